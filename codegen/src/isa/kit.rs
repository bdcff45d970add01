//! The kernel-building toolkit every family builds with: [`Kit`], a thin layer over
//! [`crate::isa::KernelBuilder`], and the one build-twice mechanism ([`build_twice`],
//! [`Kit::build`]) that gives a kernel exactly the size parameters its code reads.
//!
//! A [`Kit`] owns one [`KernelBuilder`] whose kernel takes one global pointer per kernel buffer
//! (inputs `noalias readonly`, outputs `noalias`) and one i64 per symbolic [`Dim`] the
//! kernel reads ([`KernelParam::Size`]; [`Kit::build`] builds with a superset of dims, then
//! once more with only those used). It adds what the generators use beyond `emit`: every
//! instruction as one call on `&self` returning [`CodegenError`] (so that generators can pass
//! the kit into closures for loop bodies), counted loops and conditionals, mutable variables
//! (`alloca`s in the prologue, which `default<O3>`'s SROA turns into registers), guarded and
//! vector loads of any float dtype converted to f32, shared memory static or dynamic, and the
//! device math library ([`crate::math`]) through the builder's [`crate::math::Ops`].
//!
//! The instruction layer knows no kernel family: what reads kernel buffers (strided views,
//! the element evaluator's bridge `Kit::with_eval`) lives in `kernels::view`.

use std::cell::{Ref, RefCell};

use inkwell::basic_block::BasicBlock;
use inkwell::context::Context;
use inkwell::module::Linkage;
use inkwell::types::{BasicTypeEnum, FloatType, IntType};
use inkwell::values::{BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim, KernelParam, TensorMap};

use crate::isa::{KernelBuilder, ParamKind, SizeTable};
use crate::math;
use crate::target::Target;
use crate::error::CodegenError;
use crate::llvm::ADDRESS_SPACE_SHARED;

/// Results of this module.
pub(crate) type R<T> = Result<T, CodegenError>;

#[cfg(any(test, feature = "emu"))]
thread_local! {
    /// Tests set it to get the kernel's LLVM IR in [`sinter_ir::LaunchPlan::ptx`] instead of
    /// PTX (see [`crate::emu`]).
    pub(crate) static EMIT_IR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Where a kernel's shared memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SharedKind {
    /// One static `.shared` array (≤ 48 KiB); the launch passes no dynamic bytes.
    Static,
    /// `extern .shared` dynamic memory of this many bytes (the launch passes them, and
    /// beyond 48 KiB the runtime must opt in with `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    Dynamic(u32),
}

/// One kernel under construction. See the module docs.
pub(crate) struct Kit<'ctx> {
    kb: RefCell<KernelBuilder<'ctx>>,
    pub ctx: &'ctx Context,
    name: String,
    pub f32t: FloatType<'ctx>,
    pub i1t: IntType<'ctx>,
    pub i32t: IntType<'ctx>,
    pub i64t: IntType<'ctx>,
    n_inputs: usize,
    n_buffers: usize,
    /// TMA tensor maps, parameters after the buffers ([`Kit::tensor_map`]).
    maps: Vec<TensorMap>,
    sizes: Vec<Dim>,
    requested: RefCell<Vec<Dim>>,
}

