//! Request handling of the fake GitHub: routing, authentication, rate limits, fault
//! injection, conditional requests, pagination and the endpoints themselves. Everything here
//! is synchronous and runs under the state lock; it never panics on any input.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::model::{
    DEFAULT_LABEL_COLOR, FaultMode, Item, Label, Pull, RATE_LIMIT, REACTION_CONTENTS, Reaction,
    Repo, Review, State, repo_key,
};
use super::util::{etag_of, parse_query, parse_time, percent_decode, percent_encode};
use super::{Fault, RequestRecord};

/// Largest request body read; longer ones answer 413.
pub(crate) const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;

const DOCS: &str = "https://docs.github.com/rest";
const RATE_DOCS: &str = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";

/// A request as the HTTP layer hands it over.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub method: String,
    /// Raw (still percent-encoded) path.
    pub path: String,
    /// Raw query string, without `?`.
    pub query: String,
    pub user_agent: Option<String>,
    pub authorization: Option<String>,
    pub if_none_match: Option<String>,
    /// The body, or the status to answer when it could not be read (400, 413).
    pub body: std::result::Result<Vec<u8>, u16>,
}

/// What to answer.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// Wait this long before answering (timeout fault).
    pub delay: Option<Duration>,
}

// ----- routes -----

#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    User,
    Repo,
    Issues,
    Issue(u64),
    IssueComments(u64),
    IssueLabels(u64),
    IssueLabel(u64, String),
    Labels,
    Label(String),
    Pulls,
    Pull(u64),
    PullReviews(u64),
    PullComments(u64),
    PullMerge(u64),
    IssueCommentReactions(u64),
    PullCommentReactions(u64),
    CollaboratorPermission(String),
}

impl Route {
    fn pattern(&self) -> &'static str {
        match self {
            Route::User => "/user",
            Route::Repo => "/repos/{owner}/{repo}",
            Route::Issues => "/repos/{owner}/{repo}/issues",
            Route::Issue(_) => "/repos/{owner}/{repo}/issues/{issue_number}",
            Route::IssueComments(_) => "/repos/{owner}/{repo}/issues/{issue_number}/comments",
            Route::IssueLabels(_) => "/repos/{owner}/{repo}/issues/{issue_number}/labels",
            Route::IssueLabel(..) => "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}",
            Route::Labels => "/repos/{owner}/{repo}/labels",
            Route::Label(_) => "/repos/{owner}/{repo}/labels/{name}",
            Route::Pulls => "/repos/{owner}/{repo}/pulls",
            Route::Pull(_) => "/repos/{owner}/{repo}/pulls/{pull_number}",
            Route::PullReviews(_) => "/repos/{owner}/{repo}/pulls/{pull_number}/reviews",
            Route::PullComments(_) => "/repos/{owner}/{repo}/pulls/{pull_number}/comments",
            Route::PullMerge(_) => "/repos/{owner}/{repo}/pulls/{pull_number}/merge",
            Route::IssueCommentReactions(_) => {
                "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions"
            }
            Route::PullCommentReactions(_) => {
                "/repos/{owner}/{repo}/pulls/comments/{comment_id}/reactions"
            }
            Route::CollaboratorPermission(_) => {
                "/repos/{owner}/{repo}/collaborators/{username}/permission"
            }
        }
    }
}

#[derive(Debug)]
struct Matched {
    route: Route,
    owner: String,
    repo: String,
}

fn number(segment: &str) -> Option<u64> {
    if segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    segment.parse().ok()
}

fn parse_route(path: &str) -> Option<Matched> {
    let rest = path.strip_prefix('/')?;
    let segments = rest
        .split('/')
        .map(percent_decode)
        .collect::<Option<Vec<String>>>()?;
    if segments.iter().any(String::is_empty) {
        return None;
    }
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (route, owner, repo) = match s.as_slice() {
        ["user"] => (Route::User, "", ""),
        ["repos", o, r] => (Route::Repo, *o, *r),
        ["repos", o, r, "issues"] => (Route::Issues, *o, *r),
        ["repos", o, r, "issues", "comments", id, "reactions"] => {
            (Route::IssueCommentReactions(number(id)?), *o, *r)
        }
        ["repos", o, r, "pulls", "comments", id, "reactions"] => {
            (Route::PullCommentReactions(number(id)?), *o, *r)
        }
        ["repos", o, r, "collaborators", login, "permission"] => {
            (Route::CollaboratorPermission((*login).to_owned()), *o, *r)
        }
        ["repos", o, r, "issues", n] => (Route::Issue(number(n)?), *o, *r),
        ["repos", o, r, "issues", n, "comments"] => (Route::IssueComments(number(n)?), *o, *r),
        ["repos", o, r, "issues", n, "labels"] => (Route::IssueLabels(number(n)?), *o, *r),
        ["repos", o, r, "issues", n, "labels", name] => {
            (Route::IssueLabel(number(n)?, (*name).to_owned()), *o, *r)
        }
        ["repos", o, r, "labels"] => (Route::Labels, *o, *r),
        ["repos", o, r, "labels", name] => (Route::Label((*name).to_owned()), *o, *r),
        ["repos", o, r, "pulls"] => (Route::Pulls, *o, *r),
        ["repos", o, r, "pulls", n] => (Route::Pull(number(n)?), *o, *r),
        ["repos", o, r, "pulls", n, "reviews"] => (Route::PullReviews(number(n)?), *o, *r),
        ["repos", o, r, "pulls", n, "comments"] => (Route::PullComments(number(n)?), *o, *r),
        ["repos", o, r, "pulls", n, "merge"] => (Route::PullMerge(number(n)?), *o, *r),
        _ => return None,
    };
    Some(Matched {
        route,
        owner: owner.to_owned(),
        repo: repo.to_owned(),
    })
}

fn is_placeholder(segment: &str) -> bool {
    segment.starts_with('{') && segment.ends_with('}')
}

/// Whether a route pattern given by a test (`/repos/{owner}/{repo}/issues`; placeholder
/// names need not match) names the route pattern `route`.
pub(crate) fn pattern_matches(wanted: &str, route: &str) -> bool {
    let a: Vec<&str> = wanted.split('/').collect();
    let b: Vec<&str> = route.split('/').collect();
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(x, y)| x == y || (is_placeholder(x) && is_placeholder(y)))
}

/// Whether a request matches a test's `(method, pattern)`: the method (or `*`) and either the
/// route pattern or the exact path.
pub(crate) fn request_matches(
    wanted_method: &str,
    wanted_pattern: &str,
    method: &str,
    path: &str,
    route: Option<&str>,
) -> bool {
    (wanted_method == "*" || wanted_method.eq_ignore_ascii_case(method))
        && (route.is_some_and(|r| pattern_matches(wanted_pattern, r)) || wanted_pattern == path)
}

// ----- replies and errors -----

#[derive(Debug)]
struct Reply {
    status: u16,
    body: Option<Value>,
    link: Option<String>,
    location: Option<String>,
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self {
            status: 200,
            body: Some(body),
            link: None,
            location: None,
        }
    }

    fn created(body: Value, location: String) -> Self {
        Self {
            status: 201,
            body: Some(body),
            link: None,
            location: Some(location),
        }
    }
}

