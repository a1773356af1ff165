//! Order statistics for the benchmarks and the tests that report figures: one definition of
//! a percentile, so that a p99 means the same in every figure of docs/benchmarks.md.

use std::cmp::Ordering;

/// The `q`-quantile of `values` (`q` from 0 to 1: 0.5 is the median, 0.99 the 99th
/// percentile, 1 the maximum) by the nearest-rank method: the smallest value such that at
/// least a `q` share of the values are at or below it; for an even count the median is the
/// lower of the two middle values. Sorts `values` in place; `None` when it is empty.
pub fn quantile<T: Copy + PartialOrd>(values: &mut [T], q: f64) -> Option<T> {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    sorted_quantile(values, q)
}

/// [`quantile`] of values already sorted in ascending order.
pub fn sorted_quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    // The rank is at most `n`, a slice length, so the conversion back is exact.
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n.max(1)) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut hundred: Vec<u32> = (1..=100).rev().collect();
        assert_eq!(quantile(&mut hundred, 0.5), Some(50));
        assert_eq!(sorted_quantile(&hundred, 0.99), Some(99));
        assert_eq!(sorted_quantile(&hundred, 0.995), Some(100));
        assert_eq!(sorted_quantile(&hundred, 1.0), Some(100));
        assert_eq!(sorted_quantile(&hundred, 0.0), Some(1));
        let mut two = [2.5_f64, 1.5];
        assert_eq!(quantile(&mut two, 0.5), Some(1.5));
        assert_eq!(quantile(&mut [7u8], 0.99), Some(7));
        assert_eq!(quantile::<u8>(&mut [], 0.5), None);
    }
}
