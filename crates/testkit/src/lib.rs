//! What agentry's tests share (a dev-dependency only, never part of the service):
//!
//! * [`SplitMix64`]: the one small deterministic generator behind seeded test data and the
//!   fake GitHub's fault injection, so that every failure is reproducible from its seed;
//! * [`dirs::outside_tmp`]: a test directory outside `/tmp` and `$TMPDIR`, wherever the
//!   build lies;
//! * [`git`]: the real `git` with no user or system configuration, and a bare source
//!   repository with a README committed on `main` ([`git::seeded_bare`],
//!   [`git::source_repo`]) for runs against a local clone URL;
//! * [`wait`]: [`wait::eventually`] and [`wait::eventually_async`], which poll a condition
//!   until it holds or a deadline passes (tests never sleep a fixed time), on
//!   [`wait::poll`], the one polling loop, which the soak, the fakes and the benchmarks use
//!   where a timeout is an answer rather than a failure;
//! * [`stats::quantile`]: the one definition of a percentile (nearest rank) behind the
//!   figures the benchmarks print;
//! * [`sandbox::sandboxed`]: whether a suite runs its agents in the sandbox, required in CI;
//! * [`http::head`] and [`http::content_length`]: an HTTP head written, and the body length
//!   one announces;
//! * [`json::elements_of`] and [`json::strings_of`]: a JSON answer's list, and one string
//!   field of each of its elements;
//! * [`sql::statements_starting_with`]: the statements of one kind in an SQL script (a
//!   migration's backfill, replayed);
//! * [`process::processes_with_env`]: the live processes a run's agent left, found by their
//!   environment;
//! * [`served::Served`]: an HTTP fake (the fake GitHub, the fake model APIs) served on a
//!   thread of its own;
//! * [`on_both_backends!`]: an async test over a database, run once on SQLite and once on
//!   PostgreSQL (reported ignored where the suite has no server).
//!
//! The rigs of the crates that drive the service are `agentry-test-rigs`: this crate cannot
//! depend on the service, since the fake GitHub depends on this crate.

pub mod dirs;
pub mod git;
pub mod http;
pub mod json;
pub mod process;
pub mod sandbox;
pub mod served;
pub mod sql;
pub mod stats;
pub mod wait;

/// SplitMix64 (Steele, Lea and Flood): a tiny, fast and deterministic generator.
///
/// The same seed always gives the same sequence, on every platform; statistical quality
/// beyond that is not a goal. Not for anything secret.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator whose state starts at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `next_u64() % n`: in `0..n` (slightly biased, which seeded test data does not mind).
    ///
    /// # Panics
    /// When `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi` (through [`below`](Self::below)).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`.
    ///
    /// # Panics
    /// When `items` is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A uniform draw in `[0, 1)` (the top 53 bits of [`next_u64`](Self::next_u64)).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Runs the async test `$name(db)` once on SQLite and once on PostgreSQL (skipped, and
/// reported ignored, where the suite has no server), as `$name::sqlite` and
/// `$name::postgres`, each under the given test attribute (`#[tokio::test]`,
/// `#[actix_web::test]`); `on_both_backends!(#[tokio::test] test_name => function)` names
/// the pair `test_name` instead.
///
/// The calling crate depends on `agentry-persistence` (with its `test_support`) and sets the
/// `agentry_pg_skipped` cfg when the suite has no PostgreSQL server.
#[macro_export]
macro_rules! on_both_backends {
    (#[$runtime:meta] $name:ident) => {
        $crate::on_both_backends!(#[$runtime] $name => $name);
    };
    (#[$runtime:meta] $test:ident => $name:ident) => {
        mod $test {
            use agentry_persistence::test_support::TestDb;

            #[$runtime]
            async fn sqlite() {
                super::$name(TestDb::sqlite()).await;
            }

            #[$runtime]
            #[cfg_attr(
                agentry_pg_skipped,
                ignore = "PostgreSQL variant: AGENTRY_TEST_PG_URL is not set"
            )]
            async fn postgres() {
                if let Some(db) = TestDb::postgres() {
                    super::$name(db).await;
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    /// The reference outputs of SplitMix64 for seed 0 (as in Vigna's `splitmix64.c`): the
    /// sequence every seeded data set of the tests depends on.
    #[test]
    fn matches_the_reference_sequence() {
        let mut rng = SplitMix64::new(0);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F
            ]
        );
    }

    #[test]
    fn same_seed_same_draws() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..10 {
            let x = a.next_f64();
            assert_eq!(x, b.next_f64());
            assert!((0.0..1.0).contains(&x));
        }
        let mut items: Vec<u32> = (0..20).collect();
        a.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        for _ in 0..100 {
            assert!((-3..=3).contains(&a.range(-3, 3)));
            assert!(a.below(5) < 5);
            assert!([1, 2].contains(a.pick(&[1, 2])));
        }
        assert!(!a.chance(0));
        assert!(a.chance(100));
    }
}
