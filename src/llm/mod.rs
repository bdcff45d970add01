//! Running language models: GGUF loading, tokenizer, chat template, and generation with a
//! paged KV cache over the zoo's Llama prefill and decode graphs.
//!
//! ```no_run
//! use sinter::llm::{Engine, LlamaModel, SampleOptions};
//! let model = LlamaModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), sinter::DType::BF16, |_, _| {})?;
//! let prompt = model.chat_prompt("What is the capital of France?")?;
//! let engine = Engine::new(model)?;
//! let out = engine.generate(&[prompt], &SampleOptions::greedy(32), &mut |_, _| {})?;
//! println!("{}", engine.model().tokenizer.decode(&out.tokens[0])?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod chat;
pub mod fetch;
pub mod gguf;
pub mod hf;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::zoo::llama::{self, LlamaConfig};
use crate::zoo::Mode;
use crate::gpu::{CompileStats, GpuProgram, Lowering};
use crate::{Backend, DType, Error, Program, Tensor};
use sinter_runtime::{Device, DeviceBuffer};
use chat::Message;
use gguf::{GgufFile, ModelError};
use tokenizer::Tokenizer;

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Error {
        Error::Model(e)
    }
}

/// A Llama-family model loaded from GGUF: config, dequantised weights, tokenizer.
pub struct LlamaModel {
    /// Hyper-parameters read from the file's metadata.
    pub cfg: LlamaConfig,
    /// Storage dtype of the weights and activations.
    pub dtype: DType,
    /// Weights by GGUF name, shared between the prefill and decode programs.
    pub weights: BTreeMap<String, Arc<Tensor>>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template.
    pub chat: chat::ChatTemplate,
    /// Where the model was loaded from.
    pub source: std::path::PathBuf,
}

impl LlamaModel {
    /// Reads a Llama-family GGUF file and dequantises its weights to `dtype`; `progress(done,
    /// total)` is called after each tensor.
    ///
    /// The attention projections keep llama.cpp's row order: its converter permutes the rows
    /// of `attn_q`/`attn_k` within each head so that RoPE pairs adjacent elements, so the
    /// model runs with the `interleaved` RoPE form, which computes the same attention as the
    /// Hugging Face weights with `rotate_half`.
    ///
    /// # Errors
    /// [`ModelError`]: unreadable, truncated or corrupt file, unknown architecture, missing
    /// keys or tensors, unsupported tensor types, shapes that disagree with the metadata.
    pub fn load(path: &Path, dtype: DType, mut progress: impl FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
        let file = GgufFile::open(path)?;
        let arch = file.str("general.architecture")?.to_string();
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture { path: path.to_path_buf(), arch });
        }
        let k = |s: &str| format!("{arch}.{s}");
        let u = |s: &str| file.u64(&k(s)).map(|v| v as usize);
        let hidden = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let cfg = LlamaConfig {
            vocab: u("vocab_size").unwrap_or(tokenizer.vocab_size()),
            hidden,
            n_layers: u("block_count")?,
            n_heads,
            n_kv_heads: u("attention.head_count_kv").unwrap_or(n_heads),
            head_dim: u("rope.dimension_count").unwrap_or(hidden / n_heads.max(1)),
            ffn: u("feed_forward_length")?,
            rope_theta: file.f64(&k("rope.freq_base")).unwrap_or(10000.0),
            rope_form: "interleaved",
            rms_eps: file.f64(&k("attention.layer_norm_rms_epsilon"))?,
            context: u("context_length")?,
            page_size: 16,
            tied_embeddings: file.info("output.weight").is_none(),
        };
        cfg.validate().map_err(|e| ModelError::Malformed { path: path.to_path_buf(), reason: e.to_string() })?;
        let (d, qd, kvd) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
        let mut wanted: Vec<(String, Vec<usize>)> = vec![("token_embd.weight".into(), vec![cfg.vocab, d]), ("output_norm.weight".into(), vec![d])];
        if !cfg.tied_embeddings {
            wanted.push(("output.weight".into(), vec![cfg.vocab, d]));
        }
        for i in 0..cfg.n_layers {
            for (n, s) in [
                ("attn_norm", vec![d]),
                ("attn_q", vec![qd, d]),
                ("attn_k", vec![kvd, d]),
                ("attn_v", vec![kvd, d]),
                ("attn_output", vec![d, qd]),
                ("ffn_norm", vec![d]),
                ("ffn_gate", vec![cfg.ffn, d]),
                ("ffn_up", vec![cfg.ffn, d]),
                ("ffn_down", vec![d, cfg.ffn]),
            ] {
                wanted.push((format!("blk.{i}.{n}.weight"), s));
            }
        }
        let total = wanted.len();
        let mut weights = BTreeMap::new();
        for (i, (name, shape)) in wanted.into_iter().enumerate() {
            let t = file.tensor(&name, &shape, dtype)?;
            weights.insert(name, Arc::new(t));
            progress(i + 1, total);
        }
        let tokens = file.strings("tokenizer.ggml.tokens").unwrap_or_default();
        let name = |k: &str| file.u64(k).ok().and_then(|i| tokens.get(i as usize).map(|t| t.to_string())).unwrap_or_default();
        let chat = chat::ChatTemplate {
            source: file.str("tokenizer.chat_template").ok().map(str::to_string),
            bos_token: name("tokenizer.ggml.bos_token_id"),
            eos_token: name("tokenizer.ggml.eos_token_id"),
        };
        Ok(LlamaModel { cfg, dtype, weights, tokenizer, chat, source: path.to_path_buf() })
    }

    /// The token ids of a one-turn chat: `user_text` rendered with the file's chat template
    /// (with its default system prompt) and the assistant's turn opened.
    ///
    /// # Errors
    /// Template or tokenizer errors.
    pub fn chat_prompt(&self, user_text: &str) -> Result<Vec<u32>, ModelError> {
        let text = self.chat.render(&[Message { role: "user".into(), content: user_text.into() }])?;
        self.tokenizer.encode(&text)
    }

    /// Loads a model from a file or folder: a `.gguf` file, or a Hugging Face folder
    /// (`config.json`, `*.safetensors`, `tokenizer.json`; see [`hf::load`]).
    ///
    /// # Errors
    /// As [`LlamaModel::load`] and [`hf::load`].
    pub fn open(path: &Path, dtype: DType, progress: impl FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
        if path.is_dir() {
            hf::load(path, dtype, progress)
        } else {
            LlamaModel::load(path, dtype, progress)
        }
    }
}

