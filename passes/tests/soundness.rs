//! Soundness of the rewrite rules.
//!
//! Every rule fires somewhere in the file-test corpus (`every_rule_fires_in_the_corpus`), and
//! on that corpus every e-node of every saturated e-graph evaluates to its class's value on
//! random inputs of random sizes (the property test; the file tests add large, −inf-row, NaN
//! and length-1 inputs). A deliberately wrong rule is caught by that check, and a rule that
//! unifies differently typed values is refused by the analysis with a located error.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{corpus, inputs, load, sizes, Variant};
use egg::Id;
use proptest::prelude::*;
use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, OpKind, Signature};
use sinter_passes::check::check_egraph;
use sinter_passes::lang::SirEGraph;
use sinter_passes::optimise::{saturate, Phase};
use sinter_passes::rules::{self, catalogue, comm_args, mk, unary_args};
use sinter_passes::{PassError, PassOptions};

fn sigs(g: &sinter_ir::Graph) -> BTreeMap<String, Signature> {
    g.funcs.values().map(|f| (f.name.clone(), f.signature())).collect()
}

#[test]
fn every_rule_fires_in_the_corpus() {
    let mut fired = BTreeSet::new();
    for (path, src) in corpus() {
        let g = load(&path, &src);
        let f = g.entry().unwrap();
        let sat = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[]).unwrap();
        for p in &sat.phases {
            fired.extend(p.rules_fired.keys().cloned());
        }
    }
    let all: BTreeSet<String> = catalogue().iter().map(|r| r.name.to_string()).collect();
    let never: Vec<&String> = all.difference(&fired).collect();
    assert!(never.is_empty(), "rules that never fire in the corpus (so are never checked): {never:?}");
    assert!(all.len() >= 30, "{} rules", all.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// After saturation, every e-node of every e-class of a corpus file evaluates to its
    /// class's value (random file, random seed, random symbol size 1..=5).
    #[test]
    fn every_enode_evaluates_to_its_class(file in 0usize..64, seed in any::<u64>(), size in 1i64..=5) {
        let files = corpus();
        let (path, src) = &files[file % files.len()];
        let g = load(path, src);
        let f = g.entry().unwrap();
        let sat = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[]).unwrap();
        let b = sizes(f, size);
        let ins = inputs(f, &b, seed, Variant::Random);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let r = check_egraph(&sat.egraph, &sat.original, &refs, &b, Some(&g));
        prop_assert!(r.is_ok(), "{}: {:?}", path.display(), r.err());
    }
}

/// A buggy SiLU rule: `a·sigmoid(b) → silu(a)` without checking that `a` and `b` are the same.
fn wrong_silu(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (a, s) in comm_args(eg, id, OpKind::Mul) {
        if !unary_args(eg, s, OpKind::Sigmoid).is_empty() {
            plans.push(a);
        }
    }
    plans.into_iter().filter_map(|a| mk(eg, OpKind::Silu, vec![], &[a]).map(|n| (id, n))).collect()
}

#[test]
fn a_wrong_rule_is_caught_by_the_consistency_check() {
    let g = sinter_ir::parse(
        "func @f(%x: f32[T, 8], %y: f32[T, 8]) {
  %s: f32[T, 8] = sigmoid(%y)
  %o: f32[T, 8] = mul(%x, %s)
  return %o
}",
    )
    .unwrap();
    let f = g.entry().unwrap();
    let wrong = rules::rule("wrong-silu", &[OpKind::Mul], wrong_silu).unwrap();
    let sat = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[wrong]).unwrap();
    assert!(sat.phases.iter().any(|p| p.rules_fired.contains_key("wrong-silu")));
    let b = sizes(f, 3);
    let ins = inputs(f, &b, 1, Variant::Random);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let mismatches = check_egraph(&sat.egraph, &sat.original, &refs, &b, None).expect_err("the wrong rule must be caught");
    assert!(mismatches.iter().any(|m| m.node.starts_with("silu")), "{mismatches:?}");
    // Without the wrong rule the same graph checks clean.
    let sat = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[]).unwrap();
    check_egraph(&sat.egraph, &sat.original, &refs, &b, None).unwrap();
}

