//! Pull-request tracking (docs/contract.md#55-pull-request-tracking–#56-webhook): the poller, and what a webhook delivery does.
//!
//! Both ask one pure question, [`pull_request_trigger`], and apply the answer with
//! [`pulls::apply_pull_outcome`], a compare-and-set transition that also enqueues the closing
//! of the linked issue in the same transaction: when the poller and a webhook see the same
//! merge, exactly one applies it and the issue is closed once. A merge or close during a
//! revision round ends the round: once the transition is committed, the round's agent is
//! stopped as a cancel stops one (here at once, on another replica at its next lease
//! renewal).

use std::sync::Arc;

use parking_lot::Mutex;

use agentry_codehost::webhook::WebhookEvent;
use agentry_codehost::{Conditional, GitHub, PullRequest};
use agentry_domain::{PullRequestState, RepoUrl, Trigger, pull_request_trigger};
use agentry_persistence::leader::LeaderLock;
use agentry_persistence::pulls::{self, PullPollState};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::{AnyConnection, DbError, webhooks, write_tx};
use futures_util::StreamExt;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::background::{Pass, StepResult};
use crate::codehost::SERVICE_LABEL;
use crate::wake::Loops;
use crate::{Service, ServiceError, now};

/// The advisory-lock key of the poller role ("agentry" and 2; the migration lock is 1).
pub(crate) const POLLER_LOCK_KEY: i64 = 0x6167_656e_7472_7902;
/// Repositories polled at once (one request each in flight).
pub const POLL_CONCURRENCY: usize = 4;

/// The reason recorded on a task event, by who saw the pull request's fate.
fn reason(trigger: Trigger, source: &str) -> String {
    match trigger {
        Trigger::PullRequestMerged => format!("pull request merged (seen by {source})"),
        _ => format!("pull request closed without merge (seen by {source})"),
    }
}

/// Applies what `pr_state` means to the task of pull request `number` in `repo`, if that
/// task is waiting on it (in `pr_opened`, or in a revision round). Returns the task this call
/// moved: once the caller's transaction is committed, the agent of a round it ended is
/// stopped with [`Service::stop_moved`]. Runs inside `conn`'s transaction when called from
/// one.
pub(crate) fn apply_pull_state(
    conn: &mut AnyConnection,
    repo: &Repository,
    number: u64,
    pr_state: PullRequestState,
    source: &str,
    now: OffsetDateTime,
) -> Result<Option<Uuid>, DbError> {
    let Ok(number) = i64::try_from(number) else {
        return Ok(None);
    };
    let Some(task) = pulls::task_of_pull(conn, repo.id, number)? else {
        return Ok(None);
    };
    let Some(trigger) = pull_request_trigger(task.state, task.revision(), pr_state) else {
        return Ok(None);
    };
    let error = (trigger == Trigger::PullRequestClosed)
        .then(|| format!("pull request #{number} was closed without being merged"));
    let applied = pulls::apply_pull_outcome(
        conn,
        task.id,
        trigger,
        &reason(trigger, source),
        error.as_deref(),
        now,
    )?;
    Ok(applied.map(|task| task.id))
}

impl Service {
    /// Stops the agents of `moved` (tasks a pull request's merge or close just moved, in a
    /// committed transaction) that run in this process: a revision round's agent, whose
    /// round is over, as [`Service::cancel_task`] stops a cancelled task's. Other replicas
    /// stop theirs when the lease renewal is refused. A task no agent runs here is left
    /// alone.
    pub(crate) fn stop_moved(&self, moved: &[Uuid]) {
        for &task in moved {
            self.parts.runs.stop_local(task);
        }
    }
}

/// What one repository's poll did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RepoPollOutcome {
    /// The first page answered 304.
    pub unchanged: bool,
    /// Tasks moved to `completed` or `failed`.
    pub applied: usize,
    /// Why the poll failed (the watermark did not move).
    pub error: Option<String>,
}

/// The newest `updated_at` of `prs`, or `old` when there is none newer.
fn next_watermark(prs: &[PullRequest], old: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
    prs.iter().map(|p| p.updated_at).chain(old).max()
}

