//! Symbolic dimensions: polynomials over named symbols with integer coefficients.
//!
//! A dimension such as `T`, `576`, `H*64` or `past+T` is kept in one canonical form (a sum of
//! monomials with non-zero coefficients, monomials sorted, symbol powers sorted by name), so
//! that two spellings of the same size compare equal: `64*H == H*64`, `(a+b)*2 == 2*a+2*b`.
//! This is what lets the verifier check `reshape` (equal products), `concat` (sums) and
//! broadcasting (equality or the constant 1) before any symbol is bound. Symbols are bound to
//! concrete sizes at run time with a [`Bindings`] map.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A symbol's name, shared cheaply between dims.
pub type Symbol = Arc<str>;

/// A product of symbols with positive powers, sorted by name; empty for the constant term.
type Monomial = Vec<(Symbol, u32)>;

/// Concrete values of symbols, in elements.
pub type Bindings = BTreeMap<String, i64>;

/// A dimension: an integer polynomial over named symbols in canonical form.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    /// Invariant: no zero coefficients; every monomial sorted by symbol name with powers ≥ 1.
    terms: BTreeMap<Monomial, i64>,
}

/// Why a dimension could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DimError {
    /// A symbol had no binding.
    #[error("symbol `{0}` is not bound")]
    Unbound(String),
    /// The arithmetic overflowed `i64`.
    #[error("dimension `{0}` overflows i64 under the given bindings")]
    Overflow(String),
}

impl Dim {
    /// The constant dimension `n`.
    pub fn constant(n: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if n != 0 {
            terms.insert(Vec::new(), n);
        }
        Dim { terms }
    }

    /// The dimension made of one symbol, e.g. `T`.
    pub fn symbol(name: &str) -> Dim {
        let mut terms = BTreeMap::new();
        terms.insert(vec![(Symbol::from(name), 1)], 1);
        Dim { terms }
    }

    /// `Some(n)` when the dimension is the constant `n`.
    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// `Some(name)` when the dimension is exactly one symbol with coefficient 1.
    pub fn as_symbol(&self) -> Option<&str> {
        if self.terms.len() != 1 {
            return None;
        }
        let (m, c) = self.terms.iter().next()?;
        if *c == 1 && m.len() == 1 && m[0].1 == 1 {
            Some(&m[0].0)
        } else {
            None
        }
    }

    /// True when the dimension is the constant 1 (the broadcastable size).
    pub fn is_one(&self) -> bool {
        self.as_const() == Some(1)
    }

    /// Every symbol the dimension mentions, sorted, without repetition.
    pub fn symbols(&self) -> Vec<Symbol> {
        let mut out: Vec<Symbol> = self.terms.keys().flat_map(|m| m.iter().map(|(s, _)| s.clone())).collect();
        out.sort();
        out.dedup();
        out
    }

    fn add_term(terms: &mut BTreeMap<Monomial, i64>, m: Monomial, c: i64) {
        let e = terms.entry(m).or_insert(0);
        *e = e.wrapping_add(c);
        terms.retain(|_, c| *c != 0);
    }

    fn checked_terms(terms: impl IntoIterator<Item = (Monomial, i128)>) -> Option<Dim> {
        let mut acc: BTreeMap<Monomial, i128> = BTreeMap::new();
        for (m, c) in terms {
            let e = acc.entry(m).or_insert(0);
            *e = e.checked_add(c)?;
        }
        let mut out = BTreeMap::new();
        for (m, c) in acc {
            if c != 0 {
                out.insert(m, i64::try_from(c).ok()?);
            }
        }
        Some(Dim { terms: out })
    }

