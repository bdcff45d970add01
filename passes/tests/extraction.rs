//! DAG-aware extraction: a shared sub-graph is paid once, tree-cost extraction picks the wrong
//! plan on the decode-shaped QKV case, and cyclic choices are refused.

use std::collections::{BTreeMap, HashMap};

use sinter_ir::{Function, Signature};
use sinter_passes::extract::{dag_cost, extract, to_function, tree_choice, Choice, NodeCosts};
use sinter_passes::lang::Sir;
use sinter_passes::optimise::{saturate, Phase};
use sinter_passes::{CostConfig, PassOptions};

fn count(f: &Function, op: &str) -> usize {
    f.nodes.values().filter(|n| n.op.kind.name() == op).count()
}

#[test]
fn tree_extraction_pays_a_shared_matmul_per_use_and_picks_the_wrong_plan() {
    // SmolLM2's Q/K/V projections at decode size: three GEMMs of one input, or one on the
    // concatenated weights whose output columns are sliced (free: the epilogue writes them).
    let g = sinter_ir::parse(
        "func @qkv(%x: bf16[T, 576], %wq: bf16[576, 576], %wk: bf16[192, 576], %wv: bf16[192, 576]) {
  %q: bf16[T, 576] = matmul(%x, %wq) {transpose_b=true}
  %k: bf16[T, 192] = matmul(%x, %wk) {transpose_b=true}
  %v: bf16[T, 192] = matmul(%x, %wv) {transpose_b=true}
  return %q, %k, %v
}",
    )
    .unwrap();
    let f = g.entry().unwrap();
    let opts = PassOptions { cost: CostConfig::decode(), ..PassOptions::default() };
    let sigs: BTreeMap<String, Signature> = BTreeMap::new();
    let sat = saturate(f, &sigs, &opts, &Phase::ALL, &[]).unwrap();
    let eg = &sat.egraph;
    let costs = NodeCosts::new(eg, &opts.cost);
    let tree: Choice = tree_choice(eg, &costs).into_iter().map(|(k, (_, n))| (k, n)).collect();
    let tree_cost = dag_cost(eg, sat.root, &tree, &costs).unwrap();
    let ex = extract(eg, sat.root, &opts.cost).unwrap();
    let names = HashMap::new();
    let by_tree = to_function(eg, sat.root, &tree, f, &names).unwrap();
    let by_dag = to_function(eg, sat.root, &ex.choice, f, &names).unwrap();
    assert_eq!(count(&by_tree, "matmul"), 3, "tree extraction keeps three GEMMs:\n{}", sinter_ir::text::print_function(&by_tree));
    assert_eq!(count(&by_dag, "matmul"), 1, "DAG extraction merges them:\n{}", sinter_ir::text::print_function(&by_dag));
    assert!(ex.dag_cost < tree_cost, "{} < {}", ex.dag_cost, tree_cost);
    assert_eq!(ex.tree_dag_cost, tree_cost);
    assert!(ex.sharing_moves >= 1);
    // Both are the same function.
    let b: sinter_ir::Bindings = [("T".to_string(), 2i64)].into();
    let mut rng = 1u64;
    let ins: Vec<sinter_ir::interp::Tensor> = f
        .params
        .iter()
        .map(|&p| {
            let shape: Vec<usize> = f.ty(p).shape.iter().map(|d| d.eval(&b).unwrap() as usize).collect();
            sinter_ir::interp::Tensor::from_fn(f.ty(p).dtype, &shape, |_| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((rng >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.2
            })
        })
        .collect();
    let refs: Vec<&sinter_ir::interp::Tensor> = ins.iter().collect();
    let mut g1 = sinter_ir::Graph::new();
    g1.add_func(by_tree);
    let mut g2 = sinter_ir::Graph::new();
    g2.add_func(by_dag);
    let a = sinter_ir::interp::run(&g1, "qkv", &refs, &Default::default()).unwrap();
    let c = sinter_ir::interp::run(&g2, "qkv", &refs, &Default::default()).unwrap();
    assert_eq!(a, c, "merging the GEMMs is exact");
}

