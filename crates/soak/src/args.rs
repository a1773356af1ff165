//! The command line: every parameter has the full run's default.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// What one soak run does.
#[derive(Debug, Clone)]
pub struct Params {
    /// The `agentry` binary the replicas run.
    pub agentry: PathBuf,
    /// The PostgreSQL database both replicas share.
    pub database_url: String,
    /// A scratch directory (replica data directories, logs, the fake agent, its ledger).
    pub work: PathBuf,
    /// Issues opened on the fake code host; half assigned by the API, half by labelling.
    pub issues: usize,
    /// How long the chaos lasts (kills and faults); work is spread over its first 60 %.
    pub chaos: Duration,
    /// Share of code-host requests answered with a fault while the chaos lasts.
    pub fault_rate: f64,
    /// Seconds between two kills: uniform in `lo..=hi`.
    pub kill_every: (u64, u64),
    /// Drives every random choice (schedule, kills, faults, agent costs and durations).
    pub seed: u64,
    /// The fake agent's duration in milliseconds: uniform in `lo..=hi`.
    pub agent_ms: (u64, u64),
    /// `AGENTRY_MAX_CONCURRENT_RUNS` of each replica.
    pub runs_per_replica: u32,
    /// `AGENTRY_RUN_LEASE_SECS` of each replica.
    pub lease_secs: u64,
    /// How long the end waits for quiescence before it checks anyway.
    pub quiesce: Duration,
}

const USAGE: &str = "usage: soak --agentry PATH --database-url URL --work DIR [--issues N] \
[--minutes M] [--fault-rate F] [--kill-every LO-HI] [--seed N] [--agent-secs LO-HI] \
[--runs-per-replica N] [--lease-secs N] [--quiesce-minutes M]";

impl Params {
    /// Reads `args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Params, String> {
        let mut agentry = None;
        let mut database_url = None;
        let mut work = None;
        let mut p = Params {
            agentry: PathBuf::new(),
            database_url: String::new(),
            work: PathBuf::new(),
            issues: 200,
            chaos: Duration::from_secs(600),
            fault_rate: 0.3,
            kill_every: (20, 40),
            seed: 1,
            agent_ms: (1000, 8000),
            runs_per_replica: 3,
            lease_secs: 10,
            quiesce: Duration::from_secs(300),
        };
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(USAGE.to_owned());
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag}: a value is missing\n{USAGE}"))?;
            let bad = |what: &str| format!("{flag} {value:?}: expected {what}\n{USAGE}");
            match flag.as_str() {
                "--agentry" => agentry = Some(PathBuf::from(&value)),
                "--database-url" => database_url = Some(value.clone()),
                "--work" => work = Some(PathBuf::from(&value)),
                "--issues" => {
                    p.issues = within(&value, 2..=100_000)
                        .ok_or_else(|| bad("a whole number from 2 to 100000"))?;
                }
                "--minutes" => p.chaos = minutes(&value).ok_or_else(|| bad("minutes > 0"))?,
                "--quiesce-minutes" => {
                    p.quiesce = minutes(&value).ok_or_else(|| bad("minutes > 0"))?;
                }
                "--fault-rate" => {
                    p.fault_rate =
                        within(&value, 0.0..=0.9).ok_or_else(|| bad("a fraction from 0 to 0.9"))?;
                }
                "--kill-every" => {
                    p.kill_every = range(&value)
                        .filter(|(lo, _)| *lo >= 1)
                        .ok_or_else(|| bad("seconds LO-HI, LO >= 1"))?;
                }
                "--agent-secs" => {
                    let (lo, hi) = range(&value).ok_or_else(|| bad("seconds LO-HI"))?;
                    p.agent_ms = (lo * 1000, hi * 1000);
                }
                "--seed" => p.seed = value.parse().map_err(|_| bad("a whole number"))?,
                "--runs-per-replica" => {
                    p.runs_per_replica = within(&value, 1..=16).ok_or_else(|| bad("1 to 16"))?;
                }
                "--lease-secs" => {
                    p.lease_secs = within(&value, 3..=600).ok_or_else(|| bad("3 to 600"))?;
                }
                _ => return Err(format!("unknown option {flag}\n{USAGE}")),
            }
        }
        p.agentry = agentry.ok_or_else(|| format!("--agentry is required\n{USAGE}"))?;
        p.database_url =
            database_url.ok_or_else(|| format!("--database-url is required\n{USAGE}"))?;
        p.work = work.ok_or_else(|| format!("--work is required\n{USAGE}"))?;
        Ok(p)
    }
}

/// `text` parsed, if it lies in `range`.
fn within<T: FromStr + PartialOrd>(text: &str, range: RangeInclusive<T>) -> Option<T> {
    text.parse().ok().filter(|n| range.contains(n))
}

fn minutes(text: &str) -> Option<Duration> {
    let m: f64 = text.parse().ok()?;
    (m > 0.0 && m <= 24.0 * 60.0).then(|| Duration::from_secs_f64(m * 60.0))
}

fn range(text: &str) -> Option<(u64, u64)> {
    let (lo, hi) = match text.split_once('-') {
        Some((lo, hi)) => (lo.trim().parse().ok()?, hi.trim().parse().ok()?),
        None => {
            let n = text.trim().parse().ok()?;
            (n, n)
        }
    };
    (lo <= hi && hi <= 3600).then_some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Params, String> {
        Params::parse(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn defaults_are_the_full_run_and_bad_values_are_named() {
        let base = [
            "--agentry",
            "/a",
            "--database-url",
            "postgres://x",
            "--work",
            "/w",
        ];
        let p = parse(&base).unwrap();
        assert_eq!(p.issues, 200);
        assert_eq!(p.chaos, Duration::from_secs(600));
        assert_eq!(p.kill_every, (20, 40));
        assert_eq!(p.agent_ms, (1000, 8000));
        let mut more = base.to_vec();
        more.extend([
            "--kill-every",
            "5-9",
            "--minutes",
            "0.5",
            "--agent-secs",
            "1-3",
        ]);
        let p = parse(&more).unwrap();
        assert_eq!(p.kill_every, (5, 9));
        assert_eq!(p.chaos, Duration::from_secs(30));
        assert_eq!(p.agent_ms, (1000, 3000));
        for bad in [
            ["--kill-every", "9-5"],
            ["--fault-rate", "1.5"],
            ["--issues", "x"],
            ["--minutes", "0"],
        ] {
            let mut args = base.to_vec();
            args.extend(bad);
            assert!(parse(&args).unwrap_err().contains(bad[0]), "{bad:?}");
        }
        assert!(parse(&["--issues", "3"]).unwrap_err().contains("--agentry"));
    }
}