#[derive(Debug)]
struct ApiError {
    status: u16,
    message: String,
    errors: Option<Value>,
    documentation_url: String,
}

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            errors: None,
            documentation_url: DOCS.to_owned(),
        }
    }

    fn not_found() -> Self {
        Self::new(404, "Not Found")
    }

    fn bad_json() -> Self {
        Self::new(400, "Problems parsing JSON")
    }

    fn invalid(detail: impl std::fmt::Display) -> Self {
        Self::new(422, format!("Invalid request.\n\n{detail}"))
    }

    /// 422 `Validation Failed` with one error object.
    fn validation(error: Value) -> Self {
        Self {
            errors: Some(json!([error])),
            ..Self::new(422, "Validation Failed")
        }
    }

    fn field(resource: &str, field: &str, code: &str) -> Self {
        Self::validation(json!({"resource": resource, "field": field, "code": code}))
    }

    fn custom(resource: &str, message: &str) -> Self {
        Self::validation(json!({"resource": resource, "code": "custom", "message": message}))
    }

    /// The refusal to reopen (or rebase) `resource`, a merged pull request.
    fn merged(resource: &str) -> Self {
        Self::custom(
            resource,
            "state cannot be changed. The pull request has been merged.",
        )
    }

    fn body(&self) -> Value {
        let mut value = json!({
            "message": self.message,
            "documentation_url": self.documentation_url,
            "status": self.status.to_string()
        });
        if let (Some(errors), Value::Object(map)) = (&self.errors, &mut value) {
            map.insert("errors".to_owned(), errors.clone());
        }
        value
    }
}

type Result<T> = std::result::Result<T, ApiError>;

fn json_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"{\"message\":\"Server Error\"}".to_vec())
}

// ----- request bodies -----

fn parse_json(bytes: &[u8]) -> Result<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(bytes).map_err(|_| ApiError::bad_json())
}

fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>> {
    match parse_json(bytes)? {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::invalid(format!(
            "For 'links/0/schema', {other} is not an object."
        ))),
    }
}

/// A member of a request body that must be a string (or null).
enum Field {
    Absent,
    Null,
    Str(String),
}

fn string_field(obj: &Map<String, Value>, name: &str) -> Result<Field> {
    match obj.get(name) {
        None => Ok(Field::Absent),
        Some(Value::Null) => Ok(Field::Null),
        Some(Value::String(s)) => Ok(Field::Str(s.clone())),
        Some(other) => Err(ApiError::invalid(format!(
            "For 'properties/{name}', {other} is not a string."
        ))),
    }
}

fn bool_field(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ApiError::invalid(format!(
            "For 'properties/{name}', {other} is not a boolean."
        ))),
    }
}

/// Label names from `["a", ...]`, `{"labels": ["a", ...]}` or `{"labels": [{"name": "a"}]}`.
fn label_names(value: &Value) -> Result<Vec<String>> {
    let list = match value {
        Value::Array(list) => list,
        Value::Object(map) => match map.get("labels") {
            Some(Value::Array(list)) => list,
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "For 'properties/labels', {other} is not an array."
                )));
            }
            None => return Err(ApiError::field("Label", "labels", "missing_field")),
        },
        other => {
            return Err(ApiError::invalid(format!(
                "For 'links/0/schema', {other} is not an array or an object."
            )));
        }
    };
    let mut names = Vec::with_capacity(list.len());
    for entry in list {
        let name = match entry {
            Value::String(s) => s.trim().to_owned(),
            Value::Object(map) => match map.get("name") {
                Some(Value::String(s)) => s.trim().to_owned(),
                _ => return Err(ApiError::field("Label", "name", "missing_field")),
            },
            other => {
                return Err(ApiError::invalid(format!(
                    "For 'items', {other} is not a string or an object."
                )));
            }
        };
        if name.is_empty() {
            return Err(ApiError::field("Label", "name", "missing_field"));
        }
        if !names.iter().any(|n: &String| n.eq_ignore_ascii_case(&name)) {
            names.push(name);
        }
    }
    Ok(names)
}

// ----- query parameters -----

struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn one_of(&self, name: &str, allowed: &[&str], default: &'static str) -> Result<String> {
        match self.get(name) {
            None | Some("") => Ok(default.to_owned()),
            Some(v) if allowed.contains(&v) => Ok(v.to_owned()),
            Some(v) => Err(ApiError::field_value(name, v)),
        }
    }

    fn since(&self) -> Result<Option<i64>> {
        match self.get("since") {
            None | Some("") => Ok(None),
            Some(v) => parse_time(v)
                .map(Some)
                .ok_or_else(|| ApiError::field_value("since", v)),
        }
    }
}

impl ApiError {
    fn field_value(name: &str, value: &str) -> Self {
        Self::validation(json!({
            "resource": "Search",
            "field": name,
            "code": "invalid",
            "message": format!("'{value}' is not a valid value for {name}")
        }))
    }
}

/// One page of `total` items: the index range and the `Link` header.
struct Window {
    start: usize,
    end: usize,
    link: Option<String>,
}

fn window(base_url: &str, path: &str, query: &Query, total: usize) -> Window {
    let per_page = query
        .get("per_page")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .map_or(30, |n| n.min(100));
    let page = query
        .get("page")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1);
    let last = total.div_ceil(per_page).max(1);
    let start = page.saturating_sub(1).saturating_mul(per_page).min(total);
    let end = start.saturating_add(per_page).min(total);
    let url = |p: usize| {
        let mut pairs: Vec<String> = Vec::new();
        let mut has_page = false;
        for (k, v) in &query.pairs {
            let v = if k == "page" {
                has_page = true;
                p.to_string()
            } else {
                v.clone()
            };
            pairs.push(format!("{}={}", percent_encode(k), percent_encode(&v)));
        }
        if !has_page {
            pairs.push(format!("page={p}"));
        }
        format!("<{base_url}{path}?{}>", pairs.join("&"))
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", url((page - 1).min(last))));
    }
    if page < last {
        links.push(format!("{}; rel=\"next\"", url(page + 1)));
        links.push(format!("{}; rel=\"last\"", url(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"first\"", url(1)));
    }
    Window {
        start,
        end,
        link: (!links.is_empty()).then(|| links.join(", ")),
    }
}

/// The page of `items` the request asks for, each item as `json` makes it, with the
/// page's `Link` header.
fn page_of<T>(state: &State, ctx: &Ctx<'_>, items: &[T], json: impl FnMut(&T) -> Value) -> Reply {
    let w = window(&state.base_url, ctx.path, ctx.query, items.len());
    let page = items
        .get(w.start..w.end)
        .unwrap_or_default()
        .iter()
        .map(json)
        .collect();
    Reply {
        link: w.link,
        ..Reply::ok(Value::Array(page))
    }
}

// ----- the pipeline -----

