//! Kernel generation, family by family: small kernel graphs built by hand (bodies with
//! `FunctionBuilder`, buffers with `Layout::contiguous`), compiled through the public entry
//! [`compile_kernel`] for sm_80 and sm_90a, every PTX assembled by ptxas (no spills, no stack),
//! snapshots of the PTX of every family at two fixed shapes per target (each with its launch
//! plan and ptxas resource lines), a snapshot of the ptxas resource report of every case, and
//! SASS checks with cuobjdump (16-byte loads in the vectorised pointwise kernel, butterfly
//! shuffles in the reductions).
//!
//! The kernel graphs live in `graphs/`; the crate's `cpu_tests` run the same graphs on the CPU
//! emulator against the interpreter.
//!
//! ptxas and cuobjdump come from `scripts/setup` (`~/.cache/sinter/bin`); where they are
//! missing the tests that need them say so and skip, except under CI (`CI` set), where they
//! fail.

use std::path::PathBuf;
use std::process::Command;

use sinter_codegen::target::Target;
use sinter_codegen::{compile_kernel, ptxas, CodegenError};
use sinter_ir::{Attr, DType, Dim, Family, FunctionBuilder, Graph, GridDim, Kernel, KernelGraph, KernelParam, LaunchPlan, Layout, OpKind};

/// The kernel graphs built by hand (shared with the CPU-emulator tests of the crate).
mod graphs;

use graphs::*;

/// The PTX snapshot cases: every kernel family at two fixed shapes, as (snapshot name, what it
/// is, kernel). The snapshot of a case at a target is `kernels__ptx_<name>_<target>.snap`.
fn ptx_cases() -> Vec<(String, String, (KernelGraph, Kernel))> {
    let mut v: Vec<(String, String, (KernelGraph, Kernel))> = Vec::new();
    let mut add = |name: String, what: String, gk: (KernelGraph, Kernel)| v.push((name, what, gk));
    for (r, c) in [(64, 4096), (333, 1000)] {
        add(format!("pointwise_fused_{r}x{c}"), format!("pointwise: cast(silu(cast(x bf16[{r},{c}], f32) + bias f32[{c}]) * cast(scale bf16[{r},1], f32), bf16)"), fused_pointwise(r, c));
    }
    for what in ["softmax", "log_softmax", "rms_norm", "layer_norm", "reduce_sum", "reduce_max", "reduce_mean"] {
        for (r, n) in [(4096, 576), (64, 32768)] {
            add(format!("row_{what}_{r}x{n}"), format!("row reduction: {what} of bf16[{r},{n}]"), row_kernel(DType::BF16, d(r), d(n), what));
        }
    }
    // The cluster schedule on sm_90a (the multi-pass one on sm_80): 8 CTAs × 512 threads, and
    // 3 CTAs with a short last slice (rows of 32768 above: 2 CTAs × 256 threads).
    for (what, r, n) in [("rms_norm", 16, 262144), ("softmax", 16, 262144), ("softmax", 3, 33000)] {
        add(format!("row_{what}_{r}x{n}"), format!("row reduction: {what} of bf16[{r},{n}]"), row_kernel(DType::BF16, d(r), d(n), what));
    }
    for form in ["rotate_half", "interleaved"] {
        for (t, h, hd) in [(128, 9, 64), (7, 32, 128)] {
            add(format!("rope_{form}_{t}x{h}x{hd}"), format!("rope {form}: bf16[{t},{h},{hd}], positions i32[{t},1]"), rope_at(DType::BF16, form, t, h, hd));
        }
    }
    // Partial rotary dims (GPT-NeoX's 25 % of 128) with YaRN, and Llama 3.1's scaling over
    // the whole head (the paired schedule).
    let yarn = || vec![("rotary_dim", Attr::Int(32)), ("scaling", Attr::Str("yarn".into())), ("factor", Attr::Float(4.0)), ("original_max_position_embeddings", Attr::Int(4096))];
    add("rope_partial32_yarn_rotate_half_7x32x128".into(), "rope rotate_half, rotary_dim 32, YaRN factor 4: bf16[7,32,128], positions i32[7,1]".into(), rope_scaled_at(DType::BF16, "rotate_half", (7, 32, 128), yarn()));
    let llama3 = vec![("scaling", Attr::Str("llama3".into())), ("factor", Attr::Float(8.0)), ("low_freq_factor", Attr::Float(1.0)), ("high_freq_factor", Attr::Float(4.0)), ("original_max_position_embeddings", Attr::Int(8192))];
    add("rope_llama3_rotate_half_7x32x128".into(), "rope rotate_half, Llama 3.1 scaling: bf16[7,32,128], positions i32[7,1]".into(), rope_scaled_at(DType::BF16, "rotate_half", (7, 32, 128), llama3));
    add("logical_mask_64x4096".into(), "logical_and/or/not: a windowed causal mask selecting x bf16[64,4096] or −inf".into(), logical_mask_at(64, 4096));
    for (t, n) in [(64, 1536), (5, 14336)] {
        add(format!("swiglu_{t}x{n}"), format!("swiglu(gate, up): bf16[{t},{n}]"), swiglu_at(DType::BF16, t, n));
    }
    add("gather_bf16_i32_49152x576".into(), "gather: table bf16[49152,576], ids i32[4,32]".into(), embedding_at(DType::BF16, DType::I32, 49152, 576, 4, 32));
    add("gather_f32_i64_32000x4096".into(), "gather: table f32[32000,4096], ids i64[1,7]".into(), embedding_at(DType::F32, DType::I64, 32000, 4096, 1, 7));
    // fp8 activations: quantize and dequantize, one shape each.
    add("quantize_fp8_bf16_64x4096".into(), "quantize_fp8(x bf16[64,4096], s f32[]) → f8e4m3".into(), quantize_fp8_at(DType::BF16, d(64), d(4096)));
    add("dequantize_fp8_bf16_64x4096".into(), "dequantize_fp8(x8 f8e4m3[64,4096], s f32[]) → bf16".into(), dequantize_fp8_at(DType::BF16, d(64), d(4096)));
    for (from, to) in [(DType::BF16, DType::F32), (DType::F32, DType::BF16)] {
        for (r, c) in [(1024, 4096), (3, 1000)] {
            add(format!("cast_{from}_{to}_{r}x{c}"), format!("cast {from}[{r},{c}] to {to}"), cast_kernel(from, to, r, c));
        }
    }
    add("kv_append_prefill".into(), "kv_append: pages bf16[64,16,3,64], new [2,5,3,64], block table [2,32]".into(), kv_append_at(DType::BF16, 64, 16, 3, 64, 2, 5, 32));
    add("kv_append_decode".into(), "kv_append: pages bf16[256,16,8,128], new [16,1,8,128], block table [16,16]".into(), kv_append_at(DType::BF16, 256, 16, 8, 128, 16, 1, 16));
    for (r, c) in [(128, 576), (33, 1000)] {
        add(format!("layout_transpose_{r}x{c}"), format!("layout: transpose bf16[{r},{c}]"), transpose_at(DType::BF16, r, c));
    }
    for (r, ca, cb) in [(64, 16, 48), (9, 20, 44)] {
        add(format!("layout_concat_{r}x{ca}_{cb}"), format!("layout: concat bf16[{r},{ca}], bf16[{r},{cb}] along the last axis"), concat_at(DType::BF16, r, ca, cb));
    }
    for (m, n, k) in [(256, 1536, 576), (512, 4096, 4096)] {
        add(format!("matmul_mma_{m}x{n}x{k}"), format!("matmul (tensor cores): bf16[{m},{k}] · bf16[{n},{k}]ᵀ"), matmul_at(DType::BF16, m, n, k));
    }
    add("matmul_mma_kn_256x1536x576".into(), "matmul (tensor cores, B [K, N]): bf16[256,576] · bf16[576,1536]".into(), matmul_kn_at(DType::BF16, 256, 1536, 576));
    add("matmul_tiled_f32_256x1536x576".into(), "matmul (tiled): f32[256,576] · f32[1536,576]ᵀ".into(), matmul_at(DType::F32, 256, 1536, 576));
    add("matmul_small_m_1x1536x576".into(), "matmul (small M): bf16[1,576] · bf16[1536,576]ᵀ".into(), matmul_at(DType::BF16, 1, 1536, 576));
    // A norm in the small-M kernel's prologue (decode at batch 1 and 16).
    for m in [1, 16] {
        add(format!("matmul_small_m_norm_{m}x960x576"), format!("matmul (small M, rms_norm prologue): rms_norm(bf16[{m},576]) · bf16[960,576]ᵀ + r"), norm_matmul_at(DType::BF16, m, 960, 576));
    }
    // The flat tensor-core GEMM (M in 2..=16).
    for (m, n, k) in [(16, 1536, 576), (16, 4096, 4096)] {
        add(format!("matmul_flat_{m}x{n}x{k}"), format!("matmul (flat, tensor cores): bf16[{m},{k}] · bf16[{n},{k}]ᵀ"), matmul_at(DType::BF16, m, n, k));
    }
    add("matmul_flat_kn_5x192x576".into(), "matmul (flat, tensor cores, B [K, N]): bf16[5,576] · bf16[576,192]".into(), matmul_kn_at(DType::BF16, 5, 192, 576));
    add("attention_causal_gqa_9_3_s128_d64".into(), "attention, causal GQA 9/3: bf16 B1 S128 D64".into(), attention_at(DType::BF16, 1, 9, 3, 128, 64, true));
    add("attention_causal_gqa_32_8_s512_d128".into(), "attention, causal GQA 32/8: bf16 B2 S512 D128".into(), attention_at(DType::BF16, 2, 32, 8, 512, 128, true));
    add("attention_mha_32_s4096_d128".into(), "attention, not causal, MHA 32: bf16 B2 S4096 D128 (the benchmark's shape)".into(), attention_at(DType::BF16, 2, 32, 32, 4096, 128, false));
    add("paged_attention_9_3_d64".into(), "paged attention, GQA 9/3: bf16 B4 D64, pages [64,16,3,64], block table [4,16]".into(), paged_at(DType::BF16, 4, 9, 3, 64, 64, 16, 16));
    add("paged_attention_32_8_d128".into(), "paged attention, GQA 32/8: bf16 B16 D128, pages [1024,16,8,128], block table [16,64]".into(), paged_at(DType::BF16, 16, 32, 8, 128, 1024, 16, 64));
    // Cascade decode: the prefix attention and the suffix decode with lse, the merge.
    add("attention_lse_prefix_bshd_d128".into(), "attention with lse, bshd: q bf16[16,256,8,128] over k/v [16,2048,8,128] (cascade prefix)".into(), attention_lse_at(DType::BF16, 16, 256, 8, 2048, 128));
    add("paged_attention_lse_32_8_d128".into(), "paged attention with lse, GQA 32/8: bf16 B64 D128, pages [1024,16,8,128], block table [64,16] (cascade suffix)".into(), paged_lse_at(DType::BF16, 64, 32, 8, 128, 1024, 16, 16));
    add("attention_merge_64x32x1x128".into(), "attention_merge: o bf16[64,32,1,128], lse f32[64,32,1]".into(), merge_at(DType::BF16, &[d(64), d(32), d(1)], 128));
    add("attention_merge_f32_rx5x40".into(), "attention_merge: o f32[R,5,40], lse f32[R,5]".into(), merge_at(DType::F32, &[s("R"), d(5)], 40));
    v
}

