//! Shared-memory staging: the cluster schedule of the row reductions reads a CTA's slice of a
//! row once from global memory and keeps it in shared memory for the later passes. A load of
//! a staged row input at the current chunk's own coordinate is stored there by the first pass
//! (or copied there ahead by `cp.async`) and read from there by the others ([`Stage`]).
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::values::{AsValueRef, BasicValue, IntValue, PointerValue};
use sinter_ir::DType;

use super::load::Raw;
use super::{At, Buf, Eval, Lanes, Tag};
use crate::isa::storage_type;
use crate::math::R;
use crate::error::CodegenError;
use std::collections::HashMap;

/// Shared-memory staging of a row reduction's row-varying parameters (the cluster schedule of
/// the row reductions): the first pass over a CTA's slice of the row loads each such parameter from
/// global memory and also stores it, as loaded, into a shared-memory array (*fills*); later
/// passes (statistics of deeper levels, the outputs) read it from there. A load is staged
/// only at the current chunk's own coordinate (the row's lead coordinates and the chunk's
/// column, [`Stage::cursor`]), outside any branch; any other load reads global memory.
pub(crate) struct Stage<'ctx> {
    /// The staged parameters: parameter index → its array (`addrspace(3)`, storage type,
    /// 16-byte aligned, indexed by [`Stage::cursor`]'s slot).
    pub arrays: HashMap<usize, PointerValue<'ctx>>,
    /// Parameters filled by an earlier pass: read from shared memory.
    pub ready: std::collections::HashSet<usize>,
    /// Parameters filled during the current pass.
    pub filling: std::collections::HashSet<usize>,
    /// Whether the current pass may fill (the output pass does not: nothing reads after it).
    pub fill: bool,
    /// The current chunk: the base of its last (row) axis, as the coordinate carries it, and
    /// its element index in the arrays.
    pub cursor: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
    /// Elements per chunk.
    pub lanes: u32,
    /// Row-invariant parameters (shape `[1…, N]`) staged too: filled by the row's prefetch
    /// (while `resident_fill`), read by every pass after it at the chunk's own column
    /// ([`Tag::Ref`] of the row axis `row_axis`).
    pub resident: std::collections::HashSet<usize>,
    pub resident_fill: bool,
    pub row_axis: usize,
}

