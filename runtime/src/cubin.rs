//! Machine code in the kernel cache: each kernel's PTX assembled once, by `ptxas`, into a
//! cubin for the device's architecture, and kept beside the plans as `<digest>.cubin`.
//!
//! An entry is keyed by the SHA-256 of the PTX, the device's architecture (`sm_90`) and the
//! assembler's version ([`Assembler`]: `ptxas`'s version line); a cubin made for another card
//! or by another assembler is another entry, never served. The entry repeats both in its
//! body's first line, checked on reading, and carries the cache's length and checksum header
//! ([`crate::cache`]): an entry that is damaged, or holds another architecture's or
//! assembler's code, is [`CubinLookup::Corrupt`] — reported, assembled again and rewritten,
//! never loaded. Loading a cached cubin is a plain `cuModuleLoadData`; the PTX stays the
//! portable form (a card without a cubin JIT-compiles the PTX, as the driver always did).
//! The assembler is `ptxas` wherever one is found ([`assembler_from_env`]: `SINTER_PTXAS`,
//! the toolchain's from `scripts/setup`, or the `PATH`), one process per kernel; without one
//! the driver JIT-compiles the PTX as before. Not the driver's own linker (`cuLinkCreate`):
//! its cubins of wgmma kernels faulted on the H200 (`book/src/design/compile-time.md`).

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::cache::KernelCache;
use crate::error::RuntimeError;

/// What turns PTX into machine code for one device: its architecture and the assembler's
/// version. Part of every cubin entry's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Assembler {
    /// The device's architecture, e.g. `sm_90` (the cubin's `.target` follows the PTX's, so
    /// `sm_90a` PTX gives an `sm_90a` cubin; the PTX is part of the key).
    pub arch: String,
    /// The assembler's version: `ptxas` and its release and build, e.g. `ptxas Cuda
    /// compilation tools, release 12.9, V12.9.86; Build cuda_12.9.r12.9/compiler.36037853_0`
    /// (`none` where there is no assembler).
    pub version: String,
}

impl Assembler {
    /// The assembler of a device of compute capability `cc` (`(9, 0)`), `version` as
    /// [`assembler_from_env`] gives it.
    pub fn for_device(cc: (u32, u32), version: &str) -> Assembler {
        let version = if version.is_empty() { "none" } else { version };
        Assembler { arch: format!("sm_{}{}", cc.0, cc.1), version: version.to_string() }
    }

    /// The first line of a cubin entry's body: what the code is for and what made it.
    fn stamp(&self) -> String {
        format!("cubin {} {}\n", self.arch, self.version)
    }
}

