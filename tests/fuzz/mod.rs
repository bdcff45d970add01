//! The differential fuzzer of the compiled path, on the CPU.
//!
//! Random graphs from the op table (`cases.rs`), random values with NaN, ±inf, finite extremes,
//! denormals and −0.0 (`values.rs`), each run by the interpreter (the reference) and through
//! both lowerings (unfused, fused) compiled for the kernel emulator and run on it
//! (`check.rs`): outputs compared element-wise with DESIGN.md's tolerances, guard bytes around
//! every buffer checked after every kernel, a fused kernel the code generator refuses where
//! the unfused graph compiles counted as a finding. Design notes: book/src/design/fuzz.md.
//!
//! - `fuzz_compiled_paths_match_the_interpreter`: the seeds `FIXED_SEEDS`, then new seeds
//!   (from the clock, printed) until `SINTER_FUZZ_SECONDS` (default 75) have passed. A finding
//!   is saved as `tests/fuzz/regressions/seed-<seed>.sir` (the seed, the finding and the
//!   graph's text, outputs and dead nodes pruned while the finding stays) and fails the test.
//! - `fuzz_regressions_replay`: every file of `tests/fuzz/regressions/`, replayed.
//!
//! Environment: `SINTER_FUZZ_SECONDS` (budget), `SINTER_FUZZ_SEEDS` (`a..b` or a list: run
//! exactly these), `SINTER_FUZZ_SCALE` (sizes ×n, 4 as on the GPU), `SINTER_FUZZ_KINDS` (`dag,attention,attention_decomposed,paged,cast_chain`),
//! `SINTER_FUZZ_FILES` (replay only the regression files whose names contain one of these
//! comma-separated parts), `SINTER_FUZZ_FEATURES` (`all`, or names of [`gen::Features`] to switch on beyond the
//! default), `SINTER_FUZZ_TARGET` (emulated target, default sm_80), `SINTER_FUZZ_PTX`
//! (`0` skips compiling the fused lowering for sm_90a to PTX), `SINTER_FUZZ_KEEP_GOING=1`
//! (report findings, do not fail: for hunting runs), `SINTER_FUZZ_SAVE` (a folder to save
//! findings in instead of the regressions folder).
//!
//! **Known bugs, not yet fixed** ([`KNOWN_OPEN`]): the generator's features that reach them are
//! off by default, and a regression file marked `// expected: <feature>` may fail while its
//! feature is listed. When a fix lands, delete its line from [`KNOWN_OPEN`]: the feature is
//! then generated in CI and its regression file must pass.

pub mod check;
pub mod cases;
pub mod values;

use std::path::{Path, PathBuf};
use std::time::Instant;

use sinter::Target;

pub use check::{check_case, Outcome};
use cases::{Features, Kind};

/// Features of the generator that reach a known, not yet fixed bug: off in CI, and their
/// regression files may fail. Delete a line when its fix lands.
pub const KNOWN_OPEN: &[(&str, &str)] = &[
];

/// Seeds every CI run replays.
const FIXED_SEEDS: std::ops::Range<u64> = 0..16;

/// The features to generate: everything but [`KNOWN_OPEN`], plus `SINTER_FUZZ_FEATURES`.
pub fn features() -> Features {
    let base = Features::ALL.without(&KNOWN_OPEN.iter().map(|k| k.0).collect::<Vec<_>>());
    match std::env::var("SINTER_FUZZ_FEATURES") {
        Ok(s) => base.with(&s),
        Err(_) => base,
    }
}

/// The generator's size scale (`SINTER_FUZZ_SCALE`, default 1; the GPU fuzzer draws at 4, so a
/// GPU finding's seed replays on the emulator at 4).
pub fn scale() -> usize {
    std::env::var("SINTER_FUZZ_SCALE").ok().and_then(|s| s.parse().ok()).filter(|&s| s >= 1).unwrap_or(1)
}

/// The kinds of graph to generate (`SINTER_FUZZ_KINDS`, default all).
pub fn kinds() -> Vec<Kind> {
    match std::env::var("SINTER_FUZZ_KINDS") {
        Ok(s) => s
            .split(',')
            .map(|n| *Kind::ALL.iter().find(|k| k.name() == n.trim()).unwrap_or_else(|| panic!("unknown fuzz kind `{n}`")))
            .collect(),
        Err(_) => Kind::ALL.to_vec(),
    }
}

