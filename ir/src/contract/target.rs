//! GPU targets that sinter generates code for, and the facts about them that the passes and
//! the code generator share.
//!
//! A [`Target`] names one NVIDIA architecture (`sm_80`, `sm_90`, `sm_90a`) — an instruction
//! set, not a card — and carries what scheduling, fusion and code generation need about it:
//! the SM version, the warp size, the shared-memory limits, cluster support, which
//! tensor-core instructions exist, the PTX ISA version sinter emits for it, and the figures of
//! the card the cost model and the persistent schedules assume for it (SM count, DRAM
//! bandwidth, peak FLOP/s: an A100 for `sm_80`, an H100/H200 SXM for `sm_90`/`sm_90a`).
//!
//! ```
//! use sinter_ir::Target;
//!
//! let t = Target::parse("sm_90a").unwrap();
//! assert_eq!(t.sm_version(), 90);
//! assert!(t.is_arch_specific() && t.has_wgmma());
//! assert_eq!(t.sm_count(), 132);
//! assert!(!Target::SM_80.has_fp8_matmul());
//! assert!(Target::parse("sm_75").is_err());
//! ```

use std::fmt;
use std::str::FromStr;

/// The PTX ISA version sinter emits for every target, as `(major, minor)`.
///
/// PTX 8.5 (CUDA 12.5) is new enough for everything the kernel families use (`cp.async.bulk`,
/// TMA, `mbarrier`, `setmaxnreg`, `wgmma`, `stmatrix`), old enough for ptxas 12.9 (which
/// accepts up to 8.8) and for any driver of CUDA 12.5 or later to JIT-compile. Left alone,
/// LLVM 22 would pick the oldest ISA each architecture allows (7.0 for sm_80, 7.8 for sm_90,
/// 8.0 for sm_90a), so the version would change with the target; one fixed version keeps
/// the generated PTX and the kernel-cache keys uniform.
pub const PTX_ISA_VERSION: (u32, u32) = (8, 5);

/// One KiB, in bytes.
const KIB: u32 = 1024;

/// An NVIDIA GPU architecture that sinter can generate code for.
///
/// The three targets are constants ([`Target::SM_80`], [`Target::SM_90`], [`Target::SM_90A`])
/// and [`Target::ALL`] lists them; [`Target::parse`] (or `str::parse`) reads their names.
///
/// Sources: shared memory and the portable cluster size from the CUDA C++ Programming Guide
/// (tables "Technical Specifications per Compute Capability", §"Thread Block Clusters");
/// instruction availability from the PTX ISA 8.5 (each instruction's "Target ISA notes"); the
/// card figures from NVIDIA's data sheets (A100 SXM4 80 GB, H100/H200 SXM5) and, for the
/// H200, the project's own measurements (TOOLCHAIN.md), which the cost model was fitted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    name: &'static str,
    sm: u32,
    arch_specific: bool,
    max_shared_per_block_optin: u32,
    max_shared_per_sm: u32,
    sm_count: u32,
    dram_gbps: u32,
    tensor_gflops: u32,
    cuda_core_gflops: u32,
}

impl Target {
    /// Ampere (A100, A800): `mma.sync` tensor cores, `cp.async`, `ldmatrix`.
    /// 164 KiB of shared memory per SM, of which one block may opt in to 163 KiB.
    /// Card figures of an A100 SXM4 80 GB, from its data sheet (sources in
    /// book/src/design/contract.md).
    pub const SM_80: Target = Target {
        name: "sm_80",
        sm: 80,
        arch_specific: false,
        max_shared_per_block_optin: 163 * KIB,
        max_shared_per_sm: 164 * KIB,
        sm_count: 108,
        dram_gbps: 2039,
        tensor_gflops: 312_000,
        cuda_core_gflops: 19_500,
    };

    /// Hopper (H100, H200) without the architecture-specific features: everything of
    /// sm_80 plus thread-block clusters, distributed shared memory, TMA and `mbarrier`
    /// transactions. 228 KiB of shared memory per SM, 227 KiB per block with opt-in.
    /// Card figures: those of [`Target::SM_90A`] (the same cards).
    pub const SM_90: Target = Target {
        name: "sm_90",
        sm: 90,
        arch_specific: false,
        max_shared_per_block_optin: 227 * KIB,
        max_shared_per_sm: 228 * KIB,
        sm_count: 132,
        dram_gbps: 4270,
        tensor_gflops: 680_000,
        cuda_core_gflops: 60_000,
    };

    /// Hopper with its architecture-specific features (`wgmma.mma_async`, `setmaxnreg`):
    /// code for `sm_90a` runs on sm_90 devices only, never on later architectures.
    /// Card figures of an H200 SXM: the SM count of the H100 SXM5, the copy bandwidth and the
    /// bf16 GEMM rate measured on the project's H200, the data sheet's f32 rate (sources and
    /// the measurements in book/src/design/contract.md and bench/RESULTS.md).
    pub const SM_90A: Target = Target {
        name: "sm_90a",
        sm: 90,
        arch_specific: true,
        max_shared_per_block_optin: 227 * KIB,
        max_shared_per_sm: 228 * KIB,
        sm_count: 132,
        dram_gbps: 4270,
        tensor_gflops: 680_000,
        cuda_core_gflops: 60_000,
    };

