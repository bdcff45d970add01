//! The GPU twin of `tests/hf_reference.rs`: every architecture with a fixture, loaded from
//! the fixture's folder and served by the GPU engine (fused lowering), against transformers.
//!
//! - f32: teacher-forced logits of every prompt's sequence (prompt + transformers' greedy
//!   continuation) within [`F32_REL_TOL`] (GPU) of the fixture's f32 rows, argmax equal where the
//!   margin allows; greedy decoding of 32 steps at batch 1 (each prompt) and at batch 3 (all
//!   three, of different lengths, at once) gives transformers' tokens, a divergence being
//!   allowed only at a step whose fixture margin is at most twice the tolerance (printed, and
//!   the rest of that sequence not compared: its context differs from there on); decode
//!   steps replayed from a CUDA graph give the eager steps' tokens, token for token.
//! - bf16: teacher-forced logits of every prompt against the fixture's bf16 rows within a
//!   tolerance derived from the fixture itself ([`bf16_rel_tol`]), and our top 8 overlapping
//!   the f32 top 8 about as much as transformers' bf16 top 8 does.
//!
//! One engine per (architecture, dtype), reused by every check: compiling is the cost.

use sinter::gpu::Lowering;
use sinter::llm::{DecoderModel, Engine, SampleOptions};
use sinter::DType;

use super::device;
use crate::hf_reference::{compare, one_model_at_a_time, open_fixture, Fixture, Rows};

/// Relative tolerance of the GPU's f32 logits against transformers' f32 logits (of the row's
/// largest logit): the GPU twin of `tests/decoder.rs` holds the GPU's f32 engine to 5e-3
/// against a full recompute (approximate `ex2`, other reduction orders and tiles than the
/// interpreter's); the same here. The test prints the measured differences to tighten it.
const F32_REL_TOL: f64 = 5e-3;

/// The tolerance of our bf16 logits against transformers' bf16 logits, relative to the row's
/// largest logit: four times the largest error of transformers' own bf16 rows against its f32
/// rows at the kept columns (both are bf16 computations of the same function with different
/// rounding points, so each may be off from f32 by about that much and from the other by
/// twice that; four leaves a factor of two), and at least 1e-2.
pub(crate) fn bf16_rel_tol(fx: &Fixture) -> f64 {
    let mut worst = 0f64;
    for (a, b) in fx.f32_rows.iter().zip(&fx.bf16_rows) {
        for p in 0..a.cols.len() {
            let scale = a.top_vals[p]
                .iter()
                .chain(&a.cols[p])
                .fold(0f64, |m, x| m.max(x.abs()))
                .max(f64::MIN_POSITIVE);
            for (x, y) in a.cols[p].iter().zip(&b.cols[p]) {
                worst = worst.max((x - y).abs() / scale);
            }
        }
    }
    (4.0 * worst).max(1e-2)
}

/// Mean over every position of every prompt of how many of `a`'s top 8 ids are in `b`'s.
fn top8_overlap(a: &[Rows], b: &[Rows]) -> f64 {
    let (mut hits, mut n) = (0usize, 0usize);
    for (ra, rb) in a.iter().zip(b) {
        for (ta, tb) in ra.top_ids.iter().zip(&rb.top_ids) {
            hits += ta.iter().filter(|t| tb.contains(t)).count();
            n += 1;
        }
    }
    hits as f64 / n.max(1) as f64
}

/// Compares greedy continuations `got[k]` of prompts `which[k]` with the fixture's: equal,
/// except that a divergence at a step whose fixture margin is at most twice the f32
/// tolerance of that step's row ends the comparison of that sequence (printed). Returns the
/// failures.
fn check_greedy(fx: &Fixture, got: &[Vec<u32>], which: &[usize], label: &str) -> Vec<String> {
    let mut fails = Vec::new();
    for (g, &i) in got.iter().zip(which) {
        let (want, margins, rows) = (&fx.greedy[i], &fx.margins[i], &fx.f32_rows[i]);
        if g.len() != want.len() {
            fails.push(format!(
                "{label}: prompt {i}: {} tokens, transformers made {}",
                g.len(),
                want.len()
            ));
            continue;
        }
        let Some(j) = g.iter().zip(want).position(|(a, b)| a != b) else {
            continue;
        };
        // The logits of step j are the teacher-forced row after the prompt and j tokens.
        let p = fx.prompts[i].len() + j - 1;
        let scale = rows.top_vals[p]
            .iter()
            .chain(&rows.cols[p])
            .fold(0f64, |m, x| m.max(x.abs()));
        let tol = F32_REL_TOL * scale;
        if margins[j] <= 2.0 * tol {
            eprintln!("{label}: prompt {i} diverges at step {j} ({} vs transformers' {}) where transformers' margin is {:.3e} ≤ 2·tol {:.3e}: not compared further", g[j], want[j], margins[j], 2.0 * tol);
        } else {
            fails.push(format!("{label}: prompt {i}, step {j}: token {} vs transformers' {} (margin {:.3e} > 2·tol {:.3e}); ours {:?}, theirs {:?}", g[j], want[j], margins[j], 2.0 * tol, g, want));
        }
    }
    fails
}

