//! The element evaluator: emits the LLVM IR that computes one value of a kernel body at one
//! coordinate. Every family that computes element by element uses it (pointwise, layout,
//! gather, row reductions, KV append, matmul epilogues); it sits below them and imports none.
//!
//! A kernel body is an IR [`Function`]; a generator decides which output elements a thread
//! computes and hands the evaluator their coordinate ([`At`]). The evaluator walks the body's
//! DAG backwards from the value asked for, mapping the coordinate through each op to its
//! operands' coordinates —
//! - NumPy broadcasting (leading axes dropped, size-1 axes pinned to 0),
//! - `transpose`/`permute` (axes permuted), `slice` (offset), `reshape` (through the
//!   row-major linear index; the longest common suffix of the two shapes maps unchanged),
//!   `concat` (a branch per input), `gather` (the index is loaded, the table row follows),
//! - `rope` and `rotary` (the element's partner within the last axis),
//!
//! and loads the body's parameters from their buffers with their strides (any strides: a
//! broadcast input has stride 0, a transposed one is strided). Every op's result is rounded
//! to its dtype exactly where the unfused graph rounds (arithmetic in `f32`, then
//! `fptrunc`/`fpext` for `bf16`/`f16`), so a fused kernel matches the interpreter op by op.
//!
//! **Lanes.** A coordinate covers `lanes` consecutive elements along one axis (the *lane
//! axis*, [`Ax::step`]): values are vectors of per-lane scalars, loaded as one vector where
//! the buffer allows it ([`load`]). Ops that cannot keep the lane structure (a gather whose
//! index varies per lane, a reshape that splits the lane group across rows) split the
//! coordinate into single lanes and evaluate each.
//!
//! **Memoisation.** Values are memoised per (value, coordinate), so a DAG shared by several
//! outputs or used twice is computed once; values computed inside a branch (`concat`,
//! `gather`) are forgotten after it, since they do not dominate the code that follows.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the evaluator's types: [`Eval`], coordinates ([`At`], [`Ax`]), [`Scalar`], [`Buf`] |
//! | `index.rs` | index arithmetic, splitting and broadcasting coordinates |
//! | `load.rs` | loads and stores: vector or lane by lane, storage encodings, `bf16` as words |
//! | `stage.rs` | shared-memory staging of row inputs (the row reductions' cluster schedule) |
//! | `ops.rs` | the op dispatch, sources and element-wise arithmetic |
//! | `views.rs` | `reshape`, `concat`, `gather` and the branches they emit |
//! | `rope.rs` | rotary position embeddings: `rope` (angles) and `rotary` (cos/sin tables) |
//! | `rows.rs` | a row reduction's results read element by element (softmax, norms, `reduce_*`) |
//!
//! Design notes: book/src/design/element-wise.md

mod index;
mod load;
mod ops;
mod rope;
mod rows;
mod stage;
mod views;

use std::collections::HashMap;

use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue};
use sinter_ir::{DType, Dim, Function, Node, Value};

use crate::isa::{KernelBuilder, SizeTable};
use crate::math::R;
use crate::error::CodegenError;

pub(crate) use self::load::words_params;
pub(crate) use self::rows::exp_shifted_ftz;
pub(crate) use self::stage::Stage;

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
/// generator; see `kernels/reduce`).
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
    /// Nesting of [`Eval::eval`] calls now (bounded by [`MAX_EXPR_DEPTH`]).
    depth: usize,
    derived: HashMap<DerivedKey, Lanes<'ctx>>,
    /// RoPE angles already computed (see [`Eval::rope`]): a thread that rotates several heads
    /// of one position computes each pair's sine and cosine once.
    sincos: HashMap<SincosKey, (FloatValue<'ctx>, FloatValue<'ctx>)>,
    rope_tables: HashMap<Vec<u64>, PointerValue<'ctx>>,
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
    /// row reductions); `None` elsewhere.
    pub stage: Option<Stage<'ctx>>,
    /// Parameters' vectors the generator loaded ahead at a chunk whose last axis has the given
    /// base (an SSA value of that chunk alone, as [`Eval::load_vector`] returned them): a load
    /// of the parameter there takes the vector instead of reading memory (a LayerNorm's row
    /// head, loaded before the slice's copies: the row reductions' `RowSchedule::head_shift`).
    pub pinned: Vec<(usize, IntValue<'ctx>, inkwell::values::VectorValue<'ctx>)>,
    /// Depth of [`Eval::branch`] arms being emitted (no staging inside a branch).
    branch_depth: u32,
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
            depth: 0,
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
}

/// Converts a `Dim` list to the `[d0, d1]` text of error messages.
pub(crate) fn shape_text(s: &[Dim]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}
