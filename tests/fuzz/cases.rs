//! The fuzzer's graph generator: from a seed, one small graph drawn from the op table.
//!
//! A case is one of a few shapes of graph ([`Kind`]), each with random sizes, dtypes and
//! attributes: a random DAG of element-wise, comparison, select, cast, reduction, row
//! (softmax, norms), matmul and layout ops; `attention` (masks, causal, GQA, both layouts);
//! attention written out (matmul, scale, mask, softmax, matmul) for the passes to recognise;
//! a paged decode step (`kv_append` then `paged_attention`, with a reader of the pages before
//! the append); RMSNorm written out with explicit casts. Sizes come from [`SIZES`] (0, 1,
//! primes, tails around tile sizes). Values are drawn by `values::inputs` from the graph and a
//! seed, so a saved graph text and its seed replay the case.
//!
//! [`Features`] switches the parts of the space where a known, not yet fixed bug lives
//! (see `tests/fuzz/mod.rs`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sinter::ir::{Attr, Dim, FunctionBuilder, Graph, OpKind, TensorType, Value};
use sinter::DType;

/// Parts of the generator's space that can be switched off (each holds a known bug until
/// it is fixed; `mod.rs` lists which are off in CI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Additive attention masks with the dtype's finite lowest value (not only `-inf`).
    pub finite_mask: bool,
    /// A batch of 0 in `attention` (either layout).
    pub attention_empty_batch: bool,
    /// A reader of the KV pages before `kv_append` updates them in place.
    pub read_before_append: bool,
    /// RMSNorm written out with explicit casts (the Gemma form, `1 + w`).
    pub cast_chain: bool,
    /// Head dims of 256 and 512 in attention written out for the passes to recognise.
    pub wide_heads: bool,
    /// NaN, ±inf and finite extremes among attention's q, k, v and pages.
    pub attention_specials: bool,
    /// Finite extremes (and magnitudes beyond 1e8) among the inputs of the DAG and the cast
    /// chains, where f32 accumulation overflows and the f64 reference does not.
    pub accumulate_extremes: bool,
    /// `slice` in the DAG (the fused lowering forms kernels outside the contract with it).
    pub dag_slice: bool,
    /// Matmuls whose batch axes hold a 0 (an empty batch).
    pub empty_batch_matmul: bool,
    /// Attention written out in bf16 (the passes' attention does not round the scores and
    /// probabilities to bf16 where the graph does).
    pub decomposed_bf16: bool,
}

impl Features {
    /// Every part on.
    pub const ALL: Features = Features {
        finite_mask: true,
        attention_empty_batch: true,
        read_before_append: true,
        cast_chain: true,
        wide_heads: true,
        attention_specials: true,
        decomposed_bf16: true,
        empty_batch_matmul: true,
        accumulate_extremes: true,
        dag_slice: true,
    };

    /// Every part off.
    pub const NONE: Features = Features {
        finite_mask: false,
        attention_empty_batch: false,
        read_before_append: false,
        cast_chain: false,
        wide_heads: false,
        attention_specials: false,
        decomposed_bf16: false,
        empty_batch_matmul: false,
        accumulate_extremes: false,
        dag_slice: false,
    };

    /// The names of the parts on, comma-separated (what [`Features::with`] reads).
    pub fn names(&self) -> String {
        let mut me = *self;
        Features::NAMES.iter().filter(|n| me.flag(n).is_some_and(|f| *f)).copied().collect::<Vec<_>>().join(",")
    }

    /// The names [`Features::with`] knows, with their switches.
    pub const NAMES: [&'static str; 10] =
        ["finite_mask", "attention_empty_batch", "read_before_append", "cast_chain", "wide_heads", "attention_specials", "decomposed_bf16", "empty_batch_matmul", "accumulate_extremes", "dag_slice"];

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "finite_mask" => &mut self.finite_mask,
            "attention_empty_batch" => &mut self.attention_empty_batch,
            "read_before_append" => &mut self.read_before_append,
            "cast_chain" => &mut self.cast_chain,
            "wide_heads" => &mut self.wide_heads,
            "attention_specials" => &mut self.attention_specials,
            "decomposed_bf16" => &mut self.decomposed_bf16,
            "empty_batch_matmul" => &mut self.empty_batch_matmul,
            "accumulate_extremes" => &mut self.accumulate_extremes,
            "dag_slice" => &mut self.dag_slice,
            _ => return None,
        })
    }

    /// `self` with the named parts switched on (`all` for every one).
    pub fn with(mut self, names: &str) -> Features {
        for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if n == "all" {
                return Features::ALL;
            }
            match self.flag(n) {
                Some(f) => *f = true,
                None => panic!("unknown fuzz feature `{n}` (known: all, {})", Features::NAMES.join(", ")),
            }
        }
        self
    }

    /// `self` with the named parts switched off.
    pub fn without(mut self, names: &[&str]) -> Features {
        for n in names {
            if let Some(f) = self.flag(n) {
                *f = false;
            }
        }
        self
    }
}

