//! A fake GitHub REST v3 server for agentry's tests (a dev-dependency only, never shipped).
//!
//! [`FakeGitHub::start`] runs a real HTTP/1.1 server on `127.0.0.1` (a free port) on its own
//! thread; dropping the [`FakeGitHub`] stops it. Tests seed and inspect its state through the
//! methods of [`FakeGitHub`], point a client (octocrab, reqwest) at [`FakeGitHub::base_url`],
//! and read back every request it answered ([`FakeGitHub::requests`], [`FakeGitHub::count`]).
//!
//! What it speaks, like api.github.com:
//! * JSON in GitHub's shapes (the members octocrab's models require, snake_case, numeric ids,
//!   `node_id`s, RFC 3339 `Z` timestamps, API `url`s on the fake's base URL and `html_url`s on
//!   `https://github.com`), `Content-Type: application/json; charset=utf-8`;
//! * a `User-Agent` is required (403 without), and `Authorization: Bearer <token>` (or
//!   `token <token>`) with a token added by [`FakeGitHub::add_token`] (401 otherwise);
//!   repositories a token may not see answer 404;
//! * `X-RateLimit-Limit/Remaining/Reset/Used` on every answer; each authenticated request but
//!   a 304 uses one unit; at 0 the fake answers 403 `API rate limit exceeded…` until the reset;
//! * a strong `ETag` (quoted hex SHA-256 of the body) on every successful GET, and
//!   `304 Not Modified` (no body, no rate-limit cost) when `If-None-Match` matches;
//! * pagination with `per_page` (default 30, max 100), `page` and a `Link` header with
//!   absolute `prev`/`next`/`last`/`first` URLs;
//! * `404 {"message":"Not Found"}` for anything it does not know. Errors are JSON
//!   `{"message", "documentation_url", "status"[, "errors"]}`; no request makes it panic.
//!
//! Routes: `GET /user`; `GET /repos/{owner}/{repo}`; `GET|POST /repos/{owner}/{repo}/issues`;
//! `GET|PATCH …/issues/{issue_number}`; `GET|POST …/issues/{issue_number}/comments`;
//! `GET|POST …/issues/{issue_number}/labels`; `DELETE …/issues/{issue_number}/labels/{name}`;
//! `GET|POST /repos/{owner}/{repo}/labels`; `GET …/labels/{name}`;
//! `GET|POST /repos/{owner}/{repo}/pulls`; `GET|PATCH …/pulls/{pull_number}`;
//! `GET|POST …/pulls/{pull_number}/reviews`; `GET …/pulls/{pull_number}/comments` (review
//! comments); `GET|PUT …/pulls/{pull_number}/merge`;
//! `POST /repos/{owner}/{repo}/issues/comments/{comment_id}/reactions`;
//! `POST /repos/{owner}/{repo}/pulls/comments/{comment_id}/reactions`;
//! `GET /repos/{owner}/{repo}/collaborators/{username}/permission`.
//!
//! [`payloads`] builds webhook payloads (`pull_request_review`, `issue_comment`,
//! `pull_request_review_comment`) from the fake's state, for tests that deliver webhooks.

mod handler;
mod model;
pub mod payloads;
mod util;

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use agentry_testkit::served::Served;

use agentry_testkit::SplitMix64;
use handler::{Incoming, MAX_BODY_BYTES, Outcome};
use model::{FaultMode, FaultRule, State, Token, repo_key};
use parking_lot::{Mutex, MutexGuard};

/// A failure the fake answers instead of handling a request, or instead of its answer (see
/// [`FakeGitHub::fail_next`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Answer this status (e.g. 500, 502, 503; anything outside 400–599 becomes 500) with a
    /// JSON `message`.
    Status(u16),
    /// Hold the request this long, then answer `504 Gateway Timeout`. Longer than the
    /// client's timeout, it looks like a hung server.
    Timeout(Duration),
    /// GitHub's primary rate limit: `403` with `Retry-After`, `X-RateLimit-Remaining: 0`, an
    /// `X-RateLimit-Reset` `retry_after_secs` from now and `API rate limit exceeded…`.
    RateLimited {
        /// Seconds in `Retry-After` (and until `X-RateLimit-Reset`).
        retry_after_secs: u64,
    },
    /// Handle the request (it takes effect), then answer this status instead of its
    /// answer, as a proxy failing after the origin acted (e.g. 502): the "did it happen?"
    /// case a client must not resolve by sending again.
    AnswerLost(u16),
    /// GitHub's secondary rate limit: `429` with `Retry-After`.
    SecondaryRateLimit {
        /// Seconds in `Retry-After`.
        retry_after_secs: u64,
    },
}

