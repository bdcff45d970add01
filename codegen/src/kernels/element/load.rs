//! Loads and stores of the evaluator's buffers.
//!
//! A load whose lane axis is the buffer's contiguous innermost axis, at an offset proven to
//! be a multiple of `lanes`, in a buffer aligned enough, is one vector load (16 bytes for 8
//! `bf16`, 4 `f32`); any other load is done lane by lane. Stores likewise.
//!
//! **`f8e4m3`** is held as its byte (`Scalar::I` of an `i8`): loaded and stored as stored
//! (16 lanes are one 16-byte vector access where the offsets prove it aligned).
//!
//! **`bf16` as words.** A `bf16` input whose every use computes in f32 ([`words_params`]) is
//! loaded as `i32` words and split with `w << 16` and `w & 0xffff0000` (exact): one
//! instruction an element where `cvt.f32.bf16` of a high half costs two. An input that is
//! added, multiplied or copied keeps the `fpext` through which LLVM narrows `round(a·b)` to a
//! `bf16x2` multiply.
//!
//! Design notes: book/src/design/element-wise.md

use std::collections::HashMap;

use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim, Function, Node, OpKind, Value};

use super::{bad, divisible, unsupported, At, Buf, Eval, Lanes, Offsets, Scalar};
use crate::isa::storage_type;
use crate::math::R;
use crate::error::CodegenError;

