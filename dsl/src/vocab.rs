//! The DSL's vocabulary: method and function names, the op each one builds, its tensor
//! operands and its attribute names. The root crate's tests check this list against
//! `sinter_ir::OP_TABLE` (through the hidden `__vocab!` macro), so the two cannot drift.

/// How the macro computes a static result type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Unary,
    Cast,
    Binary,
    Compare,
    /// `logical_and`/`logical_or`/`logical_not`: bool operands, broadcast, a bool result.
    Logical,
    Matmul,
    Reduce,
    Row,
    Transpose,
    Reshape,
    Same,
    Other,
}

/// One word of the DSL.
pub struct MethodSpec {
    /// The DSL name (`x.name(...)` or `name(x, ...)`).
    pub name: &'static str,
    /// The `OpKind` variant it builds.
    pub op: &'static str,
    pub kind: Kind,
    /// Whether the first tensor is the receiver of a method call.
    pub receiver: bool,
    /// Tensor operands (min, max), receiver included.
    pub tensors: (usize, usize),
    /// Attribute names in positional order.
    pub attrs: &'static [&'static str],
    /// Attributes without a default.
    pub required: &'static [&'static str],
    /// Number of results.
    pub results: usize,
    /// Float-only unary ops.
    pub float_only: bool,
}

const fn m(name: &'static str, op: &'static str, kind: Kind, tensors: (usize, usize), attrs: &'static [&'static str], required: &'static [&'static str]) -> MethodSpec {
    MethodSpec { name, op, kind, receiver: true, tensors, attrs, required, results: 1, float_only: false }
}
const fn f(name: &'static str, op: &'static str) -> MethodSpec {
    MethodSpec { name, op, kind: Kind::Unary, receiver: true, tensors: (1, 1), attrs: &[], required: &[], results: 1, float_only: true }
}

/// `rope`'s attributes: the base and form, the partial rotary dim, the frequency scaling and
/// its parameters (named as Hugging Face's `rope_scaling` names them).
const ROPE_ATTRS: [&str; 14] = [
    "theta",
    "form",
    "rotary_dim",
    "scaling",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "truncate",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
];

