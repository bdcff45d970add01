//! GGUF model files: metadata and tensors, dequantised to the model's dtype.
//!
//! The container (header, metadata, tensor table) is read with the `gguf-rs` crate; sinter
//! reads the tensor bytes itself and dequantises the block formats of llama.cpp's `ggml`
//! (`ggml-common.h`, `ggml-quants.c`):
//!
//! | type | block | layout | value |
//! |---|---|---|---|
//! | F32 | 1 | `f32` | x |
//! | F16 | 1 | `f16` | x |
//! | BF16 | 1 | `bf16` | x |
//! | Q8_0 | 32 | `f16 d`, `i8 q[32]` | `q·d` |
//! | Q4_0 | 32 | `f16 d`, `u8 qs[16]` | `(nibble − 8)·d` |
//! | Q4_1 | 32 | `f16 d`, `f16 m`, `u8 qs[16]` | `nibble·d + m` |
//! | Q5_0 | 32 | `f16 d`, `u32 qh`, `u8 qs[16]` | `(nibble + 16·bit − 16)·d` |
//! | Q4_K | 256 | `f16 d`, `f16 dmin`, `u8 scales[12]`, `u8 qs[128]` | `(d·sc)·nibble − dmin·mn` |
//! | Q6_K | 256 | `u8 ql[128]`, `u8 qh[64]`, `i8 scales[16]`, `f16 d` | `(d·sc)·(q − 32)` |
//!
//! In a block of 32 the low nibbles of `qs[0..16]` are elements 0..16 and the high nibbles
//! elements 16..32. The k-quants are ported from `dequantize_row_q4_K` / `_q6_K` loop for
//! loop, in `f32` as there ([`sinter_ir::qblock`] holds the same layouts as the interpreter's
//! element codes, written independently; a test checks the two agree bit for bit). A GGUF shape lists the innermost axis first (`ne[0]`); sinter's tensors are
//! row-major with the outermost axis first, so the shape is reversed: `attn_q.weight` with
//! `ne = [576, 576]` is `[out, in]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value as Json;

use crate::{DType, Tensor};

/// Why a model file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a well-formed GGUF file (bad magic, truncated header, ...).
    #[error("{}", malformed_text(path, reason))]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What the reader found wrong.
        reason: String,
    },
    /// A metadata key the model needs is absent or of the wrong type.
    #[error("{path}: metadata key `{key}` is missing or not {expected}")]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type expected.
        expected: &'static str,
    },
    /// A metadata value the reader relies on is out of its valid range.
    #[error("{path}: metadata key `{key}` = {value}: {reason}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The value as stored.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The model's architecture is not one the loader has.
    #[error("{path}: architecture `{arch}` is not supported (supported: {supported})")]
    UnsupportedArchitecture {
        /// The file.
        path: PathBuf,
        /// `general.architecture` (GGUF) or `model_type` (`config.json`).
        arch: String,
        /// The architectures the loader reads, comma-separated.
        supported: String,
    },
    /// A tensor is stored in a type sinter cannot dequantise.
    #[error("{path}: tensor `{name}` has type {kind}, which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)")]
    UnsupportedTensorType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The type's name or number.
        kind: String,
    },
    /// A tensor the model needs is absent.
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// A tensor has a shape other than the model's config implies.
    #[error("{path}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Shape from the config (row-major).
        expected: Vec<usize>,
        /// Shape in the file (row-major).
        got: Vec<usize>,
    },
    /// A tensor's data runs past the end of the file.
    #[error("{path}: tensor `{name}` needs bytes {start}..{end} but the file has {len} (truncated?)")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// File length.
        len: u64,
    },
    /// The tokenizer in the file cannot be built.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The prompt does not fit in the model's context.
    #[error("the prompt has {tokens} tokens and {max_new} more were asked for, but the context holds {context}")]
    ContextOverflow {
        /// Prompt length in tokens.
        tokens: usize,
        /// Tokens to generate.
        max_new: usize,
        /// The model's context length.
        context: usize,
    },
}

/// One tensor's entry in the file's tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml type number (0 = F32, 1 = F16, 2 = Q4_0, 3 = Q4_1, 6 = Q5_0, 8 = Q8_0, 12 = Q4_K,
    /// 14 = Q6_K, 30 = BF16, ...).
    pub kind: u32,
    /// Row-major shape (outermost axis first).
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
}

