//! Building one kernel's LLVM IR: the shared helpers every kernel family uses.
//!
//! [`KernelBuilder`] wraps an inkwell module, builder and kernel function and knows the NVPTX
//! conventions that LLVM 22 expects (checked against its `IntrinsicsNVVM.td` and with ptxas
//! 12.9):
//!
//! - **Kernels** are functions with the `PTX_Kernel` calling convention
//!   ([`crate::PTX_KERNEL_CALL_CONV`], 71); no `nvvm.annotations` metadata is needed. The
//!   launch bound (`.maxntid`, which lets ptxas budget registers for the block size) is the
//!   string function attribute `"nvvm.maxntid"` ([`KernelBuilder::set_max_threads`]).
//! - **Pointers**: buffers are `ptr addrspace(1)` parameters (global memory); shared memory is
//!   a module global in `addrspace(3)` ([`KernelBuilder::shared_array`]). A read-only input is
//!   marked `noalias readonly`, which lets the back end use the non-coherent load path
//!   (`ld.global.nc`, the read-only data cache).
//! - **Indices**: thread and block indices come from `llvm.nvvm.read.ptx.sreg.*` (32 bits,
//!   [`KernelBuilder::tid_x`] …); index arithmetic is done in 64 bits wherever a tensor may
//!   exceed 2³¹ elements (the generators pick the width, see
//!   `kernels::element::IndexWidth`).
//! - **Floats**: `bf16`/`f16` are stored as LLVM `bfloat`/`half` and computed in `f32`:
//!   [`KernelBuilder::to_f32`] extends, [`KernelBuilder::from_f32`] rounds to nearest even
//!   (`fptrunc`, which the back end emits as `cvt.rn.bf16.f32` / `cvt.rn.f16.f32`), and
//!   [`KernelBuilder::round_to`] does both, which is how an op's result is "rounded to its
//!   dtype" in a fused kernel.
//! - **Warps and blocks**: butterfly shuffles [`KernelBuilder::shfl_bfly_f32`] (`llvm.nvvm.
//!   shfl.sync.bfly.f32` → `shfl.sync.bfly.b32`, PTX ISA §9.7.8.6; CUDA C Programming Guide
//!   §7.22 "Warp Shuffle Functions"), a warp all-reduce built from them
//!   ([`KernelBuilder::warp_allreduce_f32`]) and the CTA barrier [`KernelBuilder::barrier`]
//!   (`llvm.nvvm.barrier.cta.sync.aligned.all(0)` → `bar.sync 0`).
//! - **Math**: `KernelBuilder` implements [`Ops`], so the functions of [`crate::math`]
//!   (`exp`, `log`, `tanh`, `erf`, `sincos`, `pow`, …) emit straight into the kernel.
//! - **Sizes**: a kernel's symbolic sizes are `i64` parameters after the buffers; a
//!   [`SizeTable`] hands out one per distinct non-constant [`Dim`] a generator asks for, and
//!   the generators build each kernel twice — once to learn which sizes it needs, once with
//!   exactly those parameters (see [`SizeTable`]).
//! - **Finishing**: [`KernelBuilder::finish`] runs LLVM's `default<O3>` pipeline for the
//!   target (CSE, LICM, instcombine, unrolling of the constant-trip loops the generators emit)
//!   and the NVPTX back end, and returns the PTX.
//!
//! A matmul or attention generator uses it like this (a sketch):
//!
//! ```no_run
//! # use sinter_codegen::emit::{KernelBuilder, ParamKind};
//! # use sinter_codegen::target::Target;
//! # fn main() -> Result<(), sinter_codegen::CodegenError> {
//! let cx = inkwell::context::Context::create();
//! let params = [ParamKind::input(), ParamKind::output(), ParamKind::Size];
//! let mut kb = KernelBuilder::new(&cx, "k0_example", &params, Target::SM_90A)?;
//! kb.set_max_threads(256);
//! let (x, y, n) = (kb.param_ptr(0)?, kb.param_ptr(1)?, kb.param_int(2)?);
//! let tid = kb.tid_x()?;
//! // ... kb.b (the inkwell builder) and the helpers below ...
//! kb.ret()?;
//! let ptx = kb.finish()?;
//! # let _ = (x, y, n, tid, ptx); Ok(()) }
//! ```

use std::collections::HashMap;

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::types::{AnyType, BasicMetadataTypeEnum, BasicType, BasicTypeEnum, FloatType};
use inkwell::values::{BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim};

use crate::math::{Ops, R};
use crate::target::Target;
use crate::{CodegenError, ADDRESS_SPACE_GLOBAL, ADDRESS_SPACE_SHARED, PTX_KERNEL_CALL_CONV};

/// The kind of one kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A pointer to global memory (`ptr addrspace(1)`).
    Global {
        /// The kernel only reads through it (`readonly`).
        read_only: bool,
        /// No other parameter points into the same memory (`noalias`): promise it only when
        /// the runtime passes distinct buffers (true for every family but `KvAppend`, whose
        /// output pages are its input pages).
        no_alias: bool,
    },
    /// An `i64` (a size evaluated by the runtime: [`sinter_ir::KernelParam::Size`]).
    Size,
    /// A TMA tensor map passed by value ([`sinter_ir::KernelParam::TensorMap`]): `ptr
    /// byval([128 x i8]) align 64` marked `"nvvm.grid_constant"`, so that the kernel takes
    /// its address in the parameter space (`cvta.param`) instead of copying it to local
    /// memory — the address `cp.async.bulk.tensor` needs (CUDA's `__grid_constant__`).
    TensorMap,
}

impl ParamKind {
    /// A read-only input buffer that aliases nothing (`noalias readonly`).
    pub fn input() -> ParamKind {
        ParamKind::Global { read_only: true, no_alias: true }
    }

    /// An output buffer that aliases nothing (`noalias`).
    pub fn output() -> ParamKind {
        ParamKind::Global { read_only: false, no_alias: true }
    }
}

/// How per-thread partial values are combined in a warp or block reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Combine {
    /// `a + b`.
    Sum,
    /// NaN-propagating maximum (`llvm.maximum` → `max.NaN.f32`): NaN if either is NaN.
    Max,
    /// NaN-propagating minimum.
    Min,
}

/// One kernel under construction: the LLVM context, module, builder and kernel function.
///
/// The function has an entry block (the *prologue*, left open until [`KernelBuilder::finish`])
/// where sizes and other loop-invariant values are computed, and a body that starts in the
/// block the builder is positioned at after [`KernelBuilder::new`].
pub struct KernelBuilder<'ctx> {
    /// The LLVM context.
    pub cx: &'ctx Context,
    /// The module holding the kernel (and its shared-memory and constant globals).
    pub module: Module<'ctx>,
    /// The instruction builder; positioned in the body.
    pub b: Builder<'ctx>,
    /// The kernel function.
    pub func: FunctionValue<'ctx>,
    /// The target.
    pub target: Target,
    prologue: BasicBlock<'ctx>,
    body: BasicBlock<'ctx>,
    sregs: HashMap<&'static str, IntValue<'ctx>>,
    globals: usize,
}

/// The LLVM storage type of a dtype: `bfloat`, `half`, `float`, `i32`, `i64`, `i8` (bool, and
/// the bytes of the block-quantized types and of `f8e4m3`, which only the fp8 matmul reads).
pub fn storage_type<'ctx>(cx: &'ctx Context, dtype: DType) -> BasicTypeEnum<'ctx> {
    match dtype {
        DType::BF16 => cx.bf16_type().into(),
        DType::F16 => cx.f16_type().into(),
        DType::F32 => cx.f32_type().into(),
        DType::I32 => cx.i32_type().into(),
        DType::I64 => cx.i64_type().into(),
        DType::Bool | DType::Q8_0 | DType::Q4_1 | DType::F8E4M3 => cx.i8_type().into(),
    }
}

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

fn basic<'ctx>(v: Option<BasicValueEnum<'ctx>>, what: &str) -> R<BasicValueEnum<'ctx>> {
    v.ok_or_else(|| CodegenError::Builder(format!("{what} returned no value")))
}

