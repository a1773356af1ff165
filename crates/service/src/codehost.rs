//! The service side of the code-host integration (docs/contract.md#33-secrets–#37-assign, #51-token–#54-effects-of-assignment): the one
//! client built from the stored token (a secret, `secrets.rs`), assignment of an issue
//! (the task and its outbox effects in one transaction), issue sync, and delivery of the
//! outbox.
//!
//! Decisions live in plain functions ([`assign`], `comment_body`); the async functions
//! around them read, call the code host through [`GitHub`], and write. The outbox is
//! delivered by the service's one leased delivery worker (the same as the budget alerts');
//! this module gives it the send step, [`deliver`].

use parking_lot::Mutex;
use std::collections::HashSet;
use std::time::Duration;

use agentry_codehost::{ClientConfig, CodeHostError, Conditional, GitHub, Issue, ReactionTarget};
use agentry_domain::backoff::Backoff;
use agentry_domain::{AgentType, RepoUrl, Task, TaskType};
use agentry_persistence::issues::{self, FullRead, IssueLabel, IssueSyncCursor, SyncedIssue};
use agentry_persistence::outbox::{self, Action, Effect, NewEffect};
use agentry_persistence::repos::{self, NewRepository, Repository};
use agentry_persistence::secrets::SecretValue;
use agentry_persistence::tasks::{self, NewTask};
use agentry_persistence::{AnyConnection, DbError};
use futures_util::StreamExt;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::background::{Pass, StepResult};
use crate::delivery::{self, Worker};
use crate::wake::Loops;
use crate::{Service, ServiceError, now};

pub use crate::secrets::TOKEN_SECRET;

/// The service's label on the code host.
pub(crate) const SERVICE_LABEL: &str = "agentry";
/// The colour the service's label is created with (purple).
pub(crate) const SERVICE_LABEL_COLOR: &str = "6f42c1";
/// Repositories synced at once.
const SYNC_CONCURRENCY: usize = 4;
/// How far before the watermark an incremental issue read starts. GitHub's `since` is
/// inclusive but has whole seconds, and an update may show in the list a moment after the
/// `updated_at` it carries; re-reading a few seconds costs nothing (the answer is the same
/// small page, so its ETag still gives 304s).
const SYNC_OVERLAP: time::Duration = time::Duration::seconds(5);
/// Stored issues missing from a full read that are checked one by one, at most, per read.
const MAX_MISSING_CHECKS: usize = 100;

/// Timing of the issue sync and the outbox worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often a repository's open issues are read in full, a safety net under the
    /// incremental sync: it removes issues deleted or transferred on the code host (they
    /// never show up as updated). The time of the last full read is stored, so a restart
    /// does not bring it forward.
    pub full_sync_every: Duration,
    /// Delay before the first retry of a failed effect; doubles per attempt.
    pub retry_base: Duration,
    /// Longest delay between two attempts.
    pub retry_max: Duration,
    /// How long a claimed effect stays reserved for its worker (a dead worker's effects
    /// become due again after it).
    pub lease: Duration,
    /// Longest sleep of the worker when nothing is due (it also wakes when told to).
    pub idle: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            full_sync_every: Duration::from_secs(24 * 3600),
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(600),
            lease: Duration::from_secs(120),
            idle: Duration::from_secs(30),
        }
    }
}

/// The code-host side of the application state.
pub struct CodeHost {
    client_config: ClientConfig,
    timing: Timing,
    /// The client of the stored token, rebuilt when the token changes.
    cached: Mutex<Option<(SecretValue, GitHub)>>,
    /// The outbox's delivery worker.
    pub(crate) outbox: Worker<Effect>,
    /// One issue sync at a time in this process.
    sync_lock: tokio::sync::Mutex<()>,
    /// The issue-sync loop's state: the repositories webhooks asked to sync, and its wake-up.
    pub(crate) issue_sync: IssueSyncLoop,
    /// `CODEHOST_WEBHOOK_SECRET`; the webhook is disabled without it.
    webhook_secret: Option<SecretValue>,
    /// Revisions from review feedback: settings, caches, the loop's wake-up.
    revisions: crate::revisions::Revisions,
}

