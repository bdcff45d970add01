//! Collectives on simulated ranks (`run_ranks`): values, rank order, one rank alone, and a
//! failing rank that ends the others instead of leaving them waiting.

use super::{graph, t};
use crate::dtype::DType;
use crate::interp::{run_entry, run_ranks, Tensor};
use crate::Bindings;

const SUM: &str = "func @main(%x: bf16[2, 3]) {\n  %y: bf16[2, 3] = all_reduce(%x) {ranks=3}\n  return %y\n}\n";
const GATHER: &str = "func @main(%x: f32[2, 2]) {\n  %y: f32[2, 6] = all_gather(%x) {axis=1, ranks=3}\n  %z: f32[6, 2] = all_gather(%x) {axis=0, ranks=3}\n  return %y, %z\n}\n";

fn rank_inputs(f: impl Fn(usize) -> Tensor) -> Vec<Vec<Tensor>> {
    (0..3).map(|r| vec![f(r)]).collect()
}

#[test]
fn all_reduce_sums_the_ranks_once_rounded() {
    let g = graph(SUM);
    // 256 + 1 + 1 is 258 exactly but 256 + 1 rounds to 256 in bf16 at each step: one rounding
    // of the f64 sum gives 258.
    let ins = rank_inputs(|r| t(DType::BF16, &[2, 3], vec![if r == 0 { 256.0 } else { 1.0 }, 1.0, 2.0, 3.0, f64::NAN, -0.5]));
    let outs = run_ranks(&g, "main", &ins, &Bindings::new()).unwrap();
    for o in &outs {
        let d = o[0].data();
        assert_eq!(&d[..4], &[258.0, 3.0, 6.0, 9.0]);
        assert!(d[4].is_nan());
        assert_eq!(d[5], -1.5);
    }
}

#[test]
fn all_gather_joins_the_ranks_in_rank_order() {
    let g = graph(GATHER);
    let ins = rank_inputs(|r| Tensor::from_fn(DType::F32, &[2, 2], |i| (100 * r + 10 * i[0] + i[1]) as f64));
    let outs = run_ranks(&g, "main", &ins, &Bindings::new()).unwrap();
    assert_eq!(outs[1][0].data(), &[0.0, 1.0, 100.0, 101.0, 200.0, 201.0, 10.0, 11.0, 110.0, 111.0, 210.0, 211.0]);
    assert_eq!(outs[2][1].shape(), &[6, 2]);
    assert_eq!(outs[0][1].data()[4..8], [100.0, 101.0, 110.0, 111.0]);
}

#[test]
fn collectives_alone_or_in_a_group_of_another_size_are_errors() {
    let x = t(DType::BF16, &[2, 3], vec![1.0; 6]);
    let e = run_entry(&graph(SUM), &[&x], &Bindings::new()).unwrap_err().to_string();
    assert!(e.contains("3 ranks") && e.contains("run_ranks") && e.contains("n0"), "{e}");
    let one = graph(&SUM.replace("ranks=3", "ranks=1"));
    assert_eq!(run_entry(&one, &[&x], &Bindings::new()).unwrap()[0].data(), x.data());
    let two: Vec<Vec<Tensor>> = (0..2).map(|_| vec![x.clone()]).collect();
    let e = run_ranks(&graph(SUM), "main", &two, &Bindings::new()).unwrap_err().to_string();
    assert!(e.contains("group of 2"), "{e}");
    assert!(run_ranks(&graph(SUM), "main", &[], &Bindings::new()).is_err());
}

#[test]
fn a_failing_rank_ends_every_rank_with_its_error() {
    // Rank 1's input has the wrong shape: it fails before the collective, and the ranks
    // waiting there end with an error instead of waiting for it.
    let g = graph(SUM);
    let ins = rank_inputs(|r| t(DType::BF16, &[2, if r == 1 { 4 } else { 3 }], vec![1.0; if r == 1 { 8 } else { 6 }]));
    let e = run_ranks(&g, "main", &ins, &Bindings::new()).unwrap_err().to_string();
    assert!(e.contains("axis 1"), "the failing rank's own error, not a follow-on: {e}");
}
