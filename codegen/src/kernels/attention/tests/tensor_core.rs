//! The tensor-core prefill kernels: `mma.sync` (sm_80 and later) and `wgmma` (sm_90a) with
//! its overlapped, warp-specialised, ping-pong and fp8 forms.

use sinter_ir::{DType, Family};

use super::prefill;
use crate::kernels::attention::generate_prefill;
use crate::kernels::attention::schedule::*;
use crate::kernels::attention::schedule::TcSmem as Smem;
use crate::testing::{assemble, d, sym};
use crate::target::Target;

/// The default schedule of every head dim the kernel takes (multiples of 16; bf16, and f16
/// at 64 and 128), causal or not, with and without a mask, assembles for sm_80 and sm_90a
/// without spills.
#[test]
fn default_schedules_assemble_without_spills() {
    for t in [Target::SM_80, Target::SM_90A] {
        let cases = [16, 48, 64, 80, 96, 112, 128, 192, 256].map(|hd| (DType::BF16, hd)).into_iter().chain([(DType::F16, 64), (DType::F16, 128)]);
        for (dt, hd) in cases {
            for (causal, mask) in [(true, false), (false, false), (true, true)] {
                let (g, k) = prefill(dt, 8, 2, sym("T"), sym("S"), hd, hd, causal, mask);
                let plan = generate_prefill(&g, k, &t).unwrap_or_else(|e| panic!("D{hd}: {e}"));
                // sm_90a takes the wgmma kernel for head dims 64 and 128 without a mask.
                let wgmma = t == Target::SM_90A && matches!(hd, 64 | 128) && !mask;
                assert_eq!(plan.ptx.contains("wgmma.mma_async"), wgmma, "{t} D{hd} mask={mask}");
                assert_eq!(plan.ptx.contains("mma.sync"), !wgmma && !(mask && hd > 128), "{t} D{hd} mask={mask}");
                if assemble(&plan).is_none() {
                    return;
                }
            }
        }
        // Constant sequence lengths take more registers (D = 128: 2 more, no spills).
        for causal in [true, false] {
            let (g, k) = prefill(DType::BF16, 32, 8, d(4096), d(4096), 128, 128, causal, false);
            assemble(&generate_prefill(&g, k, &t).unwrap());
        }
    }
}

/// With `check`, that ptxas does not serialize `ptx`'s `wgmma`s (no "wgmma.mma_async
/// instructions are serialized", C7510 to C7520: the overlapped and warp-specialised
/// kernels rely on groups staying in flight); with `SINTER_DUMP_WGMMA_ATTN` set, `ptx` is
/// written to `/tmp/{tag}.ptx`.
fn not_serialized_and_dumped(ptx: &str, w: &WgSchedule, tag: &str, check: bool) {
    if check {
        if let Some(ptxas) = crate::ptxas::find_ptxas_for_tests().unwrap() {
            let log = crate::ptxas::assemble_with(&ptxas, ptx, &Target::SM_90A).unwrap().log;
            assert!(!log.contains("serialized"), "{tag} ({w:?}): {log}");
        }
    }
    if std::env::var_os("SINTER_DUMP_WGMMA_ATTN").is_some() {
        std::fs::write(format!("/tmp/{}.ptx", tag.replace(' ', "_")), ptx).unwrap();
    }
}

