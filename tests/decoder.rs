//! The decoder contract is generic: a GPT-2 model — LayerNorm, learned positions, fused QKV
//! with bias, tanh-GELU, no Llama piece — loaded from a Hugging Face folder written here
//! (`Conv1D` weights stored `[in, out]`, transposed on load) and served by the same
//! [`Engine`] as the Llama family. Greedy generation through the engine's paged decode
//! equals a full recompute — the zoo's GPT-2 forward graph (no KV cache) re-run over the
//! growing sequence, bound to the weights as this test made them — for 10 steps at batch 1
//! and at batch 2 with prompts of different lengths, over 4-token pages. On the GPU (skipped
//! without one): the same tokens as the interpreter, and CUDA-graph decode equal to eager
//! decode. Also: the architecture registry's errors, the contract check, seeded sampling.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use sinter::llm::hf::HfFolder;
use sinter::llm::{DecoderModel, Engine, Generation, Gpt2Model, SampleOptions};
use sinter::zoo::gpt2::{self, Gpt2Config};
use sinter::zoo::{gpt2_paged, Mode};
use sinter::{Backend, DType, Program, Tensor};

use crate::zoo::Rng;

/// Tokens per KV page in these tests: prompts and generations cross several pages.
const PAGE: usize = 4;

/// Steps generated per sequence.
const STEPS: usize = 10;

pub(crate) fn cfg() -> Gpt2Config {
    Gpt2Config::tiny()
}

/// A fresh folder for one test.
pub(crate) fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sinter-decoder-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A word-level tokenizer over `t0..t{vocab}`.
fn write_tokenizer(dir: &Path, vocab: usize) {
    let words: HashMap<String, u32> = (0..vocab as u32).map(|i| (format!("t{i}"), i)).collect();
    let wl = tokenizers::models::wordlevel::WordLevel::builder().vocab(words.into_iter().collect()).unk_token("t0".into()).build().unwrap();
    let mut tk = tokenizers::Tokenizer::new(wl);
    tk.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
    tk.save(dir.join("tokenizer.json"), false).unwrap();
}

