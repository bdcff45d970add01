//! Emulated tests of the cascade pieces: the log-sum-exp outputs of the attention generators
//! (CUDA-core prefill and paged, tensor-core prefill, split-KV decode) and the merge kernel,
//! all against the interpreter (`matmul::emu`), and their ptxas reports.

use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, Bindings, DType, Dim, Family, FunctionBuilder, Graph, Kernel, KernelGraph, OpKind};

use crate::kernels::attention::merge::*;
use crate::kernels::attention::{generate_paged, generate_prefill, generate_prefill_with, AttentionSchedule};
use crate::emu::{check, random};
use crate::testing::{assemble, d, plan_line, single_kernel, sym, ty};
use crate::target::Target;

fn bind(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// `attention(q, k, v) {lse=true}` returning (o, lse); `bshd` puts S before H.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prefill_lse(dt: DType, b: Dim, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, causal: bool, bshd: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "prefix");
    let shape = |heads: i64, s: &Dim| if bshd { vec![b.clone(), s.clone(), d(heads), d(hd)] } else { vec![b.clone(), d(heads), s.clone(), d(hd)] };
    let q = fb.param("q", ty(dt, &shape(h, &sq)));
    let k = fb.param("k", ty(dt, &shape(hkv, &skv)));
    let v = fb.param("v", ty(dt, &shape(hkv, &skv)));
    let attrs = vec![
        ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
        ("causal", Attr::Bool(causal)),
        ("heads", Attr::Int(h)),
        ("kv_heads", Attr::Int(hkv)),
        ("layout", Attr::Str(if bshd { "bshd" } else { "bhsd" }.into())),
        ("lse", Attr::Bool(true)),
    ];
    let r = fb.op(OpKind::Attention, &[q, k, v], attrs).unwrap();
    single_kernel(Family::Attention, fb.finish(&r).unwrap())
}

/// `paged_attention(...) {lse=true}` over pages `[P, page, Hkv, D]`, returning (o, lse).
pub(crate) fn paged_lse(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "suffix");
    let q = fb.param("q", ty(dt, &[b.clone(), d(h), t, d(hd)]));
    let kp = fb.param("k_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
    let vp = fb.param("v_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
    let bt = fb.param("block_table", ty(DType::I32, &[b.clone(), sym("M")]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
    let attrs = vec![
        ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
        ("causal", Attr::Bool(true)),
        ("heads", Attr::Int(h)),
        ("kv_heads", Attr::Int(hkv)),
        ("lse", Attr::Bool(true)),
    ];
    let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
    single_kernel(Family::PagedAttention, fb.finish(&r).unwrap())
}

/// `attention_merge` of o `[rows…, D]`: contiguous operands, or (`halves`) o_a and o_b as
/// the two last-axis halves of one `[rows…, 2D]` input and lse_a, lse_b as the two
/// leading-axis halves of one `[2, rows…]` input (strided and offset views).
pub(crate) fn merge_graph(dt: DType, rows: &[Dim], hd: i64, halves: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "merge");
    let mut os: Vec<Dim> = rows.to_vec();
    os.push(d(hd));
    let (oa, la, ob, lb) = if halves {
        let mut wide = rows.to_vec();
        wide.push(d(2 * hd));
        let mut two = vec![d(2)];
        two.extend(rows.iter().cloned());
        let o = fb.param("o", ty(dt, &wide));
        let l = fb.param("lse", ty(DType::F32, &two));
        let last = rows.len() as i64;
        let sl = |fb: &mut FunctionBuilder, x, axis: i64, a: i64, b: i64| {
            fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(axis)), ("start", Attr::Int(a)), ("end", Attr::Int(b))]).unwrap()
        };
        let oa = sl(&mut fb, o, last, 0, hd);
        let ob = sl(&mut fb, o, last, hd, 2 * hd);
        let la = sl(&mut fb, l, 0, 0, 1);
        let lb = sl(&mut fb, l, 0, 1, 2);
        let la = fb.op1(OpKind::Reshape, &[la], vec![("shape", Attr::Dims(rows.to_vec()))]).unwrap();
        let lb = fb.op1(OpKind::Reshape, &[lb], vec![("shape", Attr::Dims(rows.to_vec()))]).unwrap();
        (oa, la, ob, lb)
    } else {
        let oa = fb.param("o_a", ty(dt, &os));
        let la = fb.param("lse_a", ty(DType::F32, rows));
        let ob = fb.param("o_b", ty(dt, &os));
        let lb = fb.param("lse_b", ty(DType::F32, rows));
        (oa, la, ob, lb)
    };
    let r = fb.op(OpKind::AttentionMerge, &[oa, la, ob, lb], vec![]).unwrap();
    single_kernel(Family::AttentionMerge, fb.finish(&r).unwrap())
}

