//! The split-KV decode kernel, its unified-max fast path and fallback.

use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, DType, Dim, Family, FunctionBuilder, Graph, Kernel, KernelGraph, LaunchPlan, OpKind};

use super::{bind, paged};
use crate::kernels::attention::decode::*;
use crate::testing::{assemble, d, plan_line, single_kernel, sym, ty};
use crate::target::Target;
use crate::error::CodegenError;

/// Split-KV decode at sm_80 (no cluster) and sm_90a (clusters of 8): plans and ptxas
/// resource lines (no spills, no stack).
#[test]
fn ptxas_reports() {
    let cases = vec![
        ("bf16 D64 GQA 9/3 T=1 page 16 (SmolLM2)", paged(DType::BF16, 9, 3, d(1), 64, 16)),
        ("bf16 D128 GQA 32/8 T=1 page 16", paged(DType::BF16, 32, 8, d(1), 128, 16)),
        ("bf16 D128 GQA 32/8 T=4 page 32", paged(DType::BF16, 32, 8, d(4), 128, 32)),
        ("bf16 D128 GQA 16/1 T=1 (two row tiles)", paged(DType::BF16, 16, 1, d(1), 128, 16)),
        ("f32 D128 GQA 8/2 T symbolic", paged(DType::F32, 8, 2, sym("T"), 128, 16)),
        ("bf16 D256 MHA 4/4 T=1", paged(DType::BF16, 4, 4, d(1), 256, 16)),
        ("bf16 D80 GQA 6/2 T=1", paged(DType::BF16, 6, 2, d(1), 80, 16)),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = generate(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            if t == Target::SM_90A && plan.grid[0].numerator.as_const().is_some() {
                assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1") && plan.ptx.contains("mapa.shared::cluster"), "{what}: no cluster");
            }
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("decode_ptxas", text);
}

#[test]
fn schedules() {
    assert_eq!(choose_schedule(Some(4), &Target::SM_90A), DecodeSchedule { warps: 4, rows: 4, cluster: 8 });
    assert_eq!(choose_schedule(Some(16), &Target::SM_80), DecodeSchedule { warps: 4, rows: 8, cluster: 1 });
    assert_eq!(choose_schedule(None, &Target::SM_90A), DecodeSchedule { warps: 4, rows: 8, cluster: 1 });
    // Wide heads: fewer rows, so that accumulators and a batch of V rows fit the registers.
    assert_eq!(choose_schedule_for(Some(8), 256, &Target::SM_80).rows, 8);
    assert_eq!(choose_schedule_for(Some(8), 320, &Target::SM_80).rows, 3);
    assert_eq!(choose_schedule_for(Some(8), 512, &Target::SM_90A), DecodeSchedule { warps: 4, rows: 2, cluster: 8 });
    let (g, k) = paged(DType::BF16, 8, 2, d(1), 64, 16);
    let e = generate_with(&g, k, &Target::SM_80, &DecodeSchedule { warps: 4, rows: 4, cluster: 2 }).unwrap_err();
    assert!(e.to_string().contains("sm_90"), "{e}");
    let (g, k) = paged(DType::F32, 8, 2, sym("T"), 64, 16);
    let e = generate_with(&g, k, &Target::SM_90A, &DecodeSchedule { warps: 4, rows: 4, cluster: 2 }).unwrap_err();
    assert!(e.to_string().contains("constant number of query rows"), "{e}");
    let e = generate_with(&g, k, &Target::SM_90A, &DecodeSchedule { warps: 0, rows: 4, cluster: 1 }).unwrap_err();
    assert!(e.to_string().contains("invalid decode schedule"), "{e}");
}

/// Split-KV decode emulated against the interpreter (sm_80: the split across the CTA's
/// warps, merged through shared memory): lengths 0, 1, a partly filled page, sequences
/// long enough for several tiles per worker (so every worker holds a partial and some hold
/// none), pages in scrambled order, T = 1 and T = 3 (causal within the step), GQA 4/2 and
/// 3/1, D 64 and 80 (lane dims not a multiple of 32), f32 with a symbolic T, and NaN / ±inf
/// in K and V; and sm_90a's clusters of 8 CTAs (lengths 0, 1111 and 333: the cluster merge
/// through distributed shared memory).
#[test]
fn emulated_matches_interpreter() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
    let (b, pages, page, m) = (4usize, 40usize, 16usize, 10usize);
    let table: Vec<f64> = (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect();
    let table = Tensor::new(DType::I32, &[b, m], table).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 37.0, 160.0]).unwrap();
    for (tq, h, hkv, hd) in [(1usize, 4i64, 2i64, 64usize), (3, 4, 2, 64), (1, 3, 1, 80)] {
        let (g, k) = paged(DType::BF16, h, hkv, d(tq as i64), hd as i64, page as i64);
        let ins = [
            random(DType::BF16, &[b, h as usize, tq, hd], 30),
            random(DType::BF16, &[pages, page, hkv as usize, hd], 31),
            random(DType::BF16, &[pages, page, hkv as usize, hd], 32),
            table.clone(),
            lens.clone(),
        ];
        check(&format!("bf16 split-KV T={tq} H={h}/{hkv} D={hd}"), &g, k, gen, &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
    }
    // NaN in a V row of sequence 3 (every row sees it: all NaN), +inf in a K row of
    // sequence 2 (its rows: NaN), −inf in a K element of sequence 2's first key.
    let (g, k) = paged(DType::BF16, 4, 2, d(1), 64, page as i64);
    let kp = random(DType::BF16, &[pages, page, 2, 64], 33);
    let mut vp = random(DType::BF16, &[pages, page, 2, 64], 34).data().to_vec();
    let mut kd = kp.data().to_vec();
    let at = |p: usize, s: usize, h: usize, e: usize| ((p * page + s) * 2 + h) * 64 + e;
    let page_of = |bq: usize, j: usize| ((bq * m + j / page) * 7 + 3) % pages;
    vp[at(page_of(3, 100), 100 % page, 0, 5)] = f64::NAN;
    kd[at(page_of(2, 20), 20 % page, 1, 0)] = f64::INFINITY;
    let ins = [
        random(DType::BF16, &[b, 4, 1, 64], 35),
        Tensor::new(DType::BF16, &[pages, page, 2, 64], kd).unwrap(),
        Tensor::new(DType::BF16, &[pages, page, 2, 64], vp).unwrap(),
        table.clone(),
        lens.clone(),
    ];
    check("bf16 split-KV with NaN and inf", &g, k, gen, &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
    // f32, D = 32, T symbolic.
    let (g, k) = paged(DType::F32, 2, 1, sym("T"), 32, 16);
    let table = Tensor::new(DType::I32, &[2, 3], vec![2.0, 0.0, 1.0, 5.0, 4.0, 3.0]).unwrap();
    let lens = Tensor::new(DType::I32, &[2], vec![40.0, 17.0]).unwrap();
    let ins = [random(DType::F32, &[2, 2, 2, 32], 23), random(DType::F32, &[6, 16, 1, 32], 24), random(DType::F32, &[6, 16, 1, 32], 25), table, lens];
    check("f32 split-KV T=2", &g, k, gen, &ins, &bind(&[("B", 2), ("T", 2), ("P", 6), ("M", 3)]));
    // sm_90a: clusters of 8 CTAs, 32 workers.
    let (b, pages, m) = (3usize, 211usize, 70usize);
    let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect()).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1111.0, 333.0]).unwrap();
    let (g, k) = paged(DType::BF16, 4, 2, d(1), 64, page as i64);
    let ins = [random(DType::BF16, &[b, 4, 1, 64], 36), random(DType::BF16, &[pages, page, 2, 64], 37), random(DType::BF16, &[pages, page, 2, 64], 38), table, lens];
    let plan = generate(&g, k, &Target::SM_90A).unwrap();
    assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1"), "no cluster");
    check("bf16 split-KV sm_90a clusters of 8", &g, k, |g, k| generate(g, k, &Target::SM_90A), &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
}

