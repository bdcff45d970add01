//! File tests of the passes, in the manner of Cranelift's: every `tests/filetests/*.sir` holds
//! a decomposed spelling of something the passes must find, with header lines saying what:
//!
//! - `// expect: op …` — ops the optimised function must hold;
//! - `// absent: op …` — ops it must not hold;
//! - `// count: op=n` — exactly n nodes of that op;
//! - `// kernels: n` — the compiled kernel graph launches n kernels per step (load-time
//!   kernels, which run once when the weights are bound, are not counted);
//! - `// load-time: n` — of which exactly n more run at load time;
//! - `// weights: %w …` — the parameters that are weights (`PassOptions::weights`); without
//!   it the passes guess them (`sinter_passes::hoist::infer_weights`).
//!
//! For each file the test saturates the function, checks every e-node of the e-graph against
//! its class on the interpreter (random, large, −inf-row and NaN inputs, and length-1 axes),
//! compiles it and runs the kernel graph against the reference, and snapshots the IR after
//! each phase and the fusion report (`tests/snapshots/filetests__filetests@<name>.sir.snap`;
//! review with `cargo insta review`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{inputs, load, sizes, Variant};
use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Bindings, Function, Signature};
use sinter_passes::check::{check_egraph, compare};
use sinter_passes::optimise::{saturate, Phase};
use sinter_passes::{compile, PassOptions, Target};

fn header<'a>(src: &'a str, key: &str) -> Vec<&'a str> {
    src.lines().filter_map(|l| l.strip_prefix(&format!("// {key}: "))).flat_map(|l| l.split_whitespace()).collect()
}

fn count(f: &Function, op: &str) -> usize {
    f.nodes.values().filter(|n| n.op.kind.name() == op).count()
}

fn run_file(path: &Path, src: &str) -> String {
    let name = path.file_name().and_then(|s| s.to_str()).unwrap_or("?").to_string();
    let g = load(path, src);
    let f = g.entry().expect("a function").clone();
    let sigs: BTreeMap<String, Signature> = g.funcs.values().map(|f| (f.name.clone(), f.signature())).collect();
    let weights = header(src, "weights");
    let weights = (!weights.is_empty()).then(|| weights.iter().map(|w| w.trim_start_matches('%').to_string()).collect());
    let opts = PassOptions { snapshots: true, weights, ..PassOptions::default() };
    let sat = saturate(&f, &sigs, &opts, &Phase::ALL, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));

    // Consistency: every e-node against its class, on several kinds of inputs.
    let cases = [(3, Variant::Random, 1u64), (3, Variant::Random, 2), (1, Variant::Random, 3), (3, Variant::Large, 4), (3, Variant::NegInfRow, 5), (3, Variant::Nan, 6)];
    for (size, variant, seed) in cases {
        let b = sizes(&f, size);
        let ins = inputs(&f, &b, seed, variant);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let stats = check_egraph(&sat.egraph, &sat.original, &refs, &b, Some(&g)).unwrap_or_else(|m| {
            panic!("{name}: {variant:?} size {size}: {}", m.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("\n"))
        });
        assert_eq!(stats.evaluated, stats.total - 1, "{name}: every e-node but the root evaluated");
    }

    // Expectations on the optimised function.
    let (_, last) = sat.snapshots.last().expect("a snapshot");
    for op in header(src, "expect") {
        assert!(count(last, op) > 0, "{name}: expected `{op}` in\n{}", sinter_ir::text::print_function(last));
    }
    for op in header(src, "absent") {
        assert_eq!(count(last, op), 0, "{name}: `{op}` should be gone from\n{}", sinter_ir::text::print_function(last));
    }
    for c in header(src, "count") {
        let (op, n) = c.split_once('=').expect("op=n");
        assert_eq!(count(last, op), n.parse::<usize>().unwrap(), "{name}: count of `{op}` in\n{}", sinter_ir::text::print_function(last));
    }

    // The whole pipeline against the reference.
    let (kg, report) = compile(&g, &Target::SM_90A, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    for n in header(src, "kernels") {
        assert_eq!(report.kernels_after(), n.parse::<usize>().unwrap(), "{name}: kernels\n{report}");
    }
    for n in header(src, "load-time") {
        assert_eq!(report.kernels.iter().filter(|k| k.load_time).count(), n.parse::<usize>().unwrap(), "{name}: load-time kernels\n{report}");
    }
    let b = sizes(&f, 3);
    let ins = inputs(&f, &b, 7, Variant::Random);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, &f.name, &refs, &Bindings::new()).unwrap();
    let got = run_kernel_graph(&kg, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (w, o) in want.iter().zip(&got) {
        compare(w, o, false).unwrap_or_else(|m| panic!("{name}: kernel graph vs reference: {m}"));
    }

    let mut text = String::new();
    text.push_str("== input\n");
    text.push_str(&sinter_ir::text::print_function(&f));
    for (phase, func) in &sat.snapshots {
        text.push_str(&format!("== after {phase}\n"));
        text.push_str(&sinter_ir::text::print_function(func));
    }
    text.push_str("== fusion report\n");
    text.push_str(&report.to_string());
    text
}

#[test]
fn filetests() {
    insta::glob!("filetests/*.sir", |path| {
        let src = std::fs::read_to_string(path).expect("read");
        insta::assert_snapshot!(run_file(path, &src));
    });
}
