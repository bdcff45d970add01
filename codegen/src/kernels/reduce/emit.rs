//! The row-reduction kernel ([`Emitter`]): the grid-stride loop over rows, a row's chunks
//! (a thread's vectors of the row), the passes over a row — one per reduction level, then
//! the outputs — and the row scalars written once a row.
//!
//! The multi-pass loops carry `.pragma "nounroll"` in the cluster schedule: ptxas would
//! otherwise unroll their few iterations completely and exceed the registers the schedule's
//! occupancy allows. Elements past the row's end (a partial last vector group) are read at a
//! clamped in-bounds address and masked out of the statistics and the stores.
//!
//! Design notes: book/src/design/reductions.md

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use inkwell::types::BasicTypeEnum;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Dim, Node};

use super::analysis::{Analysis, OutKind, Stat, StatKind};
use super::cluster::Split;
use super::schedule::RowSchedule;
use crate::kernels::element::{At, Ax, Buf, Eval, Stage, Tag};
use crate::math::R;
use crate::error::CodegenError;

/// Row statistics of a node waiting for the rest of its statistics: softmax's `(m, m is −inf,
/// m_safe)`, layer_norm's mean correction `d`.
pub(super) struct Pending<'ctx> {
    pub(super) softmax: HashMap<Node, (FloatValue<'ctx>, IntValue<'ctx>, FloatValue<'ctx>)>,
    pub(super) ln: HashMap<Node, FloatValue<'ctx>>,
}

pub(super) struct Emitter<'p, 'ctx> {
    pub(super) plan: &'p Analysis,
    pub(super) sched: RowSchedule,
    pub(super) obufs: Vec<Buf<'ctx>>,
    /// The cluster schedule's split of a row (`sched.cluster > 1`).
    pub(super) split: Option<Split>,
    /// The cluster schedule's dynamic shared memory: its base, and the bytes handed out so
    /// far (every shared array of the kernel is carved from it, see [`Emitter::smem_array`]).
    pub(super) dsmem: Cell<Option<PointerValue<'ctx>>>,
    pub(super) dsmem_used: Cell<u32>,
    /// The cluster schedule's facts about the current row.
    pub(super) crow: Cell<Option<ClusterRow<'ctx>>>,
    /// The commit groups the row's prefetch left in flight, one a loop iteration (see
    /// [`Emitter::prefetch_slice`]); 0 once waited for.
    pub(super) groups: Cell<u32>,
    /// The row head's chunk ([`RowSchedule::head_shift`]), its loads issued before the slice's.
    pub(super) head: RefCell<Option<At<'ctx>>>,
    /// The current row's chunks held in registers ([`RowSchedule::held`]): each chunk's
    /// slice element `j` and coordinate, made once a row (their vectors are in
    /// [`Eval::pinned`], keyed by the coordinate's last-axis base).
    pub(super) held: RefCell<Vec<(IntValue<'ctx>, At<'ctx>)>>,
}

/// Where the current row's slice lies, in the cluster schedule.
#[derive(Clone, Copy)]
pub(super) struct ClusterRow<'ctx> {
    /// This CTA's rank in its cluster (`i32`).
    pub(super) rank: IntValue<'ctx>,
    /// The slice's first element and its end (`min(N, start + slice)`), as indices.
    pub(super) start: IntValue<'ctx>,
    pub(super) end: IntValue<'ctx>,
    /// The parity of the CTA's row count (0 or 1, an index): which of the two sets of
    /// cluster slots this row uses.
    pub(super) parity: IntValue<'ctx>,
    /// Whether this is the CTA's last row (`i1`, the same in every thread of the CTA): after
    /// its statistics the CTA reads no other CTA's shared memory, so it arrives at the exit
    /// barrier there (see [`Emitter::emit`]).
    pub(super) last: IntValue<'ctx>,
}

/// A chunk of a thread's share of a row: its coordinate and whether it is inside the row.
pub(super) struct Chunk<'ctx> {
    pub(super) at: At<'ctx>,
    pub(super) valid: Option<IntValue<'ctx>>,
}

/// A statistic's running value.
#[derive(Clone, Copy)]
pub(super) enum Acc<'ctx> {
    F(FloatValue<'ctx>),
    I(IntValue<'ctx>),
}

/// Where [`Emitter::chunk_loop`] evaluates the chunks held in registers
/// ([`RowSchedule::held`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Not at all (the prefetch: nothing to copy).
    Skip,
    /// Before the loop (the output pass: their registers are free for the loop's loads).
    Before,
    /// After the loop (a statistics pass: they were loaded after the staged copies).
    After,
}

