//! A small Llama-like decoder layer (rms_norm, matmuls, rope, GQA attention, swiglu) defined
//! once and called twice from `@main` with different weights.


use super::*;
use crate::builder::{BuildError, FunctionBuilder};
use crate::dim::Dim;
use crate::graph::{TensorType, Value};
use crate::ops::{Attr, OpKind};

/// Sizes of the layer.
#[derive(Clone, Copy)]
struct Cfg {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    layers: usize,
    dtype: DType,
}

fn d(n: usize) -> Dim {
    Dim::constant(n as i64)
}

fn tt(dtype: DType, shape: Vec<Dim>) -> TensorType {
    TensorType::new(dtype, shape)
}

/// Names and types of one layer's weights (HF layout: projections are [out, in]).
fn weight_types(c: &Cfg) -> Vec<(&'static str, TensorType)> {
    let (h, q, kv, f) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim, c.ffn);
    vec![
        ("attn_norm", tt(c.dtype, vec![d(h)])),
        ("wq", tt(c.dtype, vec![d(q), d(h)])),
        ("wk", tt(c.dtype, vec![d(kv), d(h)])),
        ("wv", tt(c.dtype, vec![d(kv), d(h)])),
        ("wo", tt(c.dtype, vec![d(h), d(q)])),
        ("mlp_norm", tt(c.dtype, vec![d(h)])),
        ("w_gate", tt(c.dtype, vec![d(f), d(h)])),
        ("w_up", tt(c.dtype, vec![d(f), d(h)])),
        ("w_down", tt(c.dtype, vec![d(h), d(f)])),
    ]
}

fn layer(g: &Graph, c: &Cfg) -> Result<crate::Function, BuildError> {
    let tsym = Dim::symbol("T");
    let mut b = FunctionBuilder::new(g, "layer");
    let x = b.param("x", tt(c.dtype, vec![tsym.clone(), d(c.hidden)]));
    let pos = b.param("pos", tt(DType::I32, vec![tsym.clone()]));
    let w: Vec<Value> = weight_types(c).into_iter().map(|(n, t)| b.param(n, t)).collect();
    let tb = || vec![("transpose_b", Attr::Bool(true))];
    let eps = || vec![("eps", Attr::Float(1e-5))];
    let perm = || vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))];
    // Projection + split into heads [1, H, T, Dh] + rope (for q and k).
    let heads = |b: &mut FunctionBuilder, h: Value, wt: Value, n: usize, rope: bool| -> Result<Value, BuildError> {
        let p = b.op1(OpKind::Matmul, &[h, wt], tb())?;
        let p = b.op1(OpKind::Reshape, &[p], vec![("shape", Attr::Dims(vec![d(1), tsym.clone(), d(n), d(c.head_dim)]))])?;
        let p = b.op1(OpKind::Permute, &[p], perm())?;
        if rope {
            b.op1(OpKind::Rope, &[p, pos], vec![("theta", Attr::Float(10000.0))])
        } else {
            Ok(p)
        }
    };
    let h = b.op1(OpKind::RmsNorm, &[x, w[0]], eps())?;
    let q = heads(&mut b, h, w[1], c.heads, true)?;
    let k = heads(&mut b, h, w[2], c.kv_heads, true)?;
    let v = heads(&mut b, h, w[3], c.kv_heads, false)?;
    let attn = vec![
        ("scale", Attr::Float(1.0 / (c.head_dim as f64).sqrt())),
        ("causal", Attr::Bool(true)),
        ("heads", Attr::Int(c.heads as i64)),
        ("kv_heads", Attr::Int(c.kv_heads as i64)),
    ];
    let a = b.op1(OpKind::Attention, &[q, k, v], attn)?;
    let a = b.op1(OpKind::Permute, &[a], perm())?;
    let a = b.op1(OpKind::Reshape, &[a], vec![("shape", Attr::Dims(vec![tsym.clone(), d(c.heads * c.head_dim)]))])?;
    let o = b.op1(OpKind::Matmul, &[a, w[4]], tb())?;
    let x1 = b.op1(OpKind::Add, &[x, o], vec![])?;
    let h2 = b.op1(OpKind::RmsNorm, &[x1, w[5]], eps())?;
    let gt = b.op1(OpKind::Matmul, &[h2, w[6]], tb())?;
    let up = b.op1(OpKind::Matmul, &[h2, w[7]], tb())?;
    let s = b.op1(OpKind::Swiglu, &[gt, up], vec![])?;
    let dn = b.op1(OpKind::Matmul, &[s, w[8]], tb())?;
    let out = b.op1(OpKind::Add, &[x1, dn], vec![])?;
    b.finish(&[out])
}