    /// `self + other`, or `None` if a coefficient overflows `i64`.
    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        Self::checked_terms(self.terms.iter().chain(&other.terms).map(|(m, c)| (m.clone(), *c as i128)))
    }

    /// `self - other`, or `None` on overflow.
    pub fn checked_sub(&self, other: &Dim) -> Option<Dim> {
        Self::checked_terms(self.terms.iter().map(|(m, c)| (m.clone(), *c as i128)).chain(other.terms.iter().map(|(m, c)| (m.clone(), -(*c as i128)))))
    }

    /// `self * other`, or `None` on overflow.
    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        let mut prods = Vec::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                prods.push((Self::mul_monomials(ma, mb), (*ca as i128).checked_mul(*cb as i128)?));
            }
        }
        Self::checked_terms(prods)
    }

    /// `self + other`.
    pub fn add(&self, other: &Dim) -> Dim {
        let mut terms = self.terms.clone();
        for (m, c) in &other.terms {
            Self::add_term(&mut terms, m.clone(), *c);
        }
        Dim { terms }
    }

    /// `self - other`.
    pub fn sub(&self, other: &Dim) -> Dim {
        self.add(&other.scale(-1))
    }

    /// `c * self`.
    pub fn scale(&self, c: i64) -> Dim {
        if c == 0 {
            return Dim::constant(0);
        }
        Dim { terms: self.terms.iter().map(|(m, k)| (m.clone(), k.wrapping_mul(c))).collect() }
    }

    fn mul_monomials(a: &Monomial, b: &Monomial) -> Monomial {
        let mut map: BTreeMap<Symbol, u32> = BTreeMap::new();
        for (s, p) in a.iter().chain(b.iter()) {
            *map.entry(s.clone()).or_insert(0) += p;
        }
        map.into_iter().collect()
    }

    /// `self * other`, expanded.
    pub fn mul(&self, other: &Dim) -> Dim {
        let mut terms = BTreeMap::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                Self::add_term(&mut terms, Self::mul_monomials(ma, mb), ca.wrapping_mul(*cb));
            }
        }
        Dim { terms }
    }

    /// `self / c` when every coefficient is divisible by `c` (an exact division), else `None`.
    pub fn div_exact(&self, c: i64) -> Option<Dim> {
        if c == 0 || self.terms.values().any(|k| k % c != 0) {
            return None;
        }
        Some(Dim { terms: self.terms.iter().map(|(m, k)| (m.clone(), k / c)).collect() })
    }

    /// The product of a list of dims (1 for an empty list): the element count of a shape.
    pub fn product<'a>(dims: impl IntoIterator<Item = &'a Dim>) -> Dim {
        dims.into_iter().fold(Dim::constant(1), |acc, d| acc.mul(d))
    }

    /// Replaces symbols by dims; symbols absent from `map` stay.
    pub fn substitute(&self, map: &BTreeMap<String, Dim>) -> Dim {
        let mut out = Dim::constant(0);
        for (m, c) in &self.terms {
            let mut term = Dim::constant(*c);
            for (s, p) in m {
                let base = map.get(&**s).cloned().unwrap_or_else(|| Dim::symbol(s));
                for _ in 0..*p {
                    term = term.mul(&base);
                }
            }
            out = out.add(&term);
        }
        out
    }

    /// The concrete size under `bindings`.
    ///
    /// # Errors
    /// [`DimError::Unbound`] when a symbol has no binding, [`DimError::Overflow`] on overflow.
    pub fn eval(&self, bindings: &Bindings) -> Result<i64, DimError> {
        let mut total: i64 = 0;
        let overflow = || DimError::Overflow(self.to_string());
        for (m, c) in &self.terms {
            let mut v = *c;
            for (s, p) in m {
                let b = *bindings.get(&**s).ok_or_else(|| DimError::Unbound(s.to_string()))?;
                for _ in 0..*p {
                    v = v.checked_mul(b).ok_or_else(overflow)?;
                }
            }
            total = total.checked_add(v).ok_or_else(overflow)?;
        }
        Ok(total)
    }
}

impl From<i64> for Dim {
    fn from(n: i64) -> Dim {
        Dim::constant(n)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Dim {
        Dim::symbol(s)
    }
}

impl fmt::Display for Dim {
    /// Prints the canonical form: non-constant monomials in sorted order, then the constant;
    /// a monomial prints as `c*A*B^2` with the coefficient omitted when it is 1. The text
    /// format's dim parser reads this back to the same `Dim`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut ordered: Vec<(&Monomial, &i64)> = self.terms.iter().filter(|(m, _)| !m.is_empty()).collect();
        if let Some(c) = self.terms.get(&Vec::new()) {
            ordered.push((&EMPTY, c));
        }
        for (i, (m, c)) in ordered.into_iter().enumerate() {
            let c = *c;
            let neg = c < 0;
            let mag = c.unsigned_abs();
            if i == 0 {
                if neg {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if neg { "-" } else { "+" })?;
            }
            let mut first = true;
            if mag != 1 || m.is_empty() {
                write!(f, "{mag}")?;
                first = false;
            }
            for (s, p) in m.iter() {
                if !first {
                    f.write_str("*")?;
                }
                first = false;
                f.write_str(s)?;
                if *p > 1 {
                    write!(f, "^{p}")?;
                }
            }
        }
        Ok(())
    }
}

static EMPTY: Monomial = Vec::new();

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dim({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms_agree() {
        let h = Dim::symbol("H");
        let t = Dim::symbol("T");
        let past = Dim::symbol("past");
        assert_eq!(h.mul(&64.into()), Dim::from(64).mul(&h));
        assert_eq!(past.add(&t).to_string(), "T+past");
        assert_eq!(h.scale(64).to_string(), "64*H");
        assert_eq!(t.add(&1.into()).sub(&t), Dim::constant(1));
        assert_eq!(t.mul(&t).scale(-2).add(&3.into()).to_string(), "-2*T^2+3");
        assert_eq!(h.scale(64).div_exact(64), Some(h.clone()));
        assert_eq!(h.scale(64).div_exact(3), None);
        let mut b = Bindings::new();
        b.insert("T".into(), 5);
        assert_eq!(t.scale(3).add(&2.into()).eval(&b), Ok(17));
        assert_eq!(h.eval(&b), Err(DimError::Unbound("H".into())));
        assert_eq!(Dim::constant(0).to_string(), "0");
        assert_eq!(Dim::constant(-4).to_string(), "-4");
    }
}