impl<'ctx> KernelBuilder<'ctx> {
    /// Creates module `name` with one kernel `name` taking `params` (`ptr addrspace(1)` or
    /// `i64`, in order), an open prologue block and a body block the builder is positioned in.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] if LLVM refuses a step.
    pub fn new(cx: &'ctx Context, name: &str, params: &[ParamKind], target: Target) -> R<KernelBuilder<'ctx>> {
        let module = cx.create_module(name);
        let b = cx.create_builder();
        let gptr = cx.ptr_type(AddressSpace::from(ADDRESS_SPACE_GLOBAL));
        let tys: Vec<BasicMetadataTypeEnum<'ctx>> = params
            .iter()
            .map(|p| match p {
                ParamKind::Global { .. } => gptr.into(),
                ParamKind::Size => cx.i64_type().into(),
                ParamKind::TensorMap => cx.ptr_type(AddressSpace::default()).into(),
            })
            .collect();
        let func = module.add_function(name, cx.void_type().fn_type(&tys, false), None);
        func.set_call_conventions(PTX_KERNEL_CALL_CONV);
        for (i, p) in params.iter().enumerate() {
            if *p == ParamKind::TensorMap {
                let loc = AttributeLoc::Param(i as u32);
                let bytes = cx.i8_type().array_type(128);
                func.add_attribute(loc, cx.create_type_attribute(Attribute::get_named_enum_kind_id("byval"), bytes.as_any_type_enum()));
                func.add_attribute(loc, cx.create_enum_attribute(Attribute::get_named_enum_kind_id("align"), 64));
                func.add_attribute(loc, cx.create_string_attribute("nvvm.grid_constant", ""));
            }
            if let ParamKind::Global { read_only, no_alias } = *p {
                let loc = AttributeLoc::Param(i as u32);
                if no_alias {
                    func.add_attribute(loc, cx.create_enum_attribute(Attribute::get_named_enum_kind_id("noalias"), 0));
                }
                if read_only {
                    func.add_attribute(loc, cx.create_enum_attribute(Attribute::get_named_enum_kind_id("readonly"), 0));
                }
            }
        }
        let prologue = cx.append_basic_block(func, "prologue");
        let body = cx.append_basic_block(func, "body");
        b.position_at_end(body);
        Ok(KernelBuilder { cx, module, b, func, target, prologue, body, sregs: HashMap::new(), globals: 0 })
    }

    /// Declares the kernel's launch bound: at most `n` threads per block (`.maxntid n, 1, 1`).
    /// ptxas then keeps the register count low enough for `n` threads (≤ 64 for 1024).
    pub fn set_max_threads(&self, n: u32) {
        self.func.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("nvvm.maxntid", &n.to_string()));
    }

