//! Qwen2 and Qwen3 loaded from Hugging Face folders written here and served by the
//! [`Engine`]: the teacher-forced logits (prefill graph) equal a plain f64 forward written in
//! this file after transformers' `modeling_qwen2.py`/`modeling_qwen3.py` (q/k/v biases,
//! per-head q/k RMSNorm, `rotate_half` RoPE, GQA by repeating K/V heads, SwiGLU MLP, a
//! sliding window, linear RoPE scaling, untied LM head); greedy generation through the paged
//! decode equals a full recompute for 8 steps at batch 1 and at batch 2 with prompts of
//! different lengths, over 4-token pages. Also the GGUF ↔ Hugging Face name map and the
//! loaders' errors (missing tensor, wrong shape, unsupported RoPE scaling). The GPU twin is
//! `tests/gpu/qwen.rs`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;
use sinter::llm::hf::HfFolder;
use sinter::llm::qwen::weight_names;
use sinter::llm::{DecoderModel, Engine, Generation, QwenModel, SampleOptions};
use sinter::zoo::qwen::{QwenArch, QwenConfig, RopeScaling};
use sinter::zoo::Mode;
use sinter::DType;

use crate::zoo::Rng;

/// Tokens per KV page in these tests.
pub(crate) const PAGE: usize = 4;

/// Steps generated per sequence.
pub(crate) const STEPS: usize = 8;

/// A fresh folder for one test.
pub(crate) fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sinter-qwen-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A word-level tokenizer over `t0..t{vocab}`.
fn write_tokenizer(dir: &Path, vocab: usize) {
    let words: HashMap<String, u32> = (0..vocab as u32).map(|i| (format!("t{i}"), i)).collect();
    let wl = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(words.into_iter().collect())
        .unk_token("t0".into())
        .build()
        .unwrap();
    let mut tk = tokenizers::Tokenizer::new(wl);
    tk.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
    tk.save(dir.join("tokenizer.json"), false).unwrap();
}

/// The `config.json` of `cfg` as transformers writes it.
fn config_json(cfg: &QwenConfig) -> serde_json::Value {
    let qwen3 = cfg.arch == QwenArch::Qwen3;
    let mut c = json!({
        "architectures": [if qwen3 { "Qwen3ForCausalLM" } else { "Qwen2ForCausalLM" }],
        "model_type": cfg.arch.name(),
        "vocab_size": cfg.vocab, "hidden_size": cfg.hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.ffn, "hidden_act": "silu", "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_eps, "max_position_embeddings": cfg.context,
        "tie_word_embeddings": cfg.tied_embeddings, "bos_token_id": 1, "eos_token_id": 2,
        "use_sliding_window": false, "sliding_window": null, "max_window_layers": cfg.n_layers,
        "rope_scaling": null, "torch_dtype": "float32"
    });
    if qwen3 {
        c["head_dim"] = cfg.head_dim.into();
        c["attention_bias"] = cfg.o_bias.into();
    }
    if let Some(i) = cfg.windows.iter().position(Option::is_some) {
        c["use_sliding_window"] = true.into();
        c["sliding_window"] = cfg.windows[i].unwrap().into();
        c["max_window_layers"] = i.into();
    }
    if let RopeScaling::Linear { factor } = cfg.rope_scaling {
        // As transformers 5 writes it: θ and the scaling in `rope_parameters`.
        c["rope_parameters"] =
            json!({"rope_type": "linear", "factor": factor, "rope_theta": cfg.rope_theta});
        c.as_object_mut().unwrap().remove("rope_theta");
    }
    c
}

/// The weights of a model, by GGUF name: shape and values (f32-representable).
pub(crate) type Weights = BTreeMap<String, (Vec<usize>, Vec<f64>)>;

