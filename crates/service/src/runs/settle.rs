//! Settling a run: its cost recorded first, then what it produced published, then the
//! task's state change in one transaction (see the [parent module](super)).

use super::*;
use crate::revisions::Considered;
use agentry_persistence::revisions;

/// Fails a task that could not run at all (no agent ran, so no run is recorded).
pub(super) async fn settle_without_run(service: &Service, task: &Task, message: &str) {
    let id = task.id;
    let details = TransitionDetails {
        reason: Some(message.to_owned()),
        error_message: Some(message.to_owned()),
        pull_request: None,
    };
    let failed = transition(service, (id, task.attempt), Trigger::Fail, details).await;
    match failed {
        Ok(true) => tracing::warn!(
            task = %id,
            reason = agentry_domain::quote::one_line(message),
            "task failed before its agent ran"
        ),
        Ok(false) => tracing::info!(task = %id, "the task is at another attempt; not failed"),
        Err(e) => tracing::info!(task = %id, error = %e, "could not fail a task"),
    }
}

/// What the settling transaction does besides recording the run.
#[derive(Clone)]
struct Settlement {
    trigger: Option<(Trigger, TransitionDetails)>,
    review: Option<NewTask>,
    /// What agentry says on the pull request (a revision that changed nothing or failed).
    reply: Option<Action>,
    /// The review agent's findings, recorded as the coding task's feedback
    /// (`reviseOnAgentReview`).
    feedback: Option<AgentFeedback>,
}

/// A posted review that becomes feedback for the coding task's next revision round.
#[derive(Clone)]
struct AgentFeedback {
    coding_task: Uuid,
    text: String,
}

/// The coding task's work is on its pull request (opened, or a revision pushed to it):
/// `pr_opened`, and the review task when the repository reviews automatically.
fn published(
    prepared: &Prepared,
    task: &Task,
    pull_request: PullRequestRef,
    reason: String,
) -> Settlement {
    Settlement {
        trigger: Some((
            Trigger::PullRequestOpened,
            TransitionDetails {
                reason: Some(reason),
                error_message: None,
                pull_request: Some(pull_request),
            },
        )),
        review: prepared
            .repo
            .settings
            .auto_review
            .then(|| review_task(task, &prepared.repo)),
        reply: None,
        feedback: None,
    }
}

/// The task fails with `message` (its reason and its error).
fn fail_with(message: String) -> Settlement {
    Settlement {
        trigger: Some((
            Trigger::Fail,
            TransitionDetails {
                reason: Some(message.clone()),
                error_message: Some(message),
                pull_request: None,
            },
        )),
        review: None,
        reply: None,
        feedback: None,
    }
}

/// Records the run, publishes what it produced, then makes the state change, in these
/// named steps: [`record`], [`publish`], [`with_revision_reply`] and [`apply`].
///
/// The run (its cost) is recorded first, as soon as the agent's result is known, so that no
/// cost depends on this process surviving the publishing or on which replica recovers the
/// task. Publishing then waits out code-host failures whose outcome is unknown; only a
/// definite refusal fails the task.
pub(super) async fn settle(
    service: &Service,
    task: &Task,
    prepared: &Prepared,
    execution: Execution,
    cancel: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    let recorded = retrying(task.id, "the run's record", || {
        record(service, task, prepared, &execution)
    })
    .await?;
    let Some(cost) = recorded else {
        return Ok(());
    };
    // The reserve went back with the recording: blocked tasks may run now.
    money_freed(service).await;
    let mut patience = Patience::new(&service.parts.runs.settings, cancel);
    let Some(settlement) = publish(service, task, prepared, &execution, cost, &mut patience).await
    else {
        return Ok(());
    };
    let revision = matches!(prepared.job.kind, JobKind::Revision { .. });
    let settlement = with_revision_reply(settlement, task, revision);
    retrying(task.id, "the task's state change", || {
        apply(service, task, prepared, &settlement)
    })
    .await
}

/// The run's outcome as recorded, from the agent's verdict.
fn outcome_of(verdict: &Verdict) -> RunOutcome {
    match verdict {
        Verdict::Pushed { .. } | Verdict::Reviewed { .. } | Verdict::NoChanges => {
            RunOutcome::Succeeded
        }
        Verdict::Failed(_) => RunOutcome::Failed,
        Verdict::Cancelled => RunOutcome::Cancelled,
        Verdict::TimedOut(_) => RunOutcome::TimedOut,
    }
}

