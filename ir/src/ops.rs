//! The op table: every op of sinter's IR, defined once.
//!
//! Each [`OpInfo`] row gives the op's text name, its operands (a trailing `?` marks an optional
//! operand, `*` a variadic list), its attributes with their kinds and defaults, the shape rule
//! ([`crate::infer`]) and a doc line with the semantics. The text format, the verifier, the
//! builder, later the e-graph language and the book's op reference are all derived from this
//! table: an op is added by adding one row (and its interpreter case).

pub use crate::attr::{kind_text, Attr, AttrDefault, AttrKind, AttrSpec, Attrs};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::infer::{self, InferCtx, ShapeError};
use crate::types::TensorType;

/// The family an op belongs to; the passes and the code generator dispatch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// Element-wise on one input.
    Unary,
    /// Element-wise on two inputs with broadcasting.
    Binary,
    /// Comparison giving `bool`.
    Compare,
    /// Reduction over one axis.
    Reduce,
    /// Layout change, no arithmetic.
    Layout,
    /// Produces a tensor from attributes alone.
    Source,
    /// Composite op with its own kernel family (matmul, attention, norms, ...).
    Composite,
    /// A collective over the ranks of a tensor-parallel group (each rank runs the graph on
    /// its shard; the runtime does the exchange, the interpreter simulates it).
    Collective,
    /// A call of another function of the graph.
    Call,
}

/// The shape rule of an op: from the operands' types and the attributes to the results' types.
pub type ShapeRule = fn(&InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError>;

/// One row of the op table.
#[derive(Clone, Copy)]
pub struct OpInfo {
    /// The op.
    pub kind: OpKind,
    /// Text name (also the DSL's method name).
    pub name: &'static str,
    /// Family.
    pub class: OpClass,
    /// Operand names; `name?` optional (only trailing), `name*` variadic (only alone).
    pub operands: &'static [&'static str],
    /// Attributes, in printing order.
    pub attrs: &'static [AttrSpec],
    /// Shape and dtype rule.
    pub infer: ShapeRule,
    /// Semantics, one paragraph.
    pub doc: &'static str,
}

const fn a(name: &'static str, kind: AttrKind, default: AttrDefault) -> AttrSpec {
    AttrSpec { name, kind, default }
}
use AttrDefault as D;
use AttrKind as K;

const AXIS: AttrSpec = a("axis", K::Int, D::Int(-1));
const KEEPDIM: AttrSpec = a("keepdim", K::Bool, D::Bool(true));
const EPS: AttrSpec = a("eps", K::Float, D::Required);
const SCALE: AttrSpec = a("scale", K::Float, D::Required);
const HEADS: AttrSpec = a("heads", K::Int, D::Required);
const KV_HEADS: AttrSpec = a("kv_heads", K::Int, D::Required);
/// `attention`/`paged_attention` also return each row's log-sum-exp (f32, natural log).
const LSE: AttrSpec = a("lse", K::Bool, D::Bool(false));
/// `rope`'s attributes after `theta` and `form`: the partial rotary dim and the frequency
/// scaling of Hugging Face's `rope_scaling` (see the op's doc and [`crate::rope`]).
const ROPE_ATTRS: [AttrSpec; 12] = [
    a("rotary_dim", K::Int, D::Absent),
    a("scaling", K::Enum(&["none", "linear", "llama3", "yarn"]), D::Str("none")),
    a("factor", K::Float, D::Absent),
    a("low_freq_factor", K::Float, D::Absent),
    a("high_freq_factor", K::Float, D::Absent),
    a("original_max_position_embeddings", K::Int, D::Absent),
    a("beta_fast", K::Float, D::Absent),
    a("beta_slow", K::Float, D::Absent),
    a("truncate", K::Bool, D::Absent),
    a("mscale", K::Float, D::Absent),
    a("mscale_all_dim", K::Float, D::Absent),
    a("attention_factor", K::Float, D::Absent),
];
/// `paged_attention`'s optional unified maximum φ (FlashDecoding++'s asynchronous softmax).
const UNIFIED_MAX: AttrSpec = a("unified_max", K::Float, D::Absent);
/// `attention`/`paged_attention`'s optional sliding window W (keys per query row, causal only).
const WINDOW: AttrSpec = a("window", K::Int, D::Absent);
/// `attention`/`paged_attention`'s optional logit softcap c (scores c·tanh(s/c)).
const SOFTCAP: AttrSpec = a("softcap", K::Float, D::Absent);

macro_rules! op_table {
    ($( $kind:ident => $name:literal, $class:ident, [$($operand:literal),*], [$($attr:expr),*], $infer:path, $doc:literal; )*) => {
        /// Every op of the IR. See [`OpKind::info`] for its row of the op table.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind { $(#[doc = $doc] $kind,)* }

        /// The op table, one row per [`OpKind`], in declaration order.
        pub static OP_TABLE: &[OpInfo] = &[
            $(OpInfo {
                kind: OpKind::$kind,
                name: $name,
                class: OpClass::$class,
                operands: &[$($operand),*],
                attrs: &[$($attr),*],
                infer: $infer,
                doc: $doc,
            },)*
        ];
    };
}

