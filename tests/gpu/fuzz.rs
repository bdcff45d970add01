//! The differential fuzzer on the GPU: the CPU fuzzer's generator (`tests/fuzz/gen.rs`, with
//! sizes scaled up) and values, each graph lowered unfused and fused for this device's target
//! (`sinter::gpu::target_for`), compiled (or taken from the kernel cache), run by the
//! runtime's executor with a poisoned guard tail on every output, checked after each kernel
//! (`Executor::checked`), and compared with the interpreter under DESIGN.md's rule.
//!
//! Budget: `SINTER_FUZZ_SECONDS` (default 240); `SINTER_FUZZ_SEEDS` runs exactly those seeds;
//! `SINTER_FUZZ_FEATURES`, `SINTER_FUZZ_KINDS` as on the CPU (`tests/fuzz/mod.rs`). Prints
//! every seed, every finding (seed and graph text), and a last line `fuzz-gpu summary: …` for
//! bench/GPU-TESTS.md. A kernel fault ends the run (the CUDA context is lost) as a finding.
//! Skipped without a GPU (`SINTER_GPU_REQUIRED=1` makes that a failure).

use std::time::Instant;

use sinter::gpu::Lowering;
use sinter::{Bindings, Graph, Tensor};
use sinter_runtime::{Device, DeviceBuffer, Executor, KernelCache};

use crate::fuzz::{self, check::compare};

/// Guard bytes past every output, and their pattern.
const GUARD: (usize, u8) = (256, 0xFF);

/// One lowering of `graph` on the device: its outputs, or what went wrong (`Err((fatal,
/// message))`, fatal when the device's context is lost).
fn run_on_device(
    dev: &Device,
    cache: &KernelCache,
    graph: &Graph,
    lowering: Lowering,
    inputs: &[(String, Tensor)],
) -> Result<Vec<Tensor>, (bool, String)> {
    let target = sinter::gpu::target_for(dev);
    let kg = sinter::gpu::lower(graph, lowering, &target)
        .map_err(|e| (false, format!("lowering: {e}")))?;
    let mut stats = sinter::gpu::CompileStats::default();
    let plans = sinter::gpu::plans(&kg, &target, cache, &mut stats)
        .map_err(|e| (false, format!("code generation: {e}")))?;
    let ex = Executor::new(dev, &kg, plans)
        .map_err(|e| (false, e.to_string()))?
        .with_output_guard(GUARD.0, GUARD.1)
        .checked(true);
    let ins = fuzz::check::kernel_inputs(&kg, inputs).map_err(|e| (false, e))?;
    // Inputs carry a poisoned guard tail too: an in-place output (`kv_append`'s pages) is its
    // input's storage, and a write past it must show.
    let upload = |t: &Tensor| -> Result<DeviceBuffer, sinter_runtime::RuntimeError> {
        let b = dev.alloc_with_guard(t.dtype(), t.shape(), GUARD.0)?;
        dev.write_f64(&b, t.data())?;
        dev.poison_guard(&b, GUARD.1)?;
        Ok(b)
    };
    let bufs = ins
        .iter()
        .map(|t| upload(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| (true, e.to_string()))?;
    let refs: Vec<&DeviceBuffer> = bufs.iter().collect();
    // A launch refused before it reaches the driver leaves the context usable.
    let outs = ex.run(&refs, &Bindings::new()).map_err(|e| {
        let fatal = !matches!(e, sinter_runtime::RuntimeError::InvalidLaunch { .. });
        (fatal, format!("run: {e}"))
    })?;
    for (i, o) in outs.iter().enumerate() {
        if let Some(v) = dev
            .guard_violation(o, GUARD.1)
            .map_err(|e| (true, e.to_string()))?
        {
            return Err((false, format!("output {i} written past its end: {v}")));
        }
    }
    for (i, b) in bufs.iter().enumerate() {
        if let Some(v) = dev
            .guard_violation(b, GUARD.1)
            .map_err(|e| (true, e.to_string()))?
        {
            return Err((false, format!("input {i} written past its end: {v}")));
        }
    }
    outs.iter()
        .map(|o| dev.download_tensor(o))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| (true, e.to_string()))
}

