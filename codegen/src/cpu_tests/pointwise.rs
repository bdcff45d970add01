//! Element-wise, layout, gather, kv_append and attention-merge kernels on the CPU emulator.

use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, DType, Family};

use super::graphs::*;
use super::*;

/// The merge of partial attention states on the CPU emulator: finite states, one empty
/// (lse −inf, its o NaN and never read), both empty (0 and −inf), NaN and +inf lse; bf16
/// vectorised and f32 with a symbolic row count.
#[test]
fn cpu_attention_merge_matches_the_interpreter() {
    let mut rng = Rng(11);
    let specials = |t: Tensor, at: &[(usize, f64)]| with(t, |i, v| at.iter().find(|p| p.0 == i).map_or(v, |p| p.1));
    let gk = merge_at(DType::BF16, &[d(4), d(8), d(1)], 128);
    let la = specials(random(&mut rng, DType::F32, &[4, 8, 1], -3.0, 3.0), &[(1, f64::NEG_INFINITY), (2, f64::NEG_INFINITY), (5, f64::NAN), (6, f64::INFINITY)]);
    let lb = specials(random(&mut rng, DType::F32, &[4, 8, 1], -3.0, 3.0), &[(2, f64::NEG_INFINITY), (3, f64::NEG_INFINITY)]);
    let oa = specials(random(&mut rng, DType::BF16, &[4, 8, 1, 128], -2.0, 2.0), &[(128 + 3, f64::NAN)]);
    let ob = specials(random(&mut rng, DType::BF16, &[4, 8, 1, 128], -2.0, 2.0), &[(3 * 128 + 5, f64::NAN)]);
    check_on_cpu("merge bf16", &gk, &Bindings::new(), &[oa, la, ob, lb], 2);
    let gk = merge_at(DType::F32, &[s("R"), d(5)], 40);
    let ins = [random(&mut rng, DType::F32, &[3, 5, 40], -2.0, 2.0), random(&mut rng, DType::F32, &[3, 5], -30.0, 30.0), random(&mut rng, DType::F32, &[3, 5, 40], -2.0, 2.0), random(&mut rng, DType::F32, &[3, 5], -30.0, 30.0)];
    check_on_cpu("merge f32", &gk, &bind(&[("R", 3)]), &ins, 1);
}