/// `paged_attention` as [`paged`] builds it, with `unified_max` and `lse` as given.
#[allow(clippy::too_many_arguments)]
fn paged_with(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64, unified_max: Option<f64>, lse: bool) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
    let q = fb.param("q", ty(dt, &[b.clone(), d(h), t, d(hd)]));
    let kp = fb.param("k_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
    let vp = fb.param("v_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
    let bt = fb.param("block_table", ty(DType::I32, &[b.clone(), sym("M")]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
    let mut attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(true)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv))];
    if let Some(phi) = unified_max {
        attrs.push(("unified_max", Attr::Float(phi)));
    }
    if lse {
        attrs.push(("lse", Attr::Bool(true)));
    }
    let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
    single_kernel(Family::PagedAttention, fb.finish(&r).unwrap())
}

/// [`generate`] for `target` under the unified-max test hook `probe`.
fn gen_at(target: Target, probe: Probe) -> impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError> {
    move |g, k| {
        PROBE.with(|p| p.set(probe));
        let r = generate(g, k, &target);
        PROBE.with(|p| p.set(Probe::Off));
        r
    }
}

/// Runs kernel `k` in the emulator (generated by `gen`) and returns the interpreter's
/// outputs and the kernel's.
fn emulate(g: &KernelGraph, k: Kernel, gen: impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError>, inputs: &[Tensor], bindings: &sinter_ir::Bindings) -> (Vec<Tensor>, Vec<Vec<f64>>) {
    use crate::emu::{from_bytes, run, to_bytes};
    use crate::isa::kit::EMIT_IR;
    let body = &g.kernels[k].body;
    let mut graph = Graph::new();
    graph.add_func(body.clone());
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let want = sinter_ir::interp::run(&graph, &body.name, &refs, bindings).unwrap();
    EMIT_IR.with(|f| f.set(true));
    let plan = gen(g, k);
    EMIT_IR.with(|f| f.set(false));
    let plan = plan.unwrap();
    let mut bufs: Vec<Vec<u8>> = inputs.iter().map(to_bytes).collect();
    for w in &want {
        bufs.push(vec![0xFF; w.data().len() * w.dtype().size_bytes() + 256]);
    }
    run(&plan, bindings, &mut bufs);
    let got = want.iter().enumerate().map(|(j, w)| from_bytes(w.dtype(), &bufs[inputs.len() + j], w.data().len())).collect();
    (want, got)
}

