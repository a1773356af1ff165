//! What the gateway passes on, decided before anything reaches the model API
//! (docs/contract.md#68-model-gateway): the endpoints, the models, the provider's outbound
//! features, and the largest cost of a model call, which is reserved against the run's
//! allowance before the call is sent.
//!
//! Every check here fails closed: a path it cannot read plainly, a model without a price, a
//! tool it does not know to run on the agent's side, or a cost it cannot bound is refused.

use agentry_domain::money::Usd;
use agentry_domain::quote::excerpt;
use agentry_runner::PriceTable;
use agentry_runner::prices::ModelPrice;
use hyper::header::HeaderMap;
use hyper::{Method, StatusCode};
use serde_json::{Map, Value};

use super::usage::Provider;

/// The input tokens a call is taken to use when the provider adds stored input the gateway
/// cannot see (OpenAI's `previous_response_id`, `conversation`, stored `prompt` or an
/// `item_reference` input item): at least
/// the largest context window of the models priced, so a reservation is never short.
pub const STORED_INPUT_TOKENS: u64 = 2_000_000;

/// The most JSON values a request body may hold, an object counting as [`OBJECT_WEIGHT`]
/// values (a long real conversation holds tens of thousands). The parsed body takes about
/// 32 bytes a value and a few hundred bytes a non-empty object, so a 32 MiB body of tiny
/// values (`[0,0,0,…]`, ~16 million of them) would take over 512 MiB; within this limit it
/// takes a few tens of MiB at most. Counted by [`json_values_within`] before parsing.
pub const MAX_JSON_VALUES: usize = 1_048_576;

/// What one object counts for in [`MAX_JSON_VALUES`]: the map of a parsed object (a B-tree
/// node of 11 members, about 640 bytes) takes about as much memory as 16 other values.
pub const OBJECT_WEIGHT: usize = 16;

/// What a request path is, for a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A model call: priced, reserved and metered.
    Metered,
    /// Passed on unmetered: token counting, the model list.
    Free,
}

/// Why the gateway refuses a request itself, as the agent is told (in the provider's
/// error shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// A short code (OpenAI's `code`).
    pub code: &'static str,
    /// The sentence the agent reads.
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: String) -> Refusal {
        Refusal {
            status,
            code,
            message,
        }
    }

    fn bad(code: &'static str, message: String) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, code, message)
    }
}

/// The endpoints passed on, per provider, method and exact path (the query is passed on
/// as it is). These are what Claude Code and Codex use; every other resource of the
/// providers' APIs (files, batches, chat completions, images, stored responses, …) is
/// refused.
const ROUTES: &[(Provider, &str, &str, Route)] = &[
    (Provider::Anthropic, "POST", "/v1/messages", Route::Metered),
    (
        Provider::Anthropic,
        "POST",
        "/v1/messages/count_tokens",
        Route::Free,
    ),
    (Provider::Anthropic, "GET", "/v1/models", Route::Free),
    (Provider::OpenAi, "POST", "/v1/responses", Route::Metered),
    (
        Provider::OpenAi,
        "POST",
        "/v1/responses/compact",
        Route::Metered,
    ),
    (Provider::OpenAi, "GET", "/v1/models", Route::Free),
];

/// The route of `method` `path` for `provider`: 400 for a path that is not plain (percent
/// escapes, backslashes, empty, `.` or `..` segments), 404 for one that is not listed.
pub fn route(provider: Provider, method: &Method, path: &str) -> Result<Route, Refusal> {
    if let Err(why) = plain_path(path) {
        return Err(Refusal::bad(
            "invalid_path",
            format!(
                "the agentry model gateway refuses the path {}: {why}",
                excerpt(path, 100)
            ),
        ));
    }
    ROUTES
        .iter()
        .find(|(p, m, r, _)| *p == provider && *m == method.as_str() && *r == path)
        .map(|(_, _, _, route)| *route)
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "the agentry model gateway does not serve {method} {}: it passes on only {}",
                    excerpt(path, 100),
                    listed(provider)
                ),
            )
        })
}

/// The endpoints of `provider`, as a sentence part.
fn listed(provider: Provider) -> String {
    ROUTES
        .iter()
        .filter(|(p, ..)| *p == provider)
        .map(|(_, m, r, _)| format!("{m} {r}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `path` is plain: absolute, printable ASCII without `%`, `\`, empty segments or
/// dot segments. A plain path means the same to the gateway and to any server behind it.
fn plain_path(path: &str) -> Result<(), &'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("it is not absolute");
    };
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("it holds a character that is not printable ASCII");
    }
    if path.contains('%') {
        return Err("it holds a percent escape");
    }
    if path.contains('\\') {
        return Err("it holds a backslash");
    }
    for segment in rest.split('/') {
        match segment {
            "" => return Err("it holds an empty segment (a double or trailing slash)"),
            "." | ".." => return Err("it holds a dot segment"),
            _ => {}
        }
    }
    Ok(())
}

/// Tool types Anthropic passes back to the agent to run itself (client tools); a tool
/// without a `type` is a custom tool, also client-side. Every other type (web search, web
/// fetch, code execution, MCP toolsets, tool search, …) runs on the provider's side.
const ANTHROPIC_CLIENT_TOOLS: &[&str] =
    &["custom", "bash_", "text_editor_", "computer_", "memory_"];

/// OpenAI tool types the agent runs itself. Every other type (`web_search`,
/// `web_search_preview`, `file_search`, `mcp`, `code_interpreter`, `image_generation`, …)
/// runs on the provider's side, and so does a `shell` tool with a hosted `environment`
/// ([`shell_runs_on_client`]).
const OPENAI_CLIENT_TOOLS: &[&str] = &[
    "function",
    "custom",
    "namespace",
    "local_shell",
    "shell",
    "apply_patch",
    "computer_use_preview",
];

