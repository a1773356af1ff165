//! Claiming and running: a queued task is claimed with a lease, its job prepared
//! ([`super::prepare`]) and handed to the runner, and its lease renewed while the agent
//! runs and its outcome is published (see the [parent module](super)).

use super::*;
use agentry_persistence::budgets::Holding;

/// Claims the oldest queued task this process may run, with a lease in this runner's name.
pub(super) async fn claim(service: &Service) -> Result<Option<Task>, ServiceError> {
    let owner = service.parts.runs.owner.clone();
    let lease = lease_of(&service.parts.runs.settings);
    let holding = holding(service);
    service
        .db(move |conn| {
            Ok(claims::claim_next_holding(
                conn,
                &owner,
                now(),
                lease,
                holding,
            )?)
        })
        .await
}

/// How this process's runs hold their budgets: per call when the gateway meters them
/// (sandboxed runs), else their whole allowance from the claim (docs/budgets.md).
pub(super) fn holding(service: &Service) -> Holding {
    if service.parts.runs.gateway.is_some() {
        Holding::PerCall
    } else {
        Holding::WholeRun
    }
}

impl Service {
    /// Claims the oldest queued task and runs it to its end; returns its id, or `None` when
    /// nothing was queued. (The loop does the same with several slots; tests use this.)
    pub async fn run_next(&self) -> Result<Option<Uuid>, ServiceError> {
        let Some(task) = claim(self).await? else {
            return Ok(None);
        };
        let id = task.id;
        run_task(self, task).await;
        money_freed(self).await;
        Ok(Some(id))
    }
}

/// After a run's reserve went back (the run ended, was recovered or cancelled): the tasks a
/// budget blocked are candidates again, and the next claim decides anew with what is left.
pub(super) async fn money_freed(service: &Service) {
    let unblocked = service
        .db(|conn| Ok(agentry_persistence::budgets::unblock(conn, None)?))
        .await;
    match unblocked {
        Ok(0) => {}
        Ok(n) => tracing::debug!(tasks = n, "blocked tasks are candidates again"),
        Err(e) => tracing::warn!(error = %e, "could not unblock tasks after a run"),
    }
    // The run's cost is recorded: a budget may have reached an alert threshold.
    service.check_budget_alerts_logged().await;
}

