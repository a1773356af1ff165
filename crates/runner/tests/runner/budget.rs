//! A Codex run is held to its allowance by agentry (docs/budgets.md, "During a run"):
//! through [`LocalRunner`] with the fake `codex`'s `[fake:turns=N]` (several priced turns),
//! `[fake:pause=S]` (a second between them, so a stop that came too early would cut the
//! run short of its later turns) and `[fake:hold=S]` (a long wait after the last, so only a
//! stop ends the run), a local bare repository as the remote, in the sandbox mode of the
//! test suite. The run is stopped after the usage event whose priced cost reaches the
//! allowance, fails with "budget reached", and reports exactly the cost of everything
//! printed before the stop. The overshoot (recorded cost − allowance) is measured: less
//! than the cost of that last event.
#![allow(
    clippy::unwrap_used,
    reason = "clippy.toml's allow-*-in-tests covers #[test] functions, not these helpers"
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{PATH, fake, git, seeded_bare};
use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use agentry_runner::process::Ended;
use agentry_runner::workspace::{GitAuth, RepoSpec, branch_name};
use agentry_runner::{
    AgentOutcome, AgentSpec, Control, Execution, Job, JobKind, LocalConfig, LocalRunner,
    PriceTable, Runner, Sandbox, Verdict,
};
use tempfile::TempDir;
use tokio::sync::watch;
use uuid::Uuid;

const MODEL: &str = "gpt-5-codex";

/// How long the fake waits after its last turn: far longer than any test waits, so a run
/// that ends before it was stopped by agentry.
const HOLD_SECS: u64 = 300;

/// The priced cost after turn `k` of `[fake:turns=N]` with gpt-5-codex: turn j uses
/// j × (2000 input of which 500 cached, 300 output) tokens, and one such unit costs
/// (1500 × 1.25 + 500 × 0.125 + 300 × 10) / 10⁶ = 0.0049375 USD.
fn cumulative(k: i64) -> Usd {
    Usd::from_nanos(4_937_500 * k * (k + 1) / 2).unwrap()
}

fn usd(text: &str) -> Usd {
    Usd::parse(text).unwrap()
}

/// A data directory next to a bare repository with a README on `main`.
struct Rig {
    _dir: TempDir,
    root: PathBuf,
    bare: PathBuf,
    runner: Arc<LocalRunner>,
}

impl Rig {
    fn new() -> Rig {
        let dir = TempDir::new().unwrap();
        let (bare, _) = seeded_bare(dir.path(), "seed");
        let root = dir.path().join("agentry");
        std::fs::create_dir_all(&root).unwrap();
        let runner = Arc::new(LocalRunner::new(LocalConfig {
            root: root.clone(),
            claude_bin: fake("claude"),
            codex_bin: fake("codex"),
            prices: PriceTable::builtin(),
            env: agentry_runner::agent::ServiceEnv {
                path: Some(PATH.into()),
                ..Default::default()
            },
            stop_grace: Duration::from_secs(1),
            sandbox: Sandbox::new(agentry_runner::sandbox::mode_for_tests()),
        }));
        Rig {
            _dir: dir,
            root,
            bare,
            runner,
        }
    }

    fn job(&self, task_id: Uuid, model: &str, allowance: Option<Usd>, prompt: &str) -> Job {
        Job {
            task_id,
            attempt: 1,
            kind: JobKind::Coding {
                commit_message: "agent work".into(),
            },
            repo: RepoSpec {
                key: "repo-1".into(),
                clone_url: self.bare.to_str().unwrap().to_owned(),
                default_branch: "main".into(),
                host: "github.com".into(),
                allow_local: true,
            },
            agent: AgentSpec {
                agent_type: AgentType::Codex,
                model: model.into(),
                max_turns: None,
                max_budget_usd: allowance,
            },
            prompt: prompt.to_owned(),
            auth: GitAuth::none(),
            wall_time: Duration::from_secs(600),
        }
    }

    async fn run(&self, job: Job) -> Execution {
        let (_cancel, cancel) = watch::channel(false);
        self.runner
            .execute(
                job,
                Control {
                    cancel,
                    started: None,
                },
            )
            .await
    }

    fn home(&self, task_id: Uuid) -> PathBuf {
        self.root
            .join("runs")
            .join(task_id.to_string())
            .join("1/home")
    }

    fn remote_branch(&self, task_id: Uuid) -> String {
        git(
            &[
                "branch",
                "--list",
                "--format=%(objectname)",
                &branch_name(task_id),
            ],
            &self.bare,
        )
    }
}

fn failure(execution: &Execution) -> &str {
    match &execution.verdict {
        Verdict::Failed(message) => message,
        other => panic!(
            "expected a failure, got {other:?}; output: {}",
            execution.output
        ),
    }
}

