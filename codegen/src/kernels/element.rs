//! The element evaluator shared by the pointwise, layout, gather and row-reduction kernels:
//! it emits the LLVM IR that computes one value of a kernel body at one coordinate.
//!
//! A kernel body is an IR [`Function`]; a generator decides which output elements a thread
//! computes and hands the evaluator their coordinate ([`At`]). The evaluator walks the body's
//! DAG backwards from the value asked for, mapping the coordinate through each op to its
//! operands' coordinates —
//! - NumPy broadcasting (leading axes dropped, size-1 axes pinned to 0),
//! - `transpose`/`permute` (axes permuted), `slice` (offset), `reshape` (through the
//!   row-major linear index; the longest common suffix of the two shapes maps unchanged),
//!   `concat` (a branch per input), `gather` (the index is loaded, the table row follows),
//! - `rope` (the element's partner within the last axis),
//!
//! and loads the body's parameters from their buffers with their strides (any strides: a
//! broadcast input has stride 0, a transposed one is strided). Every op's result is rounded
//! to its dtype exactly where the unfused graph rounds (arithmetic in `f32`, then
//! `fptrunc`/`fpext` for `bf16`/`f16`), so a fused kernel matches the interpreter op by op.
//!
//! **Lanes.** A coordinate covers `lanes` consecutive elements along one axis (the *lane
//! axis*, [`Ax::step`]): values are vectors of per-lane scalars, and a load whose lane axis is
//! the buffer's contiguous innermost axis, at an offset proven to be a multiple of `lanes`, in
//! a buffer aligned enough, becomes one vector load (16 bytes for 8 `bf16`, 4 `f32`); any
//! other load is done lane by lane. Ops that cannot keep the lane structure (a gather whose
//! index varies per lane, a reshape that splits the lane group across rows) split the
//! coordinate into single lanes and evaluate each.
//!
//! **`f8e4m3`** (issue #8) is held as its byte (`Scalar::I` of an `i8`): loaded and stored as
//! stored (16 lanes are one 16-byte vector access where the offsets prove it aligned), moved
//! by the view ops and `select` unchanged; `quantize_fp8(x, s)` is `div.rn.f32` then the
//! saturating round-to-nearest-even conversion, `dequantize_fp8(x8, s)` the exact conversion
//! to f32, `mul.rn.f32` and the rounding to its dtype, `cast` goes through the exact f32 value
//! (and rounds once on the way in), an fp8 `constant` is its byte — all bit-exact with the
//! interpreter, with `cvt … e4m3x2` on sm_89+ and integer arithmetic on sm_80 ([`crate::fp8`]).
//!
//! **`bf16` as words.** A `bf16` input whose every use computes in f32 (see [`words_params`])
//! is loaded as `i32` words and split with `w << 16` and `w & 0xffff0000` (exact): one
//! instruction an element where `cvt.f32.bf16` of a high half costs two. An input that is
//! added, multiplied or copied keeps the `fpext` through which LLVM narrows `round(a·b)` to a
//! `bf16x2` multiply. A `layer_norm`'s intermediate rounding is done in pairs
//! (`cvt.rn.bf16x2.f32`, [`Eval::round_lanes`]).
//!
//! **Staging.** The cluster schedule of `reduce.rs` reads a CTA's slice of a row once from
//! global memory and keeps it in shared memory for the later passes: a load of a staged row
//! input at the current chunk's own coordinate is stored there by the first pass and read
//! from there by the others ([`Stage`]).
//!
//! **Memoisation.** Values are memoised per (value, coordinate), so a DAG shared by several
//! outputs or used twice is computed once; values computed inside a branch (`concat`,
//! `gather`) are forgotten after it, since they do not dominate the code that follows. RoPE's
//! sines and cosines are memoised per (pair, position), so the heads of one position that a
//! thread rotates share them.

use std::collections::HashMap;

use inkwell::types::{BasicTypeEnum, IntType};
use inkwell::values::{AsValueRef, BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{Attr, DType, Dim, Function, Node, OpKind, Value, ValueDef};

use crate::emit::{storage_type, KernelBuilder, SizeTable};
use crate::math::{self, Ops, R};
use crate::CodegenError;

/// Width of the index arithmetic of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexWidth {
    /// 32-bit: every size is a constant and every offset provably below 2³¹.
    I32,
    /// 64-bit: the default, required wherever a tensor may exceed 2³¹ elements (any symbolic
    /// size).
    I64,
}

/// A scalar of the body, already rounded to its value's dtype: floats as `f32` registers,
/// integers in their own width, `bool` as `i1`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar<'ctx> {
    /// A float dtype's value, as `f32`.
    F(FloatValue<'ctx>),
    /// An integer or bool value (`i32`, `i64`, `i1`).
    I(IntValue<'ctx>),
}

impl<'ctx> Scalar<'ctx> {
    pub(crate) fn f(self) -> R<FloatValue<'ctx>> {
        match self {
            Scalar::F(v) => Ok(v),
            Scalar::I(_) => Err(CodegenError::Builder("an integer where a float was expected".into())),
        }
    }
    pub(crate) fn i(self) -> R<IntValue<'ctx>> {
        match self {
            Scalar::I(v) => Ok(v),
            Scalar::F(_) => Err(CodegenError::Builder("a float where an integer was expected".into())),
        }
    }
    fn basic(self) -> BasicValueEnum<'ctx> {
        match self {
            Scalar::F(v) => v.as_basic_value_enum(),
            Scalar::I(v) => v.as_basic_value_enum(),
        }
    }
}

/// Per-lane scalars.
pub(crate) type Lanes<'ctx> = Vec<Scalar<'ctx>>;

/// Where an axis coordinate comes from, for the checks of row reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Tag {
    /// Exactly the coordinate of axis `i` of the reduction's row space.
    Ref(usize),
    /// Anything else.
    Other,
}

/// One axis of a coordinate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ax<'ctx> {
    /// Coordinate of lane 0 (index width).
    pub base: IntValue<'ctx>,
    /// The lane axis: lane `l` is at `base + l`. Otherwise every lane is at `base`.
    pub step: bool,
    /// `base` is a multiple of the lane count (always true for one lane).
    pub aligned: bool,
    /// `base` is the constant 0.
    pub zero: bool,
    /// Provenance.
    pub tag: Tag,
}

/// A coordinate: one [`Ax`] per axis of the value evaluated, covering `lanes` elements.
#[derive(Clone, Debug)]
pub(crate) struct At<'ctx> {
    pub axes: Vec<Ax<'ctx>>,
    pub lanes: u32,
}

type Key = (Value, u32, Vec<(usize, bool)>);
type DerivedKey = (Node, u8, Vec<(usize, bool)>, u32);
/// RoPE's `(sin, cos)` of one pair: (inverse-frequency table, the pair index's base value,
/// the lane offset from it, the position value), values by their LLVM identity.
type SincosKey = (usize, usize, u32, usize);
type Memo<'ctx> = (HashMap<Key, Lanes<'ctx>>, HashMap<DerivedKey, Lanes<'ctx>>, HashMap<SincosKey, (FloatValue<'ctx>, FloatValue<'ctx>)>);
/// One arm of a branch: evaluates lanes in its own block.
type Arm<'e, 'ctx> = Box<dyn FnOnce(&mut Eval<'_, 'ctx>) -> R<Lanes<'ctx>> + 'e>;
/// A buffer offset: the uniform part, the lane axes with their strides, and whether the
/// uniform part is provably a multiple of the lane count.
type Offsets<'ctx> = (IntValue<'ctx>, Vec<(Ax<'ctx>, Dim)>, bool);

/// One buffer of the kernel as the evaluator reads or writes it.
#[derive(Clone, Debug)]
pub(crate) struct Buf<'ctx> {
    pub ptr: PointerValue<'ctx>,
    pub dtype: DType,
    /// Strides in elements, one per axis of the (effective) shape.
    pub strides: Vec<Dim>,
    /// Base alignment in bytes.
    pub align: u32,
}

