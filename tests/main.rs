//! Integration tests: one binary (it links LLVM once), one module per topic.

mod architecture;
mod zoo;
mod bad_input;
mod filetests;
mod text_fuzz;
mod reference;
mod zoo_snapshots;
mod smollm2;
mod hf_folder;
mod book;
mod passes;
mod gpu;
mod fused_zoo;
mod engine_gpu;
mod cascade;
mod decoder;
mod gemma3;
mod adversarial;
mod compile_parallel;
mod fuzz;
mod facade;
mod rope_logical;
mod qwen;
mod hf_reference;
mod tokenizer;
mod gemma3_gguf;
