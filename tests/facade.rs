//! The facade without a GPU: `Backend::Gpu` where there is none, the input checks both
//! backends share, `compile_ptx` (PTX snapshots, each assembled by ptxas) and `sinter compile`.
//! The GPU half (the same graphs on both backends) is `tests/gpu/facade.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use sinter::{graph, Backend, DType, Error, Program, Target, Tensor};

/// A graph of two kernels after fusion, small enough for its PTX to be read in a snapshot: an
/// RMSNorm row reduction and a pointwise `silu(x)·x` (one `swiglu`).
pub(crate) fn two_kernel_graph() -> sinter::Graph {
    graph! {
        fn main(x: f32[T, 64], w: f32[64]) -> (f32[T, 64], f32[T, 64]) {
            (x.rms_norm(w, eps = 1e-5), x.silu() * x)
        }
    }
    .unwrap()
}

/// The graph of the bad-input checks (here and on the GPU).
pub(crate) fn bad_input_graph() -> sinter::Graph {
    graph! { fn f(x: f32[N, 4], w: f32[N, 4], pair: f32[2 * N]) -> (f32[N, 4], f32[2 * N]) { (x * w, pair * 2.0) } }.unwrap()
}

/// `Backend::gpu()` on a machine without a GPU is `Error::NoGpu`, whose message says what to
/// use instead; with a GPU it is a GPU backend.
#[test]
fn gpu_backend_without_a_device_is_a_clear_error() {
    match Backend::gpu() {
        Ok(b) => assert!(b.is_gpu() && b != Backend::Interpreter),
        Err(e) => {
            assert!(matches!(e, Error::NoGpu { .. }), "{e:?}");
            let msg = e.to_string();
            assert!(msg.starts_with("no GPU for `Backend::Gpu`: ") && msg.ends_with("(`Backend::Interpreter` runs anywhere)"), "{msg}");
        }
    }
}

/// The checks both backends run before anything reaches them: a dtype, rank or constant dim
/// mismatch at `bind` and `run`, a symbol two inputs disagree on, a dim expression an input
/// breaks, a missing parameter.
#[test]
fn bad_inputs_are_the_facades_errors() {
    let mut p = Program::compile(bad_input_graph(), Backend::Interpreter).unwrap();
    let e = p.bind("w", Tensor::full(DType::BF16, &[2, 4], 1.0)).unwrap_err();
    assert_eq!(e.to_string(), "`w` is declared f32[N, 4] but the tensor is bf16[2, 4]");
    let e = p.bind("w", Tensor::full(DType::F32, &[2, 5], 1.0)).unwrap_err();
    assert_eq!(e.to_string(), "`w` is declared f32[N, 4] but the tensor is f32[2, 5]");
    p.bind("w", Tensor::full(DType::F32, &[2, 4], 1.0)).unwrap();
    let x3 = Tensor::full(DType::F32, &[3, 4], 1.0);
    let pair4 = Tensor::full(DType::F32, &[4], 1.0);
    let e = p.run(&[("x", &x3), ("pair", &pair4)], &[]).unwrap_err();
    assert_eq!(e.to_string(), "symbol `N` is 3 from axis 0 of `x` but 2 from axis 0 of `w`");
    let e = p.run(&[("x", &Tensor::full(DType::F32, &[2, 4], 1.0)), ("pair", &Tensor::full(DType::F32, &[5], 1.0))], &[]).unwrap_err();
    assert_eq!(e.to_string(), "`pair` is declared f32[2*N] but the tensor is f32[5]");
    let e = p.run(&[("x", &Tensor::full(DType::F32, &[2, 4], 1.0)), ("pair", &pair4)], &[("N", 3)]).unwrap_err();
    assert_eq!(e.to_string(), "symbol `N` is 3 from the given symbols but 2 from axis 0 of `x`");
    let e = p.run(&[("x", &Tensor::full(DType::F32, &[2, 4], 1.0))], &[]).unwrap_err();
    assert_eq!(e.to_string(), "parameter `pair` of @f was not given: bind it with `Program::bind` or pass it to `run`");
    let out = p.run(&[("x", &Tensor::full(DType::F32, &[2, 4], 3.0)), ("pair", &pair4)], &[]).unwrap();
    assert_eq!(out[0].data(), &[3.0; 8]);
    assert_eq!(out[1].data(), &[2.0; 4]);
}

