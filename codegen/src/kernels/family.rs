//! The one shape every kernel family has as the dispatcher sees it: analyse the kernel, pick a
//! schedule (or list the autotuning candidates), build the launch plan.
//!
//! Each family implements [`Generator`] on a zero-sized struct in its own module
//! ([`super::pointwise::Pointwise`], [`super::reduce::RowReduction`], [`super::matmul::Matmul`],
//! [`super::attention::Attention`], …); [`compile`] and [`candidates`] are
//! written once over the trait, and [`super::compile_family`] / [`super::family_candidates`]
//! map a [`sinter_ir::Family`] to its generator.
//!
//! Design notes: book/src/design/kernel-families.md

use std::rc::Rc;

use sinter_ir::{Kernel, KernelGraph, LaunchPlan};

use crate::error::CodegenError;
use crate::math::R;
use crate::target::Target;

/// A named schedule candidate of a kernel and a closure that compiles it
/// ([`crate::schedule_variants`]).
pub type Candidate<'a> = (String, Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a>);

/// A kernel family's generator as the dispatcher sees it.
pub(crate) trait Generator {
    /// What the family learns of one kernel before scheduling it (its checked context, or its
    /// own analysis: the matmul's `Spec`, attention's `Prefill` / `Paged`).
    type Analysis<'g>;
    /// One way to run the kernel (tiles, threads, stages); [`Schedule::name`] is the
    /// autotuner's key.
    type Schedule: Schedule;
    /// Analyses kernel `kernel` of `graph`: the errors a body outside the family raises.
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, target: &Target) -> R<Self::Analysis<'g>>;
    /// The schedule [`crate::compile_kernel`] uses.
    fn default_schedule(a: &Self::Analysis<'_>, target: &Target) -> R<Self::Schedule>;
    /// The autotuning candidates, the default first, in a stable order.
    fn candidates(a: &Self::Analysis<'_>, target: &Target) -> R<Vec<Self::Schedule>> {
        Ok(vec![Self::default_schedule(a, target)?])
    }
    /// Generates the kernel with schedule `s`.
    fn build(a: &Self::Analysis<'_>, s: &Self::Schedule, target: &Target) -> R<LaunchPlan>;
}

/// One schedule of a family.
pub(crate) trait Schedule {
    /// A short, stable name (`mma 128x256x64 w2x4 s3`, `rows t512 u2 c8`; `default` for a
    /// family with one schedule): the autotune records are keyed by it.
    fn name(&self) -> String;
}

/// The schedule of a family that has one: its generator decides everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fixed;

impl Schedule for Fixed {
    fn name(&self) -> String {
        "default".into()
    }
}

/// The element-wise families' schedule: `None` is the driver's choice, the one candidate.
impl Schedule for Option<super::elementwise::PointwiseSchedule> {
    fn name(&self) -> String {
        match self {
            None => "default".into(),
            Some(s) => format!("{s:?}"),
        }
    }
}

/// Generates kernel `kernel` of `graph` with family `G`'s default schedule.
pub(crate) fn compile<G: Generator>(graph: &KernelGraph, kernel: Kernel, target: &Target) -> R<LaunchPlan> {
    let a = G::analyse(graph, kernel, target)?;
    let s = G::default_schedule(&a, target)?;
    G::build(&a, &s, target)
}

/// Family `G`'s schedule candidates of kernel `kernel`, named, each with a closure that
/// compiles it (the analysis is shared).
pub(crate) fn candidates<'a, G>(graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> R<Vec<Candidate<'a>>>
where
    G: Generator + 'a,
    G::Analysis<'a>: 'a,
    G::Schedule: 'a,
{
    let a: Rc<G::Analysis<'a>> = Rc::new(G::analyse(graph, kernel, target)?);
    Ok(G::candidates(&a, target)?
        .into_iter()
        .map(|s| {
            let a = a.clone();
            let name = s.name();
            let build: Box<dyn FnOnce() -> R<LaunchPlan> + 'a> = Box::new(move || {
                let a: &G::Analysis<'a> = &a;
                G::build(a, &s, target)
            });
            (name, build)
        })
        .collect())
}
