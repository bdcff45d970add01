//! The `cp.async` pipeline of the tensor-core kernels: every thread's 16-byte copies of A's and
//! B's slabs into a stage ([`StageLoads`]), zero-filled past M, N and K, and the L2-friendly
//! order of the CTA tiles ([`raster`]).
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::Dim;
use sinter_ir::epilogue::MatmulEpilogue as Epi;

use super::schedule::MmaSchedule;
use super::spec::{MatOperand, Spec, Slab, MmaPlan, Bases, Bounded, tile_column};
use crate::isa::kit::{Kit, R};

/// A 16-byte chunk of an operand that one thread of the tensor-core kernel copies into every
/// stage (see [`mma_chunks`]).
pub(super) struct Chunk<'ctx> {
    /// Element offset from the thread's first chunk (i64; a constant where the layout is).
    pub(super) delta: IntValue<'ctx>,
    /// Byte offset of the chunk in a stage (i32).
    pub(super) dst: IntValue<'ctx>,
    pub(super) guard: ChunkGuard<'ctx>,
}

/// What decides how many of a chunk's bytes exist.
pub(super) enum ChunkGuard<'ctx> {
    /// A K-contiguous slab: whether the chunk's row (M or N) exists (`None`: provably), and
    /// its first K element within the k-tile `kc` (i64); the bytes before K's end are read.
    Outer { ok: Option<IntValue<'ctx>>, kc: IntValue<'ctx> },
    /// An outer-contiguous slab: the chunk's K row within the k-tile is `row` (i64); where it
    /// is below K, `bytes` (i32) exist along M or N.
    K { row: IntValue<'ctx>, bytes: IntValue<'ctx> },
}

/// The chunks one thread copies of an operand's slab per stage (see [`mma_chunks`]).
pub(super) struct Chunks<'ctx> {
    /// Element offset of the first chunk at k-tile 0 (i64).
    pub(super) first: IntValue<'ctx>,
    pub(super) chunks: Vec<Chunk<'ctx>>,
    /// Every k-tile is whole (K a provable multiple of `bk`): no K bounds to check.
    pub(super) k_whole: bool,
}

