//! The cubin cache on the device (`sinter_runtime::cubin`): machine code assembled once by the
//! driver's linker, on several threads, loaded as it is on later starts; a damaged entry or
//! one made for another architecture or driver is refused, reported, assembled again and
//! rewritten, never loaded. The plans come from the kernel cache (precompiled on the machine
//! without LLVM), the cubins go into a fresh folder of their own.

use sinter::gpu::{CompileStats, Lowering};
use sinter::zoo::{llama, Mode};
use sinter_runtime::{Assembler, CubinLookup, Device, KernelCache, LoadStats};

use super::*;

/// The tiny Llama's fused prefill kernels (precompiled by `precompile_gpu_test_kernels`) for
/// the device's target.
fn tiny_llama_plans(dev: &Device) -> Vec<sinter::ir::LaunchPlan> {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Prefill, DType::F32).unwrap();
    let target = sinter::gpu::target_for(dev);
    let kg = sinter::gpu::lower(&g, Lowering::Fused, &target).unwrap();
    let mut stats = CompileStats::default();
    sinter::gpu::plans(&kg, &target, &KernelCache::open_default().unwrap(), &mut stats).unwrap()
}

/// A fresh handle on the device: no module loaded yet (the primary context is shared).
fn fresh() -> Device {
    Device::open().unwrap()
}

/// `SINTER_CUBIN=1` (the cubin cache, off by default) until dropped; the GPU tests run one
/// at a time, so no other test sees it.
struct CubinsOn;

impl CubinsOn {
    fn new() -> CubinsOn {
        std::env::set_var("SINTER_CUBIN", "1");
        CubinsOn
    }
}

impl Drop for CubinsOn {
    fn drop(&mut self) {
        std::env::remove_var("SINTER_CUBIN");
    }
}

/// An empty folder of this process (removed first if a killed run left it).
fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sinter-cubin-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cubins(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "cubin")).collect();
    v.sort();
    v
}

#[test]
fn gpu_cubins_are_assembled_once_then_loaded_from_the_cache() {
    let _on = CubinsOn::new();
    let Some(dev) = device() else { return };
    let plans = tiny_llama_plans(&dev);
    let dir = temp_dir("once");
    let cache = KernelCache::new(&dir).unwrap();
    // Cold: every distinct PTX assembled (on 4 threads), stored, loaded from its cubin.
    let cold = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    eprintln!("cold: {cold:?}");
    assert!(cold.modules > 1, "{cold:?}");
    assert_eq!((cold.assembled, cold.cubin_hits, cold.ptx_jit), (cold.modules, 0, 0), "{cold:?}");
    assert!(cold.damaged.is_empty(), "{cold:?}");
    assert_eq!(cubins(&dir).len(), cold.modules);
    // Warm: every module from the cache, nothing assembled.
    let warm_dev = fresh();
    let warm = warm_dev.load_modules(&plans, Some(&cache), 4).unwrap();
    eprintln!("warm: {warm:?}");
    assert_eq!((warm.modules, warm.cubin_hits, warm.assembled, warm.ptx_jit), (cold.modules, cold.modules, 0, 0), "{warm:?}");
    // The cubin is the code the driver's JIT makes of the PTX: same registers, spills, shared
    // memory, threads, cluster and architecture, kernel by kernel (the PTX version a function
    // reports is the module's metadata, not its code: not compared).
    let jit_dev = fresh();
    for p in &plans {
        let from_cubin = warm_dev.load(p).unwrap().attributes();
        let from_ptx = jit_dev.load(p).unwrap().attributes();
        assert_eq!(sinter_runtime::KernelAttributes { ptx_version: 0, ..from_cubin }, sinter_runtime::KernelAttributes { ptx_version: 0, ..from_ptx }, "{}", p.entry);
    }
    // One thread or several: the same cubins.
    let dir1 = temp_dir("one-thread");
    let one = KernelCache::new(&dir1).unwrap();
    fresh().load_modules(&plans, Some(&one), 1).unwrap();
    let asm = dev.assembler();
    for p in &plans {
        assert_eq!(one.get_cubin(&p.ptx, asm), cache.get_cubin(&p.ptx, asm), "{}", p.entry);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir1);
}

#[test]
fn gpu_damaged_or_foreign_cubins_are_refused_and_rebuilt() {
    let _on = CubinsOn::new();
    let Some(dev) = device() else { return };
    let plans = tiny_llama_plans(&dev);
    let dir = temp_dir("damage");
    let cache = KernelCache::new(&dir).unwrap();
    let cold = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    let files = cubins(&dir);
    // A flipped byte in the code of one entry, a truncated second one.
    let mut flipped = std::fs::read(&files[0]).unwrap();
    let n = flipped.len();
    flipped[n - 10] ^= 0x5a;
    std::fs::write(&files[0], &flipped).unwrap();
    let cut = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &cut[..cut.len() / 2]).unwrap();
    let again: LoadStats = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    eprintln!("damaged: {again:?}");
    assert_eq!(again.damaged.len(), 2, "{again:?}");
    assert!(again.damaged.iter().any(|d| d.contains("checksum mismatch")), "{again:?}");
    assert_eq!((again.assembled, again.cubin_hits, again.ptx_jit), (2, cold.modules - 2, 0), "{again:?}");
    // Rewritten: the next start finds every entry intact.
    let healed = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    assert_eq!((healed.cubin_hits, healed.assembled), (cold.modules, 0), "{healed:?}");
    // Code made for another architecture or by another driver is never served: entries of
    // another assembler are other keys, and one copied under this assembler's name is refused.
    let asm = dev.assembler().clone();
    let other = [Assembler { arch: "sm_80".into(), ..asm.clone() }, Assembler { version: format!("{} (another)", asm.version), ..asm.clone() }];
    for o in &other {
        assert_eq!(cache.get_cubin(&plans[0].ptx, o), CubinLookup::Miss);
        let foreign = cache.put_cubin(&plans[0].ptx, o, b"\x7fELF not this card's code").unwrap();
        let ours = dir.join(format!("{}.cubin", sinter_runtime::cubin::cubin_digest(&plans[0].ptx, &asm)));
        std::fs::copy(&foreign, &ours).unwrap();
        let s = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
        assert_eq!((s.damaged.len(), s.assembled), (1, 1), "{o:?}: {s:?}");
    }
    assert!(matches!(cache.get_cubin(&plans[0].ptx, &asm), CubinLookup::Hit(_)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a cache (or with one that cannot be written) the modules still load: assembled
/// and loaded, or JIT-compiled from the PTX.
#[test]
fn gpu_modules_load_without_a_cubin_cache() {
    let Some(dev) = device() else { return };
    let plans = tiny_llama_plans(&dev);
    let s = fresh().load_modules(&plans, None, 4).unwrap();
    assert_eq!(s.modules, s.assembled + s.ptx_jit, "{s:?}");
    assert_eq!(s.cubin_hits, 0);
}
