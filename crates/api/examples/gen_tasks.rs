//! Generates historical task records as JSON Lines for `agentry import`, for benchmarks and
//! demos: `cargo run --release -p agentry-api --example gen_tasks -- COUNT [DAYS] > tasks.jsonl`
//! (defaults: 1,000,000 records over 90 days). See `examples/common/demo.rs` for the data's
//! shape.

use std::io::{BufWriter, Write};

#[path = "common/demo.rs"]
mod demo;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let days: i64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(90);
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    demo::write_tasks(&mut out, count, days, time::OffsetDateTime::now_utc())?;
    out.flush()
}
