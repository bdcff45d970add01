//! The facade's two backends on the same graphs: `Program::compile(g, Backend::Gpu(device))`
//! bound and run exactly as on `Backend::Interpreter`, the outputs compared element-wise
//! under DESIGN.md's rule ([`super::check`]), and bad inputs refused with the same errors.

use sinter::{graph, Backend, DType, Lowering, Program, Tensor};

use super::{check, device};
use crate::zoo::Rng;

/// A graph, its weights (bound) and the symbol values to run it at (its inputs random).
struct FacadeCase {
    name: &'static str,
    graph: sinter::Graph,
    weights: Vec<&'static str>,
    sizes: Vec<usize>,
}

fn cases() -> Vec<FacadeCase> {
    vec![
        FacadeCase { name: "rms_norm and silu·x (f32)", graph: crate::facade::two_kernel_graph(), weights: vec!["w"], sizes: vec![3, 37] },
        FacadeCase {
            name: "SwiGLU MLP (bf16)",
            graph: graph! {
                fn mlp(x: bf16[T, 64], w_gate: bf16[64, 128], w_up: bf16[64, 128], w_down: bf16[128, 64]) -> bf16[T, 64] {
                    ((x @ w_gate).silu() * (x @ w_up)) @ w_down
                }
            }
            .unwrap(),
            weights: vec!["w_gate", "w_up", "w_down"],
            sizes: vec![1, 5, 130],
        },
        FacadeCase {
            name: "softmax through f32 (bf16), an unused parameter",
            graph: graph! {
                fn main(x: bf16[T, 200], _unused: f32[3]) -> bf16[T, 200] {
                    x.cast(f32).softmax(-1).cast(bf16)
                }
            }
            .unwrap(),
            weights: vec!["_unused"],
            sizes: vec![2, 64],
        },
    ]
}

/// The graphs whose kernels `precompile_gpu_test_kernels` caches for these tests.
#[cfg(feature = "llvm")]
pub(super) fn precompile_graphs() -> Vec<sinter::Graph> {
    let mut out: Vec<sinter::Graph> = cases().into_iter().map(|c| c.graph).collect();
    out.push(crate::facade::bad_input_graph());
    out
}

/// A random tensor of `ty` with every symbol `T` (the only one these graphs have) at `t`.
fn random(ty: &sinter::TensorType, t: usize, rng: &mut Rng) -> Tensor {
    let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().map_or(t, |c| c as usize)).collect();
    let n: usize = shape.iter().product();
    let s = 1.0 / (*shape.last().unwrap_or(&1) as f64).sqrt();
    Tensor::new(ty.dtype, &shape, (0..n).map(|_| 2.0 * s * rng.next_f64()).collect()).unwrap()
}

