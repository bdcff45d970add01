//! fp8 (`f8e4m3`) operands of the tensor-core kernels: recognising `dequantize_fp8(x8, scale)`
//! of a kernel input ([`fp8_operand`]) and loading its scale ([`fp8_scale`]). Shared by the
//! matmul and attention families.

use inkwell::values::FloatValue;
use sinter_ir::{DType, Function, OpKind, Value, ValueDef};

use super::view::BufInfo;
use crate::isa::kit::{Kit, R};

/// Where an fp8 operand's scale (an f32 scalar, `f32[]`) comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fp8Scale {
    /// Kernel input `i`.
    Buffer(usize),
    /// A constant of the body (its value rounded to f32, as the interpreter rounds it).
    Const(f32),
}

/// When `v` is `dequantize_fp8(x8, scale)`: `Ok((x8, scale))` for an `x8` and a scale the fp8
/// kernel reads (`x8` is checked with the operand's views; the scale is an f32 kernel input
/// or a constant), or why it cannot read them; `None` when `v` is something else.
pub(crate) fn fp8_operand(body: &Function, v: Value, buffers: &[BufInfo]) -> Option<Result<(Value, Fp8Scale), String>> {
    let ValueDef::Result(n, _) = body.values.get(v)?.def else { return None };
    let nd = body.nodes.get(n)?;
    if nd.op.kind != OpKind::DequantizeFp8 {
        return None;
    }
    let [x8, scale] = nd.inputs[..] else { return Some(Err(format!("`dequantize_fp8` {} needs two operands", body.label(v)))) };
    let scale_def = body.values.get(scale).map(|d| d.def.clone());
    let scale = match scale_def {
        Some(ValueDef::Param(i)) if buffers.get(i).is_some_and(|b| b.dtype == DType::F32) => Fp8Scale::Buffer(i),
        Some(ValueDef::Result(c, _)) if body.nodes.get(c).is_some_and(|c| c.op.kind == OpKind::Constant) => match body.nodes[c].op.float("value") {
            Some(x) => Fp8Scale::Const(x as f32),
            None => return Some(Err(format!("the scale {} of `dequantize_fp8` is not a float constant", body.label(scale)))),
        },
        _ => return Some(Err(format!("the scale {} of `dequantize_fp8` is neither an f32 kernel input nor a constant", body.label(scale)))),
    };
    Some(Ok((x8, scale)))
}

/// An fp8 operand's scale as an f32: loaded from its kernel input (a scalar, `f32[]`) or
/// the constant.
pub(crate) fn fp8_scale<'ctx>(kit: &Kit<'ctx>, scale: Fp8Scale) -> R<FloatValue<'ctx>> {
    match scale {
        Fp8Scale::Buffer(i) => kit.load_vec(DType::F32, kit.buf(i)?, kit.i64c(0), 1)?.pop().ok_or_else(|| kit.err("no scale loaded")),
        Fp8Scale::Const(x) => Ok(kit.f32c(f64::from(x))),
    }
}
