//! Load-time folding on the GPU (skipped without one): a graph whose weights feed work that
//! depends on them alone — an RMSNorm weight stored as `w − 1` (`1 + g`), a weight transposed
//! and scaled before a projection, a cosine table built from `iota` and gathered by position —
//! compiled through the facade for the GPU. Binding the last weight folds exactly the kernels
//! the fusion report marks load-time (they leave the program); the outputs then equal the
//! interpreter's. A run given one of those weights takes the program as compiled, rebinding
//! one folds again from the new value, and a CUDA graph captured after folding replays the
//! same outputs.

use sinter::{Backend, Bindings, DType, Program, Tensor};

use super::{check, device};
use crate::zoo::Rng;

/// The graph: `(rms_norm(x)·(1 + g)) @ (transpose(w)·s) · cos_table[pos]`, f32.
pub(crate) fn hoist_graph() -> sinter::Graph {
    sinter::ir::parse(
        "func @main(%x: f32[T, 32], %pos: i32[T], %g: f32[32], %w: f32[16, 32], %s: f32[16]) {
  %one: f32[] = constant() {value=1.0, dtype=f32}
  %g1: f32[32] = add(%g, %one)
  %sq: f32[T, 32] = mul(%x, %x)
  %ms: f32[T, 1] = reduce_mean(%sq)
  %eps: f32[] = constant() {value=1e-6, dtype=f32}
  %v: f32[T, 1] = add(%ms, %eps)
  %r: f32[T, 1] = rsqrt(%v)
  %n: f32[T, 32] = mul(%x, %r)
  %h: f32[T, 32] = mul(%n, %g1)
  %wt: f32[32, 16] = transpose(%w)
  %ws: f32[32, 16] = mul(%wt, %s)
  %y: f32[T, 16] = matmul(%h, %ws)
  %i: f32[16] = iota() {dtype=f32, shape=[16]}
  %k: f32[] = constant() {value=-0.125, dtype=f32}
  %e: f32[16] = mul(%i, %k)
  %theta: f32[] = constant() {value=10000.0, dtype=f32}
  %invf: f32[16] = pow(%theta, %e)
  %rows: f32[64, 1] = iota() {dtype=f32, shape=[64, 1]}
  %f: f32[64, 16] = mul(%rows, %invf)
  %ctab: f32[64, 16] = cos(%f)
  %c: f32[T, 16] = gather(%ctab, %pos)
  %z: f32[T, 16] = mul(%y, %c)
  return %z
}
",
    )
    .unwrap()
}

/// The graphs whose kernels `precompile_gpu_test_kernels` caches for this test.
pub(super) fn precompile_graphs() -> Vec<sinter::Graph> {
    vec![hoist_graph()]
}

fn random(shape: &[usize], rng: &mut Rng) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::new(
        DType::F32,
        shape,
        (0..n).map(|_| 0.5 * rng.next_f64()).collect(),
    )
    .unwrap()
}

#[test]
fn gpu_fold_bound_folds_the_load_time_kernels_and_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let g = hoist_graph();
    let target = sinter::gpu::target_for(&dev);
    let (_, report) =
        sinter_passes::compile(&g, &target, &sinter_passes::PassOptions::for_graph(&g)).unwrap();
    let load_time = report.kernels.iter().filter(|k| k.load_time).count();
    assert!(
        load_time >= 3,
        "1 + g, the prepared weight and the table are load-time kernels:\n{report}"
    );
    let kernels = sinter::gpu::lower(&g, sinter::Lowering::Fused, &target)
        .unwrap()
        .kernels
        .len();
    let mut gpu = Program::compile(g.clone(), Backend::Gpu(dev.clone())).unwrap();
    let mut cpu = Program::compile(g, Backend::Interpreter).unwrap();
    // The table reads nothing: it folds when the program is compiled.
    assert_eq!(
        kernels - gpu.gpu_program().unwrap().kernel_graph().kernels.len(),
        1,
        "the cosine table folds at once"
    );
    assert_eq!(
        gpu.gpu_program()
            .unwrap()
            .weights()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["g", "s", "w"]
    );
    let mut rng = Rng::new(7);
    let (gw, ww, sw) = (
        random(&[32], &mut rng),
        random(&[16, 32], &mut rng),
        random(&[16], &mut rng),
    );
    for (n, t) in [("g", &gw), ("w", &ww), ("s", &sw)] {
        gpu.bind(n, t.clone()).unwrap();
        cpu.bind(n, t.clone()).unwrap();
    }
    let folded = kernels - gpu.gpu_program().unwrap().kernel_graph().kernels.len();
    assert_eq!(
        folded, load_time,
        "binding the weights folds the report's load-time kernels"
    );
    let x = random(&[5, 32], &mut rng);
    let pos = Tensor::new(DType::I32, &[5], vec![0.0, 3.0, 63.0, 7.0, 3.0]).unwrap();
    let run = |p: &Program, extra: &[(&str, &Tensor)]| {
        let mut ins = vec![("x", &x), ("pos", &pos)];
        ins.extend_from_slice(extra);
        p.run(&ins, &[]).unwrap().remove(0)
    };
    let mut fails = Vec::new();
    let mut cmp = |what: &str, got: Tensor, want: Tensor| {
        if let Err(e) = check(what, &got, &want, 1.0) {
            fails.push(e);
        }
    };
    cmp("folded", run(&gpu, &[]), run(&cpu, &[]));
    // A weight given for one run: the program as compiled reads it.
    let g2 = random(&[32], &mut rng);
    cmp(
        "g given for one run",
        run(&gpu, &[("g", &g2)]),
        run(&cpu, &[("g", &g2)]),
    );
    cmp("after the run given g", run(&gpu, &[]), run(&cpu, &[]));
    // Rebinding a weight a folded kernel read folds again from the new value.
    let w2 = random(&[16, 32], &mut rng);
    gpu.bind("w", w2.clone()).unwrap();
    cpu.bind("w", w2).unwrap();
    assert_eq!(
        kernels - gpu.gpu_program().unwrap().kernel_graph().kernels.len(),
        load_time,
        "refolded"
    );
    let want = run(&cpu, &[]);
    cmp("w rebound", run(&gpu, &[]), want.clone());
    // A CUDA graph captured after folding reads the folded results.
    let p = gpu.gpu_program().unwrap();
    let (xd, pd) = (
        dev.upload_tensor(&x).unwrap(),
        dev.upload_tensor(&pos).unwrap(),
    );
    let captured = p
        .capture_device(&[("x", &xd), ("pos", &pd)], &Bindings::new())
        .unwrap();
    captured.replay().unwrap();
    let out = dev.download_tensor(&captured.outputs()[0]).unwrap();
    cmp("captured", out, want);
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}
