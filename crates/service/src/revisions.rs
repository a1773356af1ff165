//! Revisions (docs/contract.md#57-revisions): review feedback on a pull request agentry opened
//! sends its coding agent back to the same pull request.
//!
//! Feedback arrives through the signed webhook ([`Service::feedback_event`]) or the
//! pull-request poll (`collect_feedback`); both end in `Service::consider`, which keeps what asks
//! for changes from someone who may write to the repository, once per code-host id
//! ([`revisions::insert`]). A round starts when the quiet period after the latest feedback
//! has passed ([`Service::start_due_rounds`], driven by `revision_step`): the task goes `pr_opened →
//! queued` and the runner treats it as any queued task, with a revision's job
//! (`runs/prepare.rs`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use agentry_codehost::webhook::WebhookEvent;
use agentry_codehost::{GitHub, Permission};
use agentry_domain::backoff::Backoff;
use agentry_domain::{RepoUrl, Task, TaskState, TaskType, Trigger};
use agentry_persistence::outbox::{self, Action, NewEffect};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::revisions::{
    self, Feedback, FeedbackOutcome, FeedbackSource, NewFeedback,
};
use agentry_persistence::tasks::{self, TransitionDetails};
use agentry_persistence::{AnyConnection, DbError, pulls, write_tx};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::background::{Pass, Schedule, StepResult};
use crate::config::DEFAULT_MENTION;
use crate::wake::Loops;
use crate::{Service, ServiceError, now};

/// How long a collaborator's permission, as the code host answered, is trusted.
pub(crate) const PERMISSION_TTL: Duration = Duration::from_secs(60);
/// The reaction that acknowledges a comment.
pub(crate) const ACK_REACTION: &str = "eyes";
/// The most due tasks one pass of [`Service::start_due_rounds`] starts.
const ROUNDS_PER_PASS: i64 = 32;
/// The longest the revision loop sleeps without looking (feedback recorded by another
/// replica wakes nobody here).
const LOOP_TICK: Duration = Duration::from_secs(1);

/// How revisions behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionSettings {
    /// The handle whose mention asks for a revision (`AGENTRY_MENTION`).
    pub mention: String,
    /// The quiet period before a round starts (`AGENTRY_REVISION_QUIET_SECS`).
    pub quiet: Duration,
}

impl Default for RevisionSettings {
    fn default() -> Self {
        RevisionSettings {
            mention: DEFAULT_MENTION.to_owned(),
            quiet: Duration::from_secs(5),
        }
    }
}

/// The revision part of the code-host integration: settings, the permission cache and the
/// revision loop's wake-up.
#[derive(Debug, Default)]
pub struct Revisions {
    settings: RevisionSettings,
    /// (repository URL, login) → permission, when asked.
    permissions: Mutex<HashMap<(String, String), (Permission, Instant)>>,
    pub(crate) wake: tokio::sync::Notify,
}

impl Revisions {
    /// Revisions with `settings`.
    pub fn new(settings: RevisionSettings) -> Self {
        Revisions {
            settings,
            ..Revisions::default()
        }
    }

    /// The settings.
    pub fn settings(&self) -> &RevisionSettings {
        &self.settings
    }
}

/// A comment or review that may ask for changes, as the webhook or the poll saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Where it comes from.
    pub source: FeedbackSource,
    /// Its code-host id.
    pub external_id: String,
    /// The pull request it is on.
    pub pr_number: u64,
    /// Its author's login.
    pub author: String,
    /// Its text.
    pub body: String,
    /// A review comment's file.
    pub path: Option<String>,
    /// A review comment's line.
    pub line: Option<u64>,
    /// Its web address.
    pub url: String,
    /// A review's state, upper case (`CHANGES_REQUESTED`, …).
    pub review_state: Option<String>,
}

