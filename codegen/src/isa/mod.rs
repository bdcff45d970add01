//! The instruction layer: building kernels instruction by instruction, knowing no family.

pub(crate) mod kit;
