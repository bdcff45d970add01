//! Every registered architecture against Hugging Face transformers, an implementation no one
//! here wrote: `tests/fixtures/hf/<arch>.json` holds a config with a real model's dimensions
//! (2-4 layers), a manifest of every tensor of its `model.safetensors` with the weights given
//! by a formula (fnv1a64 + splitmix64, `/work/fixtures/FORMAT.md`, `bench/hf_fixtures.py`),
//! and transformers' eager outputs (f32 with TF32 off, and bf16): greedy continuations of
//! three prompts with their top1 − top2 margins, and teacher-forced logits (the top 8 and 64
//! fixed columns per position).
//!
//! The test computes the same weights bit for bit ([`weight`], pinned by hand-computed values
//! in `the_weight_formula_matches_hand_computed_values`), writes the folder (`config.json` as
//! the fixture gives it, an f32 `model.safetensors`, a word-level `tokenizer.json`), loads it
//! with [`sinter::llm::open`] in f32 and compares the interpreter's teacher-forced logits with
//! transformers' over the first prompt ([`CPU_POSITIONS`] positions, [`F32_REL_TOL`]). The
//! GPU twin (`tests/gpu/hf_reference.rs`) checks every prompt in f32 and bf16, greedy decoding
//! at batch 1 and 3, and CUDA-graph decode.
//!
//! The folders are written once into `$CARGO_TARGET_TMPDIR/hf-reference/` (up to 0.8 GB
//! each) and reused by later tests and runs ([`fixture_folder`]).
//!
//! A fixture that is absent skips its architecture's tests with a message; a fixture whose
//! `model_type` the registry does not know fails them. The bad-folder checks run over every
//! fixture present: a missing tensor, a tensor whose shape disagrees with the config, an
//! unknown `model_type`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use safetensors::{Dtype, View};
use serde_json::Value as Json;
use sinter::llm::gguf::ModelError;
use sinter::llm::{AnyDecoder, DecoderModel, Engine};
use sinter::DType;

/// Relative tolerance of the interpreter's f32 logits against transformers' f32 logits:
/// `|ours − theirs| ≤ F32_REL_TOL · max|logit of the row|` (the row's largest of the
/// fixture's kept values, top 8 and columns). Both sides compute in f32 with different
/// summation orders (torch's GEMMs with TF32 off, the interpreter's per-operation rounding),
/// so they differ by a few f32 ulps of the largest intermediate: measured below 1e-6 of the
/// row's largest logit for Llama and GPT-2. 2e-5 leaves a factor of ~20 and still catches
/// any real disagreement (a RoPE base of 1e4 instead of 1e5 moved the second position's
/// logits by 1.3e-1 of the scale).
pub(crate) const F32_REL_TOL: f64 = 2e-5;

/// Positions of the first prompt the CPU test checks: the prompt (7 tokens) and 9 generated
/// tokens, twice the 8-token sliding window of Gemma 3's fixture. Logits are the cheap part
/// (about 1 s for Gemma 3's 262 144-entry vocabulary); writing and loading the
/// real-dimension weights cost the rest.
pub(crate) const CPU_POSITIONS: usize = 16;

/// The fixtures' folder: `SINTER_HF_FIXTURES` when set, else `tests/fixtures/hf`.
pub(crate) fn fixture_dir() -> PathBuf {
    std::env::var_os("SINTER_HF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf"))
}

/// The tests that hold a real-dimension model (up to ~2 GB on the host in f32, the
/// interpreter keeping f64 values) take turns.
pub(crate) fn one_model_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------
// The weight formula (FORMAT.md): both sides compute it bit for bit.

