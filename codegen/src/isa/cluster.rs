//! Thread-block clusters (sm_90+): the cluster shape, distributed shared memory (`mapa`) and
//! the cluster barriers.
//!
//! Design notes: book/src/design/isa.md

use inkwell::attributes::AttributeLoc;
use inkwell::values::{IntValue, PointerValue};

use super::KernelBuilder;
use crate::math::R;
use crate::error::CodegenError;

impl<'ctx> KernelBuilder<'ctx> {
    /// Declares the kernel's cluster shape `dims` (CTAs along x, y, z): the function attribute
    /// `"nvvm.cluster_dim"` of LLVM 22, emitted as `.explicitcluster` and `.reqnctapercluster`
    /// (PTX ISA §11.7). A plain `cuLaunchKernel` then launches clusters of that shape; every
    /// grid dimension must be a multiple of the cluster's (CUDA C Programming Guide §2.2.1,
    /// "Thread Block Clusters"), and 8 CTAs is the portable maximum.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] below sm_90.
    pub fn set_cluster_dims(&self, dims: [u32; 3]) -> R<()> {
        if self.target.sm_version() < 90 {
            return Err(CodegenError::Builder(format!("thread-block clusters need sm_90, not {}", self.target)));
        }
        let v = format!("{},{},{}", dims[0], dims[1], dims[2]);
        self.func.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("nvvm.cluster_dim", &v));
        Ok(())
    }

    /// The address of `p` (this CTA's shared memory) in the shared memory of CTA `rank` of
    /// the cluster: `mapa.shared::cluster.u32` (PTX ISA §9.7.9, "mapa";
    /// `llvm.nvvm.mapa.shared.cluster`), a `ptr addrspace(7)` (`.shared::cluster`) that
    /// `ld.shared::cluster` reads (distributed shared memory).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mapa_shared(&self, p: PointerValue<'ctx>, rank: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        Ok(self.intrinsic_value("llvm.nvvm.mapa.shared.cluster", &[], &[p.into(), rank.into()])?.into_pointer_value())
    }

    /// A barrier of every thread of the cluster: `barrier.cluster.arrive.aligned` (release)
    /// then `barrier.cluster.wait.aligned` (acquire) (PTX ISA §9.7.13.4), so that shared
    /// memory written before it, in any CTA of the cluster, is visible after it. Every thread
    /// of every CTA of the cluster must reach it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_barrier(&self) -> R<()> {
        self.cluster_arrive()?;
        self.cluster_wait()
    }

    /// The arrive half of [`KernelBuilder::cluster_barrier`] (`barrier.cluster.arrive.aligned`,
    /// release, PTX ISA §9.7.13.4): the thread's earlier shared-memory writes become visible to
    /// every thread of the cluster that passes the matching wait. Costs a `MEMBAR.ALL.GPU` in
    /// every thread that executes it (ptxas 12.9, sm_90a): threads that wrote nothing another
    /// CTA reads may arrive relaxed ([`KernelBuilder::cluster_arrive_relaxed`]) instead.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_arrive(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cluster.arrive.aligned", &[], &[]).map(drop)
    }

    /// [`KernelBuilder::cluster_barrier`] without its memory ordering
    /// (`barrier.cluster.arrive.relaxed.aligned`, then `barrier.cluster.wait.aligned`): only
    /// an execution barrier. A release arrive costs a `MEMBAR.ALL.GPU` in every thread (ptxas
    /// 12.9, sm_90a), which waits for the thread's outstanding global stores.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_barrier_relaxed(&self) -> R<()> {
        self.cluster_arrive_relaxed()?;
        self.cluster_wait()
    }

    /// The arrive half of [`KernelBuilder::cluster_barrier_relaxed`]
    /// (`barrier.cluster.arrive.relaxed.aligned`, PTX ISA §9.7.13.4): the thread's arrival
    /// without memory ordering. Each thread alternates arrives and waits
    /// ([`KernelBuilder::cluster_wait`]); work placed between the two overlaps the other CTAs'
    /// arrivals.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_arrive_relaxed(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cluster.arrive.relaxed.aligned", &[], &[]).map(drop)
    }

    /// `barrier.cluster.wait.aligned` (acquire, PTX ISA §9.7.13.4): waits until every thread of
    /// the cluster has arrived at the current phase.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cluster_wait(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cluster.wait.aligned", &[], &[]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use crate::isa::{KernelBuilder, ParamKind};
    use crate::ptxas;
    use crate::target::Target;

    /// The thread-block cluster helpers of `KernelBuilder`: the cluster shape becomes
    /// `.explicitcluster` / `.reqnctapercluster`, the rank `%cluster_ctarank`, a remote address
    /// `mapa.shared::cluster`, the barriers `barrier.cluster.arrive`(`.relaxed`)/`wait`, the
    /// dynamic shared memory an `extern .shared` array; ptxas assembles it for sm_90a, and sm_80
    /// refuses a cluster shape.
    #[test]
    fn cluster_helpers_emit_what_ptx_says() {
        let cx = inkwell::context::Context::create();
        let mut kb = KernelBuilder::new(&cx, "clusters", &[ParamKind::output()], Target::SM_90A).unwrap();
        kb.set_max_threads(64);
        kb.set_cluster_dims([1, 4, 1]).unwrap();
        let out = kb.param_ptr(0).unwrap();
        let base = kb.dynamic_shared_base().unwrap();
        let rank = kb.sreg("cluster.ctarank").unwrap();
        let f32t = cx.f32_type();
        let v = kb.b.build_unsigned_int_to_float(rank, f32t, "v").unwrap();
        kb.store(base, v.into(), 4).unwrap();
        kb.cluster_barrier().unwrap();
        let next = kb.b.build_xor(rank, kb.i32c(1), "next").unwrap();
        let remote = kb.mapa_shared(base, next).unwrap();
        let w = kb.load(f32t.into(), remote, 4).unwrap();
        let i = kb.b.build_int_z_extend(rank, cx.i64_type(), "i").unwrap();
        let p = kb.gep(f32t.into(), out, i).unwrap();
        kb.store(p, w, 4).unwrap();
        kb.cluster_barrier_relaxed().unwrap();
        kb.ret().unwrap();
        let ptx = kb.finish().unwrap();
        for s in [".explicitcluster", ".reqnctapercluster 1, 4, 1", "%cluster_ctarank", "mapa.shared::cluster", "ld.shared::cluster", "barrier.cluster.arrive.aligned", "barrier.cluster.arrive.relaxed.aligned", "barrier.cluster.wait.aligned", ".extern .shared .align 16 .b8 dsmem[]"] {
            assert!(ptx.contains(s), "no `{s}`:\n{ptx}");
        }
        if let Some(path) = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}")) {
            let r = ptxas::assemble_with(&path, &ptx, &Target::SM_90A).unwrap_or_else(|e| panic!("{e}\n{ptx}"));
            assert!(!r.spills() && r.warnings.is_empty(), "{r}");
        }
        let kb80 = KernelBuilder::new(&cx, "clusters80", &[ParamKind::output()], Target::SM_80).unwrap();
        assert!(kb80.set_cluster_dims([2, 1, 1]).is_err());
    }
}
