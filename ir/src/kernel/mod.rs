//! The graph after fusion ([`KernelGraph`]) and the artefact the code generator hands the
//! runtime for each kernel ([`LaunchPlan`]).
//!
//! A `KernelGraph` is a list of kernels in launch order over named buffers. Each kernel has a
//! family (which generator builds it), a body (an IR [`Function`] whose parameters are the
//! kernel's input buffers and whose outputs are its output buffers: the fused computation,
//! prologue and epilogue included) and the layouts of its buffers. The interpreter can run a
//! `KernelGraph` by running each body; the code generator turns each kernel into PTX and a
//! [`LaunchPlan`]; the runtime allocates the buffers and launches the plans. `passes` produces
//! it, `codegen` and `runtime` consume it; none of them needs the others.

pub mod persistent;
pub mod plan_text;

use std::collections::BTreeMap;

use cranelift_entity::{entity_impl, PrimaryMap};

use crate::contract::target::Target;
use crate::dtype::DType;
use crate::dim::{Bindings, Dim, DimError};
use crate::graph::{Function, TensorType};
use crate::ops::OpKind;

/// A buffer of a kernel graph (`b3`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Buffer(u32);
entity_impl!(Buffer, "b");

/// A kernel of a kernel graph (`k3`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kernel(u32);
entity_impl!(Kernel, "k");

/// What a buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferRole {
    /// A parameter of the graph (an input or a weight), written by the caller.
    Input,
    /// A result of the graph.
    Output,
    /// An intermediate between kernels.
    Temp,
}

/// Memory layout of a buffer: strides in elements per axis and the alignment of its base
/// address in bytes. Row-major contiguous unless a kernel says otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Stride of each axis, in elements.
    pub strides: Vec<Dim>,
    /// Alignment of the base address, in bytes (the pool hands out 256-byte aligned blocks).
    pub align: u32,
}

impl Layout {
    /// Row-major contiguous strides for `shape`, 256-byte aligned.
    pub fn contiguous(shape: &[Dim]) -> Layout {
        let mut strides = vec![Dim::constant(1); shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].mul(&shape[i + 1]);
        }
        Layout { strides, align: 256 }
    }
}

/// A buffer's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferData {
    /// The graph value's name, for inputs and outputs.
    pub name: Option<String>,
    /// Dtype and shape.
    pub ty: TensorType,
    /// Role.
    pub role: BufferRole,
    /// Layout.
    pub layout: Layout,
}

/// Which generator builds a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Any fused element-wise expression, broadcasting included.
    Pointwise,
    /// A reduction over the last axis, possibly fused with element-wise work before and after
    /// (softmax, log_softmax, RMSNorm, LayerNorm, reduce_sum/max/mean).
    RowReduction,
    /// A (batched) matmul with a fused prologue/epilogue.
    Matmul,
    /// Prefill attention (online softmax, FlashAttention-2).
    Attention,
    /// Decode attention over a paged KV cache.
    PagedAttention,
    /// Merges two partial attention states by their log-sum-exp (`attention_merge`).
    AttentionMerge,
    /// Writes new K/V rows into a paged cache.
    KvAppend,
    /// Embedding lookup.
    Gather,
    /// Data movement: transpose, permute, broadcast, concat, slice, reshape of a
    /// non-contiguous value.
    Layout,
}

impl Family {
    /// The lower-case name (`pointwise`, `row_reduction`, ...), as kernel entry points, body
    /// names and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Pointwise => "pointwise",
            Family::RowReduction => "row_reduction",
            Family::Matmul => "matmul",
            Family::Attention => "attention",
            Family::PagedAttention => "paged_attention",
            Family::AttentionMerge => "attention_merge",
            Family::KvAppend => "kv_append",
            Family::Gather => "gather",
            Family::Layout => "layout",
        }
    }
}