#[test]
fn gpu_fuzz_compiled_paths_match_the_interpreter() {
    let Some(dev) = super::device() else { return };
    let cache = KernelCache::open_default().expect("the kernel cache");
    let secs = fuzz::budget(240.0);
    let (feats, kinds) = (fuzz::features(), fuzz::kinds());
    let explicit = fuzz::explicit_seeds();
    let mut queue: std::collections::VecDeque<u64> =
        explicit.clone().unwrap_or_else(|| (0..16).collect()).into();
    let mut fresh = fuzz::clock_seed();
    let start = Instant::now();
    let (mut ran, mut passed, mut skipped, mut findings) = (0usize, 0usize, 0usize, Vec::new());
    eprintln!(
        "fuzz-gpu: target {}, kinds {:?}, features {feats:?}, budget {secs} s",
        sinter::gpu::target_for(&dev),
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    'seeds: loop {
        let seed = match queue.pop_front() {
            Some(s) => s,
            None if explicit.is_none() && start.elapsed().as_secs_f64() < secs => {
                fresh = fresh.wrapping_add(1);
                fresh
            }
            None => break,
        };
        if explicit.is_none() && start.elapsed().as_secs_f64() >= secs {
            break;
        }
        let case = fuzz::cases::generate(seed, &kinds, feats, 4);
        let inputs = fuzz::values::inputs(&case.graph, seed, feats);
        let refs: Vec<&Tensor> = inputs.iter().map(|(_, t)| t).collect();
        ran += 1;
        let want = match sinter::ir::interp::run_entry(&case.graph, &refs, &Bindings::new()) {
            Ok(w) => w,
            Err(e) => {
                skipped += 1;
                eprintln!(
                    "fuzz-gpu seed {seed} {}: skipped: interpreter: {e}",
                    case.kind.name()
                );
                continue;
            }
        };
        let spread = fuzz::check::spread(
            &case.graph,
            &inputs,
            &want,
            seed,
            case.kind == fuzz::cases::Kind::CastChain,
        );
        let mut ok = true;
        let mut unfused_compiles = true;
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let r = run_on_device(&dev, &cache, &case.graph, lowering, &inputs);
            let problem = match r {
                Ok(got) => got.iter().zip(&want).enumerate().find_map(|(i, (g, w))| {
                    compare(
                        &format!("{lowering:?} output {i}"),
                        g,
                        w,
                        spread.as_ref().and_then(|s| s.get(i)).map(Vec::as_slice),
                    )
                    .err()
                }),
                Err((false, e))
                    if e.starts_with("code generation") && lowering == Lowering::Unfused =>
                {
                    unfused_compiles = false;
                    None
                }
                Err((false, e)) if e.starts_with("code generation") && !unfused_compiles => None,
                Err((fatal, e)) => {
                    let msg = format!("{lowering:?}: {e}");
                    if fatal {
                        findings.push(format!(
                            "seed {seed} ({}): {msg} (device lost; run stopped)\n{}",
                            case.kind.name(),
                            sinter::ir::print(&case.graph)
                        ));
                        eprintln!("fuzz-gpu seed {seed}: FATAL {msg}");
                        break 'seeds;
                    }
                    Some(msg)
                }
            };
            if let Some(p) = problem {
                ok = false;
                eprintln!(
                    "fuzz-gpu seed {seed} {}: FINDING {p}\n{}",
                    case.kind.name(),
                    sinter::ir::print(&case.graph)
                );
                findings.push(format!("seed {seed} ({}): {p}", case.kind.name()));
                break;
            }
        }
        if ok {
            if unfused_compiles {
                passed += 1;
            } else {
                skipped += 1;
            }
            eprintln!("fuzz-gpu seed {seed} {}: ok", case.kind.name());
        }
    }
    eprintln!(
        "fuzz-gpu summary: {ran} seeds in {:.0} s ({passed} passed, {skipped} skipped, {} findings{}); features {feats:?}",
        start.elapsed().as_secs_f64(),
        findings.len(),
        if findings.is_empty() { String::new() } else { format!(": {}", findings.iter().map(|f| f.lines().next().unwrap_or("")).collect::<Vec<_>>().join("; ")) }
    );
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}

