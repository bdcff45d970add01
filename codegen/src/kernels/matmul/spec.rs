//! What the matmul generators know about a kernel ([`Spec`], from [`Spec::analyse`]): its
//! operands as strided views ([`MatOperand`]), quantized or fp8 operands, the epilogue, the
//! shared-memory plan of the tensor-core kernels ([`MmaPlan`], [`Slab`] with its XOR swizzle),
//! and the per-CTA facts every generator shares ([`Bases`], [`tile_column`]).
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::IntValue;
use inkwell::IntPredicate;
use sinter_ir::{Attr, DType, Dim, Family, Function, Kernel, KernelGraph, Layout, OpKind, TensorMap, Value, ValueDef};
use sinter_ir::epilogue::{self, MatmulEpilogue as Epi};

use super::prologue::Prologue;
use super::schedule::{TiledSchedule, MmaSchedule, WgmmaSchedule, QuantMmaSchedule, MatmulSchedule, choose_schedule, small_m_schedule};
use crate::isa::kit::{dims_of, Kit, R};
use crate::kernels::view::{broadcast_strides, buffer_infos, input_view, BufInfo};
use crate::kernels::ctx::KernelCtx;
use crate::kernels::fp8_operand::{fp8_operand, Fp8Scale};
use crate::target::Target;
use crate::error::CodegenError;

/// When `v` is `dequantize` of a block-quantized kernel input: `Ok((parameter, dtype))`, or
/// why the kernel cannot read it as blocks; `None` when `v` is something else.
pub(super) fn quantized_operand(body: &Function, v: Value, buffers: &[BufInfo]) -> Option<Result<(usize, DType), String>> {
    let ValueDef::Result(n, _) = body.values.get(v)?.def else { return None };
    let nd = body.nodes.get(n)?;
    if nd.op.kind != OpKind::Dequantize {
        return None;
    }
    let w = *nd.inputs.first()?;
    let q = body.ty(w).dtype;
    Some(match body.values[w].def {
        _ if q.is_quantized() && !sinter_ir::contract::operands::MATMUL_BLOCK_TYPES.contains(&q) => Err(format!("the matmul kernels do not decode {q} blocks (only q8_0 and q4_1)")),
        ValueDef::Param(i) if q.is_quantized() && buffers.get(i).is_some_and(|b| b.dtype == q) => Ok((i, q)),
        _ => Err(format!("`dequantize` of {} that is not a {q} kernel input", body.label(w))),
    })
}

/// The error for a kernel this family cannot generate (`kernel` is `k3`).
pub(super) fn unsupported(kernel: &str, reason: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { kernel: format!("{kernel} (Matmul)"), message: reason.into() }
}

/// One matmul operand: kernel parameter, dtype, element offset (a view of the buffer), the
/// strides of its batch axes as seen from the output's batch axes (0 where broadcast), and
/// the strides of its two matrix axes.
#[derive(Clone, Debug)]
pub(super) struct MatOperand {
    pub(super) buffer: usize,
    pub(super) dtype: DType,
    pub(super) offset: Dim,
    pub(super) batch_strides: Vec<Dim>,
    /// Stride of the non-contracted axis (A: m, B: n).
    pub(super) outer: Dim,
    /// Stride of the contracted axis (k).
    pub(super) ks: Dim,
    /// Alignment of the buffer's base, bytes.
    pub(super) align: u32,
}

impl MatOperand {
    /// Whether `c` consecutive k-elements can be one aligned vector load at every k that is a
    /// multiple of `c`: k is contiguous, the offset and every other stride are multiples of
    /// `c`, the base is aligned to the vector's bytes.
    pub(super) fn vector_ok(&self, c: u32) -> bool {
        let c64 = i64::from(c);
        self.ks.as_const() == Some(1)
            && self.outer.div_exact(c64).is_some()
            && self.offset.div_exact(c64).is_some()
            && self.batch_strides.iter().all(|s| s.div_exact(c64).is_some())
            && self.align >= c * self.dtype.size_bytes() as u32
    }

    /// Whether a 16-bit or 8-bit operand can be copied in 16-byte chunks (8 or 16 elements,
    /// [`MatOperand::per_chunk`]) along its K axis (`k_contig`) or its outer axis, each chunk
    /// starting at a multiple of its element count and 16-byte aligned: that axis has stride
    /// 1; the other stride, the offset and every batch stride are provably multiples of the
    /// chunk's elements; the base is 16-byte aligned.
    pub(super) fn chunks_ok(&self, k_contig: bool) -> bool {
        let (unit, other) = if k_contig { (&self.ks, &self.outer) } else { (&self.outer, &self.ks) };
        let Some(e) = self.per_chunk() else { return false };
        unit.as_const() == Some(1)
            && other.div_exact(e).is_some()
            && self.offset.div_exact(e).is_some()
            && self.batch_strides.iter().all(|s| s.div_exact(e).is_some())
            && self.align >= 16
    }

    /// Elements per 16-byte chunk: 8 of a 16-bit dtype, 16 of `f8e4m3`; `None` for the rest.
    pub(super) fn per_chunk(&self) -> Option<i64> {
        match self.dtype {
            DType::BF16 | DType::F16 => Some(8),
            DType::F8E4M3 => Some(16),
            _ => None,
        }
    }
}

