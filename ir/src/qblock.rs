//! The block-quantized storage types (GGUF's `ggml` blocks, llama.cpp `ggml-common.h`) as the
//! reference interpreter holds them: one integer code per element, exact in an `f64`, which
//! carries the element's quant and every scale of its block that the element's value needs.
//!
//! | dtype | block | bytes | layout | value |
//! |---|---|---|---|---|
//! | `q8_0` | 32 | 34 | `f16 d`, `i8 q[32]` | `q·d` |
//! | `q4_1` | 32 | 20 | `f16 d`, `f16 m`, `u8 qs[16]` | `nibble·d + m` |
//! | `q5_0` | 32 | 22 | `f16 d`, `u32 qh`, `u8 qs[16]` | `(nibble + 16·bit − 16)·d` |
//! | `q4_k` | 256 | 144 | `f16 d`, `f16 dmin`, `u8 scales[12]`, `u8 qs[128]` | `(d·sc)·nibble − dmin·mn` |
//! | `q6_k` | 256 | 210 | `u8 ql[128]`, `u8 qh[64]`, `i8 scales[16]`, `f16 d` | `(d·sc)·(q − 32)` |
//!
//! Where the elements sit (as `dequantize_row_*` of `ggml-quants.c` reads them):
//! - `q4_1`, `q5_0`: the low nibbles of `qs[0..16]` are elements 0..16, the high nibbles
//!   elements 16..32; bit `j` of `q5_0`'s little-endian `qh` is the fifth bit of element `j`.
//! - `q4_k`: eight sub-blocks of 32 with a 6-bit scale `sc` and a 6-bit min `mn` each,
//!   packed in `scales` (`get_scale_min_k4`: sub-block `j < 4` has `sc = scales[j] & 63`,
//!   `mn = scales[j+4] & 63`; `j ≥ 4` has `sc = scales[j+4] & 15 | (scales[j-4] >> 6) << 4`,
//!   `mn = scales[j+4] >> 4 | (scales[j] >> 6) << 4`). Each 64 elements `64c..64c+64` take
//!   the 32 bytes `qs[32c..32c+32]`: low nibbles first, then high nibbles.
//! - `q6_k`: each 128 elements `128h..` take `ql[64h..64h+64]` and `qh[32h..32h+32]`; element
//!   `128h + 32k + l` (`k < 4`, `l < 32`) has low four bits from `ql[64h + l + 32·(k & 1)]`
//!   (low nibble for `k < 2`, high for `k ≥ 2`) and high two bits `(qh[32h + l] >> 2k) & 3`;
//!   element `e` has the signed scale `scales[e / 16]`.
//!
//! Values are what llama.cpp computes in `f32`: `q8_0`, `q4_1` (one rounding of an exact
//! product plus `m`) and `q5_0` are exact in `f64` before their one rounding; `q4_k` rounds
//! `(d·sc)·nibble − dmin·mn` once in `f32` (both products are exact), `q6_k` rounds
//! `(d·sc)·(q − 32)` once in `f32` (`d·sc` is exact). [`QCode::value`] gives that `f32` value.

use crate::dtype::DType;

/// One element of a block-quantized tensor as the reference interpreter holds it: its block's
/// `f16` scale `d` and `f16` minimum `m` (`q4_1`; `dmin` for `q4_k`; 0 otherwise) as bit
/// patterns, its sub-block's scale `sc` (`q4_k`: 6 bits; `q6_k`: `i8` bits) and minimum `mn`
/// (`q4_k`: 6 bits), and its own quant `q` (`q8_0`: `i8` bits; `q4_1`, `q4_k`: a nibble;
/// `q5_0`: 5 bits; `q6_k`: 6 bits).
///
/// The interpreter keeps every element of a tensor as one `f64`; for the block types that
/// `f64` is this integer code, exact in an `f64`:
///
/// | dtype | code | bits |
/// |---|---|---|
/// | `q8_0` | `d << 8 \| q` | 24 |
/// | `q4_1` | `d << 20 \| m << 4 \| q` | 36 |
/// | `q5_0` | `d << 5 \| q` | 21 |
/// | `q4_k` | `d << 32 \| m << 16 \| sc << 10 \| mn << 4 \| q` | 48 |
/// | `q6_k` | `d << 14 \| sc << 6 \| q` | 30 |
///
/// Every element carries its block's (and sub-block's) scales; encoding to bytes takes them
/// from the first element of the block (and of each sub-block).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QCode {
    /// The block's `f16` scale, as bits.
    pub d: u16,
    /// The block's `f16` minimum (`q4_1`) or minimum scale `dmin` (`q4_k`), as bits; 0 for
    /// the other types.
    pub m: u16,
    /// The sub-block's scale: 6 bits (`q4_k`) or `i8` bits (`q6_k`); 0 for the other types.
    pub sc: u8,
    /// The sub-block's 6-bit minimum (`q4_k`); 0 for the other types.
    pub mn: u8,
    /// The element's quant (see [`QCode`]).
    pub q: u8,
}

