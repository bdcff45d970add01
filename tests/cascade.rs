//! Cascade (shared-prefix) decode attention (`sinter::zoo::cascade`): on the interpreter, the
//! cascade graph equals plain paged decode over prefix + suffix; through both lowerings every
//! kernel compiles and assembles without spills; on the GPU the cascade graph matches the
//! interpreter and the plain decode, on the edge cases of cascade decode — an empty suffix, a suffix
//! of 1, partly filled pages, GQA ratios 1, 3 and 8 — and the lse/merge kernels give 0 and
//! −inf, no NaN, for fully masked rows.

use sinter::gpu::{GpuProgram, Lowering};
use sinter::zoo::cascade::{cascade_decode, plain_decode, plain_pages, plain_tables, CascadeConfig};
use sinter::{Bindings, DType, Tensor};

use crate::gpu::{check, device};
use crate::zoo::Rng;

/// One cascade case: its config and each request's suffix length.
struct Case {
    name: &'static str,
    cfg: CascadeConfig,
    suffix_lens: Vec<i32>,
}

fn cases() -> Vec<Case> {
    let base = CascadeConfig { batch: 3, heads: 4, kv_heads: 4, head_dim: 64, prefix_len: 64, page_size: 16, pages: 9, max_pages: 3, chunks: 4, dtype: DType::BF16 };
    vec![
        // GQA 1; suffixes empty, of 1 and of 37 (a partly filled third page).
        Case { name: "GQA 1, D64, suffixes 0/1/37", cfg: base.clone(), suffix_lens: vec![0, 1, 37] },
        // GQA 3, D128, one chunk pair; a full page and a partly filled one.
        Case { name: "GQA 3, D128, suffixes 16/5", cfg: CascadeConfig { batch: 2, heads: 6, kv_heads: 2, head_dim: 128, prefix_len: 48, pages: 6, chunks: 2, ..base.clone() }, suffix_lens: vec![16, 5] },
        // GQA 8, D128, a longer prefix in 8 chunks; every suffix edge at once.
        Case {
            name: "GQA 8, D128, prefix 256 in 8 chunks, suffixes 0/1/17/32",
            cfg: CascadeConfig { batch: 4, heads: 8, kv_heads: 1, head_dim: 128, prefix_len: 256, pages: 8, max_pages: 2, chunks: 8, ..base },
            suffix_lens: vec![0, 1, 17, 32],
        },
    ]
}

/// Random q, prefix K/V and suffix pool; a scrambled suffix block table (page `(7i + 3) mod
/// P` for entry i). Named as the cascade graph's inputs.
fn cascade_inputs(c: &Case, seed: u64) -> Vec<(String, Tensor)> {
    let cfg = &c.cfg;
    let mut rng = Rng::new(seed);
    let mut rnd = |shape: &[usize]| Tensor::from_fn(cfg.dtype, shape, |_| rng.next_f64());
    let q = rnd(&[cfg.batch, cfg.heads, 1, cfg.head_dim]);
    let kp = rnd(&[cfg.prefix_len, cfg.kv_heads, cfg.head_dim]);
    let vp = rnd(&[cfg.prefix_len, cfg.kv_heads, cfg.head_dim]);
    let ks = rnd(&[cfg.pages, cfg.page_size, cfg.kv_heads, cfg.head_dim]);
    let vs = rnd(&[cfg.pages, cfg.page_size, cfg.kv_heads, cfg.head_dim]);
    let table = Tensor::from_fn(DType::I32, &[cfg.batch, cfg.max_pages], |i| ((7 * (i[0] * cfg.max_pages + i[1]) + 3) % cfg.pages) as f64);
    let lens = Tensor::new(DType::I32, &[cfg.batch], c.suffix_lens.iter().map(|&l| f64::from(l)).collect()).unwrap();
    [("q", q), ("k_prefix", kp), ("v_prefix", vp), ("k_pages", ks), ("v_pages", vs), ("block_table", table), ("suffix_lens", lens)].into_iter().map(|(n, t)| (n.to_string(), t)).collect()
}

