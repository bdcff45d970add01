//! Turning a [`LaunchPlan`] into concrete launch arguments under a set of [`Bindings`]: grid
//! sizes, block shape, shared memory and the parameter values in PTX order. Pure host code, so
//! it is tested without a GPU; [`Device::launch`](crate::Device::launch) feeds the result to
//! `cuLaunchKernel`.

use sinter_ir::{Bindings, DType, Dim, KernelParam, LaunchPlan};

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgValue {
    /// A device pointer (`.param .u64` holding a global address).
    Ptr(u64),
    /// A 64-bit integer (`.param .u64`/`.s64`): a size or stride in elements.
    I64(i64),
    /// A TMA tensor map, encoded at launch ([`crate::Device`] calls `cuTensorMapEncodeTiled`)
    /// and passed as 128 bytes by value.
    TensorMap(ResolvedTensorMap),
}

/// A [`sinter_ir::TensorMap`] with its buffer's address and every dim evaluated: the
/// arguments of `cuTensorMapEncodeTiled` (dims innermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedTensorMap {
    /// The element type.
    pub dtype: DType,
    /// Global address of the tensor's first element (buffer base + offset), bytes.
    pub address: u64,
    /// Extent of each dimension, elements.
    pub dims: Vec<u64>,
    /// Stride of each dimension after the innermost, bytes.
    pub strides: Vec<u64>,
    /// Box extent of each dimension, elements.
    pub box_dims: Vec<u32>,
    /// Swizzle span in bytes (0, 32, 64, 128).
    pub swizzle: u32,
}

impl ResolvedTensorMap {
    /// The driver's constraints on a tiled tensor map (CUDA Driver API, `cuTensorMapEncodeTiled`),
    /// checked before the call so that a violation names what is wrong.
    ///
    /// # Errors
    /// The violated constraint, as a sentence.
    pub fn check(&self) -> Result<(), String> {
        let rank = self.dims.len();
        let esize = self.dtype.size_bytes() as u64;
        if !(1..=5).contains(&rank) || self.strides.len() + 1 != rank || self.box_dims.len() != rank {
            return Err(format!("rank {rank} with {} strides and {} box dims (rank 1 to 5, one stride fewer)", self.strides.len(), self.box_dims.len()));
        }
        if self.address % 16 != 0 {
            return Err(format!("address {:#x} is not 16-byte aligned", self.address));
        }
        if let Some(d) = self.dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return Err(format!("a dimension of {d} elements (1 to 2^32)"));
        }
        if let Some(s) = self.strides.iter().find(|&&s| s % 16 != 0 || s >= 1 << 40) {
            return Err(format!("a stride of {s} bytes (a multiple of 16 below 2^40)"));
        }
        if let Some(b) = self.box_dims.iter().find(|&&b| b == 0 || b > 256) {
            return Err(format!("a box extent of {b} (1 to 256)"));
        }
        let inner = u64::from(self.box_dims[0]) * esize;
        if inner % 16 != 0 {
            return Err(format!("the box's inner extent is {inner} bytes (a multiple of 16)"));
        }
        match self.swizzle {
            0 => {}
            32 | 64 | 128 if inner <= u64::from(self.swizzle) => {}
            sw => return Err(format!("swizzle {sw} with a {inner}-byte inner box extent (0, or 32/64/128 at least the extent)")),
        }
        Ok(())
    }
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
    // In u128: three u32 extents cannot overflow it (a u64 product of damaged ones can).
    let threads: u128 = plan.block.iter().map(|&b| u128::from(b)).product();
    if threads > u128::from(MAX_THREADS_PER_BLOCK) {
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
            KernelParam::TensorMap(t) => {
                let Some(&base) = buffer_ptrs.get(t.buffer) else {
                    return Err(invalid(format!("parameter {i} is a tensor map of buffer {}, but the launch has {} buffers", t.buffer, buffer_ptrs.len())));
                };
                let eval = |d: &Dim, what: &str| -> Result<u64, RuntimeError> {
                    let v = d.eval(bindings).map_err(|source| RuntimeError::Dim { what: format!("{what} (`{d}`) of parameter {i}'s tensor map, kernel `{}`", plan.entry), source })?;
                    u64::try_from(v).map_err(|_| invalid(format!("parameter {i}'s tensor map: {what} `{d}` = {v} is negative")))
                };
                let esize = t.dtype.size_bytes() as u64;
                // Elements to bytes, and the base plus the offset, checked: huge bindings or a
                // hand-edited plan must give an error, not an overflow.
                let bytes = |d: &Dim, what: &str| -> Result<u64, RuntimeError> {
                    let v = eval(d, what)?;
                    v.checked_mul(esize).ok_or_else(|| invalid(format!("parameter {i}'s tensor map: {what} `{d}` = {v} elements overflows 64-bit bytes")))
                };
                let dims = t.dims.iter().map(|d| eval(d, "a dimension")).collect::<Result<Vec<_>, _>>()?;
                let strides = t.strides.iter().map(|d| bytes(d, "a stride")).collect::<Result<Vec<_>, RuntimeError>>()?;
                let offset = bytes(&t.offset, "the offset")?;
                let address = base.checked_add(offset).ok_or_else(|| invalid(format!("parameter {i}'s tensor map: buffer address {base:#x} + offset {offset} bytes overflows 64 bits")))?;
                let map = ResolvedTensorMap { dtype: t.dtype, address, dims, strides, box_dims: t.box_dims.clone(), swizzle: t.swizzle };
                map.check().map_err(|e| invalid(format!("parameter {i}'s tensor map over buffer {}: {e}", t.buffer)))?;
                ArgValue::TensorMap(map)
            }
        });
    }
    Ok(ResolvedLaunch { entry: plan.entry.clone(), grid, block: plan.block, shared_bytes: plan.shared_bytes, args })
}