impl<'ctx> Kit<'ctx> {
    /// Kernel `name` for `target` with `n_inputs` read-only input buffers, `n_outputs`
    /// output buffers, one i64 parameter per distinct non-constant dim of `dims`, and a
    /// launch bound of `threads` threads per block; positioned in its body.
    /// TMA tensor maps `maps` are parameters after the buffers ([`Kit::tensor_map`]).
    pub(crate) fn with_maps(ctx: &'ctx Context, name: &str, target: Target, (n_inputs, n_outputs): (usize, usize), maps: &[TensorMap], dims: &[Dim], threads: u32) -> R<Kit<'ctx>> {
        let mut sizes: Vec<Dim> = Vec::new();
        for d in dims {
            if d.as_const().is_none() && !sizes.contains(d) {
                sizes.push(d.clone());
            }
        }
        let mut params = vec![ParamKind::input(); n_inputs];
        params.extend(std::iter::repeat_n(ParamKind::output(), n_outputs));
        params.extend(std::iter::repeat_n(ParamKind::TensorMap, maps.len()));
        params.extend(std::iter::repeat_n(ParamKind::Size, sizes.len()));
        let kb = KernelBuilder::new(ctx, name, &params, target)?;
        // No `.maxntid` by default: with it, ptxas 12.9 trades registers for occupancy on
        // these kernels (capping the attention core at 80–128 registers) and spills;
        // without it every schedule here assembles spill-free. The tensor-core matmul
        // declares it ([`Kit::launch_bounds`]) to get 255 registers at 256 threads.
        let _ = threads;
        Ok(Kit {
            kb: RefCell::new(kb),
            ctx,
            name: name.to_owned(),
            f32t: ctx.f32_type(),
            i1t: ctx.bool_type(),
            i32t: ctx.i32_type(),
            i64t: ctx.i64_type(),
            n_inputs,
            n_buffers: n_inputs + n_outputs,
            maps: maps.to_vec(),
            sizes,
            requested: RefCell::new(Vec::new()),
        })
    }

    /// The size dims the generator asked for ([`Kit::dim`]) or whose parameters the built
    /// code reads (the element evaluator asks its own table).
    fn used_sizes(&self) -> Vec<Dim> {
        let kb = self.bld();
        let requested = self.requested.borrow();
        self.sizes
            .iter()
            .enumerate()
            .filter(|(i, d)| requested.contains(d) || kb.func.get_nth_param((self.first_size() + i) as u32).is_some_and(|p| p.get_first_use().is_some()))
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// Builds kernel `name` with `build` and returns its PTX and parameter list. The
    /// kernel is built with every non-constant dim of `dims` as a size parameter, and once
    /// more with only those the code reads when some went unused, so that the launch plan
    /// lists exactly the sizes the kernel needs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        ctx: &'ctx Context,
        name: &str,
        target: Target,
        n_inputs: usize,
        n_outputs: usize,
        dims: &[Dim],
        threads: u32,
        build: impl Fn(&Kit<'ctx>) -> R<()>,
    ) -> R<(String, Vec<KernelParam>)> {
        Self::build_with_maps(ctx, name, target, (n_inputs, n_outputs), &[], dims, threads, build)
    }

    /// [`Kit::build`] of a kernel that also takes the TMA tensor maps `maps` (parameters
    /// after the buffers, [`Kit::tensor_map`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build_with_maps(
        ctx: &'ctx Context,
        name: &str,
        target: Target,
        io: (usize, usize),
        maps: &[TensorMap],
        dims: &[Dim],
        threads: u32,
        build: impl Fn(&Kit<'ctx>) -> R<()>,
    ) -> R<(String, Vec<KernelParam>)> {
        let (kit, _) = two_passes(Some(dims_of(dims)), |sizes| {
            let kit = Kit::with_maps(ctx, name, target, io, maps, sizes.unwrap_or_default(), threads)?;
            build(&kit)?;
            let used = kit.used_sizes();
            Ok((kit, used))
        })?;
        let params = kit.params();
        #[cfg(any(test, feature = "emu"))]
        if EMIT_IR.with(|f| f.get()) {
            return Ok((kit.ir_text()?, params));
        }
        Ok((kit.finish()?, params))
    }

    /// The kernel's LLVM IR as built (no optimisation), the prologue closed: what the
    /// CPU emulator of the tests runs.
    #[cfg(any(test, feature = "emu"))]
    fn ir_text(self) -> R<String> {
        let kb = self.kb.into_inner();
        kb.ret()?;
        let first = kb.func.get_first_basic_block().ok_or_else(|| CodegenError::Builder("no prologue".into()))?;
        let body = first.get_next_basic_block().ok_or_else(|| CodegenError::Builder("no body".into()))?;
        kb.position(first);
        kb.br(body)?;
        if EMIT_IR.with(|f| f.get()) && std::env::var_os("SINTER_EMU_O3").is_some() {
            let machine = crate::llvm::target_machine(&kb.target)?;
            kb.module.set_triple(&machine.get_triple());
            kb.module.set_data_layout(&machine.get_target_data().get_data_layout());
            kb.module
                .run_passes("default<O3>", &machine, inkwell::passes::PassBuilderOptions::create())
                .map_err(|e| CodegenError::Builder(e.to_string()))?;
        }
        Ok(kb.ir_text())
    }

    /// The builder (borrowed for one call).
    fn bld(&self) -> Ref<'_, KernelBuilder<'ctx>> {
        self.kb.borrow()
    }

    /// Runs a [`crate::math`] function on the builder.
    pub(crate) fn math<T>(&self, f: impl FnOnce(&mut KernelBuilder<'ctx>) -> R<T>) -> R<T> {
        let mut kb = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?;
        f(&mut kb)
    }

    /// The kernel's parameter list: every buffer, then every size.
    pub(crate) fn params(&self) -> Vec<KernelParam> {
        let mut p: Vec<KernelParam> = (0..self.n_buffers).map(KernelParam::Buffer).collect();
        p.extend(self.maps.iter().cloned().map(KernelParam::TensorMap));
        p.extend(self.sizes.iter().cloned().map(KernelParam::Size));
        p
    }

    /// The parameter index of the first size (after the buffers and tensor maps).
    fn first_size(&self) -> usize {
        self.n_buffers + self.maps.len()
    }

    /// Tensor map `i`'s parameter: a pointer to its 128 bytes in the parameter space.
    pub(crate) fn tensor_map(&self, i: usize) -> R<PointerValue<'ctx>> {
        if i >= self.maps.len() {
            return Err(self.err(format!("no tensor map {i}")));
        }
        let p = self.bld().func.get_nth_param((self.n_buffers + i) as u32).ok_or_else(|| self.err(format!("no parameter for tensor map {i}")))?;
        Ok(p.into_pointer_value())
    }

    /// An internal error of the generator.
    pub(crate) fn err(&self, e: impl std::fmt::Display) -> CodegenError {
        CodegenError::Builder(format!("{}: {e}", self.name))
    }

    /// The pointer to buffer `i` (inputs then outputs).
    pub(crate) fn buf(&self, i: usize) -> R<PointerValue<'ctx>> {
        if i >= self.n_buffers {
            return Err(self.err(format!("no buffer parameter {i}")));
        }
        self.bld().param_ptr(i)
    }

    /// Whether buffer `i` is an input.
    #[allow(dead_code)]
    pub(crate) fn is_input(&self, i: usize) -> bool {
        i < self.n_inputs
    }

    /// `d` as an i64: a constant, or the size parameter that carries it.
    pub(crate) fn dim(&self, d: &Dim) -> R<IntValue<'ctx>> {
        if let Some(c) = d.as_const() {
            return Ok(self.i64c(c));
        }
        let pos = self.sizes.iter().position(|s| s == d).ok_or_else(|| self.err(format!("dim {d} is not a kernel parameter")))?;
        let mut req = self.requested.borrow_mut();
        if !req.contains(d) {
            req.push(d.clone());
        }
        drop(req);
        self.bld().param_int(self.first_size() + pos)
    }

