//! Exact arithmetic helpers: comparisons of products of decimals on big integers, division
//! rounded exactly once, and non-panicking quotients.
//!
//! [`Decimal`] arithmetic is exact as long as results fit its 96-bit mantissa, but a
//! comparison such as `c₁·(n₁−1)·(S₂−c₂)` against `c₂·(n₂−1)·(S₁−c₁)` may not, and a quotient
//! has only 28 significant digits. The helpers here never round where an exact answer is
//! needed and never panic.

use std::cmp::Ordering;

use rust_decimal::{Decimal, RoundingStrategy};

/// A non-negative big integer, little-endian 32-bit limbs (no trailing zero limbs).
#[derive(Debug, Clone, PartialEq, Eq)]
struct BigUint(Vec<u32>);

impl BigUint {
    fn from_u128(mut v: u128) -> BigUint {
        let mut limbs = Vec::with_capacity(4);
        while v > 0 {
            limbs.push(v as u32);
            v >>= 32;
        }
        BigUint(limbs)
    }

    fn mul_small(&mut self, factor: u32) {
        let mut carry: u64 = 0;
        for limb in &mut self.0 {
            let product = u64::from(*limb) * u64::from(factor) + carry;
            *limb = product as u32;
            carry = product >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
        self.trim();
    }

    fn mul(&self, other: &BigUint) -> BigUint {
        if self.0.is_empty() || other.0.is_empty() {
            return BigUint(Vec::new());
        }
        let mut out = vec![0_u32; self.0.len() + other.0.len()];
        for (i, &a) in self.0.iter().enumerate() {
            let mut carry: u64 = 0;
            for (j, &b) in other.0.iter().enumerate() {
                let cur = u64::from(out[i + j]) + u64::from(a) * u64::from(b) + carry;
                out[i + j] = cur as u32;
                carry = cur >> 32;
            }
            let mut k = i + other.0.len();
            while carry > 0 {
                let cur = u64::from(out[k]) + carry;
                out[k] = cur as u32;
                carry = cur >> 32;
                k += 1;
            }
        }
        let mut big = BigUint(out);
        big.trim();
        big
    }

    fn mul_pow10(&mut self, mut exponent: u32) {
        while exponent >= 9 {
            self.mul_small(1_000_000_000);
            exponent -= 9;
        }
        if exponent > 0 {
            self.mul_small(10_u32.pow(exponent));
        }
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }
}

impl Ord for BigUint {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }
}