    /// Declares that at least `n` CTAs of this kernel should fit on one SM (`.minnctapersm
    /// n`, the function attribute `"nvvm.minctasm"`). With `n = 1` this only restates what
    /// any launch needs, but it changes ptxas's register heuristic: without it ptxas (12.9,
    /// sm_80) may cap a 256-thread kernel at 32 registers and spill a few bytes to reach full
    /// occupancy; with it, it uses the registers it needs (the generators of this crate set
    /// 1 and their tests assert zero spills).
    pub fn set_min_ctas_per_sm(&self, n: u32) {
        self.func.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("nvvm.minctasm", &n.to_string()));
    }

    /// Parameter `i` as a global pointer.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] if it is not one.
    pub fn param_ptr(&self, i: usize) -> R<PointerValue<'ctx>> {
        match self.func.get_nth_param(i as u32) {
            Some(BasicValueEnum::PointerValue(p)) => Ok(p),
            _ => Err(CodegenError::Builder(format!("kernel parameter {i} is not a pointer"))),
        }
    }

    /// Parameter `i` as an integer.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] if it is not one.
    pub fn param_int(&self, i: usize) -> R<IntValue<'ctx>> {
        match self.func.get_nth_param(i as u32) {
            Some(BasicValueEnum::IntValue(p)) => Ok(p),
            _ => Err(CodegenError::Builder(format!("kernel parameter {i} is not an integer"))),
        }
    }

    /// Runs `f` with the builder at the end of the prologue (the entry block), then returns
    /// to where it was. Values made there dominate the whole body.
    ///
    /// # Errors
    /// Those of `f`; [`CodegenError::Builder`] if the current position is lost.
    pub fn in_prologue<T>(&mut self, f: impl FnOnce(&mut Self) -> R<T>) -> R<T> {
        let here = self.b.get_insert_block().ok_or_else(|| CodegenError::Builder("builder is not positioned".into()))?;
        self.b.position_at_end(self.prologue);
        let r = f(self);
        self.b.position_at_end(here);
        r
    }

    /// A new basic block at the end of the function.
    pub fn block(&self, name: &str) -> BasicBlock<'ctx> {
        self.cx.append_basic_block(self.func, name)
    }

    /// The block the builder is in.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] if the builder is not positioned.
    pub fn current_block(&self) -> R<BasicBlock<'ctx>> {
        self.b.get_insert_block().ok_or_else(|| CodegenError::Builder("builder is not positioned".into()))
    }

    /// Continues emitting at the end of `bb`.
    pub fn position(&self, bb: BasicBlock<'ctx>) {
        self.b.position_at_end(bb);
    }

    /// `br bb`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn br(&self, bb: BasicBlock<'ctx>) -> R<()> {
        self.b.build_unconditional_branch(bb)?;
        Ok(())
    }

    /// `br c, t, f`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cond_br(&self, c: IntValue<'ctx>, t: BasicBlock<'ctx>, f: BasicBlock<'ctx>) -> R<()> {
        self.b.build_conditional_branch(c, t, f)?;
        Ok(())
    }

    /// `ret void`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn ret(&self) -> R<()> {
        self.b.build_return(None)?;
        Ok(())
    }

    /// Calls intrinsic `name` (overloaded on `types`, empty if not overloaded) with `args`;
    /// `None` for a void intrinsic.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] if LLVM does not know the intrinsic (a name LLVM 22 lacks
    /// fails here, not silently as an external call).
    pub fn intrinsic(&self, name: &str, types: &[BasicTypeEnum<'ctx>], args: &[BasicMetadataValueEnum<'ctx>]) -> R<Option<BasicValueEnum<'ctx>>> {
        let intr = Intrinsic::find(name).ok_or_else(|| CodegenError::Builder(format!("LLVM 22 has no intrinsic {name}")))?;
        let decl = intr
            .get_declaration(&self.module, types)
            .ok_or_else(|| CodegenError::Builder(format!("cannot declare {name} for {types:?}")))?;
        let call = self.b.build_call(decl, args, "")?;
        Ok(call.try_as_basic_value().basic())
    }

    /// Like [`KernelBuilder::intrinsic`] for an intrinsic that returns a value.
    ///
    /// # Errors
    /// As [`KernelBuilder::intrinsic`], and when it returns nothing.
    pub fn intrinsic_value(&self, name: &str, types: &[BasicTypeEnum<'ctx>], args: &[BasicMetadataValueEnum<'ctx>]) -> R<BasicValueEnum<'ctx>> {
        basic(self.intrinsic(name, types, args)?, name)
    }

    fn float_intr(&self, name: &str, args: &[FloatValue<'ctx>]) -> R<FloatValue<'ctx>> {
        let ty = args.first().map(|a| a.get_type()).ok_or_else(|| CodegenError::Builder(format!("{name} without arguments")))?;
        let args: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|&a| a.into()).collect();
        Ok(self.intrinsic_value(name, &[ty.into()], &args)?.into_float_value())
    }

    fn int_intr(&self, name: &str, args: &[IntValue<'ctx>]) -> R<IntValue<'ctx>> {
        let ty = args.first().map(|a| a.get_type()).ok_or_else(|| CodegenError::Builder(format!("{name} without arguments")))?;
        let args: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|&a| a.into()).collect();
        Ok(self.intrinsic_value(name, &[ty.into()], &args)?.into_int_value())
    }

    /// Reads special register `llvm.nvvm.read.ptx.sreg.<name>` (an `i32`), once per kernel
    /// (in the prologue).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn sreg(&mut self, name: &'static str) -> R<IntValue<'ctx>> {
        if let Some(v) = self.sregs.get(name) {
            return Ok(*v);
        }
        let full = format!("llvm.nvvm.read.ptx.sreg.{name}");
        let v = self.in_prologue(|kb| Ok(kb.intrinsic_value(&full, &[], &[])?.into_int_value()))?;
        self.sregs.insert(name, v);
        Ok(v)
    }

    /// `threadIdx.x`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn tid_x(&mut self) -> R<IntValue<'ctx>> {
        self.sreg("tid.x")
    }

    /// `blockDim.x`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn ntid_x(&mut self) -> R<IntValue<'ctx>> {
        self.sreg("ntid.x")
    }

    /// `blockIdx.x`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn ctaid_x(&mut self) -> R<IntValue<'ctx>> {
        self.sreg("ctaid.x")
    }

    /// `gridDim.x`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn nctaid_x(&mut self) -> R<IntValue<'ctx>> {
        self.sreg("nctaid.x")
    }

    /// An `i32` constant.
    pub fn i32c(&self, v: i64) -> IntValue<'ctx> {
        self.cx.i32_type().const_int(v as u64, true)
    }

    /// An `i64` constant.
    pub fn i64c(&self, v: i64) -> IntValue<'ctx> {
        self.cx.i64_type().const_int(v as u64, true)
    }

    /// An `f32` constant.
    pub fn f32c(&self, v: f32) -> FloatValue<'ctx> {
        self.cx.f32_type().const_float(v as f64)
    }

    /// An `f64` constant.
    pub fn f64c(&self, v: f64) -> FloatValue<'ctx> {
        self.cx.f64_type().const_float(v)
    }

    /// `&ptr[idx]` for elements of type `elem` (an in-bounds GEP).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn gep(&self, elem: BasicTypeEnum<'ctx>, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        // SAFETY (of the IR, not of Rust): every generator computes in-range indices.
        Ok(unsafe { self.b.build_in_bounds_gep(elem, ptr, &[idx], "p") }?)
    }

    /// Loads a `ty` from `ptr` with alignment `align` bytes.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn load(&self, ty: BasicTypeEnum<'ctx>, ptr: PointerValue<'ctx>, align: u32) -> R<BasicValueEnum<'ctx>> {
        let v = self.b.build_load(ty, ptr, "v")?;
        if let Some(i) = v.as_instruction_value() {
            i.set_alignment(align).map_err(|e| CodegenError::Builder(e.to_string()))?;
        }
        Ok(v)
    }

    /// Stores `v` to `ptr` with alignment `align` bytes.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn store(&self, ptr: PointerValue<'ctx>, v: BasicValueEnum<'ctx>, align: u32) -> R<()> {
        let st = self.b.build_store(ptr, v)?;
        st.set_alignment(align).map_err(|e| CodegenError::Builder(e.to_string()))?;
        Ok(())
    }

    /// A shared-memory array of `len` elements of `elem`, aligned to `align` bytes: a module
    /// global in `addrspace(3)` (PTX `.shared`), statically sized (≤ 48 KiB per kernel
    /// without opt-in). Returns its address.
    pub fn shared_array(&mut self, elem: BasicTypeEnum<'ctx>, len: u32, align: u32, name: &str) -> PointerValue<'ctx> {
        let ty = elem.array_type(len);
        self.globals += 1;
        let g = self.module.add_global(ty, Some(AddressSpace::from(ADDRESS_SPACE_SHARED)), &format!("{name}_{}", self.globals));
        g.set_linkage(Linkage::Internal);
        g.set_initializer(&ty.get_undef());
        g.set_alignment(align);
        g.as_pointer_value()
    }

    /// A constant table of `f64` in global memory (`.global`, read through `ld.global.nc`),
    /// for per-lane lookups (RoPE's inverse frequencies): constant memory would serialise a
    /// warp whose lanes read different entries.
    pub fn global_f64_table(&mut self, values: &[f64], name: &str) -> PointerValue<'ctx> {
        let f64t = self.cx.f64_type();
        let elems: Vec<FloatValue<'ctx>> = values.iter().map(|&v| f64t.const_float(v)).collect();
        let init = f64t.const_array(&elems);
        self.globals += 1;
        let g = self.module.add_global(init.get_type(), Some(AddressSpace::from(ADDRESS_SPACE_GLOBAL)), &format!("{name}_{}", self.globals));
        g.set_linkage(Linkage::Internal);
        g.set_constant(true);
        g.set_initializer(&init);
        g.set_alignment(16);
        g.as_pointer_value()
    }

    /// `v` passed through an inline-asm `mov`, so that LLVM cannot see its value: a loop
    /// bounded by a constant made opaque this way is not fully unrolled by `default<O3>`
    /// (which, for a long constant trip count, would hoist dozens of loads and exhaust the
    /// registers). ptxas sees through the `mov` and loses nothing.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn opaque(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.opaque_mov(v, false)
    }

    /// `v` through an inline-asm `mov`, marked as having side effects or not.
    fn opaque_mov(&self, v: IntValue<'ctx>, side_effects: bool) -> R<IntValue<'ctx>> {
        let t = v.get_type();
        let (asm, cons) = if t.get_bit_width() == 64 { ("mov.b64 $0, $1;", "=l,l") } else { ("mov.b32 $0, $1;", "=r,r") };
        let fty = t.fn_type(&[t.into()], false);
        let f = self.cx.create_inline_asm(fty, asm.to_owned(), cons.to_owned(), side_effects, false, None, false);
        let r = self.b.build_indirect_call(fty, f, &[v.into()], "opaque")?;
        Ok(basic(r.try_as_basic_value().basic(), "inline asm")?.into_int_value())
    }

    /// As [`KernelBuilder::opaque`], but the `mov` is marked as having side effects, so that
    /// LLVM also cannot move it, nor anything computed from it, out of the block it is
    /// emitted in: values derived from it are computed where they are used rather than
    /// hoisted out of an enclosing loop (e.g. a row loop that runs once) and kept live
    /// throughout it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn opaque_here(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.opaque_mov(v, true)
    }

    /// A CTA-wide barrier: `llvm.nvvm.barrier.cta.sync.aligned.all(0)` (`bar.sync 0`); every
    /// thread of the block must reach it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn barrier(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", &[], &[self.i32c(0).into()])?;
        Ok(())
    }

    // ---- tensor-core primitives (sm_80+) ---------------------------------------------------
    //
    // The building blocks of the Ampere-style tensor-core kernels (the matmul's
    // `MmaSchedule`, tensor-core attention): asynchronous global→shared copies, `ldmatrix`
    // fragment loads and the `m16n8k16` warp MMA. Each is one NVVM intrinsic of LLVM 22, so
    // the CPU emulator of the tests (`kernels::matmul::emu`) can model it.

    /// `cp.async.cg.shared.global [dst], [src], 16, src_bytes` (PTX ISA §9.7.9.3, "cp.async";
    /// `llvm.nvvm.cp.async.cg.shared.global.16.s`): starts an asynchronous copy of 16 bytes
    /// from global memory `src` (`ptr addrspace(1)`) to shared memory `dst`
    /// (`ptr addrspace(3)`), cached in L2 only (`.cg`). Only the first `src_bytes` (an `i32`,
    /// 0 ..= 16) are read, the rest of the 16 destination bytes are zero-filled: 0 reads
    /// nothing (the source address is not accessed), which predicates a copy off where its
    /// source lies outside a tensor, and 2·(elements left) zero-fills a tail. Both addresses
    /// must be 16-byte aligned.
    ///
    /// The copy is asynchronous: group the copies issued so far with
    /// [`KernelBuilder::cp_async_commit`], wait for groups with [`KernelBuilder::cp_async_wait`]
    /// (which covers only the calling thread's copies), then [`KernelBuilder::barrier`] before
    /// other threads read the data.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cp_async_16(&self, dst: PointerValue<'ctx>, src: PointerValue<'ctx>, src_bytes: IntValue<'ctx>) -> R<()> {
        self.intrinsic("llvm.nvvm.cp.async.cg.shared.global.16.s", &[], &[dst.into(), src.into(), src_bytes.into()])?;
        Ok(())
    }

    /// `cp.async.commit_group` (PTX ISA §9.7.9.3.2; `llvm.nvvm.cp.async.commit.group`): closes
    /// the calling thread's group of [`KernelBuilder::cp_async_16`] copies issued since the
    /// last commit (an empty group is fine and completes at once).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cp_async_commit(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.cp.async.commit.group", &[], &[])?;
        Ok(())
    }

    /// `cp.async.wait_group n` (PTX ISA §9.7.9.3.3; `llvm.nvvm.cp.async.wait.group`): waits
    /// until at most `n` of the calling thread's committed groups are still pending (the
    /// older ones have landed in shared memory). With a pipeline of `s` stages that commits
    /// one group per stage, `n = s − 2` makes the oldest stage ready.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cp_async_wait(&self, n: u32) -> R<()> {
        self.intrinsic("llvm.nvvm.cp.async.wait.group", &[], &[self.i32c(i64::from(n)).into()])?;
        Ok(())
    }

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

    /// A side-effecting inline-asm statement without operands (clobbering memory).
    fn asm_void(&self, text: &str) -> R<()> {
        let vt = self.cx.void_type().fn_type(&[], false);
        let f = self.cx.create_inline_asm(vt, text.to_owned(), "~{memory}".to_owned(), true, false, None, false);
        self.b.build_indirect_call(vt, f, &[], "")?;
        Ok(())
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

    /// `bar.red.or.pred` over the `count` threads (a multiple of 32) that reach named barrier
    /// `id` (an `i32`, 1..=15; 0 is the CTA barrier of [`KernelBuilder::barrier`]) (PTX ISA
    /// §9.7.13.1, "bar, barrier"): every one of them gets whether `flag` (an `i1`) holds in any
    /// of them — a barrier and a vote over, for instance, one warpgroup. Every thread counted
    /// must reach it, with the whole warp (`.aligned`).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn bar_red_or(&self, id: IntValue<'ctx>, count: u32, flag: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let fty = i32t.fn_type(&[i32t.into(), i32t.into()], false);
        let text = format!("{{\n.reg .pred p, q;\nsetp.ne.b32 p, $1, 0;\nbar.red.or.pred q, $2, {count}, p;\nselp.b32 $0, 1, 0, q;\n}}");
        let f = self.cx.create_inline_asm(fty, text, "=r,r,r,~{memory}".to_owned(), true, false, None, false);
        let x = self.b.build_int_z_extend(flag, i32t, "")?;
        let r = self.b.build_indirect_call(fty, f, &[x.into(), id.into()], "bar_red_or")?;
        let v = basic(r.try_as_basic_value().basic(), "bar_red_or")?.into_int_value();
        Ok(self.b.build_int_compare(inkwell::IntPredicate::NE, v, i32t.const_zero(), "")?)
    }

    /// `bar.sync id, count` (PTX ISA §9.7.13.1, "bar, barrier"): waits at named barrier `id`
    /// (an `i32`, 1..=15; 0 is the CTA barrier of [`KernelBuilder::barrier`]) until `count`
    /// threads (a multiple of 32) have arrived there, this warp's included — with
    /// [`KernelBuilder::bar_arrive`]s of other warps, a one-way signal between warpgroups
    /// (FlashAttention-3's warpgroup scheduling barriers, arXiv 2407.08608 §3.1).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn bar_sync(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_args(&format!("bar.sync $0, {count};"), "r", &[id.into()])
    }

    /// `bar.arrive id, count` (PTX ISA §9.7.13.1): this warp's arrival at named barrier `id`
    /// (an `i32`, 1..=15) of `count` threads, without waiting; the threads that wait there
    /// ([`KernelBuilder::bar_sync`]) are released once `count` have arrived.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn bar_arrive(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_args(&format!("bar.arrive $0, {count};"), "r", &[id.into()])
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

    /// A side-effecting inline-asm statement with input operands `args` under constraints
    /// `cons` (clobbering memory).
    fn asm_args(&self, text: &str, cons: &str, args: &[BasicMetadataValueEnum<'ctx>]) -> R<()> {
        let tys: Vec<BasicMetadataTypeEnum<'ctx>> = args
            .iter()
            .map(|a| match a {
                BasicMetadataValueEnum::IntValue(v) => Ok(v.get_type().into()),
                BasicMetadataValueEnum::PointerValue(v) => Ok(v.get_type().into()),
                _ => Err(CodegenError::Builder("an inline-asm operand that is not an integer or a pointer".into())),
            })
            .collect::<R<_>>()?;
        let fty = self.cx.void_type().fn_type(&tys, false);
        let f = self.cx.create_inline_asm(fty, text.to_owned(), format!("{cons},~{{memory}}"), true, false, None, false);
        self.b.build_indirect_call(fty, f, args, "")?;
        Ok(())
    }

    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16` (PTX ISA §9.7.14.5.15;
    /// `llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16` and its `.x1`/`.x2`/`.trans`
    /// variants): the warp loads `count` (1, 2 or 4) 8×8 matrices of 16-bit elements from
    /// shared memory. Lane `8·j + r` supplies `ptr`, the address of row `r` of matrix `j`
    /// (16 contiguous bytes, 16-byte aligned; lanes beyond `8·count` supply nothing); every
    /// lane receives one `i32` per matrix: without `trans`, lane `l` gets elements
    /// `(l/4, 2·(l%4))` and `(l/4, 2·(l%4)+1)` of matrix `j` (low half first); with `trans`,
    /// elements `(2·(l%4), l/4)` and `(2·(l%4)+1, l/4)` — the transposed matrix.
    ///
    /// These are the register fragments of `mma.m16n8k16` ([`KernelBuilder::mma_m16n8k16`]):
    /// a 16×16 A tile stored row-major (K contiguous) is one `x4` with lane `l` pointing at
    /// row `l % 16`, column `8·(l / 16)`; stored column-major (M contiguous), the same with
    /// `trans`. A 16(K)×16(N) B tile stored N-major (`[N, K]`, K contiguous) is one `x4` with
    /// lane `l` at row `(l % 8) + 8·(l / 16)`, column `8·((l / 8) % 2)`, giving the fragments
    /// of two n8 tiles; stored K-major (`[K, N]`) the same with `trans` and rows/columns
    /// swapped. All 32 lanes must execute it (`.sync.aligned`).
    ///
    /// # Errors
    /// [`CodegenError::Builder`], also for a `count` other than 1, 2, 4.
    pub fn ldmatrix(&self, ptr: PointerValue<'ctx>, count: u32, trans: bool) -> R<Vec<IntValue<'ctx>>> {
        if !matches!(count, 1 | 2 | 4) {
            return Err(CodegenError::Builder(format!("ldmatrix of {count} matrices")));
        }
        let name = format!("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{}.b16", if trans { ".trans" } else { "" });
        // Overloaded on the pointer (`.p3` for shared memory).
        let v = self.intrinsic_value(&name, &[ptr.get_type().into()], &[ptr.into()])?;
        if count == 1 {
            return Ok(vec![v.into_int_value()]);
        }
        let s = v.into_struct_value();
        (0..count).map(|i| Ok(self.b.build_extract_value(s, i, "frag")?.into_int_value())).collect()
    }

    /// [`KernelBuilder::ldmatrix`] of four matrices: the A fragment of one `m16n8k16`, or
    /// the B fragments of two.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn ldmatrix_x4(&self, ptr: PointerValue<'ctx>, trans: bool) -> R<[IntValue<'ctx>; 4]> {
        let v = self.ldmatrix(ptr, 4, trans)?;
        Ok([v[0], v[1], v[2], v[3]])
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` (PTX ISA
    /// §9.7.14.5.14; `llvm.nvvm.mma.m16n8k16.row.col.bf16` / `.f32.f32` for f16): the warp
    /// computes `D = A·B + C` for a 16×16 A (`dtype` bf16 or f16), a 16×8 B and f32 C, D,
    /// with products exact and sums in f32. With `g = lane / 4`, `t = lane % 4`, each lane
    /// holds (each `i32` two 16-bit elements, the lower column or row first):
    /// - `a[0]`: A(g, 2t..2t+1), `a[1]`: A(g+8, 2t..), `a[2]`: A(g, 2t+8..), `a[3]`: A(g+8, 2t+8..);
    /// - `b[0]`: B(2t..2t+1, g), `b[1]`: B(2t+8..2t+9, g);
    /// - `c[0]`, `c[1]`: C(g, 2t), C(g, 2t+1); `c[2]`, `c[3]`: C(g+8, 2t), C(g+8, 2t+1) — and D alike.
    ///
    /// [`KernelBuilder::ldmatrix`] loads A and B fragments in this layout; for an A made in
    /// registers (attention's P), [`KernelBuilder::pack_x2`] packs two f32s. All 32 lanes
    /// must execute it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`], also for a `dtype` other than bf16 and f16.
    pub fn mma_m16n8k16(&self, dtype: DType, a: [IntValue<'ctx>; 4], b: [IntValue<'ctx>; 2], c: [FloatValue<'ctx>; 4]) -> R<[FloatValue<'ctx>; 4]> {
        let name = match dtype {
            DType::BF16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            DType::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
            other => return Err(CodegenError::Builder(format!("mma.m16n8k16 of {other}"))),
        };
        let mut args: Vec<BasicMetadataValueEnum<'ctx>> = Vec::with_capacity(10);
        for x in a.iter().chain(&b) {
            if dtype == DType::F16 {
                let h2 = self.cx.f16_type().vec_type(2);
                args.push(self.b.build_bit_cast(*x, h2, "h2")?.into());
            } else {
                args.push((*x).into());
            }
        }
        args.extend(c.iter().map(|&x| BasicMetadataValueEnum::from(x)));
        let s = self.intrinsic_value(name, &[], &args)?.into_struct_value();
        let d = |i: u32| -> R<FloatValue<'ctx>> { Ok(self.b.build_extract_value(s, i, "d")?.into_float_value()) };
        Ok([d(0)?, d(1)?, d(2)?, d(3)?])
    }

    /// Two f32s rounded to nearest even into `dtype` (bf16 or f16) and packed into one `i32`
    /// (`lo` in bits 0–15, `hi` in 16–31): a register of an `mma` A or B fragment
    /// (`cvt.rn.bf16x2.f32` / `cvt.rn.f16x2.f32`, PTX ISA §9.7.9.21).
    ///
    /// # Errors
    /// [`CodegenError::Builder`], also for another `dtype`.
    pub fn pack_x2(&self, dtype: DType, lo: FloatValue<'ctx>, hi: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(CodegenError::Builder(format!("pack_x2 of {dtype}")));
        }
        let vt = self.float_type(dtype).vec_type(2);
        let mut v = vt.get_poison();
        for (i, x) in [lo, hi].into_iter().enumerate() {
            let r = self.from_f32(x, dtype)?;
            v = self.b.build_insert_element(v, r, self.i32c(i as i64), "p")?;
        }
        Ok(self.b.build_bit_cast(v, self.cx.i32_type(), "x2")?.into_int_value())
    }

    /// Four f32s rounded to nearest even into `f8e4m3` (OCP E4M3) with saturation to ±448 (NaN
    /// stays NaN) and packed into one `i32`, `x[0]` in bits 0–7 … `x[3]` in 24–31: two
    /// `cvt.rn.satfinite.e4m3x2.f32` (PTX ISA §9.7.9.21, sm_89+; the first source goes to the
    /// upper byte) and a `mov.b32` of the halves — a register of an e4m3 `wgmma` A fragment.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn pack_e4m3x4(&self, x: [FloatValue<'ctx>; 4]) -> R<IntValue<'ctx>> {
        let (i32t, f32t) = (self.cx.i32_type(), self.cx.f32_type());
        let fty = i32t.fn_type(&[f32t.into(); 4], false);
        let text = "{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\ncvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\nmov.b32 $0, {lo, hi};\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,f,f,f,f".to_owned(), false, false, None, false);
        let args: Vec<BasicMetadataValueEnum<'ctx>> = x.iter().map(|&v| v.into()).collect();
        let r = self.b.build_indirect_call(fty, f, &args, "e4m3x4")?;
        Ok(basic(r.try_as_basic_value().basic(), "inline asm")?.into_int_value())
    }

    /// The two `f8e4m3` values in the low 16 bits of `x` (an `i32`; bits 0–7 first) as f32s,
    /// exactly: `cvt.rn.f16x2.e4m3x2` (PTX ISA §9.7.9.21) then f16 → f32.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn e4m3x2_to_f32(&self, x: IntValue<'ctx>) -> R<[FloatValue<'ctx>; 2]> {
        let w = self.e4m3x2_to_f16x2(x)?;
        let h2 = self.b.build_bit_cast(w, self.cx.f16_type().vec_type(2), "h2")?.into_vector_value();
        let f32t = self.cx.f32_type();
        let e = |i: u64| -> R<FloatValue<'ctx>> {
            let h = self.b.build_extract_element(h2, self.cx.i32_type().const_int(i, false), "")?.into_float_value();
            Ok(self.b.build_float_ext(h, f32t, "")?)
        };
        Ok([e(0)?, e(1)?])
    }

    /// The two `f8e4m3` values in the low 16 bits of `x` (an `i32`; bits 0–7 first) widened
    /// exactly to an f16 pair, packed into an `i32` (the first in bits 0–15):
    /// `cvt.rn.f16x2.e4m3x2` (PTX ISA §9.7.9.21).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn e4m3x2_to_f16x2(&self, x: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let fty = i32t.fn_type(&[i32t.into()], false);
        let text = "{\n.reg .b16 h;\ncvt.u16.u32 h, $1;\ncvt.rn.f16x2.e4m3x2 $0, h;\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,r".to_owned(), false, false, None, false);
        let r = self.b.build_indirect_call(fty, f, &[x.into()], "e4m3x2")?;
        Ok(basic(r.try_as_basic_value().basic(), "inline asm")?.into_int_value())
    }

    /// The 4×4 byte transpose of `rows` (four `i32`s, byte `j` of row `i` = element `(i, j)`):
    /// word `j` of the result holds bytes `(0, j), (1, j), (2, j), (3, j)`, low byte first.
    /// Eight `prmt.b32` (PTX ISA §9.7.8.7), one inline-asm block.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn transpose_bytes_4x4(&self, rows: [IntValue<'ctx>; 4]) -> R<[IntValue<'ctx>; 4]> {
        let i32t = self.cx.i32_type();
        let out_ty = self.cx.struct_type(&[i32t.into(); 4], false);
        let fty = out_ty.fn_type(&[i32t.into(); 4], false);
        let text = "{\n.reg .b32 t0, t1, t2, t3;\nprmt.b32 t0, $4, $5, 0x5140;\nprmt.b32 t1, $4, $5, 0x7362;\nprmt.b32 t2, $6, $7, 0x5140;\nprmt.b32 t3, $6, $7, 0x7362;\nprmt.b32 $0, t0, t2, 0x5410;\nprmt.b32 $1, t0, t2, 0x7632;\nprmt.b32 $2, t1, t3, 0x5410;\nprmt.b32 $3, t1, t3, 0x7632;\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,=r,=r,=r,r,r,r,r".to_owned(), false, false, None, false);
        let args: Vec<BasicMetadataValueEnum<'ctx>> = rows.iter().map(|&v| v.into()).collect();
        let st = basic(self.b.build_indirect_call(fty, f, &args, "t4x4")?.try_as_basic_value().basic(), "inline asm")?.into_struct_value();
        let e = |i: u32| -> R<IntValue<'ctx>> { Ok(self.b.build_extract_value(st, i, "")?.into_int_value()) };
        Ok([e(0)?, e(1)?, e(2)?, e(3)?])
    }

    /// `vote.sync.any.pred p, pred, 0xffffffff` (PTX ISA §9.7.13.10; `llvm.nvvm.vote.any.sync`):
    /// whether `pred` (an `i1`) holds in any lane of the warp; every lane gets the answer, and
    /// ptxas knows it is warp-uniform (a branch on it is not divergent). All 32 lanes must
    /// take part.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn vote_any(&self, pred: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.intrinsic_value("llvm.nvvm.vote.any.sync", &[], &[self.i32c(-1).into(), pred.into()])?.into_int_value())
    }

    /// `vote.sync.ballot.b32 m, pred, 0xffffffff` (PTX ISA §9.7.13.10;
    /// `llvm.nvvm.vote.ballot.sync`): an `i32` whose bit `l` is `pred` (an `i1`) of lane `l`;
    /// every lane gets it. All 32 lanes must take part.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn vote_ballot(&self, pred: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.intrinsic_value("llvm.nvvm.vote.ballot.sync", &[], &[self.i32c(-1).into(), pred.into()])?.into_int_value())
    }

    /// `shfl.sync.bfly.b32 v, lane_mask, 0x1f, 0xffffffff`: the value of lane `lane ^ lane_mask`
    /// (all 32 lanes must take part).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn shfl_bfly_f32(&self, v: FloatValue<'ctx>, lane_mask: u32) -> R<FloatValue<'ctx>> {
        let args = [self.i32c(-1).into(), v.into(), self.i32c(lane_mask as i64).into(), self.i32c(0x1f).into()];
        Ok(self.intrinsic_value("llvm.nvvm.shfl.sync.bfly.f32", &[], &args)?.into_float_value())
    }

    /// [`KernelBuilder::shfl_bfly_f32`] for an `i32`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn shfl_bfly_i32(&self, v: IntValue<'ctx>, lane_mask: u32) -> R<IntValue<'ctx>> {
        let args = [self.i32c(-1).into(), v.into(), self.i32c(lane_mask as i64).into(), self.i32c(0x1f).into()];
        Ok(self.intrinsic_value("llvm.nvvm.shfl.sync.bfly.i32", &[], &args)?.into_int_value())
    }

    /// [`KernelBuilder::shfl_bfly_f32`] for an `i64` (two 32-bit shuffles).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn shfl_bfly_i64(&self, v: IntValue<'ctx>, lane_mask: u32) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let i64t = self.cx.i64_type();
        let lo = self.b.build_int_truncate(v, i32t, "lo")?;
        let hi = self.b.build_right_shift(v, self.i64c(32), false, "hi")?;
        let hi = self.b.build_int_truncate(hi, i32t, "hi")?;
        let lo = self.shfl_bfly_i32(lo, lane_mask)?;
        let hi = self.shfl_bfly_i32(hi, lane_mask)?;
        let lo = self.b.build_int_z_extend(lo, i64t, "lo")?;
        let hi = self.b.build_int_z_extend(hi, i64t, "hi")?;
        let hi = self.b.build_left_shift(hi, self.i64c(32), "hi")?;
        Ok(self.b.build_or(hi, lo, "v")?)
    }

    /// Combines two `f32` partials.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn combine_f32(&self, op: Combine, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        match op {
            Combine::Sum => Ok(self.b.build_float_add(a, b, "s")?),
            Combine::Max => self.float_intr("llvm.maximum", &[a, b]),
            Combine::Min => self.float_intr("llvm.minimum", &[a, b]),
        }
    }

    /// Combines two integer partials (sum wraps; the callers saturate afterwards).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn combine_int(&self, op: Combine, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        match op {
            Combine::Sum => Ok(self.b.build_int_add(a, b, "s")?),
            Combine::Max => self.int_intr("llvm.smax", &[a, b]),
            Combine::Min => self.int_intr("llvm.smin", &[a, b]),
        }
    }

    /// All-reduce over the 32 lanes of a warp by butterfly shuffles (offsets 16, 8, 4, 2, 1):
    /// every lane ends with the combination of all 32 values, combined in the same tree
    /// order, so the result is bit-identical across lanes. (CUDA C Programming Guide §7.22;
    /// PTX ISA §9.7.8.6 `shfl.sync`.)
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn warp_allreduce_f32(&self, op: Combine, mut v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        for off in [16, 8, 4, 2, 1] {
            let o = self.shfl_bfly_f32(v, off)?;
            v = self.combine_f32(op, v, o)?;
        }
        Ok(v)
    }

    /// [`KernelBuilder::warp_allreduce_f32`] for an `i64`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn warp_allreduce_i64(&self, op: Combine, mut v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        for off in [16, 8, 4, 2, 1] {
            let o = self.shfl_bfly_i64(v, off)?;
            v = self.combine_int(op, v, o)?;
        }
        Ok(v)
    }

    /// A float storage value (`bfloat`, `half` or `float`) extended to `f32` (exact).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn to_f32(&self, v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f32t = self.cx.f32_type();
        if v.get_type() == f32t {
            return Ok(v);
        }
        Ok(self.b.build_float_ext(v, f32t, "x")?)
    }

    /// The LLVM float type of a float dtype.
    pub fn float_type(&self, dtype: DType) -> FloatType<'ctx> {
        match dtype {
            DType::BF16 => self.cx.bf16_type(),
            DType::F16 => self.cx.f16_type(),
            _ => self.cx.f32_type(),
        }
    }

    /// An `f32` rounded to nearest even into `dtype`'s storage type (`cvt.rn.bf16.f32`,
    /// `cvt.rn.f16.f32`; unchanged for `f32`). Overflow gives ±inf, NaN stays NaN.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn from_f32(&self, v: FloatValue<'ctx>, dtype: DType) -> R<FloatValue<'ctx>> {
        let t = self.float_type(dtype);
        if t == v.get_type() {
            return Ok(v);
        }
        Ok(self.b.build_float_trunc(v, t, "r")?)
    }

    /// An `f32` rounded to `dtype` and back: the value an op of dtype `dtype` produces. The
    /// identity for `f32`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn round_to(&self, v: FloatValue<'ctx>, dtype: DType) -> R<FloatValue<'ctx>> {
        match dtype {
            DType::BF16 | DType::F16 => {
                let r = self.from_f32(v, dtype)?;
                self.to_f32(r)
            }
            _ => Ok(v),
        }
    }

    /// `a < b` on signed integers.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn slt(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(IntPredicate::SLT, a, b, "lt")?)
    }

    /// `a + b` (no signed wrap).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_nsw_add(a, b, "a")?)
    }

    /// `a · b` (no signed wrap).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_nsw_mul(a, b, "m")?)
    }

    /// Verifies the module, runs LLVM's `default<O3>` pipeline with the NVPTX target machine
    /// (which adds the NVPTX IR passes) and emits PTX.
    ///
    /// # Errors
    /// [`CodegenError::InvalidModule`] (a generator bug), the errors of
    /// [`crate::compile_module_to_ptx`].
    pub fn finish(self) -> R<String> {
        // Close the prologue: fall through into the body.
        self.b.position_at_end(self.prologue);
        self.b.build_unconditional_branch(self.body)?;
        let machine = crate::target_machine(&self.target)?;
        self.module.set_triple(&machine.get_triple());
        self.module.set_data_layout(&machine.get_target_data().get_data_layout());
        self.module.verify().map_err(|e| CodegenError::InvalidModule {
            module: self.module.get_name().to_string_lossy().into_owned(),
            message: e.to_string(),
        })?;
        IR_SINK.with(|sink| {
            if let Some(v) = sink.borrow_mut().as_mut() {
                v.push(self.module.print_to_string().to_string());
            }
        });
        self.module
            .run_passes("default<O3>", &machine, PassBuilderOptions::create())
            .map_err(|e| CodegenError::Emit { target: self.target, message: e.to_string() })?;
        crate::compile_module_to_ptx(&self.module, &self.target)
    }

    /// The textual LLVM IR of the module (for debugging and error messages).
    pub fn ir_text(&self) -> String {
        self.module.print_to_string().to_string()
    }

    // ---- thread-block clusters (sm_90+) ----------------------------------------------------

    /// Declares the kernel's cluster shape `dims` (CTAs along x, y, z): the function attribute
    /// `"nvvm.cluster_dim"` of LLVM 22, emitted as `.explicitcluster` and `.reqnctapercluster`
    /// (PTX ISA §11.7). A plain `cuLaunchKernel` then launches clusters of that shape; every
    /// grid dimension must be a multiple of the cluster's (CUDA C Programming Guide §2.2.1,
    /// "Thread Block Clusters"), and 8 CTAs is the portable maximum.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] below sm_90.
    pub fn set_cluster_dims(&self, dims: [u32; 3]) -> R<()> {
        if self.target.sm_version() < 90 {
            return Err(CodegenError::Builder(format!("thread-block clusters need sm_90, not {}", self.target)));
        }
        let v = format!("{},{},{}", dims[0], dims[1], dims[2]);
        self.func.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("nvvm.cluster_dim", &v));
        Ok(())
    }

    /// The address of `p` (this CTA's shared memory) in the shared memory of CTA `rank` of
    /// the cluster: `mapa.shared::cluster.u32` (PTX ISA §9.7.9, "mapa";
    /// `llvm.nvvm.mapa.shared.cluster`), a `ptr addrspace(7)` (`.shared::cluster`) that
    /// `ld.shared::cluster` reads (distributed shared memory).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mapa_shared(&self, p: PointerValue<'ctx>, rank: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        Ok(self.intrinsic_value("llvm.nvvm.mapa.shared.cluster", &[], &[p.into(), rank.into()])?.into_pointer_value())
    }

    /// A barrier of every thread of the cluster: `barrier.cluster.arrive.aligned` (release)
    /// then `barrier.cluster.wait.aligned` (acquire) (PTX ISA §9.7.13.4), so that shared
    /// memory written before it, in any CTA of the cluster, is visible after it. Every thread
    /// of every CTA of the cluster must reach it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_barrier(&self) -> R<()> {
        self.cluster_arrive()?;
        self.cluster_wait()
    }

    /// The arrive half of [`KernelBuilder::cluster_barrier`] (`barrier.cluster.arrive.aligned`,
    /// release, PTX ISA §9.7.13.4): the thread's earlier shared-memory writes become visible to
    /// every thread of the cluster that passes the matching wait. Costs a `MEMBAR.ALL.GPU` in
    /// every thread that executes it (ptxas 12.9, sm_90a): threads that wrote nothing another
    /// CTA reads may arrive relaxed ([`KernelBuilder::cluster_arrive_relaxed`]) instead.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_arrive(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cluster.arrive.aligned", &[], &[]).map(drop)
    }

    /// [`KernelBuilder::cluster_barrier`] without its memory ordering
    /// (`barrier.cluster.arrive.relaxed.aligned`, then `barrier.cluster.wait.aligned`): only
    /// an execution barrier. A release arrive costs a `MEMBAR.ALL.GPU` in every thread (ptxas
    /// 12.9, sm_90a), which waits for the thread's outstanding global stores.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_barrier_relaxed(&self) -> R<()> {
        self.cluster_arrive_relaxed()?;
        self.cluster_wait()
    }

    /// The arrive half of [`KernelBuilder::cluster_barrier_relaxed`]
    /// (`barrier.cluster.arrive.relaxed.aligned`, PTX ISA §9.7.13.4): the thread's arrival
    /// without memory ordering. Each thread alternates arrives and waits
    /// ([`KernelBuilder::cluster_wait`]); work placed between the two overlaps the other CTAs'
    /// arrivals.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_arrive_relaxed(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cluster.arrive.relaxed.aligned", &[], &[]).map(drop)
    }

    /// `barrier.cluster.wait.aligned` (acquire, PTX ISA §9.7.13.4): waits until every thread of
    /// the cluster has arrived at the current phase.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_wait(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cluster.wait.aligned", &[], &[]).map(drop)
    }

    /// The base of the kernel's dynamic shared memory (`extern .shared .align 16 .b8
    /// dsmem[]`, sized by the launch), offset by an opaque zero (`mov.u32 $0, 0;` as inline
    /// asm) computed in the prologue: every access is then an instruction off this base, never
    /// a constant expression over the global, which lets the CPU simulation of the tests give
    /// each CTA of a cluster its own copy (ptxas folds the zero).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn dynamic_shared_base(&mut self) -> R<PointerValue<'ctx>> {
        let i8t = self.cx.i8_type();
        let g = match self.module.get_global("dsmem") {
            Some(g) => g,
            None => {
                let g = self.module.add_global(i8t.array_type(0), Some(AddressSpace::from(ADDRESS_SPACE_SHARED)), "dsmem");
                g.set_linkage(Linkage::External);
                g.set_alignment(16);
                g
            }
        };
        self.in_prologue(|kb| {
            let i32t = kb.cx.i32_type();
            let f = kb.cx.create_inline_asm(i32t.fn_type(&[], false), "mov.u32 $0, 0;".to_owned(), "=r".to_owned(), false, false, None, false);
            let z = kb.b.build_indirect_call(i32t.fn_type(&[], false), f, &[], "smem_off")?;
            let z = basic(z.try_as_basic_value().basic(), "inline asm")?.into_int_value();
            // SAFETY (of the IR, not of Rust): an in-bounds offset of the dynamic area.
            Ok(unsafe { kb.b.build_gep(i8t, g.as_pointer_value(), &[z], "dsmem") }?)
        })
    }
}

