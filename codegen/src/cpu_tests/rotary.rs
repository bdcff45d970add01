//! `rotary(x, cos, sin)` (rotation by caller-supplied tables) on the CPU emulator, in every
//! kernel `rope` fuses into: element-wise kernels (the paired rotate-half schedule, the
//! interleaved lanes, partial rotation, per-lane fallbacks), the matmul's columns epilogue
//! (tiled/`mma.sync` with staged tiles, the small-M kernel), a row kernel after a q/k norm,
//! and the `kv_append` kernel's prologue and the projection's epilogue that appends.

use sinter_ir::{DType, Family};

use super::graphs::single;
use super::*;

fn body(src: &str) -> sinter_ir::Function {
    let g = sinter_ir::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    sinter_ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{src}"));
    g.funcs.values().next().expect("one function").clone()
}

/// A table shape for x `[T, 5, D]` rotating R features: `[T, 1, R]` (HF's unsqueezed
/// `[T, R]`), `[T, 5, R]` (one entry per head) or `[R]` (the same for every row).
fn table_shape(kind: &str, t: usize, r: usize) -> Vec<usize> {
    match kind {
        "heads" => vec![t, 5, r],
        "flat" => vec![r],
        _ => vec![t, 1, r],
    }
}

fn dims(s: &[usize], t_sym: bool) -> String {
    let v: Vec<String> = s.iter().enumerate().map(|(i, d)| if i == 0 && t_sym && s.len() > 1 { "T".into() } else { d.to_string() }).collect();
    format!("[{}]", v.join(", "))
}

#[test]
fn cpu_rotary_matches_the_interpreter() {
    let mut rng = Rng(31);
    // (x dtype, tables dtype, form, D, rotary_dim, tables): the paired schedule (rotate-half,
    // every feature), interleaved lanes, partial rotation with R/2 a multiple of the lanes and
    // not (per lane), f32 tables with bf16 x, tables per head and one for every row.
    let cases = [
        (DType::BF16, DType::BF16, "rotate_half", 64, None, "rows"),
        (DType::F32, DType::F32, "rotate_half", 64, None, "heads"),
        (DType::BF16, DType::F32, "interleaved", 64, None, "rows"),
        (DType::F32, DType::F32, "interleaved", 8, None, "flat"),
        (DType::BF16, DType::BF16, "rotate_half", 64, Some(32), "rows"),
        (DType::F32, DType::F32, "rotate_half", 40, Some(20), "heads"),
        (DType::BF16, DType::BF16, "interleaved", 64, Some(16), "rows"),
        (DType::F16, DType::F16, "rotate_half", 16, None, "rows"),
    ];
    let t = 3usize;
    for (dt, tdt, form, dd, r, tables) in cases {
        let rr = r.unwrap_or(dd);
        let ts = table_shape(tables, t, rr);
        let mut attrs = format!("form=\"{form}\"");
        if let Some(r) = r {
            attrs += &format!(", rotary_dim={r}");
        }
        let tt = format!("{tdt}{}", dims(&ts, true));
        let src = format!("func @k(%x: {dt}[T, 5, {dd}], %cos: {tt}, %sin: {tt}) {{\n  %y: {dt}[T, 5, {dd}] = rotary(%x, %cos, %sin) {{{attrs}}}\n  return %y\n}}");
        let gk = single(Family::Pointwise, body(&src));
        // NaN in a table entry reaches only the features that read it; inf in x its pair.
        let x = with(random(&mut rng, dt, &[t, 5, dd], -2.0, 2.0), |i, v| if i == 7 { f64::INFINITY } else { v });
        let c = with(random(&mut rng, tdt, &ts, -1.0, 1.0), |i, v| if i == 3 { f64::NAN } else { v });
        let s = random(&mut rng, tdt, &ts, -1.0, 1.0);
        let tag = format!("rotary {dt} tables {tdt} {tables} {attrs}");
        let target = Target::SM_90A;
        for v in crate::schedule_variants(&gk.0, gk.1, &target).unwrap() {
            let outs = check_built_on_cpu(&format!("{tag} variant `{}`", v.name), &gk, &bind(&[("T", t as i64)]), &[x.clone(), c.clone(), s.clone()], 2, || {
                crate::compile_variant(&gk.0, gk.1, &target, &v.name)
            });
            assert!(outs[0][3].is_nan(), "{tag}: a NaN cos entry gives NaN");
        }
    }
}