/// The shape of graph a case draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A random DAG of the element-wise, row, matmul and layout ops.
    Dag,
    /// The `attention` op.
    Attention,
    /// Attention written out for the passes to recognise.
    AttentionDecomposed,
    /// `kv_append` + `paged_attention`.
    Paged,
    /// RMSNorm with explicit casts.
    CastChain,
}

impl Kind {
    /// Every kind, for `SINTER_FUZZ_KINDS`.
    pub const ALL: [Kind; 5] = [Kind::Dag, Kind::Attention, Kind::AttentionDecomposed, Kind::Paged, Kind::CastChain];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Dag => "dag",
            Kind::Attention => "attention",
            Kind::AttentionDecomposed => "attention_decomposed",
            Kind::Paged => "paged",
            Kind::CastChain => "cast_chain",
        }
    }
}

/// Sizes a dimension is drawn from: 0, 1, small primes, and tails around tile sizes.
pub const SIZES: [usize; 14] = [0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 32, 33, 64];

/// One generated case: its graph (entry `@main`) and the seed of its values.
pub struct Case {
    /// The graph.
    pub graph: Graph,
    /// What was drawn (for the report).
    pub kind: Kind,
}

struct Gen {
    rng: StdRng,
    b: FunctionBuilder,
    feats: Features,
    /// Scale of sizes: 1 in CI, larger on the GPU.
    big: usize,
}

/// The case of `seed`, drawn from `kinds` (when `Features` switch a kind off, it is skipped
/// over). `big` multiplies the sizes (1 for the emulator).
pub fn generate(seed: u64, kinds: &[Kind], feats: Features, big: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let allowed: Vec<Kind> = kinds.iter().copied().filter(|k| *k != Kind::CastChain || feats.cast_chain).collect();
    let kind = allowed[rng.random_range(0..allowed.len())];
    let mut g = Gen { rng, b: FunctionBuilder::new(&Graph::new(), "main"), feats, big };
    let outs = match kind {
        Kind::Dag => g.dag(),
        Kind::Attention => g.attention(),
        Kind::AttentionDecomposed => g.attention_decomposed(),
        Kind::Paged => g.paged(),
        Kind::CastChain => g.cast_chain(),
    };
    let func = g.b.finish(&outs).expect("the generator's outputs");
    let mut graph = Graph::new();
    graph.add_func(func);
    Case { graph, kind }
}

fn dims(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&d| Dim::constant(d as i64)).collect()
}

fn float_dtypes() -> [DType; 3] {
    [DType::F32, DType::BF16, DType::F16]
}