/// FNV-1a, 64 bits.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// SplitMix64's output function of state `x` (the state already advanced by the caller's
/// `key + i`).
#[inline]
pub(crate) fn splitmix64(x: u64) -> u64 {
    let x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of tensor `name` under `seed`: `fnv1a64(name) ^ seed`.
pub(crate) fn tensor_key(name: &str, seed: u64) -> u64 {
    fnv1a64(name.as_bytes()) ^ seed
}

/// Element `i` of the tensor of key `key`: `center + scale · (2u − 1)`, `u` uniform in [0, 1)
/// from the top 24 bits of `splitmix64(key + i)`, in f32 with one rounding per operation
/// (Rust does not contract `a + b * c` into an FMA).
#[inline]
pub(crate) fn weight(key: u64, i: u64, center: f32, scale: f32) -> f32 {
    let z = splitmix64(key.wrapping_add(i));
    let u = (z >> 40) as f32 / 16_777_216.0;
    let t = 2.0f32 * u - 1.0f32;
    center + scale * t
}

// ---------------------------------------------------------------------------------------
// The fixture.

/// One tensor of the manifest.
#[derive(Clone, Debug)]
pub(crate) struct TensorSpec {
    /// The Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Its shape in `model.safetensors`.
    pub shape: Vec<usize>,
    /// The formula's centre and scale (f32 values).
    pub center: f32,
    pub scale: f32,
}

/// Teacher-forced logits of one sequence: position `p` holds the logits after
/// `tokens[0..=p]`.
#[derive(Clone, Debug)]
pub(crate) struct Rows {
    pub tokens: Vec<u32>,
    /// The 8 largest logits' ids and values per position, largest first.
    pub top_ids: Vec<Vec<u32>>,
    pub top_vals: Vec<Vec<f64>>,
    /// The logits at the fixture's `cols` per position.
    pub cols: Vec<Vec<f64>>,
}

/// One architecture's fixture (`tests/fixtures/hf/<arch>.json`).
#[derive(Clone, Debug)]
pub(crate) struct Fixture {
    /// The architecture's file stem (`gemma3`); the registry picks by `config.model_type`.
    pub arch: String,
    /// Where the expected values come from (`transformers 4.57.1, torch 2.x`).
    pub made_by: String,
    /// `config.json`, written as is.
    pub config: Json,
    pub seed: u64,
    pub tensors: Vec<TensorSpec>,
    /// Three prompts of different lengths.
    pub prompts: Vec<Vec<u32>>,
    pub steps: usize,
    /// The vocabulary ids whose logits the rows keep.
    pub cols: Vec<u32>,
    /// transformers' f32 greedy continuation (batch 1) of each prompt, and the top1 − top2
    /// margin at each step.
    pub greedy: Vec<Vec<u32>>,
    pub margins: Vec<Vec<f64>>,
    /// Teacher-forced rows over prompt + greedy, f32 and bf16.
    pub f32_rows: Vec<Rows>,
    pub bf16_rows: Vec<Rows>,
    /// fnv1a64 of the fixture's text (names its written folder).
    pub digest: u64,
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x.as_u64().expect("an id") as u32)
                .collect()
        })
        .expect("a list of ids")
}

fn floats(v: &Json) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().expect("a number")).collect())
        .expect("a list of numbers")
}

fn list<T>(v: &Json, f: impl Fn(&Json) -> T) -> Vec<T> {
    v.as_array().expect("a list").iter().map(f).collect()
}

fn rows(v: &Json) -> Vec<Rows> {
    list(v, |r| Rows {
        tokens: ids(&r["tokens"]),
        top_ids: list(&r["top_ids"], ids),
        top_vals: list(&r["top_vals"], floats),
        cols: list(&r["cols"], floats),
    })
}

