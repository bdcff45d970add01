//! GPU targets: [`Target`] lives in `sinter_ir::contract::target` (the passes size their cost
//! model and their fusion by it too); this module adds what only the code generator needs,
//! the names LLVM's NVPTX back end knows a target by ([`NvptxNames`]).
//!
//! ```
//! use sinter_codegen::target::{NvptxNames, Target};
//!
//! let t = Target::parse("sm_90a").unwrap();
//! assert_eq!(t.llvm_cpu(), "sm_90a");
//! assert_eq!(t.llvm_features(), "+ptx85");
//! ```

// shim: old path, removed at integration (`crate::target::Target` → `sinter_ir::Target`)
pub use sinter_ir::contract::target::*;

/// The LLVM target triple of every sinter kernel: 64-bit NVPTX for the CUDA driver.
pub const NVPTX_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// The names LLVM's NVPTX back end takes for a [`Target`].
pub trait NvptxNames {
    /// The LLVM target triple: [`NVPTX_TRIPLE`].
    fn llvm_triple(&self) -> &'static str;
    /// The CPU name (the same as [`Target::name`]).
    fn llvm_cpu(&self) -> &'static str;
    /// The feature string: `+ptx85`, which selects the PTX ISA version ([`PTX_ISA_VERSION`];
    /// LLVM 22 knows `ptx80` to `ptx88` and `ptx90`; the architecture itself comes from
    /// [`NvptxNames::llvm_cpu`]).
    fn llvm_features(&self) -> &'static str;
}

impl NvptxNames for Target {
    fn llvm_triple(&self) -> &'static str {
        NVPTX_TRIPLE
    }

    fn llvm_cpu(&self) -> &'static str {
        self.name()
    }

    fn llvm_features(&self) -> &'static str {
        "+ptx85"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_names() {
        for t in Target::ALL {
            assert_eq!(t.llvm_features(), "+ptx85");
            assert_eq!(t.llvm_cpu(), t.name());
            assert_eq!(t.llvm_triple(), NVPTX_TRIPLE);
        }
        // The feature string names the PTX ISA version the target module declares.
        let (major, minor) = PTX_ISA_VERSION;
        assert_eq!(Target::SM_80.llvm_features(), format!("+ptx{major}{minor}"));
    }
}
