//! Gemma 3 270M from its real GGUF file (`gemma-3-270m-q4_k_m.gguf`, fetched by
//! `sinter run --model gemma3-270m`): tensors in F32, Q8_0, Q5_0, Q4_K and Q6_K.
//!
//! - Every tensor dequantises bit for bit as the `gguf` Python package's numpy ports of
//!   llama.cpp's `dequantize_row_*` do (`bench/fixtures/gemma3_dequant_fixture.py` wrote the
//!   sha256 of each tensor's f32 values), and the interpreter's `dequantize` of the blocks as
//!   stored gives the same values.
//!
//! CI does not fetch the file (253 MB): where it is missing these tests say so and pass.

use sha2::{Digest, Sha256};
use sinter::llm::fetch;
use sinter::llm::gguf::GgufFile;
use sinter::DType;
use sinter_ir::{Attr, Bindings, Dim, FunctionBuilder, Graph, OpKind, TensorType};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3_270m");

/// The cached file, or `None` (with a message) where it has not been fetched.
pub(crate) fn gemma3_file() -> Option<GgufFile> {
    let known = fetch::known_model("gemma3-270m").expect("gemma3-270m is a known model");
    let path = fetch::model_path(known);
    if !path.exists() {
        eprintln!("skipped: {} is missing (`sinter run --model gemma3-270m` fetches it)", path.display());
        return None;
    }
    Some(GgufFile::open(&path).unwrap())
}

/// `dequantize(w) {dtype=f32}` of a block-quantized tensor on the interpreter.
fn interpreter_dequantize(w: &sinter::Tensor) -> Vec<f64> {
    let mut fb = FunctionBuilder::new(&Graph::new(), "main");
    let dims: Vec<Dim> = w.shape().iter().map(|&d| Dim::constant(d as i64)).collect();
    let p = fb.param("w", TensorType::new(w.dtype(), dims));
    let y = fb.op1(OpKind::Dequantize, &[p], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
    let mut g = Graph::new();
    g.add_func(fb.finish(&[y]).unwrap());
    sinter_ir::interp::run(&g, "main", &[w], &Bindings::new()).unwrap().remove(0).into_data()
}

#[test]
fn gemma3_gguf_every_tensor_dequantises_as_the_gguf_package_does() {
    let Some(file) = gemma3_file() else { return };
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/dequant.json")).unwrap()).unwrap();
    let want = j["tensors"].as_object().unwrap();
    assert_eq!(file.tensors().len(), want.len(), "tensor count");
    let mut by_type = std::collections::BTreeMap::<String, usize>::new();
    let mut interpreted = 0;
    for t in file.tensors() {
        let w = &want[&t.name];
        let kind = sinter::llm::gguf::kind_name(t.kind);
        assert_eq!(kind, w["type"].as_str().unwrap(), "{}", t.name);
        let shape: Vec<usize> = w["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(t.shape, shape, "{}", t.name);
        let values = file.dequantize(&t.name, &shape).unwrap();
        let mut h = Sha256::new();
        for v in &values {
            h.update(v.to_le_bytes());
        }
        assert_eq!(format!("{:x}", h.finalize()), w["sha256"].as_str().unwrap(), "{} ({kind}): the f32 values differ from the gguf package's", t.name);
        *by_type.entry(kind).or_default() += 1;
        // The interpreter's codes of the same blocks (the 168M-element embedding aside: its
        // codes would take 1.3 GB).
        if let Some(q) = file.quantized_tensor(&t.name, &shape).unwrap().filter(|q| q.numel() <= 4 << 20) {
            let got = interpreter_dequantize(&q);
            for (i, (a, b)) in got.iter().zip(&values).enumerate() {
                assert_eq!((*a as f32).to_bits(), b.to_bits(), "{} element {i}: interpreter {a} vs loader {b}", t.name);
            }
            interpreted += 1;
        }
    }
    eprintln!("gemma3 GGUF: {by_type:?} tensors equal to the gguf package's dequantisation bit for bit; {interpreted} block-quantized ones equal through the interpreter too");
    assert_eq!(by_type.values().sum::<usize>(), 236);
    assert!(["Q4_K", "Q5_0", "Q6_K", "Q8_0"].iter().all(|k| by_type.contains_key(*k)));
}
