//! The persistent decode kernel (`sinter_codegen::persistent`) on the CPU emulator: a Llama
//! decode step with several small layers, lowered and fused as the engine lowers it, run as
//! one persistent launch gives exactly the outputs of the same kernels launched one by one,
//! with sequences whose KV cache crosses a page boundary; the launch leaves its counters
//! ready for the next one; a planted task that never completes ends the launch with an error
//! naming the task and what it waited for; kernels that cannot be tasks are refused with the
//! reason; the sm_90a kernel assembles with ptxas.

use std::time::{Duration, Instant};

use sinter::gpu::Lowering;
use sinter::zoo::{llama, Mode};
use sinter::{Bindings, DType, KernelGraph, Target, Tensor};
use sinter_codegen::emu::graph::{compile_plans, run_plans};
use sinter_codegen::emu::persistent::run_persistent;
use sinter_codegen::persistent::{build, kernel_ir, PersistentBuild};
use sinter_ir::kernel::persistent::state;

/// A tiny Llama decode step with `layers` layers, lowered with fusion for `target`, and its
/// inputs in the kernel graph's input order: 5 sequences holding 4, 5, 8, 3 and 12 tokens
/// over 4-token pages, so the new tokens of three of them are the first of a new page.
fn decode_step(layers: usize, target: &Target) -> (KernelGraph, Vec<Tensor>) {
    let cfg = llama::LlamaConfig { n_layers: layers, ..llama::LlamaConfig::tiny() };
    let g = llama::build(&cfg, Mode::Decode, DType::F32).unwrap();
    let kg = sinter::gpu::lower(&g, Lowering::Fused, target).unwrap();
    let mut ins = crate::zoo::graph_inputs(&g, Mode::Decode, 5);
    let f = g.entry().unwrap();
    let names: Vec<String> = f.params.iter().map(|p| f.values[*p].name.clone().unwrap_or_default()).collect();
    let pos = names.iter().position(|n| n == "positions").unwrap();
    ins[pos] = Tensor::new(ins[pos].dtype(), &[5], vec![4.0, 5.0, 8.0, 3.0, 12.0]).unwrap();
    let ordered = kg
        .inputs
        .iter()
        .map(|b| {
            let n = kg.buffers[*b].name.clone().unwrap_or_default();
            ins[names.iter().position(|m| *m == n).unwrap_or_else(|| panic!("kernel graph input `{n}` is not a graph input"))].clone()
        })
        .collect();
    (kg, ordered)
}

fn persistent(kg: &KernelGraph, target: &Target) -> PersistentBuild {
    let kernels: Vec<(String, sinter::LaunchPlan)> = kg.kernels.keys().map(|k| kernel_ir(kg, k, target).unwrap()).collect();
    build(&kernels, target).unwrap()
}

#[test]
fn a_decode_step_as_one_persistent_launch_equals_the_kernels_one_by_one() {
    let target = Target::SM_90;
    let (kg, ins) = decode_step(4, &target);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let plans = compile_plans(&kg, &target).unwrap();
    let want = run_plans(&kg, &plans, &refs, &Bindings::new()).unwrap();
    let p = persistent(&kg, &target);
    let functions = p.program.threads.len();
    assert!(functions < kg.kernels.len(), "{} task functions for {} kernels: the layers' kernels should share functions", functions, kg.kernels.len());
    for ctas in [1, 3] {
        let run = run_persistent(&kg, &p, &refs, &Bindings::new(), ctas, 10_000_000_000, None, ctas == 3).unwrap();
        assert_eq!(run.timed_out, None);
        for (i, (a, b)) in run.outputs.iter().zip(&want).enumerate() {
            assert_eq!(a.shape(), b.shape(), "output {i}");
            let same = a.data().iter().zip(b.data()).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
            assert!(same, "{ctas} CTAs: output {i} differs from the kernel-by-kernel run");
        }
        // Ready for the next launch: claim and exit counters and every completion counter zero.
        assert_eq!((run.state[state::HEAD], run.state[state::EXITED], run.state[state::ABORT]), (0, 0, 0), "{ctas} CTAs: state {:?}", run.state);
        assert!(run.counters.iter().all(|&c| c == 0), "{ctas} CTAs: counters {:?}", run.counters);
        if ctas == 3 {
            // The profile: every kernel ran, each completing after the one before it.
            let spans: Vec<(u64, u64)> = run.spans.iter().map(|s| s.expect("every kernel has a span")).collect();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].1 && w[0].0 <= w[1].0), "{spans:?}");
        } else {
            assert!(run.spans.iter().all(Option::is_none), "no profile asked for: {:?}", run.spans);
        }
    }
    eprintln!("{} kernels, {} task functions, {} threads a CTA, {} bytes of shared memory", kg.kernels.len(), functions, p.program.kernel.block[0], p.program.kernel.shared_bytes);
}