/// Per sequence of an output `[B, H, T, D]`: how many of its `H·T` rows hold a NaN.
fn nan_rows(out: &[f64], b: usize, hd: usize) -> Vec<usize> {
    let per = out.len() / b;
    (0..b).map(|s| out[s * per..(s + 1) * per].chunks(hd).filter(|row| row.iter().any(|x| x.is_nan())).count()).collect()
}

/// The unified-max tests' batch on a target: 4 sequences, pages of 16 in scrambled order
/// (`page_of`, a bijection: `pages` prime).
/// - sm_80 (4 workers a sequence): 0, 1, 37 (a partly filled page) and 160 keys (five
///   tiles: worker 0 takes tiles 0 and 4, workers 1–3 one each);
/// - sm_90a (clusters of 8 CTAs, 32 workers): 0, 1, 160 (solo mode: the first CTA's 4
///   workers) and 1111 keys (35 tiles, the cluster split: workers 0–2 take two, 3–31 one,
///   merged through distributed shared memory).
struct Batch {
    lens: [usize; 4],
    maxp: usize,
    pages: usize,
    /// Workers splitting the last sequence's tiles (worker `u` takes tiles `u`, `u + U`, …).
    workers: usize,
}

const B: usize = 4;
const PAGE: usize = 16;

impl Batch {
    fn on(t: Target) -> Batch {
        if t == Target::SM_80 {
            Batch { lens: [0, 1, 37, 160], maxp: 10, pages: 41, workers: 4 }
        } else {
            Batch { lens: [0, 1, 160, 1111], maxp: 70, pages: 281, workers: 32 }
        }
    }

    fn page_of(&self, bq: usize, j: usize) -> usize {
        ((bq * self.maxp + j / PAGE) * 7 + 3) % self.pages
    }

    /// q (`abs`: all positive, when asked), K and V random in [−1, 1), the table, the lengths.
    fn inputs(&self, h: usize, hkv: usize, tq: usize, hd: usize, positive_q: bool, seed: u64) -> Vec<Tensor> {
        use crate::emu::random;
        let table = Tensor::new(DType::I32, &[B, self.maxp], (0..B * self.maxp).map(|i| self.page_of(i / self.maxp, (i % self.maxp) * PAGE) as f64).collect()).unwrap();
        let lens = Tensor::new(DType::I32, &[B], self.lens.iter().map(|&l| l as f64).collect()).unwrap();
        let mut q = random(DType::BF16, &[B, h, tq, hd], seed);
        if positive_q {
            q = Tensor::new(DType::BF16, &[B, h, tq, hd], q.data().iter().map(|x| x.abs()).collect()).unwrap();
        }
        vec![q, random(DType::BF16, &[self.pages, PAGE, hkv, hd], seed + 1), random(DType::BF16, &[self.pages, PAGE, hkv, hd], seed + 2), table, lens]
    }

