//! [`GitHub`], the one GitHub REST client (docs/contract.md#51-token–#52-rate-limits-and-failures).
//!
//! # Transport
//! octocrab carries the requests ([`Octocrab::execute`]) over a service stack built here: a
//! hyper client with rustls (webpki roots, ring) and nothing else. octocrab's default stack
//! is not used because it adds its own `User-Agent: octocrab` next to ours, may add a retry
//! layer, and logs every 5xx at error level; here every header is ours and retries are this
//! module's only. octocrab's service runs a worker task on the tokio runtime that creates
//! it, so the client builds one transport per runtime, lazily, on first use there:
//! [`GitHub::new`] needs no runtime, and a client survives the runtime it was first used on.
//!
//! # Every request
//! * `Authorization: Bearer <token>` (a sensitive header value; the token is never logged nor
//!   put in a message), `User-Agent`, `Accept: application/vnd.github+json`,
//!   `X-GitHub-Api-Version: 2022-11-28`;
//! * at most [`ClientConfig::request_timeout`] per attempt, for the whole answer;
//! * 5xx answers, timeouts and connection errors are retried up to
//!   [`ClientConfig::max_retries`] times after a capped exponential backoff with full jitter
//!   (`uniform(0, min(backoff_max, backoff_base × 2^retry))`). POST and PATCH are retried
//!   too where doing them twice is harmless (labels, closing an issue, reactions); a
//!   request that reached GitHub before failing may take effect twice, so
//!   [`GitHub::create_comment`],
//!   [`GitHub::create_pull`] and [`GitHub::create_review`] are never sent again after such
//!   a failure: their callers look for what they may have created first;
//! * rate limits: a 403/429 with `Retry-After` waits that long; a 403 with
//!   `X-RateLimit-Remaining: 0` waits until `X-RateLimit-Reset`; a 429 (or a 403 saying
//!   "rate limit") with neither waits a minute. And before sending, when the last answer said
//!   `Remaining: 0` with a reset in the future, the client waits for the reset instead of
//!   spending a request on a certain 403. A wait longer than
//!   [`ClientConfig::max_rate_limit_wait`] is not slept: the call returns
//!   [`CodeHostError::RateLimited`] at once, without sending anything more. Rate-limit waits
//!   share the retry budget;
//! * a 304 is data ([`Conditional::NotModified`]), not an error;
//! * pagination follows the `Link` header's `rel="next"`, keeping only its path and query:
//!   requests always go to the configured host (so the token never leaves it), under its base
//!   path (`/api/v3` on GitHub Enterprise Server).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LINK, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use octocrab::{AuthState, OctoBody, Octocrab, OctocrabBuilder};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::error::CodeHostError;
use crate::policy::{
    Jitter, backoff_delay, encode_segment, link_target, next_link, parse_retry_after, until_epoch,
};
use crate::types::{
    Comment, Conditional, Issue, IssueChanges, Permission, PullRequest, ReactionTarget, RepoInfo,
    Review, ReviewComment, User,
};
use crate::wire::{ErrorJson, IssueItem, PermissionJson, ReviewCommentItem};

mod transport;

use transport::{parse, parse_base_url, path_only, repo_path, since_param};

/// Which failed requests are sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// After 5xx answers, timeouts and connection errors (and rate-limit refusals).
    AfterFailures,
    /// Only after rate-limit refusals: for a write that must not happen twice.
    OnlyRefused,
}

/// The REST API version every request asks for.
pub const API_VERSION: &str = "2022-11-28";
/// The media type every request accepts.
pub const MEDIA_TYPE: &str = "application/vnd.github+json";
/// Items per page of every list request (GitHub's maximum).
pub const PER_PAGE: u32 = 100;
/// Pages one list call reads at most (a guard against a `Link` loop).
const MAX_PAGES: usize = 1000;
/// How long to wait on a secondary rate limit that names no time (GitHub: "at least one
/// minute").
const SECONDARY_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);
/// The shortest wait after a rate-limit answer, so that a reset already in the past (clock
/// skew) never turns into a tight loop.
const MIN_RATE_LIMIT_WAIT: Duration = Duration::from_secs(1);
/// Runtimes whose transports are kept; past this, the list starts again (dead runtimes'
/// transports are dropped with it).
const MAX_TRANSPORTS: usize = 256;

