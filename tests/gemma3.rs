//! Gemma 3 (text) through the decoder contract: Hugging Face folders written here (f32
//! safetensors, `model_type` `gemma3_text` or `gemma3`), loaded by `sinter::llm::open` and
//! served by the same [`Engine`] as the other architectures.
//!
//! - A plain f64 implementation written here after `modeling_gemma3.py` (scaled embeddings,
//!   `(1 + w)` RMSNorms in f32, sandwich norms, q/k norms before RoPE, the local RoPE base on
//!   sliding layers and the global one with its linear scaling on full ones,
//!   `query_pre_attn_scalar`, the sliding-window mask, soft-capping, GELU(tanh)) gives the
//!   teacher-forced logits of the prefill graph at every position, past the window.
//! - Greedy generation through the engine (prefill, then paged decode) gives the tokens and
//!   logits of that full recompute for 10 steps at batch 1 and batch 2 (prompts of 3 and 7
//!   tokens, window 4, 4-token pages).
//! - The window is the `window` attribute of `attention`/`paged_attention` on sliding layers
//!   only, and the graphs hold no mask.
//! - A `gemma3` (multimodal) folder and a GGUF file (norms stored `w + 1`) load the same
//!   weights; missing tensors, wrong shapes and bad configs are errors naming them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;
use sinter::llm::{DecoderModel, Engine, Gemma3Model, Generation, SampleOptions};
use sinter::zoo::gemma3::{self, Gemma3Config};
use sinter::zoo::Mode;
use sinter::DType;

use crate::zoo::Rng;

/// Steps generated per sequence.
pub(crate) const STEPS: usize = 10;

/// Weights by Hugging Face name (without a prefix): shape and values (f32-exact).
pub(crate) type Weights = BTreeMap<String, (Vec<usize>, Vec<f64>)>;

/// A fresh folder for one test.
pub(crate) fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sinter-gemma3-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The vocabulary's words: `t{i}`, with Gemma's `<eos>` (1), `<bos>` (2) and
/// `<end_of_turn>` (the last id).
fn word(i: usize, vocab: usize) -> String {
    match i {
        1 => "<eos>".into(),
        2 => "<bos>".into(),
        i if i + 1 == vocab => "<end_of_turn>".into(),
        i => format!("t{i}"),
    }
}

/// A word-level tokenizer over [`word`].
pub(crate) fn write_tokenizer(dir: &Path, vocab: usize) {
    let words: HashMap<String, u32> = (0..vocab).map(|i| (word(i, vocab), i as u32)).collect();
    let wl = tokenizers::models::wordlevel::WordLevel::builder().vocab(words.into_iter().collect()).unk_token("t0".into()).build().unwrap();
    let mut tk = tokenizers::Tokenizer::new(wl);
    tk.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
    let specials: Vec<tokenizers::AddedToken> = [1, 2, vocab - 1].iter().map(|&i| tokenizers::AddedToken::from(word(i, vocab), true)).collect();
    tk.add_special_tokens(&specials);
    tk.save(dir.join("tokenizer.json"), false).unwrap();
}

/// The tiny configuration of these tests: 3 layers (sliding, full, sliding), window 4.
pub(crate) fn cfg() -> Gemma3Config {
    Gemma3Config::tiny()
}

/// `config.json` of `cfg` as Hugging Face writes a `gemma3_text` model.
pub(crate) fn config_json(cfg: &Gemma3Config) -> serde_json::Value {
    let types: Vec<&str> = cfg.sliding.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" }).collect();
    json!({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": cfg.vocab, "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.n_layers(), "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": cfg.context,
        "rms_norm_eps": cfg.rms_eps, "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        "sliding_window": cfg.sliding_window, "layer_types": types,
        "rope_theta": cfg.rope_theta, "rope_local_base_freq": cfg.rope_local_theta,
        "rope_scaling": cfg.rope_linear_factor.map(|f| json!({"rope_type": "linear", "factor": f})),
        "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.final_softcap,
        "attention_bias": false, "tie_word_embeddings": true,
        "bos_token_id": 2, "eos_token_id": [1, cfg.vocab - 1], "pad_token_id": 0
    })
}

