//! The fusion report: what the passes did, and Graphviz pictures of the graphs.
//!
//! [`FusionReport`]'s `Display` prints, without wall times (so that it can be snapshotted):
//! the cost configuration; per function, its size before and after, the modelled cost before
//! and after (and what a tree-cost extraction would have paid), and per saturation phase the
//! iterations, stop reason and e-graph size; the rules that fired, with counts; the kernels
//! with family, origin, ops, HBM bytes and modelled time; the totals before (one kernel per
//! node) and after; the temporary buffers and the peak of live temporary bytes; kernels per
//! origin (per layer); and the buffers that alias (`kv_append` updates its pages in place). [`FusionReport::timings`] gives the wall times;
//! [`FusionReport::layers`] the kernels per layer of the repeated block, however it is written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};

use sinter_ir::{BufferRole, Family, Function, Graph, Kernel, KernelData, KernelGraph, OpKind};

use crate::cost::{self, CostConfig};
use crate::optimise::{OptimisedFunction, PhaseStats};
use crate::PassOptions;

/// What happened to one function.
#[derive(Clone, Debug)]
pub struct FunctionReport {
    /// Its name.
    pub name: String,
    /// Nodes before.
    pub nodes_before: usize,
    /// Nodes after optimisation.
    pub nodes_after: usize,
    /// Modelled cost before (each node its own kernel), µs.
    pub cost_before_us: f64,
    /// Modelled DAG cost after extraction, µs.
    pub cost_after_us: f64,
    /// What tree-cost extraction would have paid, µs.
    pub cost_tree_extraction_us: f64,
    /// Sharing moves the extractor kept.
    pub sharing_moves: usize,
    /// Saturation phases.
    pub phases: Vec<PhaseStats>,
    /// The function after each phase (printed `.sir`).
    pub snapshots: Vec<(String, String)>,
}

impl FunctionReport {
    /// The report of an optimised function.
    pub fn from_optimised(name: &str, o: &OptimisedFunction) -> FunctionReport {
        FunctionReport {
            name: name.to_string(),
            nodes_before: o.nodes_before,
            nodes_after: o.nodes_after,
            cost_before_us: o.cost_before,
            cost_after_us: o.cost_after,
            cost_tree_extraction_us: o.cost_tree_extraction,
            sharing_moves: o.sharing_moves,
            phases: o.phases.clone(),
            snapshots: o.snapshots.iter().map(|(p, f)| (p.clone(), sinter_ir::text::print_function(f))).collect(),
        }
    }
}

/// What [`crate::lower::build_kernel_graph`] says about each kernel beyond the [`KernelGraph`].
#[derive(Clone, Debug)]
pub struct KernelMeta {
    /// Where the kernel's anchor came from (`main`, `layer#3`).
    pub origin: String,
    /// Reads only weights and load-time kernels' results ([`KernelGraph::load_time_kernels`]):
    /// run once at load time.
    pub load_time: bool,
    /// The kernel of the partition it was built from (`None`: a graph output's view copy).
    pub group: Option<usize>,
}

/// One kernel of the result.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// The kernel.
    pub kernel: Kernel,
    /// Its family.
    pub family: Family,
    /// The ops of its body, in order.
    pub ops: Vec<String>,
    /// HBM bytes read at the cost config's sizes.
    pub bytes_read: f64,
    /// HBM bytes written.
    pub bytes_written: f64,
    /// Modelled time, µs.
    pub modelled_us: f64,
    /// Where its anchor came from (`main`, `layer#3`).
    pub origin: String,
    /// Run once at load time (see [`KernelMeta::load_time`]), not counted per step.
    pub load_time: bool,
    /// Indices (into [`FusionReport::kernels`]) of the kernels that write its input buffers;
    /// filled in by [`FusionReport::new`].
    pub producers: Vec<usize>,
}

