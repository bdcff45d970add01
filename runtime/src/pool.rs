//! [`MemoryPool`]: device allocations reused by size class.
//!
//! Freed blocks are kept on a free list per size class and handed out again to the next
//! request of the same class, so a decode loop that allocates the same temporaries every step
//! reaches a steady state with no driver allocations. Every block is 256-byte aligned and at
//! least 256 bytes long. The pool is independent of CUDA: it drives a [`RawAllocator`], which
//! on a device is the driver's `cuMemAlloc`/`cuMemFree` and in tests a fake.
//!
//! Reuse is safe because all work of a [`Device`](crate::Device) runs in order on its one
//! stream: a block released after a kernel was *enqueued* is only written by work enqueued
//! later.

use std::collections::BTreeMap;

use crate::error::RuntimeError;

/// Alignment and granularity of every block, in bytes.
pub const BLOCK_ALIGN: usize = 256;

/// The source of raw device memory under a [`MemoryPool`].
pub trait RawAllocator: Send {
    /// Allocates `bytes` bytes (already a size class) and returns the device address, aligned
    /// to at least [`BLOCK_ALIGN`] bytes.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the memory is not there (the pool then releases its
    /// cached blocks and tries once more); any other error is passed on.
    fn allocate(&mut self, bytes: usize) -> Result<u64, RuntimeError>;

    /// Returns a block obtained from [`RawAllocator::allocate`] with the same size.
    fn free(&mut self, ptr: u64, bytes: usize);

    /// Free device memory in bytes, for out-of-memory reports (0 when unknown).
    fn free_memory(&self) -> usize;
}

/// A block of device memory handed out by a [`MemoryPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// Device address, [`BLOCK_ALIGN`]-aligned.
    pub ptr: u64,
    /// Length in bytes: the size class of the request.
    pub size: usize,
}

/// Counters of a [`MemoryPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks obtained from the raw allocator (driver allocations).
    pub driver_allocations: u64,
    /// Requests served from the free lists.
    pub reuses: u64,
    /// Bytes in blocks currently handed out.
    pub live_bytes: usize,
    /// Bytes in blocks on the free lists.
    pub cached_bytes: usize,
    /// The largest `live_bytes + cached_bytes` seen, in bytes.
    pub peak_bytes: usize,
}

/// The size class of a request of `bytes` bytes, or `None` when it overflows `usize`.
///
/// Requests are rounded up to a multiple of 256 bytes (at least 256); above 4 KiB they are
/// further rounded to a multiple of one eighth of the largest power of two not above them, so
/// that a class wastes at most 12.5% and a few classes cover each octave.
pub fn size_class(bytes: usize) -> Option<usize> {
    let r = round_up(bytes.max(1), BLOCK_ALIGN)?;
    if r <= 4096 {
        return Some(r);
    }
    let top = 1usize << (usize::BITS - 1 - r.leading_zeros());
    round_up(r, (top / 8).max(BLOCK_ALIGN))
}

fn round_up(n: usize, m: usize) -> Option<usize> {
    n.checked_add(m - 1).map(|x| x / m * m)
}

/// Device allocations reused by size class (see the module docs).
pub struct MemoryPool {
    allocator: Box<dyn RawAllocator>,
    free: BTreeMap<usize, Vec<u64>>,
    stats: PoolStats,
}

impl MemoryPool {
    /// A pool over `allocator`, with empty free lists.
    pub fn new(allocator: Box<dyn RawAllocator>) -> MemoryPool {
        MemoryPool { allocator, free: BTreeMap::new(), stats: PoolStats::default() }
    }

