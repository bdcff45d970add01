//! `sinter bench`: each kernel family on the GPU at the shapes of `bench/anchors.py`, timed with
//! CUDA events (the median over the iterations of the time from a run's first kernel's start to
//! its last kernel's end), printed beside the anchor figures measured in the same device call.
//!
//! Each timed run follows an L2-clearing fill of a scratch buffer, as the anchors' timer does
//! ([`crate::timing`]); with `--no-flush` each run starts on an idle GPU, the host's launch
//! latency included. Each [`Row`] records which ([`Row::flushed`]).
//!
//! Traffic is counted as `anchors.py` counts it (bytes the op must read and write once), so
//! the GB/s figures compare one to one. Every memory-bound row moves at least
//! [`MIN_TRAFFIC_BYTES`] per run and is also reported as a fraction of the copy bandwidth
//! `anchors.py` measured in the same call (its `ceiling` / `d2d copy` row, always measured).
//! The groups without a PyTorch anchor of their own (RoPE, gather, casts, `kv_append`,
//! LayerNorm, log-softmax, row reductions, a broadcast add, the row-length sweep) are compared
//! with that copy bandwidth only.

use serde_json::Value as Json;
use sinter_runtime::{Device, DeviceBuffer};

use crate::gpu::{GpuProgram, Lowering};
use crate::{Bindings, DType, Error, Graph, Target};

/// One measured row.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// Group, as in `anchors.py` (`swiglu`, `rmsnorm`, `softmax`, `matmul`, `attn`, `decode`).
    pub group: String,
    /// What ran.
    pub name: String,
    /// Shape text.
    pub shape: String,
    /// Median milliseconds.
    pub ms: f64,
    /// GB/s or TFLOP/s.
    pub value: f64,
    /// `GB/s` or `TFLOP/s`.
    pub unit: String,
    /// Kernels launched.
    pub kernels: usize,
    /// The anchor compared with (`name = value`), if any.
    pub anchor: Option<String>,
    /// value / anchor value.
    pub ratio: Option<f64>,
    /// For GB/s rows: value / the copy bandwidth measured in the same call, where the anchors
    /// hold it.
    pub of_copy: Option<f64>,
    /// Whether each timed run followed the L2-clearing fill (the default) rather than starting
    /// on an idle GPU (`--no-flush`); see the module docs.
    pub flushed: bool,
}

/// The benchmark groups, in the order they run (`--only` takes these names).
pub const GROUPS: &[&str] = &[
    "swiglu", "rmsnorm", "softmax", "bias", "rope", "gather", "cast", "kv_append", "layernorm", "log_softmax", "reduce", "rows", "matmul", "fp8", "qmatmul", "attn", "decode", "cascade",
];

/// The group under which [`run`] lists its own rows among the anchors, for a case whose
/// anchor is an earlier row of the same run.
const OURS: &str = "ours";

/// The least traffic (bytes read + written once) of a memory-bound row: large enough that
/// launch latency and the 50 MB L2 cache do not flatter the GB/s figure.
pub const MIN_TRAFFIC_BYTES: f64 = 256.0 * 1024.0 * 1024.0;

/// The copy bandwidth row of the anchors (`group = "ceiling"`, name containing `copy`), as
/// `(name shape, GB/s)`.
fn copy_anchor(anchors: &[Json]) -> Option<(String, f64)> {
    anchor(anchors, "ceiling", &["copy"])
}