/// Whether `body` mentions `handle` (case-insensitively, as a whole handle: not inside an
/// e-mail address or a longer login), outside quoted lines (`> …`) and code.
pub fn mentions(body: &str, handle: &str) -> bool {
    let handle = handle.to_ascii_lowercase();
    let login_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut fenced = false;
    for line in body.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced || trimmed.starts_with('>') {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        let mut from = 0;
        while let Some(found) = lower[from..].find(&handle) {
            let start = from + found;
            let end = start + handle.len();
            let before = lower[..start].chars().next_back();
            let after = lower[end..].chars().next();
            let in_code = lower[..start].matches('`').count() % 2 == 1;
            if !before.is_some_and(|c| login_char(c) || c == '@' || c == '.')
                && !after.is_some_and(login_char)
                && !in_code
            {
                return true;
            }
            from = end;
        }
    }
    false
}

/// Whether the text is agentry's own (a comment or review it posted carries a marker).
fn is_agentrys(body: &str) -> bool {
    body.contains("<!-- agentry:")
}

/// Whether `candidate` asks for changes: a review with "changes requested", or a comment
/// that mentions `handle`.
pub(crate) fn asks_for_changes(candidate: &Candidate, handle: &str) -> bool {
    match candidate.source {
        FeedbackSource::Review => candidate
            .review_state
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("CHANGES_REQUESTED")),
        FeedbackSource::IssueComment | FeedbackSource::ReviewComment => {
            mentions(&candidate.body, handle)
        }
        FeedbackSource::AgentReview => true,
    }
}

/// What became of a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Considered {
    /// Recorded: it waits for a round due at this time.
    Waiting(OffsetDateTime),
    /// Recorded, but the repository's `maxRevisions` is reached: nothing runs.
    OverLimit,
    /// Seen before (a redelivery, the webhook and the poll): nothing changed.
    Duplicate,
    /// Not for agentry, with why (logged, never answered on the code host).
    Ignored(String),
}

impl Considered {
    /// The loops recording it wakes: the scheduler for a round due, the outbox for what
    /// it says on the pull request.
    pub(crate) fn wakes(&self) -> Loops {
        match self {
            Considered::Waiting(_) => Loops::REVISIONS | Loops::OUTBOX,
            Considered::OverLimit => Loops::OUTBOX,
            Considered::Duplicate | Considered::Ignored(_) => Loops::NONE,
        }
    }
}

/// The task a revision of pull request `number` would run for: the coding task that opened
/// it, while its pull request is open as far as agentry knows (`pr_opened`, or a round under
/// way).
fn revisable_task(
    conn: &mut AnyConnection,
    repo: &Repository,
    number: u64,
) -> Result<Result<Task, String>, DbError> {
    let Ok(number) = i64::try_from(number) else {
        return Ok(Err("no such pull request".into()));
    };
    let Some(task) = pulls::task_of_pull(conn, repo.id, number)? else {
        return Ok(Err(format!(
            "pull request #{number} was not opened by agentry"
        )));
    };
    if task.task_type != TaskType::Coding {
        return Ok(Err("not a coding task's pull request".into()));
    }
    if task.state != TaskState::PrOpened && task.revision().is_none() {
        return Ok(Err(format!(
            "pull request #{number} is no longer open (task {} is {})",
            task.id, task.state
        )));
    }
    Ok(Ok(task))
}

impl Service {
    /// `login`'s permission on `repo`, from the cache while it is fresh.
    async fn permission(
        &self,
        github: &GitHub,
        repo: &RepoUrl,
        login: &str,
    ) -> Result<Permission, ServiceError> {
        let key = (repo.as_str().to_owned(), login.to_ascii_lowercase());
        let cache = &self.parts.codehost.revisions().permissions;
        if let Some((permission, at)) = cache.lock().get(&key)
            && at.elapsed() < PERMISSION_TTL
        {
            return Ok(*permission);
        }
        let permission = github
            .collaborator_permission(repo.owner(), repo.name(), login)
            .await?;
        let mut cache = cache.lock();
        cache.retain(|_, (_, at)| at.elapsed() < PERMISSION_TTL);
        cache.insert(key, (permission, Instant::now()));
        Ok(permission)
    }

