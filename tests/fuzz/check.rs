//! One fuzz case on the CPU: the interpreter's result (the reference), then the unfused and
//! the fused lowering, each compiled for the emulator and run on it
//! (`sinter_codegen::emu::graph`), every output compared with DESIGN.md's rule.

use sinter::ir::{Graph, KernelGraph};
use sinter::{Bindings, DType, Target, Tensor};
use sinter_codegen::emu::graph::{compile_plans, run_plans, GraphRunError};

use super::gen::Features;

/// What one case gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Both lowerings matched the interpreter; kernels of each.
    Pass { unfused: usize, fused: usize },
    /// Nothing to compare (the interpreter refused the inputs, or the code generator refuses
    /// the graph unfused too): why.
    Skip(String),
    /// A bug: which path and what.
    Finding(String),
}

/// DESIGN.md's element-wise rule (f32 widened to rtol 2e-5, as the emulator's host `exp2`
/// stands in for `ex2.approx`): `|out − ref| ≤ atol + rtol·|ref|`, NaN exactly where the
/// reference has NaN, ±inf equal; integers and bools exact.
pub fn compare(what: &str, out: &Tensor, want: &Tensor) -> Result<(), String> {
    if out.shape() != want.shape() || out.dtype() != want.dtype() {
        return Err(format!("{what}: {}{:?} vs reference {}{:?}", out.dtype(), out.shape(), want.dtype(), want.shape()));
    }
    let max_ref = want.data().iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()));
    let (rtol, atol) = match want.dtype() {
        DType::BF16 | DType::F16 => (1.6e-2, 1e-2 * max_ref),
        DType::F32 => (2e-5, 2e-6 * max_ref),
        _ => (0.0, 0.0),
    };
    for (i, (&o, &r)) in out.data().iter().zip(want.data()).enumerate() {
        let bad = if r.is_nan() || o.is_nan() {
            r.is_nan() != o.is_nan()
        } else if r.is_infinite() || o.is_infinite() {
            r != o
        } else {
            (o - r).abs() > atol + rtol * r.abs()
        };
        if bad {
            let idx = unravel(i, want.shape());
            return Err(format!("{what}: element {idx:?} of {:?}: {o} vs reference {r} (max |ref| {max_ref:e})", want.shape()));
        }
    }
    Ok(())
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (a, &d) in shape.iter().enumerate().rev() {
        idx[a] = i % d.max(1);
        i /= d.max(1);
    }
    idx
}

/// The inputs of `kg` (its input buffers, by name) from the graph's named inputs.
pub fn kernel_inputs<'a>(kg: &KernelGraph, inputs: &'a [(String, Tensor)]) -> Result<Vec<&'a Tensor>, String> {
    kg.inputs
        .iter()
        .map(|b| {
            let name = kg.buffers[*b].name.as_deref().unwrap_or("");
            inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| format!("kernel graph input `{name}` is not a graph parameter"))
        })
        .collect()
}

/// Why an emulated run gave no outputs.
enum Failed {
    /// The code generator refuses a kernel.
    Refused(String),
    /// The emulator cannot run a kernel (its own limits: TMA, host IR it cannot rewrite).
    Emulator(String),
    /// The run went wrong: out-of-bounds or foreign writes, a failure inside a kernel.
    Run(String),
}

/// `kg` compiled for the emulator and run on it.
fn emulate(kg: &KernelGraph, target: &Target, inputs: &[(String, Tensor)]) -> Result<Vec<Tensor>, Failed> {
    let plans = compile_plans(kg, target).map_err(|e| Failed::Refused(e.to_string()))?;
    let ins = kernel_inputs(kg, inputs).map_err(Failed::Run)?;
    run_plans(kg, &plans, &ins, &Bindings::new()).map_err(|e| match e {
        GraphRunError::Codegen { .. } => Failed::Refused(e.to_string()),
        GraphRunError::Emulator { ref message, .. } if message.contains("host IR does not parse") || message.contains("runs no TMA kernel") => Failed::Emulator(e.to_string()),
        other => Failed::Run(other.to_string()),
    })
}

/// The fraction of a low-precision output that must equal the reference bit for bit in a
/// graph of explicit casts: where the graph rounds is where the kernel must round, so only
/// the rare element whose f32 statistics differ in the last bit may round the other way.
const SAME_ROUNDING: f64 = 0.9;

