//! Recovery: the tasks of runners that died (their leases expired, or a stopped process
//! left them) are requeued or failed with the cost their output shows, and the runs a
//! stopped process left unrecorded are recorded (see the [parent module](super)).

use super::*;

/// Logs the outcome of a step of [`Service::recover_at_start`], a count or an error: a
/// warning with the count as `$field` and `$done` when the step did anything, or with the
/// error and `$failed` when it failed.
macro_rules! log_start_step {
    ($result:expr, $field:ident, $done:literal, $failed:literal $(,)?) => {
        match $result {
            Ok(0) => {}
            Ok(n) => tracing::warn!($field = n, $done),
            Err(e) => tracing::warn!(error = %e, $failed),
        }
    };
}

impl Service {
    /// Recovers every task whose lease expired before `before` (see the module docs); returns
    /// how many were recovered.
    pub async fn recover_expired(&self, before: OffsetDateTime) -> Result<usize, ServiceError> {
        let expired = self
            .db(move |conn| Ok(claims::expired_leases(conn, before, 100)?))
            .await?;
        let mut recovered = 0;
        let mut failed = None;
        for lease in expired {
            let task = lease.task.clone();
            if self.parts.runs.active.lock().contains_key(&task.id)
                && lease.owner == self.parts.runs.owner
            {
                // Ours and still running (a renewal is late): leave it.
                continue;
            }
            // One lease that cannot be recovered (its salvaged figures refused, the database
            // failing on its row) must not hold up the others behind it: it is tried again
            // on the next pass, and the error is returned once all were tried.
            match recover_lease(self, lease, before).await {
                Ok(true) => recovered += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(task = %task.id, attempt = task.attempt, error = %e, "could not recover a task whose runner died");
                    failed = Some(e);
                }
            }
        }
        let released = release_abandoned(self, before).await;
        if recovered > 0 || released > 0 {
            money_freed(self).await;
        }
        if recovered > 0 {
            self.wake(Loops::RUNNER);
        }
        match failed {
            Some(e) if recovered == 0 => Err(e),
            _ => Ok(recovered),
        }
    }

    /// At start, before the runner loop claims anything: on SQLite (one process per database)
    /// every lease found belongs to a dead process and is recovered at once; on PostgreSQL only
    /// expired ones (other replicas may be running).
    pub(crate) async fn recover_at_start(&self, backend: Backend) {
        let before = match backend {
            Backend::Sqlite => now() + time::Duration::days(36_500),
            Backend::Postgres => now(),
        };
        log_start_step!(
            self.recover_expired(before).await,
            tasks,
            "recovered tasks left running by a stopped process",
            "could not recover the tasks of a stopped process"
        );
        log_start_step!(
            record_leftovers(self).await,
            runs,
            "recorded the cost of runs a stopped process left unrecorded",
            "could not record the runs a stopped process left"
        );
    }
}

/// Recovers one expired lease: records what its run left and requeues or fails its task;
/// `true` when this call recovered it (`false`: someone else did, or the task is gone).
async fn recover_lease(
    service: &Service,
    lease: ExpiredLease,
    before: OffsetDateTime,
) -> Result<bool, ServiceError> {
    let task = lease.task.clone();
    let recover = |salvaged| {
        with_lost_run(
            service,
            lease.clone(),
            salvaged,
            move |conn, lease, lost| claims::recover_expired(conn, lease, before, lost, now()),
        )
    };
    let done = match recover(true).await {
        // What the dead run's output shows cannot be recorded (a token count past the
        // task's total, say): recovered all the same, with its metered calls only, rather
        // than left in progress for ever with its reserve held.
        Err(ServiceError::Conflict(why)) => {
            tracing::warn!(task = %task.id, attempt = task.attempt, why = %why, "the figures a dead run's output shows cannot be recorded; recovering it with its metered calls only");
            recover(false).await?
        }
        done => done?,
    };
    let Some(Some((after, t))) = done else {
        return Ok(false);
    };
    tracing::warn!(
        task = %after.id, from = t.from.as_str(), to = t.to.as_str(), attempt = after.attempt,
        "recovered a task whose runner died"
    );
    // The lease is ours now: what is left of the run may go (not before: its owner may only
    // have been late renewing, and would have kept it).
    service.parts.runs.runner.reap(task.id, task.attempt);
    service.parts.runs.runner.discard(task.id, task.attempt);
    Ok(true)
}

