//! The pointwise family ([`Family::Pointwise`]): any fused element-wise expression, written
//! to contiguous (or strided) outputs of one shape.
//!
//! # What a kernel computes
//! The body is a DAG of element-wise ops of the op table — unary (`neg abs exp log sqrt rsqrt
//! recip sigmoid silu gelu(erf|tanh) tanh erf sin cos cast`), binary with NumPy broadcasting
//! (`add sub mul div maximum minimum pow`), comparisons, `select`, `swiglu`, `rope` (both
//! forms), sources (`constant`, `iota`) and views (`reshape`, `slice`, `broadcast`,
//! `transpose`, `permute`, `concat`, `gather`) — whose outputs all have one shape `S`. Each
//! output element is computed by the element evaluator (`kernels::element`): operands are
//! read from their buffers with their strides (0 for broadcast axes), every op computes in
//! `f32` (or in its integer dtype, saturating) and rounds its result to its dtype, as the
//! interpreter does. Transcendentals are [`crate::math`]'s: `f32` results get the precise
//! versions (≤ 3 ulp), `bf16`/`f16` results the fast ones (`ex2.approx`, `div.approx`), whose
//! error is far below half a `bf16` ulp.
//!
//! # Schedule
//! The element-wise kernel driver of `element/kernel.rs`, shared with the layout and gather
//! families: a grid-stride loop over groups of `vec` elements of the innermost axis (flat,
//! shaped, or paired for RoPE), chosen by [`PointwiseSchedule`] or by default.
//!
//! Design notes: book/src/design/element-wise.md

use sinter_ir::{Family, Kernel, KernelGraph, LaunchPlan};

use super::elementwise::generate_elementwise;
use super::family::Generator;
use super::ctx::KernelCtx;
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;

pub use super::elementwise::PointwiseSchedule;

/// Generates pointwise kernel `kernel` of `graph` with the default schedule.
///
/// Parameters: the kernel's buffers, then its symbolic sizes. Grid `(⌈numel/(vec·block)⌉,
/// 1, 1)`, block `(block, 1, 1)`, no dynamic shared memory.
///
/// # Errors
/// [`CodegenError::Unsupported`] for ops that need their own kernel (matmul, attention,
/// reductions) or outputs of different shapes; [`CodegenError::BadKernel`] for a body that
/// does not match its buffers; LLVM errors.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    super::family::compile::<Pointwise>(graph, kernel, target)
}

/// The pointwise family's generator: the element-wise kernel driver, default schedule.
pub(crate) struct Pointwise;

impl Generator for Pointwise {
    type Analysis<'g> = KernelCtx<'g>;
    /// `None`: the driver's choice (named `default`).
    type Schedule = Option<PointwiseSchedule>;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<KernelCtx<'g>> {
        let cx = KernelCtx::new(graph, kernel)?;
        if cx.data.family != Family::Pointwise {
            return Err(cx.bad(format!("a {:?} kernel given to the pointwise generator", cx.data.family)));
        }
        Ok(cx)
    }
    fn default_schedule(_: &KernelCtx<'_>, _: &Target) -> R<Option<PointwiseSchedule>> {
        Ok(None)
    }
    fn build(cx: &KernelCtx<'_>, s: &Option<PointwiseSchedule>, target: &Target) -> R<LaunchPlan> {
        generate_elementwise(cx, target, *s)
    }
}
