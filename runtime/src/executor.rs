//! [`Executor`]: runs a whole [`KernelGraph`] — one [`LaunchPlan`] per kernel — on a
//! [`Device`], with per-kernel timing ([`Executor::run_profiled`]) and CUDA graph capture
//! ([`Executor::capture`]).
//!
//! Buffers: the caller passes the graph's inputs as device buffers (by position or by name);
//! the executor allocates outputs and temporaries from the device's pool with sizes from the
//! buffers' shapes and layouts under the bindings, launches the kernels in order on the
//! device's stream, and returns the outputs. A temporary goes back to the pool right after the
//! last kernel using it is enqueued (safe: the stream runs in order).
//!
//! Bindings: every symbol of an input's shape that is a bare symbol (`T`, not `T+1`) is bound
//! from the buffer passed; other symbols must come with the caller's bindings. A binding that
//! disagrees with an input's shape is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use sinter_ir::{Bindings, Buffer, BufferData, BufferRole, Dim, Kernel, KernelData, KernelGraph, LaunchPlan};

use crate::buffer::DeviceBuffer;
use crate::device::{Device, LoadedKernel};
use crate::error::RuntimeError;
use crate::launch::{max_buffer_index, resolve, ResolvedLaunch};

/// One kernel's time in a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel.
    pub kernel: Kernel,
    /// Its entry point.
    pub entry: String,
    /// Device time between CUDA events recorded just before and after its launch, in
    /// microseconds.
    pub micros: f64,
}

/// Per-kernel device times of one run ([`Executor::run_profiled`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Kernels in launch order.
    pub kernels: Vec<KernelTime>,
    /// From the first kernel's start event to the last kernel's end event, in microseconds.
    pub total_micros: f64,
}

impl std::fmt::Display for Profile {
    /// One line per kernel (`k0  entry  12.3 us  45.6%`), then the total.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total = self.total_micros.max(f64::MIN_POSITIVE);
        for k in &self.kernels {
            writeln!(f, "{:<5} {:<40} {:>10.2} us {:>6.1}%", k.kernel.to_string(), k.entry, k.micros, 100.0 * k.micros / total)?;
        }
        write!(f, "total {:>57.2} us", self.total_micros)
    }
}

/// A [`KernelGraph`] with its launch plans, loaded on a device and ready to run.
pub struct Executor {
    device: Device,
    graph: KernelGraph,
    plans: Vec<LaunchPlan>,
    loaded: Vec<Arc<LoadedKernel>>,
    output_guard: Option<(usize, u8)>,
    checked: bool,
    /// Outputs that update another buffer in place → that buffer's storage root.
    aliases: BTreeMap<Buffer, Buffer>,
}

/// The in-place updates of a kernel graph (`kv_append` results sharing their page inputs'
/// storage): [`KernelGraph::in_place_aliases`].
pub fn in_place_aliases(graph: &KernelGraph) -> BTreeMap<Buffer, Buffer> {
    graph.in_place_aliases()
}

/// What one execution set up: the buffer of every graph buffer that has one.
pub(crate) struct Prepared {
    pub(crate) bindings: Bindings,
    pub(crate) slots: BTreeMap<Buffer, DeviceBuffer>,
    /// For each temporary, the index of the last kernel that uses it.
    pub(crate) last_use: BTreeMap<Buffer, usize>,
}

enum Mode {
    Run,
    Profile,
    Capture,
}

