//! Sliding-window and soft-capped attention through the passes. Where the op's kernels do not
//! implement them (`sinter_ir::contract::window_softcap_kernels`), or the node is refused for
//! another reason (head dim 640), a user-written `attention` / `paged_attention` with `window`
//! or `softcap` is compiled as its decomposition (the one place a window is a dense mask);
//! where they do, it stays one kernel of its family with both attributes. Every compiled
//! graph, evaluated on the interpreter, equals the graph as written (DESIGN.md's bf16
//! tolerance), for windows of 1, shorter than the keys and longer than them.

mod common;

use sinter_ir::contract::window_softcap_kernels;
use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Attr, Bindings, DType, Dim, Family, FunctionBuilder, Graph, KernelGraph, OpKind, TensorType, Value};
use sinter_passes::check::compare;
use sinter_passes::{compile, FusionReport, PassOptions, Target};

fn bf16(shape: Vec<Dim>) -> TensorType {
    TensorType::new(DType::BF16, shape)
}

fn c(v: i64) -> Dim {
    Dim::constant(v)
}

fn compile_and_compare(g: &Graph, target: &Target, b: &Bindings, ins: &[Tensor]) -> (KernelGraph, FusionReport) {
    let (kg, report) = compile(g, target, &PassOptions::default()).unwrap_or_else(|e| panic!("{target}: {e}"));
    for (_, kd) in kg.kernels.iter() {
        sinter_ir::contract::check(kd, target).unwrap_or_else(|e| panic!("{target}: a kernel outside the contract: {e}"));
    }
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(g, "main", &refs, b).unwrap();
    let got = run_kernel_graph(&kg, &refs, b).unwrap();
    for (w, o) in want.iter().zip(&got) {
        compare(w, o, false).unwrap_or_else(|m| panic!("{target}: kernel graph vs reference: {m}\n{report}"));
    }
    (kg, report)
}

/// The node's kernel: one of its family with the window and softcap kept, or none (the
/// decomposition: matmuls and row reductions).
fn assert_lowering(kg: &KernelGraph, family: Family, kernel: bool, window: Option<i64>, softcap: Option<f64>, report: &FusionReport) {
    let node = kg.kernels.values().filter(|kd| kd.family == family).flat_map(|kd| kd.body.nodes.values()).find(|nd| matches!(nd.op.kind, OpKind::Attention | OpKind::PagedAttention));
    if kernel {
        let nd = node.unwrap_or_else(|| panic!("no {family:?} kernel\n{report}"));
        assert_eq!((nd.op.int("window"), nd.op.float("softcap")), (window, softcap), "{report}");
    } else {
        assert!(node.is_none(), "{report}");
        assert!(kg.kernels.values().any(|kd| kd.family == Family::Matmul), "{report}");
    }
}

fn extra(window: Option<i64>, softcap: Option<f64>) -> Vec<(&'static str, Attr)> {
    let mut v = vec![];
    if let Some(w) = window {
        v.push(("window", Attr::Int(w)));
    }
    if let Some(cap) = softcap {
        v.push(("softcap", Attr::Float(cap)));
    }
    v
}

/// `attention` GQA 8/2 `bshd`, causal with Sq ≤ Skv, head dim `d`, optionally a mask and lse.
fn attention_graph(d: i64, window: Option<i64>, softcap: Option<f64>, mask: bool, lse: bool) -> Graph {
    let mut g = Graph::new();
    let mut b = FunctionBuilder::new(&g, "main");
    let (t, s) = (Dim::symbol("T"), Dim::symbol("S"));
    let q = b.param("q", bf16(vec![c(2), t.clone(), c(8), c(d)]));
    let k = b.param("k", bf16(vec![c(2), s.clone(), c(2), c(d)]));
    let v = b.param("v", bf16(vec![c(2), s.clone(), c(2), c(d)]));
    let mut ins = vec![q, k, v];
    if mask {
        ins.push(b.param("mask", bf16(vec![t.clone(), s.clone()])));
    }
    let mut attrs = vec![
        ("scale", Attr::Float(0.3)),
        ("causal", Attr::Bool(true)),
        ("heads", Attr::Int(8)),
        ("kv_heads", Attr::Int(2)),
        ("layout", Attr::Str("bshd".into())),
        ("lse", Attr::Bool(lse)),
    ];
    attrs.extend(extra(window, softcap));
    let outs: Vec<Value> = b.op(OpKind::Attention, &ins, attrs).unwrap();
    let f = b.finish(&outs).unwrap();
    g.add_func(f);
    g
}