/// The best anchor figure of a group measured in the same call: the highest value among the
/// anchor rows whose name contains one of `names`.
fn anchor(anchors: &[Json], group: &str, names: &[&str]) -> Option<(String, f64)> {
    anchors
        .iter()
        .filter(|r| r["group"] == group)
        .filter(|r| names.iter().any(|n| r["name"].as_str().is_some_and(|s| s.contains(n))))
        .filter_map(|r| Some((format!("{} {}", r["name"].as_str()?, r["shape"].as_str().unwrap_or("")), r["value"].as_f64()?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

fn random_buffer(dev: &Device, dtype: DType, shape: &[usize], seed: u64) -> Result<DeviceBuffer, Error> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    // The float dtypes are encoded here, without a vector of f64 the size of the tensor.
    let bytes: Vec<u8> = match dtype {
        DType::BF16 => (0..n).flat_map(|_| sinter_ir::dtype::bf16_from_f64(next()).to_bits().to_le_bytes()).collect(),
        DType::F16 => (0..n).flat_map(|_| sinter_ir::dtype::f16_from_f64(next()).to_bits().to_le_bytes()).collect(),
        DType::F32 => (0..n).flat_map(|_| (next() as f32).to_le_bytes()).collect(),
        DType::Q8_0 | DType::Q4_1 => {
            // Random blocks: a small positive f16 scale (and a negative minimum for q4_1),
            // random quant bytes.
            let mut out = Vec::with_capacity(dtype.storage_bytes(n).unwrap_or(0));
            for _ in 0..n / DType::QBLOCK {
                out.extend(sinter_ir::dtype::f16_from_f64(0.001 + 0.01 * next().abs()).to_le_bytes());
                let quants = if dtype == DType::Q4_1 {
                    out.extend(sinter_ir::dtype::f16_from_f64(-0.08 * next().abs()).to_le_bytes());
                    16
                } else {
                    32
                };
                out.extend((0..quants).map(|_| ((next() + 1.0) * 127.9) as u8));
            }
            out
        }
        _ => {
            let data: Vec<f64> = (0..n).map(|_| next()).collect();
            return Ok(dev.upload_f64(dtype, shape, &data)?);
        }
    };
    Ok(dev.upload_bytes(dtype, shape, &bytes)?)
}

/// Times `g`'s entry on `inputs` (device buffers in parameter order): the median over `iters`
/// runs of the time from a run's first kernel's start to its last kernel's end (milliseconds),
/// each run preceded by a fill of `flush` when given ([`crate::timing::median_micros`]).
fn time(dev: &Device, g: &Graph, lowering: Lowering, inputs: &[DeviceBuffer], iters: usize, autotune: bool, flush: Option<&DeviceBuffer>) -> Result<(f64, usize), Error> {
    let p = GpuProgram::compile_with_options(g, dev, lowering, autotune, &mut |_, _| {})?;
    if autotune {
        let cache = sinter_runtime::KernelCache::open_default()?;
        let target = crate::gpu::target_for(dev);
        for k in p.kernel_graph().kernels.keys() {
            if let Some(r) = crate::tune::record(p.kernel_graph(), k, &target, &cache) {
                let times: Vec<String> = r.micros.iter().map(|(n, us)| format!("{n} {us:.1} us")).collect();
                eprintln!("  {k} tuned on {}: {} ({})", r.device, r.winner, times.join(", "));
            }
        }
    }
    let refs: Vec<&DeviceBuffer> = inputs.iter().collect();
    let b = Bindings::new();
    let micros = crate::timing::median_micros(dev, flush, iters, || Ok(p.executor().run_profiled(&refs, &b)?.1.total_micros))?;
    Ok((micros / 1000.0, p.kernel_graph().kernels.len()))
}

/// What one benchmark input holds.
#[derive(Clone, Debug, PartialEq)]
enum Fill {
    /// Uniform random values in [-1, 1) with this seed.
    Random(u64),
    /// Explicit values.
    Values(Vec<f64>),
}

/// One benchmark input: dtype, shape and contents.
type Input = (DType, Vec<usize>, Fill);

/// One benchmark row to measure.
struct BenchCase {
    group: &'static str,
    name: String,
    shape: String,
    graph: Graph,
    lowering: Lowering,
    inputs: Vec<Input>,
    /// Work per run: bytes (GB/s) or FLOPs (TFLOP/s).
    work: f64,
    unit: &'static str,
    iters_cap: usize,
    /// Picks the anchor row to compare with.
    anchor: Box<dyn Fn(&[Json]) -> Option<(String, f64)>>,
}

fn cases(only: &[String]) -> Result<Vec<BenchCase>, Error> {
    let want = |g: &str| only.is_empty() || only.iter().any(|o| o == g);
    let mut out = Vec::new();
    if want("swiglu") {
        let (m, n) = (16384usize, 14336usize);
        let g = crate::graph! { fn main(a: bf16[{m}, {n}], b: bf16[{m}, {n}]) -> bf16[{m}, {n}] { a.silu() * b } }?;
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            out.push(BenchCase {
                group: "swiglu",
                name: format!("silu(a)*b [{lowering:?}]"),
                shape: format!("{m}x{n}"),
                graph: g.clone(),
                lowering,
                inputs: vec![(DType::BF16, vec![m, n], Fill::Random(1)), (DType::BF16, vec![m, n], Fill::Random(2))],
                work: 3.0 * (m * n * 2) as f64,
                unit: "GB/s",
                iters_cap: usize::MAX,
                anchor: Box::new(|a| anchor(a, "swiglu", &["compile silu"])),
            });
        }
        // The swiglu op itself (what the recognitions produce), one kernel.
        let g = crate::graph! { fn main(a: bf16[{m}, {n}], b: bf16[{m}, {n}]) -> bf16[{m}, {n}] { a.swiglu(b) } }?;
        out.push(BenchCase {
            group: "swiglu",
            name: "swiglu(a, b) op".into(),
            shape: format!("{m}x{n}"),
            graph: g,
            lowering: Lowering::Unfused,
            inputs: vec![(DType::BF16, vec![m, n], Fill::Random(1)), (DType::BF16, vec![m, n], Fill::Random(2))],
            work: 3.0 * (m * n * 2) as f64,
            unit: "GB/s",
            iters_cap: usize::MAX,
            anchor: Box::new(|a| anchor(a, "swiglu", &["compile silu"])),
        });
    }
    if want("rmsnorm") {
        let (m, n) = (32768usize, 4096usize);
        let g = crate::graph! {
            fn main(x: bf16[{m}, {n}], w: bf16[{n}]) -> bf16[{m}, {n}] {
                let x32 = x.cast(f32);
                (x32 * ((x32 * x32).mean(-1) + 1e-6).rsqrt()).cast(bf16) * w
            }
        }?;
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            out.push(BenchCase {
                group: "rmsnorm",
                name: format!("decomposed RMSNorm [{lowering:?}]"),
                shape: format!("{m}x{n}"),
                graph: g.clone(),
                lowering,
                inputs: vec![(DType::BF16, vec![m, n], Fill::Random(3)), (DType::BF16, vec![n], Fill::Random(4))],
                work: 2.0 * (m * n * 2) as f64,
                unit: "GB/s",
                iters_cap: usize::MAX,
                anchor: Box::new(|a| anchor(a, "rmsnorm", &["torch.compile"])),
            });
        }
    }
    if want("softmax") {
        let (m, n) = (32768usize, 4096usize);
        let g = crate::graph! { fn main(x: bf16[{m}, {n}]) -> bf16[{m}, {n}] { x.softmax(-1) } }?;
        out.push(BenchCase {
            group: "softmax",
            name: "softmax".into(),
            shape: format!("{m}x{n}"),
            graph: g,
            lowering: Lowering::Unfused,
            inputs: vec![(DType::BF16, vec![m, n], Fill::Random(5))],
            work: 2.0 * (m * n * 2) as f64,
            unit: "GB/s",
            iters_cap: usize::MAX,
            anchor: Box::new(|a| anchor(a, "softmax", &["torch.softmax"])),
        });
    }
    memory_bound_groups(&want, &mut out)?;
    if want("matmul") {
        for (m, n, k) in [(8192usize, 8192usize, 8192usize), (4096, 4096, 4096), (16, 1536, 576)] {
            let g = crate::graph! { fn main(a: bf16[{m}, {k}], w: bf16[{n}, {k}]) -> bf16[{m}, {n}] { a.matmul(w, transpose_b = true) } }?;
            out.push(BenchCase {
                group: "matmul",
                name: "matmul (tensor cores; M <= 16: flat GEMM)".into(),
                shape: format!("{m}x{n}x{k}"),
                graph: g,
                lowering: Lowering::Unfused,
                inputs: vec![(DType::BF16, vec![m, k], Fill::Random(6)), (DType::BF16, vec![n, k], Fill::Random(7))],
                work: 2.0 * (m * n * k) as f64,
                unit: "TFLOP/s",
                iters_cap: 10,
                anchor: Box::new(|a| anchor(a, "ceiling", &["cuBLAS"])),
            });
        }
    }
    if want("fp8") {
        // The fp8 matmul: e4m3 operands A [M, K] and B [N, K] with per-tensor f32
        // scales, one fused kernel (sm_90a's wgmma e4m3 GEMM), bf16 out — anchors.py's
        // `torch._scaled_mm` row. Inputs uniform in [-1, 1) rounded to e4m3.
        let (m, n, k) = (8192usize, 8192usize, 8192usize);
        let g = crate::graph! {
            fn main(a8: f8e4m3[{m}, {k}], sa: f32[], b8: f8e4m3[{n}, {k}], sb: f32[]) -> bf16[{m}, {n}] {
                a8.dequantize_fp8(sa, bf16).matmul(b8.dequantize_fp8(sb, bf16), transpose_b = true)
            }
        }?;
        out.push(BenchCase {
            group: "fp8",
            name: "fp8 e4m3 matmul (wgmma)".into(),
            shape: format!("{m}x{n}x{k}"),
            graph: g,
            lowering: Lowering::Fused,
            inputs: vec![
                (DType::F8E4M3, vec![m, k], Fill::Random(50)),
                (DType::F32, vec![], Fill::Values(vec![0.5])),
                (DType::F8E4M3, vec![n, k], Fill::Random(51)),
                (DType::F32, vec![], Fill::Values(vec![0.25])),
            ],
            work: 2.0 * (m * n * k) as f64,
            unit: "TFLOP/s",
            iters_cap: 10,
            anchor: Box::new(|a| anchor(a, "fp8", &["cuBLAS fp8"])),
        });
    }
    if want("qmatmul") {
        qmatmul_cases(&mut out)?;
    }
    if want("attn") {
        // The anchor's shapes: B2 H32 S4096 D128 (the main target shape), B1 H32 S16384 D128,
        // B2 H32 S4096 D64. On sm_90a the kernel is the wgmma one (FlashAttention-3 tiles),
        // elsewhere FlashAttention-2 on mma.sync.
        for (b, h, s, d, causal) in [(2usize, 32usize, 4096usize, 128usize, false), (2, 32, 4096, 128, true), (1, 32, 16384, 128, false), (1, 32, 16384, 128, true), (2, 32, 4096, 64, false), (2, 32, 4096, 64, true)] {
            let g = crate::graph! {
                fn main(q: bf16[{b}, {h}, {s}, {d}], k: bf16[{b}, {h}, {s}, {d}], v: bf16[{b}, {h}, {s}, {d}]) -> bf16[{b}, {h}, {s}, {d}] {
                    q.attention(k, v, scale = 1.0 / (d as f64).sqrt(), causal = causal, heads = h, kv_heads = h)
                }
            }?;
            let shape = format!("B{b} H{h} S{s} D{d}{}", if causal { " causal" } else { "" });
            let key = shape.clone();
            out.push(BenchCase {
                group: "attn",
                name: "attention (sm_90a: wgmma FA3 tiles; else FA2 mma.sync)".into(),
                shape,
                graph: g,
                lowering: Lowering::Unfused,
                inputs: (8..11).map(|seed| (DType::BF16, vec![b, h, s, d], Fill::Random(seed))).collect(),
                work: 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 },
                unit: "TFLOP/s",
                iters_cap: 5,
                anchor: Box::new(move |a| exact_anchor(a, "attn", &key, "cudnn")),
            });
        }
        // The fp8 attention: q, k, v e4m3 with per-tensor f32 scales, one fused
        // kernel (sm_90a: wgmma e4m3, P in e4m3, V transposed in shared memory), bf16 out.
        // anchors.py has no fp8 attention: the ratio is to our bf16 attention row of the same
        // shape measured just before in this run (the goal: ≥ 1.5×).
        for causal in [false, true] {
            let (b, h, s, d) = (2usize, 32usize, 4096usize, 128usize);
            let g = crate::graph! {
                fn main(q8: f8e4m3[{b}, {h}, {s}, {d}], sq: f32[], k8: f8e4m3[{b}, {h}, {s}, {d}], sk: f32[], w8: f8e4m3[{b}, {h}, {s}, {d}], sv: f32[]) -> bf16[{b}, {h}, {s}, {d}] {
                    q8.dequantize_fp8(sq, bf16).attention(k8.dequantize_fp8(sk, bf16), w8.dequantize_fp8(sv, bf16), scale = 1.0 / (d as f64).sqrt(), causal = causal, heads = h, kv_heads = h)
                }
            }?;
            let shape = format!("B{b} H{h} S{s} D{d}{}", if causal { " causal" } else { "" });
            let key = shape.clone();
            out.push(BenchCase {
                group: "attn",
                name: "attn fp8 e4m3 (wgmma; ratio: our bf16)".into(),
                shape,
                graph: g,
                lowering: Lowering::Fused,
                inputs: vec![
                    (DType::F8E4M3, vec![b, h, s, d], Fill::Random(60)),
                    (DType::F32, vec![], Fill::Values(vec![0.5])),
                    (DType::F8E4M3, vec![b, h, s, d], Fill::Random(61)),
                    (DType::F32, vec![], Fill::Values(vec![0.25])),
                    (DType::F8E4M3, vec![b, h, s, d], Fill::Random(62)),
                    (DType::F32, vec![], Fill::Values(vec![0.5])),
                ],
                work: 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 },
                unit: "TFLOP/s",
                iters_cap: 5,
                anchor: Box::new(move |a| exact_anchor(a, OURS, &key, "attention (sm_90a")),
            });
        }
    }
    if want("decode") {
        // Paged decode attention over a full KV cache: B16, GQA 32/8, D128, L32768 (page 16),
        // with the online softmax and with FlashDecoding++'s unified maximum. The inputs are
        // uniform in [−1, 1), so every score s = scale·q·k obeys |s| ≤ scale·D = √128 ≈ 11.3:
        // φ is that bound (a model would take it from its score statistics). The scores'
        // largest value is about 1.5 (they are about N(0, ⅓²)), inside every worker's window
        // [φ − 30, φ + 20], so every worker takes the fast path.
        let (b, hq, hkv, l, d, ps) = (16usize, 32usize, 8usize, 32768usize, 128usize, 16usize);
        let pages_per = l / ps;
        let scale = 1.0 / (d as f64).sqrt();
        let phi = scale * d as f64;
        let plain = crate::graph! {
            fn main(q: bf16[{b}, {hq}, 1, {d}], kp: bf16[{b * pages_per}, {ps}, {hkv}, {d}], vp: bf16[{b * pages_per}, {ps}, {hkv}, {d}], bt: i32[{b}, {pages_per}], lens: i32[{b}]) -> bf16[{b}, {hq}, 1, {d}] {
                q.paged_attention(kp, vp, bt, lens, scale = scale, causal = true, heads = hq, kv_heads = hkv)
            }
        }?;
        let unified = crate::graph! {
            fn main(q: bf16[{b}, {hq}, 1, {d}], kp: bf16[{b * pages_per}, {ps}, {hkv}, {d}], vp: bf16[{b * pages_per}, {ps}, {hkv}, {d}], bt: i32[{b}, {pages_per}], lens: i32[{b}]) -> bf16[{b}, {hq}, 1, {d}] {
                q.paged_attention(kp, vp, bt, lens, scale = scale, causal = true, heads = hq, kv_heads = hkv, unified_max = phi)
            }
        }?;
        let shape = format!("B{b} Hq{hq} Hkv{hkv} L{l} D{d}");
        for (name, g) in [("paged decode attention".to_string(), plain), (format!("paged decode attention, unified max {phi:.2}"), unified)] {
            let key = shape.clone();
            out.push(BenchCase {
                group: "decode",
                name,
                shape: shape.clone(),
                graph: g,
                lowering: Lowering::Unfused,
                inputs: vec![
                    (DType::BF16, vec![b, hq, 1, d], Fill::Random(11)),
                    (DType::BF16, vec![b * pages_per, ps, hkv, d], Fill::Random(12)),
                    (DType::BF16, vec![b * pages_per, ps, hkv, d], Fill::Random(13)),
                    (DType::I32, vec![b, pages_per], Fill::Values((0..b * pages_per).map(|i| i as f64).collect())),
                    (DType::I32, vec![b], Fill::Values(vec![l as f64; b])),
                ],
                work: 2.0 * (b * hkv * l * d * 2) as f64,
                unit: "GB/s",
                iters_cap: usize::MAX,
                anchor: Box::new(move |a| exact_anchor(a, "decode", &key, "")),
            });
        }
    }
    if want("cascade") {
        cascade_group(&mut out)?;
    }
    Ok(out)
}

