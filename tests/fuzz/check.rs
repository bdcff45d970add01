//! One fuzz case on the CPU: the interpreter's result (the reference), then the unfused and
//! the fused lowering, each compiled for the emulator and run on it
//! (`sinter_codegen::emu::graph`), every output compared with DESIGN.md's rule.

use sinter::ir::{Graph, KernelGraph};
use sinter::{Bindings, DType, Target, Tensor};
use sinter_codegen::emu::graph::{compile_plans, run_plans, GraphRunError};

use super::cases::Features;

/// What one case gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Both lowerings matched the interpreter; kernels of each.
    Pass { unfused: usize, fused: usize },
    /// Nothing to compare (the interpreter refused the inputs, or the code generator refuses
    /// the graph unfused too): why.
    Skip(String),
    /// A bug: which path and what.
    Finding(String),
}

/// DESIGN.md's element-wise rule (f32 widened to rtol 2e-5, as the emulator's host `exp2`
/// stands in for `ex2.approx`): `|out − ref| ≤ atol + rtol·|ref|`, NaN exactly where the
/// reference has NaN, ±inf equal; integers and bools exact. With `spread` ([`spread`]: how far
/// the reference moves when its inputs and its intermediate values move by a few units of
/// their dtype's rounding) an element may also differ by twice its spread, and anything goes
/// where the spread is infinite. A kernel computing in f32 cannot do better than its inputs'
/// and its own roundings allow: this admits ill-conditioned elements (near-tied scores of
/// magnitude 10⁸, cancelling sums, a layer_norm of values 88 ulps apart) and no others, as a
/// well-conditioned reference barely moves; the spread is infinite where the moves reach a
/// tenth of the output's largest magnitude (the element is not determined at this precision)
/// and where an element depends on inputs beyond f32's range ([`saturated`]), and NaN (any
/// non-finite output for a non-finite reference) where a non-finite element depends on them
/// ([`zeroed_large`]). NaN is accepted where the
/// reference is ±inf: an infinite value times an f32 weight that underflowed to 0 is NaN
/// (IEEE), where the f64 reference keeps the weight.
pub fn compare(
    what: &str,
    out: &Tensor,
    want: &Tensor,
    spread: Option<&[f64]>,
) -> Result<(), String> {
    if out.shape() != want.shape() || out.dtype() != want.dtype() {
        return Err(format!(
            "{what}: {}{:?} vs reference {}{:?}",
            out.dtype(),
            out.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    let max_ref = want
        .data()
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()));
    let (rtol, atol) = match want.dtype() {
        DType::BF16 | DType::F16 => (1.6e-2, 1e-2 * max_ref),
        DType::F32 => (2e-5, 2e-6 * max_ref),
        _ => (0.0, 0.0),
    };
    for (i, (&o, &r)) in out.data().iter().zip(want.data()).enumerate() {
        let slack = spread.and_then(|s| s.get(i).copied()).unwrap_or(0.0);
        if slack.is_infinite() || (slack.is_nan() && !o.is_finite()) {
            continue;
        }
        let slack = if slack.is_nan() { 0.0 } else { slack };
        let slack = if r.is_finite() { 2.0 * slack } else { 0.0 };
        let bad = if r.is_infinite() && o.is_nan() {
            false
        } else if r.is_nan() || o.is_nan() {
            r.is_nan() != o.is_nan()
        } else if r.is_infinite() || o.is_infinite() {
            r != o
        } else {
            (o - r).abs() > atol + rtol * r.abs() + slack
        };
        if bad {
            let idx = unravel(i, want.shape());
            return Err(format!(
                "{what}: element {idx:?} of {:?}: {o} vs reference {r} (max |ref| {max_ref:e})",
                want.shape()
            ));
        }
    }
    Ok(())
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (a, &d) in shape.iter().enumerate().rev() {
        idx[a] = i % d.max(1);
        i /= d.max(1);
    }
    idx
}

/// The inputs of `kg` (its input buffers, by name) from the graph's named inputs.
pub fn kernel_inputs<'a>(
    kg: &KernelGraph,
    inputs: &'a [(String, Tensor)],
) -> Result<Vec<&'a Tensor>, String> {
    kg.inputs
        .iter()
        .map(|b| {
            let name = kg.buffers[*b].name.as_deref().unwrap_or("");
            inputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| format!("kernel graph input `{name}` is not a graph parameter"))
        })
        .collect()
}