/// The `wgmma` kernel (sm_90a) at head dims 64 and 128 (Dv 64 with D 128 too), bf16 and
/// f16, causal or not, symbolic and constant lengths, with lse, each schedule candidate
/// and the intra-warpgroup overlap at 128 and 64 keys (with `pv_split` too, whose S wait
/// counts two P·V groups): it assembles without spills (and the overlap without ptxas
/// serializing its `wgmma`s), holds the `wgmma` forms it is built on (A from shared
/// memory for Q·Kᵀ, from registers with a transposed B for P·V) and no `mma.sync`; and
/// sm_90 (no `a`) and sm_80 keep the `mma.sync` kernel.
#[test]
fn wgmma_kernel_assembles_without_spills() {
    use crate::kernels::attention::generate_prefill_wg_with;
    let h = Target::SM_90A;
    let wd = choose_wg_schedule(128, 128);
    let scheds = [
        wd,
        WgSchedule { pv_split: true, ..wd },
        WgSchedule { block_kv: 64, ..wd },
        WgSchedule { overlap: true, ..wd },
        WgSchedule { overlap: true, block_kv: 64, ..wd },
        WgSchedule { overlap: true, pv_split: true, ..wd },
    ];
    for (dt, hd, dv) in [(DType::BF16, 128, 128), (DType::BF16, 64, 64), (DType::F16, 128, 128), (DType::BF16, 128, 64)] {
        for causal in [false, true] {
            for (sq, skv) in [(sym("T"), sym("S")), (d(4096), d(4096))] {
                let (g, k) = prefill(dt, 8, 2, sq.clone(), skv.clone(), hd, dv, causal, false);
                for w in &scheds {
                    let plan = generate_prefill_wg_with(&g, k, &h, w).unwrap_or_else(|e| panic!("{w:?} D{hd}: {e}"));
                    let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
                    let n = if w.pv_split { 64 } else { dv };
                    assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{ty}.{ty}", w.block_kv)), "{w:?}");
                    assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty}")), "{w:?}");
                    assert!(plan.ptx.contains("bar.red.or.pred") && !plan.ptx.contains("mma.sync"), "{w:?}");
                    assert!(plan.ptx.contains(".align 1024 .b8 smem_dyn[]"), "{w:?}");
                    assert_eq!(plan.block, [w.threads(), 1, 1]);
                    let Some(r) = assemble(&plan) else { return };
                    eprintln!("{} D{hd}/{dv} causal={causal} {sq}: {r}", w.name());
                    // The overlap holds only if ptxas keeps the groups in flight.
                    not_serialized_and_dumped(&plan.ptx, w, &format!("wgattn_{}_{hd}_{causal}", w.name()), w.overlap);
                }
            }
        }
    }
    for t in [Target::SM_80, Target::SM_90] {
        let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 128, 128, false, false);
        let plan = generate_prefill(&g, k, &t).unwrap();
        assert!(plan.ptx.contains("mma.sync") && !plan.ptx.contains("wgmma"), "{t}");
        assert!(generate_prefill_wg_with(&g, k, &t, &choose_wg_schedule(128, 128)).is_err(), "{t}");
    }
    // Other head dims and a mask keep the mma.sync kernel on sm_90a.
    for (hd, mask) in [(96, false), (256, false), (128, true)] {
        let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), hd, hd, false, mask);
        assert!(!generate_prefill(&g, k, &h).unwrap().ptx.contains("wgmma"), "D{hd} mask={mask}");
    }
}

/// `attention(q, k, v)` with the rows' log-sum-exp, layout `bshd` (q `[B, Sq, H, D]`,
/// k `[B, Skv, Hkv, D]`, v `[B, Skv, Hkv, Dv]`): the TMA maps' strides out of order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prefill_lse(dt: DType, h: i64, hkv: i64, sq: sinter_ir::Dim, skv: sinter_ir::Dim, hd: i64, dv: i64, causal: bool) -> (sinter_ir::KernelGraph, sinter_ir::Kernel) {
    use crate::testing::{single_kernel, ty};
    use sinter_ir::{Attr, FunctionBuilder, Graph, OpKind};
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(dt, &[b.clone(), sq, d(h), d(hd)]));
    let k = fb.param("k", ty(dt, &[b.clone(), skv.clone(), d(hkv), d(hd)]));
    let v = fb.param("v", ty(dt, &[b, skv, d(hkv), d(dv)]));
    let attrs = vec![
        ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
        ("causal", Attr::Bool(causal)),
        ("heads", Attr::Int(h)),
        ("kv_heads", Attr::Int(hkv)),
        ("layout", Attr::Str("bshd".into())),
        ("lse", Attr::Bool(true)),
    ];
    let r = fb.op(OpKind::Attention, &[q, k, v], attrs).unwrap();
    single_kernel(Family::Attention, fb.finish(&r).unwrap())
}

