//! The kernel cache's key of a compiled kernel.
//!
//! Every compiled kernel is stored under `$SINTER_CACHE/kernels`, keyed by its family, its
//! body's IR text, its buffers' types and layouts, the target, the PTX version, the LLVM
//! version, the sinter version and a fingerprint of the code generator's and IR's sources
//! (computed by `build.rs`, so that a cache filled by one version of the generator is never
//! served to another). Autotuning keys its records and candidates by the same key with the
//! schedule field changed ([`crate::tune`]).

use sinter_ir::{Kernel, KernelGraph, Target};
use sinter_runtime::CacheKey;

/// The PTX ISA version the code generator emits.
pub const PTX_VERSION: &str = "8.5";
/// The LLVM the code generator is built with (Debian's llvm-22-dev, TOOLCHAIN.md).
pub const LLVM_VERSION: &str = "22.1";

/// The cache key of one kernel (see the module docs).
pub fn kernel_key(kg: &KernelGraph, k: Kernel, target: &Target) -> CacheKey {
    let kd = &kg.kernels[k];
    // The body's name carries the kernel's index: identical kernels (the same op in every
    // layer) must share one cache entry and one loaded module.
    let mut body = kd.body.clone();
    body.name = "kernel".into();
    for v in body.values.values_mut() {
        v.name = None;
    }
    let mut text = format!("family {:?}\n{}", kd.family, sinter_ir::text::print_function(&body));
    for &b in kd.inputs.iter().chain(&kd.outputs) {
        let bd = &kg.buffers[b];
        let strides: Vec<String> = bd.layout.strides.iter().map(|d| d.to_string()).collect();
        text.push_str(&format!("buffer {} strides [{}] align {}\n", bd.ty, strides.join(", "), bd.layout.align));
    }
    // The tensor-core prefill's debugging fill changes the code it generates.
    if let Some(fill) = std::env::var_os("SINTER_DEBUG_SMEM_FILL") {
        text.push_str(&format!("debug smem fill {}\n", fill.to_string_lossy()));
    }
    // The schedule field carries the code generator's fingerprint (build.rs): a kernel cached
    // by another version of the generator is a miss, never a stale hit.
    CacheKey::new(&text, concat!("auto codegen ", env!("SINTER_CODEGEN_FINGERPRINT")), target.name(), PTX_VERSION, LLVM_VERSION)
}