/// The PTX of a small graph's kernels, for sm_90a and sm_80, as `compile_ptx` returns it: each
/// text a snapshot, each assembled by ptxas without spills; the plan file too.
#[cfg(feature = "llvm")]
#[test]
fn compile_ptx_snapshots() {
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap();
    for target in [Target::SM_90A, Target::SM_80] {
        let c = sinter::compile_ptx(&two_kernel_graph(), &target).unwrap();
        let kinds: Vec<String> = c.kernels.iter().map(|k| format!("{} {}: {}", k.kernel, k.family.name(), k.ops.join(" "))).collect();
        assert_eq!(kinds, ["k0 row_reduction: rms_norm", "k1 pointwise: swiglu"], "{target}");
        for k in &c.kernels {
            assert_eq!(k.plan.target, target);
            insta::assert_snapshot!(format!("compile_ptx_{}_{}", target.name(), k.plan.entry), k.plan.ptx);
            if let Some(ptxas) = &ptxas {
                let report = sinter_codegen::ptxas::assemble_with(ptxas, &k.plan.ptx, &target).unwrap_or_else(|e| panic!("{target} {}: {e}", k.plan.entry));
                assert!(!report.spills(), "{target} {}: spills\n{}", k.plan.entry, report.log);
            }
        }
        insta::assert_snapshot!(format!("compile_ptx_{}_plan", target.name()), serde_json::to_string_pretty(&c.plan_json()).unwrap());
    }
}

/// Identical kernels (one per layer) are one PTX module, shared by every kernel that is it.
#[cfg(feature = "llvm")]
#[test]
fn compile_ptx_generates_each_distinct_kernel_once() {
    let g = graph! {
        fn main(a: f32[T, 64], b: f32[T, 64]) -> (f32[T, 64], f32[T, 64]) {
            (a.softmax(-1), b.softmax(-1))
        }
    }
    .unwrap();
    let c = sinter::compile_ptx(&g, &Target::SM_90A).unwrap();
    assert_eq!(c.kernels.len(), 2);
    assert_eq!(c.kernels[0].plan, c.kernels[1].plan);
    assert_eq!(c.modules().len(), 1);
    assert_eq!(c.kernels[1].buffers[0].name.as_deref(), Some("b"));
}

/// An ill-formed graph is refused before any kernel is generated.
#[test]
fn compile_ptx_refuses_an_ill_formed_graph() {
    let mut g = two_kernel_graph();
    g.funcs.clear();
    let e = sinter::compile_ptx(&g, &Target::SM_90A).unwrap_err();
    if cfg!(feature = "llvm") {
        assert!(matches!(e, Error::Verify(_) | Error::Passes(_)), "{e:?}");
    } else {
        assert_eq!(e.to_string(), "compile_ptx needs the code generator, and this build of sinter has none (it was built without the `llvm` feature)");
    }
}

/// A chain of `n` element-wise ops fuses into one kernel whose expression is `n` deep: the code
/// generator recurses through it on threads with stacks sized for that (a test thread has only
/// 2 MiB), and a chain deeper than its limit is an error naming it, not a stack overflow.
#[cfg(feature = "llvm")]
#[test]
fn long_fused_chains_compile_or_are_a_clear_error() {
    let chain = |n: usize| {
        let mut text = String::from("func @main(%a: f32[4]) {\n");
        let mut prev = "%a".to_string();
        for i in 0..n {
            text += &format!("  %v{i}: f32[4] = exp({prev})\n");
            prev = format!("%v{i}");
        }
        text += &format!("  return {prev}\n}}\n");
        sinter_ir::parse(&text).unwrap()
    };
    let c = sinter::compile_ptx(&chain(1500), &Target::SM_90A).unwrap();
    assert_eq!(c.kernels.len(), 1);
    let e = sinter::compile_ptx(&chain(2100), &Target::SM_90A).unwrap_err().to_string();
    assert!(e.contains("more than 2048 operations deep in one kernel") && e.starts_with("code generation: kernel k0 (Pointwise): unsupported"), "{e}");
}

