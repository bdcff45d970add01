//! The fp8 GPU tests: the fp8 matmul and attention (one `wgmma` kernel each, every schedule
//! candidate) and the fp8 element-wise kernels on the device against the interpreter.

use super::*;

/// The fp8 matmuls of `gpu_fp8_matmul_matches_the_interpreter`: `(label, graph,
/// NaN position in a8)`. `dequantize_fp8(a8 [M, K], sa) · dequantize_fp8(b8 [N, K], sb)ᵀ` in
/// bf16 at 128×256×128 (whole tiles), 200×300×256 (M and N tails), 200×300×208 with a bias
/// `[N]` in the epilogue (a K tail: 208 = 128 + 80, a multiple of 16 as the 16-byte rows
/// need) and 1024³; each lowers to one kernel, the wgmma e4m3 GEMM on sm_90a.
pub(super) fn fp8_cases() -> Vec<(String, sinter::Graph, Option<usize>)> {
    let mut out = Vec::new();
    for (m, n, k, bias, nan) in [(128usize, 256usize, 128usize, false, None), (200, 300, 256, false, Some(57 * 256 + 3)), (200, 300, 208, true, None), (1024, 1024, 1024, false, Some(1000 * 1024 + 777))] {
        let g = if bias {
            sinter::graph! {
                fn main(a8: f8e4m3[{m}, {k}], sa: f32[], b8: f8e4m3[{n}, {k}], sb: f32[], bias: bf16[{n}]) -> bf16[{m}, {n}] {
                    a8.dequantize_fp8(sa, bf16).matmul(b8.dequantize_fp8(sb, bf16), transpose_b = true) + bias
                }
            }
        } else {
            sinter::graph! {
                fn main(a8: f8e4m3[{m}, {k}], sa: f32[], b8: f8e4m3[{n}, {k}], sb: f32[]) -> bf16[{m}, {n}] {
                    a8.dequantize_fp8(sa, bf16).matmul(b8.dequantize_fp8(sb, bf16), transpose_b = true)
                }
            }
        };
        out.push((format!("fp8 {m}x{n}x{k}{}", if bias { " + bias" } else { "" }), g.unwrap(), nan));
    }
    out
}

/// Inputs of an fp8 case: e4m3 operands from random values (A in ±8, B in ±200, rounded to
/// e4m3: normals and subnormals), scales 0.37 and 1.9 (≠ 1), a bias in ±2, NaN in a8 at `nan`.
pub(super) fn fp8_inputs(g: &sinter::Graph, seed: u64, nan: Option<usize>) -> Vec<(String, Tensor)> {
    let f = g.entry().unwrap();
    let mut rng = Rng::new(seed);
    f.params
        .iter()
        .map(|&p| {
            let name = f.values[p].name.clone().unwrap();
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
            let n: usize = shape.iter().product();
            let t = match name.as_str() {
                "sa" => Tensor::scalar(DType::F32, 0.37),
                "sb" => Tensor::scalar(DType::F32, 1.9),
                "a8" => Tensor::new(DType::F8E4M3, &shape, (0..n).map(|i| if Some(i) == nan { f64::NAN } else { 8.0 * rng.next_f64() }).collect()).unwrap(),
                "b8" => Tensor::new(DType::F8E4M3, &shape, (0..n).map(|_| 200.0 * rng.next_f64()).collect()).unwrap(),
                _ => Tensor::new(ty.dtype, &shape, (0..n).map(|_| 2.0 * rng.next_f64()).collect()).unwrap(),
            };
            (name, t)
        })
        .collect()
}

/// Without a GPU: each fp8 case lowers (fused) to one matmul kernel that sm_90a compiles to
/// the wgmma e4m3 GEMM — every schedule candidate a wgmma one, each assembled by ptxas without
/// spills — and that sm_80 refuses, naming f8e4m3.
#[cfg(feature = "llvm")]
#[test]
pub(super) fn fp8_cases_lower_to_one_wgmma_kernel() {
    for (label, g, _) in fp8_cases() {
        let mut names = fp8_kernel_lowers_to_one_wgmma_kernel(&label, &g, "_matmul_wgmma_e4m3");
        names.sort_unstable();
        assert_eq!(names, ["wgmma 128x128x128 s4 f1", "wgmma 128x128x128 s4 f1 tma", "wgmma 128x256x128 s4", "wgmma 128x256x128 s4 f1", "wgmma 128x256x128 s4 f1 tma"], "{label}");
    }
}