/// The budget in seconds (`SINTER_FUZZ_SECONDS`, else `default`).
pub fn budget(default: f64) -> f64 {
    std::env::var("SINTER_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Explicit seeds (`SINTER_FUZZ_SEEDS`: `a..b` or `a,b,c`), if given.
pub fn explicit_seeds() -> Option<Vec<u64>> {
    let s = std::env::var("SINTER_FUZZ_SEEDS").ok()?;
    if let Some((a, b)) = s.split_once("..") {
        return Some((a.trim().parse().expect("a seed")..b.trim().parse().expect("a seed")).collect());
    }
    Some(s.split(',').map(|x| x.trim().parse().expect("a seed")).collect())
}

/// A seed from the clock, for the new seeds of a run.
pub fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16
}

fn emu_target() -> Target {
    std::env::var("SINTER_FUZZ_TARGET").ok().map(|t| Target::parse(&t).expect("a target")).unwrap_or(Target::SM_80)
}

fn ptx_targets() -> Vec<Target> {
    if std::env::var("SINTER_FUZZ_PTX").as_deref() == Ok("0") {
        vec![]
    } else {
        vec![Target::SM_90A]
    }
}

fn regressions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/regressions")
}

/// Findings of the GPU fuzzer at sizes the CPU emulator takes minutes over: replayed on the
/// device by `tests/gpu/fuzz.rs`, not here.
pub fn gpu_regressions_dir() -> PathBuf {
    regressions_dir().join("gpu")
}

/// A regression file's header field (`// name: value`).
pub fn header<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix("// ")?.strip_prefix(name)?.strip_prefix(": ")).map(str::trim)
}

