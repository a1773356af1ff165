//! The background-work runtime: every loop of the service is a [`BackgroundLoop`] (a name, a
//! `Schedule` and a step function), listed once in [`BackgroundLoop::all`] and run by one
//! driver (`drive`).
//!
//! The driver runs a loop's step, then waits as the step's `Pass` and the schedule say: at
//! once again, until something is due, or the schedule's period; a wake-up from
//! `crate::wake` ends any wait early. A failing step is logged with the loop's name and
//! retried after the schedule's [`Backoff`] (exponential with a cap), the wait growing with
//! each failure in a row. [`crate::Service::start_background`] starts the list and
//! [`crate::Service::shut_down`] stops it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use agentry_domain::backoff::Backoff;
use tokio::task::JoinHandle;

use crate::Service;
use crate::config::Config;
use crate::wake::Loops;

/// How often webhook delivery ids older than their retention are forgotten.
pub(crate) const DELIVERY_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Why a step failed; logged by the driver with the loop's name.
pub(crate) type StepError = Box<dyn std::error::Error + Send + Sync>;

/// What a step returns: how the loop goes on, or why the step failed.
pub(crate) type StepResult = Result<Pass, StepError>;

/// The future of one step.
type StepFuture = Pin<Box<dyn Future<Output = StepResult> + Send>>;

/// A loop's step function: one pass of its work, on a clone of the service.
type Step = Box<dyn FnMut(Service) -> StepFuture + Send>;

/// How a loop goes on after a step that succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Nothing more to do now: wait the schedule's period (or a wake-up).
    Idle,
    /// More work waits: step again at once.
    Again,
    /// The next work is due in this long: wait that (at most the period, at least the
    /// schedule's shortest wait) or a wake-up.
    DueIn(Duration),
    /// The loop has nothing to do in this process (runs disabled, no webhook, stopping).
    Stop,
}

/// When a loop steps: its period, its wake-up and its retry schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// The longest wait between two steps: the interval of a periodic loop, the idle time
    /// of a woken one.
    pub(crate) every: Duration,
    /// Whether the first step waits a period first (else it runs at once).
    pub(crate) wait_first: bool,
    /// The wake-up that ends a wait early, when the loop has one.
    pub(crate) wake: Loops,
    /// The shortest wait after a step, so a loop whose work stays due does not spin.
    pub(crate) min_wait: Duration,
    /// The wait after failed steps: the delay after the first failure in a row, doubling
    /// with each further one up to the cap.
    pub(crate) backoff: Backoff,
    /// Whether a failing step is expected now and then (no token yet, another replica's
    /// work) and logged at debug level rather than as a warning.
    pub(crate) quiet: bool,
}

impl Schedule {
    /// Every `every`, from the first step on; a failure waits the period too.
    pub(crate) fn every(every: Duration) -> Schedule {
        Schedule {
            every,
            wait_first: false,
            wake: Loops::NONE,
            min_wait: Duration::ZERO,
            backoff: Backoff {
                base: every,
                max: every,
            },
            quiet: false,
        }
    }

    /// Woken by `wake`, else every `idle`.
    pub(crate) fn woken(wake: Loops, idle: Duration) -> Schedule {
        Schedule {
            wake,
            ..Schedule::every(idle)
        }
    }

    /// The first step waits a period too.
    pub(crate) fn waiting_first(self) -> Schedule {
        Schedule {
            wait_first: true,
            ..self
        }
    }

    /// At least `min_wait` between two steps.
    pub(crate) fn at_least(self, min_wait: Duration) -> Schedule {
        Schedule { min_wait, ..self }
    }

    /// Failed steps wait `backoff`.
    pub(crate) fn backing_off(self, backoff: Backoff) -> Schedule {
        Schedule { backoff, ..self }
    }

    /// Failures are logged at debug level.
    pub(crate) fn quiet(self) -> Schedule {
        Schedule {
            quiet: true,
            ..self
        }
    }