/// How to pick each next token.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOptions {
    /// Tokens to generate at most per sequence (generation also stops at EOS).
    pub max_new: usize,
    /// 0 for greedy (argmax, ties to the lowest id); otherwise logits are divided by it.
    pub temperature: f64,
    /// Nucleus sampling (Holtzman et al. 2020): sample from the smallest set of tokens whose
    /// probability reaches `top_p`; 1.0 keeps all.
    pub top_p: f64,
    /// Seed of the sampler's RNG (ChaCha), so sampled runs repeat.
    pub seed: u64,
    /// Stop a sequence at EOS (true), or always generate `max_new` tokens (benchmarks).
    pub stop_at_eos: bool,
}

impl SampleOptions {
    /// Greedy decoding of up to `max_new` tokens.
    pub fn greedy(max_new: usize) -> SampleOptions {
        SampleOptions { max_new, temperature: 0.0, top_p: 1.0, seed: 0, stop_at_eos: true }
    }
}

/// What [`Engine::generate`] returns.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated tokens of each sequence (EOS included when it was produced).
    pub tokens: Vec<Vec<u32>>,
    /// Prompt tokens processed, over all sequences.
    pub prompt_tokens: usize,
    /// Time spent in prefill.
    pub prefill_time: Duration,
    /// Decode steps run (each produces one token for every sequence of the batch).
    pub decode_steps: usize,
    /// Time spent in decode steps.
    pub decode_time: Duration,
}

/// Where an [`Engine`] runs its two graphs.
enum Programs {
    /// The CPU reference interpreter.
    Cpu { prefill: Program, decode: Program },
    /// The GPU: weights uploaded once, the KV cache kept on the device and updated in place.
    Gpu { prefill: GpuProgram, decode: GpuProgram, device: Device },
}

/// The KV page pools of a generation.
enum Pages {
    Host(Arc<Tensor>, Arc<Tensor>),
    Device(DeviceBuffer, DeviceBuffer),
}

/// Prefill and decode programs of one model, sharing its weights.
pub struct Engine {
    model: LlamaModel,
    programs: Programs,
}