/// Why an emulated run gave no outputs.
enum Failed {
    /// The code generator refuses a kernel.
    Refused(String),
    /// The emulator cannot run a kernel (its own limits: TMA, host IR it cannot rewrite).
    Emulator(String),
    /// The run went wrong: out-of-bounds or foreign writes, a failure inside a kernel.
    Run(String),
}

/// `kg` compiled for the emulator and run on it.
fn emulate(
    kg: &KernelGraph,
    target: &Target,
    inputs: &[(String, Tensor)],
) -> Result<Vec<Tensor>, Failed> {
    let plans = compile_plans(kg, target).map_err(|e| Failed::Refused(e.to_string()))?;
    let ins = kernel_inputs(kg, inputs).map_err(Failed::Run)?;
    run_plans(kg, &plans, &ins, &Bindings::new()).map_err(|e| match e {
        GraphRunError::Codegen { .. } => Failed::Refused(e.to_string()),
        GraphRunError::Emulator { ref message, .. }
            if message.contains("host IR does not parse")
                || message.contains("runs no TMA kernel")
                || message.contains("runs no wgmma kernel") =>
        {
            Failed::Emulator(e.to_string())
        }
        other => Failed::Run(other.to_string()),
    })
}

/// The fraction of a low-precision output that must equal the reference bit for bit in a
/// graph of explicit casts: where the graph rounds is where the kernel must round, so only
/// the rare element whose f32 statistics differ in the last bit may round the other way.
const SAME_ROUNDING: f64 = 0.9;

/// The inputs with every finite, non-zero float element moved by a random ±`u` relative,
/// `u` a few units of its dtype's rounding (f32 2⁻²⁰, f16 2⁻¹¹, bf16 2⁻⁸), where the moved
/// value stays finite; integers untouched. Seeded by `seed`, so a case replays exactly.
pub fn perturbed(inputs: &[(String, Tensor)], seed: u64) -> Vec<(String, Tensor)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed_0f_c0_11d);
    inputs
        .iter()
        .map(|(n, t)| {
            let u = match t.dtype() {
                DType::F32 => (-20f64).exp2(),
                DType::F16 => (-11f64).exp2(),
                DType::BF16 => (-8f64).exp2(),
                _ => return (n.clone(), t.clone()),
            };
            let data: Vec<f64> = t
                .data()
                .iter()
                .map(|&x| {
                    let y = t
                        .dtype()
                        .round(x * (1.0 + if rng.random_bool(0.5) { u } else { -u }));
                    if x.is_finite() && x != 0.0 && y.is_finite() {
                        y
                    } else {
                        x
                    }
                })
                .collect();
            (
                n.clone(),
                Tensor::new(t.dtype(), t.shape(), data).expect("same shape"),
            )
        })
        .collect()
}