op_table! {
    // --- unary element-wise -------------------------------------------------------------
    Neg => "neg", Unary, ["x"], [], infer::unary_any, "−x, element-wise; any numeric dtype.";
    Abs => "abs", Unary, ["x"], [], infer::unary_any, "|x|, element-wise; any numeric dtype.";
    Exp => "exp", Unary, ["x"], [], infer::unary_float, "eˣ, element-wise; float dtypes.";
    Log => "log", Unary, ["x"], [], infer::unary_float, "Natural logarithm, element-wise; log(0) = −inf, log(x<0) = NaN.";
    Sqrt => "sqrt", Unary, ["x"], [], infer::unary_float, "√x, element-wise; NaN for x < 0.";
    Rsqrt => "rsqrt", Unary, ["x"], [], infer::unary_float, "1/√x, element-wise; rsqrt(0) = +inf.";
    Recip => "recip", Unary, ["x"], [], infer::unary_float, "1/x, element-wise.";
    Sigmoid => "sigmoid", Unary, ["x"], [], infer::unary_float, "1/(1+e⁻ˣ), element-wise.";
    Silu => "silu", Unary, ["x"], [], infer::unary_float, "x·sigmoid(x) (SiLU / swish), element-wise.";
    Gelu => "gelu", Unary, ["x"], [a("form", K::Enum(&["erf", "tanh"]), D::Str("erf"))], infer::unary_float,
        "GELU: `erf` form x·Φ(x) = x/2·(1+erf(x/√2)); `tanh` form x/2·(1+tanh(√(2/π)(x+0.044715x³))) (GPT-2).";
    Tanh => "tanh", Unary, ["x"], [], infer::unary_float, "Hyperbolic tangent, element-wise.";
    Erf => "erf", Unary, ["x"], [], infer::unary_float,
        "Gauss error function erf(x) = 2/√π ∫₀ˣ e^(−t²) dt, element-wise; float dtypes; erf(±0) = ±0, erf(±inf) = ±1, NaN propagates. The interpreter computes it in f64 with fdlibm's `erf` (the `libm` crate); the kernels compute it in f32 with N. Juffa's single-precision `erff` (two minimax pieces: x + x·P(x²) below |x| = 0.9277, sign(x)·(1 − e^(Q(|x|))) above), within 1.04 ulp of the exact value (measured against libm over a dense sweep) plus at most 0.8 ulp from the device's `ex2.approx`; bf16/f16 compute in f32 and round once. With it, Hugging Face's `0.5·x·(1 + erf(x/√2))` is recognised as `gelu` (erf form).";
    Sin => "sin", Unary, ["x"], [], infer::unary_float, "Sine (radians), element-wise.";
    Cos => "cos", Unary, ["x"], [], infer::unary_float, "Cosine (radians), element-wise.";
    Cast => "cast", Unary, ["x"], [a("dtype", K::DType, D::Required)], infer::cast,
        "Converts to `dtype`: float→float rounds to nearest even; float→int truncates toward zero and saturates (NaN→0); →bool is x≠0. →`f8e4m3` rounds to nearest even and saturates (PTX `cvt.rn.satfinite.e4m3x2.f32`): finite values beyond ±448 and ±inf give ±448, NaN stays NaN; `f8e4m3`→ a float dtype is exact.";
    Dequantize => "dequantize", Unary, ["x"], [a("dtype", K::DType, D::Required)], infer::dequantize,
        "Block-quantized `q8_0`/`q4_1`/`q5_0` (GGUF blocks of 32 along the last axis) or `q4_k`/`q6_k` (super-blocks of 256) → float `dtype` (bf16, f16, f32), element-wise: q·d (`q8_0`), nibble·d + m (`q4_1`), (q − 16)·d (`q5_0`), exact; (d·sc)·q − dmin·mn (`q4_k`) and (d·sc)·(q − 32) (`q6_k`) as llama.cpp computes them in f32; rounded once to `dtype` (llama.cpp's `dequantize_row_*`). The only op that reads a quantized tensor.";
    QuantizeFp8 => "quantize_fp8", Binary, ["x", "scale"], [], infer::quantize_fp8,
        "Per-tensor FP8 quantization (OCP OFP8 E4M3, Micikevicius et al. 2022, arXiv 2209.05433): float `x` (bf16, f16, f32) → `f8e4m3`, element-wise x/scale, the quotient computed in f32 (IEEE division, one rounding) and converted as PTX's `cvt.rn.satfinite.e4m3x2.f32` does: round to nearest even, finite values beyond ±448 and ±inf saturate to ±448, NaN stays NaN, subnormals (down to 2⁻⁹) kept. `scale` is the per-tensor *dequantisation* scale (x ≈ scale·quantize_fp8(x, scale); the scale_a/scale_b of `torch._scaled_mm`, Transformer Engine's scale_inv, typically amax(x)/448), one f32 in device memory: a scalar tensor f32[].";
    DequantizeFp8 => "dequantize_fp8", Binary, ["x", "scale"], [a("dtype", K::DType, D::Required)], infer::dequantize_fp8,
        "Per-tensor FP8 dequantization: `f8e4m3` `x` → float `dtype` (bf16, f16, f32), element-wise x·scale computed in f32 (the fp8 value is exact in f32: one rounding) and rounded to `dtype`; `scale` an f32 scalar tensor f32[] (as in `quantize_fp8`). With `cast`, the only op that reads f8e4m3 as numbers: `matmul(dequantize_fp8(a8, sa), dequantize_fp8(b8, sb))` is the fp8 matmul, `attention` of dequantised q, k, v the fp8 attention; the compiler keeps each one kernel reading the fp8 bytes and the scales.";
    // --- binary element-wise with NumPy broadcasting --------------------------------------
    Add => "add", Binary, ["a", "b"], [], infer::binary, "a + b with NumPy broadcasting; operands share a dtype.";
    Sub => "sub", Binary, ["a", "b"], [], infer::binary, "a − b with broadcasting.";
    Mul => "mul", Binary, ["a", "b"], [], infer::binary, "a · b with broadcasting.";
    Div => "div", Binary, ["a", "b"], [], infer::binary, "a / b with broadcasting; integer division truncates toward zero, by zero is an error.";
    Maximum => "maximum", Binary, ["a", "b"], [], infer::binary, "max(a, b) element-wise; NaN if either is NaN.";
    Minimum => "minimum", Binary, ["a", "b"], [], infer::binary, "min(a, b) element-wise; NaN if either is NaN.";
    Pow => "pow", Binary, ["a", "b"], [], infer::binary_float, "aᵇ element-wise (IEEE `pow`); float dtypes.";
    // --- comparisons and select ----------------------------------------------------------
    Eq => "eq", Compare, ["a", "b"], [], infer::compare, "a = b → bool, with broadcasting; NaN compares unequal.";
    Ne => "ne", Compare, ["a", "b"], [], infer::compare, "a ≠ b → bool.";
    Lt => "lt", Compare, ["a", "b"], [], infer::compare, "a < b → bool.";
    Le => "le", Compare, ["a", "b"], [], infer::compare, "a ≤ b → bool.";
    Gt => "gt", Compare, ["a", "b"], [], infer::compare, "a > b → bool.";
    Ge => "ge", Compare, ["a", "b"], [], infer::compare, "a ≥ b → bool.";
    Select => "select", Binary, ["cond", "a", "b"], [], infer::select,
        "cond ? a : b element-wise, all three broadcast; `cond` is bool, `a` and `b` share a dtype.";
    // --- logical (bool) ------------------------------------------------------------------
    LogicalAnd => "logical_and", Binary, ["a", "b"], [], infer::logical, "a ∧ b element-wise on bool operands with broadcasting → bool (`torch.logical_and`, ONNX `And`).";
    LogicalOr => "logical_or", Binary, ["a", "b"], [], infer::logical, "a ∨ b element-wise on bool operands with broadcasting → bool (`torch.logical_or`, ONNX `Or`).";
    LogicalNot => "logical_not", Unary, ["x"], [], infer::logical, "¬x element-wise on a bool operand → bool (`torch.logical_not`, ONNX `Not`).";
    // --- reductions ----------------------------------------------------------------------
    ReduceSum => "reduce_sum", Reduce, ["x"], [AXIS, KEEPDIM], infer::reduce, "Σ over `axis` (negative counts from the end), accumulated in f64; an empty axis sums to 0.";
    ReduceMax => "reduce_max", Reduce, ["x"], [AXIS, KEEPDIM], infer::reduce, "max over `axis`; NaN if any element is NaN; an empty axis gives −inf.";
    ReduceMin => "reduce_min", Reduce, ["x"], [AXIS, KEEPDIM], infer::reduce, "min over `axis`; NaN if any element is NaN; an empty axis gives +inf.";
    ReduceMean => "reduce_mean", Reduce, ["x"], [AXIS, KEEPDIM], infer::reduce_mean, "Mean over `axis`; an empty axis gives NaN (0/0).";
    Argmax => "argmax", Reduce, ["x"], [AXIS, KEEPDIM], infer::argmax,
        "Index (i64) of the largest element along `axis`: the first on ties, the first NaN if the row has one; an empty axis gives −1. The passes lower it by its decomposition (max, compare, index select, min).";
    Softmax => "softmax", Composite, ["x"], [AXIS], infer::row_op,
        "Safe softmax over `axis` with f32 statistics: exp(x−max)/Σexp(x−max); a row of all −inf gives 0; NaN in a row gives NaN for the row.";
    LogSoftmax => "log_softmax", Composite, ["x"], [AXIS], infer::row_op,
        "x − max − log Σexp(x−max) over `axis`, f32 statistics; a row of all −inf gives −inf.";
    // --- layout --------------------------------------------------------------------------
    Transpose => "transpose", Layout, ["x"], [a("dim0", K::Int, D::Int(-2)), a("dim1", K::Int, D::Int(-1))], infer::transpose,
        "Swaps axes `dim0` and `dim1` (negative counts from the end).";
    Permute => "permute", Layout, ["x"], [a("perm", K::Ints, D::Required)], infer::permute,
        "Reorders axes: result axis i is input axis perm[i]; `perm` is a permutation of 0..rank.";
    Reshape => "reshape", Layout, ["x"], [a("shape", K::Dims, D::Required)], infer::reshape,
        "Same elements in row-major order under a new `shape`; element counts must be provably equal.";
    Broadcast => "broadcast", Layout, ["x"], [a("shape", K::Dims, D::Required)], infer::broadcast,
        "Expands to `shape` by NumPy rules (leading axes added, size-1 axes repeated); also called expand.";
    Concat => "concat", Layout, ["inputs*"], [AXIS], infer::concat,
        "Joins ≥1 tensors of one dtype along `axis`; other axes must agree.";
    Slice => "slice", Layout, ["x"], [AXIS, a("start", K::Dim, D::Required), a("end", K::Dim, D::Required)], infer::slice,
        "Elements start..end (end exclusive, step 1) of `axis`; 0 ≤ start ≤ end ≤ size, checked when known and at run time.";
    Gather => "gather", Layout, ["table", "indices"], [], infer::gather,
        "Embedding lookup: out[i…, :] = table[indices[i…], :]; table [V, …], integer indices of any shape; out of range is an error.";
    // --- sources -------------------------------------------------------------------------
    Constant => "constant", Source, [], [a("value", K::Float, D::Required), a("dtype", K::DType, D::Required), a("shape", K::Dims, D::Empty)], infer::constant,
        "A tensor of `shape` (default scalar) whose every element is `value` rounded to `dtype`.";
    Iota => "iota", Source, [], [a("dtype", K::DType, D::Required), a("shape", K::Dims, D::Required), a("axis", K::Int, D::Int(0))], infer::iota,
        "out[i…] = the index along `axis`; positions and causal masks are built from it.";
    // --- composite -----------------------------------------------------------------------
    Matmul => "matmul", Composite, ["a", "b"], [a("transpose_a", K::Bool, D::Bool(false)), a("transpose_b", K::Bool, D::Bool(false))], infer::matmul,
        "Batched matrix product a[…, M, K] · b[…, K, N] → […, M, N] (after optional transposes of the last two axes), batch axes broadcast, f32+ accumulation, one rounding to the dtype.";
    Rope => "rope", Composite, ["x", "positions"], [a("theta", K::Float, D::Required), a("form", K::Enum(&["rotate_half", "interleaved"]), D::Str("rotate_half")), ROPE_ATTRS[0], ROPE_ATTRS[1], ROPE_ATTRS[2], ROPE_ATTRS[3], ROPE_ATTRS[4], ROPE_ATTRS[5], ROPE_ATTRS[6], ROPE_ATTRS[7], ROPE_ATTRS[8], ROPE_ATTRS[9], ROPE_ATTRS[10], ROPE_ATTRS[11]], infer::rope,
        "Rotary position embedding (Su et al. 2021, arXiv 2104.09864) over the last axis D: the first R = `rotary_dim` features (optional, even, 2 ≤ R ≤ D; default D) rotate, the rest pass through unchanged (GPT-NeoX/Phi's `partial_rotary_factor`, R = int(D·factor)); pair i < R/2 is rotated by the angle pos·inv_freq[i]; `rotate_half` pairs (i, i+R/2) as in Llama/HF, `interleaved` pairs (2i, 2i+1) as in GPT-J/llama.cpp; `positions` (integers) broadcast against x's shape without its last axis; angles in f64, result rounded once; θ a finite number above 0. inv_freq follows Hugging Face transformers' `modeling_rope_utils.py` (`rope_type`) over dim = R: `scaling=\"none\"` θ^(−2i/R); `\"linear\"` (`factor`) θ^(−2i/R)/factor; `\"llama3\"` (`factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings` = L) with wavelength w = 2π/inv: w > L/low → inv/factor, w < L/high → inv, between → (1−s)·inv/factor + s·inv with s = (L/w − low)/(high − low); `\"yarn\"` (Peng et al. 2023, arXiv 2309.00071; `factor`, `original_max_position_embeddings` = L, `beta_fast` 32, `beta_slow` 1, `truncate` true, `mscale`, `mscale_all_dim`, `attention_factor`): c(b) = R·ln(L/(2πb))/(2 ln θ), low = max(⌊c(beta_fast)⌋, 0), high = min(⌈c(beta_slow)⌉, R−1) (no floor/ceil with `truncate=false`), ramp r_i = clamp((i − low)/(high − low), 0, 1) (high += 0.001 if equal), inv = θ^(−2i/R)·(r_i/factor + 1 − r_i), and the rotated features are scaled by the attention factor: `attention_factor` if given, else m(factor, mscale)/m(factor, mscale_all_dim) when both are given and non-zero, else m(factor, 1), with m(s, k) = 1 if s ≤ 1 else 0.1·k·ln s + 1 (HF multiplies cos and sin by it). A scaling's parameters are required (`beta_*`, `truncate`, `mscale*`, `attention_factor` optional), and parameters of another scaling are an error.";
    Rotary => "rotary", Composite, ["x", "cos", "sin"], [a("form", K::Enum(&["rotate_half", "interleaved"]), D::Str("rotate_half")), ROPE_ATTRS[0]], infer::rotary,
        "Rotation by caller-supplied tables (rotary embedding, Su et al. 2021, arXiv 2104.09864, as Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin)` takes `position_embeddings`): over the last axis D of float x, the first R = `rotary_dim` features (optional, even, 2 ≤ R ≤ D; default D) rotate, the rest pass through; `cos`, `sin` (one float dtype) have last axis R and broadcast against x[..., :R] (HF's `unsqueeze_dim`: [T, R], [B, 1, T, R], …) and give every feature its own factors, any values (no θ is implied, unlike `rope`). `rotate_half`, h = R/2, i < h: out[i] = x[i]·cos[i] − x[i+h]·sin[i], out[i+h] = x[i+h]·cos[i+h] + x[i]·sin[i+h] (x·cos + rotate_half(x)·sin); `interleaved` (GPT-J's `rotate_every_two`): out[2i] = x[2i]·cos[2i] − x[2i+1]·sin[2i], out[2i+1] = x[2i+1]·cos[2i+1] + x[2i]·sin[2i+1]. Products and sum in f32 or wider, rounded once to x's dtype; NaN in x or a table propagates to the features that read it.";
    RmsNorm => "rms_norm", Composite, ["x", "weight"], [EPS], infer::rms_norm,
        "RMSNorm (Zhang & Sennrich 2019) over the last axis: h = cast_x(x·rsqrt(mean(x²)+eps)) computed in f32 with eps added in f32, out = h·weight; a zero row gives 0; eps a finite f32 ≥ 0.";
    LayerNorm => "layer_norm", Composite, ["x", "weight", "bias"], [EPS], infer::layer_norm,
        "LayerNorm (Ba et al. 2016) over the last axis: (x−mean)·rsqrt(var+eps)·weight + bias, statistics in f32, biased variance; eps a finite f32 ≥ 0.";
    Swiglu => "swiglu", Composite, ["gate", "up"], [], infer::swiglu,
        "SwiGLU (Shazeer 2020): silu(gate)·up element-wise, same shape and dtype, silu rounded to the dtype before the product as in the unfused graph.";
    Attention => "attention", Composite, ["q", "k", "v", "mask?"],
        [SCALE, a("causal", K::Bool, D::Bool(false)), HEADS, KV_HEADS, a("layout", K::Enum(&["bhsd", "bshd"]), D::Str("bhsd")), LSE, WINDOW, SOFTCAP],
        infer::attention,
        "softmax(scale·Q·Kᵀ + mask)·V with f32 statistics (FlashAttention, Dao 2022), `scale` a finite f32: q [B,H,Sq,D], k [B,Hkv,Skv,D], v [B,Hkv,Skv,Dv] in `bhsd` ([B,S,H,D] in `bshd`); H a multiple of Hkv (GQA: query head h reads KV head h/(H/Hkv)); causal aligned bottom-right (query i sees keys j ≤ i+Skv−Sq); optional additive mask broadcast to [B,H,Sq,Skv]; every visible key's p·v is made, a masked key's with p = 0 (so NaN or ±inf in V there gives NaN, as the written-out softmax·V does), and a fully masked row gives Σ 0·v (0 for finite V); keys hidden by `causal`/`window` are never read. With `lse=true` a second result f32 [B,H,Sq] ([B,Sq,H] in `bshd`): each row's natural-log log-sum-exp of its scores, ln Σⱼ exp(scale·q·kⱼ + maskⱼ) (−inf for a fully masked row), for `attention_merge`. `softcap=c` (optional, a finite f32 above 0; Gemma 2's logit soft-capping) replaces each score s = scale·q·k by c·tanh(s/c), in f32, before the mask is added. `window=W` (optional, an integer ≥ 1; needs `causal=true`) is a causal sliding window as Hugging Face's `sliding_window` (Mistral, Gemma 2/3) and FlashAttention's `window_size=(W−1, 0)`: query i, at absolute position pᵢ = i+Skv−Sq, sees key j iff j ≤ pᵢ and pᵢ − j < W, so W keys including its own; a window of at least Skv is plain causal attention. Kernels skip the key tiles wholly outside the window.";
    KvAppend => "kv_append", Composite, ["k_pages", "v_pages", "k_new", "v_new", "block_table", "start_pos"], [], infer::kv_append,
        "Writes new K/V rows into a paged cache (PagedAttention, Kwon et al. 2023): pages [P, page_size, Hkv, D], new [B, T, Hkv, D], block_table [B, max_pages] i32, start_pos [B] i32; token t of sequence b goes to slot start_pos[b]+t, page block_table[b][slot/page_size]; returns the updated (k_pages, v_pages).";
    PagedAttention => "paged_attention", Composite, ["q", "k_pages", "v_pages", "block_table", "seq_lens"],
        [SCALE, a("causal", K::Bool, D::Bool(true)), HEADS, KV_HEADS, LSE, UNIFIED_MAX, WINDOW, SOFTCAP],
        infer::paged_attention,
        "Attention (scores scaled by `scale`, a finite f32) of q [B, H, T, D] over a paged cache [P, page_size, Hkv, D] read through block_table [B, max_pages] i32 with seq_lens [B] i32 keys per sequence (the lengths live in device memory); causal aligned bottom-right per sequence; GQA as in `attention`; a sequence with no visible key gives 0. With `lse=true` a second result f32 [B, H, T]: each row's natural-log log-sum-exp of its visible scores (−inf where none), for `attention_merge`. `unified_max=φ` (optional, a finite f32; an execution strategy that does not change the result) asks the split-KV kernel for FlashDecoding++'s asynchronous softmax (Hong et al. 2023, arXiv 2311.01282): every partial softmax takes exp(s − φ) against this one maximum chosen ahead of time (from the model's score statistics) instead of its running maximum, so no partial reduces maxima or rescales its sums, and the partials merge without synchronising; φ cancels, so the result is the same softmax; a partial whose largest score lies too far above or below φ for exp(s − φ) to be safe in f32 is recomputed with the online softmax, so any finite φ gives the right result and one near the scores' maximum the fast one. Measured on the H200 (B16, GQA 32/8, 32768 keys, D128) it is not faster than the online softmax yet (0.98×: the kernel is bound by its K/V loads in flight), so it is off unless given. `window=W` and `softcap=c` as in `attention`, with pᵢ = i+seq_lens[b]−T per sequence: query i of sequence b sees key j iff j ≤ pᵢ and pᵢ − j < W.";
    AttentionMerge => "attention_merge", Composite, ["o_a", "lse_a", "o_b", "lse_b"], [], infer::attention_merge,
        "Merges two partial attention states over disjoint key sets by their log-sum-exp (FlashInfer's merge state; Ye et al. 2024, cascade inference): o_a, o_b [..., D] of one float dtype, lse_a, lse_b f32 [...] (natural log, as `attention` with `lse=true` gives); with M = max(lse_a, lse_b), wₓ = exp(lseₓ − M): o = (w_a·o_a + w_b·o_b)/(w_a + w_b) rounded once, lse = M + ln(w_a + w_b) in f32. A state whose lse is −inf is empty and its o is not read; both empty gives o = 0, lse = −inf; NaN propagates. Commutative and associative (up to rounding), so partial states of any key split merge in any order.";
    // --- collectives (tensor parallelism) --------------------------------------------------
    AllReduce => "all_reduce", Collective, ["x"], [a("ranks", K::Int, D::Required)], infer::all_reduce,
        "Sum of x over the `ranks` ranks of the tensor-parallel group (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053; NCCL `ncclAllReduce` with `ncclSum`): every rank gets Σᵣ xᵣ, same type; a float dtype; summed in f32 or wider and rounded once (NCCL's ring may round each partial sum to the dtype: equal within the dtype's tolerance). With `ranks=1` it is x.";
    AllGather => "all_gather", Collective, ["x"], [AXIS, a("ranks", K::Int, D::Required)], infer::all_gather,
        "Concatenation along `axis` of x from every rank of the tensor-parallel group, in rank order (NCCL `ncclAllGather`, then a transpose of the rank axis where `axis` is not the first): the axis grows `ranks` times; any dtype but the block-quantized ones.";
    // --- functions -----------------------------------------------------------------------
    Call => "call", Call, ["args*"], [a("func", K::Str, D::Required)], infer::call,
        "Calls function `func` of the graph with `args`; results are its outputs. A block (a decoder layer) is defined once and called per layer with different weights.";
}