/// Greedy continuations of `prompts` (exactly `steps` tokens each, EOS not stopping them).
fn greedy<M: DecoderModel>(
    engine: &Engine<M>,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Vec<Vec<u32>> {
    let o = SampleOptions {
        stop_at_eos: false,
        ..SampleOptions::greedy(steps)
    };
    engine.generate(prompts, &o, &mut |_, _| {}).unwrap().tokens
}

/// Teacher-forced logits of every prompt's sequence against `want` (the fixture's f32 or bf16
/// rows) within `rel`; prints the measured differences; returns the failures and the rows'
/// top-8 ids (for the overlap check).
fn teacher_forced<M: DecoderModel>(
    engine: &Engine<M>,
    fx: &Fixture,
    want: &[Rows],
    rel: f64,
    label: &str,
) -> (Vec<String>, Vec<Rows>) {
    let vocab = engine.model().vocab();
    let (mut fails, mut ours) = (Vec::new(), Vec::new());
    for (i, rows) in want.iter().enumerate() {
        let logits = engine.logits(&rows.tokens).unwrap();
        let a = compare(
            logits.data(),
            vocab,
            rows,
            &fx.cols,
            rel,
            &format!("{label} prompt {i}"),
        );
        eprintln!(
            "{label} prompt {i}: {} positions, max |diff| {:.3e} ({:.3e} of max|logit| {:.2}; tol {rel:.1e}), argmax checked at {} ({} skipped), top-8 overlap {:.2}",
            rows.tokens.len(),
            a.max_abs,
            a.max_rel,
            a.scale,
            a.argmax_checked,
            a.argmax_skipped,
            a.top8_overlap
        );
        fails.extend(a.failures);
        let d = logits.data();
        let top_ids = (0..rows.tokens.len())
            .map(|p| crate::hf_reference::top_k(&d[p * vocab..(p + 1) * vocab], 8))
            .collect();
        ours.push(Rows {
            tokens: rows.tokens.clone(),
            top_ids,
            top_vals: vec![],
            cols: vec![],
        });
    }
    (fails, ours)
}

/// The f32 checks on one engine: teacher-forced logits, greedy at batch 1 and 3 against
/// transformers, CUDA-graph decode against eager decode.
fn f32_checks<M: DecoderModel>(engine: &mut Engine<M>, fx: &Fixture, on: &str) -> Vec<String> {
    let label = format!("{} f32 ({on})", fx.arch);
    let (mut fails, _) = teacher_forced(engine, fx, &fx.f32_rows, F32_REL_TOL, &label);
    let all: Vec<usize> = (0..fx.prompts.len()).collect();
    let mut runs: Vec<(bool, Vec<Vec<u32>>, Vec<Vec<u32>>)> = Vec::new();
    for graph in [false, true] {
        engine.set_cuda_graph(graph);
        let one: Vec<Vec<u32>> = fx
            .prompts
            .iter()
            .map(|p| greedy(engine, std::slice::from_ref(p), fx.steps).remove(0))
            .collect();
        let three = greedy(engine, &fx.prompts, fx.steps);
        runs.push((graph, one, three));
    }
    let (_, eager1, eager3) = &runs[0];
    fails.extend(check_greedy(
        fx,
        eager1,
        &all,
        &format!("{label} greedy batch 1"),
    ));
    fails.extend(check_greedy(
        fx,
        eager3,
        &all,
        &format!("{label} greedy batch 3"),
    ));
    let (_, graph1, graph3) = &runs[1];
    if graph1 != eager1 || graph3 != eager3 {
        fails.push(format!("{label}: CUDA-graph decode differs from eager decode: batch 1 {graph1:?} vs {eager1:?}; batch 3 {graph3:?} vs {eager3:?}"));
    }
    fails
}

/// Every check of one fixture on the engines `make(dtype)` builds (`on` names them in
/// messages): f32 first, dropped before the bf16 one is made.
fn all_checks<M: DecoderModel>(fx: &Fixture, make: impl Fn(DType) -> Engine<M>, on: &str) {
    let mut engine = make(DType::F32);
    let mut fails = f32_checks(&mut engine, fx, on);
    drop(engine);
    let engine = make(DType::BF16);
    let label = format!("{} bf16 ({on})", fx.arch);
    let rel = bf16_rel_tol(fx);
    let (f, ours) = teacher_forced(&engine, fx, &fx.bf16_rows, rel, &label);
    fails.extend(f);
    let (theirs_overlap, our_overlap) = (
        top8_overlap(&fx.bf16_rows, &fx.f32_rows),
        top8_overlap(&ours, &fx.f32_rows),
    );
    eprintln!("{label}: top 8 shared with transformers' f32 top 8: ours {our_overlap:.2}, transformers' bf16 {theirs_overlap:.2} (of 8)");
    if our_overlap < theirs_overlap - 1.0 {
        fails.push(format!("{label}: our bf16 top 8 shares {our_overlap:.2} ids with the f32 top 8, transformers' bf16 shares {theirs_overlap:.2}"));
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// Every GPU check of one architecture (skipped without a GPU or without its fixture).
fn gpu_matches(arch: &str) {
    let Some(dev) = device() else { return };
    let Some(fx) = Fixture::load(arch) else {
        return;
    };
    fx.assert_registered();
    let _turn = one_model_at_a_time();
    all_checks(
        &fx,
        |dt| Engine::new_gpu(open_fixture(&fx, dt), &dev, Lowering::Fused).unwrap(),
        "GPU",
    );
}

/// The same checks on the interpreter, for working on them without a GPU (slow: about 40 s
/// an architecture of two layers): runs the architectures `SINTER_HF_ARCHS` names, and
/// says it was skipped when the variable is not set.
#[test]
fn hf_gpu_checks_on_the_interpreter() {
    let Ok(archs) = std::env::var("SINTER_HF_ARCHS") else {
        eprintln!("hf_gpu_checks_on_the_interpreter: skipped (minutes of interpreter time): set SINTER_HF_ARCHS, e.g. \"llama gpt2\", to run it");
        return;
    };
    for arch in archs.split_whitespace() {
        let Some(fx) = Fixture::load(arch) else {
            continue;
        };
        let _turn = one_model_at_a_time();
        all_checks(
            &fx,
            |dt| Engine::new(open_fixture(&fx, dt)).unwrap(),
            "interpreter",
        );
    }
}

#[test]
fn gpu_hf_llama_matches_transformers() {
    gpu_matches("llama");
}

#[test]
fn gpu_hf_gpt2_matches_transformers() {
    gpu_matches("gpt2");
}

#[test]
fn gpu_hf_qwen2_matches_transformers() {
    gpu_matches("qwen2");
}

#[test]
fn gpu_hf_qwen3_matches_transformers() {
    gpu_matches("qwen3");
}

#[test]
fn gpu_hf_gemma3_matches_transformers() {
    gpu_matches("gemma3");
}

/// The graphs these tests run, for `precompile_gpu_test_kernels`: for every fixture present,
/// in f32 and bf16, the prefill graph, the symbolic decode graph and the decode graph
/// specialised to batches 1 and 3.
#[cfg(feature = "llvm")]
pub(super) fn precompile_graphs() -> Vec<sinter::Graph> {
    let mut out = Vec::new();
    for fx in Fixture::all() {
        if sinter::llm::registry::architecture(fx.model_type(), std::path::Path::new("config.json"))
            .is_err()
        {
            continue;
        }
        for dt in [DType::F32, DType::BF16] {
            let m = open_fixture(&fx, dt);
            out.push(m.graph(sinter::zoo::Mode::Prefill).unwrap());
            out.push(m.graph(sinter::zoo::Mode::Decode).unwrap());
            for b in [1, 3] {
                out.push(m.decode_graph_for_batch(b).unwrap());
            }
        }
    }
    out
}