impl KernelReport {
    /// Measures a kernel of `kg`.
    pub fn new(k: Kernel, kd: &KernelData, kg: &KernelGraph, meta: &KernelMeta, cfg: &CostConfig) -> KernelReport {
        let body = &kd.body;
        let ops: Vec<String> = body.nodes.values().map(|n| n.op.kind.name().to_string()).collect();
        // Folded from 0.0: an empty `sum` of floats is −0.0 (a kernel reading nothing).
        let mut read: f64 = kd.inputs.iter().map(|b| cfg.bytes(&kg.buffers[*b].ty)).fold(0.0, |a, b| a + b);
        let mut written: f64 = kd.outputs.iter().map(|b| cfg.bytes(&kg.buffers[*b].ty)).fold(0.0, |a, b| a + b);
        let mut flops = 0.0;
        let mut tc = false;
        for nd in body.nodes.values() {
            let ins: Vec<&sinter_ir::TensorType> = nd.inputs.iter().map(|&v| body.ty(v)).collect();
            let outs: Vec<sinter_ir::TensorType> = nd.results.iter().map(|&r| body.ty(r).clone()).collect();
            flops += cost::flops(cfg, &nd.op, &ins, &outs);
            tc |= cost::uses_tensor_cores(&nd.op, &ins);
            if matches!(nd.op.kind, OpKind::PagedAttention | OpKind::Gather) {
                (read, written) = cost::op_read_write(cfg, &nd.op, &ins, &outs);
            }
            if nd.op.kind == OpKind::KvAppend {
                // The page buffers (in and out, one storage) are not streamed: only the new
                // rows are written into them (wherever the kv_append sits: its own kernel or a
                // projection's epilogue).
                let pages: f64 = ins.iter().take(2).map(|t| cfg.bytes(t)).sum();
                let new: f64 = ins.get(2..4).map(|s| s.iter().map(|t| cfg.bytes(t)).sum()).unwrap_or(0.0);
                read -= pages;
                written += new - pages;
            }
        }
        // A norm in a matmul's prologue: the small-M kernel on CUDA cores, every CTA reading
        // its rows again — from L2, so not in the HBM bytes, but in the modelled time as
        // `cost::norm_prologue_saving` counts them.
        let mut rereads = 0.0;
        let prologue = body.nodes.iter().find(|(_, nd)| nd.op.kind == OpKind::Matmul).filter(|(m, _)| sinter_ir::contract::norm_prologue(body, *m).is_some());
        if let Some((_, nd)) = prologue {
            tc = false;
            rereads = cost::norm_prologue_rereads(cfg, &nd.op, body.ty(nd.inputs[0]), body.ty(nd.results[0]));
        }
        let modelled_us = cost::kernel_us(&cfg.target, read + written + rereads, flops, tc);
        KernelReport { kernel: k, family: kd.family, ops, bytes_read: read, bytes_written: written, modelled_us, origin: meta.origin.clone(), load_time: meta.load_time, producers: vec![] }
    }
}

/// The fusion report of one [`crate::compile`].
#[derive(Clone, Debug)]
pub struct FusionReport {
    /// The cost configuration's name and sizes.
    pub cost: String,
    /// Per function.
    pub functions: Vec<FunctionReport>,
    /// Rules that changed an e-graph, summed over functions and phases.
    pub rules_fired: BTreeMap<String, usize>,
    /// Nodes of the input graph with calls inlined (what one kernel per node launches).
    pub nodes_before: usize,
    /// Kernels of [`crate::lower_unfused`] on the input graph.
    pub kernels_before: usize,
    /// HBM bytes moved by those kernels.
    pub bytes_before: f64,
    /// Their modelled time, µs.
    pub us_before: f64,
    /// The kernels after fusion.
    pub kernels: Vec<KernelReport>,
    /// `(output buffer, input buffer)` pairs that share storage on the device (`kv_append`).
    pub aliases: Vec<(String, String)>,
    /// Lifetime of every `Temp` buffer: the kernel that writes it and the last that reads it.
    pub lifetimes: Vec<BufferLifetime>,
    /// Wall time of the compile, seconds (not printed by `Display`).
    pub seconds: f64,
}

/// When a temporary buffer is live: from the kernel that writes it to the last that reads it
/// (launch-order indices), and its size at the cost config's sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferLifetime {
    /// The buffer.
    pub buffer: sinter_ir::Buffer,
    /// Index of the writing kernel.
    pub first: usize,
    /// Index of the last reading kernel (the writer's when nothing reads it).
    pub last: usize,
    /// Bytes.
    pub bytes: f64,
}

/// The lifetimes of the `Temp` buffers of `kg`.
pub fn buffer_lifetimes(kg: &KernelGraph, cfg: &CostConfig) -> Vec<BufferLifetime> {
    let mut out: BTreeMap<sinter_ir::Buffer, BufferLifetime> = BTreeMap::new();
    for (i, kd) in kg.kernels.values().enumerate() {
        for &b in &kd.outputs {
            if kg.buffers[b].role == BufferRole::Temp {
                out.entry(b).or_insert(BufferLifetime { buffer: b, first: i, last: i, bytes: cfg.bytes(&kg.buffers[b].ty) });
            }
        }
        for b in &kd.inputs {
            if let Some(l) = out.get_mut(b) {
                l.last = i;
            }
        }
    }
    out.into_values().collect()
}

