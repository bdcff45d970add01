//! Tensor parallelism on the CPU: every zoo architecture sharded for N ranks by
//! `sinter_passes::shard`, run as N simulated ranks (`run_ranks`), equals the unsharded graph;
//! the plan is Megatron's where the heads divide; what does not divide is an error naming it
//! (strict) or stays whole (not strict).

use sinter::ir::interp::{run_entry, run_ranks};
use sinter::zoo::{gemma3, gpt2, gpt2_paged, llama, qwen, Mode};
use sinter::{Bindings, DType, Graph, Tensor};
use sinter_passes::shard::{shard, Placement, ShardError, ShardOptions};

use crate::zoo::Rng;

/// Shards `g` for `ranks`, runs the ranks on the interpreter, and compares the assembled
/// outputs with the unsharded run: relative to each output's largest magnitude, `tol`.
fn check(what: &str, g: &Graph, mode: Mode, ranks: usize, strict: bool, tol: f64) -> sinter_passes::shard::ShardPlan {
    let ins = crate::zoo::graph_inputs(g, mode, 11);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = run_entry(g, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: unsharded: {e}"));
    let plan = shard(g, &ShardOptions { strict, ..ShardOptions::new(ranks) }).unwrap_or_else(|e| panic!("{what}: {e}"));
    if std::env::var("SINTER_SHARD_DUMP").is_ok_and(|w| what.starts_with(&w)) {
        eprintln!("{what}:\n{}\nreplicated: {:?}", sinter::ir::print(&plan.graph), plan.replicated);
    }
    let per_rank: Vec<Vec<Tensor>> = (0..ranks).map(|r| plan.rank_inputs(&refs, r).unwrap()).collect();
    let entry = plan.graph.entry().unwrap().name.clone();
    let outs = run_ranks(&plan.graph, &entry, &per_rank, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: ranks: {e}"));
    let got = plan.assemble(&outs).unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.shape(), b.shape(), "{what}: output {k}");
        let scale = b.data().iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
        for (j, (x, y)) in a.data().iter().zip(b.data()).enumerate() {
            assert!((x - y).abs() <= tol * scale, "{what}: output {k} element {j}: sharded {x} vs unsharded {y} (scale {scale})");
        }
    }
    plan
}

/// The zoo's architectures at their tiny configurations, prefill and decode.
fn zoo(dtype: DType) -> Vec<(String, Graph, Mode)> {
    let mut v = Vec::new();
    for mode in [Mode::Prefill, Mode::Decode] {
        let m = format!("{mode:?}");
        v.push((format!("llama {m}"), llama::build(&llama::LlamaConfig::tiny(), mode, dtype).unwrap(), mode));
        v.push((format!("qwen2 {m}"), qwen::build(&qwen::QwenConfig::tiny(qwen::QwenArch::Qwen2), mode, dtype).unwrap(), mode));
        v.push((format!("qwen3 {m}"), qwen::build(&qwen::QwenConfig::tiny(qwen::QwenArch::Qwen3), mode, dtype).unwrap(), mode));
        v.push((format!("gemma3 {m}"), gemma3::build(&gemma3::Gemma3Config::tiny(), mode, dtype).unwrap(), mode));
        v.push((format!("gpt2 paged {m}"), gpt2_paged::build(&gpt2::Gpt2Config::tiny(), mode, dtype, 4).unwrap(), mode));
    }
    v.push(("gpt2".into(), gpt2::build(&gpt2::Gpt2Config::tiny(), dtype).unwrap(), Mode::Prefill));
    v
}

#[test]
fn sharded_zoo_graphs_equal_the_unsharded_on_simulated_ranks() {
    for (name, g, mode) in zoo(DType::F32) {
        for ranks in [1, 2, 4] {
            // One rank: the same arithmetic (collectives of one rank are the identity).
            let tol = if ranks == 1 { 0.0 } else { 1e-5 };
            let plan = check(&format!("{name}, {ranks} ranks"), &g, mode, ranks, false, tol);
            let split = plan.params.iter().filter(|p| matches!(p.placement, Placement::Split(_))).count();
            if ranks == 2 {
                // Heads divide by 2 in every tiny config: Megatron's plan, two all-reduces a
                // layer (attention output, MLP down), every matrix of a layer split.
                assert!(plan.replicated.is_empty(), "{name}: {:?}", plan.replicated);
                assert!(plan.collectives.0 >= 4, "{name}: {:?}", plan.collectives);
                assert!(split >= 8, "{name}: {split} split parameters");
            }
        }
    }
}