impl PartialOrd for BigUint {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The exact product of `factors` as (sign, magnitude, scale): the value is
/// `sign × magnitude × 10^-scale`, `sign` in {-1, 0, 1}.
fn product(factors: &[Decimal]) -> (i8, BigUint, u32) {
    let mut sign: i8 = 1;
    let mut magnitude = BigUint::from_u128(1);
    let mut scale = 0_u32;
    for f in factors {
        if f.is_zero() {
            return (0, BigUint(Vec::new()), 0);
        }
        if f.is_sign_negative() {
            sign = -sign;
        }
        magnitude = magnitude.mul(&BigUint::from_u128(f.mantissa().unsigned_abs()));
        scale += f.scale();
    }
    (sign, magnitude, scale)
}

/// Compares the exact products `Π lhs` and `Π rhs` (an empty product is 1).
pub(crate) fn cmp_products(lhs: &[Decimal], rhs: &[Decimal]) -> Ordering {
    let (ls, mut lm, lscale) = product(lhs);
    let (rs, mut rm, rscale) = product(rhs);
    if ls != rs || ls == 0 {
        return ls.cmp(&rs);
    }
    let common = lscale.max(rscale);
    lm.mul_pow10(common - lscale);
    rm.mul_pow10(common - rscale);
    let magnitude = lm.cmp(&rm);
    if ls > 0 {
        magnitude
    } else {
        magnitude.reverse()
    }
}

/// Compares the fractions `a / b` and `c / d` exactly; `b` and `d` must be positive.
pub(crate) fn cmp_fractions(a: Decimal, b: Decimal, c: Decimal, d: Decimal) -> Ordering {
    cmp_products(&[a, d], &[c, b])
}

/// `numerator / denominator` as a [`Decimal`] (28 significant digits, one rounding), or a
/// saturated value when it does not fit; zero when `denominator` is zero.
///
/// The operands are normalised first: rust_decimal's division rounds its last digit
/// differently for the same values held at different scales (`0.5` vs `0.500000000`), and
/// the report must not depend on how its inputs were summed.
pub(crate) fn quotient(numerator: Decimal, denominator: Decimal) -> Decimal {
    if denominator.is_zero() {
        return Decimal::ZERO;
    }
    let (numerator, denominator) = (numerator.normalize(), denominator.normalize());
    numerator.checked_div(denominator).unwrap_or_else(|| {
        if numerator.is_sign_negative() != denominator.is_sign_negative() {
            Decimal::MIN
        } else {
            Decimal::MAX
        }
    })
}

/// `numerator / denominator` rounded half away from zero to `dp` decimal places, exactly: the
/// exact quotient is rounded once (no intermediate 28-digit rounding can move it across a
/// midpoint). Zero when `denominator` is zero.
pub(crate) fn div_round(numerator: Decimal, denominator: Decimal, dp: u32) -> Decimal {
    if denominator.is_zero() || numerator.is_zero() {
        return Decimal::ZERO;
    }
    let negative = numerator.is_sign_negative() != denominator.is_sign_negative();
    let p = numerator.abs();
    let q = denominator.abs();
    let ulp = Decimal::new(1, dp);
    let half = Decimal::new(5, dp + 1);
    // An estimate from the 28-digit quotient, then corrected until
    // magnitude − ulp/2 ≤ p/q < magnitude + ulp/2, i.e. p/q rounds half away to `magnitude`.
    let mut magnitude =
        quotient(p, q).round_dp_with_strategy(dp, RoundingStrategy::MidpointAwayFromZero);
    for _ in 0..8 {
        let Some(high) = magnitude.checked_add(half) else {
            break;
        };
        if cmp_products(&[p], &[high, q]) != Ordering::Less {
            match magnitude.checked_add(ulp) {
                Some(up) => magnitude = up,
                None => break,
            }
            continue;
        }
        if magnitude.is_zero() {
            break;
        }
        let low = magnitude - half;
        if cmp_products(&[p], &[low, q]) == Ordering::Less {
            magnitude -= ulp;
            continue;
        }
        break;
    }
    if negative && !magnitude.is_zero() {
        -magnitude
    } else {
        magnitude
    }
}

/// `a × b`, saturating instead of panicking.
pub(crate) fn mul(a: Decimal, b: Decimal) -> Decimal {
    a.saturating_mul(b)
}

/// The count `n` as a [`Decimal`].
pub(crate) fn count(n: i64) -> Decimal {
    Decimal::from(n)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    #[test]
    fn quotients_do_not_depend_on_the_scale_of_equal_operands() {
        // The same values, summed from nano-dollars or from normalised amounts.
        let a = Decimal::from_i128_with_scale(40_442_521_672, 9);
        let b = Decimal::from_i128_with_scale(4_374_239_589_258_065, 15);
        let scaled = quotient(a * Decimal::from(31), b * Decimal::from(1_000_000));
        let plain = quotient(
            (a * Decimal::from(31)).normalize(),
            (b * Decimal::from(1_000_000)).normalize(),
        );
        assert_eq!(scaled.to_string(), plain.to_string());
        let x = Decimal::from_i128_with_scale(1_000_000_000, 9); // 1.000000000
        assert_eq!(
            quotient(Decimal::ONE, Decimal::from(3)),
            quotient(x, Decimal::from(3))
        );
    }

    #[test]
    fn products_compare_exactly() {
        assert_eq!(
            cmp_products(&[d("1.5"), d("2")], &[d("3")]),
            Ordering::Equal
        );
        assert_eq!(
            cmp_products(&[d("0.1"), d("3")], &[d("0.3")]),
            Ordering::Equal
        );
        assert_eq!(
            cmp_products(&[d("0.1"), d("3")], &[d("0.30000001")]),
            Ordering::Less
        );
        assert_eq!(cmp_products(&[], &[d("1.000")]), Ordering::Equal);
        assert_eq!(cmp_products(&[d("-1")], &[d("0")]), Ordering::Less);
        assert_eq!(cmp_products(&[d("-1")], &[d("-2")]), Ordering::Greater);
        assert_eq!(
            cmp_products(&[d("-1"), d("-2")], &[d("2")]),
            Ordering::Equal
        );
        assert_eq!(cmp_products(&[d("0")], &[d("0.000")]), Ordering::Equal);
        // Products far beyond Decimal's 96-bit mantissa.
        let big = Decimal::MAX;
        assert_eq!(
            cmp_products(&[big, big, big], &[big, big, big - Decimal::ONE]),
            Ordering::Greater
        );
        let tiny = d("0.0000000000000000000000000001");
        assert_eq!(
            cmp_products(&[big, tiny, tiny], &[big, tiny, tiny]),
            Ordering::Equal
        );
    }

    #[test]
    fn fractions() {
        assert_eq!(
            cmp_fractions(d("2"), d("3"), d("0.667"), d("1")),
            Ordering::Less
        );
        assert_eq!(
            cmp_fractions(d("2"), d("3"), d("4"), d("6")),
            Ordering::Equal
        );
    }

    #[test]
    fn rounding_once() {
        assert_eq!(div_round(d("1"), d("8"), 2), d("0.13"));
        assert_eq!(div_round(d("-1"), d("8"), 2), d("-0.13"));
        assert_eq!(div_round(d("1"), d("3"), 4), d("0.3333"));
        assert_eq!(div_round(d("2"), d("3"), 4), d("0.6667"));
        assert_eq!(div_round(d("-100"), d("3"), 1), d("-33.3"));
        assert_eq!(div_round(d("0"), d("3"), 1), d("0"));
        assert_eq!(div_round(d("1"), d("0"), 1), d("0"));
        assert_eq!(div_round(d("0.00005"), d("1"), 4), d("0.0001"));
        assert_eq!(div_round(d("0.00004999"), d("1"), 4), d("0"));
        // (0.15 − 10⁻²⁸) / 3 = 0.04999…9666…: its 28-digit quotient is exactly the midpoint
        // 0.05, which would round up to 0.1.
        let p = d("0.1499999999999999999999999999");
        assert_eq!(quotient(p, d("3")), d("0.05"));
        assert_eq!(div_round(p, d("3"), 1), d("0"));
        assert_eq!(div_round(-p, d("3"), 1), d("0"));
        assert_eq!(div_round(d("0.15"), d("3"), 1), d("0.1"));
        assert_eq!(div_round(Decimal::MAX, d("0.0000000001"), 4), Decimal::MAX);
    }

    #[test]
    fn quotients() {
        assert_eq!(quotient(d("1"), d("4")), d("0.25"));
        assert_eq!(quotient(d("1"), d("0")), d("0"));
        assert_eq!(quotient(Decimal::MAX, d("0.1")), Decimal::MAX);
        assert_eq!(quotient(Decimal::MIN, d("0.1")), Decimal::MIN);
    }
}