    fn sizes(&self) -> sinter_ir::Bindings {
        bind(&[("B", B as i64), ("P", self.pages as i64), ("M", self.maxp as i64)])
    }

    /// Sets key `j` of sequence `bq` to `value` in every dim of every KV head of `pages`.
    fn set_key(&self, pages: &Tensor, bq: usize, j: usize, value: f64) -> Tensor {
        let (hkv, hd) = (pages.shape()[2], pages.shape()[3]);
        let mut data = pages.data().to_vec();
        let base = (self.page_of(bq, j) * PAGE + j % PAGE) * hkv * hd;
        data[base..base + hkv * hd].iter_mut().for_each(|x| *x = value);
        Tensor::new(pages.dtype(), pages.shape(), data).unwrap()
    }

    /// Per sequence: the rows of `h` heads and `tq` queries that see a key (causal,
    /// bottom-right: query t of T sees keys j ≤ t + L − T).
    fn seeing_rows(&self, h: usize, tq: usize) -> Vec<usize> {
        self.lens.iter().map(|&l| h * (0..tq).filter(|&i| i + l >= tq).count()).collect()
    }

    /// The largest score (f64, over the bf16 inputs) that worker `u` sees among the rows of
    /// KV head `g` of the last sequence.
    fn worker_max(&self, ins: &[Tensor], g: usize, u: usize) -> f64 {
        let (h, tq, hd) = (ins[0].shape()[1], ins[0].shape()[2], ins[0].shape()[3]);
        let hkv = ins[1].shape()[2];
        let (bq, len) = (B - 1, self.lens[B - 1]);
        let mut top = f64::NEG_INFINITY;
        for hh in (0..h).filter(|hh| hh / (h / hkv) == g) {
            for t in 0..tq {
                for j in (0..len).filter(|j| (j / TILE as usize) % self.workers == u && j + tq <= t + len) {
                    let dot: f64 = (0..hd).map(|e| ins[0].get(&[bq, hh, t, e]).unwrap() * ins[1].get(&[self.page_of(bq, j), j % PAGE, g, e]).unwrap()).sum();
                    top = top.max(dot / (hd as f64).sqrt());
                }
            }
        }
        top
    }
}

/// The unified-max fast path with φ = 1 near the scores' maximum (random q and K in
/// [−1, 1), D 64–80: |s| ≤ √D, typically below 1.5), emulated against the interpreter at
/// sm_80 (split across the CTA's warps) and sm_90a (clusters of 8: solo mode and the
/// cluster merge) with the fallback poisoned (a worker that recomputed would report l =
/// NaN), so the match shows that every worker took the fast path and that it is right.
/// T = 1 and 3 (causal within the step), GQA 4/2, 3/1 and 8/1, D 64 and 80, a partly
/// filled page, an empty sequence (its rows exactly 0), and f32 with a symbolic T.
#[test]
fn emulated_unified_max_fast_path() {
    use crate::emu::{check, random};
    for t in [Target::SM_80, Target::SM_90A] {
        let bt = Batch::on(t);
        for (tq, h, hkv, hd) in [(1usize, 4usize, 2usize, 64usize), (3, 4, 2, 64), (1, 3, 1, 80), (1, 8, 1, 64)] {
            let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(1.0), false);
            let ins = bt.inputs(h, hkv, tq, hd, false, 40);
            let what = format!("{t} unified max 1.0 T={tq} H={h}/{hkv} D={hd}");
            check(&format!("{what} (fallback poisoned)"), &g, k, gen_at(t, Probe::PoisonFallback), &ins, &bt.sizes());
            let (_, got) = emulate(&g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
            let per = got[0].len() / B;
            assert!(got[0][..per].iter().all(|&x| x == 0.0), "{what}: the empty sequence's rows are not exactly 0");
        }
    }
    let (g, k) = paged_with(DType::F32, 2, 1, sym("T"), 32, 16, Some(0.5), false);
    let table = Tensor::new(DType::I32, &[2, 3], vec![2.0, 0.0, 1.0, 5.0, 4.0, 3.0]).unwrap();
    let lens = Tensor::new(DType::I32, &[2], vec![40.0, 17.0]).unwrap();
    let ins = [random(DType::F32, &[2, 2, 2, 32], 23), random(DType::F32, &[6, 16, 1, 32], 24), random(DType::F32, &[6, 16, 1, 32], 25), table, lens];
    for t in [Target::SM_80, Target::SM_90A] {
        check(&format!("{t} f32 unified max 0.5 T=2 (fallback poisoned)"), &g, k, gen_at(t, Probe::PoisonFallback), &ins, &bind(&[("B", 2), ("T", 2), ("P", 6), ("M", 3)]));
    }
}