    /// How long to wait after a step that ended in `pass` (`None`: stop).
    fn wait_after(&self, pass: Pass) -> Option<Duration> {
        match pass {
            Pass::Idle => Some(self.every.max(self.min_wait)),
            Pass::Again => Some(Duration::ZERO),
            Pass::DueIn(due) => Some(due.min(self.every).max(self.min_wait)),
            Pass::Stop => None,
        }
    }

    /// How long to wait after `failures` failed steps in a row (at least one).
    fn wait_after_failures(&self, failures: u32) -> Duration {
        let before = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
        self.backoff.delay(before).max(self.min_wait)
    }
}

/// A loop's schedule, made from the settings of the service it runs on.
type ScheduleOf = Box<dyn FnOnce(&Service) -> Schedule + Send>;

/// One background loop: its name (for the log), its schedule and its step function.
pub struct BackgroundLoop {
    name: &'static str,
    schedule: ScheduleOf,
    step: Step,
}

impl std::fmt::Debug for BackgroundLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundLoop")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl BackgroundLoop {
    /// The loop `name` stepping `step` on the schedule `schedule` makes of the service.
    pub(crate) fn new<S, F, Fut>(name: &'static str, schedule: S, mut step: F) -> Self
    where
        S: FnOnce(&Service) -> Schedule + Send + 'static,
        F: FnMut(Service) -> Fut + Send + 'static,
        Fut: Future<Output = StepResult> + Send + 'static,
    {
        BackgroundLoop {
            name,
            schedule: Box::new(schedule),
            step: Box::new(move |service| Box::pin(step(service))),
        }
    }

    /// The loop's name, as the log shows it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Every background loop of a service of `config`, in the order they start: the one
    /// list of the service's background work.
    pub fn all(config: &Config) -> Vec<BackgroundLoop> {
        vec![
            BackgroundLoop::runner(),
            BackgroundLoop::recovery(),
            BackgroundLoop::revisions(),
            BackgroundLoop::issue_sync(config.issue_sync_interval),
            BackgroundLoop::outbox(),
            BackgroundLoop::alerts(),
            BackgroundLoop::delivery_pruning(DELIVERY_PRUNE_EVERY),
            BackgroundLoop::pull_request_poll(config.poll_interval, config.database_url.clone()),
        ]
    }

    /// The runner: claims queued tasks into free slots ([`crate::runs`]); woken when a task
    /// may be claimed, else every `RunSettings::idle`.
    pub fn runner() -> BackgroundLoop {
        BackgroundLoop::new(
            "runner",
            |service| Schedule::woken(Loops::RUNNER, service.parts.runs.settings().idle),
            |service| async move { crate::runs::runner_step(&service).await },
        )
    }

    /// Lease recovery: every half lease (at least a second), recovers the tasks whose lease
    /// expired ([`crate::runs`]).
    pub fn recovery() -> BackgroundLoop {
        BackgroundLoop::new(
            "recovery",
            |service| {
                Schedule::every(crate::runs::recovery_every(service.parts.runs.settings()))
                    .waiting_first()
            },
            |service| async move { crate::runs::recovery_step(&service).await },
        )
    }

    /// Revision rounds: starts the rounds whose quiet period has passed
    /// ([`crate::revisions`]).
    pub fn revisions() -> BackgroundLoop {
        BackgroundLoop::new(
            "revisions",
            |_| crate::revisions::schedule(),
            |service| async move { crate::revisions::revision_step(&service).await },
        )
    }

    /// The issue sync ([`crate::codehost`]): every connected repository every `interval`,
    /// and in between, woken by labelled-issue webhooks, the repositories they asked for (at
    /// most one sync running and one more waiting, however many deliveries arrive). Without
    /// a stored token it fails quietly until there is one.
    pub fn issue_sync(interval: Duration) -> BackgroundLoop {
        BackgroundLoop::new(
            "issue sync",
            move |_| Schedule::woken(Loops::ISSUE_SYNC, interval).quiet(),
            move |service| crate::codehost::issue_sync_step(service, interval),
        )
    }

    /// The outbox: delivers code-host effects as they fall due ([`crate::codehost`]).
    pub fn outbox() -> BackgroundLoop {
        BackgroundLoop::new(
            "outbox",
            |service| crate::delivery::schedule(&service.parts.codehost.outbox, Loops::OUTBOX),
            |service| async move { crate::codehost::outbox_step(&service).await },
        )
    }

    /// The budget alerts: checks the budgets once, then delivers due alerts to the webhook
    /// (without one, the check is all) ([`crate::alerts`]).
    pub fn alerts() -> BackgroundLoop {
        let mut checked = false;
        BackgroundLoop::new(
            "alerts",
            |service| crate::delivery::schedule(&service.parts.alerts.delivery, Loops::ALERTS),
            move |service| {
                let first = !std::mem::replace(&mut checked, true);
                async move { crate::alerts::alert_step(&service, first).await }
            },
        )
    }

    /// Forgets old webhook delivery ids every `every` ([`crate::tracking`]).
    pub(crate) fn delivery_pruning(every: Duration) -> BackgroundLoop {
        BackgroundLoop::new(
            "delivery pruning",
            move |_| Schedule::every(every),
            |service| async move { crate::tracking::delivery_pruning_step(&service).await },
        )
    }

    /// The pull-request poller: every `interval`, if this process holds the poller role
    /// (the advisory lock of `database_url` on PostgreSQL) ([`crate::tracking`]).
    pub fn pull_request_poll(interval: Duration, database_url: String) -> BackgroundLoop {
        let poller = crate::tracking::Poller::new(&database_url);
        BackgroundLoop::new(
            "pull-request poll",
            move |_| Schedule::every(interval).quiet(),
            move |service| {
                let poller = poller.clone();
                async move { poller.step(&service).await }
            },
        )
    }

    /// Starts this loop on the current tokio runtime, stepping on `service`. Dropping the
    /// handle leaves it running; [`crate::Background`] stops the loops it holds.
    pub fn start(self, service: &Service) -> JoinHandle<()> {
        let schedule = (self.schedule)(service);
        tokio::spawn(drive(service.clone(), self.name, schedule, self.step))
    }
}

