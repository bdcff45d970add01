//! A kernel's LLVM IR (as its generator built it, before optimisation) turned into a task
//! function of the persistent kernel: the entry becomes `void @mk_task<i>`, its CTA
//! index and grid come from the claimed task's shared slots, its block size is a constant,
//! its CTA barriers count only its own threads when the persistent CTA is wider, and the
//! programmatic-launch wait becomes the dependency wait (`@mk_wait`), returning early when
//! the launch is abandoned. Whatever a task cannot do inside a shared CTA (clusters, TMA
//! tensor maps, named barriers, register reallocation, other special registers) is refused
//! with the reason.

use std::fmt::Write;

use sinter_ir::{KernelParam, LaunchPlan};

use super::dispatch::{slot, slot_ptr};

/// A kernel's IR rewritten as a task function.
pub(crate) struct TaskText {
    /// The module text.
    pub text: String,
    /// Whether the task calls `@mk_wait` itself (the kernel had a programmatic-launch wait).
    pub waits_inside: bool,
}

/// Special registers a task may still read as they are.
const KEPT_SREGS: [&str; 7] = ["tid.x", "tid.y", "tid.z", "laneid", "warpsize", "clock", "clock64"];

/// Rewrites kernel `plan.entry`'s IR `ir` as task function `index` of a persistent kernel
/// whose CTAs have `block` threads.
///
/// # Errors
/// Why the kernel cannot be a task, as a sentence.
pub(crate) fn rewrite(ir: &str, plan: &LaunchPlan, index: usize, block: u32) -> Result<TaskText, String> {
    let threads = plan.block[0];
    if plan.block[1] != 1 || plan.block[2] != 1 {
        return Err(format!("a {:?} block (tasks run on the x axis only)", plan.block));
    }
    if threads == 0 || threads % 32 != 0 || threads > block {
        return Err(format!("{threads} threads (a multiple of 32 up to the persistent CTA's {block})"));
    }
    if plan.params.iter().any(|p| matches!(p, KernelParam::TensorMap(_))) {
        return Err("a TMA tensor map parameter (a grid constant of its own launch)".into());
    }
    for (what, why) in [
        ("\"nvvm.cluster_dim\"", "a thread-block cluster"),
        ("setmaxnreg", "register reallocation (`setmaxnreg`)"),
        ("bar.sync", "a named barrier in inline PTX"),
        ("barrier.sync", "a named barrier in inline PTX"),
        ("bar.red", "a barrier reduction (`bar.red`) on a named barrier"),
        ("barrier.red", "a barrier reduction on a named barrier"),
        ("bar.arrive", "a split barrier (`bar.arrive`)"),
        ("barrier.cta.arrive", "a split barrier"),
        ("@llvm.nvvm.barrier0", "`barrier0`"),
        ("barrier.cta.sync.aligned.count", "a counted barrier"),
        ("mbarrier", "mbarriers (their shared words would be reused by the next task without `mbarrier.inval`)"),
        ("cp.async.bulk", "bulk asynchronous copies (TMA)"),
    ] {
        if ir.contains(what) {
            return Err(why.to_string());
        }
    }
    let define = format!("define ptx_kernel void @{}(", plan.entry);
    let Some(body) = ir.split_once(&define).map(|(_, rest)| rest.split("\n}").next().unwrap_or(rest)) else {
        return Err(format!("no `{define}` in its IR"));
    };
    // One exit: every thread of the task leaves at the end, together (a thread that returned
    // early would meet the claim loop's barrier while the others are at the task's).
    let rets = body.lines().filter(|l| l.trim_start().starts_with("ret ")).count();
    if rets != 1 {
        return Err(format!("{rets} `ret` instructions (a task must have one exit)"));
    }
    let mut out = String::with_capacity(ir.len() + 1024);
    let mut label = String::new();
    let mut waits = 0;
    let mut relabel: Vec<(String, String)> = Vec::new();
    for line in ir.lines() {
        let t = line.trim_start();
        if !line.starts_with(' ') && !t.starts_with(';') {
            if let Some((name, _)) = t.split_once(':').filter(|(n, _)| !n.contains(' ') && !n.is_empty()) {
                label = name.to_owned();
            }
        }
        if let Some(rest) = line.strip_prefix(&define) {
            let _ = writeln!(out, "define void @mk_task{index}({rest}");
            continue;
        }
        if t.contains("asm sideeffect \"griddepcontrol.launch_dependents;\"") {
            continue;
        }
        if t.contains("asm sideeffect \"griddepcontrol.wait;\"") {
            // Split the block: the task returns at once when the launch is abandoned.
            let go = format!("mk.go{waits}");
            let _ = writeln!(out, "  %mk.ok{waits} = call i1 @mk_wait(i32 {threads})\n  br i1 %mk.ok{waits}, label %{go}, label %mk.ret{waits}\nmk.ret{waits}:\n  ret void\n{go}:");
            relabel.push((label.clone(), go.clone()));
            label = go;
            waits += 1;
            continue;
        }
        if let Some((lhs, rhs)) = line.split_once(" = call i32 @llvm.nvvm.read.ptx.sreg.") {
            let name = rhs.split('(').next().unwrap_or("");
            let value = match name {
                "ctaid.x" | "ctaid.y" | "ctaid.z" | "nctaid.x" | "nctaid.y" | "nctaid.z" => {
                    let base = if name.starts_with('n') { slot::NCTAID } else { slot::CTAID };
                    let axis = u32::from(name.as_bytes()[name.len() - 1] - b'x');
                    format!("load i32, ptr addrspace(3) {}, align 4", slot_ptr(base + 4 * axis))
                }
                "ntid.x" => format!("add i32 0, {threads}"),
                "ntid.y" | "ntid.z" => "add i32 0, 1".to_owned(),
                n if KEPT_SREGS.contains(&n) => {
                    out.push_str(line);
                    out.push('\n');
                    continue;
                }
                n => return Err(format!("special register `%{n}`")),
            };
            let _ = writeln!(out, "{lhs} = {value}");
            continue;
        }
        if t.contains("@llvm.nvvm.read.ptx.sreg.") && !t.starts_with("declare") {
            let name = t.split("@llvm.nvvm.read.ptx.sreg.").nth(1).and_then(|r| r.split('(').next()).unwrap_or("");
            if !KEPT_SREGS.contains(&name) && name != "globaltimer" {
                return Err(format!("special register `%{name}` read as {t}"));
            }
        }
        if t.contains("@llvm.nvvm.barrier.cta.sync.aligned.all(") && !t.starts_with("declare") {
            if !t.contains("(i32 0)") {
                return Err(format!("a barrier other than barrier 0: {t}"));
            }
            if threads < block {
                let indent = &line[..line.len() - t.len()];
                let _ = writeln!(out, "{indent}call void @llvm.nvvm.barrier.cta.sync.aligned.count(i32 1, i32 {threads})");
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    if waits > 1 {
        return Err(format!("{waits} programmatic-launch waits (one, in the prologue, is expected)"));
    }
    // The old block's terminator now ends the split-off block: its successors' phis name it.
    for (old, new) in &relabel {
        out = out.lines().map(|l| if l.trim_start().contains(" = phi ") { l.replace(&format!(", %{old} ]"), &format!(", %{new} ]")) } else { l.to_owned() }).collect::<Vec<_>>().join("\n");
        out.push('\n');
    }
    let _ = writeln!(out, "@mk_slots = external addrspace(3) global [{} x i8], align 16", slot::BYTES);
    if !out.contains("@smem_dyn = ") {
        out.push_str("@smem_dyn = external addrspace(3) global [0 x i8], align 16\n");
    }
    out.push_str("declare i1 @mk_wait(i32)\n");
    if !out.contains("declare void @llvm.nvvm.barrier.cta.sync.aligned.count(") {
        out.push_str("declare void @llvm.nvvm.barrier.cta.sync.aligned.count(i32, i32)\n");
    }
    Ok(TaskText { text: out, waits_inside: waits == 1 })
}