    // ---- constants -------------------------------------------------------------------
    pub(crate) fn i64c(&self, v: i64) -> IntValue<'ctx> {
        self.i64t.const_int(v as u64, true)
    }
    pub(crate) fn i32c(&self, v: i32) -> IntValue<'ctx> {
        self.i32t.const_int(v as i64 as u64, true)
    }
    pub(crate) fn f32c(&self, v: f64) -> FloatValue<'ctx> {
        self.f32t.const_float(v)
    }
    pub(crate) fn bool_c(&self, v: bool) -> IntValue<'ctx> {
        self.i1t.const_int(u64::from(v), false)
    }

    // ---- integer arithmetic ----------------------------------------------------------
    pub(crate) fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_add(a, b, "")?)
    }
    pub(crate) fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_sub(a, b, "")?)
    }
    pub(crate) fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_mul(a, b, "")?)
    }
    /// Unsigned division (operands known non-negative).
    pub(crate) fn udiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_unsigned_div(a, b, "")?)
    }
    /// Unsigned remainder (operands known non-negative).
    pub(crate) fn urem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_unsigned_rem(a, b, "")?)
    }
    pub(crate) fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_compare(p, a, b, "")?)
    }
    pub(crate) fn and(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_and(a, b, "")?)
    }
    /// Signed minimum.
    pub(crate) fn smin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::SLT, a, b)?;
        self.select_int(c, a, b)
    }
    /// Signed maximum.
    pub(crate) fn smax(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::SGT, a, b)?;
        self.select_int(c, a, b)
    }
    pub(crate) fn select_int(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_select(c, a, b, "")?.into_int_value())
    }
    pub(crate) fn select_f(&self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.bld().b.build_select(c, a, b, "")?.into_float_value())
    }
    /// `c ? a : b` on integers.
    pub(crate) fn select_i(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_select(c, a, b, "")?.into_int_value())
    }
    /// Bitwise exclusive or.
    pub(crate) fn xor(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_xor(a, b, "")?)
    }
    /// i32 → i64, zero-extended (indices known non-negative).
    pub(crate) fn zext64(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_z_extend(v, self.i64t, "")?)
    }
    /// i32 → i64, sign-extended.
    pub(crate) fn sext64(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_s_extend(v, self.i64t, "")?)
    }
    /// i64 → i32 (value known to fit).
    pub(crate) fn trunc32(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_int_truncate(v, self.i32t, "")?)
    }

    // ---- float arithmetic ------------------------------------------------------------
    pub(crate) fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.bld().b.build_float_add(a, b, "")?)
    }
    pub(crate) fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.bld().b.build_float_sub(a, b, "")?)
    }
    pub(crate) fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.bld().b.build_float_mul(a, b, "")?)
    }
    /// IEEE division (`div.rn.f32`).
    pub(crate) fn fdiv(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.bld().b.build_float_div(a, b, "")?)
    }
    pub(crate) fn fcmp(&self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_float_compare(p, a, b, "")?)
    }
    /// `a·b + c` with one rounding (`fma.rn.f32`).
    pub(crate) fn fma(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.fma", &[a, b, c])
    }
    /// max that is NaN when either operand is (`max.NaN.f32`, sm_80+).
    pub(crate) fn max_nan(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.maximum", &[a, b])
    }
    /// eˣ to ≤ 3 ulp ([`crate::math::exp`], precise): exp(−inf) = 0, NaN stays NaN.
    pub(crate) fn exp(&self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.math(|kb| math::exp(kb, x, true))
    }
    /// ln x ([`crate::math::log`]): ln 0 = −inf, ln(x < 0) = NaN, ln(+inf) = +inf.
    pub(crate) fn log(&self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.math(|kb| math::log(kb, x))
    }

    /// Calls an overloaded float intrinsic `name.f32` on `args`.
    fn call_f(&self, name: &str, args: &[FloatValue<'ctx>]) -> R<FloatValue<'ctx>> {
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&a| a.into()).collect();
        Ok(self.bld().intrinsic_value(name, &[self.f32t.into()], &args)?.into_float_value())
    }

    // ---- GPU specifics ---------------------------------------------------------------
    /// A special register (`tid.x`, `ctaid.y`, ...) as i32, read once in the prologue.
    pub(crate) fn sreg(&self, name: &'static str) -> R<IntValue<'ctx>> {
        self.math(|kb| kb.sreg(name))
    }

    /// `bar.sync 0`: every thread of the CTA.
    pub(crate) fn barrier(&self) -> R<()> {
        self.bld().barrier()
    }

    /// `bar.warp.sync 0xffffffff`: orders shared-memory accesses within a warp.
    pub(crate) fn warp_sync(&self) -> R<()> {
        self.bld().intrinsic("llvm.nvvm.bar.warp.sync", &[], &[self.i32c(-1).into()])?;
        Ok(())
    }

    /// `shfl.sync.bfly.b32` over the full warp: the value of lane `lane ^ mask`.
    pub(crate) fn shfl_xor(&self, v: FloatValue<'ctx>, mask: u32) -> R<FloatValue<'ctx>> {
        self.bld().shfl_bfly_f32(v, mask)
    }

    /// Declares the launch bound (`.maxntid threads`, `.minnctapersm 1`): ptxas may then
    /// give each thread up to `65536 / threads` registers (255 at 256 threads), which the
    /// tensor-core kernels' register tiles need.
    pub(crate) fn launch_bounds(&self, threads: u32) {
        let kb = self.bld();
        kb.set_max_threads(threads);
        kb.set_min_ctas_per_sm(1);
    }

    // ---- tensor cores (see the primitives of `KernelBuilder`) ------------------------
    /// [`KernelBuilder::cp_async_16`]: 16 bytes global → shared, `src_bytes` (i32) read.
    pub(crate) fn cp_async_16(&self, dst: PointerValue<'ctx>, src: PointerValue<'ctx>, src_bytes: IntValue<'ctx>) -> R<()> {
        self.bld().cp_async_16(dst, src, src_bytes)
    }
    /// [`KernelBuilder::fence_proxy_async_shared`].
    pub(crate) fn fence_proxy_async(&self) -> R<()> {
        self.bld().fence_proxy_async_shared()
    }
    /// [`KernelBuilder::wgmma_k_tile`].
    pub(crate) fn wgmma_k_tile(&self, dt: DType, n: u32, acc: &[FloatValue<'ctx>], descs: &[(IntValue<'ctx>, IntValue<'ctx>)], in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        self.bld().wgmma_k_tile(dt, n, acc, descs, in_flight)
    }
    /// [`KernelBuilder::wgmma_rs_k_tile`].
    pub(crate) fn wgmma_rs_k_tile(&self, dt: DType, n: u32, acc: &[FloatValue<'ctx>], steps: &[([IntValue<'ctx>; 4], IntValue<'ctx>)], trans_b: bool, in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        self.bld().wgmma_rs_k_tile(dt, n, acc, steps, trans_b, in_flight)
    }
    /// [`KernelBuilder::pack_e4m3x4`].
    pub(crate) fn pack_e4m3x4(&self, x: [FloatValue<'ctx>; 4]) -> R<IntValue<'ctx>> {
        self.bld().pack_e4m3x4(x)
    }
    /// [`KernelBuilder::e4m3x2_to_f32`].
    pub(crate) fn e4m3x2_to_f32(&self, x: IntValue<'ctx>) -> R<[FloatValue<'ctx>; 2]> {
        self.bld().e4m3x2_to_f32(x)
    }
    /// [`KernelBuilder::e4m3x2_to_f16x2`].
    pub(crate) fn e4m3x2_to_f16x2(&self, x: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.bld().e4m3x2_to_f16x2(x)
    }
    /// [`KernelBuilder::transpose_bytes_4x4`].
    pub(crate) fn transpose_bytes_4x4(&self, rows: [IntValue<'ctx>; 4]) -> R<[IntValue<'ctx>; 4]> {
        self.bld().transpose_bytes_4x4(rows)
    }
    /// [`KernelBuilder::bar_red_or`].
    pub(crate) fn bar_red_or(&self, id: IntValue<'ctx>, count: u32, flag: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.bld().bar_red_or(id, count, flag)
    }
    /// [`KernelBuilder::bar_sync`].
    pub(crate) fn bar_sync(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.bld().bar_sync(id, count)
    }
    /// [`KernelBuilder::bar_arrive`].
    pub(crate) fn bar_arrive(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.bld().bar_arrive(id, count)
    }
    /// [`KernelBuilder::wgmma_wait`].
    pub(crate) fn wgmma_wait(&self, acc: &[FloatValue<'ctx>]) -> R<Vec<FloatValue<'ctx>>> {
        self.bld().wgmma_wait(acc)
    }
    /// [`KernelBuilder::wgmma_wait_group`].
    pub(crate) fn wgmma_wait_group(&self, acc: &[FloatValue<'ctx>], in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        self.bld().wgmma_wait_group(acc, in_flight)
    }
    /// [`KernelBuilder::wgmma_wait_group_noted`].
    pub(crate) fn wgmma_wait_group_noted(&self, acc: &[FloatValue<'ctx>], in_flight: u32, note: &str) -> R<Vec<FloatValue<'ctx>>> {
        self.bld().wgmma_wait_group_noted(acc, in_flight, note)
    }
    /// `n` mbarriers (8 bytes each, a static shared array): the shared address (i32) of
    /// the first; barrier `i` is 8·i bytes further.
    pub(crate) fn mbarriers(&self, n: u32) -> R<IntValue<'ctx>> {
        let p = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?.shared_array(self.i64t.into(), n.max(1), 8, "mbar");
        self.smem_addr(p)
    }
    /// [`KernelBuilder::mbarrier_init`].
    pub(crate) fn mbarrier_init(&self, bar: IntValue<'ctx>, count: u32) -> R<()> {
        self.bld().mbarrier_init(bar, count)
    }
    /// [`KernelBuilder::fence_mbarrier_init`].
    pub(crate) fn fence_mbarrier_init(&self) -> R<()> {
        self.bld().fence_mbarrier_init()
    }
    /// [`KernelBuilder::mbarrier_arrive_expect_tx`].
    pub(crate) fn mbarrier_arrive_expect_tx(&self, bar: IntValue<'ctx>, bytes: u32) -> R<()> {
        self.bld().mbarrier_arrive_expect_tx(bar, bytes)
    }
    /// [`KernelBuilder::mbarrier_arrive`].
    pub(crate) fn mbarrier_arrive(&self, bar: IntValue<'ctx>) -> R<()> {
        self.bld().mbarrier_arrive(bar)
    }
    /// [`KernelBuilder::setmaxnreg`].
    pub(crate) fn setmaxnreg(&self, inc: bool, regs: u32) -> R<()> {
        self.bld().setmaxnreg(inc, regs)
    }
    /// [`KernelBuilder::mbarrier_wait_parity`].
    pub(crate) fn mbarrier_wait_parity(&self, bar: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
        self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?.mbarrier_wait_parity(bar, parity)
    }
    /// [`KernelBuilder::tma_load`] from tensor map `map` ([`Kit::tensor_map`]).
    pub(crate) fn tma_load(&self, dst: IntValue<'ctx>, map: usize, coords: &[IntValue<'ctx>], bar: IntValue<'ctx>) -> R<()> {
        let m = self.tensor_map(map)?;
        self.bld().tma_load(dst, m, coords, bar)
    }
    /// The shared-memory address (i32, in the CTA's shared window) of `p`.
    pub(crate) fn smem_addr(&self, p: PointerValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_ptr_to_int(p, self.i32t, "saddr")?)
    }
    /// [`KernelBuilder::cp_async_commit`].
    pub(crate) fn cp_async_commit(&self) -> R<()> {
        self.bld().cp_async_commit()
    }
    /// [`KernelBuilder::cp_async_wait`].
    pub(crate) fn cp_async_wait(&self, n: u32) -> R<()> {
        self.bld().cp_async_wait(n)
    }
    /// [`KernelBuilder::ldmatrix_x4`].
    pub(crate) fn ldmatrix_x4(&self, p: PointerValue<'ctx>, trans: bool) -> R<[IntValue<'ctx>; 4]> {
        self.bld().ldmatrix_x4(p, trans)
    }
    /// [`KernelBuilder::mma_m16n8k16`].
    pub(crate) fn mma(&self, dt: DType, a: [IntValue<'ctx>; 4], b: [IntValue<'ctx>; 2], c: [FloatValue<'ctx>; 4]) -> R<[FloatValue<'ctx>; 4]> {
        self.bld().mma_m16n8k16(dt, a, b, c)
    }
    /// Logical shift right.
    pub(crate) fn lshr(&self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_right_shift(a, a.get_type().const_int(u64::from(s), false), false, "")?)
    }
    /// Shift left.
    pub(crate) fn shl(&self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_left_shift(a, a.get_type().const_int(u64::from(s), false), "")?)
    }

    /// Butterfly reduction over lanes differing in the bits of `masks` (16, 8, 4, 2, 1 for
    /// the whole warp): every lane ends with the same result.
    pub(crate) fn warp_reduce(
        &self,
        mut v: FloatValue<'ctx>,
        masks: &[u32],
        op: impl Fn(&Self, FloatValue<'ctx>, FloatValue<'ctx>) -> R<FloatValue<'ctx>>,
    ) -> R<FloatValue<'ctx>> {
        for &m in masks {
            let o = self.shfl_xor(v, m)?;
            v = op(self, v, o)?;
        }
        Ok(v)
    }

    // ---- types and memory ------------------------------------------------------------
    /// The LLVM type of a float dtype's elements.
    pub(crate) fn float_type(&self, dt: DType) -> R<FloatType<'ctx>> {
        match dt {
            DType::BF16 | DType::F16 | DType::F32 => Ok(self.bld().float_type(dt)),
            other => Err(self.err(format!("{other} is not a float dtype"))),
        }
    }


    /// `&ptr[idx]` for elements of type `ty`.
    pub(crate) fn gep(&self, ty: BasicTypeEnum<'ctx>, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        self.bld().gep(ty, ptr, idx)
    }

    /// Loads `n` consecutive elements of float dtype `dt` at `ptr[idx..]` as f32s, as one
    /// vector access of `n · size` bytes aligned to that (the caller has proven it).
    pub(crate) fn load_vec(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>, n: u32) -> R<Vec<FloatValue<'ctx>>> {
        let et = self.float_type(dt)?;
        let p = self.gep(et.into(), ptr, idx)?;
        let es = dt.size_bytes() as u32;
        let kb = self.bld();
        if n == 1 {
            let v = kb.load(et.into(), p, es)?.into_float_value();
            return Ok(vec![kb.to_f32(v)?]);
        }
        let v = kb.load(et.vec_type(n).into(), p, es * n)?.into_vector_value();
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let e = kb.b.build_extract_element(v, self.i32c(i as i32), "")?.into_float_value();
            out.push(kb.to_f32(e)?);
        }
        Ok(out)
    }

    /// Stores f32s, rounded to `dt`, at `ptr[idx..]` as one vector access (aligned as
    /// [`Kit::load_vec`] requires).
    pub(crate) fn store_vec(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>, vals: &[FloatValue<'ctx>]) -> R<()> {
        let et = self.float_type(dt)?;
        let p = self.gep(et.into(), ptr, idx)?;
        let es = dt.size_bytes() as u32;
        let n = vals.len() as u32;
        let kb = self.bld();
        if n == 1 {
            let v = kb.from_f32(vals[0], dt)?;
            return kb.store(p, v.into(), es);
        }
        let mut v = et.vec_type(n).get_poison();
        for (i, &x) in vals.iter().enumerate() {
            let e = kb.from_f32(x, dt)?;
            v = kb.b.build_insert_element(v, e, self.i32c(i as i32), "")?;
        }
        kb.store(p, v.into(), es * n)
    }

    /// Loads `n` elements of `dt` (as f32s) that are `stride` elements apart, starting at
    /// `ptr[idx]`, one scalar access each.
    pub(crate) fn load_strided(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>, stride: IntValue<'ctx>, n: u32) -> R<Vec<FloatValue<'ctx>>> {
        let mut out = Vec::with_capacity(n as usize);
        let mut at = idx;
        for i in 0..n {
            if i > 0 {
                at = self.add(at, stride)?;
            }
            out.extend(self.load_vec(dt, ptr, at, 1)?);
        }
        Ok(out)
    }

    /// Loads one i32 at `ptr[idx]`.
    pub(crate) fn load_i32(&self, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let p = self.gep(self.i32t.into(), ptr, idx)?;
        Ok(self.bld().load(self.i32t.into(), p, 4)?.into_int_value())
    }


    /// A shared-memory block of `bytes` bytes, 16-byte aligned: a static `.shared` array
    /// for [`SharedKind::Static`], the dynamic `extern .shared` area otherwise.
    pub(crate) fn shared(&self, kind: SharedKind, bytes: u32) -> R<PointerValue<'ctx>> {
        let i8t = self.ctx.i8_type();
        match kind {
            SharedKind::Static => Ok(self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?.shared_array(i8t.into(), bytes.max(16), 16, "smem")),
            SharedKind::Dynamic(_) => {
                let kb = self.bld();
                let g = kb.module.add_global(i8t.array_type(0), Some(AddressSpace::from(ADDRESS_SPACE_SHARED)), "smem_dyn");
                g.set_linkage(Linkage::External);
                g.set_alignment(16);
                Ok(g.as_pointer_value())
            }
        }
    }

    /// Raises the dynamic shared memory's declared alignment to `align` bytes (after
    /// [`Kit::shared`] with [`SharedKind::Dynamic`]).
    pub(crate) fn align_dynamic_shared(&self, align: u32) -> R<()> {
        let kb = self.bld();
        let g = kb.module.get_global("smem_dyn").ok_or_else(|| self.err("no dynamic shared memory"))?;
        g.set_alignment(align);
        Ok(())
    }

    /// `&ptr[idx]` for elements of float dtype `dt` (or the bytes of `f8e4m3`), as a plain
    /// (not `inbounds`) GEP: the result may lie outside the object (a pre-offset base that
    /// later indices bring back).
    pub(crate) fn gep_raw(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let ty: BasicTypeEnum<'ctx> = if dt.is_fp8() { self.ctx.i8_type().into() } else { self.float_type(dt)?.into() };
        // SAFETY (of the IR, not of Rust): nothing is dereferenced here.
        Ok(unsafe { self.bld().b.build_gep(ty, ptr, &[idx], "") }?)
    }

    /// A byte offset into shared memory: `&base[off]` (i32 offset).
    pub(crate) fn sh_at(&self, base: PointerValue<'ctx>, byte_off: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        self.gep(self.ctx.i8_type().into(), base, byte_off)
    }

    /// `n` consecutive f32-converted elements of `dt` from shared memory at `p`, one
    /// vector access aligned to its size.
    pub(crate) fn sh_load(&self, dt: DType, p: PointerValue<'ctx>, n: u32) -> R<Vec<FloatValue<'ctx>>> {
        self.load_vec(dt, p, self.i32c(0), n)
    }

    /// Stores f32s rounded to `dt` into shared memory at `p` (one vector access).
    pub(crate) fn sh_store(&self, dt: DType, p: PointerValue<'ctx>, vals: &[FloatValue<'ctx>]) -> R<()> {
        self.store_vec(dt, p, self.i32c(0), vals)
    }

    // ---- variables and control flow --------------------------------------------------
    /// A mutable f32 (a prologue alloca, promoted to a register by SROA) set to `init`.
    pub(crate) fn var_f(&self, init: FloatValue<'ctx>) -> R<PointerValue<'ctx>> {
        let ty = self.f32t;
        let p = self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)))?;
        self.set(p, init.into())?;
        Ok(p)
    }
    /// A private (per-thread) slot for one element of float dtype `dt`: a prologue
    /// alloca, which SROA removes when every access is a plain store then load.
    pub(crate) fn private_slot(&self, dt: DType) -> R<PointerValue<'ctx>> {
        self.private_slots(dt, 1)
    }
    /// A private slot for `n` consecutive elements of float dtype `dt` (a vector, aligned
    /// to its size), as [`Kit::private_slot`].
    pub(crate) fn private_slots(&self, dt: DType, n: u32) -> R<PointerValue<'ctx>> {
        let ty = self.float_type(dt)?;
        if n == 1 {
            return self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)));
        }
        self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty.vec_type(n), "")?)))
    }
    /// A mutable integer of `init`'s type (a prologue alloca, promoted by SROA).
    pub(crate) fn var_i(&self, init: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let ty = init.get_type();
        let p = self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)))?;
        self.set(p, init.into())?;
        Ok(p)
    }
    /// Reads an integer variable of type `ty`.
    pub(crate) fn get_i(&self, p: PointerValue<'ctx>, ty: IntType<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.bld().b.build_load(ty, p, "")?.into_int_value())
    }

    /// Runs `f` on the builder with a [`SizeTable`] of the kernel's size parameters (what
    /// the shared element evaluator needs: `kernels::view`'s `Kit::with_eval`). Kit methods
    /// must not be called inside `f` (it holds the builder).
    pub(crate) fn with_sizes<T>(&self, f: impl FnOnce(&mut KernelBuilder<'ctx>, &mut SizeTable<'ctx>) -> R<T>) -> R<T> {
        let mut kb = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?;
        let mut sizes = SizeTable::fixed(self.sizes.clone(), self.first_size(), true);
        f(&mut kb, &mut sizes)
    }

    pub(crate) fn set(&self, p: PointerValue<'ctx>, v: BasicValueEnum<'ctx>) -> R<()> {
        self.bld().b.build_store(p, v)?;
        Ok(())
    }
    pub(crate) fn get_f(&self, p: PointerValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.bld().b.build_load(self.f32t, p, "")?.into_float_value())
    }

    fn block(&self, name: &str) -> BasicBlock<'ctx> {
        self.bld().block(name)
    }
    fn here(&self) -> R<BasicBlock<'ctx>> {
        self.bld().current_block()
    }

    /// `for (i = start; i < end; i += step) body(i)` on integers of `start`'s type
    /// (signed compare). The body may build any control flow.
    pub(crate) fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        body: impl FnOnce(&Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let pre = self.here()?;
        let head = self.block("loop");
        let bodyb = self.block("body");
        let exit = self.block("endloop");
        self.bld().br(head)?;
        self.bld().position(head);
        let phi = self.bld().b.build_phi(start.get_type(), "i")?;
        let i = phi.as_basic_value().into_int_value();
        let c = self.icmp(IntPredicate::SLT, i, end)?;
        self.bld().cond_br(c, bodyb, exit)?;
        self.bld().position(bodyb);
        body(self, i)?;
        let next = self.add(i, step)?;
        let latch = self.here()?;
        self.bld().br(head)?;
        phi.add_incoming(&[(&start, pre), (&next, latch)]);
        self.bld().position(exit);
        Ok(())
    }

    /// `if cond { then() }`.
    pub(crate) fn if_then(&self, cond: IntValue<'ctx>, then: impl FnOnce(&Self) -> R<()>) -> R<()> {
        let tb = self.block("then");
        let done = self.block("endif");
        self.bld().cond_br(cond, tb, done)?;
        self.bld().position(tb);
        then(self)?;
        self.bld().br(done)?;
        self.bld().position(done);
        Ok(())
    }

    /// `if cond { body(); return }`: the threads for which `cond` holds run `body` and
    /// leave the kernel (the producer warpgroup of a warp-specialised kernel, whose
    /// registers then never meet the consumers' code).
    pub(crate) fn return_if(&self, cond: IntValue<'ctx>, body: impl FnOnce(&Self) -> R<()>) -> R<()> {
        let tb = self.block("leave");
        let cont = self.block("stay");
        self.bld().cond_br(cond, tb, cont)?;
        self.bld().position(tb);
        body(self)?;
        self.bld().ret()?;
        self.bld().position(cont);
        Ok(())
    }

    /// `if cond { then() } else { other() }`.
    pub(crate) fn if_else(
        &self,
        cond: IntValue<'ctx>,
        then: impl FnOnce(&Self) -> R<()>,
        other: impl FnOnce(&Self) -> R<()>,
    ) -> R<()> {
        let tb = self.block("then");
        let eb = self.block("else");
        let done = self.block("endif");
        self.bld().cond_br(cond, tb, eb)?;
        self.bld().position(tb);
        then(self)?;
        self.bld().br(done)?;
        self.bld().position(eb);
        other(self)?;
        self.bld().br(done)?;
        self.bld().position(done);
        Ok(())
    }

    /// `n` elements of `dt` at `ptr[idx..]` as f32s when `valid`, else zeros; `vector`
    /// says one aligned vector access is proven safe, otherwise `n` scalar accesses
    /// `stride` apart. Nothing is read when `valid` is false.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn guarded_load(
        &self,
        valid: IntValue<'ctx>,
        dt: DType,
        ptr: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
        n: u32,
        vector: bool,
        stride: IntValue<'ctx>,
    ) -> R<Vec<FloatValue<'ctx>>> {
        let vars: Vec<PointerValue> = (0..n).map(|_| self.var_f(self.f32c(0.0))).collect::<R<_>>()?;
        self.if_then(valid, |k| {
            let vals = if vector { k.load_vec(dt, ptr, idx, n)? } else { k.load_strided(dt, ptr, idx, stride, n)? };
            for (p, v) in vars.iter().zip(vals) {
                k.set(*p, v.into())?;
            }
            Ok(())
        })?;
        vars.iter().map(|&p| self.get_f(p)).collect()
    }

    /// Closes the kernel, runs `default<O3>` and returns the PTX.
    pub(crate) fn finish(self) -> R<String> {
        let kb = self.kb.into_inner();
        kb.ret()?;
        kb.finish()
    }
}