fn rate_headers(remaining: u64, reset: i64) -> Vec<(String, String)> {
    vec![
        ("X-RateLimit-Limit".to_owned(), RATE_LIMIT.to_string()),
        ("X-RateLimit-Remaining".to_owned(), remaining.to_string()),
        ("X-RateLimit-Reset".to_owned(), reset.to_string()),
        (
            "X-RateLimit-Used".to_owned(),
            RATE_LIMIT.saturating_sub(remaining).to_string(),
        ),
        ("X-RateLimit-Resource".to_owned(), "core".to_owned()),
    ]
}

fn error_outcome(error: &ApiError, mut headers: Vec<(String, String)>) -> Outcome {
    headers.push((
        "Content-Type".to_owned(),
        "application/json; charset=utf-8".to_owned(),
    ));
    Outcome {
        status: error.status,
        headers,
        body: Some(json_bytes(&error.body())),
        delay: None,
    }
}

fn fault_message(status: u16) -> &'static str {
    match status {
        500 => "Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Injected fault",
    }
}

/// The fault to apply to this request, if a rule picks it.
fn take_fault(state: &mut State, method: &str, path: &str, route: Option<&str>) -> Option<Fault> {
    let mut picked = None;
    for rule in &mut state.faults {
        if let Some((m, p)) = &rule.route
            && !request_matches(m, p, method, path, route)
        {
            continue;
        }
        match &mut rule.mode {
            FaultMode::Next(n) if *n > 0 => {
                *n -= 1;
                picked = Some(rule.fault.clone());
                break;
            }
            FaultMode::Next(_) => {}
            FaultMode::Fraction { probability, rng } => {
                if rng.next_f64() < *probability {
                    picked = Some(rule.fault.clone());
                    break;
                }
            }
        }
    }
    state
        .faults
        .retain(|r| !matches!(r.mode, FaultMode::Next(0)));
    picked
}

fn fault_outcome(state: &State, fault: &Fault) -> Outcome {
    let base = rate_headers(state.rate.remaining, state.rate.reset_at);
    match fault {
        Fault::Status(status) | Fault::AnswerLost(status) => {
            let status = if (400..=599).contains(status) {
                *status
            } else {
                500
            };
            error_outcome(&ApiError::new(status, fault_message(status)), base)
        }
        Fault::Timeout(delay) => {
            let mut out = error_outcome(
                &ApiError::new(
                    504,
                    "We couldn't respond to your request in time. Sorry about that. Please try \
                     resubmitting your request and contact us if the problem persists.",
                ),
                base,
            );
            out.delay = Some(*delay);
            out
        }
        Fault::RateLimited { retry_after_secs } => {
            let secs = i64::try_from(*retry_after_secs).unwrap_or(i64::MAX);
            let reset = time_now_real().saturating_add(secs);
            let mut headers = rate_headers(0, reset);
            headers.push(("Retry-After".to_owned(), retry_after_secs.to_string()));
            let error = ApiError {
                documentation_url: RATE_DOCS.to_owned(),
                ..ApiError::new(
                    403,
                    "API rate limit exceeded for this user. If you reach out to GitHub Support \
                     for help, please include the request ID.",
                )
            };
            error_outcome(&error, headers)
        }
        Fault::SecondaryRateLimit { retry_after_secs } => {
            let mut headers = base;
            headers.push(("Retry-After".to_owned(), retry_after_secs.to_string()));
            let error = ApiError {
                documentation_url: "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits".to_owned(),
                ..ApiError::new(
                    429,
                    "You have exceeded a secondary rate limit. Please wait a few minutes before \
                     you try again.",
                )
            };
            error_outcome(&error, headers)
        }
    }
}

fn time_now_real() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// The token of an `Authorization` header (`Bearer x` or `token x`).
fn token_of(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    let strip = |s: &str| s.trim().trim_start_matches("W/").to_owned();
    let etag = strip(etag);
    if_none_match
        .split(',')
        .any(|candidate| candidate.trim() == "*" || strip(candidate) == etag)
}

/// Handles one request and records it.
pub(crate) fn process(state: &mut State, req: &Incoming) -> Outcome {
    state.refresh_rate();
    let method = req.method.to_ascii_uppercase();
    let matched = parse_route(&req.path);
    let route = matched.as_ref().map(|m| m.route.pattern());
    let outcome = respond(state, req, &method, matched);
    state.requests.push(RequestRecord {
        method,
        path: req.path.clone(),
        query: req.query.clone(),
        route: route.map(str::to_owned),
        status: outcome.status,
        if_none_match: req.if_none_match.is_some(),
        authorization: req.authorization.is_some(),
    });
    outcome
}

fn respond(state: &mut State, req: &Incoming, method: &str, matched: Option<Matched>) -> Outcome {
    let route = matched.as_ref().map(|m| m.route.pattern());
    match take_fault(state, method, &req.path, route) {
        None => handle(state, req, method, matched),
        Some(Fault::AnswerLost(status)) => {
            // The request takes effect; its answer does not arrive.
            handle(state, req, method, matched);
            fault_outcome(state, &Fault::Status(status))
        }
        Some(fault) => fault_outcome(state, &fault),
    }
}

/// Authenticates, rate-limits and handles a request no fault intercepted.
fn handle(state: &mut State, req: &Incoming, method: &str, matched: Option<Matched>) -> Outcome {
    let headers = rate_headers(state.rate.remaining, state.rate.reset_at);
    if req
        .user_agent
        .as_deref()
        .is_none_or(|ua| ua.trim().is_empty())
    {
        return error_outcome(
            &ApiError::new(
                403,
                "Request forbidden by administrative rules. Please make sure your request has a \
                 User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). \
                 Check https://developer.github.com for other possible causes.",
            ),
            headers,
        );
    }
    let token = match req.authorization.as_deref() {
        None => {
            return error_outcome(&ApiError::new(401, "Requires authentication"), headers);
        }
        Some(header) => match token_of(header).and_then(|t| state.tokens.get(t)) {
            Some(token) => token.clone(),
            None => return error_outcome(&ApiError::new(401, "Bad credentials"), headers),
        },
    };
    if state.rate.remaining == 0 {
        let user_id = state
            .users
            .get(&token.login.to_ascii_lowercase())
            .map_or(0, |u| u.id);
        let error = ApiError {
            documentation_url: RATE_DOCS.to_owned(),
            ..ApiError::new(
                403,
                format!(
                    "API rate limit exceeded for user ID {user_id}. If you reach out to GitHub \
                     Support for help, please include the request ID."
                ),
            )
        };
        return error_outcome(&error, headers);
    }
    let body = match &req.body {
        Ok(body) => body.as_slice(),
        Err(status) => {
            let message = if *status == 413 {
                "Payload Too Large"
            } else {
                "Problems reading the request body"
            };
            return error_outcome(&ApiError::new(*status, message), headers);
        }
    };
    let query = Query {
        pairs: parse_query(&req.query),
    };
    let result = match matched {
        None => Err(ApiError::not_found()),
        Some(m) => dispatch(state, method, &req.path, &query, body, &token, m),
    };

    let reply = match result {
        Ok(reply) => reply,
        Err(error) => {
            state.rate.remaining = state.rate.remaining.saturating_sub(1);
            return error_outcome(
                &error,
                rate_headers(state.rate.remaining, state.rate.reset_at),
            );
        }
    };
    let bytes = reply.body.as_ref().map(json_bytes);
    let etag = match (&bytes, method, reply.status) {
        (Some(b), "GET", 200) => Some(etag_of(b)),
        _ => None,
    };
    let not_modified = matches!(
        (&etag, &req.if_none_match),
        (Some(etag), Some(inm)) if etag_matches(inm, etag)
    );
    if !not_modified {
        state.rate.remaining = state.rate.remaining.saturating_sub(1);
    }
    let mut headers = rate_headers(state.rate.remaining, state.rate.reset_at);
    headers.push((
        "X-GitHub-Media-Type".to_owned(),
        "github.v3; format=json".to_owned(),
    ));
    headers.push((
        "Vary".to_owned(),
        "Accept, Authorization, Cookie, X-GitHub-OTP".to_owned(),
    ));
    if let Some(etag) = &etag {
        headers.push(("ETag".to_owned(), etag.clone()));
        headers.push((
            "Cache-Control".to_owned(),
            "private, max-age=60, s-maxage=60".to_owned(),
        ));
    }
    if not_modified {
        return Outcome {
            status: 304,
            headers,
            body: None,
            delay: None,
        };
    }
    if let Some(link) = reply.link {
        headers.push(("Link".to_owned(), link));
    }
    if let Some(location) = reply.location {
        headers.push(("Location".to_owned(), location));
    }
    if bytes.is_some() {
        headers.push((
            "Content-Type".to_owned(),
            "application/json; charset=utf-8".to_owned(),
        ));
    }
    Outcome {
        status: reply.status,
        headers,
        body: bytes,
        delay: None,
    }
}

