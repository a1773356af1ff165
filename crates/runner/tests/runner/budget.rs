//! A Codex run is held to its allowance by agentry (docs/budgets.md, "During a run"):
//! through [`LocalRunner`] with the fake `codex`'s `[fake:turns=N]` (N priced model calls in
//! one turn, call k costing k units), `[fake:pause=S]` (a wait between calls, longer than the
//! runner's [`POLL_INTERVAL`], so a stop that came a call too late would show the later
//! calls) and `[fake:hold=S]` (a long wait after the last call, before the one `turn.completed`
//! that Codex prints at the very end, so only a stop ends the run), a local bare repository
//! as the remote, in the sandbox mode of the test suite. As the real CLI, the fake prints no
//! usage until the end: the runner prices each call from the `token_usage_record` lines of
//! the run's Codex session file, which it reads every [`POLL_INTERVAL`]. The run is stopped
//! once the priced calls reach the allowance, fails with "budget reached", and records
//! exactly the cost of the calls it made. The overshoot (recorded cost − allowance) is
//! measured: less than the cost of that last call.

use std::time::{Duration, Instant};

use crate::sandbox::{self, failure};
use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use agentry_runner::process::{Ended, POLL_INTERVAL};
use agentry_runner::{AgentOutcome, AgentSpec, Control, Execution, Job, Runner, Sandbox, Verdict};
use agentry_testkit::wait::eventually_async;
use tokio::sync::watch;
use uuid::Uuid;

const MODEL: &str = "gpt-5-codex";

/// How long the fake waits after its last call: far longer than any test waits, so a run
/// that ends before it was stopped by agentry.
const HOLD_SECS: u64 = 300;

/// The fake's wait between calls: three polls of the session file, so the stop after the
/// call that reaches the allowance comes before the next call.
fn pause_secs() -> u64 {
    3 * POLL_INTERVAL.as_secs().max(1)
}

/// The priced cost after call `k` of `[fake:turns=N]` with gpt-5-codex: call j uses
/// j × (2000 input of which 500 cached, 300 output) tokens, and one such unit costs
/// (1500 × 1.25 + 500 × 0.125 + 300 × 10) / 10⁶ = 0.0049375 USD.
fn cumulative(k: i64) -> Usd {
    Usd::from_nanos(4_937_500 * k * (k + 1) / 2).unwrap()
}

fn usd(text: &str) -> Usd {
    Usd::parse(text).unwrap()
}

/// The shared rig with a runner sandboxed as the tests' mode asks.
type Rig = sandbox::RunnerRig;

fn rig() -> Rig {
    Rig::new(Sandbox::new(crate::sandbox::sandbox_mode()))
}

impl Rig {
    /// A Codex job on `model` with the allowance `allowance`.
    fn codex_job(&self, task_id: Uuid, model: &str, allowance: Option<Usd>, prompt: &str) -> Job {
        Job {
            agent: AgentSpec {
                max_budget_usd: allowance,
                ..AgentSpec::unlimited(AgentType::Codex, model)
            },
            wall_time: Duration::from_secs(600),
            ..self.job(task_id, prompt)
        }
    }

    async fn run(&self, job: Job) -> Execution {
        let (_cancel, cancel) = watch::channel(false);
        self.run_until(job, cancel).await
    }

    /// Runs `job`, cancelled when `cancel` turns true.
    async fn run_until(&self, job: Job, cancel: watch::Receiver<bool>) -> Execution {
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

    /// The usage records of the Codex session files of a task's first attempt.
    fn calls_recorded(&self, task_id: Uuid) -> Vec<serde_json::Value> {
        let mut found = Vec::new();
        let mut dirs = vec![self.home(task_id).join(".codex/sessions")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    found.extend(
                        text.lines()
                            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                            .filter(|l| l["type"] == "token_usage_record"),
                    );
                }
            }
        }
        found
    }
}