/// The body of [`Emitter::chunk_loop`]: `(ev, j, accumulators) -> next accumulators`.
pub(super) type ChunkBody<'f, 'ctx> = dyn FnMut(&mut Eval<'_, 'ctx>, IntValue<'ctx>, Vec<Acc<'ctx>>) -> R<Vec<Acc<'ctx>>> + 'f;

impl<'p, 'ctx> Emitter<'p, 'ctx> {
    pub(super) fn emit(&self, ev: &mut Eval<'_, 'ctx>) -> R<()> {
        let ity = ev.ity();
        let s = self.sched;
        let tid = ev.kb.tid_x()?;
        let ctaid = ev.kb.ctaid_x()?;
        let nctaid = ev.kb.nctaid_x()?;
        let rows = ev.dim(&Dim::product(&self.plan.lead))?;
        let nv = ev.dim(&self.plan.n)?;
        let rpc = u64::from(s.rows_per_cta);
        let (t, row0, rstride, warp, lane) = ev.kb.in_prologue(|kb| {
            let z = |v| kb.b.build_int_z_extend_or_bit_cast(v, ity, "w");
            let (tid, ctaid, nctaid) = (z(tid)?, z(ctaid)?, z(nctaid)?);
            let c32 = ity.const_int(32, false);
            let lane = kb.b.build_int_unsigned_rem(tid, c32, "lane")?;
            let warp = kb.b.build_int_unsigned_div(tid, c32, "warp")?;
            let rpc_v = ity.const_int(rpc, false);
            if s.threads_per_row == 32 {
                let row0 = kb.b.build_int_add(kb.b.build_int_mul(ctaid, rpc_v, "r")?, warp, "row0")?;
                let rs = kb.b.build_int_mul(nctaid, rpc_v, "rs")?;
                Ok((lane, row0, rs, warp, lane))
            } else {
                Ok((tid, ctaid, nctaid, warp, lane))
            }
        })?;
        // The cluster schedule: its CTA's slice and staged arrays.
        let cluster = match &self.split {
            Some(split) => {
                let base = ev.kb.dynamic_shared_base()?;
                self.dsmem.set(Some(base));
                let per_iter = s.per_iter();
                let mut arrays = HashMap::new();
                for &(i, size) in split.staged.iter().chain(&split.resident) {
                    let len = u32::try_from((split.iters - split.held) * per_iter).map_err(|_| CodegenError::Builder("a slice too large".into()))?;
                    arrays.insert(i, self.smem_alloc(ev, len * size, 16)?);
                }
                ev.stage = Some(Stage {
                    arrays,
                    ready: Default::default(),
                    filling: Default::default(),
                    fill: true,
                    cursor: None,
                    lanes: s.vec,
                    resident: split.resident.iter().map(|&(i, _)| i).collect(),
                    resident_fill: false,
                    row_axis: self.plan.lead.len(),
                });
                let rank = ev.kb.sreg("cluster.ctarank")?;
                let slice = split.slice;
                let (start, end) = ev.kb.in_prologue(|kb| {
                    let r = kb.b.build_int_z_extend_or_bit_cast(rank, ity, "rank")?;
                    let start = kb.b.build_int_mul(r, ity.const_int(slice as u64, false), "slice0")?;
                    let end = kb.b.build_int_add(start, ity.const_int(slice as u64, false), "slice1")?;
                    let i = kb.intrinsic_value("llvm.umin", &[ity.into()], &[end.into(), nv.into()])?.into_int_value();
                    Ok((start, i))
                })?;
                Some((rank, start, end))
            }
            None => None,
        };
        if s.persistent > 0 {
            // The first row's slice (and the row-invariant inputs, once) are in flight before
            // the row loop; every later row's is issued by the output pass before it.
            let some = ev.ilt(row0, rows)?;
            self.guarded(ev, Some(some), |ev| {
                let lead0 = self.lead_axes(ev, row0)?;
                if let Some((rank, start, end)) = cluster {
                    let one = ev.kb.b.build_int_compare(IntPredicate::EQ, ev.ic(0), ev.ic(0), "one")?;
                    self.crow.set(Some(ClusterRow { rank, start, end, parity: ev.ic(0), last: one }));
                }
                self.prefetch_slice(ev, &lead0, t, nv, false)?;
                self.crow.set(None);
                Ok(())
            })?;
        }
        // Row loop.
        let pre = ev.kb.current_block()?;
        let header = ev.kb.block("row");
        let body = ev.kb.block("row_body");
        let exit = ev.kb.block("exit");
        ev.kb.br(header)?;
        ev.kb.position(header);
        let r = ev.kb.b.build_phi(ity, "r")?;
        r.add_incoming(&[(&row0, pre)]);
        let rv = r.as_basic_value().into_int_value();
        let parity = ev.kb.b.build_phi(ity, "parity")?;
        parity.add_incoming(&[(&ev.ic(0), pre)]);
        let pv = parity.as_basic_value().into_int_value();
        let more = ev.kb.b.build_int_compare(IntPredicate::ULT, rv, rows, "more")?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        ev.forget();
        ev.rows.clear();
        if let Some((rank, start, end)) = cluster {
            let following = ev.iadd(rv, rstride)?;
            let last = ev.kb.b.build_int_compare(IntPredicate::UGE, following, rows, "last")?;
            self.crow.set(Some(ClusterRow { rank, start, end, parity: pv, last }));
        }
        self.row(ev, rv, t, nv, warp, lane)?;
        let next = ev.iadd(rv, rstride)?;
        if s.threads_per_row > 32 && cluster.is_none() {
            // The next row's partials reuse the shared memory: a barrier before it, if there
            // is one (the grid has a CTA per row, so normally there is none). In the cluster
            // schedule each row's cluster barriers already order the reuse (see
            // `cluster_fold_with`).
            let again = ev.kb.b.build_int_compare(IntPredicate::ULT, next, rows, "again")?;
            self.guarded(ev, Some(again), |ev| ev.kb.barrier())?;
        }
        let flip = ev.kb.b.build_xor(pv, ev.ic(1), "parity")?;
        let latch = ev.kb.current_block()?;
        r.add_incoming(&[(&next, latch)]);
        parity.add_incoming(&[(&flip, latch)]);
        ev.kb.br(header)?;
        ev.kb.position(exit);
        if cluster.is_some() {
            // No CTA leaves while another CTA of its cluster may still read its shared memory.
            // Each CTA arrives (relaxed: a release would make every thread wait for its
            // outstanding global stores, `MEMBAR.ALL.GPU`) once it has read the other CTAs'
            // partials of its last row, before that row's output pass (`row`), or here if it
            // had no row; it waits here, usually without stalling, since the others arrived
            // before their own output passes. A CTA thus frees its SM slot when its own
            // outputs are stored rather than when its cluster's slowest CTA's are.
            let none = ev.kb.b.build_int_compare(IntPredicate::UGE, row0, rows, "norow")?;
            self.guarded(ev, Some(none), |ev| ev.kb.cluster_arrive_relaxed())?;
            if s.persistent > 0 {
                // The last row's refills (of nothing: zero bytes read) land before the exit.
                ev.kb.cp_async_wait(0)?;
            }
            ev.kb.cluster_wait()?;
        }
        ev.kb.ret()
    }

