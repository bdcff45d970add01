//! The cost model: modelled microseconds of a kernel on the card a [`Target`] stands for.
//!
//! **Units.** Time in microseconds (µs); bytes are HBM bytes read plus written at the graph's
//! shapes with every symbol bound by a [`CostConfig`]; FLOPs are counted as 2 per
//! multiply-add. A kernel costs
//!
//! ```text
//! launch_us + max(bytes / HBM bandwidth, flops / peak)
//! ```
//!
//! with the peak of tensor cores for bf16/f16 matmul and attention and of CUDA cores
//! otherwise. The bandwidth and the peaks are the target's ([`Target::dram_gbps`],
//! [`Target::tensor_tflops`], [`Target::cuda_core_tflops`]: for sm_90a those measured on the
//! project's H200), the launch cost [`LAUNCH_US`].
//!
//! **Per-node cost for extraction.** Extraction costs each e-node as if it were its own
//! kernel ([`node_cost`]); a few nodes are free because no kernel ever runs for them:
//! parameters, projections and the root tuple; `reshape` (a view of a contiguous buffer);
//! `constant` and `iota` (folded into their consumers); a `slice` of a matmul's output
//! columns (the matmul's epilogue writes each slice to its own buffer) or a contiguous slice;
//! a `concat` of parameters (weights, concatenated once at load time); and any node on
//! load-time operands (weights and constants, [`crate::extract::load_time_classes`]) whose
//! results have constant shapes and are no larger than its operands (computed once when the
//! weights are bound, [`crate::hoist`]). Every node also
//! pays a tiny [`EPSILON_US`], so that costs are strictly positive and a cyclic choice can
//! never be cheapest. After extraction the partitioner fuses kernels; the fusion report
//! re-costs the final kernels with [`kernel_us`].

use sinter_ir::{Bindings, DType, Dim, Op, OpKind, Target, TensorType};

/// Fixed cost of one kernel launch, µs.
pub const LAUNCH_US: f64 = 3.0;

/// The cost every e-node pays on top of its kernel cost, µs.
pub const EPSILON_US: f64 = 1e-3;

/// Which sizes the symbols take when costing, and for which target's card.
#[derive(Clone, Debug, PartialEq)]
pub struct CostConfig {
    /// A name for the report (`prefill`, `decode`).
    pub name: String,
    /// Symbol sizes; a symbol not listed counts as [`CostConfig::default_symbol`].
    pub bindings: Bindings,
    /// Size of an unlisted symbol.
    pub default_symbol: i64,
    /// The target whose figures (bandwidth, peaks) the model uses; [`crate::compile`] sets it
    /// to the target it compiles for.
    pub target: Target,
}

impl CostConfig {
    /// Prefill: `T = 512` tokens, `P = 1024` KV pages, `M = 32` pages per sequence; sm_90a.
    pub fn prefill() -> CostConfig {
        CostConfig { name: "prefill".into(), bindings: binds(&[("T", 512), ("P", 1024), ("M", 32), ("B", 1), ("S", 512)]), default_symbol: 64, target: Target::SM_90A }
    }

    /// Decode: a batch of `T = 16` sequences of one token each, `P = 1024`, `M = 32`; sm_90a.
    pub fn decode() -> CostConfig {
        CostConfig { name: "decode".into(), bindings: binds(&[("T", 16), ("P", 1024), ("M", 32), ("B", 16), ("S", 512)]), default_symbol: 64, target: Target::SM_90A }
    }

    /// Decode when the graph holds a `paged_attention` (reading the KV cache), else prefill.
    pub fn for_graph(g: &sinter_ir::Graph) -> CostConfig {
        let decode = g.funcs.values().any(|f| f.nodes.values().any(|n| n.op.kind == OpKind::PagedAttention));
        if decode {
            CostConfig::decode()
        } else {
            CostConfig::prefill()
        }
    }

    /// A dim's size under the config.
    pub fn size(&self, d: &Dim) -> f64 {
        let mut b = self.bindings.clone();
        for s in d.symbols() {
            b.entry(s.to_string()).or_insert(self.default_symbol);
        }
        d.eval(&b).map(|v| v.max(0) as f64).unwrap_or(self.default_symbol as f64)
    }

