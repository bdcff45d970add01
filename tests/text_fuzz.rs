//! Fuzzing the text format and the verifier with proptest, on a bounded budget.
//!
//! - [`mutated_files_never_panic`]: the round-trip files, mutated (byte-range deletions,
//!   insertions of grammar tokens, swaps, duplications, character replacements, truncation),
//!   are fed to `parse` and then `verify`. Neither may panic; whatever parses must also print
//!   and parse back to an equal graph.
//! - [`random_graphs_round_trip`]: random well-formed graphs made with the builder (chains of
//!   unary, binary, compare/select, reduce, softmax, reshape, transpose, permute, concat,
//!   slice, broadcast, cast, constant and iota nodes over symbolic shapes, sometimes wrapped in
//!   a function that a `@main` calls with renamed symbols) must verify and round-trip:
//!   `parse(print(g)) == g` and `print(parse(print(g))) == print(g)`.
//!
//! `SINTER_FUZZ_CASES` sets the number of cases of each test (default 2000); each test prints
//! how many inputs it ran.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sinter_ir::{parse, print, verify, Attr, DType, Dim, FunctionBuilder, Graph, OpKind, TensorType, Value};

fn cases() -> u32 {
    std::env::var("SINTER_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

fn config() -> Config {
    // No regression files: a failure prints its (shrunk) input, which is what a test needs.
    Config { cases: cases(), failure_persistence: None, ..Config::default() }
}

// ----------------------------------------------------------------------------------------
// (a) Mutated inputs

fn roundtrip_sources() -> Vec<(String, Vec<char>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests/roundtrip");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/filetests/roundtrip")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sir"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap().chars().collect()))
        .collect()
}

/// Tokens of the grammar, and a few near misses, to insert.
const TOKENS: &[&str] = &[
    "func", "@main", "@f", "@", "%x", "%v0", "%v99", "%", "%a.b", "(", ")", "[", "]", "{", "}", ",", ":", "=", "*", "+", "-",
    "^", "^9", "^0", "->", "return", "bf16", "f16", "f32", "i32", "i64", "bool", "f64", "T", "past", "H*64", "0", "1", "-1",
    "64", "9223372036854775807", "99999999999999999999", "1e-5", "1.5", "1.", "1e", "2E+3", "inf", "-inf", "nan", "true",
    "false", "\"", "\"tanh\"", "\"a\\u{41}\"", "\"\\u{zz}\"", "//", "\n", " ", "\t", "axis", "shape", "perm", "eps", "func=",
    "dtype", "start", "end", "value", "scale", "heads", "kv_heads", "call", "matmul", "reduce_sum", "kv_append",
    "attention", "paged_attention", "concat", "slice", "reshape", "rope", "select", "iota", "constant", "é", "∑", "$", "#",
    "(((((((((", "---------", "(a+b)*(a+b)*(a+b)*(a+b)", "T^8*T^8",
];

#[derive(Clone, Debug)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, token: usize },
    SwapChars { a: usize, b: usize },
    SwapLines { a: usize, b: usize },
    Duplicate { from: usize, len: usize, to: usize },
    Replace { at: usize, with: char },
    Truncate { at: usize },
    /// Replaces the word (a run of letters, digits and `_`) around `at` with another word of
    /// its class (number, dtype, op, other), so that many mutants still parse and reach the
    /// verifier.
    ReplaceWord { at: usize, pick: usize },
}