/// What the generators need to know about a matmul kernel.
pub(crate) struct Spec {
    pub(super) kernel_name: String,
    pub(super) n_inputs: usize,
    pub(super) n_buffers: usize,
    /// Dtype of the matmul's result (and operands).
    pub(super) dtype: DType,
    pub(super) a: MatOperand,
    pub(super) b: MatOperand,
    /// B is `dequantize` of a block-quantized kernel input (`q8_0`/`q4_1`, `[N, K]` read with
    /// `transpose_b`): its blocks are read as stored and dequantised in registers
    /// ([`MatOperand`] `b` then describes the quantized buffer in elements).
    pub(super) b_quant: Option<DType>,
    /// Both operands are `dequantize_fp8(x8, scale)` of `f8e4m3` kernel inputs (A `[.., M, K]`,
    /// B `[N, K]` with `transpose_b`): the fp8 matmul. [`MatOperand`] `a` and `b`
    /// then describe the `f8e4m3` buffers (one byte an element), read as stored by the wgmma
    /// kernel, and the f32 accumulators are multiplied by `scale_a · scale_b` before the
    /// epilogue.
    pub(super) fp8: Option<[Fp8Scale; 2]>,
    /// A is `rms_norm(x, w)` computed in the kernel's prologue (the small-M kernel only);
    /// [`MatOperand`] `a` then describes `x`.
    pub(super) prologue: Option<Prologue>,
    pub(super) m: Dim,
    pub(super) n: Dim,
    pub(super) k: Dim,
    /// The output's batch axes.
    pub(super) batch: Vec<Dim>,
    /// How the epilogue reads the result.
    pub(super) epi: Epi,
    /// The body with the values the epilogue reads the result through turned into more
    /// parameters after the kernel inputs: the matmul's result (Direct, Columns) or each
    /// segment's slice (Paired, in `slices` order). The element evaluator computes every
    /// output from them, the kernel inputs and constants.
    pub(super) epilogue: Function,
    /// Every buffer, inputs then outputs.
    pub(super) buffers: Vec<BufInfo>,
    /// Every dim the kernel may read at run time (a superset: all shapes, strides and
    /// attribute dims of the body, the views' offsets).
    pub(super) all_dims: Vec<Dim>,
}