/// Writes a Hugging Face folder of `cfg` (HF tensor names, f32) with seeded weights, leaving
/// out the tensors named in `skip`; returns the weights by GGUF name.
pub(crate) fn write_folder(dir: &Path, cfg: &QwenConfig, seed: u64, skip: &[&str]) -> Weights {
    std::fs::write(dir.join("config.json"), config_json(cfg).to_string()).unwrap();
    let mut rng = Rng::new(seed);
    let mut weights = Weights::new();
    let mut stored: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    for (gg, hf, shape) in weight_names(cfg) {
        let n: usize = shape.iter().product();
        let fan_in = *shape.last().unwrap() as f64;
        let values: Vec<f64> = (0..n)
            .map(|_| {
                let r = rng.next_f64();
                let x = if gg.contains("norm") {
                    1.0 + 0.2 * r
                } else if gg.ends_with(".bias") {
                    0.2 * r
                } else if gg.contains("embd") || gg.starts_with("output.") {
                    r
                } else {
                    1.5 * r / fan_in.sqrt()
                };
                x as f32 as f64
            })
            .collect();
        if !skip.contains(&hf.as_str()) {
            stored.push((
                hf,
                shape.clone(),
                values
                    .iter()
                    .flat_map(|&x| (x as f32).to_le_bytes())
                    .collect(),
            ));
        }
        weights.insert(gg, (shape, values));
    }
    let views: Vec<(String, TensorView<'_>)> = stored
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::tensor::serialize(views, None).unwrap(),
    )
    .unwrap();
    write_tokenizer(dir, cfg.vocab);
    weights
}

/// The model of `dir` with `PAGE`-token pages.
pub(crate) fn load(dir: &Path) -> QwenModel {
    let mut m =
        QwenModel::from_hf(HfFolder::open(dir).unwrap(), DType::F32, &mut |_, _| {}).unwrap();
    m.cfg.page_size = PAGE;
    m
}

/// The configurations these tests run: tiny Qwen2 and Qwen3, and variants with a sliding
/// window on the second layer and an untied LM head (Qwen2), and linear RoPE scaling with
/// `attention_bias` (Qwen3).
pub(crate) fn configs() -> Vec<(&'static str, QwenConfig)> {
    let mut swa = QwenConfig::tiny(QwenArch::Qwen2);
    swa.windows = vec![None, Some(3)];
    swa.tied_embeddings = false;
    let mut lin = QwenConfig::tiny(QwenArch::Qwen3);
    lin.rope_scaling = RopeScaling::Linear { factor: 2.0 };
    (lin.qkv_bias, lin.o_bias) = (true, true);
    vec![
        ("qwen2", QwenConfig::tiny(QwenArch::Qwen2)),
        ("qwen3", QwenConfig::tiny(QwenArch::Qwen3)),
        ("qwen2-window-untied", swa),
        ("qwen3-linear-bias", lin),
    ]
}

// ---------------------------------------------------------------------------------------
// A plain f64 forward, after transformers' Qwen2/Qwen3 modeling code.

fn w<'a>(ws: &'a Weights, name: &str) -> &'a [f64] {
    &ws.get(name).unwrap_or_else(|| panic!("no weight {name}")).1
}

/// `x @ W.T (+ b)` for `W: [out, in]`.
fn linear(x: &[f64], wt: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let n = x.len();
    (0..wt.len() / n)
        .map(|o| {
            wt[o * n..(o + 1) * n]
                .iter()
                .zip(x)
                .map(|(a, b)| a * b)
                .sum::<f64>()
                + b.map_or(0.0, |b| b[o])
        })
        .collect()
}

/// Qwen2RMSNorm: `weight * x / sqrt(mean(x²) + eps)`.
fn rms(x: &[f64], wt: &[f64], eps: f64) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(wt).map(|(v, g)| g * v * r).collect()
}

/// apply_rotary_pos_emb on one head: `x·cos + rotate_half(x)·sin`, `rotate_half(x) =
/// cat(−x₂, x₁)`, `inv_freq[i] = 1 / (θ^(2i/d) · factor)` (linear scaling).
fn rope(x: &mut [f64], pos: usize, theta: f64, factor: f64) {
    let d = x.len();
    let half = d / 2;
    let orig = x.to_vec();
    for i in 0..d {
        let fi = i % half;
        let ang = pos as f64 / theta.powf((2 * fi) as f64 / d as f64) / factor;
        let rot = if i < half {
            -orig[i + half]
        } else {
            orig[i - half]
        };
        x[i] = orig[i] * ang.cos() + rot * ang.sin();
    }
}

