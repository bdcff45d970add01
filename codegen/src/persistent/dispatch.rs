//! The persistent kernel's own code, as LLVM IR text: the claim loop that runs the task
//! functions ([`kernel`]) and the dependency wait the tasks call ([`WAIT`]). The layout of
//! the global arrays is [`sinter_ir::kernel::persistent`]'s.

use std::fmt::Write;

use sinter_ir::kernel::persistent::{instance, state, INSTANCE_WORDS};
use sinter_ir::KernelParam;

/// The entry point of every persistent kernel.
pub const ENTRY: &str = "sinter_persistent";

/// Byte offsets in `@mk_slots`, the CTA's shared copy of the claimed task.
pub(crate) mod slot {
    pub const TASK: u32 = 0;
    pub const INSTANCE: u32 = 4;
    pub const FUNCTION: u32 = 8;
    pub const FIRST_ARG: u32 = 12;
    /// `%ctaid.x`, `.y`, `.z` of the task (three words).
    pub const CTAID: u32 = 16;
    /// `%nctaid.x`, `.y`, `.z` of the task's kernel (three words).
    pub const NCTAID: u32 = 28;
    pub const OK: u32 = 40;
    /// CTAs of the instance waited for.
    pub const NEED: u32 = 44;
    /// The instance waited for, or `u32::MAX` for none.
    pub const WAITED: u32 = 48;
    /// The task's first CTA and its CTA count.
    pub const CHUNK_FIRST: u32 = 52;
    pub const CHUNK_COUNT: u32 = 56;
    /// One more than the last instance this CTA has seen complete (0: none yet).
    pub const KNOWN: u32 = 60;
    pub const BYTES: u32 = 64;
}

/// A shared slot's address as an LLVM constant expression.
pub(crate) fn slot_ptr(offset: u32) -> String {
    format!("getelementptr inbounds (i8, ptr addrspace(3) @mk_slots, i64 {offset})")
}

/// What the dispatcher needs of a task function.
pub(crate) struct Signature<'a> {
    /// Threads it runs on.
    pub threads: u32,
    /// Its parameters (buffers are pointers, sizes `i64`s).
    pub params: &'a [KernelParam],
    /// Whether it calls the wait itself (where the kernel waited for its predecessor grid).
    pub waits_inside: bool,
}

/// The dependency wait, `i1 @mk_wait(i32 threads)`, called by the task's `threads` threads:
/// thread 0 spins (acquire loads) until the waited instance has counted all its CTAs, the
/// abort flag is up, or the timeout passes (then it records the task and raises the flag);
/// a barrier of the task's threads publishes the outcome. True: go on; false: return.
pub(crate) const WAIT: &str = r#"
define i1 @mk_wait(i32 %threads) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %lead = icmp eq i32 %tid, 0
  br i1 %lead, label %first, label %sync
first:
  %waited = load i32, ptr addrspace(3) SLOT_WAITED, align 4
  %none = icmp eq i32 %waited, -1
  br i1 %none, label %pass, label %cached
cached:
  %known = load i32, ptr addrspace(3) SLOT_KNOWN, align 4
  %waited1k = add i32 %waited, 1
  %seen = icmp ule i32 %waited1k, %known
  br i1 %seen, label %pass, label %setup
setup:
  %need = load i32, ptr addrspace(3) SLOT_NEED, align 4
  %counters = load ptr addrspace(1), ptr addrspace(3) @mk_ptrs, align 8
  %state = load ptr addrspace(1), ptr addrspace(3) getelementptr inbounds (i8, ptr addrspace(3) @mk_ptrs, i64 8), align 8
  %cp = getelementptr i32, ptr addrspace(1) %counters, i32 %waited
  %abortp = getelementptr i32, ptr addrspace(1) %state, i64 STATE_ABORT
  %tp = getelementptr i32, ptr addrspace(1) %state, i64 STATE_TIMEOUT
  %timeout = load i64, ptr addrspace(1) %tp, align 4
  %t0 = call i64 @llvm.nvvm.read.ptx.sreg.globaltimer()
  br label %spin