impl Spec {
    pub(super) fn analyse(graph: &KernelGraph, kernel: Kernel) -> R<Spec> {
        let name = kernel.to_string();
        let no = |reason: String| unsupported(&name, reason);
        // The shared checks: the body's signature matches the buffers, strides fit ranks,
        // every value a node names exists.
        let kd = KernelCtx::new(graph, kernel)?.data;
        if kd.family != Family::Matmul {
            return Err(CodegenError::BadKernel { kernel: format!("{name} ({:?})", kd.family), message: "not a Matmul kernel".into() });
        }
        let body = &kd.body;
        let buffers = buffer_infos(graph, kd).map_err(&no)?;
        let mut all_dims: Vec<Dim> = Vec::new();
        for b in &buffers {
            all_dims.extend(b.shape.iter().cloned());
            all_dims.extend(b.strides.iter().cloned());
        }
        for (_, vd) in body.values.iter() {
            all_dims.extend(vd.ty.shape.iter().cloned());
            // The evaluator unravels reshapes through row-major strides and element counts.
            all_dims.extend(Layout::contiguous(&vd.ty.shape).strides);
            all_dims.push(Dim::product(&vd.ty.shape));
        }
        for (_, nd) in body.nodes.iter() {
            for a in &nd.op.attrs {
                match a {
                    Attr::Dim(d) => all_dims.push(d.clone()),
                    Attr::Dims(ds) => all_dims.extend(ds.iter().cloned()),
                    _ => {}
                }
            }
        }
        let mut mms = body.nodes.iter().filter(|(_, nd)| nd.op.kind == OpKind::Matmul);
        let (mm, mnd) = mms.next().ok_or_else(|| no("the body has no matmul".into()))?;
        if mms.next().is_some() {
            return Err(no("the body has more than one matmul".into()));
        }
        let (av, bv, mm_out) = match (mnd.inputs.as_slice(), mnd.results.as_slice()) {
            ([a, b], [c]) => (*a, *b, *c),
            _ => return Err(no("matmul needs two operands and one result".into())),
        };
        let (at, bt) = (body.ty(av), body.ty(bv));
        let dtype = at.dtype;
        if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32) || bt.dtype != dtype {
            return Err(no(format!("matmul operands must be bf16, f16 or f32 of one dtype, got {at} and {bt}")));
        }
        let ta = mnd.op.bool("transpose_a").unwrap_or(false);
        let tb = mnd.op.bool("transpose_b").unwrap_or(false);
        let out_ty = body.ty(mm_out).clone();
        let rank = out_ty.rank();
        if rank < 2 || at.rank() < 2 || bt.rank() < 2 || at.rank() > rank || bt.rank() > rank {
            return Err(no(format!("matmul {at} · {bt} → {out_ty}: operands need rank 2 to the result's rank")));
        }
        let (m, n) = (out_ty.shape[rank - 2].clone(), out_ty.shape[rank - 1].clone());
        let batch: Vec<Dim> = out_ty.shape[..rank - 2].to_vec();
        let ra = at.rank();
        let k = if ta { at.shape[ra - 2].clone() } else { at.shape[ra - 1].clone() };
        // The operands are kernel inputs, possibly through views (a reshape, a slice).
        let mat = |v: Value, ty: &sinter_ir::TensorType, transposed: bool, is_a: bool| -> R<MatOperand> {
            let view = input_view(body, v, &buffers).map_err(|e| no(format!("matmul operand: {e}")))?;
            let st = &view.strides;
            let r = ty.rank();
            // A [.., M, K]: outer = m-axis; B [.., K, N]: outer = n-axis. Transposes swap.
            let (s_rows, s_cols) = (st[r - 2].clone(), st[r - 1].clone());
            let (outer, ks) = match (is_a, transposed) {
                (true, false) | (false, true) => (s_rows, s_cols),
                (true, true) | (false, false) => (s_cols, s_rows),
            };
            let bs = broadcast_strides(&ty.shape[..r - 2], &st[..r - 2], rank - 2);
            let dtype = buffers.get(view.param).map_or(dtype, |b| b.dtype);
            Ok(MatOperand { buffer: view.param, dtype, offset: view.offset, batch_strides: bs, outer, ks, align: view.align })
        };
        // An fp8 matmul: both operands `dequantize_fp8` of f8e4m3 tensors, read as stored.
        let fp8 = match (fp8_operand(body, av, &buffers), fp8_operand(body, bv, &buffers)) {
            (None, None) => None,
            (Some(fa), Some(fb)) => {
                let ((a8, sa), (b8, sb)) = (fa.map_err(&no)?, fb.map_err(&no)?);
                if ta || !tb || bt.rank() != 2 {
                    return Err(no(format!(
                        "an f8e4m3 matmul reads A [.., M, K] and B [N, K] with transpose_b, both K-major as the fp8 tensor cores take them (got {at}, {bt}, transpose_a {ta}, transpose_b {tb})"
                    )));
                }
                let (a, b) = (mat(a8, body.ty(a8), false, true)?, mat(b8, body.ty(b8), true, false)?);
                if a.dtype != DType::F8E4M3 || b.dtype != DType::F8E4M3 {
                    return Err(no(format!("`dequantize_fp8` of {} and {}: not f8e4m3 kernel inputs", body.label(a8), body.label(b8))));
                }
                Some((a, b, [sa, sb]))
            }
            _ => return Err(no(crate::error::fp8_message("a matmul with one `dequantize_fp8` operand"))),
        };
        let prologue = match sinter_ir::contract::norm_prologue(body, mm) {
            Some(nn) => {
                sinter_ir::contract::norm_prologue_body(body, nn, mm).map_err(&no)?;
                Some(Prologue::new(body, nn, mm, &buffers).map_err(&no)?)
            }
            None => None,
        };
        let a = match (&fp8, &prologue) {
            (Some((a, _, _)), _) => a.clone(),
            (None, Some(p)) => {
                // The rows of x as stored (through casts of the norm's input).
                let x = sinter_ir::contract::through_unary(body, p.x);
                mat(x, body.ty(x), false, true)?
            }
            (None, None) => mat(av, at, ta, true)?,
        };
        let (b, b_quant) = match (fp8.as_ref().map(|f| f.1.clone()), quantized_operand(body, bv, &buffers)) {
            (Some(b), _) => (b, None),
            (None, Some(w)) => {
                let (w, q) = w.map_err(&no)?;
                if !tb || ta || bt.rank() != 2 {
                    return Err(no(format!("a {q} weight is read as blocks only as a [N, K] B operand with transpose_b (got {bt}, transpose_a {ta}, transpose_b {tb})")));
                }
                let info = &buffers[w];
                if info.strides != Layout::contiguous(&info.shape).strides || info.align < 4 {
                    return Err(no(format!("the {q} weight must be a contiguous, 4-byte aligned buffer")));
                }
                let outer = info.strides[0].clone();
                (MatOperand { buffer: w, dtype, offset: Dim::constant(0), batch_strides: vec![Dim::constant(0); rank - 2], outer, ks: Dim::constant(1), align: info.align }, Some(q))
            }
            (None, None) => (mat(bv, bt, tb, false)?, None),
        };
        let fp8 = fp8.map(|(_, _, scales)| scales);
        for op in [&a, &b] {
            all_dims.extend(op.batch_strides.iter().cloned());
            all_dims.extend([op.offset.clone(), op.outer.clone(), op.ks.clone()]);
        }
        let epi = epilogue::analyse(body, mm_out).map_err(&no)?;
        // The epilogue body: the values the epilogue reads the result through become
        // parameters after the kernel inputs.
        let mut epilogue = body.clone();
        let as_params: Vec<Value> = match &epi {
            Epi::Direct | Epi::Columns { .. } => vec![mm_out],
            Epi::Paired { slices, .. } => slices.iter().map(|(v, _)| *v).collect(),
        };
        for v in as_params {
            epilogue.values[v].def = ValueDef::Param(epilogue.params.len());
            epilogue.params.push(v);
        }
        match &epi {
            Epi::Direct => {}
            Epi::Columns { segs, .. } => all_dims.extend(segs.iter().flat_map(|s| [s.start.clone(), s.width.clone()])),
            Epi::Paired { segs, width, .. } => {
                all_dims.extend(segs.iter().map(|s| s.start.clone()));
                all_dims.push(width.clone());
            }
        }
        Ok(Spec {
            kernel_name: name,
            n_inputs: kd.inputs.len(),
            n_buffers: kd.inputs.len() + kd.outputs.len(),
            dtype,
            a,
            b,
            b_quant,
            fp8,
            prologue,
            m,
            n,
            k,
            batch,
            epi,
            epilogue,
            buffers,
            all_dims: dims_of(&all_dims),
        })
    }
}