/// The row statistics of one row-reduction node, once computed (set by the row-reduction
/// generator; see `reduce.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowScalars<'ctx> {
    /// `reduce_*`: the row's result, rounded to the dtype.
    Reduce(Scalar<'ctx>),
    /// `softmax`/`log_softmax` after the max pass: `m_safe`, the row max, or 0 when the row
    /// is all −inf (so that `exp(x − m_safe)` is 0 there, not NaN).
    SoftmaxMax { m_safe: FloatValue<'ctx> },
    /// `softmax`/`log_softmax`, complete.
    Softmax {
        /// See [`RowScalars::SoftmaxMax`].
        m_safe: FloatValue<'ctx>,
        /// The row max (NaN-propagating), −inf for an all −inf row.
        m: FloatValue<'ctx>,
        /// `1/Σ e` (NaN if the max is NaN); only read when the row is not all −inf.
        inv_s: FloatValue<'ctx>,
        /// `log Σ e`.
        log_s: FloatValue<'ctx>,
        /// The row is all −inf (`m == −inf`).
        all_neg_inf: IntValue<'ctx>,
    },
    /// `rms_norm`: `r = 1/√(mean(x²) + eps)`.
    RmsNorm { r: FloatValue<'ctx> },
    /// `layer_norm` after the mean pass.
    LayerNormMean { mean: FloatValue<'ctx> },
    /// `layer_norm`, complete: the row mean is `mean + d` (`mean` the first pass's, `d` the
    /// second pass's correction), `r = 1/√(var + eps)`.
    LayerNorm { mean: FloatValue<'ctx>, d: FloatValue<'ctx>, r: FloatValue<'ctx> },
}

/// The evaluator: emits IR computing body values at coordinates.
pub(crate) struct Eval<'a, 'ctx> {
    pub kb: &'a mut KernelBuilder<'ctx>,
    pub sizes: &'a mut SizeTable<'ctx>,
    pub f: &'a Function,
    /// Buffers of the body's parameters, by parameter position.
    pub params: Vec<Buf<'ctx>>,
    /// The shape each value is evaluated in (the value's type, or a flattened view).
    pub shapes: HashMap<Value, Vec<Dim>>,
    pub width: IndexWidth,
    /// Row statistics of row-reduction nodes (empty outside row reductions).
    pub rows: HashMap<Node, RowScalars<'ctx>>,
    memo: HashMap<Key, Lanes<'ctx>>,
    derived: HashMap<DerivedKey, Lanes<'ctx>>,
    /// RoPE angles already computed (see [`Eval::rope`]): a thread that rotates several heads
    /// of one position computes each pair's sine and cosine once.
    sincos: HashMap<SincosKey, (FloatValue<'ctx>, FloatValue<'ctx>)>,
    rope_tables: HashMap<(u64, i64), PointerValue<'ctx>>,
    /// Set by a generator that maps a thread to both halves of a rotate-half RoPE's last axis
    /// (see [`RopePair`]).
    pub rope_pair: Option<RopePair<'ctx>>,
    /// Parameters whose `bf16` vector loads are decoded as `i32` words (see
    /// [`words_params`]).
    pub bf16_words: std::collections::HashSet<usize>,
    /// Round `layer_norm`'s intermediate `bf16` values in pairs (see [`Eval::round_lanes`]).
    pub pair_rounding: bool,
    /// A `bf16` `layer_norm`'s last step, `round(h·w + b)`, as one `fma.rn.bf16x2` a pair
    /// (`llvm.fma.v2bf16`; PTX ISA §9.7.4.6, sm_80+) on the rounded `h` and the weight and
    /// bias as loaded (their parameters then not read as words, see [`words_params`]): the
    /// product and sum rounded once to `bf16`, where the f32 `fma` rounds to f32 and then to
    /// `bf16` — equal but for the rare double-rounding ties (one `bf16` ulp), for a quarter of
    /// the instructions.
    pub ln_bf16_fma: bool,
    /// Shared-memory staging of row-varying parameters (the cluster schedule of
    /// `reduce.rs`); `None` elsewhere.
    pub stage: Option<Stage<'ctx>>,
    /// Parameters' vectors the generator loaded ahead at a chunk whose last axis has the given
    /// base (an SSA value of that chunk alone, as [`Eval::load_vector`] returned them): a load
    /// of the parameter there takes the vector instead of reading memory (a LayerNorm's row
    /// head, loaded before the slice's copies: `reduce.rs`'s `RowSchedule::head_shift`).
    pub pinned: Vec<(usize, IntValue<'ctx>, inkwell::values::VectorValue<'ctx>)>,
    /// Depth of [`Eval::branch`] arms being emitted (no staging inside a branch).
    branch_depth: u32,
}

/// Shared-memory staging of a row reduction's row-varying parameters (the cluster schedule of
/// `reduce.rs`): the first pass over a CTA's slice of the row loads each such parameter from
/// global memory and also stores it, as loaded, into a shared-memory array (*fills*); later
/// passes (statistics of deeper levels, the outputs) read it from there. A load is staged
/// only at the current chunk's own coordinate (the row's lead coordinates and the chunk's
/// column, [`Stage::cursor`]), outside any branch; any other load reads global memory.
pub(crate) struct Stage<'ctx> {
    /// The staged parameters: parameter index → its array (`addrspace(3)`, storage type,
    /// 16-byte aligned, indexed by [`Stage::cursor`]'s slot).
    pub arrays: HashMap<usize, PointerValue<'ctx>>,
    /// Parameters filled by an earlier pass: read from shared memory.
    pub ready: std::collections::HashSet<usize>,
    /// Parameters filled during the current pass.
    pub filling: std::collections::HashSet<usize>,
    /// Whether the current pass may fill (the output pass does not: nothing reads after it).
    pub fill: bool,
    /// The current chunk: the base of its last (row) axis, as the coordinate carries it, and
    /// its element index in the arrays.
    pub cursor: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
    /// Elements per chunk.
    pub lanes: u32,
    /// Row-invariant parameters (shape `[1…, N]`) staged too: filled by the row's prefetch
    /// (while `resident_fill`), read by every pass after it at the chunk's own column
    /// ([`Tag::Ref`] of the row axis `row_axis`).
    pub resident: std::collections::HashSet<usize>,
    pub resident_fill: bool,
    pub row_axis: usize,
}

impl<'ctx> Stage<'ctx> {
    /// Ends a pass: what it filled is read from now on.
    pub fn end_pass(&mut self) {
        let filled: Vec<usize> = self.filling.drain().collect();
        self.ready.extend(filled);
        self.cursor = None;
    }
}

/// A load as it came from memory: one vector (of the storage type, or of `i32` words for
/// `bf16` read as words), or one storage value per lane (a single value: every lane reads
/// it).
enum Raw<'ctx> {
    Vector(inkwell::values::VectorValue<'ctx>),
    Lanes(Vec<BasicValueEnum<'ctx>>),
    /// Already decoded (a lane-by-lane load that nothing stages).
    Decoded(Lanes<'ctx>),
}

/// A hint from the generator: the coordinate `first` of the last axis (of length `d`) is in
/// the first half (`first < d/2`), and `second = first + d/2` is evaluated next in the same
/// group. A rotate-half `rope` evaluated at `first` then computes both halves with one
/// sine/cosine per pair (each half is the other's partner) and memoises the second.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopePair<'ctx> {
    pub first: IntValue<'ctx>,
    pub second: IntValue<'ctx>,
    pub d: i64,
}

/// Whether `d` is provably a multiple of `k`.
pub(crate) fn divisible(d: &Dim, k: u32) -> bool {
    k <= 1 || d.div_exact(i64::from(k)).is_some()
}

fn unsupported<T>(msg: impl Into<String>) -> R<T> {
    Err(CodegenError::Unsupported { kernel: String::new(), message: msg.into() })
}

fn bad<T>(msg: impl Into<String>) -> R<T> {
    Err(CodegenError::BadKernel { kernel: String::new(), message: msg.into() })
}

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// An evaluator for body `f` with its parameters' buffers.
    pub fn new(kb: &'a mut KernelBuilder<'ctx>, sizes: &'a mut SizeTable<'ctx>, f: &'a Function, params: Vec<Buf<'ctx>>, width: IndexWidth) -> Self {
        let shapes = f.values.iter().map(|(v, d)| (v, d.ty.shape.clone())).collect();
        Eval {
            kb,
            sizes,
            f,
            params,
            shapes,
            width,
            rows: HashMap::new(),
            memo: HashMap::new(),
            derived: HashMap::new(),
            sincos: HashMap::new(),
            rope_tables: HashMap::new(),
            rope_pair: None,
            bf16_words: std::collections::HashSet::new(),
            pair_rounding: false,
            ln_bf16_fma: false,
            stage: None,
            pinned: Vec::new(),
            branch_depth: 0,
        }
    }

    /// Forgets every memoised value (their SSA values may no longer dominate).
    pub fn forget(&mut self) {
        self.memo.clear();
        self.derived.clear();
        self.sincos.clear();
    }

    fn snapshot(&self) -> Memo<'ctx> {
        (self.memo.clone(), self.derived.clone(), self.sincos.clone())
    }

    fn restore(&mut self, s: Memo<'ctx>) {
        self.memo = s.0;
        self.derived = s.1;
        self.sincos = s.2;
    }

    // ----- index arithmetic ---------------------------------------------------------------

    /// The index type.
    pub fn ity(&self) -> IntType<'ctx> {
        match self.width {
            IndexWidth::I32 => self.kb.cx.i32_type(),
            IndexWidth::I64 => self.kb.cx.i64_type(),
        }
    }

    /// An index constant.
    pub fn ic(&self, v: i64) -> IntValue<'ctx> {
        self.ity().const_int(v as u64, true)
    }

    /// The value of a dim, as an index.
    pub fn dim(&mut self, d: &Dim) -> R<IntValue<'ctx>> {
        self.sizes.get(self.kb, d)
    }

    pub fn iadd(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_add(a, b, "ix")?)
    }
    pub fn isub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_sub(a, b, "ix")?)
    }
    pub fn imul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_mul(a, b, "ix")?)
    }
    pub fn idiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_unsigned_div(a, b, "ix")?)
    }
    pub fn irem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_unsigned_rem(a, b, "ix")?)
    }
    pub fn ilt(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_compare(IntPredicate::SLT, a, b, "lt")?)
    }

    /// An in-range `i64` (or `i32`) as an index of this kernel's width.
    pub fn to_index(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let t = self.ity();
        Ok(if v.get_type() == t {
            v
        } else if v.get_type().get_bit_width() > t.get_bit_width() {
            self.kb.b.build_int_truncate(v, t, "ix")?
        } else {
            self.kb.b.build_int_s_extend(v, t, "ix")?
        })
    }

    /// An axis pinned to 0.
    pub fn zero_ax(&self) -> Ax<'ctx> {
        Ax { base: self.ic(0), step: false, aligned: true, zero: true, tag: Tag::Other }
    }

    /// A uniform axis at `v`.
    pub fn uniform_ax(&self, v: IntValue<'ctx>) -> Ax<'ctx> {
        Ax { base: v, step: false, aligned: false, zero: false, tag: Tag::Other }
    }

    fn key(v: Value, at: &At<'ctx>) -> Key {
        (v, at.lanes, at.axes.iter().map(|a| (a.base.as_value_ref() as usize, a.step)).collect())
    }

    /// `at` split into single lanes.
    pub fn split(&self, at: &At<'ctx>) -> R<Vec<At<'ctx>>> {
        let mut out = Vec::with_capacity(at.lanes as usize);
        for l in 0..at.lanes {
            let mut axes = Vec::with_capacity(at.axes.len());
            for a in &at.axes {
                if a.step && l > 0 {
                    let base = self.iadd(a.base, self.ic(i64::from(l)))?;
                    axes.push(Ax { base, step: false, aligned: true, zero: false, tag: Tag::Other });
                } else {
                    axes.push(Ax { step: false, aligned: true, ..*a });
                }
            }
            out.push(At { axes, lanes: 1 });
        }
        Ok(out)
    }

    fn per_lane(&mut self, v: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let mut out = Vec::with_capacity(at.lanes as usize);
        for one in self.split(at)? {
            out.extend(self.eval(v, &one)?);
        }
        Ok(out)
    }

    /// Maps a coordinate of a value of shape `from` to an operand of shape `to` by NumPy
    /// broadcasting (right-aligned; a size-1 operand axis is pinned to 0).
    pub fn broadcast_at(&self, at: &At<'ctx>, from: &[Dim], to: &[Dim]) -> R<At<'ctx>> {
        if to.len() > from.len() || at.axes.len() != from.len() {
            return bad(format!("cannot broadcast a value of shape {to:?} to {from:?}"));
        }
        let off = from.len() - to.len();
        let mut axes = Vec::with_capacity(to.len());
        for (i, d) in to.iter().enumerate() {
            if d.is_one() && !from[off + i].is_one() {
                axes.push(self.zero_ax());
            } else {
                axes.push(at.axes[off + i]);
            }
        }
        Ok(At { axes, lanes: at.lanes })
    }

    fn shape(&self, v: Value) -> R<Vec<Dim>> {
        self.shapes.get(&v).cloned().ok_or_else(|| CodegenError::Builder(format!("no shape for {v}")))
    }

    fn dtype(&self, v: Value) -> R<DType> {
        self.f.values.get(v).map(|d| d.ty.dtype).ok_or_else(|| CodegenError::Builder(format!("no value {v}")))
    }

    // ----- memory ------------------------------------------------------------------------

    /// The element offset of `at` in a buffer with `strides`: the uniform part, and the lane
    /// axis's base and stride if there is one lane axis. `aligned`: the uniform part is a
    /// provable multiple of the lane count.
    fn offsets(&mut self, strides: &[Dim], at: &At<'ctx>) -> R<Offsets<'ctx>> {
        if strides.len() != at.axes.len() {
            return bad(format!("a coordinate of rank {} for a buffer of rank {}", at.axes.len(), strides.len()));
        }
        let mut off = self.ic(0);
        let mut aligned = true;
        let mut steps = Vec::new();
        for (a, s) in at.axes.iter().zip(strides) {
            if a.zero || s.as_const() == Some(0) {
                continue;
            }
            if a.step && at.lanes > 1 {
                steps.push((*a, s.clone()));
                if !(a.aligned || divisible(s, at.lanes)) {
                    aligned = false;
                }
                let sv = self.dim(s)?;
                let t = self.imul(a.base, sv)?;
                off = self.iadd(off, t)?;
                continue;
            }
            if !(a.aligned || divisible(s, at.lanes)) {
                aligned = false;
            }
            let sv = self.dim(s)?;
            let t = self.imul(a.base, sv)?;
            off = self.iadd(off, t)?;
        }
        Ok((off, steps, aligned))
    }

    /// Loads `at` from `buf`: one vector load when the lane axis is contiguous and aligned,
    /// else lane by lane (one load, splat, when every lane reads the same element). Returns
    /// the memory access, not yet decoded ([`Eval::decode_raw`]; `words`: a `bf16` vector as
    /// `i32` words, see [`words_params`]).
    fn load_raw(&mut self, buf: &Buf<'ctx>, at: &At<'ctx>, words: bool, keep_raw: bool) -> R<Raw<'ctx>> {
        let (off, steps, aligned) = self.offsets(&buf.strides, at)?;
        let st = storage_type(self.kb.cx, buf.dtype);
        let size = buf.dtype.size_bytes() as u32;
        let lanes = at.lanes;
        if steps.is_empty() || lanes == 1 {
            let p = self.kb.gep(st, buf.ptr, off)?;
            let v = self.kb.load(st, p, size.min(buf.align.max(1)))?;
            return Ok(Raw::Lanes(vec![v]));
        }
        let unit = steps.len() == 1 && steps[0].1.as_const() == Some(1);
        let vbytes = lanes * size;
        if unit && aligned && vbytes.is_power_of_two() && buf.align >= vbytes.min(16) {
            let vt = self.raw_vector_type(buf.dtype, lanes, words)?;
            let p = self.kb.gep(st, buf.ptr, off)?;
            let v = self.kb.load(vt.into(), p, vbytes.min(buf.align).min(64))?.into_vector_value();
            return Ok(Raw::Vector(v));
        }
        // Lane by lane: lane l is at off + l·(Σ lane-axis strides).
        let mut lane_stride = self.ic(0);
        for (_, s) in &steps {
            let sv = self.dim(s)?;
            lane_stride = self.iadd(lane_stride, sv)?;
        }
        let mut out = Vec::with_capacity(lanes as usize);
        let mut decoded = Vec::with_capacity(lanes as usize);
        for l in 0..lanes {
            let d = self.imul(lane_stride, self.ic(i64::from(l)))?;
            let o = self.iadd(off, d)?;
            let p = self.kb.gep(st, buf.ptr, o)?;
            let v = self.kb.load(st, p, size.min(buf.align.max(1)))?;
            if keep_raw {
                out.push(v);
            } else {
                decoded.push(self.decode_storage(buf.dtype, v)?);
            }
        }
        Ok(if keep_raw { Raw::Lanes(out) } else { Raw::Decoded(decoded) })
    }

    /// The vector type a vector load of `lanes` elements of `dtype` uses: `i32` words for
    /// `bf16` read as words, else the storage type.
    fn raw_vector_type(&self, dtype: DType, lanes: u32, words: bool) -> R<inkwell::types::VectorType<'ctx>> {
        if words && dtype == DType::BF16 && lanes % 2 == 0 {
            Ok(self.kb.cx.i32_type().vec_type(lanes / 2))
        } else {
            storage_type(self.kb.cx, dtype).vec_type_of(lanes)
        }
    }

    /// Decodes a load into `lanes` scalars.
    fn decode_raw(&self, dtype: DType, raw: Raw<'ctx>, lanes: u32) -> R<Lanes<'ctx>> {
        match raw {
            Raw::Lanes(v) if v.len() == 1 => Ok(vec![self.decode_storage(dtype, v[0])?; lanes as usize]),
            Raw::Lanes(v) => v.into_iter().map(|e| self.decode_storage(dtype, e)).collect(),
            Raw::Decoded(v) => Ok(v),
            Raw::Vector(v) => {
                let n = v.get_type().get_size();
                let words = v.get_type().get_element_type().is_int_type() && dtype == DType::BF16;
                let mut out = Vec::with_capacity(lanes as usize);
                let f32t = self.kb.cx.f32_type();
                for i in 0..n {
                    let e = self.kb.b.build_extract_element(v, self.kb.i32c(i64::from(i)), "e")?;
                    if words {
                        let w = e.into_int_value();
                        let lo = self.kb.b.build_left_shift(w, self.kb.i32c(16), "lo")?;
                        let hi = self.kb.b.build_and(w, self.kb.i32c(-65536), "hi")?;
                        out.push(Scalar::F(self.kb.b.build_bit_cast(lo, f32t, "lo")?.into_float_value()));
                        out.push(Scalar::F(self.kb.b.build_bit_cast(hi, f32t, "hi")?.into_float_value()));
                    } else {
                        out.push(self.decode_storage(dtype, e)?);
                    }
                }
                if out.len() != lanes as usize {
                    return Err(CodegenError::Builder(format!("{} lanes decoded for {lanes}", out.len())));
                }
                Ok(out)
            }
        }
    }

    /// Whether parameter `i` read at `at` is staged ([`Stage`]): `Some(true)` to read it
    /// from shared memory, `Some(false)` to load and fill, `None` for a plain load.
    fn staged(&self, i: usize, at: &At<'ctx>) -> Option<bool> {
        let st = self.stage.as_ref()?;
        let (base, _) = st.cursor?;
        if self.branch_depth > 0 || !st.arrays.contains_key(&i) || at.lanes != st.lanes {
            return None;
        }
        let k = at.axes.len().checked_sub(1)?;
        let last = at.axes[k];
        if st.resident.contains(&i) {
            let own = last.tag == Tag::Ref(st.row_axis) && last.base.as_value_ref() == base.as_value_ref() && at.axes[..k].iter().all(|a| a.zero);
            return own.then_some(!st.resident_fill);
        }
        let own = at.axes[..k].iter().enumerate().all(|(a, ax)| ax.tag == Tag::Ref(a))
            && last.tag == Tag::Ref(k)
            && last.base.as_value_ref() == base.as_value_ref();
        if !own {
            return None;
        }
        if st.ready.contains(&i) {
            Some(true)
        } else if st.fill {
            Some(false)
        } else {
            None
        }
    }

    /// The address of the current chunk's slot ([`Stage::cursor`]) in parameter `i`'s stage
    /// array (elements of `dtype`'s storage type).
    fn stage_slot(&self, i: usize, dtype: DType) -> R<PointerValue<'ctx>> {
        let st = self.stage.as_ref().ok_or_else(|| CodegenError::Builder("no stage".into()))?;
        let arr = st.arrays.get(&i).copied().ok_or_else(|| CodegenError::Builder("no stage array".into()))?;
        let (_, slot) = st.cursor.ok_or_else(|| CodegenError::Builder("no stage cursor".into()))?;
        self.kb.gep(storage_type(self.kb.cx, dtype), arr, slot)
    }

    /// Parameter `i` at `at` as one vector load as it comes from memory (of the storage type,
    /// or of `i32` words for a `bf16` parameter read as words), bypassing the stage, for
    /// [`Eval::pinned`]: `None` (nothing emitted that is used) where `at` is not a contiguous,
    /// aligned vector of the buffer.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] for an unknown parameter.
    pub fn load_vector(&mut self, i: usize, at: &At<'ctx>) -> R<Option<inkwell::values::VectorValue<'ctx>>> {
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no parameter {i}")))?;
        let words = self.bf16_words.contains(&i);
        match self.load_raw(&buf, at, words, true)? {
            Raw::Vector(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Parameter `i` (buffer `buf`) at `at`, through the stage when it applies.
    fn load_param(&mut self, i: usize, buf: &Buf<'ctx>, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let pin = self.pinned.iter().find(|(p, b, _)| *p == i && at.axes.last().is_some_and(|a| a.base.as_value_ref() == b.as_value_ref())).map(|e| e.2);
        if let Some(v) = pin {
            return self.decode_raw(buf.dtype, Raw::Vector(v), at.lanes);
        }
        let words = self.bf16_words.contains(&i);
        let Some(read) = self.staged(i, at) else {
            let raw = self.load_raw(buf, at, words, false)?;
            return self.decode_raw(buf.dtype, raw, at.lanes);
        };
        let lanes = at.lanes;
        let stt = storage_type(self.kb.cx, buf.dtype);
        let p = self.stage_slot(i, buf.dtype)?;
        let size = buf.dtype.size_bytes() as u32;
        let vbytes = (lanes * size).min(16);
        let raw = if read {
            if lanes == 1 {
                Raw::Lanes(vec![self.kb.load(stt, p, size)?])
            } else {
                let vt = self.raw_vector_type(buf.dtype, lanes, words)?;
                Raw::Vector(self.kb.load(vt.into(), p, vbytes)?.into_vector_value())
            }
        } else {
            let raw = self.load_raw(buf, at, words, true)?;
            match &raw {
                Raw::Decoded(_) => return Err(CodegenError::Builder("a staged load decoded early".into())),
                Raw::Vector(v) => self.kb.store(p, (*v).into(), vbytes)?,
                Raw::Lanes(v) if lanes == 1 => self.kb.store(p, v[0], size)?,
                Raw::Lanes(v) => {
                    // Gathered lane by lane (or one value for every lane): stored as a vector.
                    let vt = self.raw_vector_type(buf.dtype, lanes, words)?;
                    let words = vt.get_element_type().is_int_type() && buf.dtype == DType::BF16;
                    let mut vv = vt.get_undef();
                    let n = vt.get_size();
                    for j in 0..n {
                        let e = if words {
                            let i16t = self.kb.cx.i16_type();
                            let i32t = self.kb.cx.i32_type();
                            let pick = |l: usize| if v.len() == 1 { v[0] } else { v[l] };
                            let lo = self.kb.b.build_bit_cast(pick(2 * j as usize), i16t, "lo")?.into_int_value();
                            let hi = self.kb.b.build_bit_cast(pick(2 * j as usize + 1), i16t, "hi")?.into_int_value();
                            let lo = self.kb.b.build_int_z_extend(lo, i32t, "lo")?;
                            let hi = self.kb.b.build_int_z_extend(hi, i32t, "hi")?;
                            let hi = self.kb.b.build_left_shift(hi, self.kb.i32c(16), "hi")?;
                            self.kb.b.build_or(hi, lo, "w")?.as_basic_value_enum()
                        } else if v.len() == 1 {
                            v[0]
                        } else {
                            v[j as usize]
                        };
                        vv = self.kb.b.build_insert_element(vv, e, self.kb.i32c(i64::from(j)), "st")?;
                    }
                    self.kb.store(p, vv.into(), vbytes)?;
                }
            }
            if let Some(st) = self.stage.as_mut() {
                st.filling.insert(i);
            }
            raw
        };
        self.decode_raw(buf.dtype, raw, lanes)
    }

    /// Fills parameter `i`'s stage slot for `at` (the current chunk, [`Stage::cursor`])
    /// without reading it: one 16-byte `cp.async.cg.shared.global` (PTX ISA §9.7.9.25.3) when
    /// the stage fills `i` at `at` and `at` is a contiguous, aligned 16-byte vector of the
    /// buffer; otherwise nothing (the next pass loads and fills it as usual). The copy lands
    /// when the thread's `cp.async.wait_group` says so; only the issuing thread reads the slot
    /// (the stage's slots are thread-private: every pass maps a chunk to the same thread), so
    /// no barrier is needed. Returns whether a `cp.async` was issued.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn prefetch_param(&mut self, i: usize, at: &At<'ctx>) -> R<bool> {
        if self.staged(i, at) != Some(false) {
            return Ok(false);
        }
        let issued = self.cp_async_to_slot(i, at, self.kb.i32c(16))?;
        if issued {
            if let Some(st) = self.stage.as_mut() {
                st.filling.insert(i);
            }
        }
        Ok(issued)
    }

    /// Copies parameter `i` at `at` (a chunk of another row at the current chunk's column)
    /// into the current chunk's stage slot by one 16-byte `cp.async` of `src_bytes` (16, or 0:
    /// the slot is zeroed and nothing is read), whatever the stage holds now: a persistent row
    /// schedule's refill, after the thread's last read of the slot. Returns `false` (nothing
    /// issued) where the chunk is not a contiguous, aligned 16-byte vector.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] without a stage array for `i` or a current chunk.
    pub fn refill_param(&mut self, i: usize, at: &At<'ctx>, src_bytes: IntValue<'ctx>) -> R<bool> {
        let lanes = self.stage.as_ref().ok_or_else(|| CodegenError::Builder("no stage".into()))?.lanes;
        if at.lanes != lanes {
            return Ok(false);
        }
        self.cp_async_to_slot(i, at, src_bytes)
    }

    /// The one `cp.async` of [`Eval::prefetch_param`] and [`Eval::refill_param`]: parameter
    /// `i` at `at` into the current chunk's stage slot, `src_bytes` of 16 read, where `at` is
    /// a contiguous, aligned 16-byte vector of the buffer (`false`, nothing issued, elsewhere).
    fn cp_async_to_slot(&mut self, i: usize, at: &At<'ctx>, src_bytes: IntValue<'ctx>) -> R<bool> {
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
        let size = buf.dtype.size_bytes() as u32;
        let (off, steps, aligned) = self.offsets(&buf.strides, at)?;
        let unit = steps.len() == 1 && steps[0].1.as_const() == Some(1);
        if !(unit && aligned && at.lanes * size == 16 && buf.align >= 16) {
            return Ok(false);
        }
        let dst = self.stage_slot(i, buf.dtype)?;
        let src = self.kb.gep(storage_type(self.kb.cx, buf.dtype), buf.ptr, off)?;
        self.kb.cp_async_16(dst, src, src_bytes)?;
        Ok(true)
    }

    /// Fills parameter `i`'s stage slot for `at` (the current chunk): by [`Eval::prefetch_param`]'s
    /// `cp.async` where it applies, else by a load and a store (visible to the thread itself
    /// at once). Returns whether a `cp.async` was issued.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn fill_param(&mut self, i: usize, at: &At<'ctx>) -> R<bool> {
        if self.staged(i, at) != Some(false) {
            return Err(CodegenError::Builder(format!("parameter {i} is not filled at this coordinate")));
        }
        if self.prefetch_param(i, at)? {
            return Ok(true);
        }
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
        self.load_param(i, &buf, at)?;
        Ok(false)
    }

    fn decode_storage(&self, dtype: DType, v: BasicValueEnum<'ctx>) -> R<Scalar<'ctx>> {
        Ok(match dtype {
            DType::BF16 | DType::F16 | DType::F32 => Scalar::F(self.kb.to_f32(v.into_float_value())?),
            DType::I32 | DType::I64 => Scalar::I(v.into_int_value()),
            DType::Bool => {
                let z = self.kb.cx.i8_type().const_zero();
                Scalar::I(self.kb.b.build_int_compare(IntPredicate::NE, v.into_int_value(), z, "b")?)
            }
            DType::Q8_0 | DType::Q4_1 => return unsupported(format!("a {dtype} tensor read other than by `dequantize`")),
            // Held as its bit pattern (see [`crate::fp8`]).
            DType::F8E4M3 => Scalar::I(v.into_int_value()),
        })
    }

    fn encode_storage(&self, dtype: DType, s: Scalar<'ctx>) -> R<BasicValueEnum<'ctx>> {
        Ok(match dtype {
            DType::BF16 | DType::F16 | DType::F32 => self.kb.from_f32(s.f()?, dtype)?.as_basic_value_enum(),
            DType::I32 | DType::I64 => s.i()?.as_basic_value_enum(),
            DType::Bool => self.kb.b.build_int_z_extend(s.i()?, self.kb.cx.i8_type(), "b")?.as_basic_value_enum(),
            DType::Q8_0 | DType::Q4_1 => return unsupported(format!("a {dtype} result")),
            DType::F8E4M3 => {
                let v = s.i()?;
                if v.get_type().get_bit_width() != 8 {
                    return Err(CodegenError::Builder(format!("an f8e4m3 value of {} bits", v.get_type().get_bit_width())));
                }
                v.as_basic_value_enum()
            }
        })
    }

    /// Stores `vals` at `at` into `buf` (a vector store when contiguous and aligned).
    pub fn store(&mut self, buf: &Buf<'ctx>, at: &At<'ctx>, vals: &[Scalar<'ctx>]) -> R<()> {
        let (off, steps, aligned) = self.offsets(&buf.strides, at)?;
        let st = storage_type(self.kb.cx, buf.dtype);
        let size = buf.dtype.size_bytes() as u32;
        let lanes = at.lanes;
        if vals.len() != lanes as usize {
            return Err(CodegenError::Builder(format!("{} values for {lanes} lanes", vals.len())));
        }
        if lanes == 1 || steps.is_empty() {
            // Every lane writes one element: write it once (a uniform output over a lane axis
            // only happens for a broadcast output, which the generators reject).
            let p = self.kb.gep(st, buf.ptr, off)?;
            let v = self.encode_storage(buf.dtype, vals[0])?;
            return self.kb.store(p, v, size.min(buf.align.max(1)));
        }
        let unit = steps.len() == 1 && steps[0].1.as_const() == Some(1);
        let vbytes = lanes * size;
        if unit && aligned && vbytes.is_power_of_two() && buf.align >= vbytes.min(16) {
            let vt = st.vec_type_of(lanes)?;
            let mut v = vt.get_undef();
            for (l, s) in vals.iter().enumerate() {
                let e = self.encode_storage(buf.dtype, *s)?;
                v = self.kb.b.build_insert_element(v, e, self.kb.i32c(l as i64), "v")?;
            }
            let p = self.kb.gep(st, buf.ptr, off)?;
            return self.kb.store(p, v.as_basic_value_enum(), vbytes.min(buf.align).min(64));
        }
        let mut lane_stride = self.ic(0);
        for (_, s) in &steps {
            let sv = self.dim(s)?;
            lane_stride = self.iadd(lane_stride, sv)?;
        }
        for (l, s) in vals.iter().enumerate() {
            let d = self.imul(lane_stride, self.ic(l as i64))?;
            let o = self.iadd(off, d)?;
            let p = self.kb.gep(st, buf.ptr, o)?;
            let v = self.encode_storage(buf.dtype, *s)?;
            self.kb.store(p, v, size.min(buf.align.max(1)))?;
        }
        Ok(())
    }

    // ----- evaluation --------------------------------------------------------------------

    /// Emits the computation of `v` at `at` (memoised).
    pub fn eval(&mut self, v: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let key = Self::key(v, at);
        if let Some(l) = self.memo.get(&key) {
            return Ok(l.clone());
        }
        let data = self.f.values.get(v).ok_or_else(|| CodegenError::Builder(format!("no value {v}")))?;
        let out = match data.def {
            ValueDef::Param(i) => {
                let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
                self.load_param(i, &buf, at)?
            }
            ValueDef::Result(node, _) => self.eval_node(node, v, at)?,
        };
        if out.len() != at.lanes as usize {
            return Err(CodegenError::Builder(format!("{} lanes computed for {}", out.len(), at.lanes)));
        }
        self.memo.insert(key, out.clone());
        Ok(out)
    }

    fn operand(&mut self, node: Node, i: usize, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, i)?;
        let from = self.shape(result)?;
        let to = self.shape(x)?;
        let a = self.broadcast_at(at, &from, &to)?;
        self.eval(x, &a)
    }

    fn input(&self, node: Node, i: usize) -> R<Value> {
        self.f.nodes[node].inputs.get(i).copied().ok_or_else(|| CodegenError::BadKernel {
            kernel: String::new(),
            message: format!("{node} `{}` has no operand {i}", self.f.nodes[node].op.kind.name()),
        })
    }

    fn eval_node(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        use OpKind::*;
        let nd = &self.f.nodes[node];
        let kind = nd.op.kind;
        let out_dt = self.dtype(result)?;
        match kind {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Recip | Sigmoid | Silu | Gelu | Tanh | Sin | Cos | Cast => {
                let x = self.input(node, 0)?;
                let in_dt = self.dtype(x)?;
                let xs = self.operand(node, 0, result, at)?;
                let gelu_tanh = nd.op.str("form") == Some("tanh");
                xs.into_iter().map(|s| self.unary(kind, gelu_tanh, in_dt, out_dt, s)).collect()
            }
            Dequantize => self.dequantize(node, result, at, out_dt),
            QuantizeFp8 => {
                let xs = self.operand(node, 0, result, at)?;
                let ss = self.operand(node, 1, result, at)?;
                let mut q = Vec::with_capacity(xs.len());
                for (x, s) in xs.into_iter().zip(ss) {
                    q.push(self.kb.fdiv(x.f()?, s.f()?)?);
                }
                Ok(crate::fp8::from_f32(self.kb, &q)?.into_iter().map(Scalar::I).collect())
            }
            DequantizeFp8 => {
                let xs = self.operand(node, 0, result, at)?;
                let ss = self.operand(node, 1, result, at)?;
                let bytes = xs.iter().map(|x| x.i()).collect::<R<Vec<_>>>()?;
                let vals = crate::fp8::to_f32(self.kb, &bytes)?;
                let mut out = Vec::with_capacity(vals.len());
                for (v, s) in vals.into_iter().zip(ss) {
                    let p = self.kb.fmul(v, s.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(p, out_dt)?));
                }
                Ok(out)
            }
            Add | Sub | Mul | Div | Maximum | Minimum | Pow | Eq | Ne | Lt | Le | Gt | Ge => {
                let a = self.input(node, 0)?;
                let in_dt = self.dtype(a)?;
                let exponent = if kind == Pow { self.constant_of(self.input(node, 1)?) } else { None };
                let xs = self.operand(node, 0, result, at)?;
                let ys = if exponent.is_some() { xs.clone() } else { self.operand(node, 1, result, at)? };
                xs.into_iter().zip(ys).map(|(x, y)| self.binary(kind, in_dt, out_dt, x, y, exponent)).collect()
            }
            Select => {
                let c = self.operand(node, 0, result, at)?;
                let a = self.operand(node, 1, result, at)?;
                let b = self.operand(node, 2, result, at)?;
                let mut out = Vec::with_capacity(c.len());
                for ((c, a), b) in c.into_iter().zip(a).zip(b) {
                    let v = self.kb.b.build_select(c.i()?, a.basic(), b.basic(), "sel")?;
                    out.push(match v {
                        BasicValueEnum::FloatValue(f) => Scalar::F(f),
                        other => Scalar::I(other.into_int_value()),
                    });
                }
                Ok(out)
            }
            Swiglu => {
                let g = self.operand(node, 0, result, at)?;
                let u = self.operand(node, 1, result, at)?;
                let precise = out_dt == DType::F32;
                let mut out = Vec::with_capacity(g.len());
                for (g, u) in g.into_iter().zip(u) {
                    let s = math::silu(self.kb, g.f()?, precise)?;
                    let s = self.kb.round_to(s, out_dt)?;
                    let p = self.kb.fmul(s, u.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(p, out_dt)?));
                }
                Ok(out)
            }
            Constant => {
                let value = match nd.op.attr("value") {
                    Some(Attr::Float(v)) => *v,
                    _ => return bad("`constant` without a value"),
                };
                let s = self.constant_scalar(out_dt, value)?;
                Ok(vec![s; at.lanes as usize])
            }
            Iota => self.iota(node, out_dt, at),
            Broadcast => self.operand(node, 0, result, at),
            Transpose | Permute => {
                let rank = at.axes.len();
                let perm: Vec<usize> = if kind == Transpose {
                    let norm = |a: i64| -> R<usize> { sinter_ir::infer::norm_axis(a, rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() }) };
                    let d0 = norm(nd.op.int("dim0").unwrap_or(-2))?;
                    let d1 = norm(nd.op.int("dim1").unwrap_or(-1))?;
                    let mut p: Vec<usize> = (0..rank).collect();
                    p.swap(d0, d1);
                    p
                } else {
                    let p = nd.op.ints("perm").unwrap_or(&[]);
                    p.iter().map(|&x| usize::try_from(x).unwrap_or(usize::MAX)).collect()
                };
                if perm.len() != rank || perm.iter().any(|&p| p >= rank) {
                    return bad(format!("{node}: permutation {perm:?} for rank {rank}"));
                }
                let mut axes = vec![self.zero_ax(); rank];
                for (i, &p) in perm.iter().enumerate() {
                    axes[p] = at.axes[i];
                }
                let x = self.input(node, 0)?;
                self.eval(x, &At { axes, lanes: at.lanes })
            }
            Slice => {
                let rank = at.axes.len();
                let axis = sinter_ir::infer::norm_axis(nd.op.int("axis").unwrap_or(-1), rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() })?;
                let start = nd.op.dim("start").cloned().ok_or_else(|| CodegenError::BadKernel { kernel: String::new(), message: "slice without start".into() })?;
                let mut axes = at.axes.clone();
                let a = at.axes[axis];
                let sv = self.dim(&start)?;
                let base = self.iadd(a.base, sv)?;
                axes[axis] = Ax { base, step: a.step, aligned: a.aligned && divisible(&start, at.lanes), zero: a.zero && start.as_const() == Some(0), tag: Tag::Other };
                let x = self.input(node, 0)?;
                self.eval(x, &At { axes, lanes: at.lanes })
            }
            Reshape => self.reshape(node, result, at),
            Concat => self.concat(node, result, at),
            Gather => self.gather(node, result, at),
            Rope => self.rope(node, result, at),
            Softmax | LogSoftmax | RmsNorm | LayerNorm | ReduceSum | ReduceMax | ReduceMin | ReduceMean => self.row_node(node, result, at),
            Matmul | Attention | PagedAttention | AttentionMerge | KvAppend | Call => unsupported(format!(
                "`{}` ({node}) cannot be computed element by element; it needs its own kernel",
                kind.name()
            )),
        }
    }

    /// The constant value of `v` if it is a scalar (or splat) `constant`.
    fn constant_of(&self, v: Value) -> Option<f64> {
        match self.f.values.get(v)?.def {
            ValueDef::Result(n, _) => {
                let nd = &self.f.nodes[n];
                if nd.op.kind == OpKind::Constant {
                    let dt = self.f.values[v].ty.dtype;
                    nd.op.float("value").map(|x| dt.round(x))
                } else {
                    None
                }
            }
            ValueDef::Param(_) => None,
        }
    }

    /// `dequantize` of a kernel parameter (a `q8_0`/`q4_1` buffer, contiguous along its
    /// last axis) at `at`: per lane, the element's block is found from its row-major element
    /// offset (the buffer's strides are element strides) and decoded by [`crate::quant`].
    fn dequantize(&mut self, node: Node, result: Value, at: &At<'ctx>, out_dt: DType) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let in_dt = self.dtype(x)?;
        let ValueDef::Param(i) = self.f.values[x].def else {
            return unsupported(format!("`dequantize` of a computed {in_dt} value (only a kernel input is read as blocks)"));
        };
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
        if buf.strides.last().and_then(|s| s.as_const()) != Some(1) {
            return unsupported(format!("a {in_dt} buffer whose last axis is not contiguous"));
        }
        let from = self.shape(result)?;
        let to = self.shape(x)?;
        let a = self.broadcast_at(at, &from, &to)?;
        let mut out = Vec::with_capacity(at.lanes as usize);
        for one in self.split(&a)? {
            let (off, _, _) = self.offsets(&buf.strides, &one)?;
            let v = crate::quant::element(self.kb, in_dt, buf.ptr, off)?;
            out.push(Scalar::F(self.kb.round_to(v, out_dt)?));
        }
        Ok(out)
    }

    fn constant_scalar(&self, dt: DType, value: f64) -> R<Scalar<'ctx>> {
        let r = dt.round(value);
        Ok(match dt {
            DType::BF16 | DType::F16 | DType::F32 => Scalar::F(self.kb.f32c(r as f32)),
            DType::I32 => Scalar::I(self.kb.i32c(r as i64)),
            DType::I64 => Scalar::I(self.kb.i64c(r as i64)),
            DType::Bool => Scalar::I(self.kb.cx.bool_type().const_int(u64::from(r != 0.0), false)),
            DType::Q8_0 | DType::Q4_1 => return unsupported(format!("a {dt} constant")),
            DType::F8E4M3 => Scalar::I(self.kb.cx.i8_type().const_int(u64::from(sinter_ir::dtype::f8e4m3_from_f64(value)), false)),
        })
    }

    fn int_type(&self, dt: DType) -> IntType<'ctx> {
        match dt {
            DType::I64 => self.kb.cx.i64_type(),
            DType::Bool => self.kb.cx.bool_type(),
            _ => self.kb.cx.i32_type(),
        }
    }

    /// An index value (this kernel's width) converted to integer dtype `dt`, saturating.
    fn index_to_int(&self, v: IntValue<'ctx>, dt: DType) -> R<IntValue<'ctx>> {
        let b = &self.kb.b;
        Ok(match (dt, self.width) {
            (DType::I64, IndexWidth::I64) | (DType::I32, IndexWidth::I32) => v,
            (DType::I64, IndexWidth::I32) => b.build_int_s_extend(v, self.kb.cx.i64_type(), "i")?,
            (DType::I32, IndexWidth::I64) => {
                let m = self.kb.i64c(i64::from(i32::MAX));
                let c = self.kb.b.build_int_compare(IntPredicate::SLT, v, m, "c")?;
                let v = b.build_select(c, v, m, "s")?.into_int_value();
                b.build_int_truncate(v, self.kb.cx.i32_type(), "i")?
            }
            _ => return bad(format!("an index as {dt}")),
        })
    }

    fn iota(&mut self, node: Node, dt: DType, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let rank = at.axes.len();
        let axis = sinter_ir::infer::norm_axis(self.f.nodes[node].op.int("axis").unwrap_or(0), rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() })?;
        let a = at.axes[axis];
        let mut out = Vec::with_capacity(at.lanes as usize);
        for l in 0..at.lanes {
            let c = if a.step && l > 0 { self.iadd(a.base, self.ic(i64::from(l)))? } else { a.base };
            out.push(match dt {
                DType::I32 | DType::I64 => Scalar::I(self.index_to_int(c, dt)?),
                DType::BF16 | DType::F16 | DType::F32 => {
                    let f = self.kb.b.build_signed_int_to_float(c, self.kb.cx.f32_type(), "f")?;
                    Scalar::F(self.kb.round_to(f, dt)?)
                }
                DType::Bool | DType::Q8_0 | DType::Q4_1 | DType::F8E4M3 => return bad(format!("iota cannot produce {dt}")),
            });
        }
        Ok(out)
    }

    // ----- element-wise arithmetic ------------------------------------------------------

    fn unary(&mut self, kind: OpKind, gelu_tanh: bool, in_dt: DType, out_dt: DType, x: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        let precise = out_dt == DType::F32;
        if kind == Cast {
            return self.cast(in_dt, out_dt, x);
        }
        if !in_dt.is_float() {
            return self.int_unary(kind, in_dt, x);
        }
        let x = x.f()?;
        let kb = &mut *self.kb;
        let r = match kind {
            Neg => kb.fneg(x)?,
            Abs => kb.fabs(x)?,
            Exp => math::exp(kb, x, precise)?,
            Log => math::log(kb, x)?,
            Sqrt => kb.fsqrt(x)?,
            Rsqrt => {
                let s = kb.fsqrt(x)?;
                let one = kb.f32c(1.0);
                kb.fdiv(one, s)?
            }
            Recip => {
                let one = kb.f32c(1.0);
                kb.fdiv(one, x)?
            }
            Sigmoid => math::sigmoid(kb, x, precise)?,
            Silu => math::silu(kb, x, precise)?,
            Gelu if gelu_tanh => math::gelu_tanh(kb, x, precise)?,
            Gelu => math::gelu_erf(kb, x, precise)?,
            Tanh => math::tanh(kb, x, precise)?,
            Sin => math::sincos(kb, x)?.0,
            Cos => math::sincos(kb, x)?.1,
            _ => return bad(format!("`{}` is not a unary op", kind.name())),
        };
        Ok(Scalar::F(kb.round_to(r, out_dt)?))
    }

    fn int_unary(&mut self, kind: OpKind, dt: DType, x: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        let x = x.i()?;
        if dt == DType::Bool {
            return bad(format!("`{}` is not defined on bool", kind.name()));
        }
        let zero = self.int_type(dt).const_zero();
        let neg = self.kb.intrinsic_value("llvm.ssub.sat", &[self.int_type(dt).into()], &[zero.into(), x.into()])?.into_int_value();
        match kind {
            OpKind::Neg => Ok(Scalar::I(neg)),
            OpKind::Abs => {
                let lt = self.kb.b.build_int_compare(IntPredicate::SLT, x, zero, "c")?;
                Ok(Scalar::I(self.kb.b.build_select(lt, neg, x, "abs")?.into_int_value()))
            }
            _ => bad(format!("`{}` needs a float operand, got {dt}", kind.name())),
        }
    }

    fn cast(&mut self, from: DType, to: DType, x: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        // f8e4m3 (see [`crate::fp8`]): read as its exact f32 value, then cast as an f32 is; a
        // cast to it rounds the f32 value once (integers convert to f32 first: exactly up to
        // 2²⁴, and anything larger saturates at 448 either way).
        if from == DType::F8E4M3 {
            if to == DType::F8E4M3 {
                return Ok(x);
            }
            let v = crate::fp8::to_f32(self.kb, &[x.i()?])?;
            return self.cast(DType::F32, to, Scalar::F(v[0]));
        }
        if to == DType::F8E4M3 {
            let f = match self.cast(from, DType::F32, x)? {
                Scalar::F(f) => f,
                Scalar::I(_) => return Err(CodegenError::Builder("a cast to f32 gave an integer".into())),
            };
            return Ok(Scalar::I(crate::fp8::from_f32(self.kb, &[f])?[0]));
        }
        let b = &self.kb.b;
        let f32t = self.kb.cx.f32_type();
        Ok(match (from.is_float(), to) {
            (true, DType::BF16 | DType::F16 | DType::F32) => Scalar::F(self.kb.round_to(x.f()?, to)?),
            (true, DType::I32 | DType::I64) => {
                let it = self.int_type(to);
                let v = self.kb.intrinsic_value("llvm.fptosi.sat", &[it.into(), f32t.into()], &[x.f()?.into()])?;
                Scalar::I(v.into_int_value())
            }
            (true, DType::Bool) => Scalar::I(b.build_float_compare(FloatPredicate::UNE, x.f()?, f32t.const_zero(), "b")?),
            (false, DType::BF16 | DType::F16 | DType::F32) => {
                let v = x.i()?;
                let f = if from == DType::Bool { b.build_unsigned_int_to_float(v, f32t, "f")? } else { b.build_signed_int_to_float(v, f32t, "f")? };
                Scalar::F(self.kb.round_to(f, to)?)
            }
            (_, DType::Q8_0 | DType::Q4_1) => return unsupported(format!("a cast to {to}")),
            (_, DType::F8E4M3) => return Err(CodegenError::Builder("a cast to f8e4m3 reached the generic cast".into())),
            (false, DType::Bool) => {
                let v = x.i()?;
                Scalar::I(b.build_int_compare(IntPredicate::NE, v, v.get_type().const_zero(), "b")?)
            }
            (false, DType::I32 | DType::I64) => {
                let v = x.i()?;
                let it = self.int_type(to);
                Scalar::I(match (from, to) {
                    (DType::Bool, _) => b.build_int_z_extend(v, it, "i")?,
                    (DType::I32, DType::I64) => b.build_int_s_extend(v, it, "i")?,
                    (DType::I64, DType::I32) => {
                        let i64t = self.kb.cx.i64_type();
                        let hi = i64t.const_int(i32::MAX as u64, true);
                        let lo = i64t.const_int(i32::MIN as i64 as u64, true);
                        let v = self.kb.intrinsic_value("llvm.smin", &[i64t.into()], &[v.into(), hi.into()])?.into_int_value();
                        let v = self.kb.intrinsic_value("llvm.smax", &[i64t.into()], &[v.into(), lo.into()])?.into_int_value();
                        self.kb.b.build_int_truncate(v, it, "i")?
                    }
                    _ => v,
                })
            }
        })
    }

    fn binary(&mut self, kind: OpKind, in_dt: DType, out_dt: DType, x: Scalar<'ctx>, y: Scalar<'ctx>, exponent: Option<f64>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        if matches!(kind, Eq | Ne | Lt | Le | Gt | Ge) {
            return self.compare(kind, in_dt, x, y);
        }
        if !in_dt.is_float() {
            return self.int_binary(kind, in_dt, x, y);
        }
        let (a, c) = (x.f()?, if exponent.is_some() { x.f()? } else { y.f()? });
        let kb = &mut *self.kb;
        let r = match kind {
            Add => kb.fadd(a, c)?,
            Sub => kb.fsub(a, c)?,
            Mul => kb.fmul(a, c)?,
            Div => kb.fdiv(a, c)?,
            Maximum => kb.combine_f32(crate::emit::Combine::Max, a, c)?,
            Minimum => kb.combine_f32(crate::emit::Combine::Min, a, c)?,
            Pow => match exponent {
                Some(1.0) => a,
                Some(2.0) => kb.fmul(a, a)?,
                Some(3.0) => {
                    let sq = kb.fmul(a, a)?;
                    kb.fmul(sq, a)?
                }
                Some(0.0) => kb.f32c(1.0),
                Some(-1.0) => {
                    let one = kb.f32c(1.0);
                    kb.fdiv(one, a)?
                }
                Some(e) => {
                    let ev = kb.f32c(e as f32);
                    math::pow(kb, a, ev)?
                }
                None => math::pow(kb, a, c)?,
            },
            _ => return bad(format!("`{}` is not a binary op", kind.name())),
        };
        Ok(Scalar::F(kb.round_to(r, out_dt)?))
    }

    fn compare(&mut self, kind: OpKind, dt: DType, x: Scalar<'ctx>, y: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        let b = &self.kb.b;
        Ok(Scalar::I(if dt.is_float() {
            let p = match kind {
                Eq => FloatPredicate::OEQ,
                Ne => FloatPredicate::UNE,
                Lt => FloatPredicate::OLT,
                Le => FloatPredicate::OLE,
                Gt => FloatPredicate::OGT,
                _ => FloatPredicate::OGE,
            };
            b.build_float_compare(p, x.f()?, y.f()?, "c")?
        } else {
            let u = dt == DType::Bool;
            let p = match kind {
                Eq => IntPredicate::EQ,
                Ne => IntPredicate::NE,
                Lt if u => IntPredicate::ULT,
                Le if u => IntPredicate::ULE,
                Gt if u => IntPredicate::UGT,
                Ge if u => IntPredicate::UGE,
                Lt => IntPredicate::SLT,
                Le => IntPredicate::SLE,
                Gt => IntPredicate::SGT,
                _ => IntPredicate::SGE,
            };
            b.build_int_compare(p, x.i()?, y.i()?, "c")?
        }))
    }

    /// Integer arithmetic saturates at the dtype's range, as the interpreter's rounding does
    /// (it computes in f64 and rounds with saturation); division truncates toward zero, and
    /// a zero divisor gives 0 (the interpreter reports an error there).
    fn int_binary(&mut self, kind: OpKind, dt: DType, x: Scalar<'ctx>, y: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        if dt == DType::Bool {
            return bad(format!("`{}` is not defined on bool", kind.name()));
        }
        let (a, c) = (x.i()?, y.i()?);
        let it = self.int_type(dt);
        let i64t = self.kb.cx.i64_type();
        let kb = &*self.kb;
        let sat = |name: &str| -> R<IntValue<'ctx>> { Ok(kb.intrinsic_value(name, &[it.into()], &[a.into(), c.into()])?.into_int_value()) };
        let r = match kind {
            Add => sat("llvm.sadd.sat")?,
            Sub => sat("llvm.ssub.sat")?,
            Maximum => sat("llvm.smax")?,
            Minimum => sat("llvm.smin")?,
            Mul | Div if dt == DType::I32 => {
                // Exact in i64, then clamp to i32.
                let a64 = kb.b.build_int_s_extend(a, i64t, "a")?;
                let c64 = kb.b.build_int_s_extend(c, i64t, "c")?;
                let r = if kind == Mul {
                    kb.b.build_int_mul(a64, c64, "m")?
                } else {
                    let zero = i64t.const_zero();
                    let is0 = kb.b.build_int_compare(IntPredicate::EQ, c64, zero, "z")?;
                    let d = kb.b.build_select(is0, i64t.const_int(1, false), c64, "d")?.into_int_value();
                    let q = kb.b.build_int_signed_div(a64, d, "q")?;
                    kb.b.build_select(is0, zero, q, "q")?.into_int_value()
                };
                let hi = i64t.const_int(i32::MAX as u64, true);
                let lo = i64t.const_int(i32::MIN as i64 as u64, true);
                let r = kb.intrinsic_value("llvm.smin", &[i64t.into()], &[r.into(), hi.into()])?.into_int_value();
                let r = kb.intrinsic_value("llvm.smax", &[i64t.into()], &[r.into(), lo.into()])?.into_int_value();
                kb.b.build_int_truncate(r, it, "i")?
            }
            Mul => {
                let st = kb.intrinsic_value("llvm.smul.with.overflow", &[it.into()], &[a.into(), c.into()])?.into_struct_value();
                let prod = kb.b.build_extract_value(st, 0, "p")?.into_int_value();
                let ovf = kb.b.build_extract_value(st, 1, "o")?.into_int_value();
                let sign = kb.b.build_xor(a, c, "s")?;
                let neg = kb.b.build_int_compare(IntPredicate::SLT, sign, it.const_zero(), "n")?;
                let lim = kb.b.build_select(neg, it.const_int(i64::MIN as u64, true), it.const_int(i64::MAX as u64, true), "l")?.into_int_value();
                kb.b.build_select(ovf, lim, prod, "m")?.into_int_value()
            }
            Div => {
                let zero = it.const_zero();
                let is0 = kb.b.build_int_compare(IntPredicate::EQ, c, zero, "z")?;
                let min = it.const_int(i64::MIN as u64, true);
                let m1 = it.const_int(u64::MAX, true);
                let amin = kb.b.build_int_compare(IntPredicate::EQ, a, min, "a")?;
                let cm1 = kb.b.build_int_compare(IntPredicate::EQ, c, m1, "c")?;
                let ovf = kb.b.build_and(amin, cm1, "o")?;
                let fix = kb.b.build_or(is0, ovf, "f")?;
                let d = kb.b.build_select(fix, it.const_int(1, false), c, "d")?.into_int_value();
                let q = kb.b.build_int_signed_div(a, d, "q")?;
                let q = kb.b.build_select(ovf, it.const_int(i64::MAX as u64, true), q, "q")?.into_int_value();
                kb.b.build_select(is0, zero, q, "q")?.into_int_value()
            }
            _ => return bad(format!("`{}` is not defined on {dt}", kind.name())),
        };
        Ok(Scalar::I(r))
    }

    // ----- layout ops ---------------------------------------------------------------------

    fn reshape(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let out_shape = self.shape(result)?;
        let in_shape = self.shape(x)?;
        // The longest common suffix maps unchanged.
        let mut k = 0;
        while k < out_shape.len() && k < in_shape.len() && out_shape[out_shape.len() - 1 - k] == in_shape[in_shape.len() - 1 - k] {
            k += 1;
        }
        let (po, pi) = (out_shape.len() - k, in_shape.len() - k);
        let lead_step = at.axes[..po].iter().any(|a| a.step) && at.lanes > 1;
        if lead_step {
            // The lane axis is in the reshaped prefix: lanes may straddle rows; go lane by lane
            // unless the prefix's last axis carries it with room to spare.
            let ok = at.axes[po - 1].step && at.axes[po - 1].aligned && pi > 0 && divisible(&in_shape[pi - 1], at.lanes) && at.axes[..po - 1].iter().all(|a| !a.step);
            if !ok {
                return self.per_lane(result, at);
            }
        }
        // Linear index of the prefix coordinate (row-major over out_shape[..po]).
        let mut lin = self.ic(0);
        let mut stride = Dim::constant(1);
        let mut lin_aligned = true;
        let mut lin_step = false;
        for i in (0..po).rev() {
            let a = at.axes[i];
            if !a.zero {
                let sv = self.dim(&stride)?;
                let t = self.imul(a.base, sv)?;
                lin = self.iadd(lin, t)?;
                if !(a.aligned || divisible(&stride, at.lanes)) {
                    lin_aligned = false;
                }
                if a.step && at.lanes > 1 {
                    lin_step = true;
                    if stride.as_const() != Some(1) {
                        return self.per_lane(result, at);
                    }
                }
            }
            stride = stride.mul(&out_shape[i]);
        }
        // Input prefix coordinates from the linear index, innermost first.
        let mut axes = vec![self.zero_ax(); in_shape.len()];
        let mut rem = lin;
        for i in (0..pi).rev() {
            let d = in_shape[i].clone();
            if d.is_one() {
                continue;
            }
            let first = i == 0 || in_shape[..i].iter().all(Dim::is_one);
            let (c, next) = if first {
                (rem, rem)
            } else {
                let dv = self.dim(&d)?;
                (self.irem(rem, dv)?, self.idiv(rem, dv)?)
            };
            let innermost = i == pi - 1;
            axes[i] = Ax { base: c, step: lin_step && innermost, aligned: lin_aligned, zero: false, tag: Tag::Other };
            rem = next;
        }
        axes[pi..pi + k].copy_from_slice(&at.axes[po..po + k]);
        self.eval(x, &At { axes, lanes: at.lanes })
    }

    /// Emits `if/else` branches, evaluating `arms[i]` in arm `i`, and merges the lanes with
    /// phis. `conds[i]` selects arm `i` (the last arm takes what is left).
    fn branch(&mut self, conds: Vec<IntValue<'ctx>>, arms: Vec<Arm<'_, 'ctx>>) -> R<Lanes<'ctx>> {
        let merge = self.kb.block("merge");
        let mut incoming: Vec<(Lanes<'ctx>, inkwell::basic_block::BasicBlock<'ctx>)> = Vec::new();
        let n = arms.len();
        let mut conds = conds.into_iter();
        for (i, arm) in arms.into_iter().enumerate() {
            let body = self.kb.block("arm");
            if i + 1 < n {
                let next = self.kb.block("next");
                let c = conds.next().ok_or_else(|| CodegenError::Builder("branch without condition".into()))?;
                self.kb.cond_br(c, body, next)?;
                self.kb.position(body);
                let snap = self.snapshot();
                self.branch_depth += 1;
                let v = arm(self);
                self.branch_depth -= 1;
                let v = v?;
                self.restore(snap);
                let end = self.kb.current_block()?;
                self.kb.br(merge)?;
                incoming.push((v, end));
                self.kb.position(next);
            } else {
                self.kb.br(body)?;
                self.kb.position(body);
                let snap = self.snapshot();
                self.branch_depth += 1;
                let v = arm(self);
                self.branch_depth -= 1;
                let v = v?;
                self.restore(snap);
                let end = self.kb.current_block()?;
                self.kb.br(merge)?;
                incoming.push((v, end));
            }
        }
        self.kb.position(merge);
        let lanes = incoming.first().map(|(v, _)| v.len()).unwrap_or(0);
        let mut out = Vec::with_capacity(lanes);
        for l in 0..lanes {
            let first = incoming[0].0[l].basic();
            let phi = self.kb.b.build_phi(first.get_type(), "phi")?;
            for (v, bb) in &incoming {
                let s = v[l].basic();
                phi.add_incoming(&[(&s as &dyn BasicValue<'ctx>, *bb)]);
            }
            let pv = phi.as_basic_value();
            out.push(match pv {
                BasicValueEnum::FloatValue(f) => Scalar::F(f),
                other => Scalar::I(other.into_int_value()),
            });
        }
        Ok(out)
    }

    fn concat(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let rank = at.axes.len();
        let axis = sinter_ir::infer::norm_axis(self.f.nodes[node].op.int("axis").unwrap_or(-1), rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() })?;
        let inputs = self.f.nodes[node].inputs.clone();
        let a = at.axes[axis];
        let lanes = at.lanes;
        // Offsets of the inputs along the axis.
        let mut offs = Vec::with_capacity(inputs.len());
        let mut off = Dim::constant(0);
        for &x in &inputs {
            offs.push(off.clone());
            let s = self.shape(x)?;
            off = off.add(&s[axis]);
        }
        if a.step && lanes > 1 {
            let ok = a.aligned && inputs.iter().all(|&x| self.shape(x).map(|s| divisible(&s[axis], lanes)).unwrap_or(false));
            if !ok {
                return self.per_lane(result, at);
            }
        }
        if inputs.len() == 1 {
            return self.eval(inputs[0], at);
        }
        let mut conds = Vec::new();
        for o in offs.iter().skip(1) {
            let ov = self.dim(o)?;
            conds.push(self.ilt(a.base, ov)?);
        }
        let mut arms: Vec<Arm<'_, 'ctx>> = Vec::new();
        for (x, o) in inputs.into_iter().zip(offs) {
            let at = at.clone();
            arms.push(Box::new(move |ev: &mut Eval<'_, 'ctx>| {
                let ov = ev.dim(&o)?;
                let base = ev.isub(a.base, ov)?;
                let mut axes = at.axes.clone();
                axes[axis] = Ax { base, step: a.step, aligned: a.aligned && divisible(&o, at.lanes), zero: false, tag: Tag::Other };
                ev.eval(x, &At { axes, lanes: at.lanes })
            }));
        }
        self.branch(conds, arms)
    }

    /// `gather(table, indices)`: `out[i…, j…] = table[indices[i…], j…]`. An index outside
    /// `0..V` gives NaN (float tables) or 0 (integer tables) for the whole row and reads
    /// nothing — the interpreter reports an error there; the GPU kernel has no error channel
    /// in its launch plan (see the module docs of `gather.rs`).
    fn gather(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let table = self.input(node, 0)?;
        let indices = self.input(node, 1)?;
        let ishape = self.shape(indices)?;
        let tshape = self.shape(table)?;
        let ri = ishape.len();
        if at.axes[..ri].iter().any(|a| a.step) && at.lanes > 1 {
            return self.per_lane(result, at);
        }
        let idx_at = At { axes: at.axes[..ri].to_vec(), lanes: 1 };
        let idx = self.eval(indices, &idx_at)?;
        let idx = idx.first().copied().ok_or_else(|| CodegenError::Builder("no index".into()))?.i()?;
        // Range check in 64 bits.
        let i64t = self.kb.cx.i64_type();
        let idx64 = if idx.get_type() == i64t { idx } else { self.kb.b.build_int_s_extend(idx, i64t, "ix")? };
        let v = tshape.first().cloned().ok_or_else(|| CodegenError::BadKernel { kernel: String::new(), message: "gather from a rank-0 table".into() })?;
        let vv = self.dim(&v)?;
        let vv64 = if vv.get_type() == i64t { vv } else { self.kb.b.build_int_s_extend(vv, i64t, "v")? };
        let ge0 = self.kb.b.build_int_compare(IntPredicate::SGE, idx64, i64t.const_zero(), "ge")?;
        let ltv = self.kb.b.build_int_compare(IntPredicate::SLT, idx64, vv64, "lt")?;
        let ok = self.kb.b.build_and(ge0, ltv, "ok")?;
        let idx_ix = if self.width == IndexWidth::I64 { idx64 } else { self.kb.b.build_int_truncate(idx64, self.ity(), "ix")? };
        let dt = self.dtype(result)?;
        let lanes = at.lanes;
        let mut taxes = vec![self.uniform_ax(idx_ix)];
        taxes.extend_from_slice(&at.axes[ri..]);
        let tat = At { axes: taxes, lanes };
        let arms: Vec<Arm<'_, 'ctx>> = vec![
            Box::new(move |ev: &mut Eval<'_, 'ctx>| ev.eval(table, &tat)),
            Box::new(move |ev: &mut Eval<'_, 'ctx>| {
                let fill = if dt.is_float() { f64::NAN } else { 0.0 };
                let s = ev.constant_scalar(dt, fill)?;
                Ok(vec![s; lanes as usize])
            }),
        ];
        self.branch(vec![ok], arms)
    }

    // ----- rope ---------------------------------------------------------------------------

    /// `rope(x, positions)` at `at`: pair `p` of the last axis (length D) rotated by
    /// `pos·θ^(−2p/D)`. The angle is computed in **f64** (`pos` exactly, `θ^(−2p/D)` from a
    /// table computed on the host exactly as the interpreter computes it), reduced by `π/2`
    /// in f64 and its sine and cosine evaluated in f32 ([`math::sincos_d`], absolute error
    /// ≤ 1.2e-7); `out_a = x_a·cos − x_b·sin`, `out_b = x_b·cos + x_a·sin` with one `fma`
    /// each, rounded once to the dtype. Error bound: `|Δout| ≤ 2.5e-7·(|x_a| + |x_b|)` before
    /// the final rounding, for positions below 2⁵⁰.
    ///
    /// One sine/cosine per pair: the interleaved form shares it between the two lanes of a
    /// pair; the rotate-half form, under a generator's [`RopePair`] hint, computes both halves
    /// of the pair at once (one load of each half, two outputs) and memoises the second. The
    /// angles are memoised per (pair, position value): the other heads of the position that
    /// the same thread rotates reuse them ([`Eval::rope_sincos_memo`]).
    fn rope(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let pos = self.input(node, 1)?;
        let op = &self.f.nodes[node].op;
        let theta = op.float("theta").ok_or_else(|| CodegenError::BadKernel { kernel: String::new(), message: "rope without theta".into() })?;
        let interleaved = op.str("form") == Some("interleaved");
        let xshape = self.shape(x)?;
        let rank = xshape.len();
        let Some(d) = xshape.last().and_then(Dim::as_const) else {
            return unsupported("rope over a last axis that is not a constant");
        };
        if d % 2 != 0 || d == 0 {
            return bad(format!("rope over an odd last axis ({d})"));
        }
        let half = d / 2;
        let lanes = at.lanes;
        let last = at.axes[rank - 1];
        let vector_ok = lanes == 1
            || (last.step
                && last.aligned
                && at.axes[..rank - 1].iter().all(|a| !a.step)
                && if interleaved { lanes % 2 == 0 } else { half % i64::from(lanes) == 0 });
        if !vector_ok {
            return self.per_lane(result, at);
        }
        let dt = self.dtype(result)?;
        // Position (uniform over the lanes).
        let pshape = self.shape(pos)?;
        let lead = At { axes: at.axes[..rank - 1].to_vec(), lanes: 1 };
        let pat = self.broadcast_at(&lead, &xshape[..rank - 1], &pshape)?;
        let p = self.eval(pos, &pat)?;
        let p = p.first().copied().ok_or_else(|| CodegenError::Builder("no position".into()))?.i()?;
        let pd = self.kb.b.build_signed_int_to_float(p, self.kb.cx.f64_type(), "pos")?;
        // Inverse frequencies, as the interpreter computes them.
        let key = (theta.to_bits(), d);
        let table = match self.rope_tables.get(&key) {
            Some(t) => *t,
            None => {
                let vals: Vec<f64> = (0..half).map(|i| theta.powf(-((2 * i) as f64) / d as f64)).collect();
                let t = self.kb.global_f64_table(&vals, "rope_inv_freq");
                self.rope_tables.insert(key, t);
                t
            }
        };
        let base = last.base;
        // Rotate-half with both halves in this thread: `base` is in the first half.
        let paired = match self.rope_pair {
            Some(rp) if !interleaved && rp.d == d && rp.first.as_value_ref() == base.as_value_ref() => Some(rp.second),
            _ => None,
        };
        if let Some(second) = paired {
            let xs = self.eval(x, at)?;
            let mut axes = at.axes.clone();
            axes[rank - 1] = Ax { base: second, tag: Tag::Other, ..last };
            let at2 = At { axes, lanes };
            let xp = self.eval(x, &at2)?;
            let mut out1 = Vec::with_capacity(lanes as usize);
            let mut out2 = Vec::with_capacity(lanes as usize);
            for l in 0..lanes as usize {
                let (s, c) = self.rope_sincos_memo(table, base, l as u32, p, pd, |ev| if l > 0 { ev.iadd(base, ev.ic(l as i64)) } else { Ok(base) })?;
                let xa = xs[l].f()?;
                let xb = xp[l].f()?;
                // First half: x_a·c − x_b·s; second: x_b·c + x_a·s.
                let xbs = self.kb.fmul(xb, s)?;
                let nxbs = self.kb.fneg(xbs)?;
                let r1 = self.kb.ffma(xa, c, nxbs)?;
                out1.push(Scalar::F(self.kb.round_to(r1, dt)?));
                let xas = self.kb.fmul(xa, s)?;
                let r2 = self.kb.ffma(xb, c, xas)?;
                out2.push(Scalar::F(self.kb.round_to(r2, dt)?));
            }
            let k2 = Self::key(result, &at2);
            self.memo.insert(k2, out2);
            return Ok(out1);
        }
        let xs = self.eval(x, at)?;
        // Partner values, pair indices and signs per lane.
        let (partner, pair_base, neg_first): (Lanes<'ctx>, IntValue<'ctx>, Option<IntValue<'ctx>>) = if interleaved {
            if lanes == 1 {
                let pb = self.kb.b.build_xor(base, self.ic(1), "pb")?;
                let mut axes = at.axes.clone();
                axes[rank - 1] = Ax { base: pb, step: false, aligned: true, zero: false, tag: Tag::Other };
                let xp = self.eval(x, &At { axes, lanes: 1 })?;
                let pair = self.kb.b.build_right_shift(base, self.ic(1), false, "pair")?;
                let odd = self.kb.b.build_and(base, self.ic(1), "odd")?;
                let even = self.kb.b.build_int_compare(IntPredicate::EQ, odd, self.ic(0), "even")?;
                (xp, pair, Some(even))
            } else {
                let xp: Lanes<'ctx> = (0..lanes as usize).map(|l| xs[l ^ 1]).collect();
                let pair = self.kb.b.build_right_shift(base, self.ic(1), false, "pair")?;
                (xp, pair, None)
            }
        } else {
            let hv = self.ic(half);
            let first = self.ilt(base, hv)?;
            let up = self.iadd(base, hv)?;
            let down = self.isub(base, hv)?;
            let pb = self.kb.b.build_select(first, up, down, "pb")?.into_int_value();
            let mut axes = at.axes.clone();
            axes[rank - 1] = Ax { base: pb, step: last.step, aligned: last.aligned, zero: false, tag: Tag::Other };
            let xp = self.eval(x, &At { axes, lanes })?;
            let pair = self.kb.b.build_select(first, base, down, "pair")?.into_int_value();
            (xp, pair, Some(first))
        };
        let mut out = Vec::with_capacity(lanes as usize);
        let mut sc: Option<(FloatValue<'ctx>, FloatValue<'ctx>)> = None;
        for l in 0..lanes as usize {
            // Interleaved lanes 2i and 2i + 1 are one pair: one angle.
            if !(interleaved && lanes > 1 && l % 2 == 1) || sc.is_none() {
                // The memo key: the lane's pair relative to `base` (tagged by the form).
                let (tag, off) = if interleaved && lanes > 1 { (0x1000 | (l / 2) as u32, (l / 2) as i64) } else { (0x2000 | l as u32, l as i64) };
                sc = Some(self.rope_sincos_memo(table, base, tag, p, pd, |ev| if off > 0 { ev.iadd(pair_base, ev.ic(off)) } else { Ok(pair_base) })?);
            }
            let (s, c) = sc.ok_or_else(|| CodegenError::Builder("no angle".into()))?;
            let xa = xs[l].f()?;
            let xb = partner[l].f()?;
            let xbs = self.kb.fmul(xb, s)?;
            // First of a pair: x·c − x_partner·s; second: x·c + x_partner·s.
            let nxbs = self.kb.fneg(xbs)?;
            let term = match neg_first {
                Some(fl) => self.kb.fsel(fl, nxbs, xbs)?,
                None => {
                    if l % 2 == 0 {
                        nxbs
                    } else {
                        xbs
                    }
                }
            };
            let r = self.kb.ffma(xa, c, term)?;
            out.push(Scalar::F(self.kb.round_to(r, dt)?));
        }
        Ok(out)
    }

    /// [`Eval::rope_sincos`] of the pair `pi(self)` computes, memoised by (`table`, `base`,
    /// `tag`, the position `p`): the pair is `tag`'s offset from `base` under the position
    /// `p`, whichever head of the position it is for, so a thread rotating several heads of
    /// one position (the head-sharing schedule of `pointwise.rs`) evaluates each angle once.
    fn rope_sincos_memo(
        &mut self,
        table: PointerValue<'ctx>,
        base: IntValue<'ctx>,
        tag: u32,
        p: IntValue<'ctx>,
        pd: FloatValue<'ctx>,
        pi: impl FnOnce(&mut Self) -> R<IntValue<'ctx>>,
    ) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let key = (table.as_value_ref() as usize, base.as_value_ref() as usize, tag, p.as_value_ref() as usize);
        if let Some(sc) = self.sincos.get(&key) {
            return Ok(*sc);
        }
        let pi = pi(self)?;
        let sc = self.rope_sincos(table, pi, pd)?;
        self.sincos.insert(key, sc);
        Ok(sc)
    }

    /// `(sin, cos)` of RoPE pair `pi`'s angle `pos · inv_freq[pi]` (f64).
    fn rope_sincos(&mut self, table: PointerValue<'ctx>, pi: IntValue<'ctx>, pd: FloatValue<'ctx>) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let f64t: BasicTypeEnum<'ctx> = self.kb.cx.f64_type().into();
        let tp = self.kb.gep(f64t, table, pi)?;
        let inv = self.kb.load(f64t, tp, 8)?.into_float_value();
        let angle = self.kb.dmul(pd, inv)?;
        math::sincos_d(self.kb, angle)
    }

    // ----- row-reduction nodes ------------------------------------------------------------

    /// Checks that a row-scalar node (a reduction's result, shape `[L…, 1]` or `[L…]`) is
    /// read at the current row: each leading coordinate is the row's own (or a size-1 axis).
    fn check_row_coord(&self, node: Node, shape: &[Dim], at: &At<'ctx>, keep_last: bool) -> R<()> {
        let lead = if keep_last { shape.len().saturating_sub(1) } else { shape.len() };
        for (i, (a, d)) in at.axes.iter().zip(shape).enumerate().take(lead) {
            if !(a.tag == Tag::Ref(i) || (d.is_one() && a.zero)) {
                return unsupported(format!(
                    "the result of {node} `{}` is read at another row than its own (broadcast across rows)",
                    self.f.nodes[node].op.kind.name()
                ));
            }
        }
        // The reduced (size-1) axis: every in-bounds coordinate is 0.
        Ok(())
    }

    /// `e^(x − max)` of a softmax node at `at` (memoised: the sum pass and the output pass
    /// share it in the one-read schedule).
    pub fn softmax_exp(&mut self, node: Node, m_safe: FloatValue<'ctx>, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let key = (node, 1u8, at.axes.iter().map(|a| (a.base.as_value_ref() as usize, a.step)).collect::<Vec<_>>(), at.lanes);
        if let Some(v) = self.derived.get(&key) {
            return Ok(v.clone());
        }
        let x = self.input(node, 0)?;
        let xs = self.eval(x, at)?;
        let mut out = Vec::with_capacity(xs.len());
        for s in xs {
            out.push(Scalar::F(exp_shifted_ftz(self.kb, s.f()?, m_safe)?));
        }
        self.derived.insert(key, out.clone());
        Ok(out)
    }

    /// `x − mean` of a layer_norm node at `at` (memoised).
    pub fn centered(&mut self, node: Node, mean: FloatValue<'ctx>, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let key = (node, 2u8, at.axes.iter().map(|a| (a.base.as_value_ref() as usize, a.step)).collect::<Vec<_>>(), at.lanes);
        if let Some(v) = self.derived.get(&key) {
            return Ok(v.clone());
        }
        let x = self.input(node, 0)?;
        let xs = self.eval(x, at)?;
        let mut out = Vec::with_capacity(xs.len());
        for s in xs {
            out.push(Scalar::F(self.kb.fsub(s.f()?, mean)?));
        }
        self.derived.insert(key, out.clone());
        Ok(out)
    }

    /// Each of `vals` rounded to `dt` ([`KernelBuilder::round_to`]); `bf16` pairs under
    /// [`Eval::bf16_words`] are rounded together (`cvt.rn.bf16x2.f32`, PTX ISA §9.7.9.21)
    /// and split back into f32 with integer operations: 1.5 instructions an element where
    /// `cvt.rn.bf16.f32` and a shift cost 2. Rounds the same as one at a time.
    fn round_lanes(&self, vals: Vec<FloatValue<'ctx>>, dt: DType) -> R<Vec<FloatValue<'ctx>>> {
        if !(self.pair_rounding && dt == DType::BF16 && vals.len() % 2 == 0) {
            return vals.into_iter().map(|v| self.kb.round_to(v, dt)).collect();
        }
        let (f32t, i32t) = (self.kb.cx.f32_type(), self.kb.cx.i32_type());
        let v2 = f32t.vec_type(2);
        let mut out = Vec::with_capacity(vals.len());
        for pair in vals.chunks(2) {
            // One `fptrunc <2 x float>`: `cvt.rn.bf16x2.f32` (two scalar ones inserted into a
            // vector are not paired by the back end).
            let mut v = v2.get_undef();
            for (i, x) in pair.iter().enumerate() {
                v = self.kb.b.build_insert_element(v, *x, self.kb.i32c(i as i64), "p")?;
            }
            let h = self.kb.b.build_float_trunc(v, self.kb.cx.bf16_type().vec_type(2), "h2")?;
            let w = self.kb.b.build_bit_cast(h, i32t, "w")?.into_int_value();
            let lo = self.kb.b.build_left_shift(w, self.kb.i32c(16), "lo")?;
            let hi = self.kb.b.build_and(w, self.kb.i32c(-65536), "hi")?;
            out.push(self.kb.b.build_bit_cast(lo, f32t, "lo")?.into_float_value());
            out.push(self.kb.b.build_bit_cast(hi, f32t, "hi")?.into_float_value());
        }
        Ok(out)
    }

    fn row_node(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        use OpKind::*;
        let kind = self.f.nodes[node].op.kind;
        let Some(stats) = self.rows.get(&node).copied() else {
            return unsupported(format!(
                "`{}` ({node}) needs a row-reduction kernel (family RowReduction) over the last axis",
                kind.name()
            ));
        };
        let dt = self.dtype(result)?;
        let shape = self.shape(result)?;
        match (kind, stats) {
            (ReduceSum | ReduceMax | ReduceMin | ReduceMean, RowScalars::Reduce(s)) => {
                let keep = self.f.nodes[node].op.bool("keepdim").unwrap_or(true);
                self.check_row_coord(node, &shape, at, keep)?;
                Ok(vec![s; at.lanes as usize])
            }
            (Softmax | LogSoftmax, RowScalars::Softmax { m_safe, m, inv_s, log_s, all_neg_inf }) => {
                let mut out = Vec::with_capacity(at.lanes as usize);
                // An all −inf row's special case once per row, not per element: its `e` are 0
                // (x − 0 = −inf) and its 1/Σe is taken as 0, so e·(1/Σe) = 0; its x − m_safe
                // is −inf and log Σe is taken as 0. Elsewhere m_safe = m (NaN included).
                let _ = m;
                let zero = self.kb.f32c(0.0);
                if kind == Softmax {
                    let inv = self.kb.fsel(all_neg_inf, zero, inv_s)?;
                    let e = self.softmax_exp(node, m_safe, at)?;
                    for s in e {
                        let p = self.kb.fmul(s.f()?, inv)?;
                        out.push(Scalar::F(self.kb.round_to(p, dt)?));
                    }
                } else {
                    let ls = self.kb.fsel(all_neg_inf, zero, log_s)?;
                    let x = self.input(node, 0)?;
                    let xs = self.eval(x, at)?;
                    for s in xs {
                        let d = self.kb.fsub(s.f()?, m_safe)?;
                        let r = self.kb.fsub(d, ls)?;
                        out.push(Scalar::F(self.kb.round_to(r, dt)?));
                    }
                }
                Ok(out)
            }
            (RmsNorm, RowScalars::RmsNorm { r }) => {
                let x = self.input(node, 0)?;
                let xs = self.eval(x, at)?;
                let ws = self.operand(node, 1, result, at)?;
                let mut hs = Vec::with_capacity(xs.len());
                for s in xs {
                    hs.push(self.kb.fmul(s.f()?, r)?);
                }
                        // One at a time: LLVM turns `round(round(x·r)·w)` into a `bf16x2` multiply.
                let hs: Vec<FloatValue<'ctx>> = hs.into_iter().map(|h| self.kb.round_to(h, dt)).collect::<R<_>>()?;
                let mut out = Vec::with_capacity(hs.len());
                for (h, w) in hs.into_iter().zip(ws) {
                    let o = self.kb.fmul(h, w.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(o, dt)?));
                }
                Ok(out)
            }
            (LayerNorm, RowScalars::LayerNorm { mean, d, r }) => {
                let cs = self.centered(node, mean, at)?;
                let ws = self.operand(node, 1, result, at)?;
                let bs = self.operand(node, 2, result, at)?;
                let mut out = Vec::with_capacity(cs.len());
                // (c − d)·r as one `fma`, c·r − d·r (|d| is a small correction of the mean:
                // the rounding of d·r is far below an f32 ulp of the result).
                let dr = self.kb.fmul(d, r)?;
                let ndr = self.kb.fneg(dr)?;
                let mut hs = Vec::with_capacity(cs.len());
                for c in cs {
                    hs.push(self.kb.ffma(c.f()?, r, ndr)?);
                }
                if self.ln_bf16_fma && dt == DType::BF16 && hs.len() % 2 == 0 {
                    let (f32t, bf16t) = (self.kb.cx.f32_type(), self.kb.cx.bf16_type());
                    let pack = |kb: &KernelBuilder<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>| -> R<inkwell::values::VectorValue<'ctx>> {
                        let mut v = f32t.vec_type(2).get_undef();
                        for (i, x) in [a, b].into_iter().enumerate() {
                            v = kb.b.build_insert_element(v, x, kb.i32c(i as i64), "p")?;
                        }
                        Ok(kb.b.build_float_trunc(v, bf16t.vec_type(2), "h2")?)
                    };
                    for i in (0..hs.len()).step_by(2) {
                        let h2 = pack(self.kb, hs[i], hs[i + 1])?;
                        let w2 = pack(self.kb, ws[i].f()?, ws[i + 1].f()?)?;
                        let b2 = pack(self.kb, bs[i].f()?, bs[i + 1].f()?)?;
                        let o2 = self.kb.intrinsic_value("llvm.fma", &[bf16t.vec_type(2).into()], &[h2.into(), w2.into(), b2.into()])?.into_vector_value();
                        for j in 0..2 {
                            let o = self.kb.b.build_extract_element(o2, self.kb.i32c(j), "o")?.into_float_value();
                            out.push(Scalar::F(self.kb.b.build_float_ext(o, f32t, "o")?));
                        }
                    }
                    return Ok(out);
                }
                let hs = self.round_lanes(hs, dt)?;
                for ((h, w), b) in hs.into_iter().zip(ws).zip(bs) {
                    let o = self.kb.ffma(h, w.f()?, b.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(o, dt)?));
                }
                Ok(out)
            }
            _ => unsupported(format!("`{}` ({node}) is used before its row statistics are complete", kind.name())),
        }
    }
}