/// What the fp8 lowering tests check of fp8 graph `g`: it lowers (fused) to one tunable
/// kernel whose every sm_90a candidate is an e4m3 `wgmma` kernel (entry ending `entry`)
/// that ptxas assembles without spills, and that sm_80 refuses naming f8e4m3 and sm_90a.
/// Returns the candidates' names.
#[cfg(feature = "llvm")]
pub(super) fn fp8_kernel_lowers_to_one_wgmma_kernel(label: &str, g: &sinter::Graph, entry: &str) -> Vec<String> {
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap();
    let kg = sinter::gpu::lower(g, Lowering::Fused, &Target::SM_90A).unwrap();
    assert_eq!(kg.kernels.len(), 1, "{label}: one fused kernel");
    let k = kg.kernels.keys().next().unwrap();
    assert!(sinter::tune::tunable(&kg, k), "{label}");
    let variants = sinter_codegen::schedule_variants(&kg, k, &sinter_codegen::Target::SM_90A).unwrap();
    for v in &variants {
        assert!(v.plan.entry.ends_with(entry), "{label}: {}", v.plan.entry);
        if let Some(p) = &ptxas {
            let r = sinter_codegen::ptxas::assemble_with(p, &v.plan.ptx, &sinter_codegen::Target::SM_90A).unwrap_or_else(|e| panic!("{label} {}: {e}", v.name));
            assert!(!r.spills(), "{label} {}: spills {r:?}", v.name);
        }
    }
    let e = sinter_codegen::compile_kernel(&kg, k, &sinter_codegen::Target::SM_80).unwrap_err().to_string();
    assert!(e.contains("f8e4m3") && e.contains("sm_90a"), "{label}: {e}");
    variants.into_iter().map(|v| v.name).collect()
}