    /// Every target sinter knows, oldest first.
    pub const ALL: [Target; 3] = [Target::SM_80, Target::SM_90, Target::SM_90A];

    /// Reads a target name such as `"sm_90a"` (case-insensitive, surrounding white space
    /// ignored).
    ///
    /// # Errors
    /// [`UnknownTarget`] for any other name; its message lists the known ones.
    pub fn parse(name: &str) -> Result<Target, UnknownTarget> {
        let wanted = name.trim();
        Target::ALL
            .into_iter()
            .find(|t| t.name.eq_ignore_ascii_case(wanted))
            .ok_or_else(|| UnknownTarget {
                name: name.to_owned(),
            })
    }

    /// The target's name as CUDA writes it: `sm_80`, `sm_90`, `sm_90a`. This is also
    /// the `-arch` argument of ptxas and the `.target` line of the PTX.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The SM version as a number: 80 for `sm_80`, 90 for `sm_90` and `sm_90a`.
    pub fn sm_version(&self) -> u32 {
        self.sm
    }

    /// Whether kernels for this target take part in programmatic dependent launch (sm_90+,
    /// PTX ISA §9.7.15 `griddepcontrol`; CUDA C Programming Guide, "Programmatic Dependent
    /// Launch"): each waits for the grids it depends on at its start and lets its dependents
    /// launch while it runs.
    pub fn has_programmatic_launch(&self) -> bool {
        self.sm >= 90
    }

    /// Whether this is an architecture-specific target (the `a` suffix), whose code runs
    /// only on that exact architecture.
    pub fn is_arch_specific(&self) -> bool {
        self.arch_specific
    }

    /// Threads in a warp: 32 on every NVIDIA architecture.
    pub fn warp_size(&self) -> u32 {
        32
    }

    /// The most threads one block may have.
    pub fn max_threads_per_block(&self) -> u32 {
        1024
    }

    /// The most 32-bit registers one thread may use (ptxas spills beyond it).
    pub fn max_registers_per_thread(&self) -> u32 {
        255
    }

    /// 32-bit registers in one SM's register file.
    pub fn registers_per_sm(&self) -> u32 {
        64 * KIB
    }

    /// Shared memory, in bytes, a block may use without opting in: 48 KiB, the most a
    /// kernel may declare statically.
    pub fn default_shared_memory_per_block(&self) -> u32 {
        48 * KIB
    }