#[test]
fn cpu_pointwise_matches_the_interpreter() {
    let mut rng = Rng(1);
    // Vectorised, several CTAs' worth of groups on 3 CTAs (grid-stride).
    let gk = silu_mul(DType::BF16, s("T"), d(14336));
    let ins = [random(&mut rng, DType::BF16, &[3, 14336], -8.0, 8.0), random(&mut rng, DType::BF16, &[3, 14336], -2.0, 2.0)];
    check_on_cpu("silu_mul bf16", &gk, &bind(&[("T", 3)]), &ins, 3);
    // Scalar tail, with special values.
    let gk = silu_mul(DType::F32, s("T"), d(17));
    let a = with(random(&mut rng, DType::F32, &[5, 17], -100.0, 100.0), |i, v| match i {
        0 => f64::NEG_INFINITY,
        1 => f64::INFINITY,
        2 => f64::NAN,
        3 => 0.0,
        _ => v,
    });
    let ins = [a, random(&mut rng, DType::F32, &[5, 17], -2.0, 2.0)];
    check_on_cpu("silu_mul f32 tail", &gk, &bind(&[("T", 5)]), &ins, 1);
    // 32-bit indices.
    let gk = silu_mul(DType::BF16, d(3), d(5));
    let ins = [random(&mut rng, DType::BF16, &[3, 5], -4.0, 4.0), random(&mut rng, DType::BF16, &[3, 5], -4.0, 4.0)];
    check_on_cpu("silu_mul i32 index", &gk, &Bindings::new(), &ins, 1);
    // The zoo of element-wise ops, both dtypes.
    for dt in [DType::F32, DType::BF16] {
        let gk = elementwise_zoo(dt);
        let t = 6;
        let ins = [
            random(&mut rng, dt, &[t, 17], -3.0, 3.0),
            random(&mut rng, dt, &[17], 0.5, 2.0),
            random(&mut rng, DType::Bool, &[t, 1], 0.0, 2.0),
            with(random(&mut rng, DType::I32, &[t, 17], -50.0, 50.0), |_, v| if v == 0.0 { 7.0 } else { v }),
        ];
        check_on_cpu(&format!("zoo {dt}"), &gk, &bind(&[("T", t as i64)]), &ins, 2);
    }
    // RoPE, both forms, positions up to 10⁵.
    for (dt, form) in [(DType::BF16, "rotate_half"), (DType::F32, "interleaved"), (DType::F32, "rotate_half"), (DType::BF16, "interleaved")] {
        let gk = rope(dt, form);
        let ins = [random(&mut rng, dt, &[4, 9, 64], -2.0, 2.0), random(&mut rng, DType::I32, &[4, 1], 0.0, 100_000.0)];
        check_on_cpu(&format!("rope {form} {dt}"), &gk, &bind(&[("T", 4)]), &ins, 2);
    }
    // Four heads a thread (32 heads), and none shared (5 heads: one a thread).
    for (dt, form, h, hd) in [(DType::BF16, "rotate_half", 32, 128), (DType::BF16, "interleaved", 32, 128), (DType::F32, "rotate_half", 5, 64)] {
        let gk = rope_at(dt, form, 3, h, hd);
        let ins = [random(&mut rng, dt, &[3, h as usize, hd as usize], -2.0, 2.0), random(&mut rng, DType::I32, &[3, 1], 0.0, 100_000.0)];
        check_on_cpu(&format!("rope {form} {dt} H={h}"), &gk, &Bindings::new(), &ins, 2);
    }
    let gk = swiglu(DType::BF16);
    let ins = [random(&mut rng, DType::BF16, &[2, 1536], -6.0, 6.0), random(&mut rng, DType::BF16, &[2, 1536], -2.0, 2.0)];
    check_on_cpu("swiglu", &gk, &bind(&[("T", 2)]), &ins, 1);
}

#[test]
fn cpu_views_and_mixed_dtypes_match_the_interpreter() {
    let mut rng = Rng(5);
    let b = bind(&[("T", 3)]);
    check_on_cpu("views", &views_pointwise(), &b, &[random(&mut rng, DType::BF16, &[3, 576], -4.0, 4.0), random(&mut rng, DType::BF16, &[64], -1.0, 1.0)], 2);
    check_on_cpu("flat mixed", &flat_mixed(), &b, &[random(&mut rng, DType::BF16, &[3, 4096], -4.0, 4.0), random(&mut rng, DType::F32, &[3, 4096], -1.0, 1.0)], 2);
    check_on_cpu("silu_mul f16", &silu_mul(DType::F16, s("T"), d(100)), &b, &[random(&mut rng, DType::F16, &[3, 100], -8.0, 8.0), random(&mut rng, DType::F16, &[3, 100], -2.0, 2.0)], 2);
    for aligned in [false, true] {
        let (na, nb) = if aligned { (16, 48) } else { (20, 44) };
        let ins = [random(&mut rng, DType::BF16, &[3, na], -4.0, 4.0), random(&mut rng, DType::BF16, &[3, nb], -4.0, 4.0), random(&mut rng, DType::BF16, &[3, 100], -4.0, 4.0)];
        check_on_cpu(&format!("concat last {aligned}"), &concat_last(aligned), &b, &ins, 2);
    }
    let ins = [random(&mut rng, DType::F32, &[3, 1024], -4.0, 4.0), random(&mut rng, DType::F32, &[3], -1.0, 1.0)];
    check_on_cpu("row epilogues", &row_epilogues(DType::F32), &bind(&[("R", 3)]), &ins, 2);
    let ins = [special_rows(&mut rng, DType::F16, 5, 1000, "softmax")];
    check_on_cpu("softmax f16", &row_kernel(DType::F16, s("R"), d(1000), "softmax"), &bind(&[("R", 5)]), &ins, 2);
    let ins = [random(&mut rng, DType::BF16, &[1000, 576], -1.0, 1.0), random(&mut rng, DType::I64, &[3], 0.0, 1000.0)];
    check_on_cpu("gather scaled", &embedding_scaled(), &b, &ins, 2);
}

