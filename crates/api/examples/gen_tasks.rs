//! Generates historical task records as JSON Lines for `agentry import`, for benchmarks and
//! demos: `cargo run --release -p agentry-api --example gen_tasks -- COUNT [DAYS] > tasks.jsonl`.
//!
//! The data is deterministic (a fixed-seed generator): COUNT tasks spread evenly over the DAYS
//! days ending today (UTC), 50 repositories, 6 models, coding and review tasks, a mix of
//! states, and exact decimal costs with up to 6 decimals (some tasks without a cost).

use std::io::{BufWriter, Write};

use time::{Duration, OffsetDateTime};

/// SplitMix64: tiny, fast, deterministic; statistical quality is irrelevant here.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MODELS: [&str; 6] = [
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

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let days: i64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(90)
        .max(1);
    let now = OffsetDateTime::now_utc();
    let start = now - Duration::days(days - 1);
    let start = start.replace_time(time::Time::MIDNIGHT);
    let span_secs = (now - start).whole_seconds().max(1) as u64;
    let mut rng = Rng(0x00A6_E7E5_2026_1122);
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
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
    out.flush()
}
