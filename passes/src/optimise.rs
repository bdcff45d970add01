//! Equality saturation of one function, in three phases, and extraction after each.
//!
//! A function is loaded into an e-graph ([`crate::lang::load`]) and saturated by egg's
//! `Runner` in phases that add rule families: `algebraic` (canonical forms), then
//! `recognition` (algebraic + recognition), then `fusion` (all three). Each phase has explicit
//! iteration, node and time limits ([`crate::Limits`]); its stop reason, iterations, e-graph
//! size and the rules that fired go into the fusion report. After each phase the cheapest
//! function is extracted ([`crate::extract`]) — the "IR after each pass" of the file tests —
//! and the last one is the optimised function.
//!
//! **Functions are optimised once.** A decoder layer defined once and called thirty times is
//! saturated once; [`crate::lower`] inlines the *optimised* body at every call.
//!
//! **Soundness stop.** A hook stops the runner as soon as the analysis has recorded a
//! conflict (a rule that would have unified differently typed values), and the optimiser
//! returns it as [`PassError::Unsound`] naming the rule, the e-class and both types.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use egg::{Id, Runner, SimpleScheduler, StopReason};
use sinter_ir::{Function, Signature};

use crate::extract::{self, Extraction};
use crate::lang::{self, SirAnalysis, SirEGraph};
use crate::rules::{self, Rw};
use crate::{PassError, PassOptions};

/// One saturation phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Algebraic rules only.
    Algebraic,
    /// Algebraic and recognition rules.
    Recognition,
    /// All rule families, the fusion rule included.
    Fusion,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 3] = [Phase::Algebraic, Phase::Recognition, Phase::Fusion];

    /// Name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Algebraic => "algebraic",
            Phase::Recognition => "recognition",
            Phase::Fusion => "fusion",
        }
    }

    /// The rewrites this phase runs.
    pub fn rules(self, opts: &PassOptions) -> Vec<Rw> {
        let mut v = rules::build(rules::algebraic::RULES);
        if self != Phase::Algebraic {
            v.extend(rules::build(rules::recognition::RULES));
            v.extend(rules::build(rules::layout::RULES));
            v.extend(rules::build(rules::masks::RULES));
            v.extend(rules::build(rules::rotary::RULES));
        }
        if self == Phase::Fusion && opts.merge_parallel_matmuls {
            v.extend(rules::build(rules::fusion::RULES));
        }
        v
    }
}

/// What one phase did.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseStats {
    /// Phase name.
    pub phase: &'static str,
    /// Iterations run.
    pub iterations: usize,
    /// Why the runner stopped (`saturated`, `iteration limit 30`, `node limit`, `time limit`).
    pub stop_reason: String,
    /// E-nodes at the end.
    pub egraph_nodes: usize,
    /// E-classes at the end.
    pub egraph_classes: usize,
    /// Rules that changed the e-graph, with the number of classes each changed.
    pub rules_fired: BTreeMap<String, usize>,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// A saturated e-graph of one function.
pub struct Saturated {
    /// The e-graph.
    pub egraph: SirEGraph,
    /// Its root (a tuple of the outputs).
    pub root: Id,
    /// The loaded form (value classes, the original e-nodes).
    pub original: Vec<(Id, lang::Sir)>,
    /// Names of the function's named values by class.
    pub names: HashMap<Id, String>,
    /// Per-phase statistics.
    pub phases: Vec<PhaseStats>,
    /// The function extracted after each phase, with the phase name.
    pub snapshots: Vec<(String, Function)>,
}

fn stop_text(r: &Option<StopReason>) -> String {
    match r {
        None => "not run".into(),
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n})"),
        Some(StopReason::TimeLimit(s)) => format!("time limit ({s:.2} s)"),
        Some(StopReason::Other(s)) => s.clone(),
    }
}

/// Loads `f` and saturates it phase by phase with the rules of `phases` (plus `extra` rules in
/// every phase, for tests), extracting after each phase.
///
/// # Errors
/// A function that does not load, a rule that is unsound by the analysis, an extraction that
/// fails.
pub fn saturate(f: &Function, callees: &BTreeMap<String, Signature>, opts: &PassOptions, phases: &[Phase], extra: &[Rw]) -> Result<Saturated, PassError> {
    saturate_with_weights(f, callees, opts, phases, extra, None)
}