/// φ far below the scores (−100: exp(s − φ) overflows) and far above them (100: every p
/// subnormal; 200: every p underflows to 0): every worker with a key recomputes its tiles
/// with the online softmax, and the result matches the interpreter, at sm_80 and sm_90a
/// (clusters). The hooks show the path: with the fallback poisoned every row that sees a
/// key is NaN (the others exactly 0), and without the fallback the fast path alone gives
/// NaN there (φ = −100: inf/inf; φ = 200: 0/0).
#[test]
fn emulated_unified_max_fallback() {
    use crate::emu::check;
    for t in [Target::SM_80, Target::SM_90A] {
        let bt = Batch::on(t);
        let shapes: &[(usize, usize, usize, usize)] = if t == Target::SM_80 { &[(1, 4, 2, 64), (3, 3, 1, 80)] } else { &[(3, 3, 1, 80)] };
        for &(tq, h, hkv, hd) in shapes {
            let ins = bt.inputs(h, hkv, tq, hd, false, 50);
            for phi in [-100.0, 100.0, 200.0] {
                let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(phi), false);
                let what = format!("{t} unified max {phi} T={tq} H={h}/{hkv} D={hd}");
                check(&what, &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
                let probes: &[Probe] = if phi == 100.0 { &[Probe::PoisonFallback] } else { &[Probe::PoisonFallback, Probe::NeverFallback] };
                for &probe in probes {
                    let (_, got) = emulate(&g, k, gen_at(t, probe), &ins, &bt.sizes());
                    assert_eq!(nan_rows(&got[0], B, hd), bt.seeing_rows(h, tq), "{what} {probe:?}: rows with NaN per sequence");
                }
            }
        }
    }
}

/// A mix across workers whose partials all weigh in the result: q positive, K random and,
/// in the last sequence, key 100 (tile 3, worker 3's) set to 0.75 in every dim, so its
/// score ≈ 0.75·Σq/8 ≈ 3 while the other keys' stay near 1 (checked on the inputs: worker
/// 3's largest above 2.2, every other worker's below 1.8); with φ = −18 worker 3 sees a
/// score above φ + 20 = 2 and recomputes, the others stay on the fast path, and the merge
/// (across warps on sm_80, across the cluster on sm_90a) combines partials at m = φ with
/// one at its own m, both weighing in the result (key 100 outweighs each other key by a
/// few e only). With the fallback poisoned only the last sequence's rows are NaN.
#[test]
fn emulated_unified_max_mixed_partials() {
    use crate::emu::check;
    let phi = -18.0;
    for t in [Target::SM_80, Target::SM_90A] {
        let bt = Batch::on(t);
        let shapes: &[(usize, usize, usize, usize, bool)] = if t == Target::SM_80 { &[(1, 4, 2, 64, false), (3, 4, 2, 64, true), (1, 8, 1, 64, true)] } else { &[(3, 4, 2, 64, true), (1, 8, 1, 64, false)] };
        for &(tq, h, hkv, hd, lse) in shapes {
            let mut ins = bt.inputs(h, hkv, tq, hd, true, 80);
            ins[1] = bt.set_key(&ins[1], B - 1, 100, 0.75);
            for g in 0..hkv {
                for u in 0..bt.workers {
                    let top = bt.worker_max(&ins, g, u);
                    assert!(if u == 3 { top > phi + UMAX_HI + 0.2 } else { top < phi + UMAX_HI - 0.2 }, "{t}: worker {u} of head {g}: largest score {top}");
                }
            }
            let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(phi), lse);
            let what = format!("{t} unified max {phi}, worker 3 above the window, T={tq} H={h}/{hkv} D={hd} lse={lse}");
            check(&what, &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
            let (_, got) = emulate(&g, k, gen_at(t, Probe::PoisonFallback), &ins, &bt.sizes());
            assert_eq!(nan_rows(&got[0], B, hd), vec![0, 0, 0, h * tq], "{what}: rows with NaN per sequence, fallback poisoned");
        }
    }
}