fn can_see(token: &super::model::Token, key: &str) -> bool {
    token
        .repos
        .as_ref()
        .is_none_or(|repos| repos.iter().any(|r| r == key))
}

fn dispatch(
    state: &mut State,
    method: &str,
    path: &str,
    query: &Query,
    body: &[u8],
    token: &super::model::Token,
    m: Matched,
) -> Result<Reply> {
    let actor = token.login.as_str();
    if m.route == Route::User {
        return match method {
            "GET" => Ok(Reply::ok(state.private_user_json(actor))),
            _ => Err(ApiError::not_found()),
        };
    }
    let key = repo_key(&m.owner, &m.repo);
    if !state.repos.contains_key(&key) || !can_see(token, &key) {
        return Err(ApiError::not_found());
    }
    let ctx = Ctx {
        key: &key,
        path,
        query,
        body,
        actor,
    };
    match (method, m.route) {
        ("GET", Route::Repo) => Ok(Reply::ok(state.repo_json(repo_of(state, &key)?))),
        ("GET", Route::Issues) => list_issues(state, &ctx),
        ("POST", Route::Issues) => create_issue(state, &ctx),
        ("GET", Route::Issue(n)) => get_issue(state, &key, n),
        ("PATCH", Route::Issue(n)) => update_issue(state, &ctx, n),
        ("GET", Route::IssueComments(n)) => list_comments(state, &ctx, n),
        ("POST", Route::IssueComments(n)) => create_comment(state, &ctx, n),
        ("GET", Route::IssueLabels(n)) => list_issue_labels(state, &ctx, n),
        ("POST", Route::IssueLabels(n)) => add_issue_labels(state, &ctx, n),
        ("DELETE", Route::IssueLabel(n, name)) => remove_issue_label(state, &key, n, &name),
        ("GET", Route::Labels) => list_labels(state, &ctx),
        ("POST", Route::Labels) => create_label(state, &ctx),
        ("GET", Route::Label(name)) => get_label(state, &key, &name),
        ("GET", Route::Pulls) => list_pulls(state, &ctx),
        ("POST", Route::Pulls) => create_pull(state, &ctx),
        ("GET", Route::Pull(n)) => get_pull(state, &key, n),
        ("PATCH", Route::Pull(n)) => update_pull(state, &ctx, n),
        ("GET", Route::PullReviews(n)) => list_reviews(state, &ctx, n),
        ("POST", Route::PullReviews(n)) => create_review(state, &ctx, n),
        ("GET", Route::PullComments(n)) => list_review_comments(state, &ctx, n),
        ("POST", Route::IssueCommentReactions(id)) => add_reaction(state, &ctx, id, false),
        ("POST", Route::PullCommentReactions(id)) => add_reaction(state, &ctx, id, true),
        ("GET", Route::CollaboratorPermission(login)) => get_permission(state, &key, &login),
        ("GET", Route::PullMerge(n)) => get_merged(state, &key, n),
        ("PUT", Route::PullMerge(n)) => merge_pull(state, &ctx, n),
        _ => Err(ApiError::not_found()),
    }
}

/// What every repository endpoint needs.
struct Ctx<'a> {
    key: &'a str,
    path: &'a str,
    query: &'a Query,
    body: &'a [u8],
    actor: &'a str,
}

fn repo_of<'s>(state: &'s State, key: &str) -> Result<&'s Repo> {
    state.repos.get(key).ok_or_else(ApiError::not_found)
}

fn item_of<'s>(state: &'s State, key: &str, n: u64) -> Result<(&'s Repo, &'s Item)> {
    let repo = repo_of(state, key)?;
    let item = repo.items.get(&n).ok_or_else(ApiError::not_found)?;
    Ok((repo, item))
}

fn pull_of<'s>(state: &'s State, key: &str, n: u64) -> Result<(&'s Repo, &'s Item)> {
    let (repo, item) = item_of(state, key, n)?;
    if item.pull.is_none() {
        return Err(ApiError::not_found());
    }
    Ok((repo, item))
}

/// Applies a PATCH's `title` and `body` to an issue or pull request; whether anything changed.
fn set_title_and_body(item: &mut Item, title: Option<String>, body: Field) -> bool {
    let mut changed = false;
    if let Some(title) = title
        && item.title != title
    {
        item.title = title;
        changed = true;
    }
    let new_body = match body {
        Field::Absent => None,
        Field::Null => Some(None),
        Field::Str(s) => Some(Some(s)),
    };
    if let Some(new_body) = new_body
        && item.body != new_body
    {
        item.body = new_body;
        changed = true;
    }
    changed
}

/// Sorts a list. Items updated in the same second (GitHub's timestamps have no finer
/// grain, and it does not say how it orders such ties) come in update order, or by number
/// when `same_second_by_number`.
fn sort_items(items: &mut [&Item], sort: &str, descending: bool, same_second_by_number: bool) {
    match sort {
        "updated" if same_second_by_number => items.sort_by_key(|i| (i.updated_at, i.number)),
        "updated" => items.sort_by_key(|i| (i.updated_at, i.updated_seq)),
        "comments" | "popularity" => items.sort_by_key(|i| (i.comments.len(), i.number)),
        _ => items.sort_by_key(|i| (i.created_at, i.number)),
    }
    if descending {
        items.reverse();
    }
}

