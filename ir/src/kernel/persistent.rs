//! The persistent decode kernel's contract between the code generator and the runtime: what
//! the generated kernel (`sinter_codegen::persistent`) reads and the host writes.
//!
//! One launch runs a whole kernel graph. The graph's kernels become *instances* (in launch
//! order, each with its grid and arguments) and each run of `chunk` consecutive CTAs of an
//! instance becomes a *task*, run one CTA after another; tasks are numbered instance by
//! instance. Every CTA of the persistent grid loops: claim the
//! next task number from a global counter, run that CTA of that kernel's function, and count
//! the instance's completed CTAs in global memory. A task waits, at the point where the
//! kernel would wait for its predecessor grid (`griddepcontrol.wait`: after its weights'
//! prefetch), until every CTA of the previous instance has completed — the order of a stream,
//! without a launch between kernels. Tasks are claimed in order, so every task waited for
//! has been claimed by a running CTA: no deadlock, whatever the grid or the occupancy.
//!
//! Six global arrays, built by [`tables`] and [`profile_init`]:
//! - `instances: u32[n · INSTANCE_WORDS]`: per instance its function, its first argument
//!   word, its grid (x, y, z), its first task, its CTA count and its CTAs a task;
//! - `task_instance: u32[tasks]`: each task's instance;
//! - `args: u64[..]`: every instance's arguments, one word each (a pointer or an `i64`);
//! - `counters: u32[n]` (zero before the first launch; the last CTA to leave zeroes them);
//! - `state: u32[STATE_WORDS]` ([`state`]): the claim counter, the CTAs that have left, the
//!   abort flag and the first error, the task and instance counts, the timeout, the profile
//!   flag;
//! - `profile: u64[2 · n]`: with the flag, per instance the earliest claim and the latest
//!   completion of its tasks, `%globaltimer` nanoseconds ([`profile_init`], [`spans`]).
//!
//! A task that waits longer than the timeout (a predecessor that never completes) records
//! itself and the instance it waited for, raises the abort flag and returns; every CTA then
//! stops claiming, so the launch ends instead of hanging ([`error`] reads the record).

use std::fmt;

use super::LaunchPlan;

/// A kernel graph compiled into one persistent kernel (`sinter_codegen::persistent`).
#[derive(Clone, Debug, PartialEq)]
pub struct PersistentProgram {
    /// The persistent kernel: its parameters are the six arrays (`instances`,
    /// `task_instance`, `args`, `counters`, `state`, `profile`, as `KernelParam::Buffer(0..6)`), its
    /// block the widest task's, its `shared_bytes` the largest task's shared memory; the grid
    /// is the runtime's choice (CTAs resident at once).
    pub kernel: LaunchPlan,
    /// Threads each task function runs on (the rest of the CTA waits).
    pub threads: Vec<u32>,
    /// For each kernel of the graph, in launch order: its task function and the plan whose
    /// code that function is, which resolves the instance's grid and arguments.
    pub tasks: Vec<(u32, LaunchPlan)>,
}

/// `u32` words per instance in the `instances` table.
pub const INSTANCE_WORDS: usize = 8;

/// Word offsets of an instance's fields in the `instances` table.
pub mod instance {
    /// The function (index into the persistent kernel's task functions).
    pub const FUNCTION: usize = 0;
    /// Index of its first argument in `args`.
    pub const FIRST_ARG: usize = 1;
    /// Its grid along x, y, z (three words).
    pub const GRID: usize = 2;
    /// Its first task's number.
    pub const FIRST_TASK: usize = 5;
    /// Its CTA count (the product of the grid).
    pub const CTAS: usize = 6;
    /// CTAs a task runs, one after another (the last task of the instance may run fewer).
    pub const CHUNK: usize = 7;
}

/// Words of the `state` array and their offsets.
pub mod state {
    /// The next task number to claim.
    pub const HEAD: usize = 0;
    /// CTAs that have left the loop.
    pub const EXITED: usize = 1;
    /// Non-zero once a task has timed out: no CTA claims another task.
    pub const ABORT: usize = 2;
    /// The task that timed out, plus one (0: none).
    pub const ERROR_TASK: usize = 3;
    /// The instance it waited for, plus one.
    pub const ERROR_WAITED: usize = 4;
    /// Tasks in the launch.
    pub const TASKS: usize = 5;
    /// Instances in the launch.
    pub const INSTANCES: usize = 6;
    /// An instance whose completion is never counted, plus one (0: none) — a fault planted
    /// by tests to check that a stuck launch ends with an error.
    pub const NEVER_COMPLETES: usize = 7;
    /// The wait timeout in nanoseconds (low word, then high word).
    pub const TIMEOUT_NS: usize = 8;
    /// Non-zero: every task records its claim and completion times in the `profile` array.
    pub const PROFILE: usize = 10;
    /// Words in the array.
    pub const WORDS: usize = 16;
}

