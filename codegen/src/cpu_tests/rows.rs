//! Row reductions on the CPU emulator: every schedule (one-read, multi-pass, clusters,
//! persistent clusters, held slices, sampled LayerNorm shifts) against the interpreter.

use sinter_ir::{DType, Dim};

use super::graphs::*;
use super::*;

#[test]
fn cpu_row_reductions_match_the_interpreter() {
    let mut rng = Rng(2);
    for what in ["softmax", "log_softmax", "rms_norm", "layer_norm", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min"] {
        for dt in [DType::F32, DType::BF16] {
            let all: &[(Dim, usize)] = &[(d(1), 1), (d(17), 17), (d(1000), 1000), (d(3420), 3420), (d(4096), 4096), (s("N"), 777), (d(40000), 40000)];
            let ns = if what.starts_with("reduce") { &all[1..6] } else { all };
            for (nd, n) in ns {
                let rows = 6;
                let gk = row_kernel(dt, s("R"), nd.clone(), what);
                let mut ins = vec![special_rows(&mut rng, dt, rows, *n, what)];
                if matches!(what, "rms_norm" | "layer_norm") {
                    ins.push(random(&mut rng, dt, &[*n], 0.5, 1.5));
                }
                if what == "layer_norm" {
                    ins.push(random(&mut rng, dt, &[*n], -0.5, 0.5));
                }
                let b = bind(&[("R", rows as i64), ("N", *n as i64)]);
                check_on_cpu(&format!("{what} {dt} N={n}"), &gk, &b, &ins, 2);
            }
        }
    }
}

/// The cluster schedule of long rows (sm_90a): each row split over a thread-block cluster,
/// its slices staged in shared memory, the statistics exchanged through distributed shared
/// memory. Rows of 32768 (two CTAs, exact slices), 33000 (three, a short last slice), 262147
/// (eight CTAs, an odd length: scalar loads; 512 threads where the output pass reads a
/// weight, 256 threads × 4 vectors an iteration where it does not or, over whole slices, for
/// a LayerNorm); the special rows of
/// DESIGN.md; more rows than clusters (each cluster loops over rows, alternating its exchange
/// slots).
#[test]
fn cpu_cluster_rows_match_the_interpreter() {
    let mut rng = Rng(7);
    for n in [32768usize, 33000, 262144, 262147] {
        for what in ["softmax", "log_softmax", "rms_norm", "layer_norm"] {
            // (CTAs per row, threads per CTA)
            let expect = match (what, n) {
                (_, 32768) => (2, 256),
                (_, 33000) => (3, 256),
                ("layer_norm", 262144) => (8, 256),
                ("rms_norm" | "layer_norm", _) => (8, 512),
                _ => (8, 256),
            };
            let dt = DType::BF16;
            let rows = if n > 100_000 { 2 } else { 5 };
            let gk = row_kernel(dt, s("R"), d(n as i64), what);
            let plan = compile_kernel(&gk.0, gk.1, &Target::SM_90A).unwrap();
            assert_eq!((plan.grid[1].numerator.as_const().unwrap_or(0), plan.block[0]), expect, "{what} {n}: (CTAs per row, threads)");
            assert!(plan.ptx.contains(&format!(".reqnctapercluster 1, {}, 1", expect.0)) && plan.ptx.contains("mapa.shared::cluster"), "{what} {n}");
            // The slice is prefetched with 16-byte cp.async where rows allow 16-byte vectors
            // (an odd N has 2-byte chunks: the first pass loads and stages them).
            assert_eq!(plan.ptx.contains("cp.async.cg.shared.global"), n % 8 == 0, "{what} {n}: the prefetch");
            let plan80 = compile_kernel(&gk.0, gk.1, &Target::SM_80).unwrap();
            assert!(plan80.grid[1].numerator.is_one() && !plan80.ptx.contains("cluster"), "{what} {n}: sm_80 keeps the multi-pass schedule");
            let mut ins = vec![special_rows(&mut rng, dt, rows, n, what)];
            if matches!(what, "rms_norm" | "layer_norm") {
                ins.push(random(&mut rng, dt, &[n], 0.5, 1.5));
            }
            if what == "layer_norm" {
                ins.push(random(&mut rng, dt, &[n], -0.5, 0.5));
            }
            check_on_cpu(&format!("cluster {what} {dt} N={n}"), &gk, &bind(&[("R", rows as i64)]), &ins, 2);
        }
    }
    // A decomposed softmax: three levels, a broadcast mask read from global memory in every
    // pass, two staged inputs, three outputs.
    let gk = decomposed_softmax_sum(DType::BF16, 40000);
    let plan = compile_kernel(&gk.0, gk.1, &Target::SM_90A).unwrap();
    // Two staged bf16 inputs: 4 bytes a column, 160 kB a row, five slices of 32 kB.
    assert_eq!(plan.grid[1].numerator.as_const(), Some(5), "decomposed softmax: not the cluster schedule");
    let mask = with(random(&mut rng, DType::BF16, &[1, 40000], -1.0, 1.0), |i, v| if i % 7 == 0 { f64::NEG_INFINITY } else { v });
    let ins = [random(&mut rng, DType::BF16, &[4, 40000], -10.0, 10.0), random(&mut rng, DType::BF16, &[4, 40000], -10.0, 10.0), mask];
    check_on_cpu("cluster softmax decomposed", &gk, &bind(&[("R", 4)]), &ins, 2);
    // f32 LayerNorm of rows with a large mean and a small spread (the corrected two-pass).
    let gk = row_kernel(DType::F32, s("R"), d(40000), "layer_norm");
    let x = with(random(&mut rng, DType::F32, &[3, 40000], -1.0, 1.0), |_, v| ((1000.0 + 0.01 * v) as f32) as f64);
    let ins = [x, random(&mut rng, DType::F32, &[40000], 0.5, 1.5), random(&mut rng, DType::F32, &[40000], -0.5, 0.5)];
    check_on_cpu("cluster layer_norm offset f32", &gk, &bind(&[("R", 3)]), &ins, 1);
    // Slices of very different means (a step and a ramp along the row): the variance is
    // mostly the spread between the CTAs' slice means, the δ² term of their Chan merge.
    let x = with(random(&mut rng, DType::F32, &[3, 40000], -1.0, 1.0), |i, v| {
        let (r, c) = (i / 40000, (i % 40000) as f64);
        let m = if r == 0 { if c < 20000.0 { -50.0 } else { 50.0 } } else { 1e3 + c * 0.05 * r as f64 };
        ((m + v) as f32) as f64
    });
    let ins = [x, random(&mut rng, DType::F32, &[40000], 0.5, 1.5), random(&mut rng, DType::F32, &[40000], -0.5, 0.5)];
    check_on_cpu("cluster layer_norm slice means apart f32", &gk, &bind(&[("R", 3)]), &ins, 1);
}

