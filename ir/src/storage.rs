//! Where the storage-only dtypes may appear: block-quantized tensors (`q8_0`, `q4_1`, `q5_0`,
//! `q4_k`, `q6_k`) are read
//! only by `dequantize`, `f8e4m3` only by the conversions and the data movement ops. The
//! verifier, the interpreter and the e-graph's analysis all ask here.

use crate::dtype::DType;
use crate::infer::ShapeError;
use crate::ops::{Op, OpKind};
use crate::types::TensorType;

fn err<T>(msg: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(msg.into()))
}

/// Checks where a block-quantized dtype (`q8_0`, `q4_1`, `q5_0`, `q4_k`, `q6_k`) may appear: as the operand of
/// `dequantize` (which reads it) and as an argument or result of `call` (which passes it on);
/// anywhere else it is an error that names the operand or result.
///
/// # Errors
/// A message naming the op and the operand or result of quantized dtype.
pub fn check_quantized(op: &Op, inputs: &[&TensorType], results: &[TensorType]) -> Result<(), ShapeError> {
    let name = op.kind.name();
    match op.kind {
        OpKind::Call => return Ok(()),
        OpKind::Dequantize => {}
        _ => {
            if let Some((i, t)) = inputs.iter().enumerate().find(|(_, t)| t.dtype.is_quantized()) {
                let operand = op.kind.info().operands.get(i).map(|s| s.trim_end_matches(['?', '*'])).unwrap_or("operand");
                return err(format!(
                    "`{name}` does not read block-quantized tensors: operand {i} (`{operand}`) is {t}; only `dequantize` reads block-quantized tensors (write `dequantize(%x) {{dtype=bf16}}` first)"
                ));
            }
        }
    }
    if let Some((i, t)) = results.iter().enumerate().find(|(_, t)| t.dtype.is_quantized()) {
        return err(format!("`{name}` cannot produce a block-quantized tensor: result {i} would be {t}; block-quantized tensors come only from parameters"));
    }
    Ok(())
}

/// Whether op `kind` accepts `f8e4m3` operands. `f8e4m3` is a storage type: it is read by the
/// conversions (`cast`, `dequantize_fp8`), moved by the layout ops (`transpose`, `permute`,
/// `reshape`, `broadcast`, `concat`, `slice`, `gather`'s table, `select`'s branches) and passed
/// through `call`; arithmetic, comparisons, reductions, `matmul`, attention and the norms do
/// not compute on it (they read `dequantize_fp8`'s result, which a fused kernel recomputes from
/// the fp8 bytes: `matmul(dequantize_fp8(a8, sa), dequantize_fp8(b8, sb))` is the fp8 matmul).
pub fn accepts_fp8(kind: OpKind) -> bool {
    use OpKind::*;
    matches!(kind, Cast | DequantizeFp8 | Transpose | Permute | Reshape | Broadcast | Concat | Slice | Gather | Select | Call)
}

/// Whether op `kind` may produce an `f8e4m3` result: the ops of [`accepts_fp8`] (whose results
/// carry their operands' dtype), `quantize_fp8`, and `constant` (a value rounded to it).
pub fn produces_fp8(kind: OpKind) -> bool {
    use OpKind::*;
    (accepts_fp8(kind) && kind != DequantizeFp8) || matches!(kind, QuantizeFp8 | Constant)
}

/// The message for operand `i` of type `ty` (printed) of op `kind` being `f8e4m3` where
/// [`accepts_fp8`] says no: it names the operand and says how to read the value.
pub fn fp8_operand_message(kind: OpKind, i: usize, ty: &str) -> String {
    use OpKind::*;
    let name = kind.name();
    let operand = kind.info().operands.get(i).or(kind.info().operands.last()).map(|s| s.trim_end_matches(['?', '*'])).unwrap_or("operand");
    let hint = match kind {
        Matmul => "; an fp8 matmul is `matmul(dequantize_fp8(a8, sa) {dtype=bf16}, dequantize_fp8(b8, sb) {dtype=bf16})`, which the compiler keeps one kernel reading the fp8 bytes",
        _ => "",
    };
    format!("`{name}` does not compute on f8e4m3 (a storage type): operand {i} (`{operand}`) is {ty}; read it with `dequantize_fp8(%x, %scale) {{dtype=bf16}}` (or `cast`) first{hint}")
}

/// Checks where `f8e4m3` may appear ([`accepts_fp8`], [`produces_fp8`]).
///
/// # Errors
/// A message naming the op and the operand or result of dtype `f8e4m3`.
pub fn check_fp8(op: &Op, inputs: &[&TensorType], results: &[TensorType]) -> Result<(), ShapeError> {
    if !accepts_fp8(op.kind) {
        if let Some((i, t)) = inputs.iter().enumerate().find(|(_, t)| t.dtype.is_fp8()) {
            return err(fp8_operand_message(op.kind, i, &t.to_string()));
        }
    }
    if !produces_fp8(op.kind) {
        if let Some((i, t)) = results.iter().enumerate().find(|(_, t)| t.dtype.is_fp8()) {
            return err(format!(
                "`{}` cannot produce f8e4m3: result {i} would be {t}; f8e4m3 values come from `quantize_fp8`, `cast` and parameters",
                op.kind.name()
            ));
        }
    }
    Ok(())
}

/// Checks a block-quantized tensor type: rank ≥ 1 and a last axis that is provably a whole
/// number of blocks (of 32, or 256 for the k-quants: a constant multiple, or a symbolic dim
/// with that factor).
///
/// # Errors
/// A message naming the type.
pub fn check_quantized_type(t: &TensorType) -> Result<(), ShapeError> {
    if !t.dtype.is_quantized() {
        return Ok(());
    }
    let block = t.dtype.block_elems().unwrap_or(DType::QBLOCK);
    match t.shape.last() {
        Some(d) if d.div_exact(block as i64).is_some() => Ok(()),
        _ => err(format!("{t}: a block-quantized tensor's last axis must be a multiple of the block size {block}")),
    }
}