/// The chunks thread `tid` copies of an operand's slab per stage: chunk `tid + i·threads`
/// of the slab's row-major chunks, for every `i`. `base` is the operand's element offset for
/// the CTA's batch; `outer_of(v)` maps the slab's outer index `v` (i32: a row of A's tile, a
/// virtual column of B's) to the operand's outer index, the index that decides whether it
/// exists and its bound ([`tile_column`]'s triple). `segments`: for a paired epilogue, the
/// sub-tile width and the segments' first columns (the slab's rows `v` are column
/// `start[v / sub] + tile·sub + v mod sub`), else `None` (`outer_of(v) = c + v`); either way
/// the chunks lie at distances known without `outer_of` (constants where the strides and
/// starts are, which ptxas folds into the copies' address offsets). `whole`: every CTA's tile
/// lies inside the bound (no outer bounds to check).
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_chunks<'ctx>(
    k: &Kit<'ctx>,
    spec: &Spec,
    op: &MatOperand,
    slab: &Slab,
    (bk, threads): (u32, u32),
    tid: IntValue<'ctx>,
    base: IntValue<'ctx>,
    (segments, whole): (Option<(u32, &[Dim])>, bool),
    outer_of: &dyn Fn(&Kit<'ctx>, IntValue<'ctx>) -> R<Bounded<'ctx>>,
) -> R<Chunks<'ctx>> {
    let c = slab.chunks();
    let (outer, ks) = (k.dim(&op.outer)?, k.dim(&op.ks)?);
    let k_whole = spec.k.div_exact(i64::from(bk)).is_some();
    let keeps_column = threads % c == 0;
    let step = threads / c;
    let mut first = None;
    let mut chunks: Vec<Chunk<'ctx>> = Vec::new();
    for i in 0..slab.rows * c / threads {
        // With threads a multiple of the chunks per row, a thread keeps its chunk column and
        // moves down `threads / c` rows per chunk.
        let (row, col) = if keeps_column {
            (k.add(k.udiv(tid, k.i32c(c as i32))?, k.i32c((i * step) as i32))?, k.urem(tid, k.i32c(c as i32))?)
        } else {
            let e = k.add(tid, k.i32c((i * threads) as i32))?;
            (k.udiv(e, k.i32c(c as i32))?, k.urem(e, k.i32c(c as i32))?)
        };
        // The swizzle repeats every 8 rows: chunk i's destination is then the first's plus a
        // constant (one register for all, the rest address offsets).
        let dst = match &chunks.first() {
            Some(c0) if keeps_column && step % 8 == 0 => k.add(c0.dst, k.i32c((i * step * slab.row_bytes()) as i32))?,
            _ => k.add(k.i32c(slab.base as i32), slab.offset(k, row, col)?)?,
        };
        // The chunk's first element along its row (K, or M/N for an outer-contiguous slab).
        let first_el = k.mul(col, k.i32c(slab.per_chunk() as i32))?;
        let kc = k.zext64(first_el)?;
        let (elem, guard) = if slab.k_contig {
            let (o, idx, limit) = outer_of(k, row)?;
            let ok = if whole { None } else { Some(k.icmp(IntPredicate::SLT, idx, limit)?) };
            (k.add(k.mul(o, outer)?, kc)?, ChunkGuard::Outer { ok, kc })
        } else {
            let (o, idx, limit) = outer_of(k, first_el)?;
            let row64 = k.zext64(row)?;
            let bytes = if whole { k.i32c(16) } else { clamp_bytes(k, k.sub(limit, idx)?, slab.es)? };
            (k.add(o, k.mul(row64, ks)?)?, ChunkGuard::K { row: row64, bytes })
        };
        let delta = match (first, segments) {
            (None, _) => {
                first = Some(elem);
                k.i64c(0)
            }
            // Chunk i is i·step rows below the first: i·step·(row stride) elements.
            (Some(_), None) if keeps_column => k.mul(k.i64c(i64::from(i * step)), if slab.k_contig { outer } else { ks })?,
            (Some(_), Some(_)) if keeps_column && !slab.k_contig => k.mul(k.i64c(i64::from(i * step)), ks)?,
            // Paired rows: the first row is below `step` and `sub` a multiple of `step`, so
            // row i·step + row₀ is in segment i·step / sub, at i·step mod sub in it.
            (Some(_), Some((sub, starts))) if keeps_column && sub % step == 0 => {
                let seg = ((i * step) / sub) as usize;
                let shift = k.sub(k.dim(&starts[seg])?, k.dim(&starts[0])?)?;
                k.mul(k.add(shift, k.i64c(i64::from((i * step) % sub)))?, outer)?
            }
            (Some(f), _) => k.sub(elem, f)?,
        };
        chunks.push(Chunk { delta, dst, guard });
    }
    let first = first.ok_or_else(|| k.err("a slab without chunks"))?;
    Ok(Chunks { first: k.add(base, first)?, chunks, k_whole })
}

/// `es·clamp(n, 0, 16/es)` as an i32: the bytes of a 16-byte chunk of `es`-byte elements (2
/// or 1) that exist when `n` (i64) elements are left.
pub(super) fn clamp_bytes<'ctx>(k: &Kit<'ctx>, n: IntValue<'ctx>, es: u32) -> R<IntValue<'ctx>> {
    let n = k.smin(k.smax(n, k.i64c(0))?, k.i64c(i64::from(16 / es)))?;
    k.mul(k.trunc32(n)?, k.i32c(es as i32))
}

