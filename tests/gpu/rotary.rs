//! GPU cases of rotation by caller-supplied tables (`rotary`): Hugging Face's
//! `apply_rotary_pos_emb(q, k, cos, sin)` written out after the head transpose with
//! `position_embeddings` as graph inputs, which the passes recognise as `rotary` and fuse
//! into the QKV projection's epilogue (T = 1: the small-M kernel) or into the q norm's row
//! kernel; and the op alone (interleaved, partial, f32 tables with bf16 x). Run by
//! `gpu_kernel_families_match_the_interpreter` under both lowerings (and compiled without a
//! GPU by `every_gpu_case_compiles_and_assembles_without_spills`).

use super::*;

/// A NaN in a cos entry and a +inf in `x`, where the graph has those inputs.
fn nan_table() -> Edit {
    Box::new(|ins: &mut Vec<(String, Tensor)>| {
        for (n, t) in ins.iter_mut() {
            let at = match n.as_str() {
                "cos" => 3,
                "x" => 5,
                _ => continue,
            };
            let v = if n == "cos" { f64::NAN } else { f64::INFINITY };
            let d: Vec<f64> = t.data().iter().enumerate().map(|(i, &x)| if i == at { v } else { x }).collect();
            *t = Tensor::new(t.dtype(), t.shape(), d).unwrap();
        }
    })
}

/// `x·c + rotate_half(x)·s` over `x` (`[H, T, D]`) with tables `cos`/`sin` `[T, D]` viewed as
/// `[1, T, D]`, in `dt`: the lines of a graph computing `%y` from `%x`.
fn hf_rotate_half(dt: &str, h: i64, d: i64) -> String {
    let hd = d / 2;
    format!(
        "  %c: {dt}[1, T, {d}] = reshape(%cos) {{shape=[1, T, {d}]}}
  %s: {dt}[1, T, {d}] = reshape(%sin) {{shape=[1, T, {d}]}}
  %x1: {dt}[{h}, T, {hd}] = slice(%xt) {{axis=-1, start=0, end={hd}}}
  %x2: {dt}[{h}, T, {hd}] = slice(%xt) {{axis=-1, start={hd}, end={d}}}
  %nx2: {dt}[{h}, T, {hd}] = neg(%x2)
  %rot: {dt}[{h}, T, {d}] = concat(%nx2, %x1) {{axis=-1}}
  %a: {dt}[{h}, T, {d}] = mul(%xt, %c)
  %b: {dt}[{h}, T, {d}] = mul(%rot, %s)
  %y: {dt}[{h}, T, {d}] = add(%a, %b)
"
    )
}

pub(super) fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // The projection then the rotation by tables, HF's order (view, transpose, rotate,
    // transpose back): fused into the matmul's epilogue.
    for (t, dt) in [(9, "bf16"), (1, "bf16"), (7, "f32")] {
        let src = format!(
            "func @main(%h: {dt}[T, 64], %w: {dt}[128, 64], %cos: {dt}[T, 64], %sin: {dt}[T, 64]) {{
  %q: {dt}[T, 128] = matmul(%h, %w) {{transpose_b=true}}
  %qh: {dt}[T, 2, 64] = reshape(%q) {{shape=[T, 2, 64]}}
  %xt: {dt}[2, T, 64] = permute(%qh) {{perm=[1, 0, 2]}}
{}  %yb: {dt}[T, 2, 64] = permute(%y) {{perm=[1, 0, 2]}}
  return %yb
}}",
            hf_rotate_half(dt, 2, 64)
        );
        cases.push(Case::new(format!("matmul → rotary by tables {dt} T={t}"), &src, &[("T", t)], 7, 1.0, Box::new(none)));
    }
    // Qwen3's q norm (RMSNorm over the head, f32 inside) then the rotation by tables after
    // the transpose: fused into the norm's row kernel.
    for dt in ["bf16", "f32"] {
        let src = format!(
            "func @main(%x: {dt}[T, 4, 128], %nw: {dt}[128], %cos: {dt}[T, 128], %sin: {dt}[T, 128]) {{
  %n: {dt}[T, 4, 128] = rms_norm(%x, %nw) {{eps=1e-6}}
  %xt: {dt}[4, T, 128] = permute(%n) {{perm=[1, 0, 2]}}
{}  %yb: {dt}[T, 4, 128] = permute(%y) {{perm=[1, 0, 2]}}
  return %yb
}}",
            hf_rotate_half(dt, 4, 128)
        );
        cases.push(Case::new(format!("rms_norm → rotary by tables {dt}"), &src, &[("T", 6)], 8, 1.0, Box::new(specials("cos", &[(3, f64::NAN)]))));
    }
    // The op itself: interleaved with f32 tables, partial, broadcast over [B, H, T, D].
    for (form, r, tdt) in [("interleaved", 64, "f32"), ("rotate_half", 32, "bf16"), ("interleaved", 16, "bf16")] {
        let rd = if r < 64 { format!(", rotary_dim={r}") } else { String::new() };
        let src = format!(
            "func @main(%x: bf16[2, 3, T, 64], %cos: {tdt}[2, 1, T, {r}], %sin: {tdt}[2, 1, T, {r}]) {{
  %y: bf16[2, 3, T, 64] = rotary(%x, %cos, %sin) {{form=\"{form}\"{rd}}}
  return %y
}}"
        );
        cases.push(Case::new(format!("rotary {form} R={r} tables {tdt}"), &src, &[("T", 5)], 9, 1.0, nan_table()));
    }
    cases
}