/// The `cascade` group: cascade decode ([`crate::zoo::cascade`]) at the shape of [`crate::zoo::cascade::CascadeConfig::bench`] (Hq 32 /
/// Hkv 8 / D 128, batch 64, a 32768-token shared prefix, a 256-token suffix per request,
/// bf16), and the plain paged decode over the same keys, with each request's prefix a private
/// copy in the cache (8.7 GB of K/V, as a cache without prefix sharing holds it) and with the
/// prefix pages shared by every block table. Every row counts the same traffic, the K/V bytes
/// a request attends to (`2 · B · (prefix + suffix) · Hkv · D · 2`), so the GB/s column is an
/// effective bandwidth and the ratio of two rows' GB/s is their speed-up; the rows compare
/// with `anchors_cascade.py`'s rows (cuDNN sdpa over the same `[B, Hkv, L, D]` keys).
fn cascade_group(out: &mut Vec<BenchCase>) -> Result<(), Error> {
    use crate::zoo::cascade::{cascade_decode, plain_decode, plain_tables, CascadeConfig};
    let c = CascadeConfig::bench();
    let suffix = 256usize;
    let (b, hq, hkv, d, ps) = (c.batch, c.heads, c.kv_heads, c.head_dim, c.page_size);
    let l = c.prefix_len + suffix;
    let shape = format!("B{b} Hq{hq} Hkv{hkv} L{l} D{d}");
    let kv_bytes = 2.0 * (b * l * hkv * d * 2) as f64;
    // Request r's suffix is pages 16r .. 16r + 16 of the suffix pool, all full.
    let table: Vec<i32> = (0..b * c.max_pages).map(|i| i as i32).collect();
    let lens = vec![suffix as i32; b];
    let q = (DType::BF16, vec![b, hq, 1, d], Fill::Random(11));
    let key = shape.clone();
    out.push(BenchCase {
        group: "cascade",
        name: format!("cascade decode (prefix {}+suffix {suffix})", c.prefix_len),
        shape: shape.clone(),
        graph: cascade_decode(&c)?,
        lowering: Lowering::Fused,
        inputs: vec![
            q.clone(),
            (DType::BF16, vec![c.prefix_len, hkv, d], Fill::Random(21)),
            (DType::BF16, vec![c.prefix_len, hkv, d], Fill::Random(22)),
            (DType::BF16, vec![c.pages, ps, hkv, d], Fill::Random(23)),
            (DType::BF16, vec![c.pages, ps, hkv, d], Fill::Random(24)),
            (DType::I32, vec![b, c.max_pages], Fill::Values(table.iter().map(|&v| f64::from(v)).collect())),
            (DType::I32, vec![b], Fill::Values(lens.iter().map(|&v| f64::from(v)).collect())),
        ],
        work: kv_bytes,
        unit: "GB/s",
        iters_cap: usize::MAX,
        anchor: Box::new(move |a| exact_anchor(a, "cascade", &key, "cudnn")),
    });
    for shared in [false, true] {
        let (pages, max_pages, bt, sl) = plain_tables(&c, &table, &lens, shared)?;
        let key = shape.clone();
        out.push(BenchCase {
            group: "cascade",
            name: format!("paged decode, {} prefix", if shared { "shared" } else { "private" }),
            shape: shape.clone(),
            graph: plain_decode(&c, pages, max_pages)?,
            lowering: Lowering::Unfused,
            inputs: vec![
                q.clone(),
                (DType::BF16, vec![pages, ps, hkv, d], Fill::Random(31)),
                (DType::BF16, vec![pages, ps, hkv, d], Fill::Random(32)),
                (DType::I32, vec![b, max_pages], Fill::Values(bt)),
                (DType::I32, vec![b], Fill::Values(sl)),
            ],
            work: kv_bytes,
            unit: "GB/s",
            iters_cap: usize::MAX,
            anchor: Box::new(move |a| exact_anchor(a, "cascade", &key, "cudnn")),
        });
    }
    Ok(())
}