/// `anthropic-beta` values that switch on a provider-side feature reaching out (MCP
/// connectors, web fetch and search, code execution and the containers and files it uses,
/// skills).
const ANTHROPIC_OUTBOUND_BETAS: &[&str] = &[
    "mcp-client-",
    "web-fetch-",
    "web-search-",
    "code-execution-",
    "files-api-",
    "skills-",
];

/// Refuses a request that asks the provider to reach out on the agent's behalf: MCP
/// servers, server-side tools, and the `anthropic-beta` values that enable them, unless
/// the repository allows provider tools (`allowProviderTools`).
pub fn outbound_features(
    provider: Provider,
    headers: &HeaderMap,
    body: Option<&Map<String, Value>>,
    allowed: bool,
) -> Result<(), Refusal> {
    if allowed {
        return Ok(());
    }
    let refuse = |what: String| {
        Err(Refusal::bad(
            "provider_tools_not_allowed",
            format!(
                "the agentry model gateway refuses {what}: it makes the model provider reach \
                 out on the agent's behalf, past agentry's egress proxy. A repository admin \
                 can allow provider tools with the repository setting allowProviderTools"
            ),
        ))
    };
    if provider == Provider::Anthropic {
        for value in headers.get_all("anthropic-beta") {
            let text = String::from_utf8_lossy(value.as_bytes());
            for beta in text.split(',').map(str::trim) {
                if ANTHROPIC_OUTBOUND_BETAS.iter().any(|p| beta.starts_with(p)) {
                    return refuse(format!("the anthropic-beta value {}", excerpt(beta, 60)));
                }
            }
        }
    }
    let Some(body) = body else { return Ok(()) };
    if let Some(servers) = body.get("mcp_servers")
        && !servers.is_null()
        && servers.as_array().is_none_or(|a| !a.is_empty())
    {
        return refuse("mcp_servers".to_owned());
    }
    let client = match provider {
        Provider::Anthropic => ANTHROPIC_CLIENT_TOOLS,
        Provider::OpenAi => OPENAI_CLIENT_TOOLS,
    };
    let mut offered: Vec<&Value> = Vec::new();
    collect_tools(body.get("tools"), &mut offered);
    // Codex offers its tools in an `additional_tools` input item as well.
    if let Some(Value::Array(items)) = body.get("input") {
        for item in items {
            if item.get("type").and_then(Value::as_str) == Some("additional_tools") {
                collect_tools(item.get("tools"), &mut offered);
            }
        }
    }
    for tool in offered {
        let kind = match tool.get("type") {
            None | Some(Value::Null) => continue,
            Some(Value::String(kind)) => kind.as_str(),
            Some(_) => return refuse("a tool whose type is not a string".to_owned()),
        };
        let runs_on_client = client
            .iter()
            .any(|c| kind == *c || (c.ends_with('_') && kind.starts_with(c)));
        if !runs_on_client {
            return refuse(format!("the provider-side tool {}", excerpt(kind, 60)));
        }
        if provider == Provider::OpenAi && kind == "shell" && !shell_runs_on_client(tool) {
            return refuse(
                "a shell tool whose environment is not \"local\" (it runs commands in a \
                 container on the provider's servers, with the network access the request \
                 chooses)"
                    .to_owned(),
            );
        }
    }
    if let Some(what) = find_object(body, &mut |object| fetched_content(provider, object)) {
        return Err(Refusal::bad(
            "provider_tools_not_allowed",
            format!(
                "the agentry model gateway refuses {what}: it makes the model provider fetch \
                 a URL or read stored content for the agent, past agentry's egress proxy, and \
                 adds input the call's reserved cost cannot count. Send the content itself \
                 (base64 or a data: URL). A repository admin can allow provider tools with the \
                 repository setting allowProviderTools"
            ),
        ));
    }
    Ok(())
}

/// What `object` is, when it is a content block that makes the provider fetch a URL or read
/// a stored file: an Anthropic `image` or `document` whose `source` is not data carried in
/// the request (`url`, `file`, any type but `base64`, `text` and `content`), an Anthropic
/// `container_upload`; an OpenAI `input_image` (or a computer tool's `computer_screenshot`
/// output) naming a `file_id` or an `image_url` that is not a `data:` URL, an OpenAI
/// `input_file` naming a `file_url` or a `file_id`.
fn fetched_content(provider: Provider, object: &Map<String, Value>) -> Option<String> {
    let kind = object.get("type").and_then(Value::as_str)?;
    let named = |field: &str| object.get(field).is_some_and(|v| !v.is_null());
    match (provider, kind) {
        (Provider::Anthropic, "image" | "document") => {
            let source = object.get("source").filter(|s| !s.is_null())?;
            match source.get("type").and_then(Value::as_str) {
                Some("base64" | "text" | "content") => None,
                Some(other) => Some(format!(
                    "an {kind} block whose source is of type {:?}",
                    excerpt(other, 40)
                )),
                None => Some(format!("an {kind} block whose source has no type")),
            }
        }
        (Provider::Anthropic, "container_upload") => {
            Some("a container_upload block (a stored file)".to_owned())
        }
        (Provider::OpenAi, "input_image" | "computer_screenshot") => {
            if named("file_id") {
                return Some(format!("an {kind} naming a stored file (file_id)"));
            }
            match object.get("image_url") {
                None | Some(Value::Null) => None,
                Some(Value::String(url))
                    if url
                        .get(..5)
                        .is_some_and(|s| s.eq_ignore_ascii_case("data:")) =>
                {
                    None
                }
                Some(_) => Some(format!("an {kind} whose image_url is not a data: URL")),
            }
        }
        (Provider::OpenAi, "input_file") if named("file_url") => {
            Some("an input_file naming a file_url".to_owned())
        }
        (Provider::OpenAi, "input_file") if named("file_id") => {
            Some("an input_file naming a stored file (file_id)".to_owned())
        }
        _ => None,
    }
}

