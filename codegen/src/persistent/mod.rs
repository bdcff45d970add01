//! The persistent decode kernel: a whole kernel graph run by one launch.
//!
//! Each kernel of the graph is built as usual ([`crate::compile_kernel`]); its LLVM IR, taken
//! before optimisation, becomes a *task function* ([`task`]); the task functions are linked
//! into one module beside a claim loop ([`dispatch`]) and the module is optimised and
//! compiled to PTX like any kernel. Every CTA of the persistent grid claims CTAs of the
//! graph's kernels in launch order from a global counter and runs them; a CTA of kernel `i`
//! waits, where the kernel waited for its predecessor grid under programmatic dependent
//! launch (after its prologue's L2 prefetch of weights), until every CTA of kernel `i − 1`
//! has counted itself complete. So the next kernel's weights stream in while the previous
//! kernel finishes, and no launch, ramp-up or tail separates kernels. The tables a launch
//! reads, and the order and deadlock argument, are [`sinter_ir::kernel::persistent`]'s; the
//! runtime builds them (`sinter_runtime::Executor::capture_persistent`).
//!
//! Sharing a CTA: the persistent block is the widest task's; a narrower task runs on the
//! first threads and its CTA barriers become counted barriers of its threads (barrier 1);
//! its special registers `%ctaid`/`%nctaid` are read from the claimed task's shared slots
//! and `%ntid` is its own block size. Shared memory is one dynamic region that every task
//! starts at offset 0 (its dynamic part first, then its static arrays), so the kernel's
//! shared memory is the largest task's, not the sum. Kernels that need their own launch
//! (clusters, TMA tensor maps, `setmaxnreg`, named barriers) are refused with the reason,
//! and the caller keeps the per-kernel path.
//!
//! Numerics are the per-kernel path's wherever a task is the kernel's own schedule; paged
//! attention and the row reductions built without their clusters, and any schedule fallback,
//! sum in another order (within the tolerances the kernels are tested to).
//!
//! Algorithm sources: the "megakernel" of Spector et al., *Look Ma, No Bubbles!* (Hazy
//! Research, 2025: per-SM instruction queues, counters in global memory), Mirage's persistent
//! kernels (Jia et al., 2025); the memory-ordering pattern of CUDA cooperative groups' grid
//! barrier (a barrier of the CTA, then a release by one thread; an acquire, then a barrier).

pub mod dispatch;
mod task;

use std::collections::HashMap;

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::AddressSpace;
use sinter_ir::kernel::persistent::PersistentProgram;
use sinter_ir::{Family, GridDim, Kernel, KernelGraph, KernelParam, LaunchPlan, Target};

use crate::error::CodegenError;
use crate::isa::capture_ir;
use crate::llvm::ADDRESS_SPACE_SHARED;

pub use dispatch::ENTRY;

/// A persistent kernel and its LLVM IR before optimisation (what the CPU emulator runs).
pub struct PersistentBuild {
    /// The program the runtime launches.
    pub program: PersistentProgram,
    /// The linked module's IR, before optimisation.
    pub ir: String,
}

