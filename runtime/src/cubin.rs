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
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use process_control::{ChildExt, Control};
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
            // The driver reads the image by the offsets in its headers, with no length: an
            // image whose headers point past its end is never handed to it.
            Some(code) => match elf_problem(code) {
                None => CubinLookup::Hit(code.to_vec()),
                Some(p) => CubinLookup::Corrupt { path, reason: format!("the code after the stamp {p}") },
            },
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
/// `SINTER_CUBIN=0` (or `false`, `off`, `no`) turns cubins off; otherwise `ptxas` —
/// `SINTER_PTXAS`, else `$SINTER_CACHE/bin/ptxas` (where `scripts/setup` puts it;
/// `~/.cache/sinter/bin` without `SINTER_CACHE`), else `ptxas` on the `PATH` — with its
/// version (`ptxas --version`'s release and build lines). [`CubinAssembler::Off`] (version
/// `""`) when none of these runs (one that does not answer `--version` within 10 s is killed
/// and passed over).
pub fn assembler_from_env() -> (CubinAssembler, String) {
    let off = std::env::var("SINTER_CUBIN").is_ok_and(|v| cubins_off(&v));
    let explicit = std::env::var_os("SINTER_PTXAS").filter(|v| !v.is_empty()).map(PathBuf::from);
    let toolchain = KernelCache::default_dir().ok().map(|k| k.with_file_name("bin").join("ptxas"));
    choose_assembler(off, explicit.into_iter().chain(toolchain).chain(std::iter::once(PathBuf::from("ptxas"))))
}

/// Whether `SINTER_CUBIN`'s value turns cubins off: `0`, `false`, `off` or `no`, in any case.
fn cubins_off(value: &str) -> bool {
    ["0", "false", "off", "no"].iter().any(|v| value.trim().eq_ignore_ascii_case(v))
}

/// How long `ptxas --version` may take before the program is killed and passed over.
const VERSION_LIMIT: Duration = Duration::from_secs(10);

/// How long one kernel's assembly may take before `ptxas` is killed (the kernel is then
/// JIT-compiled from its PTX, and this process assembles nothing more: [`TIMED_OUT`]); the
/// largest kernels take well under a second.
const ASSEMBLY_LIMIT: Duration = Duration::from_secs(120);

/// Set when an assembly ran past [`ASSEMBLY_LIMIT`]: a `ptxas` that hangs once would hang on
/// every kernel, so the rest are JIT-compiled at once.
static TIMED_OUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `cmd`'s exit status and output, as [`Command::output`] gives them, unless it runs past
/// `limit`: it is then killed and the error says so (a `SINTER_PTXAS` that hangs must not hang
/// sinter).
fn output_within(cmd: &mut Command, limit: Duration) -> std::io::Result<Output> {
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    // process_control drains both pipes while it waits, and kills the child past the limit.
    match child.controlled_with_output().time_limit(limit).terminate_for_timeout().wait()? {
        Some(out) => Ok(Output { status: out.status.into_std_lossy(), stdout: out.stdout, stderr: out.stderr }),
        None => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("did not finish in {} s and was killed", limit.as_secs()))),
    }
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
    let out = output_within(Command::new(path).arg("--version"), VERSION_LIMIT).ok().filter(|o| o.status.success())?;
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