/// One kernel of the launch: its task function, grid and arguments (pointers and `i64`s as
/// 64-bit words, in the function's parameter order), and the CTAs a task of it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// Index of the task function.
    pub function: u32,
    /// CTAs along x, y, z.
    pub grid: [u32; 3],
    /// Argument words.
    pub args: Vec<u64>,
    /// CTAs a task runs (at least 1): a kernel's CTAs are cut into `⌈ctas / chunk⌉` tasks.
    pub chunk: u32,
}

/// The chunk that gives a kernel of `ctas` CTAs about one task per persistent CTA
/// (`⌈ctas / resident⌉`): a task's claim and wait are paid once for its chunk.
pub fn chunk_for(ctas: u32, resident: u32) -> u32 {
    ctas.div_ceil(resident.max(1)).max(1)
}

/// The host-side arrays of one persistent launch ([`tables`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    /// `INSTANCE_WORDS` words per instance.
    pub instances: Vec<u32>,
    /// Each task's instance.
    pub task_instance: Vec<u32>,
    /// Every instance's argument words.
    pub args: Vec<u64>,
    /// The completion counters (zeros), one per instance.
    pub counters: Vec<u32>,
    /// The `state` array.
    pub state: Vec<u32>,
}

/// Builds the arrays for `instances` (launch order; none with an empty grid) with a wait
/// timeout of `timeout_ns` nanoseconds; `never_completes` plants a stuck instance (tests).
///
/// # Errors
/// A sentence naming the instance when a grid is empty, the tasks or argument words exceed
/// `u32` indices, or `never_completes` is not an instance.
pub fn tables(instances: &[Instance], timeout_ns: u64, never_completes: Option<usize>) -> Result<Tables, String> {
    let mut t = Tables { instances: Vec::with_capacity(instances.len() * INSTANCE_WORDS), task_instance: Vec::new(), args: Vec::new(), counters: vec![0; instances.len().max(1)], state: vec![0; state::WORDS] };
    for (i, inst) in instances.iter().enumerate() {
        let ctas = inst.grid.iter().try_fold(1u32, |a, &g| a.checked_mul(g)).ok_or_else(|| format!("instance {i}: grid {:?} has more than 2^32 CTAs", inst.grid))?;
        if ctas == 0 {
            return Err(format!("instance {i}: an empty grid {:?} (leave kernels without work out)", inst.grid));
        }
        let chunk = inst.chunk.max(1);
        let first_task = u32::try_from(t.task_instance.len()).map_err(|_| format!("instance {i}: more than 2^32 tasks"))?;
        let first_arg = u32::try_from(t.args.len()).map_err(|_| format!("instance {i}: more than 2^32 argument words"))?;
        let mut words = [0u32; INSTANCE_WORDS];
        words[instance::FUNCTION] = inst.function;
        words[instance::FIRST_ARG] = first_arg;
        words[instance::GRID..instance::GRID + 3].copy_from_slice(&inst.grid);
        words[instance::FIRST_TASK] = first_task;
        words[instance::CTAS] = ctas;
        words[instance::CHUNK] = chunk;
        t.instances.extend_from_slice(&words);
        t.args.extend_from_slice(&inst.args);
        let i32 = u32::try_from(i).map_err(|_| "more than 2^32 instances".to_string())?;
        t.task_instance.extend(std::iter::repeat_n(i32, ctas.div_ceil(chunk) as usize));
        u32::try_from(t.task_instance.len()).map_err(|_| format!("instance {i}: more than 2^32 tasks"))?;
    }
    t.state[state::TASKS] = t.task_instance.len() as u32;
    t.state[state::INSTANCES] = instances.len() as u32;
    if let Some(n) = never_completes {
        if n >= instances.len() {
            return Err(format!("never_completes: instance {n} of {}", instances.len()));
        }
        t.state[state::NEVER_COMPLETES] = n as u32 + 1;
    }
    t.state[state::TIMEOUT_NS] = timeout_ns as u32;
    t.state[state::TIMEOUT_NS + 1] = (timeout_ns >> 32) as u32;
    if t.task_instance.is_empty() {
        // The kernel reads the table even when nothing is to be done.
        t.task_instance.push(0);
    }
    if t.instances.is_empty() {
        t.instances.resize(INSTANCE_WORDS, 0);
    }
    if t.args.is_empty() {
        t.args.push(0);
    }
    Ok(t)
}