impl Spec {
    /// The schedule [`generate`](super::generate) uses: the small-M kernel for a norm
    /// prologue (the one kernel that computes it); otherwise [`choose_schedule`]'s rule: a constant M in 2..=16 of
    /// bf16/f16 takes the flat tensor-core GEMM ([`MmaSchedule::flat`], 32 columns or the
    /// smallest tile a multiple of the RoPE head) where [`Spec::mma_plan`] accepts the
    /// layouts, and the small-M kernel where it does not, as M = 1 and f32 do (every epilogue
    /// mode: each group computes its column and the RoPE partner, or the n-th column of every
    /// segment); otherwise bf16/f16 operands take the tensor cores
    /// ([`MmaSchedule::for_columns`], the tile a multiple of the RoPE head) where
    /// [`Spec::mma_plan`] accepts the layouts, and everything else the tiled kernel, with a
    /// tile as wide as a staged epilogue needs (64 columns, or a RoPE head of 128 or 256, or 32
    /// per combined segment).
    pub(super) fn default_schedule(&self, target: &Target) -> MatmulSchedule {
        let b_k = self.b.ks.as_const() == Some(1);
        if self.prologue.is_some() {
            // A norm prologue: the small-M kernel, the one that computes it.
            let rows = self.m.as_const().map_or(16, |m| m.clamp(1, 16)) as u32;
            return MatmulSchedule::SmallM(small_m_schedule(rows, b_k));
        }
        if self.b_quant.is_some() {
            // One row (decode at batch 1): the small-M kernel, a warp per column streaming its
            // blocks (faster than the tensor-core kernel, whose 16-row mma computes 15 rows of
            // padding). More rows: tensor cores
            // with the blocks read into the B fragments where the kernel takes it; else the
            // quantized small-M kernel.
            if self.m.as_const() != Some(1) && self.quant_mma_ok().is_ok() {
                return MatmulSchedule::QuantMma(QuantMmaSchedule::DEFAULT);
            }
            let rows = self.m.as_const().map_or(16, |m| m.clamp(1, 16)) as u32;
            return MatmulSchedule::SmallM(small_m_schedule(rows, true));
        }
        let multiple = match &self.epi {
            Epi::Columns { rope_d, .. } => u32::try_from(*rope_d).unwrap_or(u32::MAX),
            _ => 1,
        };
        let columns = match &self.epi {
            Epi::Paired { width, segs, .. } => width.scale(segs.len() as i64),
            _ => self.n.clone(),
        };
        if self.fp8.is_some() {
            // fp8: the wgmma kernel only (on another target it fails, saying so), with the CTA
            // tile of the bf16 kernel and a K tile of 128 e4m3 elements, TMA-loaded where the
            // tensor maps fit (faster than cp.async chunks).
            let s = MmaSchedule::for_columns(&columns, multiple);
            let s = if s.bn % multiple.max(1) == 0 { s } else { MmaSchedule::DEFAULT };
            let tile = self.wgmma_tile(s);
            return MatmulSchedule::Wgmma(WgmmaSchedule { tile, tma: self.tma_maps(&tile).is_ok(), ..WgmmaSchedule::DEFAULT });
        }
        if let Some(rows) = self.m.as_const().filter(|m| (1..=16).contains(m)) {
            // The flat tensor-core GEMM with a tile a multiple of the RoPE head, where the
            // layouts allow it; the small-M kernel otherwise.
            if let MatmulSchedule::Mma(s) = choose_schedule(&self.m, &self.n, self.dtype, b_k) {
                let bn = [s.bn, 64, 128, 256].into_iter().find(|bn| bn % multiple.max(1) == 0);
                if let Some(s) = bn.map(MmaSchedule::flat) {
                    if self.mma_plan(&s, target).is_ok() {
                        return MatmulSchedule::Mma(s);
                    }
                }
                return MatmulSchedule::SmallM(small_m_schedule(rows as u32, b_k));
            }
            return choose_schedule(&self.m, &self.n, self.dtype, b_k);
        }
        if let MatmulSchedule::Mma(s) = choose_schedule(&self.m, &columns, self.dtype, b_k) {
            let s = if s.bn % multiple.max(1) == 0 { s } else { MmaSchedule::DEFAULT };
            // Hopper: the same CTA tile on warpgroup MMAs where the layouts allow, one K
            // tile's products in flight (faster than `mma.sync`).
            let w = self.wgmma_tile(s);
            if self.wgmma_plan(&w, target).is_ok() {
                let tma = self.tma_maps(&w).is_ok();
                return MatmulSchedule::Wgmma(WgmmaSchedule { tile: w, tma, ..WgmmaSchedule::DEFAULT });
            }
            if self.mma_plan(&s, target).is_ok() {
                return MatmulSchedule::Mma(s);
            }
        }
        let bn = match &self.epi {
            Epi::Direct => return MatmulSchedule::Tiled(TiledSchedule::DEFAULT),
            Epi::Columns { rope_d, .. } => (*rope_d as u32).max(64),
            Epi::Paired { segs, .. } => 32 * segs.len() as u32,
        };
        let small = self.m.as_const().is_some_and(|m| m <= 16);
        MatmulSchedule::Tiled(match bn {
            64 if small => TiledSchedule { bm: 16, bn: 64, bk: 16, tm: 1, tn: 4 },
            64 => TiledSchedule::DEFAULT,
            128 => TiledSchedule { bm: 64, bn: 128, bk: 16, tm: 4, tn: 4 },
            _ => TiledSchedule { bm: 32, bn, bk: 16, tm: 4, tn: 4 },
        })
    }

