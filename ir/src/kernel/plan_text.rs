//! A plain-text form of a [`LaunchPlan`], used by the runtime's kernel cache on disk.
//!
//! ```text
//! entry k0_pointwise
//! target sm_90a
//! grid N*T / 256
//! grid 1 / 1
//! grid 1 / 1
//! block 256 1 1
//! shared 0
//! param buffer 0
//! param size N*T
//! ptx 1234
//! <exactly 1234 bytes of PTX text>
//! ```
//!
//! Dimensions are written in [`Dim`]'s canonical `Display` form and read back by a small
//! parser here (sums and differences of products of integers and `symbol^power`), so
//! `parse_plan(&print_plan(p)) == p` for every plan.

use crate::{DType, Dim, GridDim, KernelParam, LaunchPlan, Target, TensorMap};

/// Writes `plan` in the text form above.
pub fn print_plan(plan: &LaunchPlan) -> String {
    let mut s = String::new();
    s.push_str(&format!("entry {}\n", plan.entry));
    s.push_str(&format!("target {}\n", plan.target));
    for g in &plan.grid {
        s.push_str(&format!("grid {} / {}\n", g.numerator, g.denominator));
    }
    s.push_str(&format!("block {} {} {}\n", plan.block[0], plan.block[1], plan.block[2]));
    s.push_str(&format!("shared {}\n", plan.shared_bytes));
    for p in &plan.params {
        match p {
            KernelParam::Buffer(i) => s.push_str(&format!("param buffer {i}\n")),
            KernelParam::Size(d) => s.push_str(&format!("param size {d}\n")),
            KernelParam::TensorMap(t) => {
                let list = |v: &[Dim]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                let boxes = t.box_dims.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
                s.push_str(&format!(
                    "param tmap {} {} {} {boxes} | {} | {} | {}\n",
                    t.buffer,
                    t.dtype.name(),
                    t.swizzle,
                    t.offset,
                    list(&t.dims),
                    list(&t.strides)
                ));
            }
        }
    }
    s.push_str(&format!("ptx {}\n", plan.ptx.len()));
    s.push_str(&plan.ptx);
    s
}

/// Reads a plan written by [`print_plan`].
///
/// # Errors
/// A message naming the first line that does not fit the format (also for a PTX section
/// shorter or longer than its declared length).
pub fn parse_plan(text: &str) -> Result<LaunchPlan, String> {
    let mut rest = text;
    let mut line_no = 0usize;
    let mut next_line = |rest: &mut &str| -> Result<(usize, String), String> {
        line_no += 1;
        match rest.find('\n') {
            Some(i) => {
                let line = rest[..i].to_string();
                *rest = &rest[i + 1..];
                Ok((line_no, line))
            }
            None => Err(format!("line {line_no}: unexpected end of text")),
        }
    };
    let field = |(n, line): (usize, String), key: &str| -> Result<String, String> {
        line.strip_prefix(key)
            .and_then(|r| r.strip_prefix(' '))
            .map(str::to_owned)
            .ok_or_else(|| format!("line {n}: expected `{key} …`, found `{}`", truncate(&line)))
    };
    let entry = field(next_line(&mut rest)?, "entry")?;
    let (n, line) = next_line(&mut rest)?;
    let target = Target::parse(&field((n, line), "target")?).map_err(|e| format!("line {n}: {e}"))?;
    let mut grid = Vec::with_capacity(3);
    for _ in 0..3 {
        let (n, line) = next_line(&mut rest)?;
        let g = field((n, line), "grid")?;
        let (num, den) = g.rsplit_once(" / ").ok_or_else(|| format!("line {n}: expected `grid <dim> / <n>`"))?;
        let numerator = parse_dim(num).map_err(|e| format!("line {n}: {e}"))?;
        let denominator = den.parse::<u32>().map_err(|e| format!("line {n}: denominator `{den}`: {e}"))?;
        grid.push(GridDim { numerator, denominator });
    }
    let (n, line) = next_line(&mut rest)?;
    let b = field((n, line), "block")?;
    let block: Vec<u32> = b.split(' ').map(str::parse::<u32>).collect::<Result<_, _>>().map_err(|e| format!("line {n}: block: {e}"))?;
    let block: [u32; 3] = block.try_into().map_err(|_| format!("line {n}: block needs three numbers"))?;
    let (n, line) = next_line(&mut rest)?;
    let shared_bytes = field((n, line), "shared")?.parse::<u32>().map_err(|e| format!("line {n}: shared: {e}"))?;
    let mut params = Vec::new();
    let ptx_len = loop {
        let (n, line) = next_line(&mut rest)?;
        if let Some(p) = line.strip_prefix("param buffer ") {
            params.push(KernelParam::Buffer(p.parse::<usize>().map_err(|e| format!("line {n}: buffer index: {e}"))?));
        } else if let Some(p) = line.strip_prefix("param size ") {
            params.push(KernelParam::Size(parse_dim(p).map_err(|e| format!("line {n}: {e}"))?));
        } else if let Some(p) = line.strip_prefix("param tmap ") {
            params.push(KernelParam::TensorMap(parse_tensor_map(p).map_err(|e| format!("line {n}: tensor map: {e}"))?));
        } else if let Some(p) = line.strip_prefix("ptx ") {
            break p.parse::<usize>().map_err(|e| format!("line {n}: ptx length: {e}"))?;
        } else {
            return Err(format!("line {n}: expected `param …` or `ptx <bytes>`, found `{}`", truncate(&line)));
        }
    };
    if rest.len() != ptx_len {
        return Err(format!("the PTX section has {} bytes, its header says {ptx_len}", rest.len()));
    }
    let grid: [GridDim; 3] = grid.try_into().map_err(|_| "three grid lines expected".to_string())?;
    Ok(LaunchPlan { entry, ptx: rest.to_string(), target, grid, block, shared_bytes, params })
}