/// Logits of every position of `tokens` (teacher-forced), `[len][vocab]`.
pub(crate) fn reference_logits(cfg: &QwenConfig, ws: &Weights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let (d, hd, h, hkv) = (cfg.hidden, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads);
    let n = tokens.len();
    let factor = match cfg.rope_scaling {
        RopeScaling::None => 1.0,
        RopeScaling::Linear { factor } => factor,
        ref other => panic!("the reference has no {other:?}"),
    };
    let embed = w(ws, "token_embd.weight");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embed[t as usize * d..(t as usize + 1) * d].to_vec())
        .collect();
    for l in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        let bias = |s: &str| ws.get(&p(s)).map(|t| t.1.as_slice());
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (pos, x) in xs.iter().enumerate() {
            let hn = rms(x, w(ws, &p("attn_norm.weight")), cfg.rms_eps);
            let mut q = linear(&hn, w(ws, &p("attn_q.weight")), bias("attn_q.bias"));
            let mut k = linear(&hn, w(ws, &p("attn_k.weight")), bias("attn_k.bias"));
            let v = linear(&hn, w(ws, &p("attn_v.weight")), bias("attn_v.bias"));
            for (t, heads, norm) in [
                (&mut q, h, "attn_q_norm.weight"),
                (&mut k, hkv, "attn_k_norm.weight"),
            ] {
                for hh in 0..heads {
                    let head = &mut t[hh * hd..(hh + 1) * hd];
                    if cfg.qk_norm {
                        let normed = rms(head, w(ws, &p(norm)), cfg.rms_eps);
                        head.copy_from_slice(&normed);
                    }
                    rope(head, pos, cfg.rope_theta, factor);
                }
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let window = cfg.window(l).unwrap_or(usize::MAX);
        for i in 0..n {
            // repeat_kv: query head hh reads key/value head hh / (h / hkv).
            let mut attn = vec![0.0; h * hd];
            for hh in 0..h {
                let kvh = hh / (h / hkv);
                let keys: Vec<usize> = (0..=i).filter(|&j| i - j < window).collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        (0..hd)
                            .map(|e| qs[i][hh * hd + e] * ks[j][kvh * hd + e])
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for (&j, sv) in keys.iter().zip(&s) {
                    let pr = (sv - m).exp() / z;
                    for e in 0..hd {
                        attn[hh * hd + e] += pr * vs[j][kvh * hd + e];
                    }
                }
            }
            let o = linear(
                &attn,
                w(ws, &p("attn_output.weight")),
                bias("attn_output.bias"),
            );
            let x1: Vec<f64> = xs[i].iter().zip(&o).map(|(a, b)| a + b).collect();
            let hn2 = rms(&x1, w(ws, &p("ffn_norm.weight")), cfg.rms_eps);
            let g = linear(&hn2, w(ws, &p("ffn_gate.weight")), None);
            let u = linear(&hn2, w(ws, &p("ffn_up.weight")), None);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = linear(&act, w(ws, &p("ffn_down.weight")), None);
            xs[i] = x1.iter().zip(&down).map(|(a, b)| a + b).collect();
        }
    }
    let head = if cfg.tied_embeddings {
        embed
    } else {
        w(ws, "output.weight")
    };
    xs.iter()
        .map(|x| {
            linear(
                &rms(x, w(ws, "output_norm.weight"), cfg.rms_eps),
                head,
                None,
            )
        })
        .collect()
}

/// The largest difference between two rows, relative to the reference row's largest value.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0);
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
        / scale
}

// ---------------------------------------------------------------------------------------

pub(crate) fn prompts() -> (Vec<u32>, Vec<u32>) {
    (vec![5, 17, 42], vec![9, 3, 60, 33, 21, 8, 14])
}

/// Greedy generation of exactly `STEPS` tokens per prompt, with the logits of each token.
pub(crate) fn generate<M: DecoderModel>(
    engine: &Engine<M>,
    prompts: &[Vec<u32>],
) -> (Generation, Vec<Vec<Vec<f64>>>) {
    let mut logits: Vec<Vec<Vec<f64>>> = vec![Vec::new(); prompts.len()];
    let o = SampleOptions {
        stop_at_eos: false,
        ..SampleOptions::greedy(STEPS)
    };
    let g = engine
        .generate_observed(prompts, &o, &mut |_, _| {}, &mut |s, row| {
            logits[s].push(row.to_vec())
        })
        .unwrap();
    (g, logits)
}

