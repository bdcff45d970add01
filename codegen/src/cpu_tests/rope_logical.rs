//! RoPE with a partial rotary dim and frequency scalings, and the logical ops, on the CPU
//! emulator: element-wise kernels (vectorised where R/2 is a multiple of the lanes, per lane
//! where not) and the matmul's columns epilogue (the tiled/`mma.sync` kernel with staged
//! tiles, and the small-M kernel, whose groups compute a column and its RoPE partner).

use sinter_ir::{DType, Family};

use super::graphs::single;
use super::*;

fn body(src: &str) -> sinter_ir::Function {
    let g = sinter_ir::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    sinter_ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{src}"));
    g.funcs.values().next().expect("one function").clone()
}

const YARN: &str =
    "scaling=\"yarn\", factor=4.0, original_max_position_embeddings=4096, attention_factor=1.25";
const LLAMA3: &str = "scaling=\"llama3\", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64";

#[test]
fn cpu_partial_and_scaled_rope_match_the_interpreter() {
    let mut rng = Rng(21);
    // (dtype, form, D, rotary_dim, scaling): R/2 a multiple of the lanes (a lane group rotated
    // or copied whole) and not (per lane); full-width ropes with each scaling (the paired
    // schedule); a default YaRN attention factor.
    let cases = [
        (DType::BF16, "rotate_half", 64, Some(32), YARN),
        (DType::BF16, "interleaved", 64, Some(16), LLAMA3),
        (DType::F32, "rotate_half", 40, Some(24), "scaling=\"linear\", factor=2.0"),
        (DType::BF16, "rotate_half", 64, Some(20), ""),
        (DType::F32, "interleaved", 64, Some(6), YARN),
        (DType::BF16, "rotate_half", 128, None, LLAMA3),
        (DType::BF16, "interleaved", 64, None, YARN),
        (DType::F32, "rotate_half", 64, None, "scaling=\"yarn\", factor=16.0, original_max_position_embeddings=2048, beta_fast=16.0, truncate=false"),
    ];
    for (dt, form, dd, r, scaling) in cases {
        let mut attrs = format!("theta=10000.0, form=\"{form}\"");
        if let Some(r) = r {
            attrs += &format!(", rotary_dim={r}");
        }
        if !scaling.is_empty() {
            attrs += &format!(", {scaling}");
        }
        let src = format!("func @k(%x: {dt}[T, 5, {dd}], %p: i32[T, 1]) {{\n  %y: {dt}[T, 5, {dd}] = rope(%x, %p) {{{attrs}}}\n  return %y\n}}");
        let gk = single(Family::Pointwise, body(&src));
        let x = with(
            random(&mut rng, dt, &[3, 5, dd as usize], -2.0, 2.0),
            |i, v| if i == 7 { f64::INFINITY } else { v },
        );
        let ins = [x, random(&mut rng, DType::I32, &[3, 1], 0.0, 10_000.0)];
        check_on_cpu(
            &format!("rope {dt} {attrs}"),
            &gk,
            &bind(&[("T", 3)]),
            &ins,
            2,
        );
    }
}

/// A merged QKV projection with partial, scaled RoPE on Q and K in the matmul's epilogue.
#[test]
fn cpu_partial_rope_in_the_matmul_epilogue_matches_the_interpreter() {
    let mut rng = Rng(22);
    for form in ["rotate_half", "interleaved"] {
        for t in ["T", "1"] {
            let src = format!(
                "func @qkv(%x: bf16[{t}, 32], %w: bf16[128, 32], %positions: i32[{t}]) {{
  %m: bf16[{t}, 128] = matmul(%x, %w) {{transpose_b=true}}
  %p: i32[{t}, 1] = reshape(%positions) {{shape=[{t}, 1]}}
  %qs: bf16[{t}, 64] = slice(%m) {{start=0, end=64}}
  %q: bf16[{t}, 4, 16] = reshape(%qs) {{shape=[{t}, 4, 16]}}
  %qr: bf16[{t}, 4, 16] = rope(%q, %p) {{theta=10000.0, form=\"{form}\", rotary_dim=8, {YARN}}}
  %ks: bf16[{t}, 32] = slice(%m) {{start=64, end=96}}
  %k: bf16[{t}, 2, 16] = reshape(%ks) {{shape=[{t}, 2, 16]}}
  %kr: bf16[{t}, 2, 16] = rope(%k, %p) {{theta=10000.0, form=\"{form}\", rotary_dim=8, {YARN}}}
  %v: bf16[{t}, 32] = slice(%m) {{start=96, end=128}}
  return %qr, %kr, %v
}}"
            );
            let gk = single(Family::Matmul, body(&src));
            let n = if t == "T" { 7 } else { 1 };
            let ins = [
                random(&mut rng, DType::BF16, &[n, 32], -1.0, 1.0),
                random(&mut rng, DType::BF16, &[128, 32], -1.0, 1.0),
                random(&mut rng, DType::I32, &[n], 0.0, 5000.0),
            ];
            let plan =
                compile_kernel(&gk.0, gk.1, &Target::SM_80).unwrap_or_else(|e| panic!("{e}"));
            check_built_on_cpu(
                &format!("qkv rope {form} T={t} ({})", plan.entry),
                &gk,
                &bind(&[("T", n as i64)]),
                &ins,
                128,
                || compile_kernel(&gk.0, gk.1, &Target::SM_80),
            );
        }
    }
}

#[test]
fn cpu_logical_ops_match_the_interpreter() {
    // A mask from comparisons and logical ops selecting between two tensors; bool loads,
    // stores and broadcasts.
    let src = "func @k(%i: i32[T, 40], %a: bool[T, 40], %b: bool[40], %x: bf16[T, 40]) {
  %lo: i32[] = constant() {value=3.0, dtype=i32}
  %hi: i32[] = constant() {value=30.0, dtype=i32}
  %ge: bool[T, 40] = ge(%i, %lo)
  %lt: bool[T, 40] = lt(%i, %hi)
  %in: bool[T, 40] = logical_and(%ge, %lt)
  %ab: bool[T, 40] = logical_or(%a, %b)
  %m: bool[T, 40] = logical_and(%in, %ab)
  %nm: bool[T, 40] = logical_not(%m)
  %z: bf16[] = constant() {value=0.0, dtype=bf16}
  %y: bf16[T, 40] = select(%nm, %z, %x)
  return %y, %nm, %ab
}";
    let gk = single(Family::Pointwise, body(src));
    let mut rng = Rng(23);
    let ins = [
        random(&mut rng, DType::I32, &[5, 40], 0.0, 40.0),
        random(&mut rng, DType::Bool, &[5, 40], 0.0, 2.0),
        random(&mut rng, DType::Bool, &[40], 0.0, 2.0),
        random(&mut rng, DType::BF16, &[5, 40], -3.0, 3.0),
    ];
    check_on_cpu("logical", &gk, &bind(&[("T", 5)]), &ins, 2);
    // Flat (no broadcast): vectorised bool loads and stores.
    let src = "func @k(%a: bool[T, 64], %b: bool[T, 64]) {
  %o: bool[T, 64] = logical_or(%a, %b)
  %n: bool[T, 64] = logical_not(%o)
  %x: bool[T, 64] = logical_and(%n, %a)
  return %n, %x
}";
    let gk = single(Family::Pointwise, body(src));
    let ins = [
        random(&mut rng, DType::Bool, &[3, 64], 0.0, 2.0),
        random(&mut rng, DType::Bool, &[3, 64], 0.0, 2.0),
    ];
    check_on_cpu("logical flat", &gk, &bind(&[("T", 3)]), &ins, 1);
}
