//! Which headers cross the gateway (docs/security.md#network): on the way up, only the
//! request headers listed for the run's provider; on the way back, the upstream's headers
//! but those naming the operator's account.
//!
//! The agent is taken to be hostile, and the request goes out with the operator's key. A
//! header the provider honours can choose what that key pays for (`OpenAI-Organization` and
//! `OpenAI-Project` pick the organization and project billed, and with them the project's
//! limits and data retention), carry another credential, or change how the body is read
//! (`Content-Encoding`), so the request headers pass by an allow-list of what the CLIs need
//! and a header it does not name is dropped, even one a provider starts honouring later.

use hyper::header::{HeaderMap, HeaderName};

use super::usage::Provider;

use Provider::{Anthropic, OpenAi};

/// Both providers.
const BOTH: &[Provider] = &[Anthropic, OpenAi];

/// The request headers passed upstream, each for the providers named beside it (names in
/// lower case, matched whole). They are what Claude Code
/// (Anthropic's TypeScript SDK) and Codex send that shapes the protocol, names the client,
/// or ties a call to its conversation for the provider's caching and routing. Everything
/// else is dropped: the agent's key (`x-api-key`, `authorization`, the gateway puts the
/// real one in), the tenant it would bill (`openai-organization`, `openai-project`,
/// `chatgpt-account-id`), cookies, the encodings (the gateway reads the answer, and
/// forwards the body exactly as it read it), tracing (`traceparent`, `baggage`,
/// `sentry-trace`), Codex's `x-codex-turn-metadata` (the workspace's repositories and
/// commits, for the provider's observability), idempotency keys (neither CLI sends one),
/// and the host, length and hop-by-hop headers, which the gateway's own client sets.
pub const FORWARDED_REQUEST_HEADERS: &[(&[Provider], &str)] = &[
    // The protocol: what the body is, what answer is wanted, the API version and betas.
    (BOTH, "content-type"),
    (BOTH, "accept"),
    // The Anthropic beta values are checked first (policy::outbound_features,
    // policy::pricing_options); the OpenAI ones select the Responses protocol's versions.
    (&[Anthropic], "anthropic-version"),
    (&[Anthropic], "anthropic-beta"),
    (&[OpenAi], "openai-beta"),
    (&[OpenAi], "x-codex-beta-features"),
    (&[OpenAi], "x-responsesapi-include-timing-metrics"),
    // The client and its version.
    (BOTH, "user-agent"),
    (&[Anthropic], "x-app"),
    // The SDK's own set, by name: any other `x-stainless-` header is dropped like any other.
    (&[Anthropic], "x-stainless-lang"),
    (&[Anthropic], "x-stainless-package-version"),
    (&[Anthropic], "x-stainless-os"),
    (&[Anthropic], "x-stainless-arch"),
    (&[Anthropic], "x-stainless-runtime"),
    (&[Anthropic], "x-stainless-runtime-version"),
    (&[Anthropic], "x-stainless-retry-count"),
    (&[Anthropic], "x-stainless-timeout"),
    (&[Anthropic], "x-stainless-helper-method"),
    (&[Anthropic], "x-stainless-helper"),
    (&[OpenAi], "originator"),
    (&[OpenAi], "version"),
    // The request and its conversation.
    (BOTH, "x-client-request-id"),
    (&[Anthropic], "x-claude-code-session-id"),
    (&[OpenAi], "session_id"),
    (&[OpenAi], "session-id"),
    (&[OpenAi], "conversation_id"),
    (&[OpenAi], "thread-id"),
    (&[OpenAi], "x-codex-parent-thread-id"),
    (&[OpenAi], "x-codex-window-id"),
    (&[OpenAi], "x-codex-turn-state"),
    (&[OpenAi], "x-openai-subagent"),
];

/// The answer's headers that never reach the agent: those naming the account the operator's
/// key belongs to (its organization, project or workspace), and cookies (the gateway sends
/// none upstream). Hop-by-hop headers are dropped too ([`hop_by_hop`]); every other header
/// passes, so the CLIs still read the request id, the rate limits and when to retry.
pub const WITHHELD_RESPONSE_HEADERS: &[&str] = &[
    "openai-organization",
    "openai-project",
    "anthropic-organization-id",
    "anthropic-workspace-id",
    "set-cookie",
];

/// Whether a request header `name` is passed upstream for `provider`
/// ([`FORWARDED_REQUEST_HEADERS`]).
pub fn forwarded(provider: Provider, name: &HeaderName) -> bool {
    let name = name.as_str();
    FORWARDED_REQUEST_HEADERS
        .iter()
        .any(|(providers, listed)| providers.contains(&provider) && name == *listed)
}

