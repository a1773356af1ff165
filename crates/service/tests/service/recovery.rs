//! Recovering a task whose runner stopped renewing its lease (what is left of the run is
//! stopped only once the lease is taken), and a run going on through a busy database.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agentry_domain::{TaskState, TaskType};
use agentry_persistence::secrets::MasterKey;
use agentry_persistence::test_support::TestDb;
use agentry_persistence::{Db, runner as claims};
use agentry_runner::job::ExecutionFuture;
use agentry_runner::{AgentSpec, Control, Job, Runner, Salvaged};
use agentry_service::Service;
use agentry_service::runs::{RunSettings, Runs};
use agentry_test_rigs::rig;
use time::Duration;
use uuid::Uuid;

/// A runner that runs nothing. While a run's leftovers are read (`salvage`) its owner, only
/// late, renews the lease, as long as `owner_alive`; what it reaps is kept.
struct LateOwner {
    db: Db,
    owner: String,
    owner_alive: AtomicBool,
    reaped: Mutex<Vec<(Uuid, i32)>>,
}

impl Runner for LateOwner {
    fn execute(&self, _job: Job, _control: Control) -> ExecutionFuture<'_> {
        unreachable!("no run starts in this test")
    }

    fn salvage(&self, task_id: Uuid, attempt: i32, _agent: &AgentSpec) -> Option<Salvaged> {
        if self.owner_alive.load(Ordering::SeqCst) {
            let mut conn = self.db.conn().unwrap();
            let until = agentry_persistence::now() + Duration::minutes(10);
            assert!(claims::renew_lease(&mut conn, task_id, attempt, &self.owner, until).unwrap());
        }
        None
    }

    fn reap(&self, task_id: Uuid, attempt: i32) {
        self.reaped.lock().unwrap().push((task_id, attempt));
    }
}

// A replica that only missed its renewals (a database pause) keeps its run: the recoverer
// stops nothing before its compare-and-set on the lease wins. Before, the Kubernetes runner
// deleted the run's Job while reading its leftovers, and the live run failed "stopped by
// the cluster".
#[tokio::test]
async fn a_run_whose_owner_was_only_late_renewing_is_not_stopped() {
    let test_db = TestDb::sqlite();
    let db = test_db.db.clone();
    let start = agentry_persistence::now();
    let new = rig::new_task("https://github.com/acme/web", TaskType::Coding, start);
    let task = rig::create(&db, &new);
    let owner = "agentry-other-replica".to_owned();
    {
        let mut conn = db.conn().unwrap();
        let claimed = claims::claim_next(&mut conn, &owner, start, Duration::seconds(60))
            .unwrap()
            .unwrap();
        assert_eq!(claimed.id, task.id);
    }
    let runner = Arc::new(LateOwner {
        db: db.clone(),
        owner,
        owner_alive: AtomicBool::new(true),
        reaped: Mutex::new(Vec::new()),
    });
    let service = Service::new(
        db.clone(),
        MasterKey::generate().unwrap(),
        rig::no_code_host(),
        Runs::new(runner.clone(), RunSettings::default()),
    );
    let state = || {
        let mut conn = db.conn().unwrap();
        let t = agentry_persistence::tasks::get_task(&mut conn, task.id).unwrap();
        (t.state, t.attempt)
    };
    // The lease looks expired; while its leftovers are read, its owner renews it.
    let recovered = service.recover_expired(start + Duration::seconds(61)).await;
    assert_eq!(recovered.unwrap(), 0);
    assert!(
        runner.reaped.lock().unwrap().is_empty(),
        "a live run was stopped"
    );
    assert_eq!(state(), (TaskState::Provisioning, 1));

    // Once the owner has really stopped, the lease is taken, then the run reaped.
    runner.owner_alive.store(false, Ordering::SeqCst);
    let recovered = service.recover_expired(start + Duration::minutes(20)).await;
    assert_eq!(recovered.unwrap(), 1);
    assert_eq!(*runner.reaped.lock().unwrap(), [(task.id, 1)]);
    assert_eq!(state(), (TaskState::Queued, 2));
}

