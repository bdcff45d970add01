//! How the row reductions' one-read schedule cuts a row among threads ([`OneRead`]), and so
//! the order in which it sums the row: shared by the row-reduction family, which sums that
//! way, and the matmul's norm prologue, which sums a row the same way so that its statistics
//! have the same bits as the norm's own kernel.
//!
//! The order, for a row of `n` elements cut as `(threads, vec, chunks)`: thread `t` (lane
//! `t mod 32` of warp `t / 32`) folds its chunks `c = 0, 1, …` in turn — the `vec` elements
//! from `j = c·threads·vec + t·vec`, a chunk past the row's end skipped — each chunk's
//! element values summed left to right and the sum added to the running value (from −0);
//! then a butterfly over the warp (lane masks 16, 8, 4, 2, 1); then, with more than one
//! warp, the warps' totals through shared memory, lane `l` taking warp `l mod w`'s and
//! butterflies over masks 1, 2, …, w/2. Every merge is an IEEE `f32` addition, commutative,
//! so every thread ends with the same bits.
//!
//! Design notes: book/src/design/reductions.md

use sinter_ir::Dim;

use super::element::divisible;

/// Elements a thread may hold in registers in the one-read schedule.
pub(crate) const MAX_ELEMS_PER_THREAD: u32 = 32;

/// The one-read cut of a row: `threads` threads a row (32, a warp, four rows a CTA; or a
/// power of two from 64 to 1024, a CTA a row), each holding `chunks` vectors of `vec`
/// consecutive elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OneRead {
    /// Threads reducing one row.
    pub threads: u32,
    /// Rows a CTA reduces (4 in warp mode, else 1).
    pub rows_per_cta: u32,
    /// Consecutive elements a thread loads at once.
    pub vec: u32,
    /// Vectors a thread holds.
    pub chunks: u32,
}

/// The vector width of rows of `n` elements whose narrowest row-varying buffer element is
/// `min_size` bytes: 16 bytes of it, halved until it divides `n`.
pub(crate) fn row_vec(n: &Dim, min_size: usize) -> u32 {
    let mut vec = (16 / min_size.max(1)).clamp(1, 8) as u32;
    while vec > 1 && !divisible(n, vec) {
        vec /= 2;
    }
    vec
}

/// The one-read cut of a constant row of `n` elements (see [`row_vec`] for `min_size`;
/// `heavy`: the body has a `layer_norm`, four vectors a thread rather than two), or `None`
/// when the row is symbolic or too long for a thread's registers (the multi-pass and cluster
/// schedules then take it).
pub(crate) fn one_read(n: &Dim, min_size: usize, heavy: bool) -> Option<OneRead> {
    let vec = row_vec(n, min_size);
    let n = n.as_const()?.max(0) as u64;
    let groups = n.div_ceil(u64::from(vec));
    if groups <= 64 {
        return Some(OneRead { threads: 32, rows_per_cta: 4, vec, chunks: groups.div_ceil(32) as u32 });
    }
    let per_thread = if heavy { 4 } else { 2 };
    let t = groups.div_ceil(per_thread).next_power_of_two().clamp(64, 1024) as u32;
    let chunks = groups.div_ceil(u64::from(t)) as u32;
    // 1024 threads leave 64 registers a thread: half the elements.
    let limit = if t == 1024 { MAX_ELEMS_PER_THREAD / 2 } else { MAX_ELEMS_PER_THREAD };
    (chunks * vec <= limit).then_some(OneRead { threads: t, rows_per_cta: 1, vec, chunks })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cuts of the decode models' hidden sizes: two vectors a thread over 64 to 512
    /// threads; short rows a warp; 16384 elements is the longest one-read row whatever the
    /// vector width.
    #[test]
    fn cuts_of_hidden_sizes() {
        let c = |n: i64, size| one_read(&Dim::constant(n), size, false).map(|o| (o.threads, o.vec, o.chunks));
        assert_eq!(c(576, 2), Some((64, 8, 2)));
        assert_eq!(c(2048, 2), Some((128, 8, 2)));
        assert_eq!(c(576, 4), Some((128, 4, 2)));
        assert_eq!(c(2048, 4), Some((256, 4, 2)));
        assert_eq!(c(8192, 2), Some((512, 8, 2)));
        assert_eq!(c(256, 2), Some((32, 8, 1)));
        assert_eq!(c(16384, 2), Some((1024, 8, 2)));
        assert_eq!(c(16383, 2), Some((1024, 1, 16)));
        assert_eq!(c(16385, 2), None);
        assert_eq!(c(16392, 2), None);
        assert_eq!(one_read(&Dim::symbol("D"), 2, false), None);
    }
}