/// Seeded weights of `cfg` by Hugging Face name: norm weights `w` within ±0.3 (a scale of
/// `1 + w`), matrices scaled by 1/√fan-in, embeddings within ±0.5.
pub(crate) fn make_weights(cfg: &Gemma3Config, seed: u64) -> Weights {
    let (d, hd, f) = (cfg.hidden, cfg.head_dim, cfg.ffn);
    let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    let mut named: Vec<(String, Vec<usize>)> = vec![("embed_tokens.weight".into(), vec![cfg.vocab, d]), ("norm.weight".into(), vec![d])];
    for i in 0..cfg.n_layers() {
        for (n, s) in [
            ("input_layernorm", vec![d]),
            ("self_attn.q_proj", vec![qd, d]),
            ("self_attn.k_proj", vec![kvd, d]),
            ("self_attn.v_proj", vec![kvd, d]),
            ("self_attn.q_norm", vec![hd]),
            ("self_attn.k_norm", vec![hd]),
            ("self_attn.o_proj", vec![d, qd]),
            ("post_attention_layernorm", vec![d]),
            ("pre_feedforward_layernorm", vec![d]),
            ("mlp.gate_proj", vec![f, d]),
            ("mlp.up_proj", vec![f, d]),
            ("mlp.down_proj", vec![d, f]),
            ("post_feedforward_layernorm", vec![d]),
        ] {
            named.push((format!("layers.{i}.{n}.weight"), s));
        }
    }
    let mut rng = Rng::new(seed);
    named
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let fan_in = *shape.last().unwrap() as f64;
            let values = (0..n)
                .map(|_| {
                    let r = rng.next_f64();
                    let x = if name.contains("norm") {
                        0.3 * r
                    } else if name.contains("embed") {
                        0.5 * r
                    } else {
                        r / fan_in.sqrt()
                    };
                    x as f32 as f64
                })
                .collect();
            (name, (shape, values))
        })
        .collect()
}

/// Writes `model.safetensors` (f32) with every weight under `prefix`, except `skip`.
fn write_safetensors(dir: &Path, w: &Weights, prefix: &str, skip: &[&str], edit: &dyn Fn(&str, &mut Vec<usize>)) {
    let stored: Vec<(String, Vec<usize>, Vec<u8>)> = w
        .iter()
        .filter(|(n, _)| !skip.contains(&n.as_str()))
        .map(|(n, (s, v))| {
            let mut s = s.clone();
            edit(n, &mut s);
            let len: usize = s.iter().product();
            let bytes: Vec<u8> = v.iter().cycle().take(len).flat_map(|&x| (x as f32).to_le_bytes()).collect();
            (format!("{prefix}{n}"), s, bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = stored.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::tensor::serialize(views, None).unwrap()).unwrap();
}

/// Writes a `gemma3_text` folder of `cfg` with seeded weights; returns them.
pub(crate) fn write_folder(dir: &Path, cfg: &Gemma3Config, seed: u64) -> Weights {
    std::fs::write(dir.join("config.json"), config_json(cfg).to_string()).unwrap();
    let w = make_weights(cfg, seed);
    write_safetensors(dir, &w, "model.", &[], &|_, _| {});
    write_tokenizer(dir, cfg.vocab);
    w
}

/// `x·rsqrt(mean(x²)+ε)·(1 + w)`, Gemma3RMSNorm.
fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * (1.0 + w)).collect()
}

/// `x · Wᵀ` for `W` of shape `[out, in]`.
fn linear(x: &[f64], w: &[f64], out: usize) -> Vec<f64> {
    let inn = x.len();
    (0..out).map(|o| (0..inn).map(|i| x[i] * w[o * inn + i]).sum()).collect()
}