/// A runner that runs nothing and whose dead runs left what `left` holds, by task and
/// attempt (nothing for the others).
#[derive(Default)]
struct DeadRuns {
    left: Mutex<HashMap<(Uuid, i32), Salvaged>>,
}

impl Runner for DeadRuns {
    fn execute(&self, _job: Job, _control: Control) -> ExecutionFuture<'_> {
        unreachable!("no run starts in this test")
    }

    fn salvage(&self, task_id: Uuid, attempt: i32, _agent: &AgentSpec) -> Option<Salvaged> {
        self.left.lock().unwrap().get(&(task_id, attempt)).cloned()
    }
}

/// What a Claude Code run that printed `tokens` input tokens and cost `cost` left.
fn left_by_claude(cost: &str, input_tokens: i64, metered: bool) -> Salvaged {
    let line = format!(
        r#"{{"type":"result","subtype":"success","num_turns":1,"result":"Done.","total_cost_usd":{cost}}}"#
    );
    let mut report = agentry_runner::parse_claude(&line);
    report.tokens = agentry_runner::Tokens {
        input: input_tokens,
        output: 1,
        ..Default::default()
    };
    Salvaged {
        output: format!("{line}\n"),
        report,
        metered,
    }
}

fn service_over(db: &agentry_persistence::Db, runner: Arc<DeadRuns>) -> Service {
    Service::new(
        db.clone(),
        MasterKey::generate().unwrap(),
        rig::no_code_host(),
        Runs::new(runner, RunSettings::default()),
    )
}

fn claim(db: &agentry_persistence::Db, at: time::OffsetDateTime) -> agentry_domain::Task {
    claim_for(db, at, Duration::seconds(60))
}

fn claim_for(
    db: &agentry_persistence::Db,
    at: time::OffsetDateTime,
    lease: Duration,
) -> agentry_domain::Task {
    let mut conn = db.conn().unwrap();
    claims::claim_next(&mut conn, "agentry-dead-replica", at, lease)
        .unwrap()
        .unwrap()
}

fn state_of(db: &agentry_persistence::Db, id: Uuid) -> (TaskState, i32) {
    let t = agentry_persistence::tasks::get_task(&mut db.conn().unwrap(), id).unwrap();
    (t.state, t.attempt)
}

/// A task claimed by a replica that then died, and a service over [`DeadRuns`] to recover it.
struct DeadClaim {
    /// Kept for its files: the database goes with it.
    _test_db: TestDb,
    db: agentry_persistence::Db,
    start: time::OffsetDateTime,
    task: agentry_domain::Task,
    runner: Arc<DeadRuns>,
    service: Service,
}

fn dead_claim() -> DeadClaim {
    let test_db = TestDb::sqlite();
    let db = test_db.db.clone();
    let start = agentry_persistence::now();
    let task = rig::create(
        &db,
        &rig::new_task("https://github.com/acme/web", TaskType::Coding, start),
    );
    let runner = Arc::new(DeadRuns::default());
    let service = service_over(&db, runner.clone());
    assert_eq!(claim(&db, start).id, task.id);
    DeadClaim {
        _test_db: test_db,
        db,
        start,
        task,
        runner,
        service,
    }
}

