//! A whole lowered [`KernelGraph`] on the emulator: every kernel compiled to LLVM IR for a
//! target ([`compile_ir`]) and run in launch order ([`run_graph`]) over host buffers laid
//! out as the runtime's executor lays out device buffers.
//!
//! Buffers mirror `sinter_runtime::Executor`: the graph's inputs are written contiguously
//! from the caller's tensors; every other buffer is allocated on first use with the bytes its
//! layout spans (`1 + Σ (size_i − 1)·stride_i` elements), its base 256-byte aligned; an output
//! of a `kv_append` (in a KvAppend kernel or a fused epilogue) shares the storage of its page
//! input ([`in_place_aliases`], the runtime's rule), so the update happens in place; outputs
//! are read back contiguously from their buffer's start. Symbols are bound from the inputs'
//! bare-symbol dims, then from the caller's bindings.
//!
//! Checks the runtime cannot make cheaply: each storage sits between [`GUARD_BYTES`] guard
//! bytes on both sides, filled with [`GUARD_PATTERN`] and checked after every kernel (the
//! first changed byte is reported with the kernel, the buffer and its offset); and a kernel
//! that changes a storage it does not write (one that is neither its output nor aliased by
//! one) is reported. Temporaries and outputs start filled with `0xFF` bytes (NaN for the
//! float dtypes), so a result a kernel forgets to write shows.
//!
//! A kernel the emulator cannot run (a TMA or inline-`wgmma` kernel of sm_90a) panics
//! inside the emulator; [`run_graph`] reports that panic as [`GraphRunError::Emulator`].

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, Buffer, BufferData, DType, Family, Kernel, KernelGraph, LaunchPlan, Target};

use crate::error::CodegenError;
use crate::isa::capture_ir;
use crate::isa::kit::EMIT_IR;

/// Bytes of guard on each side of every storage.
pub const GUARD_BYTES: usize = 1 << 20;
/// The byte the guards are filled with.
pub const GUARD_PATTERN: u8 = 0xA5;
/// Alignment of every storage's first byte, as the runtime's pool.
const ALIGN: usize = 256;

/// Why a graph did not run to the end on the emulator.
#[derive(Debug, thiserror::Error)]
pub enum GraphRunError {
    /// The code generator refused or failed on a kernel.
    #[error("kernel {kernel} ({family:?}): code generation failed: {error}")]
    Codegen {
        /// The kernel.
        kernel: Kernel,
        /// Its family.
        family: Family,
        /// The generator's error.
        error: CodegenError,
    },
    /// The inputs do not fit the graph (count, dtype, shape) or a size cannot be evaluated.
    #[error("inputs: {0}")]
    Input(String),
    /// A kernel wrote into the guard bytes around a storage.
    #[error("kernel {kernel} (`{entry}`) wrote {bytes} byte(s) {side} buffer {buffer}: first at byte offset {offset} from the buffer's start (the buffer holds {len} bytes)")]
    OutOfBounds {
        /// The kernel.
        kernel: Kernel,
        /// Its entry point.
        entry: String,
        /// The buffer (the storage root of aliased buffers), with its name if it has one.
        buffer: String,
        /// `before` or `after`.
        side: &'static str,
        /// Offset of the first changed guard byte from the buffer's first byte (negative
        /// before it).
        offset: isize,
        /// Changed guard bytes on that side.
        bytes: usize,
        /// The buffer's bytes.
        len: usize,
    },
    /// A kernel changed a buffer it does not write.
    #[error("kernel {kernel} (`{entry}`) changed buffer {buffer}, which is not one of its outputs")]
    ForeignWrite {
        /// The kernel.
        kernel: Kernel,
        /// Its entry point.
        entry: String,
        /// The buffer, with its name if it has one.
        buffer: String,
    },
    /// The emulator panicked while running a kernel (a kernel it cannot run, an unbound
    /// size, or a failed internal check).
    #[error("kernel {kernel} (`{entry}`): the emulator failed: {message}")]
    Emulator {
        /// The kernel.
        kernel: Kernel,
        /// Its entry point.
        entry: String,
        /// The panic's message.
        message: String,
    },
}