#[test]
fn gpu_facade_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let mut fails = Vec::new();
    for (i, c) in cases().into_iter().enumerate() {
        let f = c.graph.entry().unwrap().clone();
        let mut rng = Rng::new(100 + i as u64);
        let mut interp = Program::compile(c.graph.clone(), Backend::Interpreter).unwrap();
        let mut gpus: Vec<(Lowering, Program)> = Vec::new();
        for lowering in [Lowering::Fused, Lowering::Unfused] {
            match Program::compile_with(c.graph.clone(), Backend::Gpu(dev.clone()), lowering) {
                Ok(p) => gpus.push((lowering, p)),
                Err(e) => fails.push(format!("{} [{lowering:?}]: compile: {e}", c.name)),
            }
        }
        for &w in &c.weights {
            let t = random(f.ty(f.param_named(w).unwrap()), 1, &mut rng);
            interp.bind(w, t.clone()).unwrap();
            for (_, p) in &mut gpus {
                p.bind(w, t.clone()).unwrap();
                assert!(p.is_bound(w));
            }
        }
        for &t in &c.sizes {
            let inputs: Vec<(String, Tensor)> = f
                .params
                .iter()
                .filter_map(|&p| f.values[p].name.clone())
                .filter(|n| !c.weights.contains(&n.as_str()))
                .map(|n| {
                    let x = random(f.ty(f.param_named(&n).unwrap()), t, &mut rng);
                    (n, x)
                })
                .collect();
            let named: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, x)| (n.as_str(), x)).collect();
            let want = interp.run(&named, &[]).unwrap();
            for (lowering, p) in &gpus {
                match p.run(&named, &[]) {
                    Ok(got) => {
                        assert_eq!(got.len(), want.len());
                        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(g.dtype(), w.dtype());
                            if let Err(e) = check(&format!("{} [{lowering:?}] T={t} output {j}", c.name), g, w, 1.0) {
                                fails.push(e);
                            }
                        }
                    }
                    Err(e) => fails.push(format!("{} [{lowering:?}] T={t}: {e}", c.name)),
                }
            }
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// Every bad input of `tests/facade.rs`'s check is the same error on the GPU as on the
/// interpreter, and nothing reaches the device for it.
#[test]
fn gpu_facade_bad_inputs_are_the_interpreters_errors() {
    let Some(dev) = device() else { return };
    let on = |backend: Backend| -> Vec<String> {
        let mut p = Program::compile(crate::facade::bad_input_graph(), backend).unwrap();
        let mut errs = Vec::new();
        errs.push(p.bind("w", Tensor::full(DType::BF16, &[2, 4], 1.0)).unwrap_err().to_string());
        errs.push(p.bind("w", Tensor::full(DType::F32, &[2, 5], 1.0)).unwrap_err().to_string());
        errs.push(p.bind("nope", Tensor::full(DType::F32, &[2], 1.0)).unwrap_err().to_string());
        p.bind("w", Tensor::full(DType::F32, &[2, 4], 1.0)).unwrap();
        let (x2, x3) = (Tensor::full(DType::F32, &[2, 4], 3.0), Tensor::full(DType::F32, &[3, 4], 1.0));
        let (pair4, pair5) = (Tensor::full(DType::F32, &[4], 1.0), Tensor::full(DType::F32, &[5], 1.0));
        errs.push(p.run(&[("x", &x3), ("pair", &pair4)], &[]).unwrap_err().to_string());
        errs.push(p.run(&[("x", &x2), ("pair", &pair5)], &[]).unwrap_err().to_string());
        errs.push(p.run(&[("x", &x2), ("pair", &pair4)], &[("N", 3)]).unwrap_err().to_string());
        errs.push(p.run(&[("x", &x2)], &[]).unwrap_err().to_string());
        errs.push(p.run(&[("x", &Tensor::full(DType::I32, &[2, 4], 1.0)), ("pair", &pair4)], &[]).unwrap_err().to_string());
        let out = p.run(&[("x", &x2), ("pair", &pair4)], &[]).unwrap();
        errs.push(format!("{:?} {:?}", out[0].data(), out[1].data()));
        errs
    };
    let interp = on(Backend::Interpreter);
    let gpu = on(Backend::Gpu(dev));
    assert_eq!(gpu, interp);
}

/// Without a GPU: every case's kernels are generated for sm_90a (what the GPU test loads) and
/// every case runs on the interpreter through the facade.
#[cfg(feature = "llvm")]
#[test]
fn facade_cases_compile_to_ptx_and_run_on_the_interpreter() {
    for c in cases() {
        let compiled = sinter::compile_ptx(&c.graph, &sinter::Target::SM_90A).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert!(!compiled.kernels.is_empty(), "{}", c.name);
        let f = c.graph.entry().unwrap().clone();
        let mut p = Program::compile(c.graph.clone(), Backend::Interpreter).unwrap();
        let mut rng = Rng::new(7);
        let mut inputs = Vec::new();
        for &q in &f.params {
            let n = f.values[q].name.clone().unwrap();
            let t = random(f.ty(q), c.sizes[0], &mut rng);
            if c.weights.contains(&n.as_str()) {
                p.bind(&n, t).unwrap();
            } else {
                inputs.push((n, t));
            }
        }
        let named: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, x)| (n.as_str(), x)).collect();
        p.run(&named, &[]).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    }
}