/// Writes a GPT-2 Hugging Face folder of `cfg` with seeded weights; returns the weights as
/// the graphs take them: GGUF names, `[out, in]` matrices.
pub(crate) fn write_gpt2_folder(dir: &Path, cfg: &Gpt2Config, seed: u64) -> Vec<(String, Vec<usize>, Vec<f64>)> {
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab, "n_embd": cfg.hidden, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "n_inner": cfg.ffn, "n_positions": cfg.context, "layer_norm_epsilon": cfg.ln_eps,
        "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (d, f) = (cfg.hidden, cfg.ffn);
    // (GGUF name, HF name, graph shape, stored transposed as a Conv1D)
    let mut named: Vec<(String, String, Vec<usize>, bool)> = vec![
        ("token_embd.weight".into(), "transformer.wte.weight".into(), vec![cfg.vocab, d], false),
        ("position_embd.weight".into(), "transformer.wpe.weight".into(), vec![cfg.context, d], false),
        ("output_norm.weight".into(), "transformer.ln_f.weight".into(), vec![d], false),
        ("output_norm.bias".into(), "transformer.ln_f.bias".into(), vec![d], false),
    ];
    for i in 0..cfg.n_layers {
        for (gg, hf, shape, conv) in [
            ("attn_norm.weight", "ln_1.weight", vec![d], false),
            ("attn_norm.bias", "ln_1.bias", vec![d], false),
            ("attn_qkv.weight", "attn.c_attn.weight", vec![3 * d, d], true),
            ("attn_qkv.bias", "attn.c_attn.bias", vec![3 * d], false),
            ("attn_output.weight", "attn.c_proj.weight", vec![d, d], true),
            ("attn_output.bias", "attn.c_proj.bias", vec![d], false),
            ("ffn_norm.weight", "ln_2.weight", vec![d], false),
            ("ffn_norm.bias", "ln_2.bias", vec![d], false),
            ("ffn_up.weight", "mlp.c_fc.weight", vec![f, d], true),
            ("ffn_up.bias", "mlp.c_fc.bias", vec![f], false),
            ("ffn_down.weight", "mlp.c_proj.weight", vec![d, f], true),
            ("ffn_down.bias", "mlp.c_proj.bias", vec![d], false),
        ] {
            named.push((format!("blk.{i}.{gg}"), format!("transformer.h.{i}.{hf}"), shape, conv));
        }
    }
    let mut rng = Rng::new(seed);
    let mut graph_weights = Vec::new();
    let mut stored: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (gg, hf, shape, conv) in named {
        let n: usize = shape.iter().product();
        let fan_in = *shape.last().unwrap() as f64;
        let values: Vec<f64> = (0..n)
            .map(|_| {
                let r = rng.next_f64();
                let x = if gg.contains("norm.weight") {
                    1.0 + 0.1 * r
                } else if gg.ends_with(".bias") {
                    0.1 * r
                } else if gg.contains("embd") {
                    0.5 * r
                } else {
                    r / fan_in.sqrt()
                };
                x as f32 as f64
            })
            .collect();
        // Hugging Face's Conv1D stores the transpose: `[in, out]`.
        let (file_shape, file_values) = if conv { (vec![shape[1], shape[0]], transpose(&values, shape[0], shape[1])) } else { (shape.clone(), values.clone()) };
        stored.push((hf, file_shape, file_values.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect()));
        graph_weights.push((gg, shape, values));
    }
    let views: Vec<(String, TensorView<'_>)> = stored.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::tensor::serialize(views, None).unwrap()).unwrap();
    write_tokenizer(dir, cfg.vocab);
    graph_weights
}

/// The transpose of a row-major `r × c` matrix.
fn transpose(v: &[f64], r: usize, c: usize) -> Vec<f64> {
    (0..r * c).map(|i| v[(i % r) * c + i / r]).collect()
}

/// The GPT-2 model of `dir`, with `PAGE`-token pages.
pub(crate) fn load(dir: &Path) -> Gpt2Model {
    let mut m = Gpt2Model::from_hf(HfFolder::open(dir).unwrap(), DType::F32, &mut |_, _| {}).unwrap();
    m.page_size = PAGE;
    m
}

/// The zoo's GPT-2 forward graph (no KV cache) with the test's weights: the full recompute.
fn full_forward(cfg: &Gpt2Config, weights: &[(String, Vec<usize>, Vec<f64>)]) -> Program {
    let mut p = Program::compile(gpt2::build(cfg, DType::F32).unwrap(), Backend::Interpreter).unwrap();
    for (name, shape, values) in weights {
        p.bind(name, Tensor::new(DType::F32, shape, values.clone()).unwrap()).unwrap();
    }
    p
}

/// The last row of the full forward's logits over `tokens`.
fn last_logits(p: &Program, tokens: &[u32]) -> Vec<f64> {
    let n = tokens.len();
    let toks = Tensor::new(DType::I64, &[n], tokens.iter().map(|&t| f64::from(t)).collect()).unwrap();
    let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
    let out = p.run(&[("tokens", &toks), ("positions", &pos)], &[]).unwrap();
    let v = out[0].shape()[1];
    out[0].data()[(n - 1) * v..n * v].to_vec()
}

/// Greedy generation of exactly `STEPS` tokens per prompt, with the logits of each token.
fn generate<M: DecoderModel>(engine: &Engine<M>, prompts: &[Vec<u32>]) -> (Generation, Vec<Vec<Vec<f64>>>) {
    let mut logits: Vec<Vec<Vec<f64>>> = vec![Vec::new(); prompts.len()];
    let o = SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(STEPS) };
    let g = engine.generate_observed(prompts, &o, &mut |_, _| {}, &mut |s, row| logits[s].push(row.to_vec())).unwrap();
    (g, logits)
}

/// Checks each generated token against the full recompute over the prompt and the tokens
/// before it: the same greedy token, and logits within `tol` (relative to the row's largest).
fn check_against_full_recompute(full: &Program, prompts: &[Vec<u32>], g: &Generation, logits: &[Vec<Vec<f64>>], tol: f64) {
    for (s, prompt) in prompts.iter().enumerate() {
        assert_eq!(g.tokens[s].len(), STEPS, "sequence {s}");
        let mut seq = prompt.clone();
        for (k, &t) in g.tokens[s].iter().enumerate() {
            let want = last_logits(full, &seq);
            let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0);
            let err = want.iter().zip(&logits[s][k]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(err <= tol * scale, "sequence {s}, step {k}: logits differ by {err} (scale {scale})");
            assert_eq!(t, sinter::llm::argmax(&want), "sequence {s}, step {k}: the engine's token differs from the full recompute's");
            seq.push(t);
        }
    }
}

fn prompts() -> (Vec<u32>, Vec<u32>) {
    (vec![5, 17, 42], vec![9, 3, 60, 33, 21, 8, 14])
}