/// A score far above φ in one worker: φ = 1 and q positive, and in the last sequence key
/// 100 (tile 3, worker 3's) set to 32 in every dim, so its score ≈ 4·Σq ≈ 128 > φ + 20
/// (and e^(s − φ) overflows f32): that worker recomputes its tile and reports its own
/// maximum, the others report φ, and the merge combines them. The hooks: with the fallback
/// poisoned only the last sequence's rows are NaN, and without the fallback too (inf/inf).
/// Also with `lse=true` (both outputs compared), GQA 4/2 and 8/1, T = 1 and 3, at sm_80 and
/// sm_90a (clusters; 32 workers, so the other 31 report φ).
#[test]
fn emulated_unified_max_mixed_workers() {
    use crate::emu::check;
    for t in [Target::SM_80, Target::SM_90A] {
        let bt = Batch::on(t);
        let shapes: &[(usize, usize, usize, usize, bool)] = if t == Target::SM_80 { &[(1, 4, 2, 64, false), (3, 4, 2, 64, true)] } else { &[(1, 8, 1, 64, true)] };
        for &(tq, h, hkv, hd, lse) in shapes {
            let mut ins = bt.inputs(h, hkv, tq, hd, true, 60);
            ins[1] = bt.set_key(&ins[1], B - 1, 100, 32.0);
            let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(1.0), lse);
            let what = format!("{t} unified max 1.0, one large score, T={tq} H={h}/{hkv} D={hd} lse={lse}");
            check(&what, &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
            for probe in [Probe::PoisonFallback, Probe::NeverFallback] {
                let (want, got) = emulate(&g, k, gen_at(t, probe), &ins, &bt.sizes());
                assert_eq!(nan_rows(&got[0], B, hd), vec![0, 0, 0, h * tq], "{what} {probe:?}: rows with NaN per sequence");
                assert_eq!(nan_rows(want[0].data(), B, hd), vec![0; B], "{what}: the reference");
            }
        }
    }
}

