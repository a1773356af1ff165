//! Costing a run: the ledger row of an execution, a metered run's cost taken from its
//! metered model calls, and the notes that say why a cost is unknown.

use super::*;
use agentry_domain::Tokens;

/// The ledger row of an execution. A metered run's cost comes from its metered calls
/// ([`apply_metering`]), so its message carries no note about the agent's own figure.
pub(super) fn run_record(
    task: &Task,
    job: &Job,
    execution: &Execution,
    outcome: RunOutcome,
) -> Run {
    let report = execution.report.as_ref();
    let note = |message: String| {
        if execution.metered {
            message
        } else {
            with_cost_note(message, report)
        }
    };
    let error_message = match &execution.verdict {
        Verdict::Failed(m) | Verdict::TimedOut(m) => Some(note(m.clone())),
        Verdict::NoChanges => Some(note("the agent made no changes".to_owned())),
        Verdict::Cancelled => Some(note("the run was cancelled".to_owned())),
        Verdict::Pushed { .. } | Verdict::Reviewed { .. } => None,
    };
    run_from_report(
        task,
        job.agent.model.clone(),
        execution,
        report,
        outcome,
        error_message,
    )
}

/// The ledger row of a run from what its agent reported (`report`), launched with
/// `launched_model`; the uncached input is kept apart from the cache's tokens.
pub(super) fn run_from_report(
    task: &Task,
    launched_model: String,
    execution: &Execution,
    report: Option<&RunReport>,
    outcome: RunOutcome,
    error_message: Option<String>,
) -> Run {
    let tokens = report.map_or_else(Tokens::default, |r| r.tokens);
    Run {
        id: Uuid::new_v4(),
        task_id: task.id,
        attempt: task.attempt,
        agent_type: execution.agent_type,
        model: report
            .and_then(|r| r.model.clone())
            .or(Some(launched_model)),
        cost_usd: report.and_then(|r| r.cost_usd),
        // The ledger keeps uncached input apart, never negative; the task's input total
        // adds the cache.
        tokens: Tokens::from_uncached(
            tokens.uncached().max(0),
            tokens.cache_read,
            tokens.cache_write,
            tokens.output,
        ),
        turns: report.and_then(|r| r.turns),
        outcome,
        exit_code: execution.exit_code(),
        error_message,
        started_at: execution.started_at,
        finished_at: Some(execution.finished_at),
        sandboxed: Some(execution.sandboxed),
        model_calls: None,
        reported_cost_usd: report.and_then(|r| r.cost_usd),
    }
}

/// The least difference between a metered cost and the agent's own figure that is more than
/// rounding: 0.5 % of the larger, and at least one micro-dollar.
fn mismatch_tolerance(a: Usd, b: Usd) -> rust_decimal::Decimal {
    let larger = a.as_decimal().max(b.as_decimal());
    (larger * rust_decimal::Decimal::new(5, 3)).max(rust_decimal::Decimal::new(1, 6))
}

/// Makes `run` a metered run: its cost and tokens are those of its metered calls
/// (`totals`), what the agent printed is kept as `reported_cost_usd`. Returns the text of a
/// `cost_mismatch` event when the two differ beyond rounding.
pub(super) fn apply_metering(run: &mut Run, totals: &metering::RunTotals) -> Option<String> {
    let reported = totals.meter(run);
    match (totals.cost_usd, reported) {
        (Some(metered), Some(reported))
            if (metered.as_decimal() - reported.as_decimal()).abs()
                > mismatch_tolerance(metered, reported) =>
        {
            Some(format!(
                "cost_mismatch: attempt {} metered {metered} USD over {} model calls, but the \
                 agent reported {reported} USD; the metered cost is recorded",
                run.attempt, totals.calls
            ))
        }
        _ => None,
    }
}

/// Records `run` (see [`claims::record_finished_run`]); a metered run's cost is first made
/// that of its metered calls, and a `cost_mismatch` event noted when the agent's own figure
/// differs. Returns how it was recorded and the cost recorded.
///
/// One transaction, which locks the task's row before it reads the calls: a call written
/// meanwhile is either read here or, waiting for the lock, finds the run on record and adds
/// itself to it ([`metering::record_held_call`]).
pub(super) fn record_run(
    conn: &mut AnyConnection,
    mut run: Run,
    metered: bool,
    log: &RunLog,
) -> Result<(RunRecorded, Option<Usd>), ServiceError> {
    let recorded = write_tx(conn, |conn| {
        match agentry_persistence::revisions::lock_task(conn, run.task_id) {
            Err(DbError::NotFound) => return Ok(RunRecorded::AlreadyRecorded),
            locked => locked?,
        }
        let mismatch = if metered {
            let totals = metering::run_totals(conn, run.task_id, run.attempt)?;
            apply_metering(&mut run, &totals)
        } else {
            None
        };
        let recorded = claims::record_finished_run(conn, &run, log, now())?;
        if let Some(text) = mismatch
            && recorded != RunRecorded::AlreadyRecorded
        {
            tracing::warn!(task = %run.task_id, attempt = run.attempt, "{text}");
            tasks::record_note(conn, run.task_id, EventKind::CostMismatch, &text, now())?;
        }
        Ok::<_, DbError>(recorded)
    })?;
    Ok((recorded, run.cost_usd))
}

/// `message`, and when the run's cost is unknown, why (so the task says why its cost is
/// null, never a silent $0).
pub(super) fn with_cost_note(message: String, report: Option<&RunReport>) -> String {
    match report {
        Some(report) if report.cost_usd.is_none() => {
            let why = report
                .cost_unknown
                .as_deref()
                .unwrap_or("the agent reported none");
            format!("{message}; its cost is unknown: {why}")
        }
        _ => message,
    }
}

/// Logs what the output parser could not make sense of (an unpriced model, lines that are
/// not JSON, a missing result), so an operator sees why a run's cost is null. A warning
/// may quote the agent's output, so it is logged on one line: a line break in it would
/// let the agent write log lines of its own in the plain log format.
pub(super) fn log_warnings(task: &Task, report: Option<&RunReport>) {
    for warning in report.map(|r| r.warnings.as_slice()).unwrap_or_default() {
        let warning = agentry_domain::quote::one_line(warning);
        tracing::warn!(task = %task.id, attempt = task.attempt, %warning, "agent output");
    }
}
