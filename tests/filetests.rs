//! File tests of the `.sir` text format and the verifier, in the manner of Cranelift's
//! filetests: every `tests/filetests/<dir>/*.sir` is one test case, run by [`filetests`]
//! through `insta::glob!`, and the directory says what is checked.
//!
//! - `roundtrip/`: well-formed graphs. Each must parse and verify; its printed form must parse
//!   back to an equal graph and print identically (`parse(print(g)) == g`,
//!   `print(parse(print(g))) == print(g)`); the printed form is the insta snapshot
//!   (`tests/snapshots/main__filetests__filetests@roundtrip__<name>.sir.snap`).
//! - `verify/`: malformed inputs. The first line is `// error: <message>` and the test asserts
//!   that parsing, or else verifying, fails with exactly that message (the `Display` of the
//!   [`ParseError`] or [`VerifyError`]). No input may panic.
//!
//! Review snapshot changes with `cargo insta review`. To rewrite the `// error:` lines of the
//! `verify/` files from what the code says now, run with `SINTER_BLESS_ERRORS=1` and review
//! the diff.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use sinter_ir::{parse, print, verify, Graph, OpKind, ParseError, VerifyError, OP_TABLE};

const ERROR_HEADER: &str = "// error: ";

/// The outcome of checking a malformed input: which stage rejected it and its message.
fn reject(src: &str) -> Result<(), String> {
    match parse(src) {
        Err(e) => Err(ParseError::to_string(&e)),
        Ok(g) => verify(&g).map_err(|e: VerifyError| e.to_string()),
    }
}

fn check_roundtrip(path: &Path, src: &str) -> String {
    let name = path.display();
    let g = parse(src).unwrap_or_else(|e| panic!("{name}: does not parse: {e}"));
    verify(&g).unwrap_or_else(|e| panic!("{name}: does not verify: {e}"));
    let printed = print(&g);
    let g2 = parse(&printed).unwrap_or_else(|e| panic!("{name}: the printed form does not parse: {e}\n{printed}"));
    assert_eq!(g2, g, "{name}: parse(print(g)) != g; printed:\n{printed}");
    assert_eq!(print(&g2), printed, "{name}: print(parse(print(g))) != print(g)");
    verify(&g2).unwrap_or_else(|e| panic!("{name}: the printed form does not verify: {e}"));
    printed
}

fn check_verify_error(path: &Path, src: &str) {
    let name = path.display();
    let first = src.lines().next().unwrap_or("");
    let expected = first
        .strip_prefix(ERROR_HEADER)
        .unwrap_or_else(|| panic!("{name}: the first line must be `{ERROR_HEADER}<expected message>`"));
    let outcome = catch_unwind(AssertUnwindSafe(|| reject(src)));
    let actual = match outcome {
        Err(_) => panic!("{name}: parse or verify panicked"),
        Ok(Ok(())) => panic!("{name}: accepted, but expected the error `{expected}`"),
        Ok(Err(msg)) => msg,
    };
    if actual != expected && std::env::var_os("SINTER_BLESS_ERRORS").is_some() {
        let rest = src.split_once('\n').map_or("", |(_, r)| r);
        std::fs::write(path, format!("{ERROR_HEADER}{actual}\n{rest}")).expect("rewrite the header");
        eprintln!("{name}: blessed `{actual}`");
        return;
    }
    assert_eq!(actual, expected, "{name}: wrong error");
}

#[test]
fn filetests() {
    insta::glob!("filetests/**/*.sir", |path| {
        let src = std::fs::read_to_string(path).expect("read the file");
        let dir = path.parent().and_then(Path::file_name).and_then(|d| d.to_str()).unwrap_or("");
        match dir {
            "roundtrip" => insta::assert_snapshot!(check_roundtrip(path, &src)),
            "verify" => check_verify_error(path, &src),
            other => panic!("{}: no runner for directory `{other}`", path.display()),
        }
    });
}

fn dir_files(dir: &str) -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests").join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sir"))
        .collect();
    files.sort();
    files
}

fn parse_file(path: &Path) -> Graph {
    let src = std::fs::read_to_string(path).expect("read the file");
    parse(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every op of the op table appears in at least one round-trip file.
#[test]
fn roundtrip_files_cover_every_op() {
    let mut seen = BTreeSet::new();
    for path in dir_files("roundtrip") {
        for f in parse_file(&path).funcs.values() {
            seen.extend(f.nodes.values().map(|n| n.op.kind));
        }
    }
    let missing: Vec<&str> = OP_TABLE.iter().filter(|i| !seen.contains(&i.kind)).map(|i| i.name).collect();
    assert!(missing.is_empty(), "ops in no tests/filetests/roundtrip/*.sir file: {missing:?}");
}

/// The round-trip files cover what the format offers beyond ops: multi-result nodes, calls,
/// unnamed values, every attribute kind (optional attributes absent and given) and every dtype.
#[test]
fn roundtrip_files_cover_the_format() {
    use sinter_ir::{Attr, DType};
    let mut attr_kinds = BTreeSet::new();
    let mut dtypes = BTreeSet::new();
    let (mut multi_result, mut calls, mut unnamed, mut symbolic, mut funcs, mut optional_given) = (0, 0, 0, 0, 0, 0);
    let files = dir_files("roundtrip");
    for path in &files {
        for f in parse_file(path).funcs.values() {
            funcs += 1;
            for d in f.values.values() {
                dtypes.insert(d.ty.dtype);
                unnamed += usize::from(d.name.is_none());
                symbolic += usize::from(d.ty.shape.iter().any(|x| x.as_const().is_none()));
            }
            for n in f.nodes.values() {
                multi_result += usize::from(n.results.len() > 1);
                calls += usize::from(n.op.kind == OpKind::Call);
                for (spec, a) in n.op.kind.info().attrs.iter().zip(&n.op.attrs) {
                    optional_given += usize::from(matches!(spec.default, sinter_ir::ops::AttrDefault::Absent) && *a != Attr::Absent);
                    attr_kinds.insert(match a {
                        Attr::Int(_) => "int",
                        Attr::Float(_) => "float",
                        Attr::Bool(_) => "bool",
                        Attr::Str(_) => "str",
                        Attr::Ints(_) => "ints",
                        Attr::Dims(_) => "dims",
                        Attr::Dim(_) => "dim",
                        Attr::DType(_) => "dtype",
                        Attr::Absent => "absent",
                    });
                }
            }
        }
    }
    assert!(files.len() >= 12, "{} round-trip files", files.len());
    // The eight kinds, and optional attributes both absent and given.
    assert_eq!(attr_kinds.len(), 9, "attribute kinds seen: {attr_kinds:?}");
    assert!(optional_given >= 1, "no optional attribute given in the round-trip files");
    assert_eq!(dtypes.len(), DType::ALL.len(), "dtypes seen: {dtypes:?}");
    assert!(multi_result >= 3 && calls >= 5 && unnamed >= 10 && symbolic >= 100 && funcs >= 20);
}

/// The malformed files are many and each is rejected where it should be: a good share by the
/// parser and a good share by the verifier.
#[test]
fn verify_files_exercise_both_stages() {
    let (mut by_parser, mut by_verifier) = (0, 0);
    for path in dir_files("verify") {
        let src = std::fs::read_to_string(&path).expect("read the file");
        match parse(&src) {
            Err(_) => by_parser += 1,
            Ok(_) => by_verifier += 1,
        }
    }
    assert!(by_parser >= 15 && by_verifier >= 30, "parser {by_parser}, verifier {by_verifier}");
}