fn compare_all(path: &str, got: &[Tensor], want: &[Tensor], strict: bool) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{path}: {} outputs, the interpreter gives {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        compare(&format!("{path}: output {i}"), g, w)?;
        if strict && matches!(w.dtype(), DType::BF16 | DType::F16) && w.numel() >= 16 {
            let same = g.data().iter().zip(w.data()).filter(|(a, b)| a == b || (a.is_nan() && b.is_nan())).count();
            let frac = same as f64 / w.numel() as f64;
            if frac < SAME_ROUNDING {
                return Err(format!("{path}: output {i}: only {:.0}% of the elements round as the graph does (explicit casts: at least {:.0}% must be bit-identical)", 100.0 * frac, 100.0 * SAME_ROUNDING));
            }
        }
    }
    Ok(())
}

/// Runs one case: `graph` on the values of `vseed` (drawn under `feats`), the lowerings compiled for `target`
/// and emulated; with `ptx_targets`, the fused lowering for each of them is also compiled to
/// PTX (not run): a kernel the passes formed that the generator refuses is a finding. With
/// `strict` (a graph of explicit casts), low-precision outputs must also round as the graph
/// does ([`SAME_ROUNDING`]).
pub fn check_case(graph: &Graph, vseed: u64, feats: Features, strict: bool, target: &Target, ptx_targets: &[Target]) -> Outcome {
    let inputs = super::values::inputs(graph, vseed, feats);
    let refs: Vec<&Tensor> = inputs.iter().map(|(_, t)| t).collect();
    let want = match sinter::ir::interp::run_entry(graph, &refs, &Bindings::new()) {
        Ok(w) => w,
        Err(e) => return Outcome::Skip(format!("interpreter: {e}")),
    };
    let unfused = match sinter_passes::lower_unfused(graph) {
        Ok(kg) => kg,
        Err(e) => return Outcome::Finding(format!("unfused lowering failed: {e}")),
    };
    let mut unfused_compiles = true;
    match emulate(&unfused, target, &inputs) {
        Ok(got) => {
            if let Err(e) = compare_all("unfused", &got, &want, strict) {
                return Outcome::Finding(e);
            }
        }
        Err(Failed::Refused(e)) => {
            unfused_compiles = false;
            eprintln!("  unfused does not compile for {target}: {}", e.lines().next().unwrap_or(""));
        }
        Err(Failed::Emulator(e)) => return Outcome::Skip(format!("unfused: {}", e.lines().next().unwrap_or(""))),
        Err(Failed::Run(e)) => return Outcome::Finding(format!("unfused: {e}")),
    }
    let opts = sinter_passes::PassOptions::for_graph(graph);
    let fused = match sinter_passes::compile(graph, target, &opts) {
        Ok((kg, _)) => kg,
        Err(e) => return Outcome::Finding(format!("fused lowering failed: {e}")),
    };
    match emulate(&fused, target, &inputs) {
        Ok(got) => {
            if let Err(e) = compare_all("fused", &got, &want, strict) {
                return Outcome::Finding(e);
            }
        }
        Err(Failed::Refused(e)) if unfused_compiles => return Outcome::Finding(format!("fused for {target} does not compile where unfused does: {e}")),
        Err(Failed::Refused(e)) => return Outcome::Skip(format!("neither lowering compiles for {target}: {e}")),
        Err(Failed::Emulator(e)) => return Outcome::Skip(format!("fused: {}", e.lines().next().unwrap_or(""))),
        Err(Failed::Run(e)) => return Outcome::Finding(format!("fused: {e}")),
    }
    for t in ptx_targets {
        if let Err(e) = ptx_check(graph, t) {
            return Outcome::Finding(e);
        }
    }
    if !unfused_compiles {
        return Outcome::Skip(format!("unfused does not compile for {target}"));
    }
    Outcome::Pass { unfused: unfused.kernels.len(), fused: fused.kernels.len() }
}

/// The fused lowering for `t` compiled to PTX, kernel by kernel; a refusal is an error only
/// when the unfused lowering compiles for `t`.
fn ptx_check(graph: &Graph, t: &Target) -> Result<(), String> {
    let opts = sinter_passes::PassOptions::for_graph(graph);
    let (kg, _) = sinter_passes::compile(graph, t, &opts).map_err(|e| format!("fused lowering for {t} failed: {e}"))?;
    let Some((k, e)) = kg.kernels.keys().find_map(|k| sinter_codegen::compile_kernel(&kg, k, t).err().map(|e| (k, e))) else {
        return Ok(());
    };
    let un = sinter_passes::lower_unfused(graph).map_err(|e| e.to_string())?;
    if un.kernels.keys().all(|k| sinter_codegen::compile_kernel(&un, k, t).is_ok()) {
        return Err(format!("fused for {t}: kernel {k} ({:?}) does not compile where unfused does: {e}", kg.kernels[k].family));
    }
    Ok(())
}