    /// Acts on the feedback events of a verified webhook delivery whose id was recorded
    /// (`tracking::handle_webhook`): reviews, comments and review comments. Returns `None`
    /// for any other event.
    pub async fn feedback_event(
        &self,
        event: &WebhookEvent,
    ) -> Option<Result<Considered, ServiceError>> {
        let (html_url, candidate) = candidate_of(event)?;
        Some(self.feedback_from(&html_url, candidate, "a webhook").await)
    }

    async fn feedback_from(
        &self,
        repo_html_url: &str,
        candidate: Candidate,
        seen_by: &str,
    ) -> Result<Considered, ServiceError> {
        let Ok(url) = RepoUrl::parse(repo_html_url) else {
            return Ok(Considered::Ignored("not a repository URL".into()));
        };
        let repo = self
            .db(move |conn| Ok(repos::find_by_url(conn, &url)?))
            .await?
            .filter(|r| r.disconnected_at.is_none());
        let Some(repo) = repo else {
            return Ok(Considered::Ignored(
                "the repository is not connected".into(),
            ));
        };
        let github = self.github().await?;
        self.consider(&github, &repo, candidate, seen_by).await
    }
}

/// The repository and candidate of a feedback event.
fn candidate_of(event: &WebhookEvent) -> Option<(String, Candidate)> {
    match event {
        WebhookEvent::PullRequestReviewSubmitted {
            repo,
            number,
            review_id,
            author,
            state,
            body,
            html_url,
        } => Some((
            repo.html_url.clone(),
            Candidate {
                source: FeedbackSource::Review,
                external_id: review_id.to_string(),
                pr_number: *number,
                author: author.clone(),
                body: body.clone(),
                path: None,
                line: None,
                url: html_url.clone(),
                review_state: Some(state.clone()),
            },
        )),
        WebhookEvent::IssueCommentCreated {
            repo,
            issue_number,
            is_pull_request: true,
            comment_id,
            author,
            body,
            html_url,
        } => Some((
            repo.html_url.clone(),
            Candidate {
                source: FeedbackSource::IssueComment,
                external_id: comment_id.to_string(),
                pr_number: *issue_number,
                author: author.clone(),
                body: body.clone(),
                path: None,
                line: None,
                url: html_url.clone(),
                review_state: None,
            },
        )),
        WebhookEvent::ReviewCommentCreated {
            repo,
            number,
            comment_id,
            author,
            body,
            path,
            line,
            html_url,
        } => Some((
            repo.html_url.clone(),
            Candidate {
                source: FeedbackSource::ReviewComment,
                external_id: comment_id.to_string(),
                pr_number: *number,
                author: author.clone(),
                body: body.clone(),
                path: Some(path.clone()),
                line: *line,
                url: html_url.clone(),
                review_state: None,
            },
        )),
        _ => None,
    }
}