/// The most temporary bytes live at once (over launch order).
pub fn peak_temp_bytes(lifetimes: &[BufferLifetime], kernels: usize) -> f64 {
    (0..kernels).map(|i| lifetimes.iter().filter(|l| l.first <= i && i <= l.last).map(|l| l.bytes).sum::<f64>()).fold(0.0, f64::max)
}

fn buffer_label(kg: &KernelGraph, b: sinter_ir::Buffer) -> String {
    match &kg.buffers[b].name {
        Some(n) => format!("{b} ({n})"),
        None => b.to_string(),
    }
}

impl FusionReport {
    /// Assembles the report.
    pub fn new(opts: &PassOptions, functions: Vec<FunctionReport>, nodes_before: usize, base: &KernelGraph, mut kernels: Vec<KernelReport>, kg: &KernelGraph, seconds: f64) -> FusionReport {
        let mut writer: BTreeMap<sinter_ir::Buffer, usize> = BTreeMap::new();
        for (i, kd) in kg.kernels.values().enumerate() {
            for &b in &kd.outputs {
                writer.entry(b).or_insert(i);
            }
        }
        for (kr, kd) in kernels.iter_mut().zip(kg.kernels.values()) {
            kr.producers = kd.inputs.iter().filter_map(|b| writer.get(b).copied()).collect();
            kr.producers.sort_unstable();
            kr.producers.dedup();
        }
        let mut rules_fired = BTreeMap::new();
        for f in &functions {
            for p in &f.phases {
                for (r, n) in &p.rules_fired {
                    *rules_fired.entry(r.clone()).or_insert(0) += n;
                }
            }
        }
        let cfg = &opts.cost;
        let meta = KernelMeta { origin: String::new(), load_time: false, group: None };
        let base_reports: Vec<KernelReport> = base.kernels.iter().map(|(k, kd)| KernelReport::new(k, kd, base, &meta, cfg)).collect();
        let mut aliases = vec![];
        for kd in kg.kernels.values() {
            for nd in kd.body.nodes.values() {
                if nd.op.kind != OpKind::KvAppend {
                    continue;
                }
                for (i, r) in nd.results.iter().enumerate() {
                    let (Some(oi), Some(ii)) = (kd.body.outputs.iter().position(|o| o == r), kd.body.params.iter().position(|p| *p == nd.inputs[i])) else { continue };
                    aliases.push((buffer_label(kg, kd.outputs[oi]), buffer_label(kg, kd.inputs[ii])));
                }
            }
        }
        let binds: Vec<String> = cfg.bindings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        FusionReport {
            cost: format!("{} ({}; other symbols {})", cfg.name, binds.join(", "), cfg.default_symbol),
            functions,
            rules_fired,
            nodes_before,
            kernels_before: base.kernels.len(),
            bytes_before: base_reports.iter().map(|k| k.bytes_read + k.bytes_written).sum(),
            us_before: base_reports.iter().map(|k| k.modelled_us).sum(),
            kernels,
            aliases,
            lifetimes: buffer_lifetimes(kg, cfg),
            seconds,
        }
    }

    /// Kernels launched per step (load-time kernels excluded).
    pub fn kernels_after(&self) -> usize {
        self.kernels.iter().filter(|k| !k.load_time).count()
    }

    /// HBM bytes per step after fusion.
    pub fn bytes_after(&self) -> f64 {
        // `+ 0.0`: an empty sum of f64 is −0.0, which would print as such.
        self.kernels.iter().filter(|k| !k.load_time).map(|k| k.bytes_read + k.bytes_written).sum::<f64>() + 0.0
    }

    /// Modelled µs per step after fusion.
    pub fn us_after(&self) -> f64 {
        self.kernels.iter().filter(|k| !k.load_time).map(|k| k.modelled_us).sum::<f64>() + 0.0
    }

    /// Kernels per origin (`main`, `layer#0`, …), load-time kernels excluded.
    pub fn kernels_per_origin(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for k in self.kernels.iter().filter(|k| !k.load_time) {
            *m.entry(k.origin.clone()).or_insert(0) += 1;
        }
        m
    }

    /// Kernels per call of `func`: the smallest count over its calls (work that every layer
    /// shares, like `positions + 1`, is merged into the first call's kernels).
    pub fn kernels_per_call(&self, func: &str) -> Option<usize> {
        let prefix = format!("{func}#");
        self.kernels_per_origin()
            .into_iter()
            .filter(|(o, _)| o.rsplit('/').next().is_some_and(|l| l.starts_with(&prefix)))
            .map(|(_, n)| n)
            .min()
    }

