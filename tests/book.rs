//! The book (`book/`): its examples, its generated reference pages, and its build.
//!
//! - Every Rust example of the book is a function of this file between two mdBook anchor
//!   comments; the chapters include it with `{{#include ../../tests/book.rs:NAME}}`,
//!   so `cargo test` compiles and runs exactly the code the book shows, and the asserts in it
//!   are the numbers the book states.
//! - Output the book shows is checked: the printed IR and tables of chapter 3, and every
//!   ```` ```console ```` block whose first line is `$ sinter ...` is run with the built binary and
//!   compared (a line `…` stands for lines left out).
//! - Generated parts (the op and CLI references, `<!-- generated: NAME -->` regions, the PTX of
//!   chapter 5, the figures of chapter 4: see "Checks of the book itself") fail the tests when
//!   they differ from what the code gives now. Regenerate them with
//!   `SINTER_BLESS_BOOK=1 cargo test --test main book` and review the diff.
//! - `mdbook build` must succeed, and every relative link and `#anchor` of the HTML must
//!   resolve. Without mdbook the test says so and passes, except under `CI`.
//!
//! Keep the example at the top in place: the book shows its error message with this file's
//! line number.

use std::path::{Path, PathBuf};
use std::process::Command;

// ANCHOR: first_graph_use
use sinter::{graph, Backend, DType, Graph, Program, Tensor};
// ANCHOR_END: first_graph_use

// ---------------------------------------------------------------------------------------------
// Chapter 3: a shape error found when the graph is built.

// ANCHOR: up_projection
fn up_projection(hidden: usize, ffn: usize) -> Result<Graph, sinter::BuildError> {
    graph! {
        fn up(x: f32[T, {hidden}], w_up: f32[{ffn}, {hidden}]) -> f32[T, {ffn}] {
            x @ w_up
        }
    }
}
// ANCHOR_END: up_projection

#[test]
// ANCHOR: forgot_transpose
fn forgot_the_transpose() -> Result<(), Box<dyn std::error::Error>> {
    let err = up_projection(4, 8).unwrap_err();
    println!("{err}");
    assert_eq!(err.func, "up");
    assert_eq!(err.op, Some("matmul"));
    assert_eq!(err.rule, "the contracted dimensions differ: 4 vs 8");
    Ok(())
}
// ANCHOR_END: forgot_transpose

#[test]
fn ch3_shows_the_build_error_message() {
    let err = up_projection(4, 8).unwrap_err();
    assert_eq!(err.location.file(), "tests/book.rs");
    assert_shows("first-graph.md", &err.to_string());
}

// ---------------------------------------------------------------------------------------------
// Chapter 3: the first graph.

// ANCHOR: mlp_graph
fn mlp_graph() -> Result<Graph, sinter::BuildError> {
    graph! {
        fn mlp(x: f32[T, 4], w_gate: f32[4, 8], w_up: f32[4, 8], w_down: f32[8, 4]) -> f32[T, 4] {
            ((x @ w_gate).silu() * (x @ w_up)) @ w_down
        }
    }
}
// ANCHOR_END: mlp_graph

// ANCHOR: run_mlp
fn run_mlp() -> Result<Tensor, sinter::Error> {
    let mut p = Program::compile(mlp_graph()?, Backend::Interpreter)?;
    p.bind("w_gate", Tensor::full(DType::F32, &[4, 8], 0.5))?;
    p.bind("w_up", Tensor::full(DType::F32, &[4, 8], 1.0))?;
    p.bind("w_down", Tensor::full(DType::F32, &[8, 4], 0.25))?;

    // Two tokens of width 4: this binds T = 2.
    let x = Tensor::new(DType::F32, &[2, 4], vec![
        1.0, 1.0, 1.0, 1.0,
        -1.0, 0.0, 0.5, 0.5,
    ])?;
    let mut outputs = p.run(&[("x", &x)], &[])?;
    Ok(outputs.remove(0))
}
// ANCHOR_END: run_mlp

// ANCHOR: first_main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    print!("{}", mlp_graph()?);
    let y = run_mlp()?;
    println!("y: {} {:?}", y.dtype(), y.shape());
    for row in y.data().chunks(4) {
        println!("{}", row.iter().map(|v| format!("{v:9.4}")).collect::<String>());
    }
    Ok(())
}
// ANCHOR_END: first_main

#[test]
fn ch3_first_graph_runs_and_prints_what_the_book_shows() {
    main().unwrap();
    let g = mlp_graph().unwrap();
    assert_shows("first-graph.md", &g.to_string());
    let y = run_mlp().unwrap();
    assert_eq!(y.shape(), &[2, 4]);
    // x·w_gate = 2, silu(2) = 1.7616, x·w_up = 4; 8 columns of 7.0464 times 0.25.
    assert!(y.data()[..4].iter().all(|v| (v - 14.0928).abs() < 1e-4), "{:?}", y.data());
    assert!(y.data()[4..].iter().all(|&v| v == 0.0), "{:?}", y.data());
    let mut shown = format!("y: {} {:?}\n", y.dtype(), y.shape());
    for row in y.data().chunks(4) {
        shown += &format!("{}\n", row.iter().map(|v| format!("{v:9.4}")).collect::<String>());
    }
    assert_shows("first-graph.md", &shown);
}

// ---------------------------------------------------------------------------------------------
// Chapter 3: shapes and dtypes.