/// The warp-specialised kernel (`producer`, names ` ws`) and its ping-pong (` pp`) at
/// head dims 128 and 64 (Dv 64 with D 128 too), 128- and 64-key tiles, bf16 and f16,
/// causal or not, symbolic and constant lengths, with lse: 384 threads (`.maxntid 384`),
/// `setmaxnreg` 24/240, the TMA copies of Q, K and V (4-d maps: D, S, head, batch) with
/// their mbarriers, no `cp.async`, one CTA-wide barrier (the mbarriers' initialisation)
/// and, for the ping-pong, the scheduling barriers 3 and 4; it assembles without spills
/// and without ptxas serializing its `wgmma`s.
#[test]
fn wgmma_ws_kernel_assembles_without_spills() {
    use crate::kernels::attention::generate_prefill_wg_with;
    let h = Target::SM_90A;
    let ws = WgSchedule { producer: true, ..choose_wg_schedule(128, 128) };
    let pp = WgSchedule { pingpong: true, ..ws };
    let scheds = [ws, pp, WgSchedule { block_kv: 64, ..ws }, WgSchedule { block_kv: 64, ..pp }];
    for (dt, hd, dv) in [(DType::BF16, 128, 128), (DType::BF16, 64, 64), (DType::F16, 128, 128), (DType::BF16, 128, 64)] {
        for causal in [false, true] {
            for (sq, skv) in [(sym("T"), sym("S")), (d(4096), d(4096))] {
                for lse in [false, true] {
                    let (g, k) = if lse { prefill_lse(dt, 8, 2, sq.clone(), skv.clone(), hd, dv, causal) } else { prefill(dt, 8, 2, sq.clone(), skv.clone(), hd, dv, causal, false) };
                    for w in &scheds {
                        let plan = generate_prefill_wg_with(&g, k, &h, w).unwrap_or_else(|e| panic!("{w:?} D{hd}: {e}"));
                        let ptx = &plan.ptx;
                        assert_eq!(plan.block, [384, 1, 1]);
                        for want in [".maxntid 384", "setmaxnreg.dec.sync.aligned.u32 24", "setmaxnreg.inc.sync.aligned.u32 240", "cp.async.bulk.tensor.4d", "mbarrier.arrive.expect_tx", "mbarrier.try_wait.parity", "mbarrier.arrive.shared::cta.b64", "wgmma.mma_async", "bar.red.or.pred"] {
                            assert!(ptx.contains(want), "{} D{hd}: no `{want}`", w.name());
                        }
                        assert!(!ptx.contains("cp.async.cg") && !ptx.contains("mma.sync"), "{}", w.name());
                        let cta_barriers = ptx.lines().filter(|l| l.split_whitespace().collect::<String>().starts_with("bar.sync0;")).count();
                        assert_eq!(cta_barriers, 1, "{}: CTA barriers", w.name());
                        assert_eq!(ptx.contains("bar.arrive"), w.pingpong, "{}", w.name());
                        let params = plan.params.iter().filter(|p| matches!(p, sinter_ir::KernelParam::TensorMap(_))).count();
                        assert_eq!(params, 3, "{}", w.name());
                        let Some(r) = assemble(&plan) else { return };
                        eprintln!("{} D{hd}/{dv} {dt} causal={causal} {sq} lse={lse}: {r}", w.name());
                        not_serialized_and_dumped(ptx, w, &format!("wgattn_{}_{hd}_{causal}", w.name()), true);
                    }
                }
            }
        }
    }
}

/// Snapshots of the warp-specialised kernel: its launch plans (384 threads, the three
/// tensor maps among the parameters) and ptxas resource lines (sm_90a, no spills) for
/// ` ws` and ` ws pp` at D 128 (GQA 32/8, causal, symbolic lengths) and D 64 (SmolLM2's
/// 9/3, causal), 128- and 64-key tiles; and the whole PTX of the ping-pong at D 64, not
/// causal (the producer's TMA loop, the mbarrier waits and releases, the scheduling
/// barriers).
#[test]
fn wgmma_ws_snapshots() {
    use crate::kernels::attention::generate_prefill_wg_with;
    use crate::testing::plan_line;
    let h = Target::SM_90A;
    let mut text = String::new();
    for (what, hd, hq, hkv) in [("bf16 D128 GQA 32/8 causal Sq=T Skv=S", 128, 32, 8), ("bf16 D64 GQA 9/3 causal Sq=T Skv=T", 64, 9, 3)] {
        let skv = if hd == 128 { sym("S") } else { sym("T") };
        let (g, k) = prefill(DType::BF16, hq, hkv, sym("T"), skv, hd, hd, true, false);
        let ws = WgSchedule { producer: true, ..choose_wg_schedule(hd as u32, hd as u32) };
        let pp = WgSchedule { pingpong: true, ..ws };
        for w in [ws, WgSchedule { block_kv: 64, ..ws }, pp, WgSchedule { block_kv: 64, ..pp }] {
            let plan = generate_prefill_wg_with(&g, k, &h, &w).unwrap();
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what} [{}]\n{}\n{report}", w.name(), plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("attention_wgmma_ws_ptxas", text);
    let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 64, 64, false, false);
    let pp = WgSchedule { producer: true, pingpong: true, ..choose_wg_schedule(64, 64) };
    insta::assert_snapshot!("attention_wgmma_ws_pp_d64_ptx", generate_prefill_wg_with(&g, k, &h, &pp).unwrap().ptx);
}

