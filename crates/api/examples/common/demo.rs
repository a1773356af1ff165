//! Deterministic demo and benchmark data: task records as JSON Lines for the importer.
//!
//! `count` tasks spread evenly over the `days` days ending `now`, 50 repositories, 6 models,
//! a quarter of them reviews, a mix of states, and exact decimal costs with 6 decimals
//! (1 in 50 without a cost, and every queued task). The same arguments always give the same
//! bytes, so benchmarks on SQLite and PostgreSQL see identical data.
//!
//! Shared by `examples/gen_tasks.rs` and `examples/bench_costs.rs` (`#[path]` modules); it
//! is test data, so it is not part of the library.

use std::io::Write;

use agentry_testkit::SplitMix64;
use time::{Duration, OffsetDateTime};

/// The models the generated tasks use.
pub const MODELS: [&str; 6] = [
    "claude-opus-4-1",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "gpt-5-codex",
    "gpt-5",
    "gpt-5-mini",
];
const STATES: [&str; 7] = [
    "completed",
    "completed",
    "completed",
    "pr_opened",
    "failed",
    "cancelled",
    "queued",
];

/// Writes `count` task records over the `days` days ending `now` to `out`.
pub fn write_tasks(
    out: &mut impl Write,
    count: u64,
    days: i64,
    now: OffsetDateTime,
) -> std::io::Result<()> {
    let days = days.max(1);
    let start = (now - Duration::days(days - 1)).replace_time(time::Time::MIDNIGHT);
    let span_secs = (now - start).whole_seconds().max(1) as u64;
    let mut rng = SplitMix64::new(0x00A6_E7E5_2026_1122);
    for i in 0..count {
        let repo = rng.below(50);
        let model = MODELS[rng.below(6) as usize];
        let review = rng.below(4) == 0;
        let state = STATES[rng.below(STATES.len() as u64) as usize];
        let created = start + Duration::seconds((i * span_secs / count.max(1)) as i64);
        let created = created
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(std::io::Error::other)?;
        let cost = if state == "queued" || rng.below(50) == 0 {
            "null".to_owned()
        } else {
            let micros = 10_000 + rng.below(if review { 400_000 } else { 4_000_000 });
            format!("\"{}.{:06}\"", micros / 1_000_000, micros % 1_000_000)
        };
        let agent = if model.starts_with("gpt") {
            "codex"
        } else {
            "claude-code"
        };
        writeln!(
            out,
            r#"{{"title":"Task {i}","repoUrl":"https://github.com/acme/repo-{repo:02}","taskType":"{}","state":"{state}","agentType":"{agent}","modelUsed":"{model}","costUsd":{cost},"inputTokens":{},"outputTokens":{},"createdAt":"{created}"}}"#,
            if review { "review" } else { "coding" },
            1_000 + rng.below(200_000),
            100 + rng.below(20_000),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_is_deterministic_and_importable() {
        let now = OffsetDateTime::now_utc();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write_tasks(&mut a, 500, 90, now).unwrap();
        write_tasks(&mut b, 500, 90, now).unwrap();
        assert_eq!(a, b);
        assert_eq!(crate::import::validate(&a).unwrap(), 500);
    }
}
