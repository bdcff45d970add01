//! Tensor-parallel ranks simulated in one process: [`run_ranks`] runs the same function on
//! every rank's inputs, one thread a rank, and `all_reduce` / `all_gather` exchange tensors
//! through a [`Group`] (a rendezvous: every rank deposits its operand, each reads them all,
//! the last reader clears the slots for the next collective).
//!
//! A rank that fails (an op's error, or a collective that differs from the other ranks')
//! marks the group failed; the ranks waiting in a collective then return an error naming it,
//! so a bad graph ends every rank instead of leaving them waiting.

use std::sync::{Condvar, Mutex, MutexGuard};

use super::{attrs, layout, operands_err, type_text, Evaluator, InterpError, Result, Site};
use crate::dim::Bindings;
use crate::graph::Graph;
use crate::ops::{Op, OpKind};

use super::tensor::{round_all, Tensor};

/// The shared state of one collective in flight.
#[derive(Default)]
struct Exchange {
    /// Each rank's operand and the collective it came from (op text and node).
    slots: Vec<Option<(Tensor, String)>>,
    /// Ranks that deposited their operand in this round.
    arrived: usize,
    /// Ranks that have read every operand in this round.
    read: usize,
    /// Every rank has deposited: reading, no new deposits until the round is cleared.
    reading: bool,
    /// The first rank that failed.
    failed: Option<usize>,
    /// Ranks that returned their outputs.
    finished: usize,
}

/// The ranks of one simulated tensor-parallel group.
pub(super) struct Group {
    ranks: usize,
    state: Mutex<Exchange>,
    cv: Condvar,
}