/// The non-constant dims among `dims`, each once, in order.
pub(crate) fn dims_of(dims: &[Dim]) -> Vec<Dim> {
    let mut out: Vec<Dim> = Vec::new();
    for d in dims {
        if d.as_const().is_none() && !out.contains(d) {
            out.push(d.clone());
        }
    }
    out
}

/// The one build-twice mechanism of the code generator. A kernel takes one i64 parameter per
/// symbolic size its code reads, and which sizes those are is known only once the code is
/// built; so `pass` builds the kernel with the size parameters it is given and returns what
/// it built and the sizes the code read. The first pass gets `first` (`None`: no size
/// parameters, the code collecting the sizes it asks for; `Some`: a superset); when the sizes
/// read are not exactly `first`, the kernel is built again with them, and that second pass
/// must read as many.
fn two_passes<K>(first: Option<Vec<Dim>>, pass: impl Fn(Option<&[Dim]>) -> R<(K, Vec<Dim>)>) -> R<(K, Vec<Dim>)> {
    let (built, needed) = pass(first.as_deref())?;
    if first.as_deref() == Some(needed.as_slice()) {
        return Ok((built, needed));
    }
    drop(built);
    let (built, again) = pass(Some(&needed))?;
    if again.len() != needed.len() {
        return Err(CodegenError::Builder("the second pass asked for other sizes than the first".into()));
    }
    Ok((built, needed))
}

