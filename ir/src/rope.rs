//! `rope`'s frequencies: the partial rotary dim and the scaled inverse frequencies of Hugging
//! Face's `rope_scaling` (`linear`, `llama3`, `yarn`), computed once here in f64 for the
//! verifier, the interpreter and the code generator (which bakes them into a table).
//!
//! The formulas are those of transformers' `src/transformers/modeling_rope_utils.py`
//! (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
//! `_compute_llama3_parameters`, `_compute_yarn_parameters`), evaluated in f64 where HF
//! evaluates in f32; the `rope` row of the op table states them.

use std::f64::consts::PI;

use crate::attr::Attrs;

/// How the inverse frequencies of a `rope` are scaled (its `scaling` attribute).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// θ^(−2i/R).
    None,
    /// Position interpolation: θ^(−2i/R) / factor.
    Linear {
        /// The context extension factor.
        factor: f64,
    },
    /// Llama 3.1's wavelength-banded interpolation.
    Llama3 {
        /// Low-frequency factor (divides the long wavelengths).
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// The pre-training context length L.
        original_max_position_embeddings: f64,
    },
    /// YaRN (Peng et al. 2023): a ramp between interpolation and extrapolation, and an
    /// attention factor on the rotated features.
    Yarn {
        /// The context extension factor.
        factor: f64,
        /// The pre-training context length L.
        original_max_position_embeddings: f64,
        /// Rotations where extrapolation ends (default 32).
        beta_fast: f64,
        /// Rotations where interpolation begins (default 1).
        beta_slow: f64,
        /// Whether the correction range is rounded outwards to whole dims (default true).
        truncate: bool,
        /// The factor the rotated features are multiplied by.
        attention_factor: f64,
    },
}

/// A `rope`'s rotation: how many features rotate, at which inverse frequencies, scaled by what.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeFreqs {
    /// R: the first R features of the last axis rotate; the rest pass through.
    pub rotary_dim: usize,
    /// inv_freq[i] for pair i < R/2 (radians per position).
    pub inv_freq: Vec<f64>,
    /// Multiplies the cosine and sine (1 except for YaRN).
    pub attention_factor: f64,
}

const PARAMS: [&str; 10] = [
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "truncate",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
];

/// Which of [`PARAMS`] a scaling requires and which it accepts.
fn params_of(scaling: &str) -> (&'static [&'static str], &'static [&'static str]) {
    match scaling {
        "linear" => (&["factor"], &[]),
        "llama3" => (
            &[
                "factor",
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            ],
            &[],
        ),
        "yarn" => (
            &["factor", "original_max_position_embeddings"],
            &[
                "beta_fast",
                "beta_slow",
                "truncate",
                "mscale",
                "mscale_all_dim",
                "attention_factor",
            ],
        ),
        _ => (&[], &[]),
    }
}

fn finite(op: &dyn Attrs, name: &str, positive: bool) -> Result<Option<f64>, String> {
    let Some(v) = op.float(name) else {
        return Ok(None);
    };
    if !v.is_finite() {
        return Err(format!(
            "attribute `{name}` must be a finite number, got {v:?}"
        ));
    }
    if positive && v <= 0.0 {
        return Err(format!("attribute `{name}` must be above 0, got {v:?}"));
    }
    Ok(Some(v))
}