/// Bits of the code of a block-quantized `dtype` (see [`QCode`]), 0 for the other dtypes.
pub fn code_bits(dtype: DType) -> u32 {
    match dtype {
        DType::Q8_0 => 24,
        DType::Q4_1 => 36,
        DType::Q5_0 => 21,
        DType::Q4K => 48,
        DType::Q6K => 30,
        _ => 0,
    }
}

impl QCode {
    /// The `f64` code of this element in a tensor of `dtype` (see [`QCode`]).
    pub fn to_f64(self, dtype: DType) -> f64 {
        let (d, m, sc, mn, q) = (u64::from(self.d), u64::from(self.m), u64::from(self.sc), u64::from(self.mn), u64::from(self.q));
        let c = match dtype {
            DType::Q8_0 => (d << 8) | q,
            DType::Q4_1 => (d << 20) | (m << 4) | (q & 15),
            DType::Q5_0 => (d << 5) | (q & 31),
            DType::Q4K => (d << 32) | (m << 16) | ((sc & 63) << 10) | ((mn & 63) << 4) | (q & 15),
            DType::Q6K => (d << 14) | (sc << 6) | (q & 63),
            _ => 0,
        };
        c as f64
    }

    /// The parts of code `x` of a tensor of `dtype` (see [`QCode`]).
    pub fn from_f64(dtype: DType, x: f64) -> QCode {
        let c = dtype.round(x) as u64;
        match dtype {
            DType::Q8_0 => QCode { d: (c >> 8) as u16, q: c as u8, ..QCode::default() },
            DType::Q4_1 => QCode { d: (c >> 20) as u16, m: (c >> 4) as u16, q: (c & 15) as u8, ..QCode::default() },
            DType::Q5_0 => QCode { d: (c >> 5) as u16, q: (c & 31) as u8, ..QCode::default() },
            DType::Q4K => QCode { d: (c >> 32) as u16, m: (c >> 16) as u16, sc: ((c >> 10) & 63) as u8, mn: ((c >> 4) & 63) as u8, q: (c & 15) as u8 },
            DType::Q6K => QCode { d: (c >> 14) as u16, sc: (c >> 6) as u8, q: (c & 63) as u8, ..QCode::default() },
            _ => QCode::default(),
        }
    }

    /// The element's value as llama.cpp's `dequantize_row_*` computes it in `f32` (see the
    /// module docs), in an `f64`: round it once to the target dtype.
    pub fn value(self, dtype: DType) -> f64 {
        let h = |b: u16| half::f16::from_bits(b);
        let d = h(self.d).to_f64();
        match dtype {
            DType::Q8_0 => f64::from(self.q as i8) * d,
            DType::Q4_1 => f64::from(self.q & 15) * d + h(self.m).to_f64(),
            DType::Q5_0 => f64::from(i32::from(self.q & 31) - 16) * d,
            DType::Q4K => {
                let d1 = h(self.d).to_f32() * f32::from(self.sc & 63);
                let m1 = h(self.m).to_f32() * f32::from(self.mn & 63);
                f64::from(d1 * f32::from(self.q & 15) - m1)
            }
            DType::Q6K => {
                let d1 = h(self.d).to_f32() * f32::from(self.sc as i8);
                f64::from(d1 * f32::from(i16::from(self.q & 63) - 32))
            }
            _ => f64::NAN,
        }
    }
}