/// The `qmatmul` group: weight-only quantized matmul `x · dequantize(W)ᵀ` on a Llama-3-8B
/// gate/up shape (K 4096, N 28672: 73.4 MB of `q4_1`, 124.8 MB of `q8_0` weights, 234.9 MB
/// in bf16) at M = 1 (decode GEMV) and M = 16 (a 16-row decode batch), fused (one kernel per
/// projection reading the blocks as stored). Each row runs four projections with distinct
/// weights (four layers' worth, one kernel each, one after another) so that a run moves more
/// than [`MIN_TRAFFIC_BYTES`] and the 50 MB L2 holds no weight between runs; GB/s counts the
/// stored weight bytes, the activations read once and the outputs written once, so it
/// compares with the copy bandwidth. The same shape with bf16 weights is the reference row.
fn qmatmul_cases(out: &mut Vec<BenchCase>) -> Result<(), Error> {
    const PROJECTIONS: usize = 4;
    let (k, n) = (4096usize, 28672usize);
    for m in [1usize, 16] {
        for wdt in [DType::Q4_1, DType::Q8_0, DType::BF16] {
            let mut g = Graph::new();
            let mut fb = sinter_ir::FunctionBuilder::new(&g, "main");
            let mut outs = Vec::new();
            for p in 0..PROJECTIONS {
                // Each projection its own activations: parallel matmuls of one x by bf16
                // weights would be merged into one matmul on concatenated weights.
                let x = fb.param(&format!("x{p}"), sinter_ir::TensorType::new(DType::BF16, [sinter_ir::Dim::constant(m as i64), sinter_ir::Dim::constant(k as i64)]));
                let w = fb.param(&format!("w{p}"), sinter_ir::TensorType::new(wdt, [sinter_ir::Dim::constant(n as i64), sinter_ir::Dim::constant(k as i64)]));
                let wd = if wdt.is_quantized() { fb.op1(sinter_ir::OpKind::Dequantize, &[w], vec![("dtype", sinter_ir::Attr::DType(DType::BF16))])? } else { w };
                outs.push(fb.op1(sinter_ir::OpKind::Matmul, &[x, wd], vec![("transpose_b", sinter_ir::Attr::Bool(true))])?);
            }
            g.add_func(fb.finish(&outs)?);
            let wbytes = wdt.storage_bytes(n * k).unwrap_or(0);
            let inputs: Vec<Input> = (0..PROJECTIONS as u64).flat_map(|p| [(DType::BF16, vec![m, k], Fill::Random(40 + 2 * p)), (wdt, vec![n, k], Fill::Random(41 + 2 * p))]).collect();
            out.push(BenchCase {
                group: "qmatmul",
                name: format!("x·dequantize({wdt} W)ᵀ ×{PROJECTIONS} [Fused]"),
                shape: format!("M{m} K{k} N{n} ({:.1} MB/W)", wbytes as f64 / 1e6),
                graph: g,
                lowering: Lowering::Fused,
                inputs,
                work: (PROJECTIONS * (wbytes + m * k * 2 + m * n * 2)) as f64,
                unit: "GB/s",
                iters_cap: usize::MAX,
                anchor: Box::new(copy_anchor),
            });
        }
    }
    Ok(())
}