/// What the issue-sync loop keeps between its steps: the repositories whose sync a
/// labelled-issue webhook asked for, when every repository is due again, and the loop's
/// wake-up. A repository is held once however often it is asked for, and the loop takes
/// them all before it reads the code host: deliveries that arrive while a sync runs cause
/// one more sync, not one each, and none of them is passed over.
#[derive(Debug, Default)]
pub(crate) struct IssueSyncLoop {
    /// Wakes the issue-sync loop ([`Loops::ISSUE_SYNC`]).
    pub(crate) wake: tokio::sync::Notify,
    /// The repositories asked for since the loop last took them (connected ones only, so
    /// the set stays as small as the list of repositories).
    repos: Mutex<HashSet<Uuid>>,
    /// When every repository is synced next (`None`: at the next step).
    all_due_at: Mutex<Option<tokio::time::Instant>>,
}

impl IssueSyncLoop {
    /// Asks for a sync of `repo_id` and wakes the loop: however often it is asked before the
    /// loop takes it, it is held once, and the loop has one wake-up waiting.
    fn ask(&self, repo_id: Uuid) {
        self.repos.lock().insert(repo_id);
        self.wake.notify_one();
    }

    /// Takes the repositories asked for so far, leaving none.
    fn take(&self) -> HashSet<Uuid> {
        std::mem::take(&mut *self.repos.lock())
    }

    /// Puts back repositories taken by a step whose sync failed.
    fn ask_again(&self, repos: HashSet<Uuid>) {
        self.repos.lock().extend(repos);
    }
}

impl std::fmt::Debug for CodeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeHost")
            .field("api_url", &self.client_config.api_url)
            .finish_non_exhaustive()
    }
}

impl CodeHost {
    /// The code-host integration with its client settings and outbox timing.
    pub fn new(client_config: ClientConfig, timing: Timing) -> Self {
        CodeHost {
            client_config,
            timing,
            cached: Mutex::new(None),
            outbox: Worker::new(
                &outbox::QUEUE,
                "code-host effect",
                timing.lease,
                Backoff {
                    base: timing.retry_base,
                    max: timing.retry_max,
                },
                timing.idle,
            ),
            sync_lock: tokio::sync::Mutex::new(()),
            issue_sync: IssueSyncLoop::default(),
            webhook_secret: None,
            revisions: crate::revisions::Revisions::default(),
        }
    }

    /// The same integration with these revision settings (`AGENTRY_MENTION`,
    /// `AGENTRY_REVISION_QUIET_SECS`).
    pub fn with_revisions(mut self, settings: crate::revisions::RevisionSettings) -> Self {
        self.revisions = crate::revisions::Revisions::new(settings);
        self
    }

    /// The revision part of the integration.
    pub fn revisions(&self) -> &crate::revisions::Revisions {
        &self.revisions
    }

    /// The same integration with the webhook's shared secret (`None`: webhook disabled).
    pub fn with_webhook_secret(mut self, secret: Option<SecretValue>) -> Self {
        self.webhook_secret = secret;
        self
    }

    /// The webhook's shared secret, if the webhook is enabled.
    pub fn webhook_secret(&self) -> Option<&SecretValue> {
        self.webhook_secret.as_ref()
    }

    /// The code host's REST base URL.
    pub fn api_url(&self) -> &str {
        &self.client_config.api_url
    }

    /// The one way to a code-host client: the client of `token`, reusing the previous one
    /// while the token is the same (its connection pool and ETag cache stay warm). The
    /// stored token's client is [`Service::github`]; a token being checked before it is
    /// stored comes here directly.
    pub fn client(&self, token: &SecretValue) -> Result<GitHub, ServiceError> {
        let mut cached = self.cached.lock();
        if let Some((known, client)) = cached.as_ref()
            && known == token
        {
            return Ok(client.clone());
        }
        let client =
            GitHub::new(&self.client_config, token.expose()).map_err(ServiceError::from)?;
        *cached = Some((token.clone(), client.clone()));
        Ok(client)
    }

    /// Whether the code host accepts `token`: its user (`GET /user`, the cheapest call that
    /// needs a working token). [`ServiceError::CodeHostRejected`] when the code host refuses
    /// it (401: bad, revoked or expired), [`ServiceError::CodeHostUnavailable`] when it
    /// cannot be asked. Used before a token is stored, and by `agentry doctor`.
    pub async fn check_token(
        &self,
        token: &SecretValue,
    ) -> Result<agentry_codehost::User, ServiceError> {
        Ok(self.client(token)?.current_user().await?)
    }
}