/// Releases the expired leases of tasks moved away from their runners (cancelled, or their
/// pull request merged or closed during a round) before `before`, recording what each
/// attempt cost when no run of it is on record: a live runner records its own run as it
/// stops, a dead one never would. Returns how many leases were released; errors are logged
/// and the lease tried again on the next pass.
async fn release_abandoned(service: &Service, before: OffsetDateTime) -> usize {
    let abandoned = service
        .db(move |conn| Ok(claims::abandoned_leases(conn, before, 100)?))
        .await;
    let abandoned = match abandoned {
        Ok(abandoned) => abandoned,
        Err(e) => {
            tracing::warn!(error = %e, "could not list the leases of cancelled runs");
            return 0;
        }
    };
    let mut released = 0;
    for lease in abandoned {
        let task = lease.task.clone();
        if service.parts.runs.active.lock().contains_key(&task.id)
            && lease.owner == service.parts.runs.owner
        {
            // Ours, still stopping: it records its own run.
            continue;
        }
        let done = with_lost_run(service, lease, true, move |conn, lease, lost| {
            claims::release_abandoned(conn, lease, before, lost, now())
        })
        .await;
        match done {
            Ok(Some(true)) => {
                tracing::info!(task = %task.id, attempt = task.attempt, "released the lease of a run that was moved away from its runner");
                service.parts.runs.runner.reap(task.id, task.attempt);
                if !service.parts.runs.settings.keep_run_dirs {
                    service.parts.runs.runner.discard(task.id, task.attempt);
                }
                released += 1;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(task = %task.id, error = %e, "could not release the lease of a cancelled run");
            }
        }
    }
    released
}

/// Reads what the run of `lease` left ([`lost_run`], unless `salvaged` is false), then in one
/// transaction, the task
/// locked before its metered calls are read ([`lock_for_recording`]), gives `apply` that run
/// as it is recorded ([`with_metered_calls`]); `None` when the task is gone.
async fn with_lost_run<T, F>(
    service: &Service,
    lease: ExpiredLease,
    salvaged: bool,
    apply: F,
) -> Result<Option<T>, ServiceError>
where
    T: Send + 'static,
    F: FnOnce(
            &mut AnyConnection,
            &ExpiredLease,
            Option<(&Run, Option<&RunLog>)>,
        ) -> Result<T, DbError>
        + Send
        + 'static,
{
    let lost = if salvaged {
        lost_run(service, &lease).await?
    } else {
        None
    };
    service
        .db(move |conn| {
            Ok(write_tx::<_, DbError, _>(conn, |conn| {
                if !lock_for_recording(conn, lease.task.id)? {
                    return Ok(None);
                }
                let lost = with_metered_calls(conn, &lease, lost)?;
                let lost = lost.as_ref().map(|(run, log)| (run, Some(log)));
                apply(conn, &lease, lost).map(Some)
            })?)
        })
        .await
}

/// What a dead runner's run left, as it is recorded.
pub(super) struct Lost {
    /// The ledger row, from what the agent printed.
    run: Run,
    /// The end of its output.
    log: RunLog,
    /// Whether its calls went through the gateway ([`Salvaged::metered`]): its cost is then
    /// that of its metered calls, none or many, never the figure the agent printed.
    metered: bool,
}

/// The ledger row of a dead runner's run, from what it left (its output, and what the
/// agent recorded elsewhere, such as Codex's session files), if the runner can reach it.
pub(super) async fn lost_run(
    service: &Service,
    lease: &ExpiredLease,
) -> Result<Option<Lost>, ServiceError> {
    let task = lease.task.clone();
    let repo = match task.repo_id {
        Some(id) => Some(
            service
                .db(move |conn| Ok(repos::get_repository(conn, id)?))
                .await?,
        ),
        None => None,
    };
    let model = repo.as_ref().map_or_else(String::new, |r| {
        r.settings
            .model_for(task.agent_type, task.task_type == TaskType::Review)
            .to_owned()
    });
    let spec = AgentSpec {
        agent_type: task.agent_type,
        model: model.clone(),
        max_turns: None,
        max_budget_usd: None,
    };
    let Some(Salvaged {
        output,
        report,
        metered,
    }) = service
        .parts
        .runs
        .runner
        .salvage(task.id, task.attempt, &spec)
    else {
        return Ok(None);
    };
    log_warnings(&task, Some(&report));
    let at = now();
    let execution = Execution {
        verdict: Verdict::Cancelled,
        agent_type: task.agent_type,
        report: None,
        ended: None,
        output: String::new(),
        sandboxed: false,
        metered: false,
        started_at: task.started_at.unwrap_or(lease.expired_at),
        finished_at: at,
    };
    let mut run = run_from_report(
        &task,
        model,
        &execution,
        Some(&report),
        RunOutcome::Lost,
        Some(with_cost_note(
            "the runner stopped during the run (its lease expired)".into(),
            Some(&report),
        )),
    );
    run.finished_at = None;
    // Which sandbox the dead process ran it in is not known here.
    run.sandboxed = None;
    Ok(Some(Lost {
        run,
        log: RunLog::of(&output),
        metered,
    }))
}

