//! One generation's use of a decoder's prefill and decode programs and of its paged KV cache:
//! on the interpreter (page pools on the host, made per call) or on the GPU (per batch size,
//! device pools and a captured decode step kept between calls).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::decoder::KvGeometry;
use super::sample::greedy_tokens;
use crate::gpu::GpuProgram;
use crate::{DType, Error, Program, Tensor};
use sinter_runtime::{CapturedGraph, Device, DeviceBuffer};

/// Pages per sequence (and layer) the GPU cache holds at least: 256 tokens with 16-token pages.
pub(crate) const MIN_GPU_PAGES: usize = 16;

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
pub(crate) struct GpuBatch {
    /// Pages per sequence and layer (`M`).
    pub(crate) pages_per_seq: usize,
    /// The key and value page pools `[L·B·M, page_size, kv_heads, head_dim]`, shared by the
    /// eager prefill and the decode step (captured or not), updated in place by `kv_append`.
    pub(crate) k_pages: DeviceBuffer,
    pub(crate) v_pages: DeviceBuffer,
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
pub(crate) fn page_index(layer: usize, seq: usize, j: usize, b: usize, m: usize) -> f64 {
    ((layer * b + seq) * m + j) as f64
}

impl GpuBatch {
    /// The captured step's kernel spans, when it is a persistent launch that records them.
    pub(crate) fn persistent_profile(&self) -> Result<Option<Vec<(String, Option<(f64, f64)>)>>, Error> {
        match &self.graph {
            Some(g) => Ok(g.persistent_profile()?),
            None => Ok(None),
        }
    }

    /// Whether the captured decode step is one persistent launch.
    pub(crate) fn persistent(&self) -> bool {
        self.graph.as_ref().is_some_and(CapturedGraph::is_persistent)
    }

