//! The analysis of a row-reduction body: the row space `[L…, N]`, the statistics each row
//! node needs and their levels (a statistic's level is one more than the deepest statistic
//! its input depends on), the outputs (row values or row scalars), and the inputs the cluster
//! schedule stages.
//!
//! Design notes: book/src/design/reductions.md

use std::collections::HashMap;

use sinter_ir::{Dim, Function, Layout, Node, OpKind, Value, ValueDef};

use crate::isa::Combine;
use crate::kernels::element::shape_text;
use crate::kernels::ctx::KernelCtx;
use crate::math::R;

/// A per-row statistic: one reduction over the row of an element expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum StatKind {
    /// `reduce_*` of its operand (`op` Sum also serves `reduce_mean`).
    Reduce(Combine),
    /// `softmax`/`log_softmax`: the max of x.
    SoftmaxMax,
    /// `softmax`/`log_softmax`: Σ e^(x − m).
    SoftmaxSum,
    /// `rms_norm`: Σ x².
    SumSquares,
    /// `layer_norm`: Σ x.
    LnSum,
    /// `layer_norm`: Σ (x − mean₀), the correction of the first pass's mean.
    LnDev,
    /// `layer_norm`: Σ (x − mean₀)².
    LnVar,
    /// `layer_norm` in the one-read schedule, all its statistics in one level: per warp, the
    /// corrected two-pass on the values in registers (shuffles only), then the warps'
    /// `(count, mean, M2)` merged once through shared memory (Chan, Golub & LeVeque's
    /// parallel formula): one barrier instead of two.
    LnFused,
    /// `softmax`/`log_softmax` in the multi-pass schedule: the max and Σe in one pass over
    /// the row (online softmax, Milakov & Gimelshein 2018): a running `(m, s)` per thread,
    /// `s` rescaled by `e^(m_old − m_new)` when the max grows, merged across lanes and warps
    /// the same way. Two accumulators (`m`, then `s`).
    SoftmaxOnline,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Stat {
    pub(super) node: Node,
    pub(super) kind: StatKind,
    pub(super) level: usize,
    /// Accumulated in i64 (an integer reduction).
    pub(super) int: bool,
}

impl Stat {
    pub(super) fn combine(&self) -> Combine {
        match self.kind {
            StatKind::Reduce(c) => c,
            StatKind::SoftmaxMax => Combine::Max,
            _ => Combine::Sum,
        }
    }
}

/// What an output is in the row space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OutKind {
    /// `[L…, N]`: one value per element.
    Row,
    /// `[L…, 1]`: one value per row.
    ScalarKeep,
    /// `[L…]`: one value per row.
    Scalar,
}

pub(super) struct Out {
    pub(super) value: Value,
    pub(super) buffer: usize,
    pub(super) strides: Vec<Dim>,
    pub(super) kind: OutKind,
}

/// The row space, the statistics by level, the outputs.
pub(super) struct Analysis {
    pub(super) lead: Vec<Dim>,
    pub(super) n: Dim,
    pub(super) stats: Vec<Stat>,
    pub(super) levels: usize,
    pub(super) outs: Vec<Out>,
    /// Parameters the cluster schedule stages in shared memory: those of the row space's
    /// shape that a statistic reads (an ancestor of a row node's reduced operand).
    pub(super) staged: Vec<usize>,
    /// Row-invariant parameters of the row's length (shape `[1…, N]`, `N` not 1, not staged):
    /// what [`RowSchedule::stage_invariant`] stages.
    pub(super) resident: Vec<usize>,
}

fn is_row_node(k: OpKind) -> bool {
    use OpKind::*;
    matches!(k, ReduceSum | ReduceMax | ReduceMin | ReduceMean | Softmax | LogSoftmax | RmsNorm | LayerNorm)
}

/// The shortest constant row length for which the multi-pass schedule computes a softmax's max
/// and sum in one (online) pass.
const ONLINE_SOFTMAX_MIN_ROW: i64 = 65536;