/// `text` with the nodes no output needs removed (parameters kept, so the values of a seed
/// stay the same).
fn prune(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let names = |s: &str| -> Vec<String> {
        let mut v = Vec::new();
        let mut rest = s;
        while let Some(i) = rest.find('%') {
            let t: String = rest[i + 1..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.').collect();
            rest = &rest[i + 1 + t.len()..];
            v.push(t);
        }
        v
    };
    let mut live: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut keep = vec![true; lines.len()];
    for (i, l) in lines.iter().enumerate().rev() {
        let t = l.trim_start();
        if let Some(r) = t.strip_prefix("return") {
            live.extend(names(r));
        } else if t.starts_with('%') {
            if let Some((lhs, rhs)) = t.split_once(" = ") {
                if names(lhs).iter().any(|n| live.contains(n)) {
                    live.extend(names(rhs));
                } else {
                    keep[i] = false;
                }
            }
        }
    }
    lines.iter().zip(keep).filter(|(_, k)| *k).map(|(l, _)| format!("{l}\n")).collect()
}

/// A smaller graph with the same kind of finding: one output at a time, dead nodes pruned.
fn minimise(graph: &sinter::Graph, vseed: u64, feats: Features, strict: bool, target: &Target, ptx: &[Target]) -> String {
    let full = sinter::ir::print(graph);
    let f = graph.entry().expect("an entry");
    for i in 0..f.outputs.len() {
        if f.outputs.len() == 1 {
            break;
        }
        let mut g = graph.clone();
        let id = g.funcs.keys().next().expect("a function");
        g.funcs[id].outputs = vec![f.outputs[i]];
        let text = prune(&sinter::ir::print(&g));
        if let Ok(g2) = sinter::ir::parse(&text) {
            if matches!(check_case(&g2, vseed, feats, strict, target, ptx), Outcome::Finding(_)) {
                return text;
            }
        }
    }
    let text = prune(&full);
    match sinter::ir::parse(&text) {
        Ok(g2) if matches!(check_case(&g2, vseed, feats, strict, target, ptx), Outcome::Finding(_)) => text,
        _ => full,
    }
}

/// Writes a regression file for a finding; returns its path.
fn save(seed: u64, kind: Kind, feats: Features, target: &Target, finding: &str, text: &str) -> PathBuf {
    let dir = std::env::var_os("SINTER_FUZZ_SAVE").map(PathBuf::from).unwrap_or_else(regressions_dir);
    std::fs::create_dir_all(&dir).expect("the regressions folder");
    let path = dir.join(format!("seed-{seed}.sir"));
    let one_line = finding.replace('\n', " ");
    let body = format!("// A finding of the differential fuzzer (tests/fuzz), replayed by fuzz_regressions_replay.\n// seed: {seed}\n// kind: {}\n// features: {}\n// target: {target}\n// finding: {one_line}\n{text}", kind.name(), feats.names());
    std::fs::write(&path, body).expect("a regression file");
    path
}

/// Runs `seeds` (then new ones until the budget is spent when `more`); returns the findings.
fn run_seeds(seeds: &[u64], more: bool, secs: f64) -> (Vec<String>, usize) {
    let (target, ptx, feats, kinds) = (emu_target(), ptx_targets(), features(), kinds());
    eprintln!("fuzz: target {target} (emulated), PTX for {:?}, kinds {:?}, features {feats:?}, budget {secs} s", ptx.iter().map(|t| t.to_string()).collect::<Vec<_>>(), kinds.iter().map(|k| k.name()).collect::<Vec<_>>());
    let start = Instant::now();
    let mut findings = Vec::new();
    let mut ran = 0;
    let mut queue: std::collections::VecDeque<u64> = seeds.iter().copied().collect();
    let mut fresh = if more { Some(clock_seed()) } else { None };
    loop {
        let seed = match queue.pop_front() {
            Some(s) => s,
            None => match fresh.as_mut() {
                Some(s) if start.elapsed().as_secs_f64() < secs => {
                    *s = s.wrapping_add(1);
                    *s
                }
                _ => break,
            },
        };
        let t0 = Instant::now();
        let case = cases::generate(seed, &kinds, feats, scale());
        let strict = case.kind == Kind::CastChain;
        let outcome = check_case(&case.graph, seed, feats, strict, &target, &ptx);
        ran += 1;
        let dt = t0.elapsed().as_secs_f64();
        match &outcome {
            Outcome::Pass { unfused, fused } => eprintln!("fuzz seed {seed} {}: ok ({unfused} unfused, {fused} fused kernels) {dt:.1} s", case.kind.name()),
            Outcome::Skip(why) => eprintln!("fuzz seed {seed} {}: skipped: {why} {dt:.1} s", case.kind.name()),
            Outcome::Finding(f) => {
                let text = minimise(&case.graph, seed, feats, strict, &target, &ptx);
                let path = save(seed, case.kind, feats, &target, f, &text);
                eprintln!("fuzz seed {seed} {}: FINDING after {:.1} s: {f}\n  saved {}", case.kind.name(), start.elapsed().as_secs_f64(), path.display());
                findings.push(format!("seed {seed} ({}): {f}", case.kind.name()));
            }
        }
    }
    eprintln!("fuzz: {ran} seeds in {:.1} s, {} findings", start.elapsed().as_secs_f64(), findings.len());
    (findings, ran)
}

#[test]
fn fuzz_compiled_paths_match_the_interpreter() {
    let secs = budget(75.0);
    let (findings, _) = match explicit_seeds() {
        Some(s) => run_seeds(&s, false, secs),
        None => run_seeds(&FIXED_SEEDS.collect::<Vec<_>>(), true, secs),
    };
    if std::env::var("SINTER_FUZZ_KEEP_GOING").as_deref() == Ok("1") {
        return;
    }
    assert!(findings.is_empty(), "{} finding(s):\n{}", findings.len(), findings.join("\n"));
}

#[test]
fn fuzz_regressions_replay() {
    let dir = regressions_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "sir")).collect()).unwrap_or_default();
    files.sort();
    if let Ok(only) = std::env::var("SINTER_FUZZ_FILES") {
        files.retain(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| only.split(',').any(|o| n.contains(o.trim()))));
    }
    let mut bad = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("a regression file");
        let seed: u64 = header(&text, "seed").and_then(|s| s.parse().ok()).expect("a `// seed:` line");
        let target = header(&text, "target").map(|t| Target::parse(t).expect("a target")).unwrap_or(Target::SM_80);
        let open = header(&text, "expected").filter(|f| KNOWN_OPEN.iter().any(|k| k.0 == *f));
        let graph = sinter::ir::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t0 = Instant::now();
        // The values are drawn under the features the finding was made with.
        let feats = header(&text, "features").map_or(features(), |f| Features::NONE.with(f));
        let strict = header(&text, "kind") == Some(Kind::CastChain.name());
        let outcome = check_case(&graph, seed, feats, strict, &target, &ptx_targets());
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        match (outcome, open) {
            (Outcome::Finding(f), Some(feature)) => eprintln!("{name}: known open bug ({feature}) still found: {f}"),
            (Outcome::Finding(f), None) => bad.push(format!("{name}: {f}")),
            (o, Some(feature)) => eprintln!("{name}: {o:?} — the known bug `{feature}` no longer shows: delete it from KNOWN_OPEN"),
            (o, None) => eprintln!("{name}: {o:?} ({:.1} s)", t0.elapsed().as_secs_f64()),
        }
    }
    eprintln!("replayed {} regression files", files.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn fuzz_prune_keeps_what_outputs_need() {
    let text = "func @main(%a: f32[2], %b: f32[2]) {\n  %c: f32[2] = add(%a, %b)\n  %d: f32[2] = mul(%a, %a)\n  %e: f32[2] = neg(%c)\n  return %e\n}\n";
    let p = prune(text);
    assert!(!p.contains("mul"), "{p}");
    assert!(p.contains("add") && p.contains("neg") && p.contains("%b: f32[2]"), "{p}");
}
