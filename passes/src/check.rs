//! The consistency check: after saturation, every e-node of every e-class evaluates, on the
//! reference interpreter, to its class's value.
//!
//! The class values are first computed from the function's **original** e-nodes (what the
//! user wrote), in node order; then every other e-node whose operands have values is
//! evaluated and compared with its class's value. A rule that put a wrong e-node in a class
//! shows up as a mismatch naming the class, the e-node and the first differing element.
//!
//! **Tolerance.** Recognised ops round where their op-table row says, not at every step of
//! the decomposition, so values are compared as DESIGN.md compares a kernel with the
//! reference: `|alt − ref| ≤ atol + rtol·|ref|` with the dtype's rtol and `atol = k·max|ref|`
//! (f32: 1e-5, 1e-6; bf16: 1.6e-2, 1e-2; f16: 2e-3, 1e-3; integers and bool exactly); NaN
//! must meet NaN. **Unsafe → safe.** Where the reference's computation of a class passed
//! through a non-finite value (an overflow, a fully masked `−inf` row, a NaN input), the
//! alternative may be finite where the reference is not or differs, and anything where the
//! reference is NaN: that is the direction the rules are oriented in (`exp(x)/Σexp(x)`
//! overflows where `softmax` does not; a fully masked row is NaN decomposed, 0 or −inf as the
//! op). It may never be non-finite where a finite reference is.

use std::collections::{HashMap, HashSet};

use egg::{Id, Language};
use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, DType, Graph, TensorType};

use crate::eval::eval_op;
use crate::lang::{Sir, SirEGraph};

/// An e-node whose value differs from its class's.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The e-class.
    pub class: Id,
    /// The e-node, printed.
    pub node: String,
    /// What differed.
    pub message: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "e-class {} e-node `{}`: {}", self.class, self.node, self.message)
    }
}

/// What a successful check covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckStats {
    /// E-nodes evaluated (original and rewritten).
    pub evaluated: usize,
    /// E-nodes in the e-graph.
    pub total: usize,
}

/// The tolerance of a dtype: `(rtol, atol factor)`.
pub fn tolerance(dt: DType) -> (f64, f64) {
    match dt {
        DType::F32 => (1e-5, 1e-6),
        DType::BF16 => (1.6e-2, 1e-2),
        DType::F16 => (2e-3, 1e-3),
        _ => (0.0, 0.0),
    }
}

/// Compares `alt` with the reference `reference`; `tainted` allows the unsafe → safe
/// difference. `Err` names the first bad element.
pub fn compare(reference: &Tensor, alt: &Tensor, tainted: bool) -> Result<(), String> {
    if reference.dtype() != alt.dtype() || reference.shape() != alt.shape() {
        return Err(format!("type {}{:?} vs {}{:?}", reference.dtype(), reference.shape(), alt.dtype(), alt.shape()));
    }
    let (rtol, afac) = tolerance(reference.dtype());
    let maxref = reference.data().iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()));
    let atol = afac * maxref;
    for (i, (&r, &a)) in reference.data().iter().zip(alt.data()).enumerate() {
        if r == a || (r.is_nan() && a.is_nan()) {
            continue;
        }
        if tainted && (a.is_finite() || r.is_nan()) {
            continue;
        }
        if r.is_finite() && a.is_finite() && (a - r).abs() <= atol + rtol * r.abs() {
            continue;
        }
        return Err(format!("element {i}: {a} where the reference has {r}"));
    }
    Ok(())
}

/// Compares `alt` with `reference` element for element, exactly (NaN meets NaN; `−0` equals
/// `+0`, as the numbers they are). `Err` names the first differing element.
pub fn compare_exact(reference: &Tensor, alt: &Tensor) -> Result<(), String> {
    if reference.dtype() != alt.dtype() || reference.shape() != alt.shape() {
        return Err(format!("type {}{:?} vs {}{:?}", reference.dtype(), reference.shape(), alt.dtype(), alt.shape()));
    }
    match reference.data().iter().zip(alt.data()).position(|(r, a)| !(r == a || (r.is_nan() && a.is_nan()))) {
        Some(i) => Err(format!("element {i}: {} where the reference has {}", alt.data()[i], reference.data()[i])),
        None => Ok(()),
    }
}

/// Evaluates every e-node of `eg` on `params` (the function's inputs) and compares each with
/// its class's value (see the module docs). `original` is the loaded function's e-nodes in
/// node order; `graph` supplies callees for `call` e-nodes.
///
/// # Errors
/// Every mismatch found, and e-nodes whose evaluation failed where the class has a value.
pub fn check_egraph(eg: &SirEGraph, original: &[(Id, Sir)], params: &[&Tensor], bindings: &Bindings, graph: Option<&Graph>) -> Result<CheckStats, Vec<Mismatch>> {
    check_egraph_with(eg, original, params, bindings, graph, false)
}