impl Analysis {
    /// `fused_ln` (the one-read schedule): a `layer_norm` is one [`StatKind::LnFused`]
    /// statistic rather than three over two levels; otherwise (multi-pass) a softmax over rows
    /// of at least [`ONLINE_SOFTMAX_MIN_ROW`] (or of a symbolic length, or any in the cluster
    /// schedule: `clustered`) is one [`StatKind::SoftmaxOnline`] rather than two over two
    /// levels.
    pub(super) fn new(cx: &KernelCtx<'_>, fused_ln: bool, clustered: bool) -> R<Analysis> {
        let body = &cx.data.body;
        let mut sref: Option<Vec<Dim>> = None;
        let mut row_nodes = Vec::new();
        for (n, nd) in body.nodes.iter() {
            if !is_row_node(nd.op.kind) {
                continue;
            }
            let x = *nd.inputs.first().ok_or_else(|| cx.bad(format!("{n} has no operand")))?;
            let xs = body.ty(x).shape.clone();
            if xs.is_empty() {
                return Err(cx.unsupported(format!("{n} `{}` of a scalar", nd.op.kind.name())));
            }
            if let Some(a) = nd.op.int("axis") {
                let ax = sinter_ir::infer::norm_axis(a, xs.len()).map_err(|e| cx.bad(format!("{n}: {e}")))?;
                if ax + 1 != xs.len() {
                    return Err(cx.unsupported(format!("{n} `{}` reduces axis {a}, not the last (the passes move it last)", nd.op.kind.name())));
                }
            }
            match &sref {
                None => sref = Some(xs),
                Some(s) if *s == xs => {}
                Some(s) => {
                    return Err(cx.unsupported(format!(
                        "{n} reduces rows of {} but another row node rows of {}",
                        shape_text(&xs),
                        shape_text(s)
                    )))
                }
            }
            row_nodes.push(n);
        }
        let Some(sref) = sref else {
            return Err(cx.unsupported("no reduction in a row-reduction kernel"));
        };
        let k = sref.len() - 1;
        let lead = sref[..k].to_vec();
        let n = sref[k].clone();
        // The online softmax for long rows (or a symbolic length): it saves a read of the row,
        // which pays where the row does not stay in L2, but costs more than a second read from
        // L2 for rows that do.
        // In the cluster schedule every pass after the first reads shared memory, and the
        // online form saves a cluster exchange: always online there.
        let online = clustered || n.as_const().is_none_or(|c| c >= ONLINE_SOFTMAX_MIN_ROW);
        // Levels.
        let mut final_level: HashMap<Node, usize> = HashMap::new();
        let mut stats = Vec::new();
        for &node in &row_nodes {
            let nd = &body.nodes[node];
            let mut dep = 0;
            for &i in &nd.inputs {
                dep = dep.max(depth(body, i, &final_level));
            }
            let int = !body.ty(nd.inputs[0]).dtype.is_float();
            use OpKind::*;
            let (kinds, fin): (Vec<(StatKind, usize)>, usize) = match nd.op.kind {
                ReduceSum | ReduceMean => (vec![(StatKind::Reduce(Combine::Sum), dep + 1)], dep + 1),
                ReduceMax => (vec![(StatKind::Reduce(Combine::Max), dep + 1)], dep + 1),
                ReduceMin => (vec![(StatKind::Reduce(Combine::Min), dep + 1)], dep + 1),
                Softmax | LogSoftmax if !fused_ln && online => (vec![(StatKind::SoftmaxOnline, dep + 1)], dep + 1),
                Softmax | LogSoftmax => (vec![(StatKind::SoftmaxMax, dep + 1), (StatKind::SoftmaxSum, dep + 2)], dep + 2),
                RmsNorm => (vec![(StatKind::SumSquares, dep + 1)], dep + 1),
                _ if fused_ln => (vec![(StatKind::LnFused, dep + 1)], dep + 1),
                _ => (vec![(StatKind::LnSum, dep + 1), (StatKind::LnDev, dep + 2), (StatKind::LnVar, dep + 2)], dep + 2),
            };
            if int && !matches!(nd.op.kind, ReduceSum | ReduceMax | ReduceMin) {
                return Err(cx.bad(format!("{node} `{}` of an integer tensor", nd.op.kind.name())));
            }
            for (kind, level) in kinds {
                stats.push(Stat { node, kind, level, int });
            }
            final_level.insert(node, fin);
        }
        let levels = stats.iter().map(|s| s.level).max().unwrap_or(0);
        // Outputs (trailing reshapes of contiguous outputs peeled).
        let n_in = cx.data.inputs.len();
        let mut lead1 = lead.clone();
        lead1.push(Dim::constant(1));
        let mut outs = Vec::new();
        for (j, &o) in body.outputs.iter().enumerate() {
            let b = cx.buffer(n_in + j)?;
            let mut value = o;
            let mut strides = b.layout.strides.clone();
            let contiguous = Layout::contiguous(&b.ty.shape).strides == strides;
            loop {
                let sh = &body.ty(value).shape;
                if *sh == sref || *sh == lead1 || *sh == lead {
                    break;
                }
                let ValueDef::Result(nn, _) = body.values[value].def else { break };
                let nd = &body.nodes[nn];
                if !contiguous || nd.op.kind != OpKind::Reshape {
                    break;
                }
                value = nd.inputs[0];
                strides = Layout::contiguous(&body.ty(value).shape).strides;
            }
            let sh = &body.ty(value).shape;
            let kind = if *sh == sref {
                OutKind::Row
            } else if *sh == lead1 {
                OutKind::ScalarKeep
            } else if *sh == lead {
                OutKind::Scalar
            } else {
                return Err(cx.unsupported(format!(
                    "output {j} has shape {}, neither the rows {} nor one value per row",
                    shape_text(sh),
                    shape_text(&sref)
                )));
            };
            outs.push(Out { value, buffer: n_in + j, strides, kind });
        }
        // Parameters read by the statistics, of the rows' shape.
        let mut staged = Vec::new();
        let mut stack: Vec<Value> = row_nodes.iter().filter_map(|&n| body.nodes[n].inputs.first().copied()).collect();
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            match body.values[v].def {
                ValueDef::Param(i) => {
                    if body.ty(v).shape == sref && !staged.contains(&i) {
                        staged.push(i);
                    }
                }
                ValueDef::Result(n, _) => stack.extend(body.nodes[n].inputs.iter().copied()),
            }
        }
        staged.sort_unstable();
        // Staging pays only when a later pass reads what the first one loads: another level of
        // statistics, an online softmax beside other statistics, or outputs along the row.
        let passes: usize = (1..=levels)
            .map(|l| {
                let at = |online: bool| stats.iter().any(|s| s.level == l && (s.kind == StatKind::SoftmaxOnline) == online);
                usize::from(at(true)) + usize::from(at(false))
            })
            .sum::<usize>()
            + usize::from(outs.iter().any(|o| o.kind == OutKind::Row));
        if passes <= 1 {
            staged.clear();
        }
        let resident = if staged.is_empty() || n.is_one() {
            Vec::new()
        } else {
            body.params
                .iter()
                .enumerate()
                .filter(|&(i, &p)| {
                    let sh = &body.ty(p).shape;
                    !staged.contains(&i) && sh.last() == Some(&n) && sh[..sh.len() - 1].iter().all(Dim::is_one)
                })
                .map(|(i, _)| i)
                .collect()
        };
        Ok(Analysis { lead, n, stats, levels, outs, staged, resident })
    }

    /// The narrowest element of the buffers read or written along the rows.
    pub(super) fn min_row_elem_size(&self, cx: &KernelCtx<'_>) -> R<usize> {
        let body = &cx.data.body;
        let mut m = usize::MAX;
        if !self.n.is_one() {
            for (i, &p) in body.params.iter().enumerate() {
                if body.ty(p).shape.last() == Some(&self.n) {
                    m = m.min(cx.buffer(i)?.ty.dtype.size_bytes());
                }
            }
        }
        for o in &self.outs {
            if o.kind == OutKind::Row {
                m = m.min(cx.buffer(o.buffer)?.ty.dtype.size_bytes());
            }
        }
        Ok(if m == usize::MAX { 4 } else { m })
    }
}

/// The deepest final level of a row node `v` depends on (0 if none), stopping at row nodes.
fn depth(body: &Function, v: Value, final_level: &HashMap<Node, usize>) -> usize {
    let mut best = 0;
    let mut stack = vec![v];
    let mut seen = std::collections::HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if let ValueDef::Result(n, _) = body.values[v].def {
            if let Some(&l) = final_level.get(&n) {
                best = best.max(l);
                continue;
            }
            stack.extend(body.nodes[n].inputs.iter().copied());
        }
    }
    best
}
