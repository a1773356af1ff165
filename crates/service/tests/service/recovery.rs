//! Recovering a task whose runner stopped renewing its lease: what is left of the run is
//! stopped only once the lease is taken.

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
