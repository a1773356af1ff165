//! Generates historical task records as JSON Lines for `agentry import`, for benchmarks and
//! demos (defaults: 1,000,000 records over 90 days; see `examples/common/demo.rs` for the
//! data's shape):
//!
//! ```sh
//! cargo run --release -p agentry-api --example gen_tasks -- COUNT [DAYS] [--random-ids] > tasks.jsonl
//! ```
//!
//! `--random-ids` gives every record an `id`: a random UUIDv4, as exported history carries
//! (still deterministic: the same arguments give the same bytes). Without it the records
//! have no `id` and the output is exactly what it always was.

use std::io::{BufWriter, Write};

use agentry_testkit::SplitMix64;

#[path = "common/demo.rs"]
mod demo;

/// Writes through to `inner`, giving every line that starts with `{` a leading
/// `"id":"<UUIDv4>",` member drawn from its own seeded generator.
struct WithIds<W> {
    inner: W,
    rng: SplitMix64,
    at_line_start: bool,
}

impl<W: Write> WithIds<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            rng: SplitMix64::new(0x1D5_2026_1123),
            at_line_start: true,
        }
    }

    fn next_id(&mut self) -> uuid::Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.rng.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.rng.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

impl<W: Write> Write for WithIds<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        while !rest.is_empty() {
            if self.at_line_start && rest[0] == b'{' {
                let id = self.next_id();
                write!(self.inner, "{{\"id\":\"{id}\",")?;
                rest = &rest[1..];
                self.at_line_start = false;
                continue;
            }
            let end = rest
                .iter()
                .position(|b| *b == b'\n')
                .map_or(rest.len(), |i| i + 1);
            self.inner.write_all(&rest[..end])?;
            self.at_line_start = rest[end - 1] == b'\n';
            rest = &rest[end..];
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The command line.
#[derive(clap::Parser)]
struct Args {
    /// Records to write.
    #[arg(default_value_t = 1_000_000)]
    count: u64,
    /// Days the records' creation times spread over, ending now.
    #[arg(default_value_t = 90, value_parser = clap::value_parser!(i64).range(1..))]
    days: i64,
    /// Give every record a random (but deterministic) UUIDv4 `id`.
    #[arg(long)]
    random_ids: bool,
}

fn main() -> std::io::Result<()> {
    let Args {
        count,
        days,
        random_ids,
    } = clap::Parser::parse();
    let now = time::OffsetDateTime::now_utc();
    let out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    if random_ids {
        let mut out = WithIds::new(out);
        demo::write_tasks(&mut out, count, days, now)?;
        out.flush()
    } else {
        let mut out = out;
        demo::write_tasks(&mut out, count, days, now)?;
        out.flush()
    }
}