/// One kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelData {
    /// Generator.
    pub family: Family,
    /// The computation: parameters ↔ `inputs`, outputs ↔ `outputs`, in order.
    pub body: Function,
    /// Buffers read.
    pub inputs: Vec<Buffer>,
    /// Buffers written.
    pub outputs: Vec<Buffer>,
}

/// The graph after fusion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelGraph {
    /// Every buffer.
    pub buffers: PrimaryMap<Buffer, BufferData>,
    /// Kernels in launch order.
    pub kernels: PrimaryMap<Kernel, KernelData>,
    /// The graph's parameters, in the source function's order.
    pub inputs: Vec<Buffer>,
    /// The graph's results, in order.
    pub outputs: Vec<Buffer>,
}

impl KernelGraph {
    /// Kernel `k` alone, as a kernel graph of its own: its distinct inputs are the graph's
    /// inputs (in first-use order), its outputs the graph's outputs; every buffer is kept
    /// (same ids). For running or timing one kernel by itself.
    pub fn kernel_alone(&self, k: Kernel) -> KernelGraph {
        let kd = &self.kernels[k];
        let mut inputs = Vec::new();
        for b in &kd.inputs {
            if !inputs.contains(b) {
                inputs.push(*b);
            }
        }
        let mut kernels = PrimaryMap::new();
        kernels.push(kd.clone());
        KernelGraph { buffers: self.buffers.clone(), kernels, inputs, outputs: kd.outputs.clone() }
    }

    /// Whether kernel `k`, launched by `plan`, has anything to compute under `bindings`: every
    /// grid axis has work items and some output has elements (a kernel without outputs counts
    /// as having work). Executors skip a kernel without work: its grid, rounded up to one CTA
    /// per axis, would otherwise run over empty buffers.
    ///
    /// # Errors
    /// An unbound symbol or an overflow in a grid axis or an output's shape.
    pub fn has_work(&self, k: Kernel, plan: &LaunchPlan, bindings: &Bindings) -> Result<bool, DimError> {
        for g in &plan.grid {
            if g.numerator.eval(bindings)? <= 0 {
                return Ok(false);
            }
        }
        let outputs = &self.kernels[k].outputs;
        for b in outputs {
            let mut empty = false;
            for d in &self.buffers[*b].ty.shape {
                empty |= d.eval(bindings)? <= 0;
            }
            if !empty {
                return Ok(true);
            }
        }
        Ok(outputs.is_empty())
    }

    /// The *load-time* kernels, one flag per kernel in launch order: those whose results are
    /// the same at every run once the inputs `fixed` says are fixed (bound weights) are, so
    /// that they can run once, before the first step, and their results be bound as inputs.
    ///
    /// A kernel is load-time when every buffer it reads is a fixed graph input or written by
    /// an earlier load-time kernel (a kernel reading nothing — a table built from `constant`
    /// and `iota` — qualifies), it writes no graph output (the caller reads those after every
    /// run), it updates nothing in place (`kv_append`), and every buffer it reads or writes
    /// has a shape without symbols (its launch needs no binding). The passes mark these
    /// kernels in the fusion report with the weights as the fixed inputs; the GPU backend folds
    /// them with the bound buffers as the fixed inputs.
    pub fn load_time_kernels(&self, fixed: impl Fn(Buffer) -> bool) -> Vec<bool> {
        let outputs: std::collections::BTreeSet<Buffer> = self.outputs.iter().copied().collect();
        let mut ready: std::collections::BTreeSet<Buffer> = self.inputs.iter().copied().filter(|&b| fixed(b)).collect();
        let is_static = |b: &Buffer| self.buffers.get(*b).is_some_and(|bd| bd.ty.shape.iter().all(|d| d.as_const().is_some()));
        let mut flags = Vec::with_capacity(self.kernels.len());
        for kd in self.kernels.values() {
            let in_place = kd.body.nodes.values().any(|nd| nd.op.kind == OpKind::KvAppend);
            let load_time = !in_place
                && kd.inputs.iter().all(|b| ready.contains(b))
                && !kd.outputs.iter().any(|b| outputs.contains(b))
                && kd.inputs.iter().chain(&kd.outputs).all(is_static);
            if load_time {
                ready.extend(kd.outputs.iter().copied());
            }
            flags.push(load_time);
        }
        flags
    }

