//! SmolLM2-135M-Instruct end to end on the interpreter, against a fixture made by an
//! independent implementation (transformers 5.17 on an H200, `bench/fixtures/smollm2_fixture.py`):
//! the chat-templated token ids, and the teacher-forced logits of the first 8 positions in f32
//! and bf16. Also the bad-input cases of the model loader.
//!
//! The model comes from the cache (`scripts/setup` fetches it). Where it is missing the tests
//! say so and pass — except under `CI`, where they fail.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use sinter::llm::gguf::ModelError;
use sinter::llm::{fetch, Engine, LlamaModel, SampleOptions};
use sinter::DType;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smollm2");
const POSITIONS: usize = 8;

fn model_path() -> Option<PathBuf> {
    let p = fetch::default_model_path();
    if p.exists() {
        return Some(p);
    }
    assert!(std::env::var_os("CI").is_none(), "{} is missing: run scripts/setup", p.display());
    eprintln!("skipped: {} is missing (run scripts/setup)", p.display());
    None
}

fn engine(dtype: DType) -> Option<Arc<Engine<LlamaModel>>> {
    static F32: OnceLock<Arc<Engine<LlamaModel>>> = OnceLock::new();
    static BF16: OnceLock<Arc<Engine<LlamaModel>>> = OnceLock::new();
    let path = model_path()?;
    let cell = if dtype == DType::F32 { &F32 } else { &BF16 };
    Some(cell.get_or_init(|| Arc::new(Engine::new(LlamaModel::load(&path, dtype, |_, _| {}).unwrap()).unwrap())).clone())
}

struct Prompt {
    text: String,
    ids: Vec<u32>,
    margins: Vec<f64>,
}

fn fixture() -> Vec<Prompt> {
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/fixture.json")).unwrap()).unwrap();
    j["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Prompt {
            text: p["text"].as_str().unwrap().to_string(),
            ids: p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect(),
            margins: p["top2_margin_f32"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
        })
        .collect()
}

fn reference_logits(dtype: &str, i: usize) -> Vec<f32> {
    let b = std::fs::read(format!("{FIXTURE}/logits_{dtype}_{i}.bin")).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn chat_template_and_tokenizer_match_transformers() {
    let Some(e) = engine(DType::BF16) else { return };
    for p in fixture() {
        assert_eq!(e.model().chat_prompt(&p.text).unwrap(), p.ids, "token ids of {:?}", p.text);
    }
}

/// Teacher-forced logits of the first 8 positions against transformers; returns the largest
/// absolute difference. Greedy tokens must agree wherever the reference's top-2 margin
/// exceeds the tolerance.
fn compare_logits(dtype: DType, name: &str, tol: f64) -> f64 {
    compare_logits_with(dtype, name, name, tol)
}

fn compare_logits_with(dtype: DType, name: &str, reference: &str, tol: f64) -> f64 {
    let Some(e) = engine(dtype) else { return 0.0 };
    let vocab = e.model().cfg.vocab;
    let mut worst: f64 = 0.0;
    for (i, p) in fixture().iter().enumerate() {
        let ours = e.logits(&p.ids[..POSITIONS]).unwrap();
        let theirs = reference_logits(reference, i);
        for pos in 0..POSITIONS {
            let a = &ours.data()[pos * vocab..(pos + 1) * vocab];
            let b = &theirs[pos * vocab..(pos + 1) * vocab];
            let diff = a.iter().zip(b).map(|(x, y)| (x - *y as f64).abs()).fold(0.0, f64::max);
            worst = worst.max(diff);
            assert!(diff <= tol, "{name} prompt {i} position {pos}: max |logit diff| {diff} > {tol}");
            let am = |r: &[f64]| r.iter().enumerate().fold(0, |m, (j, &x)| if x > r[m] { j } else { m });
            let bm = b.iter().enumerate().fold(0, |m, (j, &x)| if x > b[m] { j } else { m });
            if p.margins[pos] > tol {
                assert_eq!(am(a), bm, "{name} prompt {i} position {pos}: argmax differs with a margin of {}", p.margins[pos]);
            }
        }
    }
    eprintln!("{name} vs transformers {reference}: max |logit difference| over {} prompts × {POSITIONS} positions = {worst:.2e}", fixture().len());
    worst
}

#[test]
fn f32_logits_match_transformers() {
    compare_logits(DType::F32, "f32", 2e-3);
}

#[test]
fn bf16_logits_match_transformers() {
    // Both sides store bf16 but round at different points (transformers' sdpa, RoPE and
    // matmul accumulate in their own orders). The fixture itself shows the scale of bf16
    // noise: transformers' bf16 logits differ from its own f32 logits by up to 0.93 (of
    // max |logit| 35) in these positions; two bf16 computations can differ by about twice
    // that, so the tolerance between them is 1.5.
    compare_logits(DType::BF16, "bf16", 1.5);
    // Against the f32 reference, sinter's bf16 stays within the same bound (measured: 1.20,
    // transformers' own bf16: 0.93).
    compare_logits_with(DType::BF16, "bf16", "f32", 1.5);
}

#[test]
fn greedy_answer_names_paris() {
    let Some(e) = engine(DType::BF16) else { return };
    let ids = e.model().chat_prompt("What is the capital of France?").unwrap();
    let out = e.generate(&[ids], &SampleOptions::greedy(16), &mut |_, _| {}).unwrap();
    let text = e.model().tokenizer.decode(&out.tokens[0]).unwrap();
    assert!(text.contains("Paris"), "answer: {text:?}");
}

#[test]
fn batched_generation_equals_one_at_a_time_and_sampling_repeats() {
    let Some(e) = engine(DType::BF16) else { return };
    let fx = fixture();
    let prompts: Vec<Vec<u32>> = fx.iter().take(2).map(|p| p.ids.clone()).collect();
    let opts = SampleOptions::greedy(6);
    let together = e.generate(&prompts, &opts, &mut |_, _| {}).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let alone = e.generate(std::slice::from_ref(p), &opts, &mut |_, _| {}).unwrap();
        assert_eq!(alone.tokens[0], together.tokens[i], "prompt {i}");
    }
    // The greedy tokens the decode graph computes (`generate`: its `next` output) are the
    // host's argmax of the logits it returns (`generate_observed` reads the logits).
    let mut rows = 0;
    let observed = e.generate_observed(&prompts, &opts, &mut |_, _| {}, &mut |_, _| rows += 1).unwrap();
    assert_eq!(observed.tokens, together.tokens, "graph greedy tokens vs host argmax");
    assert_eq!(rows, observed.tokens.iter().map(Vec::len).sum::<usize>(), "one logits row per token");
    let sampled = SampleOptions { max_new: 6, temperature: 0.8, top_p: 0.9, seed: 42, stop_at_eos: true };
    let a = e.generate(&prompts[..1], &sampled, &mut |_, _| {}).unwrap();
    let b = e.generate(&prompts[..1], &sampled, &mut |_, _| {}).unwrap();
    assert_eq!(a.tokens, b.tokens, "the same seed gives the same sample");
}

