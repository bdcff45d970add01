//! The kernels run on the CPU: small kernel graphs (the hand-built ones of
//! `codegen/tests/graphs/`, shared with the snapshot tests, and kernel bodies as the passes
//! produce them) compiled through [`compile_kernel`] for sm_90a, their LLVM IR (captured
//! before optimisation with [`capture_ir`]) run by the CPU emulator of kernel IR
//! (`kernels::matmul::emu`), every output compared with the interpreter's.
//!
//! This checks the generated arithmetic, indexing, vectorisation, bounds, grid-stride and
//! cluster logic without a GPU; it does not check the NVPTX back end or ptxas (the snapshot
//! tests assemble every kernel, the GPU tests run them). The emulator's `ex2.approx` is the
//! host's `exp2f`, within the f32 tolerance of the device's.
//!
//! Design notes: book/src/design/isa.md

#[path = "../../tests/graphs/mod.rs"]
mod graphs;
mod pointwise;
mod rope_logical;
mod rotary;
mod rows;

use sinter_ir::interp::{run_kernel_graph, Tensor};
use sinter_ir::{Bindings, DType, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, OpKind};

use crate::isa::capture_ir;
use crate::emu;
use crate::target::Target;
use crate::{compile_kernel, ptxas, CodegenError};

/// A deterministic pseudo-random stream (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn random(rng: &mut Rng, dt: DType, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    Tensor::from_fn(dt, shape, |_| {
        let v = rng.uniform(lo, hi);
        if dt.is_float() {
            v
        } else {
            v.floor()
        }
    })
}

fn with(t: Tensor, f: impl Fn(usize, f64) -> f64) -> Tensor {
    let (dt, shape) = (t.dtype(), t.shape().to_vec());
    let data: Vec<f64> = t.data().iter().enumerate().map(|(i, &v)| f(i, v)).collect();
    Tensor::new(dt, &shape, data).unwrap()
}

