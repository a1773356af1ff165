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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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
use crate::wire::{
    CommentJson, ErrorJson, IssueJson, PermissionJson, PullJson, RepoJson, ReviewCommentJson,
    ReviewJson, UserJson,
};

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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
        lock(&self.inner.rate).map(|w| (w.remaining, w.reset_epoch))
    }

    // ----- the API -----

    /// The token's user (`GET /user`); also the cheapest check that a token works.
    pub async fn current_user(&self) -> Result<User, CodeHostError> {
        let user: UserJson = self.get_json("/user".to_owned()).await?;
        Ok(user.into())
    }

    /// A repository (`GET /repos/{owner}/{repo}`).
    pub async fn repository(&self, owner: &str, name: &str) -> Result<RepoInfo, CodeHostError> {
        let repo: RepoJson = self.get_json(repo_path(owner, name, "")).await?;
        Ok(repo.into())
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
            .get_pages::<IssueJson>(first, etag, |_: &[IssueJson]| true)
            .await?;
        Ok(match pages {
            Conditional::NotModified => Conditional::NotModified,
            Conditional::Modified { value, etag } => {
                let mut seen = std::collections::HashSet::new();
                let issues = value
                    .into_iter()
                    .filter(|i| !i.is_pull_request() && seen.insert(i.number))
                    .map(Issue::from)
                    .collect();
                Conditional::Modified {
                    value: issues,
                    etag,
                }
            }
        })
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
            .get_counted_pages::<IssueJson>(first, etag, |_: &[IssueJson]| true)
            .await?;
        Ok(match pages {
            Conditional::NotModified => Conditional::NotModified,
            Conditional::Modified {
                value: (items, pages),
                etag,
            } => {
                let newest = items.iter().map(|i| i.updated_at).max();
                let tied = newest.map_or(0, |newest| {
                    items.iter().filter(|i| i.updated_at == newest).count()
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
                Conditional::Modified {
                    value: IssueChanges {
                        issues: latest.into_values().collect(),
                        newest: newest.map(|t| t.to_offset(time::UtcOffset::UTC)),
                        pages,
                        etag_covers_all,
                    },
                    etag,
                }
            }
        })
    }

    /// One issue (`GET /repos/{owner}/{repo}/issues/{number}`). GitHub answers a pull
    /// request's number here too.
    pub async fn issue(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<Issue, CodeHostError> {
        let issue: IssueJson = self
            .get_json(repo_path(owner, name, &format!("/issues/{number}")))
            .await?;
        Ok(issue.into())
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
        let first = format!(
            "{}?per_page={PER_PAGE}{}",
            repo_path(owner, name, &format!("/issues/{number}/comments")),
            since_query(since)
        );
        let items = self.get_all::<CommentJson>(first).await?;
        Ok(items.into_iter().map(Comment::from).collect())
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
        let (reply, target) = self.post_once(&path, &json!({"body": body})).await?;
        let comment: CommentJson = parse(&Method::POST, &target, &reply.body)?;
        Ok(comment.into())
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
        let more = |page: &[PullJson]| {
            since.is_none_or(|since| page.last().is_some_and(|p| p.updated_at >= since))
        };
        let pages = self.get_pages::<PullJson>(first, etag, more).await?;
        Ok(match pages {
            Conditional::NotModified => Conditional::NotModified,
            Conditional::Modified { value, etag } => Conditional::Modified {
                value: value.into_iter().map(PullRequest::from).collect(),
                etag,
            },
        })
    }

    /// One pull request (`GET /repos/{owner}/{repo}/pulls/{number}`).
    pub async fn pull(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<PullRequest, CodeHostError> {
        let pull: PullJson = self
            .get_json(repo_path(owner, name, &format!("/pulls/{number}")))
            .await?;
        Ok(pull.into())
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
        let (reply, target) = self
            .post_once(
                &path,
                &json!({"title": title, "head": head, "base": base, "body": body}),
            )
            .await?;
        let pull: PullJson = parse(&Method::POST, &target, &reply.body)?;
        Ok(pull.into())
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
        let pulls: Vec<PullJson> = self.get_json(path).await?;
        Ok(pulls.into_iter().next().map(PullRequest::from))
    }

    /// Posts a review with the event `COMMENT` and this body on a pull request. Like
    /// [`create_comment`](Self::create_comment) it is **not sent again after a 5xx, a
    /// timeout or a broken connection**: the caller looks for its review first
    /// ([`review_bodies`](Self::review_bodies)) and decides.
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

    /// The bodies of every review of a pull request, oldest first, every page (the bodies of
    /// [`reviews`](Self::reviews), `""` for a review without one).
    pub async fn review_bodies(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Result<Vec<String>, CodeHostError> {
        let reviews = self.reviews(owner, name, number).await?;
        Ok(reviews.into_iter().map(|r| r.body).collect())
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
        let first = format!(
            "{}?per_page={PER_PAGE}",
            repo_path(owner, name, &format!("/pulls/{number}/reviews"))
        );
        let items = self.get_all::<ReviewJson>(first).await?;
        Ok(items.into_iter().map(Review::from).collect())
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
        let first = format!(
            "{}?per_page={PER_PAGE}{}",
            repo_path(owner, name, &format!("/pulls/{number}/comments")),
            since_query(since)
        );
        let items = self.get_all::<ReviewCommentJson>(first).await?;
        Ok(items.into_iter().map(ReviewComment::from).collect())
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

    // ----- request helpers -----

    /// The full path of a route: the base path in front.
    fn route(&self, path: &str) -> String {
        format!("{}{path}", self.inner.base_path)
    }

    async fn get_json<T: DeserializeOwned>(&self, path: String) -> Result<T, CodeHostError> {
        let target = self.route(&path);
        let reply = self.send(&Method::GET, &target, None, None).await?;
        if !reply.status.is_success() {
            return Err(self.error_of(&Method::GET, &target, &reply));
        }
        parse(&Method::GET, &target, &reply.body)
    }

    async fn send_expect(
        &self,
        method: Method,
        path: String,
        body: &Value,
    ) -> Result<Reply, CodeHostError> {
        let target = self.route(&path);
        let reply = self
            .send(&method, &target, Some(body.to_string()), None)
            .await?;
        if reply.status.is_success() {
            Ok(reply)
        } else {
            Err(self.error_of(&method, &target, &reply))
        }
    }

    /// POSTs `body` once: a 5xx, a timeout or a broken connection is not re-sent (the
    /// write may have happened); rate-limit refusals are waited out and re-sent.
    async fn post_once(&self, path: &str, body: &Value) -> Result<(Reply, String), CodeHostError> {
        let target = self.route(path);
        let reply = self
            .send_with(
                &Method::POST,
                &target,
                Some(body.to_string()),
                None,
                Resend::OnlyRefused,
            )
            .await?;
        if !reply.status.is_success() {
            return Err(self.error_of(&Method::POST, &target, &reply));
        }
        Ok((reply, target))
    }

    /// Reads every page of a list, unconditionally.
    async fn get_all<T: DeserializeOwned>(&self, first: String) -> Result<Vec<T>, CodeHostError> {
        match self.get_pages(first, None, |_: &[T]| true).await? {
            Conditional::Modified { value, .. } => Ok(value),
            Conditional::NotModified => Err(CodeHostError::InvalidResponse(
                "304 to a request without If-None-Match".into(),
            )),
        }
    }

    /// Reads a list: the first page (conditional on `etag`), then each `rel="next"` page
    /// while `more(last page read)` says so.
    async fn get_pages<T: DeserializeOwned>(
        &self,
        first: String,
        etag: Option<&str>,
        more: impl FnMut(&[T]) -> bool,
    ) -> Result<Conditional<Vec<T>>, CodeHostError> {
        Ok(match self.get_counted_pages(first, etag, more).await? {
            Conditional::NotModified => Conditional::NotModified,
            Conditional::Modified {
                value: (items, _),
                etag,
            } => Conditional::Modified { value: items, etag },
        })
    }

    /// [`Self::get_pages`] that also says how many pages it read.
    async fn get_counted_pages<T: DeserializeOwned>(
        &self,
        first: String,
        etag: Option<&str>,
        mut more: impl FnMut(&[T]) -> bool,
    ) -> Result<Conditional<(Vec<T>, usize)>, CodeHostError> {
        let mut target = self.route(&first);
        let mut all = Vec::new();
        let mut first_etag = None;
        for page in 0..MAX_PAGES {
            let if_none_match = if page == 0 { etag } else { None };
            let reply = self
                .send(&Method::GET, &target, None, if_none_match)
                .await?;
            if reply.status == StatusCode::NOT_MODIFIED {
                if page == 0 && if_none_match.is_some() {
                    return Ok(Conditional::NotModified);
                }
                return Err(CodeHostError::InvalidResponse(format!(
                    "GET {}: 304 to a request without If-None-Match",
                    path_only(&target)
                )));
            }
            if reply.status != StatusCode::OK {
                return Err(self.error_of(&Method::GET, &target, &reply));
            }
            if page == 0 {
                first_etag = reply.header(ETAG).map(str::to_owned);
            }
            let items: Vec<T> = parse(&Method::GET, &target, &reply.body)?;
            let go_on = !items.is_empty() && more(&items);
            all.extend(items);
            let next = reply.header(LINK).and_then(next_link);
            match next {
                Some(link) if go_on => {
                    target = link_target(&self.inner.base_path, link).ok_or_else(|| {
                        CodeHostError::InvalidResponse(format!(
                            "GET {}: a Link header that is not a URL",
                            path_only(&target)
                        ))
                    })?;
                }
                _ => {
                    return Ok(Conditional::Modified {
                        value: (all, page + 1),
                        etag: first_etag,
                    });
                }
            }
        }
        Err(CodeHostError::InvalidResponse(format!(
            "GET {}: more than {MAX_PAGES} pages",
            path_only(&first)
        )))
    }

    /// The error for a final non-success answer.
    fn error_of(&self, method: &Method, target: &str, reply: &Reply) -> CodeHostError {
        let reason = reply.status.canonical_reason().unwrap_or("HTTP error");
        let detail = ErrorJson::parse(&reply.body).describe(reason);
        let message = self.scrub(format!("{method} {}: {detail}", path_only(target)));
        match reply.status.as_u16() {
            401 => CodeHostError::Unauthorized(message),
            403 => CodeHostError::Forbidden(message),
            404 => CodeHostError::NotFound(message),
            status => CodeHostError::Rejected { status, message },
        }
    }

    /// Removes the token from a message, should anything have echoed it.
    fn scrub(&self, message: String) -> String {
        if message.contains(&self.inner.token) {
            message.replace(&self.inner.token, "[redacted]")
        } else {
            message
        }
    }

    // ----- the request loop -----

    /// Sends one request (`target` is the path and query, base path included) with retries
    /// and rate-limit waits, and returns the final answer: 2xx, 304, or a 4xx that is not a
    /// rate limit.
    async fn send(
        &self,
        method: &Method,
        target: &str,
        body: Option<String>,
        if_none_match: Option<&str>,
    ) -> Result<Reply, CodeHostError> {
        self.send_with(method, target, body, if_none_match, Resend::AfterFailures)
            .await
    }

    /// [`Self::send`] with a choice of what is sent again.
    async fn send_with(
        &self,
        method: &Method,
        target: &str,
        body: Option<String>,
        if_none_match: Option<&str>,
        resend: Resend,
    ) -> Result<Reply, CodeHostError> {
        let config = &self.inner.config;
        let mut retries = 0u32;
        loop {
            self.wait_for_rate_window(method, target).await?;
            let attempt = self
                .attempt(method, target, body.clone(), if_none_match)
                .await?;
            let reason = match attempt {
                Attempt::Failed(reason) => reason,
                Attempt::Answer(status, headers, text) => {
                    self.note_rate(&headers);
                    if status.is_server_error() {
                        let why = ErrorJson::parse(&text)
                            .describe(status.canonical_reason().unwrap_or("server error"));
                        format!("HTTP {}: {why}", status.as_u16())
                    } else if let Some(wait) = rate_limit_wait(status, &headers, &text) {
                        if wait > config.max_rate_limit_wait || retries >= config.max_retries {
                            tracing::warn!(
                                method = %method,
                                path = %path_only(target),
                                wait_secs = wait.as_secs_f64(),
                                "code host rate limit: giving up"
                            );
                            return Err(CodeHostError::RateLimited { retry_after: wait });
                        }
                        retries += 1;
                        tracing::warn!(
                            method = %method,
                            path = %path_only(target),
                            status = status.as_u16(),
                            wait_secs = wait.as_secs_f64(),
                            retry = retries,
                            "code host rate limit: waiting"
                        );
                        tokio::time::sleep(wait).await;
                        // The wait covered the window the answer announced.
                        *lock(&self.inner.rate) = None;
                        continue;
                    } else {
                        return Ok(Reply {
                            status,
                            headers,
                            body: text,
                        });
                    }
                }
            };
            let reason = self.scrub(reason);
            if retries >= config.max_retries || resend == Resend::OnlyRefused {
                let attempts = retries + 1;
                return Err(CodeHostError::Unavailable(format!(
                    "{method} {}: {reason} ({attempts} attempt{})",
                    path_only(target),
                    if attempts == 1 { "" } else { "s" }
                )));
            }
            let delay = backoff_delay(
                config.backoff_base,
                config.backoff_max,
                retries,
                self.inner.jitter.next_u64(),
            );
            retries += 1;
            tracing::warn!(
                method = %method,
                path = %path_only(target),
                reason = %reason,
                retry = retries,
                delay_ms = delay.as_millis() as u64,
                "code host request failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// One HTTP exchange, bounded by the request timeout.
    async fn attempt(
        &self,
        method: &Method,
        target: &str,
        body: Option<String>,
        if_none_match: Option<&str>,
    ) -> Result<Attempt, CodeHostError> {
        let transport = self.transport()?;
        let request = self.request(method, target, body, if_none_match)?;
        self.inner.sent.fetch_add(1, Ordering::Relaxed);
        let timeout = self.inner.config.request_timeout;
        let exchange = async {
            let response = match transport.execute(request).await {
                Ok(response) => response,
                Err(e) => return Attempt::Failed(format!("connection error: {e}")),
            };
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Ok(bytes) => match String::from_utf8(bytes.to_bytes().to_vec()) {
                    Ok(text) => Attempt::Answer(parts.status, parts.headers, text),
                    // Only bodies are parsed; a non-UTF-8 one is as good as none.
                    Err(_) => Attempt::Answer(parts.status, parts.headers, String::new()),
                },
                Err(e) => Attempt::Failed(format!("reading the answer: {e}")),
            }
        };
        Ok(match tokio::time::timeout(timeout, exchange).await {
            Ok(attempt) => attempt,
            Err(_) => Attempt::Failed(format!("no answer within {timeout:?}")),
        })
    }

    fn request(
        &self,
        method: &Method,
        target: &str,
        body: Option<String>,
        if_none_match: Option<&str>,
    ) -> Result<http::Request<OctoBody>, CodeHostError> {
        let inner = &self.inner;
        let uri = format!("{}://{}{target}", inner.scheme, inner.authority);
        let mut builder = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(AUTHORIZATION, inner.authorization.clone())
            .header(USER_AGENT, inner.user_agent.clone())
            .header(ACCEPT, MEDIA_TYPE)
            .header("x-github-api-version", API_VERSION);
        if let Some(etag) = if_none_match {
            builder = builder.header(IF_NONE_MATCH, etag);
        }
        let body = match body {
            Some(body) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                OctoBody::from(body)
            }
            None => OctoBody::empty(),
        };
        builder.body(body).map_err(|e| {
            CodeHostError::Config(self.scrub(format!(
                "cannot build the request {method} {}: {e}",
                path_only(target)
            )))
        })
    }

    /// The octocrab transport of the current tokio runtime, built on first use there.
    fn transport(&self) -> Result<Octocrab, CodeHostError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| CodeHostError::Config("the client needs a tokio runtime".into()))?
            .id();
        let mut transports = lock(&self.inner.transports);
        if let Some((_, octocrab)) = transports.iter().find(|(id, _)| *id == runtime) {
            return Ok(octocrab.clone());
        }
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, OctoBody>(self.inner.connector.clone());
        let octocrab = match OctocrabBuilder::new_empty()
            .with_service(client)
            .with_auth(AuthState::None)
            .build()
        {
            Ok(octocrab) => octocrab,
            Err(never) => match never {},
        };
        if transports.len() >= MAX_TRANSPORTS {
            transports.clear();
        }
        transports.push((runtime, octocrab.clone()));
        Ok(octocrab)
    }

    // ----- rate limits -----

    /// Remembers `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    fn note_rate(&self, headers: &HeaderMap) {
        if let (Some(remaining), Some(reset_epoch)) = (
            header_u64(headers, "x-ratelimit-remaining"),
            header_u64(headers, "x-ratelimit-reset"),
        ) {
            *lock(&self.inner.rate) = Some(RateWindow {
                remaining,
                reset_epoch,
            });
        }
    }

    /// Before a request: if the last answer said the window is used up and it has not reset
    /// yet, waits for the reset (or fails when that is too long).
    async fn wait_for_rate_window(
        &self,
        method: &Method,
        target: &str,
    ) -> Result<(), CodeHostError> {
        let window = *lock(&self.inner.rate);
        let Some(window) = window.filter(|w| w.remaining == 0) else {
            return Ok(());
        };
        let wait = until_epoch(window.reset_epoch, SystemTime::now());
        if wait.is_zero() {
            return Ok(());
        }
        if wait > self.inner.config.max_rate_limit_wait {
            return Err(CodeHostError::RateLimited { retry_after: wait });
        }
        tracing::warn!(
            method = %method,
            path = %path_only(target),
            wait_secs = wait.as_secs_f64(),
            "code host rate limit used up: waiting for the reset"
        );
        tokio::time::sleep(wait).await;
        let mut rate = lock(&self.inner.rate);
        if *rate == Some(window) {
            *rate = None;
        }
        Ok(())
    }
}

/// How long a rate-limited answer asks to wait, or `None` if it is not a rate limit.
fn rate_limit_wait(status: StatusCode, headers: &HeaderMap, body: &str) -> Option<Duration> {
    let limited = match status.as_u16() {
        429 => true,
        403 => {
            header_str(headers, "retry-after").is_some()
                || header_u64(headers, "x-ratelimit-remaining") == Some(0)
                || ErrorJson::parse(body)
                    .message
                    .is_some_and(|m| m.to_ascii_lowercase().contains("rate limit"))
        }
        _ => false,
    };
    if !limited {
        return None;
    }
    let now = SystemTime::now();
    let wait = if let Some(after) =
        header_str(headers, "retry-after").and_then(|v| parse_retry_after(v, now))
    {
        after
    } else if header_u64(headers, "x-ratelimit-remaining") == Some(0)
        && let Some(reset) = header_u64(headers, "x-ratelimit-reset")
    {
        until_epoch(reset, now)
    } else {
        SECONDARY_RATE_LIMIT_WAIT
    };
    Some(wait.max(MIN_RATE_LIMIT_WAIT))
}

fn parse<T: DeserializeOwned>(
    method: &Method,
    target: &str,
    body: &str,
) -> Result<T, CodeHostError> {
    serde_json::from_str(body)
        .map_err(|e| CodeHostError::InvalidResponse(format!("{method} {}: {e}", path_only(target))))
}

/// `/repos/{owner}/{name}{rest}`, the names percent-encoded.
fn repo_path(owner: &str, name: &str, rest: &str) -> String {
    format!(
        "/repos/{}/{}{rest}",
        encode_segment(owner),
        encode_segment(name)
    )
}

/// `since` as GitHub's query takes it: UTC, whole seconds (rounded down), `Z`.
fn since_param(since: OffsetDateTime) -> String {
    let t = since.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// `&since=…` for a list query, or nothing.
fn since_query(since: Option<OffsetDateTime>) -> String {
    since.map_or_else(String::new, |t| format!("&since={}", since_param(t)))
}

/// A target without its query, for messages and logs.
fn path_only(target: &str) -> &str {
    target.split_once('?').map_or(target, |(path, _)| path)
}

/// Splits the base URL into scheme, authority and base path (no trailing `/`).
fn parse_base_url(url: &str) -> Result<(String, String, String), CodeHostError> {
    let bad = |why: &str| {
        CodeHostError::Config(format!(
            "api_url {why}: expected http(s)://host[:port][/path]"
        ))
    };
    let trimmed = url.trim().trim_end_matches('/');
    let uri: http::Uri = trimmed.parse().map_err(|_| bad("is not a URL"))?;
    let scheme = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("https") => "https",
        Some(s) if s.eq_ignore_ascii_case("http") => "http",
        _ => return Err(bad("is not an http or https URL")),
    };
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("must not contain credentials"));
    }
    if authority.host().is_empty() {
        return Err(bad("has no host"));
    }
    if uri.query().is_some() || trimmed.contains('#') {
        return Err(bad("must not have a query or fragment"));
    }
    let path = uri.path().trim_end_matches('/').to_owned();
    Ok((scheme.to_owned(), authority.as_str().to_owned(), path))
}

#[cfg(test)]
mod tests {

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
