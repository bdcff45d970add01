//! The kernel contract: what the passes may hand the code generator, in one place that both
//! crates call. The passes form only kernels these rules accept for the target they compile
//! for; the code generator's own checks restate them and refuse anything else with
//! `Unsupported`.
//!
//! - [`target`]: the GPU targets and their facts (shared memory, SM count, tensor-core
//!   instructions, the figures of the cost model).
//! - [`view`]: how a kernel reads a body value as a buffer (views of kernel inputs) and writes
//!   its outputs (through trailing reshapes).
//! - [`epilogue`]: what a matmul kernel's epilogue may read of the matmul's result.
//! - [`operands`]: operands read in stored form — quantized blocks, fp8 bytes (sm_90a).
//! - [`prologue`]: a row norm computed in the prologue of the matmul that reads it.
//! - [`families`]: the per-family rules, checked on a built kernel by [`check`].
//!
//! | family | body |
//! |---|---|
//! | Pointwise, Layout, Gather | element-wise ops, sources and views (no matmul, attention, `kv_append`, row reductions); every output of one shape, or of one shape once trailing `reshape`s are peeled |
//! | RowReduction | row nodes (`reduce_*`, `softmax`, `log_softmax`, `rms_norm`, `layer_norm`) over the last axis of operands of one shape `[L…, N]`, element-wise prologue and epilogue (`rope` or `rotary` of a value of that shape too: a pair's partner is the same row); every output (trailing reshapes peeled) `[L…, N]`, `[L…, 1]` or `[L…]` |
//! | Matmul | exactly one `matmul` of two float operands of one dtype that are kernel inputs through `reshape`s and `slice`s ([`view::viewed_param`]), or a B operand that is `dequantize` of a `q8_0`/`q4_1` kernel input `[N, K]` read with `transpose_b` at a constant M ≤ 16 ([`operands::quantized_b`]), or an A operand that is `rms_norm` or `layer_norm` of a kernel input at a constant M ≤ 16 ([`prologue::norm_prologue`]: the norm in the kernel's prologue), or both operands `dequantize_fp8` of `f8e4m3` kernel inputs, B `[N, K]` read with `transpose_b` ([`operands::fp8_matmul`], sm_90a); an epilogue that [`epilogue::analyse`] accepts — element-wise at the same element, column segments through element-wise ops, reshapes, `rope`, `rotary` and a `kv_append` whose pages are kernel inputs (the QKV projection writing K and V into the cache), or paired segments (SwiGLU over gate/up) |
//! | Attention, PagedAttention | exactly one `attention` / `paged_attention` node (and views) that [`attention_node`] accepts (head dims constants in `1..=`[`MAX_ATTENTION_HEAD_DIM`], rank-4 operands of one float dtype, …) whose operands are kernel inputs through `reshape`s and `slice`s — or, for `attention`, q, k, v all `dequantize_fp8` of `f8e4m3` kernel inputs ([`operands::fp8_attention`], sm_90a) — and whose result, through `reshape`s, is the one output (with `lse=true`: O and, unless unused, the lse result, through `reshape`s, are the outputs) |
//! | AttentionMerge | exactly one `attention_merge` node (and views) whose operands are kernel inputs through `reshape`s and `slice`s and whose o result and, unless unused, lse result are the outputs through `reshape`s |
//! | KvAppend | one `kv_append` whose page operands are kernel inputs and whose two results are exactly the outputs; element-wise ops and views on the other operands |
//!
//! `f8e4m3`: the fp8 matmul and attention bodies are the shapes the fp8 kernels take, on
//! sm_90a only (`wgmma` e4m3); on sm_80 and sm_90 [`check`] refuses them, naming the target,
//! and the passes write the dequantised operands to buffers instead. The element-wise
//! families load, store and convert `f8e4m3` on every target; paged attention, the attention
//! merge and the KV append hold none, nor does a matmul epilogue.
//!
//! Design notes: book/src/design/contract.md

pub mod epilogue;
pub mod families;
pub mod operands;
pub mod prologue;
pub mod target;
pub mod view;

#[cfg(test)]
mod tests;

pub use families::{attention_node, check, evaluable, head_dim_ok, is_elementwise, is_rotation, is_row_node, one_shape, window_softcap_kernels, MAX_ATTENTION_HEAD_DIM};
pub use prologue::{norm_prologue, norm_prologue_body, through_unary, NORM_PROLOGUE_COLUMNS_PER_CTA, NORM_PROLOGUE_MAX_K, NORM_PROLOGUE_MAX_M};
pub use operands::{fp8_attention, fp8_attention_form, fp8_attention_with, fp8_matmul, fp8_matmul_form, fp8_matmul_with, fp8_view_with, is_strict_operand, quantized_b, reads_fp8_with, QUANTIZED_MAX_M};
pub use target::{Target, UnknownTarget, PTX_ISA_VERSION};
pub use view::{is_param, peel, viewed_param};