/// How far before its watermark a poll reads again. GitHub's times have whole seconds, and a
/// change may show in the list a moment after a newer one was read, carrying an
/// `updated_at` older than the watermark that newer one set; read from the watermark only,
/// it would be passed over for good. Reading a few seconds again costs nothing: the request
/// is the same (its ETag still gives 304s), an outcome applied again changes nothing (a
/// compare-and-set on a task that waits no more) and feedback seen again is found recorded
/// under its code-host id. The issue sync keeps the same overlap.
const POLL_OVERLAP: time::Duration = time::Duration::seconds(5);

/// Where a poll in state `poll` reads from: [`POLL_OVERLAP`] before its watermark, or where
/// a first poll starts; `None` reads everything.
fn read_from(poll: &PullPollState) -> Option<OffsetDateTime> {
    poll.watermark
        .map(|w| w - POLL_OVERLAP)
        .or(poll.first_since)
}

async fn poll_repository(
    service: &Service,
    github: &GitHub,
    repo: Repository,
    poll: PullPollState,
) -> RepoPollOutcome {
    let mut outcome = RepoPollOutcome::default();
    // A first poll starts shortly before the oldest waiting task, not at the beginning of
    // the repository's history; a later one a little before its watermark (the overlap),
    // both for the pages it reads and for the pull requests it considers.
    let since = poll.watermark.or(poll.first_since);
    let from = read_from(&poll);
    let answer = github
        .pulls_updated_since(
            repo.url.owner(),
            repo.url.name(),
            poll.etag.as_deref(),
            from,
        )
        .await;
    let (prs, etag) = match answer {
        Ok(Conditional::NotModified) => {
            outcome.unchanged = true;
            return outcome;
        }
        Ok(Conditional::Modified { value, etag }) => (value, etag),
        Err(e) => {
            tracing::warn!(repo = %repo.url, error = %e, "pull-request poll failed; will retry");
            outcome.error = Some(e.to_string());
            return outcome;
        }
    };
    // Review feedback on the open pull requests that changed, before the watermark moves:
    // a failure leaves it where it was, and the next poll asks again.
    if let Err(e) = poll_feedback(service, github, &repo, &prs, from).await {
        tracing::warn!(repo = %repo.url, error = %e, "review feedback poll failed; will retry");
        outcome.error = Some(e.to_string());
        return outcome;
    }
    let url = repo.url.clone();
    let stored = service
        .db(move |conn| {
            let watermark = next_watermark(&prs, since);
            let mut moved = Vec::new();
            for pr in prs
                .iter()
                .filter(|p| from.is_none_or(|w| p.updated_at >= w))
            {
                let pr_state = PullRequestState::from_codehost(&pr.state, pr.merged_at.is_some());
                if pr_state == PullRequestState::Open {
                    continue;
                }
                if let Some(task) =
                    apply_pull_state(conn, &repo, pr.number, pr_state, "the poller", now())?
                {
                    moved.push(task);
                }
            }
            // Only now, after every outcome is stored, does the watermark move.
            pulls::record_pull_poll(conn, repo.id, etag.as_deref(), watermark)?;
            Ok(moved)
        })
        .await;
    match stored {
        Ok(moved) => {
            service.stop_moved(&moved);
            outcome.applied = moved.len();
        }
        Err(e) => {
            tracing::error!(repo = %url, error = %e, "cannot store a pull-request poll");
            outcome.error = Some(e.to_string());
        }
    }
    outcome
}

