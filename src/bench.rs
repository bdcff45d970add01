//! `sinter bench`: each kernel family on the GPU at the shapes of `bench/anchors.py`, timed with
//! CUDA events (median of the kernels' summed times over the iterations), printed beside the
//! anchor figures measured in the same device call.
//!
//! Traffic is counted as `anchors.py` counts it (bytes the op must read and write once), so
//! the GB/s figures compare one to one.

use serde_json::Value as Json;
use sinter_runtime::{Device, DeviceBuffer};

use crate::gpu::{GpuProgram, Lowering};
use crate::{Bindings, DType, Error, Graph};

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
    let data: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    Ok(dev.upload_f64(dtype, shape, &data)?)
}

/// Times `g`'s entry on `inputs` (device buffers in parameter order): median of `iters` runs
/// of the summed kernel times.
fn time(dev: &Device, g: &Graph, lowering: Lowering, inputs: &[DeviceBuffer], iters: usize) -> Result<(f64, usize), Error> {
    let p = GpuProgram::compile(g, dev, lowering)?;
    let refs: Vec<&DeviceBuffer> = inputs.iter().collect();
    let b = Bindings::new();
    let _ = p.executor().run_profiled(&refs, &b)?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let (_, prof) = p.executor().run_profiled(&refs, &b)?;
        times.push(prof.total_micros);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2] / 1000.0, p.kernel_graph().kernels.len()))
}

/// What one benchmark input holds.
#[derive(Clone, Debug)]
enum Fill {
    /// Uniform random values in [-1, 1) with this seed.
    Random(u64),
    /// Explicit values.
    Values(Vec<f64>),
}

/// One benchmark row to measure.
struct BenchCase {
    group: &'static str,
    name: String,
    shape: String,
    graph: Graph,
    lowering: Lowering,
    inputs: Vec<(DType, Vec<usize>, Fill)>,
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
    if want("matmul") {
        for (m, n, k) in [(4096usize, 4096usize, 4096usize), (16, 1536, 576)] {
            let g = crate::graph! { fn main(a: bf16[{m}, {k}], w: bf16[{n}, {k}]) -> bf16[{m}, {n}] { a.matmul(w, transpose_b = true) } }?;
            out.push(BenchCase {
                group: "matmul",
                name: "matmul (CUDA cores, tiled)".into(),
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
    if want("attn") {
        let (b, h, s, d) = (2usize, 32usize, 4096usize, 128usize);
        for causal in [false, true] {
            let g = crate::graph! {
                fn main(q: bf16[{b}, {h}, {s}, {d}], k: bf16[{b}, {h}, {s}, {d}], v: bf16[{b}, {h}, {s}, {d}]) -> bf16[{b}, {h}, {s}, {d}] {
                    q.attention(k, v, scale = 1.0 / (d as f64).sqrt(), causal = causal, heads = h, kv_heads = h)
                }
            }?;
            let shape = format!("B{b} H{h} S{s} D{d}{}", if causal { " causal" } else { "" });
            let key = shape.clone();
            out.push(BenchCase {
                group: "attn",
                name: "attention (online softmax)".into(),
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
    }
    if want("decode") {
        // Paged decode attention over a full KV cache: B16, GQA 32/8, D128, L32768 (page 16).
        let (b, hq, hkv, l, d, ps) = (16usize, 32usize, 8usize, 32768usize, 128usize, 16usize);
        let pages_per = l / ps;
        let g = crate::graph! {
            fn main(q: bf16[{b}, {hq}, 1, {d}], kp: bf16[{b * pages_per}, {ps}, {hkv}, {d}], vp: bf16[{b * pages_per}, {ps}, {hkv}, {d}], bt: i32[{b}, {pages_per}], lens: i32[{b}]) -> bf16[{b}, {hq}, 1, {d}] {
                q.paged_attention(kp, vp, bt, lens, scale = 1.0 / (d as f64).sqrt(), causal = true, heads = hq, kv_heads = hkv)
            }
        }?;
        let shape = format!("B{b} Hq{hq} Hkv{hkv} L{l} D{d}");
        let key = shape.clone();
        out.push(BenchCase {
            group: "decode",
            name: "paged decode attention".into(),
            shape,
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
    Ok(out)
}

/// The best anchor row of `group` with exactly this shape whose name contains `name`.
fn exact_anchor(anchors: &[Json], group: &str, shape: &str, name: &str) -> Option<(String, f64)> {
    anchors
        .iter()
        .filter(|r| r["group"] == group && r["shape"].as_str() == Some(shape) && r["name"].as_str().is_some_and(|n| n.contains(name)))
        .filter_map(|r| Some((format!("{} {shape}", r["name"].as_str()?), r["value"].as_f64()?)))
        .max_by(|x, y| x.1.total_cmp(&y.1))
}

/// Compiles every kernel the benchmark groups in `only` need for `target` into the kernel
/// cache, with no GPU: a build without LLVM then runs them from the cache.
///
/// # Errors
/// Lowering or code generation errors.
pub fn precompile(only: &[String], target: &str) -> Result<crate::gpu::CompileStats, Error> {
    let cache = sinter_runtime::KernelCache::open_default()?;
    let mut stats = crate::gpu::CompileStats::default();
    let mut kernels = 0;
    for c in cases(only)? {
        let kg = crate::gpu::lower(&c.graph, c.lowering)?;
        crate::gpu::plans(&kg, target, &cache, &mut stats)?;
        kernels += stats.kernels;
    }
    stats.kernels = kernels;
    Ok(stats)
}

/// Runs the benchmark groups in `only` (all when empty) and returns the rows.
///
/// # Errors
/// Device, compile or run errors.
pub fn run(only: &[String], anchors: &[Json], iters: usize) -> Result<Vec<Row>, Error> {
    let dev = Device::open()?;
    let mut rows = Vec::new();
    for c in cases(only)? {
        let ins = c
            .inputs
            .iter()
            .map(|(dt, shape, fill)| match fill {
                Fill::Random(seed) => random_buffer(&dev, *dt, shape, *seed),
                Fill::Values(v) => Ok(dev.upload_f64(*dt, shape, v)?),
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let (ms, kernels) = time(&dev, &c.graph, c.lowering, &ins, iters.min(c.iters_cap))?;
        let value = if c.unit == "GB/s" { c.work / ms / 1e6 } else { c.work / ms / 1e9 };
        let a = (c.anchor)(anchors);
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
        };
        println!(
            "{:8} {:34} {:22} {:9.4} ms {:9.1} {:7} {:2} kernel(s)  {}",
            row.group,
            row.name,
            row.shape,
            row.ms,
            row.value,
            row.unit,
            row.kernels,
            match (&row.anchor, row.ratio) {
                (Some(a), Some(r)) => format!("{r:.2}x of {a}"),
                _ => String::new(),
            }
        );
        drop(ins);
        rows.push(row);
    }
    let copy = anchors.iter().find(|r| r["group"] == "ceiling" && r["name"].as_str().is_some_and(|n| n.contains("copy"))).and_then(|r| r["value"].as_f64());
    if let Some(c) = copy {
        println!("copy bandwidth in this call: {c:.0} GB/s; memory-bound rows as a fraction of it:");
        for r in rows.iter().filter(|r| r.unit == "GB/s") {
            println!("  {:34} {:5.1}%", r.name, 100.0 * r.value / c);
        }
    }
    Ok(rows)
}