impl OpKind {
    /// This op's row of the op table.
    pub fn info(self) -> &'static OpInfo {
        // The table is generated in declaration order, so the discriminant is the index.
        &OP_TABLE[self as usize]
    }

    /// Text name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Looks an op up by text name.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OP_TABLE.iter().find(|i| i.name == name).map(|i| i.kind)
    }

    /// Index of attribute `name` in this op's attribute list.
    pub fn attr_index(self, name: &str) -> Option<usize> {
        self.info().attrs.iter().position(|a| a.name == name)
    }

    /// Whether `n` operands are acceptable.
    pub fn arity_ok(self, n: usize) -> bool {
        let ops = self.info().operands;
        if ops.len() == 1 && ops[0].ends_with('*') {
            return true;
        }
        let required = ops.iter().filter(|o| !o.ends_with('?')).count();
        n >= required && n <= ops.len()
    }

    /// Human-readable arity, e.g. `2`, `3 or 4`, `any number of`.
    pub fn arity_text(self) -> String {
        let ops = self.info().operands;
        if ops.len() == 1 && ops[0].ends_with('*') {
            return if self == OpKind::Concat { "at least 1".into() } else { "any number of".into() };
        }
        let required = ops.iter().filter(|o| !o.ends_with('?')).count();
        if required == ops.len() {
            format!("{required}")
        } else {
            format!("{required} to {}", ops.len())
        }
    }
}