impl Service {
    /// The client of the stored `CODEHOST_TOKEN`; 412 `codehost_token_missing` without one.
    pub async fn github(&self) -> Result<GitHub, ServiceError> {
        let token = self.codehost_token().await?;
        self.parts.codehost.client(&token)
    }
}

/// The web host whose repositories the code-host API at `api_url` serves, when it can be
/// told: `github.com` for `api.github.com`, `HOST` for GitHub Enterprise's
/// `https://HOST/api/v3`. Any other base (a proxy, a local fake) serves any host.
pub(crate) fn web_host_of(api_url: &str) -> Option<String> {
    let url = url::Url::parse(api_url).ok()?;
    let host = url.host_str()?.to_ascii_lowercase();
    if host == "api.github.com" {
        Some("github.com".into())
    } else if url.path().trim_end_matches('/') == "/api/v3" {
        Some(host)
    } else {
        None
    }
}

impl Service {
    /// Connects a repository: looks it up on the code host (default branch, clone URL) and
    /// stores it with default settings; `false` when it was connected already (returned
    /// unchanged). Its issues are synced at once, in the background.
    pub async fn connect_repository(
        &self,
        url: RepoUrl,
    ) -> Result<(Repository, bool), ServiceError> {
        if let Some(host) = web_host_of(self.parts.codehost.api_url())
            && url.host() != host
        {
            return Err(ServiceError::invalid(
                "repoUrl",
                format!(
                    "the configured code host serves repositories on {host}, not {}",
                    url.host()
                ),
            ));
        }
        let github = self.github().await?;
        let lookup = url.clone();
        let known = self
            .db(move |conn| Ok(repos::find_by_url(conn, &lookup)?))
            .await?;
        if let Some(repo) = known.filter(|r| r.disconnected_at.is_none()) {
            return Ok((repo, false));
        }
        let info = github.repository(url.owner(), url.name()).await?;
        let new = NewRepository {
            url,
            default_branch: info.default_branch,
            clone_url: info.clone_url,
            codehost_id: i64::try_from(info.id).ok(),
        };
        let (repo, created) = self
            .db(move |conn| Ok(repos::connect_repository(conn, &new, now())?))
            .await?;
        // Its issues appear without waiting for the next periodic sync.
        let service = self.clone();
        let repo_id = repo.id;
        tokio::spawn(async move {
            if let Err(e) = service.sync_issues(Some(repo_id)).await {
                tracing::warn!(error = %e, "first issue sync of a new repository failed");
            }
        });
        Ok((repo, created))
    }

    /// Syncs the open issues of every connected repository (or of `only`), then turns each
    /// open issue carrying the service's label and no task into a task
    /// (docs/contract.md#53-issue-sync). One repository's failure is recorded for it and
    /// does not stop the others. 412 without a token.
    pub async fn sync_issues(
        &self,
        only: Option<Uuid>,
    ) -> Result<Vec<(Uuid, RepoSyncOutcome)>, ServiceError> {
        self.sync_where(move |id| only.is_none_or(|only| id == only))
            .await
    }

    /// Asks for a sync of `repo_id`'s issues soon (an issue of it was labelled): the
    /// issue-sync loop is woken and syncs it, once for however many requests arrive before
    /// it starts ([`IssueSyncLoop`]).
    pub(crate) fn request_sync(&self, repo_id: Uuid) {
        self.parts.codehost.issue_sync.ask(repo_id);
    }

    /// [`Service::sync_issues`] of the connected repositories whose id `wanted` accepts.
    async fn sync_where(
        &self,
        wanted: impl Fn(Uuid) -> bool,
    ) -> Result<Vec<(Uuid, RepoSyncOutcome)>, ServiceError> {
        let service = self;
        let github = service.github().await?;
        let _one_at_a_time = service.parts.codehost.sync_lock.lock().await;
        let repos: Vec<Repository> = service
            .db(|conn| Ok(repos::issue_sync_states(conn)?))
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .filter(|r| wanted(r.id))
            .collect();
        let outcomes: Vec<(Uuid, RepoSyncOutcome)> = futures_util::stream::iter(repos)
            .map(|repo| {
                let github = github.clone();
                async move {
                    let id = repo.id;
                    (id, sync_repository(service, &github, repo).await)
                }
            })
            .buffer_unordered(SYNC_CONCURRENCY)
            .collect()
            .await;
        service.wake(
            (Loops::OUTBOX | Loops::RUNNER).when(outcomes.iter().any(|(_, o)| o.created > 0)),
        );
        Ok(outcomes)
    }

