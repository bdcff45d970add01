//! Machine code in the kernel cache: each kernel's PTX assembled once, by the CUDA driver's
//! own JIT linker (`cuLinkCreate` / `cuLinkAddData(PTX)` / `cuLinkComplete`), into a cubin for
//! the device's architecture, and kept beside the plans as `<digest>.cubin`.
//!
//! An entry is keyed by the SHA-256 of the PTX, the device's architecture (`sm_90`) and the
//! assembler's version ([`Assembler`]: the CUDA driver API version and the kernel driver's
//! version, since the linker is the driver's); a cubin made for another card or by another
//! driver is another entry, never served. The entry repeats both in its body's first line,
//! checked on reading, and carries the cache's length and checksum header
//! ([`crate::cache`]): an entry that is damaged, or holds another architecture's or
//! assembler's code, is [`CubinLookup::Corrupt`] — reported, assembled again and rewritten,
//! never loaded. Loading a cached cubin is a plain `cuModuleLoadData`; the PTX stays the
//! portable form (a card without a cubin JIT-compiles the PTX, as the driver always did).
//! `book/src/design/compile-time.md` says why the driver's linker rather than `ptxas`;
//! `SINTER_ASSEMBLER=ptxas` (with `SINTER_PTXAS` or `ptxas` on the `PATH`) assembles with
//! `ptxas` processes instead, keyed by `ptxas`'s version.

use std::ffi::{c_void, CString};
use std::path::PathBuf;

use cudarc::driver::sys::{self, CUjit_option, CUjitInputType};
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
    /// The assembler's version, e.g. `cuda 12.8 driver 570.86.15`: the driver API version
    /// and, where the kernel driver says (`/proc/driver/nvidia/version`), its release.
    pub version: String,
}

impl Assembler {
    /// The assembler of a device of compute capability `cc` under a driver of API version
    /// `driver` (`(12, 8)`), with the kernel driver's release read from
    /// `/proc/driver/nvidia/version` where there is one.
    pub fn for_device(cc: (u32, u32), driver: (u32, u32)) -> Assembler {
        let release = std::fs::read_to_string("/proc/driver/nvidia/version").ok().and_then(|t| kernel_driver_release(&t));
        let mut version = format!("cuda {}.{}", driver.0, driver.1);
        if let Some(r) = release {
            version.push_str(&format!(" driver {r}"));
        }
        Assembler { arch: format!("sm_{}{}", cc.0, cc.1), version }
    }

    /// The first line of a cubin entry's body: what the code is for and what made it.
    fn stamp(&self) -> String {
        format!("cubin {} {}\n", self.arch, self.version)
    }
}

/// The release in `/proc/driver/nvidia/version`'s first line (`NVRM version: NVIDIA UNIX
/// x86_64 Kernel Module  570.86.15  Wed …`): the first word after `Kernel Module` that starts
/// with a digit.
fn kernel_driver_release(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let rest = &line[line.find("Kernel Module")? + "Kernel Module".len()..];
    rest.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit())).map(str::to_string)
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

/// `ptxas` to assemble with instead of the driver's linker, where `SINTER_ASSEMBLER=ptxas`
/// asks for it: `SINTER_PTXAS` or `ptxas` on the `PATH`, with its version (`ptxas
/// --version`'s last line). `None` (the driver's linker) when not asked for or when the
/// program does not run.
pub(crate) fn ptxas_from_env() -> Option<(PathBuf, String)> {
    if std::env::var("SINTER_ASSEMBLER").ok()?.trim() != "ptxas" {
        return None;
    }
    let path = std::env::var_os("SINTER_PTXAS").filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from("ptxas"), PathBuf::from);
    let out = std::process::Command::new(&path).arg("--version").output().ok().filter(|o| o.status.success())?;
    let version = String::from_utf8_lossy(&out.stdout).lines().last()?.trim().to_string();
    Some((path, format!("ptxas {version}")))
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

/// Bytes of the linker's log buffers.
const LINK_LOG_BYTES: usize = 1 << 16;

/// Owns a `CUlinkState`: destroyed on every path.
struct LinkState(sys::CUlinkState);

impl Drop for LinkState {
    fn drop(&mut self) {
        // SAFETY: the state was created by cuLinkCreate and is destroyed once.
        let _ = unsafe { sys::cuLinkDestroy(self.0) };
    }
}

