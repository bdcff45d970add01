//! The instruction layer: building one kernel's LLVM IR, instruction by instruction, for the
//! NVPTX back end of LLVM 22 (checked against its `IntrinsicsNVVM.td` and with ptxas 12.9).
//!
//! [`KernelBuilder`] wraps an inkwell module, builder and kernel function; its methods are
//! spread over one file per hardware feature, each an `impl KernelBuilder` block:
//!
//! | file | what |
//! |------|------|
//! | `builder.rs` | module, parameters ([`ParamKind`]), blocks, special registers, inline asm, [`SizeTable`], [`KernelBuilder::finish`], [`capture_ir`] |
//! | `arith.rs` | [`storage_type`], `f32` ⇄ bf16/f16 ([`KernelBuilder::round_to`]), `impl Ops` for [`crate::math`] |
//! | `memory.rs` | GEPs, loads, stores, shared arrays, dynamic shared memory, `cp.async` (sm_80) |
//! | `warp.rs` | CTA and named barriers, votes, shuffles, [`Combine`], warp all-reduce |
//! | `mma.rs` | `ldmatrix`, `mma.sync.m16n8k16`, fragment packing (sm_80) |
//! | `hopper.rs` | `wgmma` ([`wgmma_k`]), mbarriers, TMA, `setmaxnreg` (sm_90a) |
//! | `cluster.rs` | cluster shape, `mapa`, cluster barriers (sm_90) |
//!
//! The layer knows no kernel family and no evaluator: it is the catalogue the families build
//! from. Kernels are `PTX_Kernel` functions ([`crate::PTX_KERNEL_CALL_CONV`]); buffers are
//! `ptr addrspace(1)` parameters, shared memory `addrspace(3)` globals; indices come from
//! `llvm.nvvm.read.ptx.sreg.*`; bf16/f16 are stored as such and computed in `f32`; symbolic
//! sizes are `i64` parameters after the buffers, so a generator builds each kernel twice (see
//! [`SizeTable`]). Every instruction is an NVVM intrinsic or a small inline-asm block, one call
//! each, so the CPU emulator of the tests can model it.
//!
//! A generator uses it like this (a sketch):
//!
//! ```no_run
//! # use sinter_codegen::isa::{KernelBuilder, ParamKind};
//! # use sinter_codegen::target::Target;
//! # fn main() -> Result<(), sinter_codegen::CodegenError> {
//! let cx = inkwell::context::Context::create();
//! let params = [ParamKind::input(), ParamKind::output(), ParamKind::Size];
//! let mut kb = KernelBuilder::new(&cx, "k0_example", &params, Target::SM_90A)?;
//! kb.set_max_threads(256);
//! let (x, y, n) = (kb.param_ptr(0)?, kb.param_ptr(1)?, kb.param_int(2)?);
//! let tid = kb.tid_x()?;
//! // ... kb.b (the inkwell builder) and the helpers of the files above ...
//! kb.ret()?;
//! let ptx = kb.finish()?;
//! # let _ = (x, y, n, tid, ptx); Ok(()) }
//! ```
//!
//! Design notes: book/src/design/isa.md

mod arith;
mod builder;
pub(crate) mod kit;
mod cluster;
mod hopper;
mod memory;
mod mma;
mod warp;

pub use arith::storage_type;
pub use builder::{capture_ir, name_value, KernelBuilder, ParamKind, SizeTable};
pub use hopper::wgmma_k;
pub use warp::Combine;

#[cfg(test)]
mod tests {
    use inkwell::context::Context;
    use inkwell::types::BasicTypeEnum;
    use sinter_ir::DType;

    use super::*;
    use crate::math::{self, Ops};
    use crate::target::Target;

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