/// The first `Some` that `visit` returns for an object within `object`: `object` itself,
/// then each member's value, depth first. The depth is bounded by the recursion limit of
/// serde_json (128 nested arrays and objects), which every parsed body is within.
fn find_object<T, F>(object: &Map<String, Value>, visit: &mut F) -> Option<T>
where
    F: FnMut(&Map<String, Value>) -> Option<T>,
{
    if let Some(found) = visit(object) {
        return Some(found);
    }
    object.values().find_map(|value| find_in(value, visit))
}

/// [`find_object`] over the objects within `value`.
fn find_in<T, F>(value: &Value, visit: &mut F) -> Option<T>
where
    F: FnMut(&Map<String, Value>) -> Option<T>,
{
    match value {
        Value::Object(object) => find_object(object, visit),
        Value::Array(items) => items.iter().find_map(|item| find_in(item, visit)),
        _ => None,
    }
}

/// Whether an OpenAI `shell` tool runs its commands on the agent's side: it names no
/// `environment`, or a `local` one. Any other environment (`container_auto`, a container
/// reference, a type not known yet) runs them on OpenAI's servers.
fn shell_runs_on_client(tool: &Value) -> bool {
    match tool.get("environment") {
        None | Some(Value::Null) => true,
        Some(environment) => environment.get("type").and_then(Value::as_str) == Some("local"),
    }
}

/// Adds the tools of a `tools` array to `out`, with those nested in namespaces.
fn collect_tools<'a>(tools: Option<&'a Value>, out: &mut Vec<&'a Value>) {
    let Some(Value::Array(tools)) = tools else {
        return;
    };
    for tool in tools {
        out.push(tool);
        if tool.get("type").and_then(Value::as_str) == Some("namespace") {
            collect_tools(tool.get("tools"), out);
        }
    }
}

/// OpenAI `service_tier` values billed at the standard prices (or less: `flex`); any other
/// (`priority`, a tier not known yet) is refused ([`pricing_options`]).
const OPENAI_PRICED_TIERS: &[&str] = &["auto", "default", "flex"];

/// `anthropic-beta` values that bill a call above the standard prices, or for more than its
/// answer's usage says: fast mode, the 1M-token context window's long-context premium, and
/// server-side compaction (its summarising pass is billed, but reported only in
/// `usage.iterations`, which the top-level counts leave out).
const ANTHROPIC_UNPRICED_BETAS: &[&str] = &["fast-mode-", "context-1m-", "compact-"];

/// Refuses a model call that asks for a rate the price table does not hold (it lists the
/// standard tier only), or for work its answer's usage leaves out. Both providers:
/// server-side compaction in `context_management` (a `type` starting with `compact`).
/// OpenAI: a `service_tier` other than `auto`, `default` or `flex`. Anthropic: a `speed`
/// other than `standard`, an `anthropic-beta` value starting with `fast-mode-`,
/// `context-1m-` or `compact-`, a `cache_control` whose `ttl` is neither `5m` nor `1h`
/// (both are priced; [`plan`] reserves a `1h` write at its price).
pub fn pricing_options(
    provider: Provider,
    headers: &HeaderMap,
    body: &Map<String, Value>,
) -> Result<(), Refusal> {
    let refuse = |what: String| {
        Err(Refusal::bad(
            "tier_not_priced",
            format!(
                "{what}: agentry prices model calls at the provider's standard rates only, so \
                 a call billed at another rate cannot be metered and was not sent. Send it \
                 without that option"
            ),
        ))
    };
    let text = |field: &str| match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.as_str())),
        Some(_) => Err(Refusal::bad(
            "invalid_request_error",
            format!("{field}: must be a string"),
        )),
    };
    // Server-side compaction: a second, summarising pass over the whole context, billed
    // but not in the usage the gateway meters (Anthropic reports it in `usage.iterations`).
    // Claude Code compacts with an ordinary call; Codex with `/v1/responses/compact`, which
    // is metered as one.
    // Only the request's own settings: the conversation may replay an earlier compaction's
    // output (`compaction` blocks and items), which costs what any input costs.
    if let Some(kind) = body.get("context_management").and_then(|settings| {
        find_in(settings, &mut |object| {
            let kind = object.get("type")?.as_str()?;
            kind.starts_with("compact").then(|| kind.to_owned())
        })
    }) {
        return refuse(format!("context_management {:?}", excerpt(&kind, 40)));
    }
    match provider {
        Provider::OpenAi => {
            if let Some(tier) = text("service_tier")?
                && !OPENAI_PRICED_TIERS.contains(&tier)
            {
                return refuse(format!("service_tier {:?}", excerpt(tier, 40)));
            }
        }
        Provider::Anthropic => {
            if let Some(speed) = text("speed")?
                && speed != "standard"
            {
                return refuse(format!("speed {:?}", excerpt(speed, 40)));
            }
            for value in headers.get_all("anthropic-beta") {
                let text = String::from_utf8_lossy(value.as_bytes());
                for beta in text.split(',').map(str::trim) {
                    if ANTHROPIC_UNPRICED_BETAS.iter().any(|p| beta.starts_with(p)) {
                        return refuse(format!("the anthropic-beta value {}", excerpt(beta, 60)));
                    }
                }
            }
            if let Some(ttl) = find_object(body, &mut |object| {
                let ttl = object.get("cache_control")?.get("ttl")?;
                match ttl.as_str() {
                    None if ttl.is_null() => None,
                    Some("5m" | "1h") => None,
                    _ => Some(ttl.to_string()),
                }
            }) {
                return refuse(format!("a cache_control ttl of {}", excerpt(&ttl, 40)));
            }
        }
    }
    Ok(())
}

/// `Some` for an Anthropic `cache_control` asking for the 1-hour cache (`"ttl": "1h"`).
fn one_hour_cache(object: &Map<String, Value>) -> Option<()> {
    let ttl = object.get("cache_control")?.get("ttl")?;
    (ttl.as_str() == Some("1h")).then_some(())
}

