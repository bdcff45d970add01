//! Integration tests: one binary (it links LLVM once), one module per topic.

mod architecture;
