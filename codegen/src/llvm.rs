//! LLVM's NVPTX back end: the conventions kernels follow (calling convention, address
//! spaces), the target machine of a [`Target`], and an LLVM module compiled to PTX text.

use std::sync::OnceLock;

use inkwell::module::Module;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;

use crate::error::CodegenError;
use crate::target::{NvptxNames, Target};

/// LLVM's `PTX_Kernel` calling convention (`ptx_kernel` in textual IR): marks a function as a
/// kernel (`.entry`) rather than a device function (`.func`).
pub const PTX_KERNEL_CALL_CONV: u32 = 71;
/// NVPTX address space of global memory.
pub const ADDRESS_SPACE_GLOBAL: u16 = 1;
/// NVPTX address space of shared memory.
pub const ADDRESS_SPACE_SHARED: u16 = 3;
/// NVPTX address space of constant memory.
pub const ADDRESS_SPACE_CONSTANT: u16 = 4;
/// NVPTX address space of local (per-thread) memory.
pub const ADDRESS_SPACE_LOCAL: u16 = 5;

/// Initialises LLVM's NVPTX back end, once per process.
fn nvptx_backend() -> Result<(), CodegenError> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        LlvmTarget::initialize_nvptx(&InitializationConfig::default());
        LlvmTarget::from_triple(&TargetTriple::create(crate::target::NVPTX_TRIPLE))
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(CodegenError::NoNvptxBackEnd)
}

/// Creates an LLVM target machine for `target` (optimisation level aggressive).
///
/// # Errors
/// [`CodegenError::NoNvptxBackEnd`] or [`CodegenError::TargetMachine`].
pub fn target_machine(target: &Target) -> Result<TargetMachine, CodegenError> {
    nvptx_backend()?;
    let triple = TargetTriple::create(target.llvm_triple());
    let llvm_target = LlvmTarget::from_triple(&triple)
        .map_err(|e| CodegenError::NoNvptxBackEnd(e.to_string()))?;
    llvm_target
        .create_target_machine(
            &triple,
            target.llvm_cpu(),
            target.llvm_features(),
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::TargetMachine {
            triple: target.llvm_triple().to_owned(),
            cpu: target.llvm_cpu().to_owned(),
            features: target.llvm_features().to_owned(),
        })
}

/// Compiles an LLVM module to PTX text for `target` with LLVM's NVPTX back end.
///
/// The module's triple and data layout are set to NVPTX's (`nvptx64-nvidia-cuda`) before
/// the module is verified and compiled; nothing else in it changes. Only the back end runs
/// (instruction selection, register allocation at optimisation level aggressive); the
/// IR-level optimisation pipeline is the caller's choice.
///
/// # Errors
/// [`CodegenError::InvalidModule`] when the LLVM verifier rejects the module (checked first,
/// since the back end may abort on invalid IR), [`CodegenError::Emit`] when the back end
/// fails, and the errors of [`target_machine`].
pub fn compile_module_to_ptx(module: &Module<'_>, target: &Target) -> Result<String, CodegenError> {
    let machine = target_machine(target)?;
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    module.verify().map_err(|e| CodegenError::InvalidModule {
        module: module.get_name().to_string_lossy().into_owned(),
        message: e.to_string(),
    })?;
    let buffer = machine
        .write_to_memory_buffer(module, FileType::Assembly)
        .map_err(|e| CodegenError::Emit {
            target: *target,
            message: e.to_string(),
        })?;
    let text = std::str::from_utf8(buffer.as_slice()).map_err(|_| CodegenError::PtxNotUtf8)?;
    // The buffer may end in a NUL terminator.
    Ok(text.trim_end_matches('\0').to_owned())
}