#[test]
fn cyclic_choices_are_refused() {
    // x·1 → x puts `mul(x, 1)` into x's own class: choosing it reaches the class itself.
    let g = sinter_ir::parse(
        "func @f(%x: f32[4]) {
  %one: f32[] = constant() {value=1.0, dtype=f32}
  %y: f32[4] = mul(%x, %one)
  %z: f32[4] = exp(%y)
  return %z
}",
    )
    .unwrap();
    let f = g.entry().unwrap();
    let sat = saturate(f, &BTreeMap::new(), &PassOptions::default(), &Phase::ALL, &[]).unwrap();
    let eg = &sat.egraph;
    let costs = NodeCosts::new(eg, &CostConfig::prefill());
    let mut choice: Choice = tree_choice(eg, &costs).into_iter().map(|(k, (_, n))| (k, n)).collect();
    let x = eg.classes().find(|c| c.nodes.iter().any(|n| matches!(n, Sir::Param(0)))).unwrap();
    let cyclic = x.nodes.iter().find(|n| n.kind() == Some(sinter_ir::OpKind::Mul)).expect("x·1 is in x's class").clone();
    assert!(dag_cost(eg, sat.root, &choice, &costs).is_some());
    choice.insert(x.id, cyclic);
    assert_eq!(dag_cost(eg, sat.root, &choice, &costs), None, "a cyclic choice has no cost");
    let err = to_function(eg, sat.root, &choice, f, &HashMap::new()).unwrap_err();
    assert!(err.contains("cyclic"), "{err}");
    // The extractor itself never returns one.
    let ex = extract(eg, sat.root, &CostConfig::prefill()).unwrap();
    let out = to_function(eg, sat.root, &ex.choice, f, &HashMap::new()).unwrap();
    assert_eq!(count(&out, "mul"), 0);
}

/// The cost model at decode sizes: extraction still takes the fused form when activations are
/// tiny (the analysis is in the book's fusion chapter, "Extraction and the cost model"). Pinned:
/// every passes filetest, with `T = 1` and the decode cost, lowers to no more kernels than the
/// same graph under the prefill cost, nor than one kernel per node.
#[test]
fn decode_sized_graphs_fuse_as_much_as_prefill_sized_ones() {
    use sinter_passes::{compile, lower_unfused, Target};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "sir")).collect();
    files.sort();
    let mut checked = 0;
    for path in files {
        let src = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let g = sinter_ir::parse(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        let one = g.specialize(&[("T".to_string(), 1)].into_iter().collect());
        if sinter_ir::verify(&one).is_err() {
            continue;
        }
        // The weights are the model's, whatever the shapes: those the header names, else the
        // guess on the symbolic graph (at T = 1 every shape is constant and nothing is guessed).
        let named: Vec<String> = src.lines().filter_map(|l| l.strip_prefix("// weights: ")).flat_map(|l| l.split_whitespace()).map(|w| w.trim_start_matches('%').to_string()).collect();
        let weights = Some(if named.is_empty() { sinter_passes::hoist::weight_names(&g, None) } else { named.into_iter().collect() });
        let prefill = PassOptions { cost: CostConfig::prefill(), weights: weights.clone(), ..PassOptions::default() };
        let decode = PassOptions { cost: CostConfig::decode(), weights, ..PassOptions::default() };
        let (_, at_prefill) = compile(&g, &Target::SM_90A, &prefill).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (_, at_decode) = compile(&one, &Target::SM_90A, &decode).unwrap_or_else(|e| panic!("{name} at T = 1: {e}"));
        let unfused = lower_unfused(&one).unwrap().kernels.len();
        assert!(at_decode.kernels_after() <= at_prefill.kernels_after(), "{name}: {} kernels at T = 1 against {} at prefill\n{at_decode}", at_decode.kernels_after(), at_prefill.kernels_after());
        assert!(at_decode.kernels_after() <= unfused, "{name}: {} kernels fused against {unfused} unfused", at_decode.kernels_after());
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} filetests specialise to T = 1");
}
