//! `sinter-passes`: from a [`Graph`] to a [`KernelGraph`] by equality saturation.
//!
//! The pipeline of [`compile`] (one pass, one file):
//!
//! 0. [`decompose`] — an `attention` / `paged_attention` the code generator refuses for the
//!    target (a head dim over 256, …) is written as its decomposition.
//!    Then [`specialise`]: a callee given an argument of known construction (a mask or
//!    rotary tables built once in the caller) gets a copy that builds it inside, where the
//!    cost model prefers that.
//! 1. [`lang`] — each function of the graph enters an e-graph whose language is generated
//!    from the op table, with an analysis carrying every class's type and known constant.
//! 2. [`rules`] — rule families ([`rules::algebraic`], [`rules::recognition`],
//!    [`rules::fusion`]) run in phases by [`optimise`] under explicit limits; a decoder layer
//!    defined once is optimised once.
//! 3. [`extract`] — DAG-aware extraction under the [`cost`] model picks the cheapest graph.
//! 4. [`lower`] — calls are inlined with the optimised bodies, [`hoist`] finds the work on
//!    weights and constants that runs once at load time, the flat function is split into
//!    kernels by [`partition`] (pointwise chains, matmul epilogues, row-reduction prologues and
//!    epilogues; never a load-time node with a per-step one), and a [`KernelGraph`] is built,
//!    its load-time kernels marked.
//! 5. [`report`] — the fusion report: rules fired, stop reasons, e-graph sizes, kernels with
//!    their families, ops and bytes, before and after; Graphviz output.
//!
//! [`compile`] compiles for a [`Target`]: the cost model takes its figures, and under
//! [`PassOptions::codegen_contract`] (the default) every kernel is checked against the kernel
//! contract ([`sinter_ir::contract`]: which bodies each generator of `sinter-codegen` accepts
//! on that target).
//!
//! [`check`] evaluates every e-node of a saturated e-graph on the interpreter: the soundness
//! check of every rule. [`lower_unfused`] gives the one-kernel-per-node graph that the fused
//! one is compared with.
#![warn(missing_docs)]

pub mod check;
pub mod cost;
pub mod decompose;
pub mod eval;
pub mod expand;
pub mod extract;
pub mod hoist;
pub mod lang;
pub mod lower;
pub mod optimise;
pub mod partition;
pub mod report;
pub mod rules;
pub mod shard;
pub mod specialise;

use std::collections::BTreeSet;
use std::time::Duration;

pub use cost::CostConfig;
pub use lower::{compile, lower_unfused};
pub use report::FusionReport;
pub use sinter_ir::{Graph, KernelGraph, Target};

/// Limits of one saturation phase (each phase gets them afresh).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Iterations of the runner.
    pub iterations: usize,
    /// E-nodes; egg checks between rules, so it may overshoot by one rule's additions.
    pub nodes: usize,
    /// Wall time.
    pub time: Duration,
}

impl Default for Limits {
    /// 30 iterations, 50,000 e-nodes, 2 seconds per phase.
    fn default() -> Limits {
        Limits { iterations: 30, nodes: 50_000, time: Duration::from_secs(2) }
    }
}

/// Options of [`compile`].
#[derive(Clone, Debug, PartialEq)]
pub struct PassOptions {
    /// The sizes and device the cost model uses.
    pub cost: CostConfig,
    /// Saturation limits per phase.
    pub limits: Limits,
    /// Offer the merge of parallel matmuls sharing an input (extraction still decides).
    pub merge_parallel_matmuls: bool,
    /// Fuse kernels after extraction (pointwise chains, epilogues, prologues); off gives one
    /// kernel per node of the optimised graph.
    pub fuse: bool,
    /// Extract after every phase (for the IR-after-each-pass snapshots); off extracts once.
    pub snapshots: bool,
    /// Fuse only into kernel bodies the code generator accepts ([`sinter_ir::contract`]): matmul
    /// epilogues element-wise on the full output, attention and matmul operands written to
    /// buffers by a kernel, every kernel checked. Off gives the unconstrained fusion (whose
    /// kernels the interpreter runs but `sinter-codegen` may refuse).
    pub codegen_contract: bool,
    /// The entry function's parameters that are weights, by name: bound once and the same at
    /// every step, so that work depending only on them and on constants is hoisted to load
    /// time ([`hoist`]). `None` (the default) guesses them ([`hoist::infer_weights`]: the
    /// parameters of a constant shape and a float or storage dtype, when some parameter's
    /// shape has a symbol).
    pub weights: Option<BTreeSet<String>>,
}

impl PassOptions {
    /// The defaults with the cost configuration chosen for `g` ([`CostConfig::for_graph`]).
    pub fn for_graph(g: &Graph) -> PassOptions {
        PassOptions { cost: CostConfig::for_graph(g), ..PassOptions::default() }
    }
}

impl Default for PassOptions {
    fn default() -> PassOptions {
        PassOptions { cost: CostConfig::prefill(), limits: Limits::default(), merge_parallel_matmuls: true, fuse: true, snapshots: false, codegen_contract: true, weights: None }
    }
}

/// Why the passes could not compile a graph.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PassError {
    /// The input graph does not verify.
    #[error("the graph does not verify: {0}")]
    Verify(#[from] sinter_ir::VerifyError),
    /// A function could not be loaded into the e-graph.
    #[error("@{func}: cannot load into the e-graph: {message}")]
    Load {
        /// The function.
        func: String,
        /// What was wrong.
        message: String,
    },
    /// A rule tried to unify values of different types or constants: a bug of that rule.
    #[error("@{func}, phase {phase}: unsound rewrite refused: {conflict}")]
    Unsound {
        /// The function.
        func: String,
        /// The phase.
        phase: &'static str,
        /// The rule, the e-class and both sides.
        conflict: String,
    },
    /// Extraction found no acyclic choice (a bug).
    #[error("@{func}: extraction failed: {message}")]
    Extract {
        /// The function.
        func: String,
        /// What was wrong.
        message: String,
    },
    /// The graph could not be lowered to kernels.
    #[error("lowering: {0}")]
    Lower(String),
}
