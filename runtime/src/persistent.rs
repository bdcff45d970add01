//! A kernel graph run as one persistent launch ([`Executor::capture_persistent`]): the
//! kernel `sinter_codegen::persistent` builds from the graph's kernels, its tables
//! ([`sinter_ir::kernel::persistent`]) written once for the buffers of the capture, the
//! launch recorded as a one-node CUDA graph that replays like a captured decode step. The
//! grid is the number of CTAs resident at once (the driver's occupancy for the kernel's
//! block and shared memory, times the SMs); a replay's result is read as usual, then
//! [`CapturedGraph::check`] reads the launch's state and reports a task that timed out.

use std::time::Duration;

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use sinter_ir::kernel::persistent::{self as tables, Instance, PersistentProgram};
use sinter_ir::{Bindings, BufferRole, DType, Kernel};

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::RuntimeError;
use crate::executor::{CapturedGraph, Executor, Prepared};
use crate::launch::{resolve, ArgValue, ResolvedLaunch};

/// How a persistent launch is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistentOptions {
    /// How long a task waits for the kernel before it (2 s by default: a real wait is
    /// microseconds).
    pub timeout: Duration,
    /// CTAs of the persistent grid; `None`: as many as are resident at once.
    pub ctas: Option<u32>,
    /// An instance whose completion is never counted (a fault planted by tests).
    pub never_completes: Option<usize>,
    /// Record each kernel's span in every replay ([`CapturedGraph::persistent_profile`]).
    pub profile: bool,
}

impl Default for PersistentOptions {
    fn default() -> PersistentOptions {
        PersistentOptions { timeout: Duration::from_secs(2), ctas: None, never_completes: None, profile: false }
    }
}

/// What [`CapturedGraph::check`] reads after a persistent replay.
pub(crate) struct PersistentCheck {
    state: DeviceBuffer,
    profile: DeviceBuffer,
    task_instance: Vec<u32>,
    /// Each instance's kernel, for messages (`k12 \`entry\``).
    names: Vec<String>,
}

impl PersistentCheck {
    /// Each kernel's span in the replays since the last read (name, first claim and last
    /// completion in µs after the first claim); the record is then cleared.
    pub(crate) fn spans(&self, device: &Device) -> Result<Vec<(String, Option<(f64, f64)>)>, RuntimeError> {
        let bytes = device.read_bytes(&self.profile)?;
        let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect();
        let init = tables::profile_init(self.names.len());
        device.write_bytes(&self.profile, &init.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())?;
        let spans = tables::spans(&words);
        Ok(self.names.iter().zip(spans).map(|(n, s)| (n.clone(), s.map(|(a, b)| (a as f64 / 1e3, b as f64 / 1e3)))).collect())
    }

    pub(crate) fn check(&self, device: &Device) -> Result<(), RuntimeError> {
        let bytes = device.read_bytes(&self.state)?;
        let words: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let Some(e) = tables::error(&words, &self.task_instance) else { return Ok(()) };
        let mut clear = words.clone();
        for w in [tables::state::ABORT, tables::state::ERROR_TASK, tables::state::ERROR_WAITED] {
            clear[w] = 0;
        }
        device.write_bytes(&self.state, &clear.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())?;
        let name = |i: u32| self.names.get(i as usize).cloned().unwrap_or_else(|| format!("instance {i}"));
        Err(RuntimeError::Persistent(format!("task {} (a CTA of {}) waited past the timeout for {} to complete: that kernel never finished", e.task, name(e.instance), name(e.waited))))
    }
}

impl Executor {
    /// [`Executor::capture_persistent`] with the inputs by name.
    ///
    /// # Errors
    /// As [`Executor::capture_persistent`]; a missing or unknown input name.
    pub fn capture_persistent_named(&self, inputs: &[(&str, &DeviceBuffer)], bindings: &Bindings, program: &PersistentProgram, options: &PersistentOptions) -> Result<CapturedGraph, RuntimeError> {
        let ordered = self.order_named(inputs)?;
        self.capture_persistent(&ordered, bindings, program, options)
    }

