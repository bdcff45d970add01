//! The generation engine: any [`DecoderModel`]'s prefill and decode programs, its paged KV
//! cache, batching, CUDA-graph replay of decode steps, sampling, streaming and profiling.
//! Nothing here knows an architecture: the model gives the graphs and the cache geometry
//! ([`super::decoder`]).

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::batching::{BatchOptions, Batcher};
use super::decoder::{check_graph, DecoderModel};
use super::pool::{CpuPool, DecodeFor, GpuPool, GpuPoolPrograms, PooledSession};
use super::gguf::ModelError;
use super::sample::{SampleOptions, Sampler};
use super::session::{page_index, tokens_tensor, CpuSession, GpuBatch, GpuSession, Session, Step, MIN_GPU_PAGES};
use crate::gpu::{CompileStats, FoldCache, GpuProgram, Lowering, ProfileReport};
use crate::zoo::Mode;
use crate::{Backend, DType, Error, Program, Tensor};
use sinter_runtime::{Device, DeviceBuffer};

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
    /// True when each decode step was one launch of the persistent decode kernel
    /// ([`Engine::set_persistent`]; false where it could not be built and the step stayed a
    /// graph of kernels).
    pub persistent: bool,
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
    /// The results of the load-time kernels, one copy shared by every program.
    folded: FoldCache,
    lowering: Lowering,
    /// The decode graph specialised to each batch size seen
    /// ([`DecoderModel::decode_graph_for_batch`]); `None` where its kernels are not in the
    /// kernel cache of a build without LLVM (the symbolic program serves that batch).
    specialised: Mutex<BTreeMap<usize, Option<Arc<GpuProgram>>>>,
}