/// The items of `repo` a list request asks for: in the state `state_filter` names (`open`,
/// `closed`, `all`), kept by `keep`, ordered by `sort` in `direction` (`asc`, `desc`).
fn listed<'r>(
    state: &State,
    repo: &'r Repo,
    state_filter: &str,
    sort: &str,
    direction: &str,
    keep: impl Fn(&Item) -> bool,
) -> Vec<&'r Item> {
    let mut items: Vec<&Item> = repo
        .items
        .values()
        .filter(|i| state_matches(state_filter, i) && keep(i))
        .collect();
    sort_items(
        &mut items,
        sort,
        direction == "desc",
        state.same_second_by_number,
    );
    items
}

fn state_matches(filter: &str, item: &Item) -> bool {
    match filter {
        "open" => item.open,
        "closed" => !item.open,
        _ => true,
    }
}

// ----- issues -----

fn list_issues(state: &State, ctx: &Ctx<'_>) -> Result<Reply> {
    let q = ctx.query;
    let state_filter = q.one_of("state", &["open", "closed", "all"], "open")?;
    let sort = q.one_of("sort", &["created", "updated", "comments"], "created")?;
    let direction = q.one_of("direction", &["asc", "desc"], "desc")?;
    let since = q.since()?;
    let labels: Vec<&str> = q
        .get("labels")
        .map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let creator = q.get("creator").filter(|c| !c.is_empty());
    let repo = repo_of(state, ctx.key)?;
    let items = listed(state, repo, &state_filter, &sort, &direction, |i| {
        since.is_none_or(|s| i.updated_at >= s)
            && labels
                .iter()
                .all(|want| i.labels.iter().any(|l| l.eq_ignore_ascii_case(want)))
            && creator.is_none_or(|c| i.user.eq_ignore_ascii_case(c))
    });
    Ok(page_of(state, ctx, &items, |i| {
        state.issue_json(repo, i, false)
    }))
}

fn get_issue(state: &State, key: &str, n: u64) -> Result<Reply> {
    let (repo, item) = item_of(state, key, n)?;
    Ok(Reply::ok(state.issue_json(repo, item, true)))
}

fn title_of(obj: &Map<String, Value>, resource: &str, required: bool) -> Result<Option<String>> {
    let title = match obj.get("title") {
        None if required => return Err(ApiError::field(resource, "title", "missing_field")),
        None => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "For 'properties/title', {other} is not a string or integer."
            )));
        }
    };
    if title.trim().is_empty() {
        return Err(ApiError::field(resource, "title", "missing_field"));
    }
    Ok(Some(title))
}

fn create_issue(state: &mut State, ctx: &Ctx<'_>) -> Result<Reply> {
    let obj = parse_object(ctx.body)?;
    let title = title_of(&obj, "Issue", true)?.unwrap_or_default();
    let body = match string_field(&obj, "body")? {
        Field::Str(s) => Some(s),
        Field::Absent | Field::Null => None,
    };
    let labels = match obj.get("labels") {
        None | Some(Value::Null) => Vec::new(),
        Some(v @ Value::Array(_)) => label_names(v)?,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "For 'properties/labels', {other} is not an array."
            )));
        }
    };
    let n = state
        .create_item(ctx.key, &title, body.as_deref(), ctx.actor, None)
        .ok_or_else(ApiError::not_found)?;
    state.add_item_labels(ctx.key, n, &labels);
    let (repo, item) = item_of(state, ctx.key, n)?;
    let json = state.issue_json(repo, item, true);
    let location = format!("{}/repos/{}/issues/{n}", state.base_url, repo.full_name());
    Ok(Reply::created(json, location))
}

fn state_reason_of(obj: &Map<String, Value>) -> Result<Option<Option<String>>> {
    match string_field(obj, "state_reason")? {
        Field::Absent => Ok(None),
        Field::Null => Ok(Some(None)),
        Field::Str(s)
            if ["completed", "not_planned", "reopened", "duplicate"].contains(&s.as_str()) =>
        {
            Ok(Some(Some(s)))
        }
        Field::Str(_) => Err(ApiError::field("Issue", "state_reason", "invalid")),
    }
}

fn open_of(obj: &Map<String, Value>, resource: &str) -> Result<Option<bool>> {
    match string_field(obj, "state")? {
        Field::Absent => Ok(None),
        Field::Str(s) if s == "open" => Ok(Some(true)),
        Field::Str(s) if s == "closed" => Ok(Some(false)),
        Field::Null | Field::Str(_) => Err(ApiError::field(resource, "state", "invalid")),
    }
}

fn update_issue(state: &mut State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    item_of(state, ctx.key, n)?;
    let obj = parse_object(ctx.body)?;
    let title = title_of(&obj, "Issue", false)?;
    let body = string_field(&obj, "body")?;
    let open = open_of(&obj, "Issue")?;
    let reason = state_reason_of(&obj)?;
    let labels = match obj.get("labels") {
        None => None,
        Some(Value::Null) => Some(Vec::new()),
        Some(v @ Value::Array(_)) => Some(label_names(v)?),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "For 'properties/labels', {other} is not an array."
            )));
        }
    };
    if open == Some(true)
        && item_of(state, ctx.key, n)?
            .1
            .pull
            .as_ref()
            .is_some_and(|p| p.merged_at.is_some())
    {
        return Err(ApiError::merged("Issue"));
    }
    let mut changed = false;
    if let Some(item) = state.item_mut(ctx.key, n) {
        changed |= set_title_and_body(item, title, body);
    }
    if let Some(labels) = labels {
        let mut canonical = Vec::with_capacity(labels.len());
        for name in &labels {
            if let Some(name) = state.ensure_label(ctx.key, name, DEFAULT_LABEL_COLOR) {
                canonical.push(name);
            }
        }
        if let Some(item) = state.item_mut(ctx.key, n)
            && item.labels != canonical
        {
            item.labels = canonical;
            changed = true;
        }
    }
    match open {
        Some(open) => {
            let reason = if open { None } else { reason.flatten() };
            state.set_item_open(ctx.key, n, open, reason, ctx.actor);
        }
        None => {
            if let Some(reason) = reason
                && let Some(item) = state.item_mut(ctx.key, n)
                && !item.open
                && item.state_reason != reason
            {
                item.state_reason = reason;
                changed = true;
            }
        }
    }
    if changed {
        state.touch(ctx.key, n);
    }
    get_issue(state, ctx.key, n)
}

// ----- comments -----

fn list_comments(state: &State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let since = ctx.query.since()?;
    let (repo, item) = item_of(state, ctx.key, n)?;
    let comments: Vec<_> = item
        .comments
        .iter()
        .filter(|c| since.is_none_or(|s| c.updated_at >= s))
        .collect();
    Ok(page_of(state, ctx, &comments, |c| {
        state.comment_json(repo, item, c)
    }))
}

