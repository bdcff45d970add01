//! Tensor parallelism as a pass: [`shard`] turns a graph into the program every rank of a
//! group of N runs on its shard of the weights, with `all_reduce` and `all_gather` where the
//! ranks must exchange (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053).
//!
//! The user's graph is unchanged; the plan follows from where its weights are read. Each
//! function is placed on its own (`place.rs`): each node, in order, takes the placement of its
//! result that needs the fewest exchanges of its operands (`rules.rs`; ties go to `Partial`,
//! then to a split of the highest axis, then to whole), and a call is placed by placing its
//! callee for the kinds of its arguments (one version serves every call that passes the same,
//! so a decoder layer stays one function). Parameters, and the work on them alone, are placed
//! lazily: a weight read by a matmul whose other operand is whole is split along its columns
//! (the result split along its last axis), one read by a matmul whose other operand is split
//! along the contracted axis is split along its rows (the result a partial sum, reduced by an
//! `all_reduce` where a whole value is needed). So a decoder layer gets Megatron's plan: Q, K,
//! V and gate/up by columns, attention per head, the output and down projections by rows
//! followed by an all-reduce, the LM head by vocabulary followed by an `all_gather`, and the
//! paged KV cache (state: a float parameter of an output's type) split by KV head. An
//! embedding table is split by rows (Megatron's vocabulary-parallel embedding): each rank looks
//! up the ids in its rows, 0 elsewhere, and an `all_reduce` sums the lookups; the rank's index
//! is then a parameter of its program. A tied embedding is one split parameter serving the
//! lookup and the LM head. A weight read in two placements becomes two parameters of the
//! rank's program; a fused projection sliced into parts
//! (GPT-2's QKV) is first rewritten into one matmul per part over a slice of the weight
//! (`slices.rs`).
//!
//! What does not divide stays whole on every rank (each rank computes it), and
//! [`ShardPlan::replicated`] says what and why; under [`ShardOptions::strict`] (the default)
//! attention heads or weight dimensions that do not divide by N are an error naming the node.
//!
//! [`ShardPlan::rank_inputs`] cuts the full inputs into each rank's, and
//! [`ShardPlan::assemble`] joins the ranks' outputs; the interpreter runs the ranks with
//! [`sinter_ir::interp::run_ranks`].

mod place;
mod rules;
mod slices;

use std::collections::BTreeSet;

use sinter_ir::interp::Tensor;
use sinter_ir::{Graph, TensorType};

use place::{Arg, Ctx};
use rules::P;

/// Options of [`shard`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardOptions {
    /// The ranks of the group (N ≥ 1).
    pub ranks: usize,
    /// Refuse, rather than keep whole, attention whose heads or weights whose dimensions do
    /// not divide by N.
    pub strict: bool,
    /// The entry's weight parameters by name; `None` guesses them as the passes do
    /// ([`crate::hoist::infer_weights`]).
    pub weights: Option<BTreeSet<String>>,
}

impl ShardOptions {
    /// N ranks, strict, weights guessed.
    pub fn new(ranks: usize) -> ShardOptions {
        ShardOptions { ranks, strict: true, weights: None }
    }
}

/// Where a parameter or an output of the rank's program lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// The whole tensor on every rank.
    Replicated,
    /// Rank r holds the r-th of N equal blocks of this axis.
    Split(usize),
}

/// One parameter of the rank's program: which parameter of the original entry it is cut from,
/// and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamShard {
    /// Index of the original entry parameter; `None` for the rank's index (an `i64` scalar,
    /// 0 ..= N−1, which the vocabulary-parallel embedding lookup reads).
    pub source: Option<usize>,
    /// Elements `start..end` of an axis of the source, taken before the split (a fused QKV
    /// weight's rows of Q, K or V): `(axis, start, end)`.
    pub slice: Option<(usize, usize, usize)>,
    /// Its placement.
    pub placement: Placement,
}

/// The program every rank runs, and how inputs and outputs map to it.
#[derive(Clone, Debug)]
pub struct ShardPlan {
    /// One function (the entry, calls inlined) with collectives over `ranks` ranks.
    pub graph: Graph,
    /// N.
    pub ranks: usize,
    /// The rank program's parameters, in order.
    pub params: Vec<ParamShard>,
    /// Each output's placement (a split output is the rank's block of a state the caller keeps
    /// per rank, such as the KV cache; everything else is gathered whole).
    pub outputs: Vec<Placement>,
    /// What stays whole on every rank where it could not be split, and why.
    pub replicated: Vec<String>,
    /// `all_reduce` and `all_gather` nodes in the program.
    pub collectives: (usize, usize),
}