pub static METHODS: &[MethodSpec] = &[
    m("neg", "Neg", Kind::Unary, (1, 1), &[], &[]),
    m("abs", "Abs", Kind::Unary, (1, 1), &[], &[]),
    f("exp", "Exp"),
    f("log", "Log"),
    f("sqrt", "Sqrt"),
    f("rsqrt", "Rsqrt"),
    f("recip", "Recip"),
    f("sigmoid", "Sigmoid"),
    f("silu", "Silu"),
    f("tanh", "Tanh"),
    f("erf", "Erf"),
    f("sin", "Sin"),
    f("cos", "Cos"),
    MethodSpec { attrs: &["form"], ..f("gelu", "Gelu") },
    m("cast", "Cast", Kind::Cast, (1, 1), &["dtype"], &["dtype"]),
    m("dequantize", "Dequantize", Kind::Cast, (1, 1), &["dtype"], &["dtype"]),
    m("quantize_fp8", "QuantizeFp8", Kind::Other, (2, 2), &[], &[]),
    m("dequantize_fp8", "DequantizeFp8", Kind::Cast, (2, 2), &["dtype"], &["dtype"]),
    m("add", "Add", Kind::Binary, (2, 2), &[], &[]),
    m("sub", "Sub", Kind::Binary, (2, 2), &[], &[]),
    m("mul", "Mul", Kind::Binary, (2, 2), &[], &[]),
    m("div", "Div", Kind::Binary, (2, 2), &[], &[]),
    m("maximum", "Maximum", Kind::Binary, (2, 2), &[], &[]),
    m("minimum", "Minimum", Kind::Binary, (2, 2), &[], &[]),
    m("pow", "Pow", Kind::Binary, (2, 2), &[], &[]),
    m("eq", "Eq", Kind::Compare, (2, 2), &[], &[]),
    m("ne", "Ne", Kind::Compare, (2, 2), &[], &[]),
    m("lt", "Lt", Kind::Compare, (2, 2), &[], &[]),
    m("le", "Le", Kind::Compare, (2, 2), &[], &[]),
    m("gt", "Gt", Kind::Compare, (2, 2), &[], &[]),
    m("ge", "Ge", Kind::Compare, (2, 2), &[], &[]),
    m("select", "Select", Kind::Other, (3, 3), &[], &[]),
    m("logical_and", "LogicalAnd", Kind::Logical, (2, 2), &[], &[]),
    m("logical_or", "LogicalOr", Kind::Logical, (2, 2), &[], &[]),
    m("logical_not", "LogicalNot", Kind::Logical, (1, 1), &[], &[]),
    m("sum", "ReduceSum", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("reduce_sum", "ReduceSum", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("max", "ReduceMax", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("reduce_max", "ReduceMax", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("min", "ReduceMin", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("reduce_min", "ReduceMin", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("mean", "ReduceMean", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("reduce_mean", "ReduceMean", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("argmax", "Argmax", Kind::Reduce, (1, 1), &["axis", "keepdim"], &[]),
    m("softmax", "Softmax", Kind::Row, (1, 1), &["axis"], &[]),
    m("log_softmax", "LogSoftmax", Kind::Row, (1, 1), &["axis"], &[]),
    m("transpose", "Transpose", Kind::Transpose, (1, 1), &["dim0", "dim1"], &[]),
    m("permute", "Permute", Kind::Other, (1, 1), &["perm"], &["perm"]),
    m("reshape", "Reshape", Kind::Reshape, (1, 1), &["shape"], &["shape"]),
    m("broadcast", "Broadcast", Kind::Reshape, (1, 1), &["shape"], &["shape"]),
    m("expand", "Broadcast", Kind::Reshape, (1, 1), &["shape"], &["shape"]),
    m("slice", "Slice", Kind::Other, (1, 1), &["axis", "start", "end"], &["start", "end"]),
    m("gather", "Gather", Kind::Other, (2, 2), &[], &[]),
    m("matmul", "Matmul", Kind::Matmul, (2, 2), &["transpose_a", "transpose_b"], &[]),
    m("rope", "Rope", Kind::Same, (2, 2), &ROPE_ATTRS, &["theta"]),
    m("rotary", "Rotary", Kind::Same, (3, 3), &["form", "rotary_dim"], &[]),
    m("rms_norm", "RmsNorm", Kind::Same, (2, 2), &["eps"], &["eps"]),
    m("layer_norm", "LayerNorm", Kind::Same, (3, 3), &["eps"], &["eps"]),
    m("swiglu", "Swiglu", Kind::Same, (2, 2), &[], &[]),
    // `lse = true` gives a second result, which the DSL's one-result `attention` refuses when
    // the graph is built: the log-sum-exp form is written with the builder or the text format.
    m("attention", "Attention", Kind::Other, (3, 4), &["scale", "causal", "heads", "kv_heads", "layout", "lse", "window", "softcap"], &["scale", "heads", "kv_heads"]),
    MethodSpec { results: 2, ..m("kv_append", "KvAppend", Kind::Other, (6, 6), &[], &[]) },
    m("paged_attention", "PagedAttention", Kind::Other, (5, 5), &["scale", "causal", "heads", "kv_heads", "lse", "unified_max", "window", "softcap"], &["scale", "heads", "kv_heads"]),
    MethodSpec { results: 2, ..m("attention_merge", "AttentionMerge", Kind::Other, (4, 4), &[], &[]) },
];

pub static SOURCES: &[MethodSpec] = &[
    MethodSpec { receiver: false, ..m("iota", "Iota", Kind::Other, (0, 0), &["dtype", "shape", "axis"], &["dtype", "shape"]) },
    MethodSpec { receiver: false, ..m("constant", "Constant", Kind::Other, (0, 0), &["value", "dtype", "shape"], &["value", "dtype"]) },
];

/// Words handled specially by the macro (not one op each).
pub const SPECIAL: &[&str] = &["weight", "input", "concat"];

pub fn find_method(name: &str) -> Option<&'static MethodSpec> {
    METHODS.iter().find(|m| m.name == name)
}

pub fn find_source(name: &str) -> Option<&'static MethodSpec> {
    SOURCES.iter().find(|m| m.name == name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let c = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + c);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The closest known word within edit distance 2.
pub fn suggest(name: &str) -> Option<&'static str> {
    METHODS
        .iter()
        .chain(SOURCES)
        .map(|m| m.name)
        .chain(SPECIAL.iter().copied())
        .map(|w| (edit_distance(name, w), w))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, w)| w)
}
