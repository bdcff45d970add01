//! Schedule candidates: compiled into the cache on demand, and the long-row reductions whose
//! every candidate must match the interpreter on the device.

use sinter::Target;

use super::{device, every_candidate_matches};

/// The schedule candidates of kernel `k` of `kg` that the cache records, compiled into the
/// cache first where they are missing: a candidate test needs no earlier precompile run.
pub(crate) fn candidate_names(kg: &sinter::KernelGraph, k: sinter::Kernel, target: &Target, cache: &sinter_runtime::KernelCache) -> Vec<String> {
    #[cfg(feature = "llvm")]
    sinter::tune::precompile_variants(kg, target, cache).unwrap();
    sinter::tune::cached_names(kg, k, target, cache).unwrap()
}

/// Row reductions over long rows whose every schedule candidate
/// `gpu_every_row_candidate_matches_the_interpreter` runs: on sm_90a the cluster schedule's
/// thread counts and unrolls, staged row-invariant inputs (` w`) and twice the default's
/// cluster size (16 CTAs a row of 262144), the persistent clusters (` p16`, ` p14`, …) —
/// LayerNorm over rows of 32768 (exact slices) and 33001 (an odd length, three rows),
/// RMSNorm over 262144, and LayerNorm over 40 rows of 262144 (more rows than a persistent
/// grid has clusters: each cluster's output pass refills its stage with its next row).
pub(crate) fn row_candidate_graphs() -> Vec<sinter::Graph> {
    vec![
        sinter::graph! { fn main(x: bf16[40, 262144], w: bf16[262144], b: bf16[262144]) -> bf16[40, 262144] { x.layer_norm(w, b, eps = 1e-5) } }.unwrap(),
        sinter::graph! { fn main(x: bf16[5, 32768], w: bf16[32768], b: bf16[32768]) -> bf16[5, 32768] { x.layer_norm(w, b, eps = 1e-5) } }.unwrap(),
        sinter::graph! { fn main(x: bf16[3, 33001], w: bf16[33001], b: bf16[33001]) -> bf16[3, 33001] { x.layer_norm(w, b, eps = 1e-5) } }.unwrap(),
        sinter::graph! { fn main(x: bf16[3, 262144], w: bf16[262144]) -> bf16[3, 262144] { x.rms_norm(w, eps = 1e-6) } }.unwrap(),
        sinter::graph! { fn main(x: bf16[3, 262144]) -> bf16[3, 262144] { x.softmax(-1) } }.unwrap(),
    ]
}

/// Every schedule candidate of the row-reduction kernels of [`row_candidate_graphs`] (pinned
/// in turn) matches the interpreter on the device.
#[test]
fn gpu_every_row_candidate_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    every_candidate_matches(&dev, row_candidate_graphs(), 160);
}
