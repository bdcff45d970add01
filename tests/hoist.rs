//! Work on weights and constants hoisted to load time, without a GPU.
//!
//! - The weights the passes guess for every zoo graph (`sinter_passes::hoist::infer_weights`:
//!   parameters of a constant shape and a float dtype beside symbolic ones) are exactly the
//!   decoder's weights, the parameters other than its inputs — what the engine names
//!   explicitly — so `sinter explain` and a program compiled without names hoist what the
//!   engine does, and the kernels precompiled for the GPU tests are the engine's.
//! - Folding emulated on the interpreter: tiny Gemma 3 (f32 and bf16), Qwen3 and Llama graphs
//!   compiled with their weights named, split as the GPU backend folds them
//!   (`sinter::gpu::fold::split`, bound = the weights); the folded kernels run once, the rest
//!   reads their results as inputs, and the outputs equal the original graph's on the
//!   interpreter. The kernels folded are exactly those the fusion report marks load-time.

use std::collections::BTreeSet;

use sinter::DType;
use sinter::gpu::fold;
use sinter::llm::decoder::GRAPH_INPUTS;
use sinter::zoo::{self, Mode, gemma3, llama, qwen};
use sinter_ir::interp::{self, Tensor, run_kernel_graph};
use sinter_ir::{Bindings, Dim, Graph, GridDim, KernelGraph, LaunchPlan, Target};
use sinter_passes::{PassOptions, compile};

use super::passes::inputs;

/// The decoder's weights: the entry's parameters other than its inputs.
fn decoder_weights(g: &Graph) -> BTreeSet<String> {
    let f = g.entry().unwrap();
    f.params
        .iter()
        .filter_map(|&p| f.values[p].name.clone())
        .filter(|n| !GRAPH_INPUTS.contains(&n.as_str()))
        .collect()
}

#[test]
fn the_weights_guessed_for_the_zoo_are_the_decoders_weights() {
    for name in zoo::MODELS {
        for mode in [Mode::Prefill, Mode::Decode] {
            let Ok(g) = zoo::build(name, mode, DType::BF16) else {
                continue;
            };
            let guessed = sinter_passes::hoist::weight_names(&g, None);
            assert_eq!(guessed, decoder_weights(&g), "{name} {mode:?}");
            // A decode graph specialised to its batch keeps symbols (pages), so the guess holds.
            if mode == Mode::Decode {
                let b = g.specialize(&[("T".to_string(), 2)].into_iter().collect());
                assert_eq!(
                    sinter_passes::hoist::weight_names(&b, None),
                    decoder_weights(&g),
                    "{name} at batch 2"
                );
            }
        }
    }
}

/// A plan that launches one CTA with no symbol: enough for [`fold::split`], which reads only
/// the grid and the size parameters.
fn static_plan() -> LaunchPlan {
    let one = || GridDim {
        numerator: Dim::constant(1),
        denominator: 1,
    };
    LaunchPlan {
        entry: "k".into(),
        ptx: String::new(),
        target: Target::SM_90A,
        grid: [one(), one(), one()],
        block: [1, 1, 1],
        shared_bytes: 0,
        params: vec![],
    }
}

/// Runs `kg` as the GPU backend does after folding: the folded kernels once on the weights,
/// then the rest on the inputs and the folded results. Returns the outputs and how many
/// kernels folded.
fn run_folded(
    kg: &KernelGraph,
    weights: &BTreeSet<String>,
    ins: &[Tensor],
) -> (Vec<Tensor>, usize) {
    let plans = vec![static_plan(); kg.kernels.len()];
    let by_name = |b: sinter_ir::Buffer| {
        let name = kg.buffers[b].name.clone().unwrap();
        let i = kg.inputs.iter().position(|&x| x == b).unwrap();
        (name, ins[i].clone())
    };
    let Some(split) = fold::split(kg, &plans, &|n| weights.contains(n)) else {
        let refs: Vec<&Tensor> = ins.iter().collect();
        return (run_kernel_graph(kg, &refs, &Bindings::new()).unwrap(), 0);
    };
    assert!(split.reads.is_subset(weights));
    let sub_ins: Vec<Tensor> = split.sub.inputs.iter().map(|&b| by_name(b).1).collect();
    let refs: Vec<&Tensor> = sub_ins.iter().collect();
    let folded = run_kernel_graph(&split.sub, &refs, &Bindings::new()).unwrap();
    let rest_ins: Vec<Tensor> = split
        .rest
        .inputs
        .iter()
        .map(|&b| match split.sub.outputs.iter().position(|&o| o == b) {
            Some(j) => folded[j].clone(),
            None => by_name(b).1,
        })
        .collect();
    let refs: Vec<&Tensor> = rest_ins.iter().collect();
    (
        run_kernel_graph(&split.rest, &refs, &Bindings::new()).unwrap(),
        split.folded.len(),
    )
}

