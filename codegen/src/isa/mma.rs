//! Ampere-style tensor cores (sm_80+): `ldmatrix` fragment loads, the `m16n8k16` warp MMA, and
//! the packing of register fragments (bf16/f16 pairs, `f8e4m3` quadruples, byte transposes).
//!
//! Design notes: book/src/design/isa.md

use inkwell::values::{BasicMetadataValueEnum, FloatValue, IntValue, PointerValue};
use sinter_ir::DType;

use super::builder::basic;
use super::KernelBuilder;
use crate::math::R;
use crate::error::CodegenError;

impl<'ctx> KernelBuilder<'ctx> {
    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16` (PTX ISA §9.7.14.5.15;
    /// `llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16` and its `.x1`/`.x2`/`.trans`
    /// variants): the warp loads `count` (1, 2 or 4) 8×8 matrices of 16-bit elements from
    /// shared memory. Lane `8·j + r` supplies `ptr`, the address of row `r` of matrix `j`
    /// (16 contiguous bytes, 16-byte aligned; lanes beyond `8·count` supply nothing); every
    /// lane receives one `i32` per matrix: without `trans`, lane `l` gets elements
    /// `(l/4, 2·(l%4))` and `(l/4, 2·(l%4)+1)` of matrix `j` (low half first); with `trans`,
    /// elements `(2·(l%4), l/4)` and `(2·(l%4)+1, l/4)` — the transposed matrix.
    ///
    /// These are the register fragments of `mma.m16n8k16` ([`KernelBuilder::mma_m16n8k16`]):
    /// a 16×16 A tile stored row-major (K contiguous) is one `x4` with lane `l` pointing at
    /// row `l % 16`, column `8·(l / 16)`; stored column-major (M contiguous), the same with
    /// `trans`. A 16(K)×16(N) B tile stored N-major (`[N, K]`, K contiguous) is one `x4` with
    /// lane `l` at row `(l % 8) + 8·(l / 16)`, column `8·((l / 8) % 2)`, giving the fragments
    /// of two n8 tiles; stored K-major (`[K, N]`) the same with `trans` and rows/columns
    /// swapped. All 32 lanes must execute it (`.sync.aligned`).
    ///
    /// # Errors
    /// [`CodegenError::Builder`], also for a `count` other than 1, 2, 4.
    pub fn ldmatrix(&self, ptr: PointerValue<'ctx>, count: u32, trans: bool) -> R<Vec<IntValue<'ctx>>> {
        if !matches!(count, 1 | 2 | 4) {
            return Err(CodegenError::Builder(format!("ldmatrix of {count} matrices")));
        }
        let name = format!("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{}.b16", if trans { ".trans" } else { "" });
        // Overloaded on the pointer (`.p3` for shared memory).
        let v = self.intrinsic_value(&name, &[ptr.get_type().into()], &[ptr.into()])?;
        if count == 1 {
            return Ok(vec![v.into_int_value()]);
        }
        let s = v.into_struct_value();
        (0..count).map(|i| Ok(self.b.build_extract_value(s, i, "frag")?.into_int_value())).collect()
    }

    /// [`KernelBuilder::ldmatrix`] of four matrices: the A fragment of one `m16n8k16`, or
    /// the B fragments of two.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn ldmatrix_x4(&self, ptr: PointerValue<'ctx>, trans: bool) -> R<[IntValue<'ctx>; 4]> {
        let v = self.ldmatrix(ptr, 4, trans)?;
        Ok([v[0], v[1], v[2], v[3]])
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` (PTX ISA
    /// §9.7.14.5.14; `llvm.nvvm.mma.m16n8k16.row.col.bf16` / `.f32.f32` for f16): the warp
    /// computes `D = A·B + C` for a 16×16 A (`dtype` bf16 or f16), a 16×8 B and f32 C, D,
    /// with products exact and sums in f32. With `g = lane / 4`, `t = lane % 4`, each lane
    /// holds (each `i32` two 16-bit elements, the lower column or row first):
    /// - `a[0]`: A(g, 2t..2t+1), `a[1]`: A(g+8, 2t..), `a[2]`: A(g, 2t+8..), `a[3]`: A(g+8, 2t+8..);
    /// - `b[0]`: B(2t..2t+1, g), `b[1]`: B(2t+8..2t+9, g);
    /// - `c[0]`, `c[1]`: C(g, 2t), C(g, 2t+1); `c[2]`, `c[3]`: C(g+8, 2t), C(g+8, 2t+1) — and D alike.
    ///
    /// [`KernelBuilder::ldmatrix`] loads A and B fragments in this layout; for an A made in
    /// registers (attention's P), [`KernelBuilder::pack_x2`] packs two f32s. All 32 lanes
    /// must execute it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`], also for a `dtype` other than bf16 and f16.
    pub fn mma_m16n8k16(&self, dtype: DType, a: [IntValue<'ctx>; 4], b: [IntValue<'ctx>; 2], c: [FloatValue<'ctx>; 4]) -> R<[FloatValue<'ctx>; 4]> {
        let name = match dtype {
            DType::BF16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            DType::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
            other => return Err(CodegenError::Builder(format!("mma.m16n8k16 of {other}"))),
        };
        let mut args: Vec<BasicMetadataValueEnum<'ctx>> = Vec::with_capacity(10);
        for x in a.iter().chain(&b) {
            if dtype == DType::F16 {
                let h2 = self.cx.f16_type().vec_type(2);
                args.push(self.b.build_bit_cast(*x, h2, "h2")?.into());
            } else {
                args.push((*x).into());
            }
        }
        args.extend(c.iter().map(|&x| BasicMetadataValueEnum::from(x)));
        let s = self.intrinsic_value(name, &[], &args)?.into_struct_value();
        let d = |i: u32| -> R<FloatValue<'ctx>> { Ok(self.b.build_extract_value(s, i, "d")?.into_float_value()) };
        Ok([d(0)?, d(1)?, d(2)?, d(3)?])
    }

    /// Two f32s rounded to nearest even into `dtype` (bf16 or f16) and packed into one `i32`
    /// (`lo` in bits 0–15, `hi` in 16–31): a register of an `mma` A or B fragment
    /// (`cvt.rn.bf16x2.f32` / `cvt.rn.f16x2.f32`, PTX ISA §9.7.9.21).
    ///
    /// # Errors
    /// [`CodegenError::Builder`], also for another `dtype`.
    pub fn pack_x2(&self, dtype: DType, lo: FloatValue<'ctx>, hi: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(CodegenError::Builder(format!("pack_x2 of {dtype}")));
        }
        let vt = self.float_type(dtype).vec_type(2);
        let mut v = vt.get_poison();
        for (i, x) in [lo, hi].into_iter().enumerate() {
            let r = self.from_f32(x, dtype)?;
            v = self.b.build_insert_element(v, r, self.i32c(i as i64), "p")?;
        }
        Ok(self.b.build_bit_cast(v, self.cx.i32_type(), "x2")?.into_int_value())
    }

    /// Four f32s rounded to nearest even into `f8e4m3` (OCP E4M3) with saturation to ±448 (NaN
    /// stays NaN) and packed into one `i32`, `x[0]` in bits 0–7 … `x[3]` in 24–31: two
    /// `cvt.rn.satfinite.e4m3x2.f32` (PTX ISA §9.7.9.21, sm_89+; the first source goes to the
    /// upper byte) and a `mov.b32` of the halves — a register of an e4m3 `wgmma` A fragment.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn pack_e4m3x4(&self, x: [FloatValue<'ctx>; 4]) -> R<IntValue<'ctx>> {
        let (i32t, f32t) = (self.cx.i32_type(), self.cx.f32_type());
        let fty = i32t.fn_type(&[f32t.into(); 4], false);
        let text = "{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\ncvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\nmov.b32 $0, {lo, hi};\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,f,f,f,f".to_owned(), false, false, None, false);
        let args: Vec<BasicMetadataValueEnum<'ctx>> = x.iter().map(|&v| v.into()).collect();
        let r = self.b.build_indirect_call(fty, f, &args, "e4m3x4")?;
        Ok(basic(r.try_as_basic_value().basic(), "inline asm")?.into_int_value())
    }

    /// The two `f8e4m3` values in the low 16 bits of `x` (an `i32`; bits 0–7 first) as f32s,
    /// exactly: `cvt.rn.f16x2.e4m3x2` (PTX ISA §9.7.9.21) then f16 → f32.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn e4m3x2_to_f32(&self, x: IntValue<'ctx>) -> R<[FloatValue<'ctx>; 2]> {
        let w = self.e4m3x2_to_f16x2(x)?;
        let h2 = self.b.build_bit_cast(w, self.cx.f16_type().vec_type(2), "h2")?.into_vector_value();
        let f32t = self.cx.f32_type();
        let e = |i: u64| -> R<FloatValue<'ctx>> {
            let h = self.b.build_extract_element(h2, self.cx.i32_type().const_int(i, false), "")?.into_float_value();
            Ok(self.b.build_float_ext(h, f32t, "")?)
        };
        Ok([e(0)?, e(1)?])
    }

    /// The two `f8e4m3` values in the low 16 bits of `x` (an `i32`; bits 0–7 first) widened
    /// exactly to an f16 pair, packed into an `i32` (the first in bits 0–15):
    /// `cvt.rn.f16x2.e4m3x2` (PTX ISA §9.7.9.21).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn e4m3x2_to_f16x2(&self, x: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let fty = i32t.fn_type(&[i32t.into()], false);
        let text = "{\n.reg .b16 h;\ncvt.u16.u32 h, $1;\ncvt.rn.f16x2.e4m3x2 $0, h;\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,r".to_owned(), false, false, None, false);
        let r = self.b.build_indirect_call(fty, f, &[x.into()], "e4m3x2")?;
        Ok(basic(r.try_as_basic_value().basic(), "inline asm")?.into_int_value())
    }

    /// The 4×4 byte transpose of `rows` (four `i32`s, byte `j` of row `i` = element `(i, j)`):
    /// word `j` of the result holds bytes `(0, j), (1, j), (2, j), (3, j)`, low byte first.
    /// Eight `prmt.b32` (PTX ISA §9.7.8.7), one inline-asm block.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn transpose_bytes_4x4(&self, rows: [IntValue<'ctx>; 4]) -> R<[IntValue<'ctx>; 4]> {
        let i32t = self.cx.i32_type();
        let out_ty = self.cx.struct_type(&[i32t.into(); 4], false);
        let fty = out_ty.fn_type(&[i32t.into(); 4], false);
        let text = "{\n.reg .b32 t0, t1, t2, t3;\nprmt.b32 t0, $4, $5, 0x5140;\nprmt.b32 t1, $4, $5, 0x7362;\nprmt.b32 t2, $6, $7, 0x5140;\nprmt.b32 t3, $6, $7, 0x7362;\nprmt.b32 $0, t0, t2, 0x5410;\nprmt.b32 $1, t0, t2, 0x7632;\nprmt.b32 $2, t1, t3, 0x5410;\nprmt.b32 $3, t1, t3, 0x7632;\n}";
        let f = self.cx.create_inline_asm(fty, text.to_owned(), "=r,=r,=r,=r,r,r,r,r".to_owned(), false, false, None, false);
        let args: Vec<BasicMetadataValueEnum<'ctx>> = rows.iter().map(|&v| v.into()).collect();
        let st = basic(self.b.build_indirect_call(fty, f, &args, "t4x4")?.try_as_basic_value().basic(), "inline asm")?.into_struct_value();
        let e = |i: u32| -> R<IntValue<'ctx>> { Ok(self.b.build_extract_value(st, i, "")?.into_int_value()) };
        Ok([e(0)?, e(1)?, e(2)?, e(3)?])
    }
}