impl Service {
    /// Decides on one candidate and records it: the checks that need no code host first
    /// (asks for changes, not agentry's own, a pull request agentry opened and still open,
    /// revisions on, not seen before), then the author's permission, asked of the code host
    /// (cached for [`PERMISSION_TTL`]). Ignored candidates are logged, never answered.
    pub(crate) async fn consider(
        &self,
        github: &GitHub,
        repo: &Repository,
        candidate: Candidate,
        seen_by: &str,
    ) -> Result<Considered, ServiceError> {
        let settings = self.parts.codehost.revisions().settings().clone();
        let ignored = |why: String| {
            tracing::info!(
                repo = %repo.url, pull = candidate.pr_number, author = %candidate.author,
                source = candidate.source.as_str(), seen_by, why = %why,
                "feedback ignored"
            );
            Ok(Considered::Ignored(why))
        };
        if !asks_for_changes(&candidate, &settings.mention) {
            // Most comments are not for agentry: not worth a log line each.
            return Ok(Considered::Ignored("does not ask for changes".into()));
        }
        if candidate.source != FeedbackSource::AgentReview && is_agentrys(&candidate.body) {
            return ignored("agentry's own text".into());
        }
        if candidate.source != FeedbackSource::AgentReview {
            let own = github.own_login().await?;
            if candidate.author.eq_ignore_ascii_case(&own) {
                return ignored("written by agentry's own account".into());
            }
        }
        if repo.settings.max_revisions == 0 {
            return ignored("revisions are off for the repository (maxRevisions 0)".into());
        }
        let (repo_id, number, source, external_id) = (
            repo.id,
            candidate.pr_number,
            candidate.source,
            candidate.external_id.clone(),
        );
        let r = repo.clone();
        let found = self
            .db(move |conn| {
                if revisions::is_recorded(conn, repo_id, source, &external_id)? {
                    return Ok(None);
                }
                Ok(Some(revisable_task(conn, &r, number)?))
            })
            .await?;
        let task = match found {
            None => return Ok(Considered::Duplicate),
            Some(Err(why)) => return ignored(why),
            Some(Ok(task)) => task,
        };
        if candidate.source != FeedbackSource::AgentReview {
            let permission = self
                .permission(github, &repo.url, &candidate.author)
                .await?;
            if !permission.can_write() {
                return ignored(format!(
                    "@{} may not write to the repository ({})",
                    candidate.author,
                    permission.as_str()
                ));
            }
        }
        let recorded = record(self, repo, &task, &candidate, settings.quiet).await?;
        match &recorded {
            Considered::Waiting(due) => {
                tracing::info!(
                    task = %task.id, pull = number, author = %candidate.author, seen_by,
                    source = candidate.source.as_str(), due = %due, "revision feedback recorded"
                );
            }
            Considered::OverLimit => {
                tracing::info!(task = %task.id, pull = number, "feedback past maxRevisions: no revision");
            }
            Considered::Duplicate | Considered::Ignored(_) => {}
        }
        Ok(recorded)
    }

    /// One pass of the revision scheduler: starts a round for every task whose quiet period
    /// ended by `at` and that waits at `pr_opened`; returns how many started.
    ///
    /// A task busy with a round is left alone: its return to `pr_opened` makes it due again
    /// (`tasks::transition_task`). Every step is a compare-and-set, so replicas running this at
    /// once start each round once.
    pub async fn start_due_rounds(&self, at: OffsetDateTime) -> Result<usize, ServiceError> {
        let due = self
            .db(move |conn| Ok(revisions::due_tasks(conn, at, ROUNDS_PER_PASS)?))
            .await?;
        let mut started = 0;
        for task_id in due {
            let round = self
                .commit(
                    move |conn| Ok(start_round(conn, task_id, at)?),
                    |started| (Loops::RUNNER | Loops::OUTBOX).when(started.is_some()),
                )
                .await;
            match round {
                Ok(Some(task)) => {
                    started += 1;
                    tracing::info!(task = %task.id, attempt = task.attempt, round = task.revisions, "revision round started");
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(task = %task_id, error = %e, "could not start a revision round")
                }
            }
        }
        Ok(started)
    }
}

/// The marker of the one comment saying a task's revision limit is reached.
pub(crate) fn limit_marker(task_id: Uuid) -> String {
    format!("<!-- agentry:revision-limit:{task_id} -->")
}

/// The marker of the reply that acknowledges a round.
pub(crate) fn round_marker(task_id: Uuid, attempt: i32) -> String {
    format!("<!-- agentry:revision:{task_id}:{attempt} -->")
}

/// The marker of the reply on a round that changed nothing or failed.
pub(crate) fn round_end_marker(task_id: Uuid, attempt: i32) -> String {
    format!("<!-- agentry:revision-end:{task_id}:{attempt} -->")
}

fn limit_notice(task: &Task, max: i32) -> Action {
    let marker = limit_marker(task.id);
    Action::Reply {
        issue_number: task.pr_number.unwrap_or_default(),
        body: format!(
            "agentry has revised this pull request {max} time{s}, the repository's limit \
             (`maxRevisions`); further feedback is not acted on. Task `{id}`.\n\n{marker}",
            s = if max == 1 { "" } else { "s" },
            id = task.id,
        ),
        marker,
    }
}