fn with_values(t: Tensor, at: &[(usize, f64)]) -> Tensor {
    let mut data = t.data().to_vec();
    for &(i, v) in at {
        data[i] = v;
    }
    Tensor::new(t.dtype(), t.shape(), data).unwrap()
}

/// The merge: rows where both states are finite, one is −inf (its o NaN: not read), both
/// are −inf (0, −inf), a NaN lse, +inf lse; bf16 vectorised with symbolic rows; f32 with
/// an odd D (element by element) through strided and offset views.
#[test]
fn emulated_merge_matches_interpreter() {
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
    let (g, k) = merge_graph(DType::BF16, &[sym("B"), d(4), d(1)], 64, false);
    let b = 3usize;
    let rows = b * 4;
    let la = with_values(random(DType::F32, &[b, 4, 1], 1), &[(1, f64::NEG_INFINITY), (2, f64::NEG_INFINITY), (5, f64::NAN), (6, f64::INFINITY)]);
    let lb = with_values(random(DType::F32, &[b, 4, 1], 2), &[(2, f64::NEG_INFINITY), (3, f64::NEG_INFINITY), (7, 40.0)]);
    // NaN in o_a of row 1 (lse_a −inf: never read) and of row 3's o_b (lse_b −inf).
    let oa = with_values(random(DType::BF16, &[b, 4, 1, 64], 3), &[(64 + 7, f64::NAN)]);
    let ob = with_values(random(DType::BF16, &[b, 4, 1, 64], 4), &[(3 * 64 + 9, f64::NAN)]);
    assert_eq!(rows, 12);
    check("merge bf16 B×4×1×64", &g, k, gen, &[oa, la, ob, lb], &bind(&[("B", b as i64)]));
    let (g, k) = merge_graph(DType::F32, &[sym("R")], 5, true);
    let r = 9usize;
    let l = with_values(random(DType::F32, &[2, r], 5), &[(0, f64::NEG_INFINITY), (r, f64::NEG_INFINITY), (r + 1, f64::NEG_INFINITY)]);
    check("merge f32 D5 views", &g, k, gen, &[random(DType::F32, &[r, 10], 6), l], &bind(&[("R", r as i64)]));
}