fn truncate(s: &str) -> String {
    s.chars().take(60).collect()
}

/// Reads a tensor map as [`print_plan`] writes it: `buffer dtype swizzle box,… | offset |
/// dim; … | stride; …`.
fn parse_tensor_map(text: &str) -> Result<TensorMap, String> {
    let parts: Vec<&str> = text.split(" | ").collect();
    let [head, offset, dims, strides] = parts.as_slice() else {
        return Err(format!("expected four `|`-separated fields, found {}", parts.len()));
    };
    let head: Vec<&str> = head.split(' ').collect();
    let [buffer, dtype, swizzle, boxes] = head.as_slice() else {
        return Err("expected `buffer dtype swizzle box`".into());
    };
    let list = |t: &str| -> Result<Vec<Dim>, String> {
        if t.trim().is_empty() {
            return Ok(Vec::new());
        }
        t.split(';').map(parse_dim).collect()
    };
    Ok(TensorMap {
        buffer: buffer.parse().map_err(|e| format!("buffer `{buffer}`: {e}"))?,
        dtype: DType::from_name(dtype).ok_or_else(|| format!("unknown dtype `{dtype}`"))?,
        swizzle: swizzle.parse().map_err(|e| format!("swizzle `{swizzle}`: {e}"))?,
        box_dims: boxes.split(',').map(|b| b.parse::<u32>().map_err(|e| format!("box `{b}`: {e}"))).collect::<Result<_, _>>()?,
        offset: parse_dim(offset)?,
        dims: list(dims)?,
        strides: list(strides)?,
    })
}