    /// Zeroed pools of `m` pages per sequence and layer for `b` sequences, and the decode
    /// step's input buffers.
    pub(crate) fn new(device: &Device, kv: &KvGeometry, b: usize, m: usize) -> Result<GpuBatch, Error> {
        let (l, dtype) = (kv.layers, kv.dtype);
        let pool = kv.pool_shape(l * b * m);
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
    pub(crate) fn inputs(&self) -> [(&'static str, &DeviceBuffer); 5] {
        [("tokens", &self.tokens), ("positions", &self.positions), ("block_tables", &self.block_tables), ("k_pages", &self.k_pages), ("v_pages", &self.v_pages)]
    }

    /// Checks that a run's page outputs are the pools themselves (`kv_append` updated them in
    /// place), so that the next step and the captured graph see the new rows.
    pub(crate) fn check_in_place(&self, outputs: &[DeviceBuffer]) -> Result<(), Error> {
        match outputs {
            [_, k, v, ..] if k.same_memory(&self.k_pages) && v.same_memory(&self.v_pages) => Ok(()),
            _ => Err(Error::Unsupported("the decode step did not update the KV page pools in place (kv_append outputs are not aliased to its page inputs)".into())),
        }
    }
}
/// One generation's use of the prefill and decode graphs and of its KV cache.
pub(crate) trait Session {
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
pub(crate) enum Step {
    /// Every sequence's logits, `[B · vocab]`.
    Logits(Vec<f64>),
    /// Every sequence's greedy next token, `[B]`.
    Greedy(Vec<u32>),
}

pub(crate) fn tokens_tensor(tokens: &[u32]) -> Result<Tensor, Error> {
    Ok(Tensor::new(DType::I64, &[tokens.len()], tokens.iter().map(|&t| f64::from(t)).collect())?)
}

/// The interpreter's session: page pools on the host, `M` pages per sequence.
pub(crate) struct CpuSession<'a> {
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
    /// A session of `b` sequences with `m` pages each per layer, on zeroed host pools.
    pub(crate) fn new<'a>(prefill: &'a Program, decode: &'a Program, kv: &KvGeometry, b: usize, m: usize, vocab: usize) -> CpuSession<'a> {
        let l = kv.layers;
        let bt = Tensor::from_fn(DType::I32, &[l, b, m], |i| page_index(i[0], i[1], i[2], b, m));
        let pool = kv.pool_shape(l * b * m);
        let (kp, vp) = (Arc::new(Tensor::zeros(kv.dtype, &pool)), Arc::new(Tensor::zeros(kv.dtype, &pool)));
        CpuSession { prefill, decode, kp, vp, bt, layers: l, b, m, vocab }
    }

    /// Runs the prefill or decode graph; returns its logits and greedy tokens (`next`).
    fn run(&mut self, decode: bool, tokens: &Tensor, pos: &Tensor, bt: &Tensor) -> Result<(Tensor, Tensor), Error> {
        let p = if decode { self.decode } else { self.prefill };
        run_paged(p, &mut self.kp, &mut self.vp, tokens, pos, bt)
    }
}

/// Runs a decoder graph on the interpreter over host pools `kp`/`vp` (replaced by the graph's
/// updated pools); returns its logits and greedy tokens (`next`).
pub(crate) fn run_paged(p: &Program, kp: &mut Arc<Tensor>, vp: &mut Arc<Tensor>, tokens: &Tensor, pos: &Tensor, bt: &Tensor) -> Result<(Tensor, Tensor), Error> {
    let r = p.run(&[("tokens", tokens), ("positions", pos), ("block_tables", bt), ("k_pages", &**kp), ("v_pages", &**vp)], &[])?;
    let mut r = r.into_iter();
    let (Some(logits), Some(k), Some(v), Some(next)) = (r.next(), r.next(), r.next(), r.next()) else {
        return Err(Error::Unsupported("the graph returned fewer than 4 outputs".into()));
    };
    *kp = Arc::new(k);
    *vp = Arc::new(v);
    Ok((logits, next))
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
pub(crate) struct GpuSession<'a> {
    pub(crate) prefill: &'a GpuProgram,
    pub(crate) decode: &'a GpuProgram,
    pub(crate) device: &'a Device,
    pub(crate) state: &'a mut GpuBatch,
    pub(crate) layers: usize,
    pub(crate) b: usize,
    pub(crate) vocab: usize,
    pub(crate) cuda_graph: bool,
    /// With `cuda_graph`: the step is one persistent launch instead of a graph of kernels.
    pub(crate) persistent: bool,
    /// With `persistent`: each step records its kernels' spans.
    pub(crate) persistent_profile: bool,
    pub(crate) capture_time: Duration,
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
                let persistent = if self.persistent {
                    let options = sinter_runtime::PersistentOptions { profile: self.persistent_profile, ..Default::default() };
                    match self.decode.capture_persistent_device(&self.state.inputs(), &crate::Bindings::new(), &options) {
                        Ok(g) => Some(g),
                        // A kernel that cannot be a task: the step stays a graph of kernels.
                        Err(Error::Codegen(why)) => {
                            tracing::warn!("the persistent decode kernel cannot be built, the step stays a CUDA graph of kernels: {why}");
                            None
                        }
                        Err(e) => return Err(e),
                    }
                } else {
                    None
                };
                let g = match persistent {
                    Some(g) => g,
                    None => self.decode.capture_device(&self.state.inputs(), &crate::Bindings::new())?,
                };
                self.state.check_in_place(g.outputs())?;
                self.state.graph = Some(g);
                self.capture_time += t0.elapsed();
            }
            let g = self.state.graph.as_ref().ok_or_else(|| Error::Unsupported("no captured decode graph".into()))?;
            if self.persistent_profile {
                // The record then holds this step alone.
                g.persistent_profile()?;
            }
            g.replay()?;
            g.outputs().to_vec()
        } else {
            let r = self.decode.run_device(&self.state.inputs(), &crate::Bindings::new())?;
            self.state.check_in_place(&r)?;
            r
        };
        // Reading the result waits for the step; a persistent step that was abandoned (a task
        // timed out) says so before its outputs are read as tokens.
        let check = |g: &Option<sinter_runtime::CapturedGraph>| g.as_ref().map_or(Ok(()), sinter_runtime::CapturedGraph::check);
        if want_logits {
            let l = outs.first().ok_or_else(|| Error::Unsupported("the decode graph returned no logits".into()))?;
            let logits = dev.download_f64(l)?;
            check(&self.state.graph)?;
            Ok(Step::Logits(logits))
        } else {
            let (Some(l), Some(next)) = (outs.first(), outs.get(3)) else {
                return Err(Error::Unsupported("the decode graph returned no greedy tokens".into()));
            };
            let v = self.vocab;
            let next = dev.download_f64(next)?;
            check(&self.state.graph)?;
            Ok(Step::Greedy(greedy_tokens(&next, v, &mut |s| Ok(dev.download_range_f64(l, s * v, v)?))?))
        }
    }

    fn capture_time(&self) -> Duration {
        self.capture_time
    }
}