fn check_attention(d: i64, refused: bool) {
    let cases = [(Some(1), None, false, true), (Some(3), Some(2.0), true, false), (Some(100), None, false, false), (None, Some(1.5), false, true), (Some(7), Some(30.0), true, true)];
    for (window, softcap, mask, lse) in cases {
        let g = attention_graph(d, window, softcap, mask, lse);
        for target in [Target::SM_90A, Target::SM_80] {
            for (seed, (sq, skv)) in [(3i64, 40i64), (1, 1), (9, 9)].into_iter().enumerate() {
                let bind: Bindings = [("T".to_string(), sq), ("S".to_string(), skv)].into();
                let ins = common::inputs(g.entry().unwrap(), &bind, seed as u64, common::Variant::Random);
                let (kg, report) = compile_and_compare(&g, &target, &bind, &ins);
                let kernel = !refused && window_softcap_kernels(OpKind::Attention);
                assert_lowering(&kg, Family::Attention, kernel, window, softcap, &report);
            }
        }
    }
}

/// Head dim 640: refused for its head dim, so the window and softcap go through the
/// decomposition on every target whatever the kernels implement.
#[test]
fn refused_windowed_attention_compiles_to_its_decomposition() {
    check_attention(640, true);
}

/// Head dim 64: one attention kernel where the family implements window and softcap, else
/// the decomposition.
#[test]
fn windowed_attention_is_a_kernel_or_its_decomposition() {
    check_attention(64, false);
}

fn paged_graph(d: i64, window: Option<i64>, softcap: Option<f64>) -> Graph {
    let mut g = Graph::new();
    let mut b = FunctionBuilder::new(&g, "main");
    let q = b.param("q", bf16(vec![c(2), c(4), c(3), c(d)]));
    let kp = b.param("k_pages", bf16(vec![c(6), c(4), c(2), c(d)]));
    let vp = b.param("v_pages", bf16(vec![c(6), c(4), c(2), c(d)]));
    let bt = b.param("block_table", TensorType::new(DType::I32, vec![c(2), c(3)]));
    let sl = b.param("seq_lens", TensorType::new(DType::I32, vec![c(2)]));
    let mut attrs = vec![("scale", Attr::Float(0.3)), ("heads", Attr::Int(4)), ("kv_heads", Attr::Int(2)), ("lse", Attr::Bool(true))];
    attrs.extend(extra(window, softcap));
    let outs = b.op(OpKind::PagedAttention, &[q, kp, vp, bt, sl], attrs).unwrap();
    let f = b.finish(&outs).unwrap();
    g.add_func(f);
    g
}

/// `paged_attention` with a window and softcap, head dim 640 (always the decomposition) and 64
/// (a kernel where the family implements them): sequences of 9 and 4 keys, 3 queries each.
#[test]
fn windowed_paged_attention_is_a_kernel_or_its_decomposition() {
    for d in [640, 64] {
        for (window, softcap) in [(Some(1), None), (Some(5), Some(2.0)), (Some(64), None), (None, Some(0.5))] {
            let g = paged_graph(d, window, softcap);
            let bind = Bindings::new();
            let mut ins = common::inputs(g.entry().unwrap(), &bind, 5, common::Variant::Random);
            ins[3] = Tensor::new(DType::I32, &[2, 3], vec![5.0, 0.0, 3.0, 1.0, 4.0, 2.0]).unwrap();
            ins[4] = Tensor::new(DType::I32, &[2], vec![9.0, 4.0]).unwrap();
            for target in [Target::SM_90A, Target::SM_80] {
                let (kg, report) = compile_and_compare(&g, &target, &bind, &ins);
                let kernel = d == 64 && window_softcap_kernels(OpKind::PagedAttention);
                assert_lowering(&kg, Family::PagedAttention, kernel, window, softcap, &report);
            }
        }
    }
}