    /// The repeated block of the graph (a decoder's layers) and its kernels per layer, load-time
    /// kernels excluded; `None` when nothing repeats.
    ///
    /// Works for layers written as calls (nested calls included) and for layers unrolled in
    /// the entry function alike, from the kernels' ops, origins and data flow only:
    ///
    /// 1. Each kernel gets a *token*: family, ops without views, and origin with the call
    ///    indices stripped (`block/attn`). A token is *chained* when each of its occurrences
    ///    depends (transitively) on the one before, as the layers of a stack do.
    /// 2. The layer count `L` is the smallest occurrence count of chained tokens whose
    ///    kernels cover at least a quarter of the kernels; the *anchor* is the earliest
    ///    chained token occurring `L` times, or an earlier run of `L` occurrences of a
    ///    chained token that falls once in each of the first anchor's layers (so that a
    ///    layer starts at its norm, not in the middle).
    /// 3. A kernel whose outermost call is to a function called exactly `L` times belongs to
    ///    that call's layer (all of its nested calls with it); any other kernel to the last
    ///    anchor occurrence it depends on or is, or to none (work before the stack).
    /// 4. Layers are grouped into kinds by their kernels' tokens. The first and last layers
    ///    also hold the work before and after the stack (embedding, head, shared
    ///    `positions + 1`), so with three layers or more only the others are classified;
    ///    with two, one kind with the smaller count.
    pub fn layers(&self) -> Option<Layers> {
        let live: Vec<usize> = (0..self.kernels.len()).filter(|&i| !self.kernels[i].load_time).collect();
        let n = live.len();
        let mut pos = vec![usize::MAX; self.kernels.len()];
        for (p, &i) in live.iter().enumerate() {
            pos[i] = p;
        }
        let tokens: Vec<String> = live.iter().map(|&i| layer_token(&self.kernels[i])).collect();
        // Ancestors (including itself) of each kernel, as bit sets over launch positions.
        let words = n.div_ceil(64);
        let mut anc = vec![0u64; n * words];
        for p in 0..n {
            for &q in &self.kernels[live[p]].producers {
                let qp = pos[q];
                if qp < p {
                    for w in 0..words {
                        anc[p * words + w] |= anc[qp * words + w];
                    }
                }
            }
            anc[p * words + p / 64] |= 1 << (p % 64);
        }
        let depends = |a: usize, b: usize| anc[a * words + b / 64] >> (b % 64) & 1 == 1;
        let mut occ: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (p, t) in tokens.iter().enumerate() {
            occ.entry(t.as_str()).or_default().push(p);
        }
        let chained: Vec<&Vec<usize>> = occ.values().filter(|o| o.len() >= 2 && o.windows(2).all(|w| depends(w[1], w[0]))).collect();
        let mut coverage: BTreeMap<usize, usize> = BTreeMap::new();
        for o in &chained {
            *coverage.entry(o.len()).or_insert(0) += o.len();
        }
        let count = coverage.iter().find(|(_, &c)| 4 * c >= n).map(|(&l, _)| l)?;
        let first = chained.iter().filter(|o| o.len() == count).min_by_key(|o| o[0])?;
        let reach = |anchor: &[usize], p: usize| anchor.iter().rposition(|&a| a <= p && depends(p, a));
        // Any rotation of a layer repeats; the layer starts at the earliest run of `count`
        // occurrences of one token that are one per layer of the first anchor (`-1, 0, 1, …`
        // or `0, 1, …`): a norm that opens every layer rather than the residual that ends it.
        let mut anchor: &[usize] = first;
        for o in chained.iter().filter(|o| o.len() >= count) {
            let r: Vec<i64> = o.iter().map(|&p| reach(first, p).map_or(-1, |l| l as i64)).collect();
            let run = (0..=o.len() - count).find(|&s| r[s] <= 0 && r[s..s + count].windows(2).all(|w| w[1] == w[0] + 1));
            if let Some(s) = run.filter(|&s| o[s] < anchor[0]) {
                anchor = &o[s..s + count];
            }
        }
        // Outermost calls: function name -> its instances.
        let mut calls: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
        for k in &self.kernels {
            if let Some((f, i)) = outer_call(&k.origin) {
                calls.entry(f).or_default().insert(i);
            }
        }
        let mut layer_of: Vec<Option<usize>> = vec![None; n];
        for p in 0..n {
            let direct = outer_call(&self.kernels[live[p]].origin).filter(|(f, _)| calls[f].len() == count).map(|(f, i)| calls[f].range(..i).count());
            layer_of[p] = direct.or_else(|| reach(anchor, p));
        }
        let mut members: Vec<Vec<&str>> = vec![vec![]; count];
        for p in 0..n {
            if let Some(l) = layer_of[p] {
                members[l].push(tokens[p].as_str());
            }
        }
        let per_layer: Vec<usize> = members.iter().map(Vec::len).collect();
        let mut kinds: Vec<(Vec<&str>, LayerKind)> = vec![];
        if count <= 2 {
            kinds.push((vec![], LayerKind { kernels: per_layer.iter().copied().min()?, layers: (0..count).collect() }));
        } else {
            for (l, m) in members.iter_mut().enumerate().take(count - 1).skip(1) {
                m.sort_unstable();
                match kinds.iter_mut().find(|(sig, _)| sig == m) {
                    Some((_, k)) => k.layers.push(l),
                    None => kinds.push((m.clone(), LayerKind { kernels: m.len(), layers: vec![l] })),
                }
            }
        }
        Some(Layers { count, anchor: tokens[anchor[0]].clone(), kinds: kinds.into_iter().map(|(_, k)| k).collect(), per_layer })
    }