/// Considers the reviews and comments of the open pull requests in `prs` updated since
/// `since` (where the poll reads from) whose coding task may be revised.
async fn poll_feedback(
    service: &Service,
    github: &GitHub,
    repo: &Repository,
    prs: &[PullRequest],
    since: Option<OffsetDateTime>,
) -> Result<(), ServiceError> {
    if repo.settings.max_revisions == 0 {
        return Ok(());
    }
    let open: Vec<u64> = prs
        .iter()
        .filter(|p| since.is_none_or(|w| p.updated_at >= w))
        .filter(|p| {
            PullRequestState::from_codehost(&p.state, p.merged_at.is_some())
                == PullRequestState::Open
        })
        .map(|p| p.number)
        .collect();
    if open.is_empty() {
        return Ok(());
    }
    let repo_id = repo.id;
    let tracked = service
        .db(move |conn| {
            let mut tracked = Vec::new();
            for number in open {
                let Ok(n) = i64::try_from(number) else {
                    continue;
                };
                if let Some(task) = pulls::task_of_pull(conn, repo_id, n)?
                    && (task.state == agentry_domain::TaskState::PrOpened
                        || task.revision().is_some())
                {
                    tracked.push(number);
                }
            }
            Ok(tracked)
        })
        .await?;
    if tracked.is_empty() {
        return Ok(());
    }
    let candidates = crate::revisions::collect_feedback(github, repo, &tracked, since).await?;
    for candidate in candidates {
        service
            .consider(github, repo, candidate, "the poller")
            .await?;
    }
    Ok(())
}

impl Service {
    /// One poll of every repository with tasks waiting on their pull request (in `pr_opened`
    /// or in a revision round): one conditional request each, more pages only while they
    /// hold pull requests updated since a few seconds before the last successful poll's
    /// watermark.
    /// A failure leaves that repository's watermark where it was. 412 without a token.
    pub async fn poll_pull_requests(&self) -> Result<Vec<(Uuid, RepoPollOutcome)>, ServiceError> {
        let github = self.github().await?;
        let repos = self.db(|conn| Ok(pulls::repos_to_poll(conn)?)).await?;
        let outcomes: Vec<(Uuid, RepoPollOutcome)> = futures_util::stream::iter(repos)
            .map(|(repo, poll)| {
                let github = github.clone();
                async move {
                    let id = repo.id;
                    (id, poll_repository(self, &github, repo, poll).await)
                }
            })
            .buffer_unordered(POLL_CONCURRENCY)
            .collect()
            .await;
        self.wake(Loops::OUTBOX.when(outcomes.iter().any(|(_, o)| o.applied > 0)));
        Ok(outcomes)
    }

    /// Forgets the delivery ids recorded more than [`DELIVERY_RETENTION`] before `now`; returns
    /// how many.
    pub async fn forget_old_deliveries(
        &self,
        now: time::OffsetDateTime,
    ) -> Result<usize, ServiceError> {
        self.db(move |conn| {
            Ok(agentry_persistence::webhooks::forget_deliveries_before(
                conn,
                now - DELIVERY_RETENTION,
            )?)
        })
        .await
    }
}

/// The pull-request poller's role: on PostgreSQL an advisory lock, so of several replicas
/// one polls; on SQLite always held.
#[derive(Clone)]
pub(crate) struct Poller {
    /// The lock, or why it cannot be had (then the poller does not start).
    lock: Result<Arc<Mutex<LeaderLock>>, String>,
}

impl Poller {
    /// The poller of the database at `database_url`.
    pub(crate) fn new(database_url: &str) -> Poller {
        Poller {
            lock: LeaderLock::new(database_url, POLLER_LOCK_KEY)
                .map(|lock| Arc::new(Mutex::new(lock)))
                .map_err(|e| e.to_string()),
        }
    }

    /// The poller loop's step: if this process holds the poller role, polls once.
    pub(crate) async fn step(&self, service: &Service) -> StepResult {
        let lock = match &self.lock {
            Ok(lock) => lock.clone(),
            Err(e) => {
                tracing::error!(error = %e, "the pull-request poller cannot start");
                return Ok(Pass::Stop);
            }
        };
        let held = tokio::task::spawn_blocking(move || lock.lock().try_hold())
            .await
            .map_err(|e| format!("the poller's lock task failed: {e}"))?
            .map_err(|e| format!("cannot take the poller role: {e}"))?;
        if !held {
            tracing::debug!("another replica polls pull requests");
            return Ok(Pass::Idle);
        }
        let outcomes = service.poll_pull_requests().await?;
        let applied: usize = outcomes.iter().map(|(_, o)| o.applied).sum();
        tracing::debug!(
            repositories = outcomes.len(),
            applied,
            "pull-request poll done"
        );
        Ok(Pass::Idle)
    }
}

