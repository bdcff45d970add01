//! Compile time without a GPU: kernels generated on several threads give the same plans as on
//! one, with a true progress count; the lowering cache reads back what the passes made.

use sinter::gpu::{lowering_cache, Lowering};
use sinter::zoo::{llama, Mode};
use sinter::{DType, Target};
use sinter_runtime::KernelCache;

/// An empty folder of this process (removed first if a killed run left it).
fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sinter-compile-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The same PTX and plans, kernel by kernel, whether 1 or 3 threads generate them; every
/// distinct kernel generated once; the progress count climbs by one kernel at a time to the
/// total.
#[cfg(feature = "llvm")]
#[test]
fn plans_are_the_same_for_one_and_many_workers() {
    use sinter::gpu::CompileStats;
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Prefill, DType::BF16).unwrap();
    let target = Target::SM_90A;
    let kg = sinter::gpu::lower(&g, Lowering::Fused, &target).unwrap();
    let mut runs = Vec::new();
    for jobs in [1, 3] {
        let dir = temp_dir(&format!("jobs{jobs}"));
        let cache = KernelCache::new(&dir).unwrap();
        let mut stats = CompileStats::default();
        let mut seen = Vec::new();
        let plans = sinter::gpu::plans_with_jobs(&kg, &target, &cache, &mut stats, jobs, &mut |done, total| seen.push((done, total))).unwrap();
        let n = kg.kernels.len();
        assert_eq!(plans.len(), n);
        assert_eq!(seen.last(), Some(&(n, n)), "jobs {jobs}");
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "jobs {jobs}: {seen:?}");
        assert_eq!(stats.built + stats.cached, n, "{stats:?}");
        assert_eq!(stats.jobs, jobs.min(stats.built.max(1)), "{stats:?}");
        // A second pass over the same cache generates nothing.
        let mut again = CompileStats::default();
        assert_eq!(sinter::gpu::plans_with_jobs(&kg, &target, &cache, &mut again, jobs, &mut |_, _| {}).unwrap(), plans);
        assert_eq!((again.built, again.cached), (0, n));
        runs.push((plans, stats.built));
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_eq!(runs[0].1, runs[1].1, "distinct kernels generated");
    for (k, (a, b)) in runs[0].0.iter().zip(&runs[1].0).enumerate() {
        assert_eq!(a.ptx, b.ptx, "kernel {k}: the PTX differs between 1 and 3 workers");
        assert_eq!(a, b, "kernel {k}");
    }
    assert!(runs[0].1 > 3, "the test needs several distinct kernels, got {}", runs[0].1);
}

/// SmolLM2's prefill and decode kernel graphs read back from their text as they were, and a
/// second lowering through the cache is a hit returning the same graph; a damaged entry is a
/// miss (the passes run) and is rewritten.
#[test]
fn the_lowering_cache_returns_what_the_passes_made() {
    let dir = temp_dir("lowerings");
    let cache = KernelCache::new(&dir).unwrap();
    for mode in [Mode::Prefill, Mode::Decode] {
        let g = llama::build(&llama::LlamaConfig::smollm2_135m(), mode, DType::BF16).unwrap();
        for lowering in [Lowering::Fused, Lowering::Unfused] {
            let (kg, per_layer, hit) = sinter::gpu::lower_with_cache(&g, lowering, &Target::SM_90A, Some(&cache)).unwrap();
            assert!(!hit, "{mode:?} {lowering:?}: an empty cache");
            let text = lowering_cache::print(&kg, per_layer);
            assert_eq!(lowering_cache::parse(&text).unwrap(), (kg.clone(), per_layer), "{mode:?} {lowering:?}");
            let (kg2, per_layer2, hit2) = sinter::gpu::lower_with_cache(&g, lowering, &Target::SM_90A, Some(&cache)).unwrap();
            assert!(hit2, "{mode:?} {lowering:?}: the second lowering reads the cache");
            assert_eq!((kg2, per_layer2), (kg.clone(), per_layer));
            // Another target is another entry.
            let (_, _, other) = sinter::gpu::lower_with_cache(&g, lowering, &Target::SM_80, Some(&cache)).unwrap();
            assert!(!other, "{mode:?} {lowering:?}: sm_80 is not sm_90a");
        }
    }
    // Damage every entry: each is a miss (never a wrong graph), then rewritten.
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n / 2] ^= 0x01;
        std::fs::write(&p, bytes).unwrap();
    }
    let g = llama::build(&llama::LlamaConfig::smollm2_135m(), Mode::Decode, DType::BF16).unwrap();
    let (kg, _, hit) = sinter::gpu::lower_with_cache(&g, Lowering::Fused, &Target::SM_90A, Some(&cache)).unwrap();
    assert!(!hit);
    assert_eq!(kg, sinter::gpu::lower(&g, Lowering::Fused, &Target::SM_90A).unwrap());
    assert!(sinter::gpu::lower_with_cache(&g, Lowering::Fused, &Target::SM_90A, Some(&cache)).unwrap().2, "rewritten");
    // Texts that do not read are errors, not panics.
    for bad in ["", "sinter-kernel-graph v1\n", "sinter-kernel-graph v1\nper_layer x\n", "sinter-kernel-graph v1\nper_layer -\nbuffer Temp 256; f32[4]; 1\n", "sinter-kernel-graph v1\nper_layer -\ninputs 7\n", "sinter-kernel-graph v1\nper_layer -\nkernel Matmul; ; \nfunc @k() {\n"] {
        assert!(lowering_cache::parse(bad).is_err(), "{bad:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