/// One request the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// Upper-case method.
    pub method: String,
    /// The path as sent (percent-encoding kept), without the query.
    pub path: String,
    /// The raw query string, without `?` (empty when none).
    pub query: String,
    /// The route pattern it matched (e.g. `/repos/{owner}/{repo}/issues`), `None` for an
    /// unknown path.
    pub route: Option<String>,
    /// The status answered (also for injected faults; 304 for conditional hits).
    pub status: u16,
    /// Whether the request carried `If-None-Match`.
    pub if_none_match: bool,
    /// Whether the request carried an `Authorization` header.
    pub authorization: bool,
}

/// A comment, as [`FakeGitHub::issue`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentState {
    /// Comment id.
    pub id: u64,
    /// Markdown body.
    pub body: String,
    /// Login of the author (the token's user for comments made through the API).
    pub user: String,
}

/// An issue (or the issue side of a pull request), as [`FakeGitHub::issue`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueState {
    /// Issue number.
    pub number: u64,
    /// Title.
    pub title: String,
    /// Body, if any.
    pub body: Option<String>,
    /// `open` or `closed`.
    pub state: String,
    /// `completed`, `not_planned`, `reopened`, … when set.
    pub state_reason: Option<String>,
    /// Labels as `(name, color)`, in the order they were added.
    pub labels: Vec<(String, String)>,
    /// Comments, oldest first.
    pub comments: Vec<CommentState>,
    /// Whether this number is a pull request.
    pub is_pull_request: bool,
    /// `updated_at` as the API writes it.
    pub updated_at: String,
}

/// A reaction to a comment, as [`FakeGitHub::reactions`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaction {
    /// The id of the comment reacted to.
    pub comment_id: u64,
    /// Whether that is a review comment (on a diff line) rather than an issue comment.
    pub review_comment: bool,
    /// `+1`, `-1`, `laugh`, `confused`, `heart`, `hooray`, `rocket` or `eyes`.
    pub content: String,
    /// Login of the user who reacted.
    pub user: String,
}

/// A pull request, as [`FakeGitHub::pulls`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullState {
    /// Number (shared with issues).
    pub number: u64,
    /// Title.
    pub title: String,
    /// Body, if any.
    pub body: Option<String>,
    /// Head branch name (`ref`, without an `owner:` prefix).
    pub head: String,
    /// Base branch name.
    pub base: String,
    /// `open` or `closed`.
    pub state: String,
    /// Whether it was merged.
    pub merged: bool,
    /// Login of the author.
    pub user: String,
    /// Label names.
    pub labels: Vec<String>,
}

/// A running fake GitHub REST API server. See the [module docs](self).
#[derive(Debug)]
pub struct FakeGitHub {
    state: Arc<Mutex<State>>,
    /// The server; dropping the fake stops it.
    served: Served,
}