// ----- tools ------------------------------------------------------------------------------

/// Assembles `plan` for its target; asserts no spills, no stack, no warnings.
fn assemble(plan: &LaunchPlan) -> Option<ptxas::PtxasReport> {
    let path = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}"))?;
    let target = plan.target;
    let report = ptxas::assemble_with(&path, &plan.ptx, &target).unwrap_or_else(|e| panic!("{}: {e}\n{}", plan.entry, plan.ptx));
    let k = report.function(&plan.entry).unwrap_or_else(|| panic!("{}: not in {report:?}", plan.entry));
    assert!(!report.spills(), "{}: spills\n{report}", plan.entry);
    assert_eq!(k.stack_frame_bytes, 0, "{}: stack\n{report}", plan.entry);
    assert!(report.warnings.is_empty(), "{report}");
    assert!(k.registers * plan.block.iter().product::<u32>() <= target.registers_per_sm(), "{}: {} registers × {:?} threads", plan.entry, k.registers, plan.block);
    Some(report)
}

/// cuobjdump from the cache (it needs nvdisasm beside it, on PATH); `None` (skipped) where it
/// is missing, a panic under CI.
fn cuobjdump() -> Option<PathBuf> {
    let cache = std::env::var_os("SINTER_CACHE").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sinter")));
    let p = cache.map(|c| c.join("bin/cuobjdump")).filter(|p| p.is_file());
    if p.is_none() {
        assert!(std::env::var_os("CI").is_none(), "cuobjdump not found: run scripts/setup");
        eprintln!("skipped: cuobjdump not found, run scripts/setup");
    }
    p
}