impl<'ctx> Ops for KernelBuilder<'ctx> {
    type F = FloatValue<'ctx>;
    type D = FloatValue<'ctx>;
    type I = IntValue<'ctx>;
    type L = IntValue<'ctx>;
    type B = IntValue<'ctx>;

    fn fc(&mut self, v: f32) -> FloatValue<'ctx> {
        self.f32c(v)
    }
    fn fadd(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, "f")?)
    }
    fn fsub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_sub(a, b, "f")?)
    }
    fn fmul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, "f")?)
    }
    fn fdiv(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        // Without fast-math flags the back end emits IEEE `div.rn.f32`.
        Ok(self.b.build_float_div(a, b, "f")?)
    }
    fn fdiv_fast(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let args = [a.into(), b.into()];
        Ok(self.intrinsic_value("llvm.nvvm.div.approx.f", &[], &args)?.into_float_value())
    }
    fn ffma(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.fma", &[a, b, c])
    }
    fn fneg(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_neg(a, "f")?)
    }
    fn fabs(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.fabs", &[a])
    }
    fn fsqrt(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        // `sqrt.rn.f32` without fast-math flags.
        self.float_intr("llvm.sqrt", &[a])
    }
    fn ex2(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.nvvm.ex2.approx", &[a])
    }
    fn flt(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OLT, a, b, "c")?)
    }
    fn feq(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OEQ, a, b, "c")?)
    }
    fn fnan(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::UNO, a, a, "c")?)
    }
    fn fsel(&mut self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_float_value())
    }
    fn fbits(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.i32_type(), "b")?.into_int_value())
    }
    fn ffrom_bits(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.f32_type(), "f")?.into_float_value())
    }
    fn ftoi_exact(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_signed_int_to_float(a, self.cx.f32_type(), "f")?)
    }
    fn ic(&mut self, v: i32) -> IntValue<'ctx> {
        self.i32c(v as i64)
    }
    fn iadd(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_add(a, b, "i")?)
    }
    fn isub(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_sub(a, b, "i")?)
    }
    fn iand(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, "i")?)
    }
    fn ior(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, "i")?)
    }
    fn ishr(&mut self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_right_shift(a, self.i32c(s as i64), false, "i")?)
    }
    fn ixor(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_xor(a, b, "i")?)
    }
    fn ieq(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(IntPredicate::EQ, a, b, "c")?)
    }
    fn isel(&mut self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_int_value())
    }
    fn band(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, "b")?)
    }
    fn bor(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, "b")?)
    }
    fn bnot(&mut self, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_not(a, "b")?)
    }
    fn dc(&mut self, v: f64) -> FloatValue<'ctx> {
        self.f64c(v)
    }
    fn dadd(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, "d")?)
    }
    fn dsub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_sub(a, b, "d")?)
    }
    fn dmul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, "d")?)
    }
    fn ddiv(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_div(a, b, "d")?)
    }
    fn dfma(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.fma", &[a, b, c])
    }
    fn drint(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.rint", &[a])
    }
    fn dlt(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OLT, a, b, "c")?)
    }
    fn deq(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OEQ, a, b, "c")?)
    }
    fn dsel(&mut self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_float_value())
    }
    fn f2d(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_ext(a, self.cx.f64_type(), "d")?)
    }
    fn d2f(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_trunc(a, self.cx.f32_type(), "f")?)
    }
    fn d2l(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        let i64t = self.cx.i64_type();
        let v = self.intrinsic_value("llvm.fptosi.sat", &[i64t.into(), a.get_type().into()], &[a.into()])?;
        Ok(v.into_int_value())
    }
    fn dbits(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.i64_type(), "b")?.into_int_value())
    }
    fn dfrom_bits(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.f64_type(), "d")?.into_float_value())
    }
    fn l2d(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_signed_int_to_float(a, self.cx.f64_type(), "d")?)
    }
    fn lc(&mut self, v: i64) -> IntValue<'ctx> {
        self.i64c(v)
    }
    fn ladd(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_add(a, b, "l")?)
    }
    fn land(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, "l")?)
    }
    fn lor(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, "l")?)
    }
    fn lshl(&mut self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_left_shift(a, self.i64c(s as i64), "l")?)
    }
    fn lshr(&mut self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_right_shift(a, self.i64c(s as i64), false, "l")?)
    }
    fn l2i(&mut self, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_truncate(a, self.cx.i32_type(), "i")?)
    }
    fn llt(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.slt(a, b)
    }
    fn lsel(&mut self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_int_value())
    }
}