/// A buggy rotary rule: `x·c + rotate_half(x)·s → rotary(x, s, c)`, the tables swapped.
fn wrong_rotary(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (xc, rs) in comm_args(eg, id, OpKind::Add) {
        for (x, c) in comm_args(eg, xc, OpKind::Mul) {
            for (rot, s) in comm_args(eg, rs, OpKind::Mul) {
                if !rules::nodes(eg, rot, OpKind::Concat).is_empty() {
                    plans.push((x, c, s));
                }
            }
        }
    }
    plans.into_iter().filter_map(|(x, c, s)| mk(eg, OpKind::Rotary, vec![], &[x, s, c]).map(|n| (id, n))).collect()
}

/// Rotation by caller-supplied tables: the right rule checks clean on random tables, a rule
/// that swaps the tables is caught.
#[test]
fn a_wrong_rotary_rule_is_caught_by_the_consistency_check() {
    let g = sinter_ir::parse(
        "func @f(%x: f32[T, 2, 8], %cos: f32[T, 1, 8], %sin: f32[T, 1, 8]) {
  %x1: f32[T, 2, 4] = slice(%x) {axis=-1, start=0, end=4}
  %x2: f32[T, 2, 4] = slice(%x) {axis=-1, start=4, end=8}
  %n: f32[T, 2, 4] = neg(%x2)
  %r: f32[T, 2, 8] = concat(%n, %x1) {axis=-1}
  %a: f32[T, 2, 8] = mul(%x, %cos)
  %b: f32[T, 2, 8] = mul(%r, %sin)
  %y: f32[T, 2, 8] = add(%a, %b)
  return %y
}",
    )
    .unwrap();
    let f = g.entry().unwrap();
    let b = sizes(f, 3);
    let ins = inputs(f, &b, 2, Variant::Random);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let sat = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[]).unwrap();
    assert!(sat.phases.iter().any(|p| p.rules_fired.contains_key("rotary-rotate-half")));
    check_egraph(&sat.egraph, &sat.original, &refs, &b, None).unwrap();
    let wrong = rules::rule("wrong-rotary", &[OpKind::Add], wrong_rotary).unwrap();
    let sat = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[wrong]).unwrap();
    let mismatches = check_egraph(&sat.egraph, &sat.original, &refs, &b, None).expect_err("the wrong rule must be caught");
    assert!(mismatches.iter().any(|m| m.node.starts_with("rotary")), "{mismatches:?}");
}

/// A rule that changes a type: `reduce_sum(x, keepdim=true) → reduce_sum(x, keepdim=false)`.
fn wrong_keepdim(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let xs: Vec<(i64, Id)> = rules::nodes(eg, id, OpKind::ReduceSum)
        .into_iter()
        .filter(|(op, _)| op.bool("keepdim") == Some(true))
        .map(|(op, ch)| (op.int("axis").unwrap_or(-1), ch[0]))
        .collect();
    // Built without the shape check of `rules::add`, as a careless rule would.
    xs.into_iter()
        .filter_map(|(axis, x)| {
            let op = sinter_ir::Op::new(OpKind::ReduceSum, vec![("axis".into(), Attr::Int(axis)), ("keepdim".into(), Attr::Bool(false))]).ok()?;
            Some((id, eg.add(sinter_passes::lang::Sir::Op(sinter_passes::lang::OpSym::new(op), vec![x]))))
        })
        .collect()
}

#[test]
fn an_ill_typed_rule_is_refused_with_its_location() {
    let g = sinter_ir::parse(
        "func @f(%x: f32[T, 8]) {
  %s: f32[T, 1] = reduce_sum(%x)
  return %s
}",
    )
    .unwrap();
    let f = g.entry().unwrap();
    let wrong = rules::rule("wrong-keepdim", &[OpKind::ReduceSum], wrong_keepdim).unwrap();
    let err = saturate(f, &sigs(&g), &PassOptions::default(), &Phase::ALL, &[wrong]).err().expect("refused");
    match &err {
        PassError::Unsound { func, conflict, .. } => {
            assert_eq!(func, "f");
            assert!(conflict.contains("wrong-keepdim") && conflict.contains("f32[T, 1]") && conflict.contains("f32[T]"), "{conflict}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("unsound rewrite refused"), "{err}");
}