/// How the client talks to GitHub.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The REST API's base URL: `https://api.github.com`, `http://127.0.0.1:PORT` (tests), or
    /// `https://ghe.example/api/v3` (GitHub Enterprise Server). A trailing `/` is ignored.
    pub api_url: String,
    /// The `User-Agent` header (GitHub refuses requests without one). Default `agentry`.
    pub user_agent: String,
    /// The longest wait for one attempt's complete answer. Default 30 s.
    pub request_timeout: Duration,
    /// Retries of a request after 5xx answers, timeouts, connection errors and rate-limit
    /// waits. Default 5.
    pub max_retries: u32,
    /// The first backoff's upper bound; it doubles per retry. Default 500 ms.
    pub backoff_base: Duration,
    /// The largest backoff upper bound. Default 30 s.
    pub backoff_max: Duration,
    /// The longest rate-limit wait the client sleeps through; a longer one returns
    /// [`CodeHostError::RateLimited`]. Default 15 min.
    pub max_rate_limit_wait: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            api_url: "https://api.github.com".to_owned(),
            user_agent: "agentry".to_owned(),
            request_timeout: Duration::from_secs(30),
            max_retries: 5,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_rate_limit_wait: Duration::from_secs(15 * 60),
        }
    }
}

/// The GitHub REST client: one token, one base URL, rate limits, retries, conditional
/// requests and pagination (see the [module docs](self)). Cheap to clone (the clones share
/// the connection pools, the rate-limit state and the request counter). Its `Debug` output
/// never shows the token.
#[derive(Clone)]
pub struct GitHub {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    /// `http` or `https`.
    scheme: String,
    /// `host[:port]`.
    authority: String,
    /// `""` or the base path without a trailing `/`, e.g. `/api/v3`.
    base_path: String,
    /// `Bearer <token>`, marked sensitive.
    authorization: HeaderValue,
    user_agent: HeaderValue,
    /// Only to scrub messages that might echo it; never printed.
    token: String,
    connector: HttpsConnector<HttpConnector>,
    transports: Mutex<Vec<(tokio::runtime::Id, Octocrab)>>,
    sent: AtomicU64,
    /// The last `X-RateLimit-Remaining` and `X-RateLimit-Reset` seen.
    rate: Mutex<Option<RateWindow>>,
    /// The token's user's login, once asked ([`GitHub::own_login`]).
    login: Mutex<Option<String>>,
    jitter: Jitter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RateWindow {
    remaining: u64,
    reset_epoch: u64,
}

impl fmt::Debug for GitHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitHub")
            .field("api_url", &self.inner.config.api_url)
            .field("user_agent", &self.inner.config.user_agent)
            .field("requests_sent", &self.requests_sent())
            .finish_non_exhaustive()
    }
}

/// A final answer (2xx, 304 or a 4xx that is not a rate limit).
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: http::header::HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// What one attempt gave.
enum Attempt {
    Answer(StatusCode, HeaderMap, String),
    /// A timeout or connection error, described.
    Failed(String),
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    header_str(headers, name).and_then(|v| v.trim().parse().ok())
}