/// Runs `calls` model calls, [`pause_secs`] apart, then a long hold, under `allowance`,
/// which the priced calls reach at call `stop`, and checks the stop: the run ended by it
/// right after that call (the later calls never made), the recorded cost exactly the priced
/// usage of the calls made, no usage printed (Codex prints it only at the end), nothing
/// committed or pushed. Returns the measured overshoot.
async fn stopped_after(allowance: Usd, calls: i64, stop: i64) -> Usd {
    let rig = rig();
    let task_id = Uuid::new_v4();
    let prompt = format!(
        "Costly work [fake:turns={calls}] [fake:pause={}] [fake:hold={HOLD_SECS}]",
        pause_secs()
    );
    let started = Instant::now();
    let execution = rig
        .run(rig.codex_job(task_id, MODEL, Some(allowance), &prompt))
        .await;
    let elapsed = started.elapsed();

    // Only the stop can have ended it this early: the fake holds after its last call.
    assert!(elapsed < Duration::from_secs(HOLD_SECS / 2), "{elapsed:?}");
    assert_eq!(
        execution.ended,
        Some(Ended::Stopped),
        "{}",
        execution.output
    );
    let message = failure(&execution);
    assert!(message.starts_with("budget reached: "), "{message}");
    let cost = cumulative(stop);
    assert!(
        message.contains(&format!("reached {cost} USD"))
            && message.contains(&format!("limit was {allowance} USD")),
        "{message}"
    );
    let report = execution.report.as_ref().unwrap();
    assert_eq!(report.outcome, AgentOutcome::MaxBudget);
    assert_eq!(report.cost_usd, Some(cost), "{:?}", report.warnings);
    let units = stop * (stop + 1) / 2;
    assert_eq!(
        (
            report.tokens.input,
            report.tokens.cache_read,
            report.tokens.output
        ),
        (2000 * units, 500 * units, 300 * units)
    );
    // Codex printed no usage (a stopped run never does): the cost is the session file's.
    // Turns count the model calls Codex recorded.
    assert!(
        !execution.output.contains("\"turn.completed\""),
        "{}",
        execution.output
    );
    assert_eq!(report.turns, Some(i32::try_from(stop).unwrap()));
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains(&format!("the {stop} model calls"))),
        "{:?}",
        report.warnings
    );
    // The calls made: `stop` of them, none after the one that reached the allowance.
    let recorded = rig.calls_recorded(task_id);
    assert_eq!(
        recorded.len(),
        usize::try_from(stop).unwrap(),
        "{recorded:?}"
    );
    assert_eq!(
        execution.output.matches("\"agent_message\"").count(),
        usize::try_from(stop).unwrap(),
        "{}",
        execution.output
    );
    // A stopped run publishes nothing.
    assert!(rig.remote_branch(task_id).is_empty());

    // The overshoot: what was spent beyond the allowance, less than the last call.
    let overshoot = Usd::from_nanos(cost.to_nanos() - allowance.to_nanos()).unwrap();
    let last_call = Usd::from_nanos(cost.to_nanos() - cumulative(stop - 1).to_nanos()).unwrap();
    assert!(overshoot < last_call, "{overshoot} ≥ {last_call}");
    overshoot
}

/// An allowance between the cumulative costs of calls 2 and 3 of 5: the run goes on past
/// calls 1 and 2, is stopped after call 3 (before call 4, a pause later), and the overshoot
/// is that call's cost minus what was left of the allowance.
#[tokio::test]
async fn a_codex_run_is_stopped_after_the_model_call_that_passes_its_allowance() {
    // Cumulative: 0.0049375, 0.0148125, 0.029625, 0.049375, 0.0740625.
    let allowance = usd("0.02");
    let overshoot = stopped_after(allowance, 5, 3).await;
    // 0.029625 − 0.02: the third call (0.0148125) began with 0.0051875 left.
    assert_eq!(overshoot, usd("0.009625"));
}

