//! [`KernelCache`]: compiled kernels ([`LaunchPlan`]s with their PTX) on disk.
//!
//! An entry is keyed by a SHA-256 digest of a [`CacheKey`]: the kernel's IR text, its
//! schedule, the target, the PTX version and features, the LLVM version, the sinter version and,
//! for loaded cubins, the driver version (DESIGN.md, "The runtime"). A change to any of them
//! is a different entry.
//!
//! Each entry is one file `<digest>.plan`:
//!
//! ```text
//! sinter-kernel-cache v1
//! key <digest>
//! sha256 <digest of the body>
//! bytes <length of the body>
//! <body: the plan in `sinter_ir::kernel::plan_text`'s format>
//! ```
//!
//! Entries are written to a temporary file in the same folder and renamed into place, so a
//! reader never sees half an entry from a live writer. An entry that is damaged anyway
//! (truncated, edited, the wrong key, a checksum that does not match, text that does not parse)
//! is reported as [`Lookup::Corrupt`] and treated as a miss: [`KernelCache::get_or_build`]
//! rebuilds it and says so with [`CacheStatus::Rebuilt`]. Nothing in here panics on a bad file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use sinter_ir::LaunchPlan;

use crate::error::RuntimeError;
use sinter_ir::kernel::plan_text::{parse_plan, print_plan};

const MAGIC: &str = "sinter-kernel-cache v1";

/// Everything a compiled kernel depends on; its [`CacheKey::digest`] names the cache entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The kernel's IR text (its body as `sinter_ir::text::print_function` prints it, plus its
    /// family and buffer layouts if the caller wants those to count).
    pub ir_text: String,
    /// The schedule (tile sizes, warps, stages, …) in any stable text form.
    pub schedule: String,
    /// Target, e.g. `sm_90a`.
    pub target: String,
    /// PTX ISA version and features, e.g. `8.5 +ptx85`.
    pub ptx_version: String,
    /// The LLVM version that generated the PTX, e.g. `22.1.8`.
    pub llvm_version: String,
    /// sinter's version ([`CacheKey::new`] fills in this crate's version).
    pub sinter_version: String,
    /// The driver version, for entries holding cubins loaded by a particular driver; `None`
    /// for PTX (which the driver JIT-compiles at load time).
    pub driver_version: Option<String>,
}

impl CacheKey {
    /// A key for PTX built from `ir_text` with `schedule` for `target` by the given PTX and LLVM
    /// versions, with this crate's version as the sinter version and no driver version.
    pub fn new(ir_text: &str, schedule: &str, target: &str, ptx_version: &str, llvm_version: &str) -> CacheKey {
        CacheKey {
            ir_text: ir_text.to_string(),
            schedule: schedule.to_string(),
            target: target.to_string(),
            ptx_version: ptx_version.to_string(),
            llvm_version: llvm_version.to_string(),
            sinter_version: env!("CARGO_PKG_VERSION").to_string(),
            driver_version: None,
        }
    }

    /// The SHA-256 of every field (each length-prefixed, so no two keys collide by
    /// concatenation), as 64 lower-case hex digits.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        let driver = self.driver_version.as_deref();
        let fields: [(&str, Option<&str>); 7] = [
            ("ir", Some(&self.ir_text)),
            ("schedule", Some(&self.schedule)),
            ("target", Some(&self.target)),
            ("ptx", Some(&self.ptx_version)),
            ("llvm", Some(&self.llvm_version)),
            ("sinter", Some(&self.sinter_version)),
            ("driver", driver),
        ];
        for (name, value) in fields {
            h.update(name.as_bytes());
            match value {
                Some(v) => {
                    h.update([1u8]);
                    h.update((v.len() as u64).to_le_bytes());
                    h.update(v.as_bytes());
                }
                None => h.update([0u8]),
            }
        }
        hex(&h.finalize())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The result of looking a key up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The entry was there and intact.
    Hit(LaunchPlan),
    /// No entry.
    Miss,
    /// An entry was there but damaged or unreadable; treat as a miss.
    Corrupt {
        /// The entry's file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

/// How [`KernelCache::get_or_build`] obtained its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheStatus {
    /// Read from the cache.
    Hit,
    /// Not in the cache: built and stored.
    Built,
    /// The entry was corrupt: built again and stored over it.
    Rebuilt {
        /// What was wrong with the old entry.
        reason: String,
    },
}

/// Compiled kernels on disk (see the module docs).
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl KernelCache {
    /// A cache in `dir`, creating the folder if needed.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when the folder cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> Result<KernelCache, RuntimeError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| RuntimeError::Cache { path: dir.clone(), message: format!("cannot create the folder: {e}") })?;
        Ok(KernelCache { dir })
    }