const NUMBERS: &[&str] = &["0", "1", "2", "3", "4", "7", "32", "63", "64", "65", "128", "576", "1536", "T", "past", "S"];
const WORDS: &[&str] = &["T", "S", "past", "B", "H", "N", "x", "true", "false", "axis", "keepdim", "start", "end", "perm", "form"];

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = 0usize..1_000_000;
    prop_oneof![
        4 => (pos.clone(), 1usize..12).prop_map(|(at, len)| Mutation::Delete { at, len }),
        4 => (pos.clone(), 0..TOKENS.len()).prop_map(|(at, token)| Mutation::Insert { at, token }),
        2 => (pos.clone(), pos.clone()).prop_map(|(a, b)| Mutation::SwapChars { a, b }),
        1 => (pos.clone(), pos.clone()).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
        1 => (pos.clone(), 1usize..40, pos.clone()).prop_map(|(from, len, to)| Mutation::Duplicate { from, len, to }),
        2 => (pos.clone(), prop::sample::select(vec!['%', '@', '(', ')', '[', ']', '{', '}', ',', ':', '=', '-', '0', '9', 'x', ' ', '"', '\n', '.', '^', '*']))
            .prop_map(|(at, with)| Mutation::Replace { at, with }),
        1 => pos.clone().prop_map(|at| Mutation::Truncate { at }),
        16 => (pos, any::<usize>()).prop_map(|(at, pick)| Mutation::ReplaceWord { at, pick }),
    ]
}

fn apply(src: &mut Vec<char>, m: &Mutation) {
    let n = src.len();
    let at = |p: usize| if n == 0 { 0 } else { p % (n + 1) };
    match *m {
        Mutation::Delete { at: p, len } => {
            let s = at(p).min(n);
            src.drain(s..(s + len).min(n));
        }
        Mutation::Insert { at: p, token } => {
            let s = at(p);
            src.splice(s..s, TOKENS[token].chars());
        }
        Mutation::SwapChars { a, b } if n > 0 => src.swap(a % n, b % n),
        Mutation::SwapLines { a, b } => {
            let text: String = src.iter().collect();
            let mut lines: Vec<&str> = text.split('\n').collect();
            let k = lines.len();
            lines.swap(a % k, b % k);
            *src = lines.join("\n").chars().collect();
        }
        Mutation::Duplicate { from, len, to } if n > 0 => {
            let s = from % n;
            let piece: Vec<char> = src[s..(s + len).min(n)].to_vec();
            let t = at(to);
            src.splice(t..t, piece);
        }
        Mutation::Replace { at: p, with } if n > 0 => src[p % n] = with,
        Mutation::Truncate { at: p } => src.truncate(at(p)),
        Mutation::ReplaceWord { at: p, pick } if n > 0 => {
            let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
            // The next word at or after `at`.
            let Some(start) = (p % n..n).find(|&i| word_char(src[i])) else { return };
            let start = (0..=start).rev().take_while(|&i| word_char(src[i])).last().unwrap_or(start);
            let end = (start..n).find(|&i| !word_char(src[i])).unwrap_or(n);
            let word: String = src[start..end].iter().collect();
            let replacement: String = if word.starts_with(|c: char| c.is_ascii_digit()) {
                NUMBERS[pick % NUMBERS.len()].into()
            } else if DType::from_name(&word).is_some() {
                DType::ALL[pick % DType::ALL.len()].name().into()
            } else if OpKind::from_name(&word).is_some() {
                sinter_ir::OP_TABLE[pick % sinter_ir::OP_TABLE.len()].name.into()
            } else {
                WORDS[pick % WORDS.len()].into()
            };
            src.splice(start..end, replacement.chars());
        }
        _ => {}
    }
}

static MUTATED_RUN: AtomicUsize = AtomicUsize::new(0);
static MUTATED_PARSED: AtomicUsize = AtomicUsize::new(0);
static MUTATED_VERIFIED: AtomicUsize = AtomicUsize::new(0);

/// Parses, verifies and, when it parsed, round-trips one input. `Err` describes a failure.
fn check_text(src: &str) -> Result<(), String> {
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let Ok(g) = parse(src) else { return Ok(()) };
        MUTATED_PARSED.fetch_add(1, Ordering::Relaxed);
        let verified = verify(&g).is_ok();
        MUTATED_VERIFIED.fetch_add(usize::from(verified), Ordering::Relaxed);
        let printed = print(&g);
        let g2 = parse(&printed).map_err(|e| format!("the printed form does not parse: {e}\n{printed}"))?;
        if g2 != g {
            return Err(format!("parse(print(g)) != g\n{printed}"));
        }
        if print(&g2) != printed {
            return Err(format!("print(parse(print(g))) != print(g)\n{printed}"));
        }
        if verify(&g2).is_ok() != verified {
            return Err(format!("verify disagrees after the round trip\n{printed}"));
        }
        Ok(())
    }));
    match outcome {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panicked: {}", msg.unwrap_or_default()))
        }
    }
}

