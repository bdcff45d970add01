//! The whole pipeline on random graphs: a property test builds graphs from the op set (with
//! decomposed SiLU, softmax, RMSNorm, LayerNorm, log_softmax and SwiGLU planted among plain
//! element-wise, reduction, layout and matmul ops), compiles them to a `KernelGraph`, and
//! checks `run_kernel_graph` against `interp::run` of the original within f32 tolerance;
//! `lower_unfused` likewise. 32 cases.

mod common;

use proptest::prelude::*;
use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Attr, DType, Dim, FunctionBuilder, Graph, OpKind, TensorType, Value};
use sinter_passes::check::compare;
use sinter_passes::{compile, lower_unfused, PassOptions, Target};

fn build(rows: i64, cols: i64, prog: &[(u8, u8, u8)]) -> Graph {
    let mut g = Graph::new();
    let mut b = FunctionBuilder::new(&g, "main");
    let t = |s: Vec<Dim>| TensorType::new(DType::F32, s);
    let (r, c) = (Dim::symbol("R"), Dim::constant(cols));
    let x = b.param("x", t(vec![r.clone(), c.clone()]));
    let y = b.param("y", t(vec![r.clone(), c.clone()]));
    let w = b.param("w", t(vec![c.clone(), c.clone()]));
    let w2 = b.param("w2", t(vec![c.clone(), c.clone()]));
    let gam = b.param("gamma", t(vec![c.clone()]));
    let bet = b.param("beta", t(vec![c.clone()]));
    let _ = rows;
    let mut pool: Vec<Value> = vec![x, y];
    let k = |v: f64| vec![("value", Attr::Float(v)), ("dtype", Attr::DType(DType::F32))];
    for &(op, a, bb) in prog {
        let a = pool[a as usize % pool.len()];
        let bv = pool[bb as usize % pool.len()];
        let u = |b: &mut FunctionBuilder, kind: OpKind, v: Value| b.op1(kind, &[v], vec![]).unwrap();
        let bin = |b: &mut FunctionBuilder, kind: OpKind, p: Value, q: Value| b.op1(kind, &[p, q], vec![]).unwrap();
        let v = match op % 14 {
            0 => u(&mut b, OpKind::Tanh, a),
            1 => bin(&mut b, OpKind::Add, a, bv),
            2 => bin(&mut b, OpKind::Mul, a, bv),
            3 => {
                let s = u(&mut b, OpKind::Sigmoid, a);
                bin(&mut b, OpKind::Mul, a, s)
            }
            4 => b.op1(OpKind::Matmul, &[a, w], vec![]).unwrap(),
            5 => {
                // x·W and x·W2ᵀ: parallel matmuls sharing an input.
                let m1 = b.op1(OpKind::Matmul, &[a, w], vec![]).unwrap();
                let m2 = b.op1(OpKind::Matmul, &[a, w2], vec![]).unwrap();
                let s = u(&mut b, OpKind::Silu, m1);
                bin(&mut b, OpKind::Mul, s, m2)
            }
            6 => {
                let m = b.op1(OpKind::ReduceMax, &[a], vec![]).unwrap();
                let d = bin(&mut b, OpKind::Sub, a, m);
                let e = u(&mut b, OpKind::Exp, d);
                let s = b.op1(OpKind::ReduceSum, &[e], vec![]).unwrap();
                bin(&mut b, OpKind::Div, e, s)
            }
            7 => {
                let sq = bin(&mut b, OpKind::Mul, a, a);
                let ms = b.op1(OpKind::ReduceMean, &[sq], vec![]).unwrap();
                let eps = b.op1(OpKind::Constant, &[], k(1e-5)).unwrap();
                let v = bin(&mut b, OpKind::Add, ms, eps);
                let rs = u(&mut b, OpKind::Rsqrt, v);
                let n = bin(&mut b, OpKind::Mul, a, rs);
                bin(&mut b, OpKind::Mul, n, gam)
            }
            8 => {
                let mu = b.op1(OpKind::ReduceMean, &[a], vec![]).unwrap();
                let xc = bin(&mut b, OpKind::Sub, a, mu);
                let sq = bin(&mut b, OpKind::Mul, xc, xc);
                let var = b.op1(OpKind::ReduceMean, &[sq], vec![]).unwrap();
                let eps = b.op1(OpKind::Constant, &[], k(1e-5)).unwrap();
                let v = bin(&mut b, OpKind::Add, var, eps);
                let rs = u(&mut b, OpKind::Rsqrt, v);
                let n = bin(&mut b, OpKind::Mul, xc, rs);
                let h = bin(&mut b, OpKind::Mul, n, gam);
                bin(&mut b, OpKind::Add, h, bet)
            }
            9 => {
                let t1 = b.op1(OpKind::Transpose, &[a], vec![]).unwrap();
                let t2 = b.op1(OpKind::Transpose, &[t1], vec![]).unwrap();
                let r1 = b.op1(OpKind::Reshape, &[t2], vec![("shape", Attr::Dims(vec![r.mul(&c)]))]).unwrap();
                b.op1(OpKind::Reshape, &[r1], vec![("shape", Attr::Dims(vec![r.clone(), c.clone()]))]).unwrap()
            }
            10 => {
                let one = b.op1(OpKind::Constant, &[], k(1.0)).unwrap();
                let zero = b.op1(OpKind::Constant, &[], k(0.0)).unwrap();
                let m = bin(&mut b, OpKind::Mul, one, a);
                bin(&mut b, OpKind::Add, m, zero)
            }
            11 => {
                let m = b.op1(OpKind::ReduceMax, &[a], vec![]).unwrap();
                let d = bin(&mut b, OpKind::Sub, a, m);
                let e = u(&mut b, OpKind::Exp, d);
                let s = b.op1(OpKind::ReduceSum, &[e], vec![]).unwrap();
                let l = u(&mut b, OpKind::Log, s);
                bin(&mut b, OpKind::Sub, d, l)
            }
            12 => b.op1(OpKind::Softmax, &[a], vec![("axis", Attr::Int(0))]).unwrap(),
            _ => {
                let s = b.op1(OpKind::ReduceSum, &[a], vec![("axis", Attr::Int(0))]).unwrap();
                bin(&mut b, OpKind::Maximum, a, s)
            }
        };
        pool.push(v);
    }
    let outs: Vec<Value> = pool.iter().rev().take(2).copied().collect();
    let f = b.finish(&outs).unwrap();
    g.add_func(f);
    g
}

