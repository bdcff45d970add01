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

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::zoo::llama::{self, LlamaConfig};
use crate::zoo::Mode;
use crate::gpu::{CompileStats, GpuProgram, Lowering, ProfileReport};
use crate::{Backend, DType, Error, Program, Tensor};
use sinter_runtime::{CapturedGraph, Device, DeviceBuffer};
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
    /// Time spent in decode steps, without `capture_time`.
    pub decode_time: Duration,
    /// True when the decode steps were replayed from a CUDA graph (the GPU, with CUDA graphs
    /// on: see [`Engine::set_cuda_graph`]).
    pub cuda_graph: bool,
    /// Time this call spent capturing the decode step as a CUDA graph: zero when it replayed a
    /// graph an earlier call at the same batch size captured, or when no graph is used.
    pub capture_time: Duration,
}

/// Where an [`Engine`] runs its two graphs.
enum Programs {
    /// The CPU reference interpreter.
    Cpu { prefill: Program, decode: Program },
    /// The GPU.
    Gpu(Box<GpuPrograms>),
}

/// The GPU's programs: weights uploaded once, the KV cache kept on the device and updated in
/// place, and the device state of each batch size seen so far.
struct GpuPrograms {
    prefill: GpuProgram,
    /// The decode graph for any batch (`T` symbolic).
    decode: GpuProgram,
    device: Device,
    batches: Mutex<BTreeMap<usize, GpuBatch>>,
    /// The uploaded weights, by name (bound into every program, never copied).
    weights: Vec<(String, DeviceBuffer)>,
    lowering: Lowering,
    /// The decode graph specialised to each batch size seen ([`decode_graph_for_batch`]);
    /// `None` where its kernels are not in the kernel cache of a build without LLVM (the
    /// symbolic program serves that batch).
    specialised: Mutex<BTreeMap<usize, Option<Arc<GpuProgram>>>>,
}

/// The decode graph of `cfg` specialised to a batch of `b` sequences (`T = b`,
/// [`sinter_ir::Graph::specialize`]): with the batch a constant, the code generator takes the
/// small-M GEMV for the projections whose epilogue is element-wise (output, down and LM-head
/// projections) and 16-row tiles for the others, instead of the 64-row tiles a symbolic
/// batch gets.
///
/// # Errors
/// Graph build or verification errors.
pub fn decode_graph_for_batch(cfg: &LlamaConfig, dtype: DType, b: usize) -> Result<crate::Graph, Error> {
    let g = llama::build(cfg, Mode::Decode, dtype)?;
    let s = g.specialize(&[("T".to_string(), b as i64)].into_iter().collect());
    sinter_ir::verify(&s)?;
    Ok(s)
}