/// The GPU fuzzer's findings kept as files (`tests/fuzz/regressions/gpu/*.sir`, sizes the CPU
/// emulator takes minutes over), each run unfused and fused on the device with the values of
/// its seed and features; a file marked `// expected: <name>` of `KNOWN_OPEN` may still fail
/// (reported), every other must pass.
#[test]
fn gpu_fuzz_regressions_replay() {
    let Some(dev) = super::device() else { return };
    let cache = KernelCache::open_default().expect("the kernel cache");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(fuzz::gpu_regressions_dir())
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sir"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut bad = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("a regression file");
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let seed: u64 = fuzz::header(&text, "seed")
            .and_then(|s| s.parse().ok())
            .expect("a `// seed:` line");
        let feats = fuzz::header(&text, "features")
            .map_or(fuzz::features(), |f| fuzz::cases::Features::NONE.with(f));
        let open =
            fuzz::header(&text, "expected").filter(|f| fuzz::KNOWN_OPEN.iter().any(|k| k.0 == *f));
        let graph = sinter::ir::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = fuzz::values::inputs(&graph, seed, feats);
        let refs: Vec<&Tensor> = inputs.iter().map(|(_, t)| t).collect();
        let want = sinter::ir::interp::run_entry(&graph, &refs, &Bindings::new())
            .unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
        let spread = fuzz::check::spread(
            &graph,
            &inputs,
            &want,
            seed,
            fuzz::header(&text, "kind") == Some(fuzz::cases::Kind::CastChain.name()),
        );
        let mut problem = None;
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let p = match run_on_device(&dev, &cache, &graph, lowering, &inputs) {
                Ok(got) => got.iter().zip(&want).enumerate().find_map(|(i, (g, w))| {
                    compare(
                        &format!("{lowering:?} output {i}"),
                        g,
                        w,
                        spread.as_ref().and_then(|s| s.get(i)).map(Vec::as_slice),
                    )
                    .err()
                }),
                Err((_, e)) => Some(format!("{lowering:?}: {e}")),
            };
            if p.is_some() {
                problem = p;
                break;
            }
        }
        match (problem, open) {
            (Some(p), Some(known)) => eprintln!("{name}: known open bug ({known}) still found: {p}"),
            (Some(p), None) => bad.push(format!("{name}: {p}")),
            (None, Some(known)) => eprintln!("{name}: passes — the known bug `{known}` no longer shows: delete it from KNOWN_OPEN"),
            (None, None) => eprintln!("{name}: passes"),
        }
    }
    eprintln!("replayed {} GPU regression files", files.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A graph output that is one of its inputs (`cast` to the dtype it has) comes back as a copy
/// with the guard tail every other output has, poisoned: a pool block holds what its last
/// user left past the extent (the GPU fuzzer read that as writes past the end).
#[test]
fn gpu_input_returned_as_output_has_a_poisoned_guard() {
    let Some(dev) = super::device() else { return };
    let graph = sinter::ir::parse(
        "func @main(%x: f16[54]) {\n  %c: f16[54] = cast(%x) {dtype=f16}\n  return %c\n}\n",
    )
    .expect("a graph");
    let target = sinter::gpu::target_for(&dev);
    let kg = sinter::gpu::lower(&graph, Lowering::Fused, &target).expect("lowered");
    assert!(kg.kernels.is_empty() && kg.outputs == kg.inputs, "the output is the input buffer");
    // A block of the copy's size class (108 + 256 bytes: 512), zeroed and returned to the pool.
    drop(dev.upload_f64(sinter::DType::F32, &[128], &[0.0; 128]).expect("a buffer"));
    let ex = Executor::new(&dev, &kg, vec![])
        .expect("an executor")
        .with_output_guard(GUARD.0, GUARD.1);
    let x = dev
        .upload_f64(sinter::DType::F16, &[54], &[1.5; 54])
        .expect("the input");
    let out = ex.run(&[&x], &Bindings::new()).expect("a run");
    let v = dev.guard_violation(&out[0], GUARD.1).expect("the guard");
    assert!(v.is_none(), "{v:?}");
    assert_eq!(dev.download_tensor(&out[0]).expect("the output").data(), &[1.5; 54][..]);
}