/// The plain decode's graph and inputs over the same keys.
fn plain_case(c: &Case, ins: &[(String, Tensor)], shared: bool) -> (sinter::Graph, Vec<(String, Tensor)>) {
    let cfg = &c.cfg;
    let get = |n: &str| ins.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone()).unwrap();
    let table: Vec<i32> = get("block_table").data().iter().map(|&v| v as i32).collect();
    let (pages, max_pages, bt, lens) = plain_tables(cfg, &table, &c.suffix_lens, shared).unwrap();
    let g = plain_decode(cfg, pages, max_pages).unwrap();
    let named = vec![
        ("q".to_string(), get("q")),
        ("k_pages".into(), plain_pages(cfg, &get("k_prefix"), &get("k_pages"), shared).unwrap()),
        ("v_pages".into(), plain_pages(cfg, &get("v_prefix"), &get("v_pages"), shared).unwrap()),
        ("block_table".into(), Tensor::new(DType::I32, &[cfg.batch, max_pages], bt).unwrap()),
        ("seq_lens".into(), Tensor::new(DType::I32, &[cfg.batch], lens).unwrap()),
    ];
    (g, named)
}

fn interp(g: &sinter::Graph, named: &[(String, Tensor)]) -> Tensor {
    let refs: Vec<&Tensor> = named.iter().map(|(_, t)| t).collect();
    sinter::ir::interp::run_entry(g, &refs, &Bindings::new()).unwrap().remove(0)
}

/// The cascade graph on the interpreter equals plain paged decode over prefix + suffix
/// (private prefix copies and shared prefix pages alike) within bf16 rounding: the cascade
/// rounds its partial states to bf16 before each merge (`widen` 2 for those extra roundings).
#[test]
fn cascade_equals_plain_decode_on_the_interpreter() {
    for (i, c) in cases().iter().enumerate() {
        let g = cascade_decode(&c.cfg).unwrap();
        sinter::ir::verify(&g).unwrap();
        let ins = cascade_inputs(c, 40 + i as u64);
        let got = interp(&g, &ins);
        for shared in [false, true] {
            let (pg, pins) = plain_case(c, &ins, shared);
            let want = interp(&pg, &pins);
            check(&format!("{} (shared prefix pages: {shared})", c.name), &got, &want, 2.0).unwrap();
        }
    }
}

/// Through both lowerings: the fused graph has the prefix attention, the split-KV suffix
/// decode and merges as kernels of their families, and every kernel compiles to PTX that
/// ptxas assembles for sm_80 and sm_90a with no spills (the bench shape too).
#[cfg(feature = "llvm")]
#[test]
fn cascade_kernels_compile_and_assemble_without_spills() {
    use sinter::ir::Family;
    let Some(ptxas) = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap() else { return };
    let mut graphs: Vec<(String, sinter::Graph, bool)> = cases().iter().map(|c| (c.name.to_string(), cascade_decode(&c.cfg).unwrap(), true)).collect();
    graphs.push(("bench shape".into(), cascade_decode(&CascadeConfig::bench()).unwrap(), true));
    graphs.push(("fully masked rows".into(), sinter::ir::parse(MASKED).unwrap(), false));
    graphs.extend(LSE_CASES.iter().map(|(name, src)| (name.to_string(), sinter::ir::parse(src).unwrap(), false)));
    for (name, g, cascade) in &graphs {
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let kg = sinter::gpu::lower(g, lowering, &sinter::Target::SM_90A).unwrap_or_else(|e| panic!("{name} {lowering:?}: {e}"));
            let families: Vec<Family> = kg.kernels.values().map(|k| k.family).collect();
            for f in [Family::Attention, Family::PagedAttention, Family::AttentionMerge].into_iter().filter(|_| *cascade) {
                assert!(families.contains(&f), "{name} {lowering:?}: no {f:?} kernel in {families:?}");
            }
            for target in [sinter_codegen::Target::SM_80, sinter_codegen::Target::SM_90A] {
                for k in kg.kernels.keys() {
                    let plan = sinter_codegen::compile_kernel(&kg, k, &target).unwrap_or_else(|e| panic!("{name} {lowering:?} {k}: {e}"));
                    let r = sinter_codegen::ptxas::assemble_with(&ptxas, &plan.ptx, &target).unwrap_or_else(|e| panic!("{name} {k}: {e}"));
                    assert!(!r.functions.iter().any(|f| f.spills()), "{name} {lowering:?} {k} {}: spills\n{r}", target.name());
                }
            }
        }
    }
}