/// The largest buffer index `plan`'s parameters name (`None`: no buffer parameter).
pub fn max_buffer_index(plan: &LaunchPlan) -> Option<usize> {
    plan.params
        .iter()
        .filter_map(|p| match p {
            KernelParam::Buffer(b) => Some(*b),
            KernelParam::TensorMap(t) => Some(t.buffer),
            KernelParam::Size(_) => None,
        })
        .max()
}

/// How many buffers `plan` refers to: one more than the largest [`KernelParam::Buffer`] index
/// (0 when it has none; `usize::MAX` for an index of `usize::MAX`, as a damaged plan may hold).
pub fn buffer_count(plan: &LaunchPlan) -> usize {
    plan.params
        .iter()
        .filter_map(|p| match p {
            KernelParam::Buffer(b) => Some(b.saturating_add(1)),
            KernelParam::TensorMap(t) => Some(t.buffer.saturating_add(1)),
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
            target: sinter_ir::Target::SM_80,
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

    /// A tensor map resolves to the buffer's address plus its offset, dims in elements and
    /// strides in bytes; what the driver would reject is an error naming the parameter, the
    /// buffer and the constraint.
    #[test]
    fn tensor_maps_resolve_and_are_checked() {
        let map = |offset: Dim, k: Dim, box0: u32, swizzle: u32| {
            let mut p = plan();
            p.params.push(KernelParam::TensorMap(sinter_ir::TensorMap {
                buffer: 1,
                dtype: DType::BF16,
                offset,
                dims: vec![k.clone(), Dim::symbol("N")],
                strides: vec![k],
                box_dims: vec![box0, 128],
                swizzle,
            }));
            p
        };
        let n = Dim::symbol("N");
        let r = resolve(&map(Dim::constant(8), n.clone(), 64, 128), &[0x1000, 0x2000], &bind(&[("N", 4096)])).unwrap();
        let Some(ArgValue::TensorMap(t)) = r.args.last() else { panic!("{:?}", r.args) };
        assert_eq!((t.address, t.dims.clone(), t.strides.clone(), t.box_dims.clone()), (0x2010, vec![4096, 4096], vec![8192], vec![64, 128]));
        for (p, n, want) in [
            (map(Dim::constant(3), n.clone(), 64, 128), 4096, "not 16-byte aligned"),
            (map(Dim::constant(0), n.clone(), 64, 128), 4100, "a multiple of 16"),
            (map(Dim::constant(0), n.clone(), 128, 128), 4096, "swizzle 128 with a 256-byte"),
            (map(Dim::constant(0), n.clone(), 300, 0), 4096, "box extent of 300"),
        ] {
            let err = resolve(&p, &[0x1000, 0x2000], &bind(&[("N", n)])).unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("buffer 1") && err.contains("k_add"), "{want}: {err}");
        }
        assert_eq!(buffer_count(&map(Dim::constant(0), n, 64, 128)), 2);
    }

    /// Bindings and plan fields at the ends of their ranges (a caller's huge size, a damaged
    /// cached plan) give errors naming the kernel, never an arithmetic overflow.
    #[test]
    fn extreme_values_are_errors_not_overflows() {
        let err = resolve(&plan(), &[1, 2], &bind(&[("N", i64::MAX)])).unwrap_err();
        assert!(matches!(err, RuntimeError::Dim { source: DimError::Overflow(_), .. }), "{err:?}");
        let mut p = plan();
        p.params.push(KernelParam::Buffer(usize::MAX));
        assert_eq!(buffer_count(&p), usize::MAX);
        assert!(resolve(&p, &[1, 2], &bind(&[("N", 1)])).unwrap_err().to_string().contains("k_add"));
        let mut p = plan();
        p.block = [u32::MAX; 3];
        assert!(matches!(resolve(&p, &[1, 2], &bind(&[("N", 1)])), Err(RuntimeError::InvalidLaunch { .. })));
        let map = |offset: i64, stride: i64| {
            let mut p = plan();
            p.params.push(KernelParam::TensorMap(sinter_ir::TensorMap {
                buffer: 1,
                dtype: DType::F32,
                offset: Dim::constant(offset),
                dims: vec![Dim::constant(64), Dim::constant(64)],
                strides: vec![Dim::constant(stride)],
                box_dims: vec![64, 64],
                swizzle: 0,
            }));
            p
        };
        for (p, base, want) in [(map(0, i64::MAX), 0x1000, "a stride"), (map(i64::MAX, 64), 0x1000, "the offset"), (map(4, 64), u64::MAX - 7, "overflows 64 bits")] {
            let err = resolve(&p, &[0x1000, base], &bind(&[("N", 1)])).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, RuntimeError::InvalidLaunch { .. }) && text.contains(want) && text.contains("k_add"), "{want}: {text}");
        }
    }
}