    /// The in-place updates: each output of a kernel that is a `kv_append` result (the updated
    /// `k_pages`, `v_pages`, in a KvAppend kernel or a projection's epilogue) is the same
    /// storage as the kernel's page input, mapped here to its storage root (chains, layer after
    /// layer threading one page pool, resolve to the first buffer). The lowering orders every
    /// other reader of a page input before the kernel that updates it.
    pub fn in_place_aliases(&self) -> BTreeMap<Buffer, Buffer> {
        let mut aliases: BTreeMap<Buffer, Buffer> = BTreeMap::new();
        for data in self.kernels.values() {
            // The page operands of a kv_append are body parameters (kernel inputs), its
            // results body outputs (kernel outputs).
            let body = &data.body;
            for nd in body.nodes.values().filter(|nd| nd.op.kind == OpKind::KvAppend) {
                for (page_operand, result) in nd.inputs.iter().zip(&nd.results).take(2) {
                    let input = body.params.iter().position(|p| p == page_operand).and_then(|i| data.inputs.get(i));
                    let output = body.outputs.iter().position(|o| o == result).and_then(|i| data.outputs.get(i));
                    if let (Some(inp), Some(out)) = (input, output) {
                        let root = aliases.get(inp).copied().unwrap_or(*inp);
                        aliases.insert(*out, root);
                    }
                }
            }
        }
        aliases
    }
}

/// `ceil(numerator / denominator)`, evaluated at launch: one grid dimension.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GridDim {
    /// Work items along this grid axis (a dim of the kernel's shapes).
    pub numerator: Dim,
    /// Work items per CTA.
    pub denominator: u32,
}

impl GridDim {
    /// A fixed count.
    pub fn fixed(n: u32) -> GridDim {
        GridDim { numerator: Dim::constant(n as i64), denominator: 1 }
    }

    /// CTAs along this axis under `bindings`, at least 1.
    ///
    /// # Errors
    /// An unbound symbol or an overflow.
    pub fn eval(&self, bindings: &Bindings) -> Result<u32, DimError> {
        let n = self.numerator.eval(bindings)?;
        let d = i64::from(self.denominator.max(1));
        // Ceiling division that cannot overflow (`n + d - 1` does for n near i64::MAX).
        let n = n.max(0);
        let ctas = n / d + i64::from(n % d != 0);
        u32::try_from(ctas.max(1)).map_err(|_| DimError::Overflow(self.numerator.to_string()))
    }
}

/// One kernel parameter, in PTX parameter order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelParam {
    /// A device pointer to the kernel's buffer `i`, counting `inputs` then `outputs`.
    Buffer(usize),
    /// A 64-bit integer: a dim evaluated under the launch's bindings (sizes, strides).
    Size(Dim),
    /// A TMA tensor map over one of the kernel's buffers, encoded by the runtime at launch
    /// (`cuTensorMapEncodeTiled`) and passed by value as a 128-byte, 64-byte-aligned
    /// `__grid_constant__` parameter (PTX: `.param .align 64 .b8 p[128]`), which the kernel's
    /// `cp.async.bulk.tensor` copies name (PTX ISA §5.5.8 "Tensor-map", §9.7.9.25.5.2).
    TensorMap(TensorMap),
}

