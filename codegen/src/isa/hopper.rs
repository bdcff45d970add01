//! Hopper (sm_90a): warpgroup MMA (`wgmma`), the async-proxy fence, mbarriers, TMA tensor
//! copies and `setmaxnreg`. Most are inline asm (LLVM 22 has no intrinsics the back end lowers
//! for them).
//!
//! Design notes: book/src/design/isa.md

use inkwell::values::{BasicMetadataValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::DType;

use super::builder::basic;
use super::KernelBuilder;
use crate::math::R;
use crate::error::CodegenError;

/// The K extent of one `wgmma.mma_async` over operands of `dt` (PTX ISA §9.7.15.5, "Matrix
/// shape"): 16 for bf16/f16, 32 for `f8e4m3` — 32 bytes of a K-major row either way, so a
/// 128-byte swizzled row (64 bf16 or 128 e4m3 elements) is four instructions' worth of K.
/// `None` for a dtype `wgmma` does not take.
pub fn wgmma_k(dt: DType) -> Option<u32> {
    match dt {
        DType::BF16 | DType::F16 => Some(16),
        DType::F8E4M3 => Some(32),
        _ => None,
    }
}

impl<'ctx> KernelBuilder<'ctx> {
    /// `fence.proxy.async.shared::cta` (PTX ISA §9.7.13.4.1, "membar/fence"): orders this
    /// thread's earlier generic-proxy writes to shared memory (stores, completed `cp.async`
    /// copies) before later async-proxy reads of it — what `wgmma.mma_async` does with its
    /// shared-memory operands (PTX ISA §9.7.15.1). Each writer fences; a CTA barrier after the
    /// fence then publishes the writes to the warpgroups that issue the `wgmma`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn fence_proxy_async_shared(&self) -> R<()> {
        self.asm_void("fence.proxy.async.shared::cta;")
    }

    /// One K tile of a warpgroup's `m64nNkK` products (PTX ISA §9.7.15.5), as one inline-asm
    /// block: `wgmma.fence`, one `wgmma.mma_async` per `(a_desc, b_desc)` pair of `descs` (both
    /// operands in shared memory, described by 64-bit matrix descriptors, §9.7.15.5.1; no
    /// transposes: K-major A and B), `wgmma.commit_group`, `wgmma.wait_group in_flight`. The
    /// operand dtype `dt` picks the instruction ([`wgmma_k`]): bf16/f16 take
    /// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16|f16}.{bf16|f16} d, a, b, p, 1, 1, 0, 0`
    /// (16 elements of K each), `f8e4m3` takes
    /// `wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 d, a, b, p, 1, 1` (32 elements:
    /// 8-bit types have no transpose operands, §9.7.15.5.2) — 32 bytes of each K-major row
    /// either way. `acc` holds the
    /// warpgroup's `n/2` f32 accumulators of this thread (the D fragment of §9.7.15.5.1's
    /// figure "WGMMA .m64nNk16 D": element `i` at row `16·(warp % 4) + lane/4 + 8·((i/2) % 2)`,
    /// column `8·(i/4) + 2·(lane % 4) + i % 2`); they are read and written in place and
    /// returned. Waiting inside the block keeps the accumulators out of LLVM's hands while the
    /// products are in flight (a copy of an accumulator register between the issue and the
    /// wait would read it early); the warpgroups of a CTA still overlap each other's products.
    /// Every thread of the warpgroup must execute it (`.sync.aligned`). sm_90a only.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] (also for an `n` that is not a multiple of 8 in 8..=256 or a
    /// dtype other than bf16, f16, f8e4m3).
    pub fn wgmma_k_tile(&self, dt: sinter_ir::DType, n: u32, acc: &[FloatValue<'ctx>], descs: &[(IntValue<'ctx>, IntValue<'ctx>)], in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        let (ty, imms) = match dt {
            sinter_ir::DType::BF16 => ("bf16", "1, 1, 0, 0"),
            sinter_ir::DType::F16 => ("f16", "1, 1, 0, 0"),
            sinter_ir::DType::F8E4M3 => ("e4m3", "1, 1"),
            _ => return Err(CodegenError::Builder(format!("wgmma of {dt} operands"))),
        };
        let k = wgmma_k(dt).ok_or_else(|| CodegenError::Builder(format!("wgmma of {dt} operands")))?;
        let regs = (n / 2) as usize;
        if n % 8 != 0 || !(8..=256).contains(&n) || acc.len() != regs || descs.is_empty() {
            return Err(CodegenError::Builder(format!("wgmma m64n{n}k{k} with {} accumulators", acc.len())));
        }
        let f32t = self.cx.f32_type();
        let i64t = self.cx.i64_type();
        let out_ty = self.cx.struct_type(&vec![f32t.into(); regs], false);
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum<'ctx>> = vec![f32t.into(); regs];
        params.extend(std::iter::repeat_n(inkwell::types::BasicMetadataTypeEnum::from(i64t), 2 * descs.len()));
        let fty = out_ty.fn_type(&params, false);
        let list = (0..regs).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
        let mut text = String::from("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.fence.sync.aligned;\n");
        for j in 0..descs.len() {
            let (a, b) = (2 * regs + 2 * j, 2 * regs + 2 * j + 1);
            text.push_str(&format!("wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ty}.{ty} {{{list}}}, ${a}, ${b}, p, {imms};\n"));
        }
        text.push_str(&format!("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned {in_flight};\n}}"));
        let mut cons: Vec<String> = (0..regs).map(|_| "=f".to_owned()).collect();
        cons.extend((0..regs).map(|i| i.to_string()));
        cons.extend(std::iter::repeat_n("l".to_owned(), 2 * descs.len()));
        cons.push("~{memory}".to_owned());
        let f = self.cx.create_inline_asm(fty, text, cons.join(","), true, false, None, false);
        let mut args: Vec<inkwell::values::BasicMetadataValueEnum<'ctx>> = acc.iter().map(|&v| v.into()).collect();
        for &(a, b) in descs {
            args.push(a.into());
            args.push(b.into());
        }
        let call = self.b.build_indirect_call(fty, f, &args, "wgmma")?;
        let st = basic(call.try_as_basic_value().basic(), "wgmma")?.into_struct_value();
        (0..regs as u32).map(|i| Ok(self.b.build_extract_value(st, i, "d")?.into_float_value())).collect()
    }

    /// One K tile of a warpgroup's `m64nNk16` (bf16/f16) or `m64nNk32` (`f8e4m3`) products
    /// with A from **registers** (PTX ISA §9.7.15.5.2, the `wgmma.mma_async … d, a, b-desc,
    /// scale-d, imm-scale-a, imm-scale-b{, imm-trans-b}` form): `wgmma.fence`, one
    /// `wgmma.mma_async` per `(a, b_desc)` pair of `steps` — `a` the four `.b32` registers of
    /// the warp's A fragment, `b_desc` B's matrix descriptor —, `wgmma.commit_group`,
    /// `wgmma.wait_group in_flight`. The A fragment (warp `w % 4` holds rows `16·(w % 4) ..`,
    /// lane `(g, t) = (lane/4, lane%4)`, low bytes first): bf16/f16 (figure "WGMMA .m64nNk16
    /// register fragment layout for matrix A") `{(g, 2t), (g, 2t+1)}`, `{(g+8, 2t), ..}`,
    /// `{(g, 2t+8), ..}`, `{(g+8, 2t+8), ..}` — the `mma.m16n8k16` A layout; `f8e4m3` (figure
    /// "WGMMA .m64nNk32 register fragment layout for matrix A") `(g, 4t..4t+3)`,
    /// `(g+8, 4t..4t+3)`, `(g, 16+4t..)`, `(g+8, 16+4t..)`, four e4m3 bytes a register.
    /// `trans_b` sets `imm-trans-b` (B stored MN-major, N contiguous; bf16/f16 only: 8-bit
    /// types have no transpose operand and take a K-major B). `acc` as in
    /// [`KernelBuilder::wgmma_k_tile`]. Every thread of the warpgroup must execute it.
    /// sm_90a only.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] (also for an `n` that is not a multiple of 8 in 8..=256, a
    /// dtype other than bf16/f16/f8e4m3, or `trans_b` with f8e4m3).
    pub fn wgmma_rs_k_tile(&self, dt: sinter_ir::DType, n: u32, acc: &[FloatValue<'ctx>], steps: &[([IntValue<'ctx>; 4], IntValue<'ctx>)], trans_b: bool, in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        let ty = match dt {
            sinter_ir::DType::BF16 => "bf16",
            sinter_ir::DType::F16 => "f16",
            sinter_ir::DType::F8E4M3 if !trans_b => "e4m3",
            _ => return Err(CodegenError::Builder(format!("wgmma of {dt} operands (A in registers, transposed B: {trans_b})"))),
        };
        let k = wgmma_k(dt).ok_or_else(|| CodegenError::Builder(format!("wgmma of {dt} operands")))?;
        let regs = (n / 2) as usize;
        if n % 8 != 0 || !(8..=256).contains(&n) || acc.len() != regs || steps.is_empty() {
            return Err(CodegenError::Builder(format!("wgmma m64n{n}k{k} (A in registers) with {} accumulators", acc.len())));
        }
        let f32t = self.cx.f32_type();
        let (i32t, i64t) = (self.cx.i32_type(), self.cx.i64_type());
        let out_ty = self.cx.struct_type(&vec![f32t.into(); regs], false);
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum<'ctx>> = vec![f32t.into(); regs];
        for _ in steps {
            params.extend(std::iter::repeat_n(inkwell::types::BasicMetadataTypeEnum::from(i32t), 4));
            params.push(i64t.into());
        }
        let fty = out_ty.fn_type(&params, false);
        let list = (0..regs).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
        // 8-bit types take no imm-trans-b operand.
        let imms = if dt == sinter_ir::DType::F8E4M3 { "1, 1".to_owned() } else { format!("1, 1, {}", u32::from(trans_b)) };
        let mut text = String::from("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.fence.sync.aligned;\n");
        for j in 0..steps.len() {
            let o = 2 * regs + 5 * j;
            text.push_str(&format!("wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ty}.{ty} {{{list}}}, {{${}, ${}, ${}, ${}}}, ${}, p, {imms};\n", o, o + 1, o + 2, o + 3, o + 4));
        }
        text.push_str(&format!("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned {in_flight};\n}}"));
        let mut cons: Vec<String> = (0..regs).map(|_| "=f".to_owned()).collect();
        cons.extend((0..regs).map(|i| i.to_string()));
        for _ in steps {
            cons.extend(std::iter::repeat_n("r".to_owned(), 4));
            cons.push("l".to_owned());
        }
        cons.push("~{memory}".to_owned());
        let f = self.cx.create_inline_asm(fty, text, cons.join(","), true, false, None, false);
        let mut args: Vec<inkwell::values::BasicMetadataValueEnum<'ctx>> = acc.iter().map(|&v| v.into()).collect();
        for (a, b) in steps {
            args.extend(a.iter().map(|&x| inkwell::values::BasicMetadataValueEnum::from(x)));
            args.push((*b).into());
        }
        let call = self.b.build_indirect_call(fty, f, &args, "wgmma_rs")?;
        let st = basic(call.try_as_basic_value().basic(), "wgmma_rs")?.into_struct_value();
        (0..regs as u32).map(|i| Ok(self.b.build_extract_value(st, i, "d")?.into_float_value())).collect()
    }

    /// `wgmma.wait_group.sync.aligned 0` with the accumulators `acc` as in-out operands: after
    /// [`KernelBuilder::wgmma_k_tile`] with a group left in flight, the wait that makes them
    /// readable (LLVM orders their later reads after it).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn wgmma_wait(&self, acc: &[FloatValue<'ctx>]) -> R<Vec<FloatValue<'ctx>>> {
        self.wgmma_wait_group(acc, 0)
    }

    /// `wgmma.wait_group.sync.aligned in_flight` (PTX ISA §9.7.15.7.3) with the accumulators
    /// `acc` as in-out operands: waits until at most the `in_flight` most recently committed
    /// `wgmma` groups are pending, so that `acc` — written by an older group — is readable
    /// (LLVM orders every later read of them after it, and none before: the values given are
    /// the asm's inputs, not readable copies). Registers an in-flight `wgmma` reads (the A
    /// fragment of a register-A product, bitcast to f32) may be passed too: live until the
    /// wait, they cannot be reused for other values while the product runs.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn wgmma_wait_group(&self, acc: &[FloatValue<'ctx>], in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        self.wgmma_wait_group_noted(acc, in_flight, "")
    }

    /// [`KernelBuilder::wgmma_wait_group`] with a PTX comment `note` after the instruction:
    /// waits with different notes are different inline asm to LLVM, so it does not merge (or
    /// hoist out of a branch) the waits of the two arms of a branch.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn wgmma_wait_group_noted(&self, acc: &[FloatValue<'ctx>], in_flight: u32, note: &str) -> R<Vec<FloatValue<'ctx>>> {
        let f32t = self.cx.f32_type();
        let n = acc.len();
        let out_ty = self.cx.struct_type(&vec![f32t.into(); n], false);
        let params: Vec<inkwell::types::BasicMetadataTypeEnum<'ctx>> = vec![f32t.into(); n];
        let fty = out_ty.fn_type(&params, false);
        let mut cons: Vec<String> = (0..n).map(|_| "=f".to_owned()).collect();
        cons.extend((0..n).map(|i| i.to_string()));
        cons.push("~{memory}".to_owned());
        let f = self.cx.create_inline_asm(fty, if note.is_empty() { format!("wgmma.wait_group.sync.aligned {in_flight};") } else { format!("wgmma.wait_group.sync.aligned {in_flight}; // {note}") }, cons.join(","), true, false, None, false);
        let args: Vec<inkwell::values::BasicMetadataValueEnum<'ctx>> = acc.iter().map(|&v| v.into()).collect();
        let call = self.b.build_indirect_call(fty, f, &args, "wgmma_wait")?;
        let st = basic(call.try_as_basic_value().basic(), "wgmma_wait")?.into_struct_value();
        (0..n as u32).map(|i| Ok(self.b.build_extract_value(st, i, "d")?.into_float_value())).collect()
    }

    /// `mbarrier.init.shared::cta.b64 [bar], count` (PTX ISA §9.7.13.15.9): the 8-byte
    /// mbarrier at shared address `bar` (32-bit) expects `count` arrivals a phase.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mbarrier_init(&self, bar: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_args(&format!("mbarrier.init.shared::cta.b64 [$0], {count};"), "r", &[bar.into()])
    }

    /// `fence.mbarrier_init.release.cluster` (PTX ISA §9.7.13.4): makes this thread's
    /// `mbarrier.init`s visible to the async proxy (TMA's `complete_tx`) and to the cluster,
    /// before the barrier that publishes them.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn fence_mbarrier_init(&self) -> R<()> {
        self.asm_void("fence.mbarrier_init.release.cluster;")
    }

    /// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes` (PTX ISA §9.7.13.15.12):
    /// this thread's arrival at the mbarrier, raising the phase's expected transaction count
    /// by `bytes` (what the copies that signal it will deliver).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mbarrier_arrive_expect_tx(&self, bar: IntValue<'ctx>, bytes: u32) -> R<()> {
        self.asm_args(&format!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {bytes};"), "r", &[bar.into()])
    }

    /// `mbarrier.arrive.shared::cta.b64 _, [bar]` (PTX ISA §9.7.13.15.13): this thread's
    /// arrival at the mbarrier at shared address `bar` (32-bit), release semantics at CTA
    /// scope (what the thread read before it is ordered before the phase completes). The
    /// warp-specialised matmul's consumers free a stage with it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mbarrier_arrive(&self, bar: IntValue<'ctx>) -> R<()> {
        self.asm_args("mbarrier.arrive.shared::cta.b64 _, [$0];", "r", &[bar.into()])
    }

    /// Waits until the phase of parity `parity` (i32, 0 or 1) of the mbarrier at `bar` has
    /// completed: a loop of `mbarrier.try_wait.parity.shared::cta.b64` (PTX ISA §9.7.13.15.16;
    /// each try suspends the thread for a while before it reports). Acquire semantics at CTA
    /// scope: the data the phase's copies delivered is visible after it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mbarrier_wait_parity(&mut self, bar: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
        let i32t = self.cx.i32_type();
        let fty = i32t.fn_type(&[i32t.into(), i32t.into()], false);
        let text = "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\nselp.u32 $0, 1, 0, p;\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,r,r,~{memory}".to_owned(), true, false, None, false);
        let spin = self.block("mbar_wait");
        let done = self.block("mbar_done");
        self.br(spin)?;
        self.position(spin);
        let call = self.b.build_indirect_call(fty, f, &[bar.into(), parity.into()], "ready")?;
        let ready = basic(call.try_as_basic_value().basic(), "mbarrier.try_wait")?.into_int_value();
        let ok = self.b.build_int_compare(IntPredicate::NE, ready, i32t.const_zero(), "ok")?;
        self.cond_br(ok, done, spin)?;
        self.position(done);
        Ok(())
    }

    /// `cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    /// [dst], [map, {coords}], [bar]` (PTX ISA §9.7.9.25.5.2): the TMA unit copies the box of
    /// the tensor map `map` (a `__grid_constant__` kernel parameter,
    /// [`ParamKind::TensorMap`]) at element coordinates `coords` (i32, innermost first; out of
    /// bounds reads as zero) to shared address `dst` (32-bit, aligned as the map's swizzle
    /// asks: 1024 bytes for 128-byte swizzling) and signals the mbarrier at `bar` with the
    /// box's bytes. Issued by one thread.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] (also for a rank outside 1..=5).
    pub fn tma_load(&self, dst: IntValue<'ctx>, map: PointerValue<'ctx>, coords: &[IntValue<'ctx>], bar: IntValue<'ctx>) -> R<()> {
        let r = coords.len();
        if !(1..=5).contains(&r) {
            return Err(CodegenError::Builder(format!("a TMA copy of rank {r}")));
        }
        let addr = self.b.build_ptr_to_int(map, self.cx.i64_type(), "tmap")?;
        let cs = (0..r).map(|i| format!("${}", 3 + i)).collect::<Vec<_>>().join(", ");
        let text = format!("cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {{{cs}}}], [$2];");
        let mut cons = vec!["r", "l", "r"];
        cons.extend(std::iter::repeat_n("r", r));
        let mut args: Vec<BasicMetadataValueEnum<'ctx>> = vec![dst.into(), addr.into(), bar.into()];
        args.extend(coords.iter().map(|&c| BasicMetadataValueEnum::from(c)));
        self.asm_args(&text, &cons.join(","), &args)
    }

    /// `setmaxnreg.{inc|dec}.sync.aligned.u32 regs` (PTX ISA "setmaxnreg" among the miscellaneous instructions;
    /// PTX 8.0, sm_90a):
    /// the executing warpgroup's per-thread register budget becomes `regs` (24 ..= 256, a
    /// multiple of 8): `.dec` releases registers to the SM's pool, `.inc` waits until the pool
    /// has them. Every thread of the warpgroup executes the same instruction (`.sync.aligned`);
    /// the kernel must declare its launch bound (`.maxntid`), from which ptxas derives the
    /// registers each warpgroup starts with.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] (also for a `regs` outside 24..=256 or not a multiple of 8).
    pub fn setmaxnreg(&self, inc: bool, regs: u32) -> R<()> {
        if !(24..=256).contains(&regs) || regs % 8 != 0 {
            return Err(CodegenError::Builder(format!("setmaxnreg {regs}: 24 ..= 256, a multiple of 8")));
        }
        self.asm_void(&format!("setmaxnreg.{}.sync.aligned.u32 {regs};", if inc { "inc" } else { "dec" }))
    }
}
