//! Fingerprints the code generator's sources (and the IR it reads) so that the kernel cache
//! key changes whenever the code that turns a kernel body into PTX changes: a cache filled by
//! one version of sinter is never served to another (see `sinter::cache_key::kernel_key`). The build
//! with LLVM that fills the cache and the build without LLVM that reads it, made from the same
//! tree, get the same fingerprint. The passes' sources get one too, for the lowering cache
//! (`sinter::lowering_cache`).

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

/// The FNV-1a fingerprint of every `.rs` file under `dirs` (paths and contents, sorted).
fn fingerprint(root: &Path, dirs: &[&str]) -> u64 {
    let mut list = Vec::new();
    for dir in dirs {
        let d = root.join(dir);
        println!("cargo:rerun-if-changed={}", d.display());
        files(&d, &mut list);
    }
    list.sort();
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for p in &list {
        fnv(&mut hash, p.strip_prefix(root).unwrap_or(p).to_string_lossy().as_bytes());
        fnv(&mut hash, &std::fs::read(p).unwrap_or_default());
    }
    hash
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    println!("cargo:rustc-env=SINTER_CODEGEN_FINGERPRINT={:016x}", fingerprint(&root, &["codegen/src", "ir/src"]));
    // The lowering cache's key (`sinter::lowering_cache`): the passes and the IR they read.
    println!("cargo:rustc-env=SINTER_PASSES_FINGERPRINT={:016x}", fingerprint(&root, &["passes/src", "ir/src"]));
}