/// The SASS of a cubin.
fn sass(tool: &PathBuf, cubin: &[u8], name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("sinter-sass-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("k.cubin");
    std::fs::write(&f, cubin).unwrap();
    let bin = tool.parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(tool).arg("--dump-sass").arg(&f).env("PATH", path).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "cuobjdump: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every case of the suite: (name, graph, kernel).
fn cases() -> Vec<(String, (KernelGraph, Kernel))> {
    let mut v: Vec<(String, (KernelGraph, Kernel))> = vec![
        ("pointwise silu_mul bf16 [T,14336]".into(), silu_mul(DType::BF16, s("T"), d(14336))),
        ("pointwise silu_mul f32 [T,17] (tail)".into(), silu_mul(DType::F32, s("T"), d(17))),
        ("pointwise silu_mul bf16 [3,5] (i32 index)".into(), silu_mul(DType::BF16, d(3), d(5))),
        ("pointwise zoo f32".into(), elementwise_zoo(DType::F32)),
        ("pointwise zoo bf16".into(), elementwise_zoo(DType::BF16)),
        ("pointwise rope rotate_half bf16".into(), rope(DType::BF16, "rotate_half")),
        ("pointwise rope interleaved f32".into(), rope(DType::F32, "interleaved")),
        ("pointwise rotary tables rotate_half bf16".into(), rotary_tables(DType::BF16, DType::BF16, "rotate_half")),
        ("pointwise rotary tables interleaved bf16, f32 tables".into(), rotary_tables(DType::BF16, DType::F32, "interleaved")),
        ("matmul qkv+rotary tables bf16 M=T".into(), qkv_rotary(DType::BF16, s("T"))),
        ("matmul qkv+rotary tables bf16 M=1".into(), qkv_rotary(DType::BF16, d(1))),
        ("matmul qkv+rotary tables f32 M=T".into(), qkv_rotary(DType::F32, s("T"))),
        ("row qk_norm+rotary tables bf16".into(), qk_norm_rotary(DType::BF16)),
        ("kv_append rotary tables bf16".into(), kv_append_rotary(DType::BF16)),
        ("pointwise swiglu bf16".into(), swiglu(DType::BF16)),
        ("row softmax decomposed bf16".into(), decomposed_softmax(DType::BF16)),
        ("row qk_norm bf16".into(), qk_norm(DType::BF16)),
        ("row int sum/max i32".into(), int_rows()),
        ("layout permute bf16".into(), transpose_heads(DType::BF16)),
        ("layout transpose f32".into(), transpose_2d(DType::F32)),
        ("layout concat/slice/broadcast bf16".into(), concat_slice(DType::BF16)),
        ("gather embedding bf16 i32".into(), embedding(DType::BF16, DType::I32)),
        ("gather embedding f32 i64".into(), embedding(DType::F32, DType::I64)),
        ("kv_append bf16".into(), kv_append(DType::BF16)),
        ("pointwise views bf16→f32".into(), views_pointwise()),
        ("pointwise flat mixed bf16/f32".into(), flat_mixed()),
        ("pointwise silu_mul f16 [T,100]".into(), silu_mul(DType::F16, s("T"), d(100))),
        ("layout concat last (straddling) + slice".into(), concat_last(false)),
        ("layout concat last (aligned) + slice".into(), concat_last(true)),
        ("row epilogues f32".into(), row_epilogues(DType::F32)),
        ("row softmax f16 [R,1000]".into(), row_kernel(DType::F16, s("R"), d(1000), "softmax")),
        ("gather scaled embedding".into(), embedding_scaled()),
        ("pointwise quantize_fp8 bf16 [T,1000]".into(), quantize_fp8_at(DType::BF16, s("T"), d(1000))),
        ("pointwise quantize_fp8 f32 [T,17] (tail)".into(), quantize_fp8_at(DType::F32, s("T"), d(17))),
        ("pointwise dequantize_fp8 bf16 [T,1000]".into(), dequantize_fp8_at(DType::BF16, s("T"), d(1000))),
        ("pointwise dequantize_fp8 f32 [T,17] (tail)".into(), dequantize_fp8_at(DType::F32, s("T"), d(17))),
        ("pointwise erf f32 [T,17] (tail)".into(), erf_pointwise(DType::F32, d(17))),
        ("pointwise erf bf16 [T,4096]".into(), erf_pointwise(DType::BF16, d(4096))),
        ("pointwise erf-GELU written out + gelu f16 [T,1000]".into(), erf_gelu_written(DType::F16, d(1000))),
    ];
    v.extend(fp8_misc());
    for what in ["softmax", "log_softmax", "rms_norm", "layer_norm", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min"] {
        for dt in [DType::BF16, DType::F32] {
            let ns: Vec<Dim> = if matches!(what, "softmax" | "rms_norm") {
                vec![d(1), d(17), d(1000), d(3420), d(4096), d(32768), d(33000), d(262144), s("N")]
            } else {
                // 32768 and 33000: cluster schedules on sm_90a (f32 LayerNorm spilled there).
                vec![d(17), d(4096), d(32768), d(33000), d(262144), s("N")]
            };
            for n in ns {
                v.push((format!("row {what} {dt} [R,{n}]"), row_kernel(dt, s("R"), n, what)));
            }
        }
    }
    v
}

// ----- tests ------------------------------------------------------------------------------

/// Every case compiles for sm_80 and sm_90a and assembles without spills; the ptxas resource
/// report of every kernel is a snapshot.
#[test]
fn every_family_assembles_without_spills() {
    let mut lines = String::new();
    let mut assembled = false;
    for (name, (g, k)) in cases() {
        for t in [Target::SM_80, Target::SM_90A] {
            let plan = compile_kernel(&g, k, &t).unwrap_or_else(|e| panic!("{name} {t}: {e}"));
            assert!(plan.ptx.contains(&format!(".visible .entry {}(", plan.entry)), "{name}");
            assert_waits_before_reading(&plan.ptx, &t, &name);
            assert_eq!(plan.params[..g.kernels[k].inputs.len()], (0..g.kernels[k].inputs.len()).map(KernelParam::Buffer).collect::<Vec<_>>()[..]);
            if let Some(r) = assemble(&plan) {
                assembled = true;
                let f = r.function(&plan.entry).unwrap();
                lines.push_str(&format!(
                    "{name} | {t}: {} regs, {} barriers, {} B smem, {} B spill | grid {}/{} block {:?}\n",
                    f.registers,
                    f.barriers,
                    f.shared_bytes,
                    f.spill_store_bytes + f.spill_load_bytes,
                    plan.grid[0].numerator,
                    plan.grid[0].denominator,
                    plan.block
                ));
            }
        }
    }
    if assembled {
        insta::assert_snapshot!("ptxas_reports", lines);
    }
}

/// Programmatic dependent launch: an sm_90+ kernel waits (`griddepcontrol.wait`) before any
/// load or asynchronous copy — only L2 prefetches of its weights come first — then lets its
/// dependents launch; an sm_80 kernel has neither.
fn assert_waits_before_reading(ptx: &str, t: &Target, name: &str) {
    if !t.has_programmatic_launch() {
        assert!(!ptx.contains("griddepcontrol"), "{name} {t}");
        return;
    }
    let (before, after) = ptx.split_once("griddepcontrol.wait;").unwrap_or_else(|| panic!("{name} {t}: no griddepcontrol.wait"));
    assert!(after.contains("griddepcontrol.launch_dependents;"), "{name} {t}");
    for l in before.lines().map(str::trim) {
        let reads = ["ld.global", "ld.shared", "ld.const", "ld.volatile", "cp.async", "atom.", "red."].iter().any(|op| l.starts_with(op));
        assert!(!reads, "{name} {t}: `{l}` before griddepcontrol.wait");
    }
}

/// One line about a plan: entry, target, launch geometry, dynamic shared memory, parameters.
fn plan_line(plan: &LaunchPlan) -> String {
    let grid: Vec<String> = plan.grid.iter().map(|g| format!("⌈{}/{}⌉", g.numerator, g.denominator)).collect();
    let sizes: Vec<String> = plan.params.iter().filter_map(|p| if let KernelParam::Size(d) = p { Some(d.to_string()) } else { None }).collect();
    format!(
        "{} {}: grid [{}], block {:?}, dynamic smem {}, {} buffers, sizes [{}]",
        plan.entry,
        plan.target,
        grid.join(", "),
        plan.block,
        plan.shared_bytes,
        plan.params.len() - sizes.len(),
        sizes.join(", ")
    )
}

/// The PTX of every kernel family at two fixed shapes, for sm_80 and sm_90a, each assembled by
/// ptxas (no spills, no stack, no warnings: see [`assemble`]); a snapshot holds what the case
/// is, its launch plan, ptxas's resource lines for that PTX and the PTX itself. Skipped (with
/// a message) where ptxas is missing outside CI, since the resource lines are part of the
/// snapshot.
#[test]
fn ptx_snapshots() {
    for (name, what, (g, k)) in ptx_cases() {
        for t in [Target::SM_80, Target::SM_90A] {
            let plan = compile_kernel(&g, k, &t).unwrap_or_else(|e| panic!("{name} {t}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            assert!(!report.spills(), "{name} {t}: spills\n{report}");
            let text = format!("# {what}\n# {}\n{}{}", plan_line(&plan), report.to_string().lines().map(|l| format!("# ptxas {l}\n")).collect::<String>(), plan.ptx);
            insta::assert_snapshot!(format!("ptx_{name}_{}", t.name()), text);
        }
    }
}

/// 16-byte loads (`LDG.E.128`) in the vectorised pointwise kernel, butterfly shuffles
/// (`SHFL.BFLY`) in every reduction, checked in the SASS.
#[test]
fn sass_has_vector_loads_and_shuffles() {
    let Some(tool) = cuobjdump() else { return };
    for t in [Target::SM_80, Target::SM_90A] {
        let (g, k) = silu_mul(DType::BF16, s("T"), d(14336));
        let plan = compile_kernel(&g, k, &t).unwrap();
        let Some(r) = assemble(&plan) else { return };
        let code = sass(&tool, &r.cubin, "silu");
        assert!(code.contains("LDG.E.128"), "{t}: no 16-byte load:\n{code}");
        assert!(code.contains("STG.E.128"), "{t}: no 16-byte store:\n{code}");
        let (g, k) = embedding(DType::BF16, DType::I32);
        let plan = compile_kernel(&g, k, &t).unwrap();
        let r = assemble(&plan).unwrap();
        let code = sass(&tool, &r.cubin, "gather");
        assert!(code.contains("LDG.E.128") && code.contains("STG.E.128"), "{t}: gather rows not vectorised:\n{code}");
        for what in ["softmax", "rms_norm", "layer_norm", "reduce_max"] {
            for n in [d(17), d(4096), d(262144), s("N")] {
                let (g, k) = row_kernel(DType::BF16, s("R"), n.clone(), what);
                let plan = compile_kernel(&g, k, &t).unwrap();
                let r = assemble(&plan).unwrap();
                let code = sass(&tool, &r.cubin, what);
                assert!(code.contains("SHFL.BFLY"), "{t} {what} {n}: no butterfly shuffle:\n{code}");
                if n == d(4096) {
                    assert!(code.contains("LDG.E.128"), "{t} {what} {n}: row not read in 16-byte vectors:\n{code}");
                }
                if n == d(262144) && t == Target::SM_90A && what != "reduce_max" {
                    // The cluster schedule: the slice prefetched into shared memory with
                    // 16-byte cp.async (LDGSTS.E.BYPASS.128, L1 bypassed), read back in 16-byte
                    // vectors, the cluster barrier in hardware.
                    for ins in ["LDGSTS.E.BYPASS.128", "LDGDEPBAR", "LDS.128", "UCGABAR_ARV", "UCGABAR_WAIT"] {
                        assert!(code.contains(ins), "{t} {what} {n}: no {ins}:\n{code}");
                    }
                }
            }
        }
    }
}

/// The tensor-core matmul is what it claims in the SASS: `HMMA` (mma.sync), `LDSM`
/// (ldmatrix; `.MT88` transposed for a `[K, N]` B) and `LDGSTS` (cp.async), with the main
/// loop's shared-memory reads and copies in between the MMAs, at sm_80 and sm_90a.
#[test]
fn sass_has_tensor_core_instructions() {
    let Some(tool) = cuobjdump() else { return };
    // sm_90 (not sm_90a, whose large matmuls take `wgmma`: `sass_wgmma_has_hgmma`).
    for t in [Target::SM_80, Target::SM_90] {
        for (what, gk) in [("[N, K] B", matmul_at(DType::BF16, 512, 4096, 4096)), ("[K, N] B", matmul_kn_at(DType::BF16, 256, 1536, 576)), ("f16", matmul_at(DType::F16, 256, 1536, 576))] {
            let plan = compile_kernel(&gk.0, gk.1, &t).unwrap();
            assert!(plan.entry.ends_with("_mma"), "{t} {what}: {}", plan.entry);
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "mma");
            for want in ["HMMA.16816.F32", "LDSM.16.M", "LDGSTS.E.BYPASS", "DEPBAR", "BAR.SYNC"] {
                assert!(code.contains(want), "{t} {what}: no {want}:\n{code}");
            }
            assert_eq!(code.contains("LDSM.16.MT88.4"), what == "[K, N] B", "{t} {what}: transposed ldmatrix only for [K, N]");
            // 64×64 warp tiles: 32 MMAs per 16-deep k-step, 4 steps per 64-deep stage.
            assert!(code.matches("HMMA.16816").count() >= 128, "{t} {what}: {} HMMA", code.matches("HMMA.16816").count());
        }
        // The flat GEMM (M ≤ 16): 16×16 warp tiles, 2 MMAs per k-step, 16 steps per 256-deep
        // stage.
        for (what, gk) in [("flat [N, K] B", matmul_at(DType::BF16, 16, 1536, 576)), ("flat [K, N] B", matmul_kn_at(DType::BF16, 5, 192, 576))] {
            let plan = compile_kernel(&gk.0, gk.1, &t).unwrap();
            assert!(plan.entry.ends_with("_mma") && plan.block == [64, 1, 1], "{t} {what}: {} {:?}", plan.entry, plan.block);
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "flat");
            for want in ["HMMA.16816.F32", "LDSM.16.M", "LDGSTS.E.BYPASS", "DEPBAR", "BAR.SYNC"] {
                assert!(code.contains(want), "{t} {what}: no {want}:\n{code}");
            }
            assert_eq!(code.contains("LDSM.16.MT88.4"), what == "flat [K, N] B", "{t} {what}: transposed ldmatrix only for [K, N]");
            assert!(code.matches("HMMA.16816").count() >= 32, "{t} {what}: {} HMMA", code.matches("HMMA.16816").count());
        }
    }
}

/// The Hopper GEMM (`wgmma`, sm_90a) loaded by cp.async (the schedule where the operands
/// allow no tensor map) in the SASS: `HGMMA` warpgroup products reading both operands from
/// shared memory, `LDGSTS` (cp.async) for the slabs, the async-proxy fence;
/// no spills. sm_80 refuses the schedule.
#[test]
fn sass_wgmma_has_hgmma() {
    let Some(tool) = cuobjdump() else { return };
    use sinter_codegen::kernels::matmul::{MatmulSchedule, WgmmaSchedule};
    let chunks = WgmmaSchedule { tma: false, ..WgmmaSchedule::DEFAULT };
    for w in [MatmulSchedule::Wgmma(chunks), MatmulSchedule::Wgmma(WgmmaSchedule { in_flight: 0, ..chunks })] {
    for (what, gk) in [("[N, K] B", matmul_at(DType::BF16, 512, 4096, 4096)), ("f16 tails", matmul_at(DType::F16, 200, 1000, 520))] {
        let plan = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &w).unwrap();
        assert!(plan.entry.ends_with("_wgmma"), "{what}: {}", plan.entry);
        assert!(plan.ptx.contains(".align 1024 .b8 smem_dyn[]"), "{what}: the slabs' 1024-byte alignment");
        let Some(r) = assemble(&plan) else { return };
        assert!(!r.spills(), "{what}: spills: {r:?}");
        let code = sass(&tool, &r.cubin, "wgmma");
        if std::env::var_os("SINTER_DUMP_WGMMA").is_some() {
            std::fs::write(format!("/tmp/wgmma_{}_{}.ptx", what.len(), w.name().len()), &plan.ptx).unwrap();
        }
        for want in ["HGMMA.64x256x16.F32", "LDGSTS.E.BYPASS", "FENCE.VIEW.ASYNC.S", "BAR.SYNC"] {
            assert!(code.contains(want), "{what}: no {want}:\n{code}");
        }
        assert!(!code.contains("HMMA.16816"), "{what}: mma.sync in the wgmma kernel");
        let err = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_80, &w).unwrap_err();
        assert!(err.to_string().contains("sm_90a"), "{what}: {err}");
    }
    }
}