#[test]
fn sharded_bf16_graphs_equal_the_unsharded_within_bf16() {
    for (name, g, mode) in zoo(DType::BF16).into_iter().filter(|(n, _, _)| n.starts_with("llama") || n.starts_with("gemma3")) {
        check(&format!("{name} bf16"), &g, mode, 2, true, 3e-2);
    }
}

#[test]
fn shard_plan_of_a_llama_decode_layer_is_megatrons() {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Decode, DType::BF16).unwrap();
    let plan = shard(&g, &ShardOptions::new(2)).unwrap();
    // The layer stays one function, placed once for every layer.
    let names: Vec<&str> = plan.graph.funcs.values().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["layer", "main"]);
    let f = plan.graph.entry().unwrap();
    let mut lines = Vec::new();
    for (ps, &v) in plan.params.iter().zip(&f.params) {
        lines.push(format!("{:<28} {:<22} {:?}", f.values[v].name.clone().unwrap_or_default(), f.ty(v).to_string(), ps.placement));
    }
    lines.push(format!("outputs: {:?}", plan.outputs));
    lines.push(format!("all_reduce {}, all_gather {}", plan.collectives.0, plan.collectives.1));
    if std::env::var_os("SINTER_SHARD_DUMP").is_some() {
        eprintln!("{}", sinter::ir::print(&plan.graph));
    }
    insta::assert_snapshot!(lines.join("\n"));
}

#[test]
fn indivisible_heads_or_dims_are_errors_naming_them() {
    // 4 query heads, 2 KV heads: 4 ranks do not divide the KV heads.
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Decode, DType::F32).unwrap();
    let e = shard(&g, &ShardOptions::new(4)).unwrap_err();
    assert!(matches!(e, ShardError::Indivisible { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("2 KV heads") && msg.contains("4 ranks") && msg.contains("paged_attention"), "{msg}");
    // Prefill writes attention out (no attention node): the reshape into heads is named.
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Prefill, DType::F32).unwrap();
    let msg = shard(&g, &ShardOptions::new(4)).unwrap_err().to_string();
    assert!(msg.contains("reshape") && msg.contains("4 ranks"), "{msg}");
    // 3 ranks: the hidden size 32 does not divide.
    let msg = shard(&g, &ShardOptions::new(3)).unwrap_err().to_string();
    assert!(msg.contains("3 ranks") && msg.contains("weight"), "{msg}");
    assert!(matches!(shard(&g, &ShardOptions::new(0)), Err(ShardError::NoRanks)));
    // Not strict: the same graph runs, what does not divide kept whole and listed.
    let plan = check("llama prefill, 4 ranks, not strict", &g, Mode::Prefill, 4, false, 1e-5);
    assert!(!plan.replicated.is_empty());
}

#[test]
fn a_sharded_graph_run_alone_or_with_wrong_inputs_is_a_clear_error() {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Decode, DType::F32).unwrap();
    let plan = shard(&g, &ShardOptions::new(2)).unwrap();
    let ins = crate::zoo::graph_inputs(&g, Mode::Decode, 3);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let r0 = plan.rank_inputs(&refs, 0).unwrap();
    let r0refs: Vec<&Tensor> = r0.iter().collect();
    let e = run_entry(&plan.graph, &r0refs, &Bindings::new()).unwrap_err().to_string();
    assert!(e.contains("2 ranks") && e.contains("run_ranks"), "{e}");
    assert!(plan.rank_inputs(&refs, 2).is_err());
    assert!(plan.rank_inputs(&refs[..3], 0).is_err());
}