/// Rotates one head in the `rotate_half` pairing with inverse frequencies
/// `θ^(−2i/D) / factor`.
fn rope(x: &mut [f64], pos: usize, theta: f64, factor: f64) {
    let half = x.len() / 2;
    for i in 0..half {
        let inv = theta.powf(-2.0 * i as f64 / x.len() as f64) / factor;
        let (s, c) = (pos as f64 * inv).sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// The logits of every position of `tokens` in f64, written after `modeling_gemma3.py`
/// (eager attention): `[T][vocab]`.
pub(crate) fn reference(cfg: &Gemma3Config, w: &Weights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let g = |n: &str| &w[n].1;
    let (d, hd, h, hkv, eps) = (cfg.hidden, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.rms_eps);
    let embed = g("embed_tokens.weight");
    let normaliser = (d as f64).sqrt() as f32 as f64;
    let mut x: Vec<Vec<f64>> = tokens.iter().map(|&t| embed[t as usize * d..(t as usize + 1) * d].iter().map(|v| v * normaliser).collect()).collect();
    let n = tokens.len();
    let scaling = cfg.query_pre_attn_scalar.powf(-0.5);
    for l in 0..cfg.n_layers() {
        let p = |s: &str| format!("layers.{l}.{s}.weight");
        let sliding = cfg.sliding[l];
        let (theta, factor) = if sliding { (cfg.rope_local_theta, 1.0) } else { (cfg.rope_theta, cfg.rope_linear_factor.unwrap_or(1.0)) };
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (t, xt) in x.iter().enumerate() {
            let hn = rms(xt, g(&p("input_layernorm")), eps);
            let (q, k, v) = (linear(&hn, g(&p("self_attn.q_proj")), h * hd), linear(&hn, g(&p("self_attn.k_proj")), hkv * hd), linear(&hn, g(&p("self_attn.v_proj")), hkv * hd));
            let heads = |m: &[f64], nh: usize, norm: &str| -> Vec<Vec<f64>> {
                (0..nh)
                    .map(|i| {
                        let mut r = rms(&m[i * hd..(i + 1) * hd], g(&p(norm)), eps);
                        rope(&mut r, t, theta, factor);
                        r
                    })
                    .collect()
            };
            qs.push(heads(&q, h, "self_attn.q_norm"));
            ks.push(heads(&k, hkv, "self_attn.k_norm"));
            vs.push((0..hkv).map(|i| v[i * hd..(i + 1) * hd].to_vec()).collect::<Vec<_>>());
        }
        for t in 0..n {
            let mut attn = vec![0.0; h * hd];
            for hh in 0..h {
                let kvh = hh / (h / hkv);
                // Keys j ≤ t, and t − j < window on a sliding layer.
                let visible: Vec<usize> = (0..=t).filter(|&j| !sliding || t - j < cfg.sliding_window).collect();
                let scores: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        let s = qs[t][hh].iter().zip(&ks[j][kvh]).map(|(a, b)| a * b).sum::<f64>() * scaling;
                        cfg.attn_softcap.map_or(s, |c| c * (s / c).tanh())
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (&j, ej) in visible.iter().zip(&e) {
                    for i in 0..hd {
                        attn[hh * hd + i] += ej / z * vs[j][kvh][i];
                    }
                }
            }
            let o = rms(&linear(&attn, g(&p("self_attn.o_proj")), d), g(&p("post_attention_layernorm")), eps);
            let x1: Vec<f64> = x[t].iter().zip(&o).map(|(a, b)| a + b).collect();
            let hn = rms(&x1, g(&p("pre_feedforward_layernorm")), eps);
            let (gate, up) = (linear(&hn, g(&p("mlp.gate_proj")), cfg.ffn), linear(&hn, g(&p("mlp.up_proj")), cfg.ffn));
            let act: Vec<f64> = gate.iter().zip(&up).map(|(a, b)| gelu_tanh(*a) * b).collect();
            let m = rms(&linear(&act, g(&p("mlp.down_proj")), d), g(&p("post_feedforward_layernorm")), eps);
            x[t] = x1.iter().zip(&m).map(|(a, b)| a + b).collect();
        }
    }
    x.iter()
        .map(|xt| {
            let xn = rms(xt, g("norm.weight"), eps);
            let logits = linear(&xn, embed, cfg.vocab);
            logits.into_iter().map(|v| cfg.final_softcap.map_or(v, |c| c * (v / c).tanh())).collect()
        })
        .collect()
}

/// The largest |a − b| over two rows, relative to the row's largest |b| (at least 1).
pub(crate) fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

/// The Gemma 3 model of `dir` (through the registry), with `PAGE`-token pages.
pub(crate) fn load(dir: &Path) -> Gemma3Model {
    let mut m = Gemma3Model::from_hf(sinter::llm::hf::HfFolder::open(dir).unwrap(), DType::F32, &mut |_, _| {}).unwrap();
    m.cfg.page_size = cfg().page_size;
    m
}

/// Greedy generation of exactly `STEPS` tokens per prompt, with the logits of each token.
pub(crate) fn generate<M: DecoderModel>(engine: &Engine<M>, prompts: &[Vec<u32>]) -> (Generation, Vec<Vec<Vec<f64>>>) {
    let mut logits: Vec<Vec<Vec<f64>>> = vec![Vec::new(); prompts.len()];
    let o = SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(STEPS) };
    let g = engine.generate_observed(prompts, &o, &mut |_, _| {}, &mut |s, row| logits[s].push(row.to_vec())).unwrap();
    (g, logits)
}

/// Each generated token against the f64 full recompute over the prompt and the tokens before
/// it: the same greedy token, logits within `tol` of the row's largest.
pub(crate) fn check_against_reference(cfg: &Gemma3Config, w: &Weights, prompts: &[Vec<u32>], g: &Generation, logits: &[Vec<Vec<f64>>], tol: f64) {
    for (s, prompt) in prompts.iter().enumerate() {
        assert_eq!(g.tokens[s].len(), STEPS, "sequence {s}");
        let mut seq = prompt.clone();
        for (k, &t) in g.tokens[s].iter().enumerate() {
            let want = reference(cfg, w, &seq).pop().unwrap();
            let err = rel_err(&logits[s][k], &want);
            assert!(err <= tol, "sequence {s}, step {k} (position {}): logits differ by {err} of the largest", seq.len());
            assert_eq!(t, sinter::llm::argmax(&want), "sequence {s}, step {k}: the engine's token differs from the full recompute's");
            seq.push(t);
        }
    }
}

pub(crate) fn prompts() -> (Vec<u32>, Vec<u32>) {
    (vec![5, 17, 42], vec![9, 3, 60, 33, 21, 8, 14])
}

#[test]
fn gemma3_prefill_equals_an_f64_implementation_after_transformers() {
    // Every optional piece switched on: linear RoPE scaling on the full layer, both soft caps,
    // a query_pre_attn_scalar other than the head width.
    let c = Gemma3Config { query_pre_attn_scalar: 24.0, rope_linear_factor: Some(2.0), attn_softcap: Some(1.5), final_softcap: Some(4.0), rope_theta: 1000.0, ..cfg() };
    let dir = scratch("reference");
    let w = write_folder(&dir, &c, 11);
    let model = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    assert_eq!(model.architecture(), "gemma3");
    let engine = Engine::new(model).unwrap();
    let tokens: Vec<u32> = (0..13).map(|i| (i * 7 + 3) % 64).collect();
    let got = engine.logits(&tokens).unwrap();
    let want = reference(&c, &w, &tokens);
    for (p, row) in want.iter().enumerate() {
        let err = rel_err(&got.data()[p * c.vocab..(p + 1) * c.vocab], row);
        assert!(err <= 1e-5, "position {p}: logits differ by {err} of the largest");
    }
    // The reference is sensitive to what it checks: without the window the logits move.
    let no_window = reference(&Gemma3Config { sliding_window: 100, ..c.clone() }, &w, &tokens);
    assert!(rel_err(&no_window[12], &want[12]) > 1e-3, "the window changes the logits past it");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gemma3_through_the_engine_equals_a_full_recompute_at_batch_1_and_2() {
    let c = cfg();
    let dir = scratch("engine");
    let w = write_folder(&dir, &c, 5);
    let any = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    assert_eq!((any.kv().kv_heads, any.kv().head_dim, any.kv().layers), (2, 16, 3));
    assert_eq!(any.eos_tokens(), vec![1, 63], "<eos> and <end_of_turn>");
    let engine = Engine::new(load(&dir)).unwrap();
    let (p1, p2) = prompts();
    let (g1, l1) = generate(&engine, std::slice::from_ref(&p1));
    assert_eq!(g1.decode_steps, STEPS - 1);
    check_against_reference(&c, &w, std::slice::from_ref(&p1), &g1, &l1, 1e-5);
    let both = [p1, p2];
    let (g2, l2) = generate(&engine, &both);
    check_against_reference(&c, &w, &both, &g2, &l2, 1e-5);
    assert_eq!(g2.tokens[0], g1.tokens[0], "a sequence's tokens do not depend on its batch");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The attribute lists of the attention nodes of a graph, in order.
fn attention_attrs(g: &sinter::Graph, op: &str) -> Vec<String> {
    let text = g.to_string();
    text.lines().filter(|l| l.contains(&format!("= {op}("))).map(|l| l.split_once('{').map_or("", |x| x.1).to_string()).collect()
}

#[test]
fn gemma3_sliding_layers_use_the_window_attribute_and_no_mask() {
    let c = cfg();
    for (mode, op) in [(Mode::Prefill, "attention"), (Mode::Decode, "paged_attention")] {
        let g = gemma3::build(&c, mode, DType::BF16).unwrap();
        sinter::ir::verify(&g).unwrap();
        let attrs = attention_attrs(&g, op);
        assert_eq!(attrs.len(), 3, "{mode:?}: one {op} per layer:\n{g}");
        for (l, a) in attrs.iter().enumerate() {
            assert_eq!(a.contains("window=4"), c.sliding[l], "{mode:?} layer {l}: {a}");
            assert!(!a.contains("softcap"), "{a}");
        }
        let text = g.to_string();
        assert!(!text.contains("iota(") || text.matches("iota(").count() == 1, "{mode:?}: no mask is built (the one iota is the greedy token's)");
        assert!(!text.contains("softmax("), "{mode:?}: attention is not decomposed");
    }
}

/// A `gemma3` (multimodal) folder: the text model's keys under `text_config`, its tensors under
/// `language_model.model.`, a vision tower that is not read.
#[test]
fn gemma3_multimodal_folder_loads_its_text_model() {
    let c = cfg();
    let dir = scratch("multimodal");
    let w = write_folder(&dir, &c, 7);
    let text = load(&dir);
    let mut text_config = config_json(&c);
    text_config["model_type"] = "gemma3_text".into();
    let config = json!({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text_config, "vision_config": {"hidden_size": 8}, "eos_token_id": [1, 63]});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut with_vision = w.clone();
    with_vision.insert("vision_tower.patch.weight".into(), (vec![2, 2], vec![0.0; 4]));
    write_safetensors(&dir, &with_vision, "language_model.model.", &[], &|_, _| {});
    let mm = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    assert_eq!(mm.architecture(), "gemma3");
    assert_eq!(mm.weights().len(), text.weights.len());
    for (k, t) in mm.weights() {
        assert_eq!(t.data(), text.weights[k].data(), "{k}");
    }
    // A key the text config lacks is named with its path.
    let mut bad = config.clone();
    bad["text_config"].as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(dir.join("config.json"), bad.to_string()).unwrap();
    let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("`text_config.hidden_size` is missing"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gemma3_bad_folders_are_errors_that_name_the_tensor_or_key() {
    let c = cfg();
    let dir = scratch("bad");
    let w = write_folder(&dir, &c, 9);
    let open = || sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap().to_string();
    write_safetensors(&dir, &w, "model.", &["layers.1.self_attn.k_norm.weight"], &|_, _| {});
    let e = open();
    assert!(e.contains("tensor `model.layers.1.self_attn.k_norm.weight` is missing"), "{e}");
    write_safetensors(&dir, &w, "model.", &[], &|n, s| {
        if n == "layers.2.post_feedforward_layernorm.weight" {
            s[0] += 1;
        }
    });
    let e = open();
    assert!(e.contains("tensor `model.layers.2.post_feedforward_layernorm.weight` has shape [33], expected [32]"), "{e}");
    write_safetensors(&dir, &w, "model.", &[], &|_, _| {});
    for (key, value, want) in [
        ("layer_types", json!(["sliding_attention", "full_attention"]), "`layer_types`: 2 entries for 3 layers"),
        ("layer_types", json!(["sliding_attention", "global", "full_attention"]), "\"global\" is neither"),
        ("rope_scaling", json!({"rope_type": "yarn", "factor": 2.0}), "RoPE type `yarn` is not supported"),
        ("num_key_value_heads", json!(3), "must be a positive multiple of n_kv_heads (3)"),
        ("use_bidirectional_attention", json!(true), "`use_bidirectional_attention = true` is not supported"),
    ] {
        let mut cj = config_json(&c);
        cj[key] = value;
        std::fs::write(dir.join("config.json"), cj.to_string()).unwrap();
        let e = open();
        assert!(e.contains(want), "{key}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GGUF value: (type id, bytes).
fn gguf_str(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// A GGUF file of `cfg`'s weights as llama.cpp's converter writes them (norm weights `w + 1`)
/// with a byte-level BPE vocabulary of [`word`]s.
fn write_gguf(path: &Path, cfg: &Gemma3Config, w: &Weights) {
    let names: BTreeMap<&str, &str> = [
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("self_attn.o_proj", "attn_output"),
        ("post_attention_layernorm", "post_attention_norm"),
        ("pre_feedforward_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("post_feedforward_layernorm", "post_ffw_norm"),
    ]
    .into_iter()
    .collect();
    let gguf_name = |hf: &str| -> String {
        match hf {
            "embed_tokens.weight" => "token_embd.weight".into(),
            "norm.weight" => "output_norm.weight".into(),
            _ => {
                let rest = hf.strip_prefix("layers.").unwrap();
                let (i, n) = rest.split_once('.').unwrap();
                format!("blk.{i}.{}.weight", names[n.strip_suffix(".weight").unwrap()])
            }
        }
    };
    let u32v = |k: &str, v: usize| [gguf_str(k), 4u32.to_le_bytes().to_vec(), (v as u32).to_le_bytes().to_vec()].concat();
    let f32v = |k: &str, v: f64| [gguf_str(k), 6u32.to_le_bytes().to_vec(), (v as f32).to_le_bytes().to_vec()].concat();
    let strv = |k: &str, v: &str| [gguf_str(k), 8u32.to_le_bytes().to_vec(), gguf_str(v)].concat();
    let arr = |k: &str, ty: u32, items: Vec<Vec<u8>>| [gguf_str(k), 9u32.to_le_bytes().to_vec(), ty.to_le_bytes().to_vec(), (items.len() as u64).to_le_bytes().to_vec(), items.concat()].concat();
    let kv = vec![
        strv("general.architecture", "gemma3"),
        u32v("gemma3.context_length", cfg.context),
        u32v("gemma3.embedding_length", cfg.hidden),
        u32v("gemma3.block_count", cfg.n_layers()),
        u32v("gemma3.feed_forward_length", cfg.ffn),
        u32v("gemma3.attention.head_count", cfg.n_heads),
        u32v("gemma3.attention.head_count_kv", cfg.n_kv_heads),
        u32v("gemma3.attention.key_length", cfg.head_dim),
        u32v("gemma3.attention.value_length", cfg.head_dim),
        f32v("gemma3.attention.layer_norm_rms_epsilon", cfg.rms_eps),
        f32v("gemma3.rope.freq_base", cfg.rope_theta),
        u32v("gemma3.attention.sliding_window", cfg.sliding_window),
        arr("gemma3.attention.sliding_window_pattern", 7, cfg.sliding.iter().map(|&s| vec![s as u8]).collect()),
        strv("tokenizer.ggml.model", "gpt2"),
        arr("tokenizer.ggml.tokens", 8, (0..cfg.vocab).map(|i| gguf_str(&word(i, cfg.vocab))).collect()),
        arr("tokenizer.ggml.merges", 8, vec![]),
        u32v("tokenizer.ggml.bos_token_id", 2),
        u32v("tokenizer.ggml.eos_token_id", 1),
    ];
    let mut infos = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    for (hf, (shape, values)) in w {
        let name = gguf_name(hf);
        let shift = if name.ends_with("norm.weight") { 1.0 } else { 0.0 };
        infos.push([gguf_str(&name), (shape.len() as u32).to_le_bytes().to_vec(), shape.iter().rev().flat_map(|&d| (d as u64).to_le_bytes()).collect(), 0u32.to_le_bytes().to_vec(), (data.len() as u64).to_le_bytes().to_vec()].concat());
        data.extend(values.iter().flat_map(|&v| ((v + shift) as f32).to_le_bytes()));
        data.resize(data.len().div_ceil(32) * 32, 0);
    }
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((infos.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    b.extend(kv.concat());
    b.extend(infos.concat());
    b.resize(b.len().div_ceil(32) * 32, 0);
    b.extend(data);
    std::fs::write(path, b).unwrap();
}

#[test]
fn gemma3_gguf_norms_stored_plus_one_load_as_the_folders_weights() {
    let c = cfg();
    let dir = scratch("gguf");
    let w = write_folder(&dir, &c, 13);
    let hf = load(&dir);
    let path = dir.join("tiny-gemma3.gguf");
    write_gguf(&path, &c, &w);
    let gg = sinter::llm::open(&path, DType::F32, &mut |_, _| {}).unwrap();
    assert_eq!(gg.architecture(), "gemma3");
    assert_eq!(gg.kv(), sinter::llm::KvGeometry { page_size: 16, ..hf.kv() });
    assert_eq!(gg.eos_tokens(), vec![1, 63]);
    assert_eq!(gg.weights().len(), hf.weights.len());
    for (k, t) in gg.weights() {
        // `w + 1` rounded to f32 then less 1: within an f32 ulp of 1.
        let err = t.data().iter().zip(hf.weights[k].data()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(err <= if k.ends_with("norm.weight") { 1.2e-7 } else { 0.0 }, "{k}: {err}");
    }
    // The same model: the GGUF metadata map to the folder's config (layer types, window, RoPE).
    let tokens: Vec<u32> = (0..11).map(|i| (i * 5 + 1) % 64).collect();
    let (a, b) = (Engine::new(gg).unwrap().logits(&tokens).unwrap(), Engine::new(hf).unwrap().logits(&tokens).unwrap());
    for p in 0..tokens.len() {
        let err = rel_err(&a.data()[p * c.vocab..(p + 1) * c.vocab], &b.data()[p * c.vocab..(p + 1) * c.vocab]);
        assert!(err <= 1e-5, "position {p}: GGUF and folder logits differ by {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Gemma's template writes `<bos>` itself: a chat prompt has one BOS although the tokenizer
/// adds one to plain text (`add_bos_token`); the template may live in `chat_template.jinja`.
#[test]
fn gemma3_chat_prompt_has_one_bos() {
    let c = cfg();
    let dir = scratch("chat");
    write_folder(&dir, &c, 3);
    let template = "{{ bos_token }}{% for m in messages %}{{ m.content }} <end_of_turn> {% endfor %}t7";
    std::fs::write(dir.join("tokenizer_config.json"), json!({"add_bos_token": true, "bos_token": "<bos>"}).to_string()).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    let model = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).unwrap();
    assert_eq!(model.tokenizer().encode("t5 t9").unwrap(), vec![2, 5, 9], "BOS before plain text");
    assert_eq!(model.chat_prompt("t5 t9").unwrap(), vec![2, 5, 9, 63, 7], "one BOS, the turn closed by <end_of_turn>");
    let _ = std::fs::remove_dir_all(&dir);
}
