//! Autotuning: a kernel's schedule candidates timed on the device on first use, the winner
//! kept in the kernel cache.
//!
//! The code generator offers several schedules for some kernels
//! (`sinter_codegen::schedule_variants`: matmul CTA tiles, row-reduction thread counts and
//! unrolls, prefill-attention key tiles), the one its heuristic picks first. With autotuning
//! on ([`GpuProgram::compile_with_options`](crate::gpu::GpuProgram::compile_with_options),
//! `SINTER_AUTOTUNE=1`, `sinter bench --autotune`), compiling a program times every candidate
//! of each *tunable* kernel alone on the device — inputs of uniform random values in
//! `[-1, 1)`, timed as `sinter bench` times ([`crate::timing`]: one launch to warm up, then the
//! median of [`TIMED_RUNS`] launches, each after an L2-clearing fill, on an idle GPU where the
//! fill's buffer cannot be allocated) — and stores a record of the times and the winner in the
//! kernel cache. Every later compile of
//! the same kernel for the same target (with or without autotuning) runs the winner's plan
//! when the record was made on a device of the same name. A kernel keeps one record per
//! (kernel, shape, target): a card of another name times it again and replaces the record, so
//! a cache shared by two kinds of card re-tunes whenever they alternate. `sinter explain
//! --schedules` shows each kernel's candidates and, where a record exists, the winner.
//! `SINTER_AUTOTUNE` must be exactly `1`.
//!
//! A kernel is tunable when its family offers alternatives (matmul, row reduction, prefill
//! attention), every buffer it reads or writes has a constant shape (the shape class of a
//! tuned kernel is its exact shape: a kernel with symbolic dims keeps the heuristic's schedule)
//! and a float dtype — or a block-quantized or `f8e4m3` one, which the random values fill as
//! well (index-driven kernels would time their random indices, not their work).
//!
//! Cache layout, beside the plans (each entry keyed like the kernel's own, see
//! [`crate::cache_key::kernel_key`], with the schedule field changed): `variant <name> …` → the
//! plan of candidate `<name>`; `variants …` → a record of the candidates' names, default first,
//! written when they are compiled (so a build without LLVM, which cannot enumerate them, can
//! still time candidates compiled elsewhere: `sinter bench --precompile sm_90a --autotune`);
//! `tuned …` → the timing record (`device <name>`, `winner <variant>`, then `<µs> <variant>`
//! per candidate).

use sinter_ir::{Bindings, DType, Family, Kernel, KernelGraph, LaunchPlan, Target};
use sinter_runtime::{CacheKey, Device, DeviceBuffer, Executor, KernelCache, Lookup};

use crate::cache_key::kernel_key;
use crate::Error;

/// Launches timed per candidate (after one warm-up launch); the median counts.
pub const TIMED_RUNS: usize = 7;

/// Whether autotuning is asked for by the environment (`SINTER_AUTOTUNE=1`).
pub fn from_env() -> bool {
    std::env::var("SINTER_AUTOTUNE").is_ok_and(|v| v == "1")
}

/// The key of candidate `name`'s plan.
pub fn variant_key(kg: &KernelGraph, k: Kernel, target: &Target, name: &str) -> CacheKey {
    let mut key = kernel_key(kg, k, target);
    key.schedule = format!("variant {name} {}", key.schedule);
    key
}

/// The key of the record of `k`'s candidate names.
fn variants_key(kg: &KernelGraph, k: Kernel, target: &Target) -> CacheKey {
    let mut key = kernel_key(kg, k, target);
    key.schedule = format!("variants {}", key.schedule);
    key
}

/// The key of `k`'s timing record.
fn tuned_key(kg: &KernelGraph, k: Kernel, target: &Target) -> CacheKey {
    let mut key = kernel_key(kg, k, target);
    key.schedule = format!("tuned {}", key.schedule);
    key
}

/// The result of timing a kernel's candidates on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct TuningRecord {
    /// The device's name (`NVIDIA H200`).
    pub device: String,
    /// The fastest candidate.
    pub winner: String,
    /// Median time of each candidate, microseconds, in the order timed (the default first).
    pub micros: Vec<(String, f64)>,
}