#[test]
fn folding_on_the_interpreter_gives_the_reference_results() {
    let mut cases: Vec<(String, Graph)> = Vec::new();
    for mode in [Mode::Prefill, Mode::Decode] {
        for dt in [DType::F32, DType::BF16] {
            cases.push((
                format!("tiny gemma3 {mode:?} {dt:?}"),
                gemma3::build(&gemma3::Gemma3Config::tiny(), mode, dt).unwrap(),
            ));
        }
        cases.push((
            format!("tiny qwen3 {mode:?}"),
            qwen::build(
                &qwen::QwenConfig::tiny(qwen::QwenArch::Qwen3),
                mode,
                DType::BF16,
            )
            .unwrap(),
        ));
        cases.push((
            format!("tiny llama {mode:?}"),
            llama::build(&llama::LlamaConfig::tiny(), mode, DType::BF16).unwrap(),
        ));
    }
    let mut folded_any = false;
    for (name, g) in cases {
        let weights = decoder_weights(&g);
        let opts = PassOptions {
            weights: Some(weights.clone()),
            ..PassOptions::for_graph(&g)
        };
        let (kg, report) =
            compile(&g, &Target::SM_90A, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ins = inputs(&g, 4, name.contains("Decode"));
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(&g, "main", &refs, &Bindings::new())
            .unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        let (got, folded) = run_folded(&kg, &weights, &ins);
        let marked = report.kernels.iter().filter(|k| k.load_time).count();
        assert_eq!(
            folded, marked,
            "{name}: the kernels folded are those the report marks load-time\n{report}"
        );
        folded_any |= folded > 0;
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            sinter_passes::check::compare(w, o, false)
                .unwrap_or_else(|m| panic!("{name} output {i}: {m}"));
        }
        eprintln!(
            "{name}: {folded} kernels folded, {} per step",
            report.kernels_after()
        );
    }
    assert!(
        folded_any,
        "some tiny graph has load-time kernels (Gemma's 1 + w in f32, merged QKV weights)"
    );
}

/// The GPU folding test's graph (`gpu::hoist`), checked here without a GPU: its weight-only
/// work (`1 + g`, the transposed and scaled weight, the cosine table) is load-time, split off
/// as the GPU backend folds it, and the rest still computes the reference.
#[test]
fn the_gpu_folding_graph_folds_on_the_interpreter() {
    let g = super::gpu::hoist::hoist_graph();
    let weights: BTreeSet<String> = ["g", "w", "s"].map(String::from).into();
    assert_eq!(sinter_passes::hoist::weight_names(&g, None), weights);
    let (kg, report) = compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).unwrap();
    let marked = report.kernels.iter().filter(|k| k.load_time).count();
    assert!(marked >= 3, "{report}");
    let ins = vec![
        Tensor::from_fn(DType::F32, &[5, 32], |i| {
            ((i[0] * 32 + i[1]) as f64 * 0.37).sin()
        }),
        Tensor::new(DType::I32, &[5], vec![0.0, 3.0, 63.0, 7.0, 3.0]).unwrap(),
        Tensor::from_fn(DType::F32, &[32], |i| 0.1 * (i[0] as f64).cos()),
        Tensor::from_fn(DType::F32, &[16, 32], |i| {
            0.2 * ((i[0] * 32 + i[1]) as f64 * 0.11).cos()
        }),
        Tensor::from_fn(DType::F32, &[16], |i| 1.0 + 0.01 * i[0] as f64),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, "main", &refs, &Bindings::new()).unwrap();
    let (got, folded) = run_folded(&kg, &weights, &ins);
    assert_eq!(folded, marked);
    sinter_passes::check::compare(&want[0], &got[0], false).unwrap();
    eprintln!("{report}");
}
