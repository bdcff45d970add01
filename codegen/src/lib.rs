//! sinter-codegen: kernels as LLVM IR (through inkwell), compiled to PTX by LLVM's NVPTX
//! back end.
//!
//! This crate is the only one that links LLVM (22, statically; see `scripts/setup` and
//! `.cargo/config.toml`). Its pieces:
//! - [`compile_kernel`]: one kernel of a [`KernelGraph`] in, its PTX and [`LaunchPlan`] out —
//!   the entry point the root crate and the runtime use; it dispatches on the kernel's
//!   [`Family`] to the generators of [`kernels`] (one file per family: pointwise, row
//!   reductions, layout, gather, kv_append, matmul, attention);
//! - [`isa`]: the instruction layer every generator builds on ([`isa::KernelBuilder`]: kernel
//!   functions, special registers, global/shared memory, dtype conversions, warp shuffles,
//!   barriers, tensor cores, clusters, symbolic sizes as kernel parameters);
//! - [`math`]: the device math library (`exp`, `log`, `tanh`, `erf`, `sin`/`cos`, `pow`, …),
//!   written once over [`math::Ops`] and tested on the CPU against f64 references;
//! - [`target`]: the GPU targets (`sm_80`, `sm_90`, `sm_90a`, defined in
//!   `sinter_ir::contract::target`) and the names LLVM knows them by;
//! - [`compile_module_to_ptx`]: an LLVM module in, PTX text out;
//! - [`ptxas`]: assembling PTX with NVIDIA's `ptxas` and reading its register, shared-memory,
//!   stack and spill report.
//!
//! Kernels follow the NVPTX conventions: a kernel has the PTX_Kernel calling convention
//! ([`PTX_KERNEL_CALL_CONV`]), global pointers live in address space [`ADDRESS_SPACE_GLOBAL`]
//! and shared memory in [`ADDRESS_SPACE_SHARED`]; thread and block indices come from the
//! `llvm.nvvm.read.ptx.sreg.*` intrinsics.

#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(any(test, feature = "emu"))]
pub mod emu;
#[cfg(test)]
mod cpu_tests;
pub(crate) mod error;
pub(crate) mod fp8;
pub mod isa;
pub mod kernels;
pub(crate) mod llvm;
pub mod math;
pub mod persistent;
pub mod ptxas;
pub(crate) mod quant;
pub mod target;
#[cfg(test)]
pub(crate) mod testing;

use std::rc::Rc;

use sinter_ir::{Family, Kernel, KernelGraph, LaunchPlan};

pub use error::CodegenError;
pub(crate) use error::fp8_message;
#[cfg(test)]
pub(crate) use error::FP8_SUPPORT;
pub use llvm::{compile_module_to_ptx, target_machine, ADDRESS_SPACE_CONSTANT, ADDRESS_SPACE_GLOBAL, ADDRESS_SPACE_LOCAL, ADDRESS_SPACE_SHARED, PTX_KERNEL_CALL_CONV};
pub use ptxas::{PtxasError, PtxasReport};
pub use target::{Target, UnknownTarget};