    /// The default folder: `$SINTER_CACHE/kernels` when `SINTER_CACHE` is set and not empty,
    /// else `$HOME/.cache/sinter/kernels`.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when neither variable is set.
    pub fn default_dir() -> Result<PathBuf, RuntimeError> {
        if let Some(root) = std::env::var_os("SINTER_CACHE").filter(|v| !v.is_empty()) {
            return Ok(PathBuf::from(root).join("kernels"));
        }
        match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => Ok(PathBuf::from(home).join(".cache").join("sinter").join("kernels")),
            None => Err(RuntimeError::Cache { path: PathBuf::new(), message: "neither SINTER_CACHE nor HOME is set".into() }),
        }
    }

    /// A cache in [`KernelCache::default_dir`].
    ///
    /// # Errors
    /// As [`KernelCache::default_dir`] and [`KernelCache::new`].
    pub fn open_default() -> Result<KernelCache, RuntimeError> {
        KernelCache::new(KernelCache::default_dir()?)
    }

    /// The cache's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds (or would hold) `key`'s entry.
    pub fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.plan", key.digest()))
    }

    /// Looks `key` up. Never fails: an unreadable or damaged entry is [`Lookup::Corrupt`].
    pub fn get(&self, key: &CacheKey) -> Lookup {
        let digest = key.digest();
        let path = self.dir.join(format!("{digest}.plan"));
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Corrupt { path, reason: format!("cannot read: {e}") },
        };
        match decode_entry(&digest, &bytes) {
            Ok(plan) => Lookup::Hit(plan),
            Err(reason) => Lookup::Corrupt { path, reason },
        }
    }

    /// Stores `plan` under `key`, atomically (temporary file + rename); returns the entry's
    /// path.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when the file cannot be written or renamed.
    pub fn put(&self, key: &CacheKey, plan: &LaunchPlan) -> Result<PathBuf, RuntimeError> {
        self.write_entry(&key.digest(), "plan", &print_plan(plan))
    }

    /// Writes `body` with the entry header as `<digest>.<ext>`, atomically.
    fn write_entry(&self, digest: &str, ext: &str, body: &str) -> Result<PathBuf, RuntimeError> {
        self.write_entry_bytes(digest, ext, body.as_bytes())
    }

    /// Writes a binary `body` (a cubin, [`crate::cubin`]) with the entry header as
    /// `<digest>.<ext>`, atomically (temporary file + rename).
    pub(crate) fn write_entry_bytes(&self, digest: &str, ext: &str, body: &[u8]) -> Result<PathBuf, RuntimeError> {
        let path = self.dir.join(format!("{digest}.{ext}"));
        let entry = [format!("{MAGIC}\nkey {digest}\nsha256 {}\nbytes {}\n", sha256_hex(body), body.len()).as_bytes(), body].concat();
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!(".{digest}.{}.{n}.tmp", std::process::id()));
        let err = |p: &Path, what: &str, e: std::io::Error| RuntimeError::Cache { path: p.to_path_buf(), message: format!("{what}: {e}") };
        let written = (|| -> Result<(), RuntimeError> {
            let mut f = fs::File::create(&tmp).map_err(|e| err(&tmp, "cannot create", e))?;
            f.write_all(&entry).map_err(|e| err(&tmp, "cannot write", e))?;
            f.sync_all().map_err(|e| err(&tmp, "cannot sync", e))?;
            fs::rename(&tmp, &path).map_err(|e| err(&path, "cannot rename the temporary file into place", e))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map(|()| path)
    }

    /// Looks up the text record stored under `key` (`<digest>.rec`, with the plans' header,
    /// length and checksum): small notes beside the plans, such as the names of a kernel's
    /// schedule variants and the result of timing them (`sinter::tune`). `Ok(None)`: no record;
    /// `Err(reason)`: a damaged one, to be treated as missing (and rewritten). Never fails
    /// otherwise.
    pub fn get_record(&self, key: &CacheKey) -> Result<Option<String>, String> {
        let digest = key.digest();
        let path = self.dir.join(format!("{digest}.rec"));
        match fs::read(&path) {
            Ok(bytes) => verify_entry(&digest, &bytes).map(|body| Some(body.to_string())).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: cannot read: {e}", path.display())),
        }
    }

    /// Stores `text` as the record of `key`, atomically; returns its path.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when the file cannot be written or renamed.
    pub fn put_record(&self, key: &CacheKey, text: &str) -> Result<PathBuf, RuntimeError> {
        self.write_entry(&key.digest(), "rec", text)
    }

    /// Deletes `key`'s record ([`KernelCache::put_record`]) if there is one.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when the file exists but cannot be removed.
    pub fn remove_record(&self, key: &CacheKey) -> Result<(), RuntimeError> {
        let path = self.dir.join(format!("{}.rec", key.digest()));
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::Cache { path, message: format!("cannot remove: {e}") }),
        }
    }

    /// Deletes `key`'s entry if there is one.
    ///
    /// # Errors
    /// [`RuntimeError::Cache`] when the file exists but cannot be removed.
    pub fn remove(&self, key: &CacheKey) -> Result<(), RuntimeError> {
        let path = self.entry_path(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::Cache { path, message: format!("cannot remove: {e}") }),
        }
    }

    /// The cached plan for `key`, or `build()`'s plan stored under `key` on a miss or a corrupt
    /// entry. The status says which happened (and why an entry was rebuilt).
    ///
    /// # Errors
    /// `build`'s error, or [`RuntimeError::Cache`] (converted into `E`) when the new entry
    /// cannot be stored.
    pub fn get_or_build<E: From<RuntimeError>>(&self, key: &CacheKey, build: impl FnOnce() -> Result<LaunchPlan, E>) -> Result<(LaunchPlan, CacheStatus), E> {
        let status = match self.get(key) {
            Lookup::Hit(plan) => return Ok((plan, CacheStatus::Hit)),
            Lookup::Miss => CacheStatus::Built,
            Lookup::Corrupt { path, reason } => CacheStatus::Rebuilt { reason: format!("{}: {reason}", path.display()) },
        };
        let plan = build()?;
        self.put(key, &plan)?;
        Ok((plan, status))
    }
}