/// The TMA-loaded wgmma matmul (sm_90a): two tensor maps (A `[M, K]`, B `[N, K]`, boxes of
/// one K tile, 128-byte swizzle) as 128-byte `__grid_constant__` parameters addressed in the
/// parameter space, `cp.async.bulk.tensor` copies completing on mbarriers; in the SASS
/// `UTMALDG` and the mbarrier's `SYNCS` operations, `HGMMA`, and no `LDGSTS` (cp.async).
/// Shapes with tails (200 × 1000 × 520, f16) too: the boxes' out-of-bounds rows read zero.
#[test]
fn sass_wgmma_tma_has_utmaldg() {
    use sinter_codegen::kernels::matmul::{MatmulSchedule, WgmmaSchedule};
    use sinter_ir::KernelParam;
    let w = MatmulSchedule::Wgmma(WgmmaSchedule { tma: true, ..WgmmaSchedule::DEFAULT });
    for (what, gk, (m, n, k)) in [("[N, K] B", matmul_at(DType::BF16, 512, 4096, 4096), (512, 4096, 4096)), ("f16 tails", matmul_at(DType::F16, 200, 1000, 520), (200, 1000, 520))] {
        let plan = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &w).unwrap();
        let maps: Vec<_> = plan.params.iter().filter_map(|p| if let KernelParam::TensorMap(t) = p { Some(t.clone()) } else { None }).collect();
        assert_eq!(maps.len(), 2, "{what}: {:?}", plan.params);
        for (t, outer, rows) in [(&maps[0], m, 128u32), (&maps[1], n, 256)] {
            assert_eq!((t.dims.iter().map(|d| d.as_const()).collect::<Vec<_>>(), t.box_dims.clone(), t.swizzle), (vec![Some(k), Some(outer)], vec![64, rows], 128), "{what}");
        }
        for want in [".param .align 64 .b8", "cvta.param.u64", "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx", "fence.mbarrier_init"] {
            assert!(plan.ptx.contains(want), "{what}: no `{want}` in the PTX");
        }
        assert!(!plan.ptx.contains("cp.async.cg"), "{what}: cp.async chunks in the TMA kernel");
        let Some(r) = assemble(&plan) else { return };
        assert!(!r.spills(), "{what}: spills: {r:?}");
        let Some(tool) = cuobjdump() else { return };
        let code = sass(&tool, &r.cubin, "wgmma");
        for want in ["UTMALDG.2D", "SYNCS", "HGMMA.64x256x16.F32"] {
            assert!(code.contains(want), "{what}: no {want}:\n{code}");
        }
        assert!(!code.contains("LDGSTS"), "{what}: cp.async in the TMA kernel");
    }
    // Batched: A `[3, 130, 256]` gets a rank-3 map (its batch axis), B `[200, 256]`
    // broadcast across the batch a rank-2 one; the TMA is the sm_90a default.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
    let x = fb.param("x", ty(DType::BF16, &[d(3), d(130), d(256)]));
    let wt = fb.param("w", ty(DType::BF16, &[d(200), d(256)]));
    let y = op_a(&mut fb, OpKind::Matmul, &[x, wt], vec![("transpose_b", Attr::Bool(true))]);
    let gk = single(Family::Matmul, fb.finish(&[y]).unwrap());
    let plan = compile_kernel(&gk.0, gk.1, &Target::SM_90A).unwrap();
    let ranks: Vec<usize> = plan.params.iter().filter_map(|p| if let KernelParam::TensorMap(t) = p { Some(t.dims.len()) } else { None }).collect();
    assert_eq!(ranks, vec![3, 2], "{:?}", plan.params);
    assert!(plan.ptx.contains("cp.async.bulk.tensor.3d") && plan.ptx.contains("cp.async.bulk.tensor.2d"));
    // Operands neither the wgmma kernel nor a tensor map can read are refused with the
    // reason: a K of 100 f16 (200-byte rows, not a multiple of 16 bytes).
    let gk = matmul_at(DType::F16, 128, 256, 100);
    let err = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &w).unwrap_err();
    assert!(err.to_string().contains("16-byte"), "{err}");
}

