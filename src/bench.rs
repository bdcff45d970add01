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

/// Runs the benchmark groups in `only` (all when empty) and returns the rows.
///
/// # Errors
/// Device, compile or run errors.
pub fn run(only: &[String], anchors: &[Json], iters: usize) -> Result<Vec<Row>, Error> {
    let dev = Device::open()?;
    let want = |g: &str| only.is_empty() || only.iter().any(|o| o == g);
    let mut rows = Vec::new();
    let mut push = |group: &str, name: &str, shape: String, ms: f64, value: f64, unit: &str, kernels: usize, anchor: Option<(String, f64)>| {
        let row = Row {
            group: group.into(),
            name: name.into(),
            shape,
            ms,
            value,
            unit: unit.into(),
            kernels,
            ratio: anchor.as_ref().map(|a| value / a.1),
            anchor: anchor.map(|a| format!("{} = {:.1}", a.0, a.1)),
        };
        println!(
            "{:8} {:34} {:18} {:9.4} ms {:9.1} {:7} {} kernel(s)  {}",
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
        rows.push(row);
    };
    if want("swiglu") {
        let (m, n) = (16384usize, 14336usize);
        let g = crate::graph! { fn main(a: bf16[{m}, {n}], b: bf16[{m}, {n}]) -> bf16[{m}, {n}] { a.silu() * b } }?;
        let ins = [random_buffer(&dev, DType::BF16, &[m, n], 1)?, random_buffer(&dev, DType::BF16, &[m, n], 2)?];
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let (ms, k) = time(&dev, &g, lowering, &ins, iters)?;
            let gbs = 3.0 * (m * n * 2) as f64 / ms / 1e6;
            push("swiglu", &format!("silu(a)*b [{lowering:?}]"), format!("{m}x{n}"), ms, gbs, "GB/s", k, anchor(anchors, "swiglu", &["compile silu"]));
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
        let ins = [random_buffer(&dev, DType::BF16, &[m, n], 3)?, random_buffer(&dev, DType::BF16, &[n], 4)?];
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let (ms, k) = time(&dev, &g, lowering, &ins, iters)?;
            let gbs = 2.0 * (m * n * 2) as f64 / ms / 1e6;
            push("rmsnorm", &format!("decomposed RMSNorm [{lowering:?}]"), format!("{m}x{n}"), ms, gbs, "GB/s", k, anchor(anchors, "rmsnorm", &["torch.compile"]));
        }
    }
    if want("softmax") {
        let (m, n) = (32768usize, 4096usize);
        let g = crate::graph! { fn main(x: bf16[{m}, {n}]) -> bf16[{m}, {n}] { x.softmax(-1) } }?;
        let ins = [random_buffer(&dev, DType::BF16, &[m, n], 5)?];
        let (ms, k) = time(&dev, &g, Lowering::Unfused, &ins, iters)?;
        let gbs = 2.0 * (m * n * 2) as f64 / ms / 1e6;
        push("softmax", "softmax", format!("{m}x{n}"), ms, gbs, "GB/s", k, anchor(anchors, "softmax", &["torch.softmax"]));
    }
    if want("matmul") {
        for (m, n, k) in [(4096usize, 4096usize, 4096usize), (16, 1536, 576)] {
            let g = crate::graph! { fn main(a: bf16[{m}, {k}], w: bf16[{n}, {k}]) -> bf16[{m}, {n}] { a.matmul(w, transpose_b = true) } }?;
            let ins = [random_buffer(&dev, DType::BF16, &[m, k], 6)?, random_buffer(&dev, DType::BF16, &[n, k], 7)?];
            let (ms, kk) = time(&dev, &g, Lowering::Unfused, &ins, iters)?;
            let tf = 2.0 * (m * n * k) as f64 / ms / 1e9;
            push("matmul", "matmul (CUDA cores, tiled)", format!("{m}x{n}x{k}"), ms, tf, "TFLOP/s", kk, anchor(anchors, "ceiling", &["cuBLAS"]));
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
            let ins = [random_buffer(&dev, DType::BF16, &[b, h, s, d], 8)?, random_buffer(&dev, DType::BF16, &[b, h, s, d], 9)?, random_buffer(&dev, DType::BF16, &[b, h, s, d], 10)?];
            let (ms, kk) = time(&dev, &g, Lowering::Unfused, &ins, iters.min(5))?;
            let fl = 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
            let shape = format!("B{b} H{h} S{s} D{d}{}", if causal { " causal" } else { "" });
            let a = anchors
                .iter()
                .filter(|r| r["group"] == "attn" && r["shape"].as_str() == Some(shape.as_str()) && r["name"].as_str().is_some_and(|n| n.contains("cudnn")))
                .filter_map(|r| Some((format!("{} {}", r["name"].as_str()?, shape), r["value"].as_f64()?)))
                .next();
            push("attn", "attention (online softmax)", shape, ms, fl / ms / 1e9, "TFLOP/s", kk, a);
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
        let bt: Vec<f64> = (0..b * pages_per).map(|i| i as f64).collect();
        let ins = [
            random_buffer(&dev, DType::BF16, &[b, hq, 1, d], 11)?,
            random_buffer(&dev, DType::BF16, &[b * pages_per, ps, hkv, d], 12)?,
            random_buffer(&dev, DType::BF16, &[b * pages_per, ps, hkv, d], 13)?,
            dev.upload_f64(DType::I32, &[b, pages_per], &bt)?,
            dev.upload_f64(DType::I32, &[b], &vec![l as f64; b])?,
        ];
        let (ms, kk) = time(&dev, &g, Lowering::Unfused, &ins, iters)?;
        let gbs = 2.0 * (b * hkv * l * d * 2) as f64 / ms / 1e6;
        let shape = format!("B{b} Hq{hq} Hkv{hkv} L{l} D{d}");
        let a = anchors
            .iter()
            .filter(|r| r["group"] == "decode" && r["shape"].as_str() == Some(shape.as_str()))
            .filter_map(|r| Some((format!("{} {}", r["name"].as_str()?, shape), r["value"].as_f64()?)))
            .max_by(|x, y| x.1.total_cmp(&y.1));
        push("decode", "paged decode attention", shape, ms, gbs, "GB/s", kk, a);
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