/// Rows' lse from the CUDA-core prefill kernel (f32, and bf16 with another schedule),
/// with fully masked rows (causal, more queries than keys) and no keys at all.
#[test]
fn emulated_prefill_lse_cuda_cores() {
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    let (g, k) = prefill_lse(DType::F32, sym("B"), 4, 2, sym("T"), sym("S"), 40, true, false);
    for (t, s) in [(7usize, 3usize), (5, 40), (3, 0)] {
        let ins = [random(DType::F32, &[1, 4, t, 40], 10), random(DType::F32, &[1, 2, s, 40], 11), random(DType::F32, &[1, 2, s, 40], 12)];
        check(&format!("f32 lse Sq={t} Skv={s}"), &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", s as i64)]));
    }
    let sch = AttentionSchedule { warps: 2, rows_per_warp: 4 };
    let gen_s = |g: &KernelGraph, k: Kernel| generate_prefill_with(g, k, &Target::SM_80, &sch);
    let (g, k) = prefill_lse(DType::BF16, d(2), 3, 1, sym("T"), sym("S"), 32, false, true);
    let ins = [random(DType::BF16, &[2, 9, 3, 32], 13), random(DType::BF16, &[2, 33, 1, 32], 14), random(DType::BF16, &[2, 33, 1, 32], 15)];
    check("bf16 bshd lse CUDA cores", &g, k, gen_s, &ins, &bind(&[("T", 9), ("S", 33)]));
}

/// Rows' lse from the tensor-core prefill kernel: the cascade's prefix shape in small
/// (`bshd`, the batch axis holding key chunks, every query row of a chunk over one KV
/// head), GQA 8, causal with fully masked rows, tails.
#[test]
fn emulated_prefill_lse_tensor_cores() {
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    let (g, k) = prefill_lse(DType::BF16, d(2), 2, 2, sym("T"), sym("S"), 64, false, true);
    let plan = generate_prefill(&g, k, &Target::SM_80).unwrap();
    assert!(plan.ptx.contains("mma.sync"), "not the tensor-core kernel");
    let ins = [random(DType::BF16, &[2, 17, 2, 64], 20), random(DType::BF16, &[2, 70, 2, 64], 21), random(DType::BF16, &[2, 70, 2, 64], 22)];
    check("tc bshd lse", &g, k, gen, &ins, &bind(&[("T", 17), ("S", 70)]));
    let (g, k) = prefill_lse(DType::BF16, d(1), 8, 1, sym("T"), sym("S"), 128, true, false);
    let ins = [random(DType::BF16, &[1, 8, 20, 128], 23), random(DType::BF16, &[1, 1, 9, 128], 24), random(DType::BF16, &[1, 1, 9, 128], 25)];
    check("tc GQA 8 causal Sq>Skv lse", &g, k, gen, &ins, &bind(&[("T", 20), ("S", 9)]));
}

/// Rows' lse from the split-KV decode kernel (sm_80: the split across warps) and the
/// CUDA-core paged kernel: sequence lengths 0 (−inf), 1, a partly filled page and several
/// tiles a worker; GQA 1, 3 and 8.
#[test]
fn emulated_paged_lse() {
    let (b, pages, page, m) = (4usize, 40usize, 16usize, 10usize);
    let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect()).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 37.0, 160.0]).unwrap();
    let sizes = bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]);
    for (h, hkv, hd) in [(2i64, 2i64, 64usize), (3, 1, 64), (8, 1, 128)] {
        let (g, k) = paged_lse(DType::BF16, h, hkv, d(1), hd as i64, page as i64);
        let ins = [
            random(DType::BF16, &[b, h as usize, 1, hd], 30),
            random(DType::BF16, &[pages, page, hkv as usize, hd], 31),
            random(DType::BF16, &[pages, page, hkv as usize, hd], 32),
            table.clone(),
            lens.clone(),
        ];
        let decode = |g: &KernelGraph, k: Kernel| crate::kernels::attention::decode::generate(g, k, &Target::SM_80);
        check(&format!("split-KV lse GQA {h}/{hkv} D{hd}"), &g, k, decode, &ins, &sizes);
        let cuda = |g: &KernelGraph, k: Kernel| generate_paged(g, k, &Target::SM_80);
        check(&format!("CUDA-core paged lse GQA {h}/{hkv} D{hd}"), &g, k, cuda, &ins, &sizes);
    }
}

/// The cascade kernels at the bench shape (prefix attention on tensor cores with lse, the
/// suffix decode with lse, the merge), sm_80 and sm_90a: plans and ptxas reports, no
/// spills.
#[test]
fn cascade_ptxas_reports() {
    let cases = vec![
        ("prefix bf16 D128 bshd [16, 256, 8, 128] over [16, 2048, 8, 128] lse", prefill_lse(DType::BF16, d(16), 8, 8, d(256), d(2048), 128, false, true)),
        ("prefix bf16 D128 bshd symbolic lse", prefill_lse(DType::BF16, sym("N"), 8, 8, sym("R"), sym("S"), 128, false, true)),
        ("prefix f32 D64 CUDA cores lse", prefill_lse(DType::F32, sym("B"), 4, 4, sym("T"), sym("S"), 64, true, false)),
        ("suffix bf16 D128 GQA 32/8 T=1 page 16 lse", paged_lse(DType::BF16, 32, 8, d(1), 128, 16)),
        ("merge bf16 [B, 32, 1, 128]", merge_graph(DType::BF16, &[sym("B"), d(32), d(1)], 128, false)),
        ("merge f32 [R, 5] views", merge_graph(DType::F32, &[sym("R")], 5, true)),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = crate::compile_kernel(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("cascade_ptxas", text);
}