/// Generates kernel `kernel` of `graph` for `target`: LLVM IR built by the generator of the
/// kernel's [`Family`], optimised (`default<O3>`) and compiled by the NVPTX back end to PTX,
/// with the [`LaunchPlan`] the runtime launches it by.
///
/// The plan's parameters are the kernel's buffers in order — `KernelParam::Buffer(i)` for
/// `i` over its inputs then its outputs — followed by one `KernelParam::Size(dim)` (an `i64`)
/// per symbolic size the code needs; constant sizes are compiled in, so one PTX serves every
/// value of the symbols. The grid is `ceil(dim / per_cta)` per axis, the block fixed; the
/// tensor-core kernels (matmul, prefill attention) use dynamic shared memory (`shared_bytes`,
/// beyond 48 KiB where the runtime opts in), the others static shared memory only
/// (`shared_bytes` 0). Outputs must not alias other buffers of the kernel, except for
/// `KvAppend`, whose output pages *are* its input pages (see [`kernels::kv_append`]).
///
/// Each family's generator implements one trait (`kernels::family::Generator`: analyse,
/// default schedule, candidates, build), dispatched on by `kernels::compile_family`:
///
/// | family | generator |
/// |---|---|
/// | `Pointwise` | [`kernels::pointwise::generate`] |
/// | `RowReduction` | [`kernels::reduce::generate`] |
/// | `Layout` | [`kernels::layout::generate`] |
/// | `Gather` | [`kernels::gather::generate`] |
/// | `KvAppend` | [`kernels::kv_append::generate`] |
/// | `Matmul` | [`kernels::matmul::generate`] |
/// | `Attention` | [`kernels::attention::generate_prefill`] |
/// | `PagedAttention` | [`kernels::decode::generate`] (split-KV; [`kernels::attention::generate_paged`] is the single-CTA alternative) |
/// | `AttentionMerge` | [`kernels::merge::generate`] |
///
/// # Errors
/// [`CodegenError::Unsupported`] (a body outside what the family's generator handles) and
/// [`CodegenError::BadKernel`] (a body that does not match its buffers), both naming the
/// kernel; LLVM and target errors.
pub fn compile_kernel(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let data = graph.kernels.get(kernel).ok_or_else(|| CodegenError::BadKernel {
        kernel: kernel.to_string(),
        message: format!("the kernel graph has {} kernels", graph.kernels.len()),
    })?;
    refuse_fp8(graph, kernel)?;
    let r = kernels::compile_family(data.family, graph, kernel, target);
    // Errors raised deep in a generator leave the kernel's name empty: fill it in.
    let name = format!("{kernel} ({:?})", data.family);
    r.map_err(|e| match e {
        CodegenError::Unsupported { kernel: k, message } if k.is_empty() => CodegenError::Unsupported { kernel: name, message },
        CodegenError::BadKernel { kernel: k, message } if k.is_empty() => CodegenError::BadKernel { kernel: name, message },
        other => other,
    })
}


/// Refuses a kernel of a family that does not read `f8e4m3` — paged attention, the attention
/// merge and the KV append — when it holds an `f8e4m3` value (a buffer it reads or
/// writes, or a value its body computes), with [`CodegenError::Unsupported`] naming the dtype,
/// the value and the kernel, before any generator sees it. The element-wise families
/// (pointwise, layout, gather, row reductions) pass: the element evaluator reads, writes and
/// converts fp8 ([`fp8`]); so does prefill attention, whose generator reads the fp8
/// attention's operands and refuses any other fp8 value ([`kernels::attention_tc`], "fp8"). A matmul kernel is refused when its epilogue holds fp8
/// ([`refuse_fp8_epilogue`]); its operands are its generator's to judge ([`kernels::matmul`],
/// `Spec::fp8`: the fp8 matmul on sm_90a, any other fp8 operand refused).
fn refuse_fp8(graph: &KernelGraph, kernel: Kernel) -> Result<(), CodegenError> {
    let Some(data) = graph.kernels.get(kernel) else { return Ok(()) };
    if matches!(data.family, Family::Pointwise | Family::Layout | Family::Gather | Family::RowReduction | Family::Attention) {
        return Ok(());
    }
    if data.family == Family::Matmul {
        return refuse_fp8_epilogue(graph, kernel, data);
    }
    let buffer = data.inputs.iter().chain(&data.outputs).find_map(|&b| graph.buffers.get(b).filter(|d| d.ty.dtype.is_fp8()).map(|d| (b, d)));
    let what = match buffer {
        Some((b, d)) => format!("buffer {b} ({}{})", d.ty, d.name.as_deref().map(|n| format!(", `{n}`")).unwrap_or_default()),
        None => match data.body.values.iter().find(|(_, v)| v.ty.dtype.is_fp8()) {
            Some((v, d)) => format!("value {} ({})", data.body.label(v), d.ty),
            None => return Ok(()),
        },
    };
    Err(CodegenError::Unsupported { kernel: format!("{kernel} ({:?})", data.family), message: fp8_message(&format!("f8e4m3 {what}: the {:?} generator does not read f8e4m3", data.family)) })
}