/// `graph` with every float value that one node computes and another reads multiplied by a
/// new parameter of its type, and those parameters as tensors of ones: [`perturbed`] ones
/// move each intermediate result by a few units of its rounding, as a kernel's own arithmetic
/// may (its ops are within a few ulps of the correctly rounded result, not at it). `None` for
/// a graph with calls or symbolic shapes.
fn with_rounding_noise(graph: &Graph) -> Option<(Graph, Vec<(String, Tensor)>)> {
    use sinter::ir::{Function, Op, OpKind};
    if graph.funcs.len() != 1 {
        return None;
    }
    let f = graph.entry()?;
    let read: std::collections::HashSet<_> = f.nodes.values().flat_map(|n| n.inputs.iter().copied()).collect();
    let mut nf = Function::new(f.name.clone());
    // Each value as its readers see it, and as computed.
    let mut map = std::collections::HashMap::new();
    for &p in &f.params {
        map.insert(p, nf.add_param(f.values[p].name.clone(), f.ty(p).clone()));
    }
    let mut plain = map.clone();
    let mut ones = vec![];
    for nd in f.nodes.values() {
        if nd.op.kind == OpKind::Call {
            return None;
        }
        let ins = nd.inputs.iter().map(|v| map[v]).collect();
        let (_, rs) = nf.push_node(nd.op.clone(), ins, nd.results.iter().map(|&r| f.ty(r).clone()).collect());
        for (&r, nr) in nd.results.iter().zip(rs) {
            let ty = f.ty(r).clone();
            map.insert(r, nr);
            plain.insert(r, nr);
            if !read.contains(&r) || !ty.dtype.is_float() {
                continue;
            }
            let shape = ty.shape.iter().map(|d| d.as_const().map(|c| c as usize)).collect::<Option<Vec<_>>>()?;
            let name = format!("noise{}", ones.len());
            let m = nf.add_param(Some(name.clone()), ty.clone());
            let (_, vm) = nf.push_node(Op::plain(OpKind::Mul).ok()?, vec![nr, m], vec![ty.clone()]);
            map.insert(r, vm[0]);
            ones.push((name, Tensor::new(ty.dtype, &shape, vec![1.0; shape.iter().product()]).ok()?));
        }
    }
    // The outputs as computed: their own rounding is what the tolerance is for.
    nf.outputs = f.outputs.iter().map(|o| plain.get(o).copied()).collect::<Option<_>>()?;
    let mut g = Graph::new();
    g.add_func(nf);
    Some((g, ones))
}

/// Magnitudes past which f32 accumulation leaves its range: a product of two values above
/// 2⁶⁰ (or a sum of a few) passes f32's largest, 2¹²⁸; a square of one below 2⁻⁶⁰ falls
/// under its smallest normal, 2⁻¹²⁶.
const F32_SAFE: (f64, f64) = (1.152_921_504_606_847e18, 8.673_617_379_884_035e-19);

/// The inputs with `f` applied to every float element (of every input but an additive mask
/// when `skip_masks`): `f` gives the new value of an element it changes. `None` when nothing
/// changes.
fn map_floats(inputs: &[(String, Tensor)], skip_masks: bool, f: impl Fn(f64) -> Option<f64>) -> Option<Vec<(String, Tensor)>> {
    let mut changed = false;
    let out = inputs
        .iter()
        .map(|(n, t)| {
            if !t.dtype().is_float() || (skip_masks && n.starts_with("mask")) {
                return (n.clone(), t.clone());
            }
            let data: Vec<f64> = t
                .data()
                .iter()
                .map(|&x| match f(x) {
                    Some(y) => {
                        changed = true;
                        y
                    }
                    None => x,
                })
                .collect();
            (n.clone(), Tensor::new(t.dtype(), t.shape(), data).expect("same shape"))
        })
        .collect();
    changed.then_some(out)
}

/// The inputs (additive masks excepted) with every float magnitude above 2⁶⁰ made ±inf and every one below 2⁻⁶⁰ made
/// ±0: what f32 accumulation does to their products, squares and sums (DESIGN.md:
/// accumulation in f32, as in cuBLAS and FlashAttention). An element of the reference that
/// changes under this depends on values beyond f32's range; `None` when nothing changes.
///
/// An additive mask's finite extremes are added to scores, never multiplied or squared: a
/// kernel keeps them finite, and a row masked with the lowest finite value must give the
/// finite mean (the finite-mask case), not anything.
pub fn saturated(inputs: &[(String, Tensor)]) -> Option<Vec<(String, Tensor)>> {
    map_floats(inputs, true, |x| match x.abs() {
        a if a.is_finite() && a > F32_SAFE.0 => Some(x.signum() * f64::INFINITY),
        a if a != 0.0 && a < F32_SAFE.1 => Some(0.0f64.copysign(x)),
        _ => None,
    })
}

/// The inputs with every float magnitude above 2⁶⁰ made ±0 (a probe of which elements depend
/// on them, for [`spread`]); `None` when there is none.
fn zeroed_large(inputs: &[(String, Tensor)]) -> Option<Vec<(String, Tensor)>> {
    map_floats(inputs, false, |x| (x.is_finite() && x.abs() > F32_SAFE.0).then(|| 0.0f64.copysign(x)))
}

