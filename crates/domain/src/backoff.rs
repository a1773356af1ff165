//! The one retry schedule of the service: a delay that starts at a base and doubles with each
//! failure in a row, up to a cap. The delivery queues (outbox, alerts), the background loops
//! and publishing a run's pull request wait on it. (`agentry-codehost`, which depends on no
//! crate of the workspace, has the same schedule with full jitter for a request's retries.)

use std::time::Duration;

use time::OffsetDateTime;

/// The longest exponential step before the cap (`base × 2^20`): keeps the arithmetic finite.
const MAX_EXPONENT: u32 = 20;

/// A capped exponential backoff: after the first failure `base`, doubling with each further
/// failure in a row, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay before the next try after `before` failures that preceded the one that just
    /// failed: `base × 2^before`, at most `max` (a negative count counts as 0).
    pub fn delay(&self, before: i32) -> Duration {
        let exponent = u32::try_from(before.max(0)).unwrap_or(0).min(MAX_EXPONENT);
        self.base
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(self.max)
    }

    /// When to try again after `before` earlier failures and one more at `now`.
    pub fn retry_at(&self, before: i32, now: OffsetDateTime) -> OffsetDateTime {
        now + self.delay(before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_delay_doubles_from_the_base_up_to_the_cap() {
        let b = Backoff {
            base: 500 * MS,
            max: Duration::from_secs(30),
        };
        assert_eq!(b.delay(0), 500 * MS);
        assert_eq!(b.delay(1), 1000 * MS);
        assert_eq!(b.delay(5), 16_000 * MS);
        assert_eq!(b.delay(6), b.max);
        assert_eq!(b.delay(1000), b.max);
        assert_eq!(b.delay(i32::MAX), b.max);
        assert_eq!(b.delay(-3), b.base);
        let minutes = Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(600),
        };
        let delays: Vec<u64> = (0..9).map(|a| minutes.delay(a).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 600, 600]);
        let huge = Backoff {
            base: Duration::MAX,
            max: b.max,
        };
        assert_eq!(huge.delay(3), b.max);
    }
}