    /// The warpgroup form of CTA tile `s`: a warp per 16 rows, 4 stages, a K tile of one
    /// 128-byte swizzle row of the operands (64 bf16/f16 elements, 128 e4m3).
    pub(super) fn wgmma_tile(&self, s: MmaSchedule) -> MmaSchedule {
        let es = self.a.dtype.size_bytes().clamp(1, 2) as u32;
        MmaSchedule { warps_m: s.bm / 16, warps_n: 1, stages: 4, bk: 128 / es, ..s }
    }

    /// Whether the quantized tensor-core kernel takes this kernel: a block-quantized B,
    /// bf16/f16 operands, a constant M ≤ 16, a direct epilogue, and activations whose K
    /// axis is read in aligned 16-byte vectors.
    pub(super) fn quant_mma_ok(&self) -> Result<(), String> {
        if self.b_quant.is_none() {
            return Err("B is not block-quantized".into());
        }
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Err(format!("tensor cores do not take {} operands", self.dtype));
        }
        if !self.m.as_const().is_some_and(|m| (1..=16).contains(&m)) {
            return Err(format!("M = {} is not a constant in 1..=16", self.m));
        }
        if !matches!(self.epi, Epi::Direct) {
            return Err("the epilogue reads R at other columns (the small-M kernel takes it)".into());
        }
        if !self.a.vector_ok(8) {
            return Err("A's rows are not read in aligned 16-byte vectors".into());
        }
        Ok(())
    }

    /// Whether tiled schedule `s` suits this kernel's epilogue (tile width a multiple of the
    /// RoPE head or of the segment count; the staged tile fits static shared memory).
    pub(super) fn fits(&self, s: &TiledSchedule) -> Result<(), String> {
        let ok = match &self.epi {
            Epi::Direct => true,
            Epi::Columns { rope_d, .. } => i64::from(s.bn) % rope_d == 0,
            Epi::Paired { segs, .. } => s.bn % segs.len() as u32 == 0,
        };
        if !ok {
            return Err(format!("{s:?} does not suit the epilogue {:?}", self.epi));
        }
        if self.epi.staged() && self.staged_bytes(s) > 48 * 1024 {
            return Err(format!("{s:?}: the staged tile needs {} bytes of shared memory", self.staged_bytes(s)));
        }
        Ok(())
    }

    /// The shared-memory plan of tensor-core schedule `s` for this kernel, or why the kernel
    /// cannot take it: bf16/f16 operands, each read in 16-byte chunks along a contiguous axis
    /// that are provably aligned ([`MatOperand::chunks_ok`], symbolic strides included),
    /// slab rows the swizzle can handle, an epilogue the tile suits (a width that is a
    /// multiple of the RoPE head or of the segment count; for paired segments of an
    /// N-contiguous B, segment starts and sub-tile widths that are multiples of 8) and
    /// shared memory within the target's limit.
    pub(super) fn mma_plan(&self, s: &MmaSchedule, target: &Target) -> Result<MmaPlan, String> {
        if self.fp8.is_some() {
            return Err(crate::error::fp8_message("the `mma.sync` kernel does not take f8e4m3 operands"));
        }
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Err(format!("tensor-core matmul of {} operands", self.dtype));
        }
        self.slab_plan(s, target)
    }

    /// The shared memory of the tensor-core kernels' pipeline for schedule `s` — slabs of
    /// the operands' element size (16-bit, or 8-bit `f8e4m3` for the fp8 wgmma kernel) — or
    /// why the kernel's layouts, epilogue or the target's shared memory do not allow it (see
    /// [`Spec::mma_plan`]).
    pub(super) fn slab_plan(&self, s: &MmaSchedule, target: &Target) -> Result<MmaPlan, String> {
        let es = self.a.dtype.size_bytes() as u32;
        let mode = |op: &MatOperand, what: &str| -> Result<bool, String> {
            if op.chunks_ok(true) {
                Ok(true)
            } else if op.chunks_ok(false) {
                Ok(false)
            } else {
                Err(format!(
                    "{what} (strides: {} along K, {} across; offset {}; {}-byte aligned) is not read in aligned 16-byte chunks",
                    op.ks, op.outer, op.offset, op.align
                ))
            }
        };
        let a = Slab::new(mode(&self.a, "A")?, s.bm, s.bk, 0, es);
        let b = Slab::new(mode(&self.b, "B")?, s.bn, s.bk, a.bytes(), es);
        let threads = s.threads();
        for (what, sl) in [("A", a), ("B", b)] {
            if !(sl.row_bytes() == 64 || sl.row_bytes() % 128 == 0) {
                return Err(format!("{s:?}: {what}'s slab rows of {} bytes cannot be swizzled (64 or a multiple of 128)", sl.row_bytes()));
            }
            if (sl.rows * sl.chunks()) % threads != 0 {
                return Err(format!("{s:?}: {what}'s slab of {} chunks does not split over {threads} threads", sl.rows * sl.chunks()));
            }
        }
        match &self.epi {
            Epi::Direct => {}
            Epi::Columns { rope_d, .. } => {
                if i64::from(s.bn) % rope_d != 0 {
                    return Err(format!("{s:?}: the tile width is not a multiple of the RoPE head {rope_d}"));
                }
            }
            Epi::Paired { segs, .. } => {
                let n = segs.len() as u32;
                if s.bn % n != 0 || (!b.k_contig && ((s.bn / n) % 8 != 0 || segs.iter().any(|sg| sg.start.div_exact(8).is_none()))) {
                    return Err(format!("{s:?} does not suit the paired epilogue over {n} segments"));
                }
            }
        }
        let stage_bytes = a.bytes() + b.bytes();
        let pitch = s.bn + 8;
        let staged = if self.epi.staged() { s.bm * pitch * self.dtype.size_bytes() as u32 } else { 0 };
        let smem_bytes = (s.stages * stage_bytes).max(staged);
        if smem_bytes > target.max_shared_memory_per_block() {
            return Err(format!("{s:?} needs {smem_bytes} bytes of shared memory, more than {target} allows"));
        }
        Ok(MmaPlan { a, b, stage_bytes, smem_bytes, pitch })
    }

    /// The shared-memory plan of Hopper schedule `s` ([`MatmulSchedule::Wgmma`]), or why the
    /// kernel cannot take it: [`Spec::mma_plan`]'s conditions (for bf16/f16 operands; `f8e4m3`
    /// ones of an fp8 matmul as well), an sm_90a target, K-major A and B (K contiguous in
    /// memory: the descriptors describe K-major slabs, and 8-bit `wgmma` has no transposed
    /// form), `bk` one 128-byte swizzle row (64 bf16/f16, 128 e4m3 elements), `bm` a multiple
    /// of 64 with a warp per 16 rows, `bn` a multiple of 8 up to 256. For an fp8 matmul the
    /// reason names the fp8 kernel: it has no other schedule.
    pub(super) fn wgmma_plan(&self, s: &MmaSchedule, target: &Target) -> Result<MmaPlan, String> {
        let plan = || -> Result<MmaPlan, String> {
            if !target.has_wgmma() {
                return Err(format!("wgmma needs sm_90a, not {target}"));
            }
            let dt = self.a.dtype;
            let es = dt.size_bytes() as u32;
            if crate::isa::wgmma_k(dt).is_none() || self.b.dtype != dt || (self.fp8.is_none() && !matches!(self.dtype, DType::BF16 | DType::F16)) {
                return Err(format!("wgmma of {dt} · {} operands", self.b.dtype));
            }
            if s.bk * es != 128 || s.bm % 64 != 0 || s.warps_n != 1 || s.warps_m * 16 != s.bm || s.bn % 8 != 0 || s.bn > 256 {
                return Err(format!("{s:?} is not a warpgroup schedule for {dt} (bk {}, bm a multiple of 64 with a warp per 16 rows, bn ≤ 256)", 128 / es));
            }
            let plan = self.slab_plan(s, target)?;
            if !(plan.a.k_contig && plan.b.k_contig) {
                return Err("wgmma reads K-major A and B only (B as [N, K])".into());
            }
            Ok(plan)
        };
        match (plan(), self.fp8) {
            (Err(e), Some(_)) => Err(crate::error::fp8_message(&format!("f8e4m3 matmul: {e}"))),
            (r, _) => r,
        }
    }

    /// Whether this kernel takes the warp-specialised and persistent forms of wgmma schedule
    /// `w` ([`WgmmaSchedule::specialized`], [`WgmmaSchedule::ctas`]), or why not: they need
    /// the TMA loads and the direct epilogue — a staged epilogue writes the tile over the
    /// pipeline's shared memory behind a CTA-wide barrier, while the producer warpgroup is
    /// already filling the stages for the next tile.
    pub(super) fn ws_ok(&self, w: &WgmmaSchedule) -> Result<(), String> {
        if !w.specialized {
            return if w.ctas == 0 { Ok(()) } else { Err(format!("{w:?}: persistent CTAs need the warp-specialised kernel")) };
        }
        if !w.tma {
            return Err(format!("{w:?}: the warp-specialised kernel loads with the TMA"));
        }
        if self.fp8.is_some() {
            return Err("the warp-specialised wgmma kernel has no fp8 form (fp8 loads with cp.async)".into());
        }
        if self.epi.staged() {
            return Err("the warp-specialised wgmma kernel writes its results from registers: a staged epilogue (segments, pairs) would overwrite stages the producer fills".into());
        }
        Ok(())
    }

    /// The TMA tensor maps of the wgmma kernel's operands ([`WgmmaSchedule::tma`]): A as
    /// `[batch…, M, K]` and B as `[batch…, N, K]` (K innermost; a batch axis an operand is
    /// broadcast along is left out), boxes of `64 × bm` and `64 × bn` elements (one K tile,
    /// 128 bytes a row) with 128-byte swizzling — the layout of the cp.async slabs
    /// ([`Slab::offset`]) and of the wgmma descriptors. Tails read as zero. Needs 16-bit
    /// operands copyable in 16-byte chunks along K ([`MatOperand::chunks_ok`]: the driver's
    /// 16-byte alignment of the start and strides), a direct or staged epilogue (not the paired
    /// one, whose B tile is two segments), and at most three batch axes.
    pub(super) fn tma_maps(&self, s: &MmaSchedule) -> Result<Vec<TensorMap>, String> {
        if matches!(self.epi, Epi::Paired { .. }) || self.b_quant.is_some() {
            return Err("TMA loads need a direct or staged epilogue of an unquantized B".into());
        }
        let map = |op: &MatOperand, outer: &Dim, rows: u32| -> Result<TensorMap, String> {
            if !op.chunks_ok(true) {
                return Err("TMA loads need K-contiguous 16-bit operands with 16-byte-aligned rows, offset and base".into());
            }
            let mut dims = vec![self.k.clone(), outer.clone()];
            let mut strides = vec![op.outer.clone()];
            let mut box_dims = vec![s.bk, rows];
            for (d, st) in self.batch.iter().zip(&op.batch_strides) {
                if st.as_const() != Some(0) {
                    dims.push(d.clone());
                    strides.push(st.clone());
                    box_dims.push(1);
                }
            }
            if dims.len() > 5 {
                return Err("TMA loads of more than three batch axes".into());
            }
            // The driver encodes no tensor map with an empty dimension (K = 0 still computes
            // the zeros of its product): such a matmul loads its tiles with `cp.async`.
            if let Some(d) = dims.iter().find(|d| d.as_const().is_some_and(|c| c <= 0)) {
                return Err(format!("a tensor map cannot have a dimension of {d} elements"));
            }
            Ok(TensorMap { buffer: op.buffer, dtype: op.dtype, offset: op.offset.clone(), dims, strides, box_dims, swizzle: 128 })
        };
        Ok(vec![map(&self.a, &self.m, s.bm)?, map(&self.b, &self.n, s.bn)?])
    }

    /// Static shared memory of the tiled kernel: the slabs, or the staged tile (in the
    /// matmul's dtype) where that is larger.
    pub(super) fn staged_bytes(&self, s: &TiledSchedule) -> u32 {
        let tile = if self.epi.staged() { s.bm * s.bn * self.dtype.size_bytes() as u32 } else { 0 };
        s.shared_bytes().max(tile)
    }
}