    /// How many kernels hold each composite op the passes recognise or keep (attention,
    /// rms_norm, softmax, swiglu, …).
    pub fn composite_ops(&self) -> BTreeMap<String, usize> {
        let names = ["attention", "paged_attention", "rms_norm", "layer_norm", "softmax", "log_softmax", "swiglu", "silu", "sigmoid", "rope", "rotary", "gelu"];
        let mut m = BTreeMap::new();
        for k in &self.kernels {
            for op in &k.ops {
                if names.contains(&op.as_str()) {
                    *m.entry(op.clone()).or_insert(0) += 1;
                }
            }
        }
        m
    }

    /// Wall times: the compile and every saturation phase.
    pub fn timings(&self) -> String {
        let mut s = format!("compile: {:.3} s\n", self.seconds);
        for f in &self.functions {
            for p in &f.phases {
                let _ = writeln!(s, "  @{} {}: {:.3} s", f.name, p.phase, p.seconds);
            }
        }
        s
    }

    /// The kernel graph as Graphviz DOT: kernels are boxes (family, ops), buffers ellipses
    /// (inputs green, outputs blue), edges read and write.
    pub fn to_dot(&self, kg: &KernelGraph) -> String {
        kernel_graph_dot(kg, Some(self))
    }
}

/// The repeated block of a graph, as [`FusionReport::layers`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layers {
    /// How many times the block repeats (the layers).
    pub count: usize,
    /// The token of the kernel that starts each layer (`family|ops|origin`).
    pub anchor: String,
    /// The kinds of layer, by first layer; the first and last layers are left out from three
    /// layers on.
    pub kinds: Vec<LayerKind>,
    /// Kernels attributed to each layer (the first and last hold the work around the stack).
    pub per_layer: Vec<usize>,
}

/// Layers with the same kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerKind {
    /// Kernels per layer of this kind.
    pub kernels: usize,
    /// Which layers (0-based).
    pub layers: Vec<usize>,
}

impl Layers {
    /// The kernels of the most common kind of layer (on a tie, the first kind).
    pub fn typical(&self) -> Option<usize> {
        let most = self.kinds.iter().map(|k| k.layers.len()).max()?;
        self.kinds.iter().find(|k| k.layers.len() == most).map(|k| k.kernels)
    }
}

/// `7 (12 layers)`, or with kinds `13 in layers 1-4, 6-10, 12-16; 14 in layers 5, 11 (18 layers)`.
impl fmt::Display for Layers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [k] = self.kinds.as_slice() {
            return write!(f, "{} ({} layers)", k.kernels, self.count);
        }
        let kinds: Vec<String> = self.kinds.iter().map(|k| format!("{} in layers {}", k.kernels, ranges(&k.layers))).collect();
        write!(f, "{} ({} layers)", kinds.join("; "), self.count)
    }
}

/// `1-4, 6, 8-9` for `[1, 2, 3, 4, 6, 8, 9]`.
fn ranges(v: &[usize]) -> String {
    let mut out: Vec<String> = vec![];
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j > i { format!("{}-{}", v[i], v[j]) } else { v[i].to_string() });
        i = j + 1;
    }
    out.join(", ")
}

/// A kernel's token for [`FusionReport::layers`]: family, ops without views and sources, and
/// origin without call indices.
fn layer_token(k: &KernelReport) -> String {
    let ops: Vec<&str> = k.ops.iter().map(String::as_str).filter(|o| !matches!(*o, "reshape" | "slice" | "constant" | "iota")).collect();
    let origin: String = k.origin.split('/').map(|c| c.split_once('#').map_or(c, |(f, _)| f)).collect::<Vec<_>>().join("/");
    format!("{}|{}|{origin}", k.family.name(), ops.join(" "))
}