thread_local! {
    static IR_SINK: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` and returns, beside its result, the LLVM IR of every kernel module finished on
/// this thread meanwhile (verified, before the optimisation pipeline), in order. A debugging
/// and testing hook: the tests run this IR on the CPU (retargeted to the host) to check the
/// kernels' arithmetic without a GPU.
pub fn capture_ir<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let previous = IR_SINK.with(|s| s.borrow_mut().replace(Vec::new()));
    let r = f();
    let got = IR_SINK.with(|s| std::mem::replace(&mut *s.borrow_mut(), previous)).unwrap_or_default();
    (r, got)
}

/// The sizes a kernel needs at run time, as `i64` parameters after its buffers.
///
/// A generator asks [`SizeTable::get`] for the value of a [`Dim`]: a constant becomes an
/// immediate, anything else (`T`, `T*576`, `past+T`) a kernel parameter whose
/// [`sinter_ir::KernelParam::Size`] the runtime evaluates under the launch's bindings — so one
/// compiled kernel serves every value of the symbols. Kernel parameters are fixed when the
/// function is created, so a generator runs twice: first with a *collecting* table (which
/// records each distinct dim in order of first request and hands out placeholders; that
/// module is thrown away), then with a *fixed* table holding exactly those dims as
/// parameters. Generators must therefore ask for the same dims in the same order both times,
/// which holds as long as their Rust control flow depends only on the kernel graph.
pub struct SizeTable<'ctx> {
    dims: Vec<Dim>,
    fixed: bool,
    first_param: usize,
    values: HashMap<Dim, IntValue<'ctx>>,
    wide: bool,
}

impl<'ctx> SizeTable<'ctx> {
    /// A collecting table (first pass). `wide`: sizes are `i64` (else truncated to `i32`).
    pub fn collecting(wide: bool) -> SizeTable<'ctx> {
        SizeTable { dims: vec![], fixed: false, first_param: 0, values: HashMap::new(), wide }
    }

    /// A fixed table (second pass): `dims` are parameters `first_param..`.
    pub fn fixed(dims: Vec<Dim>, first_param: usize, wide: bool) -> SizeTable<'ctx> {
        SizeTable { dims, fixed: true, first_param, values: HashMap::new(), wide }
    }

    /// The non-constant dims asked for so far, in parameter order.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// The value of `d` as an index (`i64`, or `i32` for a narrow table), computed in the
    /// prologue.
    ///
    /// # Errors
    /// [`CodegenError::Builder`]; an internal error if a fixed table is asked for a dim the
    /// collecting pass did not see.
    pub fn get(&mut self, kb: &mut KernelBuilder<'ctx>, d: &Dim) -> R<IntValue<'ctx>> {
        let ty = if self.wide { kb.cx.i64_type() } else { kb.cx.i32_type() };
        if let Some(c) = d.as_const() {
            return Ok(ty.const_int(c as u64, true));
        }
        if let Some(v) = self.values.get(d) {
            return Ok(*v);
        }
        let v = if self.fixed {
            let i = self
                .dims
                .iter()
                .position(|x| x == d)
                .ok_or_else(|| CodegenError::Builder(format!("size `{d}` was not requested in the first pass")))?;
            let p = kb.param_int(self.first_param + i)?;
            if self.wide {
                p
            } else {
                kb.in_prologue(|kb| Ok(kb.b.build_int_truncate(p, ty, "n")?))?
            }
        } else {
            self.dims.push(d.clone());
            // A placeholder no constant folding can see through: a load of a null-ish
            // address in the prologue is enough (the module is discarded).
            kb.in_prologue(|kb| {
                let g = kb.cx.ptr_type(AddressSpace::from(ADDRESS_SPACE_GLOBAL)).const_null();
                Ok(kb.b.build_load(ty, g, "placeholder")?.into_int_value())
            })?
        };
        self.values.insert(d.clone(), v);
        Ok(v)
    }
}

/// Sets a value's name (for readable IR); no effect on code.
pub fn name_value<'ctx>(v: impl BasicValue<'ctx>, name: &str) {
    v.as_basic_value_enum().set_name(name);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math;

    /// One kernel that uses every helper and every math function: it must verify, compile
    /// for every target and assemble with ptxas without spills (an unknown intrinsic would
    /// fail at `intrinsic`, a misspelt one in ptxas).
    #[test]
    fn every_helper_compiles_and_assembles() {
        let cx = Context::create();
        for target in Target::ALL {
            let params = [ParamKind::input(), ParamKind::output(), ParamKind::Size];
            let mut kb = KernelBuilder::new(&cx, "helpers", &params, target).unwrap();
            kb.set_max_threads(256);
            kb.set_min_ctas_per_sm(1);
            let x = kb.param_ptr(0).unwrap();
            let y = kb.param_ptr(1).unwrap();
            let tid = kb.tid_x().unwrap();
            let i = kb.b.build_int_z_extend(tid, cx.i64_type(), "i").unwrap();
            let f32t: BasicTypeEnum = cx.f32_type().into();
            let p = kb.gep(cx.bf16_type().into(), x, i).unwrap();
            let v = kb.load(cx.bf16_type().into(), p, 2).unwrap().into_float_value();
            let v = kb.to_f32(v).unwrap();
            let mut acc = v;
            let e = math::exp(&mut kb, v, true).unwrap();
            acc = kb.fadd(acc, e).unwrap();
            let e = math::exp(&mut kb, v, false).unwrap();
            acc = kb.fadd(acc, e).unwrap();
            let l = math::log(&mut kb, v).unwrap();
            acc = kb.fadd(acc, l).unwrap();
            let t = math::tanh(&mut kb, v, true).unwrap();
            acc = kb.fadd(acc, t).unwrap();
            let g = math::gelu_erf(&mut kb, v, true).unwrap();
            acc = kb.fadd(acc, g).unwrap();
            let g = math::gelu_tanh(&mut kb, v, false).unwrap();
            acc = kb.fadd(acc, g).unwrap();
            let s = math::silu(&mut kb, v, false).unwrap();
            acc = kb.fadd(acc, s).unwrap();
            let (s, c) = math::sincos(&mut kb, v).unwrap();
            acc = kb.fadd(acc, s).unwrap();
            acc = kb.fadd(acc, c).unwrap();
            let pw = math::pow(&mut kb, v, acc).unwrap();
            acc = kb.fadd(acc, pw).unwrap();
            acc = kb.warp_allreduce_f32(Combine::Max, acc).unwrap();
            acc = kb.warp_allreduce_f32(Combine::Sum, acc).unwrap();
            let smem = kb.shared_array(f32t, 32, 16, "red");
            let sp = kb.gep(f32t, smem, i).unwrap();
            kb.store(sp, acc.into(), 4).unwrap();
            kb.barrier().unwrap();
            let sp0 = kb.gep(f32t, smem, kb.i64c(0)).unwrap();
            let s0 = kb.load(f32t, sp0, 4).unwrap().into_float_value();
            acc = kb.fadd(acc, s0).unwrap();
            let li = kb.b.build_float_to_signed_int(acc, cx.i64_type(), "li").unwrap();
            let li = kb.warp_allreduce_i64(Combine::Sum, li).unwrap();
            let lf = kb.b.build_signed_int_to_float(li, cx.f32_type(), "lf").unwrap();
            acc = kb.fadd(acc, lf).unwrap();
            let r = kb.from_f32(acc, DType::BF16).unwrap();
            let q = kb.gep(cx.bf16_type().into(), y, i).unwrap();
            kb.store(q, r.into(), 2).unwrap();
            kb.ret().unwrap();
            let ptx = kb.finish().unwrap_or_else(|e| panic!("{target}: {e}"));
            assert!(ptx.contains(".maxntid 256"), "{ptx}");
            assert!(ptx.contains(".minnctapersm 1"), "{ptx}");
            assert!(ptx.contains("shfl.sync.bfly.b32"), "{ptx}");
            assert!(ptx.contains("ex2.approx"), "{ptx}");
            assert!(ptx.contains("bar.sync") || ptx.contains("barrier.sync"), "{ptx}");
            assert!(ptx.contains("max.NaN.f32"), "{ptx}");
            assert!(ptx.contains("cvt.rn.bf16.f32"), "{ptx}");
            assert!(!ptx.contains("call.uni"), "a helper became a call:\n{ptx}");
            let Some(ptxas) = crate::ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}")) else { continue };
            let report = crate::ptxas::assemble_with(&ptxas, &ptx, &target).unwrap_or_else(|e| panic!("{e}\n{ptx}"));
            assert!(!report.spills(), "{report}");
            eprintln!("{report}");
        }
    }
}
