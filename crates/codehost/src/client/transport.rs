//! How [`GitHub`] sends a request: routes under the base path, pagination, retries with
//! backoff, rate-limit waits, conditional requests, the transport per runtime, and errors
//! with the token scrubbed (see the [parent module](super) for the rules).

use super::*;

impl GitHub {
    /// The full path of a route: the base path in front.
    pub(super) fn route(&self, path: &str) -> String {
        format!("{}{path}", self.inner.base_path)
    }

    pub(super) async fn get_json<T: DeserializeOwned>(
        &self,
        path: String,
    ) -> Result<T, CodeHostError> {
        let target = self.route(&path);
        let reply = self.send(&Method::GET, &target, None, None).await?;
        if !reply.status.is_success() {
            return Err(self.error_of(&Method::GET, &target, &reply));
        }
        parse(&Method::GET, &target, &reply.body)
    }

    pub(super) async fn send_expect(
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
    pub(super) async fn post_once(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(Reply, String), CodeHostError> {
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

    /// Every item of the repository's list `path` (`?per_page=100`, updated at or after
    /// `since` if given), every page, as `T`.
    pub(super) async fn list_all<J: DeserializeOwned, T: From<J>>(
        &self,
        owner: &str,
        name: &str,
        path: &str,
        since: Option<OffsetDateTime>,
    ) -> Result<Vec<T>, CodeHostError> {
        let first = format!(
            "{}?per_page={PER_PAGE}{}",
            repo_path(owner, name, path),
            since_query(since)
        );
        let items = self.get_all::<J>(first).await?;
        Ok(items.into_iter().map(T::from).collect())
    }

    /// [`Self::post_once`], the answer read as `J` and given as `T`.
    pub(super) async fn post_once_as<J: DeserializeOwned, T: From<J>>(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<T, CodeHostError> {
        let (reply, target) = self.post_once(path, body).await?;
        let created: J = parse(&Method::POST, &target, &reply.body)?;
        Ok(created.into())
    }

    /// Reads every page of a list, unconditionally.
    pub(super) async fn get_all<T: DeserializeOwned>(
        &self,
        first: String,
    ) -> Result<Vec<T>, CodeHostError> {
        match self.get_pages(first, None, |_: &[T]| true).await? {
            Conditional::Modified { value, .. } => Ok(value),
            Conditional::NotModified => Err(CodeHostError::InvalidResponse(
                "304 to a request without If-None-Match".into(),
            )),
        }
    }

    /// Reads a list: the first page (conditional on `etag`), then each `rel="next"` page
    /// while `more(last page read)` says so.
    pub(super) async fn get_pages<T: DeserializeOwned>(
        &self,
        first: String,
        etag: Option<&str>,
        more: impl FnMut(&[T]) -> bool,
    ) -> Result<Conditional<Vec<T>>, CodeHostError> {
        let pages = self.get_counted_pages(first, etag, more).await?;
        Ok(pages.map(|(items, _)| items))
    }

    /// [`Self::get_pages`] that also says how many pages it read.
    pub(super) async fn get_counted_pages<T: DeserializeOwned>(
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
    pub(super) fn error_of(&self, method: &Method, target: &str, reply: &Reply) -> CodeHostError {
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
    pub(super) fn scrub(&self, message: String) -> String {
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
    pub(super) async fn send(
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
    pub(super) async fn send_with(
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
            let request = self.request(method, target, body.clone(), if_none_match)?;
            let attempt = self.attempt(request).await?;
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
                        *self.inner.rate.lock() = None;
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

    /// One HTTP exchange of `request`, bounded by the request timeout.
    pub(super) async fn attempt(
        &self,
        request: http::Request<OctoBody>,
    ) -> Result<Attempt, CodeHostError> {
        let transport = self.transport()?;
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

    pub(super) fn request(
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
    pub(super) fn transport(&self) -> Result<Octocrab, CodeHostError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| CodeHostError::Config("the client needs a tokio runtime".into()))?
            .id();
        let mut transports = self.inner.transports.lock();
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
    pub(super) fn note_rate(&self, headers: &HeaderMap) {
        if let (Some(remaining), Some(reset_epoch)) = (
            header_u64(headers, "x-ratelimit-remaining"),
            header_u64(headers, "x-ratelimit-reset"),
        ) {
            *self.inner.rate.lock() = Some(RateWindow {
                remaining,
                reset_epoch,
            });
        }
    }

    /// Before a request: if the last answer said the window is used up and it has not reset
    /// yet, waits for the reset (or fails when that is too long).
    pub(super) async fn wait_for_rate_window(
        &self,
        method: &Method,
        target: &str,
    ) -> Result<(), CodeHostError> {
        let window = *self.inner.rate.lock();
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
        let mut rate = self.inner.rate.lock();
        if *rate == Some(window) {
            *rate = None;
        }
        Ok(())
    }
}

/// How long a rate-limited answer asks to wait, or `None` if it is not a rate limit.
pub(super) fn rate_limit_wait(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
) -> Option<Duration> {
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

pub(super) fn parse<T: DeserializeOwned>(
    method: &Method,
    target: &str,
    body: &str,
) -> Result<T, CodeHostError> {
    serde_json::from_str(body)
        .map_err(|e| CodeHostError::InvalidResponse(format!("{method} {}: {e}", path_only(target))))
}

/// `/repos/{owner}/{name}{rest}`, the names percent-encoded.
pub(super) fn repo_path(owner: &str, name: &str, rest: &str) -> String {
    format!(
        "/repos/{}/{}{rest}",
        encode_segment(owner),
        encode_segment(name)
    )
}

/// `since` as GitHub's query takes it: UTC, whole seconds (rounded down), `Z`.
pub(super) fn since_param(since: OffsetDateTime) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    // Cannot fail: an OffsetDateTime has every component the description names.
    since
        .to_offset(time::UtcOffset::UTC)
        .format(format)
        .unwrap_or_default()
}

/// `&since=…` for a list query, or nothing.
pub(super) fn since_query(since: Option<OffsetDateTime>) -> String {
    since.map_or_else(String::new, |t| format!("&since={}", since_param(t)))
}

/// A target without its query, for messages and logs.
pub(super) fn path_only(target: &str) -> &str {
    target.split_once('?').map_or(target, |(path, _)| path)
}

/// Splits the base URL into scheme, authority and base path (no trailing `/`).
pub(super) fn parse_base_url(url: &str) -> Result<(String, String, String), CodeHostError> {
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