/// Records `candidate` for `task` in one transaction, with its acknowledgement (a reaction
/// on a comment) or, past the repository's limit, the one comment saying so.
async fn record(
    service: &Service,
    repo: &Repository,
    task: &Task,
    candidate: &Candidate,
    quiet: Duration,
) -> Result<Considered, ServiceError> {
    let new = new_feedback(repo, task, candidate);
    let react = match candidate.source {
        FeedbackSource::IssueComment | FeedbackSource::ReviewComment => candidate
            .external_id
            .parse::<i64>()
            .ok()
            .map(|comment_id| Action::React {
                issue_number: new.pr_number,
                comment_id,
                review_comment: candidate.source == FeedbackSource::ReviewComment,
                content: ACK_REACTION.to_owned(),
            }),
        FeedbackSource::Review | FeedbackSource::AgentReview => None,
    };
    let max = repo.settings.max_revisions;
    service
        .commit(
            move |conn| {
                Ok(write_tx::<_, DbError, _>(conn, |conn| {
                    record_in(conn, &new, react, max, quiet)
                })?)
            },
            Considered::wakes,
        )
        .await
}

/// The feedback row `candidate` makes for `task`'s pull request.
fn new_feedback(repo: &Repository, task: &Task, candidate: &Candidate) -> NewFeedback {
    NewFeedback {
        repo_id: repo.id,
        source: candidate.source,
        external_id: candidate.external_id.clone(),
        task_id: task.id,
        pr_number: task.pr_number.unwrap_or_default(),
        author: candidate.author.clone(),
        body: candidate.body.clone(),
        path: candidate.path.clone(),
        line: candidate.line.and_then(|l| i64::try_from(l).ok()),
        url: candidate.url.clone(),
    }
}

/// [`record`]'s writes, inside the caller's transaction: the feedback row, then its
/// acknowledgement (`react`) and the round's due time, or past `max` rounds the one comment
/// saying so.
fn record_in(
    conn: &mut AnyConnection,
    new: &NewFeedback,
    react: Option<Action>,
    max: i32,
    quiet: Duration,
) -> Result<Considered, DbError> {
    let (repo_id, task_id) = (new.repo_id, new.task_id);
    revisions::lock_task(conn, task_id)?;
    let task = tasks::get_task(conn, task_id)?;
    if task.state != TaskState::PrOpened && task.revision().is_none() {
        return Ok(Considered::Ignored(
            "the pull request is no longer open".into(),
        ));
    }
    let at = now();
    let over = task.revisions >= max;
    let outcome = if over {
        FeedbackOutcome::OverLimit
    } else {
        FeedbackOutcome::Waiting
    };
    if !revisions::insert(conn, new, outcome, at)? {
        return Ok(Considered::Duplicate);
    }
    if over {
        if revisions::count(conn, task_id, FeedbackOutcome::OverLimit)? == 1 {
            let effect = NewEffect {
                task_id: None,
                repo_id,
                action: limit_notice(&task, max),
            };
            outbox::enqueue(conn, &effect, at)?;
        }
        return Ok(Considered::OverLimit);
    }
    let quiet = time::Duration::try_from(quiet).unwrap_or(time::Duration::ZERO);
    let due = at + quiet;
    revisions::set_due(conn, task_id, Some(due))?;
    if let Some(action) = react {
        let effect = NewEffect {
            task_id: None,
            repo_id,
            action,
        };
        outbox::enqueue(conn, &effect, at)?;
    }
    Ok(Considered::Waiting(due))
}

