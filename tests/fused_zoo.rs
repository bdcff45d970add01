//! The fused zoo graphs meet the code generator's contract: every kernel that
//! `sinter_passes::compile` produces (default options) for tiny Llama (prefill and decode, bf16
//! and f32), tiny GPT-2 and SmolLM2-135M (prefill and decode, bf16) is accepted by
//! `sinter_codegen::compile_kernel` for sm_90a and assembles with ptxas without spills; and
//! the compiled tiny graphs, run on the interpreter (`run_kernel_graph`), still match the
//! original graph (`interp::run`). Both option sets are checked: `PassOptions::default()` (the
//! prefill cost model for every graph) and `PassOptions::for_graph` (what `sinter::gpu::lower`
//! and `sinter explain` use: the decode cost model for decode graphs); a kernel both produce is
//! compiled once. Prints the kernel counts per model and
//! the kernels of one layer; `SINTER_DUMP_KERNELS=1` prints every kernel's body.
#![cfg(feature = "llvm")]

use std::collections::HashSet;

use sinter::zoo::{gpt2, llama, Mode};
use sinter::DType;
use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Bindings, Graph, KernelGraph};
use sinter_passes::{compile, FusionReport, PassOptions};

use super::passes::{check_against_reference, inputs};

fn zoo_cases() -> Vec<(String, Graph, bool)> {
    let tiny = llama::LlamaConfig::tiny();
    let mut cases = Vec::new();
    for dt in [DType::BF16, DType::F32] {
        for mode in [Mode::Prefill, Mode::Decode] {
            cases.push((format!("tiny llama {mode:?} {dt:?}"), llama::build(&tiny, mode, dt).unwrap(), true));
        }
        cases.push((format!("tiny gpt2 {dt:?}"), gpt2::build(&gpt2::Gpt2Config::tiny(), dt).unwrap(), true));
    }
    for mode in [Mode::Prefill, Mode::Decode] {
        cases.push((format!("smollm2-135m {mode:?} BF16"), llama::build(&llama::LlamaConfig::smollm2_135m(), mode, DType::BF16).unwrap(), false));
    }
    // Decode steps specialised to a batch (`sinter run --decode-batches`): at 16 the
    // projections without a norm before them take the flat tensor-core GEMM; at 1 and 16 a
    // norm whose prologue pays joins its projection (the small-M kernel). Tiny Llama and the
    // tiny paged GPT-2 at batches 1 and 3 are also run on the interpreter against the
    // reference.
    let dec = llama::build(&llama::LlamaConfig::smollm2_135m(), Mode::Decode, DType::BF16).unwrap();
    for b in [1, 16] {
        cases.push((format!("smollm2-135m Decode BF16 T={b}"), dec.specialize(&[("T".to_string(), b)].into_iter().collect()), false));
    }
    for dt in [DType::BF16, DType::F32] {
        let dec = llama::build(&tiny, Mode::Decode, dt).unwrap();
        let gpt = sinter::zoo::gpt2_paged::build(&gpt2::Gpt2Config::tiny(), Mode::Decode, dt, 4).unwrap();
        for b in [1, 3] {
            cases.push((format!("tiny llama Decode {dt:?} T={b}"), dec.specialize(&[("T".to_string(), b)].into_iter().collect()), true));
            // LayerNorms in the projections' prologues.
            cases.push((format!("tiny paged gpt2 Decode {dt:?} T={b}"), gpt.specialize(&[("T".to_string(), b)].into_iter().collect()), true));
        }
    }
    cases
}