fn create_comment(state: &mut State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    item_of(state, ctx.key, n)?;
    let obj = parse_object(ctx.body)?;
    let body = match string_field(&obj, "body")? {
        Field::Str(s) if !s.trim().is_empty() => s,
        Field::Str(_) | Field::Null | Field::Absent => {
            return Err(ApiError::field("IssueComment", "body", "missing_field"));
        }
    };
    if body.chars().count() > 65536 {
        return Err(ApiError::custom(
            "IssueComment",
            "Body is too long (maximum is 65536 characters)",
        ));
    }
    state.ensure_user(ctx.actor);
    let id = state.new_id();
    let now = state.now();
    if let Some(item) = state.item_mut(ctx.key, n) {
        item.comments.push(super::model::Comment {
            id,
            body,
            user: ctx.actor.to_owned(),
            created_at: now,
            updated_at: now,
        });
    }
    state.touch(ctx.key, n);
    let (repo, item) = item_of(state, ctx.key, n)?;
    let comment = item
        .comments
        .last()
        .ok_or_else(|| ApiError::new(500, "Server Error"))?;
    let location = format!(
        "{}/repos/{}/issues/comments/{id}",
        state.base_url,
        repo.full_name()
    );
    Ok(Reply::created(
        state.comment_json(repo, item, comment),
        location,
    ))
}

// ----- labels -----

fn list_issue_labels(state: &State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let (repo, item) = item_of(state, ctx.key, n)?;
    let all = state.item_labels_json(repo, item);
    Ok(page_of(state, ctx, &all, Value::clone))
}

fn add_issue_labels(state: &mut State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    item_of(state, ctx.key, n)?;
    let names = label_names(&parse_json(ctx.body)?)?;
    state.add_item_labels(ctx.key, n, &names);
    let (repo, item) = item_of(state, ctx.key, n)?;
    Ok(Reply::ok(Value::Array(state.item_labels_json(repo, item))))
}

fn remove_issue_label(state: &mut State, key: &str, n: u64, name: &str) -> Result<Reply> {
    item_of(state, key, n)?;
    let mut removed = false;
    if let Some(item) = state.item_mut(key, n) {
        let before = item.labels.len();
        item.labels.retain(|l| !l.eq_ignore_ascii_case(name));
        removed = item.labels.len() != before;
    }
    if !removed {
        return Err(ApiError::new(404, "Label does not exist"));
    }
    state.touch(key, n);
    let (repo, item) = item_of(state, key, n)?;
    Ok(Reply::ok(Value::Array(state.item_labels_json(repo, item))))
}

fn get_label(state: &State, key: &str, name: &str) -> Result<Reply> {
    let repo = repo_of(state, key)?;
    let label = repo.label(name).ok_or_else(ApiError::not_found)?;
    Ok(Reply::ok(state.label_json(repo, label)))
}

fn list_labels(state: &State, ctx: &Ctx<'_>) -> Result<Reply> {
    let repo = repo_of(state, ctx.key)?;
    Ok(page_of(state, ctx, &repo.labels, |l| {
        state.label_json(repo, l)
    }))
}

fn create_label(state: &mut State, ctx: &Ctx<'_>) -> Result<Reply> {
    let obj = parse_object(ctx.body)?;
    let name = match string_field(&obj, "name")? {
        Field::Str(s) if !s.trim().is_empty() => s.trim().to_owned(),
        _ => return Err(ApiError::field("Label", "name", "missing_field")),
    };
    let color = match string_field(&obj, "color")? {
        Field::Absent | Field::Null => DEFAULT_LABEL_COLOR.to_owned(),
        Field::Str(s) => {
            let c = s.trim_start_matches('#').to_ascii_lowercase();
            if c.len() != 6 || !c.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ApiError::field("Label", "color", "invalid"));
            }
            c
        }
    };
    let description = match string_field(&obj, "description")? {
        Field::Str(s) if s.chars().count() > 100 => {
            return Err(ApiError::field("Label", "description", "invalid"));
        }
        Field::Str(s) => Some(s),
        Field::Absent | Field::Null => None,
    };
    if repo_of(state, ctx.key)?.label(&name).is_some() {
        return Err(ApiError {
            documentation_url: "https://docs.github.com/rest/issues/labels#create-a-label"
                .to_owned(),
            ..ApiError::field("Label", "name", "already_exists")
        });
    }
    let id = state.new_id();
    if let Some(repo) = state.repos.get_mut(ctx.key) {
        repo.labels.push(Label {
            id,
            name: name.clone(),
            color,
            description,
        });
    }
    let repo = repo_of(state, ctx.key)?;
    let label = repo
        .label(&name)
        .ok_or_else(|| ApiError::new(500, "Server Error"))?;
    let json = state.label_json(repo, label);
    let location = json
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Ok(Reply::created(json, location))
}

// ----- pull requests -----

fn list_pulls(state: &State, ctx: &Ctx<'_>) -> Result<Reply> {
    let q = ctx.query;
    let state_filter = q.one_of("state", &["open", "closed", "all"], "open")?;
    let sort = q.one_of(
        "sort",
        &["created", "updated", "popularity", "long-running"],
        "created",
    )?;
    let default_direction = if sort == "created" { "desc" } else { "asc" };
    let direction = match q.get("direction") {
        None | Some("") => default_direction.to_owned(),
        Some(_) => q.one_of("direction", &["asc", "desc"], "desc")?,
    };
    let head = q.get("head").filter(|h| !h.is_empty());
    let base = q.get("base").filter(|b| !b.is_empty());
    let repo = repo_of(state, ctx.key)?;
    let items = listed(state, repo, &state_filter, &sort, &direction, |i| {
        let Some(pull) = &i.pull else { return false };
        let head_ok = head.is_none_or(|h| match h.split_once(':') {
            Some(_) => pull.head_label.eq_ignore_ascii_case(h),
            None => pull.head_ref == h,
        });
        let base_ok = base.is_none_or(|b| pull.base_ref == b);
        head_ok && base_ok
    });
    let pulls: Vec<(&Item, &Pull)> = items
        .iter()
        .filter_map(|i| i.pull.as_ref().map(|p| (*i, p)))
        .collect();
    Ok(page_of(state, ctx, &pulls, |(i, p)| {
        state.pull_json(repo, i, p, false)
    }))
}

fn get_pull(state: &State, key: &str, n: u64) -> Result<Reply> {
    let (repo, item) = pull_of(state, key, n)?;
    let pull = item.pull.as_ref().ok_or_else(ApiError::not_found)?;
    Ok(Reply::ok(state.pull_json(repo, item, pull, true)))
}

/// `GET …/pulls/{n}/merge`: 204 when merged, else 404.
fn get_merged(state: &State, key: &str, n: u64) -> Result<Reply> {
    let (_, item) = pull_of(state, key, n)?;
    let merged = item.pull.as_ref().is_some_and(|p| p.merged_at.is_some());
    if merged {
        Ok(Reply {
            status: 204,
            body: None,
            link: None,
            location: None,
        })
    } else {
        Err(ApiError::not_found())
    }
}

