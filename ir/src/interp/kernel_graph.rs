//! Running a [`KernelGraph`] on the interpreter: each kernel's body, in launch order, over the
//! graph's buffers.

use crate::dim::Bindings;
use crate::graph::{Function, Graph};
use crate::kernel::{Buffer, KernelGraph};

use super::{Evaluator, InterpError, Result, Site, Tensor};

/// Evaluates a [`KernelGraph`] on `inputs` (one tensor per `kg.inputs` buffer, in order) and
/// returns the tensors of `kg.outputs`, in order.
///
/// Symbols are bound from the input buffers' declared shapes and `bindings`, as [`super::run`]
/// binds a function's parameters; each kernel body is then run with those bindings (so that a
/// body may use a symbol none of its own parameters determines). Every buffer a kernel reads
/// must have been written by an earlier kernel or be an input.
///
/// # Errors
/// The input count or types do not match the input buffers; a kernel reads a buffer nothing
/// has written yet; a kernel's results do not match its output buffers; and any error of a
/// body's evaluation (naming the kernel's body function, the node and the op).
pub fn run_kernel_graph(kg: &KernelGraph, inputs: &[&Tensor], bindings: &Bindings) -> Result<Vec<Tensor>> {
    let empty = Graph::new();
    let mut ev = Evaluator { g: &empty, callers: Vec::new(), comm: None };
    // Bind the graph's symbols from the input buffers, as a function's parameters would.
    let mut sig = Function::new("kernel_graph");
    for &b in &kg.inputs {
        let ty = kg.buffers.get(b).map(|d| d.ty.clone()).ok_or_else(|| malformed("kernel_graph", format!("input buffer {b} does not exist")))?;
        sig.add_param(kg.buffers[b].name.clone(), ty);
    }
    let all = ev.bind(&sig, inputs, bindings, None)?;
    // Storage as on the device: an in-place `kv_append` result shares its page input's slot,
    // so a kernel launched after the append reads the updated pages whichever value it names.
    let aliases = kg.in_place_aliases();
    let slot = |b: Buffer| aliases.get(&b).copied().unwrap_or(b).as_u32() as usize;
    let mut store: Vec<Option<Tensor>> = vec![None; kg.buffers.len()];
    for (&b, t) in kg.inputs.iter().zip(inputs) {
        store[b.as_u32() as usize] = Some((*t).clone());
    }
    for (k, kd) in kg.kernels.iter() {
        let name = &kd.body.name;
        let mut args = Vec::with_capacity(kd.inputs.len());
        for &b in &kd.inputs {
            match store.get(slot(b)).and_then(|s| s.as_ref()) {
                Some(t) => args.push(t),
                None => return Err(malformed(name, format!("kernel {k} reads buffer {b} before any kernel writes it"))),
            }
        }
        let outs = ev.eval(&kd.body, &args, &all, None)?;
        if outs.len() != kd.outputs.len() {
            return Err(malformed(name, format!("kernel {k} gives {} results for {} output buffers", outs.len(), kd.outputs.len())));
        }
        for (&b, t) in kd.outputs.iter().zip(outs) {
            let Some(place) = store.get_mut(slot(b)) else {
                return Err(malformed(name, format!("kernel {k} writes buffer {b}, which does not exist")));
            };
            *place = Some(t);
        }
    }
    let mut result = Vec::with_capacity(kg.outputs.len());
    for &b in &kg.outputs {
        match store.get(slot(b)).and_then(|s| s.clone()) {
            Some(t) => result.push(t),
            None => return Err(malformed("kernel_graph", format!("output buffer {b} is never written"))),
        }
    }
    Ok(result)
}

fn malformed(func: &str, message: String) -> InterpError {
    InterpError::Malformed { site: Site { func: func.to_string(), ..Site::default() }, message }
}
