//! How a kernel reads a value of its body as a buffer: the view walks that the generators and
//! the passes share. An operand is read in place when it is a kernel input seen through
//! `reshape`s and `slice`s that keep it a strided view of that buffer ([`viewed_param`]); an
//! output is written through its trailing `reshape`s ([`peel`]).

use crate::{Dim, Function, OpKind, Value, ValueDef};

/// Follows `v` back through `reshape` and `slice` nodes of `body` to the kernel input
/// (parameter index) it views, as the generators read their buffer operands (a contiguous
/// buffer; a `reshape` only of a view that is still contiguous); `None` when `v` is computed
/// in the body or is a reshape of a strided view.
pub fn viewed_param(body: &Function, v: Value) -> Option<usize> {
    let mut chain = Vec::new();
    let mut cur = v;
    let param = loop {
        match body.values.get(cur)?.def {
            ValueDef::Param(i) => break i,
            ValueDef::Result(n, _) => {
                let nd = body.nodes.get(n)?;
                if !matches!(nd.op.kind, OpKind::Reshape | OpKind::Slice) {
                    return None;
                }
                chain.push(n);
                cur = *nd.inputs.first()?;
            }
        }
    };
    let mut contiguous = true;
    for &n in chain.iter().rev() {
        let nd = &body.nodes[n];
        let shape = &body.ty(nd.inputs[0]).shape;
        if nd.op.kind == OpKind::Reshape {
            if !contiguous {
                return None;
            }
        } else {
            let axis = crate::infer::norm_axis(nd.op.int("axis")?, shape.len()).ok()?;
            contiguous = contiguous && shape[..axis].iter().all(Dim::is_one);
        }
    }
    Some(param)
}

/// Follows `v` back through `reshape` nodes of `body` (as the generators peel trailing
/// reshapes of contiguous outputs).
pub fn peel(body: &Function, mut v: Value) -> Value {
    while let ValueDef::Result(n, _) = body.values[v].def {
        let nd = &body.nodes[n];
        if nd.op.kind != OpKind::Reshape {
            break;
        }
        v = nd.inputs[0];
    }
    v
}

/// Whether `v` of kernel body `f` is a kernel input (a parameter).
pub fn is_param(f: &Function, v: Value) -> bool {
    matches!(f.values[v].def, ValueDef::Param(_))
}