/// The inputs with every float magnitude above 2⁶⁰ made 0, in every input but an additive
/// mask: an element of the reference that changes under this depends on a product or sum
/// that f32 accumulation may overflow to either sign (a score that is +inf in the reference
/// and −inf in a kernel hides its key where the reference's row is NaN). `None` when nothing
/// changes.
pub fn dropped(inputs: &[(String, Tensor)]) -> Option<Vec<(String, Tensor)>> {
    map_floats(inputs, true, |x| (x.is_finite() && x.abs() > F32_SAFE.0).then_some(0.0))
}

/// The inputs with every float magnitude above 2⁶⁰ clamped to ±2⁶⁰, in every input but an
/// additive mask: where [`dropped`]'s zeros meet an infinity elsewhere (`0 · −inf` = NaN,
/// the reference's NaN again), a finite stand-in still shows that a row depends on a sum f32
/// accumulation may overflow in either order (a sequential `fma` chain keeps the sign of its
/// first overflowing product: a score of −inf where the f64 reference's is +inf). `None`
/// when nothing changes.
pub fn clamped(inputs: &[(String, Tensor)]) -> Option<Vec<(String, Tensor)>> {
    map_floats(inputs, true, |x| (x.is_finite() && x.abs() > F32_SAFE.0).then(|| F32_SAFE.0.copysign(x)))
}

/// Draws of [`perturbed`] inputs [`spread`] takes: one draw's estimate of the sensitivity
/// varies by orders of magnitude with the signs drawn, the largest of three is steady.
const SPREAD_DRAWS: u64 = 3;

/// Per output element, the largest `|moved − ref|` over [`SPREAD_DRAWS`] runs of the
/// reference on [`perturbed`] inputs with [`with_rounding_noise`] on its intermediate values
/// (+inf where a moved reference is not finite and `ref` is, or where the move reaches a tenth
/// of the output's largest magnitude), +inf over a row where the reference on [`saturated`],
/// [`dropped`] or [`clamped`] inputs differs at all, and NaN where `ref` is not finite and moves when the
/// inputs beyond 2⁶⁰ are made 0 ([`zeroed_large`]), for [`compare`];
/// `None` for a graph of explicit casts (`strict`), where rounding is the thing checked, or
/// when the reference does not run.
pub fn spread(
    graph: &Graph,
    inputs: &[(String, Tensor)],
    want: &[Tensor],
    seed: u64,
    strict: bool,
) -> Option<Vec<Vec<f64>>> {
    if strict {
        return None;
    }
    let mut worst: Vec<Vec<f64>> = want.iter().map(|w| vec![0.0; w.numel()]).collect();
    let noisy = with_rounding_noise(graph);
    for draw in 0..SPREAD_DRAWS {
        let mut moved = perturbed(inputs, seed.wrapping_add(draw));
        let g = match &noisy {
            Some((g, ones)) => {
                moved.extend(perturbed(ones, !seed.wrapping_add(draw)));
                g
            }
            None => graph,
        };
        let refs: Vec<&Tensor> = moved.iter().map(|(_, t)| t).collect();
        let got = sinter::ir::interp::run_entry(g, &refs, &Bindings::new()).ok()?;
        for ((acc, g), w) in worst.iter_mut().zip(&got).zip(want) {
            for ((a, &m), &r) in acc.iter_mut().zip(g.data()).zip(w.data()) {
                let d = if r.is_finite() && !m.is_finite() {
                    f64::INFINITY
                } else if r.is_finite() {
                    (m - r).abs()
                } else {
                    0.0
                };
                *a = a.max(d);
            }
        }
    }
    // An element that rounding-level moves shift by a tenth of its output's largest magnitude
    // is not determined by the graph at its precision (cos of 7·10¹⁵ computed in f32, whose
    // ulp there is 512 million): three draws estimate such a move too unreliably to bound it.
    for (acc, w) in worst.iter_mut().zip(want) {
        let max_ref = w.data().iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()));
        acc.iter_mut().filter(|a| **a > 0.1 * max_ref).for_each(|a| *a = f64::INFINITY);
    }
    for sat in [saturated(inputs), dropped(inputs), clamped(inputs)].into_iter().flatten() {
        let refs: Vec<&Tensor> = sat.iter().map(|(_, t)| t).collect();
        let got = sinter::ir::interp::run_entry(graph, &refs, &Bindings::new()).ok()?;
        for ((acc, g), w) in worst.iter_mut().zip(&got).zip(want) {
            // A row (last axis) with one such element has all of them: its elements share
            // the row's statistics (a softmax's maximum, attention's scores), and a score
            // that overflowed to the other sign's infinity changes each of them, a NaN of
            // the reference included.
            let n = w.shape().last().copied().unwrap_or(1).max(1);
            for ((a, gr), wr) in acc.chunks_mut(n).zip(g.data().chunks(n)).zip(w.data().chunks(n)) {
                if gr.iter().zip(wr).any(|(&m, &r)| m != r && !(m.is_nan() && r.is_nan())) {
                    a.fill(f64::INFINITY);
                }
            }
        }
    }
    // A non-finite reference element that moves when the inputs beyond 2⁶⁰ are made 0
    // depends on them: a kernel whose f32 sum of their squares overflowed may reach another
    // non-finite value by another path (x·rsqrt(∞) = −0, then rsqrt(−0) = −∞ where the f64
    // reference takes the rsqrt of a small negative number: NaN). NaN marks it for `compare`.
    if let Some(zeroed) = zeroed_large(inputs) {
        let refs: Vec<&Tensor> = zeroed.iter().map(|(_, t)| t).collect();
        let got = sinter::ir::interp::run_entry(graph, &refs, &Bindings::new()).ok()?;
        for ((acc, g), w) in worst.iter_mut().zip(&got).zip(want) {
            for ((a, &m), &r) in acc.iter_mut().zip(g.data()).zip(w.data()) {
                if !r.is_finite() && a.is_finite() && m != r && !(m.is_nan() && r.is_nan()) {
                    *a = f64::NAN;
                }
            }
        }
    }
    Some(worst)
}

