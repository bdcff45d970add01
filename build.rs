//! Fingerprints the code generator's sources (and the IR it reads) so that the kernel cache
//! key changes whenever the code that turns a kernel body into PTX changes: a cache filled by
//! one version of sinter is never served to another (see `sinter::cache_key::kernel_key`). The build
//! with LLVM that fills the cache and the build without LLVM that reads it, made from the same
//! tree, get the same fingerprint.

use std::path::{Path, PathBuf};

/// FNV-1a, 64-bit: stable across toolchains (unlike `DefaultHasher`).
fn fnv(hash: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "snapshots") {
                continue;
            }
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let mut list = Vec::new();
    for dir in ["codegen/src", "ir/src"] {
        let d = root.join(dir);
        println!("cargo:rerun-if-changed={}", d.display());
        files(&d, &mut list);
    }
    list.sort();
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for p in &list {
        fnv(&mut hash, p.strip_prefix(&root).unwrap_or(p).to_string_lossy().as_bytes());
        fnv(&mut hash, &std::fs::read(p).unwrap_or_default());
    }
    println!("cargo:rustc-env=SINTER_CODEGEN_FINGERPRINT={hash:016x}");
}