/// What a verified webhook delivery asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// A delivery id seen before: nothing done again.
    Duplicate,
    /// `ping`, or an event that was acted on.
    Handled,
    /// An event agentry does not act on (or about something it does not track).
    Ignored,
}

/// What follows a webhook delivery once its transaction is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Nothing.
    Nothing,
    /// A sync of this repository's issues (one was labelled), after the answer.
    Sync(Uuid),
    /// Stopping the agent of this task, which the delivery moved (a merge or close during a
    /// revision round), if one runs it here.
    Stop(Uuid),
}

/// Records the delivery and acts on `event`, in one transaction: a redelivery of the same
/// id changes nothing, and a pull request's fate is stored before the answer. Returns what
/// follows the commit: a labelled issue's repository to sync (done after answering, never
/// waited on), or the task a pull request's fate moved, whose agent is to be stopped.
pub(crate) fn handle_webhook(
    conn: &mut AnyConnection,
    delivery_id: &str,
    event_name: &str,
    event: &WebhookEvent,
    now: OffsetDateTime,
) -> Result<(WebhookOutcome, Then), DbError> {
    write_tx(conn, |conn| {
        let action = match event {
            WebhookEvent::Ping { .. } => None,
            WebhookEvent::IssueLabeled { .. } => Some("labeled"),
            other => other.action(),
        };
        if !webhooks::record_delivery(conn, delivery_id, event_name, action, now)? {
            return Ok((WebhookOutcome::Duplicate, Then::Nothing));
        }
        let connected = |conn: &mut AnyConnection, html_url: &str| -> Result<_, DbError> {
            let Ok(url) = RepoUrl::parse(html_url) else {
                return Ok(None);
            };
            Ok(repos::find_by_url(conn, &url)?.filter(|r| r.disconnected_at.is_none()))
        };
        match event {
            WebhookEvent::Ping { .. } => Ok((WebhookOutcome::Handled, Then::Nothing)),
            WebhookEvent::IssueLabeled { repo, label, .. } if label == SERVICE_LABEL => {
                match connected(conn, &repo.html_url)? {
                    Some(r) => Ok((WebhookOutcome::Handled, Then::Sync(r.id))),
                    None => Ok((WebhookOutcome::Ignored, Then::Nothing)),
                }
            }
            WebhookEvent::PullRequestClosed {
                repo,
                number,
                merged,
                ..
            } => {
                let Some(r) = connected(conn, &repo.html_url)? else {
                    return Ok((WebhookOutcome::Ignored, Then::Nothing));
                };
                let pr_state = PullRequestState::from_codehost("closed", *merged);
                match apply_pull_state(conn, &r, *number, pr_state, "a webhook", now)? {
                    Some(task) => Ok((WebhookOutcome::Handled, Then::Stop(task))),
                    None => Ok((WebhookOutcome::Ignored, Then::Nothing)),
                }
            }
            // Review feedback: what it asks for needs the code host (the author's
            // permission), so it is decided after the delivery is recorded
            // (`Service::webhook_event`); its own id keeps it once.
            WebhookEvent::PullRequestReviewSubmitted { repo, .. }
            | WebhookEvent::IssueCommentCreated { repo, .. }
            | WebhookEvent::ReviewCommentCreated { repo, .. } => {
                match connected(conn, &repo.html_url)? {
                    Some(_) => Ok((WebhookOutcome::Handled, Then::Nothing)),
                    None => Ok((WebhookOutcome::Ignored, Then::Nothing)),
                }
            }
            WebhookEvent::IssueLabeled { .. } | WebhookEvent::Other { .. } => {
                Ok((WebhookOutcome::Ignored, Then::Nothing))
            }
        }
    })
}

