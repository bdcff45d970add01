//! sinter-codegen.