fn compare_all(
    path: &str,
    got: &[Tensor],
    want: &[Tensor],
    strict: bool,
    spread: Option<&[Vec<f64>]>,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{path}: {} outputs, the interpreter gives {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        compare(
            &format!("{path}: output {i}"),
            g,
            w,
            spread.and_then(|s| s.get(i)).map(Vec::as_slice),
        )?;
        if strict && matches!(w.dtype(), DType::BF16 | DType::F16) && w.numel() >= 16 {
            let same = g
                .data()
                .iter()
                .zip(w.data())
                .filter(|(a, b)| a == b || (a.is_nan() && b.is_nan()))
                .count();
            let frac = same as f64 / w.numel() as f64;
            if frac < SAME_ROUNDING {
                return Err(format!("{path}: output {i}: only {:.0}% of the elements round as the graph does (explicit casts: at least {:.0}% must be bit-identical)", 100.0 * frac, 100.0 * SAME_ROUNDING));
            }
        }
    }
    Ok(())
}

/// Runs one case: `graph` on the values of `vseed` (drawn under `feats`), the lowerings compiled for `target`
/// and emulated; with `ptx_targets`, the fused lowering for each of them is also compiled to
/// PTX (not run): a kernel the passes formed that the generator refuses is a finding. With
/// `strict` (a graph of explicit casts), low-precision outputs must also round as the graph
/// does ([`SAME_ROUNDING`]).
pub fn check_case(
    graph: &Graph,
    vseed: u64,
    feats: Features,
    strict: bool,
    target: &Target,
    ptx_targets: &[Target],
) -> Outcome {
    let inputs = super::values::inputs(graph, vseed, feats);
    let refs: Vec<&Tensor> = inputs.iter().map(|(_, t)| t).collect();
    let want = match sinter::ir::interp::run_entry(graph, &refs, &Bindings::new()) {
        Ok(w) => w,
        Err(e) => return Outcome::Skip(format!("interpreter: {e}")),
    };
    let spread = spread(graph, &inputs, &want, vseed, strict);
    let spread = spread.as_deref();
    let unfused = match sinter_passes::lower_unfused(graph) {
        Ok(kg) => kg,
        Err(e) => return Outcome::Finding(format!("unfused lowering failed: {e}")),
    };
    let mut unfused_compiles = true;
    match emulate(&unfused, target, &inputs) {
        Ok(got) => {
            if let Err(e) = compare_all("unfused", &got, &want, strict, spread) {
                return Outcome::Finding(e);
            }
        }
        Err(Failed::Refused(e)) => {
            unfused_compiles = false;
            eprintln!(
                "  unfused does not compile for {target}: {}",
                e.lines().next().unwrap_or("")
            );
        }
        Err(Failed::Emulator(e)) => {
            return Outcome::Skip(format!("unfused: {}", e.lines().next().unwrap_or("")))
        }
        Err(Failed::Run(e)) => return Outcome::Finding(format!("unfused: {e}")),
    }
    let opts = sinter_passes::PassOptions::for_graph(graph);
    let fused = match sinter_passes::compile(graph, target, &opts) {
        Ok((kg, _)) => kg,
        Err(e) => return Outcome::Finding(format!("fused lowering failed: {e}")),
    };
    match emulate(&fused, target, &inputs) {
        Ok(got) => {
            if let Err(e) = compare_all("fused", &got, &want, strict, spread) {
                return Outcome::Finding(e);
            }
        }
        Err(Failed::Refused(e)) if unfused_compiles => {
            return Outcome::Finding(format!(
                "fused for {target} does not compile where unfused does: {e}"
            ))
        }
        Err(Failed::Refused(e)) => {
            return Outcome::Skip(format!("neither lowering compiles for {target}: {e}"))
        }
        Err(Failed::Emulator(e)) => {
            return Outcome::Skip(format!("fused: {}", e.lines().next().unwrap_or("")))
        }
        Err(Failed::Run(e)) => return Outcome::Finding(format!("fused: {e}")),
    }
    for t in ptx_targets {
        if let Err(e) = ptx_check(graph, t) {
            return Outcome::Finding(e);
        }
    }
    if !unfused_compiles {
        return Outcome::Skip(format!("unfused does not compile for {target}"));
    }
    Outcome::Pass {
        unfused: unfused.kernels.len(),
        fused: fused.kernels.len(),
    }
}

