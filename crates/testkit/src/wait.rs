//! Waiting in tests for something another thread, task or process does: poll a probe until
//! it reports done or a deadline passes, then fail with what was awaited and the last thing
//! seen. Never a fixed sleep, so a test is as fast as the system under test.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How often a probe is polled.
const EVERY: Duration = Duration::from_millis(20);

/// What a probe reports: done (with a value) or not yet (with what it saw).
///
/// * `bool`: done when `true`; the value is `()`;
/// * `Option<T>`: done with `Some(value)`;
/// * `Result<T, E>`: done with `Ok(value)`; `Err(seen)` is not yet, and the last `seen` is
///   part of the failure message.
pub trait Outcome {
    /// What a done probe hands back.
    type Value;
    /// `Ok(value)` when done, or what was seen (possibly nothing) when not.
    fn settle(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn settle(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn settle(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn settle(self) -> Result<T, String> {
        self.map_err(|seen| seen.to_string())
    }
}

/// Polls `probe` (on this thread, every `every`) until it reports done and returns its
/// value, or, once `within` has passed, `Err` with the last thing it saw (empty when it said
/// nothing). The probe is always polled at least once. For waits that must not panic: the
/// soak, the fakes' own waits, the benchmarks; tests use [`eventually`].
pub fn poll<O: Outcome>(
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> O,
) -> Result<O::Value, String> {
    let start = Instant::now();
    loop {
        match probe().settle() {
            Ok(value) => return Ok(value),
            Err(seen) if start.elapsed() >= within => return Err(seen),
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// [`poll`] for an async probe, on the current (tokio) runtime's timer without blocking it.
pub async fn poll_async<O: Outcome>(
    within: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> O,
) -> Result<O::Value, String> {
    let start = Instant::now();
    loop {
        match probe().await.settle() {
            Ok(value) => return Ok(value),
            Err(seen) if start.elapsed() >= within => return Err(seen),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// The panic of a wait for `what` that timed out after `within`, having last seen `seen`.
fn timed_out(within: Duration, what: impl Display, seen: &str) -> ! {
    if seen.is_empty() {
        panic!("timed out after {within:?} waiting for {what}");
    }
    panic!("timed out after {within:?} waiting for {what}; last seen: {seen}");
}

/// Polls `probe` (on this thread, every 20 ms) until it reports done, and returns its
/// value; panics naming `what` (and the last thing the probe saw) once `within` has passed.
pub fn eventually<O: Outcome>(
    within: Duration,
    what: impl Display,
    probe: impl FnMut() -> O,
) -> O::Value {
    poll(within, EVERY, probe).unwrap_or_else(|seen| timed_out(within, what, &seen))
}

/// [`eventually`] for an async probe: polls it every 20 ms on the current (tokio)
/// runtime's timer without blocking the runtime.
pub async fn eventually_async<O: Outcome>(
    within: Duration,
    what: impl Display,
    probe: impl AsyncFnMut() -> O,
) -> O::Value {
    match poll_async(within, EVERY, probe).await {
        Ok(value) => value,
        Err(seen) => timed_out(within, what, &seen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_probe_is_done() {
        let mut calls = 0;
        let value = eventually(Duration::from_secs(5), "three calls", || {
            calls += 1;
            (calls == 3).then_some(calls * 10)
        });
        assert_eq!(value, 30);
    }

    #[test]
    #[should_panic(expected = "timed out after 50ms waiting for never; last seen: still 1")]
    fn fails_naming_what_and_the_last_thing_seen() {
        eventually(Duration::from_millis(50), "never", || {
            Err::<(), _>(format!("still {}", 1))
        });
    }

    #[test]
    #[should_panic(expected = "timed out after 50ms waiting for a false")]
    fn a_bool_probe_fails_with_what_only() {
        eventually(Duration::from_millis(50), "a false", || false);
    }

    #[test]
    fn poll_gives_the_last_thing_seen_instead_of_panicking() {
        let mut calls = 0;
        let seen = poll(Duration::from_millis(30), Duration::from_millis(5), || {
            calls += 1;
            Err::<(), _>(format!("call {calls}"))
        });
        assert_eq!(seen, Err(format!("call {calls}")));
        assert!(calls >= 2, "polled until the deadline: {calls}");
        assert_eq!(
            poll(Duration::ZERO, EVERY, || true),
            Ok(()),
            "polled once at least"
        );
    }

    #[tokio::test]
    async fn the_async_probe_is_awaited_until_done() {
        let mut calls = 0;
        eventually_async(Duration::from_secs(5), "two calls", async || {
            calls += 1;
            calls == 2
        })
        .await;
        assert_eq!(calls, 2);
    }
}