impl Fixture {
    /// Parses a fixture's JSON text.
    ///
    /// # Panics
    /// On a field that is missing or of the wrong type: the fixture is broken.
    pub(crate) fn parse(arch: &str, text: &str) -> Fixture {
        let j: Json = serde_json::from_str(text).unwrap_or_else(|e| panic!("fixture {arch}: {e}"));
        let tensors = list(&j["tensors"], |t| TensorSpec {
            name: t["name"].as_str().expect("a tensor name").to_string(),
            shape: list(&t["shape"], |d| d.as_u64().expect("a dimension") as usize),
            center: t["center"].as_f64().expect("center") as f32,
            scale: t["scale"].as_f64().expect("scale") as f32,
        });
        Fixture {
            arch: j["arch"].as_str().unwrap_or(arch).to_string(),
            made_by: format!(
                "transformers {}, torch {}",
                j["transformers"].as_str().unwrap_or("?"),
                j["torch"].as_str().unwrap_or("?")
            ),
            config: j["config"].clone(),
            seed: j["seed"].as_u64().expect("seed"),
            tensors,
            prompts: list(&j["prompts"], ids),
            steps: j["steps"].as_u64().expect("steps") as usize,
            cols: ids(&j["cols"]),
            greedy: list(&j["f32"]["greedy"], ids),
            margins: list(&j["f32"]["margins"], floats),
            f32_rows: rows(&j["f32"]["logits"]),
            bf16_rows: rows(&j["bf16"]["logits"]),
            digest: fnv1a64(text.as_bytes()),
        }
    }

    /// The fixture of `arch`, or `None` with a message saying the tests are skipped.
    pub(crate) fn load(arch: &str) -> Option<Fixture> {
        let path = fixture_dir().join(format!("{arch}.json"));
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(Fixture::parse(arch, &text)),
            Err(e) => {
                eprintln!("skipped: no fixture {} ({e})", path.display());
                None
            }
        }
    }

    /// Every fixture present, by file name.
    pub(crate) fn all() -> Vec<Fixture> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        paths
            .iter()
            .map(|p| {
                Fixture::parse(
                    &p.file_stem().unwrap().to_string_lossy(),
                    &std::fs::read_to_string(p).unwrap(),
                )
            })
            .collect()
    }

    /// `config.model_type`.
    pub(crate) fn model_type(&self) -> &str {
        self.config["model_type"]
            .as_str()
            .expect("config.model_type")
    }

    /// `config.vocab_size`.
    pub(crate) fn vocab(&self) -> usize {
        self.config["vocab_size"]
            .as_u64()
            .expect("config.vocab_size") as usize
    }

    /// Checks that the registry knows the fixture's `model_type`: a fixture present for an
    /// architecture sinter does not load is a failure, not a skip.
    pub(crate) fn assert_registered(&self) {
        let r = sinter::llm::registry::architecture(self.model_type(), Path::new("config.json"));
        assert!(
            r.is_ok(),
            "fixture {}: model_type `{}` is not registered (supported: {})",
            self.arch,
            self.model_type(),
            sinter::llm::registry::supported()
        );
    }
}

// ---------------------------------------------------------------------------------------
// The folder.

/// One tensor of `model.safetensors`, made when the writer asks for its bytes (the largest,
/// an embedding of 262 144 × 640, is 670 MB: never more than one is in memory).
struct Lazy {
    shape: Vec<usize>,
    key: u64,
    center: f32,
    scale: f32,
    /// Zeros instead of the formula (the bad-folder tests, where values do not matter).
    zeros: bool,
}

impl View for Lazy {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let n = self.shape.iter().product::<usize>();
        if self.zeros {
            return Cow::Owned(vec![0; 4 * n]);
        }
        let mut b = vec![0u8; 4 * n];
        // Two threads: the largest tensors have 1.7e8 elements.
        let half = (n / 2) * 4;
        let (lo, hi) = b.split_at_mut(half);
        let fill = |bytes: &mut [u8], first: u64| {
            for (i, c) in (first..).zip(bytes.chunks_exact_mut(4)) {
                c.copy_from_slice(&weight(self.key, i, self.center, self.scale).to_le_bytes());
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| fill(lo, 0));
            fill(hi, (half / 4) as u64);
        });
        Cow::Owned(b)
    }
    fn data_len(&self) -> usize {
        4 * self.shape.iter().product::<usize>()
    }
}

/// What [`write_folder`] changes in the manifest (the bad-folder tests).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Edit {
    /// The manifest as it is, weights from the formula.
    None,
    /// This tensor left out (zero weights).
    Drop(String),
    /// This tensor stored with this shape (zero weights).
    Shape(String, Vec<usize>),
}