/// `(sc, mn)` of sub-block `j` (0..8) of a `q4_k` block's 12 packed `scales` bytes
/// (`get_scale_min_k4`).
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The codes of one block `blk` (exactly `block_bytes` long) of `dtype`, in element order.
fn decode_block(dtype: DType, blk: &[u8], out: &mut Vec<f64>) {
    let f16_at = |i: usize| u16::from_le_bytes([blk[i], blk[i + 1]]);
    let mut push = |c: QCode| out.push(c.to_f64(dtype));
    match dtype {
        DType::Q8_0 => blk[2..34].iter().for_each(|&q| push(QCode { d: f16_at(0), q, ..QCode::default() })),
        DType::Q4_1 => {
            let (d, m) = (f16_at(0), f16_at(2));
            (0..32).for_each(|j| push(QCode { d, m, q: if j < 16 { blk[4 + j] & 15 } else { blk[4 + j - 16] >> 4 }, ..QCode::default() }));
        }
        DType::Q5_0 => {
            let d = f16_at(0);
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            for j in 0..32 {
                let nib = if j < 16 { blk[6 + j] & 15 } else { blk[6 + j - 16] >> 4 };
                push(QCode { d, q: nib | (((qh >> j) & 1) as u8) << 4, ..QCode::default() });
            }
        }
        DType::Q4K => {
            let (d, m) = (f16_at(0), f16_at(2));
            let (scales, qs) = (&blk[4..16], &blk[16..144]);
            for e in 0..256 {
                let (sc, mn) = scale_min_k4(e / 32, scales);
                let byte = qs[32 * (e / 64) + e % 32];
                let q = if e % 64 < 32 { byte & 15 } else { byte >> 4 };
                push(QCode { d, m, sc, mn, q });
            }
        }
        DType::Q6K => {
            let (ql, qh, scales) = (&blk[0..128], &blk[128..192], &blk[192..208]);
            let d = f16_at(208);
            for e in 0..256 {
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                let lo = ql[64 * h + l + 32 * (k & 1)];
                let lo = if k < 2 { lo & 15 } else { lo >> 4 };
                let hi = (qh[32 * h + l] >> (2 * k)) & 3;
                push(QCode { d, sc: scales[e / 16], q: lo | (hi << 4), ..QCode::default() });
            }
        }
        _ => {}
    }
}

/// The bytes of one block of `dtype` from its elements' codes `c` (`block_elems` of them):
/// the block's scales from `c[0]`, each sub-block's from its first element.
fn encode_block(dtype: DType, c: &[QCode], out: &mut Vec<u8>) {
    match dtype {
        DType::Q8_0 => {
            out.extend(c[0].d.to_le_bytes());
            out.extend(c.iter().map(|e| e.q));
        }
        DType::Q4_1 => {
            out.extend(c[0].d.to_le_bytes());
            out.extend(c[0].m.to_le_bytes());
            out.extend((0..16).map(|j| (c[j].q & 15) | ((c[j + 16].q & 15) << 4)));
        }
        DType::Q5_0 => {
            out.extend(c[0].d.to_le_bytes());
            let qh = (0..32).fold(0u32, |h, j| h | (u32::from((c[j].q >> 4) & 1) << j));
            out.extend(qh.to_le_bytes());
            out.extend((0..16).map(|j| (c[j].q & 15) | ((c[j + 16].q & 15) << 4)));
        }
        DType::Q4K => {
            out.extend(c[0].d.to_le_bytes());
            out.extend(c[0].m.to_le_bytes());
            let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8).map(|s| (c[32 * s].sc & 63, c[32 * s].mn & 63)).unzip();
            let mut scales = [0u8; 12];
            for j in 0..4 {
                scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
                scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
                scales[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
            }
            out.extend(scales);
            for chunk in 0..4 {
                out.extend((0..32).map(|l| (c[64 * chunk + l].q & 15) | ((c[64 * chunk + 32 + l].q & 15) << 4)));
            }
        }
        DType::Q6K => {
            let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
            for (e, code) in c.iter().enumerate() {
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                let q = code.q & 63;
                ql[64 * h + l + 32 * (k & 1)] |= if k < 2 { q & 15 } else { (q & 15) << 4 };
                qh[32 * h + l] |= (q >> 4) << (2 * k);
            }
            out.extend(ql);
            out.extend(qh);
            out.extend((0..16).map(|s| c[16 * s].sc));
            out.extend(c[0].d.to_le_bytes());
        }
        _ => {}
    }
}

/// Element codes ([`QCode`]) of a block-quantized tensor from its stored bytes (GGUF block
/// layout, little-endian), [`DType::block_elems`] codes per block; `None` when `dtype` is not
/// block-quantized or `bytes` is not a whole number of blocks.
pub fn qcodes_from_bytes(dtype: DType, bytes: &[u8]) -> Option<Vec<f64>> {
    let (bb, be) = (dtype.block_bytes()?, dtype.block_elems()?);
    if bytes.len() % bb != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / bb * be);
    for blk in bytes.chunks_exact(bb) {
        decode_block(dtype, blk, &mut out);
    }
    Some(out)
}