/// Why a graph could not be sharded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShardError {
    /// N is 0.
    #[error("tensor parallelism needs at least 1 rank, got 0")]
    NoRanks,
    /// Heads or a weight dimension that do not divide by N (strict mode).
    #[error("{site}: {what} do not divide among {ranks} ranks (tensor parallelism splits them evenly; use a rank count that divides them, or non-strict sharding to keep them whole)")]
    Indivisible {
        /// The node (`n12 \`attention\``) or weight.
        site: String,
        /// What does not divide, with its size.
        what: String,
        /// N.
        ranks: usize,
    },
    /// The graph already holds collectives, or could not be inlined.
    #[error("cannot shard: {0}")]
    Graph(String),
    /// Inputs or outputs that do not fit the plan.
    #[error("{0}")]
    Tensors(String),
}

/// Shards `g`'s entry function for `opts.ranks` ranks; see the module docs.
///
/// # Errors
/// [`ShardError::NoRanks`]; [`ShardError::Indivisible`] under `strict`; [`ShardError::Graph`]
/// for a graph that does not verify or already holds collectives.
pub fn shard(g: &Graph, opts: &ShardOptions) -> Result<ShardPlan, ShardError> {
    if opts.ranks == 0 {
        return Err(ShardError::NoRanks);
    }
    sinter_ir::verify(g).map_err(|e| ShardError::Graph(e.to_string()))?;
    let entry = g.entry().ok_or_else(|| ShardError::Graph("the graph has no function".into()))?;
    let ranks = opts.ranks as i64;
    // Splittable: the weights, and state carried from step to step (a float parameter of an
    // output's type: the KV cache). Tokens, positions and tables stay whole.
    let weights = crate::hoist::weight_params(entry, opts.weights.as_ref());
    let out_types: Vec<&TensorType> = entry.outputs.iter().map(|&o| entry.ty(o)).collect();
    let args = entry
        .params
        .iter()
        .map(|&p| {
            let ty = entry.ty(p);
            let splittable = weights.contains(&p) || (ty.dtype.is_float() && out_types.contains(&ty));
            Arg::Free { split: ty.shape.iter().map(|d| splittable && d.div_exact(ranks).is_some()).collect(), cut: splittable, weight: weights.contains(&p) }
        })
        .collect();
    let mut cx = Ctx::new(g, ranks, opts.strict);
    let placed = place::shard_function(&mut cx, entry, args, true)?;
    let mut graph = Graph::new();
    // Callees come before their callers.
    for f in std::mem::take(&mut cx.funcs) {
        graph.add_func(f);
    }
    graph.add_func(placed.func);
    sinter_ir::verify(&graph).map_err(|e| ShardError::Graph(format!("the sharded program does not verify (a bug of the pass): {e}")))?;
    let placement = |p: P| match p {
        P::Split(a) => Placement::Split(a),
        _ => Placement::Replicated,
    };
    Ok(ShardPlan {
        graph,
        ranks: opts.ranks,
        params: placed.params.iter().map(|&(source, p, slice)| ParamShard { source: (source != place::RANK).then_some(source), slice, placement: placement(p) }).collect(),
        outputs: placed.outputs.iter().map(|&p| placement(p)).collect(),
        replicated: cx.replicated,
        collectives: placed.collectives,
    })
}

/// Bytes of a tensor type whose dims are all constants; `None` otherwise.
fn static_bytes(t: &TensorType) -> Option<usize> {
    let n = t.shape.iter().map(|d| d.as_const().and_then(|c| usize::try_from(c).ok())).product::<Option<usize>>()?;
    t.dtype.storage_bytes(n)
}

impl ShardPlan {
    /// A summary for people: the parameters split and kept whole, the bytes of the parameters
    /// of a fixed size (the weights) on each rank against the original's, the collectives,
    /// and what stays whole.
    pub fn describe(&self, original: &Graph) -> String {
        let (Some(src), Some(f)) = (original.entry(), self.graph.entry()) else { return String::new() };
        let full: usize = src.params.iter().filter_map(|&p| static_bytes(src.ty(p))).sum();
        let rank: usize = f.params.iter().filter_map(|&p| static_bytes(f.ty(p))).sum();
        let split = self.params.iter().filter(|p| p.placement != Placement::Replicated).count();
        let mb = |b: usize| b as f64 / 1e6;
        let mut s = format!(
            "tensor parallel over {} ranks: {} parameters, {split} split, {} whole; fixed-size parameters {:.1} MB a rank of {:.1} MB ({:.2}x); {} all_reduce, {} all_gather a step\n",
            self.ranks,
            self.params.len(),
            self.params.len() - split,
            mb(rank),
            mb(full),
            if full > 0 { rank as f64 / full as f64 } else { 1.0 },
            self.collectives.0,
            self.collectives.1
        );
        for r in &self.replicated {
            s.push_str(&format!("  kept whole: {r}\n"));
        }
        s
    }