/// The graphs the GPU tests below run, for `precompile_gpu_test_kernels`.
#[cfg(feature = "llvm")]
pub(crate) fn precompile_graphs() -> Vec<sinter::Graph> {
    let mut out = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        out.push(cascade_decode(&c.cfg).unwrap());
        let ins = cascade_inputs(c, 40 + i as u64);
        for shared in [false, true] {
            out.push(plain_case(c, &ins, shared).0);
        }
    }
    out.push(sinter::ir::parse(MASKED).unwrap());
    out.extend(LSE_CASES.iter().map(|(_, src)| sinter::ir::parse(src).unwrap()));
    out
}

/// Fully masked rows through the lse kernels and the merge: causal prefill with more queries
/// than keys (rows 0..3 see nothing: O 0, lse −inf), merged with itself and with a finite
/// state.
const MASKED: &str = "func @main(%q: bf16[1, 2, 5, 64], %k: bf16[1, 2, 2, 64], %v: bf16[1, 2, 2, 64], %o2: bf16[1, 2, 5, 64], %l2: f32[1, 2, 5]) {
  %o: bf16[1, 2, 5, 64], %l: f32[1, 2, 5] = attention(%q, %k, %v) {scale=0.125, causal=true, heads=2, kv_heads=2, lse=true}
  %oo: bf16[1, 2, 5, 64], %ll: f32[1, 2, 5] = attention_merge(%o, %l, %o, %l)
  %of: bf16[1, 2, 5, 64], %lf: f32[1, 2, 5] = attention_merge(%o, %l, %o2, %l2)
  return %o, %l, %oo, %ll, %of, %lf
}";

/// The lse outputs of every attention generator on the GPU: split-KV paged decode with
/// sequences long enough for the sm_90 cluster merge (300 and 1000 keys) beside empty and
/// 1-key ones, the CUDA-core prefill (f32, D 40, causal with more queries than keys) and the
/// tensor-core prefill (bf16, GQA 3, tails).
const LSE_CASES: [(&str, &str); 3] = [
    (
        "paged lse, lengths 0/1/300/1000",
        "func @main(%q: bf16[4, 8, 1, 128], %kp: bf16[300, 16, 2, 128], %vp: bf16[300, 16, 2, 128], %bt: i32[4, 64], %lens: i32[4]) {
  %o: bf16[4, 8, 1, 128], %l: f32[4, 8, 1] = paged_attention(%q, %kp, %vp, %bt, %lens) {scale=0.08838834764831843, heads=8, kv_heads=2, lse=true}
  return %o, %l
}",
    ),
    (
        "CUDA-core prefill lse f32",
        "func @main(%q: f32[1, 4, 33, 40], %k: f32[1, 2, 20, 40], %v: f32[1, 2, 20, 40]) {
  %o: f32[1, 4, 33, 40], %l: f32[1, 4, 33] = attention(%q, %k, %v) {scale=0.15, causal=true, heads=4, kv_heads=2, lse=true}
  return %o, %l
}",
    ),
    (
        "tensor-core prefill lse bf16 GQA 3",
        "func @main(%q: bf16[2, 6, 70, 128], %k: bf16[2, 2, 129, 128], %v: bf16[2, 2, 129, 128]) {
  %o: bf16[2, 6, 70, 128], %l: f32[2, 6, 70] = attention(%q, %k, %v) {scale=0.08838834764831843, heads=6, kv_heads=2, lse=true}
  return %o, %l
}",
    ),
];

