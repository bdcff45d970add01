//! The fuzzer's input values: from a graph's parameters (names and types) and a seed.
//!
//! Float inputs take one of several modes per input: uniform in [−2, 2); the same with special
//! values sprinkled (NaN, ±inf, the dtype's finite extremes, denormals, ±0); log-uniform
//! magnitudes; whole rows of one special value. NaN, ±inf and the finite extremes among
//! attention's operands only with `Features::attention_specials`; the finite extremes (and
//! magnitudes beyond 1e8) elsewhere only with `Features::accumulate_extremes`. Parameters the generator names get values
//! that make the graph meaningful: `mask` rows of 0 and −inf (some fully masked),
//! `mask_finite` the same with the dtype's lowest finite value instead of −inf;
//! `block_table`, `start_pos`, `seq_lens` a valid paged cache (distinct pages per
//! sequence, the new rows inside the table, `seq_lens = start_pos + T`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sinter::ir::Graph;
use sinter::{DType, Tensor};

use super::cases::Features;

/// The lowest finite value of a float dtype, as Hugging Face masks use it.
pub fn lowest(dt: DType) -> f64 {
    match dt {
        DType::BF16 => -3.3895313892515355e38,
        DType::F16 => -65504.0,
        _ => f64::from(f32::MIN),
    }
}

/// The smallest positive denormal-ish value of a float dtype (a subnormal of it).
fn denormal(dt: DType) -> f64 {
    match dt {
        DType::F16 => 3.0e-7,
        _ => 1.0e-40,
    }
}

/// A special value: denormals, signed zeros and 1 always; NaN and ±inf with `nonfinite`; the
/// dtype's finite extremes with `extremes`.
fn special(rng: &mut StdRng, dt: DType, kinds: Specials) -> f64 {
    let l = lowest(dt);
    let mut all = vec![denormal(dt), -denormal(dt), -0.0, 0.0, 1.0];
    if kinds.nonfinite {
        all.extend([f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
    }
    if kinds.extremes {
        all.extend([l, -l]);
    }
    all[rng.random_range(0..all.len())]
}

/// Which special values an input may hold.
#[derive(Clone, Copy)]
struct Specials {
    nonfinite: bool,
    extremes: bool,
}

/// Values of one float input of `shape`: a mode chosen by `rng`.
fn floats(rng: &mut StdRng, dt: DType, shape: &[usize], kinds: Specials) -> Vec<f64> {
    let n: usize = shape.iter().product();
    let row = shape.last().copied().unwrap_or(1).max(1);
    let mode = rng.random_range(0..6);
    let uni = |rng: &mut StdRng| rng.random_range(-2.0..2.0);
    match mode {
        // Specials sprinkled.
        3 => (0..n).map(|_| if rng.random_bool(0.15) { special(rng, dt, kinds) } else { uni(rng) }).collect(),
        // Log-uniform magnitudes, both signs.
        4 => (0..n)
            .map(|_| {
                let e = rng.random_range(-30.0..if kinds.extremes { 30.0 } else { 8.0 });
                let s = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
                s * 10f64.powf(if dt == DType::F16 { e / 7.0 } else { e })
            })
            .collect(),
        // Whole rows of one special value.
        5 => {
            let mut v: Vec<f64> = (0..n).map(|_| uni(rng)).collect();
            for r in v.chunks_mut(row) {
                if rng.random_bool(0.3) {
                    let s = special(rng, dt, kinds);
                    r.fill(s);
                }
            }
            v
        }
        _ => (0..n).map(|_| uni(rng)).collect(),
    }
}

/// An additive mask: rows of 0 with some entries `fill`, some rows entirely `fill`.
fn mask(rng: &mut StdRng, shape: &[usize], fill: f64) -> Vec<f64> {
    let n: usize = shape.iter().product();
    let row = shape.last().copied().unwrap_or(1).max(1);
    let mut v = vec![0.0; n];
    for r in v.chunks_mut(row) {
        match rng.random_range(0..4) {
            0 => r.fill(fill),
            1 => r.iter_mut().for_each(|x| {
                if rng.random_bool(0.5) {
                    *x = fill;
                }
            }),
            2 => r.iter_mut().for_each(|x| *x = rng.random_range(-1.0..1.0)),
            _ => {}
        }
    }
    v
}

/// Attention operands: without `attention_specials`, no NaN, ±inf or finite extremes among them.
const ATTENTION_OPERANDS: [&str; 7] = ["q", "k", "v", "k_new", "v_new", "k_pages", "v_pages"];

/// The inputs of `graph`'s entry function for value seed `seed`, by parameter name.
pub fn inputs(graph: &Graph, seed: u64, feats: Features) -> Vec<(String, Tensor)> {
    let f = graph.entry().expect("an entry function");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15);
    let shape_of = |name: &str| -> Option<Vec<usize>> {
        let p = f.params.iter().find(|p| f.values[**p].name.as_deref() == Some(name))?;
        Some(f.values[*p].ty.shape.iter().map(|d| d.as_const().unwrap_or(0) as usize).collect())
    };
    // The paged cache's tables, drawn together.
    let (mut table, mut start, mut lens) = (None, None, None);
    if let (Some(bt), Some(kn), Some(kp)) = (shape_of("block_table"), shape_of("k_new"), shape_of("k_pages")) {
        let (b, cols, t, npages, page) = (bt[0], bt[1], kn[1], kp[0], kp[1]);
        let mut perm: Vec<usize> = (0..npages).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.random_range(0..=i));
        }
        table = Some(perm.iter().take(b * cols).map(|&p| p as f64).chain(std::iter::repeat(0.0)).take(b * cols).collect::<Vec<_>>());
        let cap = cols * page;
        let s: Vec<f64> = (0..b).map(|_| rng.random_range(0..=cap.saturating_sub(t)) as f64).collect();
        lens = Some(s.iter().map(|x| x + t as f64).collect::<Vec<_>>());
        start = Some(s);
    }
    f.params
        .iter()
        .map(|p| {
            let v = &f.values[*p];
            let name = v.name.clone().unwrap_or_default();
            let dt = v.ty.dtype;
            let shape: Vec<usize> = v.ty.shape.iter().map(|d| d.as_const().unwrap_or(0) as usize).collect();
            let n: usize = shape.iter().product();
            let data = match name.as_str() {
                "block_table" => table.clone().unwrap_or_else(|| vec![0.0; n]),
                "start_pos" => start.clone().unwrap_or_else(|| vec![0.0; n]),
                "seq_lens" => lens.clone().unwrap_or_else(|| vec![0.0; n]),
                "mask" => mask(&mut rng, &shape, f64::NEG_INFINITY),
                "mask_finite" => mask(&mut rng, &shape, lowest(dt)),
                _ if dt.is_float() => {
                    let kinds = if ATTENTION_OPERANDS.contains(&name.as_str()) {
                        Specials { nonfinite: feats.attention_specials, extremes: feats.attention_specials }
                    } else {
                        Specials { nonfinite: true, extremes: feats.accumulate_extremes }
                    };
                    floats(&mut rng, dt, &shape, kinds)
                }
                _ if dt == DType::Bool => (0..n).map(|_| f64::from(u8::from(rng.random_bool(0.5)))).collect(),
                _ => (0..n).map(|_| f64::from(rng.random_range(-3i32..4))).collect(),
            };
            (name, Tensor::new(dt, &shape, data).expect("an input tensor"))
        })
        .collect()
}