/// The stored bytes (GGUF block layout) of a block-quantized tensor from its element codes
/// ([`QCode`]): each block's scales come from its first element, each sub-block's from its
/// first. `None` when `dtype` is not block-quantized or the count is not a whole number of
/// blocks.
pub fn qcodes_to_bytes(dtype: DType, codes: &[f64]) -> Option<Vec<u8>> {
    let (bb, be) = (dtype.block_bytes()?, dtype.block_elems()?);
    if codes.len() % be != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(codes.len() / be * bb);
    for blk in codes.chunks_exact(be) {
        let c: Vec<QCode> = blk.iter().map(|&x| QCode::from_f64(dtype, x)).collect();
        encode_block(dtype, &c, &mut out);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        half::f16::from_f32(x).to_le_bytes()
    }

    fn values(dtype: DType, bytes: &[u8]) -> Vec<f64> {
        let codes = qcodes_from_bytes(dtype, bytes).unwrap();
        assert_eq!(qcodes_to_bytes(dtype, &codes).unwrap(), bytes, "{dtype}: the bytes round-trip through the codes");
        codes.iter().map(|&c| QCode::from_f64(dtype, c).value(dtype)).collect()
    }

    #[test]
    fn blocks_of_zeros_are_zero_and_sizes_hold() {
        for (dtype, elems, bytes) in [(DType::Q8_0, 32, 34), (DType::Q4_1, 32, 20), (DType::Q5_0, 32, 22), (DType::Q4K, 256, 144), (DType::Q6K, 256, 210)] {
            assert_eq!((dtype.block_elems(), dtype.block_bytes()), (Some(elems), Some(bytes)));
            assert_eq!(DType::from_name(dtype.name()), Some(dtype));
            let v = values(dtype, &vec![0u8; bytes * 2]);
            assert_eq!(v.len(), 2 * elems);
            assert!(v.iter().all(|&x| x == 0.0), "{dtype}: {v:?}");
            assert_eq!(dtype.storage_bytes(elems * 3), Some(bytes * 3));
            assert_eq!(dtype.storage_bytes(elems + 32), if elems == 32 { Some(2 * bytes) } else { None });
            let max = (1u64 << code_bits(dtype)) as f64;
            assert_eq!(dtype.round(max - 1.0), max - 1.0);
            assert_eq!(dtype.round(max), 0.0, "{dtype}: a code past its bits is not a code");
        }
    }

    #[test]
    fn q5_0_largest_smallest_quants_and_extreme_scales() {
        // Quants 0..32 in element order: q = j, so values (j − 16)·d.
        for d in [1.0f32, 65504.0, -65504.0, 6e-8] {
            let mut blk = f16b(d).to_vec();
            let qh: u32 = (0..32).fold(0, |h, j| h | (((j >> 4) & 1) << j));
            blk.extend(qh.to_le_bytes());
            blk.extend((0..16u8).map(|j| j | ((16 + j) & 15) << 4));
            let v = values(DType::Q5_0, &blk);
            let dd = f64::from(half::f16::from_f32(d).to_f32());
            for (j, x) in v.iter().enumerate() {
                assert_eq!(*x, (j as f64 - 16.0) * dd, "d {d} element {j}");
            }
            assert_eq!((v[0], v[31]), (-16.0 * dd, 15.0 * dd), "smallest and largest quant");
        }
    }

    /// A `q4_k` block: `d`, `dmin`, the 8 (sc, mn) pairs, quant of element `e` = `q(e)`.
    fn q4k_block(d: f32, dmin: f32, sm: [(u8, u8); 8], q: impl Fn(usize) -> u8) -> Vec<u8> {
        let c: Vec<QCode> = (0..256)
            .map(|e| QCode { d: half::f16::from_f32(d).to_bits(), m: half::f16::from_f32(dmin).to_bits(), sc: sm[e / 32].0, mn: sm[e / 32].1, q: q(e) })
            .collect();
        let mut out = Vec::new();
        encode_block(DType::Q4K, &c, &mut out);
        out
    }

    #[test]
    fn q4_k_scales_unpack_and_quants_sit_where_llama_cpp_reads_them() {
        let sm = [(1, 0), (63, 63), (2, 5), (40, 1), (63, 0), (0, 63), (33, 17), (48, 62)];
        let blk = q4k_block(0.5, 0.25, sm, |e| (e % 16) as u8);
        assert_eq!(blk.len(), 144);
        for (j, &(sc, mn)) in sm.iter().enumerate() {
            assert_eq!(scale_min_k4(j, &blk[4..16]), (sc, mn), "sub-block {j}");
        }
        // Hand-placed: element 32 (sub-block 1) is the high nibble of qs[0].
        assert_eq!(blk[16] >> 4, 0, "element 32 has quant 32 % 16 = 0");
        assert_eq!(blk[16 + 5] & 15, 5, "element 5");
        let v = values(DType::Q4K, &blk);
        for e in 0..256 {
            let (sc, mn) = sm[e / 32];
            let want = (0.5f32 * f32::from(sc)) * (e % 16) as f32 - 0.25f32 * f32::from(mn);
            assert_eq!(v[e], f64::from(want), "element {e}");
        }
        // Largest quant at the largest scales; smallest quant at the largest minimum.
        let big = q4k_block(65504.0, 65504.0, [(63, 63); 8], |e| if e % 2 == 0 { 15 } else { 0 });
        let v = values(DType::Q4K, &big);
        assert_eq!(v[0], f64::from(65504.0f32 * 63.0 * 15.0 - 65504.0 * 63.0));
        assert_eq!(v[1], f64::from(-(65504.0f32 * 63.0)));
        // `d1·q − m1` rounds once in f32, as llama.cpp computes it: 945 − 2⁻²⁰ is 945.
        let r = q4k_block(1.0, 2f32.powi(-20), [(63, 1); 8], |_| 15);
        assert_eq!(values(DType::Q4K, &r)[0], 945.0);
        // A subnormal d: products stay exact.
        let tiny = q4k_block(6e-8, 0.0, [(63, 0); 8], |_| 15);
        let dd = half::f16::from_f32(6e-8).to_f32();
        assert!(values(DType::Q4K, &tiny).iter().all(|&x| x == f64::from(dd * 63.0 * 15.0)));
    }

    #[test]
    fn q6_k_quants_and_signed_scales_sit_where_llama_cpp_reads_them() {
        // Element e has quant e % 64 and scale index e / 16 with scales −128, 127, ...
        let scales: [i8; 16] = [-128, 127, 1, -1, 0, 64, -64, 3, 5, 7, 9, 11, 13, -13, 100, -100];
        let c: Vec<QCode> = (0..256).map(|e| QCode { d: half::f16::from_f32(0.125).to_bits(), sc: scales[e / 16] as u8, q: (e % 64) as u8, ..QCode::default() }).collect();
        let mut blk = Vec::new();
        encode_block(DType::Q6K, &c, &mut blk);
        assert_eq!(blk.len(), 210);
        // llama.cpp's loop, by hand, for the first 128: y[l] = ql[l] & 15 | (qh[l] & 3) << 4.
        for l in 0..32 {
            let (ql, qh) = (&blk[0..128], &blk[128..192]);
            let q = |k: usize| {
                let lo = if k < 2 { ql[l + 32 * (k & 1)] & 15 } else { ql[l + 32 * (k & 1)] >> 4 };
                lo | (((qh[l] >> (2 * k)) & 3) << 4)
            };
            for k in 0..4 {
                assert_eq!(usize::from(q(k)), (32 * k + l) % 64, "element {}", 32 * k + l);
            }
        }
        let v = values(DType::Q6K, &blk);
        for e in 0..256 {
            let want = (0.125f32 * f32::from(scales[e / 16])) * ((e % 64) as f32 - 32.0);
            assert_eq!(v[e], f64::from(want), "element {e}");
        }
        assert_eq!(v[0], 0.125 * -128.0 * -32.0, "smallest quant, most negative scale");
        assert_eq!(v[16 + 15], 0.125 * 127.0 * (31.0 - 32.0));
        // Extreme d: `d·sc·q` has at most 11 + 7 + 5 significant bits, exact in f32.
        let c: Vec<QCode> = (0..256).map(|e| QCode { d: half::f16::from_f32(65504.0).to_bits(), sc: 127, q: if e == 0 { 63 } else { 0 }, ..QCode::default() }).collect();
        let mut blk = Vec::new();
        encode_block(DType::Q6K, &c, &mut blk);
        let v = values(DType::Q6K, &blk);
        assert_eq!(v[0], f64::from(65504.0f32 * 127.0 * 31.0));
        assert_eq!(v[1], f64::from(65504.0f32 * 127.0 * -32.0));
    }
}