/// The fp8 kernel (sm_90a): head dims 64 and 128 (and 128/64), causal or not, symbolic
/// and constant lengths, bf16 and f16 outputs, 128- and 64-key tiles and the overlap
/// (without ptxas serializing its `wgmma`s): e4m3 `wgmma`s with
/// A from shared memory for Q·Kᵀ and from registers for P·V (K-major Vᵀ, no transpose),
/// P converted with `cvt.rn.satfinite.e4m3x2.f32`, V transposed with `prmt`, the async
/// proxy fenced after the transposition; it assembles without spills. Other targets, the
/// `+split` schedules, tiles over 128 keys and an f32 output are refused naming f8e4m3.
#[test]
fn fp8_kernel_assembles_without_spills() {
    use crate::kernels::attention::generate_prefill_wg_with;
    use super::prefill_fp8;
    let h = Target::SM_90A;
    let wd = choose_fp8_schedule();
    for (out, hd, dv) in [(DType::BF16, 128, 128), (DType::BF16, 64, 64), (DType::F16, 128, 128), (DType::BF16, 128, 64)] {
        for causal in [false, true] {
            for (sq, skv) in [(sym("T"), sym("S")), (d(4096), d(4096))] {
                let (g, k) = prefill_fp8(out, 8, 2, sq.clone(), skv.clone(), hd, dv, causal);
                // (The 128-key tiles are no candidate, see `choose_fp8_schedule`, but still build.)
                for w in [wd, WgSchedule { overlap: true, ..wd }, WgSchedule { block_kv: 128, ..wd }, WgSchedule { block_kv: 128, overlap: true, ..wd }] {
                    let plan = generate_prefill_wg_with(&g, k, &h, &w).unwrap_or_else(|e| panic!("{w:?} D{hd}: {e}"));
                    assert!(plan.entry.ends_with("_attention_wgmma_e4m3"), "{}", plan.entry);
                    assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{}k32.f32.e4m3.e4m3", w.block_kv)), "{w:?}");
                    assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{dv}k32.f32.e4m3.e4m3")), "{w:?}");
                    for needle in ["cvt.rn.satfinite.e4m3x2.f32", "prmt.b32", "fence.proxy.async.shared::cta", "bar.red.or.pred", ".align 1024 .b8 smem_dyn[]"] {
                        assert!(plan.ptx.contains(needle), "{w:?}: no {needle}");
                    }
                    assert!(!plan.ptx.contains("mma.sync") && !plan.ptx.contains("k16.f32"), "{w:?}");
                    assert_eq!(plan.block, [w.threads(), 1, 1]);
                    let Some(r) = assemble(&plan) else { return };
                    eprintln!("fp8 {} D{hd}/{dv} causal={causal} {sq}: {r}", w.name());
                    not_serialized_and_dumped(&plan.ptx, &w, &format!("wgattn8_{}_{hd}_{causal}", w.name()), w.overlap);
                }
            }
        }
    }
    // Shared memory of the 128-key tiles: Q 128 rows, two K stages, three V stages of
    // 128-byte rows (half used at D 64), two Vᵀ buffers of Dv rows × 128 keys, the P scratch
    // / output staging 128 × 136 × 2 bytes; the 64-key tiles halve the K and V stages.
    let w128 = WgSchedule { block_kv: 128, ..wd };
    let p_scratch = 128 * 136 * 2;
    assert_eq!(Smem::wg(&w128, 128, 128, true).total, 16384 * (1 + 2 + 3) + 2 * 128 * 128 + p_scratch);
    assert_eq!(Smem::wg(&w128, 128, 128, true).total, 165888);
    assert_eq!(Smem::wg(&w128, 64, 64, true).total, 16384 * (1 + 2 + 3) + 2 * 64 * 128 + p_scratch);
    assert_eq!(Smem::wg(&wd, 128, 128, true).total, 16384 + 8192 * (2 + 3) + 2 * 128 * 128 + p_scratch);
    let sm = Smem::wg(&wd, 128, 128, true);
    assert!(sm.vt.iter().chain([&sm.v2]).all(|o| o % 1024 == 0), "swizzled buffers 1024-byte aligned");
    let (g, k) = prefill_fp8(DType::BF16, 8, 2, sym("T"), sym("S"), 128, 128, true);
    assert!(generate_prefill(&g, k, &h).unwrap().entry.ends_with("_attention_wgmma_e4m3"));
    for t in [Target::SM_80, Target::SM_90] {
        // `sinter explain --schedules` lists no kernel it would refuse.
        assert!(matches!(crate::schedule_variants(&g, k, &t), Err(crate::error::CodegenError::Unsupported { .. })), "{t}");
        let e = generate_prefill(&g, k, &t).unwrap_err().to_string();
        assert!(e.contains(&format!("f8e4m3 attention: wgmma needs sm_90a, not {t}: {}", crate::FP8_SUPPORT)), "{e}");
    }
    for w in [WgSchedule { pv_split: true, ..wd }, WgSchedule { block_kv: 256, ..wd }] {
        let e = generate_prefill_wg_with(&g, k, &h, &w).unwrap_err().to_string();
        assert!(e.contains("f8e4m3 attention: schedule"), "{e}");
    }
    for (out, hd) in [(DType::F32, 128), (DType::BF16, 96)] {
        let (g, k) = prefill_fp8(out, 8, 2, sym("T"), sym("S"), hd, hd, false);
        assert!(matches!(crate::schedule_variants(&g, k, &h), Err(crate::error::CodegenError::Unsupported { .. })), "{out} D{hd}");
        let e = generate_prefill(&g, k, &h).unwrap_err().to_string();
        assert!(e.contains("f8e4m3 attention: ") && e.contains(crate::FP8_SUPPORT), "{e}");
    }
}

