//! Turning a [`LaunchPlan`] into concrete launch arguments under a set of [`Bindings`]: grid
//! sizes, block shape, shared memory and the parameter values in PTX order. Pure host code, so
//! it is tested without a GPU; [`Device::launch`](crate::Device::launch) feeds the result to
//! `cuLaunchKernel`.

use sinter_ir::{Bindings, KernelParam, LaunchPlan};

use crate::error::RuntimeError;

/// Static shared memory a kernel may use without opting in, in bytes (48 KiB). A plan asking
/// for more dynamic shared memory makes the runtime raise the kernel's
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` first.
pub const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;

/// Most threads in one CTA.
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;

/// Largest grid size along x, y and z.
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// One kernel argument, as it is passed to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgValue {
    /// A device pointer (`.param .u64` holding a global address).
    Ptr(u64),
    /// A 64-bit integer (`.param .u64`/`.s64`): a size or stride in elements.
    I64(i64),
}

/// A launch plan with every expression evaluated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedLaunch {
    /// Entry point.
    pub entry: String,
    /// CTAs along x, y, z.
    pub grid: [u32; 3],
    /// Threads per CTA along x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per CTA, bytes.
    pub shared_bytes: u32,
    /// Arguments in PTX parameter order.
    pub args: Vec<ArgValue>,
}

/// Evaluates `plan` for a launch over buffers at the device addresses `buffer_ptrs` (the
/// kernel's inputs then outputs, as [`KernelParam::Buffer`] counts them) under `bindings`.
///
/// # Errors
/// [`RuntimeError::Dim`] when a grid dimension or size parameter mentions an unbound symbol
/// or overflows; [`RuntimeError::InvalidLaunch`] when a block dimension is 0, the block has
/// more than 1024 threads, a grid dimension exceeds the hardware limit, or a buffer parameter
/// indexes past `buffer_ptrs`.
pub fn resolve(plan: &LaunchPlan, buffer_ptrs: &[u64], bindings: &Bindings) -> Result<ResolvedLaunch, RuntimeError> {
    let invalid = |reason: String| RuntimeError::InvalidLaunch { entry: plan.entry.clone(), reason };
    if plan.block.contains(&0) {
        return Err(invalid(format!("block {:?} has a zero dimension", plan.block)));
    }
    let threads: u64 = plan.block.iter().map(|&b| u64::from(b)).product();
    if threads > MAX_THREADS_PER_BLOCK {
        return Err(invalid(format!("block {:?} has {threads} threads, more than {MAX_THREADS_PER_BLOCK}", plan.block)));
    }
    let mut grid = [1u32; 3];
    for (axis, (g, name)) in plan.grid.iter().zip(["x", "y", "z"]).enumerate() {
        let n = g.eval(bindings).map_err(|source| RuntimeError::Dim {
            what: format!("grid.{name} = ceil(({}) / {}) of kernel `{}`", g.numerator, g.denominator, plan.entry),
            source,
        })?;
        if n > MAX_GRID[axis] {
            return Err(invalid(format!("grid.{name} = {n} CTAs exceeds the limit {}", MAX_GRID[axis])));
        }
        grid[axis] = n;
    }
    let mut args = Vec::with_capacity(plan.params.len());
    for (i, p) in plan.params.iter().enumerate() {
        args.push(match p {
            KernelParam::Buffer(b) => match buffer_ptrs.get(*b) {
                Some(&ptr) => ArgValue::Ptr(ptr),
                None => return Err(invalid(format!("parameter {i} is buffer {b}, but the launch has {} buffers", buffer_ptrs.len()))),
            },
            KernelParam::Size(d) => ArgValue::I64(d.eval(bindings).map_err(|source| RuntimeError::Dim {
                what: format!("parameter {i} (`{d}`) of kernel `{}`", plan.entry),
                source,
            })?),
        });
    }
    Ok(ResolvedLaunch { entry: plan.entry.clone(), grid, block: plan.block, shared_bytes: plan.shared_bytes, args })
}

/// How many buffers `plan` refers to: one more than the largest [`KernelParam::Buffer`] index
/// (0 when it has none).
pub fn buffer_count(plan: &LaunchPlan) -> usize {
    plan.params
        .iter()
        .filter_map(|p| match p {
            KernelParam::Buffer(b) => Some(b + 1),
            KernelParam::Size(_) => None,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use sinter_ir::{Dim, DimError, GridDim};

    use super::*;

    pub(crate) fn plan() -> LaunchPlan {
        LaunchPlan {
            entry: "k_add".into(),
            ptx: String::new(),
            target: "sm_80".into(),
            grid: [GridDim { numerator: Dim::symbol("N"), denominator: 256 }, GridDim::fixed(3), GridDim::fixed(1)],
            block: [256, 1, 1],
            shared_bytes: 0,
            params: vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Size(Dim::symbol("N").mul(&Dim::constant(2)))],
        }
    }

    fn bind(pairs: &[(&str, i64)]) -> Bindings {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn grid_and_params_follow_bindings() {
        let r = resolve(&plan(), &[0x1000, 0x2000], &bind(&[("N", 1000)])).unwrap();
        assert_eq!(r.grid, [4, 3, 1]); // ceil(1000 / 256) = 4
        assert_eq!(r.block, [256, 1, 1]);
        assert_eq!(r.args, vec![ArgValue::Ptr(0x1000), ArgValue::Ptr(0x2000), ArgValue::I64(2000)]);
        // Exact multiples do not round up; zero work still launches one CTA.
        assert_eq!(resolve(&plan(), &[1, 2], &bind(&[("N", 512)])).unwrap().grid[0], 2);
        assert_eq!(resolve(&plan(), &[1, 2], &bind(&[("N", 0)])).unwrap().grid[0], 1);
        assert_eq!(buffer_count(&plan()), 2);
    }

    #[test]
    fn unbound_symbol_names_the_dimension() {
        let err = resolve(&plan(), &[1, 2], &Bindings::new()).unwrap_err();
        match &err {
            RuntimeError::Dim { what, source } => {
                assert!(what.contains("grid.x") && what.contains("k_add"), "{what}");
                assert_eq!(source, &DimError::Unbound("N".into()));
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("symbol `N` is not bound"), "{err}");
        // A size parameter with an unbound symbol is named by its index.
        let mut p = plan();
        p.grid[0] = GridDim::fixed(1);
        let err = resolve(&p, &[1, 2], &Bindings::new()).unwrap_err().to_string();
        assert!(err.contains("parameter 2"), "{err}");
    }

    #[test]
    fn invalid_geometry_and_buffer_indices_are_errors() {
        let mut p = plan();
        p.block = [64, 32, 1];
        assert!(matches!(resolve(&p, &[1, 2], &bind(&[("N", 1)])), Err(RuntimeError::InvalidLaunch { .. })));
        p.block = [0, 1, 1];
        assert!(matches!(resolve(&p, &[1, 2], &bind(&[("N", 1)])), Err(RuntimeError::InvalidLaunch { .. })));
        let err = resolve(&plan(), &[1], &bind(&[("N", 1)])).unwrap_err().to_string();
        assert!(err.contains("buffer 1") && err.contains("k_add"), "{err}");
        let mut p = plan();
        p.grid[1] = GridDim::fixed(70000);
        let err = resolve(&p, &[1, 2], &bind(&[("N", 1)])).unwrap_err().to_string();
        assert!(err.contains("grid.y"), "{err}");
        // Overflowing u32 CTAs is an error, not a wrap.
        let err = resolve(&plan(), &[1, 2], &bind(&[("N", i64::MAX / 2)])).unwrap_err();
        assert!(matches!(err, RuntimeError::Dim { source: DimError::Overflow(_), .. }), "{err:?}");
    }
}
