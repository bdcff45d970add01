//! [`DeviceBuffer`]: a tensor's bytes in device memory, with its dtype and shape.

use std::sync::{Arc, Mutex};

use sinter_ir::DType;

use crate::error::RuntimeError;
use crate::pool::{Block, MemoryPool};

/// An allocation from a pool; returns its block to the pool when the last handle goes.
pub(crate) struct Allocation {
    block: Block,
    pool: Arc<Mutex<MemoryPool>>,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // A poisoned lock still holds a consistent pool (its methods do not panic midway).
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.release(self.block);
    }
}

/// A tensor in device memory: `len_bytes` bytes of `dtype` elements in `shape` at a
/// 256-byte-aligned device address, followed by a *guard tail* (the rest of the pool block,
/// at least as many bytes as asked for with [`Device::alloc_with_guard`](crate::Device::alloc_with_guard))
/// that kernels must not touch.
///
/// A `DeviceBuffer` is a handle: cloning it shares the same device memory (like a reference
/// counted pointer), and the memory goes back to the pool when the last clone is dropped.
/// Device memory is written through `&DeviceBuffer` (by kernels and by
/// [`Device::write_bytes`](crate::Device::write_bytes)): the host never holds references into
/// it, so sharing is sound; ordering follows the device's stream.
#[derive(Clone)]
pub struct DeviceBuffer {
    alloc: Arc<Allocation>,
    dtype: DType,
    shape: Vec<usize>,
    len_bytes: usize,
}

/// The bytes an element count of `dtype` occupies, or an error on overflow.
pub(crate) fn byte_len(dtype: DType, numel: usize) -> Result<usize, RuntimeError> {
    dtype
        .storage_bytes(numel)
        .ok_or_else(|| RuntimeError::Buffer(format!("{numel} elements of {dtype} overflow usize bytes or are not whole blocks")))
}

/// The element count of `shape`, or an error on overflow.
pub(crate) fn numel(shape: &[usize]) -> Result<usize, RuntimeError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| RuntimeError::Buffer(format!("the element count of shape {shape:?} overflows usize")))
}

impl DeviceBuffer {
    /// Takes a block of at least `len_bytes + guard_bytes` bytes from `pool`.
    pub(crate) fn allocate(pool: &Arc<Mutex<MemoryPool>>, dtype: DType, shape: &[usize], len_bytes: usize, guard_bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        let total = len_bytes
            .checked_add(guard_bytes)
            .ok_or_else(|| RuntimeError::Buffer(format!("{len_bytes} + {guard_bytes} guard bytes overflow usize")))?;
        let block = pool.lock().unwrap_or_else(|e| e.into_inner()).allocate(total)?;
        Ok(DeviceBuffer { alloc: Arc::new(Allocation { block, pool: pool.clone() }), dtype, shape: shape.to_vec(), len_bytes })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape, outermost axis first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element count of the shape.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the tensor's extent (what uploads and downloads cover).
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Bytes of the underlying block (extent plus guard tail), a pool size class.
    pub fn capacity_bytes(&self) -> usize {
        self.alloc.block.size
    }

    /// Bytes past the extent that belong to this buffer: the guard tail.
    pub fn guard_bytes(&self) -> usize {
        self.alloc.block.size - self.len_bytes
    }

    /// The device address of the first byte (256-byte aligned), as kernels receive it.
    pub fn device_ptr(&self) -> u64 {
        self.alloc.block.ptr
    }

    /// True when `self` and `other` share the same device memory.
    pub fn same_memory(&self, other: &DeviceBuffer) -> bool {
        Arc::ptr_eq(&self.alloc, &other.alloc)
    }

    /// The same memory seen with another dtype and shape of the same byte length (a reshape or
    /// a bit-cast; no copy).
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when the byte lengths differ.
    pub fn reinterpret(&self, dtype: DType, shape: &[usize]) -> Result<DeviceBuffer, RuntimeError> {
        let len = byte_len(dtype, numel(shape)?)?;
        if len != self.len_bytes {
            return Err(RuntimeError::Buffer(format!(
                "cannot view {} bytes ({} {:?}) as {dtype} {shape:?} ({len} bytes)",
                self.len_bytes, self.dtype, self.shape
            )));
        }
        Ok(DeviceBuffer { alloc: self.alloc.clone(), dtype, shape: shape.to_vec(), len_bytes: len })
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({}{:?} at {:#x}, {} + {} guard bytes)", self.dtype, self.shape, self.device_ptr(), self.len_bytes, self.guard_bytes())
    }
}

/// Where a guard tail was found changed by [`Device::guard_violation`](crate::Device::guard_violation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardViolation {
    /// Offset from the buffer's start, in bytes (at least `len_bytes`).
    pub offset: usize,
    /// The byte found there.
    pub found: u8,
    /// The poison pattern expected.
    pub expected: u8,
    /// How many bytes of the tail differ.
    pub changed: usize,
}

impl std::fmt::Display for GuardViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} guard bytes changed, the first at byte offset {} ({:#04x}, expected {:#04x})", self.changed, self.offset, self.found, self.expected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::tests::FakeAllocator;

    #[test]
    fn buffers_share_memory_and_release_once() {
        let fake = FakeAllocator::with_capacity(1 << 20);
        let pool = Arc::new(Mutex::new(MemoryPool::new(Box::new(fake.clone()))));
        let a = DeviceBuffer::allocate(&pool, DType::F32, &[3, 5], 60, 0).unwrap();
        assert_eq!(a.len_bytes(), 60);
        assert_eq!(a.capacity_bytes(), 256);
        assert_eq!(a.guard_bytes(), 196);
        assert_eq!(a.device_ptr() % 256, 0);
        let b = a.clone();
        assert!(a.same_memory(&b));
        drop(a);
        assert_eq!(pool.lock().unwrap().stats().live_bytes, 256);
        drop(b);
        let s = pool.lock().unwrap().stats();
        assert_eq!((s.live_bytes, s.cached_bytes), (0, 256));
        // The next buffer of that class reuses the block.
        let c = DeviceBuffer::allocate(&pool, DType::BF16, &[100], 200, 0).unwrap();
        assert_eq!(pool.lock().unwrap().stats().reuses, 1);
        let v = c.reinterpret(DType::F32, &[50]).unwrap();
        assert!(v.same_memory(&c));
        assert!(c.reinterpret(DType::F32, &[51]).is_err());
    }

    #[test]
    fn guard_request_grows_the_block() {
        let fake = FakeAllocator::with_capacity(1 << 20);
        let pool = Arc::new(Mutex::new(MemoryPool::new(Box::new(fake))));
        let a = DeviceBuffer::allocate(&pool, DType::F32, &[64], 256, 64).unwrap();
        assert_eq!(a.len_bytes(), 256);
        assert!(a.guard_bytes() >= 64, "{a:?}");
        assert!(matches!(DeviceBuffer::allocate(&pool, DType::F32, &[64], usize::MAX, 1), Err(RuntimeError::Buffer(_))));
        assert!(numel(&[usize::MAX, 2]).is_err());
        assert!(byte_len(DType::I64, usize::MAX / 4).is_err());
    }
}
