//! The layout family ([`Family::Layout`]): data movement — `transpose`, `permute`,
//! `broadcast`, `concat`, `slice`, `reshape` of a non-contiguous value — as a strided gather
//! into a contiguous (or strided) output.
//!
//! A layout kernel is the element-wise kernel driver's (`kernels::element`): each output
//! element's coordinate is mapped back through the body's view ops by the element
//! evaluator — `permute`/`transpose` permute the coordinate, `slice` adds its start,
//! `broadcast` pins size-1 axes to 0, `reshape` goes through the row-major linear index (the
//! common trailing dims map unchanged, so a reshape that keeps the innermost axis stays
//! vectorised), and `concat` branches on the coordinate along its axis to the input that
//! holds it. Writes are contiguous and vectorised along the output's innermost axis (16 bytes
//! per thread where its extent is a multiple of the vector width); reads are vectorised where
//! the innermost output axis is also the input's contiguous innermost axis (`concat`,
//! `slice`, `broadcast` of leading axes, reshapes), element by element otherwise (a transpose
//! of the innermost axis).
//!
//! Design notes: book/src/design/element-wise.md

use sinter_ir::{Family, Kernel, KernelGraph, LaunchPlan};

use super::elementwise::{generate_elementwise, PointwiseSchedule};
use super::family::Generator;
use super::ctx::KernelCtx;
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;

/// Generates layout kernel `kernel` of `graph` (see the module docs).
///
/// Parameters: the kernel's buffers, then its symbolic sizes (including a symbolic `slice`
/// start). Grid `(⌈numel/(vec·256)⌉, 1, 1)`, block `(256, 1, 1)`.
///
/// # Errors
/// [`CodegenError::Unsupported`] for ops that are not views, sources or element-wise;
/// [`CodegenError::BadKernel`] for a body that does not match its buffers.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    super::family::compile::<Layout>(graph, kernel, target)
}

/// The layout family's generator: the element-wise kernel driver, default schedule.
pub(crate) struct Layout;

impl Generator for Layout {
    type Analysis<'g> = KernelCtx<'g>;
    /// `None`: the driver's choice (named `default`).
    type Schedule = Option<PointwiseSchedule>;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<KernelCtx<'g>> {
        let cx = KernelCtx::new(graph, kernel)?;
        if cx.data.family != Family::Layout {
            return Err(cx.bad(format!("a {:?} kernel given to the layout generator", cx.data.family)));
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