/// Step 1: records the run and its cost (after the gateway wrote its metered calls).
/// Returns the cost, or `None` when the run is not this process's to publish (the task was
/// recovered elsewhere during the run, or a recoverer recorded it already).
pub(super) async fn record(
    service: &Service,
    task: &Task,
    prepared: &Prepared,
    execution: &Execution,
) -> Result<Option<Option<Usd>>, ServiceError> {
    let run = run_record(
        task,
        &prepared.job,
        execution,
        outcome_of(&execution.verdict),
    );
    log_warnings(task, execution.report.as_ref());
    let log = RunLog::of(&execution.output);
    let (id, attempt, metered) = (task.id, task.attempt, execution.metered);
    if metered
        && let Some(gateway) = &service.parts.runs.gateway
        && !gateway.drain(id, attempt, DRAIN_WAIT).await
    {
        tracing::warn!(task = %id, attempt, "metered calls of the run are still being written; recording what is there");
    }
    let (recorded, cost) = service
        .db(move |conn| record_run(conn, run, metered, &log))
        .await?;
    match recorded {
        RunRecorded::Current => Ok(Some(cost)),
        RunRecorded::Late => {
            tracing::warn!(task = %id, attempt, "the task was recovered elsewhere during the run; its cost is recorded, its outcome not published");
            Ok(None)
        }
        RunRecorded::AlreadyRecorded => {
            tracing::info!(task = %id, attempt, "the run was already recorded by a recoverer; nothing is published");
            Ok(None)
        }
        RunRecorded::Stopped => {
            tracing::info!(task = %id, attempt, "the task was cancelled as its run ended; its cost is recorded, nothing is published");
            money_freed(service).await;
            Ok(None)
        }
    }
}

/// Step 2: publishes what the run produced (opens the pull request, posts the review) and
/// says what the settling transaction does; `None` when the run was stopped while
/// publishing (the task stays as it is, for recovery).
async fn publish(
    service: &Service,
    task: &Task,
    prepared: &Prepared,
    execution: &Execution,
    cost: Option<Usd>,
    patience: &mut Patience,
) -> Option<Settlement> {
    let revision = matches!(prepared.job.kind, JobKind::Revision { .. });
    let settlement = match &execution.verdict {
        Verdict::Pushed { .. } if revision => {
            let pull_request = PullRequestRef {
                url: task.pr_url.clone().unwrap_or_default(),
                number: task.pr_number.unwrap_or_default(),
            };
            let reason = format!("revision pushed to pull request #{}", pull_request.number);
            published(prepared, task, pull_request, reason)
        }
        Verdict::Pushed { branch, .. } => {
            match open_pull_request(service, prepared, task, branch, cost, patience).await {
                Published::Done(pull_request) => {
                    let reason = format!("pull request #{} opened", pull_request.number);
                    published(prepared, task, pull_request, reason)
                }
                Published::Refused(message) => fail_with(message),
                Published::Stopped => return None,
            }
        }
        Verdict::Reviewed { text } => {
            match post_review(service, prepared, task, text, cost, patience).await {
                Published::Done(pull_request) => review_posted(prepared, pull_request, text),
                Published::Refused(message) => fail_with(message),
                Published::Stopped => return None,
            }
        }
        // A metered run's cost is known from its calls: no note about the agent's own figure.
        Verdict::NoChanges if execution.metered => fail_with("the agent made no changes".into()),
        Verdict::NoChanges => fail_with(with_cost_note(
            "the agent made no changes".into(),
            execution.report.as_ref(),
        )),
        Verdict::Failed(m) | Verdict::TimedOut(m) if execution.metered => fail_with(m.clone()),
        Verdict::Failed(m) | Verdict::TimedOut(m) => {
            fail_with(with_cost_note(m.clone(), execution.report.as_ref()))
        }
        Verdict::Cancelled => Settlement {
            trigger: None,
            review: None,
            reply: None,
            feedback: None,
        },
    };
    Some(settlement)
}

/// The review task's review is on the pull request: `review_posted`, and its text the coding
/// task's feedback when the repository revises on agent reviews.
fn review_posted(prepared: &Prepared, pull_request: PullRequestRef, text: &str) -> Settlement {
    let feedback = prepared
        .parent
        .as_ref()
        .filter(|_| prepared.repo.settings.revise_on_agent_review)
        .map(|parent| AgentFeedback {
            coding_task: parent.id,
            text: text.to_owned(),
        });
    Settlement {
        trigger: Some((
            Trigger::ReviewPosted,
            TransitionDetails {
                reason: Some(format!(
                    "review posted on pull request #{}",
                    pull_request.number
                )),
                error_message: None,
                pull_request: Some(pull_request),
            },
        )),
        review: None,
        reply: None,
        feedback,
    }
}

/// Step 3: a revision that pushed nothing leaves the pull request as it was: the
/// settlement also says so there.
fn with_revision_reply(settlement: Settlement, task: &Task, revision: bool) -> Settlement {
    match (&settlement.trigger, revision) {
        (Some((Trigger::Fail, details)), true) => {
            let why = details.reason.clone().unwrap_or_default();
            Settlement {
                reply: Some(revision_end_reply(task, &why)),
                ..settlement
            }
        }
        _ => settlement,
    }
}