/// The warp-specialised wgmma matmul (`WgmmaSchedule::specialized`), one CTA per
/// tile and persistent over 132 CTAs: 384 threads (`.maxntid 384`, so ptxas budgets ≤ 168
/// registers a thread), `setmaxnreg` 40/232 (`USETMAXREG` in the SASS), the producer's
/// `UTMALDG`, the mbarriers' `SYNCS`, `HGMMA`, no spills, and one `BAR.SYNC` only (the one
/// publishing the mbarriers' initialisation: none in the main loop); the persistent form's
/// grid is `[132, 1, 1]`. Both are schedule candidates of a plain sm_90a product.
#[test]
fn sass_wgmma_ws_has_setmaxnreg() {
    use sinter_codegen::kernels::matmul::{MatmulSchedule, WgmmaSchedule};
    let ws = WgmmaSchedule { specialized: true, ..WgmmaSchedule::DEFAULT };
    let persistent = WgmmaSchedule { ctas: 132, ..ws };
    let gk = matmul_at(DType::BF16, 512, 4096, 4096);
    let names: Vec<String> = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap().into_iter().map(|v| v.name).collect();
    for w in [ws, persistent] {
        assert!(names.contains(&MatmulSchedule::Wgmma(w).name()), "{:?} not in {names:?}", MatmulSchedule::Wgmma(w).name());
    }
    for (what, gk) in [("bf16 512x4096x4096", matmul_at(DType::BF16, 512, 4096, 4096)), ("f16 tails", matmul_at(DType::F16, 200, 1000, 520))] {
        for w in [ws, persistent] {
            let name = MatmulSchedule::Wgmma(w).name();
            let plan = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &MatmulSchedule::Wgmma(w)).unwrap();
            assert_eq!(plan.block, [384, 1, 1], "{what} {name}");
            if w.ctas > 0 {
                assert_eq!(plan.grid.iter().map(|g| (g.numerator.as_const(), g.denominator)).collect::<Vec<_>>(), vec![(Some(132), 1), (Some(1), 1), (Some(1), 1)], "{what} {name}");
            }
            for want in [".maxntid 384", "setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232", "mbarrier.arrive.shared::cta.b64", "mbarrier.arrive.expect_tx", "cp.async.bulk.tensor.2d"] {
                assert!(plan.ptx.contains(want), "{what} {name}: no `{want}` in the PTX");
            }
            let Some(r) = assemble(&plan) else { return };
            let regs = r.function(&plan.entry).map(|k| k.registers).unwrap_or(0);
            eprintln!("{what} {name}: {regs} registers");
            assert!(regs <= 168, "{what} {name}: {regs} registers");
            let Some(tool) = cuobjdump() else { return };
            let code = sass(&tool, &r.cubin, "wgmma");
            for want in ["USETMAXREG", "UTMALDG.2D", "SYNCS", "HGMMA.64x256x16.F32"] {
                assert!(code.contains(want), "{what} {name}: no {want}:\n{code}");
            }
            assert_eq!(code.matches("BAR.SYNC").count(), 1, "{what} {name}: CTA barriers beyond the initialisation's:\n{code}");
            assert!(!code.contains("LDGSTS"), "{what} {name}: cp.async in the TMA kernel");
        }
    }
}