#[test]
fn cpu_layout_gather_kv_append_match_the_interpreter() {
    let mut rng = Rng(4);
    let gk = transpose_heads(DType::BF16);
    check_on_cpu("permute", &gk, &bind(&[("T", 5)]), &[random(&mut rng, DType::BF16, &[5, 9, 64], -4.0, 4.0)], 2);
    let gk = transpose_2d(DType::F32);
    check_on_cpu("transpose", &gk, &bind(&[("T", 7)]), &[random(&mut rng, DType::F32, &[7, 576], -4.0, 4.0)], 2);
    let gk = concat_slice(DType::BF16);
    let ins = [random(&mut rng, DType::BF16, &[3, 64], -4.0, 4.0), random(&mut rng, DType::BF16, &[5, 64], -4.0, 4.0)];
    check_on_cpu("concat/slice/broadcast", &gk, &bind(&[("P", 3), ("T", 5)]), &ins, 2);
    for (dt, it) in [(DType::BF16, DType::I32), (DType::F32, DType::I64)] {
        let gk = embedding(dt, it);
        let table = random(&mut rng, dt, &[49152, 576], -1.0, 1.0);
        let ids = random(&mut rng, it, &[2, 3], 0.0, 49152.0);
        check_on_cpu(&format!("gather {dt} {it}"), &gk, &bind(&[("B", 2), ("T", 3)]), &[table.clone(), ids], 2);
        // Out-of-range indices give a NaN row (the interpreter reports an error).
        let ids = Tensor::new(it, &[2, 3], vec![0.0, -1.0, 49152.0, 5.0, 1e9, 49151.0]).unwrap();
        let outs = check_on_cpu(&format!("gather {dt} oor"), &gk, &bind(&[("B", 2), ("T", 3)]), &[table.clone(), ids], 2);
        if let Some(out) = outs.first() {
            for (row, ok) in [(0, true), (1, false), (2, false), (3, true), (4, false), (5, true)] {
                let vals = &out[row * 576..(row + 1) * 576];
                if ok {
                    let src = [0usize, 0, 0, 5, 0, 49151][row];
                    assert_eq!(vals, &table.data()[src * 576..(src + 1) * 576], "row {row}");
                } else {
                    assert!(vals.iter().all(|v| v.is_nan()), "row {row}: {:?}", &vals[..4]);
                }
            }
        }
    }
    let gk = kv_append(DType::BF16);
    let (p, b, t, m) = (6usize, 2usize, 5usize, 3usize);
    let kp = random(&mut rng, DType::BF16, &[p, 16, 3, 64], -1.0, 1.0);
    let vp = random(&mut rng, DType::BF16, &[p, 16, 3, 64], -1.0, 1.0);
    let kn = random(&mut rng, DType::BF16, &[b, t, 3, 64], -1.0, 1.0);
    let vn = random(&mut rng, DType::BF16, &[b, t, 3, 64], -1.0, 1.0);
    // Sequence 0 starts at 14 (crosses a page), sequence 1 at 30.
    let bt = Tensor::new(DType::I32, &[b, m], vec![4.0, 1.0, 0.0, 2.0, 5.0, 3.0]).unwrap();
    let sp = Tensor::new(DType::I32, &[b], vec![14.0, 30.0]).unwrap();
    check_on_cpu("kv_append", &gk, &bind(&[("P", p as i64), ("B", b as i64), ("T", t as i64), ("M", m as i64)]), &[kp, vp, kn, vn, bt, sp], 3);
}