/// Kernel `kernel` of `graph` for `target`: its LLVM IR as built (before optimisation) and
/// its launch plan, as [`build`] takes them. The kernel's default schedule where it can be a
/// task, else the first of its schedule candidates that can; paged attention and row
/// reductions are built without their thread-block clusters (a cluster's CTAs must run
/// together, tasks run one CTA at a time). Where none can, the default (whose refusal
/// [`build`] reports).
///
/// # Errors
/// As [`crate::compile_kernel`]; [`CodegenError::Builder`] when no IR was captured.
pub fn kernel_ir(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<(String, LaunchPlan), CodegenError> {
    let family = graph.kernels.get(kernel).map(|d| d.family);
    let first = captured(kernel, || match family {
        Some(Family::PagedAttention) => crate::kernels::attention::decode::generate_without_cluster(graph, kernel, target),
        Some(Family::RowReduction) => crate::kernels::reduce::generate_without_cluster(graph, kernel, target),
        _ => crate::compile_kernel(graph, kernel, target),
    })?;
    if task::rewrite(&first.0, &first.1, 0, 1024).is_ok() {
        return Ok(first);
    }
    for name in crate::schedule_names(graph, kernel, target)?.iter().skip(1) {
        if let Ok(other) = captured(kernel, || crate::compile_variant(graph, kernel, target, name)) {
            if task::rewrite(&other.0, &other.1, 0, 1024).is_ok() {
                return Ok(other);
            }
        }
    }
    Ok(first)
}

/// The plan `build` makes and the IR of its entry, captured before optimisation.
fn captured(kernel: Kernel, build: impl FnOnce() -> Result<LaunchPlan, CodegenError>) -> Result<(String, LaunchPlan), CodegenError> {
    let (plan, irs) = capture_ir(build);
    let plan = plan?;
    let define = format!("define ptx_kernel void @{}(", plan.entry);
    let ir = irs.into_iter().rev().find(|t| t.contains(&define)).ok_or_else(|| CodegenError::Builder(format!("kernel {kernel}: no LLVM IR captured for `{}`", plan.entry)))?;
    Ok((ir, plan))
}

/// Builds the persistent kernel of a graph whose kernels, in launch order, are `kernels`
/// (each its IR before optimisation and its plan, [`kernel_ir`]) for `target`. Kernels with
/// the same code (IR equal up to the entry's name, same parameters and block) share one
/// task function.
///
/// # Errors
/// [`CodegenError::Unsupported`] naming the first kernel that cannot be a task and why;
/// [`CodegenError::InvalidModule`] and the back end's errors (code generator bugs).
pub fn build(kernels: &[(String, LaunchPlan)], target: &Target) -> Result<PersistentBuild, CodegenError> {
    build_with(kernels, target, MIN_CTAS_PER_SM)
}

/// CTAs of the persistent kernel an SM by default: two, so that one CTA's loads are in
/// flight while the other waits or synchronises (ptxas then keeps 128 registers a thread at
/// 256 threads).
pub const MIN_CTAS_PER_SM: u32 = 2;

/// [`build`] with at least `min_ctas` CTAs an SM (ptxas's register budget).
///
/// # Errors
/// As [`build`].
pub fn build_with(kernels: &[(String, LaunchPlan)], target: &Target, min_ctas: u32) -> Result<PersistentBuild, CodegenError> {
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut functions: Vec<usize> = Vec::new();
    let mut tasks = Vec::with_capacity(kernels.len());
    for (i, (ir, plan)) in kernels.iter().enumerate() {
        let key = format!("{:?}|{:?}|{}|{}", plan.params, plan.block, plan.shared_bytes, ir.replace(&plan.entry, "\u{1}"));
        let f = *index.entry(key).or_insert_with(|| {
            functions.push(i);
            functions.len() as u32 - 1
        });
        tasks.push((f, plan.clone()));
    }
    let block = functions.iter().map(|&i| kernels[i].1.block[0]).max().unwrap_or(32).max(32);
    let cx = Context::create();
    let machine = crate::llvm::target_machine(target)?;
    let data = machine.get_target_data();
    let mut texts = Vec::with_capacity(functions.len());
    for (j, &i) in functions.iter().enumerate() {
        let (ir, plan) = &kernels[i];
        let t = task::rewrite(ir, plan, j, block).map_err(|message| CodegenError::Unsupported { kernel: format!("{} (persistent task)", plan.entry), message })?;
        texts.push(t);
    }
    let signatures: Vec<dispatch::Signature<'_>> = functions.iter().zip(&texts).map(|(&i, t)| dispatch::Signature { threads: kernels[i].1.block[0], params: &kernels[i].1.params, waits_inside: t.waits_inside }).collect();
    let main = parse(&cx, &dispatch::kernel(&signatures, block, min_ctas), "sinter_persistent")?;
    let mut shared = 0u32;
    for (j, (t, &i)) in texts.iter().zip(&functions).enumerate() {
        let entry = &kernels[i].1.entry;
        let m = parse(&cx, &t.text, &format!("task {j} (`{entry}`)"))?;
        shared = shared.max(alias_shared(&m, kernels[i].1.shared_bytes, &data).map_err(|e| CodegenError::Builder(format!("task {j} (`{entry}`): {e}")))?);
        if let Some(f) = m.get_function(&format!("mk_task{j}")) {
            for key in ["nvvm.maxntid", "nvvm.minctasm", "nvvm.maxnreg", "nvvm.reqntid"] {
                f.remove_string_attribute(inkwell::attributes::AttributeLoc::Function, key);
            }
        }
        main.link_in_module(m).map_err(|e| CodegenError::Builder(format!("linking task {j} (`{entry}`): {e}")))?;
    }
    // Linked by name, then private to the module (so the optimiser may inline and drop them).
    for j in 0..functions.len() {
        if let Some(f) = main.get_function(&format!("mk_task{j}")) {
            f.set_linkage(Linkage::Internal);
        }
    }
    if let Some(f) = main.get_function("mk_wait") {
        f.set_linkage(Linkage::Internal);
    }
    for g in ["mk_slots", "mk_ptrs"] {
        if let Some(g) = main.get_global(g) {
            g.set_linkage(Linkage::Internal);
        }
    }
    main.set_triple(&machine.get_triple());
    main.set_data_layout(&data.get_data_layout());
    main.verify().map_err(|e| CodegenError::InvalidModule { module: ENTRY.into(), message: e.to_string() })?;
    let ir = main.print_to_string().to_string();
    main.run_passes("default<O3>", &machine, PassBuilderOptions::create()).map_err(|e| CodegenError::Emit { target: *target, message: e.to_string() })?;
    let ptx = crate::llvm::compile_module_to_ptx(&main, target)?;
    let kernel = LaunchPlan {
        entry: ENTRY.into(),
        ptx,
        target: *target,
        grid: [GridDim::fixed(1), GridDim::fixed(1), GridDim::fixed(1)],
        block: [block, 1, 1],
        shared_bytes: shared,
        params: (0..6).map(KernelParam::Buffer).collect(),
    };
    let threads = functions.iter().map(|&i| kernels[i].1.block[0]).collect();
    Ok(PersistentBuild { program: PersistentProgram { kernel, threads, tasks }, ir })
}

fn parse<'c>(cx: &'c Context, text: &str, name: &str) -> Result<Module<'c>, CodegenError> {
    cx.create_module_from_ir(MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), name)).map_err(|e| CodegenError::InvalidModule { module: name.into(), message: e.to_string() })
}