impl TuningRecord {
    fn to_text(&self) -> String {
        let mut s = format!("device {}\nwinner {}\n", self.device, self.winner);
        for (name, us) in &self.micros {
            s.push_str(&format!("{us:.3} {name}\n"));
        }
        s
    }

    fn parse(text: &str) -> Option<TuningRecord> {
        let mut lines = text.lines();
        let device = lines.next()?.strip_prefix("device ")?.to_string();
        let winner = lines.next()?.strip_prefix("winner ")?.to_string();
        let micros = lines
            .map(|l| {
                let (us, name) = l.split_once(' ')?;
                Some((name.to_string(), us.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        micros
            .iter()
            .any(|(n, _)| *n == winner)
            .then_some(TuningRecord {
                device,
                winner,
                micros,
            })
    }
}

/// `k`'s timing record in `cache`, if there is an intact one.
pub fn record(
    kg: &KernelGraph,
    k: Kernel,
    target: &Target,
    cache: &KernelCache,
) -> Option<TuningRecord> {
    cache
        .get_record(&tuned_key(kg, k, target))
        .ok()
        .flatten()
        .and_then(|t| TuningRecord::parse(&t))
}

/// Deletes `k`'s timing record, so that the next compile with autotuning times it again.
///
/// # Errors
/// [`Error::Runtime`] when the record exists but cannot be removed.
pub fn forget(kg: &KernelGraph, k: Kernel, target: &Target, cache: &KernelCache) -> Result<(), Error> {
    Ok(cache.remove_record(&tuned_key(kg, k, target))?)
}

/// Pins candidate `name` of kernel `k` for devices named `device`: writes a timing record
/// whose winner is `name` (untimed: its time reads `NaN`), so that later compiles on such a
/// device run that candidate (when its plan is in the cache) until the kernel is tuned or
/// [`forget`]-ed again. For tests that run every candidate, and for a user who wants one.
///
/// # Errors
/// [`Error::Runtime`] when the record cannot be written.
pub fn pin(kg: &KernelGraph, k: Kernel, target: &Target, cache: &KernelCache, device: &str, name: &str) -> Result<(), Error> {
    let r = TuningRecord { device: device.to_string(), winner: name.to_string(), micros: vec![(name.to_string(), f64::NAN)] };
    cache.put_record(&tuned_key(kg, k, target), &r.to_text())?;
    Ok(())
}

/// The plan of the candidate `k`'s timing record chose on a device named `device`, if there is
/// such a record and the plan is in the cache (else the caller uses the default schedule).
pub fn tuned_plan(
    kg: &KernelGraph,
    k: Kernel,
    target: &Target,
    cache: &KernelCache,
    device: &str,
) -> Option<(String, LaunchPlan)> {
    let r = record(kg, k, target, cache).filter(|r| r.device == device)?;
    match cache.get(&variant_key(kg, k, target, &r.winner)) {
        Lookup::Hit(plan) => Some((r.winner, plan)),
        _ => None,
    }
}

/// Whether `k` is tunable (see the module docs).
pub fn tunable(kg: &KernelGraph, k: Kernel) -> bool {
    let kd = &kg.kernels[k];
    matches!(
        kd.family,
        Family::Matmul | Family::RowReduction | Family::Attention
    ) && kd.inputs.iter().chain(&kd.outputs).all(|b| {
        let ty = &kg.buffers[*b].ty;
        matches!(ty.dtype, DType::BF16 | DType::F16 | DType::F32 | DType::Q8_0 | DType::Q4_1 | DType::F8E4M3)
            && ty.shape.iter().all(|d| d.as_const().is_some())
    })
}

/// Compiles every candidate of each tunable kernel of `kg` that the cache lacks, stores their
/// plans and the record of their names; returns how many plans it compiled.
///
/// # Errors
/// Code generation and cache errors.
#[cfg(feature = "llvm")]
pub fn precompile_variants(
    kg: &KernelGraph,
    target: &Target,
    cache: &KernelCache,
) -> Result<usize, Error> {
    let mut built = 0;
    for k in kg.kernels.keys() {
        if tunable(kg, k) {
            built += ensure_variants(kg, k, target, cache)?.1;
        }
    }
    Ok(built)
}

/// The candidate names of `k` (from the cache's record, or compiled now and recorded), and how
/// many plans were compiled.
#[cfg(feature = "llvm")]
fn ensure_variants(
    kg: &KernelGraph,
    k: Kernel,
    target: &Target,
    cache: &KernelCache,
) -> Result<(Vec<String>, usize), Error> {
    if let Some(names) = cached_names(kg, k, target, cache) {
        if names
            .iter()
            .all(|n| matches!(cache.get(&variant_key(kg, k, target, n)), Lookup::Hit(_)))
        {
            return Ok((names, 0));
        }
    }
    let variants = sinter_codegen::schedule_variants(kg, k, target)
        .map_err(|e| Error::Codegen(format!("kernel {k}: {e}")))?;
    let mut names = Vec::with_capacity(variants.len());
    for v in &variants {
        cache.put(&variant_key(kg, k, target, &v.name), &v.plan)?;
        names.push(v.name.clone());
    }
    cache.put_record(&variants_key(kg, k, target), &names.join("\n"))?;
    Ok((names, variants.len()))
}

#[cfg(not(feature = "llvm"))]
fn ensure_variants(
    kg: &KernelGraph,
    k: Kernel,
    target: &Target,
    cache: &KernelCache,
) -> Result<(Vec<String>, usize), Error> {
    Ok((cached_names(kg, k, target, cache).unwrap_or_default(), 0))
}

/// The candidate names the cache records for `k`.
pub fn cached_names(
    kg: &KernelGraph,
    k: Kernel,
    target: &Target,
    cache: &KernelCache,
) -> Option<Vec<String>> {
    let text = cache
        .get_record(&variants_key(kg, k, target))
        .ok()
        .flatten()?;
    let names: Vec<String> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Times the candidates of every tunable kernel of `kg` that has no record for `device` yet
/// and stores the records; returns the records made. A kernel with fewer than two candidates
/// in the cache (and, without LLVM, none recorded) is skipped; a candidate that fails to load
/// (more shared memory than the device gives) is left out of the race.
///
/// # Errors
/// Code generation, cache and driver errors (a failed launch of a candidate).
pub fn autotune(
    kg: &KernelGraph,
    target: &Target,
    cache: &KernelCache,
    device: &Device,
) -> Result<Vec<(Kernel, TuningRecord)>, Error> {
    let name = device.info().name.clone();
    let mut made = Vec::new();
    // Each timed run follows a fill of this buffer ([`crate::timing`]). Allocated on the first
    // kernel to time; where the memory is not there, runs are timed on an idle GPU (the
    // candidates' order, what the record keeps, does not depend on it).
    let mut flush: Option<Option<DeviceBuffer>> = None;
    for k in kg.kernels.keys() {
        if !tunable(kg, k) || record(kg, k, target, cache).is_some_and(|r| r.device == name) {
            continue;
        }
        let (names, _) = ensure_variants(kg, k, target, cache)?;
        let plans: Vec<(String, LaunchPlan)> = names
            .into_iter()
            .filter_map(|n| match cache.get(&variant_key(kg, k, target, &n)) {
                Lookup::Hit(p) => Some((n, p)),
                _ => None,
            })
            .collect();
        if plans.len() < 2 {
            continue;
        }
        let (one, inputs) = alone(kg, k, device)?;
        let refs: Vec<&DeviceBuffer> = inputs.iter().collect();
        let mut micros = Vec::new();
        let flush = flush.get_or_insert_with(|| crate::timing::flush_buffer(device).ok());
        for (n, plan) in plans {
            let Ok(ex) = Executor::new(device, &one, vec![plan]) else {
                continue;
            };
            let us = crate::timing::median_micros(device, flush.as_ref(), TIMED_RUNS, || Ok(ex.run_profiled(&refs, &Bindings::new())?.1.total_micros))?;
            micros.push((n, us));
        }
        let Some((winner, _)) = micros.iter().min_by(|a, b| a.1.total_cmp(&b.1)).cloned() else {
            continue;
        };
        let r = TuningRecord {
            device: name.clone(),
            winner,
            micros,
        };
        cache.put_record(&tuned_key(kg, k, target), &r.to_text())?;
        made.push((k, r));
    }
    Ok(made)
}

/// One line on `k`'s schedules for `target` (`sinter explain --schedules`): its candidates, the
/// default first, whether it is tunable, and the winner of its timing record if the kernel
/// cache holds one; for a kernel the code generator cannot build, `schedule: none, ` and the
/// code generator's message (which names the kernel and what it refused).
pub fn describe(kg: &KernelGraph, k: Kernel, target: &Target) -> String {
    #[cfg(feature = "llvm")]
    let names = match sinter_codegen::schedule_names(kg, k, target) {
        Ok(names) => names,
        // A kernel the code generator cannot build is reported in its line, so that the rest
        // of the report still prints; the message names the kernel and what it refused.
        Err(e) => return format!("schedule: none, {e}"),
    };
    // The records are optional here: a cache that cannot be opened has none.
    let cache = KernelCache::open_default().ok();
    #[cfg(not(feature = "llvm"))]
    let names = cache.as_ref().and_then(|c| cached_names(kg, k, target, c)).unwrap_or_else(|| vec!["default".into()]);
    let mut line = format!(
        "schedule: {}",
        names.first().map_or("default", String::as_str)
    );
    if names.len() > 1 {
        line.push_str(&format!(" (candidates: {})", names[1..].join(", ")));
        if !tunable(kg, k) {
            line.push_str("; not tuned: a buffer with a symbolic dim or an integer/bool dtype");
        }
    }
    if let Some(r) = cache.as_ref().and_then(|c| record(kg, k, target, c)) {
        let times: Vec<String> = r
            .micros
            .iter()
            .map(|(n, us)| format!("{n} {us:.1} us"))
            .collect();
        line.push_str(&format!(
            "; tuned on {}: {} ({})",
            r.device,
            r.winner,
            times.join(", ")
        ));
    }
    line
}

/// Kernel `k` alone (its inputs graph inputs, its outputs graph outputs) and device buffers of
/// uniform random values in `[-1, 1)` for its inputs.
fn alone(
    kg: &KernelGraph,
    k: Kernel,
    device: &Device,
) -> Result<(KernelGraph, Vec<DeviceBuffer>), Error> {
    let one = kg.kernel_alone(k);
    let inputs = one.inputs.clone();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut bufs = Vec::with_capacity(inputs.len());
    for b in &inputs {
        let ty = &kg.buffers[*b].ty;
        let shape: Vec<usize> = ty
            .shape
            .iter()
            .map(|d| d.as_const().unwrap_or(0).max(0) as usize)
            .collect();
        let n: usize = shape.iter().product();
        let mut next = || {
                // xorshift64*: reproducible, no dependency.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
                r as f64 / (1u64 << 53) as f64
            };
        if let Some(block) = ty.dtype.block_bytes() {
            // Quantized weights: random codes under a finite scale (and min) of 1/16 in every
            // block (f16 0x2C00), so no block decodes to NaN or infinity.
            let len = ty.dtype.storage_bytes(n).unwrap_or(0);
            let mut bytes: Vec<u8> = (0..len).map(|_| (next() * 256.0) as u8).collect();
            let scales = if ty.dtype == DType::Q4_1 { 2 } else { 1 };
            for blk in bytes.chunks_mut(block) {
                for s in 0..scales.min(blk.len() / 2) {
                    blk[2 * s..2 * s + 2].copy_from_slice(&0x2C00u16.to_le_bytes());
                }
            }
            bufs.push(device.upload_bytes(ty.dtype, &shape, &bytes)?);
            continue;
        }
        let values: Vec<f64> = (0..n).map(|_| 2.0 * next() - 1.0).collect();
        bufs.push(device.upload_f64(ty.dtype, &shape, &values)?);
    }
    Ok((one, bufs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_what_they_print() {
        let r = TuningRecord {
            device: "NVIDIA H200".into(),
            winner: "rows t256 u4 c8".into(),
            micros: vec![
                ("rows t512 u2 c8".into(), 148.25),
                ("rows t256 u4 c8".into(), 146.5),
            ],
        };
        assert_eq!(TuningRecord::parse(&r.to_text()), Some(r.clone()));
        // A winner that was not timed, or a damaged line, is no record.
        assert_eq!(TuningRecord::parse("device X\nwinner b\n1.0 a\n"), None);
        assert_eq!(TuningRecord::parse("device X\nwinner a\nfast a\n"), None);
        assert_eq!(TuningRecord::parse(""), None);
    }
}