impl Gen {
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng.random_range(0..xs.len())]
    }

    fn size(&mut self) -> usize {
        let s = self.pick(&SIZES);
        if self.big > 1 && s > 8 {
            s * self.big + self.rng.random_range(0..self.big)
        } else {
            s
        }
    }

    /// A size, rarely 0 (zero sizes are drawn, but most cases need elements to compare).
    fn size_nz(&mut self) -> usize {
        if self.rng.random_bool(0.1) {
            0
        } else {
            loop {
                let s = self.size();
                if s > 0 {
                    return s;
                }
            }
        }
    }

    fn param(&mut self, name: &str, dt: DType, shape: &[usize]) -> Value {
        self.b.param(name, TensorType::new(dt, dims(shape)))
    }

    fn shape(&self, v: Value) -> Vec<usize> {
        self.b.ty(v).shape.iter().map(|d| d.as_const().unwrap_or(0) as usize).collect()
    }

    fn dtype(&self, v: Value) -> DType {
        self.b.ty(v).dtype
    }

    fn op(&mut self, kind: OpKind, ins: &[Value], attrs: Vec<(&str, Attr)>) -> Value {
        self.b.op1(kind, ins, attrs).unwrap_or_else(|e| panic!("the generator built a bad {kind:?}: {e}"))
    }

    fn try_op(&mut self, kind: OpKind, ins: &[Value], attrs: Vec<(&str, Attr)>) -> Option<Value> {
        self.b.op1(kind, ins, attrs).ok()
    }

    fn cast(&mut self, v: Value, dt: DType) -> Value {
        self.op(OpKind::Cast, &[v], vec![("dtype", Attr::DType(dt))])
    }

    /// A random DAG: a few inputs of one shape, then ops on values of the pool.
    fn dag(&mut self) -> Vec<Value> {
        let rank = self.rng.random_range(1..=3);
        let mut shape: Vec<usize> = (0..rank).map(|_| self.size_nz()).collect();
        // The interpreter computes every element in f64: keep the tensors small.
        while shape.iter().product::<usize>() > 20_000 * self.big * self.big {
            let i = (0..rank).max_by_key(|&i| shape[i]).unwrap_or(0);
            shape[i] /= 2;
        }
        let dt = self.pick(&float_dtypes());
        let mut pool: Vec<Value> = (0..self.rng.random_range(1..=3)).map(|i| self.param(&format!("x{i}"), dt, &shape)).collect();
        let steps = self.rng.random_range(1..=5);
        let mut extra = 0;
        for _ in 0..steps {
            let x = self.pick(&pool);
            if let Some(v) = self.dag_step(x, &pool, &mut extra) {
                pool.push(v);
            }
        }
        // Every value no other op reads is an output (a dead node would make the unfused
        // lowering a kernel without outputs).
        let f = self.b.func();
        let used: std::collections::BTreeSet<Value> = f.nodes.values().flat_map(|n| n.inputs.iter().copied()).collect();
        let params: Vec<Value> = f.params.clone();
        let outs: Vec<Value> = pool.iter().copied().filter(|v| !used.contains(v) && !params.contains(v)).collect();
        if outs.is_empty() {
            let x = pool[0];
            return vec![self.op(OpKind::Neg, &[x], vec![])];
        }
        outs
    }

    /// One op on `x` (and perhaps another value of `pool` or a new input).
    fn dag_step(&mut self, x: Value, pool: &[Value], extra: &mut usize) -> Option<Value> {
        let dt = self.dtype(x);
        let shape = self.shape(x);
        let rank = shape.len();
        let mut new_input = |g: &mut Gen, dt: DType, shape: &[usize]| {
            *extra += 1;
            g.param(&format!("y{extra}"), dt, shape)
        };
        let choice = self.rng.random_range(0..14);
        let float = dt.is_float();
        match choice {
            0 | 1 if float => {
                let k = self.pick(&[
                    OpKind::Neg,
                    OpKind::Abs,
                    OpKind::Exp,
                    OpKind::Log,
                    OpKind::Sqrt,
                    OpKind::Rsqrt,
                    OpKind::Recip,
                    OpKind::Sigmoid,
                    OpKind::Silu,
                    OpKind::Gelu,
                    OpKind::Tanh,
                    OpKind::Erf,
                    OpKind::Sin,
                    OpKind::Cos,
                ]);
                let attrs = if k == OpKind::Gelu && self.rng.random_bool(0.5) { vec![("form", Attr::Str("tanh".into()))] } else { vec![] };
                self.try_op(k, &[x], attrs)
            }
            2..=4 => {
                let k = self.pick(&[OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum, OpKind::Minimum, OpKind::Pow]);
                // The other operand: a pool value of the same type, or a new input of a
                // shape that broadcasts (axes of 1, fewer leading axes, a scalar).
                let same: Vec<Value> = pool.iter().copied().filter(|v| self.b.ty(*v) == self.b.ty(x)).collect();
                let y = if !same.is_empty() && self.rng.random_bool(0.5) {
                    self.pick(&same)
                } else {
                    let drop = self.rng.random_range(0..=rank);
                    let bshape: Vec<usize> = shape[drop..].iter().map(|&d| if self.rng.random_bool(0.4) { 1 } else { d }).collect();
                    new_input(self, dt, &bshape)
                };
                let (a, b) = if self.rng.random_bool(0.5) { (x, y) } else { (y, x) };
                self.try_op(k, &[a, b], vec![])
            }
            5 => {
                let k = self.pick(&[OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge]);
                let y = new_input(self, dt, &shape);
                let c = self.try_op(k, &[x, y], vec![])?;
                self.try_op(OpKind::Select, &[c, x, y], vec![])
            }
            6 if float => {
                let to = self.pick(&float_dtypes());
                let c = self.try_op(OpKind::Cast, &[x], vec![("dtype", Attr::DType(to))])?;
                // Round trips move the rounding the passes must keep.
                if self.rng.random_bool(0.5) {
                    self.try_op(OpKind::Cast, &[c], vec![("dtype", Attr::DType(dt))])
                } else {
                    Some(c)
                }
            }
            7 if rank > 0 => {
                let k = self.pick(&[OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceMean]);
                let axis = self.rng.random_range(0..rank) as i64 - if self.rng.random_bool(0.5) { rank as i64 } else { 0 };
                let keep = self.rng.random_bool(0.5);
                self.try_op(k, &[x], vec![("axis", Attr::Int(axis)), ("keepdim", Attr::Bool(keep))])
            }
            8 if float && rank > 0 => {
                let k = self.pick(&[OpKind::Softmax, OpKind::LogSoftmax]);
                let axis = if self.rng.random_bool(0.7) { -1 } else { self.rng.random_range(0..rank) as i64 };
                self.try_op(k, &[x], vec![("axis", Attr::Int(axis))])
            }
            9 if float && rank > 0 => {
                let w = new_input(self, dt, &shape[rank - 1..]);
                let eps = self.pick(&[0.0, 1e-6, 1e-5]);
                if self.rng.random_bool(0.5) {
                    self.try_op(OpKind::RmsNorm, &[x, w], vec![("eps", Attr::Float(eps))])
                } else {
                    let bias = new_input(self, dt, &shape[rank - 1..]);
                    self.try_op(OpKind::LayerNorm, &[x, w, bias], vec![("eps", Attr::Float(eps))])
                }
            }
            10 if float && rank >= 2 && (self.feats.empty_batch_matmul || !shape[..rank - 2].contains(&0)) => {
                let k = shape[rank - 1];
                let n = self.size_nz();
                let tb = self.rng.random_bool(0.3);
                let w = new_input(self, dt, &if tb { vec![n, k] } else { vec![k, n] });
                self.try_op(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(tb))])
            }
            11 if rank >= 2 => {
                if self.rng.random_bool(0.5) {
                    self.try_op(OpKind::Transpose, &[x], vec![])
                } else {
                    // Merge the last two axes.
                    let mut s = shape[..rank - 2].to_vec();
                    s.push(shape[rank - 2] * shape[rank - 1]);
                    self.try_op(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(dims(&s)))])
                }
            }
            12 if rank > 0 && self.feats.dag_slice => {
                let axis = self.rng.random_range(0..rank);
                let n = shape[axis];
                let start = self.rng.random_range(0..=n);
                let end = self.rng.random_range(start..=n);
                self.try_op(OpKind::Slice, &[x], vec![("axis", Attr::Int(axis as i64)), ("start", Attr::Dim(Dim::constant(start as i64))), ("end", Attr::Dim(Dim::constant(end as i64)))])
            }
            13 => {
                // A stride-0 view: broadcast a new leading axis, or an axis of 1, then use it.
                let lead = self.size_nz().min(5);
                let mut s = vec![lead];
                s.extend(&shape);
                let bx = self.try_op(OpKind::Broadcast, &[x], vec![("shape", Attr::Dims(dims(&s)))])?;
                let y = new_input(self, dt, &s);
                self.try_op(OpKind::Add, &[bx, y], vec![])
            }
            _ => None,
        }
    }

    /// Head dims of attention: common sizes, tails, and (with `wide_heads`) 256 and 512.
    fn head_dim(&mut self, wide: bool) -> usize {
        if wide && self.rng.random_bool(0.25) {
            return self.pick(&[256, 512]);
        }
        self.pick(&[1, 8, 16, 17, 32, 64, 80, 128])
    }

    /// The lowest finite value of `dt`, or `-inf` (without `finite_mask`).
    fn mask_fill(&mut self) -> bool {
        self.feats.finite_mask && self.rng.random_bool(0.5)
    }

    /// The `attention` op with random sizes, layout, GQA, causal and mask.
    fn attention(&mut self) -> Vec<Value> {
        let dt = self.pick(&float_dtypes());
        let bshd = self.rng.random_bool(0.5);
        let mut batch = self.pick(&[0, 1, 1, 2, 3]);
        if batch == 0 && !self.feats.attention_empty_batch {
            batch = 1;
        }
        let hkv = self.pick(&[1, 1, 2, 3]);
        let heads = hkv * self.pick(&[1, 1, 2, 4]);
        let sq = self.size().min(33);
        let skv = if self.rng.random_bool(0.5) { sq } else { self.size().min(33) };
        let d = self.head_dim(false);
        let dv = if self.rng.random_bool(0.8) { d } else { self.head_dim(false) };
        // The emulator runs every thread of every CTA: keep the work small.
        let (mut sq, mut skv) = (sq, skv);
        while batch.max(1) * heads * sq * skv * d.max(dv) > 60_000 * self.big * self.big {
            if sq >= skv {
                sq /= 2;
            } else {
                skv /= 2;
            }
        }
        let lay = |h: usize, s: usize, d: usize| if bshd { vec![batch, s, h, d] } else { vec![batch, h, s, d] };
        let q = self.param("q", dt, &lay(heads, sq, d));
        let k = self.param("k", dt, &lay(hkv, skv, d));
        let v = self.param("v", dt, &lay(hkv, skv, dv));
        let mut ins = vec![q, k, v];
        let finite = self.mask_fill();
        match self.rng.random_range(0..4) {
            1 => ins.push(self.param(if finite { "mask_finite" } else { "mask" }, dt, &[1, 1, sq, skv])),
            2 => ins.push(self.param(if finite { "mask_finite" } else { "mask" }, dt, &[batch, 1, 1, skv])),
            3 => ins.push(self.param(if finite { "mask_finite" } else { "mask" }, dt, &[batch, heads, sq, skv])),
            _ => {}
        }
        let scale = 1.0 / (d.max(1) as f64).sqrt();
        let causal = self.rng.random_bool(0.3);
        let mut attrs = vec![("scale", Attr::Float(scale)), ("heads", Attr::Int(heads as i64)), ("kv_heads", Attr::Int(hkv as i64)), ("causal", Attr::Bool(causal))];
        if bshd {
            attrs.push(("layout", Attr::Str("bshd".into())));
        }
        vec![self.op(OpKind::Attention, &ins, attrs)]
    }

    /// `softmax(scale·Q·Kᵀ + mask)·V` written out, as models without an attention op do.
    fn attention_decomposed(&mut self) -> Vec<Value> {
        let dt = if self.feats.decomposed_bf16 { self.pick(&[DType::F32, DType::BF16]) } else { DType::F32 };
        let batch = self.pick(&[1, 1, 2]);
        let heads = self.pick(&[1, 2]);
        let sq = self.size_nz().min(33);
        let skv = if self.rng.random_bool(0.5) { sq } else { self.size_nz().min(33) };
        let d = self.head_dim(self.feats.wide_heads);
        let (sq, skv) = if d > 128 { (sq.min(9), skv.min(9)) } else { (sq, skv) };
        let q = self.param("q", dt, &[batch, heads, sq, d]);
        let k = self.param("k", dt, &[batch, heads, skv, d]);
        let v = self.param("v", dt, &[batch, heads, skv, d]);
        let s = self.op(OpKind::Matmul, &[q, k], vec![("transpose_b", Attr::Bool(true))]);
        let scale = 1.0 / (d as f64).sqrt();
        let c = self.op(OpKind::Constant, &[], vec![("value", Attr::Float(scale)), ("dtype", Attr::DType(dt))]);
        let mut s = self.op(OpKind::Mul, &[s, c], vec![]);
        if self.rng.random_bool(0.5) {
            let name = if self.mask_fill() { "mask_finite" } else { "mask" };
            let m = self.param(name, dt, &[1, 1, sq, skv]);
            s = self.op(OpKind::Add, &[s, m], vec![]);
        }
        let p = self.op(OpKind::Softmax, &[s], vec![]);
        vec![self.op(OpKind::Matmul, &[p, v], vec![])]
    }

    /// A decode (or chunked prefill) step over a paged KV cache; with `read_before_append`,
    /// the sum of squares of the pages (read before the in-place append) is an output too.
    fn paged(&mut self) -> Vec<Value> {
        let dt = self.pick(&[DType::F32, DType::BF16]);
        let batch = self.pick(&[1, 1, 2, 3]);
        let hkv = self.pick(&[1, 2]);
        let heads = hkv * self.pick(&[1, 2, 4]);
        let d = self.pick(&[16, 32, 64, 128]);
        let page = self.pick(&[4, 8, 16]);
        let max_pages = self.rng.random_range(1..=3);
        let pages = batch * max_pages + self.rng.random_range(0..=2);
        let t = self.pick(&[1, 1, 2, 3]).min(page * max_pages);
        let q = self.param("q", dt, &[batch, heads, t, d]);
        let kn = self.param("k_new", dt, &[batch, t, hkv, d]);
        let vn = self.param("v_new", dt, &[batch, t, hkv, d]);
        let kp = self.param("k_pages", dt, &[pages, page, hkv, d]);
        let vp = self.param("v_pages", dt, &[pages, page, hkv, d]);
        let bt = self.param("block_table", DType::I32, &[batch, max_pages]);
        let sp = self.param("start_pos", DType::I32, &[batch]);
        let sl = self.param("seq_lens", DType::I32, &[batch]);
        let mut outs = vec![];
        if self.feats.read_before_append && self.rng.random_bool(0.6) {
            let f = self.cast(kp, DType::F32);
            let sq = self.op(OpKind::Mul, &[f, f], vec![]);
            let r = self.op(OpKind::ReduceSum, &[sq], vec![("axis", Attr::Int(-1)), ("keepdim", Attr::Bool(false))]);
            outs.push(r);
        }
        let r = self.b.op(OpKind::KvAppend, &[kp, vp, kn, vn, bt, sp], vec![]).expect("kv_append");
        let scale = 1.0 / (d as f64).sqrt();
        let o = self.op(OpKind::PagedAttention, &[q, r[0], r[1], bt, sl], vec![("scale", Attr::Float(scale)), ("heads", Attr::Int(heads as i64)), ("kv_heads", Attr::Int(hkv as i64))]);
        outs.insert(0, o);
        if self.rng.random_bool(0.5) {
            outs.push(r[0]);
            outs.push(r[1]);
        }
        outs
    }

    /// `bf16(f32(x)·rsqrt(mean(f32(x)²)+eps)·(1+f32(w)))` and variants: where the casts are
    /// is where the graph rounds, and a fused kernel must round there too.
    fn cast_chain(&mut self) -> Vec<Value> {
        let dt = self.pick(&[DType::BF16, DType::F16]);
        let rows = self.size_nz().max(1);
        let n = self.size_nz().max(1);
        let x = self.param("x", dt, &[rows, n]);
        let w = self.param("w", dt, &[n]);
        let xf = self.cast(x, DType::F32);
        let sq = self.op(OpKind::Mul, &[xf, xf], vec![]);
        let ms = self.op(OpKind::ReduceMean, &[sq], vec![("axis", Attr::Int(-1))]);
        let eps = self.op(OpKind::Constant, &[], vec![("value", Attr::Float(1e-6)), ("dtype", Attr::DType(DType::F32))]);
        let ms = self.op(OpKind::Add, &[ms, eps], vec![]);
        let r = self.op(OpKind::Rsqrt, &[ms], vec![]);
        let mut h = self.op(OpKind::Mul, &[xf, r], vec![]);
        if self.rng.random_bool(0.5) {
            // Round the normalised row to the storage dtype before the weight (Llama's form).
            h = self.cast(h, dt);
            h = self.cast(h, DType::F32);
        }
        let wf = self.cast(w, DType::F32);
        let wf = if self.rng.random_bool(0.6) {
            let one = self.op(OpKind::Constant, &[], vec![("value", Attr::Float(1.0)), ("dtype", Attr::DType(DType::F32))]);
            self.op(OpKind::Add, &[one, wf], vec![])
        } else {
            wf
        };
        let y = self.op(OpKind::Mul, &[h, wf], vec![]);
        vec![self.cast(y, dt)]
    }
}