async fn handle(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<Arc<Mutex<State>>>,
) -> HttpResponse {
    let body = match payload.to_bytes_limited(MAX_BODY_BYTES).await {
        Ok(Ok(bytes)) => Ok(bytes.to_vec()),
        Ok(Err(_)) => Err(400),
        Err(_) => Err(413),
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let incoming = Incoming {
        method: req.method().as_str().to_owned(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().unwrap_or_default().to_owned(),
        user_agent: header("user-agent"),
        authorization: header("authorization"),
        if_none_match: header("if-none-match"),
        body,
    };
    let outcome = {
        let mut guard = state.lock();
        handler::process(&mut guard, &incoming)
    };
    to_response(outcome).await
}

async fn to_response(outcome: Outcome) -> HttpResponse {
    if let Some(delay) = outcome.delay {
        actix_web::rt::time::sleep(delay).await;
    }
    let status = StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    for (name, value) in outcome.headers {
        builder.insert_header((name, value));
    }
    match outcome.body {
        Some(body) => builder.body(body),
        None => builder.finish(),
    }
}

impl FakeGitHub {
    /// Starts a fake on `127.0.0.1` and a free port.
    ///
    /// # Panics
    /// If no port can be bound or the server thread cannot start (see [`Self::try_start`]).
    #[track_caller]
    pub fn start() -> Self {
        match Self::try_start() {
            Ok(fake) => fake,
            Err(e) => panic!("fake GitHub: cannot start: {e}"),
        }
    }

    /// Starts a fake on `127.0.0.1` and a free port, or says why it could not.
    pub fn try_start() -> std::io::Result<Self> {
        let (served, state) = Served::on_loopback(
            "fake-github",
            |addr| Arc::new(Mutex::new(State::new(format!("http://{addr}")))),
            handle,
            // actix-web's default time for a request's head.
            Duration::from_secs(5),
        )?;
        Ok(Self { state, served })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash: the client's base URI.
    pub fn base_url(&self) -> String {
        self.served.base_url().to_owned()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Runs `change` on the repository `owner/name`.
    ///
    /// # Panics
    /// If the repository does not exist.
    #[track_caller]
    fn change_repo(&self, owner: &str, name: &str, change: impl FnOnce(&mut model::Repo)) {
        let found = self
            .state()
            .repos
            .get_mut(&repo_key(owner, name))
            .map(change)
            .is_some();
        if !found {
            no_repo(owner, name);
        }
    }

    /// Runs `change` on the locked state for issue or pull request `number` of `owner/name`
    /// (a pull request only, when `pull`), given the repository's key and its owner, and
    /// returns what it returns.
    ///
    /// # Panics
    /// If there is no such issue (or pull request).
    #[track_caller]
    fn change_item<T>(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        pull: bool,
        change: impl FnOnce(&mut State, &str, &str) -> T,
    ) -> T {
        let done = {
            let mut s = self.state();
            let key = repo_key(owner, name);
            let repo_owner = s
                .repos
                .get(&key)
                .filter(|r| {
                    r.items
                        .get(&number)
                        .is_some_and(|i| !pull || i.pull.is_some())
                })
                .map(|r| r.owner.clone());
            repo_owner.map(|repo_owner| change(&mut s, &key, &repo_owner))
        };
        done.unwrap_or_else(|| {
            if pull {
                no_pull(owner, name, number)
            } else {
                no_issue(owner, name, number)
            }
        })
    }

    /// What `read` finds in issue or pull request `number` of `owner/name` (`None` when
    /// there is no such issue).
    fn read_item<T>(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        read: impl FnOnce(&model::Repo, &model::Item) -> Option<T>,
    ) -> Option<T> {
        let s = self.state();
        let repo = s.repos.get(&repo_key(owner, name))?;
        read(repo, repo.items.get(&number)?)
    }

    // ----- tokens -----

    /// Accepts `token` (as `Bearer` or `token`) for the user `login`, on every repository.
    pub fn add_token(&self, token: &str, login: &str) {
        self.insert_token(token, login, None);
    }

    /// Accepts `token` for `login`, seeing only the repositories `repos` (`owner/name`); the
    /// others answer 404, like GitHub does for a fine-grained token without access.
    pub fn add_token_with_access(&self, token: &str, login: &str, repos: &[&str]) {
        let repos = repos.iter().map(|r| r.to_ascii_lowercase()).collect();
        self.insert_token(token, login, Some(repos));
    }

    /// Accepts `token` for `login` on `repos` (lower-case `owner/name`; `None` for all).
    fn insert_token(&self, token: &str, login: &str, repos: Option<Vec<String>>) {
        let mut s = self.state();
        s.ensure_user(login);
        s.tokens.insert(
            token.to_owned(),
            Token {
                login: login.to_owned(),
                repos,
            },
        );
    }

    /// Stops accepting `token` (later requests with it answer 401).
    pub fn remove_token(&self, token: &str) {
        self.state().tokens.remove(token);
    }

    // ----- repositories -----

    /// Creates the repository `owner/name` (or returns the id of the existing one) and
    /// returns its id. Its `clone_url` is `https://github.com/{owner}/{name}.git` until
    /// [`Self::set_clone_url`].
    pub fn add_repo(&self, owner: &str, name: &str, default_branch: &str) -> u64 {
        let mut s = self.state();
        let key = repo_key(owner, name);
        if let Some(repo) = s.repos.get(&key) {
            return repo.id;
        }
        s.ensure_user(owner);
        let id = s.new_id();
        let created_at = s.now();
        s.repos.insert(
            key,
            model::Repo {
                id,
                owner: owner.to_owned(),
                name: name.to_owned(),
                default_branch: default_branch.to_owned(),
                clone_url: None,
                created_at,
                labels: Vec::new(),
                items: Default::default(),
                next_number: 1,
                reactions: Vec::new(),
                permissions: Default::default(),
            },
        );
        id
    }

    /// Sets the `clone_url` the repository reports, e.g. `file:///tmp/x/repo.git` for a local
    /// bare repository. Use a URL (octocrab parses it as one): a bare path fails there.
    ///
    /// # Panics
    /// If the repository does not exist.
    #[track_caller]
    pub fn set_clone_url(&self, owner: &str, name: &str, url: &str) {
        self.change_repo(owner, name, |r| r.clone_url = Some(url.to_owned()));
    }

    /// Sets the default branch the repository reports.
    ///
    /// # Panics
    /// If the repository does not exist.
    #[track_caller]
    pub fn set_default_branch(&self, owner: &str, name: &str, branch: &str) {
        self.change_repo(owner, name, |r| r.default_branch = branch.to_owned());
    }

    // ----- issues -----

    /// Opens an issue authored by the repository owner, with these labels (missing repository
    /// labels are created with colour `ededed`), and returns its number. Numbers are shared
    /// with pull requests, like GitHub's.
    ///
    /// # Panics
    /// If the repository does not exist.
    #[track_caller]
    pub fn add_issue(
        &self,
        owner: &str,
        name: &str,
        title: &str,
        body: Option<&str>,
        labels: &[&str],
    ) -> u64 {
        let number = {
            let mut s = self.state();
            let key = repo_key(owner, name);
            let author = s.repos.get(&key).map(|r| r.owner.clone());
            let number = author.and_then(|author| s.create_item(&key, title, body, &author, None));
            if let Some(n) = number {
                let labels: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
                s.add_item_labels(&key, n, &labels);
                // Labels given at creation are part of the creation, not a later update.
                if let Some(item) = s.item_mut(&key, n) {
                    item.updated_at = item.created_at;
                }
            }
            number
        };
        number.unwrap_or_else(|| no_repo(owner, name))
    }

    /// Closes an issue (reason `completed`) as the repository owner.
    ///
    /// # Panics
    /// If the issue does not exist.
    #[track_caller]
    pub fn close_issue(&self, owner: &str, name: &str, number: u64) {
        self.set_open(owner, name, number, false);
    }

    /// Reopens an issue.
    ///
    /// # Panics
    /// If the issue does not exist.
    #[track_caller]
    pub fn reopen_issue(&self, owner: &str, name: &str, number: u64) {
        self.set_open(owner, name, number, true);
    }

    #[track_caller]
    fn set_open(&self, owner: &str, name: &str, number: u64, open: bool) {
        self.change_item(owner, name, number, false, |s, key, actor| {
            s.set_item_open(key, number, open, None, actor);
        });
    }

    /// Adds a label to an issue or pull request (creating the repository label with colour
    /// `ededed` if missing), as someone labelling it on github.com would.
    ///
    /// # Panics
    /// If the issue does not exist.
    #[track_caller]
    pub fn add_label(&self, owner: &str, name: &str, number: u64, label: &str) {
        self.change_item(owner, name, number, false, |s, key, _| {
            s.add_item_labels(key, number, &[label.to_owned()]);
        });
    }

    /// Creates a repository label (`color` without `#`), or recolours an existing one.
    ///
    /// # Panics
    /// If the repository does not exist.
    #[track_caller]
    pub fn add_repo_label(&self, owner: &str, name: &str, label: &str, color: &str) {
        let found = {
            let mut s = self.state();
            let key = repo_key(owner, name);
            let canonical = s.ensure_label(&key, label, color);
            if let Some(l) = s.repos.get_mut(&key).and_then(|r| {
                r.labels
                    .iter_mut()
                    .find(|l| l.name.eq_ignore_ascii_case(label))
            }) {
                l.color = color.to_owned();
            }
            canonical.is_some()
        };
        if !found {
            no_repo(owner, name);
        }
    }

    /// Replaces the body of an issue or pull request.
    ///
    /// # Panics
    /// If the issue does not exist.
    #[track_caller]
    pub fn set_issue_body(&self, owner: &str, name: &str, number: u64, body: Option<&str>) {
        self.change_item(owner, name, number, false, |s, key, _| {
            if let Some(item) = s.item_mut(key, number) {
                item.body = body.map(str::to_owned);
            }
            s.touch(key, number);
        });
    }

    /// Adds a comment to an issue or pull request as `login`; returns the comment id.
    ///
    /// # Panics
    /// If the issue does not exist.
    #[track_caller]
    pub fn add_comment(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        login: &str,
        body: &str,
    ) -> u64 {
        self.change_item(owner, name, number, false, |s, key, _| {
            s.ensure_user(login);
            let id = s.new_id();
            let now = s.now();
            if let Some(item) = s.item_mut(key, number) {
                item.comments.push(model::Comment {
                    id,
                    body: body.to_owned(),
                    user: login.to_owned(),
                    created_at: now,
                    updated_at: now,
                });
            }
            s.touch(key, number);
            id
        })
    }

    // ----- pull requests -----

    /// Opens a pull request `head_ref` → `base_ref` authored by the repository owner and
    /// returns its number (shared with issues).
    ///
    /// # Panics
    /// If the repository does not exist.
    #[track_caller]
    pub fn add_pull(
        &self,
        owner: &str,
        name: &str,
        title: &str,
        head_ref: &str,
        base_ref: &str,
    ) -> u64 {
        let number = {
            let mut s = self.state();
            let key = repo_key(owner, name);
            let author = s.repos.get(&key).map(|r| r.owner.clone());
            author.and_then(|author| {
                s.create_item(
                    &key,
                    title,
                    None,
                    &author,
                    Some((
                        format!("{author}:{head_ref}"),
                        head_ref.to_owned(),
                        base_ref.to_owned(),
                        false,
                    )),
                )
            })
        };
        number.unwrap_or_else(|| no_repo(owner, name))
    }

    /// Merges an open pull request (state `closed`, `merged: true`, `merged_at` now) as the
    /// repository owner; a pull request that is already closed is left alone.
    ///
    /// # Panics
    /// If the pull request does not exist.
    #[track_caller]
    pub fn merge_pull(&self, owner: &str, name: &str, number: u64) {
        self.change_item(owner, name, number, true, |s, key, actor| {
            s.merge(key, number, actor);
        });
    }

    /// Closes a pull request without merging it.
    ///
    /// # Panics
    /// If the pull request does not exist.
    #[track_caller]
    pub fn close_pull(&self, owner: &str, name: &str, number: u64) {
        self.change_item(owner, name, number, true, |s, key, actor| {
            s.set_item_open(key, number, false, None, actor);
            if let Some(item) = s.item_mut(key, number) {
                item.state_reason = None;
            }
        });
    }

    /// Submits a review of pull request `number` as `login`, with `state` as the REST API
    /// writes it (`APPROVED`, `CHANGES_REQUESTED`, `COMMENTED`, `DISMISSED` or `PENDING`), on
    /// the head commit; returns the review id. Like GitHub, a submitted (not pending) review
    /// touches the pull request's `updated_at`.
    ///
    /// # Panics
    /// If the pull request does not exist or `state` is none of those.
    #[track_caller]
    pub fn add_review(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        login: &str,
        state: &str,
        body: &str,
    ) -> u64 {
        const STATES: [&str; 5] = [
            "APPROVED",
            "CHANGES_REQUESTED",
            "COMMENTED",
            "DISMISSED",
            "PENDING",
        ];
        if !STATES.contains(&state) {
            panic!("fake GitHub: review state {state:?} is none of {STATES:?}");
        }
        let id = {
            let mut s = self.state();
            let key = repo_key(owner, name);
            s.push_review(&key, number, login, state, body)
        };
        id.unwrap_or_else(|| no_pull(owner, name, number))
    }

    /// Comments on line `line` of `path` in pull request `number`'s diff as `login` (a
    /// "single comment" on github.com): like GitHub, this submits a `COMMENTED` review with
    /// an empty body holding the comment (its `pull_request_review_id`), and touches the pull
    /// request's `updated_at`. Returns the review comment's id.
    ///
    /// # Panics
    /// If the pull request does not exist.
    #[track_caller]
    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the comment's own members"
    )]
    pub fn add_review_comment(
        &self,
        owner: &str,
        name: &str,
        number: u64,
        login: &str,
        path: &str,
        line: u64,
        body: &str,
    ) -> u64 {
        let id = {
            let mut s = self.state();
            let key = repo_key(owner, name);
            s.push_review(&key, number, login, "COMMENTED", "")
                .and_then(|review_id| {
                    let id = s.new_id();
                    let now = s.now();
                    let pull = s.item_mut(&key, number).and_then(|i| i.pull.as_mut())?;
                    pull.review_comments.push(model::ReviewComment {
                        id,
                        body: body.to_owned(),
                        user: login.to_owned(),
                        path: path.to_owned(),
                        line,
                        created_at: now,
                        updated_at: now,
                        review_id,
                        commit_id: pull.head_sha.clone(),
                    });
                    Some(id)
                })
        };
        id.unwrap_or_else(|| no_pull(owner, name, number))
    }

    /// Gives `login` the role `role` on the repository (`admin`, `maintain`, `write`,
    /// `triage`, `read` or `none`), as `GET …/collaborators/{login}/permission` reports it
    /// (`none` answers `permission: none`). Without a role set, that endpoint answers `admin`
    /// for the owner, `read` for any other user the fake knows (its repositories are public)
    /// and 404 for a login that is no user, like GitHub.
    ///
    /// # Panics
    /// If the repository does not exist or `role` is none of those.
    #[track_caller]
    pub fn set_permission(&self, owner: &str, name: &str, login: &str, role: &str) {
        if !model::ROLES.contains(&role) {
            panic!("fake GitHub: role {role:?} is none of {:?}", model::ROLES);
        }
        self.state().ensure_user(login);
        self.change_repo(owner, name, |r| {
            r.permissions
                .insert(login.to_ascii_lowercase(), role.to_owned());
        });
    }

    // ----- inspection -----

    /// The issue (or pull request) `number`, or `None`.
    pub fn issue(&self, owner: &str, name: &str, number: u64) -> Option<IssueState> {
        self.read_item(owner, name, number, |repo, item| {
            Some(IssueState {
                number,
                title: item.title.clone(),
                body: item.body.clone(),
                state: if item.open { "open" } else { "closed" }.to_owned(),
                state_reason: item.state_reason.clone(),
                labels: item
                    .labels
                    .iter()
                    .map(|l| {
                        let color = repo.label(l).map_or_else(
                            || model::DEFAULT_LABEL_COLOR.to_owned(),
                            |x| x.color.clone(),
                        );
                        (l.clone(), color)
                    })
                    .collect(),
                comments: item
                    .comments
                    .iter()
                    .map(|c| CommentState {
                        id: c.id,
                        body: c.body.clone(),
                        user: c.user.clone(),
                    })
                    .collect(),
                is_pull_request: item.pull.is_some(),
                updated_at: util::format_time(item.updated_at),
            })
        })
    }

    /// The repository's labels as `(name, color)`, in creation order (empty for an unknown
    /// repository).
    pub fn labels(&self, owner: &str, name: &str) -> Vec<(String, String)> {
        self.state()
            .repos
            .get(&repo_key(owner, name))
            .map(|r| {
                r.labels
                    .iter()
                    .map(|l| (l.name.clone(), l.color.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The repository's pull requests, by number.
    pub fn pulls(&self, owner: &str, name: &str) -> Vec<PullState> {
        let s = self.state();
        let Some(repo) = s.repos.get(&repo_key(owner, name)) else {
            return Vec::new();
        };
        repo.items
            .values()
            .filter_map(|i| {
                let p = i.pull.as_ref()?;
                Some(PullState {
                    number: i.number,
                    title: i.title.clone(),
                    body: i.body.clone(),
                    head: p.head_ref.clone(),
                    base: p.base_ref.clone(),
                    state: if i.open { "open" } else { "closed" }.to_owned(),
                    merged: p.merged_at.is_some(),
                    user: i.user.clone(),
                    labels: i.labels.clone(),
                })
            })
            .collect()
    }

    /// The bodies of the reviews posted on pull request `number`, oldest first.
    pub fn reviews(&self, owner: &str, name: &str, number: u64) -> Vec<String> {
        self.read_item(owner, name, number, |_, i| {
            let pull = i.pull.as_ref()?;
            Some(pull.reviews.iter().map(|r| r.body.clone()).collect())
        })
        .unwrap_or_default()
    }

    /// The reactions to the repository's comments (issue and review comments), oldest first
    /// (empty for an unknown repository).
    pub fn reactions(&self, owner: &str, name: &str) -> Vec<Reaction> {
        self.state()
            .repos
            .get(&repo_key(owner, name))
            .map(|r| {
                r.reactions
                    .iter()
                    .map(|x| Reaction {
                        comment_id: x.comment_id,
                        review_comment: x.review_comment,
                        content: x.content.clone(),
                        user: x.user.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The comments of issue or pull request `number` as `(id, author, body)`, oldest first
    /// (empty when there is no such issue); the same as [`Self::issue`]'s `comments`.
    pub fn issue_comments(
        &self,
        owner: &str,
        name: &str,
        number: u64,
    ) -> Vec<(u64, String, String)> {
        self.read_item(owner, name, number, |_, i| {
            Some(
                i.comments
                    .iter()
                    .map(|c| (c.id, c.user.clone(), c.body.clone()))
                    .collect(),
            )
        })
        .unwrap_or_default()
    }

    /// The head branch (`head.ref`, without an `owner:` prefix) of pull request `number`, or
    /// `None` when there is no such pull request.
    pub fn pull_head(&self, owner: &str, name: &str, number: u64) -> Option<String> {
        self.read_item(owner, name, number, |_, i| {
            i.pull.as_ref().map(|p| p.head_ref.clone())
        })
    }

    // ----- request accounting -----

    /// Every request answered since the start (or [`Self::reset_counts`]), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state().requests.clone()
    }

    /// How many requests matched `method` (case-insensitive, `*` for any) and `route`: a route
    /// pattern such as `/repos/{owner}/{repo}/issues` (placeholder names are free:
    /// `/repos/{o}/{r}/issues/{n}` works too) or an exact path such as `/repos/o/r/issues`.
    pub fn count(&self, method: &str, route: &str) -> usize {
        self.state()
            .requests
            .iter()
            .filter(|r| {
                handler::request_matches(method, route, &r.method, &r.path, r.route.as_deref())
            })
            .count()
    }

    /// How many requests were answered with `status`.
    pub fn count_status(&self, status: u16) -> usize {
        self.state()
            .requests
            .iter()
            .filter(|r| r.status == status)
            .count()
    }

    /// Forgets the recorded requests.
    pub fn reset_counts(&self) {
        self.state().requests.clear();
    }

    // ----- faults -----

    /// Answers the next `n` requests matching `route` (`(method, pattern)` as in
    /// [`Self::count`], or `None` for any request) with `fault` instead of handling them.
    /// Faults come before authentication and cost no rate limit; they are recorded with the
    /// status they answered. Rules apply in the order they were added.
    pub fn fail_next(&self, route: Option<(&str, &str)>, n: usize, fault: Fault) {
        if n == 0 {
            return;
        }
        self.state().faults.push(FaultRule {
            route: route.map(|(m, p)| (m.to_owned(), p.to_owned())),
            mode: FaultMode::Next(n),
            fault,
        });
    }

    /// Answers each request matching `route` with `fault` with probability `probability`
    /// (0.0–1.0), drawn from a deterministic RNG seeded with `seed`, until
    /// [`Self::clear_faults`].
    pub fn fail_fraction(
        &self,
        route: Option<(&str, &str)>,
        probability: f64,
        fault: Fault,
        seed: u64,
    ) {
        self.state().faults.push(FaultRule {
            route: route.map(|(m, p)| (m.to_owned(), p.to_owned())),
            mode: FaultMode::Fraction {
                probability: if probability.is_nan() {
                    0.0
                } else {
                    probability
                },
                rng: SplitMix64::new(seed),
            },
            fault,
        });
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    // ----- rate limit and clock -----

    /// Sets `X-RateLimit-Remaining` (of 5000). At 0, requests answer 403 `API rate limit
    /// exceeded` until the window resets (an hour after the fake started, or
    /// [`Self::set_rate_limit_reset_in`]).
    pub fn set_rate_limit_remaining(&self, n: u64) {
        let mut s = self.state();
        s.refresh_rate();
        s.rate.remaining = n;
    }

    /// Makes the current rate-limit window end `after` from now (`X-RateLimit-Reset`); then
    /// `remaining` goes back to 5000.
    pub fn set_rate_limit_reset_in(&self, after: Duration) {
        let mut s = self.state();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let secs = i64::try_from(after.as_secs()).unwrap_or(i64::MAX / 2);
        s.rate.reset_at = now.saturating_add(secs);
    }

    /// The current `X-RateLimit-Remaining`.
    pub fn rate_limit_remaining(&self) -> u64 {
        let mut s = self.state();
        s.refresh_rate();
        s.rate.remaining
    }

    /// Stops the fake's clock at the current second: every later change gets the same
    /// `updated_at` (until [`Self::advance_clock`] or [`Self::unfreeze_clock`]), the case of
    /// several changes within one second of GitHub's second-granular timestamps.
    pub fn freeze_clock(&self) {
        let mut s = self.state();
        if s.frozen_at.is_none() {
            s.frozen_at = Some(time::OffsetDateTime::now_utc().unix_timestamp());
        }
    }

    /// Lets the clock run with real time again (keeping what [`Self::advance_clock`] added).
    pub fn unfreeze_clock(&self) {
        self.state().frozen_at = None;
    }

    /// How lists sorted by `updated` order items updated in the same second. GitHub does not
    /// say; by default the fake puts the later update first (desc), as if the clock had a
    /// finer grain. With `by_number`, ties are ordered by number instead, so an update within
    /// the second other items were updated in does not move an item ahead of them: an
    /// update can then land on a later page and leave the first page (and its ETag) as it was.
    pub fn order_same_second_by_number(&self, by_number: bool) {
        self.state().same_second_by_number = by_number;
    }

    /// The fake's current time (what the next change's `updated_at` will be), in unix seconds.
    pub fn now_unix(&self) -> i64 {
        self.state().now()
    }

    /// Moves the fake's clock (used for `created_at`, `updated_at`, … of later changes)
    /// forward by `by`.
    pub fn advance_clock(&self, by: Duration) {
        let mut s = self.state();
        let secs = i64::try_from(by.as_secs()).unwrap_or(i64::MAX / 2);
        s.clock_offset_secs = s.clock_offset_secs.saturating_add(secs);
    }

    /// Moves the fake's clock back by `by`: the next change carries an `updated_at` older
    /// than changes already listed. That is what a reader of GitHub's lists sees when a
    /// change shows there a moment after the time it carries, later than a newer change.
    pub fn rewind_clock(&self, by: Duration) {
        let mut s = self.state();
        let secs = i64::try_from(by.as_secs()).unwrap_or(i64::MAX / 2);
        s.clock_offset_secs = s.clock_offset_secs.saturating_sub(secs);
    }
}

#[track_caller]
fn no_repo(owner: &str, name: &str) -> ! {
    panic!("fake GitHub: no repository {owner}/{name} (call add_repo first)")
}

#[track_caller]
fn no_issue(owner: &str, name: &str, number: u64) -> ! {
    panic!("fake GitHub: no issue {owner}/{name}#{number}")
}

#[track_caller]
pub(crate) fn no_pull(owner: &str, name: &str, number: u64) -> ! {
    panic!("fake GitHub: no pull request {owner}/{name}#{number}")
}
