//! CPU reference interpreter (placeholder while being written).