/// Every well-formed graph of the round-trip filetests compiles to PTX, or is refused by the
/// code generator as unsupported with its reason — never by the lowering's own contract check
/// (a `paged_attention` of which only the log-sum-exp is read once was).
#[cfg(feature = "llvm")]
#[test]
fn every_roundtrip_filetest_compiles_to_ptx_or_is_unsupported() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests/roundtrip");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "sir")).collect();
    files.sort();
    assert!(files.len() >= 20, "{}", files.len());
    for path in files {
        let g = sinter_ir::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        match sinter::compile_ptx(&g, &Target::SM_90A) {
            Ok(c) => assert!(!c.kernels.is_empty() || g.funcs.values().all(|f| f.nodes.is_empty()), "{}", path.display()),
            Err(e) => assert!(e.to_string().contains(": unsupported: "), "{}: {e}", path.display()),
        }
    }
}

fn sinter(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sinter")).args(args).output().unwrap()
}

fn scratch(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("sinter-compile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `sinter compile` writes what `compile_ptx` returns: a `.ptx` per distinct kernel and the
/// plan, and prints one line.
#[cfg(feature = "llvm")]
#[test]
fn sinter_compile_writes_the_ptx_and_the_plan() {
    let dir = scratch("ok");
    let file = dir.with_extension("sir");
    std::fs::write(&file, two_kernel_graph().to_string()).unwrap();
    let out = sinter(&["compile", file.to_str().unwrap(), "--target", "sm_80", "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout, format!("{}: 2 kernels for sm_80, 2 PTX files and plan.json in {}\n", file.display(), dir.display()));
    let c = sinter::compile_ptx(&two_kernel_graph(), &Target::SM_80).unwrap();
    for k in &c.kernels {
        assert_eq!(std::fs::read_to_string(dir.join(format!("{}.ptx", k.plan.entry))).unwrap(), k.plan.ptx);
    }
    let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan, c.plan_json());
    assert_eq!(plan["kernels"][0]["ptx"], "k0_row_reduction.ptx");
    assert_eq!(plan["inputs"][0]["name"], "x");
    // The unfused lowering: a kernel per node.
    let out = sinter(&["compile", file.to_str().unwrap(), "--out", dir.to_str().unwrap(), "--lowering", "unfused"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8(out.stdout).unwrap().contains(" kernels for sm_90a, "));
}

/// A file that is missing or does not parse, a target that is not one, a folder that cannot
/// be made: each a one-line error naming it, and a nonzero exit.
#[test]
fn sinter_compile_bad_input_is_a_clear_error() {
    let dir = scratch("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.sir");
    std::fs::write(&good, "func @f(%x: f32[4]) {\n  %y: f32[4] = exp(%x)\n  return %y\n}\n").unwrap();
    let bad = dir.join("bad.sir");
    std::fs::write(&bad, "func @f(%x: f32[4]) {\n  %y: f32[4] = frobnicate(%x)\n  return %y\n}\n").unwrap();
    let missing = dir.join("missing.sir");
    let blocked = dir.join("good.sir").join("out"); // under a file: cannot be created
    let cases: [(Vec<&str>, String); 4] = [
        (vec!["compile", missing.to_str().unwrap(), "--out", dir.to_str().unwrap()], format!("error: cannot read {}: ", missing.display())),
        (vec!["compile", bad.to_str().unwrap(), "--out", dir.to_str().unwrap()], format!("error: {}:2:", bad.display())),
        (vec!["compile", good.to_str().unwrap(), "--target", "sm_75", "--out", dir.to_str().unwrap()], "sm_75".to_string()),
        (vec!["compile", good.to_str().unwrap(), "--out", blocked.to_str().unwrap()], format!("error: cannot write {}: ", blocked.display())),
    ];
    for (args, want) in cases {
        let out = sinter(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "sinter {args:?} succeeded");
        assert!(stderr.contains(&want), "sinter {args:?}: stderr does not contain `{want}`:\n{stderr}");
        assert!(out.stdout.is_empty(), "sinter {args:?} printed {}", String::from_utf8_lossy(&out.stdout));
    }
}