/// A fresh folder of this process's own under the system's temporary folder (created
/// exclusively, readable by its owner only), removed on drop: the PTX and the cubin of one
/// assembly, out of reach of another process, container or user that shares `/tmp`.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        let mut last = String::new();
        for _ in 0..16 {
            let path = base.join(format!("sinter-cubin-{}-{}-{nanos}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
            match builder.create(&path) {
                Ok(()) => return Ok(Scratch(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = format!("{}: {e}", path.display()),
                Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
            }
        }
        Err(format!("no free folder name in {} ({last})", base.display()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Why `code` is not a CUDA ELF image whose headers and sections lie inside it (`None`
/// when it is one). The driver's `cuModuleLoadData` takes no length and trusts the headers, so
/// a cubin is checked when `ptxas` has made it and when it is read from the cache.
fn elf_problem(code: &[u8]) -> Option<String> {
    const EM_CUDA: u16 = 190;
    const SHT_NOBITS: u32 = 8;
    let len = code.len() as u64;
    if code.len() < 64 || !code.starts_with(b"\x7fELF") {
        return Some(format!("is not an ELF image ({} bytes)", code.len()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([code[o], code[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(code[o..o + 4].try_into().unwrap_or_default());
    let u64_at = |o: usize| u64::from_le_bytes(code[o..o + 8].try_into().unwrap_or_default());
    if code[4] != 2 || code[5] != 1 || u16_at(18) != EM_CUDA {
        return Some(format!("is not a 64-bit little-endian CUDA ELF image (class {}, data {}, machine {})", code[4], code[5], u16_at(18)));
    }
    let table = |off: u64, n: u16, size: u16| off.checked_add(u64::from(n) * u64::from(size)).filter(|&end| end <= len).map(|_| ());
    let (phoff, phsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    let (shoff, shsize, shnum) = (u64_at(40), u16_at(58), u16_at(60));
    if table(phoff, phnum, phsize).is_none() || table(shoff, shnum, shsize).is_none() {
        return Some(format!("has header tables past its end ({len} bytes): truncated"));
    }
    let within = |off: u64, size: u64| off.checked_add(size).is_some_and(|end| end <= len);
    // Only 64-bit entries are read (an image with smaller ones is left to the driver).
    for i in 0..u64::from(shnum) * u64::from(shsize >= 64) {
        let h = (shoff + i * u64::from(shsize)) as usize;
        if u32_at(h + 4) != SHT_NOBITS && !within(u64_at(h + 24), u64_at(h + 32)) {
            return Some(format!("has section {i} past its end ({len} bytes): truncated"));
        }
    }
    for i in 0..u64::from(phnum) * u64::from(phsize >= 56) {
        let h = (phoff + i * u64::from(phsize)) as usize;
        if !within(u64_at(h + 8), u64_at(h + 32)) {
            return Some(format!("has segment {i} past its end ({len} bytes): truncated"));
        }
    }
    None
}

/// Assembles `ptx` for `arch` with the `ptxas` program at `ptxas` (default optimisation),
/// through files in a [`Scratch`] folder; `ptxas` is killed after [`ASSEMBLY_LIMIT`]. Errors
/// are (a short code, ptxas's messages or what failed, naming the file or program).
pub(crate) fn ptxas_assemble(ptxas: &std::path::Path, ptx: &str, arch: &str) -> Result<Vec<u8>, (String, String)> {
    let fail = |what: &str, e: String| ("PTXAS_FAILED".to_string(), format!("{what}: {e}"));
    if TIMED_OUT.load(Ordering::Relaxed) {
        return Err(fail(&ptxas.display().to_string(), format!("an earlier assembly ran past {} s; no more are tried", ASSEMBLY_LIMIT.as_secs())));
    }
    let scratch = Scratch::new().map_err(|e| fail("no folder for the PTX", e))?;
    let (src, dst) = (scratch.0.join("kernel.ptx"), scratch.0.join("kernel.cubin"));
    std::fs::write(&src, ptx).map_err(|e| fail(&format!("cannot write {}", src.display()), e.to_string()))?;
    let out =
        output_within(Command::new(ptxas).arg(format!("-arch={}", ptxas_arch(ptx, arch))).arg("-o").arg(&dst).arg(&src), ASSEMBLY_LIMIT).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                TIMED_OUT.store(true, Ordering::Relaxed);
            }
            fail(&format!("cannot run {}", ptxas.display()), e.to_string())
        })?;
    if !out.status.success() {
        return Err(fail(&format!("{} ({})", ptxas.display(), out.status), String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    let cubin = std::fs::read(&dst).map_err(|e| fail(&format!("cannot read {}'s cubin {}", ptxas.display(), dst.display()), e.to_string()))?;
    match elf_problem(&cubin) {
        None => Ok(cubin),
        Some(p) => Err(fail(&format!("{}'s cubin", ptxas.display()), p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asm(arch: &str, version: &str) -> Assembler {
        Assembler { arch: arch.into(), version: version.into() }
    }

    const PTX: &str = ".version 8.5\n.target sm_90a\n.address_size 64\n.visible .entry k() { ret; }\n";

    /// A CUDA ELF header (64-bit, little-endian, no program or section headers) and `tail`.
    fn fake_cubin(tail: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        h[18..20].copy_from_slice(&190u16.to_le_bytes());
        h[54..56].copy_from_slice(&56u16.to_le_bytes());
        h[58..60].copy_from_slice(&64u16.to_le_bytes());
        [h, tail.to_vec()].concat()
    }

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
        let path = cache.put_cubin(PTX, &a, &fake_cubin(b"code")).unwrap();
        assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Hit(fake_cubin(b"code")));
        // Another architecture, another assembler, another PTX: other entries.
        for other in [asm("sm_80", &a.version), asm("sm_90", "ptxas release 12.8, V12.8.93"), asm("sm_90", "ptxas release 13.0, V13.0.48")] {
            assert_ne!(cubin_digest(PTX, &other), cubin_digest(PTX, &a));
            assert_eq!(cache.get_cubin(PTX, &other), CubinLookup::Miss, "{other:?}");
        }
        assert_eq!(cache.get_cubin(&PTX.replace("ret", "exit"), &a), CubinLookup::Miss);
        // Another assembler's entry copied under this one's name is refused, never loaded.
        let b = asm("sm_90", "ptxas release 12.9, V12.9.86");
        let b_path = cache.put_cubin(PTX, &b, &fake_cubin(b"newer")).unwrap();
        std::fs::copy(&b_path, &path).unwrap();
        assert!(matches!(cache.get_cubin(PTX, &a), CubinLookup::Corrupt { .. }));
        // An entry whose key matches but whose stamp names another assembler (a cache
        // rewritten by hand, or by a sinter that stamped differently) is refused too.
        let body = [b.stamp().as_bytes(), &fake_cubin(b"newer")].concat();
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
        let code = fake_cubin(&(0..=255u8).cycle().take(4000).collect::<Vec<u8>>());
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

    /// A cache entry that is intact (its checksum matches) but whose code is no CUDA ELF
    /// image, or one whose headers point past its end, is refused: `cuModuleLoadData` takes
    /// no length and would read past the buffer.
    #[test]
    fn entries_that_are_not_whole_elf_images_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let a = asm("sm_90", "ptxas release 12.8, V12.8.61");
        // One section header (at 64) whose section runs past the end.
        let mut past = fake_cubin(&[0u8; 64]);
        past[40..48].copy_from_slice(&64u64.to_le_bytes());
        past[60..62].copy_from_slice(&1u16.to_le_bytes());
        past[64 + 24..64 + 32].copy_from_slice(&100u64.to_le_bytes());
        past[64 + 32..64 + 40].copy_from_slice(&10_000u64.to_le_bytes());
        let mut headers_past = fake_cubin(b"");
        headers_past[40..48].copy_from_slice(&64u64.to_le_bytes());
        headers_past[60..62].copy_from_slice(&12u16.to_le_bytes());
        let mut x86 = fake_cubin(b"code");
        x86[18] = 62;
        for (what, code) in [("empty", vec![]), ("text", b"abc".to_vec()), ("x86", x86), ("section", past), ("headers", headers_past)] {
            cache.put_cubin(PTX, &a, &code).unwrap();
            match cache.get_cubin(PTX, &a) {
                CubinLookup::Corrupt { reason, .. } => assert!(reason.starts_with("the code after the stamp"), "{what}: {reason}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        // A real cubin, cut short (and its entry's checksum made to match), is refused too.
        let Some(ptxas) = std::env::var_os("SINTER_PTXAS").filter(|v| !v.is_empty()).map(PathBuf::from) else {
            eprintln!("skipped the rest: SINTER_PTXAS is not set");
            return;
        };
        let cubin = ptxas_assemble(&ptxas, PTX, "sm_90").unwrap();
        assert_eq!(elf_problem(&cubin), None);
        cache.put_cubin(PTX, &a, &cubin).unwrap();
        assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Hit(cubin.clone()));
        for cut in [cubin.len() - 1, cubin.len() / 2, 63] {
            cache.put_cubin(PTX, &a, &cubin[..cut]).unwrap();
            assert!(matches!(cache.get_cubin(PTX, &a), CubinLookup::Corrupt { .. }), "cut at {cut}");
        }
    }

    /// `path`, an executable shell script of `body`, written by another process (a file this
    /// process held open for writing could not be run while a test thread forks).
    #[cfg(unix)]
    fn script(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        let mut sh = Command::new("sh").arg("-c").arg("cat > \"$1\" && chmod +x \"$1\"").arg("sh").arg(&path).stdin(Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(sh.stdin.as_mut().unwrap(), body.as_bytes()).unwrap();
        drop(sh.stdin.take());
        assert!(sh.wait().unwrap().success());
        path
    }

    /// Programs that claim to be `ptxas` but write no cubin, an empty one, garbage, or fail:
    /// each is an error naming the program, never a cubin.
    #[cfg(unix)]
    #[test]
    fn a_ptxas_that_misbehaves_makes_no_cubin() {
        let dir = tempfile::tempdir().unwrap();
        let version = "if [ \"$1\" = --version ]; then echo 'ptxas: fake'; echo 'Cuda compilation tools, release 99.9, V99.9.1'; exit 0; fi\nfor a; do [ \"$prev\" = -o ] && out=\"$a\"; prev=\"$a\"; done\n";
        let cases = [
            ("garbage", "printf abc > \"$out\"\n", "not an ELF image"),
            ("empty", ": > \"$out\"\n", "not an ELF image"),
            ("silent", "exit 0\n", "cannot read"),
            ("failing", "echo 'ptxas fatal: broken' >&2; exit 3\n", "ptxas fatal: broken"),
        ];
        for (name, tail, expected) in cases {
            let path = script(dir.path(), name, &format!("#!/bin/sh\n{version}{tail}"));
            let (found, v) = choose_assembler(false, [path.clone()]);
            assert_eq!((found, v.as_str()), (CubinAssembler::Ptxas(path.clone()), "ptxas Cuda compilation tools, release 99.9, V99.9.1"), "{name}");
            let (code, log) = ptxas_assemble(&path, PTX, "sm_90").unwrap_err();
            assert_eq!(code, "PTXAS_FAILED");
            assert!(log.contains(expected) && log.contains(&path.display().to_string()), "{name}: {log}");
        }
        // Not executable, a folder: passed over.
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\necho ptxas release 1\n").unwrap();
        assert_eq!(choose_assembler(false, [plain, dir.path().to_path_buf()]), (CubinAssembler::Off, String::new()));
    }

    /// A program that hangs is killed at the limit, with an error that says so.
    #[cfg(unix)]
    #[test]
    fn a_hanging_program_is_killed() {
        let t = std::time::Instant::now();
        let err = output_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("killed"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let out = output_within(Command::new("sh").arg("-c").arg("echo out; echo err >&2; exit 2"), Duration::from_secs(10)).unwrap();
        assert_eq!((out.status.code(), &out.stdout[..], &out.stderr[..]), (Some(2), &b"out\n"[..], &b"err\n"[..]));
    }

    #[test]
    fn sinter_cubin_off_values() {
        for v in ["0", " 0 ", "false", "OFF", "no"] {
            assert!(cubins_off(v), "{v:?}");
        }
        for v in ["", "1", "true", "on", "yes", "00"] {
            assert!(!cubins_off(v), "{v:?}");
        }
    }

    /// Each assembly gets a fresh folder of its own (owner-only), removed afterwards.
    #[cfg(unix)]
    #[test]
    fn scratch_folders_are_private_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (Scratch::new().unwrap(), Scratch::new().unwrap());
        assert_ne!(a.0, b.0);
        assert_eq!(std::fs::metadata(&a.0).unwrap().permissions().mode() & 0o777, 0o700);
        let path = a.0.clone();
        std::fs::write(path.join("kernel.ptx"), "x").unwrap();
        drop(a);
        assert!(!path.exists());
    }
}