#[test]
// ANCHOR: shapes
fn shapes_and_dtypes() -> Result<(), Box<dyn std::error::Error>> {
    let hidden = 3; // a value from your config
    let g = graph! {
        fn f(x: f32[T, {hidden}], pair: f32[2 * T, {hidden}], scale: f32[]) -> (f32[T, 3], i32[T]) {
            let summed = pair.reshape([2, T, 3]).sum(0, keepdim = false);
            ((x + summed) * scale, iota(i32, [T]))
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let x = Tensor::full(DType::F32, &[2, 3], 1.0); // binds T = 2
    let pair = Tensor::full(DType::F32, &[4, 3], 10.0); // 2 * T = 4 rows: agrees
    let scale = Tensor::scalar(DType::F32, 0.5);
    let out = p.run(&[("x", &x), ("pair", &pair), ("scale", &scale)], &[])?;
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_eq!(out[0].data(), &[10.5; 6]); // (1 + 10 + 10) · 0.5
    assert_eq!(out[1].dtype(), DType::I32);
    assert_eq!(out[1].data(), &[0.0, 1.0]); // every element is an f64, rounded to the dtype
    Ok(())
}
// ANCHOR_END: shapes

#[test]
// ANCHOR: explicit_symbols
fn symbols_given_by_hand() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn positions(offset: i32[]) -> i32[N] {
            iota(i32, [N]) + offset
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let offset = Tensor::scalar(DType::I32, 10.0);
    // No input has an axis of size N: give it by hand.
    let out = p.run(&[("offset", &offset)], &[("N", 3)])?;
    assert_eq!(out[0].data(), &[10.0, 11.0, 12.0]);
    Ok(())
}
// ANCHOR_END: explicit_symbols

#[test]
// ANCHOR: methods
fn methods_and_attributes() -> Result<(), Box<dyn std::error::Error>> {
    let eps = 1e-6;
    let g = graph! {
        fn f(x: f32[2, 3], w: f32[3]) -> (f32[2, 3], f32[2], f32[3, 2], bf16[2, 3]) {
            let probs = x.softmax(-1);                    // positional: axis = -1
            let total = x.sum(axis = -1, keepdim = false); // named
            let xt = x.transpose(0, 1);
            let normed = rms_norm(x, w, eps = eps);       // function form; a Rust value
            (probs, total, xt, normed.cast(bf16))
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let x = Tensor::new(DType::F32, &[2, 3], vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0])?;
    let w = Tensor::new(DType::F32, &[3], vec![1.0, 2.0, 3.0])?;
    let out = p.run(&[("x", &x), ("w", &w)], &[])?;
    assert!(out[0].data().iter().all(|p| (p - 1.0 / 3.0).abs() < 1e-7));
    assert_eq!(out[1].data(), &[3.0, 6.0]);
    assert_eq!(out[2].data(), &[1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    // Each row divided by its RMS is [1, 1, 1] (less a hair for eps) times w; bf16 rounds the hair away.
    assert_eq!(out[3].data(), &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    Ok(())
}
// ANCHOR_END: methods

// ---------------------------------------------------------------------------------------------
// Chapter 3: `let`, `for`, `if`, weights, functions.

#[test]
// ANCHOR: control
fn loops_ifs_and_weights() -> Result<(), Box<dyn std::error::Error>> {
    let n_layers = 3;
    let with_bias = true;
    let g = graph! {
        fn main(x: f32[T, 2]) -> f32[T, 2] {
            let mut h = x;
            for i in 0..n_layers {
                h = h + h @ weight(format!("layer{i}.w"), f32[2, 2]);
            }
            if with_bias {
                h = h + weight("bias", f32[2]);
            }
            h
        }
    }?;
    let mut p = Program::compile(g, Backend::Interpreter)?;
    assert_eq!(p.unbound(&["x"]), ["layer0.w", "layer1.w", "layer2.w", "bias"]);
    for i in 0..n_layers {
        // layer i's weight is (i + 1)·I, so layer i multiplies h by i + 2
        let v = (i + 1) as f64;
        p.bind(&format!("layer{i}.w"), Tensor::new(DType::F32, &[2, 2], vec![v, 0.0, 0.0, v])?)?;
    }
    p.bind("bias", Tensor::new(DType::F32, &[2], vec![0.5, -0.5])?)?;
    let out = p.run(&[("x", &Tensor::full(DType::F32, &[1, 2], 1.0))], &[])?;
    assert_eq!(out[0].data(), &[24.5, 23.5]); // 1 · 2 · 3 · 4, plus the bias
    Ok(())
}
// ANCHOR_END: control

// ANCHOR: functions
fn two_blocks() -> Result<Graph, sinter::BuildError> {
    let n_layers = 2;
    graph! {
        fn block(x: f32[T, 4], norm: f32[4], w_up: f32[4, 8], w_down: f32[8, 4]) -> f32[T, 4] {
            let h = x.rms_norm(norm, eps = 1e-5);
            x + (h @ w_up).silu() @ w_down
        }

        fn main(x: f32[T, 4]) -> f32[T, 4] {
            let mut h = x;
            for i in 0..n_layers {
                h = block(h, weight(format!("blk.{i}.norm"), f32[4]),
                          weight(format!("blk.{i}.up"), f32[4, 8]),
                          weight(format!("blk.{i}.down"), f32[8, 4]));
            }
            h
        }
    }
}
// ANCHOR_END: functions

#[test]
fn ch3_functions_print_what_the_book_shows() {
    let g = two_blocks().unwrap();
    assert_eq!(g.funcs.len(), 2);
    let main = g.func("main").unwrap();
    let printed = g.to_string();
    let main_text = &printed[printed.find("func @main").unwrap()..];
    assert_shows("first-graph.md", main_text);
    assert_eq!(main.params.len(), 1 + 2 * 3);
    // It runs: with w_up = 0 every block adds silu(0)·… = 0, so the output is x.
    let mut p = Program::compile(g, Backend::Interpreter).unwrap();
    for i in 0..2 {
        p.bind(&format!("blk.{i}.norm"), Tensor::full(DType::F32, &[4], 1.0)).unwrap();
        p.bind(&format!("blk.{i}.up"), Tensor::zeros(DType::F32, &[4, 8])).unwrap();
        p.bind(&format!("blk.{i}.down"), Tensor::full(DType::F32, &[8, 4], 1.0)).unwrap();
    }
    let x = Tensor::new(DType::F32, &[1, 4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(p.run(&[("x", &x)], &[]).unwrap()[0].data(), x.data());
}

// ---------------------------------------------------------------------------------------------
// Chapter 4: the fused forms agree with the plain ones on the interpreter.

#[test]
// ANCHOR: swiglu_agrees
fn swiglu_agrees_with_its_spelling() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn main(gate: bf16[T, 4], up: bf16[T, 4]) -> (bf16[T, 4], bf16[T, 4]) {
            (gate.silu() * up, gate.swiglu(up))
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let gate = Tensor::from_fn(DType::BF16, &[3, 4], |i| i[0] as f64 - 0.7 * i[1] as f64);
    let up = Tensor::from_fn(DType::BF16, &[3, 4], |i| 0.25 + i[1] as f64);
    let out = p.run(&[("gate", &gate), ("up", &up)], &[])?;
    assert_eq!(out[0].data(), out[1].data()); // bit for bit: the same roundings
    Ok(())
}
// ANCHOR_END: swiglu_agrees

#[test]
// ANCHOR: attention_agrees
fn attention_agrees_with_its_spelling() -> Result<(), Box<dyn std::error::Error>> {
    let scale = 0.5; // 1/√D for D = 4
    let g = graph! {
        fn main(q: f32[1, 2, S, 4], k: f32[1, 2, S, 4], v: f32[1, 2, S, 4]) -> (f32[1, 2, S, 4], f32[1, 2, S, 4]) {
            let visible = iota(i32, [S, S], 0) >= iota(i32, [S, S], 1);
            let mask = visible.select(constant(0.0, f32), constant(-1e30, f32));
            let plain = ((q @ k.transpose(-2, -1)) * {scale} + mask).softmax(-1) @ v;
            let fused = q.attention(k, v, scale = scale, causal = true, heads = 2, kv_heads = 2);
            (plain, fused)
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let t = |seed: f64| Tensor::from_fn(DType::F32, &[1, 2, 5, 4], move |i| ((i[1] * 20 + i[2] * 4 + i[3]) as f64 * seed).sin());
    let (q, k, v) = (t(0.37), t(0.91), t(1.73));
    let out = p.run(&[("q", &q), ("k", &k), ("v", &v)], &[])?;
    for (a, b) in out[0].data().iter().zip(out[1].data()) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}"); // equal up to f32 rounding
    }
    Ok(())
}
// ANCHOR_END: attention_agrees

// ---------------------------------------------------------------------------------------------
// Chapter 4: what the passes make of the zoo's decoder layers.

#[test]
// ANCHOR: seven_kernels
fn seven_kernels_per_decoder_layer() -> Result<(), Box<dyn std::error::Error>> {
    use sinter::zoo::{self, Mode};
    use sinter_passes::{compile, PassOptions, Target};

    let cases = [
        ("smollm2-135m", Mode::Prefill, "layer#1", "attention"),
        ("smollm2-135m", Mode::Decode, "layer#1", "paged_attention"),
        ("gpt2", Mode::Prefill, "block#1", "attention"),
    ];
    for (model, mode, call, attention) in cases {
        let g = zoo::build(model, mode, DType::BF16)?;
        let (kernels, report) = compile(&g, &Target::SM_90A, &PassOptions::default())?;
        assert_eq!(kernels.kernels.len(), report.kernels.len());
        // The kernels of one decoder layer, in launch order; weight concatenations run once,
        // when the weights are bound, not per step.
        let layer: Vec<_> = report.kernels.iter().filter(|k| k.origin == call && !k.load_time).collect();
        let families: Vec<&str> = layer.iter().map(|k| k.family.name()).collect();
        assert_eq!(families, ["row_reduction", "matmul", attention, "matmul", "row_reduction", "matmul", "matmul"]);
        // What each matmul's epilogue does, by the last op of its body.
        let last: Vec<&str> = layer.iter().map(|k| k.ops.last().unwrap().as_str()).collect();
        let (qkv, o_proj, up, down) = (last[1], last[3], last[5], last[6]);
        if model == "gpt2" {
            assert_eq!([layer[0].ops.as_slice(), &layer[4].ops], [["layer_norm"], ["layer_norm"]]);
            assert!(layer[1].ops.starts_with(&["matmul".into(), "add".into()])); // QKV + bias, then split
            assert_eq!([o_proj, up, down], ["add", "gelu", "add"]); // bias + residual; bias, GELU
        } else {
            assert_eq!([layer[0].ops.as_slice(), &layer[4].ops], [["rms_norm"], ["rms_norm"]]);
            assert_eq!(qkv, "kv_append"); // RoPE on Q and K, K and V scattered into the pages
            assert!(layer[1].ops.iter().filter(|op| *op == "rope").count() == 2);
            assert_eq!([o_proj, up, down], ["add", "swiglu", "add"]); // residual; SwiGLU; residual
        }
    }
    Ok(())
}
// ANCHOR_END: seven_kernels

/// Chapter 4's table of rules is `sinter_passes::rules::catalogue()`, and the optimised `layer`
/// it shows is what the e-graph makes of SmolLM2's prefill layer.
#[test]
fn ch4_shows_the_rules_and_the_optimised_layer() {
    let mut table = String::from("| rule | family | rewrites |\n|---|---|---|\n");
    for r in sinter_passes::rules::catalogue() {
        table += &format!("| `{}` | {} | {} |\n", r.name, r.family, r.doc.replace('|', "\\|"));
    }
    check_region("fusion.md", "rules", &table);

    let g = sinter::zoo::build("smollm2-135m", sinter::zoo::Mode::Prefill, DType::BF16).unwrap();
    let (_, report) = sinter_passes::compile(&g, &sinter::Target::SM_90A, &sinter_passes::PassOptions::default()).unwrap();
    let layer = report.functions.iter().find(|f| f.name == "layer").unwrap();
    let (phase, text) = layer.snapshots.last().unwrap();
    assert_eq!(phase, "fusion");
    check_region("fusion.md", "layer-optimised", &format!("```text\n{text}```\n"));
}

// ---------------------------------------------------------------------------------------------
// Chapter 5: the PTX of a pointwise kernel and of a softmax kernel.

// ANCHOR: ptx_graphs
fn swiglu_graph() -> Result<Graph, sinter::BuildError> {
    graph! {
        fn main(gate: bf16[4096, 1536], up: bf16[4096, 1536]) -> bf16[4096, 1536] {
            gate.silu() * up
        }
    }
}

fn softmax_graph() -> Result<Graph, sinter::BuildError> {
    graph! {
        fn main(x: bf16[4096, 4096]) -> bf16[4096, 4096] {
            let x32 = x.cast(f32);
            let e = (x32 - x32.max(-1)).exp();
            (e / e.sum(-1)).cast(bf16)
        }
    }
}
// ANCHOR_END: ptx_graphs

/// The two graphs of chapter 5 are one kernel each after the passes: a `swiglu` pointwise kernel
/// and a softmax row reduction with its casts fused.
#[test]
fn ch5_graphs_are_one_kernel_each() {
    use sinter::gpu::{lower, Lowering};
    for (g, family, ops) in [
        (swiglu_graph().unwrap(), sinter::ir::Family::Pointwise, vec!["swiglu"]),
        (softmax_graph().unwrap(), sinter::ir::Family::RowReduction, vec!["cast", "softmax", "cast"]),
    ] {
        let kg = lower(&g, Lowering::Fused, &sinter::Target::SM_90A).unwrap();
        let kernels: Vec<_> = kg.kernels.values().collect();
        assert_eq!(kernels.len(), 1);
        assert_eq!(kernels[0].family, family);
        assert_eq!(kernels[0].body.nodes.values().map(|n| n.op.kind.name()).collect::<Vec<_>>(), ops);
    }
}

#[cfg(feature = "llvm")]
// ANCHOR: ptx_of
/// The kernels of `g` after the fusion passes, each with its PTX and launch plan for sm_90a.
fn ptx_of(g: &Graph) -> Result<Vec<(sinter::Family, sinter::LaunchPlan)>, sinter::Error> {
    let compiled = sinter::compile_ptx(g, &sinter::Target::SM_90A)?;
    Ok(compiled.kernels.into_iter().map(|k| (k.family, k.plan)).collect())
}
// ANCHOR_END: ptx_of

/// Both graphs of chapter 5 as one `.sir` file, for its `sinter compile` example.
#[cfg(feature = "llvm")]
fn ch5_file_graph() -> Result<Graph, sinter::BuildError> {
    graph! {
        fn main(gate: bf16[4096, 1536], up: bf16[4096, 1536], x: bf16[4096, 4096]) -> (bf16[4096, 1536], bf16[4096, 4096]) {
            let x32 = x.cast(f32);
            let e = (x32 - x32.max(-1)).exp();
            (gate.silu() * up, (e / e.sum(-1)).cast(bf16))
        }
    }
}

/// `book/src/ptx/chapter5.sir` is that graph's text, and `sinter compile` of it writes what
/// `compile_ptx` returns.
#[cfg(feature = "llvm")]
#[test]
fn ch5_sir_file_is_the_chapters_graphs() {
    let g = ch5_file_graph().unwrap();
    check_generated("book/src/ptx/chapter5.sir", &g.to_string(), "tests/book.rs (ch5_file_graph)");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("book-ptx");
    let out = sinter_cmd(&["compile", root().join("book/src/ptx/chapter5.sir").to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let compiled = sinter::compile_ptx(&g, &sinter::Target::SM_90A).unwrap();
    assert_eq!(compiled.kernels.len(), 2);
    for k in &compiled.kernels {
        assert_eq!(read_abs(&dir.join(format!("{}.ptx", k.plan.entry))), k.plan.ptx);
    }
    let plan: serde_json::Value = serde_json::from_str(&read_abs(&dir.join("plan.json"))).unwrap();
    assert_eq!(plan, compiled.plan_json());
}

#[cfg(feature = "llvm")]
fn read_abs(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// A launch plan's grid, `⌈T/64⌉` for a symbolic count, the number of CTAs for a constant one.
#[cfg(feature = "llvm")]
fn grid_text(plan: &sinter::ir::LaunchPlan) -> String {
    let axis = |g: &sinter::ir::GridDim| match g.numerator.as_const() {
        Some(n) => (n + i64::from(g.denominator) - 1).div_euclid(i64::from(g.denominator)).to_string(),
        None if g.denominator == 1 => g.numerator.to_string(),
        None => format!("⌈{}/{}⌉", g.numerator, g.denominator),
    };
    format!("{} × {} × {}", axis(&plan.grid[0]), axis(&plan.grid[1]), axis(&plan.grid[2]))
}

/// What `ptxas -v` says of `ptx` (its lines but the compile time), or `None` without ptxas
/// (outside CI).
#[cfg(feature = "llvm")]
fn ptxas_report(ptx: &str) -> Option<sinter_codegen::PtxasReport> {
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap()?;
    Some(sinter_codegen::ptxas::assemble_with(&ptxas, ptx, &sinter_codegen::Target::SM_90A).unwrap())
}

/// Chapter 5 shows the PTX the code generator writes now: the whole text is committed as
/// `book/src/ptx/<name>.ptx` (regenerated by `SINTER_BLESS_BOOK=1`), every excerpt of the
/// chapter marked `<!-- ptx: NAME -->` is a run of its lines (`…` for lines left out; an
/// annotation `  // ←…` at the end of a line is the book's), and the launch plan and the
/// `ptxas -v` report are generated regions.
#[cfg(feature = "llvm")]
#[test]
fn ch5_ptx_is_what_the_code_generator_writes() {
    for (name, g) in [("swiglu", swiglu_graph().unwrap()), ("softmax", softmax_graph().unwrap())] {
        let plans = ptx_of(&g).unwrap();
        assert_eq!(plans.len(), 1, "{name}: the passes fuse it into one kernel");
        let (family, plan) = &plans[0];
        check_generated(&format!("book/src/ptx/{name}.ptx"), &plan.ptx, "the code generator");
        let ptx = read(&format!("book/src/ptx/{name}.ptx"));
        assert_ptx_excerpts("ptx.md", name, &ptx);
        let launch = format!(
            "```text\nentry {}   family {}   grid {} CTAs   block {} threads   params {}\n```\n",
            plan.entry,
            family.name(),
            grid_text(plan),
            plan.block[0],
            plan.params.len()
        );
        check_region("ptx.md", &format!("{name}-launch"), &launch);
        if name == "swiglu" {
            // The kernel's entry of the plan file `sinter compile` writes.
            let json = sinter::compile_ptx(&g, &sinter::Target::SM_90A).unwrap().plan_json();
            let kernel = serde_json::to_string_pretty(&json["kernels"][0]).unwrap();
            check_region("ptx.md", "swiglu-plan", &format!("```json\n{kernel}\n```\n"));
        }
        if let Some(report) = ptxas_report(&plan.ptx) {
            let log: String = report.log.lines().filter(|l| !l.contains("Compile time")).map(|l| format!("{l}\n")).collect();
            check_region("ptx.md", &format!("{name}-ptxas"), &format!("```console\n$ ptxas -arch=sm_90a -v {name}.ptx -o {name}.cubin\n{log}```\n"));
        }
    }
}

/// Every fenced block of `book/src/<chapter>` right after a `<!-- ptx: NAME -->` line is a run
/// of lines of `ptx`: compared with runs of whitespace collapsed, `…` standing for any lines,
/// and an annotation `  // ←…` at the end of a line dropped.
#[cfg(feature = "llvm")]
fn assert_ptx_excerpts(chapter: &str, name: &str, ptx: &str) {
    let page = read(&format!("book/src/{chapter}"));
    let norm = |l: &str| l.split_once("// ←").map_or(l, |(code, _)| code).split_whitespace().collect::<Vec<_>>().join(" ");
    let got: Vec<String> = ptx.lines().map(norm).collect();
    let marker = format!("<!-- ptx: {name} -->");
    let mut found = 0;
    for piece in page.split(&marker).skip(1) {
        let block: Vec<String> = piece.trim_start().lines().skip(1).take_while(|l| !l.starts_with("```")).map(norm).collect();
        let mut want: Vec<&str> = vec!["…"];
        want.extend(block.iter().map(String::as_str));
        want.push("…");
        let got: Vec<&str> = got.iter().map(String::as_str).collect();
        assert!(matches_with_gaps(&want, &got), "book/src/{chapter}: an excerpt marked `{marker}` is not in book/src/ptx/{name}.ptx:\n{}", block.join("\n"));
        found += 1;
    }
    assert!(found > 0, "book/src/{chapter} shows no excerpt of {name}");
}

// ---------------------------------------------------------------------------------------------
// Chapter 6: the kernels of one SmolLM2 decoder layer, as the code generator builds them.

/// A table of the kernels of SmolLM2's `layer#1` in `mode`: entry point, grid, block, and what
/// `ptxas -v` reports (registers per thread, static shared memory, spills).
#[cfg(feature = "llvm")]
fn layer_kernel_table(mode: sinter::zoo::Mode) -> Option<String> {
    use sinter_passes::{compile, PassOptions};
    let g = sinter::zoo::build("smollm2-135m", mode, DType::BF16).unwrap();
    let (kg, report) = compile(&g, &sinter::Target::SM_90A, &PassOptions::default()).unwrap();
    let mut s = String::from("| kernel | ops | grid (CTAs) | threads | registers | static smem | spills |\n|---|---|---|---|---|---|---|\n");
    for kr in report.kernels.iter().filter(|k| k.origin == "layer#1" && !k.load_time) {
        let plan = sinter_codegen::compile_kernel(&kg, kr.kernel, &sinter_codegen::Target::SM_90A).unwrap();
        let ptxas = ptxas_report(&plan.ptx)?;
        let f = ptxas.function(&plan.entry).unwrap();
        let ops: Vec<&str> = kr.ops.iter().map(String::as_str).filter(|o| !matches!(*o, "reshape" | "slice")).collect();
        s += &format!(
            "| `{}` | {} | {} | {} | {} | {} B | {} |\n",
            plan.entry,
            ops.join(" "),
            grid_text(&plan),
            plan.block[0],
            f.registers,
            f.shared_bytes,
            if f.spills() { "yes" } else { "none" }
        );
    }
    Some(s)
}

/// Chapter 6's tables are what the code generator and ptxas make of the layer's kernels now.
#[cfg(feature = "llvm")]
#[test]
fn ch6_layer_kernels_are_what_the_code_generator_builds() {
    for (mode, name) in [(sinter::zoo::Mode::Prefill, "prefill"), (sinter::zoo::Mode::Decode, "decode")] {
        let Some(table) = layer_kernel_table(mode) else { return };
        check_region("kernels.md", &format!("layer-{name}"), &table);
    }
}

// ---------------------------------------------------------------------------------------------
// Chapter 6: paged attention reads the cache through the block table.

#[test]
// ANCHOR: paged_agrees
fn paged_attention_reads_through_the_block_table() -> Result<(), Box<dyn std::error::Error>> {
    // One sequence of 6 tokens, 2 heads of width 4, pages of 4 slots. The block table maps
    // the sequence's page 0 to physical page 2 and its page 1 to physical page 0.
    let g = graph! {
        fn main(q: f32[1, 2, 1, 4], k: f32[1, 6, 2, 4], v: f32[1, 6, 2, 4],
                k_pages: f32[3, 4, 2, 4], v_pages: f32[3, 4, 2, 4],
                block_table: i32[1, 2], start: i32[1], seq_lens: i32[1])
            -> (f32[3, 4, 2, 4], f32[1, 2, 1, 4], f32[1, 2, 1, 4])
        {
            let [kp, vp] = k_pages.kv_append(v_pages, k, v, block_table, start);
            let paged = q.paged_attention(kp, vp, block_table, seq_lens, scale = 0.5, heads = 2, kv_heads = 2);
            let dense = q.attention(k.transpose(1, 2), v.transpose(1, 2), scale = 0.5, heads = 2, kv_heads = 2);
            (kp, paged, dense)
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let t = |shape: &[usize], seed: f64| Tensor::from_fn(DType::F32, shape, move |i| ((i.iter().sum::<usize>() as f64 + 1.0) * seed).sin());
    let (q, k, v) = (t(&[1, 2, 1, 4], 0.3), t(&[1, 6, 2, 4], 0.7), t(&[1, 6, 2, 4], 1.1));
    let empty = Tensor::zeros(DType::F32, &[3, 4, 2, 4]);
    let block_table = Tensor::new(DType::I32, &[1, 2], vec![2.0, 0.0])?;
    let start = Tensor::new(DType::I32, &[1], vec![0.0])?; // the cache was empty
    let seq_lens = Tensor::new(DType::I32, &[1], vec![6.0])?;
    let out = p.run(&[("q", &q), ("k", &k), ("v", &v), ("k_pages", &empty), ("v_pages", &empty),
                      ("block_table", &block_table), ("start", &start), ("seq_lens", &seq_lens)], &[])?;
    // Token t sits in slot t % 4 of physical page block_table[t / 4]: tokens 0-3 in page 2,
    // tokens 4-5 in page 0; page 1 stays empty.
    let kp = &out[0];
    assert_eq!(kp.get(&[2, 0, 0, 0]), k.get(&[0, 0, 0, 0]));
    assert_eq!(kp.get(&[0, 1, 1, 3]), k.get(&[0, 5, 1, 3]));
    assert!(kp.data()[32..64].iter().all(|&x| x == 0.0));
    for (a, b) in out[1].data().iter().zip(out[2].data()) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    Ok(())
}
// ANCHOR_END: paged_agrees

#[test]
// ANCHOR: fp8_matmul
fn an_fp8_matmul_is_written_with_its_scales() -> Result<(), Box<dyn std::error::Error>> {
    // Activations quantized per tensor at run time, a weight stored in f8e4m3 as [N, K]; the
    // scales are f32 scalars in device memory.
    let g = graph! {
        fn main(x: bf16[T, 4], sx: f32[], w8: f8e4m3[2, 4], sw: f32[]) -> (bf16[T, 2], f8e4m3[T, 4]) {
            let x8 = x.quantize_fp8(sx);
            let a = x8.dequantize_fp8(sx, bf16);
            let w = w8.dequantize_fp8(sw, bf16);
            (a.matmul(w, transpose_b = true), x8)
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let x = Tensor::new(DType::BF16, &[1, 4], vec![0.5, 1.0625, -3.0, 1000.0])?;
    let w8 = Tensor::new(DType::F8E4M3, &[2, 4], vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])?;
    let (sx, sw) = (Tensor::scalar(DType::F32, 0.5), Tensor::scalar(DType::F32, 0.25));
    let out = p.run(&[("x", &x), ("sx", &sx), ("w8", &w8), ("sw", &sw)], &[])?;
    // x / 0.5 = [1, 2.125, -6, 2000]: 2.125 is halfway between 2 and 2.25 and goes to the
    // even 2; 2000 is beyond the largest f8e4m3, 448, and saturates.
    assert_eq!(out[1].data(), &[1.0, 2.0, -6.0, 448.0]);
    // y = (x8 · 0.5) · (w8 · 0.25)ᵀ = [(1 + 2) · 0.125, 448 · 0.125].
    assert_eq!(out[0].data(), &[0.375, 56.0]);
    Ok(())
}
// ANCHOR_END: fp8_matmul

// ---------------------------------------------------------------------------------------------
// Chapter 7: a whole model.

#[test]
// ANCHOR: zoo_graphs
fn the_zoo_builds_prefill_and_decode() -> Result<(), Box<dyn std::error::Error>> {
    use sinter::zoo::{self, Mode};

    for mode in [Mode::Prefill, Mode::Decode] {
        let g = zoo::build("smollm2-135m", mode, DType::BF16)?;
        let main = g.func("main").unwrap();
        let params: Vec<String> = main.params.iter().map(|&p| main.label(p)).collect();
        assert_eq!(params[..5], ["%tokens", "%positions", "%block_tables", "%k_pages", "%v_pages"]);
        // the embedding, 9 weights in each of the 30 layers, the final norm
        assert_eq!(params.len(), 5 + 1 + 9 * 30 + 1);
        assert_eq!(main.outputs.len(), 4); // logits, k_pages, v_pages, next
    }
    Ok(())
}
// ANCHOR_END: zoo_graphs

// ANCHOR: ask_smollm2
fn ask(model_file: &std::path::Path, question: &str) -> Result<String, Box<dyn std::error::Error>> {
    use sinter::llm::{Engine, LlamaModel, SampleOptions};

    let model = LlamaModel::open(model_file, DType::BF16, |_done, _total| {})?;
    let prompt = model.chat_prompt(question)?; // token ids, chat template applied
    let engine = Engine::new(model)?; // prefill and decode programs sharing the weights
    let out = engine.generate(&[prompt], &SampleOptions::greedy(32), &mut |_seq, _token| {})?;
    let tokenizer = &engine.model().tokenizer;
    let answer: Vec<u32> = out.tokens[0].iter().copied().filter(|&t| t != tokenizer.eos).collect();
    Ok(tokenizer.decode(&answer)?)
}
// ANCHOR_END: ask_smollm2

/// The default model, or `None` (with a message) when it is missing; under `CI` a missing
/// model fails.
fn smollm2() -> Option<PathBuf> {
    let p = sinter::llm::fetch::default_model_path();
    if p.exists() {
        return Some(p);
    }
    assert!(std::env::var_os("CI").is_none(), "{} is missing: run scripts/setup", p.display());
    eprintln!("skipped: {} is missing (run scripts/setup)", p.display());
    None
}

#[test]
fn ch7_smollm2_answers_as_the_book_says() {
    let Some(path) = smollm2() else { return };
    let answer = ask(&path, "What is the capital of France?").unwrap();
    assert_eq!(answer, "The capital of France is Paris.");
    assert_shows("whole-model.md", &answer);
}

#[test]
fn ch7_shows_the_rendered_chat_prompt() {
    use sinter::llm::chat::Message;
    let Some(path) = smollm2() else { return };
    let gguf = sinter::llm::gguf::GgufFile::open(&path).unwrap();
    let tokenizer = sinter::llm::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let chat = sinter::llm::chat::ChatTemplate {
        source: gguf.str("tokenizer.chat_template").ok().map(str::to_string),
        bos_token: String::new(),
        eos_token: String::new(),
    };
    let text = chat.render(&[Message { role: "user".into(), content: "What is the capital of France?".into() }]).unwrap();
    assert_shows("whole-model.md", &format!("```text\n{text}```"));
    let ids = tokenizer.encode(&text).unwrap();
    assert_shows("whole-model.md", &format!("{} tokens", ids.len()));
    assert_eq!(ids[0], 1, "the prompt starts with <|im_start|>, token 1, and no BOS");
}

// ---------------------------------------------------------------------------------------------
// Chapter 10: the op table is data.

#[test]
// ANCHOR: op_row
fn an_op_is_a_row_of_the_table() -> Result<(), Box<dyn std::error::Error>> {
    use sinter::ir::{OpClass, OpKind, OP_TABLE};

    let rms = OpKind::from_name("rms_norm").unwrap().info();
    assert_eq!(rms.class, OpClass::Composite);
    assert_eq!(rms.operands, ["x", "weight"]);
    assert_eq!(rms.attrs.iter().map(|a| a.name).collect::<Vec<_>>(), ["eps"]);
    println!("{}", rms.doc);
    assert!(OP_TABLE.len() >= 50);
    Ok(())
}
// ANCHOR_END: op_row

// ---------------------------------------------------------------------------------------------
// Chapter 10: a new rewrite rule, and its soundness test.

// ANCHOR: gelu_rule
use sinter::ir::OpKind;
use sinter_passes::rules::{comm_args, is_const, is_const_near, mk, unary_args, RuleFn};

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` → `gelu(x, form = "tanh")`: GPT-2's GELU as
/// Hugging Face writes it, with `x³` as `x·x·x` in either grouping; √(2/π) and 0.044715 match
/// as the graph's f32 holds them (`is_const_near`), 0.5 and 1 exactly. (egg's `Id` is not
/// re-exported, so outside `sinter-passes` the rule is a closure coerced to `RuleFn`; the
/// rules in `passes/src/rules/` are plain `fn`s of the same type.)
const GELU_TANH: RuleFn = |eg, id| {
    let same = |a, b| eg.find(a) == eg.find(b);
    let square_of = |s, x| comm_args(eg, s, OpKind::Mul).iter().any(|&(a, b)| same(a, x) && same(b, x));
    let cube_of = |c, x| comm_args(eg, c, OpKind::Mul).iter().any(|&(a, s)| same(a, x) && square_of(s, x));
    let mut xs = Vec::new();
    for (half_x, one_plus_t) in comm_args(eg, id, OpKind::Mul) {
        for (half, x) in comm_args(eg, half_x, OpKind::Mul) {
            for (one, t) in comm_args(eg, one_plus_t, OpKind::Add) {
                for u in unary_args(eg, t, OpKind::Tanh) {
                    for (c, inner) in comm_args(eg, u, OpKind::Mul) {
                        for (x2, cubic) in comm_args(eg, inner, OpKind::Add) {
                            for (k, cube) in comm_args(eg, cubic, OpKind::Mul) {
                                let constants = is_const(eg, half, 0.5)
                                    && is_const(eg, one, 1.0)
                                    && is_const_near(eg, c, (2.0 / std::f64::consts::PI).sqrt())
                                    && is_const_near(eg, k, 0.044715);
                                if constants && same(x2, x) && cube_of(cube, x) {
                                    xs.push(x);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let form = ("form", sinter::ir::Attr::Str("tanh".into()));
    xs.into_iter().filter_map(|x| mk(eg, OpKind::Gelu, vec![form.clone()], &[x]).map(|gelu| (id, gelu))).collect()
};
// ANCHOR_END: gelu_rule

#[test]
// ANCHOR: gelu_rule_test
fn the_gelu_rule_fires_and_is_sound() -> Result<(), Box<dyn std::error::Error>> {
    use sinter_passes::check::check_egraph;
    use sinter_passes::optimise::{saturate, Phase};
    use sinter_passes::{rules, PassOptions};

    let g = graph! {
        fn act(x: f32[T, 64]) -> f32[T, 64] {
            0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * (x * x * x))).tanh())
        }
    }?;
    let f = g.entry().unwrap();
    let callees: std::collections::BTreeMap<_, _> = g.funcs.values().map(|f| (f.name.clone(), f.signature())).collect();
    let rule = rules::rule("gelu-tanh", &[OpKind::Mul], GELU_TANH).unwrap();
    let sat = saturate(f, &callees, &PassOptions::default(), &Phase::ALL, &[rule])?;
    assert!(sat.phases.iter().any(|p| p.rules_fired.contains_key("gelu-tanh")));

    // Extraction takes the op: one node instead of eleven.
    let (_, best) = sat.snapshots.last().unwrap();
    assert_eq!(best.nodes.values().map(|n| n.op.kind.name()).collect::<Vec<_>>(), ["gelu"]);

    // Soundness: on these inputs every e-node of the saturated e-graph, the new `gelu` included,
    // evaluates on the interpreter to its class's value (within f32 tolerance).
    let x = Tensor::from_fn(DType::F32, &[7, 64], |i| (i[0] as f64 - 3.0) * 1.5 + i[1] as f64 / 32.0);
    let bindings = [("T".to_string(), 7)].into_iter().collect();
    let checked = check_egraph(&sat.egraph, &sat.original, &[&x], &bindings, Some(&g)).map_err(|m| format!("{m:?}"))?;
    assert!(checked.evaluated >= 12);
    Ok(())
}
// ANCHOR_END: gelu_rule_test

// ---------------------------------------------------------------------------------------------
// Chapter 11: errors.

#[test]
// ANCHOR: errors
fn errors_are_values() -> Result<(), Box<dyn std::error::Error>> {
    use sinter::Error;

    let g = graph! {
        fn f(a: f32[N, 4], b: f32[N, 4], w: f32[4, 4]) -> f32[N, 4] {
            (a + b) @ w
        }
    }?;
    let mut p = Program::compile(g, Backend::Interpreter)?;

    let e = p.bind("W", Tensor::zeros(DType::F32, &[4, 4])).unwrap_err();
    assert_eq!(e.to_string(), "@f has no parameter `W` (it has: a, b, w)");

    let e = p.bind("w", Tensor::zeros(DType::F32, &[4, 5])).unwrap_err();
    assert_eq!(e.to_string(), "`w` is declared f32[4, 4] but the tensor is f32[4, 5]");

    let (a, b) = (Tensor::zeros(DType::F32, &[2, 4]), Tensor::zeros(DType::F32, &[3, 4]));
    let e = p.run(&[("a", &a), ("b", &b)], &[]).unwrap_err();
    assert!(matches!(e, Error::MissingInput { .. }));
    assert_eq!(e.to_string(), "parameter `w` of @f was not given: bind it with `Program::bind` or pass it to `run`");

    p.bind("w", Tensor::zeros(DType::F32, &[4, 4]))?;
    let e = p.run(&[("a", &a), ("b", &b)], &[]).unwrap_err();
    assert!(matches!(e, Error::SymbolConflict { .. }));
    assert_eq!(e.to_string(), "symbol `N` is 2 from axis 0 of `a` but 3 from axis 0 of `b`");

    let missing_paren = "func @g(%x: f32[4]) {\n  %y: f32[4] = exp(%x\n  return %y\n}\n";
    let e = Program::from_text(missing_paren, Backend::Interpreter).err().unwrap();
    assert!(matches!(e, Error::Parse(_)));
    assert_eq!(e.to_string(), "3:3: expected `,` or `)`, found `return`");

    let wrong_type = "func @g(%x: f32[4]) {\n  %y: f32[5] = exp(%x)\n  return %y\n}\n";
    let e = Program::from_text(wrong_type, Backend::Interpreter).err().unwrap();
    assert!(matches!(e, Error::Verify(_)));
    assert_eq!(e.to_string(), "in @g, n0 %y = `exp`(f32[4]): result %y is declared f32[5] but the op gives f32[4]");
    Ok(())
}
// ANCHOR_END: errors

// =============================================================================================
// Checks of the book itself.
//
// Generated, and regenerated by `SINTER_BLESS_BOOK=1`:
// - the op reference (`book/src/reference/ops.md`, from `OP_TABLE`) and the CLI reference
//   (`book/src/reference/cli.md`, from `sinter --help`);
// - the regions of chapters between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`:
//   the rule catalogue and the optimised layer of chapter 4, the launch plans and `ptxas -v`
//   reports of chapter 5, the layer's kernels of chapter 6;
// - the PTX of chapter 5 (`book/src/ptx/`); each excerpt marked `<!-- ptx: NAME -->` in the
//   chapter must be a run of its lines;
// - the figures of chapter 4 (`book/src/figures/`): the DOT files are what
//   `sinter explain smollm2-135m --dot` writes, cut to one decoder layer, and each SVG must have
//   been rendered from its DOT file (bless runs Graphviz's `dot -Tsvg`).

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// Fails unless `book/src/<chapter>` contains `text` verbatim.
fn assert_shows(chapter: &str, text: &str) {
    let page = read(&format!("book/src/{chapter}"));
    assert!(
        page.contains(text),
        "book/src/{chapter} does not show what the code gives; update the page so that it contains:\n{text}"
    );
}

fn bless() -> bool {
    std::env::var("SINTER_BLESS_BOOK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Compares a generated page with the file, or rewrites the file under `SINTER_BLESS_BOOK=1`.
fn check_generated(rel: &str, rendered: &str, from: &str) {
    let path = root().join(rel);
    if bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, rendered).unwrap();
        eprintln!("wrote {rel}");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != rendered {
        let (line, (have, want)) = current
            .lines()
            .chain(std::iter::repeat(""))
            .zip(rendered.lines().chain(std::iter::repeat("")))
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((0, ("", "")));
        panic!(
            "{rel} is out of date with {from}: regenerate it with \
             `SINTER_BLESS_BOOK=1 cargo test --test main book` and review the diff.\n\
             first difference at line {}:\n  page:      {have}\n  generated: {want}",
            line + 1
        );
    }
}

// --- the op reference ------------------------------------------------------------------------

fn class_title(c: sinter::ir::OpClass) -> &'static str {
    use sinter::ir::OpClass::*;
    match c {
        Unary => "Element-wise, one operand",
        Binary => "Element-wise, several operands",
        Compare => "Comparisons",
        Reduce => "Reductions",
        Layout => "Layout",
        Source => "Sources",
        Composite => "Composite ops",
        Collective => "Collectives (tensor parallelism)",
        Call => "Calls",
    }
}

fn default_text(a: &sinter::ir::ops::AttrSpec) -> String {
    use sinter::ir::ops::AttrDefault as D;
    match a.default {
        D::Required => "required".into(),
        D::Int(v) => format!("default `{v}`"),
        D::Float(v) => format!("default `{v:?}`"),
        D::Bool(v) => format!("default `{v}`"),
        D::Str(s) => format!("default `\"{s}\"`"),
        D::Empty => "default `[]`".into(),
        D::Absent => "optional".into(),
    }
}

/// How the DSL writes an op: operators, then method or function words with the operands and
/// attributes in positional order.
fn dsl_forms(info: &sinter::ir::OpInfo) -> Vec<String> {
    use sinter::ir::OpKind::*;
    let mut forms: Vec<String> = match info.kind {
        Neg => vec!["-x".into()],
        Add => vec!["a + b".into()],
        Sub => vec!["a - b".into()],
        Mul => vec!["a * b".into()],
        Div => vec!["a / b".into()],
        Matmul => vec!["a @ b".into()],
        Eq => vec!["a == b".into()],
        Ne => vec!["a != b".into()],
        Lt => vec!["a < b".into()],
        Le => vec!["a <= b".into()],
        Gt => vec!["a > b".into()],
        Ge => vec!["a >= b".into()],
        Concat => vec!["concat([a, b, …], axis)".into()],
        Call => vec!["f(args…)".into()],
        _ => vec![],
    };
    let operand = |o: &str| if let Some(n) = o.strip_suffix('?') { format!("[{n}]") } else { o.to_string() };
    for (word, op, attrs) in sinter::__vocab!() {
        if *op != format!("{:?}", info.kind) {
            continue;
        }
        let rest: Vec<String> = info.operands.iter().skip(1).map(|o| operand(o)).chain(attrs.iter().map(|a| a.to_string())).collect();
        forms.push(match info.operands.first() {
            Some(recv) => format!("{}.{word}({})", operand(recv), rest.join(", ")),
            None => format!("{word}({})", attrs.join(", ")),
        });
    }
    forms
}

fn render_op_reference() -> String {
    use sinter::ir::OP_TABLE;
    let mut s = String::new();
    s += "# Ops\n\n";
    s += "<!-- Generated from sinter::ir::OP_TABLE by tests/book.rs; do not edit. Regenerate with\n     SINTER_BLESS_BOOK=1 cargo test --test main book -->\n\n";
    s += "Every op of sinter's IR, generated from the op table (`sinter::ir::OP_TABLE` in `ir/src/ops.rs`),\n";
    s += "the one place where an op is defined: its text name, operands, attributes and semantics. The\n";
    s += "text format, the verifier, the builder and the DSL's vocabulary come from the same table.\n\n";
    s += "Notation: an operand written `name?` is optional (only trailing ones are); `name*` is a list.\n";
    s += "In the DSL, an op's attributes follow its tensor operands, positionally in the order below or\n";
    s += "by name (`eps = 1e-5`); an attribute with a default may be left out. The interpreter computes\n";
    s += "every op in f64 and rounds the result to its dtype.\n\n";
    s += "| op | class | operands | attributes |\n|---|---|---|---|\n";
    for row in OP_TABLE {
        let ops: Vec<String> = row.operands.iter().map(|o| format!("`{o}`")).collect();
        let attrs: Vec<String> = row.attrs.iter().map(|a| format!("`{}`", a.name)).collect();
        s += &format!(
            "| [`{n}`](#{n}) | {} | {} | {} |\n",
            format!("{:?}", row.class).to_lowercase(),
            if ops.is_empty() { "—".into() } else { ops.join(", ") },
            if attrs.is_empty() { "—".into() } else { attrs.join(", ") },
            n = row.name
        );
    }
    let mut classes = Vec::new();
    for row in OP_TABLE {
        if !classes.contains(&row.class) {
            classes.push(row.class);
        }
    }
    for class in classes {
        s += &format!("\n## {}\n", class_title(class));
        for row in OP_TABLE.iter().filter(|r| r.class == class) {
            s += &format!("\n### `{}`\n\n{}\n\n", row.name, row.doc);
            let ops: Vec<String> = row.operands.iter().map(|o| format!("`{o}`")).collect();
            s += &format!("- **Operands:** {}\n", if ops.is_empty() { "none".into() } else { ops.join(", ") });
            if row.attrs.is_empty() {
                s += "- **Attributes:** none\n";
            } else {
                s += "- **Attributes:**\n";
                for a in row.attrs {
                    s += &format!("  - `{}`: {}, {}\n", a.name, sinter::ir::ops::kind_text(a.kind), default_text(a));
                }
            }
            let forms: Vec<String> = dsl_forms(row).iter().map(|f| format!("`{f}`")).collect();
            if !forms.is_empty() {
                s += &format!("- **DSL:** {}\n", forms.join(", "));
            }
        }
    }
    s
}

#[test]
fn ch10_op_reference_is_generated_from_the_op_table() {
    check_generated("book/src/reference/ops.md", &render_op_reference(), "sinter::ir::OP_TABLE");
}

/// The op reference shows each op's DSL words from the DSL's vocabulary: every word must name
/// an op of the table and take that op's attributes in the table's order.
#[test]
fn ch10_dsl_words_name_ops_of_the_table() {
    use sinter::ir::OP_TABLE;
    for (word, op, attrs) in sinter::__vocab!() {
        let row = OP_TABLE.iter().find(|r| format!("{:?}", r.kind) == *op).unwrap_or_else(|| panic!("DSL word `{word}` builds `{op}`, which is not in OP_TABLE"));
        let table: Vec<&str> = row.attrs.iter().map(|a| a.name).collect();
        assert_eq!(*attrs, &table[..], "DSL word `{word}`: attributes differ from the op table's `{}`", row.name);
    }
}

/// The DSL refuses `f8e4m3` operands at expansion for exactly the ops the IR refuses them
/// (`sinter_ir::storage::accepts_fp8`), so a misuse is a compile error where the macro knows the
/// dtype and a build error, with the same rule, where it does not.
#[test]
fn ch10_dsl_fp8_words_agree_with_the_ir() {
    let dsl: &[&str] = sinter::__vocab_fp8!();
    for row in sinter::ir::OP_TABLE {
        let variant = format!("{:?}", row.kind);
        assert_eq!(dsl.contains(&variant.as_str()), sinter::ir::storage::accepts_fp8(row.kind), "`{}`: the DSL and the IR disagree on f8e4m3 operands", row.name);
    }
}

/// The variants of an enum, read from its source: the names at four spaces of indentation
/// between `pub enum NAME {` and the closing `}`.
fn enum_variants(file: &str, name: &str) -> Vec<String> {
    let text = read(file);
    let start = text.find(&format!("pub enum {name} {{")).unwrap_or_else(|| panic!("{file} has no `pub enum {name}`"));
    let mut out = Vec::new();
    for line in text[start..].lines().skip(1) {
        if line.starts_with('}') {
            break;
        }
        let Some(rest) = line.strip_prefix("    ") else { continue };
        let word: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if word.starts_with(|c: char| c.is_ascii_uppercase()) && rest[word.len()..].trim_start().starts_with(['{', '(', ',']) {
            out.push(word);
        }
    }
    out
}

/// The errors page lists every variant of the error enums it documents.
#[test]
fn ch10_errors_page_lists_every_variant() {
    let page = read("book/src/reference/errors.md");
    for (file, name) in [
        ("src/lib.rs", "Error"),
        ("ir/src/interp/mod.rs", "InterpError"),
        ("src/llm/gguf.rs", "ModelError"),
        ("runtime/src/error.rs", "RuntimeError"),
    ] {
        let variants = enum_variants(file, name);
        assert!(variants.len() >= 4, "{file}: found only {variants:?} in `{name}`");
        for v in variants {
            assert!(
                page.contains(&format!("`{v}`")) || page.contains(&format!("`{v}(")),
                "book/src/reference/errors.md does not list `{name}::{v}` ({file}): add a row for it"
            );
        }
    }
}

// --- generated regions of chapters ------------------------------------------------------------

/// Checks the region of `book/src/<chapter>` between the lines `<!-- generated: NAME -->` and
/// `<!-- end generated: NAME -->` against `body`, or rewrites it under `SINTER_BLESS_BOOK=1`.
fn check_region(chapter: &str, name: &str, body: &str) {
    let rel = format!("book/src/{chapter}");
    let page = read(&rel);
    let (open, close) = (format!("<!-- generated: {name} -->\n"), format!("<!-- end generated: {name} -->"));
    let start = page.find(&open).unwrap_or_else(|| panic!("{rel} has no `{}` line", open.trim())) + open.len();
    let end = start + page[start..].find(&close).unwrap_or_else(|| panic!("{rel} has no `{close}` line"));
    let current = &page[start..end];
    if current == body {
        return;
    }
    if bless() {
        std::fs::write(root().join(&rel), format!("{}{body}{}", &page[..start], &page[end..])).unwrap();
        eprintln!("rewrote region `{name}` of {rel}");
        return;
    }
    panic!("{rel}: region `{name}` is out of date: regenerate it with `SINTER_BLESS_BOOK=1 cargo test --test main book` and review the diff.\nIt should read:\n{body}");
}

// --- chapter 4's figures: `sinter explain --dot`, one decoder layer, rendered by Graphviz ------

/// The one digraph named `name` of a DOT text holding several (`--dot` writes every function
/// of the graph into the `-before.dot` file).
fn dot_digraph(text: &str, name: &str) -> String {
    let head = format!("digraph \"{name}\" {{\n");
    let start = text.find(&head).unwrap_or_else(|| panic!("no digraph \"{name}\" in the DOT file"));
    let end = start + text[start..].find("\n}\n").expect("an unterminated digraph") + 3;
    text[start..end].to_string()
}

/// `(node, attributes)` of a DOT statement line `  node [attributes];`, or `(from, to)` of an
/// edge line `  from -> to;`.
fn dot_node(line: &str) -> Option<(&str, &str)> {
    let (id, rest) = line.strip_prefix("  ")?.split_once(" [")?;
    (!id.contains(' ') && id != "node" && id != "edge").then_some((id, rest))
}

fn dot_edge(line: &str) -> Option<(&str, &str)> {
    line.strip_prefix("  ")?.strip_suffix(';')?.split_once(" -> ")
}

/// The kernels of one call (`layer#1`) of a `-after.dot` kernel graph, with the buffers they
/// read and write. A weight concatenation (a `layout` kernel doing `concat` of graph inputs
/// only, which runs once when the weights are bound) is drawn dashed and grey.
fn dot_one_call(text: &str, origin: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let tag = format!("\\n{origin} ");
    let kernels: Vec<&str> = lines.iter().filter_map(|l| dot_node(l)).filter(|(_, a)| a.contains(&tag)).map(|(id, _)| id).collect();
    let edges: Vec<(&str, &str)> = lines.iter().filter_map(|l| dot_edge(l)).filter(|(a, b)| kernels.contains(a) || kernels.contains(b)).collect();
    let is_input = |b: &str| lines.iter().filter_map(|l| dot_node(l)).any(|(id, a)| id == b && a.contains("fillcolor=palegreen"));
    let mut out: Vec<String> = lines.iter().take_while(|l| dot_node(l).is_none()).map(|l| l.to_string()).collect();
    for l in &lines {
        let Some((id, attrs)) = dot_node(l) else { continue };
        if kernels.contains(&id) {
            let load_time = attrs.contains("\\nconcat\\n") && edges.iter().filter(|(_, b)| *b == id).all(|(a, _)| is_input(a));
            out.push(if load_time { l.replace("style=filled, fillcolor=lightyellow", "style=\"filled,dashed\", fillcolor=gray92") } else { l.to_string() });
        } else if edges.iter().any(|(a, b)| *a == id || *b == id) {
            out.push(l.to_string());
        }
    }
    out.extend(edges.iter().map(|(a, b)| format!("  {a} -> {b};")));
    out.push("}".into());
    out.join("\n") + "\n"
}

/// The figures of chapter 4, `(file stem, DOT)`: SmolLM2's `layer` function before fusion and
/// the kernels of its second call after, for prefill and decode, from `sinter explain --dot`.
fn chapter4_figures() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("book-explain-dot");
    let _ = std::fs::remove_dir_all(&dir);
    let out = sinter_cmd(&["explain", "smollm2-135m", "--dot", dir.to_str().unwrap()]);
    assert!(out.status.success(), "sinter explain --dot failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut figs = Vec::new();
    for mode in ["prefill", "decode"] {
        let file = |when: &str| std::fs::read_to_string(dir.join(format!("smollm2-135m-{mode}-{when}.dot"))).unwrap();
        figs.push((format!("smollm2-layer-{mode}-before"), dot_digraph(&file("before"), "layer")));
        figs.push((format!("smollm2-layer-{mode}-after"), dot_one_call(&file("after"), "layer#1")));
    }
    figs
}

/// What an SVG that Graphviz made from `dot` must name: the graph, every node and every edge
/// (each has a `<title>` element).
fn dot_titles(dot: &str) -> std::collections::BTreeSet<String> {
    let mut t = std::collections::BTreeSet::new();
    for l in dot.lines() {
        if let Some(name) = l.strip_prefix("digraph ").and_then(|r| r.strip_suffix(" {")) {
            t.insert(name.trim_matches('"').to_string());
        } else if let Some((a, b)) = dot_edge(l) {
            t.insert(format!("{a}->{b}"));
        } else if let Some((id, _)) = dot_node(l) {
            t.insert(id.to_string());
        }
    }
    t
}

fn svg_titles(svg: &str) -> std::collections::BTreeSet<String> {
    svg.split("<title>").skip(1).filter_map(|s| s.split_once("</title>")).map(|(t, _)| t.replace("&#45;", "-").replace("&gt;", ">")).collect()
}

/// Chapter 4's figures are what `sinter explain smollm2-135m --dot` writes now: the DOT files
/// beside the SVGs must equal it, and each SVG must have been rendered from its DOT file (its
/// nodes and edges are the DOT's). `SINTER_BLESS_BOOK=1` rewrites the DOT files and renders
/// the SVGs with Graphviz's `dot -Tsvg` (which `scripts/setup` installs).
#[test]
fn ch4_figures_are_what_sinter_explain_dot_writes() {
    let figs = chapter4_figures();
    let page = read("book/src/fusion.md");
    for (stem, dot) in &figs {
        let dot_rel = format!("book/src/figures/{stem}.dot");
        let svg_rel = format!("book/src/figures/{stem}.svg");
        assert!(page.contains(&format!("figures/{stem}.svg")), "fusion.md does not show {svg_rel}");
        check_generated(&dot_rel, dot, "`sinter explain smollm2-135m --dot`");
        if bless() {
            let out = Command::new("dot").arg("-Tsvg").arg(root().join(&dot_rel)).arg("-o").arg(root().join(&svg_rel)).output();
            let out = out.unwrap_or_else(|e| panic!("cannot run Graphviz's `dot` (scripts/setup installs it): {e}"));
            assert!(out.status.success(), "dot -Tsvg {dot_rel}: {}", String::from_utf8_lossy(&out.stderr));
            eprintln!("wrote {svg_rel}");
        }
        let svg = read(&svg_rel);
        assert_eq!(svg_titles(&svg), dot_titles(dot), "{svg_rel} was not rendered from {dot_rel}: regenerate both with `SINTER_BLESS_BOOK=1 cargo test --test main book`");
    }
}

/// The figures the chapters quote from `bench/RESULTS.md` (which the book includes as its
/// Results page) are still there: `(chapter, as the chapter says it, as RESULTS.md says it)`.
#[test]
fn quoted_results_are_in_bench_results() {
    let results = read("bench/RESULTS.md");
    for (chapter, shown, source) in [
        ("kernels.md", "782.8 TFLOP/s, 1.13× cuBLAS", "Best of the autotuning timings at 8192³: 1404.6 µs = 782.8 TFLOP/s"),
        ("kernels.md", "(1.05× when\nevery thread copies", "**1.05×** (cuBLAS 685.8)"),
        ("kernels.md", "470 TFLOP/s, 0.77× cuDNN", "**470.4** | 0.77× cuDNN 613.1"),
        ("kernels.md", "1353.7 TFLOP/s, 1.05×, with", "**1.05×** cuBLAS fp8 `_scaled_mm` 1284.1"),
        ("kernels.md", "1400.9 TFLOP/s, 1.10× cuBLAS's", "| 0.7849 ms | **1400.9** | **1.10×**"),
        ("kernels.md", "for the online softmax (0.98×)", "0.98× the online kernel"),
        ("kernels.md", "(0.96× our\n  autotuned bf16 attention", "| 549.3 | **0.96×** (target ≥ 1.5× ❌)"),
        ("kernels.md", "0.64× cuDNN's KV bandwidth", "**0.64×** (was 0.49×)"),
    ] {
        assert_shows(chapter, shown);
        assert!(results.contains(source), "bench/RESULTS.md no longer says `{source}`: update what book/src/{chapter} quotes (`{shown}`)");
    }
}

#[path = "book_site.rs"]
mod site;
use site::{matches_with_gaps, sinter_cmd};

#[path = "book_own_model.rs"]
mod own_model;