/// An allowance that the priced calls reach exactly stops the run there, with nothing
/// spent beyond it.
#[tokio::test]
async fn a_codex_run_whose_usage_reaches_its_allowance_exactly_is_stopped_without_overshoot() {
    let overshoot = stopped_after(cumulative(2), 4, 2).await;
    assert_eq!(overshoot, Usd::ZERO);
}

/// The stop also works when the call that reaches the allowance is the last one, during the
/// hold before Codex would print its usage (the shape of `a_codex_run_is_stopped_at_its_allowance`
/// in the API's tests).
#[tokio::test]
async fn a_codex_run_reaching_its_allowance_on_its_last_call_is_stopped_before_its_usage() {
    let overshoot = stopped_after(usd("0.02"), 3, 3).await;
    assert_eq!(overshoot, usd("0.009625"));
}

/// A run whose priced usage stays under its allowance runs to its end and is published; its
/// usage printed at the end agrees with its session file.
#[tokio::test]
async fn a_codex_run_under_its_allowance_finishes() {
    let rig = rig();
    let task_id = Uuid::new_v4();
    let execution = rig
        .run(rig.codex_job(
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
    // Four model calls (turns count them), the usage printed once at the end.
    assert_eq!(report.turns, Some(4));
    assert_eq!(execution.output.matches("\"turn.completed\"").count(), 1);
    assert_eq!(rig.calls_recorded(task_id).len(), 4);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert!(!rig.remote_branch(task_id).is_empty());
}

/// A Codex run cancelled before its usage was printed is priced from its session file: the
/// calls it made, exactly.
#[tokio::test]
async fn a_cancelled_codex_run_records_the_cost_of_its_calls() {
    let rig = rig();
    let task_id = Uuid::new_v4();
    let (cancel, cancelled) = watch::channel(false);
    let job = rig.codex_job(
        task_id,
        MODEL,
        None,
        &format!("Long work [fake:turns=2] [fake:hold={HOLD_SECS}]"),
    );
    let run = rig.run_until(job, cancelled);
    let watch = async {
        eventually_async(Duration::from_secs(60), "both calls recorded", async || {
            rig.calls_recorded(task_id).len() >= 2
        })
        .await;
        cancel.send(true).unwrap();
    };
    let (execution, ()) = tokio::join!(run, watch);
    assert_eq!(execution.verdict, Verdict::Cancelled);
    assert_eq!(execution.ended, Some(Ended::Cancelled));
    assert!(!execution.output.contains("\"turn.completed\""));
    let report = execution.report.as_ref().unwrap();
    assert_eq!(
        report.cost_usd,
        Some(cumulative(2)),
        "{:?}",
        report.warnings
    );
    assert_eq!(report.tokens.output, 300 * 3);
    assert!(rig.remote_branch(task_id).is_empty());
}

/// The allowance of a Codex run on a model without a price cannot be enforced: the run
/// fails before its agent starts, saying so.
#[tokio::test]
async fn a_capped_codex_run_of_an_unpriced_model_does_not_start() {
    let rig = rig();
    let task_id = Uuid::new_v4();
    let execution = rig
        .run(rig.codex_job(task_id, "gpt-9-unpriced", Some(usd("1")), "Anything"))
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

    // Without an allowance the same model runs (its cost unknown, as before), its calls
    // recorded but not priced.
    let task_id = Uuid::new_v4();
    let execution = rig
        .run(rig.codex_job(task_id, "gpt-9-unpriced", None, "Anything"))
        .await;
    assert!(
        matches!(execution.verdict, Verdict::Pushed { .. }),
        "{:?}",
        execution.verdict
    );
    assert_eq!(rig.calls_recorded(task_id).len(), 1);
    let report = execution.report.unwrap();
    assert_eq!(report.cost_usd, None);
    assert!(
        report
            .cost_unknown
            .as_deref()
            .is_some_and(|why| why.contains("gpt-9-unpriced")),
        "{:?}",
        report.cost_unknown
    );
}
