//! GPU targets that sinter generates code for.
//!
//! A [`Target`] names one NVIDIA architecture (`sm_80`, `sm_90`, `sm_90a`) and carries the
//! facts that code generation and scheduling need about it: the SM version, the warp size, the
//! shared-memory limits, the PTX ISA version that sinter emits for it, and the CPU name and
//! feature string handed to LLVM's NVPTX back end.
//!
//! ```
//! use sinter_codegen::target::Target;
//!
//! let t = Target::parse("sm_90a").unwrap();
//! assert_eq!(t.sm_version(), 90);
//! assert!(t.is_arch_specific());
//! assert_eq!(t.llvm_features(), "+ptx85");
//! assert!(Target::parse("sm_75").is_err());
//! ```

use std::fmt;
use std::str::FromStr;

/// The LLVM target triple of every sinter kernel: 64-bit NVPTX for the CUDA driver.
pub const NVPTX_TRIPLE: &str = "nvptx64-nvidia-cuda";

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    name: &'static str,
    sm: u32,
    arch_specific: bool,
    max_shared_per_block_optin: u32,
    max_shared_per_sm: u32,
}

impl Target {
    /// Ampere (A100, A800): `mma.sync` tensor cores, `cp.async`, `ldmatrix`.
    /// 164 KiB of shared memory per SM, of which one block may opt in to 163 KiB.
    pub const SM_80: Target = Target {
        name: "sm_80",
        sm: 80,
        arch_specific: false,
        max_shared_per_block_optin: 163 * KIB,
        max_shared_per_sm: 164 * KIB,
    };

    /// Hopper (H100, H200) without the architecture-specific features: everything of
    /// sm_80 plus thread-block clusters, distributed shared memory, TMA and `mbarrier`
    /// transactions. 228 KiB of shared memory per SM, 227 KiB per block with opt-in.
    pub const SM_90: Target = Target {
        name: "sm_90",
        sm: 90,
        arch_specific: false,
        max_shared_per_block_optin: 227 * KIB,
        max_shared_per_sm: 228 * KIB,
    };

    /// Hopper with its architecture-specific features (`wgmma.mma_async`, `setmaxnreg`):
    /// code for `sm_90a` runs on sm_90 devices only, never on later architectures.
    pub const SM_90A: Target = Target {
        name: "sm_90a",
        sm: 90,
        arch_specific: true,
        max_shared_per_block_optin: 227 * KIB,
        max_shared_per_sm: 228 * KIB,
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

    /// Whether the target has `wgmma.mma_async` (warpgroup tensor-core instructions).
    pub fn has_wgmma(&self) -> bool {
        self.sm == 90 && self.arch_specific
    }

    /// Whether the target has the Tensor Memory Accelerator (`cp.async.bulk.tensor`).
    pub fn has_tma(&self) -> bool {
        self.sm >= 90
    }

    /// The PTX ISA version of the emitted PTX, as `(major, minor)`: [`PTX_ISA_VERSION`].
    pub fn ptx_isa_version(&self) -> (u32, u32) {
        PTX_ISA_VERSION
    }

    /// The LLVM target triple: [`NVPTX_TRIPLE`].
    pub fn llvm_triple(&self) -> &'static str {
        NVPTX_TRIPLE
    }

    /// The CPU name handed to LLVM's NVPTX back end (the same as [`Target::name`]).
    pub fn llvm_cpu(&self) -> &'static str {
        self.name
    }

    /// The feature string handed to LLVM's NVPTX back end: `+ptx85`, which selects the PTX
    /// ISA version (LLVM 22 knows `ptx80` to `ptx88` and `ptx90`; the architecture itself
    /// comes from [`Target::llvm_cpu`]).
    pub fn llvm_features(&self) -> &'static str {
        "+ptx85"
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
            assert_eq!(t.llvm_features(), "+ptx85");
            assert_eq!(t.llvm_cpu(), t.name());
            assert!(t.max_shared_memory_per_block() <= t.max_shared_memory_per_sm());
        }
        assert_eq!(Target::SM_80.max_shared_memory_per_block(), 166_912);
        assert_eq!(Target::SM_90.max_shared_memory_per_block(), 232_448);
        assert_eq!(Target::SM_90A.sm_version(), 90);
        assert!(Target::SM_90A.has_wgmma() && !Target::SM_90.has_wgmma());
        assert!(Target::SM_90.has_tma() && !Target::SM_80.has_tma());
    }
}
