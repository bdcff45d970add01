//! The evaluator's op dispatch ([`Eval::eval`]), sources (`constant`, `iota`), `dequantize`,
//! and the element-wise arithmetic: every op computes in `f32` (or in its integer dtype,
//! saturating) and rounds its result to its dtype, as the interpreter does.
//!
//! **`f8e4m3`** values are their bytes: `quantize_fp8(x, s)` is `div.rn.f32` then the
//! saturating round-to-nearest-even conversion, `dequantize_fp8(x8, s)` the exact conversion
//! to f32, `mul.rn.f32` and the rounding to its dtype, `cast` goes through the exact f32 value
//! (and rounds once on the way in), an fp8 `constant` is its byte — all bit-exact with the
//! interpreter, with `cvt … e4m3x2` on sm_89+ and integer arithmetic on sm_80 ([`crate::fp8`]).
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::types::IntType;
use inkwell::values::{BasicValueEnum, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{Attr, DType, Node, OpKind, Value, ValueDef};

use super::{bad, divisible, unsupported, At, Ax, Eval, IndexWidth, Lanes, Scalar, Tag};
use crate::math::{self, Ops, R};
use crate::error::CodegenError;

/// The deepest chain of operands one kernel evaluates: the evaluator recurses through the
/// operands, so a deeper expression is an error, not a stack overflow (the code generator's
/// threads have stacks sized for this depth).
pub(crate) const MAX_EXPR_DEPTH: usize = 2048;

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// Emits the computation of `v` at `at` (memoised).
    ///
    /// # Errors
    /// An expression deeper than [`MAX_EXPR_DEPTH`] operands; the op and builder errors.
    pub fn eval(&mut self, v: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let key = Self::key(v, at);
        if let Some(l) = self.memo.get(&key) {
            return Ok(l.clone());
        }
        if self.depth >= MAX_EXPR_DEPTH {
            return unsupported(format!("an expression more than {MAX_EXPR_DEPTH} operations deep in one kernel (at {v}): split the chain, or compile it unfused"));
        }
        self.depth += 1;
        let out = self.eval_uncached(v, at);
        self.depth -= 1;
        let out = out?;
        self.memo.insert(key, out.clone());
        Ok(out)
    }

    fn eval_uncached(&mut self, v: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let data = self.f.values.get(v).ok_or_else(|| CodegenError::Builder(format!("no value {v}")))?;
        let out = match data.def {
            ValueDef::Param(i) => {
                let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
                self.load_param(i, &buf, at)?
            }
            ValueDef::Result(node, _) => self.eval_node(node, v, at)?,
        };
        if out.len() != at.lanes as usize {
            return Err(CodegenError::Builder(format!("{} lanes computed for {}", out.len(), at.lanes)));
        }
        Ok(out)
    }

    pub(super) fn operand(&mut self, node: Node, i: usize, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, i)?;
        let from = self.shape(result)?;
        let to = self.shape(x)?;
        let a = self.broadcast_at(at, &from, &to)?;
        self.eval(x, &a)
    }

    pub(super) fn input(&self, node: Node, i: usize) -> R<Value> {
        self.f.nodes[node].inputs.get(i).copied().ok_or_else(|| CodegenError::BadKernel {
            kernel: String::new(),
            message: format!("{node} `{}` has no operand {i}", self.f.nodes[node].op.kind.name()),
        })
    }

    fn eval_node(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        use OpKind::*;
        let nd = &self.f.nodes[node];
        let kind = nd.op.kind;
        let out_dt = self.dtype(result)?;
        match kind {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Recip | Sigmoid | Silu | Gelu | Tanh | Erf | Sin | Cos | Cast => {
                let x = self.input(node, 0)?;
                let in_dt = self.dtype(x)?;
                let xs = self.operand(node, 0, result, at)?;
                let gelu_tanh = nd.op.str("form") == Some("tanh");
                xs.into_iter().map(|s| self.unary(kind, gelu_tanh, in_dt, out_dt, s)).collect()
            }
            Dequantize => self.dequantize(node, result, at, out_dt),
            QuantizeFp8 => {
                let xs = self.operand(node, 0, result, at)?;
                let ss = self.operand(node, 1, result, at)?;
                let mut q = Vec::with_capacity(xs.len());
                for (x, s) in xs.into_iter().zip(ss) {
                    q.push(self.kb.fdiv(x.f()?, s.f()?)?);
                }
                Ok(crate::fp8::from_f32(self.kb, &q)?.into_iter().map(Scalar::I).collect())
            }
            DequantizeFp8 => {
                let xs = self.operand(node, 0, result, at)?;
                let ss = self.operand(node, 1, result, at)?;
                let bytes = xs.iter().map(|x| x.i()).collect::<R<Vec<_>>>()?;
                let vals = crate::fp8::to_f32(self.kb, &bytes)?;
                let mut out = Vec::with_capacity(vals.len());
                for (v, s) in vals.into_iter().zip(ss) {
                    let p = self.kb.fmul(v, s.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(p, out_dt)?));
                }
                Ok(out)
            }
            Add | Sub | Mul | Div | Maximum | Minimum | Pow | Eq | Ne | Lt | Le | Gt | Ge => {
                let a = self.input(node, 0)?;
                let in_dt = self.dtype(a)?;
                let exponent = if kind == Pow { self.constant_of(self.input(node, 1)?) } else { None };
                let xs = self.operand(node, 0, result, at)?;
                let ys = if exponent.is_some() { xs.clone() } else { self.operand(node, 1, result, at)? };
                xs.into_iter().zip(ys).map(|(x, y)| self.binary(kind, in_dt, out_dt, x, y, exponent)).collect()
            }
            // bool is `i1` in registers (a byte in memory, read as ≠ 0).
            LogicalAnd | LogicalOr => {
                let xs = self.operand(node, 0, result, at)?;
                let ys = self.operand(node, 1, result, at)?;
                let mut out = Vec::with_capacity(xs.len());
                for (x, y) in xs.into_iter().zip(ys) {
                    let (x, y) = (x.i()?, y.i()?);
                    out.push(Scalar::I(if kind == LogicalAnd { self.kb.b.build_and(x, y, "and")? } else { self.kb.b.build_or(x, y, "or")? }));
                }
                Ok(out)
            }
            LogicalNot => {
                let xs = self.operand(node, 0, result, at)?;
                xs.into_iter().map(|x| Ok(Scalar::I(self.kb.b.build_not(x.i()?, "not")?))).collect()
            }
            Select => {
                let c = self.operand(node, 0, result, at)?;
                let a = self.operand(node, 1, result, at)?;
                let b = self.operand(node, 2, result, at)?;
                let mut out = Vec::with_capacity(c.len());
                for ((c, a), b) in c.into_iter().zip(a).zip(b) {
                    let v = self.kb.b.build_select(c.i()?, a.basic(), b.basic(), "sel")?;
                    out.push(match v {
                        BasicValueEnum::FloatValue(f) => Scalar::F(f),
                        other => Scalar::I(other.into_int_value()),
                    });
                }
                Ok(out)
            }
            Swiglu => {
                let g = self.operand(node, 0, result, at)?;
                let u = self.operand(node, 1, result, at)?;
                let precise = out_dt == DType::F32;
                let mut out = Vec::with_capacity(g.len());
                for (g, u) in g.into_iter().zip(u) {
                    let s = math::silu(self.kb, g.f()?, precise)?;
                    let s = self.kb.round_to(s, out_dt)?;
                    let p = self.kb.fmul(s, u.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(p, out_dt)?));
                }
                Ok(out)
            }
            Constant => {
                let value = match nd.op.attr("value") {
                    Some(Attr::Float(v)) => *v,
                    _ => return bad("`constant` without a value"),
                };
                let s = self.constant_scalar(out_dt, value)?;
                Ok(vec![s; at.lanes as usize])
            }
            Iota => self.iota(node, out_dt, at),
            Broadcast => self.operand(node, 0, result, at),
            Transpose | Permute => {
                let rank = at.axes.len();
                let perm: Vec<usize> = if kind == Transpose {
                    let norm = |a: i64| -> R<usize> { sinter_ir::infer::norm_axis(a, rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() }) };
                    let d0 = norm(nd.op.int("dim0").unwrap_or(-2))?;
                    let d1 = norm(nd.op.int("dim1").unwrap_or(-1))?;
                    let mut p: Vec<usize> = (0..rank).collect();
                    p.swap(d0, d1);
                    p
                } else {
                    let p = nd.op.ints("perm").unwrap_or(&[]);
                    p.iter().map(|&x| usize::try_from(x).unwrap_or(usize::MAX)).collect()
                };
                if perm.len() != rank || perm.iter().any(|&p| p >= rank) {
                    return bad(format!("{node}: permutation {perm:?} for rank {rank}"));
                }
                let mut axes = vec![self.zero_ax(); rank];
                for (i, &p) in perm.iter().enumerate() {
                    axes[p] = at.axes[i];
                }
                let x = self.input(node, 0)?;
                self.eval(x, &At { axes, lanes: at.lanes })
            }
            Slice => {
                let rank = at.axes.len();
                let axis = sinter_ir::infer::norm_axis(nd.op.int("axis").unwrap_or(-1), rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() })?;
                let start = nd.op.dim("start").cloned().ok_or_else(|| CodegenError::BadKernel { kernel: String::new(), message: "slice without start".into() })?;
                let mut axes = at.axes.clone();
                let a = at.axes[axis];
                let sv = self.dim(&start)?;
                let base = self.iadd(a.base, sv)?;
                axes[axis] = Ax { base, step: a.step, aligned: a.aligned && divisible(&start, at.lanes), zero: a.zero && start.as_const() == Some(0), tag: Tag::Other };
                let x = self.input(node, 0)?;
                self.eval(x, &At { axes, lanes: at.lanes })
            }
            Reshape => self.reshape(node, result, at),
            Concat => self.concat(node, result, at),
            Gather => self.gather(node, result, at),
            Rope | Rotary => self.rope(node, result, at),
            Softmax | LogSoftmax | RmsNorm | LayerNorm | ReduceSum | ReduceMax | ReduceMin | ReduceMean => self.row_node(node, result, at),
            Argmax => unsupported(format!("`argmax` ({node}) reaches the code generator only as its decomposition (max, compare, index, min)")),
            Matmul | Attention | PagedAttention | AttentionMerge | KvAppend | Call => unsupported(format!(
                "`{}` ({node}) cannot be computed element by element; it needs its own kernel",
                kind.name()
            )),
            AllReduce | AllGather => unsupported(format!("`{}` ({node}) is a collective: the runtime runs it between kernels", kind.name())),
        }
    }

    /// The constant value of `v` if it is a scalar (or splat) `constant`.
    fn constant_of(&self, v: Value) -> Option<f64> {
        match self.f.values.get(v)?.def {
            ValueDef::Result(n, _) => {
                let nd = &self.f.nodes[n];
                if nd.op.kind == OpKind::Constant {
                    let dt = self.f.values[v].ty.dtype;
                    nd.op.float("value").map(|x| dt.round(x))
                } else {
                    None
                }
            }
            ValueDef::Param(_) => None,
        }
    }

    /// `dequantize` of a kernel parameter (a `q8_0`/`q4_1` buffer, contiguous along its
    /// last axis) at `at`: per lane, the element's block is found from its row-major element
    /// offset (the buffer's strides are element strides) and decoded by [`crate::quant`].
    fn dequantize(&mut self, node: Node, result: Value, at: &At<'ctx>, out_dt: DType) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let in_dt = self.dtype(x)?;
        let ValueDef::Param(i) = self.f.values[x].def else {
            return unsupported(format!("`dequantize` of a computed {in_dt} value (only a kernel input is read as blocks)"));
        };
        let buf = self.params.get(i).cloned().ok_or_else(|| CodegenError::Builder(format!("no buffer for parameter {i}")))?;
        if buf.strides.last().and_then(|s| s.as_const()) != Some(1) {
            return unsupported(format!("a {in_dt} buffer whose last axis is not contiguous"));
        }
        let from = self.shape(result)?;
        let to = self.shape(x)?;
        let a = self.broadcast_at(at, &from, &to)?;
        let mut out = Vec::with_capacity(at.lanes as usize);
        for one in self.split(&a)? {
            let (off, _, _) = self.offsets(&buf.strides, &one)?;
            let v = crate::quant::element(self.kb, in_dt, buf.ptr, off)?;
            out.push(Scalar::F(self.kb.round_to(v, out_dt)?));
        }
        Ok(out)
    }

    pub(super) fn constant_scalar(&self, dt: DType, value: f64) -> R<Scalar<'ctx>> {
        let r = dt.round(value);
        Ok(match dt {
            DType::BF16 | DType::F16 | DType::F32 => Scalar::F(self.kb.f32c(r as f32)),
            DType::I32 => Scalar::I(self.kb.i32c(r as i64)),
            DType::I64 => Scalar::I(self.kb.i64c(r as i64)),
            DType::Bool => Scalar::I(self.kb.cx.bool_type().const_int(u64::from(r != 0.0), false)),
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => return unsupported(format!("a {dt} constant")),
            DType::F8E4M3 => Scalar::I(self.kb.cx.i8_type().const_int(u64::from(sinter_ir::dtype::f8e4m3_from_f64(value)), false)),
        })
    }

    fn int_type(&self, dt: DType) -> IntType<'ctx> {
        match dt {
            DType::I64 => self.kb.cx.i64_type(),
            DType::Bool => self.kb.cx.bool_type(),
            _ => self.kb.cx.i32_type(),
        }
    }

    /// An index value (this kernel's width) converted to integer dtype `dt`, saturating.
    fn index_to_int(&self, v: IntValue<'ctx>, dt: DType) -> R<IntValue<'ctx>> {
        let b = &self.kb.b;
        Ok(match (dt, self.width) {
            (DType::I64, IndexWidth::I64) | (DType::I32, IndexWidth::I32) => v,
            (DType::I64, IndexWidth::I32) => b.build_int_s_extend(v, self.kb.cx.i64_type(), "i")?,
            (DType::I32, IndexWidth::I64) => {
                let m = self.kb.i64c(i64::from(i32::MAX));
                let c = self.kb.b.build_int_compare(IntPredicate::SLT, v, m, "c")?;
                let v = b.build_select(c, v, m, "s")?.into_int_value();
                b.build_int_truncate(v, self.kb.cx.i32_type(), "i")?
            }
            _ => return bad(format!("an index as {dt}")),
        })
    }

    fn iota(&mut self, node: Node, dt: DType, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let rank = at.axes.len();
        let axis = sinter_ir::infer::norm_axis(self.f.nodes[node].op.int("axis").unwrap_or(0), rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() })?;
        let a = at.axes[axis];
        let mut out = Vec::with_capacity(at.lanes as usize);
        for l in 0..at.lanes {
            let c = if a.step && l > 0 { self.iadd(a.base, self.ic(i64::from(l)))? } else { a.base };
            out.push(match dt {
                DType::I32 | DType::I64 => Scalar::I(self.index_to_int(c, dt)?),
                DType::BF16 | DType::F16 | DType::F32 => {
                    let f = self.kb.b.build_signed_int_to_float(c, self.kb.cx.f32_type(), "f")?;
                    Scalar::F(self.kb.round_to(f, dt)?)
                }
                DType::Bool | DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K | DType::F8E4M3 => return bad(format!("iota cannot produce {dt}")),
            });
        }
        Ok(out)
    }

    // ----- element-wise arithmetic ------------------------------------------------------

    fn unary(&mut self, kind: OpKind, gelu_tanh: bool, in_dt: DType, out_dt: DType, x: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        let precise = out_dt == DType::F32;
        if kind == Cast {
            return self.cast(in_dt, out_dt, x);
        }
        if !in_dt.is_float() {
            return self.int_unary(kind, in_dt, x);
        }
        let x = x.f()?;
        let kb = &mut *self.kb;
        let r = match kind {
            Neg => kb.fneg(x)?,
            Abs => kb.fabs(x)?,
            Exp => math::exp(kb, x, precise)?,
            Log => math::log(kb, x)?,
            Sqrt => kb.fsqrt(x)?,
            Rsqrt => {
                let s = kb.fsqrt(x)?;
                let one = kb.f32c(1.0);
                kb.fdiv(one, s)?
            }
            Recip => {
                let one = kb.f32c(1.0);
                kb.fdiv(one, x)?
            }
            Sigmoid => math::sigmoid(kb, x, precise)?,
            Silu => math::silu(kb, x, precise)?,
            Gelu if gelu_tanh => math::gelu_tanh(kb, x, precise)?,
            Gelu => math::gelu_erf(kb, x, precise)?,
            Tanh => math::tanh(kb, x, precise)?,
            Erf => math::erf(kb, x)?,
            Sin => math::sincos(kb, x)?.0,
            Cos => math::sincos(kb, x)?.1,
            _ => return bad(format!("`{}` is not a unary op", kind.name())),
        };
        Ok(Scalar::F(kb.round_to(r, out_dt)?))
    }

    fn int_unary(&mut self, kind: OpKind, dt: DType, x: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        let x = x.i()?;
        if dt == DType::Bool {
            return bad(format!("`{}` is not defined on bool", kind.name()));
        }
        let zero = self.int_type(dt).const_zero();
        let neg = self.kb.intrinsic_value("llvm.ssub.sat", &[self.int_type(dt).into()], &[zero.into(), x.into()])?.into_int_value();
        match kind {
            OpKind::Neg => Ok(Scalar::I(neg)),
            OpKind::Abs => {
                let lt = self.kb.b.build_int_compare(IntPredicate::SLT, x, zero, "c")?;
                Ok(Scalar::I(self.kb.b.build_select(lt, neg, x, "abs")?.into_int_value()))
            }
            _ => bad(format!("`{}` needs a float operand, got {dt}", kind.name())),
        }
    }

    fn cast(&mut self, from: DType, to: DType, x: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        // f8e4m3 (see [`crate::fp8`]): read as its exact f32 value, then cast as an f32 is; a
        // cast to it rounds the f32 value once (integers convert to f32 first: exactly up to
        // 2²⁴, and anything larger saturates at 448 either way).
        if from == DType::F8E4M3 {
            if to == DType::F8E4M3 {
                return Ok(x);
            }
            let v = crate::fp8::to_f32(self.kb, &[x.i()?])?;
            return self.cast(DType::F32, to, Scalar::F(v[0]));
        }
        if to == DType::F8E4M3 {
            let f = match self.cast(from, DType::F32, x)? {
                Scalar::F(f) => f,
                Scalar::I(_) => return Err(CodegenError::Builder("a cast to f32 gave an integer".into())),
            };
            return Ok(Scalar::I(crate::fp8::from_f32(self.kb, &[f])?[0]));
        }
        let b = &self.kb.b;
        let f32t = self.kb.cx.f32_type();
        Ok(match (from.is_float(), to) {
            (true, DType::BF16 | DType::F16 | DType::F32) => Scalar::F(self.kb.round_to(x.f()?, to)?),
            (true, DType::I32 | DType::I64) => {
                let it = self.int_type(to);
                let v = self.kb.intrinsic_value("llvm.fptosi.sat", &[it.into(), f32t.into()], &[x.f()?.into()])?;
                Scalar::I(v.into_int_value())
            }
            (true, DType::Bool) => Scalar::I(b.build_float_compare(FloatPredicate::UNE, x.f()?, f32t.const_zero(), "b")?),
            (false, DType::BF16 | DType::F16 | DType::F32) => {
                let v = x.i()?;
                let f = if from == DType::Bool { b.build_unsigned_int_to_float(v, f32t, "f")? } else { b.build_signed_int_to_float(v, f32t, "f")? };
                Scalar::F(self.kb.round_to(f, to)?)
            }
            (_, DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K) => return unsupported(format!("a cast to {to}")),
            (_, DType::F8E4M3) => return Err(CodegenError::Builder("a cast to f8e4m3 reached the generic cast".into())),
            (false, DType::Bool) => {
                let v = x.i()?;
                Scalar::I(b.build_int_compare(IntPredicate::NE, v, v.get_type().const_zero(), "b")?)
            }
            (false, DType::I32 | DType::I64) => {
                let v = x.i()?;
                let it = self.int_type(to);
                Scalar::I(match (from, to) {
                    (DType::Bool, _) => b.build_int_z_extend(v, it, "i")?,
                    (DType::I32, DType::I64) => b.build_int_s_extend(v, it, "i")?,
                    (DType::I64, DType::I32) => {
                        let i64t = self.kb.cx.i64_type();
                        let hi = i64t.const_int(i32::MAX as u64, true);
                        let lo = i64t.const_int(i32::MIN as i64 as u64, true);
                        let v = self.kb.intrinsic_value("llvm.smin", &[i64t.into()], &[v.into(), hi.into()])?.into_int_value();
                        let v = self.kb.intrinsic_value("llvm.smax", &[i64t.into()], &[v.into(), lo.into()])?.into_int_value();
                        self.kb.b.build_int_truncate(v, it, "i")?
                    }
                    _ => v,
                })
            }
        })
    }

    fn binary(&mut self, kind: OpKind, in_dt: DType, out_dt: DType, x: Scalar<'ctx>, y: Scalar<'ctx>, exponent: Option<f64>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        if matches!(kind, Eq | Ne | Lt | Le | Gt | Ge) {
            return self.compare(kind, in_dt, x, y);
        }
        if !in_dt.is_float() {
            return self.int_binary(kind, in_dt, x, y);
        }
        let (a, c) = (x.f()?, if exponent.is_some() { x.f()? } else { y.f()? });
        let kb = &mut *self.kb;
        let r = match kind {
            Add => kb.fadd(a, c)?,
            Sub => kb.fsub(a, c)?,
            Mul => kb.fmul(a, c)?,
            Div => kb.fdiv(a, c)?,
            Maximum => kb.combine_f32(crate::isa::Combine::Max, a, c)?,
            Minimum => kb.combine_f32(crate::isa::Combine::Min, a, c)?,
            Pow => match exponent {
                Some(1.0) => a,
                Some(2.0) => kb.fmul(a, a)?,
                Some(3.0) => {
                    let sq = kb.fmul(a, a)?;
                    kb.fmul(sq, a)?
                }
                Some(0.0) => kb.f32c(1.0),
                Some(-1.0) => {
                    let one = kb.f32c(1.0);
                    kb.fdiv(one, a)?
                }
                Some(e) => {
                    let ev = kb.f32c(e as f32);
                    math::pow(kb, a, ev)?
                }
                None => math::pow(kb, a, c)?,
            },
            _ => return bad(format!("`{}` is not a binary op", kind.name())),
        };
        Ok(Scalar::F(kb.round_to(r, out_dt)?))
    }

    fn compare(&mut self, kind: OpKind, dt: DType, x: Scalar<'ctx>, y: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        let b = &self.kb.b;
        Ok(Scalar::I(if dt.is_float() {
            let p = match kind {
                Eq => FloatPredicate::OEQ,
                Ne => FloatPredicate::UNE,
                Lt => FloatPredicate::OLT,
                Le => FloatPredicate::OLE,
                Gt => FloatPredicate::OGT,
                _ => FloatPredicate::OGE,
            };
            b.build_float_compare(p, x.f()?, y.f()?, "c")?
        } else {
            let u = dt == DType::Bool;
            let p = match kind {
                Eq => IntPredicate::EQ,
                Ne => IntPredicate::NE,
                Lt if u => IntPredicate::ULT,
                Le if u => IntPredicate::ULE,
                Gt if u => IntPredicate::UGT,
                Ge if u => IntPredicate::UGE,
                Lt => IntPredicate::SLT,
                Le => IntPredicate::SLE,
                Gt => IntPredicate::SGT,
                _ => IntPredicate::SGE,
            };
            b.build_int_compare(p, x.i()?, y.i()?, "c")?
        }))
    }

    /// Integer arithmetic saturates at the dtype's range, as the interpreter's rounding does
    /// (it computes in f64 and rounds with saturation); division truncates toward zero, and
    /// a zero divisor gives 0 (the interpreter reports an error there).
    fn int_binary(&mut self, kind: OpKind, dt: DType, x: Scalar<'ctx>, y: Scalar<'ctx>) -> R<Scalar<'ctx>> {
        use OpKind::*;
        if dt == DType::Bool {
            return bad(format!("`{}` is not defined on bool", kind.name()));
        }
        let (a, c) = (x.i()?, y.i()?);
        let it = self.int_type(dt);
        let i64t = self.kb.cx.i64_type();
        let kb = &*self.kb;
        let sat = |name: &str| -> R<IntValue<'ctx>> { Ok(kb.intrinsic_value(name, &[it.into()], &[a.into(), c.into()])?.into_int_value()) };
        let r = match kind {
            Add => sat("llvm.sadd.sat")?,
            Sub => sat("llvm.ssub.sat")?,
            Maximum => sat("llvm.smax")?,
            Minimum => sat("llvm.smin")?,
            Mul | Div if dt == DType::I32 => {
                // Exact in i64, then clamp to i32.
                let a64 = kb.b.build_int_s_extend(a, i64t, "a")?;
                let c64 = kb.b.build_int_s_extend(c, i64t, "c")?;
                let r = if kind == Mul {
                    kb.b.build_int_mul(a64, c64, "m")?
                } else {
                    let zero = i64t.const_zero();
                    let is0 = kb.b.build_int_compare(IntPredicate::EQ, c64, zero, "z")?;
                    let d = kb.b.build_select(is0, i64t.const_int(1, false), c64, "d")?.into_int_value();
                    let q = kb.b.build_int_signed_div(a64, d, "q")?;
                    kb.b.build_select(is0, zero, q, "q")?.into_int_value()
                };
                let hi = i64t.const_int(i32::MAX as u64, true);
                let lo = i64t.const_int(i32::MIN as i64 as u64, true);
                let r = kb.intrinsic_value("llvm.smin", &[i64t.into()], &[r.into(), hi.into()])?.into_int_value();
                let r = kb.intrinsic_value("llvm.smax", &[i64t.into()], &[r.into(), lo.into()])?.into_int_value();
                kb.b.build_int_truncate(r, it, "i")?
            }
            Mul => {
                let st = kb.intrinsic_value("llvm.smul.with.overflow", &[it.into()], &[a.into(), c.into()])?.into_struct_value();
                let prod = kb.b.build_extract_value(st, 0, "p")?.into_int_value();
                let ovf = kb.b.build_extract_value(st, 1, "o")?.into_int_value();
                let sign = kb.b.build_xor(a, c, "s")?;
                let neg = kb.b.build_int_compare(IntPredicate::SLT, sign, it.const_zero(), "n")?;
                let lim = kb.b.build_select(neg, it.const_int(i64::MIN as u64, true), it.const_int(i64::MAX as u64, true), "l")?.into_int_value();
                kb.b.build_select(ovf, lim, prod, "m")?.into_int_value()
            }
            Div => {
                let zero = it.const_zero();
                let is0 = kb.b.build_int_compare(IntPredicate::EQ, c, zero, "z")?;
                let min = it.const_int(i64::MIN as u64, true);
                let m1 = it.const_int(u64::MAX, true);
                let amin = kb.b.build_int_compare(IntPredicate::EQ, a, min, "a")?;
                let cm1 = kb.b.build_int_compare(IntPredicate::EQ, c, m1, "c")?;
                let ovf = kb.b.build_and(amin, cm1, "o")?;
                let fix = kb.b.build_or(is0, ovf, "f")?;
                let d = kb.b.build_select(fix, it.const_int(1, false), c, "d")?.into_int_value();
                let q = kb.b.build_int_signed_div(a, d, "q")?;
                let q = kb.b.build_select(ovf, it.const_int(i64::MAX as u64, true), q, "q")?.into_int_value();
                kb.b.build_select(is0, zero, q, "q")?.into_int_value()
            }
            _ => return bad(format!("`{}` is not defined on {dt}", kind.name())),
        };
        Ok(Scalar::I(r))
    }
}