    /// Makes sure `number` is an open issue of `repo_id` in the synced copy, syncing that
    /// repository once when it is not there yet: `Ok(true)` if it is (now), `Ok(false)` if
    /// the code host does not list it as an open issue (a pull request, a closed issue, or
    /// no such number). A sync that fails answers the code host's error (503 or 422); no
    /// token, 412.
    pub(crate) async fn known_open_issue(
        &self,
        repo_id: Uuid,
        number: i64,
    ) -> Result<bool, ServiceError> {
        let known = self
            .db(move |conn| Ok(issues::is_open_issue(conn, repo_id, number)?))
            .await?;
        if known {
            return Ok(true);
        }
        let outcomes = self.sync_issues(Some(repo_id)).await?;
        if let Some(error) = outcomes.into_iter().find_map(|(_, o)| o.error) {
            return Err(error);
        }
        self.db(move |conn| Ok(issues::is_open_issue(conn, repo_id, number)?))
            .await
    }

    /// Claims the code-host effects due at `at` and delivers them ([`deliver`]); returns
    /// how many were delivered. Without a stored token nothing is claimed.
    pub async fn deliver_due_effects(&self, at: OffsetDateTime) -> Result<usize, ServiceError> {
        let service = self;
        let github = &service.github().await?;
        delivery::deliver_due(
            service,
            &service.parts.codehost.outbox,
            at,
            |effect: Effect| async move {
                let repo_id = effect.repo_id;
                let repo = service
                    .db(move |conn| Ok(repos::get_repository(conn, repo_id)?))
                    .await
                    .map_err(|e| e.to_string())?;
                // Only a post looks for agentry's own earlier one (the login is asked once).
                let own = match &effect.action {
                    Action::Comment { .. } | Action::Reply { .. } => {
                        github.own_login().await.map_err(|e| e.to_string())?
                    }
                    _ => String::new(),
                };
                deliver(github, &repo, &effect, &own)
                    .await
                    .map_err(|e| e.to_string())
            },
        )
        .await
    }
}

/// The one comment agentry writes on an assigned issue. The HTML comment is the marker by
/// which a retried delivery recognises a comment already posted for this task.
pub(crate) fn comment_body(task_id: Uuid) -> String {
    format!(
        "agentry is working on this issue (task `{task_id}`). A pull request will follow.\n\n{}",
        comment_marker(task_id)
    )
}

/// The marker `comment_body` ends with.
pub(crate) fn comment_marker(task_id: Uuid) -> String {
    format!("<!-- agentry:task:{task_id} -->")
}

/// Creates the coding task of an issue with its label and comment effects, in one
/// transaction, unless the issue already has a task (docs/contract.md#37-assign, #54-effects-of-assignment): the task and whether
/// it was created now. The same path serves `POST /api/issues/assign` and label sync.
pub fn assign(
    conn: &mut AnyConnection,
    repo: &Repository,
    issue_number: i64,
    title: &str,
    body: &str,
    agent_type: AgentType,
    now: OffsetDateTime,
) -> Result<(Task, bool), DbError> {
    if let Some(task) = tasks::linked_task(conn, repo.id, issue_number)? {
        return Ok((task, false));
    }
    let new = NewTask {
        id: Uuid::new_v4(),
        title: title.to_owned(),
        prompt: body.to_owned(),
        repo_id: Some(repo.id),
        repo_url: repo.url.clone(),
        task_type: TaskType::Coding,
        agent_type,
        issue_number: Some(issue_number),
        parent_task_id: None,
        created_at: now,
    };
    tasks::create_issue_task(conn, &new, |conn, task| {
        let actions = [
            Action::AddLabel {
                issue_number,
                label: SERVICE_LABEL.to_owned(),
            },
            Action::Comment {
                issue_number,
                body: comment_body(task.id),
            },
        ];
        for action in actions {
            let effect = NewEffect {
                task_id: Some(task.id),
                repo_id: repo.id,
                action,
            };
            outbox::enqueue(conn, &effect, now)?;
        }
        Ok(())
    })
}