/// A model call the gateway will pass on, as planned from its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPlan {
    /// The model asked for.
    pub model: String,
    /// Its price.
    pub price: ModelPrice,
    /// The largest the call can cost: reserved against the run's allowance while it runs.
    pub reservation: Usd,
    /// Whether the answer cannot carry the call's usage (an OpenAI `background` request,
    /// whose answer comes before its work): such a call is billed at its reservation.
    pub unknown_usage: bool,
}

/// Plans the model call whose JSON body is `body` (`body_len` bytes): its model must be
/// priced, and its largest cost is every byte of the body an input token (a token is never
/// shorter than a byte of the text it stands for), or [`STORED_INPUT_TOKENS`] more when the
/// provider adds stored input (`previous_response_id`, `conversation`, `prompt`, an
/// `item_reference` item), at the dearest input price (a 1-hour cache write when a
/// `cache_control` asks for one), plus its output limit (`max_tokens`, `max_output_tokens`,
/// else the model's) at the output price.
pub fn plan(
    provider: Provider,
    body: &Map<String, Value>,
    body_len: usize,
    prices: &PriceTable,
) -> Result<CallPlan, Refusal> {
    let model = match body.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        _ => {
            return Err(Refusal::bad(
                "invalid_request_error",
                "model: a model call names its model (a non-empty string)".to_owned(),
            ));
        }
    };
    let Some(price) = prices.get(&model).copied() else {
        return Err(Refusal::bad(
            "model_not_priced",
            format!(
                "model: agentry has no price for {:?}, so a call to it cannot be metered and \
                 was not sent. An operator adds its price to the JSON file that \
                 AGENTRY_PRICES_FILE names (USD per million tokens: {{\"{}\": {{\"input\": \
                 \"…\", \"cachedInput\": \"…\", \"output\": \"…\"}}}}) and restarts agentry",
                excerpt(&model, 100),
                excerpt(&model, 100)
            ),
        ));
    };
    let limit_field = match provider {
        Provider::Anthropic => "max_tokens",
        Provider::OpenAi => "max_output_tokens",
    };
    let output = match body.get(limit_field) {
        None | Some(Value::Null) => u64::from(price.output_limit()),
        Some(value) => value.as_u64().filter(|n| *n > 0).ok_or_else(|| {
            Refusal::bad(
                "invalid_request_error",
                format!("{limit_field}: must be a positive integer"),
            )
        })?,
    };
    let stored_input = ["previous_response_id", "conversation", "prompt"]
        .iter()
        .any(|field| body.get(*field).is_some_and(|v| !v.is_null()))
        || (provider == Provider::OpenAi && find_object(body, &mut item_reference).is_some());
    let input = u64::try_from(body_len)
        .unwrap_or(u64::MAX)
        .saturating_add(if stored_input { STORED_INPUT_TOKENS } else { 0 });
    let beyond = || {
        Refusal::bad(
            "invalid_request_error",
            format!("{limit_field}: the call's largest cost is beyond what agentry can reserve"),
        )
    };
    // A 1-hour cache write (twice the input price) is the dearest input of such a call.
    let reserved_at =
        if provider == Provider::Anthropic && find_object(body, &mut one_hour_cache).is_some() {
            let one_hour = price.one_hour_cache_write().ok_or_else(beyond)?;
            ModelPrice {
                cache_write: Some(one_hour.max(price.cache_write.unwrap_or(price.input))),
                ..price
            }
        } else {
            price
        };
    let reservation = reserved_at.max_cost(input, output).ok_or_else(beyond)?;
    Ok(CallPlan {
        model,
        price,
        reservation,
        unknown_usage: body.get("background").and_then(Value::as_bool) == Some(true),
    })
}

/// `Some` for an OpenAI `item_reference` input item, which the provider replaces by a
/// stored item the gateway cannot see.
fn item_reference(object: &Map<String, Value>) -> Option<()> {
    (object.get("type").and_then(Value::as_str) == Some("item_reference")).then_some(())
}

/// What the gateway passes on of a `POST` body to `route` of `provider`, read once: the body
/// holds at most [`MAX_JSON_VALUES`] ([`json_values_within`], else 413) and is a JSON object
/// ([`json_object`]); its outbound features pass ([`outbound_features`]); for a model call,
/// its rate is priced ([`pricing_options`]) and its plan made ([`plan`]). The parsed body is
/// dropped on return: only the plan outlives it, while the call is reserved and forwarded.
pub fn inspect(
    provider: Provider,
    route: Route,
    headers: &HeaderMap,
    body: &[u8],
    allow_provider_tools: bool,
    prices: &PriceTable,
) -> Result<Option<CallPlan>, Refusal> {
    if !json_values_within(body, MAX_JSON_VALUES) {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "the request body holds more than {MAX_JSON_VALUES} JSON values (an object \
                 counting as {OBJECT_WEIGHT}), the agentry model gateway's limit; it was not \
                 sent"
            ),
        ));
    }
    let object = json_object(body)?;
    outbound_features(provider, headers, Some(&object), allow_provider_tools)?;
    match route {
        Route::Metered => {
            pricing_options(provider, headers, &object)?;
            plan(provider, &object, body.len(), prices).map(Some)
        }
        Route::Free => Ok(None),
    }
}