impl Group {
    fn new(ranks: usize) -> Group {
        let state = Exchange { slots: (0..ranks).map(|_| None).collect(), ..Exchange::default() };
        Group { ranks, state: Mutex::new(state), cv: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Exchange> {
        // A rank thread that panicked cannot leave the exchange half-updated in a way the
        // others misread: every update is one assignment under the lock.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fail(&self, rank: usize) {
        let mut s = self.lock();
        s.failed.get_or_insert(rank);
        self.cv.notify_all();
    }

    fn finish(&self) {
        let mut s = self.lock();
        s.finished += 1;
        self.cv.notify_all();
    }

    fn wait<'a>(&'a self, mut s: MutexGuard<'a, Exchange>, until: impl Fn(&Exchange) -> bool) -> Result<MutexGuard<'a, Exchange>> {
        loop {
            if let Some(r) = s.failed {
                return operands_err(format!("rank {r} of the group failed, so the collective cannot complete"));
            }
            if until(&s) {
                return Ok(s);
            }
            if s.finished > 0 {
                return operands_err("another rank finished without reaching this collective".to_string());
            }
            s = self.cv.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Deposits `x` for rank `rank`, waits for every rank's, and gives `f` of them all.
    fn exchange(&self, rank: usize, what: String, x: Tensor, f: impl FnOnce(&[&Tensor]) -> Result<Tensor>) -> Result<Tensor> {
        let s = self.lock();
        let mut s = self.wait(s, |s| !s.reading)?;
        s.slots[rank] = Some((x, what.clone()));
        s.arrived += 1;
        if s.arrived == self.ranks {
            s.reading = true;
            self.cv.notify_all();
        }
        let mut s = self.wait(s, |s| s.reading)?;
        let result = {
            let mut xs = Vec::with_capacity(self.ranks);
            for (r, slot) in s.slots.iter().enumerate() {
                let Some((t, w)) = slot else { return operands_err(format!("rank {r} deposited nothing")) };
                if *w != what {
                    let msg = format!("rank {rank} is at {what} but rank {r} at {w}: the ranks run different collectives");
                    s.failed.get_or_insert(rank);
                    self.cv.notify_all();
                    return operands_err(msg);
                }
                xs.push(t);
            }
            f(&xs)
        };
        s.read += 1;
        if s.read == self.ranks {
            s.slots.iter_mut().for_each(|x| *x = None);
            s.arrived = 0;
            s.read = 0;
            s.reading = false;
            self.cv.notify_all();
        }
        result
    }
}

/// One rank's handle on its group.
pub(super) struct Comm<'a> {
    pub(super) group: &'a Group,
    pub(super) rank: usize,
}

/// Σ over the ranks, in f64, rounded once to the dtype.
fn sum(xs: &[&Tensor]) -> Result<Tensor> {
    let first = xs[0];
    for (r, t) in xs.iter().enumerate() {
        if t.dtype != first.dtype || t.shape != first.shape {
            return operands_err(format!("rank {r}'s operand is {}, rank 0's {}", type_text(t.dtype, &t.shape), type_text(first.dtype, &first.shape)));
        }
    }
    let mut data = first.data.clone();
    for t in &xs[1..] {
        for (d, v) in data.iter_mut().zip(&t.data) {
            *d += v;
        }
    }
    round_all(first.dtype, &mut data);
    Ok(Tensor::from_parts(first.dtype, first.shape.clone(), data))
}

impl Evaluator<'_> {
    /// `all_reduce` / `all_gather` of `x` on this rank (alone: `ranks=1` is the identity).
    pub(super) fn collective(&self, op: &Op, x: &Tensor, site: &Site) -> Result<Vec<Tensor>> {
        let ranks = attrs::int(op, "ranks")?;
        let group_ranks = self.comm.as_ref().map_or(1, |c| c.group.ranks);
        if usize::try_from(ranks).ok() != Some(group_ranks) {
            return operands_err(format!(
                "`{}` is for {ranks} ranks but runs in a group of {group_ranks} (a sharded graph runs with `run_ranks`)",
                op.kind.name()
            ));
        }
        if x.dtype.is_quantized() || (op.kind == OpKind::AllReduce && !x.dtype.is_float()) {
            return operands_err(format!("`{}` of {}", op.kind.name(), type_text(x.dtype, &x.shape)));
        }
        let Some(comm) = &self.comm else { return Ok(vec![x.clone()]) };
        let what = format!("`{}` {}", op.kind.name(), site.node.map(|n| n.to_string()).unwrap_or_default());
        let out = match op.kind {
            OpKind::AllReduce => comm.group.exchange(comm.rank, what, x.clone(), sum)?,
            _ => comm.group.exchange(comm.rank, what, x.clone(), |xs| layout::concat(op, xs))?,
        };
        Ok(vec![out])
    }
}

/// Runs function `func` of `g` as `inputs.len()` tensor-parallel ranks, rank r on
/// `inputs[r]`, one thread a rank; `all_reduce` and `all_gather` exchange between them.
/// Returns each rank's outputs, rank order.
///
/// # Errors
/// Every error [`super::run`] gives, from the first rank that failed (the others report that
/// a rank failed); an error when no rank is given, or when a collective's `ranks` is not the
/// number of ranks or the ranks reach different collectives.
pub fn run_ranks(g: &Graph, func: &str, inputs: &[Vec<Tensor>], bindings: &Bindings) -> Result<Vec<Vec<Tensor>>> {
    let f = g.func(func).ok_or_else(|| InterpError::NoSuchFunction { name: func.to_string() })?;
    if inputs.is_empty() {
        return Err(InterpError::Arity { site: Site { func: func.to_string(), ..Site::default() }, what: "ranks", expected: "at least 1".into(), got: 0 });
    }
    let group = Group::new(inputs.len());
    let results: Vec<Result<Vec<Tensor>>> = std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(rank, ins)| {
                let group = &group;
                s.spawn(move || {
                    let refs: Vec<&Tensor> = ins.iter().collect();
                    let mut ev = Evaluator { g, callers: Vec::new(), comm: Some(Comm { group, rank }) };
                    let r = ev.eval(f, &refs, bindings, None);
                    match &r {
                        Ok(_) => group.finish(),
                        Err(_) => group.fail(rank),
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|_| {
                    group.fail(rank);
                    Err(InterpError::Malformed { site: Site { func: func.to_string(), ..Site::default() }, message: format!("rank {rank} panicked") })
                })
            })
            .collect()
    });
    let failed = group.lock().failed;
    let mut outs = Vec::with_capacity(results.len());
    let mut first_err = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(o) => outs.push(o),
            Err(e) if failed == Some(rank) => return Err(e),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(outs),
    }
}
