//! The lowering cache: a graph's [`KernelGraph`] kept on disk, so that a warm start does not
//! run the e-graph passes again.
//!
//! An entry is keyed by the graph's canonical text (`sinter_ir::text::print`), the lowering
//! (fused or not) with its pass options, the target, sinter's version and a fingerprint of
//! the passes' and the IR's sources (`build.rs`): any change to what the passes would see or
//! do is another entry. It lives in `$SINTER_CACHE/lowerings`, beside the kernel cache's
//! `kernels`, in the kernel cache's entry format (length, checksum, atomic writes): a damaged
//! entry is treated as missing, the graph lowered again and the entry rewritten.
//!
//! The value is the kernel graph in the text form below, with the kernels per decoder layer
//! of the fusion report. An entry is written only when its text reads back as the same
//! kernel graph, so a hit is exactly what the passes would return.
//!
//! ```text
//! sinter-kernel-graph v1
//! per_layer 7                          (or `per_layer -`)
//! buffer Input 256; bf16[T, 576]; 576, 1; =tokens     (role; align; type; strides; name or -)
//! inputs 0 3
//! outputs 9
//! kernel RowReduction; 0 1; 2          (family; input buffers; output buffers)
//! func @... { ... }                    (the body, as `print_function` prints it)
//! ```

use std::path::PathBuf;

use rayon::prelude::*;
use sinter_ir::kernel::plan_text::parse_dim;
use sinter_ir::{Buffer, BufferData, BufferRole, DType, Family, Graph, KernelData, KernelGraph, Layout, Target, TensorType};
use sinter_runtime::{CacheKey, KernelCache};

use super::Lowering;
use crate::Error;

const MAGIC: &str = "sinter-kernel-graph v1";

/// The folder of the lowering cache: `lowerings` beside the kernel cache's folder.
///
/// # Errors
/// As [`KernelCache::default_dir`].
pub fn default_dir() -> Result<PathBuf, Error> {
    let kernels = KernelCache::default_dir()?;
    Ok(kernels.with_file_name("lowerings"))
}

/// The key of `graph` lowered by `lowering` with `options` (their `Debug` text) for `target`.
fn key(graph: &Graph, lowering: Lowering, options: &str, target: &Target) -> CacheKey {
    let how = format!("lowering {lowering:?} passes {} options {options}", env!("SINTER_PASSES_FINGERPRINT"));
    CacheKey::new(&sinter_ir::text::print(graph), &how, target.name(), "-", "-")
}

/// `graph` lowered for `target` under `options`, from `cache` when it holds the lowering, else
/// by `lower` (whose result is then stored); with the kernels per layer, and whether it was a
/// hit.
/// A cache that cannot be written costs the next start its lowering, nothing else.
///
/// # Errors
/// `lower`'s.
pub(crate) fn lower_cached(
    graph: &Graph,
    lowering: Lowering,
    target: &Target,
    cache: Option<&KernelCache>,
    options: &sinter_passes::PassOptions,
    lower: impl FnOnce() -> Result<(KernelGraph, Option<usize>), Error>,
) -> Result<(KernelGraph, Option<usize>, bool), Error> {
    let options = match lowering {
        Lowering::Unfused => String::new(),
        Lowering::Fused => format!("{options:?}"),
    };
    let Some(cache) = cache else {
        let (kg, per_layer) = lower()?;
        return Ok((kg, per_layer, false));
    };
    let key = key(graph, lowering, &options, target);
    if let Ok(Some(text)) = cache.get_record(&key) {
        if let Ok((kg, per_layer)) = parse(&text) {
            return Ok((kg, per_layer, true));
        }
    }
    let (kg, per_layer) = lower()?;
    let text = print(&kg, per_layer);
    if parse(&text).is_ok_and(|(back, n)| back == kg && n == per_layer) {
        let _ = cache.put_record(&key, &text);
    }
    Ok((kg, per_layer, false))
}

/// The text form of `kg` with the kernels per layer (module docs). A buffer name holding a
/// line break does not read back (and such a graph is not cached).
pub fn print(kg: &KernelGraph, per_layer: Option<usize>) -> String {
    let mut s = format!("{MAGIC}\nper_layer {}\n", per_layer.map_or("-".to_string(), |n| n.to_string()));
    for bd in kg.buffers.values() {
        let strides: Vec<String> = bd.layout.strides.iter().map(ToString::to_string).collect();
        let name = bd.name.as_ref().map_or("-".to_string(), |n| format!("={n}"));
        s.push_str(&format!("buffer {:?} {}; {}; {}; {name}\n", bd.role, bd.layout.align, bd.ty, strides.join(", ")));
    }
    let ids = |bs: &[Buffer]| bs.iter().map(|b| b.as_u32().to_string()).collect::<Vec<_>>().join(" ");
    s.push_str(&format!("inputs {}\noutputs {}\n", ids(&kg.inputs), ids(&kg.outputs)));
    for kd in kg.kernels.values() {
        s.push_str(&format!("kernel {:?}; {}; {}\n", kd.family, ids(&kd.inputs), ids(&kd.outputs)));
        s.push_str(&sinter_ir::text::print_function(&kd.body));
    }
    s
}