/// Issues one stage's `cp.async` copies of an operand: its chunks at k-tile offset `k0`
/// (i64, elements) into the stage at byte `stage` (i32) of `smem`, zero-filling what lies
/// past K, M or N.
pub(super) fn issue_chunks<'ctx>(k: &Kit<'ctx>, op: &MatOperand, cs: &Chunks<'ctx>, k0: IntValue<'ctx>, kdim: IntValue<'ctx>, smem: PointerValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
    let ptr = k.buf(op.buffer)?;
    let at = k.gep_raw(op.dtype, ptr, k.add(cs.first, k.mul(k0, k.dim(&op.ks)?)?)?)?;
    let full = k.i32c(16);
    for c in &cs.chunks {
        let bytes = match c.guard {
            ChunkGuard::Outer { ok, kc } => {
                let left = if cs.k_whole { full } else { clamp_bytes(k, k.sub(kdim, k.add(k0, kc)?)?, op.dtype.size_bytes() as u32)? };
                match ok {
                    Some(ok) => k.select_i(ok, left, k.i32c(0))?,
                    None => left,
                }
            }
            ChunkGuard::K { row, bytes } => {
                if cs.k_whole {
                    bytes
                } else {
                    let inside = k.icmp(IntPredicate::SLT, k.add(k0, row)?, kdim)?;
                    k.select_i(inside, bytes, k.i32c(0))?
                }
            }
        };
        let src = k.gep_raw(op.dtype, at, c.delta)?;
        let dst = k.sh_at(smem, k.add(stage, c.dst)?)?;
        k.cp_async_16(dst, src, bytes)?;
    }
    Ok(())
}

/// The CTA's tile coordinates `(row tile, column tile)` (i64) from `ctaid.x` (row tiles) and
/// `ctaid.y` (column tiles), regrouped so that CTAs launched one after another cover `group`
/// row tiles × the column tiles in turn (the grouped ordering of Triton's matmul tutorial):
/// the A and B slabs a wave of CTAs reads then stay in L2.
pub(super) fn raster<'ctx>(k: &Kit<'ctx>, group: u32) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let x = k.zext64(k.sreg("ctaid.x")?)?;
    let y = k.zext64(k.sreg("ctaid.y")?)?;
    if group <= 1 {
        return Ok((x, y));
    }
    let nx = k.zext64(k.sreg("nctaid.x")?)?;
    let ny = k.zext64(k.sreg("nctaid.y")?)?;
    group_tiles(k, k.add(x, k.mul(y, nx)?)?, (nx, ny), group)
}

/// [`raster`]'s order: the `linear`-th tile (i64) of a grid of `nx` row tiles × `ny` column
/// tiles → `(row tile, column tile)`, `group` row tiles at a time.
pub(super) fn group_tiles<'ctx>(k: &Kit<'ctx>, linear: IntValue<'ctx>, (nx, ny): (IntValue<'ctx>, IntValue<'ctx>), group: u32) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    if group <= 1 {
        return Ok((k.urem(linear, nx)?, k.udiv(linear, nx)?));
    }
    let g = k.i64c(i64::from(group));
    let per_group = k.mul(g, ny)?;
    let first = k.mul(k.udiv(linear, per_group)?, g)?;
    let size = k.smin(k.sub(nx, first)?, g)?;
    let r = k.urem(linear, per_group)?;
    Ok((k.add(first, k.urem(r, size)?)?, k.udiv(r, size)?))
}

/// The tensor-core kernel (see [`MmaSchedule`] and the module docs).
///
/// Pipeline (as CUTLASS's `MmaMultistage`): the prologue issues the copies of k-tiles
/// `0 .. stages−1`, one `cp.async` group each; at k-tile `kt` the warps compute from stage
/// `kt mod stages` in `bk/16` steps, loading the fragments of step `kk+1` before the MMAs of
/// step `kk` (register double buffering); at the first step they issue k-tile
/// `kt + stages − 1` into the stage freed by k-tile `kt − 1`, and before the last step they
/// wait for k-tile `kt + 1` (`cp.async.wait_group stages−2`, then a barrier, which also
/// tells every thread that the stage about to be overwritten has been read), so that its
/// first fragments load while the last MMAs of `kt` issue.
/// The `cp.async` copies of a tensor-core kernel's pipeline stage ([`build_mma`](super::mma::build_mma),
/// [`build_wgmma`](super::wgmma::build_wgmma)): the 16-byte chunks of A's and B's slabs this thread copies per stage
/// ([`mma_chunks`]; B's in segments for the paired epilogue), and where they go.
pub(super) struct StageLoads<'a, 'ctx> {
    pub(super) spec: &'a Spec,
    pub(super) bk: u32,
    pub(super) a: Chunks<'ctx>,
    pub(super) b: Chunks<'ctx>,
    pub(super) kdim: IntValue<'ctx>,
    pub(super) smem: PointerValue<'ctx>,
}