/// The `profile` array for `n` instances before a launch: no claim yet (`u64::MAX`), no
/// completion yet (0).
pub fn profile_init(n: usize) -> Vec<u64> {
    (0..n.max(1)).flat_map(|_| [u64::MAX, 0]).collect()
}

/// Each instance's span in a launch's `profile` array: its first task's claim and its last
/// task's completion, nanoseconds after the launch's first claim (`None`: not run).
pub fn spans(profile: &[u64]) -> Vec<Option<(u64, u64)>> {
    let origin = profile.chunks_exact(2).map(|c| c[0]).min().unwrap_or(0);
    profile.chunks_exact(2).map(|c| (c[0] != u64::MAX && c[1] >= c[0]).then(|| (c[0] - origin, c[1] - origin))).collect()
}

/// A task that waited past the timeout, read from the `state` array after a launch. Instances
/// count the kernels with work, in launch order (a kernel with nothing to compute is left
/// out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// The waiting task's number.
    pub task: u32,
    /// Its instance.
    pub instance: u32,
    /// The instance it waited for.
    pub waited: u32,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {} (instance {}) waited past the timeout for instance {} to complete", self.task, self.instance, self.waited)
    }
}

/// The timed-out task recorded in `state` (with `task_instance` to name its instance), or
/// `None` when the launch completed.
pub fn error(state: &[u32], task_instance: &[u32]) -> Option<TimedOut> {
    if state.get(state::ABORT).copied().unwrap_or(0) == 0 {
        return None;
    }
    let task = state.get(state::ERROR_TASK).copied().unwrap_or(0).checked_sub(1)?;
    let waited = state.get(state::ERROR_WAITED).copied().unwrap_or(0).saturating_sub(1);
    Some(TimedOut { task, instance: task_instance.get(task as usize).copied().unwrap_or(u32::MAX), waited })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_number_tasks_instance_by_instance() {
        let a = Instance { function: 1, grid: [2, 1, 1], args: vec![10, 11], chunk: 1 };
        let b = Instance { function: 0, grid: [1, 3, 1], args: vec![12], chunk: 2 };
        let t = tables(&[a, b], 5_000_000_000, None).unwrap();
        assert_eq!(t.task_instance, vec![0, 0, 1, 1]);
        assert_eq!(&t.instances[..INSTANCE_WORDS], &[1, 0, 2, 1, 1, 0, 2, 1]);
        assert_eq!(&t.instances[INSTANCE_WORDS..], &[0, 2, 1, 3, 1, 2, 3, 2]);
        assert_eq!(t.args, vec![10, 11, 12]);
        assert_eq!((t.state[state::TASKS], t.state[state::INSTANCES]), (4, 2));
        assert_eq!((chunk_for(300, 264), chunk_for(264, 264), chunk_for(1, 264), chunk_for(5, 0)), (2, 1, 1, 5));
        assert_eq!(u64::from(t.state[state::TIMEOUT_NS]) | u64::from(t.state[state::TIMEOUT_NS + 1]) << 32, 5_000_000_000);
        assert_eq!(error(&t.state, &t.task_instance), None);
    }

    #[test]
    fn spans_are_relative_to_the_first_claim() {
        let mut p = profile_init(3);
        p[..4].copy_from_slice(&[1_000, 1_500, 1_600, 2_000]);
        assert_eq!(spans(&p), vec![Some((0, 500)), Some((600, 1_000)), None]);
    }

    #[test]
    fn bad_instances_are_named() {
        let e = tables(&[Instance { function: 0, grid: [4, 0, 1], args: vec![], chunk: 1 }], 1, None).unwrap_err();
        assert!(e.contains("instance 0") && e.contains("empty grid"), "{e}");
        let e = tables(&[Instance { function: 0, grid: [1, 1, 1], args: vec![], chunk: 1 }], 1, Some(3)).unwrap_err();
        assert!(e.contains("instance 3"), "{e}");
    }

    #[test]
    fn a_recorded_timeout_names_the_task_and_what_it_waited_for() {
        let mut state = vec![0; state::WORDS];
        state[state::ABORT] = 1;
        state[state::ERROR_TASK] = 4;
        state[state::ERROR_WAITED] = 1;
        let e = error(&state, &[0, 0, 1, 1, 1]).unwrap();
        assert_eq!(e, TimedOut { task: 3, instance: 1, waited: 0 });
        assert!(e.to_string().contains("task 3 (instance 1) waited"));
    }
}