spin:
  %c = load atomic i32, ptr addrspace(1) %cp syncscope("device") acquire, align 4
  %done = icmp uge i32 %c, %need
  br i1 %done, label %complete, label %check
complete:
  store i32 %waited1k, ptr addrspace(3) SLOT_KNOWN, align 4
  br label %pass
check:
  %ab = load atomic i32, ptr addrspace(1) %abortp syncscope("device") monotonic, align 4
  %aborted = icmp ne i32 %ab, 0
  br i1 %aborted, label %fail, label %clock
clock:
  %t = call i64 @llvm.nvvm.read.ptx.sreg.globaltimer()
  %elapsed = sub i64 %t, %t0
  %late = icmp ugt i64 %elapsed, %timeout
  br i1 %late, label %record, label %spin
record:
  %task = load i32, ptr addrspace(3) SLOT_TASK, align 4
  %task1 = add i32 %task, 1
  %errp = getelementptr i32, ptr addrspace(1) %state, i64 STATE_ERROR_TASK
  %x = cmpxchg ptr addrspace(1) %errp, i32 0, i32 %task1 syncscope("device") monotonic monotonic, align 4
  %won = extractvalue { i32, i1 } %x, 1
  br i1 %won, label %record.first, label %raise
record.first:
  %wp = getelementptr i32, ptr addrspace(1) %state, i64 STATE_ERROR_WAITED
  %waited1 = add i32 %waited, 1
  store atomic i32 %waited1, ptr addrspace(1) %wp syncscope("device") monotonic, align 4
  br label %raise
raise:
  store atomic i32 1, ptr addrspace(1) %abortp syncscope("device") release, align 4
  br label %fail
fail:
  br label %publish
pass:
  br label %publish
publish:
  %ok = phi i32 [ 0, %fail ], [ 1, %pass ]
  store i32 %ok, ptr addrspace(3) SLOT_OK, align 4
  br label %sync
sync:
  call void @llvm.nvvm.barrier.cta.sync.aligned.count(i32 1, i32 %threads)
  %okv = load i32, ptr addrspace(3) SLOT_OK, align 4
  %r = icmp ne i32 %okv, 0
  ret i1 %r
}
"#;

