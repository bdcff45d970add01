//! One KV page pool shared by sequences that come and go: the sessions under continuous
//! batching ([`super::batching`]).
//!
//! The pool is cut into *page groups*: group `g` is page `l·N + g` of every layer `l` (`N`
//! groups), so one group holds `page_size` tokens of one sequence in all layers. A sequence
//! owns a list of groups, handed out and taken back by the scheduler; its block-table row in
//! layer `l` is `l·N + groups[j]`. Rows of a decode step are the running sequences in any
//! order, each with its own token, position and groups; rows past a sequence's groups repeat
//! its last group (attention reads only `positions[b] + 1` tokens, so they are never read).
//!
//! On the interpreter the pools are host tensors and every step runs the symbolic decode graph
//! at the batch's exact size. On the GPU the batch is padded to a bucket (the next power of
//! two, at most the scheduler's largest batch) so that the decode step captured as a CUDA graph
//! at that bucket is replayed for every batch that rounds to it; padding rows decode token 0
//! at position 0 into a scratch group `N` that no sequence owns, and their logits are dropped.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::decoder::KvGeometry;
use super::sample::greedy_tokens;
use super::session::{run_paged, tokens_tensor, Step};
use crate::gpu::GpuProgram;
use crate::{DType, Error, Program, Tensor};
use sinter_runtime::{CapturedGraph, Device, DeviceBuffer};

/// One row of a decode step: the sequence's last token, its position (tokens already cached)
/// and its page groups.
pub(crate) struct Row<'a> {
    pub(crate) token: u32,
    pub(crate) position: usize,
    pub(crate) groups: &'a [usize],
}

/// A pool of page groups and the programs that read and write it.
pub(crate) trait PooledSession {
    /// Prefills a fresh sequence owning `groups` with `prompt` (positions `0..n`); returns the
    /// logits of the prompt's last token.
    fn prefill(&mut self, groups: &[usize], prompt: &[u32]) -> Result<Vec<f64>, Error>;
    /// One decode step of `rows`; returns `rows.len()` rows of logits (`logits`) or greedy
    /// tokens.
    fn decode(&mut self, rows: &[Row<'_>], logits: bool) -> Result<Step, Error>;
    /// Makes ready every decode bucket a batch of at most `max_batch` rows of at most
    /// `max_groups` page groups each can round to (the GPU: compiles the batch-specialised
    /// programs and captures their CUDA graphs), so no later step stalls on that work.
    fn warm(&mut self, _max_groups: usize) -> Result<(), Error> {
        Ok(())
    }
}

/// Page of layer `layer` in group `group` of a pool of `n` groups (as f64 for a tensor).
fn page(layer: usize, group: usize, n: usize) -> f64 {
    (layer * n + group) as f64
}

/// Block tables `[L, B, M]` for `rows` (`M` at least `m`); `pad` rows after them use group `pad_group`.
fn block_tables(layers: usize, n: usize, rows: &[Row<'_>], b: usize, m: usize, pad_group: usize) -> Tensor {
    Tensor::from_fn(DType::I32, &[layers, b, m], |i| match rows.get(i[1]) {
        Some(r) => page(i[0], r.groups.get(i[2]).or(r.groups.last()).copied().unwrap_or(pad_group), n),
        None => page(i[0], pad_group, n),
    })
}

/// The interpreter's pooled session: host page pools of `groups` groups.
pub(crate) struct CpuPool<'a> {
    prefill: &'a Program,
    decode: &'a Program,
    kp: Arc<Tensor>,
    vp: Arc<Tensor>,
    layers: usize,
    groups: usize,
    vocab: usize,
}

/// The host memory available to new allocations, in bytes (`MemAvailable` of
/// `/proc/meminfo`), where the system says.
pub(crate) fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl<'a> CpuPool<'a> {
    /// Zeroed host pools of `groups` page groups.
    pub(crate) fn new(prefill: &'a Program, decode: &'a Program, kv: &KvGeometry, groups: usize, vocab: usize) -> CpuPool<'a> {
        let pool = kv.pool_shape(kv.layers * groups);
        let (kp, vp) = (Arc::new(Tensor::zeros(kv.dtype, &pool)), Arc::new(Tensor::zeros(kv.dtype, &pool)));
        CpuPool { prefill, decode, kp, vp, layers: kv.layers, groups, vocab }
    }

    fn run(&mut self, decode: bool, tokens: &Tensor, pos: &Tensor, bt: &Tensor) -> Result<(Tensor, Tensor), Error> {
        let p = if decode { self.decode } else { self.prefill };
        run_paged(p, &mut self.kp, &mut self.vp, tokens, pos, bt)
    }
}

impl PooledSession for CpuPool<'_> {
    fn prefill(&mut self, groups: &[usize], prompt: &[u32]) -> Result<Vec<f64>, Error> {
        let (n, vocab) = (prompt.len(), self.vocab);
        let tokens = tokens_tensor(prompt)?;
        let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
        let row = [Row { token: 0, position: 0, groups }];
        let bt = block_tables(self.layers, self.groups, &row, 1, groups.len(), 0);
        let (logits, _) = self.run(false, &tokens, &pos, &bt)?;
        logits.data().get((n.max(1) - 1) * vocab..n * vocab).map(<[f64]>::to_vec).ok_or_else(|| Error::Unsupported("the prefill graph returned too few logits".into()))
    }