fn synced(issue: Issue) -> Result<SyncedIssue, CodeHostError> {
    Ok(SyncedIssue {
        number: i64::try_from(issue.number)
            .map_err(|_| CodeHostError::InvalidResponse("issue number out of range".into()))?,
        title: issue.title,
        body: issue.body,
        html_url: issue.html_url,
        author: issue.author,
        labels: issue
            .labels
            .into_iter()
            .map(|l| IssueLabel {
                name: l.name,
                color: l.color,
            })
            .collect(),
        created_at: issue.created_at,
        updated_at: issue.updated_at,
    })
}

/// What one repository's sync did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RepoSyncOutcome {
    /// The code host answered 304: nothing changed.
    pub unchanged: bool,
    /// Tasks created for labelled issues.
    pub created: usize,
    /// Why the sync failed: the code host refused or could not be reached (its message is
    /// also stored and shown in the issues view), or the database failed.
    pub error: Option<ServiceError>,
}

async fn sync_repository(service: &Service, github: &GitHub, repo: Repository) -> RepoSyncOutcome {
    let mut outcome = RepoSyncOutcome::default();
    let repo_id = repo.id;
    let full_every = service.parts.codehost.timing.full_sync_every;
    let read = match service
        .db(move |conn| Ok(issues::sync_cursor(conn, repo_id)?))
        .await
    {
        Ok(cursor) => read_issues(service, github, &repo, cursor, full_every).await,
        Err(e) => Err(SyncFailure::Storage(e)),
    };
    match read {
        Ok(unchanged) => outcome.unchanged = unchanged,
        Err(SyncFailure::CodeHost(e)) => {
            tracing::warn!(repo = %repo.url, error = %e, "issue sync failed");
            let error = ServiceError::code_host(&format!("syncing {}", repo.url), &e);
            let message = error.to_string();
            outcome.error = Some(error);
            if let Err(e) = service
                .db(move |conn| Ok(issues::mark_issues_sync_failed(conn, repo_id, &message)?))
                .await
            {
                tracing::error!(repo = %repo.url, error = %e, "cannot store the issue sync");
            }
        }
        Err(SyncFailure::Storage(e)) => {
            tracing::error!(repo = %repo.url, error = %e, "cannot store the issue sync");
            outcome.error = Some(e);
        }
    }
    // Labelled issues become tasks even when the list did not change: an earlier attempt
    // may have failed after the sync was stored.
    let assigned = service
        .db(move |conn| {
            let mut created = 0;
            for issue in issues::unlinked_with_label(conn, repo.id, SERVICE_LABEL)? {
                let agent = repo.settings.agent_type;
                let (_, new) = assign(
                    conn,
                    &repo,
                    issue.number,
                    &issue.title,
                    &issue.body,
                    agent,
                    now(),
                )?;
                created += usize::from(new);
            }
            Ok(created)
        })
        .await;
    match assigned {
        Ok(n) => outcome.created = n,
        Err(e) => {
            tracing::error!(error = %e, "cannot create tasks for labelled issues");
            outcome.error.get_or_insert(e);
        }
    }
    outcome
}

/// Why a repository's sync stopped.
enum SyncFailure {
    /// The code host failed or refused: recorded as the repository's sync error.
    CodeHost(CodeHostError),
    /// The database failed.
    Storage(ServiceError),
}

impl From<CodeHostError> for SyncFailure {
    fn from(e: CodeHostError) -> Self {
        SyncFailure::CodeHost(e)
    }
}

impl From<ServiceError> for SyncFailure {
    fn from(e: ServiceError) -> Self {
        SyncFailure::Storage(e)
    }
}