/// [`saturate`] with `f`'s weight parameters flagged ([`lang::load_with_weights`]).
///
/// # Errors
/// As [`saturate`].
pub fn saturate_with_weights(f: &Function, callees: &BTreeMap<String, Signature>, opts: &PassOptions, phases: &[Phase], extra: &[Rw], weights: Option<&[bool]>) -> Result<Saturated, PassError> {
    let loaded = lang::load_with_weights(f, callees, weights).map_err(|message| PassError::Load { func: f.name.clone(), message })?;
    let mut names = HashMap::new();
    for (v, &c) in &loaded.value_class {
        if let Some(n) = &f.values[*v].name {
            if !lang::is_param(f, *v) {
                names.entry(loaded.egraph.find(c)).or_insert_with(|| n.clone());
            }
        }
    }
    let root = loaded.root;
    let mut eg = loaded.egraph;
    let mut stats = vec![];
    let mut snapshots = vec![];
    for &phase in phases {
        let start = Instant::now();
        let mut rws = phase.rules(opts);
        rws.extend(extra.iter().cloned());
        let runner: Runner<lang::Sir, SirAnalysis> = Runner::new(SirAnalysis::default())
            .with_egraph(eg)
            .with_iter_limit(opts.limits.iterations)
            .with_node_limit(opts.limits.nodes)
            .with_time_limit(opts.limits.time)
            .with_scheduler(SimpleScheduler)
            .with_hook(|r| if r.egraph.analysis.conflicts.is_empty() { Ok(()) } else { Err("stopped: analysis conflict".into()) })
            .run(rws.iter());
        let mut fired: BTreeMap<String, usize> = BTreeMap::new();
        for it in &runner.iterations {
            for (name, n) in &it.applied {
                *fired.entry(name.to_string()).or_insert(0) += n;
            }
        }
        let stop = stop_text(&runner.stop_reason);
        eg = runner.egraph;
        eg.rebuild();
        if let Some(c) = eg.analysis.conflicts.first() {
            return Err(PassError::Unsound { func: f.name.clone(), phase: phase.name(), conflict: c.to_string() });
        }
        stats.push(PhaseStats {
            phase: phase.name(),
            iterations: runner.iterations.len(),
            stop_reason: stop,
            egraph_nodes: eg.total_number_of_nodes(),
            egraph_classes: eg.number_of_classes(),
            rules_fired: fired,
            seconds: start.elapsed().as_secs_f64(),
        });
        if opts.snapshots || phase == *phases.last().unwrap_or(&phase) {
            let ex = extract::extract(&eg, root, &opts.cost).map_err(|message| PassError::Extract { func: f.name.clone(), message })?;
            let g = extract::to_function(&eg, root, &ex.choice, f, &canonical_names(&eg, &names)).map_err(|message| PassError::Extract { func: f.name.clone(), message })?;
            snapshots.push((phase.name().to_string(), g));
        }
    }
    let names = canonical_names(&eg, &names);
    Ok(Saturated { egraph: eg, root, original: loaded.original, names, phases: stats, snapshots })
}

fn canonical_names(eg: &SirEGraph, names: &HashMap<Id, String>) -> HashMap<Id, String> {
    let mut out: HashMap<Id, String> = HashMap::new();
    let mut sorted: Vec<(&Id, &String)> = names.iter().collect();
    sorted.sort();
    for (c, n) in sorted {
        out.entry(eg.find(*c)).or_insert_with(|| n.clone());
    }
    out
}

/// One function after optimisation.
#[derive(Clone, Debug)]
pub struct OptimisedFunction {
    /// The optimised function (same name and signature).
    pub function: Function,
    /// Per-phase statistics.
    pub phases: Vec<PhaseStats>,
    /// The function after each phase.
    pub snapshots: Vec<(String, Function)>,
    /// Nodes before and after.
    pub nodes_before: usize,
    /// Nodes after.
    pub nodes_after: usize,
    /// Modelled cost of the input function (every node its own kernel), µs.
    pub cost_before: f64,
    /// Modelled DAG cost of the extracted function, µs.
    pub cost_after: f64,
    /// What a tree-cost extraction would have paid (as a DAG), µs.
    pub cost_tree_extraction: f64,
    /// Moves the sharing pass of extraction kept.
    pub sharing_moves: usize,
}

/// Saturates and extracts one function with every phase.
///
/// # Errors
/// As [`saturate`].
pub fn optimise_function(f: &Function, callees: &BTreeMap<String, Signature>, opts: &PassOptions) -> Result<OptimisedFunction, PassError> {
    optimise_function_with_weights(f, callees, opts, None)
}

/// [`optimise_function`] with `f`'s weight parameters flagged ([`crate::hoist::weight_masks`]);
/// `None` guesses them from the parameter types.
///
/// # Errors
/// As [`saturate`].
pub fn optimise_function_with_weights(f: &Function, callees: &BTreeMap<String, Signature>, opts: &PassOptions, weights: Option<&[bool]>) -> Result<OptimisedFunction, PassError> {
    let sat = saturate_with_weights(f, callees, opts, &Phase::ALL, &[], weights)?;
    let before_ex = original_cost(f, callees, opts, weights);
    let ex: Extraction = extract::extract(&sat.egraph, sat.root, &opts.cost).map_err(|message| PassError::Extract { func: f.name.clone(), message })?;
    let function = extract::to_function(&sat.egraph, sat.root, &ex.choice, f, &sat.names).map_err(|message| PassError::Extract { func: f.name.clone(), message })?;
    Ok(OptimisedFunction {
        nodes_before: f.nodes.len(),
        nodes_after: function.nodes.len(),
        function,
        phases: sat.phases,
        snapshots: sat.snapshots,
        cost_before: before_ex,
        cost_after: ex.dag_cost,
        cost_tree_extraction: ex.tree_dag_cost,
        sharing_moves: ex.sharing_moves,
    })
}

/// The modelled cost of a function as written (each node costed once, as extraction would).
pub fn original_cost(f: &Function, callees: &BTreeMap<String, Signature>, opts: &PassOptions, weights: Option<&[bool]>) -> f64 {
    match lang::load_with_weights(f, callees, weights) {
        Ok(l) => {
            let costs = extract::NodeCosts::new(&l.egraph, &opts.cost);
            let choice: extract::Choice = l.original.iter().map(|(id, n)| (l.egraph.find(*id), n.clone())).chain(
                l.egraph.classes().filter_map(|c| c.nodes.iter().find(|n| matches!(n, lang::Sir::Param(_) | lang::Sir::Tuple(_))).map(|n| (c.id, n.clone()))),
            ).collect();
            extract::dag_cost(&l.egraph, l.root, &choice, &costs).unwrap_or(f64::NAN)
        }
        Err(_) => f64::NAN,
    }
}