#[test]
fn mutated_files_never_panic() {
    let sources = roundtrip_sources();
    assert!(!sources.is_empty());
    let mut runner = TestRunner::new(config());
    let strategy = (0..sources.len(), prop::collection::vec(mutation(), 1..5));
    let result = runner.run(&strategy, |(file, muts)| {
        let mut src = sources[file].1.clone();
        for m in &muts {
            apply(&mut src, m);
        }
        let text: String = src.iter().collect();
        MUTATED_RUN.fetch_add(1, Ordering::Relaxed);
        check_text(&text).map_err(|e| TestCaseError::fail(format!("{} mutated by {muts:?}: {e}\n--- input ---\n{text}", sources[file].0)))
    });
    eprintln!(
        "text_fuzz: {} mutated inputs run ({} parsed, {} of those verified)",
        MUTATED_RUN.load(Ordering::Relaxed),
        MUTATED_PARSED.load(Ordering::Relaxed),
        MUTATED_VERIFIED.load(Ordering::Relaxed)
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Whole-input edge cases that random mutation rarely reaches.
#[test]
fn hostile_inputs_are_errors_not_panics() {
    let deep_parens = format!("func @f(%x: f32[{}T{}]) {{\n  return %x\n}}\n", "(".repeat(100_000), ")".repeat(100_000));
    let deep_minus = format!("func @f(%x: f32[{}T]) {{\n  return %x\n}}\n", "-".repeat(100_000));
    let blowup = format!("func @f(%x: f32[{}]) {{\n  return %x\n}}\n", vec!["(a+b+c+d+e+f+g+h)"; 40].join("*"));
    let many_funcs: String = (0..2000).map(|i| format!("func @f{i}() {{\n  return\n}}\n")).collect();
    for (what, src) in [
        ("empty", String::new()),
        ("deep parentheses", deep_parens),
        ("deep unary minus", deep_minus),
        ("a product of sums", blowup),
        ("a NUL byte", "func @f(\0)".to_string()),
        ("a lone percent", "%".to_string()),
        ("EOF after func", "func".to_string()),
        ("EOF after (", "func @f(".to_string()),
        ("EOF in attrs", "func @f(%x: f32[4]) {\n  %y: f32[4] = softmax(%x) {".to_string()),
        ("i64::MIN dim", "func @f(%x: f32[-9223372036854775807-1]) {\n  return %x\n}\n".to_string()),
        ("overflowing dim", "func @f(%x: f32[9223372036854775807+1]) {\n  return %x\n}\n".to_string()),
        ("many functions", many_funcs),
    ] {
        let outcome = catch_unwind(AssertUnwindSafe(|| parse(&src).map(|g| verify(&g).is_ok())));
        assert!(outcome.is_ok(), "{what}: panicked");
    }
}

/// String attributes print with Rust's `{:?}` escapes and read back to the same string.
#[test]
fn string_escapes_round_trip() {
    for name in ["plain", "a b", "quote\"back\\slash", "tab\tnl\ncr\r", "nul\0esc\u{1b}", "zero width\u{200b}", "é∑"] {
        let mut g = Graph::new();
        let mut b = FunctionBuilder::new(&g, "main");
        let x = b.param("x", TensorType::new(DType::F32, [Dim::constant(4)]));
        // The callee does not exist: the graph does not verify, but it prints and parses.
        let f = b.func_mut();
        let op = sinter_ir::Op::new(OpKind::Call, vec![("func".into(), Attr::Str(name.into()))]).expect("op");
        let (_, r) = f.push_node(op, vec![x], vec![TensorType::new(DType::F32, [Dim::constant(4)])]);
        g.add_func(b.finish(&r).expect("finish"));
        let text = print(&g);
        let back = parse(&text).unwrap_or_else(|e| panic!("{name:?}: {e}\n{text}"));
        assert_eq!(back, g, "{name:?}\n{text}");
    }
}

// ----------------------------------------------------------------------------------------
// (b) Random well-formed graphs

#[derive(Clone, Debug)]
enum Step {
    Unary { op: usize, x: usize },
    Binary { op: usize, a: usize, b: usize },
    CompareSelect { op: usize, a: usize, b: usize },
    Reduce { op: usize, x: usize, axis: i64, keepdim: bool },
    RowOp { log: bool, x: usize, axis: i64 },
    Merge { x: usize, axis: usize },
    Split { x: usize, axis: usize },
    Transpose { x: usize, d0: i64, d1: i64 },
    Permute { x: usize, seed: u64 },
    Concat { a: usize, b: usize, axis: i64 },
    Slice { x: usize, axis: usize, trim: bool },
    Broadcast { x: usize, lead: usize },
    Cast { x: usize, to: usize },
    Constant { like: usize, value: f64 },
    Iota { like: usize, axis: i64 },
    Name { x: usize, name: usize },
}

const UNARY: &[OpKind] = &[
    OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Recip, OpKind::Sigmoid,
    OpKind::Silu, OpKind::Gelu, OpKind::Tanh, OpKind::Erf, OpKind::Sin, OpKind::Cos,
];
const BINARY: &[OpKind] = &[OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum, OpKind::Pow];
const COMPARE: &[OpKind] = &[OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge];
const REDUCE: &[OpKind] = &[OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceMean];
const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const DIMS: &[&str] = &["T", "H", "B", "S", "past", "1", "2", "4", "64", "H*64", "T+past", "2*T", "B*S", "T-1"];
const NAMES: &[&str] = &["h", "x1", "attn.0", "mlp_out", "layer.1.q", "t", "_tmp", "Y"];

fn float_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => -1e6f64..1e6,
        2 => any::<f64>().prop_filter("finite", |v| v.is_finite()),
        1 => prop::sample::select(vec![0.0, -0.0, 1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -f64::NAN, f64::MIN_POSITIVE, 5e-324, 1e-5]),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let i = 0usize..64;
    let ax = -4i64..4;
    prop_oneof![
        4 => (0..UNARY.len(), i.clone()).prop_map(|(op, x)| Step::Unary { op, x }),
        4 => (0..BINARY.len(), i.clone(), i.clone()).prop_map(|(op, a, b)| Step::Binary { op, a, b }),
        1 => (0..COMPARE.len(), i.clone(), i.clone()).prop_map(|(op, a, b)| Step::CompareSelect { op, a, b }),
        2 => (0..REDUCE.len(), i.clone(), ax.clone(), any::<bool>()).prop_map(|(op, x, axis, keepdim)| Step::Reduce { op, x, axis, keepdim }),
        1 => (any::<bool>(), i.clone(), ax.clone()).prop_map(|(log, x, axis)| Step::RowOp { log, x, axis }),
        2 => (i.clone(), 0usize..4).prop_map(|(x, axis)| Step::Merge { x, axis }),
        2 => (i.clone(), 0usize..4).prop_map(|(x, axis)| Step::Split { x, axis }),
        2 => (i.clone(), ax.clone(), ax.clone()).prop_map(|(x, d0, d1)| Step::Transpose { x, d0, d1 }),
        1 => (i.clone(), any::<u64>()).prop_map(|(x, seed)| Step::Permute { x, seed }),
        1 => (i.clone(), i.clone(), ax.clone()).prop_map(|(a, b, axis)| Step::Concat { a, b, axis }),
        1 => (i.clone(), 0usize..4, any::<bool>()).prop_map(|(x, axis, trim)| Step::Slice { x, axis, trim }),
        1 => (i.clone(), 0..DIMS.len()).prop_map(|(x, lead)| Step::Broadcast { x, lead }),
        1 => (i.clone(), 0..FLOATS.len()).prop_map(|(x, to)| Step::Cast { x, to }),
        1 => (i.clone(), float_value()).prop_map(|(like, value)| Step::Constant { like, value }),
        1 => (i.clone(), ax).prop_map(|(like, axis)| Step::Iota { like, axis }),
        1 => (i.clone(), 0..NAMES.len()).prop_map(|(x, name)| Step::Name { x, name }),
    ]
}

fn dim(text: &str) -> Dim {
    let g = parse(&format!("func @d(%x: f32[{text}]) {{\n  return %x\n}}\n")).expect("a dim");
    g.funcs.values().next().unwrap().values.values().next().unwrap().ty.shape[0].clone()
}

#[derive(Clone, Debug)]
struct Recipe {
    params: Vec<(usize, Vec<usize>)>,
    steps: Vec<Step>,
    outputs: Vec<usize>,
    wrap: bool,
}

fn recipe() -> impl Strategy<Value = Recipe> {
    let param = (0..FLOATS.len(), prop::collection::vec(0..DIMS.len(), 0..4));
    (prop::collection::vec(param, 1..4), prop::collection::vec(step(), 1..24), prop::collection::vec(0usize..64, 0..3), any::<bool>())
        .prop_map(|(params, steps, outputs, wrap)| Recipe { params, steps, outputs, wrap })
}

/// Applies one step; `Ok(None)` when the step does not apply to the chosen values.
fn apply_step(b: &mut FunctionBuilder, pool: &[Value], step: &Step) -> Result<Option<Value>, String> {
    let pick = |i: usize| pool[i % pool.len()];
    let rank = |b: &FunctionBuilder, v: Value| b.ty(v).rank() as i64;
    let attrs = Vec::new;
    let v = match *step {
        Step::Unary { op, x } => {
            let kind = UNARY[op];
            let a = if kind == OpKind::Gelu && x % 2 == 0 { vec![("form", Attr::Str("tanh".into()))] } else { attrs() };
            b.op1(kind, &[pick(x)], a)
        }
        Step::Binary { op, a, b: bi } => {
            let (x, y) = (pick(a), pick(bi));
            // Operands of other dtypes or shapes are replaced by the first operand itself.
            let y = if b.ty(x).dtype == b.ty(y).dtype && sinter_ir::infer::broadcast_shapes(&b.ty(x).shape, &b.ty(y).shape).is_ok() { y } else { x };
            b.op1(BINARY[op], &[x, y], attrs())
        }
        Step::CompareSelect { op, a, b: bi } => {
            let (x, y) = (pick(a), pick(bi));
            let y = if b.ty(x).dtype == b.ty(y).dtype && sinter_ir::infer::broadcast_shapes(&b.ty(x).shape, &b.ty(y).shape).is_ok() { y } else { x };
            let c = b.op1(COMPARE[op], &[x, y], attrs()).map_err(|e| e.to_string())?;
            b.op1(OpKind::Select, &[c, x, y], attrs())
        }
        Step::Reduce { op, x, axis, keepdim } => {
            let x = pick(x);
            if rank(b, x) == 0 {
                return Ok(None);
            }
            let axis = axis.rem_euclid(2 * rank(b, x)) - rank(b, x);
            b.op1(REDUCE[op], &[x], vec![("axis", Attr::Int(axis)), ("keepdim", Attr::Bool(keepdim))])
        }
        Step::RowOp { log, x, axis } => {
            let x = pick(x);
            if rank(b, x) == 0 {
                return Ok(None);
            }
            let axis = axis.rem_euclid(rank(b, x));
            b.op1(if log { OpKind::LogSoftmax } else { OpKind::Softmax }, &[x], vec![("axis", Attr::Int(axis))])
        }
        Step::Merge { x, axis } => {
            let x = pick(x);
            let shape = b.ty(x).shape.clone();
            if shape.len() < 2 {
                return Ok(None);
            }
            let a = axis % (shape.len() - 1);
            let mut to = shape[..a].to_vec();
            to.push(shape[a].mul(&shape[a + 1]));
            to.extend_from_slice(&shape[a + 2..]);
            b.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(to))])
        }
        Step::Split { x, axis } => {
            let x = pick(x);
            let shape = b.ty(x).shape.clone();
            if shape.is_empty() || shape.len() >= 5 {
                return Ok(None);
            }
            let a = axis % shape.len();
            let (outer, inner) = match shape[a].div_exact(2) {
                Some(half) if !shape[a].is_one() && shape[a] != Dim::constant(0) => (Dim::constant(2), half),
                _ => (shape[a].clone(), Dim::constant(1)),
            };
            let mut to = shape[..a].to_vec();
            to.push(outer);
            to.push(inner);
            to.extend_from_slice(&shape[a + 1..]);
            b.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(to))])
        }
        Step::Transpose { x, d0, d1 } => {
            let x = pick(x);
            let r = rank(b, x);
            if r == 0 {
                return Ok(None);
            }
            let (d0, d1) = (d0.rem_euclid(2 * r) - r, d1.rem_euclid(2 * r) - r);
            b.op1(OpKind::Transpose, &[x], vec![("dim0", Attr::Int(d0)), ("dim1", Attr::Int(d1))])
        }
        Step::Permute { x, seed } => {
            let x = pick(x);
            let mut perm: Vec<i64> = (0..rank(b, x)).collect();
            let mut s = seed;
            for i in (1..perm.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                perm.swap(i, (s >> 33) as usize % (i + 1));
            }
            b.op1(OpKind::Permute, &[x], vec![("perm", Attr::Ints(perm))])
        }
        Step::Concat { a, b: bi, axis } => {
            let (x, y) = (pick(a), pick(bi));
            let r = rank(b, x);
            if r == 0 {
                return Ok(None);
            }
            let axis = axis.rem_euclid(2 * r) - r;
            let attrs = || vec![("axis", Attr::Int(axis))];
            match b.op1(OpKind::Concat, &[x, y], attrs()) {
                Ok(v) => Ok(v),
                Err(_) => b.op1(OpKind::Concat, &[x, x, x], attrs()),
            }
        }
        Step::Slice { x, axis, trim } => {
            let x = pick(x);
            let shape = b.ty(x).shape.clone();
            if shape.is_empty() {
                return Ok(None);
            }
            let a = axis % shape.len();
            let size = shape[a].clone();
            // Trim one element from each end where the size is symbolic or at least 2.
            let (start, end) = if trim && size.as_const().is_none_or(|c| c >= 2) {
                (Dim::constant(1), size.sub(&Dim::constant(1)))
            } else {
                (Dim::constant(0), size)
            };
            let axis_attr = Attr::Int(a as i64 - shape.len() as i64);
            b.op1(OpKind::Slice, &[x], vec![("axis", axis_attr), ("start", Attr::Dim(start)), ("end", Attr::Dim(end))])
        }
        Step::Broadcast { x, lead } => {
            let x = pick(x);
            if rank(b, x) >= 5 {
                return Ok(None);
            }
            let mut to = vec![dim(DIMS[lead])];
            to.extend(b.ty(x).shape.iter().cloned());
            b.op1(OpKind::Broadcast, &[x], vec![("shape", Attr::Dims(to))])
        }
        Step::Cast { x, to } => b.op1(OpKind::Cast, &[pick(x)], vec![("dtype", Attr::DType(FLOATS[to]))]),
        Step::Constant { like, value } => {
            let like = pick(like);
            let t = b.ty(like).clone();
            let c = b
                .op1(OpKind::Constant, &[], vec![("value", Attr::Float(value)), ("dtype", Attr::DType(t.dtype)), ("shape", Attr::Dims(vec![]))])
                .map_err(|e| e.to_string())?;
            b.op1(OpKind::Add, &[like, c], attrs())
        }
        Step::Iota { like, axis } => {
            let t = b.ty(pick(like)).clone();
            if t.rank() == 0 {
                return Ok(None);
            }
            let axis = axis.rem_euclid(t.rank() as i64);
            b.op1(OpKind::Iota, &[], vec![("dtype", Attr::DType(t.dtype)), ("shape", Attr::Dims(t.shape)), ("axis", Attr::Int(axis))])
        }
        Step::Name { x, name } => {
            // A name already taken is refused; that is fine here.
            let _ = b.name(pick(x), NAMES[name]);
            return Ok(None);
        }
    };
    v.map(Some).map_err(|e| format!("{step:?}: the builder refused a well-formed node: {e}"))
}