/// One operand's slab in a pipeline stage of the tensor-core kernel: `rows × cols` elements
/// of `es` bytes (2: bf16/f16; 1: `f8e4m3`) stored row by row, each row of `cols · es / 16`
/// 16-byte chunks whose order is XOR-swizzled by the row ([`Slab::offset`]). Rows are the
/// operand's outer axis (M for A, N for B) and columns its K axis when K is contiguous in
/// memory (`k_contig`), else the reverse.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slab {
    pub(super) k_contig: bool,
    pub(super) rows: u32,
    pub(super) cols: u32,
    /// Byte offset within a stage.
    pub(super) base: u32,
    /// Bytes per element.
    pub(super) es: u32,
}

impl Slab {
    /// The slab of an operand with `outer` rows or columns in the CTA tile and `bk` K
    /// elements per stage, at `base`.
    pub(super) fn new(k_contig: bool, outer: u32, bk: u32, base: u32, es: u32) -> Slab {
        if k_contig {
            Slab { k_contig, rows: outer, cols: bk, base, es }
        } else {
            Slab { k_contig, rows: bk, cols: outer, base, es }
        }
    }
    /// Elements per 16-byte chunk.
    pub(super) fn per_chunk(&self) -> u32 {
        16 / self.es
    }
    pub(super) fn chunks(&self) -> u32 {
        self.cols / self.per_chunk()
    }
    pub(super) fn row_bytes(&self) -> u32 {
        self.cols * self.es
    }
    pub(super) fn bytes(&self) -> u32 {
        self.rows * self.row_bytes()
    }
    /// The value XORed into the chunk index of row `row` (i32): `row mod 8` for rows of
    /// whole 128-byte lines, `(row / 2) mod 4` for 64-byte rows (two rows to a line). Eight
    /// consecutive rows then place a given chunk in eight different 16-byte bank groups, so
    /// the eight row addresses of an `ldmatrix` matrix and the chunks eight threads copy
    /// never share a bank (the "XOR swizzle" of CUTLASS's `Swizzle<3, 3, 3>` layouts).
    pub(super) fn swizzle<'ctx>(&self, k: &Kit<'ctx>, row: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        if self.chunks() == 4 {
            k.and(k.lshr(row, 1)?, k.i32c(3))
        } else {
            k.and(row, k.i32c(7))
        }
    }
    /// Byte offset (i32, from the slab's base) of chunk `chunk` of row `row`.
    pub(super) fn offset<'ctx>(&self, k: &Kit<'ctx>, row: IntValue<'ctx>, chunk: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let phys = k.xor(chunk, self.swizzle(k, row)?)?;
        k.add(k.mul(row, k.i32c(self.row_bytes() as i32))?, k.shl(phys, 4)?)
    }
}