/// Runs a loop: steps, then waits as the step's outcome and `schedule` say, until a step
/// says [`Pass::Stop`].
async fn drive(service: Service, name: &'static str, schedule: Schedule, mut step: Step) {
    if schedule.wait_first {
        wait(&service, &schedule, schedule.every).await;
    }
    let mut failures: u32 = 0;
    loop {
        let pause = match step(service.clone()).await {
            Ok(pass) => {
                failures = 0;
                match schedule.wait_after(pass) {
                    Some(pause) => pause,
                    None => return,
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                let retry_in = schedule.wait_after_failures(failures);
                if schedule.quiet {
                    tracing::debug!(%error, failures, ?retry_in, "{name} step failed");
                } else {
                    tracing::warn!(%error, failures, ?retry_in, "{name} step failed");
                }
                retry_in
            }
        };
        wait(&service, &schedule, pause).await;
    }
}

/// Waits `pause`, or less if the schedule's wake-up comes first.
async fn wait(service: &Service, schedule: &Schedule, pause: Duration) {
    if pause.is_zero() {
        return;
    }
    match service.wakeup(schedule.wake) {
        Some(wakeup) => {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = wakeup.notified() => {}
            }
        }
        None => tokio::time::sleep(pause).await,
    }
}

/// The background loops of a started service; [`Service::shut_down`] stops them.
#[derive(Debug)]
pub struct Background {
    loops: Vec<JoinHandle<()>>,
}

impl Background {
    /// Starts `loops` on `service`.
    pub fn start(service: &Service, loops: Vec<BackgroundLoop>) -> Background {
        Background {
            loops: loops.into_iter().map(|l| l.start(service)).collect(),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for handle in &self.loops {
            handle.abort();
        }
    }
}