    fn decode(&mut self, rows: &[Row<'_>], logits: bool) -> Result<Step, Error> {
        let tokens = tokens_tensor(&rows.iter().map(|r| r.token).collect::<Vec<_>>())?;
        let pos = Tensor::new(DType::I32, &[rows.len()], rows.iter().map(|r| r.position as f64).collect())?;
        let m = rows.iter().map(|r| r.groups.len()).max().unwrap_or(1).max(1);
        let bt = block_tables(self.layers, self.groups, rows, rows.len(), m, 0);
        let (l, next) = self.run(true, &tokens, &pos, &bt)?;
        let v = self.vocab;
        Ok(if logits { Step::Logits(l.data().to_vec()) } else { Step::Greedy(greedy_tokens(next.data(), v, &mut |s| Ok(l.data()[s * v..(s + 1) * v].to_vec()))?) })
    }
}

/// Checks that a decode step's KV outputs are the page pools themselves (updated in place).
fn in_place(outputs: &[DeviceBuffer], k_pages: &DeviceBuffer, v_pages: &DeviceBuffer) -> Result<(), Error> {
    match outputs {
        [_, k, v, ..] if k.same_memory(k_pages) && v.same_memory(v_pages) => Ok(()),
        _ => Err(Error::Unsupported("the decode step did not update the KV page pools in place (kv_append outputs are not aliased to its page inputs)".into())),
    }
}

/// The device buffers of one batch bucket: the decode step's inputs and its captured graph.
struct Bucket {
    tokens: DeviceBuffer,
    positions: DeviceBuffer,
    block_tables: DeviceBuffer,
    graph: Option<CapturedGraph>,
}

/// The decode program for a batch size: the batch-specialised one where it can be had
/// (`Some`), else `None` for the symbolic one.
pub(crate) type DecodeFor<'a> = Box<dyn FnMut(usize) -> Result<Option<Arc<GpuProgram>>, Error> + 'a>;

/// The GPU's pooled session: device pools of `groups + 1` groups (the last is the padding
/// rows' scratch group) and one [`Bucket`] per (batch, block-table width) pair, both powers
/// of two.
pub(crate) struct GpuPool<'a> {
    prefill: &'a GpuProgram,
    decode: &'a GpuProgram,
    decode_for: DecodeFor<'a>,
    device: &'a Device,
    k_pages: DeviceBuffer,
    v_pages: DeviceBuffer,
    buckets: BTreeMap<(usize, usize), (Option<Arc<GpuProgram>>, Bucket)>,
    layers: usize,
    groups: usize,
    max_batch: usize,
    vocab: usize,
    cuda_graph: bool,
}

/// What a [`GpuPool`] runs: the prefill program, the symbolic decode program and the
/// batch-specialised ones.
pub(crate) struct GpuPoolPrograms<'a> {
    pub(crate) prefill: &'a GpuProgram,
    pub(crate) decode: &'a GpuProgram,
    pub(crate) decode_for: DecodeFor<'a>,
}

impl<'a> GpuPool<'a> {
    /// Zeroed device pools of `groups` page groups plus the scratch group; batches padded up
    /// to powers of two, at most `max_batch`.
    pub(crate) fn new(p: GpuPoolPrograms<'a>, device: &'a Device, kv: &KvGeometry, groups: usize, max_batch: usize, vocab: usize, cuda_graph: bool) -> Result<GpuPool<'a>, Error> {
        let pool = kv.pool_shape(kv.layers * (groups + 1));
        let (k_pages, v_pages) = (device.alloc_zeroed(kv.dtype, &pool)?, device.alloc_zeroed(kv.dtype, &pool)?);
        let GpuPoolPrograms { prefill, decode, decode_for } = p;
        Ok(GpuPool { prefill, decode, decode_for, device, k_pages, v_pages, buckets: BTreeMap::new(), layers: kv.layers, groups: groups + 1, max_batch: max_batch.max(1), vocab, cuda_graph })
    }

    /// The bucket of batch `b` and block-table width `w`, made on first use: its program (the
    /// batch-specialised one, compiled now) and buffers, and with CUDA graphs on its captured
    /// decode step.
    fn ready(&mut self, b: usize, w: usize) -> Result<(), Error> {
        let dev = self.device;
        if !self.buckets.contains_key(&(b, w)) {
            let program = (self.decode_for)(b)?;
            let bucket = Bucket {
                tokens: dev.alloc_zeroed(DType::I64, &[b])?,
                positions: dev.alloc_zeroed(DType::I32, &[b])?,
                block_tables: dev.alloc_zeroed(DType::I32, &[self.layers, b, w])?,
                graph: None,
            };
            self.buckets.insert((b, w), (program, bucket));
        }
        let (k_pages, v_pages) = (&self.k_pages, &self.v_pages);
        let (program, bucket) = self.buckets.get_mut(&(b, w)).ok_or_else(|| Error::Unsupported("no decode bucket".into()))?;
        if self.cuda_graph && bucket.graph.is_none() {
            let program: &GpuProgram = program.as_deref().unwrap_or(self.decode);
            let inputs = [("tokens", &bucket.tokens), ("positions", &bucket.positions), ("block_tables", &bucket.block_tables), ("k_pages", k_pages), ("v_pages", v_pages)];
            let g = program.capture_device(&inputs, &crate::Bindings::new())?;
            in_place(g.outputs(), k_pages, v_pages)?;
            bucket.graph = Some(g);
        }
        Ok(())
    }
}