impl Executor {
    /// Checks that `plans` fit `graph` (one per kernel, in order; buffer parameters within each
    /// kernel's buffers) and loads every plan on `device` (JIT-compiling its PTX).
    ///
    /// # Errors
    /// [`RuntimeError::Graph`] when the plans do not fit; as [`Device::load`].
    pub fn new(device: &Device, graph: &KernelGraph, plans: Vec<LaunchPlan>) -> Result<Executor, RuntimeError> {
        if plans.len() != graph.kernels.len() {
            return Err(RuntimeError::Graph(format!("{} launch plans for {} kernels", plans.len(), graph.kernels.len())));
        }
        for ((k, data), plan) in graph.kernels.iter().zip(&plans) {
            let have = data.inputs.len() + data.outputs.len();
            if let Some(top) = max_buffer_index(plan).filter(|&top| top >= have) {
                return Err(RuntimeError::Graph(format!("plan `{}` of {k} uses buffer {top} but the kernel has {have}", plan.entry)));
            }
            for b in data.inputs.iter().chain(&data.outputs) {
                if graph.buffers.get(*b).is_none() {
                    return Err(RuntimeError::Graph(format!("{k} uses {b}, which the graph does not have")));
                }
            }
        }
        for b in graph.inputs.iter().chain(&graph.outputs) {
            if graph.buffers.get(*b).is_none() {
                return Err(RuntimeError::Graph(format!("graph input/output {b} is not a buffer of the graph")));
            }
        }
        let loaded = device.load_all(&plans)?;
        Ok(Executor { device: device.clone(), graph: graph.clone(), plans, loaded, output_guard: None, checked: false, aliases: in_place_aliases(graph) })
    }

    /// Allocates every output with at least `bytes` guard bytes past its extent and fills each
    /// output's whole block with `pattern` before the kernels run, so that afterwards
    /// [`Device::guard_violation`] tells whether a kernel wrote past an output (and elements
    /// still equal to the pattern show what was never written).
    pub fn with_output_guard(mut self, bytes: usize, pattern: u8) -> Executor {
        self.output_guard = Some((bytes, pattern));
        self
    }

    /// In checked mode the stream is synchronised after every kernel, so a fault is reported
    /// with the exact kernel that caused it (slow; for debugging and tests).
    pub fn checked(mut self, on: bool) -> Executor {
        self.checked = on;
        self
    }

    /// The device this executor runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The kernel graph.
    pub fn graph(&self) -> &KernelGraph {
        &self.graph
    }

    /// The launch plans, one per kernel in launch order.
    pub fn plans(&self) -> &[LaunchPlan] {
        &self.plans
    }

    /// The loaded kernels, in launch order (registers, spills: [`LoadedKernel::attributes`]).
    pub fn kernels(&self) -> &[Arc<LoadedKernel>] {
        &self.loaded
    }

    /// The graph's input names in order (`None` for an unnamed input).
    pub fn input_names(&self) -> Vec<Option<&str>> {
        self.graph.inputs.iter().map(|b| self.graph.buffers[*b].name.as_deref()).collect()
    }

    /// `extra` plus every binding implied by the inputs' shapes (see the module docs).
    ///
    /// # Errors
    /// [`RuntimeError::Graph`] for a wrong number of inputs; [`RuntimeError::Buffer`] when an
    /// input's dtype, rank or a dimension disagrees with the graph; [`RuntimeError::Dim`] when
    /// a dimension cannot be evaluated.
    pub fn bindings(&self, inputs: &[&DeviceBuffer], extra: &Bindings) -> Result<Bindings, RuntimeError> {
        if inputs.len() != self.graph.inputs.len() {
            return Err(RuntimeError::Graph(format!("{} inputs given, the graph takes {}", inputs.len(), self.graph.inputs.len())));
        }
        let mut bindings = extra.clone();
        for (b, buf) in self.graph.inputs.iter().zip(inputs) {
            let data = &self.graph.buffers[*b];
            let label = buffer_label(*b, data);
            if buf.dtype() != data.ty.dtype {
                return Err(RuntimeError::Buffer(format!("input {label} is {}, the graph expects {}", buf.dtype(), data.ty.dtype)));
            }
            if buf.shape().len() != data.ty.shape.len() {
                return Err(RuntimeError::Buffer(format!("input {label} has shape {:?}, the graph expects {}", buf.shape(), data.ty)));
            }
            for (dim, &actual) in data.ty.shape.iter().zip(buf.shape()) {
                if let Some(sym) = dim.as_symbol() {
                    bindings.entry(sym.to_string()).or_insert(actual as i64);
                }
            }
        }
        for (b, buf) in self.graph.inputs.iter().zip(inputs) {
            let data = &self.graph.buffers[*b];
            let label = buffer_label(*b, data);
            let want = eval_shape(&data.ty.shape, &bindings, &label)?;
            if want != buf.shape() {
                return Err(RuntimeError::Buffer(format!("input {label} has shape {:?}, the graph expects {} = {want:?}", buf.shape(), data.ty)));
            }
            let extent = extent_bytes(data, &want, &bindings, &label)?;
            if buf.len_bytes() < extent {
                return Err(RuntimeError::Buffer(format!("input {label} holds {} bytes, its layout spans {extent}", buf.len_bytes())));
            }
        }
        Ok(bindings)
    }