/// The fp8 matmul (`f8e4m3` operands) on sm_90a: the `wgmma` kernel with e4m3
/// products — `QGMMA` in the SASS (`wgmma.mma_async …k32.f32.e4m3.e4m3`), no `HGMMA`/`HMMA`
/// —, `LDGSTS` (cp.async) for the byte slabs, no spills, for every wgmma schedule candidate
/// and with M, N and K tails (K a multiple of 16: 16-byte rows); bf16 and f32 results. sm_80
/// and sm_90 (no `wgmma`) refuse it, naming f8e4m3.
#[test]
fn sass_fp8_wgmma_has_qgmma() {
    let Some(tool) = cuobjdump() else { return };
    for (what, gk) in [("fp8 512x4096x4096", fp8_matmul_at(DType::BF16, 512, 4096, 4096)), ("fp8 tails 200x300x208", fp8_matmul_at(DType::BF16, 200, 300, 208)), ("fp8 f32 out", fp8_matmul_at(DType::F32, 128, 256, 128))] {
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
        assert!(variants.len() >= 3 && variants.iter().all(|v| v.name.starts_with("wgmma ") && v.name.contains("x128 ")), "{what}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        for v in &variants {
            let plan = &v.plan;
            assert!(plan.entry.ends_with("_matmul_wgmma_e4m3"), "{what}: {}", plan.entry);
            assert!(plan.ptx.contains("wgmma.mma_async.sync.aligned.m64n") && plan.ptx.contains("k32.f32.e4m3.e4m3"), "{what} {}", v.name);
            let Some(r) = assemble(plan) else { return };
            assert!(!r.spills(), "{what} {}: spills: {r:?}", v.name);
            let code = sass(&tool, &r.cubin, "fp8");
            // The TMA-loaded candidate (`… tma`: e4m3 boxes of 128 × rows, one byte an
            // element) or every thread's cp.async chunks.
            let loads: &[&str] = if v.name.ends_with(" tma") { &["UTMALDG.2D", "SYNCS"] } else { &["LDGSTS.E.BYPASS", "FENCE.VIEW.ASYNC.S"] };
            for want in ["QGMMA.64x", "BAR.SYNC"].iter().chain(loads) {
                assert!(code.contains(want), "{what} {}: no {want}:\n{code}", v.name);
            }
            assert!(!code.contains("HGMMA") && !code.contains("HMMA"), "{what} {}: 16-bit tensor-core products in the fp8 kernel", v.name);
        }
        for t in [Target::SM_80, Target::SM_90] {
            let err = compile_kernel(&gk.0, gk.1, &t).unwrap_err().to_string();
            assert!(err.contains("f8e4m3") && err.contains("sm_90a"), "{what} {t}: {err}");
        }
    }
}

/// The PTX of the fp8 matmul (sm_90a only: the other targets refuse it) at one shape with
/// its launch plan and ptxas's resource lines (no spills), as [`ptx_snapshots`].
#[test]
fn ptx_snapshot_fp8_wgmma() {
    let (g, k) = fp8_matmul_at(DType::BF16, 512, 4096, 4096);
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    let Some(report) = assemble(&plan) else { return };
    assert!(!report.spills(), "spills\n{report}");
    let what = "matmul (fp8 wgmma): dequantize_fp8(f8e4m3[512,4096], sa) · dequantize_fp8(f8e4m3[4096,4096], sb)ᵀ → bf16";
    let text = format!("# {what}\n# {}\n{}{}", plan_line(&plan), report.to_string().lines().map(|l| format!("# ptxas {l}\n")).collect::<String>(), plan.ptx);
    insta::assert_snapshot!("ptx_matmul_fp8_wgmma_512x4096x4096_sm_90a", text);
}

/// The fp8 attention (`f8e4m3` q, k, v) on sm_90a: the `wgmma` attention kernel
/// with e4m3 products — `QGMMA` in the SASS for Q·Kᵀ (both operands from shared memory) and
/// P·V (A from registers), no `HGMMA`/`HMMA` —, `F2FP` packing P to e4m3, `PRMT` transposing
/// V, `LDGSTS` (cp.async) for the tiles, `FENCE.VIEW.ASYNC.S` (the async-proxy fence), no
/// spills, at head dims 128 and 64, causal or not, for each schedule candidate (64-key
/// tiles, plain and with the intra-warpgroup overlap). sm_80 and sm_90 refuse it, naming f8e4m3.
#[test]
fn sass_fp8_attention_has_qgmma() {
    let Some(tool) = cuobjdump() else { return };
    for (what, gk) in [("fp8 attention D128 causal", fp8_attention_at(2, 32, 8, 512, 128, true)), ("fp8 attention D64", fp8_attention_at(1, 8, 8, 300, 64, false))] {
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
        assert_eq!(variants.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["wgmma kv64 g2 e4m3", "wgmma kv64 g2 ov e4m3"], "{what}");
        for v in &variants {
            let plan = &v.plan;
            assert!(plan.entry.ends_with("_attention_wgmma_e4m3"), "{what}: {}", plan.entry);
            let Some(r) = assemble(plan) else { return };
            assert!(!r.spills(), "{what} {}: spills: {r:?}", v.name);
            let code = sass(&tool, &r.cubin, "fp8attn");
            for want in ["QGMMA.64x", "F2FP.SATFINITE.E4M3.F32.PACK_AB", "PRMT", "LDGSTS.E.BYPASS", "FENCE.VIEW.ASYNC.S", "MUFU.EX2", "BAR.SYNC"] {
                assert!(code.contains(want), "{what} {}: no {want}:\n{code}", v.name);
            }
            assert!(!code.contains("HGMMA") && !code.contains("HMMA"), "{what} {}: 16-bit tensor-core products in the fp8 kernel", v.name);
        }
        for t in [Target::SM_80, Target::SM_90] {
            let err = compile_kernel(&gk.0, gk.1, &t).unwrap_err().to_string();
            assert!(err.contains("f8e4m3") && err.contains("sm_90a"), "{what} {t}: {err}");
        }
    }
}

/// The PTX of the fp8 attention (sm_90a only) at head dims 128 (causal GQA 32/8) and 64 with
/// its launch plan and ptxas's resource lines (no spills), as [`ptx_snapshots`].
#[test]
fn ptx_snapshot_fp8_attention() {
    for (name, what, (g, k)) in [
        ("ptx_attention_fp8_causal_gqa_32_8_s512_d128_sm_90a", "attention (fp8 wgmma), causal GQA 32/8: f8e4m3 B2 S512 D128 → bf16", fp8_attention_at(2, 32, 8, 512, 128, true)),
        ("ptx_attention_fp8_s300_d64_sm_90a", "attention (fp8 wgmma): f8e4m3 B1 H8 S300 D64 → bf16", fp8_attention_at(1, 8, 8, 300, 64, false)),
    ] {
        let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
        let Some(report) = assemble(&plan) else { return };
        assert!(!report.spills(), "spills\n{report}");
        let text = format!("# {what}\n# {}\n{}{}", plan_line(&plan), report.to_string().lines().map(|l| format!("# ptxas {l}\n")).collect::<String>(), plan.ptx);
        insta::assert_snapshot!(name, text);
    }
}

/// Prefill attention on tensor cores, in the SASS: `HMMA` for Q·Kᵀ and P·V, `LDSM` for Q
/// and K and its transposed form (`.MT88`) for V, `LDGSTS` (cp.async) for the tiles,
/// `MUFU.EX2` alone for the exponentials (no subnormal range fix-ups), `VOTE.ANY` for the
/// warp's decisions, at sm_80 and sm_90 (sm_90a takes the `wgmma` kernel:
/// [`sass_attention_wgmma_has_hgmma`]), for head dims 64 and 128, causal or not.
#[test]
fn sass_attention_has_tensor_core_instructions() {
    let Some(tool) = cuobjdump() else { return };
    for t in [Target::SM_80, Target::SM_90] {
        for (hd, causal) in [(64, true), (128, true), (128, false)] {
            let (g, k) = attention_at(DType::BF16, 2, 32, 8, 512, hd, causal);
            let plan = compile_kernel(&g, k, &t).unwrap();
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "attention");
            for want in ["HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128", "MUFU.EX2", "SHFL.BFLY", "VOTE.ANY", "BAR.SYNC", "STG.E.128"] {
                assert!(code.contains(want), "{t} D{hd} causal={causal}: no {want}:\n{code}");
            }
            // One 32- or 64-key tile: 2 slabs × (D/16 · kv/8 for S + kv/16 · D/8 for O).
            let hmma = code.matches("HMMA.16816").count();
            assert!(hmma >= 128, "{t} D{hd}: {hmma} HMMA");
            assert!(!code.contains("LDL") && !code.contains("STL"), "{t} D{hd}: local memory");
        }
    }
}