#[test]
fn a_prompt_longer_than_the_context_is_an_error() {
    let Some(e) = engine(DType::BF16) else { return };
    let long = vec![28u32; 8190];
    let err = e.generate(&[long], &SampleOptions::greedy(10), &mut |_, _| {}).unwrap_err();
    assert_eq!(err.to_string(), "the prompt has 8190 tokens and 10 more were asked for, but the context holds 8192");
    // A `max_new` whose sum with the prompt overflows is the same error, not a panic.
    let err = e.generate(&[vec![28u32; 3]], &SampleOptions::greedy(usize::MAX), &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("but the context holds 8192"), "{err}");
    // Sampling options the sampler cannot use are refused before any work.
    for (t, p) in [(f64::NAN, 1.0), (-1.0, 1.0), (f64::INFINITY, 1.0), (0.5, 0.0), (0.5, 1.5)] {
        let o = SampleOptions { temperature: t, top_p: p, ..SampleOptions::greedy(2) };
        let err = e.generate(&[vec![28u32; 3]], &o, &mut |_, _| {}).unwrap_err();
        assert!(err.to_string().contains("temperature") || err.to_string().contains("top_p"), "{t} {p}: {err}");
    }
}

fn load_err(bytes: &[u8], name: &str) -> ModelError {
    let dir = std::env::temp_dir().join(format!("sinter-bad-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let r = std::panic::catch_unwind(|| LlamaModel::load(&p, DType::BF16, |_, _| {}));
    let _ = std::fs::remove_file(&p);
    // The folder too, once empty (another call of this process may still be using it).
    let _ = std::fs::remove_dir(&dir);
    match r {
        Ok(Ok(_)) => panic!("{name}: loaded"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{name}: the loader panicked"),
    }
}

/// Replaces the first occurrence of `from` by `to` (same length) in a copy.
fn patched(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
    let mut b = bytes.to_vec();
    b[at..at + to.len()].copy_from_slice(to);
    b
}

#[test]
fn malformed_model_files_are_clear_errors() {
    let e = LlamaModel::load("/nonexistent/model.gguf".as_ref(), DType::BF16, |_, _| {}).err().unwrap();
    assert!(e.to_string().starts_with("cannot read /nonexistent/model.gguf"), "{e}");
    assert!(load_err(b"", "empty.gguf").to_string().contains("does not start with the magic `GGUF`"));
    assert!(load_err(b"GGML\x03\0\0\0 and then some more bytes", "magic.gguf").to_string().contains("magic"));
    let Some(path) = model_path() else { return };
    let real = std::fs::read(path).unwrap();
    // Truncated inside the header (the tokenizer arrays) and inside the tensor data.
    let e = load_err(&real[..100_000], "header.gguf");
    assert!(matches!(e, ModelError::Malformed { .. }), "{e}");
    let e = load_err(&real[..60_000_000], "data.gguf");
    assert!(matches!(e, ModelError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    // Another architecture name (same length).
    let e = load_err(&patched(&real, b"\x05\0\0\0\0\0\0\0llama", b"\x05\0\0\0\0\0\0\0mamba"), "arch.gguf");
    assert!(e.to_string().contains("architecture `mamba` is not supported"), "{e}");
    // The first tensor's type (Q8_0 = 8, token_embd) changed to Q5_K (13), which sinter does
    // not read.
    let name = b"token_embd.weight";
    let at = real.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    // After the name: n_dims (u32), dims (2 × u64), then the type (u32).
    let kind_at = at + 4 + 16;
    assert_eq!(u32::from_le_bytes(real[kind_at..kind_at + 4].try_into().unwrap()), 8);
    let mut b = real.clone();
    b[kind_at..kind_at + 4].copy_from_slice(&13u32.to_le_bytes());
    let e = load_err(&b, "type.gguf");
    assert!(e.to_string().contains("tensor `token_embd.weight` has type Q5_K, which is not supported"), "{e}");
}