/// Kernel `k` of `kg` compiled for `target` as the emulator runs it: the plan's `ptx` holds
/// the kernel's LLVM IR (as built, before the NVPTX back end).
///
/// # Errors
/// As [`crate::compile_kernel`].
pub fn compile_ir(kg: &KernelGraph, k: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    // Kernels built with the kit return their IR under `EMIT_IR`; the others finish their
    // module (to PTX), whose IR `capture_ir` keeps.
    EMIT_IR.with(|f| f.set(true));
    let (plan, irs) = capture_ir(|| catch_unwind(AssertUnwindSafe(|| crate::compile_kernel(kg, k, target))));
    EMIT_IR.with(|f| f.set(false));
    let mut plan = plan.unwrap_or_else(|p| Err(CodegenError::Builder(format!("the code generator panicked: {}", panic_text(&*p)))))?;
    if !plan.ptx.contains("define ") {
        plan.ptx = irs.last().cloned().ok_or_else(|| CodegenError::Builder(format!("kernel {k}: no LLVM IR captured")))?;
    }
    Ok(plan)
}

/// Every kernel of `kg` compiled with [`compile_ir`], in launch order.
///
/// # Errors
/// [`GraphRunError::Codegen`] for the first kernel that fails.
pub fn compile_plans(kg: &KernelGraph, target: &Target) -> Result<Vec<LaunchPlan>, GraphRunError> {
    kg.kernels.iter().map(|(k, d)| compile_ir(kg, k, target).map_err(|error| GraphRunError::Codegen { kernel: k, family: d.family, error })).collect()
}

/// The in-place updates of `kg`: each output of a kernel that is a `kv_append` result → the
/// storage root of the page input it updates (the runtime executor's rule; chains resolve to
/// the first buffer).
pub fn in_place_aliases(kg: &KernelGraph) -> BTreeMap<Buffer, Buffer> {
    kg.in_place_aliases()
}

/// One storage: guard, (alignment padding), data, guard.
pub(super) struct Storage {
    bytes: Vec<u8>,
    /// Offset of the data's first byte in `bytes`.
    start: usize,
    /// Data bytes.
    len: usize,
}

impl Storage {
    pub(super) fn new(data: &[u8], len: usize, fill: u8) -> Storage {
        let mut bytes = vec![GUARD_PATTERN; GUARD_BYTES + ALIGN + len + GUARD_BYTES];
        let base = bytes.as_ptr() as usize;
        let start = (base + GUARD_BYTES).div_ceil(ALIGN) * ALIGN - base;
        bytes[start..start + len].fill(fill);
        let n = data.len().min(len);
        bytes[start..start + n].copy_from_slice(&data[..n]);
        // The padding between the aligned start and the fixed guard counts as guard too.
        Storage { bytes, start, len }
    }

    pub(super) fn addr(&mut self) -> u64 {
        // SAFETY: `start ≤ bytes.len()` by construction.
        unsafe { self.bytes.as_mut_ptr().add(self.start) as u64 }
    }

    pub(super) fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    /// The first changed guard byte before and after the data: `(side, offset, changed)`.
    pub(super) fn guard_violation(&self) -> Option<(&'static str, isize, usize)> {
        let before = &self.bytes[..self.start];
        let after = &self.bytes[self.start + self.len..];
        // Whole-slice comparisons first (a `memcmp`), the byte scan only on a change.
        let clean = |s: &[u8]| s.chunks(GUARD_BYTES).all(|c| c == &GUARD_FILL[..c.len()]);
        if !clean(before) {
            let i = before.iter().position(|&b| b != GUARD_PATTERN).unwrap_or(0);
            let n = before.iter().filter(|&&b| b != GUARD_PATTERN).count();
            return Some(("before", i as isize - self.start as isize, n));
        }
        if !clean(after) {
            let i = after.iter().position(|&b| b != GUARD_PATTERN).unwrap_or(0);
            let n = after.iter().filter(|&&b| b != GUARD_PATTERN).count();
            return Some(("after", (self.len + i) as isize, n));
        }
        None
    }
}

/// One guard's worth of the pattern, to compare guards with.
static GUARD_FILL: [u8; GUARD_BYTES] = [GUARD_PATTERN; GUARD_BYTES];

