//! Helpers the unit tests of every family share: a one-kernel graph ([`single_kernel`]), dims
//! and types in one call, a launch plan in one line ([`plan_line`]) and ptxas's report of a
//! plan ([`assemble`], asserting no spills, no stack, no warnings).

use sinter_ir::{Buffer, BufferData, BufferRole, DType, Dim, Family, Function, Kernel, KernelData, KernelGraph, KernelParam, LaunchPlan, Layout, TensorType, Value};

use crate::ptxas;

/// A kernel graph holding one kernel of `family` with `body`, every buffer contiguous.
pub(crate) fn single_kernel(family: Family, body: Function) -> (KernelGraph, Kernel) {
    let mut g = KernelGraph::default();
    let mut add = |v: Value, role: BufferRole| -> Buffer {
        let ty = body.ty(v).clone();
        let layout = Layout::contiguous(&ty.shape);
        g.buffers.push(BufferData { name: body.values[v].name.clone(), ty, role, layout })
    };
    let inputs: Vec<Buffer> = body.params.iter().map(|&p| add(p, BufferRole::Input)).collect();
    let outputs: Vec<Buffer> = body.outputs.iter().map(|&o| add(o, BufferRole::Output)).collect();
    let k = g.kernels.push(KernelData { family, body, inputs: inputs.clone(), outputs: outputs.clone() });
    g.inputs = inputs;
    g.outputs = outputs;
    (g, k)
}

/// A tensor type.
pub(crate) fn ty(dt: DType, dims: &[Dim]) -> TensorType {
    TensorType::new(dt, dims.iter().cloned())
}

/// A constant dim.
pub(crate) fn d(n: i64) -> Dim {
    Dim::constant(n)
}

/// A symbolic dim.
pub(crate) fn sym(s: &str) -> Dim {
    Dim::symbol(s)
}

/// One line about a plan: entry, target, launch geometry, parameters.
pub(crate) fn plan_line(plan: &LaunchPlan) -> String {
    let grid: Vec<String> = plan.grid.iter().map(|g| format!("⌈{}/{}⌉", g.numerator, g.denominator)).collect();
    let sizes: Vec<String> = plan
        .params
        .iter()
        .filter_map(|p| match p {
            KernelParam::Size(d) => Some(d.to_string()),
            KernelParam::TensorMap(t) => Some(format!("tmap(buffer {}, box {:?})", t.buffer, t.box_dims)),
            KernelParam::Buffer(_) => None,
        })
        .collect();
    format!(
        "{} {}: grid [{}], block {:?}, dynamic smem {}, {} buffers, sizes [{}]",
        plan.entry,
        plan.target,
        grid.join(", "),
        plan.block,
        plan.shared_bytes,
        plan.params.len() - sizes.len(),
        sizes.join(", ")
    )
}

/// Assembles `plan` with ptxas for its target, asserts no spills, no stack and no
/// warnings, and returns ptxas's line for the kernel; `None` when ptxas is missing outside
/// CI (it is an error in CI).
pub(crate) fn assemble(plan: &LaunchPlan) -> Option<String> {
    let ptxas = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}"))?;
    let target = plan.target;
    let report = ptxas::assemble_with(&ptxas, &plan.ptx, &target).unwrap_or_else(|e| panic!("{}: {e}", plan.entry));
    let k = report.function(&plan.entry).unwrap_or_else(|| panic!("{report:?}"));
    assert!(!report.spills(), "{}: spills\n{report}", plan.entry);
    assert_eq!(k.stack_frame_bytes, 0, "{}: stack\n{report}", plan.entry);
    assert!(report.warnings.is_empty(), "{report}");
    assert!(!plan.ptx.contains("call."), "{}: a call in the PTX", plan.entry);
    Some(report.to_string())
}
