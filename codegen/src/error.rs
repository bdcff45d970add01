//! What can go wrong in code generation ([`CodegenError`]), and the one message every
//! generator gives for `f8e4m3` where it does not read it ([`fp8_message`]).

use crate::ptxas::PtxasError;
use crate::target::{Target, UnknownTarget};

/// What can go wrong in code generation.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// A target name sinter does not know.
    #[error(transparent)]
    UnknownTarget(#[from] UnknownTarget),
    /// LLVM's NVPTX back end could not be initialised or found.
    #[error("LLVM has no NVPTX back end: {0}")]
    NoNvptxBackEnd(String),
    /// LLVM refused to create a target machine for the target.
    #[error("LLVM cannot create a target machine for {triple} cpu {cpu} features {features}")]
    TargetMachine {
        /// The triple asked for.
        triple: String,
        /// The CPU asked for.
        cpu: String,
        /// The feature string asked for.
        features: String,
    },
    /// The module is not valid LLVM IR (the verifier's message).
    #[error("invalid LLVM module `{module}`: {message}")]
    InvalidModule {
        /// The module's name.
        module: String,
        /// What the verifier said.
        message: String,
    },
    /// The NVPTX back end failed to emit PTX.
    #[error("LLVM failed to emit PTX for {target}: {message}")]
    Emit {
        /// The target.
        target: Target,
        /// LLVM's message.
        message: String,
    },
    /// The emitted PTX is not UTF-8 (it never should be).
    #[error("LLVM emitted PTX that is not UTF-8")]
    PtxNotUtf8,
    /// ptxas could not be found or run, or rejected the PTX.
    #[error(transparent)]
    Ptxas(#[from] PtxasError),
    /// The kernel asks for something this code generator does not do: an op, a shape or a
    /// layout outside what its family's generator handles. `message` says what and why.
    #[error("kernel {kernel}: unsupported: {message}")]
    Unsupported {
        /// The kernel (`k3`) and its family, e.g. `k3 (Pointwise)`.
        kernel: String,
        /// What is not supported.
        message: String,
    },
    /// The kernel is ill-formed: its body's parameters or outputs do not match its buffers,
    /// a dtype does not fit an op, an attribute is missing.
    #[error("kernel {kernel}: {message}")]
    BadKernel {
        /// The kernel (`k3`) and its family.
        kernel: String,
        /// What is wrong.
        message: String,
    },
    /// An LLVM IR builder call failed: an internal error of the generator (it built
    /// inconsistent IR), never the user's.
    #[error("LLVM IR builder: {0}")]
    Builder(String),
}

impl From<inkwell::builder::BuilderError> for CodegenError {
    fn from(e: inkwell::builder::BuilderError) -> CodegenError {
        CodegenError::Builder(e.to_string())
    }
}

/// The text of [`fp8_message`] after the refused part: where `f8e4m3` is supported.
pub(crate) const FP8_SUPPORT: &str = "f8e4m3 tensor-core operands are read only on sm_90a with wgmma, by the fp8 matmul (`matmul(dequantize_fp8(a8, sa), dequantize_fp8(b8, sb))`, B [N, K] with transpose_b) and the fp8 attention (`attention(dequantize_fp8(q8, sq), dequantize_fp8(k8, sk), dequantize_fp8(v8, sv))`, head dims 64 or 128, no mask, a bf16 or f16 output); the element-wise kernels (pointwise, layout, gather, row reductions) load, store, quantize, dequantize and cast f8e4m3 on every target, so the unfused lowering (`dequantize_fp8` as its own kernel) runs anywhere; the interpreter runs every fp8 graph";

/// What the generators say of `f8e4m3` where they do not read it: `what` (the
/// refused kernel or value), then where fp8 is supported ([`FP8_SUPPORT`]): the fp8 matmul and
/// the fp8 prefill attention on sm_90a ([`kernels::matmul`], [`kernels::attention_tc`]) and
/// the element-wise kernels on every target (`kernels::element`, [`fp8`]).
pub(crate) fn fp8_message(what: &str) -> String {
    format!("{what}: {FP8_SUPPORT}")
}
