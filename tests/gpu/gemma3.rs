//! Gemma 3 on the GPU (fused kernels; skipped without a GPU): the tiny model of
//! `tests/gemma3.rs` (f32, window 4, layers sliding/full/sliding) generates the interpreter's
//! tokens, with logits within 5e-3 of the row's largest of the f64 full recompute, at batch 1
//! and 2, and CUDA-graph decode equals eager decode; Gemma-3-270M's layer shapes (hidden 640,
//! 4 heads of 256, 1 KV head, FFN 2048; 3 layers, window 8, a 512-token vocabulary) in bf16
//! give the interpreter's teacher-forced logits over 24 tokens (past the window: the D = 256
//! windowed attention and paged decode kernels) and its first greedy token (where the interpreter's margin exceeds that bound).

use std::path::Path;

use sinter::gpu::Lowering;
use sinter::llm::hf::HfFolder;
use sinter::llm::{Engine, Gemma3Model, SampleOptions};
use sinter::zoo::gemma3::{self, Gemma3Config};
use sinter::zoo::Mode;
use sinter::DType;

use crate::gemma3::{cfg, check_against_reference, generate, load, prompts, rel_err, scratch, write_folder, STEPS};

/// Gemma-3-270M's layer shapes with 3 layers (sliding, sliding, full), window 8 and a
/// 512-token vocabulary, 16-token pages.
fn shapes_270m() -> Gemma3Config {
    Gemma3Config { vocab: 512, sliding: vec![true, true, false], sliding_window: 8, ..Gemma3Config::gemma3_270m() }
}

fn load_as(dir: &Path, dtype: DType) -> Gemma3Model {
    Gemma3Model::from_hf(HfFolder::open(dir).unwrap(), dtype, &mut |_, _| {}).unwrap()
}

/// The graphs the GPU tests below run, for `precompile_gpu_test_kernels`: prefill and decode
/// (symbolic, and specialised to batches 1 and 2) of the tiny model (f32) and of the
/// 270M-shaped one (bf16).
pub(crate) fn precompile_graphs() -> Vec<sinter::Graph> {
    let mut gs = Vec::new();
    for (c, dt) in [(cfg(), DType::F32), (shapes_270m(), DType::BF16), (Gemma3Config::gemma3_270m(), DType::BF16)] {
        gs.push(gemma3::build(&c, Mode::Prefill, dt).unwrap());
        let decode = gemma3::build(&c, Mode::Decode, dt).unwrap();
        for b in [1i64, 2] {
            gs.push(decode.specialize(&[("T".to_string(), b)].into_iter().collect()));
        }
        gs.push(decode);
    }
    gs
}