#[test]
fn full_size_smollm2_shards_over_3_ranks_with_two_all_reduces_a_layer() {
    // SmolLM2-135M: 9 query and 3 KV heads divide by 3 (not by 2 or 4).
    let g = sinter::zoo::build("smollm2-135m", Mode::Decode, DType::BF16).unwrap();
    let t0 = std::time::Instant::now();
    let plan = shard(&g, &ShardOptions::new(3)).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(plan.collectives, (2 * 30 + 1, 1), "two all-reduces a layer and one of the embedding lookup, the logits gathered once");
    assert!(plan.replicated.is_empty(), "{:?}", plan.replicated);
    let names: Vec<&str> = plan.graph.funcs.values().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["layer", "main"]);
    // Each rank holds a third of every matrix and of the tied embedding (its rows serve the
    // lookup and the LM head), the norms whole, and its index (8 bytes).
    let text = plan.describe(&g);
    assert!(text.contains("over 3 ranks"), "{text}");
    let bytes = |f: &sinter::ir::Function| f.params.iter().filter_map(|&p| {
        let t = f.ty(p);
        t.shape.iter().map(|d| d.as_const()).product::<Option<i64>>().map(|n| n as usize * t.dtype.size_bytes())
    }).sum::<usize>();
    let (full, rank) = (bytes(g.entry().unwrap()), bytes(plan.graph.entry().unwrap()));
    let (embed, norms) = (49152 * 576 * 2, (2 * 30 + 1) * 576 * 2);
    assert_eq!(rank, embed / 3 + norms + (full - embed - norms) / 3 + 8, "{text}");
    eprintln!("{text}sharded in {secs:.2} s");
    assert!(sinter::ir::interp::run_entry(&plan.graph, &[], &sinter::Bindings::new()).is_err());
}

/// Shards a hand-written graph (weights: its parameters of a fixed shape) for 2 ranks, runs
/// both on seeded inputs (T = 3), and compares.
fn check_text(what: &str, src: &str) {
    let g = sinter::ir::parse(src).unwrap_or_else(|e| panic!("{what}: {e}"));
    let f = g.entry().unwrap();
    let mut rng = Rng::new(5);
    let ins: Vec<Tensor> = f
        .params
        .iter()
        .map(|&p| {
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap_or(3) as usize).collect();
            Tensor::from_fn(ty.dtype, &shape, |_| if ty.dtype.is_float() { rng.next_f64() } else { ((rng.next_f64() + 1.0) * 4.0).floor() })
        })
        .collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = run_entry(&g, &refs, &Bindings::new()).unwrap();
    let plan = shard(&g, &ShardOptions { strict: false, ..ShardOptions::new(2) }).unwrap_or_else(|e| panic!("{what}: {e}"));
    let per_rank: Vec<Vec<Tensor>> = (0..2).map(|r| plan.rank_inputs(&refs, r).unwrap()).collect();
    let entry = plan.graph.entry().unwrap().name.clone();
    let got = plan.assemble(&run_ranks(&plan.graph, &entry, &per_rank, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: {e}"))).unwrap();
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.shape(), b.shape(), "{what}: output {k}\n{}", sinter::ir::print(&plan.graph));
        for (x, y) in a.data().iter().zip(b.data()) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what}: output {k}: {x} vs {y}");
        }
    }
}

#[test]
fn hand_written_corners_shard_to_the_same_results() {
    // A fused projection scaled by a constant, then sliced: the constant is not sliced.
    check_text(
        "scaled fused projection",
        "func @main(%x: f32[T, 16], %w: f32[24, 16]) {\n  %h: f32[T, 24] = matmul(%x, %w) {transpose_b=true}\n  %c: f32[] = constant() {value=0.5, dtype=f32}\n  %y: f32[T, 24] = mul(%h, %c)\n  %q: f32[T, 8] = slice(%y) {axis=1, start=0, end=8}\n  %k: f32[T, 8] = slice(%y) {axis=1, start=8, end=16}\n  %v: f32[T, 8] = slice(%y) {axis=1, start=16, end=24}\n  return %q, %k, %v\n}\n",
    );
    // A symbolic axis is never split where no split argument bound it.
    check_text(
        "broadcast along T",
        "func @main(%tok: i64[T], %w: f32[1, 8]) {\n  %b: f32[T, 8] = broadcast(%w) {shape=[T, 8]}\n  %s: f32[T, 8] = softmax(%b)\n  return %s\n}\n",
    );
    // An integer sum over a split axis is gathered, not all-reduced.
    check_text(
        "integer count over a split axis",
        "func @main(%x: f32[T, 16], %w: f32[32, 16]) {\n  %h: f32[T, 32] = matmul(%x, %w) {transpose_b=true}\n  %z: f32[] = constant() {value=0.0, dtype=f32}\n  %p: bool[T, 32] = ge(%h, %z)\n  %i: i32[T, 32] = cast(%p) {dtype=i32}\n  %n: i32[T, 1] = reduce_sum(%i) {axis=1}\n  return %n\n}\n",
    );
}