/// Prefill attention on Hopper tensor cores (sm_90a, the default there for head dims 64 and
/// 128): `HGMMA` for Q·Kᵀ and P·V and no `HMMA`, `LDGSTS` for the tiles, the async-proxy
/// fence, the warpgroup's `BAR.RED.OR`, `MUFU.EX2` for the exponentials; no local memory.
/// Each schedule candidate, bf16, causal or not, D 64 and 128; the intra-warpgroup overlap
/// (`ov`) with a group left in flight and no serialization by ptxas.
#[test]
fn sass_attention_wgmma_has_hgmma() {
    use sinter_codegen::kernels::attention::generate_prefill_wg_with;
    use sinter_codegen::kernels::attention::schedule::{choose_wg_schedule, WgSchedule};
    let Some(tool) = cuobjdump() else { return };
    for (hd, causal) in [(64, true), (128, true), (128, false)] {
        let (g, k) = attention_at(DType::BF16, 2, 32, 8, 512, hd, causal);
        let default = compile_kernel(&g, k, &Target::SM_90A).unwrap();
        assert!(default.entry.ends_with("_attention_wgmma"), "D{hd}: {}", default.entry);
        let w = choose_wg_schedule(hd as u32, hd as u32);
        for sc in [w, WgSchedule { pv_split: true, ..w }, WgSchedule { block_kv: 64, ..w }, WgSchedule { overlap: true, ..w }, WgSchedule { overlap: true, block_kv: 64, ..w }] {
            let plan = generate_prefill_wg_with(&g, k, &Target::SM_90A, &sc).unwrap();
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "attention_wgmma");
            for want in ["HGMMA.64x", "LDGSTS.E.BYPASS.128", "FENCE.VIEW.ASYNC.S", "MUFU.EX2", "SHFL.BFLY", "BAR.SYNC", "BAR.RED.OR", "STG.E.128"] {
                assert!(code.contains(want), "{} D{hd} causal={causal}: no {want}:\n{code}", sc.name());
            }
            assert!(!code.contains("HMMA.16816"), "{} D{hd}: mma.sync in the wgmma kernel", sc.name());
            assert!(!code.contains("LDL") && !code.contains("STL"), "{} D{hd}: local memory", sc.name());
            // S: m64n{kv}k16 per 16 of D; P·V: per 16 keys, one m64n{Dv}k16 or Dv/64 n64.
            let n = code.matches("HGMMA.64x").count() as u32;
            let pv = if sc.pv_split { hd / 64 } else { 1 };
            assert!(n >= hd as u32 / 16 + sc.block_kv / 16 * pv as u32, "{} D{hd}: {n} HGMMA", sc.name());
            // The overlap keeps a group in flight: a `WARPGROUP.DEPBAR` that waits for all but
            // one group (S_t done while P·V runs) with the softmax's exponentials before the
            // wait for the last (ptxas hoists a wait to the top of its basic block), and
            // ptxas did not serialize the `wgmma`s.
            if sc.overlap {
                let overlapped = code.match_indices("WARPGROUP.DEPBAR.LE gsb0, 0x1").any(|(i, _)| {
                    let rest = &code[i..];
                    rest.find("WARPGROUP.DEPBAR.LE gsb0, 0x0").is_some_and(|j| rest[..j].contains("MUFU.EX2"))
                });
                assert!(overlapped, "{} D{hd} causal={causal}: no softmax between the waits:\n{code}", sc.name());
                assert!(!r.log.contains("serialized"), "{} D{hd} causal={causal}: {}", sc.name(), r.log);
            }
        }
    }
}

/// The warp-specialised wgmma attention (`WgSchedule::producer`, names ` ws`) and its
/// ping-pong (` ws pp`): schedule candidates of a plain sm_90a prefill at D 64 and
/// 128; 384 threads (`.maxntid 384`: ptxas budgets ≤ 168 registers a thread before
/// `setmaxnreg`), `USETMAXREG` (24/240), the producer's `UTMALDG.4D` (Q, K, V through 4-d
/// maps), the mbarriers' `SYNCS`, `HGMMA`, no `LDGSTS` (cp.async) and no local memory, no
/// `wgmma` serialization; one CTA-wide `BAR.SYNC 0` (the mbarriers' initialisation: none in
/// the key loop), the ping-pong's `BAR.ARV` on the named scheduling barriers.
#[test]
fn sass_attention_wgmma_ws_has_tma_and_setmaxnreg() {
    use sinter_codegen::kernels::attention::generate_prefill_wg_with;
    use sinter_codegen::kernels::attention::schedule::{choose_wg_schedule, WgSchedule};
    for (hd, causal) in [(64, true), (128, true), (128, false)] {
        let (g, k) = attention_at(DType::BF16, 2, 32, 8, 512, hd, causal);
        let names: Vec<String> = sinter_codegen::schedule_variants(&g, k, &Target::SM_90A).unwrap().into_iter().map(|v| v.name).collect();
        let ws = WgSchedule { producer: true, ..choose_wg_schedule(hd as u32, hd as u32) };
        let pp = WgSchedule { pingpong: true, ..ws };
        for sc in [ws, pp, WgSchedule { block_kv: 64, ..ws }, WgSchedule { block_kv: 64, ..pp }] {
            assert!(names.contains(&sc.name()), "{} not in {names:?}", sc.name());
            let plan = generate_prefill_wg_with(&g, k, &Target::SM_90A, &sc).unwrap();
            assert_eq!(plan.block, [384, 1, 1], "{}", sc.name());
            assert!(plan.ptx.contains(".maxntid 384"), "{}", sc.name());
            let Some(r) = assemble(&plan) else { return };
            let regs = r.function(&plan.entry).map(|k| k.registers).unwrap_or(0);
            assert!(regs <= 168, "{} D{hd}: {regs} registers", sc.name());
            assert!(!r.log.contains("serialized"), "{} D{hd} causal={causal}: {}", sc.name(), r.log);
            let Some(tool) = cuobjdump() else { return };
            let code = sass(&tool, &r.cubin, "attention_wgmma_ws");
            for want in ["USETMAXREG", "UTMALDG.4D", "SYNCS", "HGMMA.64x", "MUFU.EX2", "BAR.RED.OR", "STG.E.128"] {
                assert!(code.contains(want), "{} D{hd} causal={causal}: no {want}:\n{code}", sc.name());
            }
            assert!(!code.contains("LDGSTS"), "{} D{hd}: cp.async in the TMA kernel", sc.name());
            assert!(!code.contains("HMMA.16816"), "{} D{hd}: mma.sync in the wgmma kernel", sc.name());
            assert!(!code.contains("LDL") && !code.contains("STL"), "{} D{hd}: local memory", sc.name());
            let cta = code.lines().filter(|l| l.contains("BAR.SYNC") && !l.contains("BAR.SYNC.DEFER_BLOCKING R") && (l.contains("BAR.SYNC 0x0") || l.contains("BAR.SYNC.DEFER_BLOCKING 0x0"))).count();
            assert_eq!(cta, 1, "{} D{hd}: CTA barriers beyond the initialisation's:\n{code}", sc.name());
            assert_eq!(code.contains("BAR.ARV"), sc.pingpong, "{} D{hd}: the ping-pong's bar.arrive", sc.name());
        }
    }
}