fn create_pull(state: &mut State, ctx: &Ctx<'_>) -> Result<Reply> {
    let obj = parse_object(ctx.body)?;
    let title = title_of(&obj, "PullRequest", true)?.unwrap_or_default();
    let head = match string_field(&obj, "head")? {
        Field::Str(s) if !s.trim().is_empty() => s.trim().to_owned(),
        _ => return Err(ApiError::field("PullRequest", "head", "missing_field")),
    };
    let base = match string_field(&obj, "base")? {
        Field::Str(s) if !s.trim().is_empty() => s.trim().to_owned(),
        _ => return Err(ApiError::field("PullRequest", "base", "missing_field")),
    };
    let body = match string_field(&obj, "body")? {
        Field::Str(s) => Some(s),
        Field::Absent | Field::Null => None,
    };
    let draft = bool_field(&obj, "draft")?.unwrap_or(false);
    let repo = repo_of(state, ctx.key)?;
    let (head_label, head_ref) = match head.split_once(':') {
        Some((owner, r)) if !owner.is_empty() && !r.is_empty() => (head.clone(), r.to_owned()),
        Some(_) => return Err(ApiError::field("PullRequest", "head", "invalid")),
        None => (format!("{}:{head}", repo.owner), head.clone()),
    };
    if head_ref == base {
        return Err(ApiError::custom(
            "PullRequest",
            &format!("No commits between {base} and {head_ref}"),
        ));
    }
    let duplicate = repo.items.values().any(|i| {
        i.open
            && i.pull.as_ref().is_some_and(|p| {
                p.head_label.eq_ignore_ascii_case(&head_label) && p.base_ref == base
            })
    });
    if duplicate {
        return Err(ApiError::custom(
            "PullRequest",
            &format!("A pull request already exists for {head_label}."),
        ));
    }
    let n = state
        .create_item(
            ctx.key,
            &title,
            body.as_deref(),
            ctx.actor,
            Some((head_label, head_ref, base, draft)),
        )
        .ok_or_else(ApiError::not_found)?;
    let reply = get_pull(state, ctx.key, n)?;
    let location = format!(
        "{}/repos/{}/pulls/{n}",
        state.base_url,
        repo_of(state, ctx.key)?.full_name()
    );
    Ok(Reply {
        status: 201,
        location: Some(location),
        ..reply
    })
}