fn run_case(rows: i64, cols: i64, prog: &[(u8, u8, u8)], seed: u64) -> Result<(), String> {
    let g = build(rows, cols, prog);
    sinter_ir::verify(&g).map_err(|e| e.to_string())?;
    let f = g.entry().unwrap();
    let b: sinter_ir::Bindings = [("R".to_string(), rows)].into();
    let ins = common::inputs(f, &b, seed, common::Variant::Random);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, "main", &refs, &Default::default()).map_err(|e| e.to_string())?;
    let (kg, report) = compile(&g, &Target::SM_90A, &PassOptions::default()).map_err(|e| e.to_string())?;
    let got = run_kernel_graph(&kg, &refs, &Default::default()).map_err(|e| format!("{e}\n{report}"))?;
    for (w, o) in want.iter().zip(&got) {
        compare(w, o, false).map_err(|m| format!("fused: {m}\n{}\n{report}", sinter_ir::print(&g)))?;
    }
    let unfused = lower_unfused(&g).map_err(|e| e.to_string())?;
    let got = run_kernel_graph(&unfused, &refs, &Default::default()).map_err(|e| e.to_string())?;
    for (w, o) in want.iter().zip(&got) {
        compare(w, o, false).map_err(|m| format!("unfused: {m}"))?;
        assert_eq!(w, o, "one kernel per node is the same computation");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn compiled_random_graphs_match_the_reference(
        rows in 1i64..4,
        cols in prop::sample::select(vec![2i64, 4, 8]),
        prog in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..8),
        seed in any::<u64>(),
    ) {
        let r = run_case(rows, cols, &prog, seed);
        prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
    }
}