/// A memory-bound row of one unfused graph (each of these graphs is one kernel), compared with
/// the copy bandwidth of the same call.
fn copy_case(group: &'static str, name: impl Into<String>, shape: impl Into<String>, graph: Graph, inputs: Vec<Input>, bytes: usize) -> BenchCase {
    BenchCase {
        group,
        name: name.into(),
        shape: shape.into(),
        graph,
        lowering: Lowering::Unfused,
        inputs,
        work: bytes as f64,
        unit: "GB/s",
        iters_cap: usize::MAX,
        anchor: Box::new(copy_anchor),
    }
}

/// `n` pseudo-random integers in `0..hi` (a fixed LCG: the same values in every call).
fn random_ints(n: usize, hi: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % hi as u64) as f64
        })
        .collect()
}

/// The groups of the "fast" families, all memory-bound, each row moving at least
/// [`MIN_TRAFFIC_BYTES`] (bf16 unless the name says otherwise): a broadcast add, RoPE in both
/// forms, the embedding gather, casts, `kv_append`, LayerNorm, log-softmax, the row
/// reductions, and a row-length sweep of RMSNorm and softmax.
fn memory_bound_groups(want: &dyn Fn(&str) -> bool, out: &mut Vec<BenchCase>) -> Result<(), Error> {
    let (m, n) = (32768usize, 4096usize);
    let x_in = |seed| (DType::BF16, vec![m, n], Fill::Random(seed));
    if want("bias") {
        let g = crate::graph! { fn main(x: bf16[{m}, {n}], b: bf16[{n}]) -> bf16[{m}, {n}] { x + b } }?;
        let ins = vec![x_in(20), (DType::BF16, vec![n], Fill::Random(21))];
        out.push(copy_case("bias", "x + bias[N] (broadcast)", format!("{m}x{n}"), g, ins, 2 * m * n * 2 + n * 2));
    }
    if want("rope") {
        let (t, h, d) = (32768usize, 32usize, 128usize);
        for form in ["rotate_half", "interleaved"] {
            let g = crate::graph! {
                fn main(q: bf16[{t}, {h}, {d}], pos: i32[{t}, 1]) -> bf16[{t}, {h}, {d}] { q.rope(pos, theta = 500000.0, form = form) }
            }?;
            let ins = vec![(DType::BF16, vec![t, h, d], Fill::Random(22)), (DType::I32, vec![t, 1], Fill::Values((0..t).map(|i| i as f64).collect()))];
            out.push(copy_case("rope", format!("rope {form}"), format!("T{t} H{h} D{d}"), g, ins, 2 * t * h * d * 2 + t * 4));
        }
    }
    if want("gather") {
        // Llama-3-sized rows (4096) from a 32000-row table, 32768 random tokens.
        let (v, t) = (32000usize, 32768usize);
        let g = crate::graph! { fn main(table: bf16[{v}, {n}], ids: i64[{t}]) -> bf16[{t}, {n}] { table.gather(ids) } }?;
        let ins = vec![(DType::BF16, vec![v, n], Fill::Random(23)), (DType::I64, vec![t], Fill::Values(random_ints(t, v, 24)))];
        out.push(copy_case("gather", "embedding gather (i64 ids)", format!("V{v} D{n} T{t}"), g, ins, 2 * t * n * 2 + t * 8));
    }
    if want("cast") {
        let g = crate::graph! { fn main(x: bf16[{m}, {n}]) -> f32[{m}, {n}] { x.cast(f32) } }?;
        out.push(copy_case("cast", "cast bf16 -> f32", format!("{m}x{n}"), g, vec![x_in(25)], m * n * (2 + 4)));
        let g = crate::graph! { fn main(x: f32[{m}, {n}]) -> bf16[{m}, {n}] { x.cast(bf16) } }?;
        out.push(copy_case("cast", "cast f32 -> bf16", format!("{m}x{n}"), g, vec![(DType::F32, vec![m, n], Fill::Random(26))], m * n * (4 + 2)));
    }
    if want("kv_append") {
        // A prefill of 16 sequences × 4096 tokens into a paged cache (GQA 8 KV heads, D128,
        // page 16): the new keys and values are read once and written once into their pages.
        let (b, t, hkv, d, ps) = (16usize, 4096usize, 8usize, 128usize, 16usize);
        let per = t / ps;
        let pages = b * per;
        let g = crate::graph! {
            fn main(kp: bf16[{pages}, {ps}, {hkv}, {d}], vp: bf16[{pages}, {ps}, {hkv}, {d}], kn: bf16[{b}, {t}, {hkv}, {d}], vn: bf16[{b}, {t}, {hkv}, {d}], bt: i32[{b}, {per}], start: i32[{b}])
                -> (bf16[{pages}, {ps}, {hkv}, {d}], bf16[{pages}, {ps}, {hkv}, {d}])
            {
                let [k2, v2] = kp.kv_append(vp, kn, vn, bt, start);
                (k2, v2)
            }
        }?;
        let ins = vec![
            (DType::BF16, vec![pages, ps, hkv, d], Fill::Random(27)),
            (DType::BF16, vec![pages, ps, hkv, d], Fill::Random(28)),
            (DType::BF16, vec![b, t, hkv, d], Fill::Random(29)),
            (DType::BF16, vec![b, t, hkv, d], Fill::Random(30)),
            (DType::I32, vec![b, per], Fill::Values((0..pages).map(|i| i as f64).collect())),
            (DType::I32, vec![b], Fill::Values(vec![0.0; b])),
        ];
        let bytes = 2 * 2 * (b * t * hkv * d * 2) + pages * 4 + b * 4;
        out.push(copy_case("kv_append", "kv_append (in place)", format!("B{b} T{t} Hkv{hkv} D{d} page {ps}"), g, ins, bytes));
    }
    if want("layernorm") {
        let g = crate::graph! { fn main(x: bf16[{m}, {n}], w: bf16[{n}], b: bf16[{n}]) -> bf16[{m}, {n}] { x.layer_norm(w, b, eps = 1e-5) } }?;
        let ins = vec![x_in(31), (DType::BF16, vec![n], Fill::Random(32)), (DType::BF16, vec![n], Fill::Random(33))];
        out.push(copy_case("layernorm", "layer_norm", format!("{m}x{n}"), g, ins, 2 * m * n * 2 + 2 * n * 2));
    }
    if want("log_softmax") {
        let g = crate::graph! { fn main(x: bf16[{m}, {n}]) -> bf16[{m}, {n}] { x.log_softmax(-1) } }?;
        out.push(copy_case("log_softmax", "log_softmax", format!("{m}x{n}"), g, vec![x_in(34)], 2 * m * n * 2));
    }
    if want("reduce") {
        // Read-only: twice the rows of the others, for the same floor of traffic.
        let rm = 2 * m;
        let sum = crate::graph! { fn main(x: bf16[{rm}, {n}]) -> bf16[{rm}, 1] { x.sum(-1) } }?;
        let max = crate::graph! { fn main(x: bf16[{rm}, {n}]) -> bf16[{rm}, 1] { x.max(-1) } }?;
        let mean = crate::graph! { fn main(x: bf16[{rm}, {n}]) -> bf16[{rm}, 1] { x.mean(-1) } }?;
        for (name, g) in [("reduce_sum (last axis)", sum), ("reduce_max (last axis)", max), ("reduce_mean (last axis)", mean)] {
            out.push(copy_case("reduce", name, format!("{rm}x{n}"), g, vec![(DType::BF16, vec![rm, n], Fill::Random(35))], rm * n * 2 + rm * 2));
        }
    }
    if want("rows") {
        // Row-length sweep at 2^27 elements (512 MiB of traffic): from short rows (a warp or
        // a CTA per row) to 262144-element rows (an 8-CTA cluster on sm_90a, the multi-pass
        // schedule on sm_80).
        for cols in [1024usize, 4096, 32768, 262144] {
            let rows = (1usize << 27) / cols;
            let g = crate::graph! { fn main(x: bf16[{rows}, {cols}], w: bf16[{cols}]) -> bf16[{rows}, {cols}] { x.rms_norm(w, eps = 1e-6) } }?;
            let ins = vec![(DType::BF16, vec![rows, cols], Fill::Random(36)), (DType::BF16, vec![cols], Fill::Random(37))];
            out.push(copy_case("rows", "rms_norm op", format!("{rows}x{cols}"), g, ins, 2 * rows * cols * 2 + cols * 2));
            let g = crate::graph! { fn main(x: bf16[{rows}, {cols}]) -> bf16[{rows}, {cols}] { x.softmax(-1) } }?;
            out.push(copy_case("rows", "softmax", format!("{rows}x{cols}"), g, vec![(DType::BF16, vec![rows, cols], Fill::Random(36))], 2 * rows * cols * 2));
            if cols >= 32768 {
                // The other statistics of the cluster schedule: log_softmax (no weight: 256
                // threads × 4) and layer_norm (weight and bias: 512 × 2).
                let g = crate::graph! { fn main(x: bf16[{rows}, {cols}]) -> bf16[{rows}, {cols}] { x.log_softmax(-1) } }?;
                out.push(copy_case("rows", "log_softmax", format!("{rows}x{cols}"), g, vec![(DType::BF16, vec![rows, cols], Fill::Random(36))], 2 * rows * cols * 2));
                let g = crate::graph! { fn main(x: bf16[{rows}, {cols}], w: bf16[{cols}], b: bf16[{cols}]) -> bf16[{rows}, {cols}] { x.layer_norm(w, b, eps = 1e-5) } }?;
                let ins = vec![(DType::BF16, vec![rows, cols], Fill::Random(36)), (DType::BF16, vec![cols], Fill::Random(37)), (DType::BF16, vec![cols], Fill::Random(38))];
                out.push(copy_case("rows", "layer_norm", format!("{rows}x{cols}"), g, ins, 2 * rows * cols * 2 + 2 * cols * 2));
            }
        }
    }
    Ok(())
}

