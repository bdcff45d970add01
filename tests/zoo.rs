//! The model zoo: graphs verify, run on the interpreter, and decode agrees with prefill.

use sinter::zoo::{llama, Mode};
use sinter::{Backend, DType, Program, Tensor};

/// Deterministic pseudo-random numbers in [-1, 1) (SplitMix64), so tests need no RNG crate.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// Binds every weight (`token_embd`, `blk.*`, `output_norm`) of a zoo graph to seeded random
/// values: norms near 1, matrices scaled by 1/sqrt(fan-in).
pub fn bind_random_weights(p: &mut Program, seed: u64) {
    let mut rng = Rng::new(seed);
    let f = p.graph().func(p.entry()).unwrap().clone();
    for &v in &f.params {
        let name = f.values[v].name.clone().unwrap();
        if !(name.contains(".weight")) {
            continue;
        }
        let ty = f.ty(v);
        let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
        let n: usize = shape.iter().product();
        let data: Vec<f64> = if name.contains("norm") {
            (0..n).map(|_| 1.0 + 0.1 * rng.next_f64()).collect()
        } else {
            let s = 1.0 / (*shape.last().unwrap() as f64).sqrt();
            (0..n).map(|_| s * rng.next_f64()).collect()
        };
        p.bind(&name, Tensor::new(ty.dtype, &shape, data).unwrap()).unwrap();
    }
}

#[test]
fn tiny_llama_decode_matches_prefill() {
    let cfg = llama::LlamaConfig::tiny();
    let mut pre = Program::compile(llama::build(&cfg, Mode::Prefill, DType::F32).unwrap(), Backend::Interpreter).unwrap();
    let mut dec = Program::compile(llama::build(&cfg, Mode::Decode, DType::F32).unwrap(), Backend::Interpreter).unwrap();
    bind_random_weights(&mut pre, 7);
    bind_random_weights(&mut dec, 7);
    let toks = [3i64, 17, 42, 5, 9];
    let n = toks.len();
    let (ps, pages_per_layer) = (cfg.page_size, 2usize);
    let n_pages = cfg.n_layers * pages_per_layer;
    let page_shape = [n_pages, ps, cfg.n_kv_heads, cfg.head_dim];
    let empty = Tensor::zeros(DType::F32, &page_shape);
    // Block tables: layer l owns pages l*2 .. l*2+2.
    let bt = Tensor::from_fn(DType::I32, &[cfg.n_layers, 1, pages_per_layer], |i| (i[0] * pages_per_layer + i[2]) as f64);
    // Prefill the whole sequence at once.
    let tokens = Tensor::new(DType::I64, &[n], toks.iter().map(|&t| t as f64).collect()).unwrap();
    let pos = Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64);
    let full = pre.run(&[("tokens", &tokens), ("positions", &pos), ("block_tables", &bt), ("k_pages", &empty), ("v_pages", &empty)], &[]).unwrap();
    assert_eq!(full[0].shape(), &[n, cfg.vocab]);
    // Prefill the first token, then decode the rest one at a time.
    let t0 = Tensor::new(DType::I64, &[1], vec![toks[0] as f64]).unwrap();
    let p0 = Tensor::new(DType::I32, &[1], vec![0.0]).unwrap();
    let mut out = pre.run(&[("tokens", &t0), ("positions", &p0), ("block_tables", &bt), ("k_pages", &empty), ("v_pages", &empty)], &[]).unwrap();
    let mut logits = vec![out[0].data().to_vec()];
    for (step, &t) in toks.iter().enumerate().skip(1) {
        let tk = Tensor::new(DType::I64, &[1], vec![t as f64]).unwrap();
        let ps_ = Tensor::new(DType::I32, &[1], vec![step as f64]).unwrap();
        out = dec.run(&[("tokens", &tk), ("positions", &ps_), ("block_tables", &bt), ("k_pages", &out[1]), ("v_pages", &out[2])], &[]).unwrap();
        logits.push(out[0].data().to_vec());
    }
    let max_ref = full[0].data().iter().fold(0f64, |m, x| m.max(x.abs()));
    for (step, row) in logits.iter().enumerate() {
        for (j, &x) in row.iter().enumerate() {
            let r = full[0].data()[step * cfg.vocab + j];
            assert!((x - r).abs() <= 1e-6 * max_ref + 1e-5 * r.abs(), "step {step} logit {j}: decode {x} vs prefill {r}");
        }
    }
    // The caches agree too.
    for (a, b) in out[1].data().iter().zip(full[1].data()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()));
    }
}
