//! The passes on the model zoo: `sinter_passes::compile` recognises attention, RMSNorm (as a
//! RowReduction kernel), SwiGLU and the softmax (inside attention) in the Llama and GPT-2
//! graphs as written, the kernel count drops, and the compiled `KernelGraph` evaluated on the
//! interpreter (`run_kernel_graph`) matches the original graph (`interp::run`) within
//! DESIGN.md's f32 tolerance; `lower_unfused` likewise.

use sinter::zoo::{gpt2, llama, Mode};
use sinter::DType;
use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Bindings, Family, Graph, KernelGraph};
use sinter_passes::{compile, lower_unfused, FusionReport, PassOptions, Target};

use super::zoo::Rng;

/// Seeded inputs for every parameter of `@main`: token ids, positions, block tables and empty
/// pages for the named inputs; weights as `bind_random_weights` makes them.
pub(crate) fn inputs(g: &Graph, n_tokens: usize, decode: bool) -> Vec<Tensor> {
    let f = g.func("main").unwrap();
    let mut rng = Rng::new(11);
    let mut out = vec![];
    let mut sizes = Bindings::new();
    sizes.insert("T".into(), n_tokens as i64);
    sizes.insert("P".into(), 8);
    sizes.insert("M".into(), 4);
    for &p in &f.params {
        let name = f.values[p].name.clone().unwrap();
        let ty = f.ty(p);
        let shape: Vec<usize> = ty.shape.iter().map(|d| d.eval(&sizes).unwrap() as usize).collect();
        let n: usize = shape.iter().product();
        let t = match name.as_str() {
            "tokens" => Tensor::from_fn(ty.dtype, &shape, |i| ((i[0] * 7 + 3) % 50) as f64),
            "positions" if decode => Tensor::from_fn(ty.dtype, &shape, |i| (i[0] + 2) as f64),
            "positions" => Tensor::from_fn(ty.dtype, &shape, |i| i[0] as f64),
            // Layer l, sequence b owns pages (l*T + b)*... distinct per (layer, sequence).
            "block_tables" => Tensor::from_fn(ty.dtype, &shape, |i| ((i[0] * shape[1] + i[1]) % 2 * 4 + i[2]) as f64 % 8.0),
            "k_pages" | "v_pages" => Tensor::from_fn(ty.dtype, &shape, |i| 0.1 * (((i[0] * 31 + i[1] * 7 + i[2] * 3 + i[3]) % 17) as f64 - 8.0) / 8.0),
            _ if name.contains(".bias") => Tensor::new(ty.dtype, &shape, (0..n).map(|_| 0.1 * rng.next_f64()).collect()).unwrap(),
            _ if name.contains("norm") => Tensor::new(ty.dtype, &shape, (0..n).map(|_| 1.0 + 0.1 * rng.next_f64()).collect()).unwrap(),
            _ => {
                let s = 1.0 / (*shape.last().unwrap() as f64).sqrt();
                Tensor::new(ty.dtype, &shape, (0..n).map(|_| s * rng.next_f64()).collect()).unwrap()
            }
        };
        out.push(t);
    }
    out
}

/// DESIGN.md's f32 criterion: element-wise `|out − ref| ≤ 1e-6·max|ref| + 1e-5·|ref|`, NaN
/// where the reference has NaN, and a norm-wise error under 1e-5.
fn assert_f32_close(what: &str, reference: &Tensor, out: &Tensor) {
    assert_eq!(reference.shape(), out.shape(), "{what}: shapes differ");
    let maxref = reference.data().iter().fold(0f64, |m, x| m.max(x.abs()));
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&r, &o)) in reference.data().iter().zip(out.data()).enumerate() {
        assert_eq!(r.is_nan(), o.is_nan(), "{what}: element {i}: {o} vs reference {r}");
        if r.is_nan() {
            continue;
        }
        assert!((o - r).abs() <= 1e-6 * maxref + 1e-5 * r.abs(), "{what}: element {i}: {o} vs reference {r} (max |ref| {maxref})");
        num += (o - r) * (o - r);
        den += r * r;
    }
    assert!(den == 0.0 || (num / den).sqrt() < 1e-5, "{what}: norm-wise error {}", (num / den).sqrt());
}

