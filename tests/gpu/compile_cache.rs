//! The cubin cache on the device (`sinter_runtime::cubin`): machine code assembled once by
//! `ptxas` (`SINTER_PTXAS` or the toolchain's), on several threads, loaded as it is on later starts; a damaged entry or
//! one made for another architecture or assembler is refused, reported, assembled again and
//! rewritten, never loaded; a `ptxas` that makes no cubin leaves every module to the JIT. The plans come from the kernel cache (precompiled on the machine
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

/// `SINTER_CUBIN=0` (no cubins: the driver's JIT) until dropped; the GPU tests run one at a
/// time, so no other test sees it.
struct CubinsOff;

impl CubinsOff {
    fn new() -> CubinsOff {
        // SAFETY: the GPU tests run with one test thread; no other thread reads the environment.
        unsafe { std::env::set_var("SINTER_CUBIN", "0") };
        CubinsOff
    }
}

impl Drop for CubinsOff {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        unsafe { std::env::remove_var("SINTER_CUBIN") };
    }
}

/// The device, where it has an assembler for the cubin cache (with `SINTER_GPU_REQUIRED=1`
/// a missing `ptxas` is an error, as a missing GPU is).
fn device_with_ptxas() -> Option<Device> {
    let dev = device()?;
    if *dev.cubin_assembler() == sinter_runtime::CubinAssembler::Off {
        assert!(std::env::var("SINTER_GPU_REQUIRED").is_err(), "no ptxas for the cubin cache: set SINTER_PTXAS");
        eprintln!("skipped: no ptxas (SINTER_PTXAS) for the cubin cache");
        return None;
    }
    Some(dev)
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
    let Some(dev) = device_with_ptxas() else { return };
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
    // The cubin is the kernel the driver's JIT makes of the PTX: same shared memory, cluster
    // and architecture, kernel by kernel. Registers and spills (and so the most threads a CTA
    // may have) are the compilers' own
    // (`ptxas` and the driver's JIT may be of different CUDA releases): printed side by side.
    let jit_dev = {
        let _off = CubinsOff::new();
        fresh()
    };
    assert_eq!(*jit_dev.cubin_assembler(), sinter_runtime::CubinAssembler::Off);
    for p in &plans {
        let c = warm_dev.load(p).unwrap().attributes();
        let j = jit_dev.load(p).unwrap().attributes();
        eprintln!("{}: registers {} / {} (cubin / JIT), local bytes {} / {}", p.entry, c.registers, j.registers, c.local_bytes, j.local_bytes);
        let code = |a: sinter_runtime::KernelAttributes| (a.static_shared_bytes, a.binary_version, a.cluster_size);
        assert_eq!(code(c), code(j), "{}", p.entry);
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
    let Some(dev) = device_with_ptxas() else { return };
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

/// `SINTER_PTXAS` set to `path` until dropped, then restored (the GPU tests run one at a
/// time, so no other test sees it).
struct PtxasIs(Option<std::ffi::OsString>);

impl PtxasIs {
    fn new(path: &std::path::Path) -> PtxasIs {
        let old = std::env::var_os("SINTER_PTXAS");
        // SAFETY: the GPU tests run with one test thread; no other thread reads the environment.
        unsafe { std::env::set_var("SINTER_PTXAS", path) };
        PtxasIs(old)
    }
}

impl Drop for PtxasIs {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        match self.0.take() {
            Some(v) => unsafe { std::env::set_var("SINTER_PTXAS", v) },
            None => unsafe { std::env::remove_var("SINTER_PTXAS") },
        }
    }
}

/// A program that answers `--version` as `ptxas` does and "assembles" with `make` (a shell
/// command writing `$out`), written by `sh` (a file this process held open for writing could
/// not be run while another thread forks).
#[cfg(unix)]
fn fake_ptxas(path: &std::path::Path, make: &str) {
    let body = format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'ptxas: fake'; echo 'Cuda compilation tools, release 99.9, V99.9.1'; exit 0; fi\nfor a; do [ \"$prev\" = -o ] && out=\"$a\"; prev=\"$a\"; done\n{make}\n"
    );
    let status = std::process::Command::new("sh").arg("-c").arg("printf '%s' \"$2\" > \"$1\" && chmod +x \"$1\"").arg("sh").arg(path).arg(body).status().unwrap();
    assert!(status.success());
}

/// A `ptxas` that exits 0 but writes an empty file or text instead of a cubin: no cubin is
/// loaded or stored (the driver takes no length: an empty or short image would be read past
/// its end), every module is JIT-compiled from its PTX.
#[cfg(unix)]
#[test]
fn gpu_a_ptxas_that_writes_no_cubin_falls_back_to_the_jit() {
    let Some(dev) = device() else { return };
    let plans = tiny_llama_plans(&dev);
    let dir = temp_dir("fake-ptxas");
    let fake = dir.join("ptxas");
    for make in [": > \"$out\"", "printf abc > \"$out\"", "exit 0"] {
        fake_ptxas(&fake, make);
        let dev = {
            let _ptxas = PtxasIs::new(&fake);
            fresh()
        };
        assert_eq!(*dev.cubin_assembler(), sinter_runtime::CubinAssembler::Ptxas(fake.clone()), "{make}");
        let cache_dir = dir.join(format!("cache-{}", make.len()));
        let cache = KernelCache::new(&cache_dir).unwrap();
        let s = dev.load_modules(&plans, Some(&cache), 4).unwrap();
        eprintln!("{make}: {s:?}");
        assert!(s.modules > 1, "{s:?}");
        assert_eq!((s.assembled, s.cubin_hits, s.ptx_jit), (0, 0, s.modules), "{make}: {s:?}");
        assert!(cubins(&cache_dir).is_empty(), "{make}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Entries whose checksum matches but whose code is a cubin cut short (its headers point past
/// its end) are refused, reassembled and rewritten, never handed to the driver.
#[test]
fn gpu_intact_entries_holding_a_cut_cubin_are_refused() {
    let Some(dev) = device_with_ptxas() else { return };
    let plans = tiny_llama_plans(&dev);
    let dir = temp_dir("cut");
    let cache = KernelCache::new(&dir).unwrap();
    let cold = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    let asm = dev.assembler().clone();
    let mut seen = std::collections::BTreeSet::new();
    for p in &plans {
        if !seen.insert(p.ptx.clone()) {
            continue;
        }
        let CubinLookup::Hit(code) = cache.get_cubin(&p.ptx, &asm) else { panic!("{}: no cubin after a cold load", p.entry) };
        cache.put_cubin(&p.ptx, &asm, &code[..code.len() / 2]).unwrap();
    }
    let again = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    eprintln!("cut: {again:?}");
    assert_eq!((again.damaged.len(), again.assembled, again.cubin_hits, again.ptx_jit), (cold.modules, cold.modules, 0, 0), "{again:?}");
    let healed = fresh().load_modules(&plans, Some(&cache), 4).unwrap();
    assert_eq!((healed.cubin_hits, healed.assembled, healed.damaged.len()), (cold.modules, 0, 0), "{healed:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
