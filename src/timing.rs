//! Timing on the device, as `sinter bench` and autotuning both time: one untimed warm-up run,
//! then the median of N runs, each measured with CUDA events and each preceded on the same
//! stream by a fill of a [`FLUSH_BYTES`] scratch buffer.
//!
//! The fill is what `triton.testing.do_bench` (which times every anchor of `bench/anchors.py`)
//! does before each of its runs: the run starts from the cache state the anchors start from
//! (the L2 cleared), and the GPU is still busy with the fill when the run's start event and
//! launches are queued, so the host's launch latency is not timed. Without the buffer
//! (`sinter bench --no-flush`, or where it cannot be allocated) each run starts on an idle
//! GPU: the start event is stamped at once and the kernel begins only when the host's launch
//! call reaches the GPU, which the time then includes.

use sinter_runtime::{Device, DeviceBuffer, RuntimeError};

use crate::DType;

/// The scratch buffer filled before each timed run: 256 MiB, as `triton.testing.do_bench`'s
/// cache-clearing buffer, five times an H100/H200's 50 MiB L2.
pub const FLUSH_BYTES: usize = 256 << 20;

/// Allocates the [`FLUSH_BYTES`] scratch buffer on `dev`.
///
/// # Errors
/// Out of device memory.
pub fn flush_buffer(dev: &Device) -> Result<DeviceBuffer, RuntimeError> {
    dev.alloc(DType::Bool, &[FLUSH_BYTES])
}

/// The median of `runs` timings (µs) of `run`, which runs once and returns its own time (the
/// `total_micros` of a profiled run); `run` is called once more first, untimed, to warm up.
/// With `flush`, each timed run follows a fill of it (see the module docs).
///
/// # Errors
/// The errors of `run` and of the fill.
pub fn median_micros(dev: &Device, flush: Option<&DeviceBuffer>, runs: usize, mut run: impl FnMut() -> Result<f64, RuntimeError>) -> Result<f64, RuntimeError> {
    run()?;
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        if let Some(f) = flush {
            dev.zero(f)?;
        }
        times.push(run()?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