/// Reads what changed in one repository and stores it; `true` when the code host said
/// nothing changed (304).
///
/// * No full read yet, or the last one older than `full_every`: the changes since the
///   watermark if there is one, then every open issue ([`read_all_open`]), then the changes
///   since the new watermark at once, which catches updates made during the full read and
///   stores the ETag of the query the next syncs ask.
/// * The last full read found no open issue (no watermark): its query again, conditionally.
/// * Otherwise the issues updated since a little before the watermark ([`read_changes`]).
async fn read_issues(
    service: &Service,
    github: &GitHub,
    repo: &Repository,
    cursor: IssueSyncCursor,
    full_every: Duration,
) -> Result<bool, SyncFailure> {
    let full_every = time::Duration::try_from(full_every).unwrap_or(time::Duration::DAY);
    let due = cursor
        .full_synced_at
        .is_none_or(|at| now() - at >= full_every);
    let watermark = match cursor.watermark {
        Some(watermark) if !due => watermark,
        _ => {
            if let Some(watermark) = cursor.watermark {
                // First the changes since the last sync, so that issues closed since leave
                // the copy as closings and only issues gone without a trace (deleted,
                // transferred) are left for the full read to check one by one.
                read_changes(service, github, repo, watermark, cursor.etag.as_deref()).await?;
            }
            let etag = cursor
                .etag
                .as_deref()
                .filter(|_| !due && cursor.watermark.is_none());
            match read_all_open(service, github, repo, etag).await? {
                None => return Ok(true),
                Some(None) => return Ok(false),
                Some(Some(watermark)) => {
                    read_changes(service, github, repo, watermark, None).await?;
                    return Ok(false);
                }
            }
        }
    };
    read_changes(service, github, repo, watermark, cursor.etag.as_deref()).await
}

