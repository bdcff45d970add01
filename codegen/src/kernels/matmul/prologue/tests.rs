//! The norm prologue's tests: the fused kernel (`matmul(rms_norm(x, w), B)` or a `layer_norm`, and an epilogue)
//! run on the emulator bit for bit against the norm's own row-reduction kernel followed by the
//! matmul kernel, at decode batches, with every epilogue mode; ptxas without spills; the
//! other schedules refuse it.

use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, BufferData, BufferRole, DType, Family, Function, KernelData, KernelGraph, Layout, Target};

use super::super::{generate, generate_with, MatmulSchedule, MmaSchedule};
use crate::emu::graph::run_graph;
use crate::emu::random;
use crate::testing::{assemble, single_kernel};

fn func(text: &str) -> Function {
    let g = sinter_ir::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    g.funcs.values().next().unwrap().clone()
}

/// The fused body — `rms_norm(x [M, K], nw [K])` then `matmul` with `w [N, K]ᵀ`, then `epi`
/// (`"none"`, `"residual"`: `+ r [M, N]`, `"swiglu"`: over the halves of N, `"gemma"`: the
/// norm as Gemma computes it, in f32 with the weight `1 + nw`, cast back) — and the same as the norm's kernel and the
/// matmul's: `(fused, norm, matmul)` texts.
fn texts(dt: DType, m: i64, k: i64, n: i64, epi: &str) -> (String, String, String) {
    let layer = epi.starts_with("layernorm");
    let norm_line = if layer {
        format!("  %h: {dt}[{m}, {k}] = layer_norm(%x, %nw, %nb) {{eps=1e-05}}\n")
    } else if epi == "gemma" {
        // Gemma: x and the weight in f32, `1 + w`, the norm in f32, then a cast back.
        let f = "f32";
        format!(
            "  %xf: {f}[{m}, {k}] = cast(%x) {{dtype={f}}}\n  %one: {f}[] = constant() {{value=1.0, dtype={f}}}\n  %nf: {f}[{k}] = cast(%nw) {{dtype={f}}}\n  %w1: {f}[{k}] = add(%nf, %one)\n  %hf: {f}[{m}, {k}] = rms_norm(%xf, %w1) {{eps=1e-06}}\n  %h: {dt}[{m}, {k}] = cast(%hf) {{dtype={dt}}}\n"
        )
    } else {
        format!("  %h: {dt}[{m}, {k}] = rms_norm(%x, %nw) {{eps=1e-05}}\n")
    };
    let mut rest = format!("%w: {dt}[{n}, {k}]");
    let (tail, ret) = match epi {
        "residual" => {
            rest.push_str(&format!(", %r: {dt}[{m}, {n}]"));
            (format!("  %o: {dt}[{m}, {n}] = add(%r, %y)\n"), "%o")
        }
        "swiglu" => {
            let h = n / 2;
            let g = format!("  %g: {dt}[{m}, {h}] = slice(%y) {{axis=-1, start=0, end={h}}}\n");
            let u = format!("  %u: {dt}[{m}, {h}] = slice(%y) {{axis=-1, start={h}, end={n}}}\n");
            (format!("{g}{u}  %o: {dt}[{m}, {h}] = swiglu(%g, %u)\n"), "%o")
        }
        "rope" => {
            // A merged QKV projection (N = 960: 9 query heads, 3 key and 3 value heads of 64)
            // with RoPE on Q and K: a columns epilogue.
            rest.push_str(&format!(", %pos: i32[{m}]"));
            let mut t = format!("  %p2: i32[{m}, 1] = reshape(%pos) {{shape=[{m}, 1]}}\n");
            for (name, a, b, heads) in [("q", 0, 576, 9), ("k", 576, 768, 3)] {
                t.push_str(&format!("  %{name}0: {dt}[{m}, {}] = slice(%y) {{axis=-1, start={a}, end={b}}}\n", b - a));
                t.push_str(&format!("  %{name}1: {dt}[{m}, {heads}, 64] = reshape(%{name}0) {{shape=[{m}, {heads}, 64]}}\n"));
                t.push_str(&format!("  %{name}: {dt}[{m}, {heads}, 64] = rope(%{name}1, %p2) {{theta=100000.0}}\n"));
            }
            t.push_str(&format!("  %v: {dt}[{m}, 192] = slice(%y) {{axis=-1, start=768, end=960}}\n"));
            (t, "%q, %k, %v")
        }
        "layernorm_bias_gelu" => {
            // GPT-2's MLP input projection: bias, then GELU (tanh form).
            rest.push_str(&format!(", %b: {dt}[{n}]"));
            (format!("  %yb: {dt}[{m}, {n}] = add(%y, %b)\n  %o: {dt}[{m}, {n}] = gelu(%yb) {{form=\"tanh\"}}\n"), "%o")
        }
        _ => (String::new(), "%y"),
    };
    let mm_lines = format!("  %y: {dt}[{m}, {n}] = matmul(%h, %w) {{transpose_b=true}}\n{tail}  return {ret}\n}}\n");
    let x = if layer { format!("%x: {dt}[{m}, {k}], %nw: {dt}[{k}], %nb: {dt}[{k}]") } else { format!("%x: {dt}[{m}, {k}], %nw: {dt}[{k}]") };
    (
        format!("func @fused({x}, {rest}) {{\n{norm_line}{mm_lines}"),
        format!("func @norm({x}) {{\n{norm_line}  return %h\n}}\n"),
        format!("func @mm(%h: {dt}[{m}, {k}], {rest}) {{\n{mm_lines}"),
    )
}