/// The best anchor row of `group` with exactly this shape whose name contains `name`.
fn exact_anchor(anchors: &[Json], group: &str, shape: &str, name: &str) -> Option<(String, f64)> {
    anchors
        .iter()
        .filter(|r| r["group"] == group && r["shape"].as_str() == Some(shape) && r["name"].as_str().is_some_and(|n| n.contains(name)))
        .filter_map(|r| Some((format!("{} {shape}", r["name"].as_str()?), r["value"].as_f64()?)))
        .max_by(|x, y| x.1.total_cmp(&y.1))
}

/// Checks the names given to `--only` against [`GROUPS`].
///
/// # Errors
/// [`Error::Unsupported`] naming the unknown group and the known ones.
fn check_groups(only: &[String]) -> Result<(), Error> {
    match only.iter().find(|o| !GROUPS.contains(&o.as_str())) {
        Some(bad) => Err(Error::Unsupported(format!("no benchmark group {bad:?}; the groups are {}", GROUPS.join(" ")))),
        None => Ok(()),
    }
}

/// Whether case `c` times an fp8 kernel only sm_90a has (the `fp8` matmul group and the
/// `attn fp8` rows): on other targets it is skipped, not an error.
fn needs_sm90a(c: &BenchCase) -> bool {
    c.group == "fp8" || c.name.starts_with("attn fp8")
}