/// Whether decode graphs are specialised to their batch: yes, unless `SINTER_NO_SPECIALIZE`
/// is set to something other than empty or `0`.
pub fn specialise_default() -> bool {
    !matches!(std::env::var("SINTER_NO_SPECIALIZE").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

/// Whether CUDA graphs are on by default: yes, unless `SINTER_NO_CUDA_GRAPH` is set to
/// something other than empty or `0`.
pub fn cuda_graph_default() -> bool {
    !matches!(std::env::var("SINTER_NO_CUDA_GRAPH").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

/// Whether a CUDA-graph decode step is one persistent launch by default: when
/// `SINTER_PERSISTENT` is set to something other than empty or `0`.
pub fn persistent_default() -> bool {
    matches!(std::env::var("SINTER_PERSISTENT").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

impl GpuPrograms {
    /// The decode program for a batch of `b`: the specialised one when its kernels can be had
    /// (compiled, or from the cache), else the symbolic one.
    fn decode_for(&self, model: &dyn DecoderModel, b: usize, on: bool) -> Result<Option<Arc<GpuProgram>>, Error> {
        if !on {
            return Ok(None);
        }
        let mut map = self.specialised.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&b) {
            return Ok(p.clone());
        }
        let g = model.decode_graph_for_batch(b)?;
        let names = self.weights.iter().map(|(n, _)| n.clone()).collect();
        let p = match GpuProgram::compile_with_weights(&g, &self.device, self.lowering, &names, &mut |_, _| {}) {
            Ok(mut p) => {
                for (name, buf) in &self.weights {
                    p.bind_buffer(name, buf.clone());
                }
                p.fold_bound_with(Some(&self.folded))?;
                Some(Arc::new(p))
            }
            Err(Error::KernelNotCached { .. }) => None,
            Err(e) => return Err(e),
        };
        map.insert(b, p.clone());
        Ok(p)
    }
}

/// Prefill and decode programs of one decoder (any [`DecoderModel`]), sharing its weights.
///
/// Prompts are prefilled one by one into their own pages, then all sequences decode
/// together, one token each per step ([`Engine::generate`]). On the GPU, decode steps are
/// captured as a CUDA graph (once per batch size, on the first decode step at that size) and
/// replayed: each later step copies only the token ids and positions into the device
/// buffers the graph reads, launches the whole step with one driver call, and reads back the
/// logits — or, for a greedy step without a logits observer, only the graph's greedy tokens
/// (`next`). Prefill runs eagerly on the same page pools. `SINTER_NO_CUDA_GRAPH=1` (or
/// [`Engine::set_cuda_graph`]) launches every kernel of every decode step from the host
/// instead, on the same buffers. Decode steps run the decode graph specialised to the batch
/// size ([`DecoderModel::decode_graph_for_batch`]) where its kernels can be had, unless
/// `SINTER_NO_SPECIALIZE=1` (or [`Engine::set_specialise`]). With
/// [`Engine::set_persistent`] (or `SINTER_PERSISTENT=1`) the captured step is one launch of
/// the persistent decode kernel built from the step's kernels ([`sinter_codegen::persistent`]).
pub struct Engine<M: DecoderModel> {
    model: M,
    programs: Programs,
    cuda_graph: bool,
    specialise: bool,
    persistent: bool,
    /// Persistent steps record each kernel's span ([`Engine::set_persistent_profile`]).
    persistent_profile: bool,
}

/// The model's prefill and decode graphs, checked against the decoder contract.
/// An error for a prompt holding an id past the model's vocabulary (a tokenizer larger than
/// the embedding table): the gather would read past its table.
fn check_token_ids(tokens: &[u32], vocab: usize) -> Result<(), Error> {
    match tokens.iter().enumerate().find(|(_, t)| **t as usize >= vocab) {
        Some((i, t)) => Err(Error::Unsupported(format!("prompt token {i} is id {t}, past the model's vocabulary of {vocab} ids: the tokenizer does not belong to this model"))),
        None => Ok(()),
    }
}

fn graphs(model: &dyn DecoderModel) -> Result<(crate::Graph, crate::Graph), Error> {
    let (p, d) = (model.graph(Mode::Prefill)?, model.graph(Mode::Decode)?);
    let kv = model.kv();
    check_graph(&p, model.weights(), Some(&kv), "prefill")?;
    check_graph(&d, model.weights(), Some(&kv), "decode")?;
    Ok((p, d))
}

impl<M: DecoderModel> Engine<M> {
    /// Builds the model's prefill and decode graphs, checks them against the decoder
    /// contract, compiles them for the interpreter, and binds the weights (shared, not
    /// copied).
    ///
    /// # Errors
    /// Graph build or verification errors; a graph that breaks the contract or a weight the
    /// graphs do not take ([`Error::Unsupported`], [`Error::UnknownInput`]).
    pub fn new(model: M) -> Result<Engine<M>, Error> {
        let (p, d) = graphs(&model)?;
        let mut prefill = Program::compile(p, Backend::Interpreter)?;
        let mut decode = Program::compile(d, Backend::Interpreter)?;
        for (name, t) in model.weights() {
            prefill.bind(name, t.clone())?;
            decode.bind(name, t.clone())?;
        }
        Ok(Engine { model, programs: Programs::Cpu { prefill, decode }, cuda_graph: false, specialise: false, persistent: false, persistent_profile: false })
    }

    /// Compiles both graphs for the GPU (`lowering` picks fused or one kernel per node; kernels
    /// come from the kernel cache or the code generator) and uploads the weights once. Decode
    /// steps replay a CUDA graph unless `SINTER_NO_CUDA_GRAPH` is set ([`cuda_graph_default`]).
    ///
    /// # Errors
    /// As [`Engine::new`]; lowering, code generation, cache or driver errors.
    pub fn new_gpu(model: M, device: &Device, lowering: Lowering) -> Result<Engine<M>, Error> {
        Engine::new_gpu_with_progress(model, device, lowering, &mut |_, _, _| {})
    }

    /// [`Engine::new_gpu`], calling `progress(graph, done, total)` as the kernels of the
    /// `"prefill"` and the `"decode"` graph are found in the cache or compiled (`total` is 0
    /// while the graph is being lowered).
    ///
    /// # Errors
    /// As [`Engine::new_gpu`].
    pub fn new_gpu_with_progress(model: M, device: &Device, lowering: Lowering, progress: &mut dyn FnMut(&str, usize, usize)) -> Result<Engine<M>, Error> {
        let (p, d) = graphs(&model)?;
        // The passes hoist the work on these into load-time kernels, folded below.
        let names = model.weights().keys().cloned().collect();
        let mut prefill = GpuProgram::compile_with_weights(&p, device, lowering, &names, &mut |d, t| progress("prefill", d, t))?;
        let mut decode = GpuProgram::compile_with_weights(&d, device, lowering, &names, &mut |d, t| progress("decode", d, t))?;
        let mut weights = Vec::with_capacity(model.weights().len());
        for (name, t) in model.weights() {
            let buf = device.upload_tensor(t)?;
            prefill.bind_buffer(name, buf.clone());
            decode.bind_buffer(name, buf.clone());
            weights.push((name.clone(), buf));
        }
        // The load-time kernels (weight concatenations of merged projections, transposed or
        // scaled weights, tables of constants) run once here, each result kept once for all
        // programs (the batch-specialised decodes fold from the same cache).
        let folded = FoldCache::new();
        prefill.fold_bound_with(Some(&folded))?;
        decode.fold_bound_with(Some(&folded))?;
        let batches = Mutex::new(BTreeMap::new());
        let programs = Programs::Gpu(Box::new(GpuPrograms { prefill, decode, device: device.clone(), batches, weights, folded, lowering, specialised: Mutex::new(BTreeMap::new()) }));
        Ok(Engine { model, programs, cuda_graph: cuda_graph_default(), specialise: specialise_default(), persistent: persistent_default(), persistent_profile: false })
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
            self.drop_batches();
        }
        self.specialise = on;
    }

    /// Makes each captured decode step one launch of the persistent decode kernel (on) or a
    /// CUDA graph of the step's kernels (off, the default); GPU with CUDA graphs only. Steps
    /// captured the other way are dropped.
    pub fn set_persistent(&mut self, on: bool) {
        if self.persistent != on {
            self.drop_batches();
        }
        self.persistent = on;
    }

    /// With persistent steps: record each kernel's span in every step (the record is cleared
    /// before each step, a device round trip), read by [`Engine::persistent_step_profile`].
    /// Steps captured without it are dropped.
    pub fn set_persistent_profile(&mut self, on: bool) {
        if self.persistent_profile != on {
            self.drop_batches();
        }
        self.persistent_profile = on;
    }

    /// Drops every batch size's device state (pools, captured step): it was made for a
    /// setting being changed.
    fn drop_batches(&self) {
        if let Programs::Gpu(g) = &self.programs {
            g.batches.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// The last decode step at batch `b`, when it was a persistent launch recorded with
    /// [`Engine::set_persistent_profile`]: each kernel (`k12 \`entry\``) with its first
    /// task's claim and its last task's completion, in µs after the step's first claim.
    /// `None` when there is no such step.
    ///
    /// # Errors
    /// Device errors reading the record.
    pub fn persistent_step_profile(&self, b: usize) -> Result<Option<Vec<(String, Option<(f64, f64)>)>>, Error> {
        let Programs::Gpu(g) = &self.programs else { return Ok(None) };
        let guard = g.batches.lock().unwrap_or_else(|e| e.into_inner());
        match guard.get(&b) {
            Some(st) => st.persistent_profile(),
            None => Ok(None),
        }
    }

    /// Whether decode steps are persistent launches ([`Engine::set_persistent`]).
    pub fn persistent(&self) -> bool {
        self.persistent && self.cuda_graph()
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

    /// The decode program specialised to a batch of `b` (GPU, once a step at that batch ran
    /// or was compiled): its kernels a step (load-time kernels folded away) and its kernels
    /// per layer; `None` when the batch runs the symbolic decode graph.
    pub fn decode_kernels_at(&self, b: usize) -> Option<(usize, Option<usize>)> {
        let Programs::Gpu(g) = &self.programs else { return None };
        let map = g.specialised.lock().unwrap_or_else(|e| e.into_inner());
        let p = map.get(&b)?.as_ref()?;
        Some((p.kernel_graph().kernels.len(), p.stats().kernels_per_layer))
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Generates a continuation of each prompt. Each prompt is prefilled on its own (its keys
    /// and values go to its own pages), then all sequences decode together, one token per
    /// sequence per step, until each has produced one of the model's end-of-sequence tokens
    /// or `max_new` tokens. `on_token(seq, token)` sees every token as it is chosen.
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
        let (kv, vocab, context) = (self.model.kv(), self.model.vocab(), self.model.context());
        let b = prompts.len();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.iter().any(Vec::is_empty) {
            return Err(Error::Unsupported("an empty prompt: there is no token to continue from".into()));
        }
        for p in prompts {
            check_token_ids(p, vocab)?;
        }
        if longest.checked_add(o.max_new).is_none_or(|n| n > context) {
            return Err(ModelError::ContextOverflow { tokens: longest, max_new: o.max_new, context }.into());
        }
        o.validate()?;
        if b == 0 {
            return Ok(Generation { tokens: vec![], prompt_tokens: 0, prefill_time: Duration::ZERO, decode_steps: 0, decode_time: Duration::ZERO, cuda_graph: false, capture_time: Duration::ZERO, persistent: false });
        }
        let need = kv.pages_for(longest + o.max_new);
        match &self.programs {
            Programs::Cpu { prefill, decode } => {
                let mut s = CpuSession::new(prefill, decode, &kv, b, need, vocab);
                self.run_session(&mut s, prompts, o, on_token, on_logits)
            }
            Programs::Gpu(g) => {
                let specialised = g.decode_for(&self.model, b, self.specialise)?;
                let GpuPrograms { prefill, decode, device, batches, .. } = &**g;
                let decode = specialised.as_deref().unwrap_or(decode);
                // A poisoned lock: a panic left the state mid-step; the pools are zeroed below
                // and a half-made capture is never stored, so it is still usable.
                let mut guard = batches.lock().unwrap_or_else(|e| e.into_inner());
                if guard.get(&b).is_none_or(|st| st.pages_per_seq < need) {
                    // Free the old state (pools, captured graph) before allocating the new one.
                    guard.remove(&b);
                    let most = kv.pages_for(context).max(need);
                    let m = need.next_power_of_two().max(MIN_GPU_PAGES).min(most);
                    guard.insert(b, GpuBatch::new(device, &kv, b, m)?);
                }
                let state = guard.get_mut(&b).ok_or_else(|| Error::Unsupported("no device state for the batch".into()))?;
                // A fresh cache: the result of a call does not depend on the calls before it.
                device.zero(&state.k_pages)?;
                device.zero(&state.v_pages)?;
                let cuda_graph = self.cuda_graph;
                let mut s = GpuSession { prefill, decode, device, state, layers: kv.layers, b, vocab, cuda_graph, persistent: self.persistent, persistent_profile: self.persistent_profile, capture_time: Duration::ZERO };
                let mut out = self.run_session(&mut s, prompts, o, on_token, on_logits)?;
                out.cuda_graph = cuda_graph && out.decode_steps > 0;
                out.persistent = out.cuda_graph && s.state.persistent();
                Ok(out)
            }
        }
    }

    /// The sampling loop of [`Engine::generate_observed`] over a session.
    fn run_session(&self, s: &mut dyn Session, prompts: &[Vec<u32>], o: &SampleOptions, on_token: &mut dyn FnMut(usize, u32), mut on_logits: Option<&mut dyn FnMut(usize, &[f64])>) -> Result<Generation, Error> {
        let b = prompts.len();
        let vocab = self.model.vocab();
        let eos = self.model.eos_tokens();
        let ends = |t: u32| o.stop_at_eos && eos.contains(&t);
        let mut sampler = Sampler::new(o);
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut last = vec![0u32; b];
        let t0 = Instant::now();
        for (seq, prompt) in prompts.iter().enumerate() {
            let row = s.prefill(seq, prompt)?;
            if let Some(f) = on_logits.as_mut() {
                f(seq, &row);
            }
            let t = sampler.pick(&row)?;
            last[seq] = t;
            if o.max_new > 0 {
                out[seq].push(t);
                on_token(seq, t);
                done[seq] = ends(t) || o.max_new == 1;
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
                        sampler.pick(row)?
                    }
                    Step::Greedy(next) => *next.get(seq).ok_or_else(|| Error::Unsupported("the decode step returned too few tokens".into()))?,
                };
                last[seq] = t;
                out[seq].push(t);
                on_token(seq, t);
                done[seq] = ends(t) || out[seq].len() >= o.max_new;
            }
        }
        let capture_time = s.capture_time();
        let decode_time = t1.elapsed().saturating_sub(capture_time);
        let prompt_tokens = prompts.iter().map(Vec::len).sum();
        Ok(Generation { tokens: out, prompt_tokens, prefill_time, decode_steps: steps, decode_time, cuda_graph: false, capture_time, persistent: false })
    }

    /// A continuous-batching scheduler over a fresh KV page pool of `opts.kv_tokens` tokens
    /// ([`Batcher`]: requests join and leave the running batch between decode steps). On the
    /// GPU, decode steps run at power-of-two batch buckets, each captured as a CUDA graph once
    /// (with CUDA graphs on) and replayed.
    ///
    /// # Errors
    /// Device allocation errors (the pool's pages).
    pub fn batcher(&self, opts: BatchOptions) -> Result<Batcher<'_>, Error> {
        let kv = self.model.kv();
        let groups = Batcher::groups_for(&kv, &opts);
        let vocab = self.model.vocab();
        // Elements of one of the K and V pools (a spare group on the GPU).
        let elements = kv.layers.checked_mul(groups + 1).and_then(|pages| kv.pool_shape(pages).iter().try_fold(1usize, |a, &d| a.checked_mul(d)));
        let Some(elements) = elements else {
            return Err(Error::Unsupported(format!("a KV pool of {} tokens is too large: its element count overflows", opts.kv_tokens)));
        };
        let session: Box<dyn PooledSession + '_> = match &self.programs {
            Programs::Cpu { prefill, decode } => {
                // The interpreter holds K and V as f64s.
                let bytes = elements as u128 * 2 * 8;
                if let Some(free) = crate::llm::pool::available_memory().filter(|&free| bytes > u128::from(free)) {
                    let gib = |b: u128| b as f64 / f64::from(1u32 << 30);
                    return Err(Error::Unsupported(format!(
                        "a KV pool of {} tokens needs {:.1} GiB of host memory (K and V pages of {} layers × {} heads × {} on the interpreter, 8 bytes an element) and {:.1} GiB are available: ask for fewer KV tokens",
                        opts.kv_tokens,
                        gib(bytes),
                        kv.layers,
                        kv.kv_heads,
                        kv.head_dim,
                        gib(u128::from(free))
                    )));
                }
                Box::new(CpuPool::new(prefill, decode, &kv, groups, vocab))
            }
            Programs::Gpu(g) => {
                let (model, spec) = (&self.model, self.specialise);
                let decode_for: DecodeFor<'_> = Box::new(move |b| g.decode_for(model, b, spec));
                let programs = GpuPoolPrograms { prefill: &g.prefill, decode: &g.decode, decode_for };
                Box::new(GpuPool::new(programs, &g.device, &kv, groups, opts.max_batch, vocab, self.cuda_graph)?)
            }
        };
        Ok(Batcher::new(session, &self.model, opts, groups))
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
            Entry::Vacant(e) => e.insert(GpuBatch::new(&g.device, &self.model.kv(), batch, MIN_GPU_PAGES)?),
        };
        let specialised = g.decode_for(&self.model, batch, self.specialise)?;
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
        let (kv, context) = (self.model.kv(), self.model.context());
        let n = tokens.len();
        if n == 0 || n > context {
            return Err(ModelError::ContextOverflow { tokens: n, max_new: 0, context }.into());
        }
        check_token_ids(tokens, self.model.vocab())?;
        let m = kv.pages_for(n);
        let pool = kv.pool_shape(kv.layers * m);
        let toks = tokens_tensor(tokens)?;
        let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
        let bt = Tensor::from_fn(DType::I32, &[kv.layers, 1, m], |i| page_index(i[0], 0, i[2], 1, m));
        let dt = kv.dtype;
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