/// Whether `body` holds at most `limit` JSON values, counted in one pass over its bytes
/// outside strings, before anything is parsed: the first value, then one for each `[` and
/// `,` and [`OBJECT_WEIGHT`] for each `{` (an empty array or object is counted as if it held
/// a value; what is not JSON is counted the same way and refused by the parser after).
pub fn json_values_within(body: &[u8], limit: usize) -> bool {
    let mut count: usize = 1;
    let mut at = 0;
    while let Some(&byte) = body.get(at) {
        at += 1;
        count = match byte {
            b'"' => {
                // Inside a string: on to its closing quote, past escaped characters (most of
                // a large body is a string, such as an image's base 64, skipped at memchr's
                // speed).
                loop {
                    match memchr::memchr2(b'"', b'\\', &body[at.min(body.len())..]) {
                        Some(found) if body[at + found] == b'\\' => at += found + 2,
                        Some(found) => {
                            at += found + 1;
                            break;
                        }
                        // Never closed: the parser refuses it.
                        None => return count <= limit,
                    }
                }
                continue;
            }
            b'[' | b',' => count.saturating_add(1),
            b'{' => count.saturating_add(OBJECT_WEIGHT),
            _ => continue,
        };
        if count > limit {
            return false;
        }
    }
    count <= limit
}