#[test]
fn gpu_gemma3_engine_matches_the_interpreter_and_cuda_graph_matches_eager() {
    let Some(dev) = super::device() else { return };
    let c = cfg();
    let dir = scratch("gpu");
    let w = write_folder(&dir, &c, 5);
    let cpu = Engine::new(load(&dir)).unwrap();
    let mut engine = Engine::new_gpu(load(&dir), &dev, Lowering::Fused).unwrap();
    let (p1, p2) = prompts();
    for prompts in [vec![p1.clone()], vec![p1.clone(), p2.clone()]] {
        let (want, _) = generate(&cpu, &prompts);
        engine.set_cuda_graph(false);
        let (eager, le) = generate(&engine, &prompts);
        assert!(!eager.cuda_graph);
        check_against_reference(&c, &w, &prompts, &eager, &le, 5e-3);
        assert_eq!(eager.tokens, want.tokens, "the GPU's tokens are the interpreter's");
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

#[test]
fn gpu_gemma3_270m_shapes_bf16_match_the_interpreter() {
    let Some(dev) = super::device() else { return };
    let c = shapes_270m();
    let dir = scratch("gpu-270m");
    write_folder(&dir, &c, 21);
    let cpu = Engine::new(load_as(&dir, DType::BF16)).unwrap();
    let mut gpu = Engine::new_gpu(load_as(&dir, DType::BF16), &dev, Lowering::Fused).unwrap();
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 11) % 512).collect();
    let (cpu_logits, got) = (cpu.logits(&tokens).unwrap(), gpu.logits(&tokens).unwrap());
    let mut worst: f64 = 0.0;
    for p in 0..tokens.len() {
        let r = p * c.vocab..(p + 1) * c.vocab;
        let err = rel_err(&got.data()[r.clone()], &cpu_logits.data()[r]);
        worst = worst.max(err);
        // bf16 activations over 3 layers, accumulation orders differing: a few bf16 ulps of
        // the row's largest logit.
        assert!(err <= 4e-2, "position {p}: GPU logits differ from the interpreter's by {err} of the largest");
    }
    eprintln!("Gemma-3-270M shapes, bf16, 24 tokens: max |GPU − interpreter| {worst:.4} of the row's largest logit");
    let prompt = tokens[..13].to_vec();
    let o = SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(4) };
    let want = cpu.generate(std::slice::from_ref(&prompt), &o, &mut |_, _| {}).unwrap();
    gpu.set_cuda_graph(false);
    let eager = gpu.generate(std::slice::from_ref(&prompt), &o, &mut |_, _| {}).unwrap();
    gpu.set_cuda_graph(true);
    let graph = gpu.generate(std::slice::from_ref(&prompt), &o, &mut |_, _| {}).unwrap();
    assert_eq!(graph.tokens, eager.tokens, "CUDA-graph decode == eager decode");
    // The first token is the interpreter's unless its two best logits are within the bound.
    let row = &cpu_logits.data()[12 * c.vocab..13 * c.vocab];
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if sorted[0] - sorted[1] > 4e-2 * sorted[0].abs().max(1.0) {
        assert_eq!(eager.tokens[0][0], want.tokens[0][0], "the first greedy token is the interpreter's");
    }
    eprintln!("greedy: interpreter {:?}, GPU {:?}", want.tokens[0], eager.tokens[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Largest |logit difference| allowed between the GPU's bf16 run and llama.cpp on the
/// F32-dequantised weights: the interpreter's bf16 run differs from it by 0.22 at most (its
/// f32 run by 0.009), and the GPU's bf16 rounding orders differ from the interpreter's.
const GPU_LLAMA_CPP_TOL: f64 = 0.75;

/// Gemma 3 270M from its real GGUF file (skipped without a GPU or without the file in the
/// cache), bf16 on the GPU against llama.cpp on the same weights dequantised to F32
/// (`tests/fixtures/gemma3_270m/llamacpp.json`): teacher-forced logits over prompt +
/// llama.cpp's greedy continuation within [`GPU_LLAMA_CPP_TOL`] of llama.cpp's top 64, and
/// the greedy tokens of CUDA-graph decode.
#[test]
fn gpu_gemma3_270m_gguf_matches_llama_cpp() {
    let Some(dev) = super::device() else { return };
    let Some(file) = crate::gemma3_gguf::gemma3_file(false) else { return };
    let model = Gemma3Model::from_gguf(&file, DType::BF16, &mut |_, _| {}).unwrap();
    drop(file);
    assert_eq!(model.cfg, Gemma3Config::gemma3_270m(), "the precompiled graphs are this config's");
    let vocab = model.cfg.vocab;
    let gpu = Engine::new_gpu(model, &dev, Lowering::Fused).unwrap();
    let (mut worst, mut greedy): (f64, usize) = (0.0, 0);
    for p in crate::gemma3_gguf::llama_cpp_fixture("f32") {
        let full: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
        let logits = gpu.logits(&full).unwrap();
        worst = worst.max(crate::gemma3_gguf::compare_with_llama_cpp("GPU bf16", &p, logits.data(), vocab, GPU_LLAMA_CPP_TOL));
        let g = gpu.generate(std::slice::from_ref(&p.ids), &SampleOptions::greedy(p.greedy.len()), &mut |_, _| {}).unwrap();
        greedy += crate::gemma3_gguf::check_greedy("GPU bf16", &p, &g.tokens[0], GPU_LLAMA_CPP_TOL);
        eprintln!("{:?} ({} tokens): GPU greedy {:?}, llama.cpp {:?}", p.text.chars().take(40).collect::<String>(), p.ids.len(), g.tokens[0], p.greedy);
    }
    eprintln!("gemma3 GGUF GPU bf16 vs llama.cpp f32: max |logit difference| over the top 64 of every position = {worst:.3}; {greedy} greedy tokens equal");
}