/// The warp-specialised options' names, threads, and what they refuse: the ping-pong
/// without the producer or with other than two consumer warpgroups, the producer with the
/// intra-warpgroup overlap (not built) or three consumer warpgroups (240 registers each).
#[test]
fn ws_schedules() {
    let wd = choose_wg_schedule(128, 128);
    assert!(!wd.producer && !wd.pingpong, "the default stays the cp.async kernel");
    let ws = WgSchedule { producer: true, ..wd };
    let pp = WgSchedule { pingpong: true, ..ws };
    assert_eq!((ws.name(), pp.name(), WgSchedule { block_kv: 64, ..pp }.name()), ("wgmma kv128 g2 ws".into(), "wgmma kv128 g2 ws pp".into(), "wgmma kv64 g2 ws pp".into()));
    assert_eq!((wd.threads(), ws.threads(), pp.threads()), (256, 384, 384));
    assert_eq!((ws.block_q(), ws.as_tc().threads()), (128, 256), "the consumers' walk");
    assert!(ws.check().is_ok() && pp.check().is_ok() && WgSchedule { block_kv: 64, ..pp }.check().is_ok());
    for bad in [WgSchedule { pingpong: true, ..wd }, WgSchedule { overlap: true, ..ws }, WgSchedule { warpgroups: 3, ..ws }, WgSchedule { warpgroups: 1, ..pp }] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
    // 128 · 24 + 256 · 240 registers fit the SM's 65536; the D 128 shared memory (Q, two
    // stages of K and V, the P scratch) an sm_90 CTA's 227 KiB.
    assert!(128 * WS_PRODUCER_REGS + 256 * WS_CONSUMER_REGS <= 65536);
    assert_eq!(ws.shared_bytes(128, 128), 128 * 128 * 2 + WS_STAGES * 2 * 128 * 128 * 2 + 128 * 136 * 2);
    assert!(ws.shared_bytes(128, 128) + 1024 <= Target::SM_90A.max_shared_memory_per_block());
}