/// Each generated token and its logits against the full recompute (`recompute(seq)`: the last
/// row's logits over the whole sequence): the same greedy token, logits within `tol`.
pub(crate) fn check_against(
    recompute: &dyn Fn(&[u32]) -> Vec<f64>,
    prompts: &[Vec<u32>],
    g: &Generation,
    logits: &[Vec<Vec<f64>>],
    tol: f64,
    what: &str,
) {
    for (s, prompt) in prompts.iter().enumerate() {
        assert_eq!(g.tokens[s].len(), STEPS, "{what}: sequence {s}");
        let mut seq = prompt.clone();
        for (k, &t) in g.tokens[s].iter().enumerate() {
            let want = recompute(&seq);
            let err = rel_err(&logits[s][k], &want);
            assert!(
                err <= tol,
                "{what}: sequence {s}, step {k}: logits differ by {err} (relative)"
            );
            assert_eq!(t, sinter::llm::argmax(&want), "{what}: sequence {s}, step {k}: the engine's token differs from the full recompute's");
            seq.push(t);
        }
    }
}

#[test]
fn qwen_teacher_forced_logits_equal_an_f64_forward_after_transformers() {
    for (tag, cfg) in configs() {
        let dir = scratch(&format!("ref-{tag}"));
        let weights = write_folder(&dir, &cfg, 11, &[]);
        // The registry picks the architecture from `model_type`.
        let any = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
        assert_eq!(any.architecture(), cfg.arch.name(), "{tag}");
        assert_eq!(
            (any.kv().kv_heads, any.kv().head_dim),
            (cfg.n_kv_heads, cfg.head_dim),
            "{tag}"
        );
        assert_eq!(any.eos_tokens(), vec![2], "{tag}");
        let m = load(&dir);
        assert_eq!(
            m.cfg,
            QwenConfig {
                page_size: PAGE,
                ..cfg.clone()
            },
            "{tag}: the config read back"
        );
        let engine = Engine::new(m).unwrap();
        let tokens: Vec<u32> = vec![3, 14, 15, 9, 26, 53, 58, 9, 7];
        let got = engine.logits(&tokens).unwrap();
        let want = reference_logits(&cfg, &weights, &tokens);
        for (p, row) in want.iter().enumerate() {
            let err = rel_err(&got.data()[p * cfg.vocab..(p + 1) * cfg.vocab], row);
            assert!(
                err <= 2e-5,
                "{tag}: position {p}: logits differ from the f64 forward by {err} (relative)"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn qwen_greedy_decode_equals_a_full_recompute_at_batch_1_and_2() {
    for (tag, cfg) in configs() {
        let dir = scratch(&format!("greedy-{tag}"));
        write_folder(&dir, &cfg, 12, &[]);
        let engine = Engine::new(load(&dir)).unwrap();
        let full = |seq: &[u32]| {
            let l = engine.logits(seq).unwrap();
            l.data()[(seq.len() - 1) * cfg.vocab..].to_vec()
        };
        let (p1, p2) = prompts();
        let (g1, l1) = generate(&engine, std::slice::from_ref(&p1));
        check_against(&full, std::slice::from_ref(&p1), &g1, &l1, 1e-5, tag);
        let both = [p1, p2];
        let (g2, l2) = generate(&engine, &both);
        check_against(&full, &both, &g2, &l2, 1e-5, tag);
        assert_eq!(
            g2.tokens[0], g1.tokens[0],
            "{tag}: a sequence's tokens do not depend on its batch"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn qwen_gguf_and_hugging_face_names_map_one_to_one() {
    let q2 = weight_names(&QwenConfig::tiny(QwenArch::Qwen2));
    let q3 = weight_names(&QwenConfig::tiny(QwenArch::Qwen3));
    let find = |w: &[(String, String, Vec<usize>)], gg: &str| {
        w.iter()
            .find(|(g, _, _)| g == gg)
            .map(|(_, hf, s)| (hf.clone(), s.clone()))
    };
    assert_eq!(
        find(&q2, "blk.1.attn_q.bias"),
        Some(("model.layers.1.self_attn.q_proj.bias".into(), vec![32]))
    );
    assert_eq!(
        find(&q2, "blk.0.attn_k.bias"),
        Some(("model.layers.0.self_attn.k_proj.bias".into(), vec![16]))
    );
    assert_eq!(
        find(&q2, "blk.0.attn_output.bias"),
        None,
        "Qwen2's o_proj has no bias"
    );
    assert_eq!(find(&q2, "blk.0.attn_q_norm.weight"), None);
    assert_eq!(
        find(&q3, "blk.0.attn_q.bias"),
        None,
        "Qwen3 has no q/k/v biases"
    );
    assert_eq!(
        find(&q3, "blk.1.attn_k_norm.weight"),
        Some(("model.layers.1.self_attn.k_norm.weight".into(), vec![12]))
    );
    assert_eq!(
        find(&q3, "blk.0.attn_q.weight"),
        Some((
            "model.layers.0.self_attn.q_proj.weight".into(),
            vec![48, 32]
        ))
    );
    assert_eq!(
        find(&q3, "blk.0.attn_output.weight"),
        Some((
            "model.layers.0.self_attn.o_proj.weight".into(),
            vec![32, 48]
        ))
    );
    for (gg, hf) in [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        (
            "blk.0.attn_norm.weight",
            "model.layers.0.input_layernorm.weight",
        ),
        (
            "blk.0.ffn_norm.weight",
            "model.layers.0.post_attention_layernorm.weight",
        ),
        (
            "blk.0.ffn_gate.weight",
            "model.layers.0.mlp.gate_proj.weight",
        ),
        ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
        (
            "blk.0.ffn_down.weight",
            "model.layers.0.mlp.down_proj.weight",
        ),
        (
            "blk.0.attn_v.weight",
            "model.layers.0.self_attn.v_proj.weight",
        ),
    ] {
        assert_eq!(find(&q3, gg).map(|x| x.0), Some(hf.to_string()));
    }
    assert_eq!(find(&q2, "output.weight"), None, "tied: no lm_head");
    let untied = QwenConfig {
        tied_embeddings: false,
        ..QwenConfig::tiny(QwenArch::Qwen2)
    };
    assert_eq!(
        find(&weight_names(&untied), "output.weight").map(|x| x.0),
        Some("lm_head.weight".into())
    );
    // Every graph weight is in the map and nothing else.
    for cfg in [
        QwenConfig::tiny(QwenArch::Qwen2),
        QwenConfig::tiny(QwenArch::Qwen3),
        untied,
    ] {
        let names: std::collections::BTreeSet<String> =
            weight_names(&cfg).into_iter().map(|x| x.0).collect();
        let g = sinter::zoo::qwen::build(&cfg, Mode::Prefill, DType::F32).unwrap();
        let f = g.entry().unwrap();
        let params: std::collections::BTreeSet<String> = f
            .params
            .iter()
            .filter_map(|&p| f.values[p].name.clone())
            .filter(|n| !sinter::llm::decoder::GRAPH_INPUTS.contains(&n.as_str()))
            .collect();
        assert_eq!(params, names);
    }
}

#[test]
fn qwen_bad_folders_are_errors_that_name_the_culprit() {
    let cfg = QwenConfig::tiny(QwenArch::Qwen3);
    let dir = scratch("bad");
    let open = |dir: &Path| {
        sinter::llm::open(dir, DType::F32, &mut |_, _| {})
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    write_folder(&dir, &cfg, 13, &["model.layers.1.self_attn.q_norm.weight"]);
    let e = open(&dir);
    assert!(
        e.contains("tensor `model.layers.1.self_attn.q_norm.weight` is missing"),
        "{e}"
    );
    write_folder(&dir, &cfg, 13, &[]);
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = config_json(&cfg);
        f(&mut c);
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    };
    edit(&|c| c["head_dim"] = 16.into());
    let e = open(&dir);
    assert!(
        e.contains(
            "tensor `model.layers.0.self_attn.q_proj.weight` has shape [48, 32], expected [64, 32]"
        ),
        "{e}"
    );
    edit(&|c| c["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0}));
    let e = open(&dir);
    assert!(
        e.contains("rope_scaling.rope_type")
            && e.contains("dynamic")
            && e.contains("default, linear, llama3 and yarn"),
        "{e}"
    );
    edit(&|c| c["rope_scaling"] = json!({"type": "linear"}));
    let e = open(&dir);
    assert!(e.contains("rope_scaling.factor"), "{e}");
    edit(&|c| c["hidden_act"] = "gelu".into());
    let e = open(&dir);
    assert!(e.contains("hidden_act") && e.contains("gelu"), "{e}");
    // YaRN and Llama 3 scalings load (the `rope` op has them).
    edit(&|c| {
        c["rope_scaling"] =
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})
    });
    let m = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    assert!(m.graph(Mode::Decode).is_ok());
    edit(
        &|c| c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    );
    assert!(sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).is_ok());
    // The EOS tokens of generation_config.json join config.json's.
    edit(&|_| {});
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [7, 2]}"#,
    )
    .unwrap();
    assert_eq!(
        sinter::llm::open(&dir, DType::F32, &mut |_, _| {})
            .unwrap()
            .eos_tokens(),
        vec![2, 7]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The graphs the GPU tests run, for `precompile_gpu_test_kernels`: each configuration's
/// prefill and decode (symbolic, and specialised to batches 1, 2 and 3), f32, 4-token pages.
pub(crate) fn precompile_graphs() -> Vec<sinter::Graph> {
    let mut gs = vec![];
    for (_, cfg) in configs() {
        let cfg = QwenConfig {
            page_size: PAGE,
            ..cfg
        };
        gs.push(sinter::zoo::qwen::build(&cfg, Mode::Prefill, DType::F32).unwrap());
        let decode = sinter::zoo::qwen::build(&cfg, Mode::Decode, DType::F32).unwrap();
        for b in [1i64, 2, 3] {
            gs.push(decode.specialize(&[("T".to_string(), b)].into_iter().collect()));
        }
        gs.push(decode);
    }
    gs
}

/// A GGUF metadata value.
enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
    Strs(Vec<String>),
}

fn gguf_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A GGUF v3 file of `meta` and f32 tensors (`[out, in]` row-major, stored innermost first).
fn gguf_bytes(meta: &[(String, Meta)], tensors: &[(String, Vec<usize>, Vec<f64>)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        gguf_str(&mut b, k);
        match v {
            Meta::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Meta::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Meta::Str(x) => {
                b.extend(8u32.to_le_bytes());
                gguf_str(&mut b, x);
            }
            Meta::Strs(xs) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((xs.len() as u64).to_le_bytes());
                for x in xs {
                    gguf_str(&mut b, x);
                }
            }
        }
    }
    let mut offset = 0u64;
    for (name, shape, _) in tensors {
        gguf_str(&mut b, name);
        b.extend((shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            b.extend((*d as u64).to_le_bytes());
        }
        b.extend(0u32.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset += (shape.iter().product::<usize>() as u64 * 4).div_ceil(32) * 32;
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    for (_, _, values) in tensors {
        b.extend(values.iter().flat_map(|&x| (x as f32).to_le_bytes()));
        b.resize(b.len().div_ceil(32) * 32, 0);
    }
    b
}

/// The GGUF file llama.cpp's converter would write for `cfg` and `weights` (no row
/// permutation for Qwen), with a small byte-level BPE tokenizer.
fn write_gguf(path: &Path, cfg: &QwenConfig, weights: &Weights) {
    let a = cfg.arch.name();
    let k = |s: &str| format!("{a}.{s}");
    let tokens: Vec<String> = (0..cfg.vocab)
        .map(|i| {
            ["a", "b", "ab"]
                .get(i)
                .map_or(format!("t{i}"), |t| t.to_string())
        })
        .collect();
    let meta = vec![
        (
            "general.architecture".to_string(),
            Meta::Str(if a == "qwen2" { "qwen2" } else { "qwen3" }),
        ),
        (k("embedding_length"), Meta::U32(cfg.hidden as u32)),
        (k("block_count"), Meta::U32(cfg.n_layers as u32)),
        (k("attention.head_count"), Meta::U32(cfg.n_heads as u32)),
        (
            k("attention.head_count_kv"),
            Meta::U32(cfg.n_kv_heads as u32),
        ),
        (k("attention.key_length"), Meta::U32(cfg.head_dim as u32)),
        (k("attention.value_length"), Meta::U32(cfg.head_dim as u32)),
        (k("feed_forward_length"), Meta::U32(cfg.ffn as u32)),
        (k("rope.freq_base"), Meta::F32(cfg.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Meta::F32(cfg.rms_eps as f32),
        ),
        (k("context_length"), Meta::U32(cfg.context as u32)),
        ("tokenizer.ggml.model".to_string(), Meta::Str("gpt2")),
        ("tokenizer.ggml.tokens".to_string(), Meta::Strs(tokens)),
        (
            "tokenizer.ggml.merges".to_string(),
            Meta::Strs(vec!["a b".into()]),
        ),
        ("tokenizer.ggml.bos_token_id".to_string(), Meta::U32(1)),
        ("tokenizer.ggml.eos_token_id".to_string(), Meta::U32(2)),
    ];
    let tensors: Vec<(String, Vec<usize>, Vec<f64>)> = weights
        .iter()
        .map(|(n, (s, v))| (n.clone(), s.clone(), v.clone()))
        .collect();
    std::fs::write(path, gguf_bytes(&meta, &tensors)).unwrap();
}

#[test]
fn qwen_gguf_files_load_with_llama_cpp_names_and_give_the_folders_logits() {
    for (tag, cfg) in configs()
        .into_iter()
        .filter(|(t, _)| matches!(*t, "qwen2" | "qwen3"))
    {
        let dir = scratch(&format!("gguf-{tag}"));
        let weights = write_folder(&dir, &cfg, 14, &[]);
        let path = dir.join("model.gguf");
        write_gguf(&path, &cfg, &weights);
        let gguf = sinter::llm::open(&path, DType::F32, &mut |_, _| {}).unwrap();
        assert_eq!(gguf.architecture(), tag);
        assert_eq!(
            (gguf.kv().head_dim, gguf.kv().kv_heads, gguf.eos_tokens()),
            (cfg.head_dim, cfg.n_kv_heads, vec![2])
        );
        let hf = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
        let tokens = [3u32, 14, 15, 9, 26];
        let (a, b) = (
            Engine::new(gguf).unwrap().logits(&tokens).unwrap(),
            Engine::new(hf).unwrap().logits(&tokens).unwrap(),
        );
        assert_eq!(
            a.data(),
            b.data(),
            "{tag}: the GGUF file and the folder give the same logits"
        );
        // A GGUF file without a tensor the config implies names it.
        let mut fewer = weights.clone();
        fewer.remove(if cfg.qk_norm {
            "blk.1.attn_k_norm.weight"
        } else {
            "blk.1.attn_v.bias"
        });
        write_gguf(&path, &cfg, &fewer);
        let e = sinter::llm::open(&path, DType::F32, &mut |_, _| {})
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(if cfg.qk_norm {
                "tensor `blk.1.attn_k_norm.weight` is missing"
            } else {
                "tensor `blk.1.attn_v.bias` is missing"
            }),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Fused kernels (load-time ones left out) of a Qwen graph in `spelling`, and the ops of the
/// kernels of one layer (the second), for the failure message.
fn fused_kernels(cfg: &QwenConfig, mode: Mode, spelling: sinter::zoo::qwen::Spelling) -> (usize, String) {
    let g = sinter::zoo::qwen::build_spelled(cfg, mode, DType::BF16, spelling).unwrap();
    let (_, report) = sinter_passes::compile(&g, &sinter::Target::SM_90A, &sinter_passes::PassOptions::for_graph(&g)).unwrap();
    let layer: Vec<String> = report.kernels.iter().filter(|k| !k.load_time).map(|k| format!("{:?}[{}]", k.family, k.ops.join(" "))).collect();
    (report.kernels_after(), layer.join("\n"))
}

/// The issue's gate: Qwen2-0.5B's and Qwen3-0.6B's layers (two of them) written in Hugging
/// Face's order — heads transposed, then RoPE — lower to at most one kernel a layer more than
/// with RoPE applied before the transpose, in prefill and in decode; the layout rules move
/// RoPE onto the projection's rows, into its epilogue.
#[test]
fn qwen_hugging_face_order_lowers_to_the_kernels_of_rope_first() {
    use sinter::zoo::qwen::Spelling;
    for mut cfg in [QwenConfig::qwen2_0_5b(), QwenConfig::qwen3_0_6b()] {
        cfg.n_layers = 2;
        for mode in [Mode::Prefill, Mode::Decode] {
            let (hf, hf_list) = fused_kernels(&cfg, mode, Spelling::HuggingFace);
            let (first, first_list) = fused_kernels(&cfg, mode, Spelling::RopeFirst);
            println!("{} {mode:?}: {hf} kernels in Hugging Face's order, {first} RoPE-first ({} layers)", cfg.arch.name(), cfg.n_layers);
            assert!(
                hf <= first + cfg.n_layers,
                "{} {mode:?}: {hf} kernels in HF order vs {first} RoPE-first\nHF:\n{hf_list}\nRoPE-first:\n{first_list}",
                cfg.arch.name()
            );
        }
    }
}

/// The decode step specialised to batches of 1 and 3 computes every layer's RMSNorms in the
/// prologues of the projections that read them (the GPU test `gpu_qwen_fused_norms_decode_as_
/// the_interpreter` runs these graphs), and the final norm in the LM head's (a vocabulary of
/// 64: the launch saved pays for its CTAs' re-reads).
#[test]
fn specialised_qwen_decode_computes_the_layer_norms_in_projection_prologues() {
    for (tag, cfg) in configs() {
        let dir = scratch(&format!("prologue-{tag}"));
        write_folder(&dir, &cfg, 3, &[]);
        let model = load(&dir);
        for b in [1, 3] {
            let g = model.decode_graph_for_batch(b).unwrap();
            let (_, report) = sinter_passes::compile(&g, &sinter::Target::SM_90A, &sinter_passes::PassOptions::for_graph(&g)).unwrap();
            let fused = report.kernels.iter().filter(|k| k.ops.iter().any(|o| o == "matmul") && k.ops.iter().any(|o| o == "rms_norm")).count();
            // Two norms a layer (before attention and before the MLP), and the final one.
            assert_eq!(fused, 2 * cfg.n_layers + 1, "{tag} batch {b}:\n{report}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A Llama GGUF file whose positions are scaled — `llama.rope.scaling.type` other than
/// `none`, or Llama 3.1's `rope_freqs.weight` tensor — is refused with the key or tensor
/// named, not run with unscaled positions (the writer is this file's).
#[test]
fn llama_gguf_with_rope_scaling_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("sinter-llama-rope-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = || vec![("general.architecture".to_string(), Meta::Str("llama")), ("llama.embedding_length".to_string(), Meta::U32(32)), ("llama.attention.head_count".to_string(), Meta::U32(4))];
    let mut scaled = base();
    scaled.push(("llama.rope.scaling.type".to_string(), Meta::Str("linear")));
    let path = dir.join("scaled.gguf");
    std::fs::write(&path, gguf_bytes(&scaled, &[])).unwrap();
    let e = sinter::llm::open(&path, DType::F32, &mut |_, _| {}).err().unwrap().to_string();
    assert!(e.contains("`llama.rope.scaling.type` = linear") && e.contains("RoPE scaling is not read"), "{e}");
    let path = dir.join("freqs.gguf");
    std::fs::write(&path, gguf_bytes(&base(), &[("rope_freqs.weight".to_string(), vec![4], vec![1.0; 4])])).unwrap();
    let e = sinter::llm::open(&path, DType::F32, &mut |_, _| {}).err().unwrap().to_string();
    assert!(e.contains("`rope_freqs.weight`") && e.contains("Hugging Face folder"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