/// Locks the task's row for the rest of the caller's transaction, before its run's metered
/// calls are read: a call written meanwhile then waits, and finds the run on record
/// ([`metering::record_held_call`]). `false` when the task is gone.
fn lock_for_recording(conn: &mut AnyConnection, task: Uuid) -> Result<bool, DbError> {
    match agentry_persistence::revisions::lock_task(conn, task) {
        Ok(()) => Ok(true),
        Err(DbError::NotFound) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The run of an expired lease as it is recorded: what the dead runner's output showed
/// (`lost`, if reachable from here), with the cost and tokens of its metered model calls
/// when the gateway metered any, or when the run was metered at all (then an agent that
/// made no call costs nothing, whatever it printed). The calls are in the database
/// whichever replica ran the agent, so a run recovered elsewhere keeps every metered call
/// even when its output is out of reach.
pub(super) fn with_metered_calls(
    conn: &mut AnyConnection,
    lease: &ExpiredLease,
    lost: Option<Lost>,
) -> Result<Option<(Run, RunLog)>, DbError> {
    let task = &lease.task;
    let totals = metering::run_totals(conn, task.id, task.attempt)?;
    let metered = lost.as_ref().is_some_and(|l| l.metered);
    if totals.calls == 0 && !metered {
        return Ok(lost.map(|l| (l.run, l.log)));
    }
    let reachable = lost.is_some();
    let (mut run, log) = lost.map(|l| (l.run, l.log)).unwrap_or_else(|| {
        let run = Run {
            // Only sandboxed runs go through the gateway.
            sandboxed: Some(true),
            ..Run::new(
                task.id,
                task.attempt,
                task.agent_type,
                RunOutcome::Lost,
                task.started_at.unwrap_or(lease.expired_at),
            )
        };
        (run, RunLog::of(""))
    });
    run.error_message = Some(if reachable {
        "the runner stopped during the run (its lease expired)".to_owned()
    } else {
        "the runner stopped during the run (its lease expired); its output is out of reach, \
         its cost is that of its metered model calls"
            .to_owned()
    });
    if let Some(text) = apply_metering(&mut run, &totals) {
        tracing::warn!(task = %task.id, attempt = task.attempt, "{text}");
    }
    Ok(Some((run, log)))
}

/// At start, before any run: records every run this process's runner still holds whose
/// attempt has no run on record, with the cost its output shows, and forgets the runs on
/// record. These are runs whose agent ended (or was stopped by salvaging) after the
/// previous process died and before it recorded them. On PostgreSQL another replica may
/// recover such a task; it cannot read this runner's directory, so without this the cost
/// would be lost. Returns how many runs were recorded.
pub(super) async fn record_leftovers(service: &Service) -> Result<usize, ServiceError> {
    let mut recorded = 0;
    let mut failed = None;
    for (task_id, attempt) in service.parts.runs.runner.leftovers() {
        if service.parts.runs.active.lock().contains_key(&task_id) {
            continue;
        }
        // As in recovery, one leftover that cannot be recorded does not hold up the others.
        match record_leftover(service, task_id, attempt).await {
            Ok(true) => recorded += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(task = %task_id, attempt, error = %e, "could not record a run a stopped process left");
                failed = Some(e);
            }
        }
    }
    if recorded > 0 {
        money_freed(service).await;
    }
    match failed {
        Some(e) if recorded == 0 => Err(e),
        _ => Ok(recorded),
    }
}

/// Records one run this process's runner still holds, when its attempt has none on record
/// ([`record_leftovers`]); `true` when it recorded one.
async fn record_leftover(
    service: &Service,
    task_id: Uuid,
    attempt: i32,
) -> Result<bool, ServiceError> {
    let found = service
        .db(move |conn| {
            let task = match tasks::get_task(conn, task_id) {
                Ok(task) => task,
                Err(DbError::NotFound) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let on_record = claims::attempt_recorded(conn, task_id, attempt)?;
            Ok(Some((task, on_record)))
        })
        .await?;
    let Some((task, false)) = found else {
        if !service.parts.runs.settings.keep_run_dirs {
            service.parts.runs.runner.discard(task_id, attempt);
        }
        return Ok(false);
    };
    let lease = ExpiredLease {
        expired_at: task.started_at.unwrap_or_else(now),
        owner: String::new(),
        task: Task { attempt, ..task },
    };
    let written = with_lost_run(service, lease, true, |conn, _, lost| match lost {
        Some((run, Some(log))) => claims::record_finished_run(conn, run, log, now()),
        _ => Ok(RunRecorded::AlreadyRecorded),
    })
    .await?;
    let fresh = written.is_some_and(|w| w != RunRecorded::AlreadyRecorded);
    if fresh {
        tracing::warn!(task = %task_id, attempt, "recorded the cost of a run a stopped process left");
    }
    // This process's own leftover: the process that ran it is gone.
    service.parts.runs.runner.reap(task_id, attempt);
    if !service.parts.runs.settings.keep_run_dirs {
        service.parts.runs.runner.discard(task_id, attempt);
    }
    Ok(fresh)
}

/// How often the recovery loop looks: every half lease, at least every second.
pub(crate) fn recovery_every(settings: &RunSettings) -> Duration {
    (settings.lease / 2).max(Duration::from_secs(1))
}

/// The recovery loop's step: recovers the tasks whose lease expired.
pub(crate) async fn recovery_step(service: &Service) -> StepResult {
    service.recover_expired(now()).await?;
    Ok(Pass::Idle)
}