/// Kernel bodies as the passes produce them for the zoo models (`tests/fused_zoo.rs` with
/// `SINTER_DUMP_KERNELS=1`: SmolLM2-135M decode, tiny Llama decode, tiny GPT-2), run on the CPU
/// against the interpreter.
const ZOO_BODIES: &str = r#"
func @k4_pointwise(%v0: bf16[T, 960], %positions: i32[T]) {
  %v2: bf16[T, 576] = slice(%v0) {start=0, end=576}
  %v3: bf16[T, 9, 64] = reshape(%v2) {shape=[T, 9, 64]}
  %v4: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %v5: bf16[T, 9, 64] = rope(%v3, %v4) {theta=100000.0}
  %v6: bf16[T, 9, 1, 64] = reshape(%v5) {shape=[T, 9, 1, 64]}
  return %v6
}
func @k5_pointwise(%positions: i32[T]) {
  %v1: i32[] = constant() {value=1.0, dtype=i32}
  %v2: i32[T] = add(%positions, %v1)
  return %v2
}
func @k7_layout(%block_tables: i32[2, T, M]) {
  %v1: i32[1, T, M] = slice(%block_tables) {axis=-3, start=0, end=1}
  %v2: i32[T, M] = reshape(%v1) {shape=[T, M]}
  %v3: i32[1, T, M] = slice(%block_tables) {axis=-3, start=1, end=2}
  %v4: i32[T, M] = reshape(%v3) {shape=[T, M]}
  return %v4, %v2
}
func @k8_kv_append(%positions: i32[T], %v1: bf16[T, 64], %k_pages: bf16[P, 4, 2, 8], %v_pages: bf16[P, 4, 2, 8], %v4: i32[T, M]) {
  %v5: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %v6: bf16[T, 16] = slice(%v1) {start=32, end=48}
  %v7: bf16[T, 2, 8] = reshape(%v6) {shape=[T, 2, 8]}
  %v8: bf16[T, 2, 8] = rope(%v7, %v5) {theta=10000.0}
  %v9: bf16[T, 1, 2, 8] = reshape(%v8) {shape=[T, 1, 2, 8]}
  %v10: bf16[T, 16] = slice(%v1) {start=48, end=64}
  %v11: bf16[T, 1, 2, 8] = reshape(%v10) {shape=[T, 1, 2, 8]}
  %v12: bf16[P, 4, 2, 8], %v13: bf16[P, 4, 2, 8] = kv_append(%k_pages, %v_pages, %v9, %v11, %v4, %positions)
  return %v12, %v13
}
func @k14_pointwise(%v0: bf16[T, 96]) {
  %v1: bf16[T, 48] = slice(%v0) {start=0, end=48}
  %v2: bf16[T, 48] = slice(%v0) {start=48, end=96}
  %v3: bf16[T, 48] = swiglu(%v1, %v2)
  return %v3
}
func @k2_row_reduction(%v0: bf16[T, 32], %v1: bf16[T, 32], %w: bf16[32], %b: bf16[32]) {
  %v4: bf16[T, 32] = add(%v0, %v1)
  %v5: bf16[T, 32] = layer_norm(%v4, %w, %b) {eps=1e-5}
  return %v4, %v5
}
func @k4_layout(%v0: bf16[T, 96]) {
  %v1: bf16[T, 32] = slice(%v0) {start=0, end=32}
  %v2: bf16[1, T, 4, 8] = reshape(%v1) {shape=[1, T, 4, 8]}
  %v3: bf16[T, 32] = slice(%v0) {start=32, end=64}
  %v4: bf16[1, T, 4, 8] = reshape(%v3) {shape=[1, T, 4, 8]}
  %v5: bf16[T, 32] = slice(%v0) {start=64, end=96}
  %v6: bf16[1, T, 4, 8] = reshape(%v5) {shape=[1, T, 4, 8]}
  return %v6, %v4, %v2
}
func @k1_row_reduction(%v0: bf16[T, 576], %w: bf16[576]) {
  %v2: bf16[T, 576] = rms_norm(%v0, %w) {eps=1e-5}
  return %v2
}
func @k0_gather(%token_embd.weight: bf16[49152, 576], %tokens: i64[T]) {
  %v2: bf16[T, 576] = gather(%token_embd.weight, %tokens)
  return %v2
}
"#;