/// The outermost call of an origin (`block#3/attn#3` -> `("block", 3)`); `None` for the
/// entry function.
fn outer_call(origin: &str) -> Option<(&str, usize)> {
    let first = origin.split('/').next()?;
    let (f, i) = first.split_once('#')?;
    Some((f, i.parse().ok()?))
}

fn mb(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

impl fmt::Display for FusionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fusion report — cost model: {}", self.cost)?;
        for fr in &self.functions {
            writeln!(
                f,
                "@{}: {} nodes -> {} nodes; modelled {:.1} us -> {:.1} us (tree extraction: {:.1} us; sharing moves: {})",
                fr.name, fr.nodes_before, fr.nodes_after, fr.cost_before_us, fr.cost_after_us, fr.cost_tree_extraction_us, fr.sharing_moves
            )?;
            writeln!(f, "  {:<12} {:>5}  {:<22} {:>8} {:>9}", "phase", "iters", "stop reason", "e-nodes", "e-classes")?;
            for p in &fr.phases {
                writeln!(f, "  {:<12} {:>5}  {:<22} {:>8} {:>9}", p.phase, p.iterations, p.stop_reason, p.egraph_nodes, p.egraph_classes)?;
            }
        }
        writeln!(f, "rules fired:")?;
        for (r, n) in &self.rules_fired {
            writeln!(f, "  {r:<26} {n:>5}")?;
        }
        writeln!(
            f,
            "kernels: {} nodes -> {} kernels unfused -> {} kernels fused ({} load-time); HBM {} -> {}; modelled {:.1} us -> {:.1} us",
            self.nodes_before,
            self.kernels_before,
            self.kernels_after(),
            self.kernels.len() - self.kernels_after(),
            mb(self.bytes_before),
            mb(self.bytes_after()),
            self.us_before,
            self.us_after()
        )?;
        writeln!(f, "  {:<5} {:<15} {:<10} {:>10} {:>10} {:>9}  ops", "id", "family", "origin", "read", "written", "us")?;
        for k in &self.kernels {
            let ops = if k.ops.len() > 12 { format!("{} … ({} ops)", k.ops[..12].join(" "), k.ops.len()) } else { k.ops.join(" ") };
            writeln!(
                f,
                "  {:<5} {:<15} {:<10} {:>10} {:>10} {:>9.2}  {}{}",
                k.kernel.to_string(),
                k.family.name(),
                k.origin,
                mb(k.bytes_read),
                mb(k.bytes_written),
                k.modelled_us,
                ops,
                if k.load_time { "  [load-time]" } else { "" }
            )?;
        }
        writeln!(
            f,
            "temporary buffers: {}; peak live temporaries {}",
            self.lifetimes.len(),
            mb(peak_temp_bytes(&self.lifetimes, self.kernels.len()))
        )?;
        let per: Vec<String> = self.kernels_per_origin().into_iter().map(|(o, n)| format!("{o}: {n}")).collect();
        writeln!(f, "kernels per origin: {}", per.join(", "))?;
        let comp: Vec<String> = self.composite_ops().into_iter().map(|(o, n)| format!("{o} ×{n}")).collect();
        writeln!(f, "composite ops in kernels: {}", comp.join(", "))?;
        if !self.aliases.is_empty() {
            let a: Vec<String> = self.aliases.iter().map(|(o, i)| format!("{o} = {i}")).collect();
            writeln!(f, "aliases (updated in place): {}", a.join(", "))?;
        }
        Ok(())
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A kernel graph as Graphviz DOT (see [`FusionReport::to_dot`]).
pub fn kernel_graph_dot(kg: &KernelGraph, report: Option<&FusionReport>) -> String {
    let mut s = String::from("digraph kernels {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n");
    for (b, bd) in kg.buffers.iter() {
        let color = match bd.role {
            BufferRole::Input => "palegreen",
            BufferRole::Output => "lightblue",
            BufferRole::Temp => "white",
        };
        let name = bd.name.clone().unwrap_or_default();
        let _ = writeln!(s, "  {b} [shape=ellipse, style=filled, fillcolor={color}, label=\"{b} {}\\n{}\"];", esc(&name), esc(&bd.ty.to_string()));
    }
    for (k, kd) in kg.kernels.iter() {
        let ops: Vec<&str> = kd.body.nodes.values().map(|n| n.op.kind.name()).collect();
        let extra = report.and_then(|r| r.kernels.get(k.as_u32() as usize)).map(|kr| format!("\\n{} {:.1} us", kr.origin, kr.modelled_us)).unwrap_or_default();
        let _ = writeln!(s, "  {k} [shape=box, style=filled, fillcolor=lightyellow, label=\"{k} {}\\n{}{}\"];", kd.family.name(), esc(&ops.join(" ")), extra);
        for b in &kd.inputs {
            let _ = writeln!(s, "  {b} -> {k};");
        }
        for b in &kd.outputs {
            let _ = writeln!(s, "  {k} -> {b};");
        }
    }
    s.push_str("}\n");
    s
}

/// One function of a graph as Graphviz DOT: parameters and nodes, edges by operand.
pub fn function_dot(f: &Function) -> String {
    let mut s = format!("digraph \"{}\" {{\n  node [fontname=\"monospace\", fontsize=10];\n", esc(&f.name));
    for &p in &f.params {
        let _ = writeln!(s, "  {p} [shape=ellipse, style=filled, fillcolor=palegreen, label=\"{}\\n{}\"];", esc(&f.label(p)), esc(&f.ty(p).to_string()));
    }
    for (n, nd) in f.nodes.iter() {
        let tys: Vec<String> = nd.results.iter().map(|&r| f.ty(r).to_string()).collect();
        let _ = writeln!(s, "  {n} [shape=box, label=\"{} {}\\n{}\"];", n, nd.op.kind.name(), esc(&tys.join(", ")));
        for &v in &nd.inputs {
            match f.values[v].def {
                sinter_ir::ValueDef::Param(_) => {
                    let _ = writeln!(s, "  {v} -> {n};");
                }
                sinter_ir::ValueDef::Result(m, _) => {
                    let _ = writeln!(s, "  {m} -> {n};");
                }
            }
        }
    }
    s.push_str("}\n");
    s
}

/// Every function of a graph as DOT, one digraph after another.
pub fn graph_dot(g: &Graph) -> String {
    g.funcs.values().map(function_dot).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile, PassOptions};
    use sinter_ir::Target;

    fn report(text: &str) -> FusionReport {
        let g = sinter_ir::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        compile(&g, &Target::SM_90A, &PassOptions::default()).unwrap().1
    }

    /// A graph with no kernel to launch reports zero bytes and time, not −0.0.
    #[test]
    fn nothing_to_launch_prints_zero_not_negative_zero() {
        let r = report("func @f(%x: f32[T, 16]) {\n  %i: i32[T, 0] = iota() {dtype=i32, shape=[T, 0]}\n  return %x\n}\n");
        let text = r.to_string();
        assert!(!text.contains("-0.0"), "{text}");
        assert!(r.bytes_after().is_sign_positive() && r.us_after().is_sign_positive(), "{text}");
    }

    /// A stack of `kinds.len()` layers unrolled in `@main`: RMSNorm, a projection and the
    /// residual; a layer of kind `true` has a second projection. Then a final norm and head.
    fn unrolled(kinds: &[bool]) -> String {
        let mut params = vec!["%x0: bf16[T, 64]".to_string(), "%nf: bf16[64]".into(), "%head: bf16[64, 256]".into()];
        let mut body = String::new();
        for (i, &big) in kinds.iter().enumerate() {
            params.push(format!("%n{i}: bf16[64], %w{i}: bf16[64, 64], %v{i}: bf16[64, 64]"));
            body += &format!("  %h{i}: bf16[T, 64] = rms_norm(%x{i}, %n{i}) {{eps=1e-5}}\n  %m{i}: bf16[T, 64] = matmul(%h{i}, %w{i})\n");
            let y = if big {
                body += &format!("  %p{i}: bf16[T, 64] = matmul(%m{i}, %v{i})\n");
                format!("%p{i}")
            } else {
                format!("%m{i}")
            };
            body += &format!("  %x{}: bf16[T, 64] = add(%x{i}, {y})\n", i + 1);
        }
        let l = kinds.len();
        format!("func @main({}) {{\n{body}  %o: bf16[T, 64] = rms_norm(%x{l}, %nf) {{eps=1e-5}}\n  %logits: bf16[T, 256] = matmul(%o, %head)\n  return %logits\n}}\n", params.join(", "))
    }

    /// `n` calls of `@block`, which calls `@norm` and `@proj` (two projections): nested calls.
    fn nested(n: usize) -> String {
        let mut params = vec!["%x0: bf16[T, 64]".to_string()];
        let mut body = String::new();
        for i in 0..n {
            params.push(format!("%n{i}: bf16[64], %w{i}: bf16[64, 64], %v{i}: bf16[64, 64]"));
            body += &format!("  %x{}: bf16[T, 64] = call(%x{i}, %n{i}, %w{i}, %v{i}) {{func=\"block\"}}\n", i + 1);
        }
        format!(
            "func @norm(%x: bf16[T, 64], %n: bf16[64]) {{
  %h: bf16[T, 64] = rms_norm(%x, %n) {{eps=1e-5}}
  return %h
}}
func @proj(%h: bf16[T, 64], %w: bf16[64, 64], %v: bf16[64, 64]) {{
  %m: bf16[T, 64] = matmul(%h, %w)
  %e: bf16[T, 64] = exp(%m)
  %s: bf16[T, 64] = softmax(%e) {{axis=-1}}
  %p: bf16[T, 64] = matmul(%s, %v)
  return %p
}}
func @block(%x: bf16[T, 64], %n: bf16[64], %w: bf16[64, 64], %v: bf16[64, 64]) {{
  %h: bf16[T, 64] = call(%x, %n) {{func=\"norm\"}}
  %p: bf16[T, 64] = call(%h, %w, %v) {{func=\"proj\"}}
  %y: bf16[T, 64] = add(%x, %p)
  return %y
}}
func @main({}) {{
{body}  return %x{n}
}}
",
            params.join(", ")
        )
    }

    /// Kernels one more layer adds: the independent measure the counts are checked against.
    fn added(build: &dyn Fn(usize) -> String, n: usize) -> usize {
        report(&build(n + 1)).kernels_after() - report(&build(n)).kernels_after()
    }

    #[test]
    fn nested_calls_count_with_their_layer() {
        let want = added(&nested, 4);
        let r = report(&nested(4));
        let layers = r.layers().expect("four blocks repeat");
        assert_eq!(layers.count, 4, "{layers:?}\n{r}");
        assert_eq!(layers.kinds, [LayerKind { kernels: want, layers: vec![1, 2] }], "{r}");
        // The nested calls' kernels are in the block (the old count saw only @block's own).
        assert!(r.kernels.iter().any(|k| k.origin.contains('/')), "{r}");
        assert_eq!(layers.typical(), Some(want));
        assert_eq!(layers.to_string(), format!("{want} (4 layers)"));
    }

    #[test]
    fn unrolled_layers_are_found_from_the_kernels() {
        let build = |n: usize| unrolled(&vec![false; n]);
        let want = added(&build, 5);
        let r = report(&build(5));
        assert!(r.kernels.iter().all(|k| k.origin == "main"));
        let layers = r.layers().expect("five unrolled layers repeat");
        assert_eq!(layers.count, 5, "{layers:?}\n{r}");
        assert_eq!(layers.kinds, [LayerKind { kernels: want, layers: vec![1, 2, 3] }], "{r}");
        // Every kernel but the embedding-free prefix is in some layer.
        assert!(layers.per_layer.iter().sum::<usize>() <= r.kernels_after());
    }

    #[test]
    fn two_kinds_of_layer_are_reported_apart() {
        let kinds: Vec<bool> = (0..7).map(|i| i % 3 == 2).collect();
        let small = added(&|n| unrolled(&vec![false; n]), 3);
        let big = added(&|n| unrolled(&vec![true; n]), 3);
        assert!(big > small, "a second projection adds a kernel");
        let r = report(&unrolled(&kinds));
        let layers = r.layers().expect("seven layers repeat");
        assert_eq!(layers.count, 7, "{layers:?}\n{r}");
        assert_eq!(layers.kinds, [LayerKind { kernels: small, layers: vec![1, 3, 4] }, LayerKind { kernels: big, layers: vec![2, 5] }], "{r}");
        assert_eq!(layers.typical(), Some(small));
        assert_eq!(layers.to_string(), format!("{small} in layers 1, 3-4; {big} in layers 2, 5 (7 layers)"));
    }

    #[test]
    fn a_graph_without_layers_has_none() {
        let r = report(
            "func @main(%x: bf16[T, 64], %w: bf16[64, 64]) {
  %m: bf16[T, 64] = matmul(%x, %w)
  %s: bf16[T, 64] = softmax(%m) {axis=-1}
  return %s
}",
        );
        assert_eq!(r.layers(), None, "{r}");
        // Two independent kernels of one kind are not a stack: they do not depend on each other.
        let r = report(
            "func @main(%x: bf16[T, 64], %y: bf16[T, 64], %w: bf16[64, 64]) {
  %a: bf16[T, 64] = matmul(%x, %w)
  %b: bf16[T, 64] = matmul(%y, %w)
  return %a, %b
}",
        );
        assert_eq!(r.layers(), None, "{r}");
    }

    #[test]
    fn ranges_are_compact() {
        assert_eq!(ranges(&[1, 2, 3, 4, 6, 8, 9]), "1-4, 6, 8-9");
        assert_eq!(ranges(&[]), "");
    }
}