    /// Records one run of the graph on `inputs` as a single launch of `program`'s persistent
    /// kernel (built for this executor's graph, one task plan per kernel), captured as a CUDA
    /// graph: every replay reads the same inputs and writes the same outputs, as
    /// [`Executor::capture`]'s graphs do. Call [`CapturedGraph::check`] after a replay.
    ///
    /// # Errors
    /// [`RuntimeError::Graph`] when `program` does not fit the graph (a kernel count, a tensor
    /// map argument); as [`Executor::capture`].
    pub fn capture_persistent(&self, inputs: &[&DeviceBuffer], bindings: &Bindings, program: &PersistentProgram, options: &PersistentOptions) -> Result<CapturedGraph, RuntimeError> {
        let graph = self.graph();
        if program.tasks.len() != graph.kernels.len() {
            return Err(RuntimeError::Graph(format!("a persistent program of {} tasks for {} kernels", program.tasks.len(), graph.kernels.len())));
        }
        let Prepared { bindings, mut slots, last_use } = self.prepare(inputs, bindings)?;
        for b in last_use.keys() {
            self.slot(*b, &mut slots, &bindings, 0)?;
        }
        let dev = self.device();
        let kernel = dev.load(&program.kernel)?;
        let block = program.kernel.block[0];
        let smem = program.kernel.shared_bytes;
        dev.prepare_shared(&kernel, smem)?;
        let static_smem = kernel.attributes().static_shared_bytes;
        let limit = dev.info().max_shared_per_block_optin;
        if u64::from(smem) + u64::from(static_smem) > u64::from(limit) {
            return Err(RuntimeError::InvalidLaunch { entry: program.kernel.entry.clone(), reason: format!("{smem} bytes of dynamic and {static_smem} of static shared memory, the device allows {limit} a CTA") });
        }
        let ctas = match options.ctas {
            Some(n) => n.max(1),
            None => match dev.resident_ctas(&kernel, block, smem)? {
                0 => return Err(RuntimeError::InvalidLaunch { entry: program.kernel.entry.clone(), reason: format!("no CTA of {block} threads and {smem} bytes of dynamic shared memory fits an SM") }),
                n => n,
            },
        };
        let mut instances = Vec::new();
        let mut names = Vec::new();
        for (i, (k, data)) in graph.kernels.iter().enumerate() {
            let (function, plan) = &program.tasks[i];
            let work = graph.has_work(k, plan, &bindings).map_err(|source| RuntimeError::Dim { what: format!("the grid or outputs of kernel `{}`", plan.entry), source })?;
            if !work {
                continue;
            }
            let ptrs = data.inputs.iter().chain(&data.outputs).map(|b| slots.get(b).map(DeviceBuffer::device_ptr).ok_or_else(|| RuntimeError::Graph(format!("{b} has no buffer")))).collect::<Result<Vec<_>, _>>()?;
            let r = resolve(plan, &ptrs, &bindings)?;
            let args = r
                .args
                .iter()
                .map(|a| match a {
                    ArgValue::Ptr(p) => Ok(*p),
                    ArgValue::I64(v) => Ok(*v as u64),
                    ArgValue::TensorMap(_) => Err(RuntimeError::Graph(format!("kernel {k} (`{}`) takes a tensor map: it cannot be a persistent task", plan.entry))),
                })
                .collect::<Result<Vec<u64>, _>>()?;
            let cta_count = r.grid.iter().map(|&g| u64::from(g)).product::<u64>().min(u64::from(u32::MAX)) as u32;
            let chunk = tables::chunk_for(cta_count, ctas);
            instances.push(Instance { function: *function, grid: r.grid, args, chunk });
            names.push(format!("{} `{}`", Kernel::from_u32(i as u32), plan.entry));
        }
        let mut t = tables::tables(&instances, options.timeout.as_nanos().min(u128::from(u64::MAX)) as u64, options.never_completes).map_err(RuntimeError::Graph)?;
        t.state[tables::state::PROFILE] = u32::from(options.profile);
        let profile_words = tables::profile_init(instances.len());
        let words = |v: &[u32]| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let up32 = |v: &[u32]| dev.upload_bytes(DType::I32, &[v.len()], &words(v));
        let insts = up32(&t.instances)?;
        let task_instance = up32(&t.task_instance)?;
        let args = dev.upload_bytes(DType::I64, &[t.args.len()], &t.args.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())?;
        let counters = up32(&t.counters)?;
        let state = up32(&t.state)?;
        let profile = dev.upload_bytes(DType::I64, &[profile_words.len()], &profile_words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())?;
        let launch = ResolvedLaunch {
            entry: program.kernel.entry.clone(),
            grid: [ctas, 1, 1],
            block: [block, 1, 1],
            shared_bytes: smem,
            args: [&insts, &task_instance, &args, &counters, &state, &profile].iter().map(|b| ArgValue::Ptr(b.device_ptr())).collect(),
        };
        dev.synchronize()?;
        let stream = dev.stream().clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| dev.stream_error("cuStreamBeginCapture", e))?;
        let launched = dev.enqueue(&kernel, &launch);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        dev.synchronize().ok();
        launched?;
        let cuda_graph = ended
            .map_err(|e| RuntimeError::cuda("cuStreamEndCapture/cuGraphInstantiate", e, Some(launch.entry.clone())))?
            .ok_or_else(|| RuntimeError::Graph("stream capture recorded no work".into()))?;
        cuda_graph.upload().map_err(|e| RuntimeError::cuda("cuGraphUpload", e, Some(launch.entry.clone())))?;
        let mut outputs = Vec::with_capacity(graph.outputs.len());
        for b in &graph.outputs {
            outputs.push(slots.get(b).cloned().ok_or_else(|| RuntimeError::Graph(format!("output {b} has no buffer")))?);
            debug_assert!(graph.buffers[*b].role != BufferRole::Temp);
        }
        let mut keep: Vec<DeviceBuffer> = slots.into_values().collect();
        keep.extend([insts, task_instance.clone(), args, counters]);
        let entries = vec![format!("{} ({} tasks of {} kernels on {ctas} CTAs)", launch.entry, t.state[tables::state::TASKS], instances.len())];
        let check = PersistentCheck { state: state.clone(), profile: profile.clone(), task_instance: t.task_instance, names };
        keep.push(profile);
        keep.push(state);
        Ok(CapturedGraph { graph: cuda_graph, device: dev.clone(), outputs, _keep: keep, entries, bindings, persistent: Some(check) })
    }
}

impl Device {
    /// CTAs of `kernel` resident at once on the whole device with `block` threads and `smem`
    /// bytes of dynamic shared memory each (`cuOccupancyMaxActiveBlocksPerMultiprocessor`
    /// times the SMs).
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the driver refuses the query.
    pub fn resident_ctas(&self, kernel: &crate::device::LoadedKernel, block: u32, smem: u32) -> Result<u32, RuntimeError> {
        self.bind()?;
        let mut n: i32 = 0;
        // SAFETY: `kernel`'s function belongs to this device's context, made current above.
        unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, kernel.func(), block as i32, smem as usize) }.result().map_err(|e| RuntimeError::cuda("cuOccupancyMaxActiveBlocksPerMultiprocessor", e, Some(kernel.entry().to_owned())))?;
        Ok(n.max(0) as u32 * self.info().sm_count)
    }
}