impl Service {
    /// Acts on a webhook event whose signature the caller verified (`handle_webhook`), then
    /// wakes what it concerns: the outbox after a pull request's fate was stored (and the
    /// agent of a revision round it ended is stopped), and the issue-sync loop for a sync of
    /// the repository after an issue was labelled (never waited on; deliveries that arrive
    /// while one runs cause one more, not one each).
    pub async fn webhook_event(
        &self,
        delivery_id: String,
        event_name: String,
        event: WebhookEvent,
    ) -> Result<WebhookOutcome, ServiceError> {
        let feedback = (matches!(
            event,
            WebhookEvent::PullRequestReviewSubmitted { .. }
                | WebhookEvent::IssueCommentCreated { .. }
                | WebhookEvent::ReviewCommentCreated { .. }
        ))
        .then(|| event.clone());
        // Feedback is decided (and wakes what it concerns) after this answer.
        let decided_later = feedback.is_some();
        let (outcome, then) = self
            .commit(
                move |conn| {
                    Ok(handle_webhook(
                        conn,
                        &delivery_id,
                        &event_name,
                        &event,
                        now(),
                    )?)
                },
                |(outcome, _)| {
                    Loops::OUTBOX.when(*outcome == WebhookOutcome::Handled && !decided_later)
                },
            )
            .await?;
        if let (WebhookOutcome::Handled, Some(event)) = (&outcome, feedback) {
            // Decided in the background: the author's permission may need the code host,
            // and GitHub waits 10 s at most for the answer.
            let service = self.clone();
            tokio::spawn(async move {
                if let Some(Err(e)) = service.feedback_event(&event).await {
                    tracing::warn!(error = %e, "review feedback from a webhook not decided; the poll finds it again");
                }
            });
            return Ok(outcome);
        }
        match then {
            Then::Sync(repo_id) => self.request_sync(repo_id),
            Then::Stop(task) => self.stop_moved(&[task]),
            Then::Nothing => {}
        }
        Ok(outcome)
    }
}

/// How long recorded delivery ids are kept. GitHub redelivers deliveries of the past three
/// days only, so an older id can never arrive again.
pub const DELIVERY_RETENTION: time::Duration = time::Duration::days(7);

/// The delivery-pruning loop's step: forgets old delivery ids, so the de-duplication table
/// stays as small as GitHub's redelivery window. A failure is tried again next time.
pub(crate) async fn delivery_pruning_step(service: &Service) -> StepResult {
    let forgotten = service
        .forget_old_deliveries(agentry_persistence::now())
        .await?;
    if forgotten > 0 {
        tracing::info!(forgotten, "forgot old webhook delivery ids");
    }
    Ok(Pass::Idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pr(number: u64, updated: i64) -> PullRequest {
        PullRequest {
            number,
            title: String::new(),
            body: String::new(),
            html_url: String::new(),
            state: "open".into(),
            merged_at: None,
            closed_at: None,
            updated_at: OffsetDateTime::from_unix_timestamp(updated)
                .unwrap_or(OffsetDateTime::UNIX_EPOCH),
            head_ref: String::new(),
            base_ref: String::new(),
        }
    }

    #[test]
    fn the_watermark_only_moves_forward() {
        let t = |s| OffsetDateTime::from_unix_timestamp(s).ok();
        assert_eq!(next_watermark(&[], None), None);
        assert_eq!(next_watermark(&[], t(50)), t(50));
        assert_eq!(next_watermark(&[pr(1, 10), pr(2, 70)], t(50)), t(70));
        assert_eq!(next_watermark(&[pr(1, 10)], t(50)), t(50));
    }

    #[test]
    fn a_poll_reads_from_a_little_before_its_watermark() {
        let t = |s| OffsetDateTime::from_unix_timestamp(s).ok();
        let state = |watermark, first_since| PullPollState {
            etag: None,
            watermark,
            first_since,
        };
        assert_eq!(read_from(&state(None, None)), None);
        assert_eq!(read_from(&state(None, t(1_000))), t(1_000));
        assert_eq!(read_from(&state(t(1_000), None)), t(995));
    }

    #[test]
    fn event_reasons_name_the_source() {
        assert_eq!(
            reason(Trigger::PullRequestMerged, "a webhook"),
            "pull request merged (seen by a webhook)"
        );
        assert!(reason(Trigger::PullRequestClosed, "the poller").contains("without merge"));
    }
}