pub(crate) fn check_against_reference(name: &str, g: &Graph, kg: &KernelGraph, ins: &[Tensor]) {
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(g, "main", &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{name}: reference: {e}"));
    let got = run_kernel_graph(kg, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{name}: kernel graph: {e}"));
    assert_eq!(want.len(), got.len());
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        assert_f32_close(&format!("{name} output {i}"), w, o);
    }
}

fn compile_zoo(g: &Graph) -> (KernelGraph, FusionReport) {
    compile(g, &Target::SM_90A, &PassOptions::for_graph(g)).unwrap_or_else(|e| panic!("compile: {e}"))
}

fn has_kernel(kg: &KernelGraph, family: Family, op: &str) -> bool {
    kg.kernels.values().any(|k| k.family == family && k.body.nodes.values().any(|n| n.op.kind.name() == op))
}

#[test]
fn tiny_llama_prefill_compiles_fused_and_matches_the_reference() {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Prefill, DType::F32).unwrap();
    let (kg, report) = compile_zoo(&g);
    println!("{report}");
    assert!(has_kernel(&kg, Family::Attention, "attention"), "attention recognised");
    assert!(has_kernel(&kg, Family::RowReduction, "rms_norm"), "RMSNorm as a RowReduction");
    // SwiGLU over the merged gate/up output is that matmul's (paired) epilogue; RoPE and
    // kv_append are the QKV projection's.
    assert!(has_kernel(&kg, Family::Matmul, "swiglu"), "SwiGLU in the gate/up epilogue");
    assert!(has_kernel(&kg, Family::Matmul, "kv_append"), "kv_append in the QKV epilogue");
    assert!(has_kernel(&kg, Family::Matmul, "rope"), "RoPE in the QKV epilogue");
    for r in ["attention", "rms-norm", "swiglu", "merge-parallel-matmuls"] {
        assert!(report.rules_fired.contains_key(r), "rule {r} fired: {:?}", report.rules_fired);
    }
    assert!(report.kernels_after() < report.kernels_before, "{} -> {}", report.kernels_before, report.kernels_after());
    let ins = inputs(&g, 5, false);
    check_against_reference("llama prefill", &g, &kg, &ins);
    check_against_reference("llama prefill unfused", &g, &lower_unfused(&g).unwrap(), &ins);
}

#[test]
fn tiny_llama_decode_compiles_fused_and_matches_the_reference() {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Decode, DType::F32).unwrap();
    let (kg, report) = compile_zoo(&g);
    println!("{report}");
    assert!(has_kernel(&kg, Family::PagedAttention, "paged_attention"));
    assert!(has_kernel(&kg, Family::RowReduction, "rms_norm"));
    assert!(report.rules_fired.contains_key("swiglu"));
    assert!(report.kernels_after() < report.kernels_before);
    let ins = inputs(&g, 3, true);
    check_against_reference("llama decode", &g, &kg, &ins);
    check_against_reference("llama decode unfused", &g, &lower_unfused(&g).unwrap(), &ins);
}

#[test]
fn tiny_gpt2_compiles_fused_and_matches_the_reference() {
    let g = gpt2::build(&gpt2::Gpt2Config::tiny(), DType::F32).unwrap();
    let (kg, report) = compile_zoo(&g);
    println!("{report}");
    assert!(has_kernel(&kg, Family::Attention, "attention"));
    assert!(has_kernel(&kg, Family::RowReduction, "layer_norm"));
    assert!(report.kernels_after() < report.kernels_before);
    let ins = inputs(&g, 5, false);
    check_against_reference("gpt2", &g, &kg, &ins);
    check_against_reference("gpt2 unfused", &g, &lower_unfused(&g).unwrap(), &ins);
}