/// The two-kernel path: the norm's RowReduction kernel writing `h`, then the matmul and its
/// epilogue reading it (the fused body's inputs: the norm's, then the matmul's).
fn two_kernels(fused: &Function, norm: Function, mm: Function) -> KernelGraph {
    let mut g = KernelGraph::default();
    let mut buf = |ty: &sinter_ir::TensorType, role| g.buffers.push(BufferData { name: None, ty: ty.clone(), role, layout: Layout::contiguous(&ty.shape) });
    let ins: Vec<_> = fused.params.iter().map(|&p| buf(fused.ty(p), BufferRole::Input)).collect();
    let h = buf(norm.ty(norm.outputs[0]), BufferRole::Temp);
    let outs: Vec<_> = mm.outputs.iter().map(|&o| buf(mm.ty(o), BufferRole::Output)).collect();
    let n_norm = norm.params.len();
    let mut mm_ins = vec![h];
    mm_ins.extend(ins[n_norm..].iter().copied());
    g.kernels.push(KernelData { family: Family::RowReduction, body: norm, inputs: ins[..n_norm].to_vec(), outputs: vec![h] });
    g.kernels.push(KernelData { family: Family::Matmul, body: mm, inputs: mm_ins, outputs: outs.clone() });
    g.inputs = ins;
    g.outputs = outs;
    g
}

/// Random inputs for `f`'s parameters, with a few zero and large rows in x.
fn inputs(f: &Function, seed: u64) -> Vec<Tensor> {
    f.params
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let t = f.ty(p);
            let shape: Vec<usize> = t.shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
            if t.dtype == DType::I32 {
                // Positions.
                let data = (0..shape[0]).map(|j| (7 * j + 3) as f64).collect();
                return Tensor::new(t.dtype, &shape, data).unwrap();
            }
            let r = random(t.dtype, &shape, seed + i as u64);
            if i != 0 || shape[0] < 2 {
                return r;
            }
            // x: row 0 scaled up (a large mean square), row 1 all zeros (r = 1/√eps).
            let k = shape[1];
            let data: Vec<f64> = r.data().iter().enumerate().map(|(j, &v)| if j < k { t.dtype.round(v * 300.0) } else if j < 2 * k { 0.0 } else { v }).collect();
            Tensor::new(t.dtype, &shape, data).unwrap()
        })
        .collect()
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.data().iter().map(|v| v.to_bits()).collect()
}