// A dead run whose leftovers cannot be recorded (here its tokens overflow the task's) is
// recovered all the same, without those figures, and the leases behind it too. Before, the
// first error ended the pass, and being oldest that lease came first in every pass: no dead
// run was recovered any more, and that task stayed in progress with its reserve held.
#[tokio::test]
async fn a_dead_run_whose_figures_cannot_be_recorded_is_recovered_without_them() {
    let test_db = TestDb::sqlite();
    let db = test_db.db.clone();
    let start = agentry_persistence::now();
    let a = rig::create(
        &db,
        &rig::new_task("https://github.com/acme/web", TaskType::Coding, start),
    );
    let b = rig::new_task(
        "https://github.com/acme/web",
        TaskType::Coding,
        start + Duration::seconds(1),
    );
    let b = rig::create(&db, &b);
    let runner = Arc::new(DeadRuns::default());
    let service = service_over(&db, runner.clone());
    // A's first attempt dies having used 10 input tokens.
    assert_eq!(claim(&db, start).id, a.id);
    runner
        .left
        .lock()
        .unwrap()
        .insert((a.id, 1), left_by_claude("0.01", 10, false));
    let recovered = service.recover_expired(start + Duration::minutes(2)).await;
    assert_eq!(recovered.unwrap(), 1);
    assert_eq!(state_of(&db, a.id), (TaskState::Queued, 2));
    // Its second attempt dies printing a count the task's total cannot hold; B dies too, its
    // lease expiring after A's (the oldest expiry is recovered first).
    let later = start + Duration::minutes(3);
    assert_eq!(claim_for(&db, later, Duration::minutes(1)).id, a.id);
    assert_eq!(claim_for(&db, later, Duration::minutes(5)).id, b.id);
    runner
        .left
        .lock()
        .unwrap()
        .insert((a.id, 2), left_by_claude("0.01", i64::MAX - 5, false));
    let recovered = service.recover_expired(start + Duration::minutes(10)).await;
    assert_eq!(recovered.unwrap(), 2, "A, then B behind it");
    assert_eq!(state_of(&db, a.id), (TaskState::Queued, 3));
    assert_eq!(state_of(&db, b.id), (TaskState::Queued, 2));
    let mut conn = db.conn().unwrap();
    let runs = agentry_persistence::tasks::task_runs(&mut conn, a.id).unwrap();
    assert_eq!(runs.len(), 1, "only the first attempt's figures: {runs:?}");
    let a = agentry_persistence::tasks::get_task(&mut conn, a.id).unwrap();
    assert_eq!(a.input_tokens, 10);
}

// A dead run whose calls went through the gateway costs what the gateway metered: with no
// call metered, nothing, whatever the agent printed (it runs inside the sandbox and may print
// anything). Before, the printed figure was recorded as spent when no call was on record.
#[tokio::test]
async fn a_metered_dead_run_without_calls_costs_nothing_whatever_it_printed() {
    let c = dead_claim();
    c.runner
        .left
        .lock()
        .unwrap()
        .insert((c.task.id, 1), left_by_claude("9223372036", 1_000, true));
    let recovered = c
        .service
        .recover_expired(c.start + Duration::minutes(2))
        .await;
    assert_eq!(recovered.unwrap(), 1);
    let mut conn = c.db.conn().unwrap();
    let runs = agentry_persistence::tasks::task_runs(&mut conn, c.task.id).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(
        run.cost_usd.map(|c| c.to_string()),
        Some("0".to_owned()),
        "{run:?}"
    );
    assert_eq!(run.model_calls, Some(0));
    assert_eq!(run.tokens.input, 0);
    assert_eq!(
        run.reported_cost_usd.map(|c| c.to_string()),
        Some("9223372036".to_owned())
    );
    let after = agentry_persistence::tasks::get_task(&mut conn, c.task.id).unwrap();
    assert_eq!(after.cost_usd.map(|c| c.to_string()), Some("0".to_owned()));
}

/// A runner whose agent starts while another writer holds SQLite's write lock for
/// `held` (an import, another process), then ends with no change once its task is running
/// or it is told to stop; it says whether it was told to stop.
struct BusyAtStart {
    file: std::path::PathBuf,
    db: agentry_persistence::Db,
    held: std::time::Duration,
    stopped: AtomicBool,
}