/// Records the findings of agentry's own review agent (review task `review_task`, on the
/// pull request of `coding_task`) as feedback for the coding task's next round, inside the
/// transaction that records the review as posted, so that a crash between the two cannot
/// lose it. The caller checks the repository asks for that (`reviseOnAgentReview`) and holds
/// the coding task's lock ([`revisions::lock_task`]) from the start of its transaction.
pub(crate) fn agent_review_in(
    conn: &mut AnyConnection,
    repo: &Repository,
    review_task: Uuid,
    coding_task: Uuid,
    text: &str,
    quiet: Duration,
) -> Result<Considered, DbError> {
    if repo.settings.max_revisions == 0 {
        return Ok(Considered::Ignored(
            "revisions are off for the repository (maxRevisions 0)".into(),
        ));
    }
    let external_id = review_task.to_string();
    if revisions::is_recorded(conn, repo.id, FeedbackSource::AgentReview, &external_id)? {
        return Ok(Considered::Duplicate);
    }
    let task = tasks::get_task(conn, coding_task)?;
    let (Some(number), Some(url)) = (task.pr_number, task.pr_url.clone()) else {
        return Ok(Considered::Ignored(
            "the coding task has no pull request".into(),
        ));
    };
    let Ok(number) = u64::try_from(number) else {
        return Ok(Considered::Ignored("no such pull request".into()));
    };
    let task = match revisable_task(conn, repo, number)? {
        Ok(task) if task.id == coding_task => task,
        Ok(_) => return Ok(Considered::Ignored("another task's pull request".into())),
        Err(why) => return Ok(Considered::Ignored(why)),
    };
    let candidate = Candidate {
        source: FeedbackSource::AgentReview,
        external_id,
        pr_number: number,
        author: "agentry".to_owned(),
        body: text.to_owned(),
        path: None,
        line: None,
        url,
        review_state: None,
    };
    let new = new_feedback(repo, &task, &candidate);
    record_in(conn, &new, None, repo.settings.max_revisions, quiet)
}

/// Who gave `feedback`, each once, as a reply names them: `@login`, and agentry's own
/// review agent by name (its feedback is stored with the author `agentry`, a login that
/// belongs to somebody else on the code host, who must not be pinged).
fn feedback_authors(feedback: &[Feedback]) -> Vec<String> {
    let mut authors: Vec<String> = Vec::new();
    for f in feedback {
        let who = match f.source {
            FeedbackSource::AgentReview => "agentry's review".to_owned(),
            _ => format!("@{}", f.author),
        };
        if !authors.contains(&who) {
            authors.push(who);
        }
    }
    authors
}

/// The reason of the task event that starts a round.
fn round_reason(feedback: &[Feedback]) -> String {
    let who = feedback_authors(feedback).join(", ");
    let link = feedback.first().map(|f| f.url.as_str()).unwrap_or_default();
    match feedback.len() {
        1 => format!("revision requested by {who} ({link})"),
        n => format!("revision requested by {who}: {n} comments ({link})"),
    }
}

fn round_reply(task: &Task, attempt: i32, round: i32, max: i32, feedback: &[Feedback]) -> Action {
    let marker = round_marker(task.id, attempt);
    let authors = feedback_authors(feedback);
    Action::Reply {
        issue_number: task.pr_number.unwrap_or_default(),
        body: format!(
            "agentry is revising this pull request for the feedback of {} (round {round} of \
             at most {max}; task `{}`).\n\n{marker}",
            authors.join(", "),
            task.id
        ),
        marker,
    }
}

