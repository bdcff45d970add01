//! The GPU twin of `tests/qwen.rs`: each Qwen2/Qwen3 test configuration served by the engine
//! on the GPU (fused kernels) gives the interpreter's tokens and logits (f32, within 5e-3 of
//! the row's largest logit) at batch 1 and 2, and decode steps replayed from a CUDA graph give
//! the same tokens and logits as eager ones. Skipped without a GPU.

use sinter::llm::{Engine, SampleOptions};

use crate::qwen::{check_against, configs, generate, load, prompts, scratch, write_folder, STEPS};

#[test]
fn gpu_qwen_engine_matches_the_interpreter_and_cuda_graph_matches_eager() {
    let Some(dev) = super::device() else { return };
    for (tag, cfg) in configs() {
        let dir = scratch(&format!("gpu-{tag}"));
        write_folder(&dir, &cfg, 12, &[]);
        let cpu = Engine::new(load(&dir)).unwrap();
        let full = |seq: &[u32]| {
            let l = cpu.logits(seq).unwrap();
            l.data()[(seq.len() - 1) * cfg.vocab..].to_vec()
        };
        let mut engine = Engine::new_gpu(load(&dir), &dev, sinter::gpu::Lowering::Fused).unwrap();
        // The GPU prefill's teacher-forced logits are the interpreter's.
        let tokens: Vec<u32> = vec![3, 14, 15, 9, 26, 53, 58, 9, 7];
        let (g, c) = (
            engine.logits(&tokens).unwrap(),
            cpu.logits(&tokens).unwrap(),
        );
        let err = g
            .data()
            .iter()
            .zip(c.data())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            err <= 5e-3,
            "{tag}: GPU prefill logits differ from the interpreter's by {err}"
        );
        let (p1, p2) = prompts();
        for prompts in [vec![p1.clone()], vec![p1.clone(), p2.clone()]] {
            engine.set_cuda_graph(false);
            let (eager, le) = generate(&engine, &prompts);
            assert!(!eager.cuda_graph);
            check_against(&full, &prompts, &eager, &le, 5e-3, tag);
            let (interp, _) = generate(&cpu, &prompts);
            assert_eq!(
                eager.tokens, interp.tokens,
                "{tag}: the GPU's tokens are the interpreter's"
            );
            engine.set_cuda_graph(true);
            let (graph, lg) = generate(&engine, &prompts);
            assert!(
                graph.cuda_graph,
                "{tag}: decode steps replayed a CUDA graph"
            );
            assert_eq!(
                graph.tokens, eager.tokens,
                "{tag}: CUDA-graph decode == eager decode"
            );
            for (a, b) in lg.iter().flatten().zip(le.iter().flatten()) {
                let err = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(
                    err <= 1e-5,
                    "{tag}: CUDA-graph logits differ from eager ones by {err}"
                );
            }
            // Greedy without an observer: the graph's `next` tokens.
            let o = SampleOptions {
                stop_at_eos: false,
                ..SampleOptions::greedy(STEPS)
            };
            assert_eq!(
                engine
                    .generate(&prompts, &o, &mut |_, _| {})
                    .unwrap()
                    .tokens,
                eager.tokens,
                "{tag}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The decode step with each layer's RMSNorms in its projections' prologues (the small-M
/// kernel computing its rows' statistics; `specialised_qwen_decode_computes_the_layer_norms_
/// in_projection_prologues` checks the graphs fuse them) gives the interpreter's greedy tokens
/// over 64 steps at batch 1 and 3, for every tiny Qwen configuration: compared step by step
/// until a step whose interpreter logits have a top-2 margin under 1e-4 (a near tie that f32
/// summation order may break either way), and the logits within 5e-3 until then.
#[test]
fn gpu_qwen_fused_norms_decode_as_the_interpreter() {
    let Some(dev) = super::device() else { return };
    for (tag, cfg) in configs() {
        // Room for a prompt and 64 new tokens.
        let cfg = sinter::zoo::qwen::QwenConfig { context: 128, ..cfg };
        let dir = scratch(&format!("gpu-prologue-{tag}"));
        write_folder(&dir, &cfg, 21, &[]);
        let cpu = Engine::new(load(&dir)).unwrap();
        let engine = Engine::new_gpu(load(&dir), &dev, sinter::gpu::Lowering::Fused).unwrap();
        let (p1, p2) = prompts();
        for prompts in [vec![p1.clone()], vec![p1.clone(), p2.clone(), vec![11, 4]]] {
            let (want, want_logits) = greedy_observed(&cpu, &prompts, 64);
            let (got, got_logits) = greedy_observed(&engine, &prompts, 64);
            for s in 0..prompts.len() {
                for i in 0..want[s].len() {
                    let row = &want_logits[s][i];
                    let err = row.iter().zip(&got_logits[s][i]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    assert!(err <= 5e-3, "{tag}: batch {}, sequence {s}, step {i}: logits differ by {err}", prompts.len());
                    let mut sorted = row.clone();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    if sorted[0] - sorted[1] < 1e-4 {
                        break;
                    }
                    assert_eq!(got[s][i], want[s][i], "{tag}: batch {}, sequence {s}, step {i}", prompts.len());
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `steps` greedy tokens per prompt and the logits each was chosen from.
fn greedy_observed<M: sinter::llm::DecoderModel>(engine: &Engine<M>, prompts: &[Vec<u32>], steps: usize) -> (Vec<Vec<u32>>, Vec<Vec<Vec<f64>>>) {
    let o = SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(steps) };
    let mut logits: Vec<Vec<Vec<f64>>> = vec![Vec::new(); prompts.len()];
    let g = engine.generate_observed(prompts, &o, &mut |_, _| {}, &mut |s, row| logits[s].push(row.to_vec())).unwrap();
    (g.tokens, logits)
}