/// The result of looking a cubin up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CubinLookup {
    /// An intact entry for this PTX, architecture and assembler: the cubin's bytes.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that is damaged or was made for another architecture or assembler: not to be
    /// loaded; assemble again and rewrite it.
    Corrupt {
        /// The entry's file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

/// The cache digest of `ptx`'s cubin by `asm` (each field length-prefixed).
pub fn cubin_digest(ptx: &str, asm: &Assembler) -> String {
    let mut h = Sha256::new();
    for (name, v) in [("cubin-of-ptx", ptx), ("arch", asm.arch.as_str()), ("assembler", asm.version.as_str())] {
        h.update(name.as_bytes());
        h.update((v.len() as u64).to_le_bytes());
        h.update(v.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl KernelCache {
    /// Looks up the cubin of `ptx` made by `asm`. Never fails: an unreadable, damaged or
    /// foreign entry is [`CubinLookup::Corrupt`].
    pub fn get_cubin(&self, ptx: &str, asm: &Assembler) -> CubinLookup {
        let digest = cubin_digest(ptx, asm);
        let path = self.dir().join(format!("{digest}.cubin"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return CubinLookup::Miss,
            Err(e) => return CubinLookup::Corrupt { path, reason: format!("cannot read: {e}") },
        };
        let body = match crate::cache::verify_entry_bytes(&digest, &bytes) {
            Ok(b) => b,
            Err(reason) => return CubinLookup::Corrupt { path, reason },
        };
        let stamp = asm.stamp();
        match body.strip_prefix(stamp.as_bytes()) {
            Some(code) if !code.is_empty() => CubinLookup::Hit(code.to_vec()),
            Some(_) => CubinLookup::Corrupt { path, reason: "no code after the stamp".into() },
            None => {
                let line = body.split(|&b| b == b'\n').next().map(|l| String::from_utf8_lossy(l).into_owned()).unwrap_or_default();
                CubinLookup::Corrupt { path, reason: format!("made for `{line}`, this device needs `{}`", stamp.trim_end()) }
            }
        }
    }

    /// Deletes the cubin of `ptx` made by `asm`, if there is one (one the driver would not
    /// load: the next start assembles it again). A file that cannot be removed is left.
    pub fn remove_cubin(&self, ptx: &str, asm: &Assembler) {
        let _ = std::fs::remove_file(self.dir().join(format!("{}.cubin", cubin_digest(ptx, asm))));
    }

    /// Stores `cubin`, the code of `ptx` made by `asm`, atomically; returns the entry's path.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when the file cannot be written or renamed.
    pub fn put_cubin(&self, ptx: &str, asm: &Assembler, cubin: &[u8]) -> Result<PathBuf, RuntimeError> {
        let body = [asm.stamp().as_bytes(), cubin].concat();
        self.write_entry_bytes(&cubin_digest(ptx, asm), "cubin", &body)
    }
}

/// What makes the machine code of the cubin cache on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CubinAssembler {
    /// A `ptxas` program (whole-program, `-arch` of the PTX's architecture-specific target or
    /// the card's).
    Ptxas(PathBuf),
    /// No cubins (`SINTER_CUBIN=0`, or no `ptxas` found): the driver JIT-compiles each PTX.
    Off,
}

/// The assembler the environment chooses, with its version for the cache's key:
/// `SINTER_CUBIN=0` turns cubins off; otherwise `ptxas` — `SINTER_PTXAS`, else
/// `$SINTER_CACHE/bin/ptxas` (where `scripts/setup` puts it; `~/.cache/sinter/bin` without
/// `SINTER_CACHE`), else `ptxas` on the `PATH` — with its version (`ptxas --version`'s
/// release and build lines). [`CubinAssembler::Off`] (version `""`) when none of these runs.
pub fn assembler_from_env() -> (CubinAssembler, String) {
    let off = std::env::var("SINTER_CUBIN").is_ok_and(|v| v.trim() == "0");
    let explicit = std::env::var_os("SINTER_PTXAS").filter(|v| !v.is_empty()).map(PathBuf::from);
    let toolchain = KernelCache::default_dir().ok().map(|k| k.with_file_name("bin").join("ptxas"));
    choose_assembler(off, explicit.into_iter().chain(toolchain).chain(std::iter::once(PathBuf::from("ptxas"))))
}

/// The first of `candidates` that runs as a `ptxas`, unless cubins are `off`.
fn choose_assembler(off: bool, candidates: impl IntoIterator<Item = PathBuf>) -> (CubinAssembler, String) {
    if off {
        return (CubinAssembler::Off, String::new());
    }
    for path in candidates {
        if let Some(version) = ptxas_version(&path) {
            return (CubinAssembler::Ptxas(path), format!("ptxas {version}"));
        }
    }
    (CubinAssembler::Off, String::new())
}

/// `ptxas --version`'s release and build lines (`Cuda compilation tools, release 12.9,
/// V12.9.86; Build cuda_12.9.r12.9/compiler.36037853_0`), where `path` runs as a `ptxas`.
fn ptxas_version(path: &std::path::Path) -> Option<String> {
    let out = std::process::Command::new(path).arg("--version").output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| l.contains("release") || l.starts_with("Build")).collect();
    (text.contains("ptxas") && !lines.is_empty()).then(|| lines.join("; "))
}

/// The architecture `ptxas` assembles `ptx` for on a device of architecture `arch`
/// (`sm_89`): the PTX's own `.target` where it is architecture-specific (`sm_90a`), else the
/// device's (PTX for `sm_80` assembles for any later card).
fn ptxas_arch(ptx: &str, arch: &str) -> String {
    let target = ptx.lines().find_map(|l| l.trim().strip_prefix(".target ")).map(|t| t.split([',', ' ']).next().unwrap_or("").trim().to_string());
    match target {
        Some(t) if t.ends_with('a') => t,
        _ => arch.to_string(),
    }
}

/// Assembles `ptx` for `arch` with the `ptxas` program at `ptxas` (default optimisation),
/// through temporary files. Errors are (a short code, ptxas's messages).
pub(crate) fn ptxas_assemble(ptxas: &std::path::Path, ptx: &str, arch: &str) -> Result<Vec<u8>, (String, String)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let stem = std::env::temp_dir().join(format!("sinter-ptxas-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let (src, dst) = (stem.with_extension("ptx"), stem.with_extension("cubin"));
    let fail = |what: &str, e: String| ("PTXAS_FAILED".to_string(), format!("{what}: {e}"));
    let r = (|| {
        std::fs::write(&src, ptx).map_err(|e| fail("cannot write the PTX", e.to_string()))?;
        let out = std::process::Command::new(ptxas)
            .arg(format!("-arch={}", ptxas_arch(ptx, arch)))
            .arg("-o")
            .arg(&dst)
            .arg(&src)
            .output()
            .map_err(|e| fail(&format!("cannot run {}", ptxas.display()), e.to_string()))?;
        if !out.status.success() {
            return Err(fail("ptxas", String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        std::fs::read(&dst).map_err(|e| fail("cannot read the cubin", e.to_string()))
    })();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asm(arch: &str, version: &str) -> Assembler {
        Assembler { arch: arch.into(), version: version.into() }
    }

    const PTX: &str = ".version 8.5\n.target sm_90a\n.address_size 64\n.visible .entry k() { ret; }\n";

    #[test]
    fn ptxas_assembles_for_the_card_or_the_arch_specific_target() {
        assert_eq!(ptxas_arch(PTX, "sm_90"), "sm_90a");
        assert_eq!(ptxas_arch(&PTX.replace("sm_90a", "sm_80"), "sm_89"), "sm_89");
        assert_eq!(ptxas_arch("no target", "sm_80"), "sm_80");
    }

    /// With `SINTER_PTXAS` (the toolchain's ptxas) a PTX assembles into an ELF cubin; bad PTX
    /// is an error with ptxas's message. Skipped without it.
    #[test]
    fn ptxas_makes_a_cubin() {
        let Some(ptxas) = std::env::var_os("SINTER_PTXAS").filter(|v| !v.is_empty()).map(PathBuf::from) else {
            eprintln!("skipped: SINTER_PTXAS is not set");
            return;
        };
        let cubin = ptxas_assemble(&ptxas, PTX, "sm_90").unwrap();
        assert!(cubin.starts_with(b"\x7fELF"), "{:?}", &cubin[..cubin.len().min(8)]);
        let (code, log) = ptxas_assemble(&ptxas, &PTX.replace("ret;", "bogus;"), "sm_90").unwrap_err();
        assert_eq!(code, "PTXAS_FAILED");
        assert!(log.contains("bogus") || log.contains("error"), "{log}");
    }

    /// The first candidate that runs as a `ptxas` is the assembler; programs that do not run or
    /// are not `ptxas` are passed over; `SINTER_CUBIN=0` or no `ptxas` means no cubins.
    #[test]
    fn the_assembler_is_the_first_ptxas_found() {
        let missing = PathBuf::from("/nonexistent/ptxas");
        let not_ptxas = PathBuf::from("true");
        assert_eq!(choose_assembler(false, [missing.clone(), not_ptxas.clone()]), (CubinAssembler::Off, String::new()));
        let Some(ptxas) = std::env::var_os("SINTER_PTXAS").filter(|v| !v.is_empty()).map(PathBuf::from) else {
            eprintln!("skipped the rest: SINTER_PTXAS is not set");
            return;
        };
        let (found, version) = choose_assembler(false, [missing, not_ptxas, ptxas.clone()]);
        assert_eq!(found, CubinAssembler::Ptxas(ptxas.clone()));
        assert!(version.starts_with("ptxas Cuda compilation tools"), "{version}");
        assert_eq!(choose_assembler(true, [ptxas]), (CubinAssembler::Off, String::new()));
    }

    #[test]
    fn cubins_of_another_arch_or_assembler_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let a = asm("sm_90", "ptxas release 12.8, V12.8.61");
        assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Miss);
        let path = cache.put_cubin(PTX, &a, b"\x7fELF code").unwrap();
        assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Hit(b"\x7fELF code".to_vec()));
        // Another architecture, another assembler, another PTX: other entries.
        for other in [asm("sm_80", &a.version), asm("sm_90", "ptxas release 12.8, V12.8.93"), asm("sm_90", "ptxas release 13.0, V13.0.48")] {
            assert_ne!(cubin_digest(PTX, &other), cubin_digest(PTX, &a));
            assert_eq!(cache.get_cubin(PTX, &other), CubinLookup::Miss, "{other:?}");
        }
        assert_eq!(cache.get_cubin(&PTX.replace("ret", "exit"), &a), CubinLookup::Miss);
        // Another assembler's entry copied under this one's name is refused, never loaded.
        let b = asm("sm_90", "ptxas release 12.9, V12.9.86");
        let b_path = cache.put_cubin(PTX, &b, b"\x7fELF newer").unwrap();
        std::fs::copy(&b_path, &path).unwrap();
        assert!(matches!(cache.get_cubin(PTX, &a), CubinLookup::Corrupt { .. }));
        // An entry whose key matches but whose stamp names another assembler (a cache
        // rewritten by hand, or by a sinter that stamped differently) is refused too.
        let body = [b.stamp().as_bytes(), b"\x7fELF newer"].concat();
        cache.write_entry_bytes(&cubin_digest(PTX, &a), "cubin", &body).unwrap();
        match cache.get_cubin(PTX, &a) {
            CubinLookup::Corrupt { reason, .. } => assert!(reason.contains("this device needs"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    /// Damage of every kind is detected and reported; rewriting the entry repairs it.
    #[test]
    fn corrupt_cubins_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let a = asm("sm_90", "ptxas release 12.8, V12.8.61");
        let code: Vec<u8> = (0..=255u8).cycle().take(4000).collect();
        let path = cache.put_cubin(PTX, &a, &code).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut damaged: Vec<Vec<u8>> = vec![vec![], good[..good.len() - 1].to_vec(), [good.clone(), vec![0]].concat()];
        let mut flipped = good.clone();
        let n = flipped.len();
        flipped[n - 100] ^= 1;
        damaged.push(flipped);
        for cut in (0..good.len()).step_by(97) {
            damaged.push(good[..cut].to_vec());
        }
        for bytes in damaged {
            std::fs::write(&path, &bytes).unwrap();
            assert!(matches!(cache.get_cubin(PTX, &a), CubinLookup::Corrupt { .. }), "{} bytes", bytes.len());
            cache.put_cubin(PTX, &a, &code).unwrap();
            assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Hit(code.clone()));
        }
    }
}