/// Starts the task's round if it is due and waits at `pr_opened`, in one transaction: the
/// transition, the feedback taken, the acknowledgement. `None` when nothing started.
fn start_round(
    conn: &mut AnyConnection,
    task_id: Uuid,
    at: OffsetDateTime,
) -> Result<Option<Task>, DbError> {
    write_tx(conn, |conn| {
        revisions::lock_task(conn, task_id)?;
        let task = tasks::get_task(conn, task_id)?;
        if task.imported {
            // History is never revised (feedback recorded for it before imported tasks were
            // left out of tracking): what waits is dropped.
            revisions::settle_waiting(conn, task_id, FeedbackOutcome::Dropped, None)?;
            revisions::set_due(conn, task_id, None)?;
            return Ok(None);
        }
        if task.state != TaskState::PrOpened {
            // Busy with a round (made due again when it ends) or over (its waiting feedback
            // was dropped): nothing waits here.
            revisions::set_due(conn, task_id, None)?;
            return Ok(None);
        }
        let waiting = revisions::with_outcome(conn, task_id, FeedbackOutcome::Waiting)?;
        revisions::set_due(conn, task_id, None)?;
        if waiting.is_empty() {
            return Ok(None);
        }
        let Some(repo_id) = task.repo_id else {
            return Ok(None);
        };
        let repo = repos::get_repository(conn, repo_id)?;
        let max = repo.settings.max_revisions;
        if task.revisions >= max {
            let moved = revisions::settle_waiting(conn, task_id, FeedbackOutcome::OverLimit, None)?;
            if moved > 0
                && max > 0
                && revisions::count(conn, task_id, FeedbackOutcome::OverLimit)? == moved as i64
            {
                let effect = NewEffect {
                    task_id: None,
                    repo_id,
                    action: limit_notice(&task, max),
                };
                outbox::enqueue(conn, &effect, at)?;
            }
            return Ok(None);
        }
        let details = TransitionDetails {
            reason: Some(round_reason(&waiting)),
            error_message: None,
            pull_request: None,
        };
        let (task, t) =
            tasks::transition_task(conn, task_id, Trigger::RevisionRequested, &details, at)?;
        revisions::settle_waiting(conn, task_id, FeedbackOutcome::Taken, Some(t.attempt))?;
        let effect = NewEffect {
            task_id: None,
            repo_id,
            action: round_reply(&task, t.attempt, task.revisions, max, &waiting),
        };
        outbox::enqueue(conn, &effect, at)?;
        Ok(Some(task))
    })
}

/// The revision loop's schedule: woken when feedback is recorded, else every `LOOP_TICK`
/// (feedback recorded by another replica wakes nobody here); at least 100 ms between two
/// steps, so rounds that stay due (a failing database) do not spin, and failures retried
/// after 100 ms, doubling up to `LOOP_TICK`.
pub(crate) fn schedule() -> Schedule {
    let min_wait = Duration::from_millis(100);
    Schedule::woken(Loops::REVISIONS, LOOP_TICK)
        .at_least(min_wait)
        .backing_off(Backoff {
            base: min_wait,
            max: LOOP_TICK,
        })
        .quiet()
}

/// The revision loop's step: starts the rounds whose quiet period has ended, then says when
/// the next one is due.
pub(crate) async fn revision_step(service: &Service) -> StepResult {
    service.start_due_rounds(now()).await?;
    let next = service.db(|conn| Ok(revisions::next_due(conn)?)).await?;
    Ok(next.map_or(Pass::Idle, |at| {
        Pass::DueIn(Duration::try_from(at - now()).unwrap_or(Duration::ZERO))
    }))
}

/// Collects the feedback of the open pull requests `numbers` of `repo` that changed since
/// `since` (where the poll reads from, a little before its watermark): each one's reviews,
/// comments and review comments, as candidates for `Service::consider`. Comments are asked
/// for a minute before `since` (clocks differ); what was seen before is then found
/// recorded.
pub(crate) async fn collect_feedback(
    github: &GitHub,
    repo: &Repository,
    numbers: &[u64],
    since: Option<OffsetDateTime>,
) -> Result<Vec<Candidate>, agentry_codehost::CodeHostError> {
    let (owner, name) = (repo.url.owner(), repo.url.name());
    let since = since.map(|s| s - time::Duration::minutes(1));
    let mut found = Vec::new();
    for &number in numbers {
        for review in github.reviews(owner, name, number).await? {
            if review.state.eq_ignore_ascii_case("CHANGES_REQUESTED")
                && since.is_none_or(|s| review.submitted_at.is_none_or(|at| at >= s))
            {
                found.push(Candidate {
                    source: FeedbackSource::Review,
                    external_id: review.id.to_string(),
                    pr_number: number,
                    author: review.author,
                    body: review.body,
                    path: None,
                    line: None,
                    url: review.html_url,
                    review_state: Some(review.state),
                });
            }
        }
        for comment in github
            .issue_comments_since(owner, name, number, since)
            .await?
        {
            found.push(Candidate {
                source: FeedbackSource::IssueComment,
                external_id: comment.id.to_string(),
                pr_number: number,
                author: comment.author,
                body: comment.body,
                path: None,
                line: None,
                url: comment.html_url,
                review_state: None,
            });
        }
        for comment in github.review_comments(owner, name, number, since).await? {
            found.push(Candidate {
                source: FeedbackSource::ReviewComment,
                external_id: comment.id.to_string(),
                pr_number: number,
                author: comment.author,
                body: comment.body,
                path: Some(comment.path),
                line: comment.line,
                url: comment.html_url,
                review_state: None,
            });
        }
    }
    Ok(found)
}