/// [`check_egraph`] with every e-node required to equal its class's value **exactly** (NaN
/// meeting NaN; no tolerance, no unsafe → safe allowance) when `exact`: the check of the
/// rules whose rounding is claimed identical ([`crate::rules::Rounding::Exact`]).
///
/// # Errors
/// As [`check_egraph`].
pub fn check_egraph_with(eg: &SirEGraph, original: &[(Id, Sir)], params: &[&Tensor], bindings: &Bindings, graph: Option<&Graph>, exact: bool) -> Result<CheckStats, Vec<Mismatch>> {
    let mut values: HashMap<Id, Vec<Tensor>> = HashMap::new();
    let mut tainted: HashSet<Id> = HashSet::new();
    let mut mismatches = vec![];
    let mut evaluated = 0usize;
    let total = eg.total_number_of_nodes();
    for class in eg.classes() {
        for n in &class.nodes {
            if let Sir::Param(i) = n {
                if let Some(t) = params.get(*i as usize) {
                    values.insert(class.id, vec![(*t).clone()]);
                    evaluated += 1;
                }
            }
        }
    }
    let eval = |n: &Sir, values: &HashMap<Id, Vec<Tensor>>| -> Option<Result<Vec<Tensor>, String>> {
        match n {
            Sir::Param(_) | Sir::Tuple(_) => None,
            Sir::Proj(i, [c]) => {
                let v = values.get(&eg.find(*c))?;
                Some(v.get(*i as usize).cloned().map(|t| vec![t]).ok_or_else(|| "projection out of range".to_string()))
            }
            Sir::Op(sym, ch) => {
                let mut tys: Vec<TensorType> = vec![];
                let mut ins: Vec<&Tensor> = vec![];
                for c in ch {
                    let c = eg.find(*c);
                    ins.push(values.get(&c)?.first()?);
                    tys.push(eg[c].data.ty()?.clone());
                }
                Some(eval_op(sym.op(), &tys, &ins, bindings, graph).map_err(|e| e.to_string()))
            }
        }
    };
    let mut record = |class: Id, n: &Sir, res: Result<Vec<Tensor>, String>, values: &mut HashMap<Id, Vec<Tensor>>, tainted: &mut HashSet<Id>, is_ref: bool| {
        match (res, values.get(&class)) {
            (Ok(v), None) => {
                if is_ref {
                    let child_taint = n.children().iter().any(|c| tainted.contains(&eg.find(*c)));
                    let own = v.iter().any(|t| t.dtype().is_float() && t.data().iter().any(|x| !x.is_finite()));
                    if child_taint || own {
                        tainted.insert(class);
                    }
                }
                values.insert(class, v);
            }
            (Ok(v), Some(r)) => {
                let t = tainted.contains(&class);
                for (a, b) in r.iter().zip(&v) {
                    let res = if exact { compare_exact(a, b) } else { compare(a, b, t) };
                    if let Err(m) = res {
                        mismatches.push(Mismatch { class, node: n.to_string(), message: m });
                        break;
                    }
                }
            }
            (Err(e), Some(_)) => mismatches.push(Mismatch { class, node: n.to_string(), message: format!("does not evaluate: {e}") }),
            (Err(_), None) => {}
        }
    };
    let mut done: HashSet<(Id, Sir)> = HashSet::new();
    for (id, n) in original {
        let class = eg.find(*id);
        let canon = n.clone().map_children(|c| eg.find(c));
        if !done.insert((class, canon.clone())) {
            continue;
        }
        if let Some(res) = eval(&canon, &values) {
            evaluated += 1;
            record(class, &canon, res, &mut values, &mut tainted, true);
        }
    }
    loop {
        let mut progress = false;
        for class in eg.classes() {
            for n in &class.nodes {
                let canon = n.clone().map_children(|c| eg.find(c));
                if done.contains(&(class.id, canon.clone())) {
                    continue;
                }
                if let Some(res) = eval(&canon, &values) {
                    done.insert((class.id, canon.clone()));
                    evaluated += 1;
                    progress = true;
                    record(class.id, &canon, res, &mut values, &mut tainted, false);
                }
            }
        }
        if !progress {
            break;
        }
    }
    if mismatches.is_empty() {
        Ok(CheckStats { evaluated, total })
    } else {
        Err(mismatches)
    }
}
