//! A Hugging Face model folder (config.json + safetensors + tokenizer.json), written by the
//! test, loads and computes the same logits as the zoo graph bound to the same weights.

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use sinter::llm::{Engine, LlamaModel};
use sinter::zoo::{llama, Mode};
use sinter::{Backend, DType, Program, Tensor};

use crate::zoo::Rng;

const LAYER: [(&str, &str); 9] = [
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

#[test]
fn hugging_face_folder_loads_and_matches_the_zoo_graph() {
    let cfg = llama::LlamaConfig::tiny();
    let dir = std::env::temp_dir().join(format!("sinter-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab, "hidden_size": cfg.hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.ffn, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_eps,
        "max_position_embeddings": cfg.context, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": 2
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    // Weights: f32, seeded; HF names in the file, GGUF names for the direct binding.
    let (d, qd, kvd) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
    let mut named: Vec<(String, String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), "token_embd.weight".into(), vec![cfg.vocab, d]), ("model.norm.weight".into(), "output_norm.weight".into(), vec![d])];
    for i in 0..cfg.n_layers {
        for (hf, gg) in LAYER {
            let shape = match gg {
                "attn_norm" | "ffn_norm" => vec![d],
                "attn_q" => vec![qd, d],
                "attn_k" | "attn_v" => vec![kvd, d],
                "attn_output" => vec![d, qd],
                "ffn_gate" | "ffn_up" => vec![cfg.ffn, d],
                _ => vec![d, cfg.ffn],
            };
            named.push((format!("model.layers.{i}.{hf}.weight"), format!("blk.{i}.{gg}.weight"), shape));
        }
    }
    let mut rng = Rng::new(11);
    let values: Vec<Vec<f32>> = named
        .iter()
        .map(|(_, g, s)| {
            let n: usize = s.iter().product();
            (0..n).map(|_| if g.contains("norm") { 1.0 + 0.1 * rng.next_f64() as f32 } else { 0.3 * rng.next_f64() as f32 }).collect()
        })
        .collect();
    let bytes: Vec<Vec<u8>> = values.iter().map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, TensorView<'_>)> =
        named.iter().zip(&bytes).map(|((hf, _, s), b)| (hf.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::tensor::serialize(views, None).unwrap()).unwrap();
    // A word-level tokenizer over t0..t63.
    let vocab: HashMap<String, u32> = (0..cfg.vocab as u32).map(|i| (format!("t{i}"), i)).collect();
    let wl = tokenizers::models::wordlevel::WordLevel::builder().vocab(vocab.into_iter().collect()).unk_token("t0".into()).build().unwrap();
    let mut tk = tokenizers::Tokenizer::new(wl);
    tk.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
    tk.save(dir.join("tokenizer.json"), false).unwrap();

    let model = LlamaModel::open(&dir, DType::F32, |_, _| {}).unwrap();
    assert_eq!(model.cfg.rope_form, "rotate_half");
    let ids = model.tokenizer.encode("t3 t17 t42 t5").unwrap();
    assert_eq!(ids, vec![3, 17, 42, 5]);
    let engine = Engine::new(model).unwrap();
    let ours = engine.logits(&ids).unwrap();
    // An id past the embedding table (a tokenizer that does not belong to the model) is an
    // error naming it, not a gather past the table.
    let e = engine.logits(&[3, cfg.vocab as u32]).unwrap_err().to_string();
    assert!(e.contains(&format!("prompt token 1 is id {}, past the model's vocabulary of {} ids", cfg.vocab, cfg.vocab)), "{e}");

    let mut c = cfg.clone();
    c.rope_form = "rotate_half";
    let mut p = Program::compile(llama::build(&c, Mode::Prefill, DType::F32).unwrap(), Backend::Interpreter).unwrap();
    for ((_, g, s), v) in named.iter().zip(&values) {
        p.bind(g, Tensor::new(DType::F32, s, v.iter().map(|&x| x as f64).collect()).unwrap()).unwrap();
    }
    let n = ids.len();
    let m = n.div_ceil(c.page_size);
    let pages = Tensor::zeros(DType::F32, &[c.n_layers * m, c.page_size, c.n_kv_heads, c.head_dim]);
    let toks = Tensor::new(DType::I64, &[n], ids.iter().map(|&t| t as f64).collect()).unwrap();
    let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
    let bt = Tensor::from_fn(DType::I32, &[c.n_layers, 1, m], |i| (i[0] * m + i[2]) as f64);
    let want = p.run(&[("tokens", &toks), ("positions", &pos), ("block_tables", &bt), ("k_pages", &pages), ("v_pages", &pages)], &[]).unwrap();
    assert_eq!(ours.data(), want[0].data());

    // Llama 3.1's `rope_scaling` is read (before, the folder was refused) and reaches every
    // `rope` of the graph: the same logits as the zoo graph built with that scaling.
    let mut scaled = config.clone();
    scaled["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16});
    std::fs::write(dir.join("config.json"), scaled.to_string()).unwrap();
    let model = LlamaModel::open(&dir, DType::F32, |_, _| {}).unwrap();
    let llama3 = llama::RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 16 };
    assert_eq!(model.cfg.rope_scaling, llama3);
    let ours_scaled = Engine::new(model).unwrap().logits(&ids).unwrap();
    c.rope_scaling = llama3;
    let mut p = Program::compile(llama::build(&c, Mode::Prefill, DType::F32).unwrap(), Backend::Interpreter).unwrap();
    for ((_, g, s), v) in named.iter().zip(&values) {
        p.bind(g, Tensor::new(DType::F32, s, v.iter().map(|&x| x as f64).collect()).unwrap()).unwrap();
    }
    let want = p.run(&[("tokens", &toks), ("positions", &pos), ("block_tables", &bt), ("k_pages", &pages), ("v_pages", &pages)], &[]).unwrap();
    assert_eq!(ours_scaled.data(), want[0].data());
    assert_ne!(ours_scaled.data(), ours.data(), "the scaling changes the logits");
    // What the Llama graph does not compute is refused, not run.
    for (key, value) in [("hidden_act", serde_json::json!("gelu")), ("attention_bias", serde_json::json!(true)), ("mlp_bias", serde_json::json!(true))] {
        let mut bad = config.clone();
        bad[key] = value;
        std::fs::write(dir.join("config.json"), bad.to_string()).unwrap();
        let e = LlamaModel::open(&dir, DType::F32, |_, _| {}).err().unwrap().to_string();
        assert!(e.contains(&format!("`{key}`")) && e.contains("supported:"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_folder_with_another_architecture_or_no_weights_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("sinter-hf-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"model_type": "mistral"}"#).unwrap();
    let e = LlamaModel::open(&dir, DType::F32, |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("architecture `mistral` is not supported"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"model_type": "llama", "hidden_size": 8}"#).unwrap();
    let e = LlamaModel::open(&dir, DType::F32, |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("`num_attention_heads` is missing"), "{e}");
    // No `model_type`: the `architectures` class decides; with neither, an error names the key.
    std::fs::write(dir.join("config.json"), r#"{"architectures": ["MistralForCausalLM"]}"#).unwrap();
    let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("`MistralForCausalLM` is not supported"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 8}"#).unwrap();
    let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap();
    assert!(e.to_string().contains("`num_attention_heads` is missing"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"hidden_size": 8}"#).unwrap();
    for e in [sinter::llm::open(&dir, DType::F32, &mut |_, _| {}).err().unwrap().to_string(), LlamaModel::open(&dir, DType::F32, |_, _| {}).err().unwrap().to_string()] {
        assert!(e.contains("`model_type`") && e.contains("config.json"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