/// `@main(x, pos, weights of layer 0, weights of layer 1, …)`: the layers in sequence.
fn model(c: &Cfg, embed: bool) -> Graph {
    let mut g = Graph::new();
    let f = layer(&g, c).unwrap_or_else(|e| panic!("{e}"));
    g.add_func(f);
    let tsym = Dim::symbol("T");
    let mut b = FunctionBuilder::new(&g, "main");
    let (mut x, table) = if embed {
        let ids = b.param("ids", tt(DType::I64, vec![tsym.clone()]));
        let table = b.param("embed", tt(c.dtype, vec![d(c.vocab), d(c.hidden)]));
        (b.op1(OpKind::Gather, &[table, ids], vec![]).unwrap_or_else(|e| panic!("{e}")), Some(table))
    } else {
        (b.param("x", tt(c.dtype, vec![tsym.clone(), d(c.hidden)])), None)
    };
    let pos = b.param("pos", tt(DType::I32, vec![tsym]));
    for l in 0..c.layers {
        let ws: Vec<Value> = weight_types(c).into_iter().map(|(n, t)| b.param(&format!("{n}_{l}"), t)).collect();
        let mut args = vec![x, pos];
        args.extend(ws);
        x = b.op1(OpKind::Call, &args, vec![("func", Attr::Str("layer".into()))]).unwrap_or_else(|e| panic!("{e}"));
    }
    // Tied embeddings: logits = rms_norm(x) · embedᵀ.
    let out = match table {
        Some(table) => {
            let norm_w = b.param("final_norm", tt(c.dtype, vec![d(c.hidden)]));
            let n = b.op1(OpKind::RmsNorm, &[x, norm_w], vec![("eps", Attr::Float(1e-5))]).unwrap_or_else(|e| panic!("{e}"));
            b.op1(OpKind::Matmul, &[n, table], vec![("transpose_b", Attr::Bool(true))]).unwrap_or_else(|e| panic!("{e}"))
        }
        None => x,
    };
    let f = b.finish(&[out]).unwrap_or_else(|e| panic!("{e}"));
    g.add_func(f);
    verify(&g).unwrap_or_else(|e| panic!("{e}"));
    g
}

fn weights(c: &Cfg, rng: &mut Rng) -> Vec<Tensor> {
    weight_types(c)
        .into_iter()
        .map(|(n, ty)| {
            let shape: Vec<usize> = ty.shape.iter().map(|x| x.as_const().unwrap_or(0) as usize).collect();
            if n.ends_with("norm") {
                Tensor::from_fn(c.dtype, &shape, |_| 1.0 + 0.1 * rng.next())
            } else {
                let fan_in = shape[1] as f64;
                rng.tensor(c.dtype, &shape, 1.0 / fan_in.sqrt())
            }
        })
        .collect()
}

#[test]
fn llama_layer_called_twice_equals_running_it_twice() {
    let c = Cfg { hidden: 16, heads: 4, kv_heads: 2, head_dim: 4, ffn: 24, vocab: 0, layers: 2, dtype: DType::BF16 };
    let g = model(&c, false);
    let mut rng = Rng(2024);
    let tokens = 5;
    let x = rng.tensor(c.dtype, &[tokens, c.hidden], 1.0);
    let pos = Tensor::from_fn(DType::I32, &[tokens], |i| i[0] as f64 + 3.0);
    let w0 = weights(&c, &mut rng);
    let w1 = weights(&c, &mut rng);
    let mut inputs: Vec<&Tensor> = vec![&x, &pos];
    inputs.extend(w0.iter());
    inputs.extend(w1.iter());
    let out = call_fn(&g, "main", &inputs).remove(0);

    let mut first: Vec<&Tensor> = vec![&x, &pos];
    first.extend(w0.iter());
    let y0 = call_fn(&g, "layer", &first).remove(0);
    let mut second: Vec<&Tensor> = vec![&y0, &pos];
    second.extend(w1.iter());
    let y1 = call_fn(&g, "layer", &second).remove(0);

    assert_eq!(out.shape(), &[tokens, c.hidden]);
    assert_eq!(out, y1);
    assert!(out.data().iter().all(|v| v.is_finite()));
    assert_ne!(y0, y1, "the two layers have different weights");
    assert_ne!(&y0, &x);
    // The causal layer: token 0's output depends on token 0 alone, so running the layer on
    // the first token by itself gives the same first row.
    let x_one = Tensor::from_fn(c.dtype, &[1, c.hidden], |i| x.get(&[0, i[1]]).unwrap_or(0.0));
    let pos_one = Tensor::from_fn(DType::I32, &[1], |_| 3.0);
    let mut one: Vec<&Tensor> = vec![&x_one, &pos_one];
    one.extend(w0.iter());
    let y_one = call_fn(&g, "layer", &one).remove(0);
    assert_eq!(y_one.data(), &y0.data()[..c.hidden]);
}