/// Runs one claimed task to its end. Never fails: problems become the task's failure.
pub(super) async fn run_task(service: &Service, task: Task) {
    let id = task.id;
    let attempt = task.attempt;
    tracing::info!(task = %id, attempt, kind = task.task_type.as_str(), "run started");
    let prepared = {
        let key = service.master_key().clone();
        let task = task.clone();
        let settings = service.parts.runs.settings.clone();
        // Local clone URLs only when the code host is a local fake (tests).
        let allow_local = is_loopback_url(service.parts.codehost.api_url());
        let holding = holding(service);
        service
            .db(move |conn| Ok(prepare(conn, &key, &task, &settings, allow_local, holding)))
            .await
            .unwrap_or_else(|e| Err(Refusal::from(e)))
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(refusal) => {
            refusal.record(service, &task).await;
            return;
        }
    };
    let (cancel, cancelled) = watch::channel(false);
    let renewer = tokio::spawn(renew_lease(service.clone(), id, attempt, cancel.clone()));
    // The lease is renewed while an earlier attempt of the task still ends here.
    let _turn = service.parts.runs.turns.turn(id).await;
    service.parts.runs.active.lock().insert(id, cancel.clone());
    // A shutdown that began while this run was being claimed or prepared did not see it,
    // nor did a cancel sent while it waited for its turn (it went to the earlier attempt).
    if service.parts.runs.stopping.load(Ordering::SeqCst) || !is_ours(service, id, attempt).await {
        let _ = cancel.send(true);
    }
    let (started, on_start) = oneshot::channel();
    let running = {
        let service = service.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if on_start.await.is_err() {
                return;
            }
            let moved = retrying(id, "the agent's start", || {
                transition(
                    &service,
                    (id, attempt),
                    Trigger::AgentStarted,
                    TransitionDetails::default(),
                )
            })
            .await;
            match moved {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(task = %id, attempt, "the task is at another attempt; stopping the agent");
                    let _ = cancel.send(true);
                }
                Err(e) => {
                    tracing::info!(task = %id, error = %e, "the task left provisioning; stopping the agent");
                    let _ = cancel.send(true);
                }
            }
        })
    };
    let control = Control {
        cancel: cancelled,
        started: Some(started),
    };
    let execution = service
        .parts
        .runs
        .runner
        .execute(prepared.job.clone(), control)
        .await;
    let _ = running.await;
    if service.parts.runs.stopping.load(Ordering::SeqCst) {
        // Shutting down: the task stays leased and is recovered after the restart, with
        // the cost its output shows. A task that left the run meanwhile (cancelled, or a
        // revision round cancelled, merged or closed) is not recovered, only its lease
        // released: its run is recorded now (the database only), with its output.
        renewer.abort();
        if !is_ours(service, id, attempt).await
            && let Err(e) = record(service, &task, &prepared, &execution).await
        {
            tracing::error!(task = %id, error = %e, "could not record a cancelled run at shutdown");
        }
        service.parts.runs.active.lock().remove(&id);
        return;
    }
    // The lease is still renewed while the outcome is published (which may wait out a
    // failing code host); a refused renewal (cancelled, or recovered elsewhere) stops that.
    let settled = settle(service, &task, &prepared, execution, cancel.subscribe()).await;
    renewer.abort();
    service.parts.runs.active.lock().remove(&id);
    match settled {
        Ok(()) => {
            if !service.parts.runs.settings.keep_run_dirs {
                service.parts.runs.runner.discard(id, attempt);
            }
        }
        Err(e) => {
            tracing::error!(task = %id, error = %e, "could not record a run; it is recovered when its lease expires");
        }
    }
}

/// Whether the task is still at attempt `attempt` and being provisioned or run, or the
/// database could not tell (then the lease decides, at the next renewal).
async fn is_ours(service: &Service, id: Uuid, attempt: i32) -> bool {
    let task = service.db(move |conn| Ok(tasks::get_task(conn, id)?)).await;
    match task {
        Ok(t) => t.attempt == attempt && is_running(t.state),
        Err(_) => true,
    }
}

/// Renews the lease of attempt `attempt` every third of its length; a refused renewal stops
/// the agent.
async fn renew_lease(service: Service, id: Uuid, attempt: i32, cancel: watch::Sender<bool>) {
    let every = service.parts.runs.settings.lease / 3;
    let lease = lease_of(&service.parts.runs.settings);
    let mut stopping = false;
    loop {
        tokio::time::sleep(every).await;
        let owner = service.parts.runs.owner.clone();
        // Moved away from this runner (cancelled; its pull request merged or closed during a
        // round), the attempt's lease is still renewed until its run is recorded: recovery
        // must not take a live runner for a dead one.
        let renewed = service
            .db(move |conn| {
                let until = now() + lease;
                if claims::renew_lease(conn, id, attempt, &owner, until)? {
                    return Ok(Some(true));
                }
                let kept = claims::renew_stopped_lease(conn, id, attempt, &owner, until)?;
                Ok(kept.then_some(false))
            })
            .await;
        match renewed {
            Ok(Some(true)) => {}
            Ok(Some(false)) => {
                if !stopping {
                    tracing::info!(task = %id, "the task was moved away from its run; stopping the agent");
                    let _ = cancel.send(true);
                    stopping = true;
                }
            }
            Ok(None) => {
                tracing::info!(task = %id, "the task is no longer this runner's (cancelled or recovered); stopping the agent");
                let _ = cancel.send(true);
                return;
            }
            Err(e) => tracing::warn!(task = %id, error = %e, "could not renew a lease"),
        }
    }
}