/// Builds a kernel on a bare [`KernelBuilder`] with the buffer parameters `kinds` (the
/// families on the shared element evaluator: pointwise, row reductions, `kv_append`): a first
/// pass learns the symbolic sizes `emit` asks for ([`SizeTable::collecting`]), a second builds
/// with exactly those as `i64` parameters after the buffers ([`two_passes`]). Returns the PTX
/// and the parameter list (buffers `0..n`, then the sizes). `wide`: 64-bit size values.
pub(crate) fn build_twice(
    kinds: &[ParamKind],
    target: &Target,
    entry: &str,
    max_threads: u32,
    wide: bool,
    emit: impl for<'c> Fn(&mut KernelBuilder<'c>, &mut SizeTable<'c>) -> R<()>,
) -> R<(String, Vec<KernelParam>)> {
    build_twice_occupancy(kinds, target, entry, max_threads, 1, wide, emit)
}

/// As [`build_twice`], asking ptxas to fit at least `min_ctas` CTAs on an SM (see
/// [`KernelBuilder::set_min_ctas_per_sm`]); `min_ctas` 1 is [`build_twice`].
pub(crate) fn build_twice_occupancy(
    kinds: &[ParamKind],
    target: &Target,
    entry: &str,
    max_threads: u32,
    min_ctas: u32,
    wide: bool,
    emit: impl for<'c> Fn(&mut KernelBuilder<'c>, &mut SizeTable<'c>) -> R<()>,
) -> R<(String, Vec<KernelParam>)> {
    let context = Context::create();
    let (kb, dims) = two_passes(None, |sizes| {
        let Some(dims) = sizes else {
            let mut kb = KernelBuilder::new(&context, entry, kinds, *target)?;
            let mut table = SizeTable::collecting(wide);
            emit(&mut kb, &mut table)?;
            return Ok((kb, table.dims().to_vec()));
        };
        let mut all = kinds.to_vec();
        all.extend(std::iter::repeat_n(ParamKind::Size, dims.len()));
        let mut kb = KernelBuilder::new(&context, entry, &all, *target)?;
        kb.set_max_threads(max_threads);
        if max_threads < 1024 {
            // See `set_min_ctas_per_sm`: keeps ptxas from spilling to reach full occupancy. (At
            // 1024 threads the register cap is 64 either way, and the hint makes ptxas schedule
            // more aggressively into it.)
            kb.set_min_ctas_per_sm(min_ctas.max(1));
        }
        let mut table = SizeTable::fixed(dims.to_vec(), kinds.len(), wide);
        emit(&mut kb, &mut table)?;
        Ok((kb, table.dims().to_vec()))
    })?;
    let ptx = kb.finish()?;
    let mut params: Vec<KernelParam> = (0..kinds.len()).map(KernelParam::Buffer).collect();
    params.extend(dims.into_iter().map(KernelParam::Size));
    Ok((ptx, params))
}