/// A load as it came from memory: one vector (of the storage type, or of `i32` words for
/// `bf16` read as words), or one storage value per lane (a single value: every lane reads
/// it).
pub(super) enum Raw<'ctx> {
    Vector(inkwell::values::VectorValue<'ctx>),
    Lanes(Vec<BasicValueEnum<'ctx>>),
    /// Already decoded (a lane-by-lane load that nothing stages).
    Decoded(Lanes<'ctx>),
}

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// The element offset of `at` in a buffer with `strides`: the uniform part, and the lane
    /// axis's base and stride if there is one lane axis. `aligned`: the uniform part is a
    /// provable multiple of the lane count.
    pub(super) fn offsets(&mut self, strides: &[Dim], at: &At<'ctx>) -> R<Offsets<'ctx>> {
        if strides.len() != at.axes.len() {
            return bad(format!("a coordinate of rank {} for a buffer of rank {}", at.axes.len(), strides.len()));
        }
        let mut off = self.ic(0);
        let mut aligned = true;
        let mut steps = Vec::new();
        for (a, s) in at.axes.iter().zip(strides) {
            if a.zero || s.as_const() == Some(0) {
                continue;
            }
            if a.step && at.lanes > 1 {
                steps.push((*a, s.clone()));
                if !(a.aligned || divisible(s, at.lanes)) {
                    aligned = false;
                }
                let sv = self.dim(s)?;
                let t = self.imul(a.base, sv)?;
                off = self.iadd(off, t)?;
                continue;
            }
            if !(a.aligned || divisible(s, at.lanes)) {
                aligned = false;
            }
            let sv = self.dim(s)?;
            let t = self.imul(a.base, sv)?;
            off = self.iadd(off, t)?;
        }
        Ok((off, steps, aligned))
    }

    /// Loads `at` from `buf`: one vector load when the lane axis is contiguous and aligned,
    /// else lane by lane (one load, splat, when every lane reads the same element). Returns
    /// the memory access, not yet decoded ([`Eval::decode_raw`]; `words`: a `bf16` vector as
    /// `i32` words, see [`words_params`]).
    pub(super) fn load_raw(&mut self, buf: &Buf<'ctx>, at: &At<'ctx>, words: bool, keep_raw: bool) -> R<Raw<'ctx>> {
        let (off, steps, aligned) = self.offsets(&buf.strides, at)?;
        let st = storage_type(self.kb.cx, buf.dtype);
        let size = buf.dtype.size_bytes() as u32;
        let lanes = at.lanes;
        if steps.is_empty() || lanes == 1 {
            let p = self.kb.gep(st, buf.ptr, off)?;
            let v = self.kb.load(st, p, size.min(buf.align.max(1)))?;
            return Ok(Raw::Lanes(vec![v]));
        }
        let unit = steps.len() == 1 && steps[0].1.as_const() == Some(1);
        let vbytes = lanes * size;
        if unit && aligned && vbytes.is_power_of_two() && buf.align >= vbytes.min(16) {
            let vt = self.raw_vector_type(buf.dtype, lanes, words)?;
            let p = self.kb.gep(st, buf.ptr, off)?;
            let v = self.kb.load(vt.into(), p, vbytes.min(buf.align).min(64))?.into_vector_value();
            return Ok(Raw::Vector(v));
        }
        // Lane by lane: lane l is at off + l·(Σ lane-axis strides).
        let mut lane_stride = self.ic(0);
        for (_, s) in &steps {
            let sv = self.dim(s)?;
            lane_stride = self.iadd(lane_stride, sv)?;
        }
        let mut out = Vec::with_capacity(lanes as usize);
        let mut decoded = Vec::with_capacity(lanes as usize);
        for l in 0..lanes {
            let d = self.imul(lane_stride, self.ic(i64::from(l)))?;
            let o = self.iadd(off, d)?;
            let p = self.kb.gep(st, buf.ptr, o)?;
            let v = self.kb.load(st, p, size.min(buf.align.max(1)))?;
            if keep_raw {
                out.push(v);
            } else {
                decoded.push(self.decode_storage(buf.dtype, v)?);
            }
        }
        Ok(if keep_raw { Raw::Lanes(out) } else { Raw::Decoded(decoded) })
    }

    /// The vector type a vector load of `lanes` elements of `dtype` uses: `i32` words for
    /// `bf16` read as words, else the storage type.
    pub(super) fn raw_vector_type(&self, dtype: DType, lanes: u32, words: bool) -> R<inkwell::types::VectorType<'ctx>> {
        if words && dtype == DType::BF16 && lanes % 2 == 0 {
            Ok(self.kb.cx.i32_type().vec_type(lanes / 2))
        } else {
            storage_type(self.kb.cx, dtype).vec_type_of(lanes)
        }
    }

    /// Decodes a load into `lanes` scalars.
    pub(super) fn decode_raw(&self, dtype: DType, raw: Raw<'ctx>, lanes: u32) -> R<Lanes<'ctx>> {
        match raw {
            Raw::Lanes(v) if v.len() == 1 => Ok(vec![self.decode_storage(dtype, v[0])?; lanes as usize]),
            Raw::Lanes(v) => v.into_iter().map(|e| self.decode_storage(dtype, e)).collect(),
            Raw::Decoded(v) => Ok(v),
            Raw::Vector(v) => {
                let n = v.get_type().get_size();
                let words = v.get_type().get_element_type().is_int_type() && dtype == DType::BF16;
                let mut out = Vec::with_capacity(lanes as usize);
                let f32t = self.kb.cx.f32_type();
                for i in 0..n {
                    let e = self.kb.b.build_extract_element(v, self.kb.i32c(i64::from(i)), "e")?;
                    if words {
                        let w = e.into_int_value();
                        let lo = self.kb.b.build_left_shift(w, self.kb.i32c(16), "lo")?;
                        let hi = self.kb.b.build_and(w, self.kb.i32c(-65536), "hi")?;
                        out.push(Scalar::F(self.kb.b.build_bit_cast(lo, f32t, "lo")?.into_float_value()));
                        out.push(Scalar::F(self.kb.b.build_bit_cast(hi, f32t, "hi")?.into_float_value()));
                    } else {
                        out.push(self.decode_storage(dtype, e)?);
                    }
                }
                if out.len() != lanes as usize {
                    return Err(CodegenError::Builder(format!("{} lanes decoded for {lanes}", out.len())));
                }
                Ok(out)
            }
        }
    }

    /// Parameter `i` at `at` as one vector load as it comes from memory (of the storage type,
    /// or of `i32` words for a `bf16` parameter read as words), bypassing the stage, for
    /// [`Eval::pinned`]: `None` (nothing emitted that is used) where `at` is not a contiguous,
    /// aligned vector of the buffer.
    ///
    /// # Errors
    /// [`CodegenError::Builder`] for an unknown parameter.
    pub fn load_vector(&mut self, i: usize, at: &At<'ctx>) -> R<Option<inkwell::values::VectorValue<'ctx>>> {
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no parameter {i}")))?;
        let words = self.bf16_words.contains(&i);
        match self.load_raw(&buf, at, words, true)? {
            Raw::Vector(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    fn decode_storage(&self, dtype: DType, v: BasicValueEnum<'ctx>) -> R<Scalar<'ctx>> {
        Ok(match dtype {
            DType::BF16 | DType::F16 | DType::F32 => Scalar::F(self.kb.to_f32(v.into_float_value())?),
            DType::I32 | DType::I64 => Scalar::I(v.into_int_value()),
            DType::Bool => {
                let z = self.kb.cx.i8_type().const_zero();
                Scalar::I(self.kb.b.build_int_compare(IntPredicate::NE, v.into_int_value(), z, "b")?)
            }
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => return unsupported(format!("a {dtype} tensor read other than by `dequantize`")),
            // Held as its bit pattern (see [`crate::fp8`]).
            DType::F8E4M3 => Scalar::I(v.into_int_value()),
        })
    }

    fn encode_storage(&self, dtype: DType, s: Scalar<'ctx>) -> R<BasicValueEnum<'ctx>> {
        Ok(match dtype {
            DType::BF16 | DType::F16 | DType::F32 => self.kb.from_f32(s.f()?, dtype)?.as_basic_value_enum(),
            DType::I32 | DType::I64 => s.i()?.as_basic_value_enum(),
            DType::Bool => self.kb.b.build_int_z_extend(s.i()?, self.kb.cx.i8_type(), "b")?.as_basic_value_enum(),
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => return unsupported(format!("a {dtype} result")),
            DType::F8E4M3 => {
                let v = s.i()?;
                if v.get_type().get_bit_width() != 8 {
                    return Err(CodegenError::Builder(format!("an f8e4m3 value of {} bits", v.get_type().get_bit_width())));
                }
                v.as_basic_value_enum()
            }
        })
    }

    /// Stores `vals` at `at` into `buf` (a vector store when contiguous and aligned).
    pub fn store(&mut self, buf: &Buf<'ctx>, at: &At<'ctx>, vals: &[Scalar<'ctx>]) -> R<()> {
        let (off, steps, aligned) = self.offsets(&buf.strides, at)?;
        let st = storage_type(self.kb.cx, buf.dtype);
        let size = buf.dtype.size_bytes() as u32;
        let lanes = at.lanes;
        if vals.len() != lanes as usize {
            return Err(CodegenError::Builder(format!("{} values for {lanes} lanes", vals.len())));
        }
        if lanes == 1 || steps.is_empty() {
            // Every lane writes one element: write it once (a uniform output over a lane axis
            // only happens for a broadcast output, which the generators reject).
            let p = self.kb.gep(st, buf.ptr, off)?;
            let v = self.encode_storage(buf.dtype, vals[0])?;
            return self.kb.store(p, v, size.min(buf.align.max(1)));
        }
        let unit = steps.len() == 1 && steps[0].1.as_const() == Some(1);
        let vbytes = lanes * size;
        if unit && aligned && vbytes.is_power_of_two() && buf.align >= vbytes.min(16) {
            let vt = st.vec_type_of(lanes)?;
            let mut v = vt.get_undef();
            for (l, s) in vals.iter().enumerate() {
                let e = self.encode_storage(buf.dtype, *s)?;
                v = self.kb.b.build_insert_element(v, e, self.kb.i32c(l as i64), "v")?;
            }
            let p = self.kb.gep(st, buf.ptr, off)?;
            return self.kb.store(p, v.as_basic_value_enum(), vbytes.min(buf.align).min(64));
        }
        let mut lane_stride = self.ic(0);
        for (_, s) in &steps {
            let sv = self.dim(s)?;
            lane_stride = self.iadd(lane_stride, sv)?;
        }
        for (l, s) in vals.iter().enumerate() {
            let d = self.imul(lane_stride, self.ic(l as i64))?;
            let o = self.iadd(off, d)?;
            let p = self.kb.gep(st, buf.ptr, o)?;
            let v = self.encode_storage(buf.dtype, *s)?;
            self.kb.store(p, v, size.min(buf.align.max(1)))?;
        }
        Ok(())
    }
}

/// The `bf16` parameters of `f` whose vector loads are best decoded as `i32` words: a
/// 16-byte load as four `i32`, each split with integer operations (`w << 16` and `w &
/// 0xffff0000` are the two f32 values, exactly): one instruction an element, where
/// extracting the high half and converting it (`cvt.f32.bf16`) costs two. Those whose every use (through views: `broadcast`, `reshape`, `slice`,
/// `transpose`, `permute`) computes in f32 — the reduced operand of a row node, a
/// `layer_norm`'s weight and bias, `rope`'s input, `rotary`'s operands, a transcendental or a cast, a `swiglu`'s
/// gate. A value added, multiplied or compared (where LLVM may narrow the f32 operation back
/// to a `bf16x2` one: `fptrunc(fpext a · fpext b)` is exact), copied to an output, or used
/// anywhere else keeps the `fpext` LLVM can see through.
pub(crate) fn words_params(f: &Function) -> std::collections::HashSet<usize> {
    use OpKind::*;
    let mut users: HashMap<Value, Vec<(Node, usize)>> = HashMap::new();
    for (n, nd) in f.nodes.iter() {
        for (i, &v) in nd.inputs.iter().enumerate() {
            users.entry(v).or_default().push((n, i));
        }
    }
    let computes_f32 = |v: Value| -> bool {
        let mut stack = vec![v];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            if f.outputs.contains(&v) {
                return false;
            }
            for &(n, i) in users.get(&v).map(Vec::as_slice).unwrap_or(&[]) {
                let nd = &f.nodes[n];
                let ok = match nd.op.kind {
                    Broadcast | Reshape | Slice | Transpose | Permute => {
                        stack.extend(nd.results.iter().copied());
                        true
                    }
                    Softmax | LogSoftmax | RmsNorm | ReduceSum | ReduceMax | ReduceMin | ReduceMean => i == 0,
                    LayerNorm => true,
                    Rope => i == 0,
                    Rotary => true,
                    Swiglu => i == 0,
                    Exp | Log | Sqrt | Rsqrt | Recip | Sigmoid | Silu | Gelu | Tanh | Erf | Sin | Cos | Cast => true,
                    _ => false,
                };
                if !ok {
                    return false;
                }
            }
        }
        true
    };
    f.params.iter().enumerate().filter(|&(_, &p)| f.ty(p).dtype == DType::BF16 && computes_f32(p)).map(|(i, _)| i).collect()
}

trait VecTypeOf<'ctx> {
    fn vec_type_of(self, lanes: u32) -> R<inkwell::types::VectorType<'ctx>>;
}

impl<'ctx> VecTypeOf<'ctx> for BasicTypeEnum<'ctx> {
    fn vec_type_of(self, lanes: u32) -> R<inkwell::types::VectorType<'ctx>> {
        Ok(match self {
            BasicTypeEnum::FloatType(t) => t.vec_type(lanes),
            BasicTypeEnum::IntType(t) => t.vec_type(lanes),
            other => return Err(CodegenError::Builder(format!("no vector of {other:?}"))),
        })
    }
}