    /// A block of at least `bytes` bytes: a cached block of the same size class if there is
    /// one, else a new one from the allocator.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the allocator has no memory even after the cached
    /// blocks were released (`requested` is the size class); other allocator errors as they
    /// come.
    pub fn allocate(&mut self, bytes: usize) -> Result<Block, RuntimeError> {
        let Some(size) = size_class(bytes) else {
            return Err(RuntimeError::OutOfMemory { requested: bytes, free: self.allocator.free_memory() });
        };
        if let Some(ptr) = self.free.get_mut(&size).and_then(Vec::pop) {
            self.stats.reuses += 1;
            self.stats.cached_bytes -= size;
            self.stats.live_bytes += size;
            return Ok(Block { ptr, size });
        }
        let ptr = match self.allocator.allocate(size) {
            Ok(p) => p,
            Err(RuntimeError::OutOfMemory { .. }) if self.stats.cached_bytes > 0 => {
                self.trim();
                self.allocator.allocate(size)?
            }
            Err(e) => return Err(e),
        };
        if ptr % BLOCK_ALIGN as u64 != 0 {
            self.allocator.free(ptr, size);
            return Err(RuntimeError::Buffer(format!("the allocator returned {ptr:#x}, which is not {BLOCK_ALIGN}-byte aligned")));
        }
        self.stats.driver_allocations += 1;
        self.stats.live_bytes += size;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.live_bytes + self.stats.cached_bytes);
        Ok(Block { ptr, size })
    }

    /// Puts a block back on its free list (it stays allocated on the device).
    pub fn release(&mut self, block: Block) {
        self.stats.live_bytes = self.stats.live_bytes.saturating_sub(block.size);
        self.stats.cached_bytes += block.size;
        self.free.entry(block.size).or_default().push(block.ptr);
    }

    /// Returns every cached block to the allocator; returns the bytes released.
    pub fn trim(&mut self) -> usize {
        let mut released = 0;
        for (size, ptrs) in std::mem::take(&mut self.free) {
            for ptr in ptrs {
                self.allocator.free(ptr, size);
                released += size;
            }
        }
        self.stats.cached_bytes = 0;
        released
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Free device memory as the allocator reports it, in bytes.
    pub fn free_memory(&self) -> usize {
        self.allocator.free_memory()
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        self.trim();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A fake device: hands out increasing addresses from a fixed capacity and records frees.
    #[derive(Clone, Default)]
    pub(crate) struct FakeAllocator {
        pub(crate) state: Arc<Mutex<FakeState>>,
    }

    #[derive(Default)]
    pub(crate) struct FakeState {
        pub(crate) next: u64,
        pub(crate) used: usize,
        pub(crate) capacity: usize,
        pub(crate) allocs: Vec<(u64, usize)>,
        pub(crate) frees: Vec<(u64, usize)>,
    }

    impl FakeAllocator {
        pub(crate) fn with_capacity(capacity: usize) -> FakeAllocator {
            let a = FakeAllocator::default();
            if let Ok(mut s) = a.state.lock() {
                s.capacity = capacity;
                s.next = 0x1000_0000;
            }
            a
        }
    }

    impl RawAllocator for FakeAllocator {
        fn allocate(&mut self, bytes: usize) -> Result<u64, RuntimeError> {
            let mut s = self.state.lock().unwrap();
            if s.used + bytes > s.capacity {
                return Err(RuntimeError::OutOfMemory { requested: bytes, free: s.capacity - s.used });
            }
            let p = s.next;
            s.next += bytes as u64;
            s.used += bytes;
            s.allocs.push((p, bytes));
            Ok(p)
        }
        fn free(&mut self, ptr: u64, bytes: usize) {
            let mut s = self.state.lock().unwrap();
            s.used -= bytes;
            s.frees.push((ptr, bytes));
        }
        fn free_memory(&self) -> usize {
            let s = self.state.lock().unwrap();
            s.capacity - s.used
        }
    }

    #[test]
    fn size_classes_are_aligned_and_bounded() {
        assert_eq!(size_class(0), Some(256));
        assert_eq!(size_class(1), Some(256));
        assert_eq!(size_class(256), Some(256));
        assert_eq!(size_class(257), Some(512));
        assert_eq!(size_class(4096), Some(4096));
        assert_eq!(size_class(4097), Some(4608));
        assert_eq!(size_class(1_000_000), Some(1_048_576));
        assert_eq!(size_class(usize::MAX), None);
        for n in (1..5_000_000).step_by(9973) {
            let c = size_class(n).unwrap();
            assert!(c >= n && c % BLOCK_ALIGN == 0, "{n} -> {c}");
            assert!(c <= n + n / 8 + BLOCK_ALIGN, "class of {n} wastes too much: {c}");
        }
    }

    #[test]
    fn pool_reuses_freed_blocks_of_the_same_class() {
        let fake = FakeAllocator::with_capacity(1 << 20);
        let mut pool = MemoryPool::new(Box::new(fake.clone()));
        let a = pool.allocate(1000).unwrap();
        assert_eq!(a.size, 1024);
        pool.release(a);
        // 900 bytes rounds to the same class: the same block comes back.
        let b = pool.allocate(900).unwrap();
        assert_eq!(b, a);
        // A different class is a new driver allocation.
        let c = pool.allocate(2000).unwrap();
        assert_ne!(c.ptr, a.ptr);
        let s = pool.stats();
        assert_eq!(s.driver_allocations, 2);
        assert_eq!(s.reuses, 1);
        assert_eq!(s.live_bytes, 1024 + 2048);
        assert_eq!(s.cached_bytes, 0);
        pool.release(b);
        pool.release(c);
        assert_eq!(pool.stats().cached_bytes, 3072);
        assert_eq!(pool.trim(), 3072);
        assert_eq!(fake.state.lock().unwrap().frees.len(), 2);
    }

    #[test]
    fn out_of_memory_trims_cache_then_reports_error() {
        let fake = FakeAllocator::with_capacity(8192);
        let mut pool = MemoryPool::new(Box::new(fake.clone()));
        let a = pool.allocate(4096).unwrap();
        pool.release(a); // cached: 4096 of 8192 bytes held.
        // 8192 fits only once the cached block is returned to the allocator.
        let b = pool.allocate(8192).unwrap();
        assert_eq!(b.size, 8192);
        assert_eq!(fake.state.lock().unwrap().frees, vec![(a.ptr, 4096)]);
        match pool.allocate(256) {
            Err(RuntimeError::OutOfMemory { requested, free }) => {
                assert_eq!(requested, 256);
                assert_eq!(free, 0);
            }
            other => panic!("expected OutOfMemory, got {:?}", other.map(|_| ())),
        }
        let msg = pool.allocate(1 << 30).map(|_| ()).unwrap_err().to_string();
        assert!(msg.contains("out of device memory"), "{msg}");
    }

    #[test]
    fn dropping_the_pool_frees_cached_blocks() {
        let fake = FakeAllocator::with_capacity(1 << 20);
        {
            let mut pool = MemoryPool::new(Box::new(fake.clone()));
            let a = pool.allocate(300).unwrap();
            let b = pool.allocate(300).unwrap();
            pool.release(a);
            pool.release(b);
        }
        let s = fake.state.lock().unwrap();
        assert_eq!(s.frees.len(), 2);
        assert_eq!(s.used, 0);
    }

    #[test]
    fn misaligned_allocator_is_an_error() {
        struct Bad;
        impl RawAllocator for Bad {
            fn allocate(&mut self, _: usize) -> Result<u64, RuntimeError> {
                Ok(0x1001)
            }
            fn free(&mut self, _: u64, _: usize) {}
            fn free_memory(&self) -> usize {
                0
            }
        }
        let mut pool = MemoryPool::new(Box::new(Bad));
        assert!(matches!(pool.allocate(10), Err(RuntimeError::Buffer(_))));
    }
}