#[test]
fn schedules() {
    let s = |warps, m_tiles, block_kv, q_in_regs| TcSchedule { warps, m_tiles, block_kv, q_in_regs };
    let (a, h) = (&Target::SM_80, &Target::SM_90A);
    assert_eq!(choose_tc_schedule(64, 64, false, false, h), s(4, 2, 64, true));
    assert_eq!(choose_tc_schedule(128, 128, false, false, h), s(4, 2, 48, false));
    assert_eq!(choose_tc_schedule(128, 128, false, false, &Target::SM_90), s(4, 2, 48, false));
    // Two CTAs of 48-key tiles (2 × 100 KiB) do not fit in sm_80's 164 KiB.
    assert_eq!(choose_tc_schedule(128, 128, false, false, a), s(4, 2, 32, false));
    // Causal 48-key tiles spill (8 bytes with constant sequence lengths).
    assert_eq!(choose_tc_schedule(128, 128, false, true, h), s(4, 2, 32, false));
    assert_eq!(choose_tc_schedule(112, 112, false, false, h), s(4, 2, 32, false));
    assert_eq!(choose_tc_schedule(80, 96, false, false, h), s(4, 2, 32, false));
    assert_eq!(choose_tc_schedule(256, 256, false, false, h), s(4, 1, 32, false));
    assert_eq!(choose_tc_schedule(128, 128, true, false, h), s(4, 1, 64, false));
    assert_eq!(choose_tc_schedule(64, 64, true, false, a), s(4, 1, 64, true));
    // Q 128 × 136, two stages of K and V 48 × 136, the P scratch 128 × 56: 99 KiB.
    assert_eq!(s(4, 2, 48, false).shared_bytes(128, 128), 128 * 136 * 2 + 4 * 48 * 136 * 2 + 128 * 56 * 2);
    assert_eq!(s(4, 2, 48, false).shared_bytes(128, 128), 101376);
    // Q 128 rows × (64 + 8), two stages of K and V 64 × 72 (bf16); P in Q's rows.
    assert_eq!(s(4, 2, 64, true).shared_bytes(64, 64), 128 * 72 * 2 + 4 * 64 * 72 * 2);
    // Plus the P scratch 128 × (32 + 8) when Q is re-read from shared memory.
    assert_eq!(s(4, 2, 32, false).shared_bytes(128, 128), 128 * 136 * 2 + 4 * 32 * 136 * 2 + 128 * 40 * 2);
    assert!(s(0, 1, 64, true).check().is_err() && s(4, 3, 64, true).check().is_err() && s(4, 1, 40, true).check().is_err());
}

/// `SINTER_DEBUG_SMEM_FILL`'s byte: hex or decimal, nothing else.
#[test]
fn smem_fill_byte_parses() {
    use crate::kernels::attention::prefill_mma::parse_fill_byte;
    assert_eq!(parse_fill_byte("0x7f"), Some(0x7f));
    assert_eq!(parse_fill_byte(" 0XFF "), Some(0xff));
    assert_eq!(parse_fill_byte("127"), Some(127));
    for bad in ["", "0x", "256", "0x100", "-1", "nan"] {
        assert_eq!(parse_fill_byte(bad), None, "{bad}");
    }
}

/// With its shared memory filled with 0x7f bytes first (`SINTER_DEBUG_SMEM_FILL`; bf16
/// 0x7f7f is 3.4e38), the `mma.sync` kernel still matches the interpreter on the emulator at
/// causal Sq > Skv (fully masked rows, a partial last key tile, rows past Sq in the last CTA):
/// it reads no shared byte it did not write. The fp8 `wgmma` kernel (which the emulator
/// cannot run) takes the fill too, and is unchanged without it.
#[test]
fn smem_fill_reads_nothing_unwritten() {
    use crate::emu::{check, random};
    use crate::kernels::attention::generate_prefill_wg_with;
    use crate::kernels::attention::prefill_mma::with_smem_fill;
    use super::{bind, prefill_fp8};
    let (g, k) = prefill(DType::BF16, 4, 2, sym("T"), sym("S"), 64, 64, true, false);
    let ins = [random(DType::BF16, &[1, 4, 150, 64], 91), random(DType::BF16, &[1, 2, 40, 64], 92), random(DType::BF16, &[1, 2, 40, 64], 93)];
    let binds = bind(&[("B", 1), ("T", 150), ("S", 40)]);
    with_smem_fill(0x7f, || {
        let plan = generate_prefill(&g, k, &Target::SM_80).unwrap();
        assert!(plan.ptx.contains("mma.sync") && plan.ptx.contains("%ntid.x"), "no fill in the mma.sync kernel");
        check("mma.sync causal Sq 150 Skv 40, shared memory filled with 0x7f", &g, k, |g, k| generate_prefill(g, k, &Target::SM_80), &ins, &binds);
    });
    let (g8, k8) = prefill_fp8(DType::BF16, 4, 2, d(300), d(77), 128, 128, true);
    let w = choose_fp8_schedule();
    let filled = with_smem_fill(0x7f, || generate_prefill_wg_with(&g8, k8, &Target::SM_90A, &w).unwrap().ptx);
    let plain = generate_prefill_wg_with(&g8, k8, &Target::SM_90A, &w).unwrap().ptx;
    // (The fill's loop steps by the block size; the kernel reads no %ntid.x otherwise.)
    assert!(filled.contains("%ntid.x") && filled.contains("2139062143"), "no fill in the fp8 kernel");
    assert!(!plain.contains("%ntid.x"), "a fill without SINTER_DEBUG_SMEM_FILL");
}
