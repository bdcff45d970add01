//! The architecture test: the sinter-internal arrows and the heavy dependencies' homes, as
//! ARCHITECTURE.md draws them. A crate that gains a forbidden arrow fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// crate → the sinter crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("sinter-ir", &[]),
    ("sinter-dsl", &[]),
    ("sinter-passes", &["sinter-ir"]),
    ("sinter-codegen", &["sinter-ir"]),
    ("sinter-runtime", &["sinter-ir"]),
    ("sinter", &["sinter-ir", "sinter-dsl", "sinter-passes", "sinter-codegen", "sinter-runtime"]),
];

/// heavy dependency → the one crate allowed to depend on it.
const HEAVY: &[(&str, &str)] = &[
    ("egg", "sinter-passes"),
    ("inkwell", "sinter-codegen"),
    ("llvm-sys", "sinter-codegen"),
    ("cudarc", "sinter-runtime"),
];

fn deps_of(manifest: &Path) -> (String, BTreeSet<String>) {
    let text = std::fs::read_to_string(manifest).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let name = doc["package"]["name"].as_str().unwrap().to_string();
    let mut deps = BTreeSet::new();
    for section in ["dependencies", "build-dependencies"] {
        if let Some(t) = doc.get(section).and_then(|s| s.as_table()) {
            for (k, v) in t {
                // `package = "..."` renames count under their real name.
                let real = v.get("package").and_then(|p| p.as_str()).unwrap_or(k);
                deps.insert(real.to_string());
            }
        }
    }
    (name, deps)
}

fn workspace_deps() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = BTreeMap::new();
    for dir in [".", "ir", "dsl", "passes", "codegen", "runtime"] {
        let (name, deps) = deps_of(&root.join(dir).join("Cargo.toml"));
        out.insert(name, deps);
    }
    out
}

fn violations(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut bad = Vec::new();
    for (krate, ds) in deps {
        let Some(ok) = allowed.get(krate.as_str()) else {
            bad.push(format!("{krate} is not on the map in ARCHITECTURE.md"));
            continue;
        };
        for d in ds {
            if d.starts_with("sinter") && !ok.contains(&d.as_str()) {
                bad.push(format!("{krate} -> {d} is an arrow the map forbids"));
            }
            if let Some((_, home)) = HEAVY.iter().find(|(h, _)| h == d) {
                if krate != home {
                    bad.push(format!("{krate} depends on {d}, which belongs in {home} only"));
                }
            }
        }
    }
    bad
}

#[test]
fn crates_keep_to_the_map() {
    let deps = workspace_deps();
    assert_eq!(deps.len(), ALLOWED.len(), "every crate of the map exists: {:?}", deps.keys());
    let bad = violations(&deps);
    assert!(bad.is_empty(), "architecture violations:\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_a_forbidden_arrow_and_a_stray_heavy_dependency() {
    let mut deps = workspace_deps();
    deps.get_mut("sinter-passes").unwrap().insert("sinter-codegen".into());
    deps.get_mut("sinter-ir").unwrap().insert("egg".into());
    let bad = violations(&deps);
    assert!(bad.contains(&"sinter-passes -> sinter-codegen is an arrow the map forbids".to_string()), "{bad:?}");
    assert!(bad.contains(&"sinter-ir depends on egg, which belongs in sinter-passes only".to_string()), "{bad:?}");
}

#[test]
fn architecture_md_names_every_crate() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap();
    for (krate, _) in ALLOWED {
        assert!(text.contains(&format!("`{krate}`")), "ARCHITECTURE.md does not name `{krate}`");
    }
}