/// Compiles every kernel the benchmark groups in `only` (all when empty) need for `target`
/// (but the fp8 rows on targets other than sm_90a, see [`needs_sm90a`])
/// into the kernel cache, with no GPU: a build without LLVM then runs them from the cache.
/// With `autotune`, also every schedule candidate of each tunable kernel
/// ([`crate::tune::precompile_variants`]), so that the build without LLVM can time them.
///
/// # Errors
/// An unknown group; lowering or code generation errors; `autotune` in a build without LLVM.
pub fn precompile(only: &[String], target: &Target, autotune: bool) -> Result<crate::gpu::CompileStats, Error> {
    check_groups(only)?;
    if autotune && !cfg!(feature = "llvm") {
        return Err(Error::Unsupported("--autotune with --precompile compiles every schedule candidate: this build has no code generator (the `llvm` feature)".into()));
    }
    let cache = sinter_runtime::KernelCache::open_default()?;
    let mut stats = crate::gpu::CompileStats::default();
    let mut kernels = 0;
    for c in cases(only)?.into_iter().filter(|c| target.has_fp8_matmul() || !needs_sm90a(c)) {
        let kg = crate::gpu::lower(&c.graph, c.lowering, target)?;
        crate::gpu::plans(&kg, target, &cache, &mut stats)?;
        #[cfg(feature = "llvm")]
        if autotune {
            stats.built += crate::tune::precompile_variants(&kg, target, &cache)?;
        }
        kernels += stats.kernels;
    }
    stats.kernels = kernels;
    Ok(stats)
}

/// The device buffers of one case's inputs; an input equal (dtype, shape, fill) to one of the
/// previous case's is that buffer again, so a group's rows share their uploads.
fn upload_inputs(dev: &Device, specs: &[Input], previous: &[(Input, DeviceBuffer)]) -> Result<Vec<DeviceBuffer>, Error> {
    specs
        .iter()
        .map(|spec| {
            if let Some((_, b)) = previous.iter().find(|(s, _)| s == spec) {
                return Ok(b.clone());
            }
            let (dt, shape, fill) = spec;
            match fill {
                Fill::Random(seed) => random_buffer(dev, *dt, shape, *seed),
                Fill::Values(v) => Ok(dev.upload_f64(*dt, shape, v)?),
            }
        })
        .collect()
}