/// Assembles `ptx` into a cubin for the device of the context current on this thread, with
/// the driver's JIT linker at its default optimisation (the code `cuModuleLoadData` of the
/// PTX would make). Errors are (CUDA error name, the linker's error log).
pub(crate) fn link_ptx(ptx: &str) -> Result<Vec<u8>, (String, String)> {
    let src = CString::new(ptx).map_err(|_| ("CUDA_ERROR_INVALID_PTX".to_string(), "the PTX text contains a NUL byte".to_string()))?;
    let mut err_log = vec![0u8; LINK_LOG_BYTES];
    let mut options = [CUjit_option::CU_JIT_ERROR_LOG_BUFFER, CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    // Sizes are passed as pointer-sized integers, as the driver API specifies.
    let mut values: [*mut c_void; 2] = [err_log.as_mut_ptr().cast(), LINK_LOG_BYTES as *mut c_void];
    let text = |buf: &[u8]| String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(buf.len())]).trim().to_string();
    let fail = |what: &str, e: sys::CUresult, log: &[u8]| {
        let mut l = text(log);
        if l.is_empty() {
            l = format!("{what} failed");
        }
        (format!("{e:?}"), l)
    };
    let mut raw: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: two options with their values; the log buffer outlives the link state (it is
    // dropped after `state` below, declared earlier).
    let r = unsafe { sys::cuLinkCreate_v2(options.len() as u32, options.as_mut_ptr(), values.as_mut_ptr(), &mut raw) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(fail("cuLinkCreate", r, &err_log));
    }
    let state = LinkState(raw);
    let name = c"kernel.ptx";
    // SAFETY: `src` is a NUL-terminated PTX image whose size includes the NUL, as the driver
    // expects for PTX input; no per-input options.
    let r = unsafe {
        sys::cuLinkAddData_v2(state.0, CUjitInputType::CU_JIT_INPUT_PTX, src.as_ptr() as *mut c_void, src.as_bytes_with_nul().len(), name.as_ptr(), 0, std::ptr::null_mut(), std::ptr::null_mut())
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(fail("cuLinkAddData", r, &err_log));
    }
    let mut cubin: *mut c_void = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: the state holds one PTX input; the cubin it returns belongs to the state and is
    // copied out before the state is destroyed.
    let r = unsafe { sys::cuLinkComplete(state.0, &mut cubin, &mut size) };
    if r != sys::CUresult::CUDA_SUCCESS || cubin.is_null() {
        return Err(fail("cuLinkComplete", r, &err_log));
    }
    // SAFETY: the driver returned `size` bytes at `cubin`, alive until cuLinkDestroy.
    let out = unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec();
    drop(state);
    Ok(out)
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

    #[test]
    fn the_kernel_driver_release_is_read() {
        let t = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 21:32:08 UTC 2025\nGCC version:  gcc 12\n";
        assert_eq!(kernel_driver_release(t).as_deref(), Some("570.86.15"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build\n";
        assert_eq!(kernel_driver_release(open).as_deref(), Some("575.57.08"));
        assert_eq!(kernel_driver_release("nothing here"), None);
    }

    /// A cubin is served only for its PTX, architecture and assembler.
    #[test]
    fn cubins_of_another_arch_or_assembler_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let a = asm("sm_90", "cuda 12.8 driver 570.86.15");
        assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Miss);
        let path = cache.put_cubin(PTX, &a, b"\x7fELF code").unwrap();
        assert_eq!(cache.get_cubin(PTX, &a), CubinLookup::Hit(b"\x7fELF code".to_vec()));
        // Another architecture, another assembler, another PTX: other entries.
        for other in [asm("sm_80", &a.version), asm("sm_90", "cuda 12.8 driver 575.57.08"), asm("sm_90", "cuda 13.0 driver 570.86.15")] {
            assert_ne!(cubin_digest(PTX, &other), cubin_digest(PTX, &a));
            assert_eq!(cache.get_cubin(PTX, &other), CubinLookup::Miss, "{other:?}");
        }
        assert_eq!(cache.get_cubin(&PTX.replace("ret", "exit"), &a), CubinLookup::Miss);
        // Another assembler's entry copied under this one's name is refused, never loaded.
        let b = asm("sm_90", "cuda 13.0 driver 580.65.06");
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
        let a = asm("sm_90", "cuda 12.8");
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