/// `body` as a JSON object, refusing a member named twice in any object (the gateway
/// checks what the provider will read, and two parsers may keep different copies of a
/// duplicated member).
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, Refusal> {
    let refused = |why: String| {
        Refusal::bad(
            "invalid_request_error",
            format!("the body of a request to the model API must be a JSON object: {why}"),
        )
    };
    match serde_json::from_slice::<Strict>(body) {
        Ok(Strict(Value::Object(object))) => Ok(object),
        Ok(_) => Err(refused("it is another JSON value".to_owned())),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// A JSON value whose objects name each member once.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(Strict(value)) = seq.next_element()? {
            out.push(value);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the member {:?} is named twice",
                    excerpt(&key, 60)
                )));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn only_the_listed_endpoints_pass_and_only_by_their_plain_path() {
        use Provider::{Anthropic, OpenAi};
        let (post, get) = (Method::POST, Method::GET);
        for (provider, method, path, expected) in [
            (Anthropic, &post, "/v1/messages", Ok(Route::Metered)),
            (
                Anthropic,
                &post,
                "/v1/messages/count_tokens",
                Ok(Route::Free),
            ),
            (Anthropic, &get, "/v1/models", Ok(Route::Free)),
            (OpenAi, &post, "/v1/responses", Ok(Route::Metered)),
            (OpenAi, &post, "/v1/responses/compact", Ok(Route::Metered)),
            (OpenAi, &get, "/v1/models", Ok(Route::Free)),
            // Other resources and methods: 404.
            (Anthropic, &post, "/v1/responses", Err(404)),
            (Anthropic, &get, "/v1/files", Err(404)),
            (Anthropic, &post, "/v1/messages/batches", Err(404)),
            (Anthropic, &get, "/v1/models/claude-sonnet-5", Err(404)),
            (OpenAi, &get, "/v1/responses", Err(404)),
            (OpenAi, &get, "/v1/responses/resp_123", Err(404)),
            (OpenAi, &post, "/v1/responses/resp_123/cancel", Err(404)),
            (OpenAi, &post, "/v1/files", Err(404)),
            (OpenAi, &post, "/v1/chat/completions", Err(404)),
            (OpenAi, &post, "/v1/images/generations", Err(404)),
            (OpenAi, &post, "/v1/batches", Err(404)),
            (OpenAi, &Method::DELETE, "/v1/models", Err(404)),
            // Paths that are not plain: 400, whatever they would lead to.
            (OpenAi, &get, "/v1/models/../files", Err(400)),
            (OpenAi, &get, "/v1/models/%2e%2e/files", Err(400)),
            (OpenAi, &get, "/v1/models/%2E%2E/files", Err(400)),
            (Anthropic, &post, "/v1//messages", Err(400)),
            (Anthropic, &post, "//v1/messages", Err(400)),
            (Anthropic, &post, "/v1/messages/", Err(400)),
            (Anthropic, &post, "/v1/./messages", Err(400)),
            (Anthropic, &post, "/v1/messages/..", Err(400)),
            (Anthropic, &post, "/v1\\messages", Err(400)),
            (Anthropic, &post, "/v1/%6dessages", Err(400)),
            (Anthropic, &post, "v1/messages", Err(400)),
            (Anthropic, &post, "", Err(400)),
        ] {
            let got = route(provider, method, path).map_err(|r| r.status.as_u16());
            assert_eq!(got, expected, "{provider:?} {method} {path}");
        }
        let refused = route(OpenAi, &post, "/v1/files").unwrap_err();
        assert!(
            refused
                .message
                .contains("POST /v1/responses, POST /v1/responses/compact"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_body_is_one_json_object_naming_each_member_once() {
        let parsed = json_object(br#"{"model": "m", "n": [1, -2, 0.5, true, null, {"a": "b"}]}"#);
        assert_eq!(
            parsed.map(Value::Object),
            Ok(json!({"model": "m", "n": [1, -2, 0.5, true, null, {"a": "b"}]}))
        );
        for bad in [
            &br#"{"tools": [], "tools": [{"type": "web_fetch_20250910"}]}"#[..],
            br#"{"a": {"type": "custom", "type": "web_search"}}"#,
            br#"{"a": [{"x": 1, "x": 1}]}"#,
            br#"[{"model": "m"}]"#,
            br#""text""#,
            br#"{"model": "m""#,
            b"",
            b"\xff",
        ] {
            let refused = json_object(bad).unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(
                refused.message.contains("must be a JSON object"),
                "{}",
                refused.message
            );
        }
        let twice = json_object(br#"{"a": {"type": 1, "type": 2}}"#).unwrap_err();
        assert!(
            twice.message.contains("\"type\" is named twice"),
            "{}",
            twice.message
        );
    }

    #[test]
    fn json_values_are_counted_outside_strings_before_parsing() {
        assert!(json_values_within(b"[0,0,0]", 4));
        assert!(!json_values_within(b"[0,0,0]", 3));
        // An object counts as 16, its members one each after the first.
        assert!(json_values_within(br#"{"a":1,"b":[2]}"#, 19));
        assert!(!json_values_within(br#"{"a":1,"b":[2]}"#, 18));
        // Brackets, braces and commas inside strings, escaped quotes included, count nothing.
        assert!(json_values_within(br#"{"text":"[{,}] \" [[[,,,{{{"}"#, 17));
        assert!(json_values_within(br#""\\""#, 1));
        assert!(!json_values_within(br#"["\\",0]"#, 2));
        let many = format!("[{}0]", "0,".repeat(MAX_JSON_VALUES));
        assert!(!json_values_within(many.as_bytes(), MAX_JSON_VALUES));
        let objects = format!("[{}{{}}]", "{},".repeat(MAX_JSON_VALUES / OBJECT_WEIGHT));
        assert!(!json_values_within(objects.as_bytes(), MAX_JSON_VALUES));
        let text = format!(r#"{{"data":"{}"}}"#, "A,[{".repeat(1_000_000));
        assert!(json_values_within(text.as_bytes(), MAX_JSON_VALUES));
    }

    #[test]
    fn a_call_reserves_every_body_byte_as_input_and_its_output_limit() {
        let prices = PriceTable::builtin();
        // claude-sonnet-5: $2 input, $2.5 cache write, $10 output per million.
        let body = object(json!({"model": "claude-sonnet-5", "max_tokens": 1000, "messages": []}));
        let small = plan(Provider::Anthropic, &body, 400, &prices).unwrap();
        // 400 × $2.5 + 1,000 × $10 per million = $0.011.
        assert_eq!(small.reservation, Usd::parse("0.011").unwrap());
        assert!(!small.unknown_usage);
        // Without a limit: the model's (128,000 by default) = $1.28 of output.
        let body = object(json!({"model": "gpt-6.1-sol", "input": []}));
        let unbounded = plan(Provider::OpenAi, &body, 1000, &prices).unwrap();
        assert_eq!(unbounded.reservation, Usd::parse("1.2825").unwrap());
        // A dated id is priced as its model.
        let body = object(json!({"model": "claude-sonnet-5-20261101", "max_tokens": 1}));
        assert!(plan(Provider::Anthropic, &body, 10, &prices).is_ok());
        // Stored input counts as the largest context; background usage is unknown.
        let body = object(json!({
            "model": "gpt-6.1-sol", "max_output_tokens": 10,
            "previous_response_id": "resp_1", "background": true,
        }));
        let stored = plan(Provider::OpenAi, &body, 100, &prices).unwrap();
        // (2,000,000 + 100) × $2.5 + 10 × $10 per million.
        assert_eq!(stored.reservation, Usd::parse("5.00035").unwrap());
        assert!(stored.unknown_usage);
    }

    #[test]
    fn content_the_provider_would_fetch_or_read_from_storage_is_refused_unless_allowed() {
        use Provider::{Anthropic, OpenAi};
        let none = HeaderMap::new();
        let check = |provider, body: Value, allowed| {
            outbound_features(provider, &none, Some(&object(body)), allowed).map_err(|r| r.message)
        };
        let image = |source: Value| json!({"type": "image", "source": source});
        let url = json!({"type": "url", "url": "https://x.example/?secret=worktree"});
        let file = json!({"type": "file", "file_id": "file_1"});
        // Content carried in the request passes, wherever it is.
        let data = image(json!({"type": "base64", "media_type": "image/png", "data": "AA=="}));
        let pdf = json!({"type": "document", "source": {"type": "text", "data": "t"}});
        let plain = json!({
            "system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": [data, pdf, {"type": "tool_result",
                "tool_use_id": "t", "content": [image(json!({"type": "base64", "data": ""}))]}]}],
        });
        assert_eq!(check(Anthropic, plain, false), Ok(()));
        let inline = json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
            {"type": "input_image", "image_url": "DATA:image/png;base64,AA=="},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,AA=="},
            {"type": "input_text", "text": "https://x.example"},
        ]}, {"type": "computer_call_output", "call_id": "c", "output":
            {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}}]});
        assert_eq!(check(OpenAi, inline, false), Ok(()));
        // Content the provider fetches or reads from storage, at any depth.
        for (provider, body) in [
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [image(url.clone())]}]}),
            ),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [image(file.clone())]}]}),
            ),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "document", "source": url.clone()}
                ]}]}),
            ),
            (
                Anthropic,
                json!({"system": [{"type": "document", "source": file.clone()}]}),
            ),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result",
                    "tool_use_id": "t", "content": [image(url.clone())]}]}]}),
            ),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [image(json!("https://x"))]}]}),
            ),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [
                    {"type": "container_upload", "file_id": "file_1"}
                ]}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"role": "user", "content": [
                    {"type": "input_image", "image_url": "https://x.example/a.png"}
                ]}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"role": "user", "content": [
                    {"type": "input_image", "file_id": "file_1"}
                ]}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": [
                    {"type": "input_file", "file_url": "https://x.example/a.pdf"}
                ]}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"role": "user", "content": [
                    {"type": "input_file", "file_id": "file_1"}
                ]}]}),
            ),
            (
                OpenAi,
                json!({"instructions": "i", "input": [{"role": "user", "content": [
                    {"type": "input_image", "image_url": {"url": "https://x"}}
                ]}]}),
            ),
            // A computer tool's screenshot, by URL or stored file.
            (
                OpenAi,
                json!({"input": [{"type": "computer_call_output", "call_id": "c",
                    "output": {"type": "computer_screenshot", "image_url": "https://x/s.png"}}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"type": "computer_call_output", "call_id": "c",
                    "output": {"type": "computer_screenshot", "file_id": "file_1"}}]}),
            ),
        ] {
            let refused = check(provider, body.clone(), false).unwrap_err();
            assert!(
                refused.contains("allowProviderTools") && refused.contains("fetch a URL"),
                "{body}: {refused}"
            );
            assert_eq!(check(provider, body, true), Ok(()));
        }
    }

    #[test]
    fn an_item_reference_reserves_stored_input() {
        let prices = PriceTable::builtin();
        let body = object(json!({
            "model": "gpt-6.1-sol", "max_output_tokens": 10,
            "input": [{"type": "item_reference", "id": "msg_1"}],
        }));
        let referenced = plan(Provider::OpenAi, &body, 100, &prices).unwrap();
        // (2,000,000 + 100) × $2.5 + 10 × $10 per million.
        assert_eq!(referenced.reservation, Usd::parse("5.00035").unwrap());
        let body = object(json!({
            "model": "gpt-6.1-sol", "max_output_tokens": 10,
            "input": [{"type": "message", "role": "user", "content": "hi"}],
        }));
        let plain = plan(Provider::OpenAi, &body, 100, &prices).unwrap();
        assert_eq!(plain.reservation, Usd::parse("0.00035").unwrap());
    }

    #[test]
    fn a_rate_the_price_table_does_not_hold_is_refused() {
        use Provider::{Anthropic, OpenAi};
        let none = HeaderMap::new();
        let check = |provider, headers: &HeaderMap, body: Value| {
            pricing_options(provider, headers, &object(body)).map_err(|r| (r.code, r.message))
        };
        for (provider, body) in [
            (OpenAi, json!({"model": "gpt-6.1-sol"})),
            (OpenAi, json!({"service_tier": null})),
            (OpenAi, json!({"service_tier": "auto"})),
            (OpenAi, json!({"service_tier": "default"})),
            (OpenAi, json!({"service_tier": "flex"})),
            (Anthropic, json!({"speed": "standard"})),
            (Anthropic, json!({"speed": null})),
            (
                Anthropic,
                json!({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "t",
                       "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}],
                       "tools": [{"name": "Bash", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}),
            ),
        ] {
            assert_eq!(check(provider, &none, body.clone()), Ok(()), "{body}");
        }
        for (provider, body, named) in [
            (
                OpenAi,
                json!({"service_tier": "priority"}),
                "service_tier \"priority\"",
            ),
            (
                OpenAi,
                json!({"service_tier": "scale"}),
                "service_tier \"scale\"",
            ),
            (Anthropic, json!({"speed": "fast"}), "speed \"fast\""),
            (
                Anthropic,
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "t",
                       "cache_control": {"type": "ephemeral", "ttl": "24h"}}]}]}),
                "ttl of \"24h\"",
            ),
            (
                Anthropic,
                json!({"cache_control": {"type": "ephemeral", "ttl": 3600}}),
                "ttl of 3600",
            ),
        ] {
            let (code, message) = check(provider, &none, body.clone()).unwrap_err();
            assert_eq!(code, "tier_not_priced", "{body}");
            assert!(
                message.contains(named) && message.contains("standard rates"),
                "{message}"
            );
        }
        assert_eq!(
            check(OpenAi, &none, json!({"service_tier": 1})).map_err(|e| e.0),
            Err("invalid_request_error")
        );
        // The betas of fast mode and of the long-context premium, among Claude Code's own.
        let mut betas = HeaderMap::new();
        betas.insert(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219,interleaved-thinking-2025-05-14"),
        );
        assert_eq!(check(Anthropic, &betas, json!({})), Ok(()));
        for beta in [
            "context-1m-2025-08-07",
            "fast-mode-2026-02-01",
            "compact-2026-01-12",
        ] {
            let mut more = betas.clone();
            more.append(
                "anthropic-beta",
                HeaderValue::from_str(&format!("oauth-2025-04-20, {beta}")).unwrap(),
            );
            let (code, message) = check(Anthropic, &more, json!({})).unwrap_err();
            assert_eq!(code, "tier_not_priced");
            assert!(message.contains(beta), "{message}");
        }
        // Server-side compaction, asked for in the body: its summarising pass is billed but
        // left out of the usage the gateway meters. Context editing that clears old tool
        // results, and a replayed earlier compaction, are ordinary input.
        let compaction = [
            (
                Anthropic,
                json!({"context_management": {"edits": [{"type": "compact_20260112",
                       "trigger": {"type": "input_tokens", "value": 50000}}]}}),
            ),
            (
                OpenAi,
                json!({"context_management": [{"type": "compaction", "compact_threshold": 1000}]}),
            ),
        ];
        for (provider, body) in compaction {
            let (code, message) = check(provider, &none, body.clone()).unwrap_err();
            assert_eq!(code, "tier_not_priced", "{body}");
            assert!(message.contains("context_management"), "{message}");
        }
        let ordinary = [
            (
                Anthropic,
                json!({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
                       "messages": [{"role": "assistant", "content": [
                           {"type": "compaction", "content": "Summary: ..."}]}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"type": "compaction", "encrypted_content": "..."}]}),
            ),
        ];
        for (provider, body) in ordinary {
            assert_eq!(check(provider, &none, body.clone()), Ok(()), "{body}");
        }
    }

    #[test]
    fn a_one_hour_cache_write_is_reserved_at_twice_the_input_price() {
        let prices = PriceTable::builtin();
        let body = object(
            json!({"model": "claude-sonnet-5", "max_tokens": 1000, "system": [
                {"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ]}),
        );
        let one_hour = plan(Provider::Anthropic, &body, 400, &prices).unwrap();
        // 400 × $4 (2 × $2 input) + 1,000 × $10 per million = $0.0116.
        assert_eq!(one_hour.reservation, Usd::parse("0.0116").unwrap());
        let body = object(
            json!({"model": "claude-sonnet-5", "max_tokens": 1000, "system": [
                {"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "5m"}}
            ]}),
        );
        let five = plan(Provider::Anthropic, &body, 400, &prices).unwrap();
        assert_eq!(five.reservation, Usd::parse("0.011").unwrap());
    }

    #[test]
    fn an_unpriced_model_or_an_unbounded_call_is_refused() {
        let prices = PriceTable::builtin();
        let refused = |body: Value| {
            plan(Provider::Anthropic, &object(body), 10, &prices)
                .map(|p| p.reservation)
                .unwrap_err()
        };
        let unpriced = refused(json!({"model": "claude-free-9", "max_tokens": 10}));
        assert_eq!(
            (unpriced.status, unpriced.code),
            (StatusCode::BAD_REQUEST, "model_not_priced")
        );
        assert!(
            unpriced.message.contains("\"claude-free-9\"")
                && unpriced.message.contains("AGENTRY_PRICES_FILE"),
            "{}",
            unpriced.message
        );
        for body in [
            json!({"max_tokens": 10}),
            json!({"model": "", "max_tokens": 10}),
            json!({"model": 5, "max_tokens": 10}),
            json!({"model": "claude-sonnet-5", "max_tokens": 0}),
            json!({"model": "claude-sonnet-5", "max_tokens": -5}),
            json!({"model": "claude-sonnet-5", "max_tokens": "100"}),
            json!({"model": "claude-sonnet-5", "max_tokens": 1.5}),
        ] {
            assert_eq!(
                refused(body.clone()).status,
                StatusCode::BAD_REQUEST,
                "{body}"
            );
        }
        let huge = refused(json!({"model": "claude-sonnet-5", "max_tokens": u64::MAX}));
        assert!(huge.message.contains("largest cost"), "{}", huge.message);
    }

    #[test]
    fn provider_side_tools_and_their_betas_are_refused_unless_allowed() {
        use Provider::{Anthropic, OpenAi};
        let none = HeaderMap::new();
        let check = |provider, headers: &HeaderMap, body: Value, allowed| {
            outbound_features(provider, headers, Some(&object(body)), allowed)
                .map_err(|r| r.message)
        };
        // What the CLIs send: client tools.
        let claude = json!({"tools": [
            {"name": "Bash", "input_schema": {}},
            {"type": "custom", "name": "Edit", "input_schema": {}},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        ], "mcp_servers": []});
        assert_eq!(check(Anthropic, &none, claude, false), Ok(()));
        let codex = json!({"tools": [
            {"type": "function", "name": "shell"},
            {"type": "custom", "name": "apply_patch"},
            {"type": "local_shell"},
            {"type": "shell"},
            {"type": "shell", "environment": {"type": "local"}},
        ], "input": [{"type": "additional_tools", "tools": [
            {"type": "namespace", "name": "functions", "tools": [
                {"type": "custom", "name": "exec"}, {"type": "function", "name": "wait"}
            ]}
        ]}]});
        assert_eq!(check(OpenAi, &none, codex, false), Ok(()));
        // Provider-side tools, wherever they are offered.
        for (provider, body) in [
            (
                Anthropic,
                json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
            ),
            (
                Anthropic,
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            ),
            (
                Anthropic,
                json!({"tools": [{"type": "code_execution_20250825"}]}),
            ),
            (
                Anthropic,
                json!({"tools": [{"type": "mcp_toolset", "mcp_server_name": "x"}]}),
            ),
            (
                Anthropic,
                json!({"mcp_servers": [{"type": "url", "url": "https://x.example"}]}),
            ),
            (
                Anthropic,
                json!({"mcp_servers": {"url": "https://x.example"}}),
            ),
            (Anthropic, json!({"tools": [{"type": 7}]})),
            (OpenAi, json!({"tools": [{"type": "web_search"}]})),
            (OpenAi, json!({"tools": [{"type": "web_search_preview"}]})),
            (
                OpenAi,
                json!({"tools": [{"type": "mcp", "server_url": "https://x.example"}]}),
            ),
            (OpenAi, json!({"tools": [{"type": "code_interpreter"}]})),
            (OpenAi, json!({"tools": [{"type": "file_search"}]})),
            (OpenAi, json!({"tools": [{"type": "image_generation"}]})),
            (
                OpenAi,
                json!({"input": [{"type": "additional_tools", "tools": [
                    {"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}
                ]}]}),
            ),
            // A shell that runs in a container on OpenAI's servers, wherever it is offered.
            (
                OpenAi,
                json!({"tools": [{"type": "shell", "environment": {
                    "type": "container_auto", "network_policy": {"type": "allowlist"}
                }}]}),
            ),
            (
                OpenAi,
                json!({"tools": [{"type": "shell", "environment": {
                    "type": "container_reference", "container_id": "cntr_1"
                }}]}),
            ),
            (
                OpenAi,
                json!({"tools": [{"type": "shell", "environment": "container_auto"}]}),
            ),
            (
                OpenAi,
                json!({"input": [{"type": "additional_tools", "tools": [
                    {"type": "namespace", "name": "n", "tools": [
                        {"type": "shell", "environment": {"type": "container_auto"}}
                    ]}
                ]}]}),
            ),
        ] {
            let refused = check(provider, &none, body.clone(), false).unwrap_err();
            assert!(refused.contains("allowProviderTools"), "{body}: {refused}");
            assert_eq!(check(provider, &none, body, true), Ok(()));
        }
        // The betas that switch them on, among the ones Claude Code sends.
        let mut betas = HeaderMap::new();
        betas.insert(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219,interleaved-thinking-2025-05-14"),
        );
        assert_eq!(check(Anthropic, &betas, json!({}), false), Ok(()));
        betas.append(
            "anthropic-beta",
            HeaderValue::from_static("context-1m-2025-08-07, web-fetch-2025-09-10"),
        );
        let refused = check(Anthropic, &betas, json!({}), false).unwrap_err();
        assert!(refused.contains("web-fetch-2025-09-10"), "{refused}");
        assert_eq!(check(Anthropic, &betas, json!({}), true), Ok(()));
        assert_eq!(
            outbound_features(Anthropic, &betas, None, false).map_err(|r| r.status),
            Err(StatusCode::BAD_REQUEST)
        );
    }
}