impl Runner for BusyAtStart {
    fn execute(&self, job: Job, mut control: Control) -> ExecutionFuture<'_> {
        Box::pin(async move {
            use diesel::Connection as _;
            use diesel::connection::SimpleConnection as _;
            let started_at = agentry_persistence::now();
            let mut other =
                diesel::SqliteConnection::establish(self.file.to_str().unwrap()).unwrap();
            other.batch_execute("BEGIN IMMEDIATE").unwrap();
            control.started.take().unwrap().send(()).unwrap();
            // The other writer's transaction lasts `held`: the contention itself, not a wait
            // for a condition. The first try always meets it (the lock is taken before the
            // start is signalled), and the service keeps trying for about 8 s, far past it,
            // however slow the machine.
            tokio::time::sleep(self.held).await;
            other.batch_execute("COMMIT").unwrap();
            let db = self.db.clone();
            let cancel = control.cancel.clone();
            let stopped = tokio::task::spawn_blocking(move || {
                agentry_testkit::wait::eventually(
                    std::time::Duration::from_secs(30),
                    "the task running or the agent stopped",
                    || {
                        *cancel.borrow()
                            || agentry_persistence::tasks::get_task(
                                &mut db.conn().unwrap(),
                                job.task_id,
                            )
                            .unwrap()
                            .state
                                == TaskState::Running
                    },
                );
                *cancel.borrow()
            })
            .await
            .unwrap();
            self.stopped.store(stopped, Ordering::SeqCst);
            agentry_runner::Execution {
                verdict: if stopped {
                    agentry_runner::Verdict::Cancelled
                } else {
                    agentry_runner::Verdict::NoChanges
                },
                agent_type: job.agent.agent_type,
                report: None,
                ended: None,
                output: String::new(),
                sandboxed: false,
                metered: false,
                started_at,
                finished_at: agentry_persistence::now(),
            }
        })
    }
}

// The database busy for a moment as the agent starts (SQLite's write lock held by another
// writer past the busy timeout): the task's move to running is tried again, and the run goes
// on. Before, the first failure stopped the agent, and the task waited in provisioning for
// its lease to expire and its agent to run again.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_database_as_the_agent_starts_does_not_stop_it() {
    let test_db = TestDb::sqlite();
    let file = test_db.url.strip_prefix("sqlite://").unwrap().into();
    let db = agentry_persistence::Db::connect_with(
        &test_db.url,
        8,
        std::time::Duration::from_millis(200),
    )
    .unwrap();
    let key = MasterKey::generate().unwrap();
    agentry_persistence::secrets::put(
        &mut db.conn().unwrap(),
        &key,
        "CODEHOST_TOKEN",
        &agentry_persistence::secrets::SecretValue::new("ghp_token"),
        agentry_persistence::now(),
    )
    .unwrap();
    let repo = rig::connect_url(&db, "https://github.com/acme/web");
    let new = agentry_persistence::tasks::NewTask {
        repo_id: Some(repo),
        ..rig::new_task(
            "https://github.com/acme/web",
            TaskType::Coding,
            agentry_persistence::now(),
        )
    };
    let task = rig::create(&db, &new);
    let runner = Arc::new(BusyAtStart {
        file,
        db: db.clone(),
        held: std::time::Duration::from_millis(1500),
        stopped: AtomicBool::new(false),
    });
    let service = Service::new(
        db.clone(),
        key,
        rig::no_code_host(),
        Runs::new(runner.clone(), RunSettings::default()),
    );
    assert_eq!(service.run_next().await.unwrap(), Some(task.id));
    assert!(
        !runner.stopped.load(Ordering::SeqCst),
        "the agent was stopped"
    );
    let after = agentry_persistence::tasks::get_task(&mut db.conn().unwrap(), task.id).unwrap();
    assert_eq!(after.state, TaskState::Failed, "{after:?}");
    assert!(
        after
            .error_message
            .as_deref()
            .is_some_and(|m| m.contains("no changes")),
        "{after:?}"
    );
}

