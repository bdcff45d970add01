//! A kernel graph run as one persistent kernel ([`crate::persistent`]) on the emulator, over
//! host buffers laid out as [`super::graph`] lays them out, with the launch's tables built
//! as the runtime builds them. The emulator runs CTAs one after another, so the first CTA
//! claims every task and the others find none: this checks the task functions, the shared
//! slots and region, the counted barriers, the waits and the tables, not the interleaving of
//! CTAs on a device.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use sinter_ir::interp::Tensor;
use sinter_ir::kernel::persistent::{self, Instance, TimedOut};
use sinter_ir::{Bindings, Buffer, GridDim, KernelGraph, KernelParam};

use super::graph::{bind, eval_shape, extent, label, panic_text, tensor_bytes, tensor_from_bytes, GraphRunError, Storage};
use crate::persistent::PersistentBuild;

/// What a persistent launch on the emulator left.
pub struct PersistentRun {
    /// The graph's outputs, in order.
    pub outputs: Vec<Tensor>,
    /// The task that timed out, if one did.
    pub timed_out: Option<TimedOut>,
    /// The `state` array after the launch.
    pub state: Vec<u32>,
    /// The completion counters after the launch (zeroed by the last CTA out).
    pub counters: Vec<u32>,
    /// With `profile`: each instance's span (first claim, last completion; ns after the
    /// first claim).
    pub spans: Vec<Option<(u64, u64)>>,
}

/// Runs `kg` as the persistent kernel `build` on `ctas` CTAs over `inputs` (one tensor per
/// `kg.inputs` buffer), a wait timing out after `timeout_ns`; `never_completes` plants an
/// instance whose completion is never counted; `profile` records each instance's span.
///
/// # Errors
/// As [`super::graph::run_plans`]; a kernel with a tensor-map parameter or an instance table
/// that cannot be built is [`GraphRunError::Input`].
#[allow(clippy::too_many_arguments)]
pub fn run_persistent(kg: &KernelGraph, build: &PersistentBuild, inputs: &[&Tensor], extra: &Bindings, ctas: u32, timeout_ns: u64, never_completes: Option<usize>, profile: bool) -> Result<PersistentRun, GraphRunError> {
    let program = &build.program;
    if program.tasks.len() != kg.kernels.len() {
        return Err(GraphRunError::Input(format!("{} tasks for {} kernels", program.tasks.len(), kg.kernels.len())));
    }
    let bindings = bind(kg, inputs, extra)?;
    let aliases = kg.in_place_aliases();
    let root = |b: Buffer| aliases.get(&b).copied().unwrap_or(b);
    let mut store: BTreeMap<Buffer, Storage> = BTreeMap::new();
    for (b, t) in kg.inputs.iter().zip(inputs) {
        let len = extent(&kg.buffers[*b], &bindings, *b)?;
        store.insert(*b, Storage::new(&tensor_bytes(t), len, 0));
    }
    let mut instances = Vec::new();
    for (i, (k, data)) in kg.kernels.iter().enumerate() {
        let (function, plan) = &program.tasks[i];
        for b in data.inputs.iter().chain(&data.outputs) {
            let r = root(*b);
            if !store.contains_key(&r) {
                let len = extent(&kg.buffers[r], &bindings, r)?;
                store.insert(r, Storage::new(&[], len, 0xFF));
            }
        }
        if !kg.has_work(k, plan, &bindings).map_err(|e| GraphRunError::Input(format!("kernel {k}: {e}")))? {
            continue;
        }
        let addrs: Vec<u64> = data.inputs.iter().chain(&data.outputs).map(|b| store.get_mut(&root(*b)).map_or(0, Storage::addr)).collect();
        let args = plan
            .params
            .iter()
            .map(|p| match p {
                KernelParam::Buffer(j) => addrs.get(*j).copied().ok_or_else(|| GraphRunError::Input(format!("kernel {k}: buffer parameter {j}"))),
                KernelParam::Size(d) => d.eval(&bindings).map(|v| v as u64).map_err(|e| GraphRunError::Input(format!("kernel {k}: {e}"))),
                KernelParam::TensorMap(_) => Err(GraphRunError::Input(format!("kernel {k}: a tensor map in a persistent task"))),
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let grid = plan.grid.iter().map(|g| g.eval(&bindings)).collect::<Result<Vec<u32>, _>>().map_err(|e| GraphRunError::Input(format!("kernel {k}: grid: {e}")))?;
        let cta_count = grid.iter().map(|&g| u64::from(g)).product::<u64>().min(u64::from(u32::MAX)) as u32;
        let chunk = persistent::chunk_for(cta_count, ctas);
        instances.push(Instance { function: *function, grid: [grid[0], grid[1], grid[2]], args, chunk });
    }
    let mut t = persistent::tables(&instances, timeout_ns, never_completes).map_err(GraphRunError::Input)?;
    t.state[persistent::state::PROFILE] = u32::from(profile);
    let mut prof = persistent::profile_init(instances.len());
    let mut plan = program.kernel.clone();
    plan.ptx = build.ir.clone();
    plan.grid = [GridDim::fixed(ctas.max(1)), GridDim::fixed(1), GridDim::fixed(1)];
    let addrs = [t.instances.as_mut_ptr() as u64, t.task_instance.as_mut_ptr() as u64, t.args.as_mut_ptr() as u64, t.counters.as_mut_ptr() as u64, t.state.as_mut_ptr() as u64, prof.as_mut_ptr() as u64];
    catch_unwind(AssertUnwindSafe(|| super::run_at(&plan, &bindings, &addrs))).map_err(|p| GraphRunError::Emulator { kernel: sinter_ir::Kernel::from_u32(0), entry: plan.entry.clone(), message: panic_text(&*p) })?;
    for (b, s) in &store {
        if let Some((side, offset, bytes)) = s.guard_violation() {
            return Err(GraphRunError::OutOfBounds { kernel: sinter_ir::Kernel::from_u32(0), entry: plan.entry.clone(), buffer: label(kg, *b), side, offset, bytes, len: s.data().len() });
        }
    }
    let outputs = kg
        .outputs
        .iter()
        .map(|b| {
            let s = store.get(&root(*b)).ok_or_else(|| GraphRunError::Input(format!("output {b} is never written")))?;
            let shape = eval_shape(kg, *b, &bindings)?;
            tensor_from_bytes(kg.buffers[*b].ty.dtype, &shape, s.data())
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PersistentRun { outputs, timed_out: persistent::error(&t.state, &t.task_instance), state: t.state, counters: t.counters, spans: persistent::spans(&prof) })
}