    /// Orders named inputs as the graph's inputs.
    pub(crate) fn order_named<'a>(&self, inputs: &[(&str, &'a DeviceBuffer)]) -> Result<Vec<&'a DeviceBuffer>, RuntimeError> {
        let names = self.input_names();
        for (n, _) in inputs {
            if !names.contains(&Some(n)) {
                return Err(RuntimeError::Graph(format!("the graph has no input named `{n}`")));
            }
        }
        names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let name = name.ok_or_else(|| RuntimeError::Graph(format!("input {i} has no name; pass inputs by position")))?;
                inputs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| RuntimeError::Graph(format!("input `{name}` is missing")))
            })
            .collect()
    }

    /// Runs the graph on `inputs` (in the graph's input order) and returns its outputs, after
    /// waiting for the device.
    ///
    /// # Errors
    /// As [`Executor::bindings`]; [`RuntimeError::OutOfMemory`]; launch errors; a kernel's
    /// fault as [`RuntimeError::Cuda`] naming the kernel(s).
    pub fn run(&self, inputs: &[&DeviceBuffer], bindings: &Bindings) -> Result<Vec<DeviceBuffer>, RuntimeError> {
        self.execute(inputs, bindings, Mode::Run).map(|(o, _, _)| o)
    }

    /// [`Executor::run`] with inputs by name.
    ///
    /// # Errors
    /// [`RuntimeError::Graph`] for a missing, unknown or unnamed input; as [`Executor::run`].
    pub fn run_named(&self, inputs: &[(&str, &DeviceBuffer)], bindings: &Bindings) -> Result<Vec<DeviceBuffer>, RuntimeError> {
        let ordered = self.order_named(inputs)?;
        self.run(&ordered, bindings)
    }

    /// [`Executor::run`], timing each kernel with CUDA events (for `--profile`).
    ///
    /// # Errors
    /// As [`Executor::run`].
    pub fn run_profiled(&self, inputs: &[&DeviceBuffer], bindings: &Bindings) -> Result<(Vec<DeviceBuffer>, Profile), RuntimeError> {
        self.execute(inputs, bindings, Mode::Profile).map(|(o, p, _)| (o, p.unwrap_or_default()))
    }

    /// Captures one run of the graph on `inputs` as a CUDA graph, without running it.
    ///
    /// The graph bakes in every device address and every value computed from `bindings`
    /// (grid sizes, size parameters), so:
    /// - it reads the *same input buffers* on every replay: write new values into them
    ///   ([`Device::write_bytes`] & co.) between replays — values that change every decode
    ///   step (position, sequence length, token ids) belong in device buffers the kernels read;
    /// - it writes the same output buffers ([`CapturedGraph::outputs`]) on every replay;
    /// - a different binding (another batch size) needs another capture.
    ///
    /// The captured graph keeps its inputs, temporaries and outputs alive.
    ///
    /// # Errors
    /// As [`Executor::run`] (except kernel faults, which show at replay), and
    /// [`RuntimeError::Cuda`] when capture or instantiation fails;
    /// [`RuntimeError::Graph`] for a graph with no kernels.
    pub fn capture(&self, inputs: &[&DeviceBuffer], bindings: &Bindings) -> Result<CapturedGraph, RuntimeError> {
        if self.graph.kernels.is_empty() {
            return Err(RuntimeError::Graph("a graph with no kernels cannot be captured".into()));
        }
        let (outputs, _, captured) = self.execute(inputs, bindings, Mode::Capture)?;
        let (graph, keep, bindings) = captured.ok_or_else(|| RuntimeError::Graph("capture produced no graph".into()))?;
        Ok(CapturedGraph { graph, device: self.device.clone(), outputs, _keep: keep, entries: self.plans.iter().map(|p| p.entry.clone()).collect(), bindings, persistent: None })
    }

    /// [`Executor::run_profiled`] with inputs by name.
    ///
    /// # Errors
    /// As [`Executor::run_named`].
    pub fn run_profiled_named(&self, inputs: &[(&str, &DeviceBuffer)], bindings: &Bindings) -> Result<(Vec<DeviceBuffer>, Profile), RuntimeError> {
        let ordered = self.order_named(inputs)?;
        self.run_profiled(&ordered, bindings)
    }

    /// [`Executor::capture`] with inputs by name.
    ///
    /// # Errors
    /// [`RuntimeError::Graph`] for a missing, unknown or unnamed input; as [`Executor::capture`].
    pub fn capture_named(&self, inputs: &[(&str, &DeviceBuffer)], bindings: &Bindings) -> Result<CapturedGraph, RuntimeError> {
        let ordered = self.order_named(inputs)?;
        self.capture(&ordered, bindings)
    }

    /// A buffer's storage: itself, or the buffer it aliases (see [`in_place_aliases`]).
    fn root(&self, b: Buffer) -> Buffer {
        self.aliases.get(&b).copied().unwrap_or(b)
    }

    /// The slot of `b`, allocating (or sharing its alias root's storage) on first use.
    pub(crate) fn slot(&self, b: Buffer, slots: &mut BTreeMap<Buffer, DeviceBuffer>, bindings: &Bindings, guard: usize) -> Result<DeviceBuffer, RuntimeError> {
        if let Some(buf) = slots.get(&b) {
            return Ok(buf.clone());
        }
        let r = self.root(b);
        let buf = match slots.get(&r) {
            Some(buf) => buf.clone(),
            None => {
                let buf = self.allocate(r, bindings, guard)?;
                slots.insert(r, buf.clone());
                buf
            }
        };
        slots.insert(b, buf.clone());
        Ok(buf)
    }

    pub(crate) fn prepare(&self, inputs: &[&DeviceBuffer], extra: &Bindings) -> Result<Prepared, RuntimeError> {
        let bindings = self.bindings(inputs, extra)?;
        let mut slots = BTreeMap::new();
        for (b, buf) in self.graph.inputs.iter().zip(inputs) {
            slots.insert(*b, (*buf).clone());
        }
        // Outputs that update a buffer in place share its storage.
        for b in &self.graph.outputs {
            if self.aliases.contains_key(b) {
                self.slot(*b, &mut slots, &bindings, 0)?;
            }
        }
        let (guard, pattern) = self.output_guard.unwrap_or((0, 0));
        for b in &self.graph.outputs {
            if slots.contains_key(b) {
                continue;
            }
            let buf = self.allocate(*b, &bindings, guard)?;
            if self.output_guard.is_some() {
                self.device.poison(&buf, pattern)?;
            }
            slots.insert(*b, buf);
        }
        let mut last_use = BTreeMap::new();
        for (i, (_, data)) in self.graph.kernels.iter().enumerate() {
            for b in data.inputs.iter().chain(&data.outputs) {
                if !slots.contains_key(b) {
                    last_use.insert(*b, i);
                }
            }
        }
        Ok(Prepared { bindings, slots, last_use })
    }

    fn allocate(&self, b: Buffer, bindings: &Bindings, guard: usize) -> Result<DeviceBuffer, RuntimeError> {
        let data = &self.graph.buffers[b];
        let label = buffer_label(b, data);
        let shape = eval_shape(&data.ty.shape, bindings, &label)?;
        let extent = extent_bytes(data, &shape, bindings, &label)?;
        self.device.alloc_extent(data.ty.dtype, &shape, extent, guard)
    }

    /// Whether kernel `i` has anything to compute under `bindings`
    /// ([`KernelGraph::has_work`]).
    fn has_work(&self, i: usize, bindings: &Bindings) -> Result<bool, RuntimeError> {
        let k = Kernel::from_u32(i as u32);
        self.graph.has_work(k, &self.plans[i], bindings).map_err(|source| RuntimeError::Dim { what: format!("the grid or outputs of kernel `{}`", self.plans[i].entry), source })
    }

    fn resolve_kernel(&self, i: usize, data: &KernelData, slots: &BTreeMap<Buffer, DeviceBuffer>, bindings: &Bindings) -> Result<ResolvedLaunch, RuntimeError> {
        let ptrs = data
            .inputs
            .iter()
            .chain(&data.outputs)
            .map(|b| slots.get(b).map(DeviceBuffer::device_ptr).ok_or_else(|| RuntimeError::Graph(format!("{b} has no buffer"))))
            .collect::<Result<Vec<_>, _>>()?;
        let r = resolve(&self.plans[i], &ptrs, bindings)?;
        self.device.prepare_shared(&self.loaded[i], r.shared_bytes)?;
        Ok(r)
    }

    #[allow(clippy::type_complexity)]
    fn execute(&self, inputs: &[&DeviceBuffer], extra: &Bindings, mode: Mode) -> Result<(Vec<DeviceBuffer>, Option<Profile>, Option<(CudaGraph, Vec<DeviceBuffer>, Bindings)>), RuntimeError> {
        let Prepared { bindings, mut slots, last_use } = self.prepare(inputs, extra)?;
        let kernel_ids: Vec<Kernel> = self.graph.kernels.keys().collect();
        let kernels: Vec<&KernelData> = self.graph.kernels.values().collect();
        let n = kernels.len();
        let mut captured = None;
        let mut profile = None;
        match mode {
            Mode::Capture => {
                // Everything is allocated and resolved before capture begins: allocation and
                // attribute changes are not allowed while a stream is capturing.
                for b in last_use.keys() {
                    self.slot(*b, &mut slots, &bindings, 0)?;
                }
                let mut resolved = Vec::with_capacity(n);
                for (i, data) in kernels.iter().enumerate() {
                    if self.has_work(i, &bindings)? {
                        resolved.push((i, self.resolve_kernel(i, data, &slots, &bindings)?));
                    }
                }
                self.device.synchronize()?;
                let stream = self.device.stream().clone();
                stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(|e| self.device.stream_error("cuStreamBeginCapture", e))?;
                let mut failed = None;
                for (i, r) in &resolved {
                    if let Err(e) = self.device.enqueue(&self.loaded[*i], r) {
                        failed = Some(e);
                        break;
                    }
                }
                let ended = stream.end_capture(CUgraphInstantiate_flags(0));
                // Launches recorded into a graph did not run: they are not pending.
                self.device.synchronize().ok();
                if let Some(e) = failed {
                    return Err(e);
                }
                let graph = ended
                    .map_err(|e| RuntimeError::cuda("cuStreamEndCapture/cuGraphInstantiate", e, Some(self.entries())))?
                    .ok_or_else(|| RuntimeError::Graph("stream capture recorded no work".into()))?;
                graph.upload().map_err(|e| RuntimeError::cuda("cuGraphUpload", e, Some(self.entries())))?;
                let keep: Vec<DeviceBuffer> = slots.values().cloned().collect();
                captured = Some((graph, keep, bindings.clone()));
            }
            Mode::Run | Mode::Profile => {
                let profiling = matches!(mode, Mode::Profile);
                let mut events = Vec::new();
                for (i, data) in kernels.iter().enumerate() {
                    for b in data.inputs.iter().chain(&data.outputs) {
                        self.slot(*b, &mut slots, &bindings, 0)?;
                    }
                    // A kernel with nothing to compute is not launched (zero-sized outputs or
                    // an empty grid axis): its plan may not even resolve (a tensor map over an
                    // empty tensor), and a grid rounded up to one CTA would write past them.
                    let work = self.has_work(i, &bindings)?;
                    let r = if work { Some(self.resolve_kernel(i, data, &slots, &bindings)?) } else { None };
                    if profiling {
                        let start = self.event()?;
                        start.record(self.device.stream()).map_err(|e| self.device.stream_error("cuEventRecord", e))?;
                        if let Some(r) = &r {
                            self.device.enqueue(&self.loaded[i], r)?;
                        }
                        let end = self.event()?;
                        end.record(self.device.stream()).map_err(|e| self.device.stream_error("cuEventRecord", e))?;
                        events.push((start, end));
                    } else if let Some(r) = &r {
                        self.device.enqueue(&self.loaded[i], r)?;
                    }
                    if self.checked {
                        self.device.synchronize()?;
                    }
                    // Temporaries whose last reader is enqueued go back to the pool.
                    for b in data.inputs.iter().chain(&data.outputs) {
                        if last_use.get(b) == Some(&i) {
                            slots.remove(b);
                        }
                    }
                }
                self.device.synchronize()?;
                if profiling {
                    let mut p = Profile::default();
                    let elapsed = |a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent| {
                        a.elapsed_ms(b).map(|ms| f64::from(ms) * 1000.0).map_err(|e| RuntimeError::cuda("cuEventElapsedTime", e, None))
                    };
                    for (i, (s, e)) in events.iter().enumerate() {
                        p.kernels.push(KernelTime { kernel: kernel_ids[i], entry: self.plans[i].entry.clone(), micros: elapsed(s, e)? });
                    }
                    if let (Some((first, _)), Some((_, last))) = (events.first(), events.last()) {
                        p.total_micros = elapsed(first, last)?;
                    }
                    profile = Some(p);
                }
            }
        }
        let mut outputs = Vec::with_capacity(self.graph.outputs.len());
        for b in &self.graph.outputs {
            let buf = slots.get(b).ok_or_else(|| RuntimeError::Graph(format!("output {b} has no buffer")))?;
            if self.graph.buffers[*b].role == BufferRole::Input && !matches!(mode, Mode::Capture) {
                // An input returned as an output: hand back a copy, not the caller's buffer;
                // guarded and poisoned like every other output (a pool block's tail holds what
                // its last user left there).
                let (guard, pattern) = self.output_guard.unwrap_or((0, 0));
                let copy = self.device.alloc_extent(buf.dtype(), buf.shape(), buf.len_bytes(), guard)?;
                if self.output_guard.is_some() {
                    self.device.poison(&copy, pattern)?;
                }
                self.device.copy(&copy, buf)?;
                self.device.synchronize()?;
                outputs.push(copy);
            } else {
                outputs.push(buf.clone());
            }
        }
        Ok((outputs, profile, captured))
    }

    fn event(&self) -> Result<cudarc::driver::CudaEvent, RuntimeError> {
        self.device.ctx().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| RuntimeError::cuda("cuEventCreate", e, None))
    }

    pub(crate) fn entries(&self) -> String {
        self.plans.iter().map(|p| p.entry.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// A run of a kernel graph recorded as a CUDA graph by [`Executor::capture`]: replaying it
/// launches every kernel again with one driver call, on the same buffers.
pub struct CapturedGraph {
    pub(crate) graph: CudaGraph,
    pub(crate) device: Device,
    pub(crate) outputs: Vec<DeviceBuffer>,
    pub(crate) _keep: Vec<DeviceBuffer>,
    pub(crate) entries: Vec<String>,
    pub(crate) bindings: Bindings,
    /// A persistent launch's state, checked after a replay ([`CapturedGraph::check`]).
    pub(crate) persistent: Option<crate::persistent::PersistentCheck>,
}

// SAFETY: the driver's graph and graph-exec handles are not tied to the thread that made
// them (every cudarc call on them binds the context first), and the buffers it keeps are
// `Send`. It is not `Sync`: launching one graph exec from two threads at once is not allowed,
// so a shared captured graph sits behind a lock.
unsafe impl Send for CapturedGraph {}

impl CapturedGraph {
    /// Enqueues the whole graph on the device's stream (asynchronous; read the outputs or call
    /// [`Device::synchronize`] to wait).
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the driver refuses the launch; a kernel's fault shows at the
    /// next synchronising call, naming the graph's kernels.
    pub fn replay(&self) -> Result<(), RuntimeError> {
        let name = format!("graph[{}]", self.entries.join(", "));
        self.graph.launch().map_err(|e| RuntimeError::cuda("cuGraphLaunch", e, Some(name.clone())))?;
        self.device.note_pending(&name);
        Ok(())
    }

    /// The output buffers every replay writes, in the graph's output order.
    pub fn outputs(&self) -> &[DeviceBuffer] {
        &self.outputs
    }

    /// Kernels in the graph.
    pub fn kernel_count(&self) -> usize {
        self.entries.len()
    }

    /// The bindings baked into the graph.
    pub fn bindings(&self) -> &Bindings {
        &self.bindings
    }

    /// After a replay has finished (its outputs read): `Ok` for a kernel-by-kernel graph;
    /// for a persistent launch ([`Executor::capture_persistent`]), an error naming the task
    /// that waited past the timeout and the kernel it waited for, if one did (the launch's
    /// state is then cleared for the next replay).
    ///
    /// # Errors
    /// [`RuntimeError::Persistent`]; device errors reading the state.
    pub fn check(&self) -> Result<(), RuntimeError> {
        match &self.persistent {
            Some(p) => p.check(&self.device),
            None => Ok(()),
        }
    }

    /// A persistent launch captured with [`crate::PersistentOptions::profile`]: each kernel's
    /// span over the replays since the last call (its name, its first task's claim and its
    /// last task's completion in µs after the first claim, `None` for a kernel that did not
    /// run); the record is cleared. `None` for any other graph.
    ///
    /// # Errors
    /// Device errors reading or clearing the record.
    pub fn persistent_profile(&self) -> Result<Option<Vec<(String, Option<(f64, f64)>)>>, RuntimeError> {
        self.persistent.as_ref().map(|p| p.spans(&self.device)).transpose()
    }

    /// Whether the graph is one persistent launch.
    pub fn is_persistent(&self) -> bool {
        self.persistent.is_some()
    }
}

fn buffer_label(b: Buffer, data: &BufferData) -> String {
    match &data.name {
        Some(n) => format!("`{n}` ({b})"),
        None => b.to_string(),
    }
}

/// A shape's dims under `bindings`, each a non-negative size.
fn eval_shape(shape: &[Dim], bindings: &Bindings, label: &str) -> Result<Vec<usize>, RuntimeError> {
    shape
        .iter()
        .enumerate()
        .map(|(axis, d)| {
            let v = d.eval(bindings).map_err(|source| RuntimeError::Dim { what: format!("axis {axis} (`{d}`) of buffer {label}"), source })?;
            usize::try_from(v).map_err(|_| RuntimeError::Buffer(format!("axis {axis} (`{d}`) of buffer {label} is {v} < 0")))
        })
        .collect()
}

/// Bytes a buffer's layout spans: `1 + Σ (size_i − 1)·stride_i` elements (0 for an empty
/// shape), which is the element count for a contiguous layout.
fn extent_bytes(data: &BufferData, shape: &[usize], bindings: &Bindings, label: &str) -> Result<usize, RuntimeError> {
    let overflow = || RuntimeError::Buffer(format!("the extent of buffer {label} overflows usize"));
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(overflow)?;
    let mut elems = numel;
    if numel > 0 && data.layout.strides.len() == shape.len() {
        let mut span = 1usize;
        for (axis, (s, &d)) in data.layout.strides.iter().zip(shape).enumerate() {
            let s = s.eval(bindings).map_err(|source| RuntimeError::Dim { what: format!("stride {axis} (`{s}`) of buffer {label}"), source })?;
            let s = usize::try_from(s).map_err(|_| RuntimeError::Buffer(format!("stride {axis} of buffer {label} is negative")))?;
            span = (d - 1).checked_mul(s).and_then(|x| x.checked_add(span)).ok_or_else(overflow)?;
        }
        elems = elems.max(span);
    }
    data.ty.dtype.storage_bytes(elems).ok_or_else(overflow)
}

/// Symbols of `graph`'s buffer shapes that no input shape binds directly (as a bare symbol):
/// what the caller must pass in `bindings`.
pub fn free_symbols(graph: &KernelGraph) -> BTreeSet<String> {
    let bound: BTreeSet<String> = graph.inputs.iter().flat_map(|b| graph.buffers[*b].ty.shape.iter().filter_map(|d| d.as_symbol().map(str::to_owned))).collect();
    graph
        .buffers
        .values()
        .flat_map(|d| d.ty.shape.iter().flat_map(|dim| dim.symbols()))
        .map(|s| s.to_string())
        .filter(|s| !bound.contains(s))
        .collect()
}

#[cfg(test)]
mod tests {
    use sinter_ir::{DType, Layout, TensorType};

    use super::*;

    fn data(shape: Vec<Dim>, strides: Option<Vec<Dim>>) -> BufferData {
        let layout = match strides {
            Some(s) => Layout { strides: s, align: 256 },
            None => Layout::contiguous(&shape),
        };
        BufferData { name: Some("x".into()), ty: TensorType::new(DType::BF16, shape), role: BufferRole::Temp, layout }
    }

    #[test]
    fn extents_follow_layouts() {
        let b: Bindings = [("T".to_string(), 5)].into_iter().collect();
        let shape = vec![Dim::symbol("T"), Dim::constant(64)];
        let d = data(shape.clone(), None);
        let s = eval_shape(&d.ty.shape, &b, "x").unwrap();
        assert_eq!(s, vec![5, 64]);
        assert_eq!(extent_bytes(&d, &s, &b, "x").unwrap(), 5 * 64 * 2);
        // Rows padded to 128 elements: the last row is not padded.
        let d = data(shape.clone(), Some(vec![Dim::constant(128), Dim::constant(1)]));
        assert_eq!(extent_bytes(&d, &s, &b, "x").unwrap(), (4 * 128 + 64) * 2);
        // A broadcast (stride 0) layout never spans less than its element count.
        let d = data(shape.clone(), Some(vec![Dim::constant(0), Dim::constant(1)]));
        assert_eq!(extent_bytes(&d, &s, &b, "x").unwrap(), 5 * 64 * 2);
        // Empty shapes span nothing.
        let z = vec![0usize, 64];
        assert_eq!(extent_bytes(&data(shape.clone(), None), &z, &b, "x").unwrap(), 0);
        // Unbound and negative dims are errors.
        assert!(matches!(eval_shape(&shape, &Bindings::new(), "x"), Err(RuntimeError::Dim { .. })));
        let neg: Bindings = [("T".to_string(), -1)].into_iter().collect();
        assert!(matches!(eval_shape(&shape, &neg, "x"), Err(RuntimeError::Buffer(_))));
    }

    #[test]
    fn free_symbols_are_those_inputs_do_not_bind() {
        let mut g = KernelGraph::default();
        let x = g.buffers.push(BufferData { name: Some("x".into()), ty: TensorType::new(DType::F32, vec![Dim::symbol("T"), Dim::constant(8)]), role: BufferRole::Input, layout: Layout::contiguous(&[]) });
        g.buffers.push(BufferData { name: None, ty: TensorType::new(DType::F32, vec![Dim::symbol("T").add(&Dim::symbol("past"))]), role: BufferRole::Temp, layout: Layout::contiguous(&[]) });
        g.inputs.push(x);
        assert_eq!(free_symbols(&g), BTreeSet::from(["past".to_string()]));
    }
}