/// Every row schedule autotuning may pick computes what the interpreter does: the cluster
/// schedule's thread counts and unrolls (softmax and rms_norm, rows of 33000: three CTAs, a
/// short last slice), with the row-invariant inputs staged or not and its cluster sizes
/// (rms_norm; layer_norm of an odd 33001 and of 32768: whole slices), the persistent
/// clusters (` p`: two clusters over three rows, so one cluster's output pass refills its
/// stage with its next row), and the multi-pass CTA schedule's (f32 softmax, rows of 262144).
#[test]
fn cpu_row_schedule_variants_match_the_interpreter() {
    let mut rng = Rng(11);
    for (dt, n, what) in [(DType::BF16, 33000usize, "softmax"), (DType::BF16, 33000, "rms_norm"), (DType::BF16, 33001, "layer_norm"), (DType::BF16, 32768, "layer_norm"), (DType::F32, 262144, "softmax")] {
        let gk = row_kernel(dt, s("R"), d(n as i64), what);
        let target = Target::SM_90A;
        let variants = crate::schedule_variants(&gk.0, gk.1, &target).unwrap();
        assert!(variants.len() >= 3, "{what} {n}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        assert_eq!(variants[0].plan, compile_kernel(&gk.0, gk.1, &target).unwrap(), "{what} {n}: the first variant is the default");
        let rows = if n > 100_000 { 2 } else { 3 };
        let mut ins = vec![special_rows(&mut rng, dt, rows, n, what)];
        if matches!(what, "rms_norm" | "layer_norm") {
            ins.push(random(&mut rng, dt, &[n], 0.5, 1.5));
        }
        if what == "layer_norm" {
            ins.push(random(&mut rng, dt, &[n], -0.5, 0.5));
            // An odd length: the staged weight and bias (` w`) are copied by loads and stores,
            // not cp.async.
            assert!(variants.iter().filter(|v| v.name.contains(" w")).count() >= 2, "{:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        }
        // Persistent clusters wherever the slices are 16-byte chunks (not the odd 33001: its
        // staged chunks are single elements, which the output pass cannot refill by cp.async).
        // The sampled LayerNorm shift (` s`) where the slices are whole (32768, not 33001).
        let sampled = variants.iter().filter(|v| v.name.ends_with(" s")).count();
        assert_eq!(sampled > 0, what == "layer_norm" && n == 32768, "{what} {n}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        let persistent = variants.iter().filter(|v| v.name.contains(" p")).count();
        assert_eq!(persistent > 0, n % 8 == 0 && n < 100_000, "{what} {n}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        for v in &variants {
            let tag = format!("variant `{}` {what} {dt} N={n}", v.name);
            check_built_on_cpu(&tag, &gk, &bind(&[("R", rows as i64)]), &ins, 2, || crate::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
}

#[test]
fn cpu_long_rows_and_fused_rows() {
    let mut rng = Rng(3);
    // A long row, multi-pass.
    for what in ["softmax", "layer_norm"] {
        let gk = row_kernel(DType::F32, s("R"), d(262144), what);
        let mut ins = vec![random(&mut rng, DType::F32, &[1, 262144], -5.0, 5.0)];
        if what == "layer_norm" {
            ins.push(random(&mut rng, DType::F32, &[262144], 0.5, 1.5));
            ins.push(random(&mut rng, DType::F32, &[262144], -0.5, 0.5));
        }
        check_on_cpu(&format!("{what} 262144"), &gk, &bind(&[("R", 1)]), &ins, 1);
    }
    // The online softmax of the multi-pass schedule: rows whose max grows along the row, with
    // a −inf prefix (a thread's or a warp's part all −inf), and a masked tail.
    for what in ["softmax", "log_softmax"] {
        let gk = row_kernel(DType::F32, s("R"), d(40000), what);
        let x = with(random(&mut rng, DType::F32, &[3, 40000], -5.0, 5.0), |i, v| {
            let (r, c) = (i / 40000, i % 40000);
            match r {
                0 if c < 30000 => f64::NEG_INFINITY,
                1 => v + c as f64 * 1e-3,
                2 if c >= 7 => f64::NEG_INFINITY,
                _ => v,
            }
        });
        check_on_cpu(&format!("{what} online 40000"), &gk, &bind(&[("R", 3)]), &[x], 3);
    }
    // LayerNorm of rows with a large mean and a small spread (the corrected two-pass).
    // (4096 and 1000: the one-read schedule's per-warp statistics merged across warps, 1000
    // with partial warps; 100000: the multi-pass schedule.)
    for n in [1000usize, 4096, 100_000] {
        let gk = row_kernel(DType::F32, s("R"), if n < 100_000 { d(n as i64) } else { s("N") }, "layer_norm");
        let x = with(random(&mut rng, DType::F32, &[2, n], -1.0, 1.0), |_, v| ((1000.0 + 0.01 * v) as f32) as f64);
        let ins = [x, random(&mut rng, DType::F32, &[n], 0.5, 1.5), random(&mut rng, DType::F32, &[n], -0.5, 0.5)];
        check_on_cpu(&format!("layer_norm offset {n}"), &gk, &bind(&[("R", 2), ("N", n as i64)]), &ins, 1);
    }
    // The same in bf16: a mean of 64 and values 63…65 (a few bf16 steps apart).
    let gk = row_kernel(DType::BF16, s("R"), d(4096), "layer_norm");
    let x = with(random(&mut rng, DType::BF16, &[3, 4096], -1.0, 1.0), |_, v| DType::BF16.round(64.0 + v));
    let ins = [x, random(&mut rng, DType::BF16, &[4096], 0.5, 1.5), random(&mut rng, DType::BF16, &[4096], -0.5, 0.5)];
    check_on_cpu("layer_norm offset bf16", &gk, &bind(&[("R", 3)]), &ins, 3);
    // Decomposed softmax with a −inf mask and three outputs.
    let gk = decomposed_softmax(DType::BF16);
    let mask = with(random(&mut rng, DType::BF16, &[1, 1000], -1.0, 1.0), |i, v| if i % 7 == 0 { f64::NEG_INFINITY } else { v });
    let ins = [random(&mut rng, DType::BF16, &[5, 1000], -20.0, 20.0), mask];
    check_on_cpu("softmax decomposed", &gk, &bind(&[("T", 5)]), &ins, 2);
    let gk = qk_norm(DType::BF16);
    let ins = [random(&mut rng, DType::BF16, &[3, 9, 64], -3.0, 3.0), random(&mut rng, DType::BF16, &[64], 0.5, 1.5), random(&mut rng, DType::BF16, &[3, 9, 64], -1.0, 1.0)];
    check_on_cpu("qk_norm", &gk, &bind(&[("T", 3)]), &ins, 3);
    let gk = int_rows();
    let ins = [random(&mut rng, DType::I32, &[3, 300], -1e7, 1e7)];
    check_on_cpu("int rows", &gk, &bind(&[("R", 3)]), &ins, 2);
}

/// Slice iterations held in registers (` k1`, `RowSchedule::held`): at 512 × 262144 `bf16`
/// (8-CTA clusters, 64 KiB slices) the RMSNorm, the softmax and the LayerNorm (row-head shift)
/// have candidates whose stage is 48 KiB, so four CTAs fit an H100/H200 SM's 228 KiB, that
/// assemble without spills in the 64 registers a thread four CTAs of 256 threads leave, and
/// that compute what the interpreter does (CPU emulation: five rows over two clusters, so a
/// cluster's second row reloads its held chunks; NaN, ±inf, zero and offset rows where
/// `special_rows` puts them, and random rows). At `bf16` rows of 65536, 131072 and 196608 and
/// `f32` rows of 131072 the held candidates there are (only where they put more rows on an SM)
/// assemble without spills.
#[test]
fn cpu_held_slice_iterations_match_the_interpreter() {
    let mut rng = Rng(29);
    let n = 262144usize;
    for what in ["rms_norm", "softmax", "layer_norm"] {
        let gk = row_kernel(DType::BF16, s("R"), d(n as i64), what);
        let target = Target::SM_90A;
        let variants = crate::schedule_variants(&gk.0, gk.1, &target).unwrap();
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        let held: Vec<_> = variants.iter().filter(|v| v.name.contains(" k")).collect();
        assert!(!held.is_empty(), "{what}: {names:?}");
        for shape in ["rows t256 u4 c8", "rows t256 u4 c4"] {
            assert!(held.iter().any(|v| v.name.starts_with(shape)), "{what}: {names:?}");
        }
        if what == "layer_norm" {
            assert!(held.iter().any(|v| v.name.contains(" s h ")), "{what}: {names:?}");
        }
        let mut ins = vec![special_rows(&mut rng, DType::BF16, 5, n, what)];
        if matches!(what, "rms_norm" | "layer_norm") {
            ins.push(random(&mut rng, DType::BF16, &[n], 0.5, 1.5));
        }
        if what == "layer_norm" {
            ins.push(random(&mut rng, DType::BF16, &[n], -0.5, 0.5));
        }
        for v in held {
            let tag = format!("variant `{}` {what} N={n}", v.name);
            // CTAs an SM by shared memory (228 KiB, 1 KiB reserved a CTA): more rows an SM
            // than the three eighths of the unheld 64 KiB slices, and the registers allow as
            // many CTAs.
            let per_sm = (228u32 << 10) / (v.plan.shared_bytes + 1024);
            let cluster = v.plan.grid[1].numerator.as_const().unwrap() as u32;
            assert!(per_sm * 8 > 3 * cluster, "{tag}: {} bytes of shared memory, {per_sm} CTAs an SM, clusters of {cluster}", v.plan.shared_bytes);
            if let Some(r) = assemble(&v.plan) {
                let regs = r.function(&v.plan.entry).map(|k| k.registers).unwrap_or(0);
                eprintln!("{tag}: {regs} registers, {} bytes of shared memory, {per_sm} CTAs an SM", v.plan.shared_bytes);
                assert!(regs * v.plan.block[0] * per_sm <= 65536, "{tag}: {regs} registers × {} threads × {per_sm} CTAs", v.plan.block[0]);
            }
            check_built_on_cpu(&tag, &gk, &bind(&[("R", 5)]), &ins, 2, || crate::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
    // Other long rows: held candidates only where they put more rows on an SM, and those
    // assemble without spills (their register budget counts the held vectors).
    for (dt, n) in [(DType::BF16, 65536i64), (DType::BF16, 131072), (DType::BF16, 196608), (DType::F32, 131072)] {
        for what in ["rms_norm", "softmax", "layer_norm"] {
            let gk = row_kernel(dt, s("R"), d(n), what);
            let variants = crate::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
            for v in variants.iter().filter(|v| v.name.contains(" k")) {
                eprintln!("{what} {dt} N={n}: `{}`", v.name);
                assemble(&v.plan);
            }
        }
    }
}

/// The sampled LayerNorm shifts stay within the bf16 tolerance on rows built against them:
/// ` s` (each warp's shift the mean of its first chunk) and ` s h` (the whole row's shift the
/// mean of the row's first 32 × 8 elements, where the slices are over 32 KiB). The corrected
/// two-pass's error grows with (mean − shift)², bounded by the sample being the shift's own
/// data: a large mean with a small spread, the first chunk of every warp far from the rest,
/// one huge element at the row's end, the row's head far from the rest ((mean − shift)² ≈
/// (N/256)·var, the ` h` bound), and an ordinary row. Every sampled candidate of rows of 32768
/// (2-CTA clusters) runs, and of rows of 262144 (8-CTA clusters) every row-head candidate
/// (` s h`, the default there; each assembles without spills).
#[test]
fn cpu_sampled_layer_norm_shift_is_accurate() {
    let mut rng = Rng(23);
    for n in [32768usize, 262144] {
        let gk = row_kernel(DType::BF16, s("R"), d(n as i64), "layer_norm");
        let target = Target::SM_90A;
        let x = random(&mut rng, DType::BF16, &[5, n], -1.0, 1.0);
        let x = with(x, |i, v| {
            let (r, c) = (i / n, i % n);
            match r {
                0 => 256.0 + 2.0 * v,
                // Every warp's first chunk (8 columns × 32 lanes of each 256-thread × 8 span).
                1 if c % 2048 < 256 => 3e4 + v,
                2 if c == n - 1 => 1e5,
                3 if c < 256 => 3e4 + v,
                3 => 256.0 + 2.0 * v,
                _ => v,
            }
        });
        let ins = vec![x, random(&mut rng, DType::BF16, &[n], 0.5, 1.5), random(&mut rng, DType::BF16, &[n], -0.5, 0.5)];
        let variants = crate::schedule_variants(&gk.0, gk.1, &target).unwrap();
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        let sampled: Vec<_> = variants.iter().filter(|v| v.name.contains(" s") && !v.name.contains(" p")).collect();
        assert!(sampled.len() >= 3, "{names:?}");
        let head = sampled.iter().filter(|v| v.name.contains(" s h")).count();
        // The row head's shift over slices above 32 KiB only, and the default there.
        assert_eq!(head >= 2, n == 262144, "{names:?}");
        assert_eq!(names[0].contains(" s h"), n == 262144, "{names:?}");
        for v in sampled.into_iter().filter(|v| n == 32768 || v.name.contains(" s h")) {
            let tag = format!("variant `{}` sampled shift N={n}", v.name);
            if v.name.contains(" s h") {
                assemble(&v.plan);
            }
            check_built_on_cpu(&tag, &gk, &bind(&[("R", 5)]), &ins, 2, || crate::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
}

/// RoPE in a row kernel's epilogue (Gemma's q/k norm then RoPE, one kernel): the partner
/// half of each rotated pair is the normalised row at another column, recomputed from the
/// row's statistics; heads last (`[T, H, D]`, positions `[T, 1]`) and first (`[H, T, D]`,
/// positions `[1, T]`), every schedule variant.
#[test]
fn cpu_norm_then_rope_in_one_row_kernel() {
    let mut rng = Rng(17);
    for (dt, h, hd, heads_first) in [(DType::BF16, 4, 256, false), (DType::BF16, 1, 256, true), (DType::F32, 3, 64, true), (DType::F32, 2, 128, false)] {
        let gk = qk_norm_rope(dt, h, hd, heads_first);
        let t = 5usize;
        let xs: Vec<usize> = if heads_first { vec![h as usize, t, hd as usize] } else { vec![t, h as usize, hd as usize] };
        let ps: Vec<usize> = if heads_first { vec![1, t] } else { vec![t, 1] };
        let ins = [random(&mut rng, dt, &xs, -3.0, 3.0), random(&mut rng, dt, &[hd as usize], -0.5, 0.5), random(&mut rng, DType::I32, &ps, 0.0, 3000.0)];
        let target = Target::SM_90A;
        for v in crate::schedule_variants(&gk.0, gk.1, &target).unwrap() {
            let tag = format!("variant `{}` norm+rope {dt} H={h} D={hd} heads_first={heads_first}", v.name);
            check_built_on_cpu(&tag, &gk, &bind(&[("T", t as i64)]), &ins, 3, || crate::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
}