impl GitHub {
    /// A client for `token` on `config.api_url`. Checks the URL, the user agent and the
    /// token's characters; sends nothing and needs no runtime.
    pub fn new(config: &ClientConfig, token: &str) -> Result<GitHub, CodeHostError> {
        let (scheme, authority, base_path) = parse_base_url(&config.api_url)?;
        if config.request_timeout.is_zero() {
            return Err(CodeHostError::Config("request_timeout is zero".into()));
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(CodeHostError::Config("the token is empty".into()));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(CodeHostError::Config(
                "the token contains characters not allowed in an HTTP header".into(),
            ));
        }
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                CodeHostError::Config(
                    "the token contains characters not allowed in an HTTP header".into(),
                )
            })?;
        authorization.set_sensitive(true);
        if config.user_agent.trim().is_empty() {
            return Err(CodeHostError::Config("the user agent is empty".into()));
        }
        let user_agent = HeaderValue::from_str(config.user_agent.trim()).map_err(|_| {
            CodeHostError::Config("the user agent is not a valid header value".into())
        })?;
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| CodeHostError::Config(format!("TLS setup failed: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(GitHub {
            inner: Arc::new(Inner {
                config: config.clone(),
                scheme,
                authority,
                base_path,
                authorization,
                user_agent,
                token: token.to_owned(),
                connector,
                transports: Mutex::new(Vec::new()),
                sent: AtomicU64::new(0),
                rate: Mutex::new(None),
                login: Mutex::new(None),
                jitter: Jitter::new(),
            }),
        })
    }

    /// The configuration the client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// HTTP requests sent, retries included (an attempt that could not connect counts too),
    /// for tests and benchmarks. Waits the client decided itself send nothing.
    pub fn requests_sent(&self) -> u64 {
        self.inner.sent.load(Ordering::Relaxed)
    }

    /// The last rate-limit state GitHub reported: `(X-RateLimit-Remaining, X-RateLimit-Reset
    /// as unix seconds)`, or `None` before any answer carried them.
    pub fn rate_limit(&self) -> Option<(u64, u64)> {
        self.inner.rate.lock().map(|w| (w.remaining, w.reset_epoch))
    }

    // ----- the API -----

    /// The token's user (`GET /user`); also the cheapest check that a token works.
    pub async fn current_user(&self) -> Result<User, CodeHostError> {
        self.get_json("/user".to_owned()).await
    }

    /// The login of the token's user: [`GitHub::current_user`]'s, asked once per client (a
    /// client has one token for its life, so the answer cannot change under it).
    pub async fn own_login(&self) -> Result<String, CodeHostError> {
        if let Some(login) = self.inner.login.lock().clone() {
            return Ok(login);
        }
        let login = self.current_user().await?.login;
        *self.inner.login.lock() = Some(login.clone());
        Ok(login)
    }

    /// A repository (`GET /repos/{owner}/{repo}`).
    pub async fn repository(&self, owner: &str, name: &str) -> Result<RepoInfo, CodeHostError> {
        self.get_json(repo_path(owner, name, "")).await
    }

    /// The open issues, every page (`per_page=100`, `state=open`, `sort=updated`,
    /// `direction=desc`), pull requests skipped, each issue once.
    ///
    /// With `etag`, the first page is asked with `If-None-Match`; a 304 there gives
    /// [`Conditional::NotModified`] after one request (that GitHub does not count against the
    /// rate limit). The returned ETag is the first page's: any change to an open issue moves
    /// it to the first page, so an unchanged first page means unchanged issues. An issue
    /// changing while the pages are read may be missed this time (the pages shift); the
    /// first page's ETag then differs next time, so the next call reads it.
    pub async fn open_issues(
        &self,
        owner: &str,
        name: &str,
        etag: Option<&str>,
    ) -> Result<Conditional<Vec<Issue>>, CodeHostError> {
        let first = format!(
            "{}?state=open&sort=updated&direction=desc&per_page={PER_PAGE}",
            repo_path(owner, name, "/issues")
        );
        let pages = self
            .get_pages::<IssueItem>(first, etag, |_: &[IssueItem]| true)
            .await?;
        Ok(pages.map(|items| {
            let mut seen = std::collections::HashSet::new();
            items
                .into_iter()
                .filter(|i| !i.is_pull_request() && seen.insert(i.issue.number))
                .map(Issue::from)
                .collect()
        }))
    }

    /// The issues and pull requests updated at or after `since` (`state=all`,
    /// `since=<since, whole seconds>`, `sort=updated`, `direction=desc`, `per_page=100`),
    /// every page; closed issues included, so that a reader learns of closings. GitHub's
    /// `since` is inclusive and second-granular: `since` is rounded down to its second.
    ///
    /// With `etag`, the first page is asked with `If-None-Match`; a 304 gives
    /// [`Conditional::NotModified`] after one request that GitHub does not count. The first
    /// page holds the most recent updates, so any update at or after `since` changes it,
    /// unless a page of items share its newest second (GitHub does not order those): callers
    /// should keep the ETag only when [`IssueChanges::etag_covers_all`]. Newest first means an update during the read moves an item
    /// to the front: it may be missed this time (its new `updated_at` is at least
    /// [`IssueChanges::newest`], so the next read from there has it) but no other item is
    /// skipped.
    pub async fn issues_updated_since(
        &self,
        owner: &str,
        name: &str,
        since: OffsetDateTime,
        etag: Option<&str>,
    ) -> Result<Conditional<IssueChanges>, CodeHostError> {
        let first = format!(
            "{}?state=all&since={}&sort=updated&direction=desc&per_page={PER_PAGE}",
            repo_path(owner, name, "/issues"),
            since_param(since)
        );
        let pages = self
            .get_counted_pages::<IssueItem>(first, etag, |_: &[IssueItem]| true)
            .await?;
        Ok(pages.map(|(items, pages)| {
            let newest = items.iter().map(|i| i.issue.updated_at).max();
            let tied = newest.map_or(0, |newest| {
                items
                    .iter()
                    .filter(|i| i.issue.updated_at == newest)
                    .count()
            });
            let etag_covers_all = tied < PER_PAGE as usize;
            // One copy per number, the latest (pages can shift while they are read).
            let mut latest: std::collections::BTreeMap<u64, Issue> =
                std::collections::BTreeMap::new();
            for item in items.into_iter().filter(|i| !i.is_pull_request()) {
                let issue = Issue::from(item);
                let newer = latest
                    .get(&issue.number)
                    .is_none_or(|known| issue.updated_at > known.updated_at);
                if newer {
                    latest.insert(issue.number, issue);
                }
            }
            IssueChanges {
                issues: latest.into_values().collect(),
                newest: newest.map(|t| t.to_offset(time::UtcOffset::UTC)),
                pages,
                etag_covers_all,
            }
        }))
    }

    /// One issue (`GET /repos/{owner}/{repo}/issues/{number}`). GitHub answers a pull
    /// request's number here too.
    pub async fn issue(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<Issue, CodeHostError> {
        self.get_json(repo_path(owner, name, &format!("/issues/{number}")))
            .await
    }

    /// Closes an issue (`PATCH …/issues/{number}` `{"state":"closed"}`); closing a closed
    /// issue succeeds.
    pub async fn close_issue(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<(), CodeHostError> {
        let path = repo_path(owner, name, &format!("/issues/{number}"));
        self.send_expect(Method::PATCH, path, &json!({"state": "closed"}))
            .await
            .map(drop)
    }

    /// Makes sure the repository has the label `label`: `GET …/labels/{label}`, and if that
    /// is 404, `POST …/labels` `{name, color}` (`color`: six hex digits, no `#`). A 422
    /// `already_exists` (created concurrently) is success. An existing label keeps its
    /// colour.
    pub async fn ensure_label(
        &self,
        owner: &str,
        name: &str,
        label: &str,
        color: &str,
    ) -> Result<(), CodeHostError> {
        let path = self.route(&repo_path(
            owner,
            name,
            &format!("/labels/{}", encode_segment(label)),
        ));
        let reply = self.send(&Method::GET, &path, None, None).await?;
        match reply.status {
            s if s.is_success() => return Ok(()),
            StatusCode::NOT_FOUND => {}
            _ => return Err(self.error_of(&Method::GET, &path, &reply)),
        }
        let create = self.route(&repo_path(owner, name, "/labels"));
        let body = json!({"name": label, "color": color.trim_start_matches('#')}).to_string();
        let reply = self.send(&Method::POST, &create, Some(body), None).await?;
        if reply.status.is_success()
            || (reply.status == StatusCode::UNPROCESSABLE_ENTITY
                && ErrorJson::parse(&reply.body).has_code("already_exists"))
        {
            Ok(())
        } else {
            Err(self.error_of(&Method::POST, &create, &reply))
        }
    }

    /// Adds labels to an issue or pull request (`POST …/issues/{number}/labels`
    /// `{"labels": [...]}`); labels it already has stay, missing repository labels are
    /// created by GitHub with a default colour.
    pub async fn add_labels(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        labels: &[&str],
    ) -> Result<(), CodeHostError> {
        let path = repo_path(owner, name, &format!("/issues/{number}/labels"));
        self.send_expect(Method::POST, path, &json!({"labels": labels}))
            .await
            .map(drop)
    }

    /// Every comment of an issue or pull request, oldest first, every page.
    pub async fn issue_comments(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<Vec<Comment>, CodeHostError> {
        self.issue_comments_since(owner, name, number, None).await
    }

    /// The comments of an issue or pull request (its conversation, not the review comments
    /// on its diff), oldest first, every page (`GET …/issues/{number}/comments?per_page=100`).
    /// With `since`, only those updated (created or edited) at or after it: `&since=` in
    /// whole UTC seconds, rounded down, as GitHub's `since` is inclusive and second-granular.
    pub async fn issue_comments_since(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        since: Option<OffsetDateTime>,
    ) -> Result<Vec<Comment>, CodeHostError> {
        let path = format!("/issues/{number}/comments");
        self.list_all::<Comment, _>(owner, name, &path, since).await
    }

    /// Posts a comment on an issue or pull request. Unlike other calls it is **not sent
    /// again after a 5xx, a timeout or a broken connection** (GitHub may have stored the
    /// comment before failing): it returns [`CodeHostError::Unavailable`] at once, and the
    /// caller, who can look for its comment first, decides. Rate-limit refusals are still
    /// waited out and retried, since nothing was stored.
    pub async fn create_comment(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        body: &str,
    ) -> Result<Comment, CodeHostError> {
        let path = repo_path(owner, name, &format!("/issues/{number}/comments"));
        self.post_once_as::<Comment, _>(&path, &json!({"body": body}))
            .await
    }

    /// Pull requests, most recently updated first (`state=all`, `sort=updated`,
    /// `direction=desc`, `per_page=100`), with `If-None-Match: etag` on the first page (a 304
    /// gives [`Conditional::NotModified`]). Reads the next page only while the last pull
    /// request of the page read has `updated_at >= since` (every page when `since` is
    /// `None`), so a poll costs one request unless more than a page changed. The value holds
    /// every pull request read, so the last page's may include some older than `since`; the
    /// ETag is the first page's.
    pub async fn pulls_updated_since(
        &self,
        owner: &str,
        name: &str,
        etag: Option<&str>,
        since: Option<OffsetDateTime>,
    ) -> Result<Conditional<Vec<PullRequest>>, CodeHostError> {
        let first = format!(
            "{}?state=all&sort=updated&direction=desc&per_page={PER_PAGE}",
            repo_path(owner, name, "/pulls")
        );
        let more = |page: &[PullRequest]| {
            since.is_none_or(|since| page.last().is_some_and(|p| p.updated_at >= since))
        };
        self.get_pages(first, etag, more).await
    }

    /// One pull request (`GET /repos/{owner}/{repo}/pulls/{number}`).
    pub async fn pull(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<PullRequest, CodeHostError> {
        self.get_json(repo_path(owner, name, &format!("/pulls/{number}")))
            .await
    }

    /// Opens a pull request `head` → `base` (`head` is a branch of this repository, or
    /// `owner:branch`). A 422 (e.g. one already exists for `head`) is
    /// [`CodeHostError::Rejected`]. Like [`create_comment`](Self::create_comment) it is
    /// **not sent again after a 5xx, a timeout or a broken connection**: the pull request
    /// may exist, and the caller finds it with
    /// [`open_pull_for_branch`](Self::open_pull_for_branch).
    pub async fn create_pull(
        &self,
        owner: &str,
        name: &str,
        title: &str,
        head: &str,
        base: &str,
        body: &str,
    ) -> Result<PullRequest, CodeHostError> {
        let path = repo_path(owner, name, "/pulls");
        let body = json!({"title": title, "head": head, "base": base, "body": body});
        self.post_once_as::<PullRequest, _>(&path, &body).await
    }

    /// The open pull request whose head is `branch` of this repository, if any (one page of
    /// `GET /pulls?state=open&head=owner:branch`). Used after an uncertain
    /// [`create_pull`](Self::create_pull) to find the pull request it may have opened.
    pub async fn open_pull_for_branch(
        &self,
        owner: &str,
        name: &str,
        branch: &str,
    ) -> Result<Option<PullRequest>, CodeHostError> {
        let path = format!(
            "{}?state=open&head={}&per_page={PER_PAGE}",
            repo_path(owner, name, "/pulls"),
            encode_segment(&format!("{owner}:{branch}"))
        );
        let pulls: Vec<PullRequest> = self.get_json(path).await?;
        Ok(pulls.into_iter().next())
    }

    /// Posts a review with the event `COMMENT` and this body on a pull request. Like
    /// [`create_comment`](Self::create_comment) it is **not sent again after a 5xx, a
    /// timeout or a broken connection**: the caller looks for its review first
    /// ([`reviews`](Self::reviews), by its author and a marker) and decides.
    pub async fn create_review(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        body: &str,
    ) -> Result<(), CodeHostError> {
        let path = repo_path(owner, name, &format!("/pulls/{number}/reviews"));
        self.post_once(&path, &json!({"body": body, "event": "COMMENT"}))
            .await?;
        Ok(())
    }

    /// Every review of a pull request, oldest first, every page
    /// (`GET …/pulls/{number}/reviews?per_page=100`). [`Review::state`] is GitHub's, upper
    /// case (`CHANGES_REQUESTED`, `COMMENTED`, `APPROVED`, `DISMISSED`, `PENDING`).
    pub async fn reviews(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<Vec<Review>, CodeHostError> {
        let path = format!("/pulls/{number}/reviews");
        self.list_all::<Review, _>(owner, name, &path, None).await
    }

    /// The review comments of a pull request (the comments on lines of its diff), in
    /// GitHub's order (oldest first), every page (`GET …/pulls/{number}/comments?per_page=100`).
    /// With `since`, only those updated at or after it (`&since=`, whole UTC seconds, rounded
    /// down).
    pub async fn review_comments(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        since: Option<OffsetDateTime>,
    ) -> Result<Vec<ReviewComment>, CodeHostError> {
        let path = format!("/pulls/{number}/comments");
        self.list_all::<ReviewCommentItem, _>(owner, name, &path, since)
            .await
    }

    /// The permission `login` has on the repository
    /// (`GET …/collaborators/{login}/permission`): its `role_name` when that is one of
    /// GitHub's base roles (`admin`, `maintain`, `write`, `triage`, `read`), else the legacy
    /// `permission` (`admin`, `write`, `read`, `none`; an organisation's custom role is
    /// reported there as its base). A 404 is [`Permission::None`], not an error: GitHub
    /// answers it for a login that is no user, and also for a repository the token cannot
    /// see, without saying which. An answer naming no known permission is
    /// [`CodeHostError::InvalidResponse`].
    pub async fn collaborator_permission(
        &self,
        owner: &str,
        name: &str,
        login: &str,
    ) -> Result<Permission, CodeHostError> {
        let target = self.route(&repo_path(
            owner,
            name,
            &format!("/collaborators/{}/permission", encode_segment(login)),
        ));
        let reply = self.send(&Method::GET, &target, None, None).await?;
        match reply.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(Permission::None),
            _ => return Err(self.error_of(&Method::GET, &target, &reply)),
        }
        let answer: PermissionJson = parse(&Method::GET, &target, &reply.body)?;
        answer.permission().ok_or_else(|| {
            CodeHostError::InvalidResponse(format!(
                "GET {}: no known permission in the answer",
                path_only(&target)
            ))
        })
    }

    /// Adds the reaction `content` (`+1`, `-1`, `laugh`, `confused`, `heart`, `hooray`,
    /// `rocket` or `eyes`) of the token's user to a comment
    /// (`POST …/issues/comments/{id}/reactions` or `POST …/pulls/comments/{id}/reactions`,
    /// `{"content": …}`). GitHub answers 201 when it creates the reaction and 200 when the
    /// user already reacted so: both are `Ok`. A 404 (no such comment) is
    /// [`CodeHostError::NotFound`], a 422 (unknown content) [`CodeHostError::Rejected`].
    ///
    /// Unlike [`create_comment`](Self::create_comment), it **is** sent again after a 5xx, a
    /// timeout or a broken connection: a user has at most one reaction of each content on a
    /// comment, so sending it twice stores nothing twice.
    pub async fn add_reaction(
        &self,
        owner: &str,
        name: &str,
        target: ReactionTarget,
        content: &str,
    ) -> Result<(), CodeHostError> {
        let rest = match target {
            ReactionTarget::IssueComment(id) => format!("/issues/comments/{id}/reactions"),
            ReactionTarget::ReviewComment(id) => format!("/pulls/comments/{id}/reactions"),
        };
        self.send_expect(
            Method::POST,
            repo_path(owner, name, &rest),
            &json!({"content": content}),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {

    use super::transport::rate_limit_wait;
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn base_urls_split_into_origin_and_path() {
        let ok = |u: &str| parse_base_url(u).unwrap();
        assert_eq!(
            ok("https://api.github.com"),
            ("https".into(), "api.github.com".into(), String::new())
        );
        assert_eq!(
            ok("http://127.0.0.1:8080/"),
            ("http".into(), "127.0.0.1:8080".into(), String::new())
        );
        assert_eq!(
            ok("https://ghe.example/api/v3/"),
            ("https".into(), "ghe.example".into(), "/api/v3".into())
        );
        for bad in [
            "",
            "api.github.com",
            "ftp://x",
            "https://user:pw@h",
            "https://h/?q=1",
            "not a url",
        ] {
            let err = parse_base_url(bad).unwrap_err();
            assert!(matches!(err, CodeHostError::Config(_)), "{bad}: {err:?}");
            assert!(!err.to_string().contains("pw"), "{err}");
        }
    }

    #[test]
    fn rate_limited_answers_are_recognised() {
        let now_plus = |s: u64| {
            (SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                + s)
                .to_string()
        };
        let forbidden = StatusCode::FORBIDDEN;
        assert_eq!(
            rate_limit_wait(forbidden, &headers(&[("retry-after", "7")]), ""),
            Some(Duration::from_secs(7))
        );
        let reset = now_plus(30);
        let wait = rate_limit_wait(
            forbidden,
            &headers(&[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
            ]),
            "",
        )
        .unwrap();
        assert!(
            wait > Duration::from_secs(28) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert_eq!(
            rate_limit_wait(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), ""),
            Some(SECONDARY_RATE_LIMIT_WAIT)
        );
        assert_eq!(
            rate_limit_wait(
                forbidden,
                &HeaderMap::new(),
                r#"{"message":"You have exceeded a secondary rate limit."}"#
            ),
            Some(SECONDARY_RATE_LIMIT_WAIT)
        );
        // A reset no clock can hold (a garbled header) is the longest wait, not a panic.
        assert_eq!(
            rate_limit_wait(
                forbidden,
                &headers(&[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", &u64::MAX.to_string()),
                ]),
                ""
            ),
            Some(Duration::MAX)
        );
        // A reset in the past still waits a little.
        assert_eq!(
            rate_limit_wait(
                forbidden,
                &headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1")]),
                ""
            ),
            Some(MIN_RATE_LIMIT_WAIT)
        );
        // A plain 403 and other statuses are not rate limits.
        assert_eq!(
            rate_limit_wait(
                forbidden,
                &headers(&[("x-ratelimit-remaining", "4999")]),
                r#"{"message":"Resource not accessible by integration"}"#
            ),
            None
        );
        assert_eq!(
            rate_limit_wait(StatusCode::NOT_FOUND, &headers(&[("retry-after", "1")]), ""),
            None
        );
    }

    #[test]
    fn tokens_are_checked_without_echoing_them() {
        let config = ClientConfig::default();
        for token in ["", "  ", "ghp_bad\ntoken", "ghp_bad token", "ghp_tökén"] {
            let err = GitHub::new(&config, token).unwrap_err();
            assert!(matches!(err, CodeHostError::Config(_)), "{err:?}");
            assert!(!err.to_string().contains("ghp_"), "{err}");
        }
        let gh = GitHub::new(&config, "ghp_secret123").unwrap();
        let debug = format!("{gh:?}");
        assert!(!debug.contains("ghp_secret123"), "{debug}");
        assert!(debug.contains("api.github.com"), "{debug}");
        assert_eq!(gh.requests_sent(), 0);
    }

    #[test]
    fn the_futures_are_send() {
        fn send<T: Send>(_: T) {}
        let gh = GitHub::new(&ClientConfig::default(), "t").unwrap();
        send(gh.current_user());
        send(gh.open_issues("o", "r", None));
        send(gh.pulls_updated_since("o", "r", None, None));
        send(gh.ensure_label("o", "r", "l", "ffffff"));
        send(gh.create_comment("o", "r", 1, "b"));
        send(gh.reviews("o", "r", 1));
        send(gh.review_comments("o", "r", 1, None));
        send(gh.issue_comments_since("o", "r", 1, None));
        send(gh.collaborator_permission("o", "r", "u"));
        send(gh.add_reaction("o", "r", ReactionTarget::IssueComment(1), "eyes"));
        send(gh.clone());
    }

    #[test]
    fn repo_paths_are_encoded() {
        assert_eq!(
            repo_path("acme", "web", "/issues"),
            "/repos/acme/web/issues"
        );
        assert_eq!(repo_path("a b", "c/d", ""), "/repos/a%20b/c%2Fd");
        assert_eq!(path_only("/repos/a/b?page=2"), "/repos/a/b");
    }

    #[test]
    fn since_is_whole_utc_seconds() {
        let t = time::macros::datetime!(2024-03-05 06:07:08.999 +02:00);
        assert_eq!(since_param(t), "2024-03-05T04:07:08Z");
    }
}