/// The tensor-data alignment of a file: `general.alignment` (32 when absent), which the GGUF
/// specification requires to be a positive multiple of 8 and which must leave the tensor data
/// (at `data_offset`) inside the file of `len` bytes.
///
/// # Errors
/// [`ModelError::BadValue`] naming `general.alignment` when either does not hold (the
/// container reader falls back to 32 for a value it cannot use, which would read every tensor
/// from the wrong place); [`ModelError::Malformed`] when the data starts past the end of the
/// file without an alignment key.
fn check_alignment(path: &Path, metadata: &BTreeMap<String, Json>, data_offset: u64, len: u64) -> Result<u64, ModelError> {
    const KEY: &str = "general.alignment";
    let bad = |value: &Json, reason: String| ModelError::BadValue { path: path.to_path_buf(), key: KEY.into(), value: value.to_string(), reason };
    let alignment = match metadata.get(KEY) {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a % 8 == 0 => a,
            _ => return Err(bad(v, "the alignment must be a positive multiple of 8 (GGUF specification)".into())),
        },
    };
    if data_offset > len {
        return Err(match metadata.get(KEY) {
            Some(v) => bad(v, format!("it puts the tensor data at byte {data_offset}, past the end of the file ({len} bytes)")),
            None => ModelError::Malformed { path: path.to_path_buf(), reason: format!("the tensor data starts at byte {data_offset}, past the end of the file ({len} bytes)") },
        });
    }
    Ok(alignment)
}

/// A GGUF file in memory.
pub struct GgufFile {
    path: PathBuf,
    metadata: BTreeMap<String, Json>,
    tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
}

/// Name of a ggml type number, for messages.
pub fn kind_name(kind: u32) -> String {
    match kind {
        0 => "F32".into(),
        1 => "F16".into(),
        2 => "Q4_0".into(),
        3 => "Q4_1".into(),
        6 => "Q5_0".into(),
        7 => "Q5_1".into(),
        8 => "Q8_0".into(),
        10..=15 => ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"][(kind - 10) as usize].into(),
        30 => "BF16".into(),
        k => format!("type {k}"),
    }
}

/// (elements per block, bytes per block) of the types sinter dequantises.
fn block_geometry(kind: u32) -> Option<(usize, usize)> {
    match kind {
        0 => Some((1, 4)),
        1 | 30 => Some((1, 2)),
        2 => Some((32, 18)),
        3 => Some((32, 20)),
        6 => Some((32, 22)),
        8 => Some((32, 34)),
        12 => Some((256, 144)),
        14 => Some((256, 210)),
        _ => None,
    }
}