/// Parses a dimension in [`Dim`]'s printed form: `term (('+'|'-') term)*`, a term being
/// `['-'] factor ('*' factor)*` and a factor an integer or `symbol['^' power]`.
///
/// # Errors
/// A message naming what was expected where.
pub fn parse_dim(text: &str) -> Result<Dim, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty dimension".into());
    }
    let bytes = s.as_bytes();
    let mut i = 0usize;
    let mut total = Dim::constant(0);
    let mut sign = 1i64;
    if bytes[0] == b'-' {
        sign = -1;
        i = 1;
    }
    loop {
        // term
        let mut term = Dim::constant(sign);
        loop {
            let start = i;
            if i < bytes.len() && bytes[i].is_ascii_digit() {
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                let v: i64 = s[start..i].parse().map_err(|e| format!("integer `{}` in `{s}`: {e}", &s[start..i]))?;
                term = term.mul(&Dim::constant(v));
            } else if i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_') {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let sym = Dim::symbol(&s[start..i]);
                let mut power = 1u32;
                if i < bytes.len() && bytes[i] == b'^' {
                    i += 1;
                    let ps = i;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                    power = s[ps..i].parse().map_err(|_| format!("a power after `^` at byte {ps} of `{s}`"))?;
                    if power == 0 || power > 64 {
                        return Err(format!("power {power} out of range in `{s}`"));
                    }
                }
                for _ in 0..power {
                    term = term.mul(&sym);
                }
            } else {
                return Err(format!("an integer or a symbol at byte {i} of `{s}`"));
            }
            if i < bytes.len() && bytes[i] == b'*' {
                i += 1;
            } else {
                break;
            }
        }
        total = total.add(&term);
        if i == bytes.len() {
            return Ok(total);
        }
        sign = match bytes[i] {
            b'+' => 1,
            b'-' => -1,
            _ => return Err(format!("`+`, `-` or `*` at byte {i} of `{s}`")),
        };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> Vec<Dim> {
        let h = Dim::symbol("H");
        let t = Dim::symbol("T");
        let past = Dim::symbol("past_len");
        vec![
            Dim::constant(0),
            Dim::constant(7),
            Dim::constant(-3),
            h.clone(),
            h.mul(&Dim::constant(64)),
            h.mul(&t).mul(&t).add(&Dim::constant(5)),
            past.add(&t).sub(&Dim::constant(1)),
            Dim::constant(2).sub(&h.mul(&Dim::constant(3))),
            t.scale(-1),
        ]
    }

    #[test]
    fn dims_round_trip_through_their_printed_form() {
        for d in dims() {
            let text = d.to_string();
            assert_eq!(parse_dim(&text).unwrap(), d, "{text}");
        }
        for bad in ["", "H+", "*H", "H^", "2**3", "H T", "H^0", "(H)"] {
            assert!(parse_dim(bad).is_err(), "`{bad}` should not parse");
        }
    }

    #[test]
    fn plans_round_trip_through_text() {
        let ds = dims();
        let plan = LaunchPlan {
            entry: "k3_row_reduction".into(),
            ptx: ".version 8.5\n.target sm_90a\n// no trailing newline, odd bytes: é".into(),
            target: Target::SM_90A,
            grid: [GridDim { numerator: ds[5].clone(), denominator: 128 }, GridDim::fixed(4), GridDim { numerator: ds[6].clone(), denominator: 1 }],
            block: [128, 2, 1],
            shared_bytes: 99 * 1024,
            params: vec![
                KernelParam::Buffer(0),
                KernelParam::Size(ds[4].clone()),
                KernelParam::Buffer(2),
                KernelParam::TensorMap(TensorMap {
                    buffer: 1,
                    dtype: DType::BF16,
                    offset: ds[6].clone(),
                    dims: vec![ds[3].clone(), ds[5].clone(), Dim::constant(8)],
                    strides: vec![ds[4].clone(), ds[5].clone()],
                    box_dims: vec![64, 256, 1],
                    swizzle: 128,
                }),
                KernelParam::Size(ds[2].clone()),
            ],
        };
        let text = print_plan(&plan);
        assert_eq!(parse_plan(&text).unwrap(), plan);
        // The target is written by name, as the kernel cache has always stored it.
        assert!(text.starts_with("entry k3_row_reduction\ntarget sm_90a\n"), "{text}");
        let unknown = parse_plan(&text.replace("target sm_90a", "target sm_75")).unwrap_err();
        assert!(unknown.starts_with("line 2: unknown GPU target `sm_75`"), "{unknown}");
        // Truncating the text anywhere is an error, never a panic or a wrong plan.
        for cut in 0..text.len() {
            if text.is_char_boundary(cut) {
                assert!(parse_plan(&text[..cut]).is_err(), "cut at {cut} parsed");
            }
        }
    }
}