/// The feedback a revision round took, for its prompt.
pub(crate) fn round_feedback(
    conn: &mut AnyConnection,
    task: &Task,
) -> Result<Vec<Feedback>, DbError> {
    match task.revision() {
        Some(round) => revisions::of_round(conn, task.id, round.first_attempt),
        None => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mention_is_a_whole_handle_outside_quotes_and_code() {
        let m = |body: &str| mentions(body, "@agentry");
        assert!(m("@agentry please rename this"));
        assert!(m("Could you fix it, @Agentry?"));
        assert!(m("line one\n@agentry: use a map"));
        assert!(!m("@agentry-bot please"));
        assert!(!m("mail me at ops@agentry.dev"));
        assert!(!m("> @agentry said so\nok"));
        assert!(!m("`@agentry` is the handle"));
        assert!(!m("```\n@agentry\n```"));
        assert!(!m("thanks @agentryx"));
        assert!(!m("nothing here"));
    }

    fn candidate(source: FeedbackSource, body: &str, state: Option<&str>) -> Candidate {
        Candidate {
            source,
            external_id: "1".into(),
            pr_number: 1,
            author: "alice".into(),
            body: body.into(),
            path: None,
            line: None,
            url: String::new(),
            review_state: state.map(str::to_owned),
        }
    }

    #[test]
    fn what_asks_for_changes() {
        let h = "@agentry";
        assert!(asks_for_changes(
            &candidate(FeedbackSource::Review, "", Some("CHANGES_REQUESTED")),
            h
        ));
        assert!(!asks_for_changes(
            &candidate(
                FeedbackSource::Review,
                "@agentry looks good",
                Some("APPROVED")
            ),
            h
        ));
        assert!(asks_for_changes(
            &candidate(FeedbackSource::IssueComment, "@agentry add tests", None),
            h
        ));
        assert!(!asks_for_changes(
            &candidate(FeedbackSource::ReviewComment, "nit: spacing", None),
            h
        ));
        assert!(is_agentrys("done\n<!-- agentry:review:x -->"));
    }

    #[test]
    fn the_round_reason_names_everyone_once() {
        let f = |author: &str, url: &str| Feedback {
            source: FeedbackSource::IssueComment,
            external_id: "1".into(),
            pr_number: 3,
            author: author.into(),
            body: String::new(),
            path: None,
            line: None,
            url: url.into(),
            received_at: OffsetDateTime::UNIX_EPOCH,
            round_attempt: None,
            outcome: FeedbackOutcome::Waiting,
        };
        assert_eq!(
            round_reason(&[f("alice", "u1")]),
            "revision requested by @alice (u1)"
        );
        assert_eq!(
            round_reason(&[f("alice", "u1"), f("bob", "u2"), f("alice", "u3")]),
            "revision requested by @alice, @bob: 3 comments (u1)"
        );
        // agentry's own review agent is named, not pinged as the login `agentry`.
        let review = Feedback {
            source: FeedbackSource::AgentReview,
            ..f("agentry", "u4")
        };
        assert_eq!(
            round_reason(&[review.clone(), f("alice", "u5")]),
            "revision requested by agentry's review, @alice: 2 comments (u4)"
        );
        // The round's reply names them the same way.
        assert_eq!(feedback_authors(&[review]), ["agentry's review"]);
    }
}