/// An op with its attributes: what a node computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Which op.
    pub kind: OpKind,
    /// One value per attribute of the op's table row, in table order (defaults filled in; an
    /// optional attribute not given is [`Attr::Absent`]).
    pub attrs: Vec<Attr>,
}

/// An attribute was missing, unknown or of the wrong kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    /// Not an attribute of this op.
    #[error("`{op}` has no attribute `{name}` (it has: {known})")]
    Unknown {
        /// The op's text name.
        op: &'static str,
        /// The attribute's name.
        name: String,
        /// The op's attributes.
        known: String,
    },
    /// Required and absent.
    #[error("`{op}` needs attribute `{name}`")]
    Missing {
        /// The op's text name.
        op: &'static str,
        /// The attribute's name.
        name: &'static str,
    },
    /// Given twice.
    #[error("attribute `{name}` of `{op}` is given twice")]
    Duplicate {
        /// The op's text name.
        op: &'static str,
        /// The attribute's name.
        name: String,
    },
    /// Wrong kind of value.
    #[error("attribute `{name}` of `{op}` must be {expected}")]
    Kind {
        /// The op's text name.
        op: &'static str,
        /// The attribute's name.
        name: &'static str,
        /// What kind of value it takes.
        expected: String,
    },
}

impl Op {
    /// Builds an op from named attributes, filling in defaults and checking names and kinds.
    ///
    /// # Errors
    /// [`AttrError`] naming the op and the attribute.
    pub fn new(kind: OpKind, named: Vec<(String, Attr)>) -> Result<Op, AttrError> {
        let info = kind.info();
        let mut slots: Vec<Option<Attr>> = vec![None; info.attrs.len()];
        for (name, value) in named {
            let i = kind.attr_index(&name).ok_or_else(|| AttrError::Unknown {
                op: info.name,
                name: name.clone(),
                known: if info.attrs.is_empty() {
                    "none".into()
                } else {
                    info.attrs.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
                },
            })?;
            let spec = &info.attrs[i];
            // An integer literal is accepted where a float or a dim is expected.
            let value = match (value, spec.kind) {
                (Attr::Int(v), AttrKind::Float) => Attr::Float(v as f64),
                (Attr::Int(v), AttrKind::Dim) => Attr::Dim(Dim::constant(v)),
                (Attr::Ints(v), AttrKind::Dims) => Attr::Dims(v.into_iter().map(Dim::constant).collect()),
                (Attr::Dims(v), AttrKind::Ints) if v.iter().all(|d| d.as_const().is_some()) => {
                    Attr::Ints(v.iter().filter_map(Dim::as_const).collect())
                }
                (v, _) => v,
            };
            if !spec.accepts(&value) {
                return Err(AttrError::Kind { op: info.name, name: spec.name, expected: kind_text(spec.kind) });
            }
            if slots[i].is_some() {
                return Err(AttrError::Duplicate { op: info.name, name });
            }
            slots[i] = Some(value);
        }
        let mut attrs = Vec::with_capacity(slots.len());
        for (slot, spec) in slots.into_iter().zip(info.attrs) {
            match slot.or_else(|| spec.default_value()) {
                Some(v) => attrs.push(v),
                None => return Err(AttrError::Missing { op: info.name, name: spec.name }),
            }
        }
        Ok(Op { kind, attrs })
    }