#[test]
fn cpu_zoo_bodies_match_the_interpreter() {
    let g = sinter_ir::parse(ZOO_BODIES).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = Rng(6);
    let (t, p, m) = (3usize, 16usize, 3usize);
    let b = bind(&[("T", t as i64), ("P", p as i64), ("M", m as i64)]);
    for f in g.funcs.values() {
        let family = match f.name.split_once('_').map(|(_, fam)| fam) {
            Some("pointwise") => Family::Pointwise,
            Some("layout") => Family::Layout,
            Some("kv_append") => Family::KvAppend,
            Some("row_reduction") => Family::RowReduction,
            Some("gather") => Family::Gather,
            other => panic!("{other:?}"),
        };
        let inputs: Vec<Tensor> = f
            .params
            .iter()
            .map(|&v| {
                let tt = f.ty(v);
                let shape: Vec<usize> = tt.shape.iter().map(|d| d.eval(&b).unwrap() as usize).collect();
                let name = f.values[v].name.clone().unwrap_or_default();
                let (lo, hi) = match (name.as_str(), tt.dtype, shape.len()) {
                    ("positions", _, _) => (0.0, (m * 4) as f64),
                    ("tokens", _, _) => (0.0, 49152.0),
                    (_, DType::I32, _) => (0.0, p as f64),
                    _ => (-3.0, 3.0),
                };
                if tt.dtype == DType::I32 && shape.len() == 2 {
                    // A block table: distinct pages per sequence, so no two tokens share a slot.
                    let cols = shape[1];
                    return Tensor::from_fn(DType::I32, &shape, |ix| ((ix[0] * cols + ix[1]) % p) as f64);
                }
                random(&mut rng, tt.dtype, &shape, lo, hi)
            })
            .collect();
        check_on_cpu(&f.name, &single(family, f.clone()), &b, &inputs, 2);
    }
}

/// The `erf` op's element-wise kernel on the emulator: f32 against libm's f64 `erf` in ulps
/// over a sweep of |x| ≤ 10 with ±0, subnormal and tiny inputs, ±inf (→ ±1) and NaN; bf16
/// against the interpreter (computed in f32, rounded once); erf-GELU written out beside
/// `gelu` in f16.
#[test]
fn cpu_erf_matches_libm() {
    let n = 4096usize;
    let rows = 8usize;
    let specials = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -3e-30, 1e-7, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 3.92, -10.0];
    let xs: Vec<f64> = (0..rows * n).map(|i| specials.get(i).copied().unwrap_or_else(|| -10.0 + 20.0 * i as f64 / (rows * n) as f64) as f32 as f64).collect();
    let x = Tensor::new(DType::F32, &[rows, n], xs.clone()).unwrap();
    let outs = check_on_cpu("erf f32", &erf_pointwise(DType::F32, d(n as i64)), &bind(&[("T", rows as i64)]), &[x], 4);
    let mut worst = (0.0f64, 0.0f64);
    for (&xi, &yi) in xs.iter().zip(&outs[0]) {
        let want = libm::erf(xi);
        if xi.is_nan() {
            assert!(yi.is_nan(), "erf(NaN) = {yi}");
            continue;
        }
        let w = want as f32;
        let ulp = if w.abs() < f32::MIN_POSITIVE { f32::from_bits(1) as f64 } else { (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64 };
        let e = (yi - want).abs() / ulp;
        if e > worst.0 {
            worst = (e, xi);
        }
        if xi == 0.0 {
            assert_eq!(yi.to_bits(), xi.to_bits(), "erf({xi}) keeps the sign of zero");
        }
    }
    eprintln!("erf f32 on the emulator: max {} ulp at {}", worst.0, worst.1);
    // The emulator's `ex2.approx` is the host's `exp2f`: 0.965 ulp measured here, against 1.04
    // for the CPU model of `math::erf` with a correctly rounded `ex2`.
    assert!(worst.0 <= 1.5, "erf f32: {} ulp at {}", worst.0, worst.1);
    let mut rng = Rng(21);
    let x = random(&mut rng, DType::BF16, &[5, 4096], -5.0, 5.0);
    check_on_cpu("erf bf16", &erf_pointwise(DType::BF16, d(4096)), &bind(&[("T", 5)]), &[x], 2);
    let x = random(&mut rng, DType::F16, &[3, 1000], -8.0, 8.0);
    check_on_cpu("erf-GELU f16", &erf_gelu_written(DType::F16, d(1000)), &bind(&[("T", 3)]), &[x], 2);
}