#[test]
fn a_task_that_never_completes_ends_the_launch_with_an_error_naming_it() {
    let target = Target::SM_90;
    let (kg, ins) = decode_step(2, &target);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let p = persistent(&kg, &target);
    let t0 = Instant::now();
    let run = run_persistent(&kg, &p, &refs, &Bindings::new(), 2, 50_000_000, Some(3), false).unwrap();
    let took = t0.elapsed();
    let e = run.timed_out.expect("the launch should report the stuck wait");
    assert_eq!((e.instance, e.waited), (4, 3), "{e}");
    assert!(e.to_string().contains("waited past the timeout for instance 3"), "{e}");
    assert!(took < Duration::from_secs(60), "the stuck launch took {took:?}");
    assert!(run.counters.iter().all(|&c| c == 0), "counters {:?}", run.counters);
}

#[test]
fn kernels_that_need_their_own_launch_are_refused_with_the_reason() {
    // The prefill's tensor-core kernels on sm_90a read TMA tensor maps, grid constants of
    // their own launch.
    let target = Target::SM_90A;
    let cfg = llama::LlamaConfig { hidden: 128, n_heads: 2, n_kv_heads: 1, head_dim: 64, ffn: 256, ..llama::LlamaConfig::tiny() };
    let g = llama::build(&cfg, Mode::Prefill, DType::BF16).unwrap();
    let kg = sinter::gpu::lower(&g, Lowering::Fused, &target).unwrap();
    let kernels: Vec<(String, sinter::LaunchPlan)> = kg.kernels.keys().map(|k| kernel_ir(&kg, k, &target).unwrap()).collect();
    let tma = kernels.iter().any(|(_, p)| p.params.iter().any(|q| matches!(q, sinter::KernelParam::TensorMap(_))));
    match build(&kernels, &target) {
        Err(e) if tma => assert!(e.to_string().contains("tensor map") && e.to_string().contains("persistent task"), "{e}"),
        Err(e) => panic!("refused without a tensor map: {e}"),
        Ok(_) => assert!(!tma, "a TMA kernel became a task"),
    }
}

#[test]
fn the_sm90a_persistent_decode_kernel_assembles_with_ptxas() {
    let target = Target::SM_90A;
    let (kg, _) = decode_step(2, &target);
    let p = persistent(&kg, &target);
    let ptx = &p.program.kernel.ptx;
    if let Ok(d) = std::env::var("SINTER_PERSISTENT_DUMP") {
        std::fs::write(format!("{d}/persistent.ptx"), ptx).unwrap();
        std::fs::write(format!("{d}/persistent.ll"), &p.ir).unwrap();
    }
    for want in [".entry sinter_persistent", "ld.acquire.gpu", "bar.sync", "atom.global.add"] {
        assert!(ptx.contains(want), "no `{want}` in the persistent kernel's PTX");
    }
    assert!(!ptx.contains("griddepcontrol"), "a programmatic-launch instruction left in the persistent kernel");
    let report = sinter_codegen::ptxas::assemble(ptx, &target).unwrap();
    let k = report.function("sinter_persistent").unwrap_or_else(|| panic!("{report:?}"));
    eprintln!("sinter_persistent: {} registers, {} bytes of static shared memory, spills {}/{} bytes", k.registers, k.shared_bytes, k.spill_store_bytes, k.spill_load_bytes);
    // The widest task sets the registers: ptxas fits two 256-thread CTAs an SM (128).
    assert!(k.registers <= 128, "{report:?}");
    assert!(k.spill_store_bytes <= 256, "{report:?}");
}

/// SmolLM2-135M's decode step at batch 1 and 16, full size, lowered as the engine lowers it
/// for the H200: every kernel becomes a task (the row reductions and paged attention without
/// their clusters), and the layers share their functions.
#[test]
fn smollm2_decode_steps_build_as_persistent_kernels() {
    let target = Target::SM_90A;
    for b in [1, 16] {
        let g = sinter::llm::llama::decode_graph_for_batch(&llama::LlamaConfig::smollm2_135m(), DType::BF16, b).unwrap();
        let kg = sinter::gpu::lower(&g, Lowering::Fused, &target).unwrap();
        let p = sinter::gpu::persistent_program(&kg, &target).unwrap_or_else(|e| panic!("batch {b}: {e}"));
        assert_eq!(p.tasks.len(), kg.kernels.len());
        if let Ok(d) = std::env::var("SINTER_PERSISTENT_DUMP") {
            std::fs::write(format!("{d}/smollm2-b{b}.ptx"), &p.kernel.ptx).unwrap();
        }
        assert!(p.threads.len() * 2 < kg.kernels.len(), "batch {b}: {} functions for {} kernels", p.threads.len(), kg.kernels.len());
        let tasks: u32 = p.tasks.iter().map(|(_, plan)| plan.grid.iter().map(|g| g.eval(&sinter::Bindings::new()).unwrap_or(1)).product::<u32>()).sum();
        eprintln!("batch {b}: {} kernels, {tasks} tasks, {} task functions, {} threads a CTA, {} bytes of shared memory", kg.kernels.len(), p.threads.len(), p.kernel.block[0], p.kernel.shared_bytes);
    }
}