impl<'ctx> Stage<'ctx> {
    /// Ends a pass: what it filled is read from now on.
    pub fn end_pass(&mut self) {
        let filled: Vec<usize> = self.filling.drain().collect();
        self.ready.extend(filled);
        self.cursor = None;
    }
}

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// Whether parameter `i` read at `at` is staged ([`Stage`]): `Some(true)` to read it
    /// from shared memory, `Some(false)` to load and fill, `None` for a plain load.
    fn staged(&self, i: usize, at: &At<'ctx>) -> Option<bool> {
        let st = self.stage.as_ref()?;
        let (base, _) = st.cursor?;
        if self.branch_depth > 0 || !st.arrays.contains_key(&i) || at.lanes != st.lanes {
            return None;
        }
        let k = at.axes.len().checked_sub(1)?;
        let last = at.axes[k];
        if st.resident.contains(&i) {
            let own = last.tag == Tag::Ref(st.row_axis) && last.base.as_value_ref() == base.as_value_ref() && at.axes[..k].iter().all(|a| a.zero);
            return own.then_some(!st.resident_fill);
        }
        let own = at.axes[..k].iter().enumerate().all(|(a, ax)| ax.tag == Tag::Ref(a))
            && last.tag == Tag::Ref(k)
            && last.base.as_value_ref() == base.as_value_ref();
        if !own {
            return None;
        }
        if st.ready.contains(&i) {
            Some(true)
        } else if st.fill {
            Some(false)
        } else {
            None
        }
    }

    /// The address of the current chunk's slot ([`Stage::cursor`]) in parameter `i`'s stage
    /// array (elements of `dtype`'s storage type).
    fn stage_slot(&self, i: usize, dtype: DType) -> R<PointerValue<'ctx>> {
        let st = self.stage.as_ref().ok_or_else(|| CodegenError::Builder("no stage".into()))?;
        let arr = st.arrays.get(&i).copied().ok_or_else(|| CodegenError::Builder("no stage array".into()))?;
        let (_, slot) = st.cursor.ok_or_else(|| CodegenError::Builder("no stage cursor".into()))?;
        self.kb.gep(storage_type(self.kb.cx, dtype), arr, slot)
    }

    /// Parameter `i` (buffer `buf`) at `at`, through the stage when it applies.
    pub(super) fn load_param(&mut self, i: usize, buf: &Buf<'ctx>, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let pin = self.pinned.iter().find(|(p, b, _)| *p == i && at.axes.last().is_some_and(|a| a.base.as_value_ref() == b.as_value_ref())).map(|e| e.2);
        if let Some(v) = pin {
            return self.decode_raw(buf.dtype, Raw::Vector(v), at.lanes);
        }
        let words = self.bf16_words.contains(&i);
        let Some(read) = self.staged(i, at) else {
            let raw = self.load_raw(buf, at, words, false)?;
            return self.decode_raw(buf.dtype, raw, at.lanes);
        };
        let lanes = at.lanes;
        let stt = storage_type(self.kb.cx, buf.dtype);
        let p = self.stage_slot(i, buf.dtype)?;
        let size = buf.dtype.size_bytes() as u32;
        let vbytes = (lanes * size).min(16);
        let raw = if read {
            if lanes == 1 {
                Raw::Lanes(vec![self.kb.load(stt, p, size)?])
            } else {
                let vt = self.raw_vector_type(buf.dtype, lanes, words)?;
                Raw::Vector(self.kb.load(vt.into(), p, vbytes)?.into_vector_value())
            }
        } else {
            let raw = self.load_raw(buf, at, words, true)?;
            match &raw {
                Raw::Decoded(_) => return Err(CodegenError::Builder("a staged load decoded early".into())),
                Raw::Vector(v) => self.kb.store(p, (*v).into(), vbytes)?,
                Raw::Lanes(v) if lanes == 1 => self.kb.store(p, v[0], size)?,
                Raw::Lanes(v) => {
                    // Gathered lane by lane (or one value for every lane): stored as a vector.
                    let vt = self.raw_vector_type(buf.dtype, lanes, words)?;
                    let words = vt.get_element_type().is_int_type() && buf.dtype == DType::BF16;
                    let mut vv = vt.get_undef();
                    let n = vt.get_size();
                    for j in 0..n {
                        let e = if words {
                            let i16t = self.kb.cx.i16_type();
                            let i32t = self.kb.cx.i32_type();
                            let pick = |l: usize| if v.len() == 1 { v[0] } else { v[l] };
                            let lo = self.kb.b.build_bit_cast(pick(2 * j as usize), i16t, "lo")?.into_int_value();
                            let hi = self.kb.b.build_bit_cast(pick(2 * j as usize + 1), i16t, "hi")?.into_int_value();
                            let lo = self.kb.b.build_int_z_extend(lo, i32t, "lo")?;
                            let hi = self.kb.b.build_int_z_extend(hi, i32t, "hi")?;
                            let hi = self.kb.b.build_left_shift(hi, self.kb.i32c(16), "hi")?;
                            self.kb.b.build_or(hi, lo, "w")?.as_basic_value_enum()
                        } else if v.len() == 1 {
                            v[0]
                        } else {
                            v[j as usize]
                        };
                        vv = self.kb.b.build_insert_element(vv, e, self.kb.i32c(i64::from(j)), "st")?;
                    }
                    self.kb.store(p, vv.into(), vbytes)?;
                }
            }
            if let Some(st) = self.stage.as_mut() {
                st.filling.insert(i);
            }
            raw
        };
        self.decode_raw(buf.dtype, raw, lanes)
    }

    /// Fills parameter `i`'s stage slot for `at` (the current chunk, [`Stage::cursor`])
    /// without reading it: one 16-byte `cp.async.cg.shared.global` (PTX ISA §9.7.9.25.3) when
    /// the stage fills `i` at `at` and `at` is a contiguous, aligned 16-byte vector of the
    /// buffer; otherwise nothing (the next pass loads and fills it as usual). The copy lands
    /// when the thread's `cp.async.wait_group` says so; only the issuing thread reads the slot
    /// (the stage's slots are thread-private: every pass maps a chunk to the same thread), so
    /// no barrier is needed. Returns whether a `cp.async` was issued.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn prefetch_param(&mut self, i: usize, at: &At<'ctx>) -> R<bool> {
        if self.staged(i, at) != Some(false) {
            return Ok(false);
        }
        let issued = self.cp_async_to_slot(i, at, self.kb.i32c(16))?;
        if issued {
            if let Some(st) = self.stage.as_mut() {
                st.filling.insert(i);
            }
        }
        Ok(issued)
    }

    /// Copies parameter `i` at `at` (a chunk of another row at the current chunk's column)
    /// into the current chunk's stage slot by one 16-byte `cp.async` of `src_bytes` (16, or 0:
    /// the slot is zeroed and nothing is read), whatever the stage holds now: a persistent row
    /// schedule's refill, after the thread's last read of the slot. Returns `false` (nothing
    /// issued) where the chunk is not a contiguous, aligned 16-byte vector.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] without a stage array for `i` or a current chunk.
    pub fn refill_param(&mut self, i: usize, at: &At<'ctx>, src_bytes: IntValue<'ctx>) -> R<bool> {
        let lanes = self.stage.as_ref().ok_or_else(|| CodegenError::Builder("no stage".into()))?.lanes;
        if at.lanes != lanes {
            return Ok(false);
        }
        self.cp_async_to_slot(i, at, src_bytes)
    }

    /// The one `cp.async` of [`Eval::prefetch_param`] and [`Eval::refill_param`]: parameter
    /// `i` at `at` into the current chunk's stage slot, `src_bytes` of 16 read, where `at` is
    /// a contiguous, aligned 16-byte vector of the buffer (`false`, nothing issued, elsewhere).
    fn cp_async_to_slot(&mut self, i: usize, at: &At<'ctx>, src_bytes: IntValue<'ctx>) -> R<bool> {
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
        let size = buf.dtype.size_bytes() as u32;
        let (off, steps, aligned) = self.offsets(&buf.strides, at)?;
        let unit = steps.len() == 1 && steps[0].1.as_const() == Some(1);
        if !(unit && aligned && at.lanes * size == 16 && buf.align >= 16) {
            return Ok(false);
        }
        let dst = self.stage_slot(i, buf.dtype)?;
        let src = self.kb.gep(storage_type(self.kb.cx, buf.dtype), buf.ptr, off)?;
        self.kb.cp_async_16(dst, src, src_bytes)?;
        Ok(true)
    }

    /// Fills parameter `i`'s stage slot for `at` (the current chunk): by [`Eval::prefetch_param`]'s
    /// `cp.async` where it applies, else by a load and a store (visible to the thread itself
    /// at once). Returns whether a `cp.async` was issued.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn fill_param(&mut self, i: usize, at: &At<'ctx>) -> R<bool> {
        if self.staged(i, at) != Some(false) {
            return Err(CodegenError::Builder(format!("parameter {i} is not filled at this coordinate")));
        }
        if self.prefetch_param(i, at)? {
            return Ok(true);
        }
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
        self.load_param(i, &buf, at)?;
        Ok(false)
    }
}