/// The `scaling` of a `rope`'s attributes, checked: the scaling's parameters present, in
/// range, and no parameter of another scaling.
///
/// # Errors
/// A sentence naming the attribute and the rule.
pub fn scaling(op: &dyn Attrs) -> Result<RopeScaling, String> {
    let name = op.str("scaling").unwrap_or("none");
    let (required, optional) = params_of(name);
    for p in PARAMS {
        let given = op
            .attr(p)
            .is_some_and(|a| !matches!(a, crate::attr::Attr::Absent));
        if given && !required.contains(&p) && !optional.contains(&p) {
            let owners: Vec<&str> = ["linear", "llama3", "yarn"]
                .into_iter()
                .filter(|s| params_of(s).0.contains(&p) || params_of(s).1.contains(&p))
                .collect();
            return Err(format!(
                "attribute `{p}` belongs to scaling={}, not scaling={name:?}",
                owners
                    .iter()
                    .map(|o| format!("{o:?}"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ));
        }
        if !given && required.contains(&p) {
            return Err(format!("scaling={name:?} needs attribute `{p}`"));
        }
    }
    let req = |p: &str| -> Result<f64, String> {
        finite(op, p, true)?.ok_or_else(|| format!("scaling={name:?} needs attribute `{p}`"))
    };
    let orig = || -> Result<f64, String> {
        match op.int("original_max_position_embeddings") {
            Some(l) if l > 0 => Ok(l as f64),
            other => Err(format!("attribute `original_max_position_embeddings` must be a positive integer, got {other:?}")),
        }
    };
    Ok(match name {
        "linear" => RopeScaling::Linear {
            factor: req("factor")?,
        },
        "llama3" => {
            let (low, high) = (req("low_freq_factor")?, req("high_freq_factor")?);
            if high <= low {
                return Err(format!("scaling=\"llama3\" needs high_freq_factor above low_freq_factor, got {high:?} and {low:?}"));
            }
            RopeScaling::Llama3 {
                factor: req("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: orig()?,
            }
        }
        "yarn" => {
            let factor = req("factor")?;
            let m = |s: f64, k: f64| {
                if s <= 1.0 {
                    1.0
                } else {
                    0.1 * k * s.ln() + 1.0
                }
            };
            let (ms, msa) = (
                finite(op, "mscale", false)?,
                finite(op, "mscale_all_dim", false)?,
            );
            // HF: `if mscale and mscale_all_dim` (both given and non-zero).
            let attention_factor = match (finite(op, "attention_factor", true)?, ms, msa) {
                (Some(a), _, _) => a,
                (None, Some(a), Some(b)) if a != 0.0 && b != 0.0 => m(factor, a) / m(factor, b),
                _ => m(factor, 1.0),
            };
            if !attention_factor.is_finite() || attention_factor <= 0.0 {
                return Err(format!("the YaRN attention factor from mscale and mscale_all_dim must be a finite number above 0, got {attention_factor:?}"));
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: orig()?,
                beta_fast: finite(op, "beta_fast", true)?.unwrap_or(32.0),
                beta_slow: finite(op, "beta_slow", true)?.unwrap_or(1.0),
                truncate: op.bool("truncate").unwrap_or(true),
                attention_factor,
            }
        }
        _ => RopeScaling::None,
    })
}

/// The rotary dim R of a `rope` over a last axis of `d` features: `rotary_dim` if given, else
/// `d`.
///
/// # Errors
/// When R is odd, below 2 or above `d`.
pub fn rotary_dim(op: &dyn Attrs, d: Option<i64>) -> Result<Option<i64>, String> {
    match (op.int("rotary_dim"), d) {
        (Some(r), _) if r < 2 || r % 2 != 0 => Err(format!(
            "attribute `rotary_dim` must be even and at least 2, got {r}"
        )),
        (Some(r), Some(d)) if r > d => Err(format!(
            "attribute `rotary_dim` ({r}) exceeds the rotary axis ({d})"
        )),
        (Some(r), _) => Ok(Some(r)),
        (None, d) => Ok(d),
    }
}

/// A `rope`'s rotation over a last axis of `d` features (even), from its attributes.
///
/// # Errors
/// As [`scaling`] and [`rotary_dim`]; `theta` missing or not above 0.
pub fn freqs(op: &dyn Attrs, d: usize) -> Result<RopeFreqs, String> {
    let theta = op.float("theta").ok_or("`rope` needs attribute `theta`")?;
    if !(theta.is_finite() && theta > 0.0) {
        return Err(format!(
            "attribute `theta` must be a finite number above 0, got {theta:?}"
        ));
    }
    let r = rotary_dim(op, i64::try_from(d).ok())?.unwrap_or(0) as usize;
    let half = r / 2;
    // θ^(−2i/R), as the unscaled rope has always computed it.
    let base: Vec<f64> = (0..half)
        .map(|i| theta.powf(-((2 * i) as f64) / r as f64))
        .collect();
    let (inv_freq, attention_factor) = match scaling(op)? {
        RopeScaling::None => (base, 1.0),
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: l,
        } => {
            let (low_wl, high_wl) = (l / low, l / high);
            let f = base
                .iter()
                .map(|&inv| {
                    let wl = 2.0 * PI / inv;
                    if wl > low_wl {
                        inv / factor
                    } else if wl < high_wl {
                        inv
                    } else {
                        let s = (l / wl - low) / (high - low);
                        (1.0 - s) * inv / factor + s * inv
                    }
                })
                .collect();
            (f, 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: l,
            beta_fast,
            beta_slow,
            truncate,
            attention_factor,
        } => {
            if theta == 1.0 {
                return Err(
                    "scaling=\"yarn\" needs theta ≠ 1 (its correction range divides by ln θ)"
                        .into(),
                );
            }
            let rf = r as f64;
            let corr = |rot: f64| rf * (l / (rot * 2.0 * PI)).ln() / (2.0 * theta.ln());
            let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(rf - 1.0));
            if low == high {
                high += 0.001;
            }
            let f = base
                .iter()
                .enumerate()
                .map(|(i, &inv)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    (inv / factor) * (1.0 - extrapolation) + inv * extrapolation
                })
                .collect();
            (f, attention_factor)
        }
    };
    Ok(RopeFreqs {
        rotary_dim: r,
        inv_freq,
        attention_factor,
    })
}