/// Launch plans: symbolic sizes become `Size` parameters after the buffers, constant ones
/// are baked in; grids are `ceil(work / per-CTA)` expressions.
#[test]
fn launch_plans() {
    let (g, k) = silu_mul(DType::BF16, s("T"), d(14336));
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.entry, "k0_pointwise");
    assert_eq!(plan.target, Target::SM_90A);
    assert_eq!(plan.params, vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Size(s("T").scale(14336))]);
    assert_eq!(plan.grid[0], GridDim { numerator: s("T").scale(14336), denominator: 8 * 256 });
    assert_eq!(plan.block, [256, 1, 1]);
    assert_eq!(plan.shared_bytes, 0);
    let (g, k) = silu_mul(DType::F32, d(3), d(5));
    let plan = compile_kernel(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.params, vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2)]);
    let (g, k) = row_kernel(DType::BF16, s("R"), d(4096), "softmax");
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.entry, "k0_row_reduction");
    assert_eq!(plan.grid[0], GridDim { numerator: s("R"), denominator: 1 });
    assert_eq!(plan.block, [256, 1, 1]);
    assert_eq!(plan.params, vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Size(s("R"))]);
    let (g, k) = row_kernel(DType::F32, s("R"), d(17), "softmax");
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.grid[0], GridDim { numerator: s("R"), denominator: 4 }, "a warp per row, four rows per CTA");
    assert_eq!(plan.block, [128, 1, 1]);
    let (g, k) = kv_append(DType::BF16);
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.params[..8], (0..8).map(KernelParam::Buffer).collect::<Vec<_>>()[..]);
    assert!(plan.params[8..].iter().all(|p| matches!(p, KernelParam::Size(_))));
    // The kv_append outputs alias the inputs: no pointer is noalias.
    assert!(!plan.ptx.contains("ld.global.nc"), "{}", plan.ptx);
}

/// What the generators refuse, with errors that name the kernel.
#[test]
fn unsupported_kernels_are_errors() {
    // A reduction over the first axis.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bad");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let y = op_a(&mut fb, OpKind::ReduceSum, &[x], vec![("axis", Attr::Int(0))]);
    let (g, k) = single(Family::RowReduction, fb.finish(&[y]).unwrap());
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(matches!(e, CodegenError::Unsupported { .. }) && e.to_string().contains("k0") && e.to_string().contains("not the last"), "{e}");
    // A matmul in a pointwise kernel.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bad");
    let a = fb.param("a", ty(DType::F32, &[d(4), d(8)]));
    let b = fb.param("b", ty(DType::F32, &[d(8), d(4)]));
    let y = op(&mut fb, OpKind::Matmul, &[a, b]);
    let (g, k) = single(Family::Pointwise, fb.finish(&[y]).unwrap());
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("matmul") && e.to_string().contains("k0 (Pointwise)"), "{e}");
    // A softmax outside a row-reduction kernel.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bad");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let y = op(&mut fb, OpKind::Softmax, &[x]);
    let (g, k) = single(Family::Pointwise, fb.finish(&[y]).unwrap());
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("RowReduction"), "{e}");
    // A body that does not match its buffers.
    let (mut g, k) = silu_mul(DType::BF16, d(4), d(8));
    let b0 = g.kernels[k].inputs[0];
    g.buffers[b0].ty = ty(DType::F32, &[d(4), d(8)]);
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(matches!(e, CodegenError::BadKernel { .. }), "{e}");
    // A kernel that does not exist.
    let e = compile_kernel(&g, Kernel::from_u32(7), &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("k7"), "{e}");
}

/// Strided inputs: a transposed (non-contiguous) input buffer is read with its strides, and
/// an input slice with a 2-byte-aligned base is read element by element.
#[test]
fn strided_and_unaligned_inputs() {
    let (mut g, k) = silu_mul(DType::BF16, d(64), d(128));
    let b0 = g.kernels[k].inputs[0];
    g.buffers[b0].layout = Layout { strides: vec![d(1), d(64)], align: 256 };
    let b1 = g.kernels[k].inputs[1];
    g.buffers[b1].layout.align = 2;
    for t in [Target::SM_80, Target::SM_90A] {
        let plan = compile_kernel(&g, k, &t).unwrap();
        assemble(&plan);
        // The output is still written in 16-byte vectors.
        assert!(plan.ptx.contains("st.global.v4.b32"), "{}", plan.ptx);
    }
}

/// The persistent row schedules (` p16`, ` p14`, …: autotuning candidates) at the long-row
/// benchmark shapes on sm_90a: grids of `[16, 8, 1]` and `[14, 8, 1]` for the LayerNorm and
/// the RMSNorm (clusters of 8 CTAs, one CTA an SM: the staged weights fill the shared memory)
/// and of `[49, 8, 1]`, `[42, 8, 1]` for the softmax's 512 threads (three CTAs an SM) over 512
/// rows of 262144, the refill of the next row's slice as a `cp.async` whose source size is a
/// register (16 bytes, or 0 past the last row), no spills (ptxas), and `LDGSTS` in the SASS;
/// the LayerNorm's weight and bias staged once (` w p`: 192 KiB of the stage).
#[test]
fn ptxas_persistent_row_schedules() {
    for what in ["layer_norm", "rms_norm", "softmax"] {
        let gk = row_kernel(DType::BF16, d(512), d(262144), what);
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        let persistent: Vec<_> = variants.iter().filter(|v| v.name.contains(" p")).collect();
        assert_eq!(persistent.len(), 6, "{what}: {names:?}");
        for v in persistent {
            let plan = &v.plan;
            let tag = format!("{what} `{}`", v.name);
            let g = v.name.split(' ').find_map(|w| w.strip_prefix('p')).and_then(|g| g.parse::<i64>().ok());
            let want: &[i64] = if what == "softmax" && !v.name.contains(" t1024 ") { &[49, 42] } else { &[16, 14] };
            assert!(g.is_some_and(|g| want.contains(&g)), "{tag}");
            assert_eq!(plan.grid.iter().map(|g| (g.numerator.as_const(), g.denominator)).collect::<Vec<_>>(), vec![(g, 1), (Some(8), 1), (Some(1), 1)], "{tag}");
            assert_eq!(v.name.contains(" w "), what != "softmax", "{tag}");
            if what == "layer_norm" {
                assert!(plan.shared_bytes >= 192 << 10, "{tag}: {} bytes of shared memory", plan.shared_bytes);
            }
            assert!(plan.ptx.lines().any(|l| l.contains("cp.async.cg.shared.global") && l.trim_end().trim_end_matches(';').rsplit(',').next().is_some_and(|a| a.trim().starts_with("%r"))), "{tag}: no refill cp.async with a register source size");
            let Some(r) = assemble(plan) else { return };
            let regs = r.function(&plan.entry).map(|k| k.registers).unwrap_or(0);
            eprintln!("{tag}: {regs} registers, {} bytes of shared memory", plan.shared_bytes);
            let Some(tool) = cuobjdump() else { continue };
            let code = sass(&tool, &r.cubin, "persistent");
            assert!(code.contains("LDGSTS"), "{tag}: no LDGSTS:\n{code}");
        }
    }
}