/// Reads every open issue and stores them as the copy (`etag`: conditional, for a
/// repository whose last full read found none). `None` for a 304; else the new watermark.
///
/// Stored issues absent from the list are checked one by one before they leave the copy: a
/// list read while an issue on an earlier page closes shifts by one and skips an issue,
/// and that issue must not vanish from the view.
async fn read_all_open(
    service: &Service,
    github: &GitHub,
    repo: &Repository,
    etag: Option<&str>,
) -> Result<Option<Option<time::OffsetDateTime>>, SyncFailure> {
    let (owner, name) = (repo.url.owner(), repo.url.name());
    let repo_id = repo.id;
    let (list, etag) = match github.open_issues(owner, name, etag).await? {
        Conditional::NotModified => {
            service
                .db(move |conn| Ok(issues::mark_issues_unchanged(conn, repo_id, now())?))
                .await?;
            return Ok(None);
        }
        Conditional::Modified { value, etag } => (
            value
                .into_iter()
                .map(synced)
                .collect::<Result<Vec<_>, _>>()?,
            etag,
        ),
    };
    let watermark = list.iter().map(|i| i.updated_at).max();
    let stored = service
        .db(move |conn| Ok(issues::synced_numbers(conn, repo_id)?))
        .await?;
    let listed: std::collections::HashSet<i64> = list.iter().map(|i| i.number).collect();
    let mut list = list;
    let mut keep = Vec::new();
    for (checked, number) in stored
        .into_iter()
        .filter(|n| !listed.contains(n))
        .enumerate()
    {
        if checked >= MAX_MISSING_CHECKS {
            // Beyond the checks' budget, unchecked issues stay until the next full read.
            keep.push(number);
            continue;
        }
        let Ok(n) = u64::try_from(number) else {
            continue;
        };
        match github.issue(owner, name, n).await {
            Ok(issue) if issue.state == "open" => list.push(synced(issue)?),
            Ok(_) | Err(CodeHostError::NotFound(_)) => {}
            // Deleted (410) or transferred (301): gone from this repository.
            Err(CodeHostError::Rejected { status, .. }) if status == 410 || status == 301 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Only a read that found no open issue keeps its ETag: the others hand over to the
    // incremental query, whose ETag is stored by `read_changes`.
    let etag = etag.filter(|_| watermark.is_none());
    let read = list.clone();
    service
        .db(move |conn| {
            Ok(issues::store_full_read(
                conn,
                repo_id,
                &FullRead {
                    issues: &read,
                    keep: &keep,
                    etag: etag.as_deref(),
                    watermark,
                },
                now(),
            )?)
        })
        .await?;
    Ok(Some(watermark))
}

/// Reads the issues updated since `SYNC_OVERLAP` before `watermark` (conditional on `etag`)
/// and stores them: open ones updated, closed ones removed, the watermark raised to the
/// latest `updated_at` read. `true` for a 304. The answer's ETag is stored only when it
/// vouches for the whole answer ([`agentry_codehost::IssueChanges::etag_covers_all`]): when a
/// page of issues share the newest second, another update in that second may sort onto a
/// later page and leave the first unchanged, so such an answer is read again without
/// `If-None-Match` until a later update moves the watermark on.
async fn read_changes(
    service: &Service,
    github: &GitHub,
    repo: &Repository,
    watermark: time::OffsetDateTime,
    etag: Option<&str>,
) -> Result<bool, SyncFailure> {
    let (owner, name) = (repo.url.owner(), repo.url.name());
    let repo_id = repo.id;
    let since = watermark - SYNC_OVERLAP;
    let (changes, etag) = match github
        .issues_updated_since(owner, name, since, etag)
        .await?
    {
        Conditional::NotModified => {
            service
                .db(move |conn| Ok(issues::mark_issues_unchanged(conn, repo_id, now())?))
                .await?;
            return Ok(true);
        }
        Conditional::Modified { value, etag } => (value, etag),
    };
    let etag = etag.filter(|_| changes.etag_covers_all);
    let newest = changes.newest;
    let mut open = Vec::new();
    let mut closed = Vec::new();
    for issue in changes.issues {
        if issue.state == "open" {
            open.push(synced(issue)?);
        } else {
            let number = i64::try_from(issue.number)
                .map_err(|_| CodeHostError::InvalidResponse("issue number out of range".into()))?;
            closed.push((number, issue.updated_at));
        }
    }
    service
        .db(move |conn| {
            Ok(issues::apply_issue_changes(
                conn,
                repo_id,
                &open,
                &closed,
                etag.as_deref(),
                newest,
                now(),
            )?)
        })
        .await?;
    Ok(false)
}

/// The issue-sync loop's step: syncs the issues of every repository when they are due
/// (`every` after the last such sync ended), else only of the repositories webhooks asked
/// for since the last step (none: nothing to do), then waits for the next due time or
/// request. Without a stored token it fails (quietly) until there is one.
pub(crate) async fn issue_sync_step(service: Service, every: Duration) -> StepResult {
    let state = &service.parts.codehost.issue_sync;
    // Taken before the code host is read: a request from now on wakes another step, whose
    // sync sees what this one may have missed.
    let asked = state.take();
    let all_due_at = *state.all_due_at.lock();
    let Some(all_due_at) = all_due_at.filter(|at| *at > tokio::time::Instant::now()) else {
        let outcomes = match service.sync_issues(None).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                // Asked for again: the next step, after the loop's backoff, syncs them.
                state.ask_again(asked);
                return Err(e.into());
            }
        };
        *state.all_due_at.lock() = Some(tokio::time::Instant::now() + every);
        let failed = outcomes.iter().filter(|(_, o)| o.error.is_some()).count();
        tracing::debug!(repositories = outcomes.len(), failed, "issue sync done");
        return Ok(Pass::Idle);
    };
    let until_all = || all_due_at.saturating_duration_since(tokio::time::Instant::now());
    if !asked.is_empty() {
        match service.sync_where(|id| asked.contains(&id)).await {
            Ok(outcomes) => {
                let failed = outcomes.iter().filter(|(_, o)| o.error.is_some()).count();
                tracing::debug!(
                    repositories = outcomes.len(),
                    failed,
                    "issue sync asked for by a webhook done"
                );
            }
            Err(e) => {
                // Not dropped, and the periodic sync not put off: tried again shortly. (Without
                // a token this goes on quietly until one is stored, as the loop does.)
                if matches!(e, ServiceError::CodeHostTokenMissing) {
                    tracing::debug!(error = %e, "issue sync asked for by a webhook waits for a token");
                } else {
                    tracing::warn!(error = %e, "issue sync asked for by a webhook could not start; trying again shortly");
                }
                state.ask_again(asked);
                return Ok(Pass::DueIn(until_all().min(ASKED_SYNC_RETRY)));
            }
        }
    }
    Ok(Pass::DueIn(until_all()))
}

/// How soon a sync a webhook asked for is tried again when it could not start (no token,
/// the database unavailable). A repository whose own sync failed (the code host down for
/// it) is left to the next periodic sync, like any other.
const ASKED_SYNC_RETRY: Duration = Duration::from_secs(5);