/// The fused lowering for `t` compiled to PTX, kernel by kernel; a refusal is an error only
/// when the unfused lowering compiles for `t`.
fn ptx_check(graph: &Graph, t: &Target) -> Result<(), String> {
    let opts = sinter_passes::PassOptions::for_graph(graph);
    let (kg, _) = sinter_passes::compile(graph, t, &opts)
        .map_err(|e| format!("fused lowering for {t} failed: {e}"))?;
    let Some((k, e)) = kg.kernels.keys().find_map(|k| {
        sinter_codegen::compile_kernel(&kg, k, t)
            .err()
            .map(|e| (k, e))
    }) else {
        return Ok(());
    };
    let un = sinter_passes::lower_unfused(graph).map_err(|e| e.to_string())?;
    if un
        .kernels
        .keys()
        .all(|k| sinter_codegen::compile_kernel(&un, k, t).is_ok())
    {
        return Err(format!(
            "fused for {t}: kernel {k} ({:?}) does not compile where unfused does: {e}",
            kg.kernels[k].family
        ));
    }
    Ok(())
}

#[test]
fn the_spread_admits_ill_conditioned_elements_only() {
    // y = x0·x1 + x2: well conditioned at (1.5, 2, 0.25), cancelling at (1e8, 1, −1e8 + 0.5).
    let g = sinter::ir::parse("func @main(%a: f32[2], %b: f32[2], %c: f32[2]) {\n  %m: f32[2] = mul(%a, %b)\n  %y: f32[2] = add(%m, %c)\n  return %y\n}\n").unwrap();
    let t = |v: [f64; 2]| {
        Tensor::new(
            DType::F32,
            &[2],
            v.iter().map(|&x| DType::F32.round(x)).collect(),
        )
        .unwrap()
    };
    let inputs = vec![
        ("a".to_string(), t([1.5, 1e8])),
        ("b".to_string(), t([2.0, 1.0])),
        ("c".to_string(), t([0.25, -1e8 + 8.0])),
    ];
    let refs: Vec<&Tensor> = inputs.iter().map(|(_, t)| t).collect();
    let want = sinter::ir::interp::run_entry(&g, &refs, &Bindings::new())
        .unwrap()
        .remove(0);
    let spread = spread(&g, &inputs, std::slice::from_ref(&want), 7, false).unwrap().remove(0);
    assert!(spread[0] < 1e-5 && spread[1] > 1.0, "{spread:?}");
    let off = |d0: f64, d1: f64| {
        Tensor::new(
            DType::F32,
            &[2],
            vec![want.data()[0] + d0, want.data()[1] + d1],
        )
        .unwrap()
    };
    assert!(
        compare("t", &off(0.0, 8.0), &want, Some(&spread)).is_ok(),
        "the cancelling element may be off by its spread"
    );
    assert!(
        compare("t", &off(1e-3, 0.0), &want, Some(&spread)).is_err(),
        "the well-conditioned one may not"
    );
    assert!(
        compare("t", &off(0.0, 8.0), &want, None).is_err(),
        "without a spread, DESIGN.md's rule"
    );
}