#[test]
fn gpt2_through_the_engine_equals_a_full_recompute_at_batch_1_and_2() {
    let c = cfg();
    let dir = scratch("gpt2");
    let weights = write_gpt2_folder(&dir, &c, 5);
    // The registry picks GPT-2 from `model_type`.
    let any = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    assert_eq!(any.architecture(), "gpt2");
    assert_eq!(any.kv().kv_heads, c.n_heads);
    assert_eq!(any.eos_tokens(), vec![2]);
    let engine = Engine::new(load(&dir)).unwrap();
    let full = full_forward(&c, &weights);
    let (p1, p2) = prompts();
    let (g1, l1) = generate(&engine, std::slice::from_ref(&p1));
    assert_eq!(g1.decode_steps, STEPS - 1);
    check_against_full_recompute(&full, std::slice::from_ref(&p1), &g1, &l1, 1e-4);
    let both = [p1, p2];
    let (g2, l2) = generate(&engine, &both);
    check_against_full_recompute(&full, &both, &g2, &l2, 1e-4);
    assert_eq!(g2.tokens[0], g1.tokens[0], "a sequence's tokens do not depend on its batch");
    // The boxed model the registry returned serves the same tokens.
    let (g3, _) = generate(&Engine::new(any).unwrap(), &both);
    assert_eq!(g3.tokens, g2.tokens);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn seeded_sampling_through_the_engine_repeats() {
    let dir = scratch("seeded");
    write_gpt2_folder(&dir, &cfg(), 6);
    let engine = Engine::new(load(&dir)).unwrap();
    let o = SampleOptions { stop_at_eos: false, ..SampleOptions::seeded(STEPS, 1.5, 0.95, 11) };
    let (p1, p2) = prompts();
    let run = || engine.generate(&[p1.clone(), p2.clone()], &o, &mut |_, _| {}).unwrap().tokens;
    let a = run();
    assert_eq!(a, run(), "the same seed gives the same tokens");
    let other = engine.generate(&[p1.clone(), p2.clone()], &SampleOptions { seed: 12, ..o.clone() }, &mut |_, _| {}).unwrap().tokens;
    assert_ne!(a, other, "another seed gives other tokens (20 draws at temperature 1.5)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A minimal GGUF file: no tensors, `general.architecture = arch`.
fn gguf_with_architecture(arch: &str) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    let key = "general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key.as_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend((arch.len() as u64).to_le_bytes());
    b.extend(arch.as_bytes());
    b.resize(b.len().div_ceil(32) * 32, 0);
    b
}

#[test]
fn an_unsupported_architecture_is_an_error_that_lists_the_supported_ones() {
    let dir = scratch("registry");
    let path = dir.join("mamba.gguf");
    std::fs::write(&path, gguf_with_architecture("mamba")).unwrap();
    let e = sinter::llm::open(&path, DType::F32, &mut |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("architecture `mamba` is not supported (supported: llama, gpt2, qwen2, qwen3, gemma3, gemma3_text)"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"model_type": "mistral"}"#).unwrap();
    let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("architecture `mistral` is not supported (supported: llama, gpt2, qwen2, qwen3, gemma3, gemma3_text)"), "{e}");
    // A GPT-2 folder whose weights disagree with its config.
    write_gpt2_folder(&dir, &cfg(), 7);
    let mut wrong = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    wrong["n_inner"] = 96.into();
    std::fs::write(dir.join("config.json"), wrong.to_string()).unwrap();
    let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("transformer.h.0.mlp.c_fc.weight` has shape [32, 128], expected [32, 96]"), "{e}");
    // LlamaModel reads Llama only, and says so.
    let e = sinter::llm::LlamaModel::open(&dir, DType::F32, |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("architecture `gpt2` is not supported (supported: llama)"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_graph_without_the_decoder_signature_is_refused() {
    let c = cfg();
    // The zoo's GPT-2 forward has no KV cache: not a decoder graph.
    let g = gpt2::build(&c, DType::F32).unwrap();
    let e = sinter::llm::decoder::check_graph(&g, &Default::default(), None, "prefill").unwrap_err();
    assert!(e.to_string().contains("has no input `block_tables`"), "{e}");
    // The paged graph is, once its weights are known.
    let g = gpt2_paged::build(&c, Mode::Prefill, DType::F32, PAGE).unwrap();
    let e = sinter::llm::decoder::check_graph(&g, &Default::default(), None, "prefill").unwrap_err();
    assert!(e.to_string().contains("neither a decoder input nor one of the model's weights"), "{e}");
    // A model whose KV geometry disagrees with its graphs is refused by the engine.
    let dir = scratch("geometry");
    write_gpt2_folder(&dir, &c, 9);
    let model = load(&dir);
    let weights = model.weights.clone();
    let mut kv = model.kv();
    sinter::llm::decoder::check_graph(&g, &weights, Some(&kv), "prefill").unwrap();
    kv.head_dim *= 2;
    let e = sinter::llm::decoder::check_graph(&g, &weights, Some(&kv), "prefill").unwrap_err();
    assert!(e.to_string().contains("`k_pages` is f32[P, 4, 4, 8], the model's KV geometry says f32[P, 4, 4, 16]"), "{e}");
    kv.head_dim /= 2;
    kv.layers += 1;
    let e = sinter::llm::decoder::check_graph(&g, &weights, Some(&kv), "prefill").unwrap_err();
    assert!(e.to_string().contains("the model has 3 layers"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The graphs the GPU test below runs, for `precompile_gpu_test_kernels`: the paged GPT-2's
/// prefill and decode (symbolic, and specialised to batches 1, 2 and 4: the serve test's
/// buckets too), f32.
pub(crate) fn precompile_graphs() -> Vec<sinter::Graph> {
    let c = cfg();
    let mut gs = vec![gpt2_paged::build(&c, Mode::Prefill, DType::F32, PAGE).unwrap()];
    let decode = gpt2_paged::build(&c, Mode::Decode, DType::F32, PAGE).unwrap();
    for b in [1i64, 2, 4] {
        gs.push(decode.specialize(&[("T".to_string(), b)].into_iter().collect()));
    }
    gs.push(decode);
    gs
}

/// The GPU twin: the same model on the GPU (fused kernels) gives the interpreter's tokens and
/// logits (f32, within 5e-3 of the row's largest logit) at batch 1 and 2, and decode steps
/// replayed from a CUDA graph give the same tokens and logits as eager ones.
#[test]
fn gpu_gpt2_engine_matches_the_interpreter_and_cuda_graph_matches_eager() {
    let Some(dev) = crate::gpu::device() else { return };
    let dir = scratch("gpt2-gpu");
    let weights = write_gpt2_folder(&dir, &cfg(), 5);
    let full = full_forward(&cfg(), &weights);
    let mut engine = Engine::new_gpu(load(&dir), &dev, sinter::gpu::Lowering::Fused).unwrap();
    let (p1, p2) = prompts();
    for prompts in [vec![p1.clone()], vec![p1.clone(), p2.clone()]] {
        engine.set_cuda_graph(false);
        let (eager, le) = generate(&engine, &prompts);
        assert!(!eager.cuda_graph);
        check_against_full_recompute(&full, &prompts, &eager, &le, 5e-3);
        engine.set_cuda_graph(true);
        let (graph, lg) = generate(&engine, &prompts);
        assert!(graph.cuda_graph, "decode steps replayed a CUDA graph");
        assert_eq!(graph.tokens, eager.tokens, "CUDA-graph decode == eager decode");
        for (a, b) in lg.iter().flatten().zip(le.iter().flatten()) {
            let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(err <= 1e-5, "CUDA-graph logits differ from eager ones by {err}");
        }
        // Greedy without an observer: the graph's `next` tokens.
        let o = SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(STEPS) };
        assert_eq!(engine.generate(&prompts, &o, &mut |_, _| {}).unwrap().tokens, eager.tokens);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sinter run` picks GPT-2 from the folder, feeds the prompt as plain text (the model has no
/// chat template) and prints the engine's greedy continuation; an unsupported architecture
/// is an error naming the supported ones.
#[test]
fn sinter_run_serves_a_gpt2_folder_and_names_the_supported_architectures() {
    let dir = scratch("cli");
    write_gpt2_folder(&dir, &cfg(), 8);
    let model = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    let prompt = model.tokenizer().encode("t5 t17 t42").unwrap();
    assert_eq!(prompt, vec![5, 17, 42]);
    let engine = Engine::new(model).unwrap();
    let o = SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(6) };
    let tokens: Vec<u32> = engine.generate(&[prompt], &o, &mut |_, _| {}).unwrap().tokens[0].iter().copied().filter(|&t| t != 2).collect();
    let want = engine.model().tokenizer().decode(&tokens).unwrap();
    let sinter = || std::process::Command::new(env!("CARGO_BIN_EXE_sinter"));
    let out = sinter().args(["run", "--device", "cpu", "--dtype", "f32", "--prompt", "t5 t17 t42", "--max-tokens", "6", "--ignore-eos", "--model"]).arg(&dir).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.trim(), want.trim(), "{stderr}");
    let path = dir.join("mamba.gguf");
    std::fs::write(&path, gguf_with_architecture("mamba")).unwrap();
    let out = sinter().args(["run", "--device", "cpu", "--model"]).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("architecture `mamba` is not supported (supported: llama, gpt2, qwen2, qwen3, gemma3, gemma3_text)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
