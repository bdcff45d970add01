//! The model zoo: graphs verify, run on the interpreter, and decode agrees with prefill.

use sinter::zoo::{llama, Mode};
use sinter::{Backend, DType, Program, Tensor};
use std::collections::BTreeMap;

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

/// Binds every weight and bias (`token_embd`, `blk.*`, `output_norm`, ...: every parameter
/// whose name holds `.weight` or `.bias`) of a zoo graph to seeded random values: norm weights
/// near 1, biases within ±0.1, matrices scaled by 1/sqrt(fan-in). Returns the bound tensors by
/// name, so that a reference implementation can use the same values.
pub fn bind_random_weights(p: &mut Program, seed: u64) -> BTreeMap<String, Tensor> {
    let mut rng = Rng::new(seed);
    let mut bound = BTreeMap::new();
    let f = p.graph().func(p.entry()).unwrap().clone();
    for &v in &f.params {
        let name = f.values[v].name.clone().unwrap();
        if !(name.contains(".weight") || name.contains(".bias")) {
            continue;
        }
        let ty = f.ty(v);
        let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
        let n: usize = shape.iter().product();
        let data: Vec<f64> = if name.contains(".bias") {
            (0..n).map(|_| 0.1 * rng.next_f64()).collect()
        } else if name.contains("norm") {
            (0..n).map(|_| 1.0 + 0.1 * rng.next_f64()).collect()
        } else {
            let s = 1.0 / (*shape.last().unwrap() as f64).sqrt();
            (0..n).map(|_| s * rng.next_f64()).collect()
        };
        let t = Tensor::new(ty.dtype, &shape, data).unwrap();
        bound.insert(name.clone(), t.clone());
        p.bind(&name, t).unwrap();
    }
    bound
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

/// The parameter names of `@main` of the zoo model `name` built in bf16, after checking that
/// the graph verifies.
fn main_params(name: &str, mode: Mode) -> Vec<String> {
    let g = sinter::zoo::build(name, mode, DType::BF16).unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
    sinter::ir::verify(&g).unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
    let f = g.func("main").unwrap();
    f.params.iter().map(|&p| f.values[p].name.clone().unwrap()).collect()
}

#[test]
fn full_size_zoo_graphs_verify_with_expected_parameters() {
    // Llama family: 5 inputs (tokens, positions, block_tables, k_pages, v_pages), the
    // embedding, 9 weights per layer, the output norm, and `output.weight` when untied.
    for (name, layers, untied) in [("smollm2-135m", 30, 0), ("llama3-8b", 32, usize::from(!llama::LlamaConfig::llama3_8b().tied_embeddings))] {
        for mode in [Mode::Prefill, Mode::Decode] {
            let params = main_params(name, mode);
            assert_eq!(params.len(), 5 + 1 + 9 * layers + 1 + untied, "{name} {mode:?}: {params:?}");
            assert_eq!(params[..5], ["tokens", "positions", "block_tables", "k_pages", "v_pages"]);
            assert_eq!(params.iter().filter(|p| p.starts_with("blk.")).count(), 9 * layers);
            assert!(params.contains(&"output_norm.weight".to_string()));
        }
    }
    // GPT-2 small: 2 inputs, token and position embeddings, 12 tensors per block (2 norms with
    // biases, QKV, output, up, down — each with a bias), the final norm's weight and bias.
    let params = main_params("gpt2", Mode::Prefill);
    assert_eq!(params.len(), 2 + 2 + 12 * 12 + 2, "{params:?}");
    assert_eq!(params[..4], ["tokens", "positions", "token_embd.weight", "position_embd.weight"]);
    assert!(sinter::zoo::build("gpt2", Mode::Decode, DType::BF16).is_err());
}

/// Inputs for a zoo graph's entry: seeded weights (norms near 1, matrices scaled by 1/√fan-in),
/// token ids below the vocabulary, positions (prefill `0..T`; decode: sequence b already holds
/// 3 + 2b tokens), block tables giving each (layer, sequence) its own pages, and caches holding
/// random keys and values.
pub fn graph_inputs(g: &sinter::Graph, mode: sinter::zoo::Mode, seed: u64) -> Vec<Tensor> {
    let f = g.entry().unwrap();
    let name = |i: usize| f.values[f.params[i]].name.clone().unwrap_or_default();
    let vocab = (0..f.params.len())
        .find(|&i| name(i) == "token_embd.weight")
        .and_then(|i| f.ty(f.params[i]).shape[0].as_const())
        .unwrap() as usize;
    let t = 5usize;
    let decode = mode == sinter::zoo::Mode::Decode;
    let lens: Vec<usize> = if decode { (0..t).map(|b| 3 + 2 * b).collect() } else { vec![0] };
    let b = lens.len();
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    // Page geometry from the cache's declared type [P, page, Hkv, D].
    let page_ty = (0..f.params.len()).find(|&i| name(i) == "k_pages").map(|i| f.ty(f.params[i]).clone());
    let bt_ty = (0..f.params.len()).find(|&i| name(i) == "block_tables").map(|i| f.ty(f.params[i]).clone());
    let ps = page_ty.as_ref().map_or(1, |p| p.shape[1].as_const().unwrap() as usize);
    let layers = bt_ty.as_ref().map_or(1, |t| t.shape[0].as_const().unwrap() as usize);
    let pages_per_seq = (lens.iter().max().unwrap() + t).div_ceil(ps) + 1;
    let n_pages = layers * b * pages_per_seq;
    for i in 0..f.params.len() {
        let ty = f.ty(f.params[i]);
        let n = name(i);
        let tensor = match n.as_str() {
            "tokens" => Tensor::from_fn(ty.dtype, &[t], |_| ((rng.next_f64() + 1.0) * 0.5 * vocab as f64).floor().min(vocab as f64 - 1.0)),
            "positions" if decode => Tensor::from_fn(ty.dtype, &[t], |ix| lens[ix[0]] as f64),
            "positions" => Tensor::from_fn(ty.dtype, &[t], |ix| ix[0] as f64),
            "block_tables" => Tensor::from_fn(ty.dtype, &[layers, b, pages_per_seq], |ix| ((ix[0] * b + ix[1]) * pages_per_seq + ix[2]) as f64),
            "k_pages" | "v_pages" => {
                let s: Vec<usize> = std::iter::once(n_pages).chain(ty.shape[1..].iter().map(|d| d.as_const().unwrap() as usize)).collect();
                Tensor::from_fn(ty.dtype, &s, |_| rng.next_f64())
            }
            _ => {
                let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_const().unwrap_or_else(|| panic!("{n}: {ty}")) as usize).collect();
                let fan_in = *shape.last().unwrap_or(&1) as f64;
                Tensor::from_fn(ty.dtype, &shape, |_| {
                    let r = rng.next_f64();
                    if n.contains("norm") {
                        1.0 + 0.1 * r
                    } else if n.contains(".bias") {
                        0.1 * r
                    } else {
                        r / fan_in.sqrt()
                    }
                })
            }
        };
        out.push(tensor);
    }
    out
}