fn encode(dt: DType, data: &[f64]) -> Vec<u8> {
    if dt.is_quantized() {
        return sinter_ir::dtype::qcodes_to_bytes(dt, data).expect("whole blocks");
    }
    let mut out = Vec::with_capacity(data.len() * dt.size_bytes());
    for &v in data {
        match dt {
            DType::BF16 => out.extend(sinter_ir::dtype::bf16_from_f64(v).to_bits().to_le_bytes()),
            DType::F16 => out.extend(sinter_ir::dtype::f16_from_f64(v).to_bits().to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I64 => out.extend((v as i64).to_le_bytes()),
            DType::Bool => out.push(u8::from(v != 0.0)),
            DType::F8E4M3 => out.push(sinter_ir::dtype::f8e4m3_from_f64(v)),
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => unreachable!("handled above"),
        }
    }
    out
}

fn decode(dt: DType, bytes: &[u8], n: usize) -> Vec<f64> {
    let w = dt.size_bytes();
    (0..n)
        .map(|i| {
            let b = &bytes[i * w..(i + 1) * w];
            match dt {
                DType::BF16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
                DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
                DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                DType::Bool => f64::from(b[0]),
                DType::F8E4M3 => sinter_ir::dtype::f8e4m3_to_f64(b[0]),
                DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => panic!("a block-quantized output"),
            }
        })
        .collect()
}

/// Bytes after each output buffer that must stay untouched.
const GUARD: usize = 64;

/// Runs kernel `k` of `g` on the CPU emulator with `inputs` and compares every output with
/// the interpreter under DESIGN.md's tolerance (f32: rtol 1e-5, atol 1e-6·max|ref|; bf16:
/// rtol 1.6e-2, atol 1e-2·max|ref|; NaN exactly where the reference has NaN; integers exact),
/// checking that nothing is written past an output. At most `max_ctas` CTAs (clusters, for a
/// cluster kernel) run: the kernels loop over the grid. Returns the outputs.
fn check_on_cpu(tag: &str, gk: &(KernelGraph, Kernel), bindings: &Bindings, inputs: &[Tensor], max_ctas: u32) -> Vec<Vec<f64>> {
    check_built_on_cpu(tag, gk, bindings, inputs, max_ctas, || compile_kernel(&gk.0, gk.1, &Target::SM_90A))
}

/// [`check_on_cpu`] with the plan `build` makes (for sm_90a).
fn check_built_on_cpu(tag: &str, gk: &(KernelGraph, Kernel), bindings: &Bindings, inputs: &[Tensor], max_ctas: u32, build: impl FnOnce() -> Result<LaunchPlan, CodegenError>) -> Vec<Vec<f64>> {
    let (g, k) = gk;
    let (plan, irs) = capture_ir(build);
    let mut plan = plan.unwrap_or_else(|e| panic!("{tag}: {e}"));
    let ir = irs.last().unwrap_or_else(|| panic!("{tag}: no IR captured"));
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let kd = &g.kernels[*k];
    let mut buffers: Vec<Vec<u8>> = inputs.iter().map(|t| encode(t.dtype(), t.data())).collect();
    let mut out_meta = Vec::new();
    for (j, &b) in kd.outputs.iter().enumerate() {
        let bd = &g.buffers[b];
        let n = bd.ty.shape.iter().map(|d| d.eval(bindings).unwrap() as usize).product::<usize>();
        // KvAppend updates its pages in place: output j starts as the page input it aliases.
        let alias = (kd.family == Family::KvAppend).then(|| page_param(&kd.body, j)).flatten();
        let mut bytes = match alias {
            Some(i) => buffers[i].clone(),
            None => vec![0xFF; n * bd.ty.dtype.size_bytes()],
        };
        bytes.extend(std::iter::repeat_n(0xA5, GUARD));
        out_meta.push((bd.ty.dtype, n));
        buffers.push(bytes);
    }
    // The emulator runs the plan's IR over its grid: the captured IR, and the first grid axis
    // cut to `max_ctas`.
    plan.ptx = ir.clone();
    plan.grid[0] = GridDim::fixed(plan.grid[0].eval(bindings).unwrap().min(max_ctas));
    let start = std::time::Instant::now();
    emu::run(&plan, bindings, &mut buffers);
    eprintln!("{tag}: emulated in {:.2} s", start.elapsed().as_secs_f64());
    // The interpreter rejects out-of-range gather indices: those tags end in "oor" and the
    // caller checks the outputs itself.
    let reference = if tag.ends_with("oor") {
        None
    } else {
        Some(run_kernel_graph(g, &refs, bindings).unwrap_or_else(|e| panic!("{tag}: the interpreter: {e}")))
    };
    let mut outs = Vec::new();
    for (j, (dt, n)) in out_meta.iter().enumerate() {
        let bytes = &buffers[inputs.len() + j];
        assert!(bytes[n * dt.size_bytes()..].iter().all(|&b| b == 0xA5), "{tag}: output {j} written past its end");
        let got = decode(*dt, bytes, *n);
        if let Some(r) = &reference {
            compare(&format!("{tag} output {j}"), *dt, &got, r[j].data());
        }
        outs.push(got);
    }
    outs
}

/// The parameter position of page operand `j` of the body's `kv_append`.
fn page_param(body: &Function, j: usize) -> Option<usize> {
    let nd = body.nodes.values().find(|nd| nd.op.kind == OpKind::KvAppend)?;
    match body.values[*nd.inputs.get(j)?].def {
        sinter_ir::ValueDef::Param(i) => Some(i),
        _ => None,
    }
}

fn compare(tag: &str, dt: DType, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{tag}");
    let max = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    let (rtol, atol) = match dt {
        DType::BF16 => (1.6e-2, 1e-2 * max),
        DType::F16 => (2e-3, 1e-3 * max),
        DType::F32 => (1e-5, 1e-6 * max),
        _ => (0.0, 0.0),
    };
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else if w.is_infinite() || g.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        if !ok {
            bad.push(format!("[{i}] got {g}, want {w}"));
        }
    }
    assert!(bad.is_empty(), "{tag}: {} of {} elements differ (max|ref| {max}):\n{}", bad.len(), got.len(), bad.iter().take(12).cloned().collect::<Vec<_>>().join("\n"));
}

fn bind(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Rows of `[rows, n]` with the special rows of DESIGN.md: all −inf, one NaN, one +inf, all
/// zero, a very negative but finite row, then random ones.
fn special_rows(rng: &mut Rng, dt: DType, rows: usize, n: usize, what: &str) -> Tensor {
    let x = random(rng, dt, &[rows, n], -4.0, 4.0);
    let soft = what.contains("softmax");
    with(x, |i, v| {
        let (r, c) = (i / n, i % n);
        match r {
            0 if soft => f64::NEG_INFINITY,
            0 => 0.0,
            1 if c == n / 2 => f64::NAN,
            2 if c == n / 3 && soft => f64::INFINITY,
            3 if soft => -1e4 + v,
            3 => 0.0,
            _ => v,
        }
    })
}

/// Assembles `plan` for its target; asserts no spills, no stack, no warnings. `None` where
/// ptxas is missing (a panic under CI).
fn assemble(plan: &LaunchPlan) -> Option<ptxas::PtxasReport> {
    let path = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}"))?;
    let target = plan.target;
    let report = ptxas::assemble_with(&path, &plan.ptx, &target).unwrap_or_else(|e| panic!("{}: {e}\n{}", plan.entry, plan.ptx));
    let k = report.function(&plan.entry).unwrap_or_else(|| panic!("{}: not in {report:?}", plan.entry));
    assert!(!report.spills(), "{}: spills\n{report}", plan.entry);
    assert_eq!(k.stack_frame_bytes, 0, "{}: stack\n{report}", plan.entry);
    assert!(report.warnings.is_empty(), "{report}");
    assert!(k.registers * plan.block.iter().product::<u32>() <= target.registers_per_sm(), "{}: {} registers × {:?} threads", plan.entry, k.registers, plan.block);
    Some(report)
}