/// Inputs of an [`LSE_CASES`] graph: random floats; for the paged case a scrambled table and
/// lengths 0, 1, 300 and 1000.
fn lse_inputs(g: &sinter::Graph, seed: u64) -> Vec<(String, Tensor)> {
    let f = g.entry().unwrap();
    let mut rng = Rng::new(seed);
    f.params
        .iter()
        .map(|&p| {
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
            let name = f.values[p].name.clone().unwrap();
            let t = match name.as_str() {
                "bt" => Tensor::from_fn(DType::I32, &shape, |i| ((7 * (i[0] * shape[1] + i[1]) + 3) % 300) as f64),
                "lens" => Tensor::new(DType::I32, &shape, vec![0.0, 1.0, 300.0, 1000.0]).unwrap(),
                _ => Tensor::from_fn(ty.dtype, &shape, |_| rng.next_f64()),
            };
            (name, t)
        })
        .collect()
}

#[test]
fn gpu_lse_outputs_match_the_interpreter() {
    let Some(dev) = device() else { return };
    let b = Bindings::new();
    let mut fails = Vec::new();
    for (i, (name, src)) in LSE_CASES.iter().enumerate() {
        let g = sinter::ir::parse(src).unwrap();
        let ins = lse_inputs(&g, 60 + i as u64);
        let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
        let want = sinter::ir::interp::run_entry(&g, &refs, &b).unwrap();
        let named: Vec<(&str, &Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            match GpuProgram::compile(&g, &dev, lowering).and_then(|p| p.run(&named, &b)) {
                Ok(got) => {
                    // The lse (output 1, f32) sums `ex2.approx` probabilities on tensor cores
                    // (≤ 2 ulp each): 4× the f32 tolerance.
                    for (j, (o, r)) in got.iter().zip(&want).enumerate() {
                        fails.extend(check(&format!("{name} [{lowering:?}] output {j}"), o, r, if j == 1 { 4.0 } else { 1.0 }).err());
                    }
                }
                Err(e) => fails.push(format!("{name} [{lowering:?}]: {e}")),
            }
        }
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

/// On the GPU, both lowerings: the cascade matches the interpreter and the plain decode's GPU
/// result; fully masked rows give exactly 0 and −inf.
#[test]
fn gpu_cascade_matches_interpreter_and_plain_decode() {
    let Some(dev) = device() else { return };
    let mut fails = Vec::new();
    let b = Bindings::new();
    for (i, c) in cases().iter().enumerate() {
        let g = cascade_decode(&c.cfg).unwrap();
        let ins = cascade_inputs(c, 40 + i as u64);
        let want = interp(&g, &ins);
        let (pg, pins) = plain_case(c, &ins, false);
        let named: Vec<(&str, &Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let pnamed: Vec<(&str, &Tensor)> = pins.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let plain = GpuProgram::compile(&pg, &dev, Lowering::Fused).and_then(|p| p.run(&pnamed, &b)).map(|mut v| v.remove(0));
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let label = format!("{} [{lowering:?}]", c.name);
            match GpuProgram::compile(&g, &dev, lowering).and_then(|p| p.run(&named, &b)) {
                Ok(got) => {
                    fails.extend(check(&format!("{label} vs interpreter"), &got[0], &want, 1.0).err());
                    match &plain {
                        Ok(p) => fails.extend(check(&format!("{label} vs plain decode on the GPU"), &got[0], p, 2.0).err()),
                        Err(e) => fails.push(format!("{label}: plain decode: {e}")),
                    }
                }
                Err(e) => fails.push(format!("{label}: {e}")),
            }
        }
    }
    // Fully masked rows.
    let g = sinter::ir::parse(MASKED).unwrap();
    let mut rng = Rng::new(7);
    let mut rnd = |dt: DType, shape: &[usize]| Tensor::from_fn(dt, shape, |_| rng.next_f64());
    let ins = [("q", rnd(DType::BF16, &[1, 2, 5, 64])), ("k", rnd(DType::BF16, &[1, 2, 2, 64])), ("v", rnd(DType::BF16, &[1, 2, 2, 64])), ("o2", rnd(DType::BF16, &[1, 2, 5, 64])), ("l2", rnd(DType::F32, &[1, 2, 5]))];
    let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
    let want = sinter::ir::interp::run_entry(&g, &refs, &b).unwrap();
    let named: Vec<(&str, &Tensor)> = ins.iter().map(|(n, t)| (*n, t)).collect();
    for lowering in [Lowering::Unfused, Lowering::Fused] {
        match GpuProgram::compile(&g, &dev, lowering).and_then(|p| p.run(&named, &b)) {
            Ok(got) => {
                for (j, (o, r)) in got.iter().zip(&want).enumerate() {
                    // The lse outputs (odd j, f32) come from `ex2.approx` probabilities (≤ 2 ulp
                    // each) on tensor cores: 4× the f32 tolerance.
                    let widen = if j % 2 == 1 { 4.0 } else { 1.0 };
                    fails.extend(check(&format!("fully masked rows [{lowering:?}] output {j}"), o, r, widen).err());
                }
                // Rows 0..3 of each head: O exactly 0, lse exactly −inf, after the self-merge too.
                for (o, l) in [(&got[0], &got[1]), (&got[2], &got[3])] {
                    for h in 0..2 {
                        for r in 0..3 {
                            let row = (h * 5 + r) * 64;
                            if o.data()[row..row + 64].iter().any(|&x| x != 0.0) || l.data()[h * 5 + r] != f64::NEG_INFINITY {
                                fails.push(format!("fully masked row {r} of head {h} [{lowering:?}]: not 0 / -inf"));
                            }
                        }
                    }
                }
            }
            Err(e) => fails.push(format!("fully masked rows [{lowering:?}]: {e}")),
        }
    }
    if fails.is_empty() {
        eprintln!("ok: cascade on the GPU ({} cases, fully masked rows)", cases().len());
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

/// The bench shape's graph and its fused kernels (family, outputs, the ops of each body) as
/// a snapshot: the prefix attention on all chunks at once, the merge tree, the suffix decode
/// and the final merge, each a kernel of its family.
#[test]
fn bench_shape_kernels() {
    let g = cascade_decode(&CascadeConfig::bench()).unwrap();
    let text = sinter::ir::print(&g);
    assert_eq!(sinter::ir::print(&sinter::ir::parse(&text).unwrap()), text);
    let kg = sinter::gpu::lower(&g, Lowering::Fused, &sinter::Target::SM_90A).unwrap();
    let mut out = format!("{text}\n# fused kernels\n");
    for (k, kd) in kg.kernels.iter() {
        let outs: Vec<String> = kd.outputs.iter().map(|&b| kg.buffers[b].ty.to_string()).collect();
        let ops: Vec<&str> = kd.body.nodes.values().map(|nd| nd.op.kind.name()).collect();
        out.push_str(&format!("{k} {:?} -> {} : {}\n", kd.family, outs.join(", "), ops.join(" ")));
    }
    insta::assert_snapshot!("cascade_bench_shape", out);
}

/// The builders refuse what they cannot build with an error naming it, not a panic.
#[test]
fn cascade_builders_refuse_bad_configs() {
    let bad = CascadeConfig { chunks: 3, ..CascadeConfig::bench() };
    assert!(cascade_decode(&bad).unwrap_err().to_string().contains("chunks a power of two"));
    let bad = CascadeConfig { heads: 30, ..CascadeConfig::bench() };
    assert!(cascade_decode(&bad).is_err());
    let c = CascadeConfig { prefix_len: 40, chunks: 8, ..cases().remove(0).cfg };
    let e = plain_tables(&c, &[0; 9], &[0; 3], false).unwrap_err().to_string();
    assert!(e.contains("multiple of page_size"), "{e}");
    let c = cases().remove(0).cfg;
    assert!(plain_tables(&c, &[0; 4], &[0; 3], true).is_err());
    let t = Tensor::zeros(DType::BF16, &[3, 4, 64]);
    assert!(plain_pages(&c, &t, &t, true).is_err());
}