/// A merged QKV projection with rotation by tables on Q and K in the matmul's epilogue: the
/// tables `[T, 1, 16]` are kernel inputs read at each row; full and partial, both forms, bf16
/// and f32, a symbolic T (the staged tensor-core and tiled kernels) and T = 1 (the small-M
/// kernel).
#[test]
fn cpu_rotary_in_the_matmul_epilogue_matches_the_interpreter() {
    let mut rng = Rng(32);
    for (dt, form) in [(DType::BF16, "rotate_half"), (DType::BF16, "interleaved"), (DType::F32, "rotate_half"), (DType::F32, "interleaved")] {
        for (r, rattr) in [(16usize, String::new()), (8, ", rotary_dim=8".to_string())] {
            for t in ["T", "1"] {
                let src = format!(
                    "func @qkv(%x: {dt}[{t}, 32], %w: {dt}[128, 32], %cos: {dt}[{t}, 1, {r}], %sin: {dt}[{t}, 1, {r}]) {{
  %m: {dt}[{t}, 128] = matmul(%x, %w) {{transpose_b=true}}
  %qs: {dt}[{t}, 64] = slice(%m) {{start=0, end=64}}
  %q: {dt}[{t}, 4, 16] = reshape(%qs) {{shape=[{t}, 4, 16]}}
  %qr: {dt}[{t}, 4, 16] = rotary(%q, %cos, %sin) {{form=\"{form}\"{rattr}}}
  %ks: {dt}[{t}, 32] = slice(%m) {{start=64, end=96}}
  %k: {dt}[{t}, 2, 16] = reshape(%ks) {{shape=[{t}, 2, 16]}}
  %kr: {dt}[{t}, 2, 16] = rotary(%k, %cos, %sin) {{form=\"{form}\"{rattr}}}
  %v: {dt}[{t}, 32] = slice(%m) {{start=96, end=128}}
  return %qr, %kr, %v
}}"
                );
                let gk = single(Family::Matmul, body(&src));
                let n = if t == "T" { 7 } else { 1 };
                let ins = [
                    random(&mut rng, dt, &[n, 32], -1.0, 1.0),
                    random(&mut rng, dt, &[128, 32], -1.0, 1.0),
                    random(&mut rng, dt, &[n, 1, r], -1.0, 1.0),
                    random(&mut rng, dt, &[n, 1, r], -1.0, 1.0),
                ];
                for target in [Target::SM_80, Target::SM_90] {
                    let plan = compile_kernel(&gk.0, gk.1, &target).unwrap_or_else(|e| panic!("{e}"));
                    let tag = format!("qkv rotary {dt} {form} R={r} T={t} {} ({})", target.name(), plan.entry);
                    check_built_on_cpu(&tag, &gk, &bind(&[("T", n as i64)]), &ins, 128, || compile_kernel(&gk.0, gk.1, &target));
                }
            }
        }
    }
}

/// Qwen3/Gemma 3's q norm then rotation by the caller's tables in one row kernel, heads last
/// (`[T, H, D]`, tables `[T, 1, D]`) and first (`[H, T, D]`, tables `[1, T, D]`), every
/// schedule variant.
#[test]
fn cpu_norm_then_rotary_in_one_row_kernel() {
    let mut rng = Rng(33);
    for (dt, h, hd, heads_first) in [(DType::BF16, 4, 128, false), (DType::F32, 3, 64, true), (DType::BF16, 2, 256, true)] {
        let t = 5usize;
        let (xs, ts) = if heads_first { (vec![h, t, hd], vec![1, t, hd]) } else { (vec![t, h, hd], vec![t, 1, hd]) };
        let shape = |s: &[usize]| {
            let v: Vec<String> = s.iter().map(|&d| if d == t { "T".to_string() } else { d.to_string() }).collect();
            format!("[{}]", v.join(", "))
        };
        let (xst, tst) = (shape(&xs), shape(&ts));
        let src = format!(
            "func @qn(%x: {dt}{xst}, %w: {dt}[{hd}], %cos: {dt}{tst}, %sin: {dt}{tst}) {{
  %n: {dt}{xst} = rms_norm(%x, %w) {{eps=1e-6}}
  %y: {dt}{xst} = rotary(%n, %cos, %sin)
  return %y
}}"
        );
        let gk = single(Family::RowReduction, body(&src));
        let ins = [random(&mut rng, dt, &xs, -3.0, 3.0), random(&mut rng, dt, &[hd], -0.5, 1.5), random(&mut rng, dt, &ts, -1.0, 1.0), random(&mut rng, dt, &ts, -1.0, 1.0)];
        let target = Target::SM_90A;
        for v in crate::schedule_variants(&gk.0, gk.1, &target).unwrap() {
            let tag = format!("variant `{}` norm+rotary {dt} H={h} D={hd} heads_first={heads_first}", v.name);
            check_built_on_cpu(&tag, &gk, &bind(&[("T", t as i64)]), &ins, 3, || crate::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
}

/// The new K rows rotated by tables then appended to the paged cache: in the `kv_append`
/// kernel's prologue, and in the epilogue of the QKV projection that computes them.
#[test]
fn cpu_rotary_into_kv_append_matches_the_interpreter() {
    let mut rng = Rng(34);
    let (t, p, m) = (5usize, 6usize, 3usize);
    // K rotated by the tables, then K and V appended to the pages.
    let rotate_append = "  %ks: bf16[T, 16] = slice(%kv) {start=0, end=16}
  %k: bf16[T, 2, 8] = reshape(%ks) {shape=[T, 2, 8]}
  %kr: bf16[T, 2, 8] = rotary(%k, %cos, %sin)
  %k4: bf16[T, 1, 2, 8] = reshape(%kr) {shape=[T, 1, 2, 8]}
  %vs: bf16[T, 16] = slice(%kv) {start=16, end=32}
  %v4: bf16[T, 1, 2, 8] = reshape(%vs) {shape=[T, 1, 2, 8]}
  %kc: bf16[P, 4, 2, 8], %vc: bf16[P, 4, 2, 8] = kv_append(%k_pages, %v_pages, %k4, %v4, %bt, %positions)";
    let src = format!("func @k(%kv: bf16[T, 32], %cos: bf16[T, 1, 8], %sin: bf16[T, 1, 8], %k_pages: bf16[P, 4, 2, 8], %v_pages: bf16[P, 4, 2, 8], %bt: i32[T, M], %positions: i32[T]) {{\n{rotate_append}\n  return %kc, %vc\n}}");
    let gk = single(Family::KvAppend, body(&src));
    // Sequence b (one token each) at slot 2b + 1 of pages 5 − b.
    let bt = Tensor::new(DType::I32, &[t, m], (0..t * m).map(|i| (5 - i / m) as f64).collect()).unwrap();
    let pos = Tensor::new(DType::I32, &[t], (0..t).map(|b| (2 * b + 1) as f64 % 12.0).collect()).unwrap();
    let ins = [
        random(&mut rng, DType::BF16, &[t, 32], -2.0, 2.0),
        random(&mut rng, DType::BF16, &[t, 1, 8], -1.0, 1.0),
        random(&mut rng, DType::BF16, &[t, 1, 8], -1.0, 1.0),
        random(&mut rng, DType::BF16, &[p, 4, 2, 8], -1.0, 1.0),
        random(&mut rng, DType::BF16, &[p, 4, 2, 8], -1.0, 1.0),
        bt.clone(),
        pos.clone(),
    ];
    check_on_cpu("kv_append prologue rotary", &gk, &bind(&[("T", t as i64), ("P", p as i64), ("M", m as i64)]), &ins, 2);
    // The projection computing K and V, its epilogue rotating K and appending both.
    let src = format!("func @qkv(%x: bf16[T, 24], %w: bf16[32, 24], %cos: bf16[T, 1, 8], %sin: bf16[T, 1, 8], %k_pages: bf16[P, 4, 2, 8], %v_pages: bf16[P, 4, 2, 8], %bt: i32[T, M], %positions: i32[T]) {{\n  %kv: bf16[T, 32] = matmul(%x, %w) {{transpose_b=true}}\n{rotate_append}\n  return %kr, %kc, %vc\n}}");
    let gk = single(Family::Matmul, body(&src));
    let mut ins = ins.to_vec();
    ins[0] = random(&mut rng, DType::BF16, &[t, 24], -1.0, 1.0);
    ins.insert(1, random(&mut rng, DType::BF16, &[32, 24], -1.0, 1.0));
    let gen = |g: &KernelGraph, k: Kernel| compile_kernel(g, k, &Target::SM_90);
    emu::check("qkv rotary + kv_append epilogue", &gk.0, gk.1, gen, &ins, &bind(&[("T", t as i64), ("P", p as i64), ("M", m as i64)]));
}