/// Builds the graph a recipe describes.
fn build(r: &Recipe) -> Result<Graph, String> {
    let mut g = Graph::new();
    let name = if r.wrap { "body" } else { "main" };
    let mut b = FunctionBuilder::new(&g, name);
    let mut pool: Vec<Value> = Vec::new();
    for (i, (dt, dims)) in r.params.iter().enumerate() {
        let ty = TensorType::new(FLOATS[*dt], dims.iter().map(|&d| dim(DIMS[d])));
        pool.push(b.param(&format!("p{i}"), ty));
    }
    for s in &r.steps {
        if let Some(v) = apply_step(&mut b, &pool, s)? {
            pool.push(v);
        }
    }
    let mut outputs: Vec<Value> = r.outputs.iter().map(|&i| pool[i % pool.len()]).collect();
    outputs.push(*pool.last().expect("at least one parameter"));
    let body = b.finish(&outputs).map_err(|e| e.to_string())?;
    let sig = body.signature();
    g.add_func(body);
    if r.wrap {
        // @main calls @body twice with the symbols that appear bare renamed (T -> T_2), which is
        // what a call can bind.
        let mut rename: BTreeMap<String, Dim> = BTreeMap::new();
        for p in &sig.params {
            for d in &p.shape {
                if let Some(s) = d.as_symbol() {
                    rename.insert(s.to_string(), Dim::symbol(&format!("{s}_2")));
                }
            }
        }
        let mut m = FunctionBuilder::new(&g, "main");
        let args: Vec<Value> = sig
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| m.param(&format!("a{i}"), TensorType { dtype: p.dtype, shape: p.shape.iter().map(|d| d.substitute(&rename)).collect() }))
            .collect();
        let call = |m: &mut FunctionBuilder| m.op(OpKind::Call, &args, vec![("func", Attr::Str("body".into()))]);
        let first = call(&mut m).map_err(|e| format!("the call was refused: {e}"))?;
        let second = call(&mut m).map_err(|e| format!("the second call was refused: {e}"))?;
        let mut outs = first;
        outs.extend(second);
        g.add_func(m.finish(&outs).map_err(|e| e.to_string())?);
    }
    Ok(g)
}