/// The agent's request headers that go upstream for `provider`, each value as it came.
pub fn forwarded_request(provider: Provider, incoming: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in incoming {
        if forwarded(provider, name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// Whether an answer's header `name` is passed back to the agent: all but the hop-by-hop
/// ones and [`WITHHELD_RESPONSE_HEADERS`].
pub fn answered(name: &HeaderName) -> bool {
    !hop_by_hop(name) && !WITHHELD_RESPONSE_HEADERS.contains(&name.as_str())
}

/// Whether `name` describes one connection rather than the message (RFC 9110 §7.6.1).
pub fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn request(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    fn names(headers: &HeaderMap) -> Vec<&str> {
        let mut names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Headers no list allows: keys, tenants, encodings, cookies, tracing, and the unknown.
    const NEVER: &[(&str, &str)] = &[
        ("x-api-key", "agentry-run-abc"),
        ("authorization", "Bearer agentry-run-abc"),
        ("openai-organization", "org-other"),
        ("openai-project", "proj_other"),
        ("chatgpt-account-id", "acct-other"),
        ("accept-encoding", "gzip"),
        ("content-encoding", "zstd"),
        ("cookie", "session=x"),
        ("connection", "keep-alive"),
        ("host", "127.0.0.1:4810"),
        ("content-length", "12"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("x-codex-turn-metadata", "{\"workspaces\":{}}"),
        ("idempotency-key", "k"),
        ("x-evil", "1"),
        // Not one of the SDK's: the prefix alone does not pass.
        ("x-stainless-anything", "1"),
    ];

    #[test]
    fn claude_codes_headers_pass_and_nothing_else() {
        let mut sent = request(&[
            ("content-type", "application/json"),
            ("accept", "application/json"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "claude-code-20250219"),
            ("anthropic-beta", "interleaved-thinking-2025-05-14"),
            ("user-agent", "claude-cli/2.1.197 (external, cli)"),
            ("x-app", "cli"),
            ("x-stainless-retry-count", "0"),
            ("x-stainless-timeout", "600"),
            ("x-claude-code-session-id", "5f1c2a9e"),
            ("x-client-request-id", "r1"),
            // OpenAI's own: not for Anthropic.
            ("openai-beta", "responses=experimental"),
            ("session_id", "s1"),
        ]);
        for (name, value) in NEVER {
            sent.append(*name, HeaderValue::from_static(value));
        }
        let out = forwarded_request(Anthropic, &sent);
        assert_eq!(
            names(&out),
            [
                "accept",
                "anthropic-beta",
                "anthropic-version",
                "content-type",
                "user-agent",
                "x-app",
                "x-claude-code-session-id",
                "x-client-request-id",
                "x-stainless-retry-count",
                "x-stainless-timeout",
            ]
        );
        let betas: Vec<_> = out.get_all("anthropic-beta").iter().collect();
        assert_eq!(
            betas,
            ["claude-code-20250219", "interleaved-thinking-2025-05-14"]
        );
    }

    #[test]
    fn codexs_headers_pass_and_nothing_else() {
        let mut sent = request(&[
            ("content-type", "application/json"),
            ("accept", "text/event-stream"),
            ("openai-beta", "responses=experimental"),
            ("user-agent", "codex_exec/0.169.0"),
            ("originator", "codex_exec"),
            ("version", "0.169.0"),
            ("session_id", "01a214ae"),
            ("x-codex-turn-state", "opaque"),
            ("x-client-request-id", "01a214ae"),
            // Anthropic's own: not for OpenAI.
            ("anthropic-version", "2023-06-01"),
            ("x-stainless-os", "Linux"),
        ]);
        for (name, value) in NEVER {
            sent.append(*name, HeaderValue::from_static(value));
        }
        assert_eq!(
            names(&forwarded_request(OpenAi, &sent)),
            [
                "accept",
                "content-type",
                "openai-beta",
                "originator",
                "session_id",
                "user-agent",
                "version",
                "x-client-request-id",
                "x-codex-turn-state",
            ]
        );
    }

    #[test]
    fn the_answer_keeps_its_headers_but_the_operators_account() {
        for name in [
            "openai-organization",
            "openai-project",
            "anthropic-organization-id",
            "set-cookie",
            "transfer-encoding",
            "connection",
        ] {
            assert!(!answered(&HeaderName::from_static(name)), "{name}");
        }
        for name in [
            "content-type",
            "request-id",
            "x-request-id",
            "retry-after",
            "x-should-retry",
            "anthropic-ratelimit-requests-remaining",
            "x-ratelimit-remaining-tokens",
            "openai-processing-ms",
        ] {
            assert!(answered(&HeaderName::from_static(name)), "{name}");
        }
    }
}