/// Runs `turns` turns, a second apart, then a long hold, under `allowance`, which the last
/// turn's usage event reaches, and checks the stop: the run ended by it, the recorded cost
/// exactly the priced usage of all the turns, nothing committed or pushed. Returns the
/// measured overshoot.
async fn stopped_after(allowance: Usd, turns: i64) -> Usd {
    let rig = Rig::new();
    let task_id = Uuid::new_v4();
    let prompt = format!("Costly work [fake:turns={turns}] [fake:pause=1] [fake:hold={HOLD_SECS}]");
    let started = Instant::now();
    let execution = rig
        .run(rig.job(task_id, MODEL, Some(allowance), &prompt))
        .await;
    let elapsed = started.elapsed();

    // Only the stop can have ended it this early: the fake holds after its last turn.
    assert!(elapsed < Duration::from_secs(HOLD_SECS / 2), "{elapsed:?}");
    assert_eq!(
        execution.ended,
        Some(Ended::Stopped),
        "{}",
        execution.output
    );
    let message = failure(&execution);
    assert!(message.starts_with("budget reached: "), "{message}");
    let cost = cumulative(turns);
    assert!(
        message.contains(&format!("reached {cost} USD"))
            && message.contains(&format!("limit was {allowance} USD")),
        "{message}"
    );
    let report = execution.report.as_ref().unwrap();
    assert_eq!(report.outcome, AgentOutcome::MaxBudget);
    assert_eq!(report.turns, Some(i32::try_from(turns).unwrap()));
    assert_eq!(report.cost_usd, Some(cost), "{:?}", report.warnings);
    let units = turns * (turns + 1) / 2;
    assert_eq!(
        (
            report.input_tokens,
            report.cache_read_tokens,
            report.output_tokens
        ),
        (2000 * units, 500 * units, 300 * units)
    );
    // The output ends with the usage event that reached the allowance.
    let last = execution
        .output
        .lines()
        .rfind(|line| line.starts_with('{'))
        .unwrap();
    assert!(last.contains("\"turn.completed\""), "{}", execution.output);
    assert_eq!(
        execution.output.matches("\"turn.started\"").count(),
        usize::try_from(turns).unwrap()
    );
    // A stopped run publishes nothing.
    assert!(rig.remote_branch(task_id).is_empty());

    // The overshoot: what was spent beyond the allowance, never more than the last event.
    let overshoot = Usd::from_nanos(cost.to_nanos() - allowance.to_nanos()).unwrap();
    let last_event = Usd::from_nanos(cost.to_nanos() - cumulative(turns - 1).to_nanos()).unwrap();
    assert!(overshoot < last_event, "{overshoot} ≥ {last_event}");
    overshoot
}

/// An allowance between the cumulative costs of turns 2 and 3: the run goes on past turns
/// 1 and 2, is stopped after turn 3's usage event, and the overshoot is that turn's cost
/// minus what was left of the allowance.
#[tokio::test]
async fn a_codex_run_is_stopped_after_the_usage_event_that_passes_its_allowance() {
    // Cumulative: 0.0049375, 0.0148125, 0.029625, 0.049375, 0.0740625.
    let allowance = usd("0.02");
    let overshoot = stopped_after(allowance, 3).await;
    // 0.029625 − 0.02: the third turn (0.0148125) began with 0.0051875 left.
    assert_eq!(overshoot, usd("0.009625"));
}

/// An allowance that the priced usage reaches exactly stops the run there, with nothing
/// spent beyond it.
#[tokio::test]
async fn a_codex_run_whose_usage_reaches_its_allowance_exactly_is_stopped_without_overshoot() {
    let overshoot = stopped_after(cumulative(2), 2).await;
    assert_eq!(overshoot, Usd::ZERO);
}

/// A run whose priced usage stays under its allowance runs to its end and is published.
#[tokio::test]
async fn a_codex_run_under_its_allowance_finishes() {
    let rig = Rig::new();
    let task_id = Uuid::new_v4();
    let execution = rig
        .run(rig.job(
            task_id,
            MODEL,
            Some(usd("0.05")),
            "Affordable work [fake:turns=4]",
        ))
        .await;
    assert!(
        matches!(execution.verdict, Verdict::Pushed { .. }),
        "{:?}: {}",
        execution.verdict,
        execution.output
    );
    let report = execution.report.as_ref().unwrap();
    assert_eq!(report.outcome, AgentOutcome::Success);
    assert_eq!(report.cost_usd, Some(cumulative(4)));
    assert_eq!(report.turns, Some(4));
    assert!(!rig.remote_branch(task_id).is_empty());
}

/// The allowance of a Codex run on a model without a price cannot be enforced: the run
/// fails before its agent starts, saying so.
#[tokio::test]
async fn a_capped_codex_run_of_an_unpriced_model_does_not_start() {
    let rig = Rig::new();
    let task_id = Uuid::new_v4();
    let execution = rig
        .run(rig.job(task_id, "gpt-9-unpriced", Some(usd("1")), "Anything"))
        .await;
    let message = failure(&execution);
    assert!(
        message.starts_with("budget not enforceable: ")
            && message.contains("gpt-9-unpriced")
            && message.contains("AGENTRY_PRICES_FILE"),
        "{message}"
    );
    assert_eq!(execution.ended, None);
    assert!(execution.report.is_none());
    // The fake writes its arguments first thing: it never ran.
    assert!(!rig.home(task_id).join("args").exists());

    // Without an allowance the same model runs (its cost unknown, as before).
    let task_id = Uuid::new_v4();
    let execution = rig
        .run(rig.job(task_id, "gpt-9-unpriced", None, "Anything"))
        .await;
    assert!(
        matches!(execution.verdict, Verdict::Pushed { .. }),
        "{:?}",
        execution.verdict
    );
    assert_eq!(execution.report.unwrap().cost_usd, None);
}