/// Runs `kg` (compiled with [`compile_plans`] for the emulator) on `inputs` (one tensor per
/// `kg.inputs` buffer, in order) and returns the tensors of `kg.outputs`, in order.
///
/// # Errors
/// [`GraphRunError::Input`] when the inputs do not fit; [`GraphRunError::OutOfBounds`] and
/// [`GraphRunError::ForeignWrite`] for the first kernel that writes outside its outputs;
/// [`GraphRunError::Emulator`] when the emulator fails on a kernel.
pub fn run_plans(kg: &KernelGraph, plans: &[LaunchPlan], inputs: &[&Tensor], extra: &Bindings) -> Result<Vec<Tensor>, GraphRunError> {
    if plans.len() != kg.kernels.len() {
        return Err(GraphRunError::Input(format!("{} plans for {} kernels", plans.len(), kg.kernels.len())));
    }
    let bindings = bind(kg, inputs, extra)?;
    let aliases = in_place_aliases(kg);
    let root = |b: Buffer| aliases.get(&b).copied().unwrap_or(b);
    let mut store: BTreeMap<Buffer, Storage> = BTreeMap::new();
    for (b, t) in kg.inputs.iter().zip(inputs) {
        let len = extent(&kg.buffers[*b], &bindings, *b)?;
        store.insert(*b, Storage::new(&tensor_bytes(t), len, 0));
    }
    for (i, (k, data)) in kg.kernels.iter().enumerate() {
        let plan = &plans[i];
        let mut written: BTreeSet<Buffer> = BTreeSet::new();
        for b in data.inputs.iter().chain(&data.outputs) {
            let r = root(*b);
            if !store.contains_key(&r) {
                let len = extent(&kg.buffers[r], &bindings, r)?;
                store.insert(r, Storage::new(&[], len, 0xFF));
            }
        }
        // A kernel with nothing to compute is not launched, as in the runtime.
        if !kg.has_work(k, plan, &bindings).map_err(|e| GraphRunError::Input(format!("kernel {k}: {e}")))? {
            continue;
        }
        for b in &data.outputs {
            written.insert(root(*b));
        }
        let before: BTreeMap<Buffer, Vec<u8>> = store.iter().filter(|(b, _)| !written.contains(b)).map(|(b, s)| (*b, s.data().to_vec())).collect();
        let addrs: Vec<u64> = data.inputs.iter().chain(&data.outputs).map(|b| store.get_mut(&root(*b)).map_or(0, Storage::addr)).collect();
        catch_unwind(AssertUnwindSafe(|| super::run_at(plan, &bindings, &addrs))).map_err(|p| GraphRunError::Emulator { kernel: k, entry: plan.entry.clone(), message: panic_text(&*p) })?;
        for (b, s) in &store {
            if let Some((side, offset, bytes)) = s.guard_violation() {
                return Err(GraphRunError::OutOfBounds { kernel: k, entry: plan.entry.clone(), buffer: label(kg, *b), side, offset, bytes, len: s.len });
            }
            if before.get(b).is_some_and(|old| old.as_slice() != s.data()) {
                return Err(GraphRunError::ForeignWrite { kernel: k, entry: plan.entry.clone(), buffer: label(kg, *b) });
            }
        }
    }
    kg.outputs
        .iter()
        .map(|b| {
            let s = store.get(&root(*b)).ok_or_else(|| GraphRunError::Input(format!("output {b} is never written")))?;
            let ty = &kg.buffers[*b].ty;
            let shape = eval_shape(kg, *b, &bindings)?;
            tensor_from_bytes(ty.dtype, &shape, s.data())
        })
        .collect()
}

/// [`compile_plans`] then [`run_plans`].
///
/// # Errors
/// As both.
pub fn run_graph(kg: &KernelGraph, target: &Target, inputs: &[&Tensor], extra: &Bindings) -> Result<Vec<Tensor>, GraphRunError> {
    let plans = compile_plans(kg, target)?;
    run_plans(kg, &plans, inputs, extra)
}

