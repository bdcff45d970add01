//! Tests of the attention families: CUDA-core kernels ([`simt`]), tensor-core prefill
//! ([`tensor_core`]), split-KV decode ([`decode`]) and the merge ([`merge`]), each against
//! the interpreter on the CPU emulator where it can run them, with ptxas reports; and the
//! graphs they share.

mod decode;
mod extremes;
mod wide;
mod merge;
mod simt;
mod tensor_core;
mod window;

use sinter_ir::{Attr, DType, Dim, Family, FunctionBuilder, Graph, Kernel, KernelGraph, OpKind};

use crate::testing::{d, single_kernel, sym, ty};

/// `attention(q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], mask [Sq, Skv]?)`.
#[allow(clippy::too_many_arguments)]
/// An fp8 attention kernel: `attention(dequantize_fp8(q8, sq),
/// dequantize_fp8(k8, sk), dequantize_fp8(v8, sv))` of `f8e4m3` `[B, H, S, D]` inputs and
/// `f32[]` scales, dequantised to (and output in) `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prefill_fp8(out: DType, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, dv: i64, causal: bool) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn8");
    let f8 = DType::F8E4M3;
    let q8 = fb.param("q8", ty(f8, &[b.clone(), d(h), sq.clone(), d(hd)]));
    let s_q = fb.param("sq", ty(DType::F32, &[]));
    let k8 = fb.param("k8", ty(f8, &[b.clone(), d(hkv), skv.clone(), d(hd)]));
    let s_k = fb.param("sk", ty(DType::F32, &[]));
    let v8 = fb.param("v8", ty(f8, &[b, d(hkv), skv, d(dv)]));
    let s_v = fb.param("sv", ty(DType::F32, &[]));
    let deq = |fb: &mut FunctionBuilder, x, s| fb.op1(OpKind::DequantizeFp8, &[x, s], vec![("dtype", Attr::DType(out))]).unwrap();
    let (q, k, v) = (deq(&mut fb, q8, s_q), deq(&mut fb, k8, s_k), deq(&mut fb, v8, s_v));
    let attrs = vec![
        ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
        ("causal", Attr::Bool(causal)),
        ("heads", Attr::Int(h)),
        ("kv_heads", Attr::Int(hkv)),
    ];
    let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
    single_kernel(Family::Attention, fb.finish(&[o]).unwrap())
}

pub(crate) fn prefill(dt: DType, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, dv: i64, causal: bool, mask: bool) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(dt, &[b.clone(), d(h), sq.clone(), d(hd)]));
    let k = fb.param("k", ty(dt, &[b.clone(), d(hkv), skv.clone(), d(hd)]));
    let v = fb.param("v", ty(dt, &[b, d(hkv), skv.clone(), d(dv)]));
    let mut args = vec![q, k, v];
    if mask {
        args.push(fb.param("mask", ty(dt, &[sq, skv])));
    }
    let attrs = vec![
        ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
        ("causal", Attr::Bool(causal)),
        ("heads", Attr::Int(h)),
        ("kv_heads", Attr::Int(hkv)),
    ];
    let o = fb.op1(OpKind::Attention, &args, attrs).unwrap();
    single_kernel(Family::Attention, fb.finish(&[o]).unwrap())
}

/// `paged_attention(q [B, H, T, D], pages [P, S, Hkv, D], block_table [B, M], seq_lens [B])`.
pub(crate) fn paged(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
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
    ];
    let o = fb.op1(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
    single_kernel(Family::PagedAttention, fb.finish(&[o]).unwrap())
}


pub(crate) fn bind(pairs: &[(&str, i64)]) -> sinter_ir::Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}