#[test]
fn elements_past_f32s_range_are_exempt_and_the_others_are_not() {
    // y = x0·x1 per element (rows of one): the first product leaves f32's range, the second
    // does not.
    let g = sinter::ir::parse(
        "func @main(%a: f32[2, 1], %b: f32[2, 1]) {\n  %y: f32[2, 1] = mul(%a, %b)\n  return %y\n}\n",
    )
    .unwrap();
    let t = |v: [f64; 2]| {
        Tensor::new(
            DType::F32,
            &[2, 1],
            v.iter().map(|&x| DType::F32.round(x)).collect(),
        )
        .unwrap()
    };
    let inputs = vec![
        ("a".to_string(), t([1e30, 3.0])),
        ("b".to_string(), t([1e-29, 2.0])),
    ];
    let refs: Vec<&Tensor> = inputs.iter().map(|(_, t)| t).collect();
    let exact = sinter::ir::interp::run_entry(&g, &refs, &Bindings::new()).unwrap();
    let spread = spread(&g, &inputs, &exact, 1, false).unwrap().remove(0);
    assert!(spread[0].is_infinite() && spread[1] < 1e-4, "{spread:?}");
    let want = t([10.0, 6.0]);
    assert!(compare("t", &t([f64::NAN, 6.0]), &want, Some(&spread)).is_ok());
    assert!(compare("t", &t([10.0, 6.5]), &want, Some(&spread)).is_err());
    assert!(compare("t", &t([f64::NAN, 6.0]), &want, None).is_err());
    assert!(saturated(&[("x".to_string(), t([1e6, 0.0]))]).is_none());
    // A row of two: the one element past the range takes its row with it.
    let g2 = sinter::ir::parse("func @main(%a: f32[1, 2], %b: f32[1, 2]) {\n  %y: f32[1, 2] = mul(%a, %b)\n  return %y\n}\n").unwrap();
    let row: Vec<(String, Tensor)> = inputs.iter().map(|(n, x)| (n.clone(), Tensor::new(DType::F32, &[1, 2], x.data().to_vec()).unwrap())).collect();
    let refs: Vec<&Tensor> = row.iter().map(|(_, t)| t).collect();
    let exact = sinter::ir::interp::run_entry(&g2, &refs, &Bindings::new()).unwrap();
    let wide = self::spread(&g2, &row, &exact, 1, false).unwrap().remove(0);
    assert!(wide.iter().all(|s| s.is_infinite()), "{wide:?}");
    assert!(dropped(&[("mask".to_string(), t([1e30, 0.0]))]).is_none());
    let inf = Tensor::new(DType::F32, &[1], vec![f64::INFINITY]).unwrap();
    let nan = Tensor::new(DType::F32, &[1], vec![f64::NAN]).unwrap();
    assert!(compare("t", &nan, &inf, None).is_ok() && compare("t", &inf, &nan, None).is_err());
}
