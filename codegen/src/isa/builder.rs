//! The kernel under construction: module, parameters, blocks, special registers, inline asm,
//! symbolic sizes and [`KernelBuilder::finish`] (verify, `default<O3>`, PTX).
//!
//! Design notes: book/src/design/isa.md

use std::collections::HashMap;

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::types::{AnyType, BasicMetadataTypeEnum, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::AddressSpace;
use sinter_ir::Dim;

use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;
use crate::llvm::{ADDRESS_SPACE_GLOBAL, PTX_KERNEL_CALL_CONV};

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
    /// Module globals made so far (their names' suffix).
    pub(super) globals: usize,
}

pub(super) fn basic<'ctx>(v: Option<BasicValueEnum<'ctx>>, what: &str) -> R<BasicValueEnum<'ctx>> {
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

    /// Prefetches `bytes` bytes from `base + off` (a global buffer, a byte offset: prologue
    /// values) into L2 with `prefetch.global.L2`, one 128-byte line a lane of `lanes` at a
    /// time (`lane`: this thread's, a prologue value; at most 8 lines a lane), in the
    /// prologue: on sm_90+ before the programmatic-launch wait, so that a kernel's weights
    /// stream in while the kernel before it finishes. L2 is the device's point of coherence,
    /// so a line the previous kernel writes afterwards is still read fresh.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn prefetch_l2_in_prologue(&mut self, base: PointerValue<'ctx>, off: IntValue<'ctx>, bytes: u64, lane: IntValue<'ctx>, lanes: u32) -> R<()> {
        const LINE: u64 = 128;
        let lines = bytes.div_ceil(LINE);
        if lines == 0 || lanes == 0 {
            return Ok(());
        }
        let per = lines.div_ceil(u64::from(lanes)).min(8);
        self.in_prologue(|kb| {
            let i64t = kb.cx.i64_type();
            let addr0 = kb.b.build_ptr_to_int(base, i64t, "pf_base")?;
            let addr0 = kb.b.build_int_add(addr0, off, "pf_start")?;
            for j in 0..per {
                let l = kb.b.build_int_add(lane, i64t.const_int(j * u64::from(lanes), false), "pf_line")?;
                let last = i64t.const_int(lines - 1, false);
                let over = kb.b.build_int_compare(inkwell::IntPredicate::UGT, l, last, "pf_over")?;
                let l = kb.b.build_select(over, last, l, "pf_clamp")?.into_int_value();
                let a = kb.b.build_int_add(addr0, kb.b.build_int_mul(l, i64t.const_int(LINE, false), "pf_off")?, "pf_addr")?;
                kb.asm_args("prefetch.global.L2 [$0];", "l", &[a.into()])?;
            }
            Ok(())
        })
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

    pub(super) fn float_intr(&self, name: &str, args: &[FloatValue<'ctx>]) -> R<FloatValue<'ctx>> {
        let ty = args.first().map(|a| a.get_type()).ok_or_else(|| CodegenError::Builder(format!("{name} without arguments")))?;
        let args: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|&a| a.into()).collect();
        Ok(self.intrinsic_value(name, &[ty.into()], &args)?.into_float_value())
    }

    pub(super) fn int_intr(&self, name: &str, args: &[IntValue<'ctx>]) -> R<IntValue<'ctx>> {
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

    /// A side-effecting inline-asm statement without operands (clobbering memory).
    pub(super) fn asm_void(&self, text: &str) -> R<()> {
        let vt = self.cx.void_type().fn_type(&[], false);
        let f = self.cx.create_inline_asm(vt, text.to_owned(), "~{memory}".to_owned(), true, false, None, false);
        self.b.build_indirect_call(vt, f, &[], "")?;
        Ok(())
    }

    /// A side-effecting inline-asm statement with input operands `args` under constraints
    /// `cons` (clobbering memory).
    pub(super) fn asm_args(&self, text: &str, cons: &str, args: &[BasicMetadataValueEnum<'ctx>]) -> R<()> {
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

    /// Verifies the module, runs LLVM's `default<O3>` pipeline with the NVPTX target machine
    /// (which adds the NVPTX IR passes) and emits PTX.
    ///
    /// # Errors
    /// [`CodegenError::InvalidModule`] (a generator bug), the errors of
    /// [`crate::compile_module_to_ptx`].
    pub fn finish(self) -> R<String> {
        self.b.position_at_end(self.prologue);
        if self.target.has_programmatic_launch() {
            // Programmatic dependent launch, at the end of the prologue (index arithmetic and
            // L2 prefetches of weights, [`KernelBuilder::prefetch_l2_in_prologue`]; no load):
            // nothing is read before the grids this one depends on have completed (a no-op
            // when launched without the attribute); the next kernel may then launch and
            // reach its own wait while this one runs.
            self.asm_void("griddepcontrol.wait;")?;
            self.asm_void("griddepcontrol.launch_dependents;")?;
        }
        // Close the prologue: fall through into the body.
        self.b.build_unconditional_branch(self.body)?;
        let machine = crate::llvm::target_machine(&self.target)?;
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
        crate::llvm::compile_module_to_ptx(&self.module, &self.target)
    }

    /// The textual LLVM IR of the module (for debugging and error messages).
    pub fn ir_text(&self) -> String {
        self.module.print_to_string().to_string()
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