/// The report with only the kernels of `origins` listed (the rest of the table elided).
fn report_for(report: &FusionReport, origins: &[&str]) -> String {
    report
        .to_string()
        .lines()
        .filter(|l| {
            let mut w = l.split_whitespace();
            let is_kernel = l.starts_with("  k") && w.next().is_some_and(|k| k[1..].chars().all(|c| c.is_ascii_digit()));
            !is_kernel || l.split_whitespace().nth(2).is_some_and(|o| origins.contains(&o))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The functions after each saturation phase, then the fusion report.
fn passes_text(g: &Graph) -> String {
    let opts = PassOptions { snapshots: true, ..PassOptions::for_graph(g) };
    let (_, report) = compile(g, &Target::SM_90A, &opts).unwrap();
    let mut s = String::new();
    for f in &report.functions {
        for (phase, text) in &f.snapshots {
            s.push_str(&format!("== @{} after {phase}\n{text}", f.name));
        }
    }
    s.push_str("== fusion report\n");
    s.push_str(&report.to_string());
    s
}

#[test]
fn zoo_ir_after_each_pass_and_fusion_reports() {
    let cfg = llama::LlamaConfig::tiny();
    insta::assert_snapshot!("passes_tiny_llama_prefill_bf16", passes_text(&llama::build(&cfg, Mode::Prefill, DType::BF16).unwrap()));
    insta::assert_snapshot!("passes_tiny_llama_decode_bf16", passes_text(&llama::build(&cfg, Mode::Decode, DType::BF16).unwrap()));
    insta::assert_snapshot!("passes_tiny_gpt2_bf16", passes_text(&gpt2::build(&gpt2::Gpt2Config::tiny(), DType::BF16).unwrap()));
}

#[test]
fn tiny_llama_bf16_compiled_matches_the_reference_within_bf16_tolerance() {
    for mode in [Mode::Prefill, Mode::Decode] {
        let g = llama::build(&llama::LlamaConfig::tiny(), mode, DType::BF16).unwrap();
        let (kg, _) = compile_zoo(&g);
        let ins = inputs(&g, 4, mode == Mode::Decode);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(&g, "main", &refs, &Bindings::new()).unwrap();
        let got = run_kernel_graph(&kg, &refs, &Bindings::new()).unwrap();
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            sinter_passes::check::compare(w, o, false).unwrap_or_else(|m| panic!("{mode:?} output {i}: {m}"));
        }
    }
}

#[test]
fn smollm2_full_size_kernel_counts() {
    for mode in [Mode::Prefill, Mode::Decode] {
        let g = sinter::zoo::build("smollm2-135m", mode, DType::BF16).unwrap();
        let (kg, report) = compile_zoo(&g);
        let per_layer = report.kernels_per_call("layer").unwrap();
        println!(
            "smollm2-135m {mode:?}: {} nodes -> {} kernels unfused -> {} kernels ({} per layer, {} load-time); e-graph of @layer per phase: {:?}; compile {:.3} s",
            report.nodes_before,
            report.kernels_before,
            report.kernels_after(),
            per_layer,
            report.kernels.len() - report.kernels_after(),
            report.functions.iter().find(|f| f.name == "layer").map(|f| f.phases.iter().map(|p| p.egraph_nodes).collect::<Vec<_>>()),
            report.seconds
        );
        // The seven kernels of a decoder layer: RMSNorm; the QKV projection with RoPE on Q and K in
        // its epilogue, which also writes K and V into the paged cache (kv_append); attention
        // (paged in decode); O projection + residual; RMSNorm; gate/up with SwiGLU;
        // down + residual. (The Q/K/V and gate/up weight concatenations are load-time.)
        let want = 7;
        assert_eq!(per_layer, want, "{mode:?}\n{report}");
        assert!(kg.kernels.len() < report.kernels_before);
        let name = if mode == Mode::Prefill { "passes_smollm2_prefill_report" } else { "passes_smollm2_decode_report" };
        insta::assert_snapshot!(name, report_for(&report, &["main", "layer#0", "layer#29"]));
    }
}

/// `sinter explain` prints the fusion report and the kernels per layer, and writes Graphviz
/// files that `dot` accepts.
#[test]
fn explain_prints_kernels_per_layer_and_writes_dot() {
    let dir = std::env::temp_dir().join(format!("sinter-explain-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sinter")).args(["explain", "gpt2", "--dot"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kernels per layer (prefill): "), "{text}");
    let after = std::fs::read_to_string(dir.join("gpt2-prefill-after.dot")).unwrap();
    assert!(after.starts_with("digraph"), "{}", &after[..after.len().min(80)]);
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_sinter")).args(["explain", "gpt5"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no zoo model is called `gpt5`"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sinter explain --schedules` shows the fp8 matmul's wgmma e4m3 schedule (a K tile of 128)
/// and its candidates on sm_90a; on sm_80 the passes fuse for that target (a kernel
/// dequantising each operand, then the bf16 GEMM) and every kernel has a schedule; an fp8
/// attention of head dim 16, which the fp8 kernel does not take (64 and 128 only; the kernel
/// contract said so only after the passes had formed one that the generator refused), has its
/// operands dequantised and a bf16 attention kernel with a schedule; an unknown target is an
/// error.
#[cfg(feature = "llvm")]
#[test]
fn explain_schedules_shows_every_kernel_within_the_contract() {
    let dir = std::env::temp_dir().join(format!("sinter-explain-fp8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fp8.sir");
    std::fs::write(&file, "func @main(%a8: f8e4m3[64, 64], %sa: f32[], %b8: f8e4m3[64, 64], %sb: f32[]) {\n  %a: bf16[64, 64] = dequantize_fp8(%a8, %sa) {dtype=bf16}\n  %b: bf16[64, 64] = dequantize_fp8(%b8, %sb) {dtype=bf16}\n  %y: bf16[64, 64] = matmul(%a, %b) {transpose_b=true}\n  return %y\n}\n").unwrap();
    let run = |file: &std::path::Path, arch: &str| std::process::Command::new(env!("CARGO_BIN_EXE_sinter")).args(["explain"]).arg(file).args(["--schedules", arch]).output().unwrap();
    let out = run(&file, "sm_90a");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("k0 Matmul: dequantize_fp8 dequantize_fp8 matmul") && text.contains("wgmma 128x128x128 s4 f1") && text.contains("wgmma 128x256x128 s4"), "{text}");
    let out = run(&file, "sm_80");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Layout: dequantize_fp8") && text.contains("Matmul: matmul\n") && !text.contains("schedule: none"), "{text}");
    let attention = dir.join("fp8_attention.sir");
    std::fs::write(&attention, "func @main(%q8: f8e4m3[1, 4, 2, 16], %sq: f32[], %k8: f8e4m3[1, 4, 2, 16], %sk: f32[], %v8: f8e4m3[1, 4, 2, 16], %sv: f32[]) {\n  %q: bf16[1, 4, 2, 16] = dequantize_fp8(%q8, %sq) {dtype=bf16}\n  %k: bf16[1, 4, 2, 16] = dequantize_fp8(%k8, %sk) {dtype=bf16}\n  %v: bf16[1, 4, 2, 16] = dequantize_fp8(%v8, %sv) {dtype=bf16}\n  %o: bf16[1, 4, 2, 16] = attention(%q, %k, %v) {scale=0.25, heads=2, kv_heads=2, layout=\"bshd\"}\n  return %o\n}\n").unwrap();
    let out = run(&attention, "sm_90a");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("k0 Layout: dequantize_fp8 dequantize_fp8 dequantize_fp8") && text.contains("k1 Attention: attention\n    schedule: tc ") && !text.contains("unsupported"), "{text}");
    let bad = run(&file, "sm_99");
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("unknown GPU target `sm_99`"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An fp8 matmul compiled for sm_80, which has no e4m3 tensor cores: the passes write the
/// dequantised operands to buffers and form the bf16 GEMM, the code generator builds every
/// kernel for sm_80, and the kernel graph gives on the interpreter what the unfused graph
/// gives. For sm_90a the same graph stays one fp8 kernel.
#[cfg(feature = "llvm")]
#[test]
fn an_fp8_matmul_for_sm_80_builds_and_matches_the_unfused_graph() {
    let g = sinter_ir::parse(
        "func @main(%a8: f8e4m3[T, 64], %sa: f32[], %b8: f8e4m3[32, 64], %sb: f32[]) {
  %a: bf16[T, 64] = dequantize_fp8(%a8, %sa) {dtype=bf16}
  %b: bf16[32, 64] = dequantize_fp8(%b8, %sb) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%a, %b) {transpose_b=true}
  return %y
}",
    )
    .unwrap();
    let (kg, _) = compile(&g, &Target::SM_80, &PassOptions::for_graph(&g)).unwrap();
    let families: Vec<Family> = kg.kernels.values().map(|k| k.family).collect();
    assert_eq!(families, [Family::Layout, Family::Layout, Family::Matmul]);
    for k in kg.kernels.keys() {
        sinter_codegen::compile_kernel(&kg, k, &Target::SM_80).unwrap_or_else(|e| panic!("{k} ({:?}): {e}", kg.kernels[k].family));
    }
    let b: Bindings = [("T".to_string(), 5)].into_iter().collect();
    let f = g.entry().unwrap();
    let mut rng = Rng::new(5);
    let ins: Vec<Tensor> = f
        .params
        .iter()
        .map(|&p| {
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.eval(&b).unwrap() as usize).collect();
            let scale = ty.shape.is_empty();
            Tensor::new(ty.dtype, &shape, (0..shape.iter().product()).map(|_| if scale { 0.5 } else { 8.0 * rng.next_f64() }).collect()).unwrap()
        })
        .collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = run_kernel_graph(&lower_unfused(&g).unwrap(), &refs, &b).unwrap();
    let got = run_kernel_graph(&kg, &refs, &b).unwrap();
    assert_eq!(got[0].data(), want[0].data());
    assert_eq!(got[0].data(), interp::run(&g, "main", &refs, &b).unwrap()[0].data());
    let (kg90a, _) = compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).unwrap();
    assert_eq!(kg90a.kernels.values().map(|k| k.family).collect::<Vec<_>>(), [Family::Matmul]);
}

/// A decode graph specialised to a batch (`Graph::specialize`, `T = 1` and `T = 16`) verifies
/// and fuses as the symbolic one, every kernel within the code generator's contract, none
/// taken for load-time work: five kernels per layer at `T = 1` (both RMSNorms in the prologue
/// of the projection that reads them), seven at `T = 16` (every CTA would compute the
/// statistics of 16 rows: the prologue costs more than the launch it saves); and the same
/// values on the interpreter as the symbolic graph (tiny Llama).
#[test]
fn decode_graphs_specialised_to_a_batch_fuse_the_same() {
    for (t, per_layer) in [(1i64, 5), (16, 7)] {
        let g = sinter::zoo::build("smollm2-135m", Mode::Decode, DType::BF16).unwrap();
        let s = g.specialize(&[("T".to_string(), t)].into_iter().collect());
        sinter_ir::verify(&s).unwrap();
        let (kg, report) = compile_zoo(&s);
        assert_eq!(report.kernels_per_call("layer"), Some(per_layer), "T = {t}\n{report}");
        for kd in kg.kernels.values() {
            sinter_ir::contract::check(kd, &Target::SM_90A).unwrap();
        }
    }
    let cfg = llama::LlamaConfig::tiny();
    let g = llama::build(&cfg, Mode::Decode, DType::F32).unwrap();
    let s = g.specialize(&[("T".to_string(), 3)].into_iter().collect());
    let mut sym = sinter::Program::compile(g, sinter::Backend::Interpreter).unwrap();
    let mut spec = sinter::Program::compile(s, sinter::Backend::Interpreter).unwrap();
    let ws = crate::zoo::bind_random_weights(&mut sym, 3);
    for (name, w) in &ws {
        spec.bind(name, w.clone()).unwrap();
    }
    let (nb, m) = (3usize, 4usize);
    let pages = cfg.n_layers * nb * m;
    let kp = Tensor::from_fn(DType::F32, &[pages, cfg.page_size, cfg.n_kv_heads, cfg.head_dim], |i| ((i[0] * 7 + i[1] * 3 + i[3]) % 11) as f64 * 0.05 - 0.25);
    let toks = Tensor::from_fn(DType::I64, &[nb], |i| ((i[0] * 13 + 5) % cfg.vocab) as f64);
    let pos = Tensor::from_fn(DType::I32, &[nb], |i| (3 + 2 * i[0]) as f64);
    let bt = Tensor::from_fn(DType::I32, &[cfg.n_layers, nb, m], |i| ((i[0] * nb + i[1]) * m + i[2]) as f64);
    let named = [("tokens", &toks), ("positions", &pos), ("block_tables", &bt), ("k_pages", &kp), ("v_pages", &kp)];
    let a = sym.run(&named, &[]).unwrap();
    let b = spec.run(&named, &[]).unwrap();
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.data(), y.data());
    }
}