/// The shared memory of a tensor-core kernel ([`Spec::mma_plan`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct MmaPlan {
    pub(super) a: Slab,
    pub(super) b: Slab,
    /// Bytes per pipeline stage (A's slab, then B's).
    pub(super) stage_bytes: u32,
    /// Dynamic shared memory: the stages, or the staged accumulator tile where larger.
    pub(super) smem_bytes: u32,
    /// Elements per row of the staged accumulator tile (`bn + 8`: the padding spreads the
    /// rows of a fragment store over the banks).
    pub(super) pitch: u32,
}

/// Per-CTA facts shared by both generators: the output's batch coordinates and the base
/// offsets of A and B for them.
pub(super) struct Bases<'ctx> {
    pub(super) coords: Vec<IntValue<'ctx>>,
    pub(super) a: IntValue<'ctx>,
    pub(super) b: IntValue<'ctx>,
}

/// Splits the batch index `z` (`ctaid.z`) into the output's batch coordinates and computes
/// A's and B's offsets for them.
pub(super) fn batch_bases<'ctx>(kit: &Kit<'ctx>, spec: &Spec, z: IntValue<'ctx>) -> R<Bases<'ctx>> {
    let nb = spec.batch.len();
    let mut coords = vec![kit.i64c(0); nb];
    let mut rest = z;
    for i in (0..nb).rev() {
        if i == 0 {
            coords[i] = rest;
        } else {
            let size = kit.dim(&spec.batch[i])?;
            coords[i] = kit.urem(rest, size)?;
            rest = kit.udiv(rest, size)?;
        }
    }
    let base = |strides: &[Dim]| -> R<IntValue<'ctx>> {
        let mut acc = kit.i64c(0);
        for (c, s) in coords.iter().zip(strides) {
            if s.as_const() != Some(0) {
                acc = kit.add(acc, kit.mul(*c, kit.dim(s)?)?)?;
            }
        }
        Ok(acc)
    };
    let a = kit.add(kit.dim(&spec.a.offset)?, base(&spec.a.batch_strides)?)?;
    let b = kit.add(kit.dim(&spec.b.offset)?, base(&spec.b.batch_strides)?)?;
    Ok(Bases { coords, a, b })
}