/// Reads [`print`]'s text back.
///
/// # Errors
/// A message naming the line that does not read.
pub fn parse(text: &str) -> Result<(KernelGraph, Option<usize>), String> {
    let mut lines = text.lines().enumerate().peekable();
    let mut next = |what: &str| lines.next().map(|(i, l)| (i + 1, l)).ok_or_else(|| format!("ends before {what}"));
    if next("the header")?.1 != MAGIC {
        return Err(format!("not a `{MAGIC}` text"));
    }
    let (n, l) = next("per_layer")?;
    let per_layer = match l.strip_prefix("per_layer ").ok_or(format!("line {n}: no per_layer"))? {
        "-" => None,
        v => Some(v.parse().map_err(|_| format!("line {n}: per_layer {v}"))?),
    };
    let mut kg = KernelGraph::default();
    let mut body = String::new();
    let mut kernel: Option<(Family, Vec<Buffer>, Vec<Buffer>)> = None;
    // Each kernel's header and body text, with the line its body ends on; the bodies are
    // parsed afterwards on every core (most of a warm start's lowering time).
    let mut bodies: Vec<(Family, Vec<Buffer>, Vec<Buffer>, String, usize)> = Vec::new();
    let ids = |s: &str, n: usize| -> Result<Vec<Buffer>, String> {
        s.split_whitespace().map(|t| t.parse::<u32>().map(Buffer::from_u32).map_err(|_| format!("line {n}: buffer id {t}"))).collect()
    };
    while let Ok((n, l)) = next("the end") {
        if let Some(rest) = l.strip_prefix("buffer ") {
            kg.buffers.push(parse_buffer(rest).map_err(|e| format!("line {n}: {e}"))?);
        } else if let Some(rest) = l.strip_prefix("inputs") {
            kg.inputs = ids(rest, n)?;
        } else if let Some(rest) = l.strip_prefix("outputs") {
            kg.outputs = ids(rest, n)?;
        } else if let Some(rest) = l.strip_prefix("kernel ") {
            let parts: Vec<&str> = rest.split(';').collect();
            let [fam, ins, outs] = parts[..] else { return Err(format!("line {n}: a kernel line has three fields")) };
            kernel = Some((family(fam.trim()).ok_or(format!("line {n}: family {fam}"))?, ids(ins, n)?, ids(outs, n)?));
            body.clear();
        } else {
            body.push_str(l);
            body.push('\n');
            if l == "}" {
                let (family, inputs, outputs) = kernel.take().ok_or(format!("line {n}: a body without a kernel line"))?;
                bodies.push((family, inputs, outputs, std::mem::take(&mut body), n));
            }
        }
    }
    let parsed: Vec<Result<KernelData, String>> = bodies
        .into_par_iter()
        .map(|(family, inputs, outputs, text, n)| {
            let g = sinter_ir::text::parse(&text).map_err(|e| format!("line {n}: body: {e}"))?;
            let f = g.funcs.values().next().cloned().ok_or(format!("line {n}: an empty body"))?;
            Ok(KernelData { family, body: f, inputs, outputs })
        })
        .collect();
    for k in parsed {
        kg.kernels.push(k?);
    }
    if kernel.is_some() {
        return Err("the last kernel's body is cut short".into());
    }
    let nb = kg.buffers.len();
    let bad = kg.inputs.iter().chain(&kg.outputs).chain(kg.kernels.values().flat_map(|k| k.inputs.iter().chain(&k.outputs))).find(|b| b.as_u32() as usize >= nb);
    if let Some(b) = bad {
        return Err(format!("buffer {b} of {nb}"));
    }
    Ok((kg, per_layer))
}

/// One `buffer` line after its keyword.
fn parse_buffer(rest: &str) -> Result<BufferData, String> {
    let (head, rest) = rest.split_once("; ").ok_or("no type")?;
    let (ty, rest) = rest.split_once("; ").ok_or("no strides")?;
    let (strides, name) = rest.split_once("; ").ok_or("no name")?;
    let (role, align) = head.split_once(' ').ok_or("no alignment")?;
    let role = match role {
        "Input" => BufferRole::Input,
        "Output" => BufferRole::Output,
        "Temp" => BufferRole::Temp,
        r => return Err(format!("role {r}")),
    };
    let align = align.parse().map_err(|_| format!("alignment {align}"))?;
    let dims = |s: &str| -> Result<Vec<_>, String> { s.split(',').map(str::trim).filter(|d| !d.is_empty()).map(parse_dim).collect() };
    let (dtype, shape) = ty.strip_suffix(']').and_then(|t| t.split_once('[')).ok_or(format!("type {ty}"))?;
    let dtype = DType::from_name(dtype).ok_or(format!("dtype {dtype}"))?;
    let name = match name {
        "-" => None,
        n => Some(n.strip_prefix('=').ok_or(format!("name {n}"))?.to_string()),
    };
    Ok(BufferData { name, ty: TensorType::new(dtype, dims(shape)?), role, layout: Layout { strides: dims(strides)?, align } })
}

/// A family by its `Debug` name.
fn family(name: &str) -> Option<Family> {
    [
        Family::Pointwise,
        Family::RowReduction,
        Family::Matmul,
        Family::Attention,
        Family::PagedAttention,
        Family::AttentionMerge,
        Family::KvAppend,
        Family::Gather,
        Family::Layout,
    ]
    .into_iter()
    .find(|f| format!("{f:?}") == name)
}