impl PooledSession for GpuPool<'_> {
    fn warm(&mut self, max_groups: usize) -> Result<(), Error> {
        let widths = std::iter::successors(Some(1usize), |w| (*w < max_groups.max(1)).then(|| w * 2));
        let batches: Vec<usize> = std::iter::successors(Some(1usize), |b| (b * 2 < self.max_batch).then(|| b * 2)).chain([self.max_batch]).collect();
        for w in widths {
            for &b in &batches {
                self.ready(b, w)?;
            }
        }
        Ok(())
    }

    fn prefill(&mut self, groups: &[usize], prompt: &[u32]) -> Result<Vec<f64>, Error> {
        let (n, vocab, dev) = (prompt.len(), self.vocab, self.device);
        let tokens = dev.upload_tensor(&tokens_tensor(prompt)?)?;
        let pos = dev.upload_tensor(&Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64))?;
        let row = [Row { token: 0, position: 0, groups }];
        let bt = dev.upload_tensor(&block_tables(self.layers, self.groups, &row, 1, groups.len(), self.groups - 1))?;
        let r = self.prefill.run_device(&[("tokens", &tokens), ("positions", &pos), ("block_tables", &bt), ("k_pages", &self.k_pages), ("v_pages", &self.v_pages)], &crate::Bindings::new())?;
        in_place(&r, &self.k_pages, &self.v_pages)?;
        Ok(dev.download_range_f64(&r[0], (n.max(1) - 1) * vocab, vocab)?)
    }

    fn decode(&mut self, rows: &[Row<'_>], want_logits: bool) -> Result<Step, Error> {
        let b = rows.len().next_power_of_two().min(self.max_batch).max(rows.len());
        let w = rows.iter().map(|r| r.groups.len()).max().unwrap_or(1).max(1).next_power_of_two();
        let dev = self.device;
        self.ready(b, w)?;
        let scratch = self.groups - 1;
        let tokens: Vec<f64> = (0..b).map(|i| rows.get(i).map_or(0.0, |r| f64::from(r.token))).collect();
        let positions: Vec<f64> = (0..b).map(|i| rows.get(i).map_or(0.0, |r| r.position as f64)).collect();
        let bt = block_tables(self.layers, self.groups, rows, b, w, scratch);
        let (k_pages, v_pages) = (&self.k_pages, &self.v_pages);
        let (program, bucket) = self.buckets.get_mut(&(b, w)).ok_or_else(|| Error::Unsupported("no decode bucket".into()))?;
        let program: &GpuProgram = program.as_deref().unwrap_or(self.decode);
        dev.write_f64(&bucket.tokens, &tokens)?;
        dev.write_f64(&bucket.positions, &positions)?;
        dev.write_f64(&bucket.block_tables, bt.data())?;
        let outs = match &bucket.graph {
            Some(g) => {
                g.replay()?;
                g.outputs().to_vec()
            }
            None => {
                let inputs = [("tokens", &bucket.tokens), ("positions", &bucket.positions), ("block_tables", &bucket.block_tables), ("k_pages", k_pages), ("v_pages", v_pages)];
                let r = program.run_device(&inputs, &crate::Bindings::new())?;
                in_place(&r, k_pages, v_pages)?;
                r
            }
        };
        let (v, live) = (self.vocab, rows.len());
        let l = outs.first().ok_or_else(|| Error::Unsupported("the decode graph returned no logits".into()))?;
        if want_logits {
            return Ok(Step::Logits(dev.download_range_f64(l, 0, live * v)?));
        }
        let next = outs.get(3).ok_or_else(|| Error::Unsupported("the decode graph returned no greedy tokens".into()))?;
        let next = dev.download_range_f64(next, 0, live)?;
        Ok(Step::Greedy(greedy_tokens(&next, v, &mut |s| Ok(dev.download_range_f64(l, s * v, v)?))?))
    }
}