fn argmax(row: &[f64]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in row.iter().enumerate() {
        // NaN never wins; ties keep the lowest id.
        if x > row[best] || row[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best as u32
}

fn sample(row: &[f64], o: &SampleOptions, rng: &mut rand::rngs::StdRng) -> u32 {
    if o.temperature <= 0.0 {
        return argmax(row);
    }
    let max = row.iter().copied().filter(|x| !x.is_nan()).fold(f64::NEG_INFINITY, f64::max);
    let mut probs: Vec<(usize, f64)> = row.iter().enumerate().map(|(i, &x)| (i, if x.is_nan() { 0.0 } else { ((x - max) / o.temperature).exp() })).collect();
    let sum: f64 = probs.iter().map(|p| p.1).sum();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = 0.0;
    let mut cut = probs.len();
    for (i, p) in probs.iter().enumerate() {
        kept += p.1 / sum;
        if kept >= o.top_p {
            cut = i + 1;
            break;
        }
    }
    let total: f64 = probs[..cut].iter().map(|p| p.1).sum();
    let mut r = rng.random::<f64>() * total;
    for p in &probs[..cut] {
        r -= p.1;
        if r <= 0.0 {
            return p.0 as u32;
        }
    }
    probs[0].0 as u32
}

impl Engine {
    /// Builds the prefill and decode graphs for the model's config and dtype, compiles them
    /// for the interpreter, and binds the weights (shared, not copied).
    ///
    /// # Errors
    /// Graph build or verification errors.
    pub fn new(model: LlamaModel) -> Result<Engine, Error> {
        let mut prefill = Program::compile(llama::build(&model.cfg, Mode::Prefill, model.dtype)?, Backend::Interpreter)?;
        let mut decode = Program::compile(llama::build(&model.cfg, Mode::Decode, model.dtype)?, Backend::Interpreter)?;
        for (name, t) in &model.weights {
            prefill.bind(name, t.clone())?;
            decode.bind(name, t.clone())?;
        }
        Ok(Engine { model, programs: Programs::Cpu { prefill, decode } })
    }

    /// Compiles both graphs for the GPU (`lowering` picks fused or one kernel per node; kernels
    /// come from the kernel cache or the code generator) and uploads the weights once.
    ///
    /// # Errors
    /// Lowering, code generation, cache or driver errors.
    pub fn new_gpu(model: LlamaModel, device: &Device, lowering: Lowering) -> Result<Engine, Error> {
        let mut prefill = GpuProgram::compile(&llama::build(&model.cfg, Mode::Prefill, model.dtype)?, device, lowering)?;
        let mut decode = GpuProgram::compile(&llama::build(&model.cfg, Mode::Decode, model.dtype)?, device, lowering)?;
        for (name, t) in &model.weights {
            let buf = device.upload_tensor(t)?;
            prefill.bind_buffer(name, buf.clone());
            decode.bind_buffer(name, buf);
        }
        Ok(Engine { model, programs: Programs::Gpu { prefill, decode, device: device.clone() } })
    }

    /// Kernels of the prefill and decode graphs on the GPU, with what compiling them took;
    /// `None` on the interpreter.
    pub fn gpu_stats(&self) -> Option<(usize, usize, CompileStats, CompileStats)> {
        match &self.programs {
            Programs::Gpu { prefill, decode, .. } => {
                Some((prefill.kernel_graph().kernels.len(), decode.kernel_graph().kernels.len(), prefill.stats().clone(), decode.stats().clone()))
            }
            Programs::Cpu { .. } => None,
        }
    }

    fn new_pages(&self, shape: &[usize]) -> Result<Pages, Error> {
        let dt = self.model.dtype;
        Ok(match &self.programs {
            Programs::Cpu { .. } => Pages::Host(Arc::new(Tensor::zeros(dt, shape)), Arc::new(Tensor::zeros(dt, shape))),
            Programs::Gpu { device, .. } => Pages::Device(device.alloc_zeroed(dt, shape)?, device.alloc_zeroed(dt, shape)?),
        })
    }

    /// One run of the prefill or the decode graph: the logits `[T, vocab]` on the host; the
    /// pages are updated (in place on the GPU).
    fn step(&self, decode: bool, tokens: &Tensor, pos: &Tensor, bt: &Tensor, pages: &mut Pages) -> Result<Tensor, Error> {
        match (&self.programs, pages) {
            (Programs::Cpu { prefill, decode: dec }, Pages::Host(kp, vp)) => {
                let p = if decode { dec } else { prefill };
                let r = p.run(&[("tokens", tokens), ("positions", pos), ("block_tables", bt), ("k_pages", kp), ("v_pages", vp)], &[])?;
                let mut r = r.into_iter();
                let (Some(logits), Some(k), Some(v)) = (r.next(), r.next(), r.next()) else {
                    return Err(Error::Unsupported("the graph returned fewer than 3 outputs".into()));
                };
                *kp = Arc::new(k);
                *vp = Arc::new(v);
                Ok(logits)
            }
            (Programs::Gpu { prefill, decode: dec, device }, Pages::Device(kp, vp)) => {
                let p = if decode { dec } else { prefill };
                let (t, ps, b) = (device.upload_tensor(tokens)?, device.upload_tensor(pos)?, device.upload_tensor(bt)?);
                let r = p.run_device(&[("tokens", &t), ("positions", &ps), ("block_tables", &b), ("k_pages", kp), ("v_pages", vp)], &crate::Bindings::new())?;
                let logits = r.first().ok_or_else(|| Error::Unsupported("the graph returned no logits".into()))?;
                // The pages were updated in place (`kv_append` aliases its page inputs).
                Ok(device.download_tensor(logits)?)
            }
            _ => Err(Error::Unsupported("the pages and the programs live on different devices".into())),
        }
    }

    /// The model.
    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// Generates a continuation of each prompt. Each prompt is prefilled on its own (its keys
    /// and values go to its own pages), then all sequences decode together, one token per
    /// sequence per step, until each has produced EOS or `max_new` tokens. `on_token(seq,
    /// token)` sees every token as it is chosen.
    ///
    /// # Errors
    /// [`ModelError::ContextOverflow`] when a prompt plus `max_new` exceeds the context;
    /// an empty prompt; interpreter errors.
    pub fn generate(&self, prompts: &[Vec<u32>], o: &SampleOptions, on_token: &mut dyn FnMut(usize, u32)) -> Result<Generation, Error> {
        let cfg = &self.model.cfg;
        let b = prompts.len();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.iter().any(Vec::is_empty) {
            return Err(Error::Unsupported("an empty prompt: there is no token to continue from".into()));
        }
        if longest + o.max_new > cfg.context {
            return Err(ModelError::ContextOverflow { tokens: longest, max_new: o.max_new, context: cfg.context }.into());
        }
        let (l, ps) = (cfg.n_layers, cfg.page_size);
        let m = (longest + o.max_new).div_ceil(ps).max(1);
        // Page of (layer, sequence, j): every layer's and sequence's pages are disjoint.
        let page = |layer: usize, seq: usize, j: usize| ((layer * b + seq) * m + j) as f64;
        let pool = [l * b * m, ps, cfg.n_kv_heads, cfg.head_dim];
        let mut pages = self.new_pages(&pool)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut last = vec![0u32; b];
        let vocab = cfg.vocab;
        let t0 = Instant::now();
        for (s, prompt) in prompts.iter().enumerate() {
            let n = prompt.len();
            let tokens = Tensor::new(DType::I64, &[n], prompt.iter().map(|&t| t as f64).collect())?;
            let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
            let bt = Tensor::from_fn(DType::I32, &[l, 1, m], |i| page(i[0], s, i[2]));
            let logits = self.step(false, &tokens, &pos, &bt, &mut pages)?;
            let row = &logits.data()[(n - 1) * vocab..n * vocab];
            let t = sample(row, o, &mut rng);
            last[s] = t;
            if o.max_new > 0 {
                out[s].push(t);
                on_token(s, t);
                done[s] = (o.stop_at_eos && t == self.model.tokenizer.eos) || o.max_new == 1;
            } else {
                done[s] = true;
            }
        }
        let prefill_time = t0.elapsed();
        let t1 = Instant::now();
        let mut steps = 0;
        let bt = Tensor::from_fn(DType::I32, &[l, b, m], |i| page(i[0], i[1], i[2]));
        while done.iter().any(|d| !d) {
            let tokens = Tensor::new(DType::I64, &[b], last.iter().map(|&t| t as f64).collect())?;
            // Position of the new token = tokens already in the cache.
            let pos = Tensor::new(DType::I32, &[b], (0..b).map(|s| (prompts[s].len() + out[s].len() - 1) as f64).collect())?;
            let logits = self.step(true, &tokens, &pos, &bt, &mut pages)?;
            steps += 1;
            for s in 0..b {
                if done[s] {
                    continue;
                }
                let t = sample(&logits.data()[s * vocab..(s + 1) * vocab], o, &mut rng);
                last[s] = t;
                out[s].push(t);
                on_token(s, t);
                done[s] = (o.stop_at_eos && t == self.model.tokenizer.eos) || out[s].len() >= o.max_new;
            }
        }
        Ok(Generation { tokens: out, prompt_tokens: prompts.iter().map(Vec::len).sum(), prefill_time, decode_steps: steps, decode_time: t1.elapsed() })
    }

    /// Teacher-forced logits of `tokens` (one sequence, prefill graph): `[len, vocab]`, f64.
    ///
    /// # Errors
    /// Interpreter errors; a sequence longer than the context.
    pub fn logits(&self, tokens: &[u32]) -> Result<Tensor, Error> {
        let cfg = &self.model.cfg;
        let n = tokens.len();
        if n == 0 || n > cfg.context {
            return Err(ModelError::ContextOverflow { tokens: n, max_new: 0, context: cfg.context }.into());
        }
        let m = n.div_ceil(cfg.page_size);
        let pool = [cfg.n_layers * m, cfg.page_size, cfg.n_kv_heads, cfg.head_dim];
        let mut pages = self.new_pages(&pool)?;
        let toks = Tensor::new(DType::I64, &[n], tokens.iter().map(|&t| t as f64).collect())?;
        let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
        let bt = Tensor::from_fn(DType::I32, &[cfg.n_layers, 1, m], |i| (i[0] * m + i[2]) as f64);
        self.step(false, &toks, &pos, &bt, &mut pages)
    }
}