/// Nodes → kernels unfused → kernels fused, and the fused kernels of one decoder layer (its
/// second call, whose kernels share nothing with the other layers; load-time weight
/// concatenations left out).
fn counts(name: &str, report: &FusionReport) -> String {
    let func = report.kernels.iter().find_map(|k| k.origin.split_once('#').map(|(f, _)| f.to_string())).unwrap_or_default();
    let per_layer = report.kernels_per_call(&func).map_or("-".to_string(), |n| n.to_string());
    let layer: Vec<String> = report
        .kernels
        .iter()
        .filter(|k| !k.load_time && k.origin == format!("{func}#1"))
        .map(|k| format!("{:?}[{}]", k.family, k.ops.iter().filter(|o| !matches!(o.as_str(), "reshape" | "slice" | "constant")).cloned().collect::<Vec<_>>().join(" ")))
        .collect();
    format!(
        "{name}: {} nodes -> {} kernels unfused -> {} kernels fused ({} load-time); {per_layer} per {func}: {}",
        report.nodes_before,
        report.kernels_before,
        report.kernels_after(),
        report.kernels.len() - report.kernels_after(),
        layer.join(", ")
    )
}

#[test]
fn fused_zoo_kernels_all_compile_and_assemble_without_spills() {
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap();
    let target = sinter_codegen::Target::SM_90A;
    let mut fails = Vec::new();
    let mut total = 0;
    let mut seen = HashSet::new();
    for (name, g, tiny) in zoo_cases() {
        let mut graphs = vec![];
        for (which, opts) in [("default", PassOptions::default()), ("for_graph", PassOptions::for_graph(&g))] {
            let (kg, report): (KernelGraph, FusionReport) = compile(&g, &target, &opts).unwrap_or_else(|e| panic!("{name}: compile: {e}"));
            eprintln!("{} [{which} options]", counts(&name, &report));
            assert!(report.kernels_after() < report.kernels_before, "{name}: fusion removes kernels");
            graphs.push(kg);
        }
        for kg in &graphs {
            if std::env::var_os("SINTER_DUMP_KERNELS").is_some() {
                for (k, kd) in kg.kernels.iter() {
                    eprintln!("-- {name} {k} {:?}\n{}", kd.family, sinter_ir::text::print_function(&kd.body));
                }
            }
            for (k, kd) in kg.kernels.iter() {
                // The same kernel (body and buffers) is compiled once.
                let mut key = format!("{:?}\n{}", kd.family, sinter_ir::text::print_function(&kd.body));
                for &b in kd.inputs.iter().chain(&kd.outputs) {
                    key.push_str(&format!("{} {:?}\n", kg.buffers[b].ty, kg.buffers[b].layout));
                }
                if !seen.insert(key) {
                    continue;
                }
                total += 1;
                match sinter_codegen::compile_kernel(kg, k, &target) {
                    Ok(plan) => {
                        if let Some(ptxas) = &ptxas {
                            match sinter_codegen::ptxas::assemble_with(ptxas, &plan.ptx, &target) {
                                Ok(r) if r.functions.iter().any(|f| f.spills()) => fails.push(format!("{name} {k}: spills: {r:?}")),
                                Ok(_) => {}
                                Err(e) => fails.push(format!("{name} {k}: ptxas: {e}")),
                            }
                        }
                    }
                    Err(e) => fails.push(format!("{name} {k} {:?}: {e}\n{}", kd.family, sinter_ir::text::print_function(&kd.body))),
                }
            }
        }
        if tiny {
            // The fused graphs still compute what the original does.
            let ins = inputs(&g, 4, name.contains("Decode"));
            let refs: Vec<&Tensor> = ins.iter().collect();
            for kg in &graphs {
                if name.contains("F32") {
                    check_against_reference(&name, &g, kg, &ins);
                } else {
                    let want = interp::run(&g, "main", &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{name}: reference: {e}"));
                    let got = run_kernel_graph(kg, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{name}: kernel graph: {e}"));
                    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
                        sinter_passes::check::compare(w, o, false).unwrap_or_else(|m| panic!("{name} output {i}: {m}"));
                    }
                }
            }
        }
    }
    eprintln!("{total} distinct fused zoo kernels compiled for {}", target.name());
    assert!(fails.is_empty(), "{} of {total} kernels rejected or failed:\n{}", fails.len(), fails.join("\n"));
}