static GRAPHS_RUN: AtomicUsize = AtomicUsize::new(0);
static NODES_RUN: AtomicUsize = AtomicUsize::new(0);

#[test]
fn random_graphs_round_trip() {
    let mut runner = TestRunner::new(config());
    let result = runner.run(&recipe(), |r| {
        let g = build(&r).map_err(TestCaseError::fail)?;
        GRAPHS_RUN.fetch_add(1, Ordering::Relaxed);
        NODES_RUN.fetch_add(g.funcs.values().map(|f| f.nodes.len()).sum::<usize>(), Ordering::Relaxed);
        if let Err(e) = verify(&g) {
            return Err(TestCaseError::fail(format!("built graph does not verify: {e}\n{}", print(&g))));
        }
        let text = print(&g);
        let g2 = parse(&text).map_err(|e| TestCaseError::fail(format!("printed graph does not parse: {e}\n{text}")))?;
        prop_assert_eq!(&g2, &g, "parse(print(g)) != g\n{}", text);
        prop_assert_eq!(print(&g2), text);
        Ok(())
    });
    eprintln!(
        "text_fuzz: {} random graphs run ({} nodes)",
        GRAPHS_RUN.load(Ordering::Relaxed),
        NODES_RUN.load(Ordering::Relaxed)
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