/// The fp8 matmul on the device against the interpreter, every schedule candidate
/// of its kernel pinned in turn (on sm_90a: the wgmma e4m3 kernel at 128×256 and 128×128
/// tiles, one product group in flight or none), at the shapes of [`fp8_cases`] with M, N and
/// K tails, scales ≠ 1 and NaN in an input. Tolerance: DESIGN.md's element-wise rule for a
/// bf16 result, unwidened. The interpreter computes the graph in f64 from the same e4m3
/// values, each dequantised operand rounded to bf16 (a relative 2⁻⁹ per operand) before an
/// exact product, rounded once to bf16; the kernel multiplies the e4m3 values exactly,
/// accumulates in f32 on the tensor cores (whose fp8 accumulation keeps fewer bits than
/// IEEE f32) and scales by `sa·sb` before that rounding. Those differences are random-signed
/// and about 2⁻⁸ of the terms, well inside rtol 1.6e-2 and atol 1e-2·max|ref| (for rows whose
/// sum cancels); NaN must appear exactly in the row of the NaN in a8.
#[test]
pub(super) fn gpu_fp8_matmul_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let cache = sinter_runtime::KernelCache::open_default().unwrap();
    let target = sinter::gpu::target_for(&dev);
    let mut fails = Vec::new();
    for (ci, (label, g, nan)) in fp8_cases().into_iter().enumerate() {
        let kg = sinter::gpu::lower(&g, Lowering::Fused, &target).unwrap();
        assert_eq!(kg.kernels.len(), 1, "{label}: one fused kernel");
        let k = kg.kernels.keys().next().unwrap();
        assert!(sinter::tune::tunable(&kg, k), "{label}: not tunable");
        let names = super::candidates::candidate_names(&kg, k, &target, &cache);
        assert!(names.len() >= 3 && names.iter().all(|n| n.starts_with("wgmma ")), "{label}: candidates {names:?}");
        let ins = fp8_inputs(&g, 300 + ci as u64, nan);
        let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
        let want = sinter::ir::interp::run_entry(&g, &refs, &Bindings::new()).unwrap();
        if nan.is_some() {
            assert!(want[0].data().iter().any(|x| x.is_nan()), "{label}: the reference has the NaN");
        }
        let named: Vec<(&str, &Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for name in &names {
            sinter::tune::pin(&kg, k, &target, &cache, &dev.info().name, name).unwrap();
            let r = GpuProgram::compile_with_options(&g, &dev, Lowering::Fused, false, &mut |_, _| {}).and_then(|p| p.run(&named, &Bindings::new()));
            match r {
                Ok(got) => match check(&format!("{label} [{name}]"), &got[0], &want[0], 1.0) {
                    Ok(()) => eprintln!("ok: {label} [{name}]"),
                    Err(e) => fails.push(e),
                },
                Err(e) => fails.push(format!("{label} [{name}]: {e}")),
            }
        }
        sinter::tune::forget(&kg, k, &target, &cache).unwrap();
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// The fp8 attentions of `gpu_fp8_attention_matches_the_interpreter`:
/// `attention(dequantize_fp8(q8, sq), dequantize_fp8(k8, sk), dequantize_fp8(v8, sv))`, bf16
/// out, `[B, H, S, D]`: `(label, graph, where to plant a NaN: input and element)`. Head dims 64 and
/// 128, causal and not, GQA (H/Hkv 1, 2, 4), sequence tails (1, 77, 300, 1024 keys; Sq ≠ Skv
/// both ways, causal Sq > Skv giving fully masked rows, which must be exactly 0), a NaN in q
/// (its row NaN) and a NaN in V at a key the causal mask hides from all but the last rows (NaN
/// there only). Each lowers to one kernel, the wgmma e4m3 attention on sm_90a.
#[allow(clippy::type_complexity)]
pub(super) fn fp8_attention_cases() -> Vec<(String, sinter::Graph, Option<(&'static str, usize)>)> {
    let mut out = Vec::new();
    // (B, H, Hkv, Sq, Skv, D, causal, NaN: 0 none, 1 in q, 2 in a hidden V row)
    let shapes = [
        (1usize, 4usize, 2usize, 1usize, 1usize, 128usize, false, 0u8),
        (2, 4, 1, 77, 77, 64, true, 0),
        (1, 8, 2, 300, 300, 128, true, 0),
        (1, 4, 4, 1024, 1024, 64, false, 0),
        (1, 4, 2, 1024, 1024, 128, true, 0),
        (1, 4, 2, 300, 77, 128, true, 0),
        (1, 2, 2, 77, 300, 64, false, 0),
        (1, 4, 2, 300, 300, 128, false, 1),
        (1, 4, 2, 300, 300, 128, true, 2),
    ];
    for (b, h, hkv, nq, nkv, d, causal, nan) in shapes {
        let scale = 1.0 / (d as f64).sqrt();
        let g = sinter::graph! {
            fn main(q8: f8e4m3[{b}, {h}, {nq}, {d}], sq: f32[], k8: f8e4m3[{b}, {hkv}, {nkv}, {d}], sk: f32[], w8: f8e4m3[{b}, {hkv}, {nkv}, {d}], sv: f32[]) -> bf16[{b}, {h}, {nq}, {d}] {
                q8.dequantize_fp8(sq, bf16).attention(k8.dequantize_fp8(sk, bf16), w8.dequantize_fp8(sv, bf16), scale = scale, causal = causal, heads = h, kv_heads = hkv)
            }
        }
        .unwrap();
        let label = format!("fp8 attention B{b} H{h}/{hkv} Sq{nq} Skv{nkv} D{d}{}{}", if causal { " causal" } else { "" }, ["", " NaN in q", " NaN in hidden V"][nan as usize]);
        let nan_at = match nan {
            // q row 150 of head 1.
            1 => Some(("q8", (nq + 150) * d + 3)),
            // V key Skv − 1 of KV head 0: visible to the last query row only (causal, Sq = Skv).
            2 => Some(("w8", (nkv - 1) * d + 5)),
            _ => None,
        };
        out.push((label, g, nan_at));
    }
    out
}

/// Inputs of an fp8 attention case: q8 and k8 uniform in ±4, w8 (V) in ±200, rounded to e4m3
/// (normals and subnormals), scales sq 0.37, sk 1.9, sv 0.8.
pub(super) fn fp8_attention_inputs(g: &sinter::Graph, seed: u64) -> Vec<(String, Tensor)> {
    let f = g.entry().unwrap();
    let mut rng = Rng::new(seed);
    f.params
        .iter()
        .map(|&p| {
            let name = f.values[p].name.clone().unwrap();
            let shape: Vec<usize> = f.ty(p).shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
            let n: usize = shape.iter().product();
            let t = match name.as_str() {
                "sq" => Tensor::scalar(DType::F32, 0.37),
                "sk" => Tensor::scalar(DType::F32, 1.9),
                "sv" => Tensor::scalar(DType::F32, 0.8),
                "w8" => Tensor::new(DType::F8E4M3, &shape, (0..n).map(|_| 200.0 * rng.next_f64()).collect()).unwrap(),
                _ => Tensor::new(DType::F8E4M3, &shape, (0..n).map(|_| 4.0 * rng.next_f64()).collect()).unwrap(),
            };
            (name, t)
        })
        .collect()
}

/// The fp8 tolerance of [`gpu_fp8_attention_matches_the_interpreter`], element-wise:
/// `|out − ref| ≤ atol + 1.6e-2·|ref|` with `atol = (2⁻⁴ + Skv·2⁻¹⁸)·max|V|·sv`, NaN exactly
/// where the reference has NaN, fully masked rows (`zero_rows`, query indices) exactly 0.
///
/// Why: the kernel rounds P = 2⁸·exp(s − m) ∈ [0, 256] to e4m3 (3 mantissa bits: a relative
/// error |δ| ≤ 2⁻⁴ for normals, p ≥ 2⁻¹⁴ of the row maximum) as the A operand of P·V, while
/// the row sum l is taken from the unrounded P. So O − O_ref = Σ_j p_j·δ_j·v_j / Σ_j p_j, at
/// most 2⁻⁴·max|v| — and for the subnormal p (below 2⁻¹⁴ of the row maximum; absolute error
/// at most 2⁻¹⁸ of it, and l ≥ that maximum) at most Skv·2⁻¹⁸·max|v| more. The interpreter
/// rounds the dequantised q, k, v to bf16 (2⁻⁹ each; the kernel multiplies the e4m3 values
/// exactly and scales in f32), and both round O to bf16 (the rtol). Measured on an H200
/// (sessions' scratch harness): max |diff| / max|V| 0.014 to 0.026.
pub(super) fn check_fp8_attention(name: &str, out: &Tensor, reference: &Tensor, v: &Tensor, sv: f64, skv: usize, zero_rows: &[usize]) -> Result<(), String> {
    if out.shape() != reference.shape() {
        return Err(format!("{name}: shape {:?} vs reference {:?}", out.shape(), reference.shape()));
    }
    let vmax = v.data().iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs())) * sv;
    let atol = (2f64.powi(-4) + skv as f64 * 2f64.powi(-18)) * vmax;
    let (sq, d) = (out.shape()[2], out.shape()[3]);
    // The first bad element's message, then every bad element counted by row (what a GPU
    // run needs to tell a race from a layout slip: which heads, rows and columns).
    let mut first: Option<String> = None;
    let mut bad_rows: std::collections::BTreeMap<usize, (usize, usize, usize, usize)> = std::collections::BTreeMap::new();
    for (i, (&o, &r)) in out.data().iter().zip(reference.data()).enumerate() {
        let msg = if r.is_nan() || o.is_nan() {
            (r.is_nan() != o.is_nan()).then(|| format!("{name}: element {i}: {o} vs reference {r} (NaN must match exactly)"))
        } else if zero_rows.contains(&((i / d) % sq)) && o != 0.0 {
            Some(format!("{name}: element {i} of a fully masked row: {o}, not 0"))
        } else {
            let tol = atol + 1.6e-2 * r.abs();
            ((o - r).abs() > tol).then(|| format!("{name}: element {i}: {o} vs reference {r} (|diff| {} > {tol})", (o - r).abs()))
        };
        if let Some(m) = msg {
            first.get_or_insert(m);
            let e = bad_rows.entry(i / d).or_insert((0, 0, usize::MAX, 0));
            e.0 += 1;
            e.1 += usize::from(o.is_nan());
            e.2 = e.2.min(i % d);
            e.3 = e.3.max(i % d);
        }
    }
    let Some(first) = first else { return Ok(()) };
    let (n, nan): (usize, usize) = bad_rows.values().fold((0, 0), |(n, k), e| (n + e.0, k + e.1));
    let rows: Vec<String> = bad_rows.iter().take(16).map(|(row, e)| format!("(bh {} row {}: {} bad, {} NaN, columns {}..={})", row / sq, row % sq, e.0, e.1, e.2, e.3)).collect();
    let more = if bad_rows.len() > 16 { format!(" and {} more rows", bad_rows.len() - 16) } else { String::new() };
    Err(format!("{first}; {n} bad elements ({nan} NaN) in {} rows: {}{more}", bad_rows.len(), rows.join(", ")))
}

/// Without a GPU: [`check_fp8_attention`] names the first bad element and counts every
/// bad one by (batch·head, row), with its NaNs and column span.
#[test]
pub(super) fn fp8_attention_check_summarises_every_bad_row() {
    let (sq, d) = (4usize, 2usize);
    let reference = Tensor::new(DType::F32, &[1, 2, sq, d], vec![1.0; 2 * sq * d]).unwrap();
    let v = Tensor::new(DType::F32, &[1, 1, 3, d], vec![1.0; 3 * d]).unwrap();
    let mut got = reference.data().to_vec();
    got[sq * d + 2 * d + 1] = f64::NAN; // head 1, row 2, column 1
    got[3 * d] = 5.0; // head 0, row 3, column 0
    let out = Tensor::new(DType::F32, &[1, 2, sq, d], got).unwrap();
    let e = check_fp8_attention("t", &out, &reference, &v, 1.0, 3, &[]).unwrap_err();
    assert!(e.starts_with("t: element 6: 5 vs reference 1"), "{e}");
    assert!(e.contains("2 bad elements (1 NaN) in 2 rows: (bh 0 row 3: 1 bad, 0 NaN, columns 0..=0), (bh 1 row 2: 1 bad, 1 NaN, columns 1..=1)"), "{e}");
    assert!(check_fp8_attention("t", &reference, &reference, &v, 1.0, 3, &[]).is_ok());
}

/// Without a GPU: each fp8 attention case lowers (fused) to one attention kernel whose
/// schedule candidates on sm_90a are the wgmma e4m3 kernel at 64-key tiles, plain and with
/// the intra-warpgroup overlap (`wgmma kv64 g2 e4m3`, `wgmma kv64 g2 ov e4m3`), each
/// assembled by ptxas without spills; sm_80
/// refuses it, naming f8e4m3.
#[cfg(feature = "llvm")]
#[test]
pub(super) fn fp8_attention_cases_lower_to_one_wgmma_kernel() {
    for (label, g, _) in fp8_attention_cases() {
        let names = fp8_kernel_lowers_to_one_wgmma_kernel(&label, &g, "_attention_wgmma_e4m3");
        assert_eq!(names, ["wgmma kv64 g2 e4m3", "wgmma kv64 g2 ov e4m3"], "{label}");
    }
}

/// The fp8 attention on the device against the interpreter, each schedule candidate
/// of its kernel pinned in turn (on sm_90a the wgmma e4m3 kernel at 64-key tiles, plain and
/// overlapped), at
/// the shapes of [`fp8_attention_cases`], under the tolerance of [`check_fp8_attention`]; the
/// fully masked rows (causal Sq > Skv) exactly 0, NaN exactly where the reference has it (a
/// NaN in q: its row; a NaN in V at a key the causal mask hides: only the rows that see it).
#[test]
pub(super) fn gpu_fp8_attention_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let cache = sinter_runtime::KernelCache::open_default().unwrap();
    let target = sinter::gpu::target_for(&dev);
    let mut fails = Vec::new();
    // SINTER_FP8_CASE=<part of a label> runs only the cases whose label holds it (a short
    // GPU run of one failing shape; the inputs are those of the full run).
    let only = std::env::var("SINTER_FP8_CASE").ok();
    for (ci, (label, g, nan_at)) in fp8_attention_cases().into_iter().enumerate() {
        if only.as_deref().is_some_and(|o| !label.contains(o)) {
            continue;
        }
        let kg = sinter::gpu::lower(&g, Lowering::Fused, &target).unwrap();
        assert_eq!(kg.kernels.len(), 1, "{label}: one fused kernel");
        let k = kg.kernels.keys().next().unwrap();
        assert!(sinter::tune::tunable(&kg, k), "{label}: not tunable");
        let names = super::candidates::candidate_names(&kg, k, &target, &cache);
        assert!(names.len() == 2 && names.iter().all(|n| n.starts_with("wgmma kv64 ") && n.ends_with(" e4m3")), "{label}: candidates {names:?}");
        let mut ins = fp8_attention_inputs(&g, 400 + ci as u64);
        if let Some((input, at)) = nan_at {
            let t = &mut ins.iter_mut().find(|(n, _)| n == input).unwrap().1;
            let mut d = t.data().to_vec();
            d[at] = f64::NAN;
            *t = Tensor::new(t.dtype(), t.shape(), d).unwrap();
        }
        let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
        let want = sinter::ir::interp::run_entry(&g, &refs, &Bindings::new()).unwrap();
        let v = &ins.iter().find(|(n, _)| n == "w8").unwrap().1;
        let (sq, skv) = (want[0].shape()[2], v.shape()[2]);
        // Causal, bottom-right: query i sees keys j ≤ i + Skv − Sq; none when i < Sq − Skv.
        let causal = label.contains("causal");
        let zero_rows: Vec<usize> = if causal { (0..sq.saturating_sub(skv)).collect() } else { Vec::new() };
        if label.contains("NaN") {
            let nan_rows = want[0].data().chunks(want[0].shape()[3]).filter(|r| r.iter().any(|x| x.is_nan())).count();
            assert!(nan_rows >= 1 && nan_rows < want[0].data().len() / want[0].shape()[3] / 2, "{label}: {nan_rows} NaN rows in the reference");
        }
        let named: Vec<(&str, &Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for name in &names {
            sinter::tune::pin(&kg, k, &target, &cache, &dev.info().name, name).unwrap();
            let r = GpuProgram::compile_with_options(&g, &dev, Lowering::Fused, false, &mut |_, _| {}).and_then(|p| p.run(&named, &Bindings::new()));
            match r {
                Ok(got) => match check_fp8_attention(&format!("{label} [{name}]"), &got[0], &want[0], v, 0.8, skv, &zero_rows) {
                    Ok(()) => eprintln!("ok: {label} [{name}]"),
                    Err(e) => fails.push(e),
                },
                Err(e) => fails.push(format!("{label} [{name}]: {e}")),
            }
        }
        sinter::tune::forget(&kg, k, &target, &cache).unwrap();
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// The fp8 element-wise graphs of [`gpu_fp8_quantize_matches_the_interpreter`]:
/// `quantize_fp8(x, s)`, `dequantize_fp8(x8, s)` and the fake-quant round trip
/// `dequantize_fp8(quantize_fp8(x, s), s)` of bf16 and f32 tensors of odd lengths, as
/// (label, graph).
pub(super) fn fp8_element_graphs() -> Vec<(String, sinter::Graph)> {
    let mut out = Vec::new();
    for dt in ["bf16", "f32"] {
        for n in [1usize, 17, 1000, 4097] {
            let srcs = [
                ("quantize", format!("func @main(%x: {dt}[{n}], %s: f32[]) {{\n  %q: f8e4m3[{n}] = quantize_fp8(%x, %s)\n  return %q\n}}\n")),
                ("dequantize", format!("func @main(%x8: f8e4m3[{n}], %s: f32[]) {{\n  %y: {dt}[{n}] = dequantize_fp8(%x8, %s) {{dtype={dt}}}\n  return %y\n}}\n")),
                ("fake quant", format!("func @main(%x: {dt}[{n}], %s: f32[]) {{\n  %q: f8e4m3[{n}] = quantize_fp8(%x, %s)\n  %y: {dt}[{n}] = dequantize_fp8(%q, %s) {{dtype={dt}}}\n  return %y\n}}\n")),
            ];
            for (what, src) in srcs {
                out.push((format!("{what} {dt}[{n}]"), sinter::ir::parse(&src).unwrap_or_else(|e| panic!("{what} {dt}[{n}]: {e}\n{src}"))));
            }
        }
    }
    out
}

/// The targets whose kernels the fp8 GPU tests run on a device whose own target is `own`: the
/// device's (sm_90a on Hopper: the `cvt … e4m3x2` conversions) and sm_80 (the integer
/// conversions; sm_80 PTX runs on every later GPU).
pub(super) fn fp8_test_targets(own: Target) -> Vec<Target> {
    if own == Target::SM_80 {
        vec![Target::SM_80]
    } else {
        vec![own, Target::SM_80]
    }
}

/// Inputs of an fp8 element graph: `x` (bf16 or f32) holds ±0, e4m3 subnormals and their ties
/// (times the scale, and as they are), the ties between neighbouring e4m3 values, ±448,
/// values past it (saturation), ±inf, NaN, then random values over 2⁻¹²..2¹⁰ of both signs;
/// `x8` cycles through all 256 e4m3 codes (±0, subnormals, ±448, NaN); `s` is `scale`.
pub(super) fn fp8_element_inputs(g: &sinter::Graph, scale: f64, seed: u64) -> Vec<(String, Tensor)> {
    let f = g.entry().unwrap();
    let mut rng = Rng::new(seed);
    let e4m3 = sinter::ir::dtype::f8e4m3_to_f64;
    let mut special = vec![0.0, -0.0, 448.0, -448.0, 449.0, 464.0, -470.0, 1e6, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 2f64.powi(-10), -(2f64.powi(-10)), 3.0 * 2f64.powi(-10), 2f64.powi(-11)];
    for b in (0..0x7Eu8).step_by(3) {
        let (lo, hi) = (e4m3(b), e4m3(b + 1));
        special.extend([lo, -hi, (lo + hi) / 2.0, -(lo + hi) / 2.0, (lo + hi) / 2.0 * scale, lo * scale]);
    }
    f.params
        .iter()
        .map(|&p| {
            let name = f.values[p].name.clone().unwrap();
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
            let n: usize = shape.iter().product();
            let t = match name.as_str() {
                "s" => Tensor::scalar(DType::F32, scale),
                "x8" => Tensor::new(DType::F8E4M3, &shape, (0..n).map(|i| e4m3(((i * 37 + 11) % 256) as u8)).collect()).unwrap(),
                _ => {
                    let data = (0..n)
                        .map(|i| special.get(i).copied().unwrap_or_else(|| {
                            let u = rng.next_f64();
                            u.signum() * 2f64.powf(-12.0 + 22.0 * u.abs())
                        }))
                        .collect();
                    Tensor::new(ty.dtype, &shape, data).unwrap()
                }
            };
            (name, t)
        })
        .collect()
}

/// Runs kernel graph `kg` on the device with the plans of `target` (from the kernel cache, or
/// compiled where LLVM is built in), inputs by buffer name; outputs carry a poisoned guard.
pub(super) fn run_kernel_graph_on(dev: &Device, kg: &sinter::ir::KernelGraph, target: &Target, named: &[(String, Tensor)]) -> Result<Vec<Tensor>, sinter::Error> {
    let cache = sinter_runtime::KernelCache::open_default()?;
    let mut stats = sinter::gpu::CompileStats::default();
    let plans = sinter::gpu::plans(kg, target, &cache, &mut stats)?;
    let ex = sinter_runtime::Executor::new(dev, kg, plans)?.with_output_guard(256, 0xFF);
    let bufs = kg
        .inputs
        .iter()
        .map(|b| {
            let name = kg.buffers[*b].name.clone().unwrap_or_default();
            let t = named.iter().find(|(n, _)| *n == name).map(|(_, t)| t).ok_or_else(|| sinter::Error::Unsupported(format!("no input {name}")))?;
            Ok(dev.upload_tensor(t)?)
        })
        .collect::<Result<Vec<_>, sinter::Error>>()?;
    let refs: Vec<&sinter_runtime::DeviceBuffer> = bufs.iter().collect();
    let outs = ex.run(&refs, &Bindings::new())?;
    Ok(outs.iter().map(|o| dev.download_tensor(o)).collect::<Result<Vec<_>, _>>()?)
}

/// `quantize_fp8`, `dequantize_fp8` and the fake-quant round trip on the device,
/// bit for bit against the interpreter: bf16 and f32 tensors of lengths 1, 17, 1000 and 4097
/// ([`fp8_element_graphs`]) holding ±0, e4m3 subnormals, ties, ±448, values past 448
/// (saturation), ±inf and NaN, every e4m3 code for `dequantize_fp8` ([`fp8_element_inputs`]);
/// scales 0.37 and 1.9 (and 1 and 0.5, which keep ties ties); both lowerings; the kernels of
/// the device's target (sm_90a: `cvt.rn.satfinite.e4m3x2.f32`, `cvt.rn.f16x2.e4m3x2`) and of
/// sm_80 (the integer conversions, run through the driver's JIT). Every element must equal
/// the interpreter's exactly (the same f64 bits; NaN where it has NaN — the two e4m3 NaN
/// codes are one value), and the guard tails stay untouched.
#[test]
pub(super) fn gpu_fp8_quantize_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let own = sinter::gpu::target_for(&dev);
    let mut fails = Vec::new();
    let mut checked = 0;
    for (gi, (label, g)) in fp8_element_graphs().into_iter().enumerate() {
        for (si, scale) in [0.37, 1.9, 1.0, 0.5].into_iter().enumerate() {
            let ins = fp8_element_inputs(&g, scale, 900 + (gi * 4 + si) as u64);
            let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
            let want = sinter::ir::interp::run_entry(&g, &refs, &Bindings::new()).unwrap();
            for lowering in [Lowering::Unfused, Lowering::Fused] {
                let kg = sinter::gpu::lower(&g, lowering, &own).unwrap();
                for target in fp8_test_targets(own) {
                    let name = format!("{label} s={scale} [{lowering:?} {target}]");
                    match run_kernel_graph_on(&dev, &kg, &target, &ins) {
                        Ok(got) => {
                            let (o, w) = (&got[0], &want[0]);
                            let bad = o.data().iter().zip(w.data()).enumerate().find(|(_, (a, b))| !(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())));
                            if o.dtype() != w.dtype() || o.shape() != w.shape() {
                                fails.push(format!("{name}: {:?} {:?} vs {:?} {:?}", o.dtype(), o.shape(), w.dtype(), w.shape()));
                            } else if let Some((i, (a, b))) = bad {
                                let x = ins.iter().find(|(n, _)| n.starts_with('x')).map(|(_, t)| t.data()[i]).unwrap_or(f64::NAN);
                                fails.push(format!("{name}: element {i} (input {x:e}): {a:e} vs the interpreter's {b:e}"));
                            } else {
                                checked += 1;
                            }
                        }
                        Err(e) => fails.push(format!("{name}: {e}")),
                    }
                }
            }
        }
    }
    eprintln!("fp8 element graphs: {checked} runs bit-exact");
    fails.truncate(12);
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// The fp8 matmul cases ([`fp8_cases`]) lowered *unfused* — each `dequantize_fp8` its own
/// pointwise kernel writing bf16, then the bf16 GEMM (and the bias add) — on the device
/// against the interpreter, with the kernels of the device's target and of sm_80 (no fp8
/// tensor cores needed: the path a non-Hopper GPU takes). The unfused graph computes what the
/// interpreter does (bf16 operands, a bf16 GEMM), so DESIGN.md's bf16 rule applies unwidened;
/// NaN must appear exactly where the reference has it.
#[test]
pub(super) fn gpu_fp8_matmul_unfused_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let own = sinter::gpu::target_for(&dev);
    let mut fails = Vec::new();
    for (ci, (label, g, nan)) in fp8_cases().into_iter().enumerate() {
        let kg = sinter::gpu::lower(&g, Lowering::Unfused, &own).unwrap();
        let ins = fp8_inputs(&g, 700 + ci as u64, nan);
        let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
        let want = sinter::ir::interp::run_entry(&g, &refs, &Bindings::new()).unwrap();
        for target in fp8_test_targets(own) {
            let name = format!("{label} [Unfused {target}]");
            match run_kernel_graph_on(&dev, &kg, &target, &ins) {
                Ok(got) => match check(&name, &got[0], &want[0], 1.0) {
                    Ok(()) => eprintln!("ok: {name}"),
                    Err(e) => fails.push(e),
                },
                Err(e) => fails.push(format!("{name}: {e}")),
            }
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// Without a GPU: the unfused lowering of every fp8 matmul case ([`fp8_cases`]: a pointwise
/// `dequantize_fp8` kernel per operand, then the bf16 GEMM) and every fp8 element graph
/// ([`fp8_element_graphs`]) compile for sm_80, sm_90 and sm_90a, each kernel assembled by
/// ptxas, the fp8 ones without spills.
#[cfg(feature = "llvm")]
#[test]
pub(super) fn fp8_unfused_and_element_graphs_compile_on_every_target() {
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap();
    let mut graphs: Vec<(String, sinter::Graph, Lowering)> = fp8_cases().into_iter().map(|(l, g, _)| (l, g, Lowering::Unfused)).collect();
    graphs.extend(fp8_element_graphs().into_iter().filter(|(l, _)| l.ends_with("[17]") || l.ends_with("[4097]")).flat_map(|(l, g)| [(l.clone(), g.clone(), Lowering::Unfused), (l, g, Lowering::Fused)]));
    for (label, g, lowering) in graphs {
        let kg = sinter::gpu::lower(&g, lowering, &Target::SM_90A).unwrap();
        if label.starts_with("fp8 ") {
            let dequant = kg.kernels.values().filter(|k| k.body.nodes.values().any(|n| n.op.kind == sinter::ir::OpKind::DequantizeFp8)).count();
            assert_eq!(dequant, 2, "{label}: one dequantize_fp8 kernel per operand");
        }
        for t in sinter_codegen::target::Target::ALL {
            for k in kg.kernels.keys() {
                let plan = sinter_codegen::compile_kernel(&kg, k, &t).unwrap_or_else(|e| panic!("{label} [{lowering:?}] {t}: {e}"));
                if let Some(p) = &ptxas {
                    let r = sinter_codegen::ptxas::assemble_with(p, &plan.ptx, &t).unwrap_or_else(|e| panic!("{label} {t}: {e}"));
                    // The fp8 kernels must not spill; the bf16 GEMM of the unfused lowering is
                    // the ordinary one (its default sm_80 schedule spills at 200x300, not an
                    // fp8 matter: reported, not failed).
                    if kg.kernels[k].family == sinter::ir::Family::Matmul {
                        if r.spills() {
                            eprintln!("note: {label} [{lowering:?}] {t} {k} (bf16 GEMM): spills {r:?}");
                        }
                    } else {
                        assert!(!r.spills(), "{label} [{lowering:?}] {t} {k}: spills {r:?}");
                    }
                }
            }
        }
    }
}