    /// Shared memory, in bytes, one block may use once the kernel opts in with
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`: 163 KiB on sm_80, 227 KiB on sm_90.
    pub fn max_shared_memory_per_block(&self) -> u32 {
        self.max_shared_per_block_optin
    }

    /// Shared memory, in bytes, of one SM (shared among its resident blocks).
    pub fn max_shared_memory_per_sm(&self) -> u32 {
        self.max_shared_per_sm
    }

    /// SMs of the card the cost model and the persistent schedules assume for this target
    /// (the target is an instruction set: a smaller card of it has fewer): 108 for `sm_80`
    /// (A100), 132 for `sm_90`/`sm_90a` (H100/H200 SXM).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Whether the target has `mma.sync` tensor-core instructions (bf16/f16 from sm_80): every
    /// target sinter knows.
    pub fn has_mma_sync(&self) -> bool {
        self.sm >= 80
    }

    /// Whether the target has `wgmma.mma_async` (warpgroup tensor-core instructions): sm_90a.
    pub fn has_wgmma(&self) -> bool {
        self.sm == 90 && self.arch_specific
    }

    /// Whether the target has `setmaxnreg` (warpgroup register reallocation): sm_90a.
    pub fn has_setmaxnreg(&self) -> bool {
        self.has_wgmma()
    }

    /// Whether the target has the Tensor Memory Accelerator (`cp.async.bulk.tensor`): sm_90
    /// and later.
    pub fn has_tma(&self) -> bool {
        self.sm >= 90
    }

    /// Whether the target has thread-block clusters and distributed shared memory: sm_90
    /// and later.
    pub fn has_clusters(&self) -> bool {
        self.sm >= 90
    }

    /// The most CTAs of one cluster that every device of the target runs (the portable
    /// cluster size): 8 with clusters, 1 without.
    pub fn max_cluster_size(&self) -> u32 {
        if self.has_clusters() {
            8
        } else {
            1
        }
    }

    /// Whether the target converts to and from `e4m3` in hardware (`cvt` with `.e4m3x2`):
    /// sm_89 and later, so sm_90 and sm_90a, not sm_80.
    pub fn has_fp8_convert(&self) -> bool {
        self.sm >= 89
    }

    /// Whether sinter's code generator multiplies `e4m3` operands on tensor cores there: the
    /// fp8 matmul and the fp8 attention use `wgmma ... .e4m3.e4m3`, so sm_90a only.
    pub fn has_fp8_matmul(&self) -> bool {
        self.has_wgmma()
    }

    /// DRAM bandwidth the cost model assumes, GB/s (read + write).
    pub fn dram_gbps(&self) -> f64 {
        f64::from(self.dram_gbps)
    }

    /// Peak bf16/f16 tensor-core rate the cost model assumes, TFLOP/s (dense).
    pub fn tensor_tflops(&self) -> f64 {
        f64::from(self.tensor_gflops) / 1e3
    }

    /// Peak f32 CUDA-core rate the cost model assumes, TFLOP/s.
    pub fn cuda_core_tflops(&self) -> f64 {
        f64::from(self.cuda_core_gflops) / 1e3
    }

    /// Whether code for this target runs on a device of compute capability `(major, minor)`:
    /// a device of that SM version or a later one, and for an architecture-specific target
    /// (`sm_90a`) exactly that version.
    pub fn runs_on(&self, (major, minor): (u32, u32)) -> bool {
        let have = major * 10 + minor;
        self.sm <= have && (!self.arch_specific || self.sm == have)
    }

    /// The PTX ISA version of the emitted PTX, as `(major, minor)`: [`PTX_ISA_VERSION`].
    pub fn ptx_isa_version(&self) -> (u32, u32) {
        PTX_ISA_VERSION
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl FromStr for Target {
    type Err = UnknownTarget;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Target::parse(s)
    }
}

/// A target name that sinter does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU target `{name}`: sinter generates code for sm_80, sm_90 and sm_90a")]
pub struct UnknownTarget {
    /// The name as it was given.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_names() {
        assert_eq!(Target::parse("sm_80"), Ok(Target::SM_80));
        assert_eq!(Target::parse("sm_90"), Ok(Target::SM_90));
        assert_eq!(Target::parse("sm_90a"), Ok(Target::SM_90A));
        assert_eq!(Target::parse(" SM_90A "), Ok(Target::SM_90A));
        assert_eq!("sm_80".parse::<Target>(), Ok(Target::SM_80));
        for t in Target::ALL {
            assert_eq!(Target::parse(&t.to_string()), Ok(t));
        }
    }

    #[test]
    fn unknown_names_say_what_is_known() {
        for bad in ["sm_75", "sm_90b", "", "sm90a", "compute_90a"] {
            let err = Target::parse(bad).unwrap_err();
            assert_eq!(err.name, bad);
            let msg = err.to_string();
            assert!(msg.contains(&format!("`{bad}`")), "{msg}");
            assert!(msg.contains("sm_80, sm_90 and sm_90a"), "{msg}");
        }
    }

    #[test]
    fn facts() {
        for t in Target::ALL {
            assert_eq!(t.warp_size(), 32);
            assert_eq!(t.default_shared_memory_per_block(), 48 * 1024);
            assert_eq!(t.ptx_isa_version(), (8, 5));
            assert!(t.has_mma_sync());
            assert_eq!(t.max_cluster_size() > 1, t.has_clusters());
            assert!(t.max_shared_memory_per_block() <= t.max_shared_memory_per_sm());
        }
        assert_eq!(Target::SM_80.max_shared_memory_per_block(), 166_912);
        assert_eq!(Target::SM_90.max_shared_memory_per_block(), 232_448);
        assert_eq!(Target::SM_90A.sm_version(), 90);
        assert!(Target::SM_90A.has_wgmma() && !Target::SM_90.has_wgmma());
        assert!(Target::SM_90.has_tma() && !Target::SM_80.has_tma());
        assert!(Target::SM_90A.has_fp8_matmul() && !Target::SM_90.has_fp8_matmul() && !Target::SM_80.has_fp8_matmul());
        assert!(Target::SM_90.has_fp8_convert() && !Target::SM_80.has_fp8_convert());
        assert_eq!([Target::SM_80.sm_count(), Target::SM_90.sm_count(), Target::SM_90A.sm_count()], [108, 132, 132]);
        assert_eq!(Target::SM_90.max_cluster_size(), 8);
        assert_eq!(Target::SM_80.max_cluster_size(), 1);
        // The cost model's H200 figures.
        assert_eq!((Target::SM_90A.dram_gbps(), Target::SM_90A.tensor_tflops(), Target::SM_90A.cuda_core_tflops()), (4270.0, 680.0, 60.0));
        assert_eq!(Target::SM_80.cuda_core_tflops(), 19.5);
        assert!(Target::SM_80.runs_on((9, 0)) && Target::SM_90A.runs_on((9, 0)) && !Target::SM_90A.runs_on((10, 0)));
        assert!(!Target::SM_90.runs_on((8, 6)) && Target::SM_80.runs_on((8, 6)));
    }
}
