//! sinter-runtime.
