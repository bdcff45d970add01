//! Choosing the next token from a row of logits: greedy (argmax) or seeded temperature and
//! nucleus sampling. The engine uses these for every architecture; they are public so that a
//! caller running its own loop picks tokens the same way.

use rand::{Rng, SeedableRng};

use crate::Error;

/// How to pick each next token.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOptions {
    /// Tokens to generate at most per sequence (generation also stops at EOS).
    pub max_new: usize,
    /// 0 for greedy (argmax, ties to the lowest id); otherwise logits are divided by it.
    pub temperature: f64,
    /// Nucleus sampling (Holtzman et al. 2020): sample from the smallest set of tokens whose
    /// probability reaches `top_p`; 1.0 keeps all.
    pub top_p: f64,
    /// Seed of the sampler's RNG (ChaCha), so sampled runs repeat.
    pub seed: u64,
    /// Stop a sequence at EOS (true), or always generate `max_new` tokens (benchmarks).
    pub stop_at_eos: bool,
}

impl SampleOptions {
    /// Greedy decoding of up to `max_new` tokens.
    pub fn greedy(max_new: usize) -> SampleOptions {
        SampleOptions { max_new, temperature: 0.0, top_p: 1.0, seed: 0, stop_at_eos: true }
    }

    /// Seeded sampling of up to `max_new` tokens at `temperature` (> 0) from the nucleus
    /// `top_p` (in (0, 1]).
    pub fn seeded(max_new: usize, temperature: f64, top_p: f64, seed: u64) -> SampleOptions {
        SampleOptions { max_new, temperature, top_p, seed, stop_at_eos: true }
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a temperature that is not a finite number ≥ 0 or a `top_p`
    /// outside (0, 1].
    pub fn validate(&self) -> Result<(), Error> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::Unsupported(format!("the sampling temperature must be a finite number ≥ 0 (0 = greedy), got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Unsupported(format!("top_p must be in (0, 1], got {}", self.top_p)));
        }
        Ok(())
    }
}

/// The greedy token of a row of logits: the lowest id of the largest value; NaNs never win
/// (an all-NaN or empty row gives 0).
pub fn argmax(row: &[f64]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in row.iter().enumerate() {
        // NaN never wins; ties keep the lowest id.
        if x > row[best] || row[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Picks tokens as [`SampleOptions`] say, with its own seeded RNG: the same options and the
/// same rows give the same tokens.
///
/// ```
/// use sinter::llm::{SampleOptions, Sampler};
/// let mut greedy = Sampler::new(&SampleOptions::greedy(1));
/// assert_eq!(greedy.sample(&[0.5, 2.0, 2.0, -1.0]), 1);
/// let o = SampleOptions::seeded(1, 0.8, 0.9, 7);
/// let (mut a, mut b) = (Sampler::new(&o), Sampler::new(&o));
/// assert_eq!(a.sample(&[1.0, 1.1, 0.9]), b.sample(&[1.0, 1.1, 0.9]));
/// ```
pub struct Sampler {
    temperature: f64,
    top_p: f64,
    rng: rand::rngs::StdRng,
}

impl Sampler {
    /// A sampler for `o` (its `temperature`, `top_p` and `seed`); a temperature ≤ 0 is greedy.
    pub fn new(o: &SampleOptions) -> Sampler {
        Sampler { temperature: o.temperature, top_p: o.top_p, rng: rand::rngs::StdRng::seed_from_u64(o.seed) }
    }

    /// [`Sampler::sample`], refusing a row that has no finite logit.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when every logit of `row` is NaN or ±inf: the model's
    /// activations overflowed (as Gemma's do in f16), and no token is better than another.
    pub fn pick(&mut self, row: &[f64]) -> Result<u32, Error> {
        check_row(row)?;
        Ok(self.sample(row))
    }

    /// The next token from `row` (one logit per vocabulary id): [`argmax`] when greedy, else a
    /// draw from `softmax(row / temperature)` restricted to the nucleus `top_p` (NaN logits
    /// get probability 0; ties in probability order by id).
    pub fn sample(&mut self, row: &[f64]) -> u32 {
        if self.temperature <= 0.0 || row.is_empty() {
            return argmax(row);
        }
        let max = row.iter().copied().filter(|x| !x.is_nan()).fold(f64::NEG_INFINITY, f64::max);
        let mut probs: Vec<(usize, f64)> = row.iter().enumerate().map(|(i, &x)| (i, if x.is_nan() { 0.0 } else { ((x - max) / self.temperature).exp() })).collect();
        let sum: f64 = probs.iter().map(|p| p.1).sum();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut kept = 0.0;
        let mut cut = probs.len();
        for (i, p) in probs.iter().enumerate() {
            kept += p.1 / sum;
            if kept >= self.top_p {
                cut = i + 1;
                break;
            }
        }
        let total: f64 = probs[..cut].iter().map(|p| p.1).sum();
        let mut r = self.rng.random::<f64>() * total;
        for p in &probs[..cut] {
            r -= p.1;
            if r <= 0.0 {
                return p.0 as u32;
            }
        }
        probs[0].0 as u32
    }
}

/// An error for a row of logits with no finite value (see [`Sampler::pick`]).
pub(crate) fn check_row(row: &[f64]) -> Result<(), Error> {
    if row.is_empty() || row.iter().any(|x| x.is_finite()) {
        return Ok(());
    }
    let nan = row.iter().filter(|x| x.is_nan()).count();
    Err(Error::Unsupported(format!(
        "the model's logits are not finite at any of the {} vocabulary ids ({nan} NaN, {} infinite): its activations overflowed (in f16 many models do; run it in bf16 or f32)",
        row.len(),
        row.len() - nan
    )))
}

/// Token ids from a graph's `next` output (i32 values as f64s): `next[s]` is sequence `s`'s
/// greedy token, or `vocab` for a row holding a NaN, whose token is then `argmax(row(s))` (the
/// row's logits, read only then).
pub(crate) fn greedy_tokens(next: &[f64], vocab: usize, row: &mut dyn FnMut(usize) -> Result<Vec<f64>, Error>) -> Result<Vec<u32>, Error> {
    next.iter()
        .enumerate()
        .map(|(s, &t)| {
            if t == vocab as f64 {
                let row = row(s)?;
                check_row(&row)?;
                Ok(argmax(&row))
            } else if t >= 0.0 && t < vocab as f64 && t.fract() == 0.0 {
                Ok(t as u32)
            } else {
                Err(Error::Unsupported(format!("the decode graph's greedy token {t} is not an id of the {vocab}-token vocabulary")))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_without_a_finite_logit_is_an_error_not_token_zero() {
        let mut s = Sampler::new(&SampleOptions::greedy(1));
        for row in [vec![f64::NAN; 4], vec![f64::INFINITY, f64::NAN, f64::NEG_INFINITY, f64::NAN]] {
            let e = s.pick(&row).unwrap_err().to_string();
            assert!(e.contains("not finite at any of the 4 vocabulary ids") && e.contains("bf16"), "{e}");
        }
        assert_eq!(s.pick(&[f64::NAN, 1.0, f64::INFINITY, 0.0]).unwrap(), 2);
        assert_eq!(s.pick(&[f64::NAN, 1.0, 2.0]).unwrap(), 2);
        let e = greedy_tokens(&[4.0], 4, &mut |_| Ok(vec![f64::NAN; 4])).unwrap_err().to_string();
        assert!(e.contains("not finite"), "{e}");
    }

    #[test]
    fn greedy_tokens_take_the_graph_ids_and_fall_back_to_the_host_argmax_for_nan_rows() {
        let mut asked = Vec::new();
        let mut row = |s: usize| -> Result<Vec<f64>, Error> {
            asked.push(s);
            Ok(vec![1.0, f64::NAN, 3.0, 3.0])
        };
        // Sequence 1's row holds a NaN: the graph says 4 (no id); the host argmax skips the NaN
        // and keeps the lowest id of the largest value.
        assert_eq!(greedy_tokens(&[2.0, 4.0, 0.0], 4, &mut row).unwrap(), vec![2, 2, 0]);
        assert_eq!(asked, vec![1], "only the NaN row's logits are read");
        for bad in [-1.0, 5.0, 1.5, f64::NAN] {
            let e = greedy_tokens(&[bad], 4, &mut |_| Ok(vec![0.0; 4])).unwrap_err();
            assert!(e.to_string().contains("is not an id of the 4-token vocabulary"), "{e}");
        }
    }

    #[test]
    fn seeded_sampling_repeats_and_stays_in_the_nucleus() {
        let row = [0.0, 3.0, 2.9, -5.0, f64::NAN];
        let o = SampleOptions::seeded(1, 1.0, 0.5, 3);
        let draws = |o: &SampleOptions| {
            let mut s = Sampler::new(o);
            (0..64).map(|_| s.sample(&row)).collect::<Vec<_>>()
        };
        let a = draws(&o);
        assert_eq!(a, draws(&o), "same seed, same tokens");
        // top_p 0.5: the nucleus is token 1 (≈ 0.49 of the mass) then token 2.
        assert!(a.iter().all(|&t| t == 1 || t == 2), "{a:?}");
        assert!(o.validate().is_ok());
        assert!(SampleOptions::seeded(1, f64::NAN, 1.0, 0).validate().is_err());
        assert!(SampleOptions::seeded(1, 1.0, 0.0, 0).validate().is_err());
    }
}