    /// `bytes` of the cluster schedule's dynamic shared memory, aligned to `align`.
    pub(super) fn smem_alloc(&self, ev: &mut Eval<'_, 'ctx>, bytes: u32, align: u32) -> R<PointerValue<'ctx>> {
        let base = self.dsmem.get().ok_or_else(|| CodegenError::Builder("no dynamic shared memory".into()))?;
        let off = self.dsmem_used.get().div_ceil(align) * align;
        self.dsmem_used.set(off + bytes);
        let i8t = ev.kb.cx.i8_type();
        // SAFETY (of the IR, not of Rust): inside the dynamic area the launch sizes.
        Ok(unsafe { ev.kb.b.build_gep(i8t, base, &[ev.kb.i32c(i64::from(off))], "smem") }?)
    }

    /// A shared array of `len` elements of `ty` (`size` bytes each): a static `.shared`
    /// array, or in the cluster schedule a piece of the dynamic shared memory.
    pub(super) fn smem_array(&self, ev: &mut Eval<'_, 'ctx>, ty: BasicTypeEnum<'ctx>, size: u32, len: u32, name: &str) -> R<PointerValue<'ctx>> {
        if self.split.is_some() {
            self.smem_alloc(ev, size * len, 16)
        } else {
            Ok(ev.kb.shared_array(ty, len, 16, name))
        }
    }

    /// The lead coordinates of row `r` (innermost first), tagged as the row space's axes.
    fn lead_axes(&self, ev: &mut Eval<'_, 'ctx>, r: IntValue<'ctx>) -> R<Vec<Ax<'ctx>>> {
        let lead = &self.plan.lead;
        let mut axes = vec![ev.zero_ax(); lead.len()];
        let mut rem = r;
        for i in (0..lead.len()).rev() {
            let d = &lead[i];
            if d.is_one() {
                axes[i] = Ax { tag: Tag::Ref(i), ..ev.zero_ax() };
                continue;
            }
            let outer_one = lead[..i].iter().all(Dim::is_one);
            let (c, next) = if outer_one {
                (rem, rem)
            } else {
                let dv = ev.dim(d)?;
                (ev.irem(rem, dv)?, ev.idiv(rem, dv)?)
            };
            axes[i] = Ax { base: c, step: false, aligned: false, zero: false, tag: Tag::Ref(i) };
            rem = next;
        }
        Ok(axes)
    }

    /// The coordinate of the vector starting at row element `j` (clamped to 0 when invalid).
    pub(super) fn chunk(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], j: IntValue<'ctx>, nv: IntValue<'ctx>, always_valid: bool) -> R<Chunk<'ctx>> {
        let (base, valid) = if always_valid {
            (j, None)
        } else {
            let ok = ev.ilt(j, nv)?;
            let z = ev.ic(0);
            (ev.kb.b.build_select(ok, j, z, "j")?.into_int_value(), Some(ok))
        };
        let mut axes = lead.to_vec();
        let k = lead.len();
        axes.push(Ax { base, step: self.sched.vec > 1, aligned: true, zero: false, tag: Tag::Ref(k) });
        Ok(Chunk { at: At { axes, lanes: self.sched.vec }, valid })
    }

    fn row(&self, ev: &mut Eval<'_, 'ctx>, r: IntValue<'ctx>, t: IntValue<'ctx>, nv: IntValue<'ctx>, warp: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<()> {
        let s = self.sched;
        // With chunks held in registers (`RowSchedule::held`) the thread's addresses are
        // computed in the row's body, where each pass uses them: hoisted out of the row loop
        // (which normally runs once) they would all stay live next to the held vectors.
        let t = if s.held > 0 { ev.kb.opaque_here(t)? } else { t };
        let lead = self.lead_axes(ev, r)?;
        let tv = u64::from(s.threads_per_row) * u64::from(s.vec);
        // The one-read schedule's chunks, made once so that every level reuses the loads.
        let chunks: Option<Vec<Chunk<'ctx>>> = match s.chunks {
            Some(c) => {
                let mut v = Vec::with_capacity(c as usize);
                let n_const = self.plan.n.as_const().unwrap_or(0).max(0) as u64;
                for ci in 0..c {
                    let off = ev.ic((u64::from(ci) * tv) as i64);
                    let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
                    let j = ev.iadd(off, tj)?;
                    let always = (u64::from(ci) + 1) * tv <= n_const;
                    v.push(self.chunk(ev, &lead, j, nv, always)?);
                }
                Some(v)
            }
            None => None,
        };
        if self.sched.persistent > 0 {
            // This row's slice was issued before the loop or by the previous row's output pass.
            if self.split.as_ref().is_some_and(|sp| !sp.staged.is_empty()) {
                ev.kb.cp_async_wait(0)?;
            }
        } else {
            if self.head_shift() {
                // The row head's loads first (lane `l` of every warp: the row's chunk at
                // `l·vec`, from global memory — it may lie in another CTA's slice): the shift
                // waits for them, not for the slice's copies.
                let lane_col = ev.imul(lane, ev.ic(i64::from(s.vec)))?;
                let at = self.chunk(ev, &lead, lane_col, nv, true)?.at;
                if let Some(sp) = &self.split {
                    for &(i, _) in &sp.staged {
                        if let Some(v) = ev.load_vector(i, &at)? {
                            ev.pinned.push((i, lane_col, v));
                        }
                    }
                }
                self.head.replace(Some(at));
            }
            self.prefetch_slice(ev, &lead, t, nv, true)?;
            self.load_held(ev, &lead, t)?;
        }
        // Pending softmax / layer-norm pieces.
        let mut pending_m = Pending { softmax: HashMap::new(), ln: HashMap::new() };
        for level in 1..=self.plan.levels {
            let all: Vec<Stat> = self.plan.stats.iter().copied().filter(|st| st.level == level).collect();
            let (fused, stats): (Vec<Stat>, Vec<Stat>) = all.into_iter().partition(|st| st.kind == StatKind::LnFused);
            if let Some(chs) = &chunks {
                for st in &fused {
                    self.layer_norm_fused(ev, st, chs, warp, nv)?;
                }
            }
            let (online, stats): (Vec<Stat>, Vec<Stat>) = stats.into_iter().partition(|st| st.kind == StatKind::SoftmaxOnline);
            if !online.is_empty() {
                // Multi-pass only: one pass for the online statistics.
                let acc = self.loop_level(ev, &online, &lead, t, nv)?;
                for (i, st) in online.iter().enumerate() {
                    let (Some(Acc::F(m)), Some(Acc::F(sm))) = (acc.get(2 * i).copied(), acc.get(2 * i + 1).copied()) else {
                        return Err(CodegenError::Builder("online softmax accumulators".into()));
                    };
                    self.softmax_online_finish(ev, st, m, sm, warp, t)?;
                }
            }
            if stats.is_empty() {
                continue;
            }
            let partials = match &chunks {
                Some(chs) => {
                    let mut acc = self.identities(ev, &stats);
                    for ch in chs {
                        acc = self.accumulate(ev, &stats, ch, acc)?;
                    }
                    acc
                }
                None if self.head_shift() && stats.iter().all(|st| st.kind == StatKind::LnSum) => {
                    // The shift from the row's head (`RowSchedule::head_shift`), its vectors
                    // loaded before the slice's copies ([`Eval::pinned`]).
                    ev.forget();
                    if let Some(st) = ev.stage.as_mut() {
                        st.cursor = None;
                    }
                    let at = self.head.take().ok_or_else(|| CodegenError::Builder("no row head".into()))?;
                    let init = self.identities(ev, &stats);
                    let base = at.axes.last().map(|a| a.base);
                    let acc = self.accumulate(ev, &stats, &Chunk { at, valid: None }, init)?;
                    // The head's vectors are done with (the held chunks' stay).
                    ev.pinned.retain(|(_, b, _)| base.is_none_or(|h| h != *b));
                    ev.forget();
                    acc
                }
                None if self.sampled() && stats.iter().all(|st| st.kind == StatKind::LnSum) => {
                    // A sampled shift: the thread's first chunk of the slice only (see
                    // `RowSchedule::sampled_shift`); its warp's 32 chunks are the sample.
                    ev.forget();
                    let j = ev.imul(t, ev.ic(i64::from(s.vec)))?;
                    let groups = self.groups.get();
                    if groups > 0 {
                        // The first iteration's group; the pass after waits for the others.
                        self.wait_iteration(ev, j, groups)?;
                    }
                    let ch = self.slice_chunk(ev, &lead, j, nv)?;
                    let init = self.identities(ev, &stats);
                    let acc = self.accumulate(ev, &stats, &ch, init)?;
                    ev.forget();
                    if let Some(st) = ev.stage.as_mut() {
                        st.cursor = None;
                    }
                    acc
                }
                None => self.loop_level(ev, &stats, &lead, t, nv)?,
            };
            let totals = self.combine_group(ev, &stats, partials, level, warp, lane)?;
            if self.split.is_some() {
                self.cluster_level(ev, &stats, totals, t, nv, &mut pending_m)?;
            } else {
                for (st, tot) in stats.iter().zip(totals) {
                    self.finish_stat(ev, st, tot, nv, &mut pending_m)?;
                }
            }
        }
        if let Some(c) = self.crow.get() {
            // The last remote read of the CTA's last row is done: the exit barrier's arrive.
            self.guarded(ev, Some(c.last), |ev| ev.kb.cluster_arrive_relaxed())?;
        }
        // Outputs.
        let row_outs: Vec<usize> = (0..self.plan.outs.len()).filter(|&i| self.plan.outs[i].kind == OutKind::Row).collect();
        match &chunks {
            Some(chs) => {
                for ch in chs {
                    let mut vals = Vec::new();
                    for &i in &row_outs {
                        vals.push(ev.eval(self.plan.outs[i].value, &ch.at)?);
                    }
                    self.guarded(ev, ch.valid, |ev| {
                        for (&i, v) in row_outs.iter().zip(&vals) {
                            ev.store(&self.obufs[i], &ch.at, v)?;
                        }
                        Ok(())
                    })?;
                }
            }
            None if !row_outs.is_empty() => self.loop_outputs(ev, &row_outs, &lead, (r, t, nv))?,
            None => {}
        }
        // Row scalars, written by the row group's thread 0.
        let scalar_outs: Vec<usize> = (0..self.plan.outs.len()).filter(|&i| self.plan.outs[i].kind != OutKind::Row).collect();
        if !scalar_outs.is_empty() {
            let mut vals = Vec::new();
            let mut ats = Vec::new();
            for &i in &scalar_outs {
                let o = &self.plan.outs[i];
                let mut axes = lead.clone();
                if o.kind == OutKind::ScalarKeep {
                    axes.push(ev.zero_ax());
                }
                let at = At { axes, lanes: 1 };
                vals.push(ev.eval(o.value, &at)?);
                ats.push(at);
            }
            let mut first = ev.kb.b.build_int_compare(IntPredicate::EQ, t, ev.ic(0), "t0")?;
            if let Some(c) = self.crow.get() {
                // Every CTA of the cluster holds the row's statistics; the first writes them.
                let r0 = ev.kb.b.build_int_compare(IntPredicate::EQ, c.rank, ev.kb.i32c(0), "r0")?;
                first = ev.kb.b.build_and(first, r0, "t0")?;
            }
            self.guarded(ev, Some(first), |ev| {
                for ((&i, v), at) in scalar_outs.iter().zip(&vals).zip(&ats) {
                    ev.store(&self.obufs[i], at, v)?;
                }
                Ok(())
            })?;
        }
        // The held vectors belong to this row.
        ev.pinned.clear();
        self.held.borrow_mut().clear();
        Ok(())
    }

    /// Runs `f` under `if cond` (always when `None`).
    pub(super) fn guarded(&self, ev: &mut Eval<'_, 'ctx>, cond: Option<IntValue<'ctx>>, f: impl FnOnce(&mut Eval<'_, 'ctx>) -> R<()>) -> R<()> {
        match cond {
            None => f(ev),
            Some(c) => {
                let then = ev.kb.block("then");
                let join = ev.kb.block("join");
                ev.kb.cond_br(c, then, join)?;
                ev.kb.position(then);
                f(ev)?;
                ev.kb.br(join)?;
                ev.kb.position(join);
                Ok(())
            }
        }
    }

    /// A multi-pass loop over the row (or, in the cluster schedule, the CTA's slice):
    /// `body(ev, j, acc)` for each of the `unroll` chunks of an iteration, `j` the chunk's
    /// first element (see [`Emitter::slice_chunk`]), `acc` the loop-carried accumulators
    /// (starting at `init`; `body` returns their next values); returns the accumulators at
    /// the exit. Memoised values are forgotten at the top of the body — before every chunk
    /// when `forget_each` — and after the loop.
    ///
    /// In a pass over the stage (`held` not [`Held::Skip`]) the loop covers the staged
    /// iterations, and the chunks held in registers ([`RowSchedule::held`]) are evaluated
    /// unrolled before or after it.
    pub(super) fn chunk_loop(&self, ev: &mut Eval<'_, 'ctx>, name: &str, (t, nv): (IntValue<'ctx>, IntValue<'ctx>), init: &[Acc<'ctx>], forget_each: bool, held: Held, body_fn: &mut ChunkBody<'_, 'ctx>) -> R<Vec<Acc<'ctx>>> {
        let init = if held == Held::Before { self.held_chunks(ev, init.to_vec(), body_fn)? } else { init.to_vec() };
        let acc = self.staged_loop(ev, name, (t, nv), &init, forget_each, body_fn)?;
        if held == Held::After {
            return self.held_chunks(ev, acc, body_fn);
        }
        Ok(acc)
    }

    /// [`Emitter::chunk_loop`]'s chunks held in registers, in order.
    fn held_chunks(&self, ev: &mut Eval<'_, 'ctx>, mut acc: Vec<Acc<'ctx>>, body_fn: &mut ChunkBody<'_, 'ctx>) -> R<Vec<Acc<'ctx>>> {
        let js: Vec<IntValue<'ctx>> = self.held.borrow().iter().map(|(j, _)| *j).collect();
        for j in js {
            ev.forget();
            acc = body_fn(ev, j, acc)?;
        }
        ev.forget();
        Ok(acc)
    }

    /// [`Emitter::chunk_loop`]'s loop.
    fn staged_loop(&self, ev: &mut Eval<'_, 'ctx>, name: &str, (t, nv): (IntValue<'ctx>, IntValue<'ctx>), init: &[Acc<'ctx>], forget_each: bool, body_fn: &mut ChunkBody<'_, 'ctx>) -> R<Vec<Acc<'ctx>>> {
        let s = self.sched;
        let ity = ev.ity();
        let pre = ev.kb.current_block()?;
        let header = ev.kb.block(name);
        let body = ev.kb.block(&format!("{name}_body"));
        let exit = ev.kb.block(&format!("{name}_exit"));
        ev.kb.br(header)?;
        ev.kb.position(header);
        let it = ev.kb.b.build_phi(ity, "it")?;
        it.add_incoming(&[(&ev.ic(0), pre)]);
        let mut phis = Vec::with_capacity(init.len());
        for a in init {
            let (phi, v) = match a {
                Acc::F(f) => {
                    let p = ev.kb.b.build_phi(ev.kb.cx.f32_type(), "acc")?;
                    p.add_incoming(&[(f, pre)]);
                    (p, Acc::F(p.as_basic_value().into_float_value()))
                }
                Acc::I(i) => {
                    let p = ev.kb.b.build_phi(ev.kb.cx.i64_type(), "acc")?;
                    p.add_incoming(&[(i, pre)]);
                    (p, Acc::I(p.as_basic_value().into_int_value()))
                }
            };
            phis.push((phi, v));
        }
        let itv = it.as_basic_value().into_int_value();
        let per_iter = s.per_iter();
        let start = ev.imul(itv, ev.ic(per_iter))?;
        let bound = self.loop_bound(ev, nv)?;
        let more = ev.ilt(start, bound)?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        self.no_unroll(ev)?;
        if !forget_each {
            ev.forget();
        }
        let mut acc: Vec<Acc<'ctx>> = phis.iter().map(|(_, v)| *v).collect();
        let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
        for u in 0..s.unroll {
            if forget_each {
                ev.forget();
            }
            let off = ev.ic(i64::from(u) * i64::from(s.threads_per_row) * i64::from(s.vec));
            let j = ev.iadd(start, off)?;
            let j = ev.iadd(j, tj)?;
            acc = body_fn(ev, j, acc)?;
        }
        let next = ev.iadd(itv, ev.ic(1))?;
        let latch = ev.kb.current_block()?;
        it.add_incoming(&[(&next, latch)]);
        for ((phi, _), a) in phis.iter().zip(&acc) {
            match a {
                Acc::F(f) => phi.add_incoming(&[(f, latch)]),
                Acc::I(i) => phi.add_incoming(&[(i, latch)]),
            }
        }
        ev.kb.br(header)?;
        ev.kb.position(exit);
        ev.forget();
        Ok(phis.iter().map(|(_, v)| *v).collect())
    }

    /// The coordinate of the chunk held in registers at slice element `j` (an SSA value of
    /// [`Emitter::held`]), if it is one.
    fn held_at(&self, j: IntValue<'ctx>) -> Option<At<'ctx>> {
        self.held.borrow().iter().find(|(h, _)| *h == j).map(|(_, at)| at.clone())
    }

    /// The multi-pass schedule's loop over the row for one level.
    fn loop_level(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], lead: &[Ax<'ctx>], t: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<Vec<Acc<'ctx>>> {
        let init = self.identities(ev, stats);
        let groups = self.groups.replace(0);
        let calls = Cell::new(0u32);
        let out = self.chunk_loop(ev, "pass", (t, nv), &init, false, Held::After, &mut |ev, j, acc| {
            if groups > 0 && calls.get() % self.sched.unroll == 0 && self.held_at(j).is_none() {
                self.wait_iteration(ev, j, groups)?;
            }
            calls.set(calls.get() + 1);
            let ch = self.slice_chunk(ev, lead, j, nv)?;
            self.accumulate(ev, stats, &ch, acc)
        })?;
        if let Some(st) = ev.stage.as_mut() {
            st.end_pass();
        }
        Ok(out)
    }

    /// The multi-pass loops' chunk at element `j` of the pass (`j` counts from the row's
    /// start, or in the cluster schedule from the CTA's slice's start, and is then also the
    /// chunk's slot in the staged arrays).
    pub(super) fn slice_chunk(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], j: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<Chunk<'ctx>> {
        let Some(c) = self.crow.get() else {
            return self.chunk(ev, lead, j, nv, false);
        };
        if let Some(at) = self.held_at(j) {
            // Held in registers: read through `Eval::pinned`, not the stage.
            if let Some(st) = ev.stage.as_mut() {
                st.cursor = None;
            }
            return Ok(Chunk { at, valid: None });
        }
        let col = ev.iadd(c.start, j)?;
        let exact = self.split.as_ref().is_some_and(|s| s.exact);
        let ch = self.chunk(ev, lead, col, c.end, exact)?;
        if let Some(st) = ev.stage.as_mut() {
            let k = ch.at.axes.len() - 1;
            st.cursor = Some((ch.at.axes[k].base, j));
        }
        Ok(ch)
    }

    /// In the cluster schedule, `.pragma "nounroll";` at the start of a pass loop's body (the
    /// loop's header once LLVM has rotated it; PTX ISA §11.4, "Performance-Tuning Directives:
    /// .pragma"): ptxas sees through the opaque trip count and would otherwise unroll the few
    /// iterations of a slice completely, hoisting every load and exceeding the register budget
    /// of the occupancy the schedule asks for.
    fn no_unroll(&self, ev: &mut Eval<'_, 'ctx>) -> R<()> {
        if self.split.is_none() {
            return Ok(());
        }
        let vt = ev.kb.cx.void_type().fn_type(&[], false);
        let asm = ev.kb.cx.create_inline_asm(vt, ".pragma \"nounroll\";".to_owned(), String::new(), true, false, None, false);
        ev.kb.b.build_indirect_call(vt, asm, &[], "")?;
        Ok(())
    }

    /// The row length as the multi-pass loops' bound: a constant is made opaque so that
    /// LLVM keeps the loop a loop (see [`crate::isa::KernelBuilder::opaque`]).
    fn loop_bound(&self, ev: &mut Eval<'_, 'ctx>, nv: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        if let Some(split) = &self.split {
            // The cluster schedule loops over its CTA's slice (its staged iterations).
            let per_iter = self.sched.per_iter();
            let sv = ev.ic(if split.held > 0 { (split.iters - split.held) * per_iter } else { split.slice });
            ev.kb.in_prologue(|kb| kb.opaque(sv))
        } else if self.plan.n.as_const().is_some() {
            ev.kb.in_prologue(|kb| kb.opaque(nv))
        } else {
            Ok(nv)
        }
    }

    /// The multi-pass schedule's output pass.
    ///
    /// In a persistent schedule ([`RowSchedule::persistent`]) each chunk's staged slots are
    /// refilled with the next row's chunk (row `r` + the grid's clusters) once the chunk's
    /// outputs are stored: one `cp.async` a chunk, of 0 bytes past the last row (the source
    /// address clamped to row `r`), committed as one group that the next row waits for.
    fn loop_outputs(&self, ev: &mut Eval<'_, 'ctx>, row_outs: &[usize], lead: &[Ax<'ctx>], (r, t, nv): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)) -> R<()> {
        if let Some(st) = ev.stage.as_mut() {
            // Staged inputs are read, not filled, by the outputs.
            st.fill = false;
        }
        let refill = match &self.split {
            Some(split) if self.sched.persistent > 0 && !split.staged.is_empty() => {
                let rows = ev.dim(&Dim::product(&self.plan.lead))?;
                let nctaid = ev.kb.nctaid_x()?;
                let stride = ev.kb.b.build_int_z_extend_or_bit_cast(nctaid, ev.ity(), "rs")?;
                let next = ev.iadd(r, stride)?;
                let more = ev.ilt(next, rows)?;
                let rn = ev.kb.b.build_select(more, next, r, "rn")?.into_int_value();
                let bytes = ev.kb.b.build_select(more, ev.kb.i32c(16), ev.kb.i32c(0), "bytes")?.into_int_value();
                Some((self.lead_axes(ev, rn)?, bytes, split.staged.clone()))
            }
            _ => None,
        };
        self.chunk_loop(ev, "out", (t, nv), &[], true, Held::Before, &mut |ev, j, acc| {
            let ch = self.slice_chunk(ev, lead, j, nv)?;
            let mut vals = Vec::new();
            for &i in row_outs {
                vals.push(ev.eval(self.plan.outs[i].value, &ch.at)?);
            }
            self.guarded(ev, ch.valid, |ev| {
                for (&i, v) in row_outs.iter().zip(&vals) {
                    ev.store(&self.obufs[i], &ch.at, v)?;
                }
                Ok(())
            })?;
            if let Some((next_lead, bytes, staged)) = &refill {
                let mut at = ch.at.clone();
                at.axes[..next_lead.len()].copy_from_slice(next_lead);
                for &(i, _) in staged {
                    if !ev.refill_param(i, &at, *bytes)? {
                        return Err(CodegenError::Unsupported {
                            kernel: String::new(),
                            message: format!("a persistent row schedule needs parameter {i}'s chunks to be aligned 16-byte vectors (one cp.async each)"),
                        });
                    }
                }
            }
            Ok(acc)
        })?;
        if refill.is_some() {
            ev.kb.cp_async_commit()?;
        }
        if let Some(st) = ev.stage.as_mut() {
            st.end_pass();
            st.fill = true;
        }
        Ok(())
    }
}