/// Carries out one effect on the code host, as the user `own_login` (the token's). Each kind
/// is safe to repeat: adding a label the issue has changes nothing, a comment or reply whose
/// marker is already on the issue in a comment of `own_login`'s is not posted again (a
/// marker in anybody else's comment counts for nothing: anyone may write one), an issue
/// already closed is left alone, and a reaction already there is answered 200.
pub async fn deliver(
    github: &GitHub,
    repo: &Repository,
    effect: &Effect,
    own_login: &str,
) -> Result<(), CodeHostError> {
    let posted_by_us = |comments: &[agentry_codehost::Comment], marker: &str| {
        comments
            .iter()
            .any(|c| c.author.eq_ignore_ascii_case(own_login) && c.body.contains(marker))
    };
    let (owner, name) = (repo.url.owner(), repo.url.name());
    let number = u64::try_from(effect.action.issue_number()).map_err(|_| {
        CodeHostError::InvalidResponse("the effect's issue number is negative".into())
    })?;
    match &effect.action {
        Action::AddLabel { label, .. } => {
            github
                .ensure_label(owner, name, label, SERVICE_LABEL_COLOR)
                .await?;
            github
                .add_labels(owner, name, number, &[label.as_str()])
                .await
        }
        Action::Comment { body, .. } => {
            let task_id = effect.task_id.ok_or_else(|| {
                CodeHostError::InvalidResponse("a comment effect without a task".into())
            })?;
            let marker = comment_marker(task_id);
            let posted = github.issue_comments(owner, name, number).await?;
            if posted_by_us(&posted, &marker) {
                return Ok(());
            }
            github
                .create_comment(owner, name, number, body)
                .await
                .map(drop)
        }
        Action::CloseIssue { .. } => {
            if github.issue(owner, name, number).await?.state == "open" {
                github.close_issue(owner, name, number).await?;
            }
            Ok(())
        }
        Action::Reply { body, marker, .. } => {
            let posted = github.issue_comments(owner, name, number).await?;
            if posted_by_us(&posted, marker) {
                return Ok(());
            }
            github
                .create_comment(owner, name, number, body)
                .await
                .map(drop)
        }
        Action::React {
            comment_id,
            review_comment,
            content,
            ..
        } => {
            let id = u64::try_from(*comment_id).map_err(|_| {
                CodeHostError::InvalidResponse("the effect's comment id is negative".into())
            })?;
            let target = if *review_comment {
                ReactionTarget::ReviewComment(id)
            } else {
                ReactionTarget::IssueComment(id)
            };
            github.add_reaction(owner, name, target, content).await
        }
    }
}

/// The outbox loop's step: a round of [`Service::deliver_due_effects`], then when the next
/// effect is due.
pub(crate) async fn outbox_step(service: &Service) -> StepResult {
    delivery::step(service, &service.parts.codehost.outbox, || {
        service.deliver_due_effects(now())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_url_tells_which_web_host_it_serves() {
        assert_eq!(
            web_host_of("https://api.github.com").as_deref(),
            Some("github.com")
        );
        assert_eq!(
            web_host_of("https://ghe.example.com/api/v3").as_deref(),
            Some("ghe.example.com")
        );
        assert_eq!(web_host_of("http://127.0.0.1:4000"), None);
    }

    #[test]
    fn the_comment_carries_the_task_id_and_its_marker() {
        let id = Uuid::new_v4();
        let body = comment_body(id);
        assert!(body.contains(&id.to_string()));
        assert!(body.ends_with(&comment_marker(id)));
        assert_ne!(comment_marker(id), comment_marker(Uuid::new_v4()));
    }

    // However many deliveries ask for a repository before the loop takes it, it is held
    // once, and the loop has one wake-up waiting, not one each: one more sync, not fifty.
    // Put back after a sync that could not start, it is asked for again.
    #[test]
    fn requests_before_the_loop_takes_them_are_one_sync() {
        let state = IssueSyncLoop::default();
        let (repo, other) = (Uuid::new_v4(), Uuid::new_v4());
        for _ in 0..50 {
            state.ask(repo);
        }
        state.ask(other);
        use futures_util::FutureExt as _;
        assert!(state.wake.notified().now_or_never().is_some());
        assert!(
            state.wake.notified().now_or_never().is_none(),
            "a second wake-up"
        );
        let asked = state.take();
        assert_eq!(asked, HashSet::from([repo, other]));
        assert!(state.take().is_empty());
        state.ask_again(asked);
        state.ask(repo);
        assert_eq!(state.take(), HashSet::from([repo, other]));
    }
}