// A task cancelled while its runner was dead: its attempt's metered calls still count, once
// the lease it kept expires. Before, the cancel dropped the lease, recovery never looked at
// the task again, and what the dead run had spent was in no run, task or month.
#[tokio::test]
async fn a_cancelled_run_whose_runner_died_still_costs_its_calls() {
    let c = dead_claim();
    {
        let mut conn = c.db.conn().unwrap();
        let call = agentry_persistence::test_support::model_call(
            c.task.id,
            1,
            agentry_domain::Usd::parse("0.30").unwrap(),
        );
        agentry_persistence::metering::record_held_call(
            &mut conn,
            &call,
            agentry_domain::Usd::ZERO,
        )
        .unwrap();
        let none = agentry_persistence::tasks::TransitionDetails::default();
        agentry_persistence::tasks::transition_task(
            &mut conn,
            c.task.id,
            agentry_domain::Trigger::Cancel,
            &none,
            c.start + Duration::seconds(5),
        )
        .unwrap();
    }
    // Before the lease expires its c.runner may still record the run itself: nothing is done.
    assert_eq!(
        c.service
            .recover_expired(c.start + Duration::seconds(30))
            .await
            .unwrap(),
        0
    );
    assert!(
        agentry_persistence::tasks::task_runs(&mut c.db.conn().unwrap(), c.task.id)
            .unwrap()
            .is_empty()
    );
    c.service
        .recover_expired(c.start + Duration::minutes(2))
        .await
        .unwrap();
    let mut conn = c.db.conn().unwrap();
    let runs = agentry_persistence::tasks::task_runs(&mut conn, c.task.id).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].cost_usd.map(|c| c.to_string()),
        Some("0.3".to_owned())
    );
    assert_eq!(runs[0].model_calls, Some(1));
    let after = agentry_persistence::tasks::get_task(&mut conn, c.task.id).unwrap();
    assert_eq!(after.state, TaskState::Cancelled);
    assert_eq!(
        after.cost_usd.map(|c| c.to_string()),
        Some("0.3".to_owned())
    );
    // Released once: a later pass finds nothing.
    drop(conn);
    c.service
        .recover_expired(c.start + Duration::minutes(3))
        .await
        .unwrap();
    assert_eq!(
        agentry_persistence::tasks::task_runs(&mut c.db.conn().unwrap(), c.task.id)
            .unwrap()
            .len(),
        1
    );
}

// Retried before the lease its cancel kept expired, a task's stopped attempt is recorded
// from its metered calls as it is queued again (the new claim replaces that lease, so
// recovery could not do it later). Before, a dead runner's spend was lost on such a retry.
#[tokio::test]
async fn a_run_retried_before_its_lease_expired_still_costs_its_calls() {
    let c = dead_claim();
    let none = agentry_persistence::tasks::TransitionDetails::default();
    let mut conn = c.db.conn().unwrap();
    let call = agentry_persistence::test_support::model_call(
        c.task.id,
        1,
        agentry_domain::Usd::parse("0.30").unwrap(),
    );
    agentry_persistence::metering::record_held_call(&mut conn, &call, agentry_domain::Usd::ZERO)
        .unwrap();
    for (trigger, secs) in [
        (agentry_domain::Trigger::Cancel, 5),
        (agentry_domain::Trigger::Retry, 6),
    ] {
        let at = c.start + Duration::seconds(secs);
        agentry_persistence::tasks::transition_task(&mut conn, c.task.id, trigger, &none, at)
            .unwrap();
    }
    let runs = agentry_persistence::tasks::task_runs(&mut conn, c.task.id).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!((runs[0].attempt, runs[0].model_calls), (1, Some(1)));
    let after = agentry_persistence::tasks::get_task(&mut conn, c.task.id).unwrap();
    assert_eq!((after.state, after.attempt), (TaskState::Queued, 2));
    assert_eq!(
        after.cost_usd.map(|c| c.to_string()),
        Some("0.3".to_owned())
    );
}