/// A word-level tokenizer over `t0..t{vocab}` (ids are what the tests feed; the text is
/// never used).
pub(crate) fn write_tokenizer(dir: &Path, vocab: usize) {
    let words: std::collections::HashMap<String, u32> =
        (0..vocab as u32).map(|i| (format!("t{i}"), i)).collect();
    let wl = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(words.into_iter().collect())
        .unk_token("t0".into())
        .build()
        .unwrap();
    let mut tk = tokenizers::Tokenizer::new(wl);
    tk.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
    tk.save(dir.join("tokenizer.json"), false).unwrap();
}

/// Writes the fixture's Hugging Face folder into `dir` (created): `config.json` as the
/// fixture gives it, `model.safetensors` (f32, every manifest tensor, changed by `edit`) and
/// `tokenizer.json`.
pub(crate) fn write_folder(fx: &Fixture, dir: &Path, edit: &Edit) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&fx.config).unwrap(),
    )
    .unwrap();
    let zeros = *edit != Edit::None;
    let views: Vec<(String, Lazy)> = fx
        .tensors
        .iter()
        .filter(|t| !matches!(edit, Edit::Drop(n) if *n == t.name))
        .map(|t| {
            let shape = match edit {
                Edit::Shape(n, s) if *n == t.name => s.clone(),
                _ => t.shape.clone(),
            };
            (
                t.name.clone(),
                Lazy {
                    shape,
                    key: tensor_key(&t.name, fx.seed),
                    center: t.center,
                    scale: t.scale,
                    zeros,
                },
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    write_tokenizer(dir, fx.vocab());
}

/// A fresh folder for one test.
pub(crate) fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sinter-hf-ref-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The fixture's complete folder (no edit), written once into
/// `$CARGO_TARGET_TMPDIR/hf-reference/<arch>-<digest of the fixture>` and reused by later
/// tests and runs (the f32 and bf16 engines, the kernel precompilation): writing a
/// real-dimension model takes seconds. Written to a temporary name and renamed, so a folder
/// that exists is complete.
pub(crate) fn fixture_folder(fx: &Fixture) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-reference");
    let dir = root.join(format!("{}-{:016x}", fx.arch, fx.digest));
    if dir.join("model.safetensors").exists() {
        return dir;
    }
    let tmp = root.join(format!(
        "{}-{:016x}.tmp-{}",
        fx.arch,
        fx.digest,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    write_folder(fx, &tmp, &Edit::None);
    // Folders of other versions of this fixture are stale.
    for e in std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(&format!("{}-", fx.arch)) && !name.contains(".tmp-") {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process wrote it first.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    dir
}

/// The fixture's model loaded with [`sinter::llm::open`] in `dtype` from its folder
/// ([`fixture_folder`]).
pub(crate) fn open_fixture(fx: &Fixture, dtype: DType) -> AnyDecoder {
    let model = sinter::llm::open(&fixture_folder(fx), dtype, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("fixture {}: {e}", fx.arch));
    assert_eq!(model.vocab(), fx.vocab(), "fixture {}: vocabulary", fx.arch);
    model
}

// ---------------------------------------------------------------------------------------
// The comparison.

/// How one set of logits compares with a fixture's rows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Agreement {
    /// The largest `|ours − theirs|` over the kept values (top 8 and columns).
    pub max_abs: f64,
    /// The largest `|ours − theirs| / max|logit of the row|`.
    pub max_rel: f64,
    /// The largest kept logit's magnitude.
    pub scale: f64,
    /// Positions whose argmax was compared (the fixture's margin above twice the tolerance),
    /// and those skipped.
    pub argmax_checked: usize,
    pub argmax_skipped: usize,
    /// Mean over positions of how many of the fixture's top 8 ids are in ours.
    pub top8_overlap: f64,
    /// What broke the tolerance, one line each.
    pub failures: Vec<String>,
}

/// The largest `k` ids of `row`, largest first.
pub(crate) fn top_k(row: &[f64], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    if k == 0 {
        return vec![];
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    idx
}

/// Compares `logits` (`[positions, vocab]`, row-major) with the first `positions` rows of
/// `want` at the fixture's columns `cols` and top-8 ids: every value within `rel · max|logit|`
/// of the row, our largest logit within that of theirs, and our argmax equal to theirs where
/// their top1 − top2 margin exceeds twice the tolerance (each side may be off by one
/// tolerance, so a smaller margin may honestly flip).
pub(crate) fn compare(
    logits: &[f64],
    vocab: usize,
    want: &Rows,
    cols: &[u32],
    rel: f64,
    label: &str,
) -> Agreement {
    let positions = logits.len() / vocab;
    assert!(
        positions <= want.top_ids.len(),
        "{label}: {positions} rows, the fixture has {}",
        want.top_ids.len()
    );
    let mut a = Agreement::default();
    let mut overlap = 0usize;
    for p in 0..positions {
        let row = &logits[p * vocab..(p + 1) * vocab];
        let scale = want.top_vals[p]
            .iter()
            .chain(&want.cols[p])
            .fold(0f64, |m, x| m.max(x.abs()));
        a.scale = a.scale.max(scale);
        let tol = rel * scale;
        let kept = cols
            .iter()
            .zip(&want.cols[p])
            .chain(want.top_ids[p].iter().zip(&want.top_vals[p]));
        for (&id, &w) in kept {
            let d = (row[id as usize] - w).abs();
            a.max_abs = a.max_abs.max(d);
            a.max_rel = a.max_rel.max(d / scale.max(f64::MIN_POSITIVE));
            if !(d <= tol) && a.failures.len() < 8 {
                a.failures.push(format!(
                    "{label}: position {p}, id {id}: {} vs {w} (|diff| {d:.3e} > {tol:.3e})",
                    row[id as usize]
                ));
            }
        }
        let ours = top_k(row, 8);
        let ours_max = row[ours[0] as usize];
        if !((ours_max - want.top_vals[p][0]).abs() <= tol) && a.failures.len() < 8 {
            a.failures.push(format!(
                "{label}: position {p}: our largest logit {ours_max} (id {}) vs theirs {} (id {})",
                ours[0], want.top_vals[p][0], want.top_ids[p][0]
            ));
        }
        overlap += want.top_ids[p]
            .iter()
            .filter(|id| ours.contains(id))
            .count();
        let margin = want.top_vals[p][0] - want.top_vals[p][1];
        if margin > 2.0 * tol {
            a.argmax_checked += 1;
            if ours[0] != want.top_ids[p][0] && a.failures.len() < 8 {
                a.failures.push(format!(
                    "{label}: position {p}: argmax {} vs {} (margin {margin:.3e})",
                    ours[0], want.top_ids[p][0]
                ));
            }
        } else {
            a.argmax_skipped += 1;
        }
    }
    a.top8_overlap = overlap as f64 / positions.max(1) as f64;
    a
}

// ---------------------------------------------------------------------------------------
// The tests.

/// The interpreter's f32 teacher-forced logits over the first [`CPU_POSITIONS`] tokens of the
/// first prompt's sequence against transformers'.
fn cpu_logits_match(arch: &str) {
    let Some(fx) = Fixture::load(arch) else {
        return;
    };
    fx.assert_registered();
    let _turn = one_model_at_a_time();
    let t0 = Instant::now();
    fixture_folder(&fx);
    let t_write = t0.elapsed();
    let model = open_fixture(&fx, DType::F32);
    let t_load = t0.elapsed() - t_write;
    let vocab = model.vocab();
    let engine = Engine::new(model).unwrap();
    let want = &fx.f32_rows[0];
    let n = CPU_POSITIONS.min(want.tokens.len());
    let t1 = Instant::now();
    let logits = engine.logits(&want.tokens[..n]).unwrap();
    let t_run = t1.elapsed();
    let a = compare(
        logits.data(),
        vocab,
        want,
        &fx.cols,
        F32_REL_TOL,
        &format!("{arch} f32 (interpreter)"),
    );
    eprintln!(
        "{arch} vs {}: {n} positions, max |diff| {:.3e} ({:.3e} of max|logit| {:.2}), argmax checked at {} positions ({} skipped: margin ≤ 2·tol), top-8 overlap {:.2}; write (0 when cached) {:.1} s, load {:.1} s, logits {:.1} s",
        fx.made_by,
        a.max_abs,
        a.max_rel,
        a.scale,
        a.argmax_checked,
        a.argmax_skipped,
        a.top8_overlap,
        t_write.as_secs_f64(),
        t_load.as_secs_f64(),
        t_run.as_secs_f64()
    );
    assert!(a.failures.is_empty(), "{}", a.failures.join("\n"));
}

#[test]
fn hf_llama_logits_match_transformers() {
    cpu_logits_match("llama");
}

#[test]
fn hf_gpt2_logits_match_transformers() {
    cpu_logits_match("gpt2");
}

#[test]
fn hf_qwen2_logits_match_transformers() {
    cpu_logits_match("qwen2");
}

#[test]
fn hf_qwen3_logits_match_transformers() {
    cpu_logits_match("qwen3");
}

#[test]
fn hf_gemma3_logits_match_transformers() {
    cpu_logits_match("gemma3");
}

/// Every fixture file present is one of the architectures the tests above name (a new
/// fixture needs its test).
#[test]
fn hf_every_fixture_has_its_test() {
    for fx in Fixture::all() {
        assert!(
            ["llama", "gpt2", "qwen2", "qwen3", "gemma3"].contains(&fx.arch.as_str()),
            "fixture {} has no test in tests/hf_reference.rs",
            fx.arch
        );
        assert_eq!(fx.prompts.len(), fx.f32_rows.len(), "{}", fx.arch);
        for (p, r) in fx.prompts.iter().zip(&fx.f32_rows) {
            assert_eq!(
                r.tokens[..p.len()],
                p[..],
                "{}: the rows' tokens start with the prompt",
                fx.arch
            );
        }
    }
}

/// The formula against values computed independently (Python integers, f32 rounding by
/// `struct`, `bench/hf_fixtures.py`'s constants): a drift on either side fails here.
#[test]
fn the_weight_formula_matches_hand_computed_values() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    assert_eq!(splitmix64(1), 0x910a_2dec_8902_5cc1);
    let seed = 20_261_202;
    let q_scale = (3.0f64 / 576.0).sqrt() as f32;
    assert_eq!(q_scale.to_bits(), 0x3d93_cd3a);
    for (name, i, center, scale, bits) in [
        ("a", 0, 0.0, 1.0, 0xbf1d_173a),
        ("a", 1, 0.0, 1.0, 0x3f56_8c30),
        ("a", 2, 0.0, 1.0, 0xbf65_289e),
        ("model.norm.weight", 0, 1.0, 0.1, 0x3f72_23fc),
        ("model.norm.weight", 575, 1.0, 0.1, 0x3f67_004d),
        ("transformer.wte.weight", 123_456, 0.0, 0.05, 0xbc9c_18e7),
        (
            "model.layers.0.self_attn.q_proj.weight",
            7,
            0.0,
            q_scale,
            0xbd21_c5f9,
        ),
    ] {
        let w = weight(tensor_key(name, seed), i, center, scale);
        assert_eq!(w.to_bits(), bits, "{name}[{i}] = {w}");
    }
}

/// A Llama config's RoPE scaling is read (`rope_parameters.rope_type`, transformers 5, or
/// the older `rope_scaling`): a type's missing parameter is an error naming it, a complete
/// one gets past the config to the weights, which this folder lacks (a loaded folder's
/// scaling reaches the graph: `tests/hf_folder.rs`).
#[test]
fn hf_llama_rope_scaling_is_read_or_refused_by_name() {
    let Some(fx) = Fixture::load("llama") else {
        return;
    };
    let dir = scratch("rope-scaling");
    std::fs::create_dir_all(&dir).unwrap();
    for (key, value, want) in [
        ("rope_parameters", serde_json::json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}), Some("`rope_parameters.low_freq_factor`")),
        ("rope_scaling", serde_json::json!({"type": "linear", "factor": 0.0}), Some("`rope_scaling.factor` = 0.0")),
        ("rope_scaling", serde_json::json!({"type": "dynamic", "factor": 2.0}), Some("dynamic")),
        ("rope_scaling", serde_json::json!({"type": "linear", "factor": 2.0}), None),
    ] {
        let mut config = fx.config.clone();
        config[key] = value;
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        match (sinter::llm::open(&dir, DType::F32, &mut |_, _| {}), want) {
            (Err(e), Some(want)) => assert!(e.to_string().contains(want), "{e}"),
            (Err(e), None) => assert!(e.to_string().contains("tensor `*.safetensors` is missing"), "{key}: {e}"),
            (Ok(_), None) => panic!("{key}: a folder without weights loaded"),
            (Ok(_), Some(want)) => panic!("{key}: loaded, expected an error naming {want}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over every fixture present: a folder missing a manifest tensor, or with a tensor whose
/// shape disagrees with the config, is an error naming the tensor; an unknown `model_type`
/// is [`ModelError::UnsupportedArchitecture`] listing the supported architectures, every
/// fixture's among them.
#[test]
fn hf_bad_folders_name_the_tensor_or_the_architectures() {
    let all = Fixture::all();
    if all.is_empty() {
        eprintln!("skipped: no fixture in {}", fixture_dir().display());
        return;
    }
    // A fixture of an unregistered architecture fails its own test (`cpu_logits_match`).
    let registered = |fx: &&Fixture| {
        sinter::llm::registry::architecture(fx.model_type(), Path::new("config.json")).is_ok()
    };
    for fx in all.iter().filter(registered) {
        let _turn = one_model_at_a_time();
        let dir = scratch(&format!("bad-{}", fx.arch));
        // The embedding left out (the loaders read it first: the error comes before any
        // tensor is converted).
        let gone = fx
            .tensors
            .iter()
            .find(|t| t.name.contains("embed") || t.name.contains("wte"))
            .unwrap_or(&fx.tensors[0])
            .name
            .clone();
        write_folder(fx, &dir, &Edit::Drop(gone.clone()));
        let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {})
            .err()
            .unwrap_or_else(|| panic!("{}: a folder without `{gone}` loaded", fx.arch));
        assert!(
            matches!(&e, ModelError::MissingTensor { name, .. } if *name == gone)
                && e.to_string().contains(&gone),
            "{}: {e}",
            fx.arch
        );
        // The embedding stored transposed, `[hidden, vocab]`: read first, so no tensor is
        // converted before the error (a layer's Conv1D orientation: tests/decoder.rs).
        let t = fx.tensors.iter().find(|t| t.name == gone).unwrap();
        let swapped = vec![t.shape[1], t.shape[0]];
        write_folder(fx, &dir, &Edit::Shape(t.name.clone(), swapped.clone()));
        let e = sinter::llm::open(&dir, DType::F32, &mut |_, _| {})
            .err()
            .unwrap_or_else(|| panic!("{}: `{}` of shape {swapped:?} loaded", fx.arch, t.name));
        assert!(
            matches!(&e, ModelError::TensorShape { name, .. } if *name == t.name)
                && e.to_string().contains(&t.name),
            "{}: {e}",
            fx.arch
        );
        // An architecture nobody registered.
        let mut config = fx.config.clone();
        config["model_type"] = "not_a_model".into();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        match sinter::llm::open(&dir, DType::F32, &mut |_, _| {}) {
            Err(ModelError::UnsupportedArchitecture {
                arch, supported, ..
            }) => {
                assert_eq!(arch, "not_a_model");
                for other in all.iter().filter(registered) {
                    assert!(
                        supported.split(", ").any(|s| s == other.model_type()),
                        "{supported} lacks {}",
                        other.model_type()
                    );
                }
            }
            Err(e) => panic!("{}: {e}", fx.arch),
            Ok(_) => panic!("{}: model_type `not_a_model` loaded", fx.arch),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