/// The persistent kernel's module text: shared slots, the wait, and the claim loop over
/// `functions` (the task functions `@mk_task<i>`, declared here, defined by the tasks'
/// modules linked in) on `block` threads, at least `min_ctas` CTAs an SM (ptxas keeps the
/// registers within what that allows).
pub(crate) fn kernel(functions: &[Signature<'_>], block: u32, min_ctas: u32) -> String {
    let mut s = String::new();
    let slots = |t: &str| {
        t.replace("SLOT_TASK", &slot_ptr(slot::TASK))
            .replace("SLOT_WAITED", &slot_ptr(slot::WAITED))
            .replace("SLOT_NEED", &slot_ptr(slot::NEED))
            .replace("SLOT_OK", &slot_ptr(slot::OK))
            .replace("SLOT_KNOWN", &slot_ptr(slot::KNOWN))
            .replace("STATE_ABORT", &state::ABORT.to_string())
            .replace("STATE_TIMEOUT", &state::TIMEOUT_NS.to_string())
            .replace("STATE_ERROR_TASK", &state::ERROR_TASK.to_string())
            .replace("STATE_ERROR_WAITED", &state::ERROR_WAITED.to_string())
    };
    let _ = writeln!(s, "@mk_slots = addrspace(3) global [{} x i8] undef, align 16", slot::BYTES);
    s.push_str("@mk_ptrs = addrspace(3) global [24 x i8] undef, align 16\n");
    s.push_str("@smem_dyn = external addrspace(3) global [0 x i8], align 1024\n");
    s.push_str(&slots(WAIT));
    let st = |w: usize| format!("%st.{w} = getelementptr i32, ptr addrspace(1) %state, i64 {w}");
    let _ = writeln!(s, "\ndefine ptx_kernel void @{ENTRY}(ptr addrspace(1) noalias %insts, ptr addrspace(1) noalias %task_inst, ptr addrspace(1) noalias %args, ptr addrspace(1) noalias %counters, ptr addrspace(1) noalias %state, ptr addrspace(1) noalias %profile) #0 {{");
    s.push_str("entry:\n  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n  %lead = icmp eq i32 %tid, 0\n");
    for w in [state::HEAD, state::EXITED, state::ABORT, state::TASKS, state::INSTANCES, state::NEVER_COMPLETES, state::PROFILE] {
        let _ = writeln!(s, "  {}", st(w));
    }
    let _ = writeln!(s, "  %ntasks = load i32, ptr addrspace(1) %st.{}, align 4", state::TASKS);
    s.push_str("  br i1 %lead, label %init, label %top\ninit:\n");
    s.push_str("  store ptr addrspace(1) %counters, ptr addrspace(3) @mk_ptrs, align 8\n");
    s.push_str("  store ptr addrspace(1) %state, ptr addrspace(3) getelementptr inbounds (i8, ptr addrspace(3) @mk_ptrs, i64 8), align 8\n");
    let _ = writeln!(s, "  store i32 0, ptr addrspace(3) {}, align 4\n  br label %top", slot_ptr(slot::KNOWN));
    // Claim: thread 0 takes the next task number (none once the abort flag is up) and
    // publishes the task's instance, function, arguments, CTA index and what it waits for.
    s.push_str("top:\n  br i1 %lead, label %claim, label %claimed\nclaim:\n");
    let _ = writeln!(s, "  %ab = load atomic i32, ptr addrspace(1) %st.{} syncscope(\"device\") monotonic, align 4", state::ABORT);
    s.push_str("  %aborted = icmp ne i32 %ab, 0\n  br i1 %aborted, label %claim.none, label %claim.take\nclaim.take:\n");
    let _ = writeln!(s, "  %t = atomicrmw add ptr addrspace(1) %st.{}, i32 1 syncscope(\"device\") monotonic, align 4", state::HEAD);
    s.push_str("  %live.t = icmp ult i32 %t, %ntasks\n  br i1 %live.t, label %claim.fill, label %claim.none\nclaim.fill:\n");
    s.push_str("  %tip = getelementptr i32, ptr addrspace(1) %task_inst, i32 %t\n  %i = load i32, ptr addrspace(1) %tip, align 4\n");
    let _ = writeln!(s, "  %iw = mul i32 %i, {INSTANCE_WORDS}");
    let field = |s: &mut String, name: &str, base: &str, w: usize| {
        let _ = writeln!(s, "  %{name}.w = add i32 {base}, {w}\n  %{name}.p = getelementptr i32, ptr addrspace(1) %insts, i32 %{name}.w\n  %{name} = load i32, ptr addrspace(1) %{name}.p, align 4");
    };
    field(&mut s, "f", "%iw", instance::FUNCTION);
    field(&mut s, "off", "%iw", instance::FIRST_ARG);
    field(&mut s, "gx", "%iw", instance::GRID);
    field(&mut s, "gy", "%iw", instance::GRID + 1);
    field(&mut s, "gz", "%iw", instance::GRID + 2);
    field(&mut s, "first", "%iw", instance::FIRST_TASK);
    field(&mut s, "ctas", "%iw", instance::CTAS);
    field(&mut s, "chunk", "%iw", instance::CHUNK);
    s.push_str("  %tk = sub i32 %t, %first\n  %b = mul i32 %tk, %chunk\n  %left = sub i32 %ctas, %b\n  %few = icmp ult i32 %left, %chunk\n  %n = select i1 %few, i32 %left, i32 %chunk\n");
    s.push_str("  %bx = urem i32 %b, %gx\n  %bq = udiv i32 %b, %gx\n  %by = urem i32 %bq, %gy\n  %bz = udiv i32 %bq, %gy\n");
    s.push_str("  %has.prev = icmp ne i32 %i, 0\n  %prev = sub i32 %i, 1\n  %prev.c = select i1 %has.prev, i32 %prev, i32 0\n");
    let _ = writeln!(s, "  %pw = mul i32 %prev.c, {INSTANCE_WORDS}");
    field(&mut s, "need.l", "%pw", instance::CTAS);
    s.push_str("  %need = select i1 %has.prev, i32 %need.l, i32 0\n  %waited = select i1 %has.prev, i32 %prev, i32 -1\n");
    for (v, off) in [("%i", slot::INSTANCE), ("%f", slot::FUNCTION), ("%off", slot::FIRST_ARG), ("%bx", slot::CTAID), ("%by", slot::CTAID + 4), ("%bz", slot::CTAID + 8), ("%gx", slot::NCTAID), ("%gy", slot::NCTAID + 4), ("%gz", slot::NCTAID + 8), ("%need", slot::NEED), ("%waited", slot::WAITED), ("%b", slot::CHUNK_FIRST), ("%n", slot::CHUNK_COUNT)] {
        let _ = writeln!(s, "  store i32 {v}, ptr addrspace(3) {}, align 4", slot_ptr(off));
    }
    // The claim's time, for the profile (a register read and a shared store).
    s.push_str("  %tclaim = call i64 @llvm.nvvm.read.ptx.sreg.globaltimer()\n  store i64 %tclaim, ptr addrspace(3) getelementptr inbounds (i8, ptr addrspace(3) @mk_ptrs, i64 16), align 8\n");
    s.push_str("  br label %claim.store\nclaim.none:\n  br label %claim.store\nclaim.store:\n");
    s.push_str("  %tv = phi i32 [ %t, %claim.fill ], [ %ntasks, %claim.none ]\n");
    let _ = writeln!(s, "  store i32 %tv, ptr addrspace(3) {}, align 4\n  br label %claimed", slot_ptr(slot::TASK));
    s.push_str("claimed:\n  call void @llvm.nvvm.barrier.cta.sync.aligned.all(i32 0)\n");
    let _ = writeln!(s, "  %task = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::TASK));
    s.push_str("  %live = icmp ult i32 %task, %ntasks\n  br i1 %live, label %run, label %leave\nrun:\n");
    let _ = writeln!(s, "  %fn = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::FUNCTION));
    let _ = writeln!(s, "  %argoff = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::FIRST_ARG));
    let _ = writeln!(s, "  %cn = load i32, ptr addrspace(3) {}, align 4\n  br label %cta", slot_ptr(slot::CHUNK_COUNT));
    // One CTA of the chunk after another; the slots hold the current CTA's index.
    s.push_str("cta:\n  %k = phi i32 [ 0, %run ], [ %k1, %cta.next ]\n  switch i32 %fn, label %one [");
    for j in 0..functions.len() {
        let _ = write!(s, " i32 {j}, label %fn{j}");
    }
    s.push_str(" ]\n");
    for (j, f) in functions.iter().enumerate() {
        let _ = writeln!(s, "fn{j}:\n  %in{j} = icmp ult i32 %tid, {}\n  br i1 %in{j}, label %fn{j}.wait, label %one\nfn{j}.wait:", f.threads);
        if f.waits_inside {
            let _ = writeln!(s, "  br label %fn{j}.call");
        } else {
            let _ = writeln!(s, "  %ok{j} = call i1 @mk_wait(i32 {})\n  br i1 %ok{j}, label %fn{j}.call, label %one", f.threads);
        }
        let _ = writeln!(s, "fn{j}.call:");
        let mut call = Vec::new();
        for (k, p) in f.params.iter().enumerate() {
            let _ = writeln!(s, "  %a{j}.{k}.i = add i32 %argoff, {k}\n  %a{j}.{k}.p = getelementptr i64, ptr addrspace(1) %args, i32 %a{j}.{k}.i\n  %a{j}.{k}.w = load i64, ptr addrspace(1) %a{j}.{k}.p, align 8");
            match p {
                KernelParam::Size(_) => call.push(format!("i64 %a{j}.{k}.w")),
                _ => {
                    let _ = writeln!(s, "  %a{j}.{k} = inttoptr i64 %a{j}.{k}.w to ptr addrspace(1)");
                    call.push(format!("ptr addrspace(1) %a{j}.{k}"));
                }
            }
        }
        let _ = writeln!(s, "  call void @mk_task{j}({})\n  br label %one", call.join(", "));
    }
    // The next CTA of the chunk: every thread is done with this one (shared memory is
    // reused), thread 0 publishes the next index. A wait that failed (an abandoned launch:
    // `mk_wait` left 0 in the OK slot, read by all after the barrier) ends the chunk.
    s.push_str("one:\n  call void @llvm.nvvm.barrier.cta.sync.aligned.all(i32 0)\n");
    let _ = writeln!(s, "  %okc = load i32, ptr addrspace(3) {}, align 4\n  %failed = icmp eq i32 %okc, 0\n  br i1 %failed, label %ran, label %one.more", slot_ptr(slot::OK));
    s.push_str("one.more:\n  %k1 = add i32 %k, 1\n  %kmore = icmp ult i32 %k1, %cn\n  br i1 %kmore, label %cta.sync, label %ran\n");
    s.push_str("cta.sync:\n  br i1 %lead, label %cta.publish, label %cta.next\ncta.publish:\n");
    let _ = writeln!(s, "  %cb0 = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::CHUNK_FIRST));
    let _ = writeln!(s, "  %cgx = load i32, ptr addrspace(3) {}, align 4\n  %cgy = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::NCTAID), slot_ptr(slot::NCTAID + 4));
    s.push_str("  %cb = add i32 %cb0, %k1\n  %cbx = urem i32 %cb, %cgx\n  %cbq = udiv i32 %cb, %cgx\n  %cby = urem i32 %cbq, %cgy\n  %cbz = udiv i32 %cbq, %cgy\n");
    for (v, off) in [("%cbx", slot::CTAID), ("%cby", slot::CTAID + 4), ("%cbz", slot::CTAID + 8)] {
        let _ = writeln!(s, "  store i32 {v}, ptr addrspace(3) {}, align 4", slot_ptr(off));
    }
    s.push_str("  br label %cta.next\ncta.next:\n  call void @llvm.nvvm.barrier.cta.sync.aligned.all(i32 0)\n  br label %cta\n");
    // Every thread of the CTA is done with the task: thread 0 counts it (release), unless
    // the instance is the planted one that never completes.
    s.push_str("ran:\n  call void @llvm.nvvm.barrier.cta.sync.aligned.all(i32 0)\n  br i1 %lead, label %signal, label %top\nsignal:\n");
    let _ = writeln!(s, "  %si = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::INSTANCE));
    let _ = writeln!(s, "  %stall = load i32, ptr addrspace(1) %st.{}, align 4", state::NEVER_COMPLETES);
    // An abandoned task (its wait failed) is not counted: nothing after it may run on its
    // unwritten outputs.
    let _ = writeln!(s, "  %sok = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::OK));
    s.push_str("  %si1 = add i32 %si, 1\n  %planted = icmp eq i32 %stall, %si1\n  %aborted.t = icmp eq i32 %sok, 0\n  %stuck = or i1 %planted, %aborted.t\n  br i1 %stuck, label %top, label %count\ncount:\n");
    let _ = writeln!(s, "  %sn = load i32, ptr addrspace(3) {}, align 4", slot_ptr(slot::CHUNK_COUNT));
    s.push_str("  %cnt = getelementptr i32, ptr addrspace(1) %counters, i32 %si\n  %old = atomicrmw add ptr addrspace(1) %cnt, i32 %sn syncscope(\"device\") release, align 4\n");
    // With the profile flag: the instance's earliest claim and latest completion.
    let _ = writeln!(s, "  %pf = load i32, ptr addrspace(1) %st.{}, align 4\n  %pfon = icmp ne i32 %pf, 0\n  br i1 %pfon, label %record, label %top", state::PROFILE);
    s.push_str("record:\n  %tdone = call i64 @llvm.nvvm.read.ptx.sreg.globaltimer()\n  %tc = load i64, ptr addrspace(3) getelementptr inbounds (i8, ptr addrspace(3) @mk_ptrs, i64 16), align 8\n");
    s.push_str("  %pi = mul i32 %si, 2\n  %pstart = getelementptr i64, ptr addrspace(1) %profile, i32 %pi\n  %pend = getelementptr i64, ptr addrspace(1) %pstart, i32 1\n");
    s.push_str("  %o1 = atomicrmw umin ptr addrspace(1) %pstart, i64 %tc syncscope(\"device\") monotonic, align 8\n  %o2 = atomicrmw umax ptr addrspace(1) %pend, i64 %tdone syncscope(\"device\") monotonic, align 8\n  br label %top\n");
    // Leaving: the last CTA out zeroes the claim counter and the completion counters for
    // the next launch (every other CTA has stopped touching them).
    s.push_str("leave:\n  br i1 %lead, label %leave.count, label %done\nleave.count:\n  %nct = call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()\n");
    let _ = writeln!(s, "  %e = atomicrmw add ptr addrspace(1) %st.{}, i32 1 syncscope(\"device\") acq_rel, align 4", state::EXITED);
    s.push_str("  %nct1 = sub i32 %nct, 1\n  %last = icmp eq i32 %e, %nct1\n  br i1 %last, label %reset, label %done\nreset:\n");
    let _ = writeln!(s, "  %ninst = load i32, ptr addrspace(1) %st.{}, align 4\n  br label %reset.loop", state::INSTANCES);
    s.push_str("reset.loop:\n  %j = phi i32 [ 0, %reset ], [ %j1, %reset.body ]\n  %more = icmp ult i32 %j, %ninst\n  br i1 %more, label %reset.body, label %reset.end\n");
    s.push_str("reset.body:\n  %cj = getelementptr i32, ptr addrspace(1) %counters, i32 %j\n  store i32 0, ptr addrspace(1) %cj, align 4\n  %j1 = add i32 %j, 1\n  br label %reset.loop\n");
    let _ = writeln!(s, "reset.end:\n  store atomic i32 0, ptr addrspace(1) %st.{} syncscope(\"device\") monotonic, align 4", state::HEAD);
    let _ = writeln!(s, "  store atomic i32 0, ptr addrspace(1) %st.{} syncscope(\"device\") release, align 4\n  br label %done", state::EXITED);
    s.push_str("done:\n  ret void\n}\n\n");
    for (j, f) in functions.iter().enumerate() {
        let tys: Vec<&str> = f.params.iter().map(|p| if matches!(p, KernelParam::Size(_)) { "i64" } else { "ptr addrspace(1)" }).collect();
        let _ = writeln!(s, "declare void @mk_task{j}({})", tys.join(", "));
    }
    s.push_str("declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\ndeclare i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()\ndeclare i64 @llvm.nvvm.read.ptx.sreg.globaltimer()\n");
    s.push_str("declare void @llvm.nvvm.barrier.cta.sync.aligned.all(i32)\ndeclare void @llvm.nvvm.barrier.cta.sync.aligned.count(i32, i32)\n");
    let _ = writeln!(s, "attributes #0 = {{ \"nvvm.maxntid\"=\"{block}\" \"nvvm.minctasm\"=\"{}\" }}", min_ctas.max(1));
    s
}