/// NaN and ±inf with the unified maximum (φ = 1), at sm_80 and sm_90a (clusters): NaN in a
/// V row of the last sequence (its rows NaN), +inf in a K element of sequence 2 (rows whose
/// q·k is +inf: above the window, recomputed, NaN as the reference; −inf ones contribute
/// 0), −inf in a K element of sequence 2's first key and of sequence 1's only key (rows
/// whose one score is −inf give 0, those where it is +inf NaN), a NaN in q (its row NaN);
/// `lse=false` and `true`.
#[test]
fn emulated_unified_max_nan_inf() {
    use crate::emu::check;
    for t in [Target::SM_80, Target::SM_90A] {
        let bt = Batch::on(t);
        let ins = bt.inputs(4, 2, 1, 64, false, 70);
        let mut vp = ins[2].data().to_vec();
        let mut kd = ins[1].data().to_vec();
        let mut qd = ins[0].data().to_vec();
        let at = |p: usize, s: usize, h: usize, e: usize| ((p * PAGE + s) * 2 + h) * 64 + e;
        vp[at(bt.page_of(3, 100), 100 % PAGE, 0, 5)] = f64::NAN;
        kd[at(bt.page_of(2, 20), 20 % PAGE, 1, 0)] = f64::INFINITY;
        kd[at(bt.page_of(2, 0), 0, 0, 3)] = f64::NEG_INFINITY;
        kd[at(bt.page_of(1, 0), 0, 1, 7)] = f64::NEG_INFINITY;
        qd[(2 * 4 + 1) * 64 + 9] = f64::NAN;
        let ins = [
            Tensor::new(DType::BF16, ins[0].shape(), qd).unwrap(),
            Tensor::new(DType::BF16, ins[1].shape(), kd).unwrap(),
            Tensor::new(DType::BF16, ins[2].shape(), vp).unwrap(),
            ins[3].clone(),
            ins[4].clone(),
        ];
        for lse in [false, true] {
            let (g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, PAGE as i64, Some(1.0), lse);
            check(&format!("{t} unified max with NaN and inf, lse={lse}"), &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
        }
    }
}

/// The fast path's structure: with the fallback dropped (the hook) the kernel has no
/// shuffle in its tile loop — only the two butterflies per row after it (5 shuffles each)
/// — and no ballot (every visible key is multiplied); the plain kernel shuffles in its loop
/// (10 per row and tile) and has no ballot either; a unified-max kernel holds both loops. A
/// φ that is not a finite f32 is refused.
#[test]
fn unified_max_kernel_structure() {
    let count = |ptx: &str, what: &str| ptx.matches(what).count();
    for t in [Target::SM_80, Target::SM_90A] {
        let (g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, 16, Some(1.0), false);
        let rows = 2;
        let fast = gen_at(t, Probe::NeverFallback)(&g, k).unwrap().ptx;
        assert_eq!(count(&fast, "shfl.sync.bfly"), 10 * rows, "{t}: shuffles of the fast path");
        assert_eq!(count(&fast, "vote.sync.ballot"), 0, "{t}: ballots of the fast path");
        let both = gen_at(t, Probe::Off)(&g, k).unwrap().ptx;
        assert_eq!(count(&both, "shfl.sync.bfly"), 20 * rows, "{t}: shuffles of the fast path and the fallback");
        let (g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, 16, None, false);
        let plain = gen_at(t, Probe::Off)(&g, k).unwrap().ptx;
        assert_eq!(count(&plain, "shfl.sync.bfly"), 10 * rows, "{t}: shuffles of the online softmax");
        assert_eq!(count(&plain, "vote.sync.ballot"), 0);
    }
    let (mut g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, 16, Some(1.0), false);
    let body = &mut g.kernels[k].body;
    let nd = body.nodes.values_mut().next().unwrap();
    let i = OpKind::PagedAttention.attr_index("unified_max").unwrap();
    nd.op.attrs[i] = Attr::Float(1e39);
    let e = generate(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("`unified_max` must be a finite f32 number, got 1e39"), "{e}");
}

/// The unified-max kernel at sm_80 and sm_90a (clusters of 8), at the benchmark's shape
/// (bf16 D128 GQA 32/8 T=1) and SmolLM2's (D64 GQA 9/3), with `lse=true`, and f32 with a
/// symbolic T: plans and ptxas resource lines (no spills, no stack); and the PTX of a small
/// one (MHA 8/8 D64, one row a CTA) for sm_90a: the fast loop (no shuffle),
/// the fallback loop, the cluster merge.
#[test]
fn unified_max_ptxas_reports() {
    let cases = vec![
        ("bf16 D128 GQA 32/8 T=1 page 16 unified_max", paged_with(DType::BF16, 32, 8, d(1), 128, 16, Some(11.3), false)),
        ("bf16 D64 GQA 9/3 T=1 page 16 unified_max (SmolLM2)", paged_with(DType::BF16, 9, 3, d(1), 64, 16, Some(8.0), false)),
        ("bf16 D128 GQA 32/8 T=1 page 16 unified_max lse", paged_with(DType::BF16, 32, 8, d(1), 128, 16, Some(11.3), true)),
        ("f32 D128 GQA 8/2 T symbolic unified_max", paged_with(DType::F32, 8, 2, sym("T"), 128, 16, Some(4.0), false)),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = generate(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            if t == Target::SM_90A && plan.grid[0].numerator.as_const().is_some() {
                assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1") && plan.ptx.contains("mapa.shared::cluster"), "{what}: no cluster");
            }
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("decode_unified_max_ptxas", text);
    let (g, k) = paged_with(DType::BF16, 8, 8, d(1), 64, 16, Some(6.0), false);
    let plan = generate(&g, k, &Target::SM_90A).unwrap();
    assert!(!plan.ptx.contains(".local"), "local memory in the unified-max decode kernel");
    insta::assert_snapshot!("decode_unified_max_sm_90a_ptx", plan.ptx);
}