/// `extra` plus the bindings of the inputs' bare-symbol dims, every input checked against
/// its buffer's dtype and shape (the runtime executor's rule).
pub(super) fn bind(kg: &KernelGraph, inputs: &[&Tensor], extra: &Bindings) -> Result<Bindings, GraphRunError> {
    if inputs.len() != kg.inputs.len() {
        return Err(GraphRunError::Input(format!("{} inputs given, the graph takes {}", inputs.len(), kg.inputs.len())));
    }
    let mut bindings = extra.clone();
    for (b, t) in kg.inputs.iter().zip(inputs) {
        let ty = &kg.buffers[*b].ty;
        if t.dtype() != ty.dtype || t.shape().len() != ty.shape.len() {
            return Err(GraphRunError::Input(format!("input {} is {}{:?}, the graph expects {ty}", label(kg, *b), t.dtype(), t.shape())));
        }
        for (d, &n) in ty.shape.iter().zip(t.shape()) {
            if let Some(s) = d.as_symbol() {
                bindings.entry(s.to_string()).or_insert(n as i64);
            }
        }
    }
    for (b, t) in kg.inputs.iter().zip(inputs) {
        if eval_shape(kg, *b, &bindings)? != t.shape() {
            return Err(GraphRunError::Input(format!("input {} has shape {:?}, the graph expects {}", label(kg, *b), t.shape(), kg.buffers[*b].ty)));
        }
    }
    Ok(bindings)
}

pub(super) fn eval_shape(kg: &KernelGraph, b: Buffer, bindings: &Bindings) -> Result<Vec<usize>, GraphRunError> {
    kg.buffers[b]
        .ty
        .shape
        .iter()
        .map(|d| {
            let v = d.eval(bindings).map_err(|e| GraphRunError::Input(format!("a dim of buffer {}: {e}", label(kg, b))))?;
            usize::try_from(v).map_err(|_| GraphRunError::Input(format!("buffer {} has a dim {v} < 0", label(kg, b))))
        })
        .collect()
}

/// Bytes a buffer's layout spans under `bindings` (the runtime's `extent_bytes`).
pub(super) fn extent(data: &BufferData, bindings: &Bindings, b: Buffer) -> Result<usize, GraphRunError> {
    let bad = |m: String| GraphRunError::Input(format!("buffer {b}: {m}"));
    let shape: Vec<usize> =
        data.ty.shape.iter().map(|d| d.eval(bindings).map_err(|e| bad(e.to_string())).and_then(|v| usize::try_from(v).map_err(|_| bad(format!("dim {v} < 0"))))).collect::<Result<_, _>>()?;
    let numel: usize = shape.iter().product();
    let mut elems = numel;
    if numel > 0 && data.layout.strides.len() == shape.len() {
        let mut span = 1usize;
        for (s, &d) in data.layout.strides.iter().zip(&shape) {
            let s = s.eval(bindings).map_err(|e| bad(e.to_string()))?;
            span += (d - 1) * usize::try_from(s).map_err(|_| bad("a negative stride".into()))?;
        }
        elems = elems.max(span);
    }
    data.ty.dtype.storage_bytes(elems).ok_or_else(|| bad("the extent overflows".into()))
}

pub(super) fn label(kg: &KernelGraph, b: Buffer) -> String {
    match &kg.buffers[b].name {
        Some(n) => format!("{b} `{n}`"),
        None => b.to_string(),
    }
}

/// A tensor's bytes as a device buffer holds them (row-major, little-endian).
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    let mut v = super::to_bytes(t);
    v.truncate(t.dtype().storage_bytes(t.numel()).unwrap_or(0));
    v
}

/// The tensor of `dtype` and `shape` stored row-major at the start of `b`.
///
/// # Errors
/// [`GraphRunError::Input`] for a block-quantized dtype or too few bytes.
pub fn tensor_from_bytes(dtype: DType, shape: &[usize], b: &[u8]) -> Result<Tensor, GraphRunError> {
    let n: usize = shape.iter().product();
    let need = dtype.storage_bytes(n).unwrap_or(usize::MAX);
    if dtype.is_quantized() || need > b.len() {
        return Err(GraphRunError::Input(format!("cannot read {dtype}{shape:?} from {} bytes", b.len())));
    }
    let data = match dtype {
        DType::I32 => b.chunks_exact(4).take(n).map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        DType::I64 => b.chunks_exact(8).take(n).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64).collect(),
        DType::Bool => b[..n].iter().map(|&x| f64::from(u8::from(x != 0))).collect(),
        _ => super::from_bytes(dtype, b, n),
    };
    Tensor::new(dtype, shape, data).map_err(|e| GraphRunError::Input(e.to_string()))
}

pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "a panic".into())
}