/// `e^(x − y)` for softmax: [`math::exp_shifted`]'s `ex2((x − y)·log2e)` with
/// `ex2.approx.ftz.f32` (PTX ISA §9.7.4.12): a result below 2⁻¹²⁶ is flushed to 0, an
/// absolute error below 1.2e-38, and the instruction is one `MUFU.EX2` where the non-`ftz`
/// form costs four (a range test and two rescalings around it). A softmax's exponent is
/// never positive, so nothing else changes; −inf gives 0 and NaN stays NaN.
pub(crate) fn exp_shifted_ftz<'ctx>(kb: &mut KernelBuilder<'ctx>, x: FloatValue<'ctx>, y: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    let d = kb.fsub(x, y)?;
    let l2e = kb.f32c(std::f32::consts::LOG2_E);
    let p = kb.fmul(d, l2e)?;
    Ok(kb.intrinsic_value("llvm.nvvm.ex2.approx.ftz", &[kb.cx.f32_type().into()], &[p.into()])?.into_float_value())
}

/// The `bf16` parameters of `f` whose vector loads are best decoded as `i32` words: a
/// 16-byte load as four `i32`, each split with integer operations (`w << 16` and `w &
/// 0xffff0000` are the two f32 values, exactly): one instruction an element, where
/// extracting the high half and converting it (`cvt.f32.bf16`) costs two. Those whose every use (through views: `broadcast`, `reshape`, `slice`,
/// `transpose`, `permute`) computes in f32 — the reduced operand of a row node, a
/// `layer_norm`'s weight and bias, `rope`'s input, a transcendental or a cast, a `swiglu`'s
/// gate. A value added, multiplied or compared (where LLVM may narrow the f32 operation back
/// to a `bf16x2` one: `fptrunc(fpext a · fpext b)` is exact), copied to an output, or used
/// anywhere else keeps the `fpext` LLVM can see through.
pub(crate) fn words_params(f: &Function) -> std::collections::HashSet<usize> {
    use OpKind::*;
    let mut users: HashMap<Value, Vec<(Node, usize)>> = HashMap::new();
    for (n, nd) in f.nodes.iter() {
        for (i, &v) in nd.inputs.iter().enumerate() {
            users.entry(v).or_default().push((n, i));
        }
    }
    let computes_f32 = |v: Value| -> bool {
        let mut stack = vec![v];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            if f.outputs.contains(&v) {
                return false;
            }
            for &(n, i) in users.get(&v).map(Vec::as_slice).unwrap_or(&[]) {
                let nd = &f.nodes[n];
                let ok = match nd.op.kind {
                    Broadcast | Reshape | Slice | Transpose | Permute => {
                        stack.extend(nd.results.iter().copied());
                        true
                    }
                    Softmax | LogSoftmax | RmsNorm | ReduceSum | ReduceMax | ReduceMin | ReduceMean => i == 0,
                    LayerNorm => true,
                    Rope => i == 0,
                    Swiglu => i == 0,
                    Exp | Log | Sqrt | Rsqrt | Recip | Sigmoid | Silu | Gelu | Tanh | Sin | Cos | Cast => true,
                    _ => false,
                };
                if !ok {
                    return false;
                }
            }
        }
        true
    };
    f.params.iter().enumerate().filter(|&(_, &p)| f.ty(p).dtype == DType::BF16 && computes_f32(p)).map(|(i, _)| i).collect()
}

trait VecTypeOf<'ctx> {
    fn vec_type_of(self, lanes: u32) -> R<inkwell::types::VectorType<'ctx>>;
}

impl<'ctx> VecTypeOf<'ctx> for BasicTypeEnum<'ctx> {
    fn vec_type_of(self, lanes: u32) -> R<inkwell::types::VectorType<'ctx>> {
        Ok(match self {
            BasicTypeEnum::FloatType(t) => t.vec_type(lanes),
            BasicTypeEnum::IntType(t) => t.vec_type(lanes),
            other => return Err(CodegenError::Builder(format!("no vector of {other:?}"))),
        })
    }
}

/// Converts a `Dim` list to the `[d0, d1]` text of error messages.
pub(crate) fn shape_text(s: &[Dim]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}