/// `f16` bits at `b[0..2]` as `f32`.
fn f16_at(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// One `block_q5_0` (22 bytes) into 32 values (`dequantize_row_q5_0`).
fn dequantize_q5_0(blk: &[u8], y: &mut [f32]) {
    let d = f16_at(blk);
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    let qs = &blk[6..22];
    for j in 0..16 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        let x0 = (u32::from(qs[j] & 0x0F) | xh_0) as i32 - 16;
        let x1 = (u32::from(qs[j] >> 4) | xh_1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// Scale and min of sub-block `j` of a `block_q4_K` (`get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// One `block_q4_K` (144 bytes) into 256 values (`dequantize_row_q4_K`).
fn dequantize_q4_k(blk: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(&blk[0..2]), f16_at(&blk[2..4]));
    let scales = &blk[4..16];
    let mut q = &blk[16..144];
    let mut is = 0;
    for chunk in y.chunks_exact_mut(64) {
        let (sc, m) = scale_min_k4(is, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(is + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        for l in 0..32 {
            chunk[l] = d1 * f32::from(q[l] & 0xF) - m1;
            chunk[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
        q = &q[32..];
        is += 2;
    }
}

/// One `block_q6_K` (210 bytes) into 256 values (`dequantize_row_q6_K`).
fn dequantize_q6_k(blk: &[u8], y: &mut [f32]) {
    let d = f16_at(&blk[208..210]);
    let (mut ql, mut qh, mut sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
    for y128 in y.chunks_exact_mut(128) {
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            let s = |k: usize| f32::from(sc[is + k] as i8);
            y128[l] = d * s(0) * q1 as f32;
            y128[l + 32] = d * s(2) * q2 as f32;
            y128[l + 64] = d * s(4) * q3 as f32;
            y128[l + 96] = d * s(6) * q4 as f32;
        }
        ql = &ql[64..];
        qh = &qh[32..];
        sc = &sc[8..];
    }
}

impl GgufFile {
    /// Reads a GGUF file (v2 or v3, little-endian) into memory.
    ///
    /// # Errors
    /// [`ModelError::Io`] when it cannot be read, [`ModelError::Malformed`] when the header or
    /// the tensor table is not valid GGUF (including a truncated header).
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let malformed = |reason: String| ModelError::Malformed { path: path.to_path_buf(), reason };
        if bytes.len() < 24 || &bytes[..4] != b"GGUF" {
            return Err(malformed(format!("it does not start with the magic `GGUF` ({} bytes)", bytes.len())));
        }
        // Arrays are read in full (the tokenizer needs every token and merge).
        // The header is read through a buffer (the crate's own opener reads the file unbuffered,
        // a system call per value: seconds for a vocabulary of 262 144 tokens). The magic was
        // checked above; what follows is little-endian.
        let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?);
        std::io::Read::read_exact(&mut file, &mut [0u8; 4]).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let mut container = gguf_rs::GGUFContainer::new(gguf_rs::ByteOrder::LE, Box::new(file), u64::MAX);
        let model = container.decode().map_err(|e| malformed(e.to_string()))?;
        let data_offset = model.data_offset();
        // A file without tensors (a vocabulary alone) may end before its empty data section's
        // padding, as llama.cpp's `models/ggml-vocab-*.gguf` do.
        let data_end = if model.tensors().is_empty() { data_offset.min(bytes.len() as u64) } else { data_offset };
        let alignment = check_alignment(path, model.metadata(), data_end, bytes.len() as u64)?;
        let tensors: Vec<TensorInfo> = model
            .tensors()
            .iter()
            .map(|t| TensorInfo {
                name: t.name.clone(),
                kind: t.kind,
                shape: t.shape.iter().rev().map(|&d| d as usize).collect(),
                offset: data_offset.saturating_add(t.offset),
            })
            .collect();
        for (t, raw) in tensors.iter().zip(model.tensors()) {
            if raw.offset % alignment != 0 {
                return Err(malformed(format!("tensor `{}` starts at data offset {}, not a multiple of the alignment {alignment}", t.name, raw.offset)));
            }
            if t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() {
                return Err(malformed(format!("tensor `{}` has shape {:?}, whose element count overflows", t.name, t.shape)));
            }
        }
        Ok(GgufFile { path: path.to_path_buf(), metadata: model.metadata().clone(), tensors, bytes })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All metadata.
    pub fn metadata(&self) -> &BTreeMap<String, Json> {
        &self.metadata
    }

    /// The tensor table.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    fn missing(&self, key: &str, expected: &'static str) -> ModelError {
        ModelError::MissingKey { path: self.path.clone(), key: key.to_string(), expected }
    }

    /// An unsigned integer metadata value.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn u64(&self, key: &str) -> Result<u64, ModelError> {
        self.metadata.get(key).and_then(Json::as_u64).ok_or_else(|| self.missing(key, "an unsigned integer"))
    }

    /// A float metadata value (integers accepted).
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn f64(&self, key: &str) -> Result<f64, ModelError> {
        self.metadata.get(key).and_then(Json::as_f64).ok_or_else(|| self.missing(key, "a number"))
    }

    /// A string metadata value.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn str(&self, key: &str) -> Result<&str, ModelError> {
        self.metadata.get(key).and_then(Json::as_str).ok_or_else(|| self.missing(key, "a string"))
    }

    /// A boolean metadata value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.metadata.get(key).and_then(Json::as_bool)
    }

    /// An array of strings.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn strings(&self, key: &str) -> Result<Vec<&str>, ModelError> {
        let arr = self.metadata.get(key).and_then(Json::as_array).ok_or_else(|| self.missing(key, "an array of strings"))?;
        arr.iter().map(|v| v.as_str().ok_or_else(|| self.missing(key, "an array of strings"))).collect()
    }

    /// An array of integers.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn ints(&self, key: &str) -> Result<Vec<i64>, ModelError> {
        let arr = self.metadata.get(key).and_then(Json::as_array).ok_or_else(|| self.missing(key, "an array of integers"))?;
        arr.iter().map(|v| v.as_i64().ok_or_else(|| self.missing(key, "an array of integers"))).collect()
    }

    /// The table entry of tensor `name`.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Tensor `name`, dequantised to f32, checked against an expected row-major shape.
    ///
    /// # Errors
    /// Missing tensor, wrong shape, unsupported type, data past the end of the file.
    pub fn dequantize(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, ModelError> {
        let t = self.info(name).ok_or_else(|| ModelError::MissingTensor { path: self.path.clone(), name: name.to_string() })?;
        if t.shape != expected {
            return Err(ModelError::TensorShape { path: self.path.clone(), name: name.to_string(), expected: expected.to_vec(), got: t.shape.clone() });
        }
        let (block, bytes_per_block) = block_geometry(t.kind)
            .ok_or_else(|| ModelError::UnsupportedTensorType { path: self.path.clone(), name: name.to_string(), kind: kind_name(t.kind) })?;
        let n: usize = t.shape.iter().product();
        // ggml blocks never straddle rows: the innermost axis is a whole number of blocks.
        let row = t.shape.last().copied().unwrap_or(1);
        if row % block != 0 {
            return Err(ModelError::Malformed { path: self.path.clone(), reason: format!("tensor `{name}` has rows of {row} elements, not a multiple of its block of {block}") });
        }
        let size = (n / block) as u64 * bytes_per_block as u64;
        let end = t.offset.saturating_add(size);
        if end > self.bytes.len() as u64 {
            return Err(ModelError::Truncated { path: self.path.clone(), name: name.to_string(), start: t.offset, end, len: self.bytes.len() as u64 });
        }
        let data = &self.bytes[t.offset as usize..end as usize];
        let mut out = Vec::with_capacity(n);
        let h = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        match t.kind {
            0 => out.extend(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            1 => out.extend(data.chunks_exact(2).map(h)),
            30 => out.extend(data.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
            8 => {
                for blk in data.chunks_exact(34) {
                    let d = h(&blk[0..2]);
                    out.extend(blk[2..].iter().map(|&q| q as i8 as f32 * d));
                }
            }
            6 | 12 | 14 => {
                out.resize(n, 0.0);
                let f = match t.kind {
                    6 => dequantize_q5_0,
                    12 => dequantize_q4_k,
                    _ => dequantize_q6_k,
                };
                for (blk, y) in data.chunks_exact(bytes_per_block).zip(out.chunks_exact_mut(block)) {
                    f(blk, y);
                }
            }
            2 | 3 => {
                for blk in data.chunks_exact(bytes_per_block) {
                    let d = h(&blk[0..2]);
                    let (m, qs) = if t.kind == 3 { (h(&blk[2..4]), &blk[4..]) } else { (-8.0 * d, &blk[2..]) };
                    out.extend(qs.iter().map(|&q| (q & 0x0F) as f32 * d + m));
                    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
                }
            }
            _ => unreachable!("block_geometry accepted the type"),
        }
        Ok(out)
    }

    /// Tensor `name` kept in its stored block format: a `q8_0`, `q4_1`, `q5_0`, `q4_k` or
    /// `q6_k` [`Tensor`] (GGUF type 8, 3, 6, 12 or 14) of the expected row-major shape, its
    /// bytes as the file holds them, for a graph that reads it with `dequantize` (the matmul
    /// kernels then read `q8_0`/`q4_1` blocks as stored). `Ok(None)` when the tensor is stored
    /// in another type.
    ///
    /// # Errors
    /// Missing tensor, wrong shape, data past the end of the file, a last axis that is not a
    /// whole number of blocks.
    pub fn quantized_tensor(&self, name: &str, expected: &[usize]) -> Result<Option<Tensor>, ModelError> {
        let t = self.info(name).ok_or_else(|| ModelError::MissingTensor { path: self.path.clone(), name: name.to_string() })?;
        if t.shape != expected {
            return Err(ModelError::TensorShape { path: self.path.clone(), name: name.to_string(), expected: expected.to_vec(), got: t.shape.clone() });
        }
        let dtype = match t.kind {
            8 => DType::Q8_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            12 => DType::Q4K,
            14 => DType::Q6K,
            _ => return Ok(None),
        };
        let n: usize = t.shape.iter().product();
        let size = dtype.storage_bytes(n).ok_or_else(|| ModelError::Malformed { path: self.path.clone(), reason: format!("tensor `{name}` has {n} elements, not a whole number of blocks") })? as u64;
        let end = t.offset.saturating_add(size);
        if end > self.bytes.len() as u64 {
            return Err(ModelError::Truncated { path: self.path.clone(), name: name.to_string(), start: t.offset, end, len: self.bytes.len() as u64 });
        }
        Tensor::from_blocks(dtype, expected, &self.bytes[t.offset as usize..end as usize])
            .map(Some)
            .map_err(|e| ModelError::Malformed { path: self.path.clone(), reason: format!("tensor `{name}`: {e}") })
    }

    /// Tensor `name` as a sinter [`Tensor`] of `dtype` (rounded to nearest even).
    ///
    /// # Errors
    /// As [`GgufFile::dequantize`].
    pub fn tensor(&self, name: &str, expected: &[usize], dtype: DType) -> Result<Tensor, ModelError> {
        let v = self.dequantize(name, expected)?;
        Tensor::new(dtype, expected, v.into_iter().map(f64::from).collect())
            .map_err(|e| ModelError::Malformed { path: self.path.clone(), reason: format!("tensor `{name}`: {e}") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(kind: u32, shape: &[usize], data: Vec<u8>) -> GgufFile {
        GgufFile {
            path: "mem.gguf".into(),
            metadata: BTreeMap::new(),
            tensors: vec![TensorInfo { name: "t".into(), kind, shape: shape.to_vec(), offset: 0 }],
            bytes: data,
        }
    }

    #[test]
    fn q4_1_and_q8_0_blocks_dequantise_by_hand() {
        // Q4_1: d = 0.5, m = -1, nibbles: low = j % 16, high = 15 - j % 16.
        let mut blk = Vec::new();
        blk.extend(f16::from_f32(0.5).to_le_bytes());
        blk.extend(f16::from_f32(-1.0).to_le_bytes());
        blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = file_with(3, &[32], blk).dequantize("t", &[32]).unwrap();
        assert_eq!(v[0], -1.0);
        assert_eq!(v[15], 15.0 * 0.5 - 1.0);
        assert_eq!(v[16], 15.0 * 0.5 - 1.0);
        assert_eq!(v[31], -1.0);
        // Q8_0: d = 0.25, q = -16..16.
        let mut blk = Vec::new();
        blk.extend(f16::from_f32(0.25).to_le_bytes());
        blk.extend((0..32i32).map(|j| (j - 16) as i8 as u8));
        let v = file_with(8, &[32], blk).dequantize("t", &[32]).unwrap();
        assert_eq!(v[0], -4.0);
        assert_eq!(v[31], 3.75);
    }

    /// The interpreter's `dequantize` of the blocks as stored gives exactly what this loader
    /// gives (f32, bit for bit), for random blocks of every block type (specials included:
    /// d = 0, negative d, large m or dmin, every sub-block scale byte).
    #[test]
    fn interpreter_dequantize_is_bit_exact_with_the_loader() {
        use sinter_ir::{Attr, FunctionBuilder, Graph, OpKind, TensorType};
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut byte = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        };
        for (kind, dtype, bb, be) in [(8u32, DType::Q8_0, 34usize, 32usize), (3, DType::Q4_1, 20, 32), (6, DType::Q5_0, 22, 32), (12, DType::Q4K, 144, 256), (14, DType::Q6K, 210, 256)] {
            let (rows, k) = (5usize, 2 * be + 64 * usize::from(be == 32));
            let mut data = Vec::new();
            for b in 0..rows * k / be {
                let mut blk: Vec<u8> = (0..bb).map(|_| byte()).collect();
                // Finite scales (random f16 bits may be NaN/inf: those propagate alike, but
                // keep most blocks ordinary), one zero scale, one negative.
                let d = match b % 5 {
                    0 => 0.0f32,
                    1 => -0.0123,
                    _ => f32::from(byte()) / 512.0 + 0.001,
                };
                let at = if kind == 14 { 208 } else { 0 };
                blk[at..at + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                if kind == 3 || kind == 12 {
                    blk[2..4].copy_from_slice(&f16::from_f32(if b % 3 == 0 { -300.25 } else { 0.5 }).to_le_bytes());
                }
                data.extend(blk);
            }
            let f = file_with(kind, &[rows, k], data);
            let want = f.dequantize("t", &[rows, k]).unwrap();
            let q = f.quantized_tensor("t", &[rows, k]).unwrap().expect("a block type");
            assert_eq!(q.dtype(), dtype);
            let mut fb = FunctionBuilder::new(&Graph::new(), "main");
            let w = fb.param("w", TensorType::new(dtype, [sinter_ir::Dim::constant(rows as i64), sinter_ir::Dim::constant(k as i64)]));
            let y = fb.op1(OpKind::Dequantize, &[w], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
            let mut g = Graph::new();
            g.add_func(fb.finish(&[y]).unwrap());
            let got = sinter_ir::interp::run(&g, "main", &[&q], &sinter_ir::Bindings::new()).unwrap();
            for (i, (&a, &b)) in got[0].data().iter().zip(&want).enumerate() {
                assert_eq!((a as f32).to_bits(), b.to_bits(), "{dtype} element {i}: interpreter {a} vs loader {b}");
            }
        }
        // Other types are not kept quantized.
        let f = file_with(0, &[32], vec![0; 128]);
        assert!(f.quantized_tensor("t", &[32]).unwrap().is_none());
        let f = file_with(2, &[32], vec![0; 18]);
        assert!(f.quantized_tensor("t", &[32]).unwrap().is_none());
    }

    /// A GGUF v3 file of one F32 tensor `t` of 8 elements, with `general.alignment` stored as
    /// a u32 when given, its data placed at the alignment it names (32 when absent or unusable).
    fn gguf_bytes(alignment: Option<u32>, tensor_offset: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(u64::from(alignment.is_some()).to_le_bytes());
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        if let Some(a) = alignment {
            string(&mut b, "general.alignment");
            b.extend(4u32.to_le_bytes());
            b.extend(a.to_le_bytes());
        }
        string(&mut b, "t");
        b.extend(1u32.to_le_bytes());
        b.extend(8u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(tensor_offset.to_le_bytes());
        let align = alignment.filter(|a| *a > 0 && a % 8 == 0 && *a < 4096).unwrap_or(32) as usize;
        while b.len() % align != 0 {
            b.push(0);
        }
        b.resize(b.len() + tensor_offset as usize, 0);
        b.extend((0..8).flat_map(|i| (i as f32).to_le_bytes()));
        b
    }

    #[test]
    fn the_alignment_key_is_validated_and_named() {
        let dir = std::env::temp_dir().join(format!("sinter-gguf-align-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let open = |name: &str, bytes: Vec<u8>| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            GgufFile::open(&p)
        };
        // Valid: absent (32) and 64.
        for a in [None, Some(64)] {
            let f = open("ok.gguf", gguf_bytes(a, 0)).unwrap_or_else(|e| panic!("{a:?}: {e}"));
            assert_eq!(f.dequantize("t", &[8]).unwrap(), (0..8).map(|i| i as f32).collect::<Vec<_>>());
        }
        // 0, not a multiple of 8, and 2^31 (past the end of the file) name the key.
        for a in [0u32, 12, 1 << 31] {
            let e = open("bad.gguf", gguf_bytes(Some(a), 0)).err().unwrap_or_else(|| panic!("alignment {a} accepted"));
            assert!(matches!(e, ModelError::BadValue { ref key, .. } if key == "general.alignment"), "alignment {a}: {e}");
            assert!(e.to_string().contains(&a.to_string()), "{e}");
        }
        // A tensor offset that is not a multiple of the alignment names the tensor.
        let e = open("off.gguf", gguf_bytes(None, 8)).err().unwrap();
        assert!(e.to_string().contains("tensor `t`") && e.to_string().contains("alignment 32"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn truncated_data_unsupported_types_and_wrong_shapes_are_errors() {
        let f = file_with(3, &[64], vec![0; 20]);
        assert!(matches!(f.dequantize("t", &[64]), Err(ModelError::Truncated { .. })));
        assert!(matches!(f.dequantize("t", &[32]), Err(ModelError::TensorShape { .. })));
        assert!(matches!(f.dequantize("u", &[64]), Err(ModelError::MissingTensor { .. })));
        let f = file_with(13, &[256], vec![0; 1000]);
        let e = f.dequantize("t", &[256]).unwrap_err();
        assert!(e.to_string().contains("Q5_K"), "{e}");
        // A k-quant row that is not a whole number of super-blocks.
        let f = file_with(12, &[2, 128], vec![0; 144]);
        assert!(matches!(f.dequantize("t", &[2, 128]), Err(ModelError::Malformed { .. })));
        assert!(f.quantized_tensor("t", &[2, 128]).is_err());
    }
}

/// [`ModelError::Malformed`]'s message: a GGUF file "is not a valid GGUF file"; a Hugging
/// Face folder's `config.json` or safetensors file is named with what is wrong in it.
fn malformed_text(path: &Path, reason: &str) -> String {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json" | "safetensors") => format!("{}: {reason}", path.display()),
        _ => format!("{} is not a valid GGUF file: {reason}", path.display()),
    }
}
