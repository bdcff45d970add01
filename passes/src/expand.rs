//! Ops the passes lower by their decomposition before anything else sees the graph.
//!
//! `argmax(x, axis)` becomes, over `idx = iota(axis)` (i32) and `big = i32::MAX`:
//! `first_nan = min(select(x ≠ x, idx, big))`, `first_max = min(select(x = max(x), idx, big))`
//! (no element equals a NaN maximum, so a row with a NaN gives `big` here),
//! `r = minimum(first_nan, first_max)`, then `−1` where `r = big` (an empty axis) and a cast to
//! i64: the first index of the largest element, of the first NaN when the row has one — the
//! op's definition, checked against the interpreter's own `argmax` in the tests. Every node is
//! one the row-reduction generator computes (max, min, compare, select over one row), so the
//! fusion passes make it one kernel.

use sinter_ir::builder::{BuildError, FunctionBuilder};
use sinter_ir::{Attr, DType, Function, Graph, OpKind, Value};

use crate::PassError;

/// `g` with every `argmax` replaced by its decomposition (the graph itself when it has none).
///
/// # Errors
/// [`PassError::Lower`] when a decomposition does not build (an internal error: the graph
/// verified before).
pub fn expand(g: &Graph) -> Result<Graph, PassError> {
    let has = |f: &Function| f.nodes.values().any(|nd| nd.op.kind == OpKind::Argmax);
    if !g.funcs.values().any(has) {
        return Ok(g.clone());
    }
    let mut out = Graph::new();
    for f in g.funcs.values() {
        let nf = if has(f) { expand_function(g, f).map_err(|e| PassError::Lower(format!("internal: argmax in @{}: {e}", f.name)))? } else { f.clone() };
        out.add_func(nf);
    }
    Ok(out)
}

fn expand_function(g: &Graph, f: &Function) -> Result<Function, BuildError> {
    let mut b = FunctionBuilder::new(g, f.name.clone());
    let mut env: std::collections::HashMap<Value, Value> = std::collections::HashMap::new();
    for &p in &f.params {
        let v = b.func_mut().add_param(f.values[p].name.clone(), f.ty(p).clone());
        env.insert(p, v);
    }
    for nd in f.nodes.values() {
        let inputs: Vec<Value> = nd.inputs.iter().map(|v| env[v]).collect();
        let results = if nd.op.kind == OpKind::Argmax {
            let axis = nd.op.int("axis").unwrap_or(-1);
            let keepdim = nd.op.bool("keepdim").unwrap_or(true);
            vec![argmax(&mut b, inputs[0], axis, keepdim)?]
        } else {
            let tys = nd.results.iter().map(|&r| f.ty(r).clone()).collect();
            b.func_mut().push_node(nd.op.clone(), inputs, tys).1
        };
        for (r, v) in nd.results.iter().zip(results) {
            b.func_mut().values[v].name = f.values[*r].name.clone();
            env.insert(*r, v);
        }
    }
    let outputs: Vec<Value> = f.outputs.iter().map(|v| env[v]).collect();
    b.finish(&outputs)
}