    /// An op without attributes, or with all defaults.
    ///
    /// # Errors
    /// [`AttrError::Missing`] if the op has a required attribute.
    pub fn plain(kind: OpKind) -> Result<Op, AttrError> {
        Op::new(kind, vec![])
    }

    /// The attribute called `name`, if the op has it.
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.kind.attr_index(name).and_then(|i| self.attrs.get(i))
    }

    /// Integer attribute, `None` if absent or of another kind.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.attr(name)?.as_int()
    }
    /// Float attribute (`None` also for an optional float attribute that is absent).
    pub fn float(&self, name: &str) -> Option<f64> {
        self.attr(name)?.as_float()
    }
    /// Bool attribute.
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.attr(name)?.as_bool()
    }
    /// String or enum attribute.
    pub fn str(&self, name: &str) -> Option<&str> {
        self.attr(name)?.as_str()
    }
    /// Integer-list attribute.
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        self.attr(name)?.as_ints()
    }
    /// Dim-list attribute.
    pub fn dims(&self, name: &str) -> Option<&[Dim]> {
        self.attr(name)?.as_dims()
    }
    /// Dim attribute.
    pub fn dim(&self, name: &str) -> Option<&Dim> {
        self.attr(name)?.as_dim()
    }
    /// Dtype attribute.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.attr(name)?.as_dtype()
    }
}

