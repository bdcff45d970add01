//! GPU cases of `rope` with a partial rotary dim and Hugging Face's frequency scalings, alone
//! and in a QKV projection's epilogue, and of the logical ops; run by
//! `gpu_kernel_families_match_the_interpreter` (and compiled without a GPU by
//! `every_gpu_case_compiles_and_assembles_without_spills`, precompiled with the rest).

use super::*;

const YARN: &str = "scaling=\"yarn\", factor=4.0, original_max_position_embeddings=4096";
const LLAMA3: &str = "scaling=\"llama3\", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192";

/// Positions up to 10⁵ (the default inputs stop at 7), and a ±inf in `x` where it has one.
fn far_positions() -> Edit {
    Box::new(|ins: &mut Vec<(String, Tensor)>| {
        for (n, t) in ins.iter_mut() {
            let d: Vec<f64> = match n.as_str() {
                "pos" => (0..t.data().len())
                    .map(|i| ((i * 7919 + 13) % 100_000) as f64)
                    .collect(),
                "x" => t
                    .data()
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| if i == 5 { f64::INFINITY } else { v })
                    .collect(),
                _ => continue,
            };
            *t = Tensor::new(t.dtype(), t.shape(), d).unwrap();
        }
    })
}

/// The cases: partial and scaled ropes of both forms and dtypes; a merged QKV projection with
/// partial YaRN rope on Q and K (fused: in the matmul's epilogue; T = 1 takes the small-M
/// kernel); a windowed causal mask from the logical ops selecting scores or −inf.
pub(super) fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (dt, form, d, r, scaling) in [
        ("bf16", "rotate_half", 64, "rotary_dim=32, ", YARN),
        ("bf16", "interleaved", 64, "rotary_dim=16, ", LLAMA3),
        ("f32", "rotate_half", 128, "", LLAMA3),
        (
            "f32",
            "rotate_half",
            40,
            "rotary_dim=24, ",
            "scaling=\"linear\", factor=2.0",
        ),
        ("bf16", "rotate_half", 80, "rotary_dim=20, ", YARN),
    ] {
        let attrs = format!("theta=10000.0, form=\"{form}\", {r}{scaling}");
        let src = format!("func @main(%x: {dt}[2, T, 3, {d}], %pos: i32[T, 1]) {{\n  %y: {dt}[2, T, 3, {d}] = rope(%x, %pos) {{{attrs}}}\n  return %y\n}}");
        cases.push(Case::new(
            format!("rope {dt} D={d} {attrs}"),
            &src,
            &[("T", 5)],
            4,
            1.0,
            far_positions(),
        ));
    }
    for (t, form) in [
        ("T", "rotate_half"),
        ("1", "rotate_half"),
        ("1", "interleaved"),
    ] {
        let src = format!(
            "func @main(%x: bf16[{t}, 64], %w: bf16[192, 64], %pos: i32[{t}]) {{
  %m: bf16[{t}, 192] = matmul(%x, %w) {{transpose_b=true}}
  %p: i32[{t}, 1] = reshape(%pos) {{shape=[{t}, 1]}}
  %qs: bf16[{t}, 128] = slice(%m) {{start=0, end=128}}
  %q: bf16[{t}, 2, 64] = reshape(%qs) {{shape=[{t}, 2, 64]}}
  %qr: bf16[{t}, 2, 64] = rope(%q, %p) {{theta=10000.0, form=\"{form}\", rotary_dim=16, {YARN}}}
  %ks: bf16[{t}, 64] = slice(%m) {{start=128, end=192}}
  %k: bf16[{t}, 1, 64] = reshape(%ks) {{shape=[{t}, 1, 64]}}
  %kr: bf16[{t}, 1, 64] = rope(%k, %p) {{theta=10000.0, form=\"{form}\", rotary_dim=16, {YARN}}}
  return %qr, %kr
}}"
        );
        cases.push(Case::new(
            format!("qkv + partial yarn rope {form} T={t}"),
            &src,
            &[("T", 9)],
            5,
            1.0,
            far_positions(),
        ));
    }
    let mask = "func @main(%i: i32[T, 1], %j: i32[S], %sink: bool[S], %x: f32[T, S]) {
  %w: i32[] = constant() {value=3.0, dtype=i32}
  %lo: i32[T, 1] = sub(%i, %w)
  %causal: bool[T, S] = le(%j, %i)
  %old: bool[T, S] = lt(%j, %lo)
  %recent: bool[T, S] = logical_not(%old)
  %window: bool[T, S] = logical_and(%causal, %recent)
  %keep: bool[T, S] = logical_or(%window, %sink)
  %ninf: f32[] = constant() {value=-inf, dtype=f32}
  %y: f32[T, S] = select(%keep, %x, %ninf)
  return %y, %keep
}";
    cases.push(Case::new(
        "logical mask",
        mask,
        &[("T", 6), ("S", 33)],
        6,
        1.0,
        Box::new(none),
    ));
    cases
}