/// The decomposition of `argmax(x)` over `axis` (see the module docs).
fn argmax(b: &mut FunctionBuilder, x: Value, axis: i64, keepdim: bool) -> Result<Value, BuildError> {
    let shape = b.ty(x).shape.clone();
    let ax = |keep: bool| vec![("axis", Attr::Int(axis)), ("keepdim", Attr::Bool(keep))];
    let konst = |b: &mut FunctionBuilder, v: f64| b.op1(OpKind::Constant, &[], vec![("value", Attr::Float(v)), ("dtype", Attr::DType(DType::I32))]);
    let rank = shape.len() as i64;
    let iota_axis = if axis < 0 { axis + rank } else { axis };
    let idx = b.op1(OpKind::Iota, &[], vec![("dtype", Attr::DType(DType::I32)), ("shape", Attr::Dims(shape)), ("axis", Attr::Int(iota_axis))])?;
    let big = konst(b, f64::from(i32::MAX))?;
    let is_nan = b.op1(OpKind::Ne, &[x, x], vec![])?;
    let nan_idx = b.op1(OpKind::Select, &[is_nan, idx, big], vec![])?;
    let first_nan = b.op1(OpKind::ReduceMin, &[nan_idx], ax(keepdim))?;
    let max = b.op1(OpKind::ReduceMax, &[x], ax(true))?;
    let is_max = b.op1(OpKind::Eq, &[x, max], vec![])?;
    let max_idx = b.op1(OpKind::Select, &[is_max, idx, big], vec![])?;
    let first_max = b.op1(OpKind::ReduceMin, &[max_idx], ax(keepdim))?;
    let r = b.op1(OpKind::Minimum, &[first_nan, first_max], vec![])?;
    let none = b.op1(OpKind::Eq, &[r, big], vec![])?;
    let minus_one = konst(b, -1.0)?;
    let r = b.op1(OpKind::Select, &[none, minus_one, r], vec![])?;
    b.op1(OpKind::Cast, &[r], vec![("dtype", Attr::DType(DType::I64))])
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_ir::interp::{self, Tensor};
    use sinter_ir::Bindings;

    fn graph(shape: &str, axis: i64, keepdim: bool) -> Graph {
        let out_shape: Vec<&str> = shape.split(", ").collect();
        let rank = out_shape.len() as i64;
        let a = if axis < 0 { axis + rank } else { axis } as usize;
        let mut o: Vec<String> = out_shape.iter().map(|s| s.to_string()).collect();
        if keepdim {
            o[a] = "1".into();
        } else {
            o.remove(a);
        }
        let src = format!("func @main(%x: f32[{shape}]) {{\n  %y: i64[{}] = argmax(%x) {{axis={axis}, keepdim={keepdim}}}\n  return %y\n}}", o.join(", "));
        sinter_ir::parse(&src).unwrap_or_else(|e| panic!("{e}\n{src}"))
    }

    #[test]
    fn argmax_decomposition_matches_the_interpreter_on_ties_nan_inf_and_empty_rows() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        let rows: Vec<Vec<f64>> = vec![
            vec![1.0, 3.0, 3.0, 2.0],
            vec![-inf, -inf, -inf, -inf],
            vec![inf, 1.0, nan, nan],
            vec![nan, 5.0, inf, nan],
            vec![-0.0, 0.0, -1.0, 0.0],
            vec![-3.4028235e38, -3.4028235e38, -1e-45, -3.4028235e38],
        ];
        let x = Tensor::new(DType::F32, &[6, 4], rows.concat()).unwrap();
        let want = [1.0, 0.0, 2.0, 0.0, 0.0, 2.0];
        for keepdim in [true, false] {
            let g = graph("6, 4", -1, keepdim);
            let direct = interp::run(&g, "main", &[&x], &Bindings::new()).unwrap();
            assert_eq!(direct[0].data(), &want, "interpreter");
            let e = expand(&g).unwrap();
            sinter_ir::verify(&e).unwrap();
            assert!(!e.funcs.values().any(|f| f.nodes.values().any(|n| n.op.kind == OpKind::Argmax)));
            let got = interp::run(&e, "main", &[&x], &Bindings::new()).unwrap();
            assert_eq!(got[0].shape(), direct[0].shape());
            assert_eq!(got[0].data(), direct[0].data(), "decomposition, keepdim {keepdim}");
        }
        // Over the first axis, and an empty axis (−1).
        let g = graph("4, 6", 0, false);
        let xt = Tensor::from_fn(DType::F32, &[4, 6], |i| rows[i[1]][i[0]]);
        let e = expand(&g).unwrap();
        assert_eq!(interp::run(&e, "main", &[&xt], &Bindings::new()).unwrap()[0].data(), &want);
        let g = graph("3, 0", -1, true);
        let empty = Tensor::new(DType::F32, &[3, 0], vec![]).unwrap();
        let direct = interp::run(&g, "main", &[&empty], &Bindings::new()).unwrap();
        assert_eq!(direct[0].data(), &[-1.0, -1.0, -1.0]);
        let got = interp::run(&expand(&g).unwrap(), "main", &[&empty], &Bindings::new()).unwrap();
        assert_eq!(got[0].data(), direct[0].data());
    }
}