/// A tiled TMA tensor map: a view of buffer `buffer` as a tensor of up to 5 dimensions,
/// innermost first, read in boxes of `box_dims` elements into shared memory with the
/// `swizzle` pattern; out-of-bounds elements of a box read as zero. All dims are in
/// elements and evaluated under the launch's bindings.
///
/// The driver requires (and the runtime checks, naming the kernel): a 16-byte-aligned start
/// address, strides that are multiples of 16 bytes and below 2⁴⁰, dims in `1..=2³²`, boxes
/// of at most 256 elements a dimension whose innermost extent times the element size is a
/// multiple of 16 bytes and, with a swizzle, at most the swizzle span.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMap {
    /// The kernel buffer (inputs then outputs, as [`KernelParam::Buffer`]).
    pub buffer: usize,
    /// The element type (`bf16`, `f16`, `f32`, `f8e4m3`: bytes as `uint8`).
    pub dtype: DType,
    /// Elements from the buffer's start to the tensor's first element.
    pub offset: Dim,
    /// Extent of each dimension, innermost first (the innermost is contiguous).
    pub dims: Vec<Dim>,
    /// Stride of each dimension after the innermost, in elements (`dims.len() − 1` of them).
    pub strides: Vec<Dim>,
    /// The box a copy moves, elements per dimension, innermost first.
    pub box_dims: Vec<u32>,
    /// The shared-memory swizzle span in bytes: 0 (none), 32, 64 or 128.
    pub swizzle: u32,
}

/// What the runtime needs to launch a compiled kernel: the PTX, its entry point, the launch
/// geometry as expressions of the kernel's symbols, and the parameter list. Produced by
/// `sinter-codegen`, consumed by `sinter-runtime` (which never sees LLVM); stored on disk in
/// the text form of [`plan_text`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LaunchPlan {
    /// Entry point (`.entry` name in the PTX).
    pub entry: String,
    /// The PTX module text.
    pub ptx: String,
    /// Target it was generated for.
    pub target: Target,
    /// Grid, x/y/z.
    pub grid: [GridDim; 3],
    /// Threads per CTA, x/y/z.
    pub block: [u32; 3],
    /// Dynamic shared memory per CTA, bytes.
    pub shared_bytes: u32,
    /// Parameters in order.
    pub params: Vec<KernelParam>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(kg: &mut KernelGraph, name: &str, shape: Vec<Dim>, role: BufferRole) -> Buffer {
        let ty = TensorType::new(DType::F32, shape);
        kg.buffers.push(BufferData { name: Some(name.into()), layout: Layout::contiguous(&ty.shape), ty, role })
    }

    fn kernel(kg: &mut KernelGraph, inputs: &[Buffer], outputs: &[Buffer]) {
        kg.kernels.push(KernelData { family: Family::Pointwise, body: Function::new("k"), inputs: inputs.to_vec(), outputs: outputs.to_vec() });
    }

    #[test]
    fn load_time_kernels_read_fixed_inputs_with_constant_shapes() {
        let (c8, t) = (Dim::constant(8), Dim::symbol("T"));
        let mut kg = KernelGraph::default();
        let w = buffer(&mut kg, "w", vec![c8.clone()], BufferRole::Input);
        let x = buffer(&mut kg, "x", vec![t.clone(), c8.clone()], BufferRole::Input);
        let w1 = buffer(&mut kg, "w1", vec![c8.clone()], BufferRole::Temp);
        let table = buffer(&mut kg, "table", vec![c8.clone()], BufferRole::Temp);
        let wide = buffer(&mut kg, "wide", vec![t.clone(), c8.clone()], BufferRole::Temp);
        let out = buffer(&mut kg, "out", vec![t, c8.clone()], BufferRole::Output);
        let shown = buffer(&mut kg, "shown", vec![c8], BufferRole::Output);
        kg.inputs = vec![w, x];
        kg.outputs = vec![out, shown];
        kernel(&mut kg, &[w], &[w1]); // 1 + w: load-time once w is fixed
        kernel(&mut kg, &[], &[table]); // a table from iota: always
        kernel(&mut kg, &[w], &[wide]); // a broadcast over T: its launch needs T
        kernel(&mut kg, &[x, w1, table, wide], &[out]); // per step
        kernel(&mut kg, &[w1], &[shown]); // writes a graph output
        assert_eq!(kg.load_time_kernels(|b| b == w), [true, true, false, false, false]);
        assert_eq!(kg.load_time_kernels(|_| false), [false, true, false, false, false]);
    }
}
