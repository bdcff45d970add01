//! A row norm joins the kernel of the matmul that reads it as the matmul's prologue
//! (`sinter_ir::contract::prologue`): its RowReduction kernel merges into the new Matmul
//! kernel when the matmul generator computes such a norm and the cost model says the launch
//! saved pays for every CTA re-reading its rows (`crate::cost::norm_prologue_saving`).

use std::collections::BTreeSet;

use sinter_ir::{Family, Function, Node, TensorType};

use super::{absorb, Partition, Uses};
use crate::cost::{norm_prologue_saving, CostConfig};

/// Merges the RowReduction kernel of the norm matmul `mm` (the only node of Matmul kernel
/// `g` so far) reads as its A operand into `g`, when:
/// - the contract's [`sinter_ir::contract::norm_prologue`] takes the matmul;
/// - the norm's kernel holds that norm, casts of its input and result, and element-wise work
///   on its weight (Gemma's `1 + w` in f32): one row node, `x` computed elsewhere (through
///   casts, a kernel input of the fused body);
/// - no node of that kernel is read outside it but by `mm`, and none is a graph output;
/// - [`norm_prologue_saving`] is positive at `cfg`'s sizes.
pub(super) fn join_norm(f: &Function, uses: &Uses, p: &mut Partition, g: usize, mm: Node, cfg: &CostConfig) {
    let Some(norm) = sinter_ir::contract::norm_prologue(f, mm) else { return };
    let Some(&rg) = p.group_of.get(&norm) else { return };
    let grp = &p.groups[rg];
    if rg == g || grp.family != Family::RowReduction || grp.pinned || !grp.roots.is_empty() {
        return;
    }
    let members: BTreeSet<Node> = grp.nodes.iter().copied().collect();
    let row_nodes = members.iter().filter(|&&m| sinter_ir::contract::is_row_node(f.nodes[m].op.kind)).count();
    let x = sinter_ir::contract::through_unary(f, f.nodes[norm].inputs[0]);
    let x_outside = uses.bases(f, x).iter().all(|b| uses.producer.get(b).is_none_or(|pn| !members.contains(pn)));
    let outputs: BTreeSet<_> = f.outputs.iter().flat_map(|&o| uses.bases(f, o)).collect();
    let contained = members.iter().all(|m| {
        uses.users.get(m).into_iter().flatten().all(|u| *u == mm || members.contains(u)) && f.nodes[*m].results.iter().all(|r| !outputs.contains(r))
    });
    if row_nodes != 1 || !x_outside || !contained {
        return;
    }
    let types = |n: Node| -> (Vec<&TensorType>, Vec<TensorType>) {
        let nd = &f.nodes[n];
        (nd.inputs.iter().map(|&v| f.ty(v)).collect(), nd.results.iter().map(|&r| f.ty(r).clone()).collect())
    };
    let ((ni, no), (mi, mo)) = (types(norm), types(mm));
    if norm_prologue_saving(cfg, (&f.nodes[norm].op, &ni, &no), (&f.nodes[mm].op, &mi, &mo)) <= 0.0 {
        return;
    }
    absorb(p, rg, g);
    p.groups[g].nodes.sort();
}