/// A matmul kernel's epilogue holding `f8e4m3` — an fp8 result buffer, a `quantize_fp8` or
/// `cast` to fp8, or a `dequantize_fp8` that is not one of the matmul's operands — is refused
/// (the epilogue stores of the matmul generators are not checked for one-byte results, and
/// the sm_80 conversion spills there); the unfused lowering computes it in its own
/// element-wise kernel. The fp8 operands themselves are the generator's to judge.
fn refuse_fp8_epilogue(graph: &KernelGraph, kernel: Kernel, data: &sinter_ir::KernelData) -> Result<(), CodegenError> {
    let body = &data.body;
    let operands: Vec<sinter_ir::Value> = body.nodes.values().filter(|n| n.op.kind == sinter_ir::OpKind::Matmul).flat_map(|n| n.inputs.iter().copied()).collect();
    let out = data.outputs.iter().find_map(|&b| graph.buffers.get(b).filter(|d| d.ty.dtype.is_fp8()).map(|d| format!("result buffer {b} ({})", d.ty)));
    let value = || {
        body.values.iter().find_map(|(v, d)| match d.def {
            sinter_ir::ValueDef::Result(n, _) if d.ty.dtype.is_fp8() => Some(format!("value {} ({}, `{}`)", body.label(v), d.ty, body.nodes[n].op.kind.name())),
            sinter_ir::ValueDef::Result(n, _) if body.nodes[n].op.kind == sinter_ir::OpKind::DequantizeFp8 && !operands.contains(&v) => Some(format!("value {} ({}, `dequantize_fp8` read by the epilogue)", body.label(v), d.ty)),
            _ => None,
        })
    };
    match out.or_else(value) {
        Some(what) => Err(CodegenError::Unsupported { kernel: format!("{kernel} ({:?})", data.family), message: fp8_message(&format!("f8e4m3 in a matmul epilogue: {what}")) }),
        None => Ok(()),
    }
}

/// One schedule candidate of a kernel, compiled (autotuning: the runtime times the
/// candidates of a kernel and keeps the fastest, see `sinter::tune`).
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// A short, stable name of the schedule (`mma 128x256x64 w2x4 s3`, `rows t512 u2 c8`,
    /// `tc kv48 w4 m2`); unique among a kernel's variants.
    pub name: String,
    /// Its launch plan.
    pub plan: LaunchPlan,
}

pub use kernels::family::Candidate;

/// The schedule candidates of `kernel`, uncompiled: the schedule [`compile_kernel`] uses first,
/// then the alternatives its family's generator offers (`Generator::candidates`) — matmul CTA
/// tiles, row-reduction thread counts and unrolls, prefill-attention key tiles; other
/// families have only the first, named `default`.
fn candidates<'a>(graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> Result<Vec<Candidate<'a>>, CodegenError> {
    let data = graph.kernels.get(kernel).ok_or_else(|| CodegenError::BadKernel {
        kernel: kernel.to_string(),
        message: format!("the kernel graph has {} kernels", graph.kernels.len()),
    })?;
    refuse_fp8(graph, kernel)?;
    let name = format!("{kernel} ({:?})", data.family);
    let named = move |e: CodegenError| match e {
        CodegenError::Unsupported { kernel: k, message } if k.is_empty() => CodegenError::Unsupported { kernel: name.clone(), message },
        CodegenError::BadKernel { kernel: k, message } if k.is_empty() => CodegenError::BadKernel { kernel: name.clone(), message },
        other => other,
    };
    // Every family's candidates go through its `Generator`; the closures fill in the
    // kernel's name as `compile_kernel` does.
    let all = kernels::family_candidates(data.family, graph, kernel, target).map_err(&named)?;
    let named = Rc::new(named);
    Ok(all
        .into_iter()
        .map(|(n, build)| {
            let named = named.clone();
            let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || build().map_err(&*named));
            (n, build)
        })
        .collect())
}