/// An index (i64), the index that decides whether it exists, and the bound that one must stay
/// below.
pub(super) type Bounded<'ctx> = (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>);

/// The column of R that virtual column `v` (i32) of column tile `tile` (a CTA's `bn` columns)
/// computes: `tile·bn + v`, or for a paired epilogue column `tile·sub + v mod sub` of segment
/// `v / sub` (`sub = bn / segments`: the tile holds the matching columns of every segment side
/// by side). Returns that column, the index that decides whether it exists and its bound:
/// `(n, n, N)`, or `(start + j, j, width)` for paired segments.
pub(super) fn tile_column<'ctx>(k: &Kit<'ctx>, spec: &Spec, bn: u32, tile: IntValue<'ctx>, v: IntValue<'ctx>) -> R<Bounded<'ctx>> {
    match &spec.epi {
        Epi::Paired { segs, width, .. } => {
            let sub = bn / segs.len() as u32;
            let seg = k.udiv(v, k.i32c(sub as i32))?;
            let j = k.add(k.mul(tile, k.i64c(i64::from(sub)))?, k.zext64(k.urem(v, k.i32c(sub as i32))?)?)?;
            let mut start = k.dim(&segs[0].start)?;
            for (i, sg) in segs.iter().enumerate().skip(1) {
                let here = k.icmp(IntPredicate::EQ, seg, k.i32c(i as i32))?;
                start = k.select_int(here, k.dim(&sg.start)?, start)?;
            }
            Ok((k.add(start, j)?, j, k.dim(width)?))
        }
        _ => {
            let n = k.add(k.mul(tile, k.i64c(i64::from(bn)))?, k.zext64(v)?)?;
            Ok((n, n, k.dim(&spec.n)?))
        }
    }
}