/// Runs the fused kernel and the two-kernel path on the emulator and requires the same bits;
/// returns how many elements were compared.
fn same_bits(what: &str, dt: DType, m: i64, k: i64, n: i64, epi: &str) -> usize {
    let (fused, norm, mm) = texts(dt, m, k, n, epi);
    let (fused, norm, mm) = (func(&fused), func(&norm), func(&mm));
    let ins = inputs(&fused, 17 * m as u64 + k as u64);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let (g1, k1) = single_kernel(Family::Matmul, fused.clone());
    let target = Target::SM_80;
    let plan = generate(&g1, k1, &target).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(plan.entry.ends_with("matmul_small_m"), "{what}: {}", plan.entry);
    let one = run_graph(&g1, &target, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: fused: {e}"));
    let two = run_graph(&two_kernels(&fused, norm, mm), &target, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: two kernels: {e}"));
    let want = sinter_ir::interp::run(&sinter_ir::parse(&texts(dt, m, k, n, epi).0).unwrap(), "fused", &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut compared = 0;
    for ((one, two), want) in one.iter().zip(&two).zip(&want) {
        assert_eq!(one.shape(), two.shape(), "{what}");
        let (a, b) = (bits(one), bits(two));
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert_eq!(differ, 0, "{what}: {differ} of {} elements differ from the two-kernel path", a.len());
        // And both near the interpreter's f64 reference.
        let worst = one.data().iter().zip(want.data()).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0, f64::max);
        let tol = if dt == DType::F32 { 1e-4 } else { 5e-2 };
        assert!(worst <= tol, "{what}: {worst} from the interpreter");
        compared += a.len();
    }
    compared
}

/// Bit for bit against the two-kernel path at decode batches M = 1, 3, 16, rows of 576 (a
/// 64-thread cut of the norm kernel) and 2048 (128 threads; f32: 128 and 256), bf16 and f32,
/// with a residual add in the epilogue.
#[test]
fn fused_norm_matches_the_two_kernels_bit_for_bit() {
    let mut total = 0;
    for dt in [DType::BF16, DType::F32] {
        for k in [576, 2048] {
            for m in [1, 3, 16] {
                total += same_bits(&format!("{dt} M={m} K={k}"), dt, m, k, 24, "residual");
            }
        }
    }
    eprintln!("norm prologue: {total} elements bit-identical to the two-kernel path");
}

/// The other epilogue modes with the prologue: the paired SwiGLU of a gate/up projection,
/// the columns of a QKV projection with RoPE on Q and K, no epilogue, a norm weight computed in the body (Gemma's `1 + w`), a short row (a warp a
/// row in the norm kernel) and a row with a partial last chunk.
#[test]
fn fused_norm_with_every_epilogue() {
    same_bits("swiglu M=3", DType::BF16, 3, 576, 48, "swiglu");
    same_bits("QKV with RoPE M=1", DType::BF16, 1, 576, 960, "rope");
    same_bits("QKV with RoPE M=3 f32", DType::F32, 3, 576, 960, "rope");
    same_bits("swiglu M=1 f32", DType::F32, 1, 576, 48, "swiglu");
    same_bits("plain M=2", DType::BF16, 2, 576, 20, "none");
    same_bits("gemma weight M=4", DType::BF16, 4, 640, 20, "gemma");
    same_bits("warp rows K=256", DType::BF16, 5, 256, 12, "residual");
    same_bits("partial chunk K=960", DType::BF16, 2, 960, 12, "residual");
    same_bits("odd row K=75 f32", DType::F32, 3, 75, 9, "residual");
}

/// LayerNorm (GPT-2's) in the prologue, bit for bit against the two kernels: its statistics
/// per warp of the norm kernel's cut (a warp a row at K = 256, 2 to 8 warps beyond, a partial
/// last chunk at 960), each element centred on its warp's mean; rows with a large mean.
#[test]
fn fused_layer_norm_matches_the_two_kernels_bit_for_bit() {
    let mut total = 0;
    for dt in [DType::BF16, DType::F32] {
        for (m, k) in [(1, 768), (3, 768), (16, 768), (2, 256), (3, 960), (1, 2048)] {
            total += same_bits(&format!("layer_norm {dt} M={m} K={k}"), dt, m, k, 24, "layernorm");
        }
    }
    total += same_bits("layer_norm, bias and GELU, M=3", DType::BF16, 3, 768, 40, "layernorm_bias_gelu");
    eprintln!("layer_norm prologue: {total} elements bit-identical to the two-kernel path");
}

/// The fused kernels assemble without spills for sm_80 and sm_90a at M = 1 and 16; the
/// tensor-core schedules refuse a norm prologue.
#[test]
fn fused_norm_assembles_and_other_schedules_refuse_it() {
    for (m, epi) in [(1, "residual"), (16, "residual"), (16, "swiglu"), (4, "gemma"), (1, "layernorm"), (16, "layernorm_bias_gelu")] {
        let fused = func(&texts(DType::BF16, m, 576, 3072, epi).0);
        let (g, k) = single_kernel(Family::Matmul, fused);
        for t in [Target::SM_80, Target::SM_90A] {
            let plan = generate(&g, k, &t).unwrap();
            assemble(&plan);
        }
        let e = generate_with(&g, k, &Target::SM_80, &MatmulSchedule::Mma(MmaSchedule::flat(32))).unwrap_err();
        assert!(e.to_string().contains("norm prologue"), "{e}");
    }
}