/// Whether decode graphs are specialised to their batch: yes, unless `SINTER_NO_SPECIALIZE`
/// is set to something other than empty or `0`.
pub fn specialise_default() -> bool {
    !matches!(std::env::var("SINTER_NO_SPECIALIZE").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

impl GpuPrograms {
    /// The decode program for a batch of `b`: the specialised one when its kernels can be had
    /// (compiled, or from the cache), else the symbolic one.
    fn decode_for(&self, cfg: &LlamaConfig, dtype: DType, b: usize, on: bool) -> Result<Option<Arc<GpuProgram>>, Error> {
        if !on {
            return Ok(None);
        }
        let mut map = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&b) {
            return Ok(p.clone());
        }
        let g = decode_graph_for_batch(cfg, dtype, b)?;
        let p = match GpuProgram::compile(&g, &self.device, self.lowering) {
            Ok(mut p) => {
                for (name, buf) in &self.weights {
                    p.bind_buffer(name, buf.clone());
                }
                p.fold_bound()?;
                Some(Arc::new(p))
            }
            Err(Error::KernelNotCached { .. }) => None,
            Err(e) => return Err(e),
        };
        map.insert(b, p.clone());
        Ok(p)
    }
}

/// Pages per sequence (and layer) the GPU cache holds at least: 256 tokens with 16-token pages.
const MIN_GPU_PAGES: usize = 16;

/// The device state of GPU generation at one batch size `B`, kept between [`Engine::generate`]
/// calls so that the decode step captured as a CUDA graph can be replayed on it.
///
/// A captured graph bakes in every device address and every dimension: `T = B`, `M` (the
/// block tables' width, [`GpuBatch::pages_per_seq`]) and `P` (the pool's pages). None of them
/// changes from step to step: what does — the token ids and positions — lives in the device
/// buffers `tokens` and `positions` that the graph reads, rewritten before each replay; the
/// sequence lengths are computed on the device from `positions` (`positions + 1`), and the
/// paged attention kernel reads them from device memory, so it attends to exactly the cached
/// tokens whatever `M` is. `M` is chosen with room to spare (the pages a call needs, rounded
/// up to a power of two, at least [`MIN_GPU_PAGES`], at most the context's); a later call that
/// needs more pages replaces the state and captures again.
struct GpuBatch {
    /// Pages per sequence and layer (`M`).
    pages_per_seq: usize,
    /// The key and value page pools `[L·B·M, page_size, kv_heads, head_dim]`, shared by the
    /// eager prefill and the decode step (captured or not), updated in place by `kv_append`.
    k_pages: DeviceBuffer,
    v_pages: DeviceBuffer,
    /// The decode step's inputs: `tokens: i64[B]`, `positions: i32[B]`, `block_tables:
    /// i32[L, B, M]` (fixed: page `(l·B + b)·M + j` is sequence `b`'s page `j` in layer `l`).
    tokens: DeviceBuffer,
    positions: DeviceBuffer,
    block_tables: DeviceBuffer,
    /// The decode step captured on these buffers (on the first decode step with CUDA graphs on).
    graph: Option<CapturedGraph>,
}

/// Page of layer `layer`, sequence `seq`, slot `j`, with `b` sequences of `m` pages each:
/// every layer's and sequence's pages are disjoint.
fn page_index(layer: usize, seq: usize, j: usize, b: usize, m: usize) -> f64 {
    ((layer * b + seq) * m + j) as f64
}

impl GpuBatch {
    fn new(device: &Device, cfg: &LlamaConfig, dtype: DType, b: usize, m: usize) -> Result<GpuBatch, Error> {
        let l = cfg.n_layers;
        let pool = [l * b * m, cfg.page_size, cfg.n_kv_heads, cfg.head_dim];
        let bt = Tensor::from_fn(DType::I32, &[l, b, m], |i| page_index(i[0], i[1], i[2], b, m));
        Ok(GpuBatch {
            pages_per_seq: m,
            k_pages: device.alloc_zeroed(dtype, &pool)?,
            v_pages: device.alloc_zeroed(dtype, &pool)?,
            tokens: device.alloc_zeroed(DType::I64, &[b])?,
            positions: device.alloc_zeroed(DType::I32, &[b])?,
            block_tables: device.upload_tensor(&bt)?,
            graph: None,
        })
    }

    /// The decode graph's inputs, by name.
    fn inputs(&self) -> [(&'static str, &DeviceBuffer); 5] {
        [("tokens", &self.tokens), ("positions", &self.positions), ("block_tables", &self.block_tables), ("k_pages", &self.k_pages), ("v_pages", &self.v_pages)]
    }

    /// Checks that a run's page outputs are the pools themselves (`kv_append` updated them in
    /// place), so that the next step and the captured graph see the new rows.
    fn check_in_place(&self, outputs: &[DeviceBuffer]) -> Result<(), Error> {
        match outputs {
            [_, k, v, ..] if k.same_memory(&self.k_pages) && v.same_memory(&self.v_pages) => Ok(()),
            _ => Err(Error::Unsupported("the decode step did not update the KV page pools in place (kv_append outputs are not aliased to its page inputs)".into())),
        }
    }
}

/// Whether CUDA graphs are on by default: yes, unless `SINTER_NO_CUDA_GRAPH` is set to
/// something other than empty or `0`.
pub fn cuda_graph_default() -> bool {
    !matches!(std::env::var("SINTER_NO_CUDA_GRAPH").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

/// Prefill and decode programs of one model, sharing its weights.
///
/// On the GPU, decode steps are captured as a CUDA graph (once per batch size, on the first
/// decode step at that size) and replayed: each later step copies only the token ids and
/// positions into the device buffers the graph reads, launches the whole step with one driver
/// call, and reads back the logits — or, for a greedy step without a logits observer, only
/// the graph's greedy tokens (`next`). Prefill runs eagerly on the same page pools.
/// `SINTER_NO_CUDA_GRAPH=1` (or [`Engine::set_cuda_graph`]) launches every kernel of every
/// decode step from the host instead, on the same buffers. Decode steps run the decode graph
/// specialised to the batch size ([`decode_graph_for_batch`]) where its kernels can be had,
/// unless `SINTER_NO_SPECIALIZE=1` (or [`Engine::set_specialise`]).
pub struct Engine {
    model: LlamaModel,
    programs: Programs,
    cuda_graph: bool,
    specialise: bool,
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

/// One generation's use of the prefill and decode graphs and of its KV cache.
trait Session {
    /// Prefills sequence `seq` with `prompt` (its keys and values go to its pages); returns
    /// the logits of the prompt's last token.
    fn prefill(&mut self, seq: usize, prompt: &[u32]) -> Result<Vec<f64>, Error>;
    /// One decode step: `tokens[s]` at position `positions[s]` for every sequence `s`; returns
    /// the logits `[B · vocab]` when `logits`, else only the graph's greedy tokens `[B]` (its
    /// `next` output: the host reads `B` integers rather than `B · vocab` logits).
    fn decode(&mut self, tokens: &[u32], positions: &[usize], logits: bool) -> Result<Step, Error>;
    /// Time spent capturing CUDA graphs so far.
    fn capture_time(&self) -> Duration {
        Duration::ZERO
    }
}

/// What a decode step returns ([`Session::decode`]).
enum Step {
    /// Every sequence's logits, `[B · vocab]`.
    Logits(Vec<f64>),
    /// Every sequence's greedy next token, `[B]`.
    Greedy(Vec<u32>),
}

/// Token ids from a graph's `next` output (i32 values as f64s): `next[s]` is sequence `s`'s
/// greedy token, or `vocab` for a row holding a NaN, whose token is then `argmax(row(s))` (the
/// row's logits, read only then).
fn greedy_tokens(next: &[f64], vocab: usize, row: &mut dyn FnMut(usize) -> Result<Vec<f64>, Error>) -> Result<Vec<u32>, Error> {
    next.iter()
        .enumerate()
        .map(|(s, &t)| {
            if t == vocab as f64 {
                Ok(argmax(&row(s)?))
            } else if t >= 0.0 && t < vocab as f64 && t.fract() == 0.0 {
                Ok(t as u32)
            } else {
                Err(Error::Unsupported(format!("the decode graph's greedy token {t} is not an id of the {vocab}-token vocabulary")))
            }
        })
        .collect()
}

fn tokens_tensor(tokens: &[u32]) -> Result<Tensor, Error> {
    Ok(Tensor::new(DType::I64, &[tokens.len()], tokens.iter().map(|&t| f64::from(t)).collect())?)
}

/// The interpreter's session: page pools on the host, `M` pages per sequence.
struct CpuSession<'a> {
    prefill: &'a Program,
    decode: &'a Program,
    kp: Arc<Tensor>,
    vp: Arc<Tensor>,
    /// The decode block tables `[L, B, M]`.
    bt: Tensor,
    layers: usize,
    b: usize,
    m: usize,
    vocab: usize,
}

impl CpuSession<'_> {
    /// Runs the prefill or decode graph; returns its logits and greedy tokens (`next`).
    fn run(&mut self, decode: bool, tokens: &Tensor, pos: &Tensor, bt: &Tensor) -> Result<(Tensor, Tensor), Error> {
        let p = if decode { self.decode } else { self.prefill };
        let r = p.run(&[("tokens", tokens), ("positions", pos), ("block_tables", bt), ("k_pages", &self.kp), ("v_pages", &self.vp)], &[])?;
        let mut r = r.into_iter();
        let (Some(logits), Some(k), Some(v), Some(next)) = (r.next(), r.next(), r.next(), r.next()) else {
            return Err(Error::Unsupported("the graph returned fewer than 4 outputs".into()));
        };
        self.kp = Arc::new(k);
        self.vp = Arc::new(v);
        Ok((logits, next))
    }
}

impl Session for CpuSession<'_> {
    fn prefill(&mut self, seq: usize, prompt: &[u32]) -> Result<Vec<f64>, Error> {
        let (n, b, m, vocab) = (prompt.len(), self.b, self.m, self.vocab);
        let tokens = tokens_tensor(prompt)?;
        let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
        let bt = Tensor::from_fn(DType::I32, &[self.layers, 1, m], |i| page_index(i[0], seq, i[2], b, m));
        let (logits, _) = self.run(false, &tokens, &pos, &bt)?;
        Ok(logits.data()[(n - 1) * vocab..n * vocab].to_vec())
    }

    fn decode(&mut self, tokens: &[u32], positions: &[usize], logits: bool) -> Result<Step, Error> {
        let tokens = tokens_tensor(tokens)?;
        let pos = Tensor::new(DType::I32, &[positions.len()], positions.iter().map(|&p| p as f64).collect())?;
        let bt = std::mem::replace(&mut self.bt, Tensor::zeros(DType::I32, &[0]));
        let r = self.run(true, &tokens, &pos, &bt);
        self.bt = bt;
        let (l, next) = r?;
        let v = self.vocab;
        Ok(if logits { Step::Logits(l.data().to_vec()) } else { Step::Greedy(greedy_tokens(next.data(), v, &mut |s| Ok(l.data()[s * v..(s + 1) * v].to_vec()))?) })
    }
}

/// The GPU's session: the batch size's persistent [`GpuBatch`].
struct GpuSession<'a> {
    prefill: &'a GpuProgram,
    decode: &'a GpuProgram,
    device: &'a Device,
    state: &'a mut GpuBatch,
    layers: usize,
    b: usize,
    vocab: usize,
    cuda_graph: bool,
    capture_time: Duration,
}

impl Session for GpuSession<'_> {
    fn prefill(&mut self, seq: usize, prompt: &[u32]) -> Result<Vec<f64>, Error> {
        let (n, b, m, vocab, dev) = (prompt.len(), self.b, self.state.pages_per_seq, self.vocab, self.device);
        let tokens = dev.upload_tensor(&tokens_tensor(prompt)?)?;
        let pos = dev.upload_tensor(&Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64))?;
        let bt = dev.upload_tensor(&Tensor::from_fn(DType::I32, &[self.layers, 1, m], |i| page_index(i[0], seq, i[2], b, m)))?;
        let st = &*self.state;
        let r = self.prefill.run_device(
            &[("tokens", &tokens), ("positions", &pos), ("block_tables", &bt), ("k_pages", &st.k_pages), ("v_pages", &st.v_pages)],
            &crate::Bindings::new(),
        )?;
        st.check_in_place(&r)?;
        // Only the last row: a long prompt's logits are `n × vocab`.
        Ok(dev.download_range_f64(&r[0], (n - 1) * vocab, vocab)?)
    }

    fn decode(&mut self, tokens: &[u32], positions: &[usize], want_logits: bool) -> Result<Step, Error> {
        let dev = self.device;
        dev.write_f64(&self.state.tokens, &tokens.iter().map(|&t| f64::from(t)).collect::<Vec<_>>())?;
        dev.write_f64(&self.state.positions, &positions.iter().map(|&p| p as f64).collect::<Vec<_>>())?;
        let outs = if self.cuda_graph {
            if self.state.graph.is_none() {
                let t0 = Instant::now();
                let g = self.decode.capture_device(&self.state.inputs(), &crate::Bindings::new())?;
                self.state.check_in_place(g.outputs())?;
                self.state.graph = Some(g);
                self.capture_time += t0.elapsed();
            }
            let g = self.state.graph.as_ref().ok_or_else(|| Error::Unsupported("no captured decode graph".into()))?;
            g.replay()?;
            g.outputs().to_vec()
        } else {
            let r = self.decode.run_device(&self.state.inputs(), &crate::Bindings::new())?;
            self.state.check_in_place(&r)?;
            r
        };
        // Reading the result waits for the step.
        if want_logits {
            let l = outs.first().ok_or_else(|| Error::Unsupported("the decode graph returned no logits".into()))?;
            Ok(Step::Logits(dev.download_f64(l)?))
        } else {
            let (Some(l), Some(next)) = (outs.first(), outs.get(3)) else {
                return Err(Error::Unsupported("the decode graph returned no greedy tokens".into()));
            };
            let v = self.vocab;
            Ok(Step::Greedy(greedy_tokens(&dev.download_f64(next)?, v, &mut |s| Ok(dev.download_range_f64(l, s * v, v)?))?))
        }
    }

    fn capture_time(&self) -> Duration {
        self.capture_time
    }
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
        Ok(Engine { model, programs: Programs::Cpu { prefill, decode }, cuda_graph: false, specialise: false })
    }

    /// Compiles both graphs for the GPU (`lowering` picks fused or one kernel per node; kernels
    /// come from the kernel cache or the code generator) and uploads the weights once. Decode
    /// steps replay a CUDA graph unless `SINTER_NO_CUDA_GRAPH` is set ([`cuda_graph_default`]).
    ///
    /// # Errors
    /// Lowering, code generation, cache or driver errors.
    pub fn new_gpu(model: LlamaModel, device: &Device, lowering: Lowering) -> Result<Engine, Error> {
        Engine::new_gpu_with_progress(model, device, lowering, &mut |_, _, _| {})
    }

    /// [`Engine::new_gpu`], calling `progress(graph, done, total)` as the kernels of the
    /// `"prefill"` and the `"decode"` graph are found in the cache or compiled (`total` is 0
    /// while the graph is being lowered).
    ///
    /// # Errors
    /// As [`Engine::new_gpu`].
    pub fn new_gpu_with_progress(model: LlamaModel, device: &Device, lowering: Lowering, progress: &mut dyn FnMut(&str, usize, usize)) -> Result<Engine, Error> {
        let prefill = GpuProgram::compile_with_progress(&llama::build(&model.cfg, Mode::Prefill, model.dtype)?, device, lowering, &mut |d, t| progress("prefill", d, t))?;
        let decode = GpuProgram::compile_with_progress(&llama::build(&model.cfg, Mode::Decode, model.dtype)?, device, lowering, &mut |d, t| progress("decode", d, t))?;
        let (mut prefill, mut decode) = (prefill, decode);
        let mut weights = Vec::with_capacity(model.weights.len());
        for (name, t) in &model.weights {
            let buf = device.upload_tensor(t)?;
            prefill.bind_buffer(name, buf.clone());
            decode.bind_buffer(name, buf.clone());
            weights.push((name.clone(), buf));
        }
        // The load-time kernels (the merged projections' weight concatenations) run once here.
        prefill.fold_bound()?;
        decode.fold_bound()?;
        let batches = Mutex::new(BTreeMap::new());
        let programs = Programs::Gpu(Box::new(GpuPrograms { prefill, decode, device: device.clone(), batches, weights, lowering, specialised: Mutex::new(BTreeMap::new()) }));
        Ok(Engine { model, programs, cuda_graph: cuda_graph_default(), specialise: specialise_default() })
    }

    /// Turns CUDA-graph replay of decode steps on or off (GPU only; the interpreter ignores it).
    pub fn set_cuda_graph(&mut self, on: bool) {
        self.cuda_graph = on;
    }

    /// Turns the batch-specialised decode graphs on or off (GPU only): off, every batch runs
    /// the symbolic decode graph. Device state already made for a batch (pools, a captured
    /// graph) is dropped, as it belongs to the other program.
    pub fn set_specialise(&mut self, on: bool) {
        if self.specialise != on {
            if let Programs::Gpu(g) = &self.programs {
                g.batches.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
        }
        self.specialise = on;
    }

    /// Whether decode steps replay a CUDA graph: on the GPU with CUDA graphs on.
    pub fn cuda_graph(&self) -> bool {
        self.cuda_graph && self.is_gpu()
    }

    /// True when the engine runs on the GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self.programs, Programs::Gpu(_))
    }

    /// Kernels of the prefill and decode graphs on the GPU, with what compiling them took;
    /// `None` on the interpreter.
    pub fn gpu_stats(&self) -> Option<(usize, usize, CompileStats, CompileStats)> {
        match &self.programs {
            Programs::Gpu(g) => Some((g.prefill.kernel_graph().kernels.len(), g.decode.kernel_graph().kernels.len(), g.prefill.stats().clone(), g.decode.stats().clone())),
            Programs::Cpu { .. } => None,
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
    /// On the GPU, calls wait for each other (they share the device state of their batch
    /// size), so the callbacks must not call `generate` on the same engine.
    ///
    /// # Errors
    /// [`ModelError::ContextOverflow`] when a prompt plus `max_new` exceeds the context;
    /// an empty prompt; a temperature that is not a finite number ≥ 0 or a `top_p` outside
    /// (0, 1] ([`Error::Unsupported`]); interpreter or device errors.
    pub fn generate(&self, prompts: &[Vec<u32>], o: &SampleOptions, on_token: &mut dyn FnMut(usize, u32)) -> Result<Generation, Error> {
        self.generate_inner(prompts, o, on_token, None)
    }

    /// [`Engine::generate`], also showing `on_logits(seq, logits)` the logits (`vocab` values)
    /// each token of sequence `seq` was chosen from, just before `on_token` sees the token.
    ///
    /// # Errors
    /// As [`Engine::generate`].
    pub fn generate_observed(&self, prompts: &[Vec<u32>], o: &SampleOptions, on_token: &mut dyn FnMut(usize, u32), on_logits: &mut dyn FnMut(usize, &[f64])) -> Result<Generation, Error> {
        self.generate_inner(prompts, o, on_token, Some(on_logits))
    }

    /// [`Engine::generate_observed`], or [`Engine::generate`] without an observer: then a
    /// greedy decode step reads back only the graph's greedy tokens, not the logits.
    fn generate_inner(&self, prompts: &[Vec<u32>], o: &SampleOptions, on_token: &mut dyn FnMut(usize, u32), on_logits: Option<&mut dyn FnMut(usize, &[f64])>) -> Result<Generation, Error> {
        let cfg = &self.model.cfg;
        let b = prompts.len();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.iter().any(Vec::is_empty) {
            return Err(Error::Unsupported("an empty prompt: there is no token to continue from".into()));
        }
        if longest.checked_add(o.max_new).is_none_or(|n| n > cfg.context) {
            return Err(ModelError::ContextOverflow { tokens: longest, max_new: o.max_new, context: cfg.context }.into());
        }
        if !(o.temperature.is_finite() && o.temperature >= 0.0) {
            return Err(Error::Unsupported(format!("the sampling temperature must be a finite number ≥ 0 (0 = greedy), got {}", o.temperature)));
        }
        if !(o.top_p > 0.0 && o.top_p <= 1.0) {
            return Err(Error::Unsupported(format!("top_p must be in (0, 1], got {}", o.top_p)));
        }
        if b == 0 {
            return Ok(Generation { tokens: vec![], prompt_tokens: 0, prefill_time: Duration::ZERO, decode_steps: 0, decode_time: Duration::ZERO, cuda_graph: false, capture_time: Duration::ZERO });
        }
        let (l, ps) = (cfg.n_layers, cfg.page_size);
        let need = (longest + o.max_new).div_ceil(ps).max(1);
        match &self.programs {
            Programs::Cpu { prefill, decode } => {
                let pool = [l * b * need, ps, cfg.n_kv_heads, cfg.head_dim];
                let dt = self.model.dtype;
                let bt = Tensor::from_fn(DType::I32, &[l, b, need], |i| page_index(i[0], i[1], i[2], b, need));
                let (kp, vp) = (Arc::new(Tensor::zeros(dt, &pool)), Arc::new(Tensor::zeros(dt, &pool)));
                let mut s = CpuSession { prefill, decode, kp, vp, bt, layers: l, b, m: need, vocab: cfg.vocab };
                self.run_session(&mut s, prompts, o, on_token, on_logits)
            }
            Programs::Gpu(g) => {
                let specialised = g.decode_for(cfg, self.model.dtype, b, self.specialise)?;
                let GpuPrograms { prefill, decode, device, batches, .. } = &**g;
                let decode = specialised.as_deref().unwrap_or(decode);
                // A poisoned lock: a panic left the state mid-step; the pools are zeroed below
                // and a half-made capture is never stored, so it is still usable.
                let mut guard = batches.lock().unwrap_or_else(|e| e.into_inner());
                if guard.get(&b).is_none_or(|st| st.pages_per_seq < need) {
                    // Free the old state (pools, captured graph) before allocating the new one.
                    guard.remove(&b);
                    let most = cfg.context.div_ceil(ps).max(need);
                    let m = need.next_power_of_two().max(MIN_GPU_PAGES).min(most);
                    guard.insert(b, GpuBatch::new(device, cfg, self.model.dtype, b, m)?);
                }
                let state = guard.get_mut(&b).ok_or_else(|| Error::Unsupported("no device state for the batch".into()))?;
                // A fresh cache: the result of a call does not depend on the calls before it.
                device.zero(&state.k_pages)?;
                device.zero(&state.v_pages)?;
                let cuda_graph = self.cuda_graph;
                let mut s = GpuSession { prefill, decode, device, state, layers: l, b, vocab: cfg.vocab, cuda_graph, capture_time: Duration::ZERO };
                let mut out = self.run_session(&mut s, prompts, o, on_token, on_logits)?;
                out.cuda_graph = cuda_graph && out.decode_steps > 0;
                Ok(out)
            }
        }
    }

    /// The sampling loop of [`Engine::generate_observed`] over a session.
    fn run_session(&self, s: &mut dyn Session, prompts: &[Vec<u32>], o: &SampleOptions, on_token: &mut dyn FnMut(usize, u32), mut on_logits: Option<&mut dyn FnMut(usize, &[f64])>) -> Result<Generation, Error> {
        let b = prompts.len();
        let vocab = self.model.cfg.vocab;
        let eos = self.model.tokenizer.eos;
        let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut last = vec![0u32; b];
        let t0 = Instant::now();
        for (seq, prompt) in prompts.iter().enumerate() {
            let row = s.prefill(seq, prompt)?;
            if let Some(f) = on_logits.as_mut() {
                f(seq, &row);
            }
            let t = sample(&row, o, &mut rng);
            last[seq] = t;
            if o.max_new > 0 {
                out[seq].push(t);
                on_token(seq, t);
                done[seq] = (o.stop_at_eos && t == eos) || o.max_new == 1;
            } else {
                done[seq] = true;
            }
        }
        let prefill_time = t0.elapsed();
        let t1 = Instant::now();
        let mut steps = 0;
        // Logits only where something needs them: sampling, or an observer.
        let want_logits = o.temperature > 0.0 || on_logits.is_some();
        while done.iter().any(|d| !d) {
            // Position of the new token = tokens already in the cache.
            let positions: Vec<usize> = (0..b).map(|seq| prompts[seq].len() + out[seq].len() - 1).collect();
            let step = s.decode(&last, &positions, want_logits)?;
            steps += 1;
            for seq in 0..b {
                if done[seq] {
                    continue;
                }
                let t = match &step {
                    Step::Logits(logits) => {
                        let row = logits.get(seq * vocab..(seq + 1) * vocab).ok_or_else(|| Error::Unsupported("the decode step returned too few logits".into()))?;
                        if let Some(f) = on_logits.as_mut() {
                            f(seq, row);
                        }
                        sample(row, o, &mut rng)
                    }
                    Step::Greedy(next) => *next.get(seq).ok_or_else(|| Error::Unsupported("the decode step returned too few tokens".into()))?,
                };
                last[seq] = t;
                out[seq].push(t);
                on_token(seq, t);
                done[seq] = (o.stop_at_eos && t == eos) || out[seq].len() >= o.max_new;
            }
        }
        let capture_time = s.capture_time();
        let decode_time = t1.elapsed().saturating_sub(capture_time);
        let prompt_tokens = prompts.iter().map(Vec::len).sum();
        Ok(Generation { tokens: out, prompt_tokens, prefill_time, decode_steps: steps, decode_time, cuda_graph: false, capture_time })
    }

    /// Times each kernel of one decode step at batch size `batch` (eagerly, with CUDA events),
    /// on the device state the last [`Engine::generate`] at that batch size left: its last
    /// step runs again (rewriting the same cache rows with the same values). Without such a
    /// call, one step of token 0 at position 0 on empty pages.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on the interpreter (it runs no kernels) or for a batch of 0;
    /// device errors.
    pub fn profile_decode(&self, batch: usize) -> Result<ProfileReport, Error> {
        let Programs::Gpu(g) = &self.programs else {
            return Err(Error::Unsupported("per-kernel profiles need the GPU: the CPU reference interpreter runs no kernels".into()));
        };
        if batch == 0 {
            return Err(Error::Unsupported("a decode step of 0 sequences".into()));
        }
        let mut guard = g.batches.lock().unwrap_or_else(|e| e.into_inner());
        let state = match guard.entry(batch) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(GpuBatch::new(&g.device, &self.model.cfg, self.model.dtype, batch, MIN_GPU_PAGES)?),
        };
        let specialised = g.decode_for(&self.model.cfg, self.model.dtype, batch, self.specialise)?;
        let decode = specialised.as_deref().unwrap_or(&g.decode);
        let (outs, profile) = decode.run_device_profiled(&state.inputs(), &crate::Bindings::new())?;
        state.check_in_place(&outs)?;
        Ok(ProfileReport::new(decode.kernel_graph(), &profile))
    }

    /// Teacher-forced logits of `tokens` (one sequence, prefill graph): `[len, vocab]`, f64.
    ///
    /// # Errors
    /// Interpreter or device errors; a sequence longer than the context.
    pub fn logits(&self, tokens: &[u32]) -> Result<Tensor, Error> {
        let cfg = &self.model.cfg;
        let n = tokens.len();
        if n == 0 || n > cfg.context {
            return Err(ModelError::ContextOverflow { tokens: n, max_new: 0, context: cfg.context }.into());
        }
        let m = n.div_ceil(cfg.page_size);
        let pool = [cfg.n_layers * m, cfg.page_size, cfg.n_kv_heads, cfg.head_dim];
        let toks = tokens_tensor(tokens)?;
        let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
        let bt = Tensor::from_fn(DType::I32, &[cfg.n_layers, 1, m], |i| page_index(i[0], 0, i[2], 1, m));
        let dt = self.model.dtype;
        match &self.programs {
            Programs::Cpu { prefill, .. } => {
                let (kp, vp) = (Tensor::zeros(dt, &pool), Tensor::zeros(dt, &pool));
                let r = prefill.run(&[("tokens", &toks), ("positions", &pos), ("block_tables", &bt), ("k_pages", &kp), ("v_pages", &vp)], &[])?;
                r.into_iter().next().ok_or_else(|| Error::Unsupported("the graph returned no logits".into()))
            }
            Programs::Gpu(g) => {
                let (prefill, device) = (&g.prefill, &g.device);
                let (t, p, b) = (device.upload_tensor(&toks)?, device.upload_tensor(&pos)?, device.upload_tensor(&bt)?);
                let (kp, vp) = (device.alloc_zeroed(dt, &pool)?, device.alloc_zeroed(dt, &pool)?);
                let r = prefill.run_device(&[("tokens", &t), ("positions", &p), ("block_tables", &b), ("k_pages", &kp), ("v_pages", &vp)], &crate::Bindings::new())?;
                let logits = r.first().ok_or_else(|| Error::Unsupported("the graph returned no logits".into()))?;
                Ok(device.download_tensor(logits)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_tokens_take_the_graph_ids_and_fall_back_to_the_host_argmax_for_nan_rows() {
        let mut asked = Vec::new();
        let mut row = |s: usize| -> Result<Vec<f64>, Error> {
            asked.push(s);
            Ok(vec![1.0, f64::NAN, 3.0, 3.0])
        };
        // Sequence 1's row holds a NaN: the graph says 4 (no id); the host argmax skips the NaN
        // and keeps the lowest id of the largest value.
        assert_eq!(greedy_tokens(&[2.0, 4.0, 0.0], 4, &mut row).unwrap(), vec![2, 2, 0]);
        assert_eq!(asked, vec![1], "only the NaN row's logits are read");
        for bad in [-1.0, 5.0, 1.5, f64::NAN] {
            let e = greedy_tokens(&[bad], 4, &mut |_| Ok(vec![0.0; 4])).unwrap_err();
            assert!(e.to_string().contains("is not an id of the 4-token vocabulary"), "{e}");
        }
    }
}