impl<'a, 'ctx> StageLoads<'a, 'ctx> {
    /// This thread's chunks of the CTA tile at row `m0` (i64) and column tile `pid_n` (i64).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(kit: &Kit<'ctx>, spec: &'a Spec, s: &MmaSchedule, plan: &MmaPlan, tid: IntValue<'ctx>, bases: &Bases<'ctx>, (m0, pid_n): (IntValue<'ctx>, IntValue<'ctx>), smem: PointerValue<'ctx>) -> R<Self> {
        let threads = s.threads();
        let (mdim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.k)?);
        let a_whole = spec.m.div_exact(i64::from(s.bm)).is_some();
        let a = mma_chunks(kit, spec, &spec.a, &plan.a, (s.bk, threads), tid, bases.a, (None, a_whole), &|k, v| {
            let m = k.add(m0, k.zext64(v)?)?;
            Ok((m, m, mdim))
        })?;
        let starts: Vec<Dim>;
        let (b_segments, b_whole) = match &spec.epi {
            Epi::Paired { segs, width, .. } => {
                let sub = s.bn / segs.len() as u32;
                starts = segs.iter().map(|sg| sg.start.clone()).collect();
                (Some((sub, starts.as_slice())), width.div_exact(i64::from(sub)).is_some())
            }
            _ => (None, spec.n.div_exact(i64::from(s.bn)).is_some()),
        };
        let b = mma_chunks(kit, spec, &spec.b, &plan.b, (s.bk, threads), tid, bases.b, (b_segments, b_whole), &|k, v| tile_column(k, spec, s.bn, pid_n, v))?;
        Ok(StageLoads { spec, bk: s.bk, a, b, kdim, smem })
    }

    /// K tiles (i32: K < 2³¹·bk, a row of 2³⁷ 16-bit elements would not fit in a device's
    /// memory), saving the main loop a register pair.
    pub(super) fn ktiles(&self, kit: &Kit<'ctx>) -> R<IntValue<'ctx>> {
        let bk = i64::from(self.bk);
        kit.trunc32(kit.udiv(kit.add(self.kdim, kit.i64c(bk - 1))?, kit.i64c(bk))?)
    }

    /// Issues K tile `kt`'s copies into the stage at byte offset `stage`.
    pub(super) fn issue(&self, k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        let k0 = k.mul(k.zext64(kt)?, k.i64c(i64::from(self.bk)))?;
        issue_chunks(k, &self.spec.a, &self.a, k0, self.kdim, self.smem, stage)?;
        issue_chunks(k, &self.spec.b, &self.b, k0, self.kdim, self.smem, stage)
    }

    /// The pipeline's prologue: K tiles `0 … ahead − 1` (those that exist) into stages
    /// `0 … ahead − 1`, a commit group each.
    pub(super) fn prologue(&self, kit: &Kit<'ctx>, ktiles: IntValue<'ctx>, ahead: u32, stage_bytes: u32) -> R<()> {
        for st in 0..ahead {
            kit.if_then(kit.icmp(IntPredicate::SLT, kit.i32c(st as i32), ktiles)?, |k| self.issue(k, k.i32c(st as i32), k.i32c((st * stage_bytes) as i32)))?;
            kit.cp_async_commit()?;
        }
        Ok(())
    }
}