    /// Elements of a tensor type.
    pub fn numel(&self, t: &TensorType) -> f64 {
        t.shape.iter().map(|d| self.size(d)).product()
    }

    /// Bytes of a tensor type (block-quantized types: their blocks' bytes, 34/32 or 20/32 an
    /// element for `q8_0`/`q4_1`, 144/256 for `q4_k`, ...).
    pub fn bytes(&self, t: &TensorType) -> f64 {
        let per = match (t.dtype.block_bytes(), t.dtype.block_elems()) {
            (Some(bb), Some(be)) => bb as f64 / be as f64,
            _ => t.dtype.size_bytes() as f64,
        };
        self.numel(t) * per
    }
}

fn binds(kv: &[(&str, i64)]) -> Bindings {
    kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

impl Default for CostConfig {
    fn default() -> CostConfig {
        CostConfig::prefill()
    }
}

/// Modelled time of one kernel moving `bytes` and doing `flops` on `target`, µs.
pub fn kernel_us(target: &Target, bytes: f64, flops: f64, tensor_cores: bool) -> f64 {
    let peak = if tensor_cores { target.tensor_tflops() } else { target.cuda_core_tflops() };
    let mem = bytes / (target.dram_gbps() * 1e3); // GB/s = 1e3 bytes/µs
    let math = flops / (peak * 1e6); // TFLOP/s = 1e6 flop/µs
    LAUNCH_US + mem.max(math)
}

/// FLOPs of an op, given operand and result types (2 per multiply-add; 1 per element for
/// element-wise work).
pub fn flops(cfg: &CostConfig, op: &Op, ins: &[&TensorType], outs: &[TensorType]) -> f64 {
    let out_n: f64 = outs.iter().map(|t| cfg.numel(t)).sum();
    match op.kind {
        OpKind::Matmul => {
            let Some(a) = ins.first() else { return out_n };
            let k = if op.bool("transpose_a") == Some(true) { a.shape.len().checked_sub(2) } else { a.shape.len().checked_sub(1) };
            let k = k.and_then(|i| a.shape.get(i)).map(|d| cfg.size(d)).unwrap_or(1.0);
            2.0 * out_n * k
        }
        OpKind::Attention => {
            let (Some(q), Some(k)) = (ins.first(), ins.get(1)) else { return out_n };
            let sx = if op.str("layout") == Some("bshd") { 1 } else { 2 };
            let skv = k.shape.get(sx).map(|d| cfg.size(d)).unwrap_or(1.0);
            // Q·Kᵀ and P·V: 2 multiply-adds per (query element, key).
            let f = 4.0 * cfg.numel(q) * skv;
            if op.bool("causal") == Some(true) {
                f / 2.0
            } else {
                f
            }
        }
        OpKind::PagedAttention => {
            let q = ins.first().map(|t| cfg.numel(t)).unwrap_or(0.0);
            let page = ins.get(1).map(|t| cfg.size(&t.shape[1])).unwrap_or(1.0);
            let m = ins.get(3).and_then(|t| t.shape.get(1)).map(|d| cfg.size(d)).unwrap_or(1.0);
            4.0 * q * page * m
        }
        _ => out_n,
    }
}

/// Whether an op runs on tensor cores (bf16/f16 matmul and attention).
pub fn uses_tensor_cores(op: &Op, ins: &[&TensorType]) -> bool {
    matches!(op.kind, OpKind::Matmul | OpKind::Attention | OpKind::PagedAttention)
        && ins.first().is_some_and(|t| matches!(t.dtype, DType::BF16 | DType::F16))
}

/// HBM bytes an op reads and writes as its own kernel: operands read, results written. Paged
/// ops read only the pages their block table names (`M` pages per sequence), not the whole
/// pool; `kv_append` reads and writes only its new rows (its outputs alias the pools);
/// `gather` reads only the rows it looks up.
pub fn op_read_write(cfg: &CostConfig, op: &Op, ins: &[&TensorType], outs: &[TensorType]) -> (f64, f64) {
    let written: f64 = outs.iter().map(|t| cfg.bytes(t)).sum();
    match op.kind {
        OpKind::PagedAttention => {
            let q = ins.first().map(|t| cfg.bytes(t)).unwrap_or(0.0);
            let page = ins.get(1).and_then(|t| Some(cfg.bytes(t) / cfg.size(t.shape.first()?).max(1.0))).unwrap_or(0.0);
            let m = ins.get(3).and_then(|t| t.shape.get(1)).map(|d| cfg.size(d)).unwrap_or(1.0);
            let b = ins.first().and_then(|t| t.shape.first()).map(|d| cfg.size(d)).unwrap_or(1.0);
            (q + 2.0 * page * m * b, written)
        }
        OpKind::KvAppend => {
            let new: f64 = ins.get(2..4).map(|s| s.iter().map(|t| cfg.bytes(t)).sum()).unwrap_or(0.0);
            (new, new)
        }
        OpKind::Gather => (ins.get(1).map(|t| cfg.bytes(t)).unwrap_or(0.0) + written, written),
        _ => (ins.iter().map(|t| cfg.bytes(t)).sum::<f64>(), written),
    }
}

/// HBM bytes an op moves as its own kernel (read + written, see [`op_read_write`]).
pub fn op_bytes(cfg: &CostConfig, op: &Op, ins: &[&TensorType], outs: &[TensorType]) -> f64 {
    let (r, w) = op_read_write(cfg, op, ins, outs);
    r + w
}

/// Modelled µs of an op as its own kernel.
pub fn op_us(cfg: &CostConfig, op: &Op, ins: &[&TensorType], outs: &[TensorType]) -> f64 {
    kernel_us(&cfg.target, op_bytes(cfg, op, ins, outs), flops(cfg, op, ins, outs), uses_tensor_cores(op, ins))
}

/// Modelled µs saved by computing a row norm in the prologue of the matmul that reads it
/// (`sinter_ir::contract::prologue`) rather than in a kernel of its own; fuse where it is
/// positive. `norm` and `mm` are the two ops with their operand and result types (`norm`'s
/// result is `mm`'s A, `[M, K]`).
///
/// Apart, the norm costs its own launch and moves its rows twice more (read, then written and
/// read back by the matmul); the matmul runs on tensor cores for 16-bit operands. Fused, the
/// one kernel is the small-M kernel on CUDA cores, whose CTAs — one per
/// [`sinter_ir::contract::NORM_PROLOGUE_COLUMNS_PER_CTA`] output columns — each read their
/// rows of `x` once more for the statistics: counted as HBM bytes, which overstates them
/// (the rows are a few KiB, read from L2), so the model fuses only where even that pays.
/// At decode batches of small models the launch dominates and it pays; over a wide N (a
/// vocabulary projection) the re-reads outweigh the launch.
pub fn norm_prologue_saving(cfg: &CostConfig, norm: (&Op, &[&TensorType], &[TensorType]), mm: (&Op, &[&TensorType], &[TensorType])) -> f64 {
    let apart = op_us(cfg, norm.0, norm.1, norm.2) + op_us(cfg, mm.0, mm.1, mm.2);
    let (Some(a), Some(out)) = (mm.1.first(), mm.2.first()) else { return f64::NEG_INFINITY };
    // The matmul's bytes with A read as the norm's inputs (x and its weight) instead, plus
    // every CTA's second read of its rows.
    let norm_in: f64 = norm.1.iter().map(|t| cfg.bytes(t)).sum();
    let bytes = op_bytes(cfg, mm.0, mm.1, mm.2) - cfg.bytes(a) + norm_in + norm_prologue_rereads(cfg, mm.0, a, out);
    let fused = kernel_us(&cfg.target, bytes, flops(cfg, mm.0, mm.1, mm.2) + flops(cfg, norm.0, norm.1, norm.2), false);
    let rows: f64 = a.shape.iter().map(|d| cfg.size(d)).product();
    apart - fused - NORM_PROLOGUE_US_PER_ROW_ELEMENT * rows
}

/// The time a norm prologue adds to its matmul kernel per element of the normalised rows
/// (`M·K`), µs: every CTA computes the statistics of all M rows, then reads A through the
/// element evaluator, a dependent chain that bandwidth does not bound. Calibrated on an H200
/// (bench/RESULTS.md): the prologue pays at a decode batch of one, not at sixteen.
pub const NORM_PROLOGUE_US_PER_ROW_ELEMENT: f64 = 0.0027;

/// The bytes the CTAs of a matmul with a norm prologue read again for the statistics: each
/// CTA (one per [`sinter_ir::contract::NORM_PROLOGUE_COLUMNS_PER_CTA`] output columns) its rows
/// of A (`a`, `[M, K]`; `out` the matmul's result), counted as HBM bytes.
pub fn norm_prologue_rereads(cfg: &CostConfig, mm: &Op, a: &TensorType, out: &TensorType) -> f64 {
    let n = out.shape.last().map_or(1.0, |d| cfg.size(d));
    let [k_major, other] = sinter_ir::contract::NORM_PROLOGUE_COLUMNS_PER_CTA;
    let per_cta = if mm.bool("transpose_b") == Some(true) { k_major } else { other };
    (n / per_cta as f64).ceil().max(1.0) * cfg.bytes(a)
}

/// What extraction needs to know about an e-node's operands beyond their types.
#[derive(Clone, Copy, Debug, Default)]
pub struct OperandFacts {
    /// Every operand class holds a parameter.
    pub all_params: bool,
    /// The first operand class holds a matmul.
    pub first_is_matmul: bool,
    /// Every operand class is a load-time value ([`crate::extract::load_time_classes`]).
    pub load_time: bool,
}

/// The extraction cost of an op e-node, µs (see the module docs for the free nodes).
///
/// An `attention` / `paged_attention` the kernel contract refuses on `cfg.target`
/// ([`sinter_ir::contract::attention_node`]) costs `f64::INFINITY`: extraction never picks
/// one, so a recognised attention the generator cannot build stays in its written form.
pub fn node_cost(cfg: &CostConfig, op: &Op, ins: &[&TensorType], outs: &[TensorType], facts: OperandFacts) -> f64 {
    if matches!(op.kind, OpKind::Attention | OpKind::PagedAttention) && sinter_ir::contract::attention_node(op, ins, &cfg.target).is_err() {
        return f64::INFINITY;
    }
    let free = match op.kind {
        OpKind::Reshape | OpKind::Constant | OpKind::Iota => true,
        OpKind::Slice => facts.first_is_matmul || ins.first().is_some_and(|t| is_contiguous_slice(op, t)),
        OpKind::Concat => facts.all_params,
        _ => false,
    } || hoisted_free(cfg, op, ins, outs, facts);
    if free {
        EPSILON_US
    } else {
        EPSILON_US + op_us(cfg, op, ins, outs)
    }
}

/// Whether an op on load-time operands is computed once at load time and so costs a step
/// nothing: its results have constant shapes and are no larger than its operands (the
/// hoisting criterion of [`crate::hoist`], applied to the node alone).
fn hoisted_free(cfg: &CostConfig, op: &Op, ins: &[&TensorType], outs: &[TensorType], facts: OperandFacts) -> bool {
    let read: f64 = ins.iter().map(|t| cfg.bytes(t)).sum();
    let written: f64 = outs.iter().map(|t| cfg.bytes(t)).sum();
    facts.load_time && op.kind != OpKind::KvAppend && outs.iter().all(crate::hoist::is_static) && written <= read
}

/// Whether `slice` of a contiguous `x` is itself contiguous (every axis before the sliced
/// one has size 1), so that it is an offset view.
pub fn is_contiguous_slice(op: &Op, x: &TensorType) -> bool {
    let Some(axis) = op.int("axis") else { return false };
    let r = x.rank() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    a >= 0 && x.shape[..(a as usize).min(x.shape.len())].iter().all(Dim::is_one)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_ir::{Attr, Dim};

    #[test]
    fn units_are_microseconds_bytes_and_flops() {
        // The target's DRAM bandwidth's worth of bytes per millisecond is one millisecond, plus the launch.
        let h200 = Target::SM_90A;
        assert!((kernel_us(&h200, 4.27e9, 0.0, false) - 1003.0).abs() < 1e-9);
        // The target's tensor-core FLOP/s' worth of work is one second.
        assert!((kernel_us(&h200, 0.0, 680e12, true) - (1e6 + 3.0)).abs() < 1e-6);
        // Likewise on sm_80, with its own bandwidth (the figures: book/src/design/contract.md).
        assert!((kernel_us(&Target::SM_80, 2.039e9, 0.0, false) - 1003.0).abs() < 1e-9);
        let cfg = CostConfig::prefill();
        let x = TensorType::new(DType::BF16, [Dim::symbol("T"), Dim::constant(576)]);
        let w = TensorType::new(DType::BF16, [Dim::constant(1536), Dim::constant(576)]);
        let out = TensorType::new(DType::BF16, [Dim::symbol("T"), Dim::constant(1536)]);
        let mm = Op::new(OpKind::Matmul, vec![("transpose_b".into(), Attr::Bool(true))]).unwrap();
        assert_eq!(cfg.numel(&x), 512.0 * 576.0);
        assert_eq!(flops(&cfg, &mm, &[&x, &w], &[out.clone()]), 2.0 * 512.0 * 1536.0 * 576.0);
        assert!(uses_tensor_cores(&mm, &[&x, &w]));
        assert_eq!(op_bytes(&cfg, &mm, &[&x, &w], &[out.clone()]), 2.0 * (512.0 * 576.0 + 1536.0 * 576.0 + 512.0 * 1536.0));
        // Decode binds T to a batch of 16.
        assert_eq!(CostConfig::decode().numel(&x), 16.0 * 576.0);
        // Views and weight concatenations are free for extraction; a plain op is not.
        let r = Op::new(OpKind::Reshape, vec![("shape".into(), Attr::Dims(vec![Dim::symbol("T"), Dim::constant(576)]))]).unwrap();
        assert_eq!(node_cost(&cfg, &r, &[&x], &[x.clone()], OperandFacts::default()), EPSILON_US);
        let e = Op::plain(OpKind::Exp).unwrap();
        assert!(node_cost(&cfg, &e, &[&x], &[x.clone()], OperandFacts::default()) > LAUNCH_US);
    }

    /// A norm in a projection's prologue pays at a decode batch of one (the launch saved
    /// outweighs CUDA-core math, every CTA re-reading its rows and computing their
    /// statistics) and not at sixteen rows or a prefill's 512, nor before a vocabulary-wide
    /// projection at batch 1.
    #[test]
    fn norm_prologue_pays_at_decode_sizes_only() {
        let cfg = CostConfig::decode();
        let norm = Op::new(OpKind::RmsNorm, vec![("eps".into(), Attr::Float(1e-5))]).unwrap();
        let mm = Op::new(OpKind::Matmul, vec![("transpose_b".into(), Attr::Bool(true))]).unwrap();
        let saving = |m: i64, n: i64| {
            let t = |dims: &[i64]| TensorType::new(DType::BF16, dims.iter().map(|&d| Dim::constant(d)));
            let (x, g, w, out) = (t(&[m, 576]), t(&[576]), t(&[n, 576]), t(&[m, n]));
            norm_prologue_saving(&cfg, (&norm, &[&x, &g], std::slice::from_ref(&x)), (&mm, &[&x, &w], std::slice::from_ref(&out)))
        };
        // SmolLM2's QKV (N = 960) and gate/up (N = 3072) projections.
        assert!(saving(1, 960) > 0.5 && saving(1, 3072) > 0.0, "{} {}", saving(1, 960), saving(1, 3072));
        assert!(saving(16, 960) < 0.0, "{}", saving(16, 960));
        assert!(saving(512, 960) < 0.0, "{}", saving(512, 960));
        assert!(saving(1, 49152) < 0.0, "{}", saving(1, 49152));
    }
}
