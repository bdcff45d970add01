//! Folding at load time: the kernels of a program that read only bound buffers (the weights)
//! and each other's results run once, after the weights are bound, and leave the per-step
//! program; their results become bound inputs named `folded:<buffer>`.
//!
//! Which kernels fold is [`KernelGraph::load_time_kernels`] with the bound inputs as the
//! fixed ones — the rule the passes mark `load_time` kernels with, so the fusion report's
//! per-step counts are what runs — and a launch without symbols (grid and size parameters):
//! a kernel reading nothing (a table built from `iota`) folds too. [`split`] is that choice
//! and the two kernel graphs it gives, with no device; [`super::GpuProgram::fold_bound`]
//! runs it. A [`FoldCache`] shared by several programs over the same weight buffers (prefill,
//! decode, the batch-specialised decodes) keeps one copy of each folded result: a result is
//! known by the kernel that computes it and the device buffers it reads.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use sinter_ir::{Buffer, BufferRole, KernelGraph, KernelParam, LaunchPlan};
use sinter_runtime::DeviceBuffer;

/// How a program splits into the kernels that fold and the per-step rest.
#[derive(Clone, Debug)]
pub struct Split {
    /// Indices (launch order) of the kernels that fold.
    pub folded: Vec<usize>,
    /// The folded kernels alone: the bound buffers they read as inputs, the results the rest
    /// reads as outputs (every buffer of the program kept, same ids).
    pub sub: KernelGraph,
    /// Their plans.
    pub sub_plans: Vec<LaunchPlan>,
    /// The per-step rest: `sub`'s outputs are its inputs too, named `folded:<buffer>`.
    pub rest: KernelGraph,
    /// Its plans.
    pub rest_plans: Vec<LaunchPlan>,
    /// The bound names the folded kernels read: rebinding one of them, or giving it for one
    /// run, needs the program as it was before folding.
    pub reads: BTreeSet<String>,
}

/// Whether a plan launches without a binding: no symbol in its grid or its size parameters.
fn static_launch(plan: &LaunchPlan) -> bool {
    plan.grid.iter().all(|g| g.numerator.symbols().is_empty())
        && plan.params.iter().all(|p| match p {
            KernelParam::Size(d) => d.symbols().is_empty(),
            _ => true,
        })
}

/// The name a folded result is bound under.
pub fn folded_name(b: Buffer) -> String {
    format!("folded:{b}")
}

/// Which kernels of `kg` (launched by `plans`, in order) fold when the inputs `bound` names are
/// bound, and the program split around them (module docs); `None` when none folds.
pub fn split(
    kg: &KernelGraph,
    plans: &[LaunchPlan],
    bound: &dyn Fn(&str) -> bool,
) -> Option<Split> {
    let is_bound = |b: Buffer| kg.buffers[b].name.as_deref().is_some_and(bound);
    let flags = kg.load_time_kernels(is_bound);
    let mut made: BTreeSet<Buffer> = BTreeSet::new();
    let mut folded = vec![];
    for (i, ((kd, plan), lt)) in kg.kernels.values().zip(plans).zip(flags).enumerate() {
        // A kernel after one that could not launch statically reads what is not made.
        if lt && static_launch(plan) && kd.inputs.iter().all(|b| is_bound(*b) || made.contains(b)) {
            made.extend(kd.outputs.iter().copied());
            folded.push(i);
        }
    }
    if folded.is_empty() {
        return None;
    }
    let mut sub = KernelGraph {
        buffers: kg.buffers.clone(),
        ..KernelGraph::default()
    };
    let mut rest = KernelGraph {
        buffers: kg.buffers.clone(),
        inputs: kg.inputs.clone(),
        outputs: kg.outputs.clone(),
        ..KernelGraph::default()
    };
    let (mut sub_plans, mut rest_plans) = (vec![], vec![]);
    let mut reads = BTreeSet::new();
    for (i, (kd, plan)) in kg.kernels.values().zip(plans).enumerate() {
        if folded.binary_search(&i).is_ok() {
            for b in &kd.inputs {
                if is_bound(*b) && !sub.inputs.contains(b) {
                    sub.inputs.push(*b);
                    reads.extend(kg.buffers[*b].name.clone());
                }
            }
            sub.kernels.push(kd.clone());
            sub_plans.push(plan.clone());
        } else {
            rest.kernels.push(kd.clone());
            rest_plans.push(plan.clone());
        }
    }
    for kd in rest.kernels.values() {
        for b in &kd.inputs {
            if made.contains(b) && !sub.outputs.contains(b) {
                sub.outputs.push(*b);
            }
        }
    }
    for &b in &sub.outputs {
        rest.buffers[b].name = Some(folded_name(b));
        rest.buffers[b].role = BufferRole::Input;
        rest.inputs.push(b);
    }
    Some(Split {
        folded,
        sub,
        sub_plans,
        rest,
        rest_plans,
        reads,
    })
}

/// A key for every buffer of `split.sub` that a kernel writes: a digest of the kernel (family,
/// body text, buffer types and layouts) and of the keys of what it reads, the bound inputs
/// known by their device address, dtype and shape (`device_key`).
pub fn result_keys(
    split: &Split,
    device_key: &dyn Fn(Buffer) -> Option<String>,
) -> BTreeMap<Buffer, String> {
    let sub = &split.sub;
    let mut keys: BTreeMap<Buffer, String> = BTreeMap::new();
    for &b in &sub.inputs {
        if let Some(k) = device_key(b) {
            keys.insert(b, k);
        }
    }
    for kd in sub.kernels.values() {
        let mut h = Sha256::new();
        h.update(format!("{:?}\n", kd.family));
        h.update(sinter_ir::text::print_function(&kd.body));
        for b in &kd.inputs {
            let bd = &sub.buffers[*b];
            h.update(format!(
                "in {} {:?} {}\n",
                bd.ty,
                bd.layout,
                keys.get(b).map_or("?", String::as_str)
            ));
        }
        let digest: String = h.finalize().iter().map(|x| format!("{x:02x}")).collect();
        for (j, b) in kd.outputs.iter().enumerate() {
            let bd = &sub.buffers[*b];
            keys.insert(*b, format!("{digest}/{j} {} {:?}", bd.ty, bd.layout));
        }
    }
    keys
}

/// A folded result and the buffers it was computed from, by key.
type Entries = HashMap<String, (DeviceBuffer, Vec<DeviceBuffer>)>;

/// Folded results shared between programs over the same bound buffers (module docs). Cloning
/// shares the cache. An entry keeps the buffers its kernels read alive, so no other buffer can
/// take their addresses while it is known; a bound buffer must not be rewritten in place while
/// programs fold from it.
#[derive(Clone, Default)]
pub struct FoldCache {
    entries: Arc<Mutex<Entries>>,
}

impl FoldCache {
    /// An empty cache.
    pub fn new() -> FoldCache {
        FoldCache::default()
    }

    /// The result known by `key`.
    pub fn get(&self, key: &str) -> Option<DeviceBuffer> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|(b, _)| b.clone())
    }

    /// Keeps `buf` as the result known by `key` (computed from `inputs`), unless one is kept
    /// already; returns the one kept.
    pub fn insert(
        &self,
        key: String,
        buf: DeviceBuffer,
        inputs: Vec<DeviceBuffer>,
    ) -> DeviceBuffer {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert((buf, inputs))
            .0
            .clone()
    }

    /// Results kept.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