/// Runs the benchmark groups in `only` (all when empty) and returns the rows; with
/// `autotune`, each case's tunable kernels are timed first ([`crate::tune`]) and the winners
/// printed to stderr; with `flush`, each timed run is preceded by a fill of a
/// [`crate::timing::FLUSH_BYTES`] scratch buffer (see the module docs).
///
/// # Errors
/// An unknown group; device, compile or run errors (out of device memory for the scratch
/// buffer among them).
pub fn run(only: &[String], anchors: &[Json], iters: usize, autotune: bool, flush: bool) -> Result<Vec<Row>, Error> {
    check_groups(only)?;
    let dev = Device::open()?;
    let scratch = if flush { Some(crate::timing::flush_buffer(&dev)?) } else { None };
    println!("timing: {}", if flush { "each run after a 256 MiB fill (the L2 cleared, as triton's do_bench does for the anchors)" } else { "each run on an idle GPU (--no-flush)" });
    let copy = copy_anchor(anchors).map(|c| c.1);
    match copy {
        Some(c) => println!("copy bandwidth measured by anchors.py in this call: {c:.0} GB/s"),
        None => println!("no copy bandwidth in the anchors: the % of copy column stays empty"),
    }
    let mut rows = Vec::new();
    let mut previous: Vec<(Input, DeviceBuffer)> = Vec::new();
    // The anchors and, as they are measured, our own rows (group [`OURS`]): a case may take an
    // earlier row of this run as its anchor (the fp8 attention, our bf16 attention).
    let mut anchors: Vec<Json> = anchors.to_vec();
    // `SINTER_BENCH_CASE=text`: only the cases whose "name shape" contains `text` (to profile
    // one kernel, e.g. under Nsight Compute).
    let pick = std::env::var("SINTER_BENCH_CASE").ok();
    let target = crate::gpu::target_for(&dev);
    for c in cases(only)?.into_iter().filter(|c| pick.as_ref().is_none_or(|p| format!("{} {}", c.name, c.shape).contains(p.as_str()))) {
        if needs_sm90a(&c) && !target.has_fp8_matmul() {
            println!("{:<11} {:<34} {:<27} skipped: its fp8 kernel needs sm_90a (wgmma), not {target}", c.group, c.name, c.shape);
            continue;
        }
        // The previous case's buffers that this one does not share are freed before the
        // uploads; the shared ones are used again.
        previous.retain(|(spec, _)| c.inputs.contains(spec));
        let ins = upload_inputs(&dev, &c.inputs, &previous)?;
        previous.clear();
        let (ms, kernels) = time(&dev, &c.graph, c.lowering, &ins, iters.min(c.iters_cap), autotune, scratch.as_ref())?;
        let value = if c.unit == "GB/s" { c.work / ms / 1e6 } else { c.work / ms / 1e9 };
        let a = (c.anchor)(&anchors);
        let row = Row {
            group: c.group.into(),
            name: c.name,
            shape: c.shape,
            ms,
            value,
            unit: c.unit.into(),
            kernels,
            ratio: a.as_ref().map(|a| value / a.1),
            anchor: a.map(|a| format!("{} = {:.1}", a.0, a.1)),
            of_copy: copy.filter(|_| c.unit == "GB/s").map(|cp| value / cp),
            flushed: flush,
        };
        println!(
            "{:11} {:34} {:24} {:9.4} ms {:9.1} {:7} {:2} kernel(s) {:>14}  {}",
            row.group,
            row.name,
            row.shape,
            row.ms,
            row.value,
            row.unit,
            row.kernels,
            row.of_copy.map(|f| format!("{:.1}% of copy", 100.0 * f)).unwrap_or_default(),
            match (&row.anchor, row.ratio) {
                (Some(a), Some(r)) => format!("{r:.2}x of {a}"),
                _ => String::new(),
            }
        );
        previous = c.inputs.into_iter().zip(ins).collect();
        anchors.push(serde_json::json!({"group": OURS, "name": format!("sinter {}", row.name), "shape": row.shape, "value": row.value}));
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every group is listed in [`GROUPS`], in order; every memory-bound row moves at least
    /// [`MIN_TRAFFIC_BYTES`]; every group builds its graphs (no GPU needed).
    #[test]
    fn groups_and_traffic() {
        let all = cases(&[]).unwrap();
        let mut seen: Vec<&str> = Vec::new();
        for c in &all {
            if seen.last() != Some(&c.group) {
                assert!(!seen.contains(&c.group), "group {} is not contiguous", c.group);
                seen.push(c.group);
            }
            if c.unit == "GB/s" {
                assert!(c.work >= MIN_TRAFFIC_BYTES, "{} {} {}: {} bytes", c.group, c.name, c.shape, c.work);
            }
        }
        assert_eq!(seen, GROUPS);
        assert!(check_groups(&["rope".into()]).is_ok());
        assert!(check_groups(&["ropes".into()]).unwrap_err().to_string().contains("rope"));
    }

    /// The `decode` group times one shape twice against one anchor: with the online softmax,
    /// then with `unified_max` at the bound scale·D = √D of its scores (inputs in [−1, 1)).
    #[test]
    fn decode_rows_online_and_unified_max() {
        let rows = cases(&["decode".into()]).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].shape, rows[1].shape);
        let phi = |c: &BenchCase| c.graph.entry().and_then(|f| f.nodes.values().find_map(|n| n.op.float("unified_max")));
        assert_eq!(phi(&rows[0]), None);
        assert!(phi(&rows[1]).is_some_and(|p| (p - 128f64.sqrt()).abs() < 1e-9), "{:?}", phi(&rows[1]));
        assert!(rows[1].name.contains("unified max 11.31"), "{}", rows[1].name);
        let anchors: Vec<Json> = serde_json::from_str(r#"[{"group": "decode", "name": "sdpa cudnn_attention", "shape": "B16 Hq32 Hkv8 L32768 D128", "value": 3000.0}]"#).unwrap();
        for r in &rows {
            assert_eq!((r.anchor)(&anchors), Some(("sdpa cudnn_attention B16 Hq32 Hkv8 L32768 D128".to_string(), 3000.0)));
        }
    }

    /// The copy anchor is read from the rows `anchors.py` writes.
    #[test]
    fn copy_anchor_is_found() {
        let rows: Vec<Json> = serde_json::from_str(r#"[{"group": "ceiling", "name": "d2d copy", "shape": "2 GiB", "ms": 1.0, "metric": "GB/s", "value": 4274.5, "unit": "GB/s"}, {"group": "ceiling", "name": "cuBLAS gemm", "shape": "8192^3", "value": 686.0}]"#).unwrap();
        assert_eq!(copy_anchor(&rows), Some(("d2d copy 2 GiB".to_string(), 4274.5)));
        assert_eq!(copy_anchor(&[]), None);
    }
}