/// Checks and decodes one entry file.
fn decode_entry(digest: &str, bytes: &[u8]) -> Result<LaunchPlan, String> {
    parse_plan(verify_entry(digest, bytes)?).map_err(|e| format!("body does not parse: {e}"))
}

/// The body of a text entry, after checking its header, key, length and checksum.
fn verify_entry<'b>(digest: &str, bytes: &'b [u8]) -> Result<&'b str, String> {
    let body = verify_entry_bytes(digest, bytes)?;
    std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))
}

/// The body of an entry (text or binary), after checking its header, key, length and
/// checksum.
pub(crate) fn verify_entry_bytes<'b>(digest: &str, bytes: &'b [u8]) -> Result<&'b [u8], String> {
    let mut rest = bytes;
    let mut line = |what: &str| -> Result<&str, String> {
        let i = rest.iter().position(|&b| b == b'\n').ok_or_else(|| format!("truncated before the {what} line"))?;
        let l = std::str::from_utf8(&rest[..i]).map_err(|_| format!("the {what} line is not UTF-8"))?;
        rest = &rest[i + 1..];
        Ok(l)
    };
    if line("header")? != MAGIC {
        return Err(format!("not a `{MAGIC}` entry"));
    }
    let key = line("key")?.strip_prefix("key ").ok_or("no key line")?.to_string();
    let sum = line("checksum")?.strip_prefix("sha256 ").ok_or("no checksum line")?.to_string();
    let len: usize = line("length")?
        .strip_prefix("bytes ")
        .and_then(|n| n.parse().ok())
        .ok_or("no length line")?;
    if key != digest {
        return Err(format!("holds key {key}, expected {digest}"));
    }
    if rest.len() != len {
        return Err(format!("body has {} bytes, header says {len} (truncated or extended)", rest.len()));
    }
    let actual = sha256_hex(rest);
    if actual != sum {
        return Err(format!("checksum mismatch: body hashes to {actual}, header says {sum}"));
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use sinter_ir::{Dim, GridDim, KernelParam};

    use super::*;

    fn plan(entry: &str) -> LaunchPlan {
        LaunchPlan {
            entry: entry.into(),
            ptx: format!(".version 8.5\n.target sm_80\n.address_size 64\n.visible .entry {entry}() {{ ret; }}\n"),
            target: sinter_ir::Target::SM_80,
            grid: [GridDim { numerator: Dim::symbol("N"), denominator: 256 }, GridDim::fixed(1), GridDim::fixed(1)],
            block: [256, 1, 1],
            shared_bytes: 0,
            params: vec![KernelParam::Buffer(0), KernelParam::Size(Dim::symbol("N"))],
        }
    }

    fn key() -> CacheKey {
        CacheKey::new("func @k(%x: f32[N]) -> f32[N] { ... }", "block=256", "sm_80", "8.5", "22.1.8")
    }

    #[test]
    fn records_round_trip_and_damage_is_reported() {
        let dir = std::env::temp_dir().join(format!("sinter-cache-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let cache = KernelCache::new(&dir).unwrap();
        let k = key();
        assert_eq!(cache.get_record(&k), Ok(None));
        let path = cache.put_record(&k, "winner a\n1.5 a\n2.0 b\n").unwrap();
        assert_eq!(cache.get_record(&k), Ok(Some("winner a\n1.5 a\n2.0 b\n".into())));
        // A record is not a plan, and a plan's lookup does not see it.
        assert_eq!(cache.get(&k), Lookup::Miss);
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace("winner a", "winner b")).unwrap();
        let err = cache.get_record(&k).unwrap_err();
        assert!(err.contains("checksum mismatch"), "{err}");
        fs::write(&path, &text[..text.len() - 3]).unwrap();
        assert!(cache.get_record(&k).unwrap_err().contains("truncated or extended"));
        cache.put_record(&k, "winner c\n").unwrap();
        assert_eq!(cache.get_record(&k), Ok(Some("winner c\n".into())));
        cache.remove_record(&k).unwrap();
        assert_eq!(cache.get_record(&k), Ok(None));
        cache.remove_record(&k).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_digest_depends_on_every_field() {
        let base = key();
        let d = base.digest();
        assert_eq!(d.len(), 64);
        assert_eq!(d, key().digest(), "digest is deterministic");
        let variants: Vec<CacheKey> = vec![
            CacheKey { ir_text: "other".into(), ..base.clone() },
            CacheKey { schedule: "block=128".into(), ..base.clone() },
            CacheKey { target: "sm_90a".into(), ..base.clone() },
            CacheKey { ptx_version: "8.4".into(), ..base.clone() },
            CacheKey { llvm_version: "22.1.9".into(), ..base.clone() },
            CacheKey { sinter_version: "9.9.9".into(), ..base.clone() },
            CacheKey { driver_version: Some("580".into()), ..base.clone() },
            CacheKey { driver_version: Some(String::new()), ..base.clone() },
            // Moving bytes between fields changes the digest (fields are length-prefixed).
            CacheKey { ir_text: format!("{}b", base.ir_text), schedule: "lock=256".into(), ..base.clone() },
        ];
        let mut seen = std::collections::BTreeSet::from([d]);
        for v in variants {
            assert!(seen.insert(v.digest()), "{v:?} collides");
        }
    }

    #[test]
    fn round_trip_and_miss() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path().join("kernels")).unwrap();
        assert_eq!(cache.get(&key()), Lookup::Miss);
        let p = plan("k0_add");
        let path = cache.put(&key(), &p).unwrap();
        assert_eq!(path, cache.entry_path(&key()));
        assert_eq!(cache.get(&key()), Lookup::Hit(p.clone()));
        // No temporary files are left behind.
        let names: Vec<_> = fs::read_dir(cache.dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // Overwriting replaces the entry.
        let q = plan("k0_add_v2");
        cache.put(&key(), &q).unwrap();
        assert_eq!(cache.get(&key()), Lookup::Hit(q));
        cache.remove(&key()).unwrap();
        assert_eq!(cache.get(&key()), Lookup::Miss);
        cache.remove(&key()).unwrap();
    }

    #[test]
    fn get_or_build_builds_once_then_hits() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let mut builds = 0;
        let (p1, s1) = cache
            .get_or_build(&key(), || {
                builds += 1;
                Ok::<_, RuntimeError>(plan("k"))
            })
            .unwrap();
        assert_eq!(s1, CacheStatus::Built);
        let (p2, s2) = cache.get_or_build(&key(), || -> Result<LaunchPlan, RuntimeError> { panic!("must not rebuild") }).unwrap();
        assert_eq!((builds, s2), (1, CacheStatus::Hit));
        assert_eq!(p1, p2);
        // A build error passes through and stores nothing.
        let other = CacheKey { schedule: "x".into(), ..key() };
        let err = cache.get_or_build(&other, || Err(RuntimeError::Graph("codegen failed".into()))).unwrap_err();
        assert!(err.to_string().contains("codegen failed"));
        assert_eq!(cache.get(&other), Lookup::Miss);
    }

    /// Every kind of damage is detected, reported and rebuilt; none panics.
    #[test]
    fn corrupt_entries_are_detected_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let p = plan("k1_mul");
        let path = cache.put(&key(), &p).unwrap();
        let good = fs::read(&path).unwrap();
        let body_start = good.len() - print_plan(&p).len();

        let mut damaged: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("truncated", good[..good.len() - 7].to_vec()),
            ("extended", [good.clone(), b"junk".to_vec()].concat()),
            ("not utf-8", [good[..body_start].to_vec(), vec![0xff, 0xfe]].concat()),
            ("wrong magic", [b"sinter-kernel-cache v0".to_vec(), good[22..].to_vec()].concat()),
        ];
        // A flipped byte in the PTX keeps the length but breaks the checksum.
        let mut flipped = good.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x20;
        damaged.push(("flipped", flipped));
        // An intact entry of another key, copied under this key's name.
        let other = CacheKey { target: "sm_90a".into(), ..key() };
        let other_path = cache.put(&other, &p).unwrap();
        damaged.push(("other key", fs::read(&other_path).unwrap()));
        // Every truncation point is handled.
        for cut in (0..good.len()).step_by(13) {
            damaged.push(("cut", good[..cut].to_vec()));
        }

        for (what, bytes) in damaged {
            fs::write(&path, &bytes).unwrap();
            match cache.get(&key()) {
                Lookup::Corrupt { path: p2, reason } => {
                    assert_eq!(p2, path);
                    assert!(!reason.is_empty(), "{what}");
                }
                other => panic!("{what}: expected Corrupt, got {other:?}"),
            }
            let (rebuilt, status) = cache.get_or_build(&key(), || Ok::<_, RuntimeError>(p.clone())).unwrap();
            assert_eq!(rebuilt, p);
            assert!(matches!(status, CacheStatus::Rebuilt { .. }), "{what}: {status:?}");
            assert_eq!(cache.get(&key()), Lookup::Hit(p.clone()), "{what}: rebuilt entry reads back");
        }
    }

    /// Entries whose header, key, length and checksum are right but whose body is not a plan
    /// this version wrote — cut short, random bytes, another format, values out of range —
    /// are [`Lookup::Corrupt`] (or, where the text still reads as a plan, a hit whose launch
    /// is resolved to a value or an error); none panics.
    #[test]
    fn well_formed_entries_with_damaged_bodies_are_misses() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        let digest = key().digest();
        let mut p = plan("k2_tma");
        p.params.push(KernelParam::TensorMap(sinter_ir::TensorMap {
            buffer: 1,
            dtype: sinter_ir::DType::BF16,
            offset: Dim::constant(0),
            dims: vec![Dim::constant(64), Dim::symbol("N")],
            strides: vec![Dim::constant(64)],
            box_dims: vec![64, 64],
            swizzle: 128,
        }));
        let good = print_plan(&p);
        let store = |body: &[u8]| {
            cache.write_entry_bytes(&digest, "plan", body).unwrap();
            cache.get(&key())
        };
        assert_eq!(store(good.as_bytes()), Lookup::Hit(p.clone()));

        // Must be misses: every proper prefix, trailing bytes, random bytes, other formats.
        let mut corrupt: Vec<Vec<u8>> = (0..good.len()).map(|cut| good.as_bytes()[..cut].to_vec()).collect();
        corrupt.push(format!("{good}\n").into_bytes());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in [1, 7, 64, 300, 4096] {
            corrupt.push(
                (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x >> 56) as u8
                    })
                    .collect(),
            );
        }
        corrupt.push(good.replacen("target sm_80", "target sm_999z", 1).into_bytes());
        corrupt.push(good.replacen("shared 0\n", "shared 0\ncluster 2 1 1\n", 1).into_bytes());
        corrupt.push(b"sinter-kernel-plan v2\n{\"entry\": \"k\"}\n".to_vec());
        for body in corrupt {
            let got = store(&body);
            assert!(matches!(got, Lookup::Corrupt { .. }), "{:?}: {got:?}", String::from_utf8_lossy(&body));
        }

        // Values at the ends of their ranges in every line before the PTX: a miss, or a plan
        // whose launch resolves to a value or an error.
        let header_lines = good.lines().take_while(|l| !l.starts_with("ptx ")).count();
        let extremes = ["", "-1", "0", "4294967295", "4294967296", "9223372036854775807", "18446744073709551616", "N^64*N^64", "N-9223372036854775807-9", "é", "\u{0}"];
        for line in 0..header_lines {
            for ext in extremes {
                let body: String = good
                    .split_inclusive('\n')
                    .enumerate()
                    .map(|(i, l)| match (i == line, l.rsplit_once(' ')) {
                        (true, Some((head, _))) => format!("{head} {ext}\n"),
                        _ => l.to_string(),
                    })
                    .collect();
                match store(body.as_bytes()) {
                    Lookup::Corrupt { reason, .. } => assert!(!reason.is_empty()),
                    Lookup::Hit(plan) => {
                        for n in [0, 1, i64::MAX] {
                            let _ = crate::launch::resolve(&plan, &[0x1000, 0x2000, 0x3000], &[("N".to_string(), n)].into_iter().collect());
                        }
                    }
                    Lookup::Miss => panic!("line {line} `{ext}`: an entry that is there is no miss"),
                }
            }
        }
    }

    #[test]
    fn unreadable_entry_is_corrupt_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(dir.path()).unwrap();
        // A folder where the entry file should be cannot be read as a file.
        fs::create_dir_all(cache.entry_path(&key())).unwrap();
        assert!(matches!(cache.get(&key()), Lookup::Corrupt { .. }));
        // ...and cannot be replaced either: storing reports a Cache error.
        let err = cache.get_or_build(&key(), || Ok::<_, RuntimeError>(plan("k"))).unwrap_err();
        assert!(matches!(err, RuntimeError::Cache { .. }), "{err:?}");
    }

    #[test]
    fn default_dir_honours_sinter_cache() {
        // Only reads the environment; does not set it (tests run in parallel).
        let d = KernelCache::default_dir();
        match std::env::var_os("SINTER_CACHE").filter(|v| !v.is_empty()) {
            Some(root) => assert_eq!(d.unwrap(), PathBuf::from(root).join("kernels")),
            None => {
                if let Ok(d) = d {
                    assert!(d.ends_with(".cache/sinter/kernels"), "{}", d.display());
                }
            }
        }
    }
}