impl Attrs for Op {
    fn op_name(&self) -> &'static str {
        self.kind.name()
    }

    fn attr(&self, name: &str) -> Option<&Attr> {
        Op::attr(self, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_indexed_by_discriminant_and_names_are_unique() {
        for (i, row) in OP_TABLE.iter().enumerate() {
            assert_eq!(row.kind as usize, i, "{}", row.name);
            assert_eq!(OpKind::from_name(row.name), Some(row.kind));
            for (j, o) in row.operands.iter().enumerate() {
                if o.ends_with('*') {
                    assert_eq!(row.operands.len(), 1, "{}: variadic operand must stand alone", row.name);
                }
                if !o.ends_with('?') && j > 0 {
                    assert!(!row.operands[j - 1].ends_with('?'), "{}: optional operands must trail", row.name);
                }
            }
        }
        let mut names: Vec<_> = OP_TABLE.iter().map(|r| r.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), OP_TABLE.len());
    }

    #[test]
    fn attrs_fill_defaults_and_reject_bad_input() {
        let op = Op::new(OpKind::Softmax, vec![]).unwrap();
        assert_eq!(op.int("axis"), Some(-1));
        let e = Op::new(OpKind::RmsNorm, vec![]).unwrap_err();
        assert_eq!(e.to_string(), "`rms_norm` needs attribute `eps`");
        let e = Op::new(OpKind::Gelu, vec![("form".into(), Attr::Str("fast".into()))]).unwrap_err();
        assert_eq!(e.to_string(), "attribute `form` of `gelu` must be one of \"erf\", \"tanh\"");
        assert_eq!(Op::new(OpKind::RmsNorm, vec![("eps".into(), Attr::Int(1))]).unwrap().float("eps"), Some(1.0));
    }

    /// An optional attribute (`paged_attention`'s `unified_max`) is absent unless given; only
    /// an optional slot takes `Attr::Absent`.
    #[test]
    fn optional_attrs_are_absent_unless_given() {
        let base = || vec![("scale".to_string(), Attr::Float(0.125)), ("heads".into(), Attr::Int(4)), ("kv_heads".into(), Attr::Int(2))];
        let op = Op::new(OpKind::PagedAttention, base()).unwrap();
        assert_eq!(op.attr("unified_max"), Some(&Attr::Absent));
        assert_eq!(op.float("unified_max"), None);
        let spec = &OpKind::PagedAttention.info().attrs[OpKind::PagedAttention.attr_index("unified_max").unwrap()];
        assert_eq!(spec.default_value(), Some(Attr::Absent));
        let mut given = base();
        given.push(("unified_max".into(), Attr::Int(6)));
        assert_eq!(Op::new(OpKind::PagedAttention, given).unwrap().float("unified_max"), Some(6.0));
        let mut explicit = base();
        explicit.push(("unified_max".into(), Attr::Absent));
        assert_eq!(Op::new(OpKind::PagedAttention, explicit).unwrap(), op);
        let mut wrong = base();
        wrong.push(("unified_max".into(), Attr::Bool(true)));
        assert_eq!(Op::new(OpKind::PagedAttention, wrong).unwrap_err().to_string(), "attribute `unified_max` of `paged_attention` must be a number");
        let e = Op::new(OpKind::RmsNorm, vec![("eps".into(), Attr::Absent)]).unwrap_err();
        assert_eq!(e.to_string(), "attribute `eps` of `rms_norm` must be a number");
    }
}