    /// Rank `rank`'s inputs from the full inputs of the original entry (in its parameter
    /// order): each split parameter cut to the rank's block.
    ///
    /// # Errors
    /// [`ShardError::Tensors`] for a wrong input count or rank, or an axis that does not
    /// divide.
    pub fn rank_inputs(&self, inputs: &[&Tensor], rank: usize) -> Result<Vec<Tensor>, ShardError> {
        if rank >= self.ranks {
            return Err(ShardError::Tensors(format!("rank {rank} of a group of {}", self.ranks)));
        }
        let mut out = Vec::with_capacity(self.params.len());
        for ps in &self.params {
            let Some(source) = ps.source else {
                out.push(Tensor::scalar(sinter_ir::DType::I64, rank as f64));
                continue;
            };
            let t = inputs.get(source).ok_or_else(|| ShardError::Tensors(format!("the program reads input {source} but {} were given", inputs.len())))?;
            let sliced;
            let t = match ps.slice {
                Some((a, s, e)) => {
                    let d = *t.shape().get(a).ok_or_else(|| ShardError::Tensors(format!("input {source} has no axis {a}")))?;
                    if s > e || e > d || (e - s) % self.ranks != 0 {
                        return Err(ShardError::Tensors(format!("input {source}: rows {s}..{e} of axis {a} (of {d}) for {} ranks", self.ranks)));
                    }
                    // The slice is `ranks` blocks of the axis from `s`: block `s/b + rank` of a
                    // view of `e - s` rows.
                    sliced = cut(t, a, s, e)?;
                    &sliced
                }
                None => *t,
            };
            out.push(match ps.placement {
                Placement::Replicated => t.clone(),
                Placement::Split(a) => block(t, a, rank, self.ranks)?,
            });
        }
        Ok(out)
    }

    /// The full outputs from every rank's outputs: split ones joined in rank order, whole
    /// ones taken from rank 0.
    ///
    /// # Errors
    /// [`ShardError::Tensors`] when the ranks' outputs do not fit the plan.
    pub fn assemble(&self, per_rank: &[Vec<Tensor>]) -> Result<Vec<Tensor>, ShardError> {
        let bad = |m: String| ShardError::Tensors(m);
        if per_rank.len() != self.ranks {
            return Err(bad(format!("{} ranks' outputs for a group of {}", per_rank.len(), self.ranks)));
        }
        let mut out = Vec::with_capacity(self.outputs.len());
        for (k, p) in self.outputs.iter().enumerate() {
            let parts: Vec<&Tensor> = per_rank.iter().map(|o| o.get(k).ok_or_else(|| bad(format!("a rank has no output {k}")))).collect::<Result<_, _>>()?;
            out.push(match p {
                Placement::Replicated => parts[0].clone(),
                Placement::Split(a) => join(&parts, *a)?,
            });
        }
        Ok(out)
    }
}

/// Block `rank` of `ranks` of axis `a` of `t`.
fn block(t: &Tensor, a: usize, rank: usize, ranks: usize) -> Result<Tensor, ShardError> {
    let shape = t.shape();
    let d = *shape.get(a).ok_or_else(|| ShardError::Tensors(format!("axis {a} of a rank-{} input", shape.len())))?;
    if d % ranks != 0 {
        return Err(ShardError::Tensors(format!("axis {a} of an input of shape {shape:?} does not divide among {ranks} ranks")));
    }
    let b = d / ranks;
    cut(t, a, rank * b, (rank + 1) * b)
}

/// Elements `s..e` of axis `a` of `t`.
fn cut(t: &Tensor, a: usize, s: usize, e: usize) -> Result<Tensor, ShardError> {
    t.slice_axis(a, s, e).map_err(|e| ShardError::Tensors(e.to_string()))
}

/// `parts` joined along axis `a` (every part the same shape: the ranks' blocks).
fn join(parts: &[&Tensor], a: usize) -> Result<Tensor, ShardError> {
    let first = parts.first().ok_or_else(|| ShardError::Tensors("no rank's block to join".into()))?;
    if parts.iter().any(|p| p.shape() != first.shape()) {
        return Err(ShardError::Tensors(format!("the ranks' blocks differ in shape along axis {a}")));
    }
    Tensor::concat_axis(parts, a).map_err(|e| ShardError::Tensors(e.to_string()))
}
