//! The command line: every parameter has the full run's default.

use std::path::PathBuf;
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

/// The command line, as clap reads it; [`Params::parse`] turns it into [`Params`].
#[derive(Debug, clap::Parser)]
#[command(
    name = "soak",
    about = "Two agentry replicas on one PostgreSQL through kill -9 and a failing code host",
    // scripts/soak-replicas.sh passes its defaults first: a later option wins.
    args_override_self = true
)]
struct Cli {
    /// The `agentry` binary the replicas run.
    #[arg(long, value_name = "PATH")]
    agentry: PathBuf,
    /// The PostgreSQL database both replicas share.
    #[arg(long, value_name = "URL")]
    database_url: String,
    /// A scratch directory.
    #[arg(long, value_name = "DIR")]
    work: PathBuf,
    /// Issues opened on the fake code host.
    #[arg(long, default_value_t = 200,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=100_000))]
    issues: usize,
    /// How long the chaos lasts, in minutes.
    #[arg(long, value_name = "M", default_value = "10", value_parser = minutes)]
    minutes: Duration,
    /// Share of code-host requests answered with a fault while the chaos lasts.
    #[arg(long, value_name = "F", default_value_t = 0.3, value_parser = fault_rate)]
    fault_rate: f64,
    /// Seconds between two kills, `LO-HI` with LO at least 1.
    #[arg(long, value_name = "LO-HI", default_value = "20-40", value_parser = kill_range)]
    kill_every: (u64, u64),
    /// Drives every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The fake agent's duration in seconds, `LO-HI`.
    #[arg(long, value_name = "LO-HI", default_value = "1-8", value_parser = range)]
    agent_secs: (u64, u64),
    /// `AGENTRY_MAX_CONCURRENT_RUNS` of each replica.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    runs_per_replica: u32,
    /// `AGENTRY_RUN_LEASE_SECS` of each replica.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(3..=600))]
    lease_secs: u64,
    /// How long the end waits for quiescence, in minutes.
    #[arg(long, value_name = "M", default_value = "5", value_parser = minutes)]
    quiesce_minutes: Duration,
}

impl Params {
    /// Reads `args` (without the program name).
    ///
    /// # Errors
    ///
    /// clap's error, naming the flag (`--help` is one too: [`clap::Error::exit`] prints it).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Params, clap::Error> {
        use clap::Parser as _;
        let cli = Cli::try_parse_from(std::iter::once("soak".to_owned()).chain(args))?;
        Ok(Params {
            agentry: cli.agentry,
            database_url: cli.database_url,
            work: cli.work,
            issues: cli.issues,
            chaos: cli.minutes,
            fault_rate: cli.fault_rate,
            kill_every: cli.kill_every,
            seed: cli.seed,
            agent_ms: (cli.agent_secs.0 * 1000, cli.agent_secs.1 * 1000),
            runs_per_replica: cli.runs_per_replica,
            lease_secs: cli.lease_secs,
            quiesce: cli.quiesce_minutes,
        })
    }
}

fn minutes(text: &str) -> Result<Duration, String> {
    let m: f64 = text.parse().map_err(|_| "expected minutes".to_owned())?;
    if m > 0.0 && m <= 24.0 * 60.0 {
        Ok(Duration::from_secs_f64(m * 60.0))
    } else {
        Err("expected minutes > 0, at most a day".to_owned())
    }
}

fn fault_rate(text: &str) -> Result<f64, String> {
    text.parse()
        .ok()
        .filter(|f| (0.0..=0.9).contains(f))
        .ok_or_else(|| "expected a fraction from 0 to 0.9".to_owned())
}

/// Seconds `LO-HI` (or one number for both), HI at most an hour.
fn range(text: &str) -> Result<(u64, u64), String> {
    let parsed = match text.split_once('-') {
        Some((lo, hi)) => lo.trim().parse().ok().zip(hi.trim().parse().ok()),
        None => text.trim().parse().ok().map(|n| (n, n)),
    };
    parsed
        .filter(|(lo, hi)| lo <= hi && *hi <= 3600)
        .ok_or_else(|| "expected seconds LO-HI, LO <= HI <= 3600".to_owned())
}

fn kill_range(text: &str) -> Result<(u64, u64), String> {
    range(text)
        .ok()
        .filter(|(lo, _)| *lo >= 1)
        .ok_or_else(|| "expected seconds LO-HI, 1 <= LO <= HI <= 3600".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Params, String> {
        Params::parse(args.iter().map(|s| (*s).to_owned())).map_err(|e| e.to_string())
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
        let mut twice = base.to_vec();
        twice.extend(["--issues", "50", "--issues", "60"]);
        assert_eq!(parse(&twice).unwrap().issues, 60, "a later option wins");
    }
}