/// Every schedule candidate of `kernel` that compiles, the default ([`compile_kernel`]'s
/// schedule) first: what the runtime's autotuning times (`sinter::tune`). Every variant computes
/// the same results (each schedule is checked against the interpreter in the tests); only their
/// speed differs. Alternatives the kernel's layouts, epilogue or target do not accept are left
/// out.
///
/// # Errors
/// As [`compile_kernel`], for the default schedule.
pub fn schedule_variants(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<Vec<Variant>, CodegenError> {
    let mut out = Vec::new();
    for (i, (name, build)) in candidates(graph, kernel, target)?.into_iter().enumerate() {
        match build() {
            Ok(plan) => out.push(Variant { name, plan }),
            Err(e) if i == 0 => return Err(e),
            Err(_) => {}
        }
    }
    Ok(out)
}

/// The names of `kernel`'s schedule candidates, the default first, without compiling them
/// (`sinter explain`); some may not compile ([`schedule_variants`] leaves those out).
///
/// # Errors
/// As [`compile_kernel`], when the kernel cannot be analysed.
pub fn schedule_names(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<Vec<String>, CodegenError> {
    Ok(candidates(graph, kernel, target)?.into_iter().map(|(n, _)| n).collect())
}

/// Compiles the schedule candidate of `kernel` named `name` ([`schedule_variants`]).
///
/// # Errors
/// [`CodegenError::Unsupported`] when the kernel has no candidate of that name; as
/// [`compile_kernel`].
pub fn compile_variant(graph: &KernelGraph, kernel: Kernel, target: &Target, name: &str) -> Result<LaunchPlan, CodegenError> {
    let mut all = candidates(graph, kernel, target)?;
    let names: Vec<String> = all.iter().map(|(n, _)| n.clone()).collect();
    match all.iter().position(|(n, _)| n == name) {
        Some(i) => (all.swap_remove(i).1)(),
        None => Err(CodegenError::Unsupported { kernel: kernel.to_string(), message: format!("no schedule variant `{name}` (it has: {})", names.join(", ")) }),
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::context::Context;
    use inkwell::intrinsics::Intrinsic;
    use inkwell::module::Module;
    use inkwell::AddressSpace;
    use inkwell::IntPredicate;

    /// Builds `scale2(x, y, n)`: `y[i] = x[i] * 2` for `i < n`, one element per thread,
    /// `i = ctaid.x * ntid.x + tid.x` in 64 bits.
    fn scale2_module(context: &Context) -> Module<'_> {
        let module = context.create_module("scale2");
        let builder = context.create_builder();
        let f32t = context.f32_type();
        let i32t = context.i32_type();
        let i64t = context.i64_type();
        let gptr = context.ptr_type(AddressSpace::from(ADDRESS_SPACE_GLOBAL));

        let fn_type = context
            .void_type()
            .fn_type(&[gptr.into(), gptr.into(), i64t.into()], false);
        let kernel = module.add_function("scale2", fn_type, None);
        kernel.set_call_conventions(PTX_KERNEL_CALL_CONV);
        let x = kernel.get_nth_param(0).unwrap().into_pointer_value();
        let y = kernel.get_nth_param(1).unwrap().into_pointer_value();
        let n = kernel.get_nth_param(2).unwrap().into_int_value();
        x.set_name("x");
        y.set_name("y");
        n.set_name("n");

        let sreg = |name: &str| {
            let intrinsic = Intrinsic::find(name).unwrap_or_else(|| panic!("no intrinsic {name}"));
            intrinsic.get_declaration(&module, &[]).unwrap()
        };
        let tid = sreg("llvm.nvvm.read.ptx.sreg.tid.x");
        let ctaid = sreg("llvm.nvvm.read.ptx.sreg.ctaid.x");
        let ntid = sreg("llvm.nvvm.read.ptx.sreg.ntid.x");

        let entry = context.append_basic_block(kernel, "entry");
        let body = context.append_basic_block(kernel, "body");
        let exit = context.append_basic_block(kernel, "exit");

        builder.position_at_end(entry);
        let call = |f, name| {
            builder
                .build_call(f, &[], name)
                .unwrap()
                .try_as_basic_value()
                .basic()
                .unwrap()
                .into_int_value()
        };
        let tid = call(tid, "tid");
        let ctaid = call(ctaid, "ctaid");
        let ntid = call(ntid, "ntid");
        assert_eq!(tid.get_type(), i32t);
        let wide = |v, name| builder.build_int_z_extend(v, i64t, name).unwrap();
        let block_start = builder
            .build_int_mul(wide(ctaid, "ctaid64"), wide(ntid, "ntid64"), "block_start")
            .unwrap();
        let i = builder
            .build_int_add(block_start, wide(tid, "tid64"), "i")
            .unwrap();
        let in_bounds = builder
            .build_int_compare(IntPredicate::ULT, i, n, "in_bounds")
            .unwrap();
        builder
            .build_conditional_branch(in_bounds, body, exit)
            .unwrap();

        builder.position_at_end(body);
        // SAFETY (of the IR, not of Rust): i < n is checked above.
        let px = unsafe { builder.build_in_bounds_gep(f32t, x, &[i], "px") }.unwrap();
        let py = unsafe { builder.build_in_bounds_gep(f32t, y, &[i], "py") }.unwrap();
        let v = builder
            .build_load(f32t, px, "v")
            .unwrap()
            .into_float_value();
        let two = f32t.const_float(2.0);
        let r = builder.build_float_mul(v, two, "r").unwrap();
        builder.build_store(py, r).unwrap();
        builder.build_unconditional_branch(exit).unwrap();

        builder.position_at_end(exit);
        builder.build_return(None).unwrap();
        module
    }

    #[test]
    fn emits_ptx_for_every_target() {
        let context = Context::create();
        let module = scale2_module(&context);
        for t in Target::ALL {
            let ptx = compile_module_to_ptx(&module, &t).unwrap();
            let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
            assert!(lines.contains(&".version 8.5"), "{t}:\n{ptx}");
            assert!(
                lines.contains(&format!(".target {}", t.name()).as_str()),
                "{t}:\n{ptx}"
            );
            assert!(lines.contains(&".address_size 64"), "{t}:\n{ptx}");
            assert!(ptx.contains(".visible .entry scale2("), "{t}:\n{ptx}");
            for sreg in ["%tid.x", "%ctaid.x", "%ntid.x"] {
                assert!(ptx.contains(sreg), "{t}: no {sreg}:\n{ptx}");
            }
            assert!(ptx.contains("ld.global"), "{t}:\n{ptx}");
            assert!(ptx.contains("st.global"), "{t}:\n{ptx}");
            assert!(!ptx.contains('\0'));
        }
    }

    #[test]
    fn ptx_assembles_without_spills() {
        let Some(ptxas) = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}")) else {
            return;
        };
        let context = Context::create();
        let module = scale2_module(&context);
        for t in Target::ALL {
            let ptx = compile_module_to_ptx(&module, &t).unwrap();
            let report = ptxas::assemble_with(&ptxas, &ptx, &t)
                .unwrap_or_else(|e| panic!("{t}: {e}\n{ptx}"));
            let kernels: Vec<_> = report.kernels().collect();
            assert_eq!(kernels.len(), 1, "{report:?}");
            let k = kernels[0];
            assert_eq!(k.name, "scale2");
            assert!(
                k.registers > 0 && k.registers <= t.max_registers_per_thread(),
                "{k:?}"
            );
            assert_eq!(k.spill_store_bytes, 0, "{t}: {k:?}");
            assert_eq!(k.spill_load_bytes, 0, "{t}: {k:?}");
            assert_eq!(k.stack_frame_bytes, 0, "{t}: {k:?}");
            assert_eq!(k.shared_bytes, 0, "{t}: {k:?}");
            assert!(!report.spills());
            assert!(report.warnings.is_empty(), "{t}: {:?}", report.warnings);
            // The cubin is an ELF file.
            assert_eq!(report.cubin.get(..4), Some(&b"\x7fELF"[..]), "{t}");
            eprintln!("{report}");
        }
    }

    #[test]
    fn invalid_module_is_an_error_not_an_abort() {
        let context = Context::create();
        let module = context.create_module("broken");
        let f = module.add_function("f", context.i32_type().fn_type(&[], false), None);
        let bb = context.append_basic_block(f, "entry");
        let builder = context.create_builder();
        builder.position_at_end(bb);
        builder.build_return(None).unwrap(); // `ret void` in a function returning i32
        let err = compile_module_to_ptx(&module, &Target::SM_80).unwrap_err();
        assert!(matches!(err, CodegenError::InvalidModule { .. }), "{err}");
    }

    #[test]
    fn kernels_holding_fp8_are_refused_naming_the_dtype() {
        use crate::testing::{d, single_kernel, ty};
        use sinter_ir::{Attr, DType, FunctionBuilder, Graph, OpKind};
        let scale = || ty(DType::F32, &[]);
        // An fp8 matmul: f8e4m3 input buffers.
        let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_matmul");
        let (a8, sa) = (fb.param("a8", ty(DType::F8E4M3, &[d(16), d(64)])), fb.param("sa", scale()));
        let (b8, sb) = (fb.param("b8", ty(DType::F8E4M3, &[d(32), d(64)])), fb.param("sb", scale()));
        let bf16 = || vec![("dtype", Attr::DType(DType::BF16))];
        let a = fb.op1(OpKind::DequantizeFp8, &[a8, sa], bf16()).unwrap();
        let b = fb.op1(OpKind::DequantizeFp8, &[b8, sb], bf16()).unwrap();
        let y = fb.op1(OpKind::Matmul, &[a, b], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
        // sm_90a has the fp8 wgmma kernel; sm_80 and sm_90 refuse it, naming the dtype.
        assert!(compile_kernel(&g, k, &Target::SM_90A).unwrap().entry.ends_with("_matmul_wgmma_e4m3"));
        for t in [Target::SM_80, Target::SM_90] {
            let e = compile_kernel(&g, k, &t).unwrap_err();
            assert!(matches!(&e, CodegenError::Unsupported { .. }), "{e:?}");
            assert_eq!(e.to_string(), format!("kernel k0 (Matmul): unsupported: f8e4m3 matmul: wgmma needs sm_90a, not {t}: {FP8_SUPPORT}"));
            assert!(e.to_string().contains("f8e4m3") && e.to_string().contains("sm_90a"), "{e}");
            assert!(matches!(schedule_variants(&g, k, &t), Err(CodegenError::Unsupported { .. })));
        }
        // An fp8 A with a bf16 B is not the fp8 matmul.
        let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_mixed");
        let (a8, sa) = (fb.param("a8", ty(DType::F8E4M3, &[d(16), d(64)])), fb.param("sa", scale()));
        let b = fb.param("b", ty(DType::BF16, &[d(32), d(64)]));
        let a = fb.op1(OpKind::DequantizeFp8, &[a8, sa], bf16()).unwrap();
        let y = fb.op1(OpKind::Matmul, &[a, b], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
        let e = compile_kernel(&g, k, &Target::SM_90A).unwrap_err().to_string();
        assert_eq!(e, format!("kernel k0 (Matmul): unsupported: a matmul with one `dequantize_fp8` operand: {FP8_SUPPORT}"));
        // A fake-quantization round trip (no fp8 buffer, an fp8 value in its body) is an
        // element-wise kernel: it compiles on every target.
        let mut fb = FunctionBuilder::new(&Graph::new(), "fake_quant");
        let (x, s) = (fb.param("x", ty(DType::F32, &[d(64)])), fb.param("s", scale()));
        let q = fb.op1(OpKind::QuantizeFp8, &[x, s], vec![]).unwrap();
        let y = fb.op1(OpKind::DequantizeFp8, &[q, s], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
        let (g, k) = single_kernel(Family::Pointwise, fb.finish(&[y]).unwrap());
        for t in Target::ALL {
            let plan = compile_kernel(&g, k, &t).unwrap_or_else(|e| panic!("{t}: {e}"));
            assert_eq!(plan.ptx.contains("e4m3x2"), t.sm_version() >= 89, "{t}: the cvt e4m3x2 instructions on sm_89+ only");
        }
        // A matmul whose epilogue quantizes its result to fp8 is refused (the unfused lowering
        // quantizes in a pointwise kernel).
        let mut fb = FunctionBuilder::new(&Graph::new(), "quantized_proj");
        let (a, b, s) = (fb.param("a", ty(DType::BF16, &[d(16), d(64)])), fb.param("b", ty(DType::BF16, &[d(32), d(64)])), fb.param("s", scale()));
        let y = fb.op1(OpKind::Matmul, &[a, b], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let q = fb.op1(OpKind::QuantizeFp8, &[y, s], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[q]).unwrap());
        for t in Target::ALL {
            let e = compile_kernel(&g, k, &t).unwrap_err().to_string();
            assert!(e.starts_with("kernel k0 (Matmul): unsupported: f8e4m3 in a matmul epilogue: result buffer b3 (f8e4m3[16, 32])"), "{e}");
            assert!(matches!(schedule_variants(&g, k, &t), Err(CodegenError::Unsupported { .. })));
        }
        // A family that does not read fp8 (here a paged-attention kernel holding one) is
        // refused, naming the dtype, the value and the family.
        let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_in_decode");
        let (x, s) = (fb.param("x", ty(DType::F32, &[d(64)])), fb.param("s", scale()));
        let q = fb.op1(OpKind::QuantizeFp8, &[x, s], vec![]).unwrap();
        let (g, k) = single_kernel(Family::PagedAttention, fb.finish(&[q]).unwrap());
        let e = compile_kernel(&g, k, &Target::SM_90A).unwrap_err().to_string();
        assert!(e.starts_with("kernel k0 (PagedAttention): unsupported: f8e4m3 buffer"), "{e}");
        assert!(e.contains("the PagedAttention generator does not read f8e4m3") && e.ends_with(FP8_SUPPORT), "{e}");
    }

    #[test]
    fn unknown_target_converts() {
        let err: CodegenError = Target::parse("sm_61").unwrap_err().into();
        assert!(err.to_string().contains("sm_61"));
    }
}