/// Step 4: the settling transaction: the state change, the review task, the reply and the
/// review agent's feedback, if the attempt is still this run's and the task can still move;
/// wakes the runner (a review queued), the outbox (a reply) and the revision scheduler
/// (feedback recorded).
async fn apply(
    service: &Service,
    task: &Task,
    prepared: &Prepared,
    settlement: &Settlement,
) -> Result<(), ServiceError> {
    let (id, attempt, repo) = (task.id, task.attempt, prepared.repo.clone());
    let settlement = settlement.clone();
    let queued_review = settlement.review.is_some();
    let replied = settlement.reply.is_some();
    let quiet = service.parts.codehost.revisions().settings().quiet;
    let applied = service
        .commit(
            move |conn| {
                Ok(write_tx::<_, DbError, _>(conn, |conn| {
                    apply_in(conn, (id, attempt), &repo, &settlement, quiet)
                })?)
            },
            |applied| {
                let moved = Loops::RUNNER.when(queued_review) | Loops::OUTBOX.when(replied);
                let feedback = applied
                    .feedback
                    .as_ref()
                    .map_or(Loops::NONE, Considered::wakes);
                moved.when(applied.moved) | feedback
            },
        )
        .await?;
    match applied.feedback {
        Some(Considered::Waiting(due)) => {
            tracing::info!(task = %id, due = %due, "the review agent's findings are recorded as revision feedback");
        }
        Some(Considered::OverLimit) => {
            tracing::info!(task = %id, "the review agent's findings are past maxRevisions: no revision");
        }
        Some(Considered::Ignored(why)) => {
            tracing::info!(task = %id, why = %why, "the review agent's findings are not revision feedback");
        }
        Some(Considered::Duplicate) | None => {}
    }
    Ok(())
}

/// What the settling transaction did.
struct Applied {
    /// The task moved.
    moved: bool,
    /// What became of the review agent's findings, when they were to become feedback.
    feedback: Option<Considered>,
}

/// [`apply`]'s transaction.
fn apply_in(
    conn: &mut AnyConnection,
    (id, attempt): (Uuid, i32),
    repo: &Repository,
    settlement: &Settlement,
    quiet: std::time::Duration,
) -> Result<Applied, DbError> {
    let unmoved = Applied {
        moved: false,
        feedback: None,
    };
    if let Some(feedback) = &settlement.feedback {
        // The coding task's lock before the review task's row, in the order every other
        // writer of both takes them.
        revisions::lock_task(conn, feedback.coding_task)?;
    }
    let current = tasks::get_task(conn, id)?;
    if current.attempt != attempt {
        // Recovered by someone else meanwhile: that attempt is theirs now.
        return Ok(unmoved);
    }
    let Some((trigger, details)) = &settlement.trigger else {
        return Ok(Applied {
            moved: true,
            feedback: None,
        });
    };
    // The attempt is checked again in the transition itself: on PostgreSQL another replica
    // may recover the task between the read above and it.
    match tasks::transition_task_at(conn, id, attempt, *trigger, details, now()) {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(unmoved),
        // Cancelled meanwhile: the run is recorded all the same.
        Err(DbError::InvalidTransition(_)) => return Ok(unmoved),
        Err(e) => return Err(e),
    }
    if let Some(review) = &settlement.review {
        tasks::create_task(conn, review, "review launched")?;
    }
    if let Some(action) = &settlement.reply {
        let effect = NewEffect {
            task_id: None,
            repo_id: repo.id,
            action: action.clone(),
        };
        outbox::enqueue(conn, &effect, now())?;
    }
    let feedback = match &settlement.feedback {
        Some(f) => Some(crate::revisions::agent_review_in(
            conn,
            repo,
            id,
            f.coding_task,
            &f.text,
            quiet,
        )?),
        None => None,
    };
    Ok(Applied {
        moved: true,
        feedback,
    })
}

/// The reply on a pull request whose revision round pushed nothing: why.
fn revision_end_reply(task: &Task, why: &str) -> Action {
    let marker = crate::revisions::round_end_marker(task.id, task.attempt);
    let said = if why.starts_with("the agent made no changes") {
        "The agent made no change in this revision round, so the pull request is as it was."
            .to_owned()
    } else {
        // `why` may quote the agent (its stderr, a path it chose): it pings nobody and
        // forges no marker (crate::posted_text).
        format!(
            "The revision round ended without a change to the pull request: {}",
            crate::posted_text::quiet(why)
        )
    };
    Action::Reply {
        issue_number: task.pr_number.unwrap_or_default(),
        body: format!("{said} Task `{}`.\n\n{marker}", task.id),
        marker,
    }
}

/// The review task of a coding task that opened its pull request.
fn review_task(task: &Task, repo: &Repository) -> NewTask {
    NewTask {
        id: Uuid::new_v4(),
        title: format!("Review: {}", task.title),
        prompt: String::new(),
        repo_id: Some(repo.id),
        repo_url: repo.url.clone(),
        task_type: TaskType::Review,
        agent_type: repo.settings.agent_type,
        issue_number: None,
        parent_task_id: Some(task.id),
        created_at: now(),
    }
}