/// Moves a task module's shared memory into the persistent kernel's one dynamic region:
/// its dynamic part (`dynamic` bytes, `smem_dyn` or `dsmem`) at offset 0, then each static
/// shared array at its alignment. Returns the bytes the task needs.
fn alias_shared(m: &Module<'_>, dynamic: u32, data: &inkwell::targets::TargetData) -> Result<u32, CodegenError> {
    let cx = m.get_context();
    let i8t = cx.i8_type();
    let base = m.get_global("smem_dyn").ok_or_else(|| CodegenError::Builder("a task module without `smem_dyn`".into()))?.as_pointer_value();
    let mut offset = u64::from(dynamic);
    let mut g = m.get_first_global();
    let mut doomed = Vec::new();
    while let Some(global) = g {
        g = global.get_next_global();
        if global.get_name().to_bytes() == b"smem_dyn" || global.get_name().to_bytes() == b"mk_slots" {
            continue;
        }
        let ptr = global.as_pointer_value();
        if ptr.get_type().get_address_space() != AddressSpace::from(ADDRESS_SPACE_SHARED) {
            continue;
        }
        if global.is_declaration() {
            // Another name for the dynamic region (`dsmem`).
            ptr.replace_all_uses_with(base);
            doomed.push(global);
            continue;
        }
        let ty = global.get_value_type();
        let bytes = data.get_abi_size(&ty);
        let align = u64::from(global.get_alignment()).max(u64::from(data.get_abi_alignment(&ty))).max(1);
        offset = offset.div_ceil(align) * align;
        // SAFETY: an in-bounds byte offset of the dynamic region, which the launch sizes to
        // cover every task's shared memory.
        let at = unsafe { base.const_gep(i8t, &[cx.i64_type().const_int(offset, false)]) };
        ptr.replace_all_uses_with(at);
        doomed.push(global);
        offset += bytes;
    }
    for global in doomed {
        // SAFETY: every use was replaced above.
        unsafe { global.delete() };
    }
    u32::try_from(offset).map_err(|_| CodegenError::Builder(format!("a task with {offset} bytes of shared memory")))
}