fn update_pull(state: &mut State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let (_, item) = pull_of(state, ctx.key, n)?;
    let merged = item.pull.as_ref().is_some_and(|p| p.merged_at.is_some());
    let obj = parse_object(ctx.body)?;
    let title = title_of(&obj, "PullRequest", false)?;
    let body = string_field(&obj, "body")?;
    let open = open_of(&obj, "PullRequest")?;
    let base = match string_field(&obj, "base")? {
        Field::Absent => None,
        Field::Str(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Field::Str(_) | Field::Null => {
            return Err(ApiError::field("PullRequest", "base", "invalid"));
        }
    };
    if merged && (open == Some(true) || base.is_some()) {
        return Err(ApiError::merged("PullRequest"));
    }
    let mut changed = false;
    if let Some(item) = state.item_mut(ctx.key, n) {
        changed |= set_title_and_body(item, title, body);
        if let (Some(base), Some(pull)) = (base, item.pull.as_mut())
            && pull.base_ref != base
        {
            pull.base_ref = base;
            changed = true;
        }
    }
    if let Some(open) = open {
        state.set_item_open(ctx.key, n, open, None, ctx.actor);
        if let Some(item) = state.item_mut(ctx.key, n) {
            // Pull requests carry no state_reason.
            item.state_reason = None;
        }
    }
    if changed {
        state.touch(ctx.key, n);
    }
    get_pull(state, ctx.key, n)
}

/// A pull request's reviews, oldest first; a pending review only to its author, as on
/// GitHub.
fn list_reviews(state: &State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let (repo, item) = pull_of(state, ctx.key, n)?;
    let reviews: Vec<&Review> = item
        .pull
        .as_ref()
        .map_or(&[][..], |p| p.reviews.as_slice())
        .iter()
        .filter(|r| r.state != "PENDING" || r.user.eq_ignore_ascii_case(ctx.actor))
        .collect();
    Ok(page_of(state, ctx, &reviews, |r| {
        state.review_json(repo, item, r)
    }))
}

fn create_review(state: &mut State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let (_, item) = pull_of(state, ctx.key, n)?;
    let author = item.user.clone();
    let head_sha = item
        .pull
        .as_ref()
        .map(|p| p.head_sha.clone())
        .unwrap_or_default();
    let obj = parse_object(ctx.body)?;
    let body = match string_field(&obj, "body")? {
        Field::Str(s) => s,
        Field::Absent | Field::Null => String::new(),
    };
    let review_state = match string_field(&obj, "event")? {
        Field::Absent | Field::Null => "PENDING",
        Field::Str(e) => match e.as_str() {
            "APPROVE" => "APPROVED",
            "REQUEST_CHANGES" => "CHANGES_REQUESTED",
            "COMMENT" => "COMMENTED",
            _ => return Err(ApiError::field("PullRequestReview", "event", "invalid")),
        },
    };
    let commit_id = match string_field(&obj, "commit_id")? {
        Field::Str(s) => s,
        Field::Absent | Field::Null => head_sha,
    };
    if matches!(review_state, "COMMENTED" | "CHANGES_REQUESTED") && body.trim().is_empty() {
        return Err(ApiError {
            errors: Some(json!([format!(
                "Review body is required for {} reviews",
                if review_state == "COMMENTED" {
                    "COMMENT"
                } else {
                    "REQUEST_CHANGES"
                }
            )])),
            ..ApiError::new(422, "Unprocessable Entity")
        });
    }
    if author.eq_ignore_ascii_case(ctx.actor) && review_state == "APPROVED" {
        return Err(ApiError {
            errors: Some(json!(["Can not approve your own pull request"])),
            ..ApiError::new(422, "Unprocessable Entity")
        });
    }
    if author.eq_ignore_ascii_case(ctx.actor) && review_state == "CHANGES_REQUESTED" {
        return Err(ApiError {
            errors: Some(json!(["Can not request changes on your own pull request"])),
            ..ApiError::new(422, "Unprocessable Entity")
        });
    }
    state.ensure_user(ctx.actor);
    let id = state.new_id();
    let now = state.now();
    if let Some(pull) = state.item_mut(ctx.key, n).and_then(|i| i.pull.as_mut()) {
        pull.reviews.push(Review {
            id,
            body,
            state: review_state.to_owned(),
            user: ctx.actor.to_owned(),
            submitted_at: now,
            commit_id,
        });
    }
    if review_state != "PENDING" {
        state.touch(ctx.key, n);
    }
    let (repo, item) = pull_of(state, ctx.key, n)?;
    let review = item
        .pull
        .as_ref()
        .and_then(|p| p.reviews.last())
        .ok_or_else(|| ApiError::new(500, "Server Error"))?;
    Ok(Reply::ok(state.review_json(repo, item, review)))
}

/// A pull request's review comments (`sort` `created`|`updated`, `direction` `asc`|`desc`,
/// default oldest first; `since` keeps those updated at or after it).
fn list_review_comments(state: &State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let q = ctx.query;
    let since = q.since()?;
    let sort = q.one_of("sort", &["created", "updated"], "created")?;
    let direction = q.one_of("direction", &["asc", "desc"], "asc")?;
    let (repo, item) = pull_of(state, ctx.key, n)?;
    let mut comments: Vec<_> = item
        .pull
        .as_ref()
        .map_or(&[][..], |p| p.review_comments.as_slice())
        .iter()
        .filter(|c| since.is_none_or(|s| c.updated_at >= s))
        .collect();
    if sort == "updated" {
        comments.sort_by_key(|c| (c.updated_at, c.id));
    } else {
        comments.sort_by_key(|c| (c.created_at, c.id));
    }
    if direction == "desc" {
        comments.reverse();
    }
    Ok(page_of(state, ctx, &comments, |c| {
        state.review_comment_json(repo, item, c)
    }))
}

/// Adds the actor's reaction to an issue comment or a review comment: 201 when new, 200
/// with the existing one when the actor already reacted so; 404 for an unknown comment, 422
/// for an unknown content.
fn add_reaction(
    state: &mut State,
    ctx: &Ctx<'_>,
    comment_id: u64,
    review_comment: bool,
) -> Result<Reply> {
    let repo = repo_of(state, ctx.key)?;
    let exists = if review_comment {
        repo.review_comment(comment_id).is_some()
    } else {
        repo.issue_comment(comment_id).is_some()
    };
    if !exists {
        return Err(ApiError::not_found());
    }
    let obj = parse_object(ctx.body)?;
    let content = match string_field(&obj, "content")? {
        Field::Str(s) => s,
        Field::Absent | Field::Null => {
            return Err(ApiError::field("Reaction", "content", "missing_field"));
        }
    };
    if !REACTION_CONTENTS.contains(&content.as_str()) {
        return Err(ApiError::validation(json!({
            "resource": "Reaction",
            "code": "custom",
            "field": "content",
            "message": "content is not included in the list"
        })));
    }
    let same = |r: &&Reaction| {
        r.comment_id == comment_id
            && r.review_comment == review_comment
            && r.content == content
            && r.user.eq_ignore_ascii_case(ctx.actor)
    };
    if let Some(existing) = repo.reactions.iter().find(same) {
        return Ok(Reply::ok(state.reaction_json(existing)));
    }
    state.ensure_user(ctx.actor);
    let reaction = Reaction {
        id: state.new_id(),
        comment_id,
        review_comment,
        content,
        user: ctx.actor.to_owned(),
        created_at: state.now(),
    };
    let json = state.reaction_json(&reaction);
    if let Some(repo) = state.repos.get_mut(ctx.key) {
        repo.reactions.push(reaction);
    }
    Ok(Reply {
        status: 201,
        ..Reply::ok(json)
    })
}

/// A user's permission on the repository: the role set for them
/// ([`super::FakeGitHub::set_permission`]), `admin` for the owner, `read` for any other user
/// the fake knows (every repository of the fake is public, and GitHub reports `read` for a
/// user who is not a collaborator of a public repository), and 404 for a login that is no
/// user at all, as GitHub does.
fn get_permission(state: &State, key: &str, login: &str) -> Result<Reply> {
    let repo = repo_of(state, key)?;
    let role = match repo.role_of(login) {
        Some(role) => role,
        None if state.users.contains_key(&login.to_ascii_lowercase()) => "read",
        None => return Err(ApiError::not_found()),
    };
    Ok(Reply::ok(state.permission_json(login, role)))
}

fn merge_pull(state: &mut State, ctx: &Ctx<'_>, n: u64) -> Result<Reply> {
    let (_, item) = pull_of(state, ctx.key, n)?;
    let head_sha = item
        .pull
        .as_ref()
        .map(|p| p.head_sha.clone())
        .unwrap_or_default();
    let open = item.open;
    let obj = parse_object(ctx.body)?;
    if let Field::Str(method) = string_field(&obj, "merge_method")?
        && !["merge", "squash", "rebase"].contains(&method.as_str())
    {
        return Err(ApiError::field("PullRequest", "merge_method", "invalid"));
    }
    if !open {
        return Err(ApiError::new(405, "Pull Request is not mergeable"));
    }
    if let Field::Str(sha) = string_field(&obj, "sha")?
        && sha != head_sha
    {
        return Err(ApiError::new(
            409,
            "Head branch was modified. Review and try the merge again.",
        ));
    }
    let sha = state
        .merge(ctx.key, n, ctx.actor)
        .ok_or_else(|| ApiError::new(405, "Pull Request is not mergeable"))?;
    Ok(Reply::ok(json!({
        "sha": sha,
        "merged": true,
        "message": "Pull Request successfully merged"
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_and_reject() {
        let m = parse_route("/repos/o/r/issues/12/labels/good%20first%20issue").unwrap();
        assert_eq!(m.route, Route::IssueLabel(12, "good first issue".into()));
        assert_eq!((m.owner.as_str(), m.repo.as_str()), ("o", "r"));
        assert!(parse_route("/repos/o/r/issues/x").is_none());
        assert!(parse_route("/repos/o/r/issues/").is_none());
        assert!(parse_route("/repos/o/r/issues/%ff").is_none());
        assert!(parse_route("/repos/o/r/issues/99999999999999999999999").is_none());
        assert!(parse_route("").is_none());
        assert!(parse_route("/").is_none());
    }

    #[test]
    fn patterns_match_loosely() {
        assert!(pattern_matches(
            "/repos/{owner}/{repo}/issues/{n}",
            "/repos/{owner}/{repo}/issues/{issue_number}"
        ));
        assert!(!pattern_matches(
            "/repos/{owner}/{repo}/issues",
            "/repos/{owner}/{repo}/issues/{issue_number}"
        ));
        assert!(request_matches(
            "get",
            "/repos/o/r",
            "GET",
            "/repos/o/r",
            None
        ));
        assert!(request_matches(
            "*",
            "/user",
            "POST",
            "/user",
            Some("/user")
        ));
    }

    #[test]
    fn etags_compare_weakly_and_in_lists() {
        assert!(etag_matches("\"abc\"", "\"abc\""));
        assert!(etag_matches("W/\"abc\"", "\"abc\""));
        assert!(etag_matches("\"x\", \"abc\"", "\"abc\""));
        assert!(etag_matches("*", "\"abc\""));
        assert!(!etag_matches("\"abd\"", "\"abc\""));
    }

    #[test]
    fn windows_paginate_with_links() {
        let q = Query {
            pairs: parse_query("state=open&per_page=100&page=2"),
        };
        let w = window("http://h", "/p", &q, 250);
        assert_eq!((w.start, w.end), (100, 200));
        let link = w.link.unwrap();
        assert!(link.contains("<http://h/p?state=open&per_page=100&page=3>; rel=\"next\""));
        assert!(link.contains("<http://h/p?state=open&per_page=100&page=3>; rel=\"last\""));
        assert!(link.contains("<http://h/p?state=open&per_page=100&page=1>; rel=\"prev\""));
        let q = Query {
            pairs: parse_query("page=18446744073709551615&per_page=-1"),
        };
        let w = window("http://h", "/p", &q, 5);
        assert_eq!((w.start, w.end), (5, 5));
        let w = window("http://h", "/p", &Query { pairs: vec![] }, 5);
        assert!(w.link.is_none());
    }

    #[test]
    fn tokens_parse() {
        assert_eq!(token_of("Bearer abc"), Some("abc"));
        assert_eq!(token_of("token abc"), Some("abc"));
        assert_eq!(token_of("Basic abc"), None);
        assert_eq!(token_of("Bearer "), None);
        assert_eq!(token_of(""), None);
    }
}
