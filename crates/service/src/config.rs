//! Configuration from environment variables; every one has a default (docs/contract.md#1-running-it).

use std::path::PathBuf;
use std::time::Duration;

use agentry_domain::{AgentType, EgressPattern};
use agentry_persistence::secrets::SecretValue;
use agentry_runner::SandboxMode;

use crate::runs::RunSettings;

pub mod kube;

/// The service's configuration. Its `Debug` never shows a secret: the master key, the
/// webhook secret and the model keys are redacted, and so is a password in the database URL.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// `AGENTRY_DATA_DIR`: SQLite database, admin token file, later workspaces and logs.
    pub data_dir: PathBuf,
    /// `AGENTRY_DATABASE_URL`: `sqlite://PATH` or `postgres://…`.
    pub database_url: String,
    /// `AGENTRY_CODEHOST_API_URL`: the code host's REST base URL (no trailing `/`).
    pub codehost_api_url: String,
    /// `AGENTRY_MASTER_KEY`: base64 of 32 bytes; `None` means the generated key file
    /// `$AGENTRY_DATA_DIR/master.key`. Redacted in `Debug`.
    pub master_key: Option<SecretValue>,
    /// `AGENTRY_ISSUE_SYNC_INTERVAL_SECS`: time between two issue syncs (default 60 s).
    pub issue_sync_interval: Duration,
    /// `AGENTRY_POLL_INTERVAL_SECS`: time between two pull-request polls (default 30 s).
    pub poll_interval: Duration,
    /// `CODEHOST_WEBHOOK_SECRET`: the webhook's shared secret; `None` disables the webhook
    /// endpoint (404 `webhook_disabled`). Redacted in `Debug`.
    pub webhook_secret: Option<SecretValue>,
    /// The orchestrator's settings: `AGENTRY_MAX_CONCURRENT_RUNS`, `AGENTRY_RUN_LEASE_SECS`,
    /// `AGENTRY_RUN_TIME_LIMIT_SECS`, `AGENTRY_AGENT_SANDBOX`, the agents' resource limits
    /// (`AGENTRY_AGENT_TMP_BYTES`, `AGENTRY_AGENT_MAX_*`, `AGENTRY_AGENT_TOTAL_MEMORY_BYTES`),
    /// `AGENTRY_SANDBOX_SECCOMP`, `AGENTRY_SANDBOX_EXTRA_RO` and the agents' user
    /// (`AGENTRY_AGENT_USER`, `AGENTRY_ALLOW_ROOT`), each described on its [`RunSettings`]
    /// field; the settings no variable sets are [`RunSettings::default`]'s.
    pub runs: RunSettings,
    /// `AGENTRY_CLAUDE_BIN`: the Claude Code executable (default `claude`, found on `PATH`).
    pub claude_bin: PathBuf,
    /// `AGENTRY_CODEX_BIN`: the Codex executable (default `codex`).
    pub codex_bin: PathBuf,
    /// `AGENTRY_PRICES_FILE`: a JSON price table merged over the built-in one.
    pub prices_file: Option<PathBuf>,
    /// `AGENTRY_ALERT_WEBHOOK_URL`: where budget alerts are POSTed (https, or http only to
    /// loopback); `None` records them without sending. Shown without its path in `Debug`.
    pub alert_webhook_url: Option<WebhookUrl>,
    /// `AGENTRY_AGENT_ENV`: the names of the service's environment variables passed to
    /// every agent (proxies, CA bundles, base URLs…), besides `PATH`, the run's `HOME` and
    /// the agent's own credentials. Empty by default.
    pub agent_env: Vec<String>,
    /// `AGENTRY_EGRESS_ALLOW`: comma-separated hosts (`pypi.org`), IP addresses and
    /// wildcards (`*.githubusercontent.com`), each with an optional port (`host:8080`,
    /// `[::1]:8080`; 443 only when none), every sandboxed agent may reach through the
    /// egress proxy, besides its repository's `egressAllow`. In normal form, each once.
    /// Empty by default.
    pub egress_allow: Vec<EgressPattern>,
    /// `AGENTRY_ANTHROPIC_UPSTREAM`: where the model gateway sends Anthropic calls (default
    /// `https://api.anthropic.com`; `http` only to a loopback host).
    pub anthropic_upstream: url::Url,
    /// `AGENTRY_OPENAI_UPSTREAM`: where the model gateway sends OpenAI calls (default
    /// `https://api.openai.com/v1`; `http` only to a loopback host).
    pub openai_upstream: url::Url,
    /// `ANTHROPIC_API_KEY` of the service's environment: the gateway's Anthropic key when no
    /// `ANTHROPIC_API_KEY` secret is stored. Redacted in `Debug`.
    pub anthropic_key: Option<SecretValue>,
    /// `OPENAI_API_KEY` (else `CODEX_API_KEY`) of the service's environment: the gateway's
    /// OpenAI key when no `OPENAI_API_KEY` secret is stored. Redacted in `Debug`.
    pub openai_key: Option<SecretValue>,
    /// `AGENTRY_MENTION`: the handle whose mention in a pull-request comment asks for a
    /// revision (docs/contract.md#57-revisions); default `@agentry`.
    pub mention: String,
    /// `AGENTRY_REVISION_QUIET_SECS`: how long after the latest feedback a revision round
    /// starts, so a burst of comments is one round (0 to 3600, default 5).
    pub revision_quiet: Duration,
    /// `AGENTRY_RUNNER` and the Kubernetes runner's settings ([`kube::RunnerKind`]).
    pub runner: kube::RunnerKind,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("database_url", &redacted_url(&self.database_url))
            .field("data_dir", &self.data_dir)
            .field("codehost_api_url", &self.codehost_api_url)
            .field("master_key", &self.master_key)
            .field("issue_sync_interval", &self.issue_sync_interval)
            .field("poll_interval", &self.poll_interval)
            .field("mention", &self.mention)
            .field("revision_quiet", &self.revision_quiet)
            .field("webhook_secret", &self.webhook_secret)
            .field("runs", &self.runs)
            .field("claude_bin", &self.claude_bin)
            .field("codex_bin", &self.codex_bin)
            .field("prices_file", &self.prices_file)
            .field("alert_webhook_url", &self.alert_webhook_url)
            .field("agent_env", &self.agent_env)
            .field("egress_allow", &self.egress_allow)
            .field("anthropic_upstream", &self.anthropic_upstream)
            .field("openai_upstream", &self.openai_upstream)
            .field("anthropic_key", &self.anthropic_key)
            .field("openai_key", &self.openai_key)
            .field("runner", &self.runner)
            .finish()
    }
}

/// `url` with its password, if any, shown as `***` (a URL that does not parse is shown as
/// its scheme only).
fn redacted_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => format!("{}:…", url.split(':').next().unwrap_or("")),
    }
}

/// The longest interval accepted for the periodic loops (one day).
const MAX_INTERVAL_SECS: u64 = 86_400;

/// A configuration variable with a value the service cannot use.
#[derive(Debug, thiserror::Error)]
#[error("{name}: {message}")]
pub struct ConfigError {
    /// The variable.
    pub name: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    /// A `ConfigError` of `name` for any refusal that is only its message.
    pub fn of(name: &'static str) -> impl FnOnce(String) -> ConfigError {
        move |message| ConfigError { name, message }
    }
}

/// A lookup for [`Config::from_lookup`] over fixed `(name, value)` pairs (the last pair of
/// a name counts), for tests and tools that do not read the environment.
pub fn pairs<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        vars.iter()
            .rfind(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

/// A variable that takes one of a few words (blanks around it ignored): the value paired
/// with the word given in `choices`, that of the first word (the default) when unset, or an
/// error naming `name` with the word given (quoted) followed by `refusal`.
pub fn choice<T: Copy>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    choices: &[(&str, T)],
    refusal: &str,
) -> Result<T, ConfigError> {
    let given = get(name);
    let word = given
        .as_deref()
        .map(str::trim)
        .unwrap_or_else(|| choices.first().map_or("", |(w, _)| w));
    choices
        .iter()
        .find(|(w, _)| *w == word)
        .map(|(_, v)| *v)
        .ok_or_else(|| ConfigError {
            name,
            message: format!("{word:?}{refusal}"),
        })
}

/// A variable that is a whole number in `range` (blanks around it ignored): `default` when
/// unset (`value` is `None`), else the number, or an error naming `name` that says
/// "expected `unit` from START to END".
pub(crate) fn whole_number<T>(
    name: &'static str,
    value: Option<String>,
    default: T,
    range: std::ops::RangeInclusive<T>,
    unit: &str,
) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let Some(text) = value else {
        return Ok(default);
    };
    match text.trim().parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(ConfigError {
            name,
            message: format!(
                "{text:?}; expected {unit} from {} to {}",
                range.start(),
                range.end()
            ),
        }),
    }
}

/// A list variable: empty when unset (`value` is `None`), else what `parse` makes of it, its
/// refusal named with `name`.
fn list<T>(
    name: &'static str,
    value: Option<String>,
    parse: impl FnOnce(&str) -> Result<Vec<T>, String>,
) -> Result<Vec<T>, ConfigError> {
    value.map_or(Ok(Vec::new()), |text| {
        parse(&text).map_err(ConfigError::of(name))
    })
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads configuration through `lookup` (the environment, or a map in tests), one
    /// concern after the other: where data lives, the code host, the agents and their runs,
    /// the model gateway and the egress proxy, the alerts and the revisions, the runner.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        // Blank values count as unset, for every variable.
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let (data_dir, database_url) = storage(&get)?;
        let gateway = GatewaySettings::from_lookup(&get)?;
        Ok(Config {
            codehost_api_url: codehost_api_url(&get)?,
            master_key: get("AGENTRY_MASTER_KEY").map(SecretValue::new),
            issue_sync_interval: interval(&get, "AGENTRY_ISSUE_SYNC_INTERVAL_SECS", 60)?,
            poll_interval: interval(&get, "AGENTRY_POLL_INTERVAL_SECS", 30)?,
            webhook_secret: webhook_secret(&get)?,
            runs: run_settings(&get, &data_dir)?,
            claude_bin: program(
                "AGENTRY_CLAUDE_BIN",
                get("AGENTRY_CLAUDE_BIN").unwrap_or_else(|| "claude".into()),
            )?,
            codex_bin: program(
                "AGENTRY_CODEX_BIN",
                get("AGENTRY_CODEX_BIN").unwrap_or_else(|| "codex".into()),
            )?,
            prices_file: get("AGENTRY_PRICES_FILE")
                .map(|p| absolute("AGENTRY_PRICES_FILE", PathBuf::from(p)))
                .transpose()?,
            alert_webhook_url: get("AGENTRY_ALERT_WEBHOOK_URL")
                .map(|text| {
                    WebhookUrl::parse(&text).map_err(ConfigError::of("AGENTRY_ALERT_WEBHOOK_URL"))
                })
                .transpose()?,
            agent_env: list(
                "AGENTRY_AGENT_ENV",
                get("AGENTRY_AGENT_ENV"),
                agent_env_names,
            )?,
            egress_allow: list(
                "AGENTRY_EGRESS_ALLOW",
                get("AGENTRY_EGRESS_ALLOW"),
                egress_patterns,
            )?,
            anthropic_upstream: gateway.anthropic_upstream,
            openai_upstream: gateway.openai_upstream,
            anthropic_key: gateway.anthropic_key,
            openai_key: gateway.openai_key,
            mention: mention(get("AGENTRY_MENTION"))?,
            revision_quiet: Duration::from_secs(whole_number(
                "AGENTRY_REVISION_QUIET_SECS",
                get("AGENTRY_REVISION_QUIET_SECS"),
                5,
                0..=3600,
                "whole seconds",
            )?),
            runner: kube::RunnerKind::from_lookup(&get)?,
            data_dir,
            database_url,
        })
    }
}

/// The data directory (`AGENTRY_DATA_DIR`) and the database URL (`AGENTRY_DATABASE_URL`,
/// by default an SQLite file in it), both absolute: git and the agents run in other working
/// directories, where a relative path would name something else.
fn storage(get: &impl Fn(&str) -> Option<String>) -> Result<(PathBuf, String), ConfigError> {
    let data_dir = absolute(
        "AGENTRY_DATA_DIR",
        PathBuf::from(get("AGENTRY_DATA_DIR").unwrap_or_else(|| "./agentry-data".into())),
    )?;
    let database_url = match get("AGENTRY_DATABASE_URL") {
        None => format!("sqlite://{}", data_dir.join("agentry.db").display()),
        Some(url) => absolute_sqlite_url(url)?,
    };
    agentry_persistence::DatabaseUrl::parse(&database_url).map_err(|e| ConfigError {
        name: "AGENTRY_DATABASE_URL",
        message: e.to_string(),
    })?;
    Ok((data_dir, database_url))
}

/// `AGENTRY_CODEHOST_API_URL` without its trailing `/`: an http(s) base URL, plain http only
/// to this machine (the code-host token travels in every request).
fn codehost_api_url(get: &impl Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    const NAME: &str = "AGENTRY_CODEHOST_API_URL";
    let text = get(NAME).unwrap_or_else(|| "https://api.github.com".into());
    let parsed = url::Url::parse(&text).map_err(|e| ConfigError {
        name: NAME,
        message: format!("{text:?}: {e}"),
    })?;
    if !matches!(parsed.scheme(), "http" | "https")
        || parsed.query().is_some()
        || parsed.host_str().is_none()
    {
        return Err(ConfigError {
            name: NAME,
            message: format!("{text:?} is not an http(s) base URL such as https://api.github.com"),
        });
    }
    if parsed.scheme() == "http" && !is_loopback(&parsed) {
        return Err(ConfigError {
            name: NAME,
            message: format!(
                "{text:?} uses plain http, which would send the code-host token unencrypted; \
                 use https (http is allowed only for 127.0.0.0/8, ::1 and localhost)"
            ),
        });
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// `CODEHOST_WEBHOOK_SECRET`, at least [`MIN_WEBHOOK_SECRET_BYTES`] long when set.
fn webhook_secret(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<SecretValue>, ConfigError> {
    let secret = get("CODEHOST_WEBHOOK_SECRET").map(SecretValue::new);
    if let Some(secret) = &secret
        && secret.expose().len() < MIN_WEBHOOK_SECRET_BYTES
    {
        return Err(ConfigError {
            name: "CODEHOST_WEBHOOK_SECRET",
            message: format!(
                "too short ({} bytes): use at least {MIN_WEBHOOK_SECRET_BYTES} random bytes, \
                 e.g. the output of `openssl rand -hex 32`",
                secret.expose().len()
            ),
        });
    }
    Ok(secret)
}

/// The orchestrator's settings ([`Config::runs`]); what no variable sets keeps
/// [`RunSettings::default`]'s value, declared once there.
fn run_settings(
    get: &impl Fn(&str) -> Option<String>,
    data_dir: &std::path::Path,
) -> Result<RunSettings, ConfigError> {
    let defaults = RunSettings::default();
    let lease = interval(get, "AGENTRY_RUN_LEASE_SECS", defaults.lease.as_secs())?;
    if lease < Duration::from_secs(3) {
        return Err(ConfigError {
            name: "AGENTRY_RUN_LEASE_SECS",
            message: "at least 3 seconds (the lease is renewed every third of it)".into(),
        });
    }
    let sandbox = match get("AGENTRY_AGENT_SANDBOX") {
        None => defaults.sandbox,
        Some(text) => text
            .trim()
            .parse()
            .map_err(|e| ConfigError::of("AGENTRY_AGENT_SANDBOX")(format!("{e}")))?,
    };
    Ok(RunSettings {
        max_concurrent: whole_number(
            "AGENTRY_MAX_CONCURRENT_RUNS",
            get("AGENTRY_MAX_CONCURRENT_RUNS"),
            defaults.max_concurrent,
            0..=64,
            "a whole number",
        )?,
        lease,
        wall_time: interval(
            get,
            "AGENTRY_RUN_TIME_LIMIT_SECS",
            defaults.wall_time.as_secs(),
        )?,
        sandbox,
        agent_limits: agentry_runner::AgentLimits::from_lookup(get)
            .map_err(|(name, message)| ConfigError { name, message })?,
        sandbox_seccomp: choice(
            get,
            "AGENTRY_SANDBOX_SECCOMP",
            &[("on", true), ("off", false)],
            ": expected \"on\" (sandboxed agents get the seccomp filter, the default) or \
             \"off\"",
        )?,
        sandbox_extra_ro: list(
            "AGENTRY_SANDBOX_EXTRA_RO",
            get("AGENTRY_SANDBOX_EXTRA_RO"),
            |text| sandbox_extra_ro(text, data_dir),
        )?,
        agent_user: agent_user(get, sandbox)?,
        ..defaults
    })
}

/// The agents' user (`AGENTRY_AGENT_USER`, `AGENTRY_ALLOW_ROOT`) for this process's user.
fn agent_user(
    get: &impl Fn(&str) -> Option<String>,
    sandbox: SandboxMode,
) -> Result<agentry_runner::user::AgentUser, ConfigError> {
    let allow_root = choice(
        get,
        "AGENTRY_ALLOW_ROOT",
        &[("0", false), ("1", true)],
        ": expected \"1\" (a service run as root runs its agents as root) or \"0\" (the \
         default: they run as AGENTRY_AGENT_USER)",
    )?;
    agentry_runner::user::AgentUser::resolve(
        agentry_runner::user::effective_uid().unwrap_or(u32::MAX),
        get("AGENTRY_AGENT_USER").as_deref().map(str::trim),
        allow_root,
        sandbox == SandboxMode::Auto,
    )
    .map_err(ConfigError::of("AGENTRY_AGENT_USER"))
}

/// The model gateway's upstreams and the service's own model keys.
struct GatewaySettings {
    anthropic_upstream: url::Url,
    openai_upstream: url::Url,
    anthropic_key: Option<SecretValue>,
    openai_key: Option<SecretValue>,
}

impl GatewaySettings {
    /// `AGENTRY_ANTHROPIC_UPSTREAM`, `AGENTRY_OPENAI_UPSTREAM`, `ANTHROPIC_API_KEY` and
    /// `OPENAI_API_KEY` (else `CODEX_API_KEY`).
    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(GatewaySettings {
            anthropic_upstream: upstream(
                "AGENTRY_ANTHROPIC_UPSTREAM",
                get("AGENTRY_ANTHROPIC_UPSTREAM"),
                crate::gateway::DEFAULT_ANTHROPIC_UPSTREAM,
            )?,
            openai_upstream: upstream(
                "AGENTRY_OPENAI_UPSTREAM",
                get("AGENTRY_OPENAI_UPSTREAM"),
                crate::gateway::DEFAULT_OPENAI_UPSTREAM,
            )?,
            anthropic_key: get("ANTHROPIC_API_KEY").map(SecretValue::new),
            openai_key: get("OPENAI_API_KEY")
                .or_else(|| get("CODEX_API_KEY"))
                .map(SecretValue::new),
        })
    }
}

/// `AGENTRY_MENTION`: `@` and a code-host login (default [`DEFAULT_MENTION`]).
fn mention(value: Option<String>) -> Result<String, ConfigError> {
    let Some(text) = value else {
        return Ok(DEFAULT_MENTION.to_owned());
    };
    let handle = text.trim();
    let name = handle.strip_prefix('@').unwrap_or_default();
    if name.is_empty()
        || name.len() > 39
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigError {
            name: "AGENTRY_MENTION",
            message: format!(
                "{text:?}; expected @ and a code-host login (letters, digits, - and _)"
            ),
        });
    }
    Ok(handle.to_owned())
}

/// The mention handle unless `AGENTRY_MENTION` names another.
pub(crate) const DEFAULT_MENTION: &str = "@agentry";

/// A model API upstream: an absolute `https` URL (or `http` to a loopback host, for a
/// local relay or a test fake), without credentials, query or fragment.
fn upstream(
    name: &'static str,
    value: Option<String>,
    default: &str,
) -> Result<url::Url, ConfigError> {
    let text = value.unwrap_or_else(|| default.to_owned());
    let error = |message: String| ConfigError { name, message };
    let url = url::Url::parse(text.trim())
        .map_err(|e| error(format!("{text:?} is not an absolute URL: {e}")))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        _ => {
            return Err(error(format!(
                "{text:?}: expected an https URL (http only to a loopback host)"
            )));
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(error("must not carry credentials".into()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(error("must not have a query or fragment".into()));
    }
    Ok(url)
}

/// The variable names of `AGENTRY_AGENT_ENV`: separated by commas or white space, each an
/// environment variable name (`[A-Za-z_][A-Za-z0-9_]*`), listed once. Refused: `PATH`,
/// `HOME`, `CODEX_HOME` and `CLAUDE_CONFIG_DIR` (agentry sets them, or they follow the run's
/// own `HOME`), agentry's own configuration (`AGENTRY_*`,
/// `CODEHOST_WEBHOOK_SECRET`), and the agents' credentials, which reach the agent that uses
/// them without being listed (listed, they would reach every agent).
/// The paths of `AGENTRY_SANDBOX_EXTRA_RO` (`text`, colon-separated, empty entries
/// skipped): each absolute, none the data directory `data_dir`, in it or holding it (also
/// once symlinks are resolved), none a directory the sandbox replaces itself or one in
/// `/proc` or `/dev` ([`agentry_runner::sandbox::extra_ro_refusal`]; one *in* `/tmp` is
/// accepted: agents see it over their own `/tmp`). One that does not exist is accepted with
/// a warning (it is left out of the sandbox until it does).
fn sandbox_extra_ro(text: &str, data_dir: &std::path::Path) -> Result<Vec<PathBuf>, String> {
    let resolved_data = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    let mut paths = Vec::new();
    for entry in text.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let path = PathBuf::from(entry);
        if !path.is_absolute() {
            return Err(format!("{entry:?} is not an absolute path"));
        }
        let resolved = std::fs::canonicalize(&path).ok();
        let overlaps = |p: &std::path::Path| {
            [data_dir, resolved_data.as_path()]
                .iter()
                .any(|d| p.starts_with(d) || d.starts_with(p))
        };
        if overlaps(&path) || resolved.as_deref().is_some_and(overlaps) {
            return Err(format!(
                "{entry:?} is, holds or lies in the data directory ({}), which agents must \
                 never see",
                data_dir.display()
            ));
        }
        if let Some(why) = agentry_runner::sandbox::extra_ro_refusal(&path).or_else(|| {
            resolved
                .as_deref()
                .and_then(agentry_runner::sandbox::extra_ro_refusal)
        }) {
            return Err(why);
        }
        if resolved.is_none() {
            tracing::warn!(
                path = entry,
                "AGENTRY_SANDBOX_EXTRA_RO names a path that does not exist here; agents will \
                 not see it until it does"
            );
        }
        paths.push(path);
    }
    Ok(paths)
}

fn agent_env_names(text: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    for name in text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|n| !n.is_empty())
    {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "{name:?} is not an environment variable name (letters, digits and _, not \
                 starting with a digit)"
            ));
        }
        let credential = [AgentType::ClaudeCode, AgentType::Codex]
            .into_iter()
            .any(|agent| agentry_runner::agent::api_key_vars(agent).contains(&name));
        let why = if matches!(name, "PATH" | "HOME" | "CODEX_HOME" | "CLAUDE_CONFIG_DIR") {
            Some(
                "agentry sets it for every agent (each run has its own HOME, where agentry reads what Codex records of its spending)",
            )
        } else if name.starts_with("AGENTRY_") || name == "CODEHOST_WEBHOOK_SECRET" {
            Some("it is agentry's own configuration, which agents must not see")
        } else if credential {
            Some("credentials reach the agent that uses them without being listed")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("{name} cannot be passed to agents: {why}"));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// The patterns of `AGENTRY_EGRESS_ALLOW`: separated by commas, blanks around them ignored,
/// each an [`EgressPattern`] (listed once); a bad one is named with why.
fn egress_patterns(text: &str) -> Result<Vec<EgressPattern>, String> {
    let mut patterns: Vec<EgressPattern> = Vec::new();
    for member in text.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let pattern = EgressPattern::parse(member).map_err(|e| format!("{member:?}: {e}"))?;
        if !patterns.contains(&pattern) {
            patterns.push(pattern);
        }
    }
    Ok(patterns)
}

/// `path` made absolute against the current directory (lexically: nothing is read).
fn absolute(name: &'static str, path: PathBuf) -> Result<PathBuf, ConfigError> {
    std::path::absolute(&path).map_err(|e| ConfigError {
        name,
        message: format!("cannot make {} absolute: {e}", path.display()),
    })
}

/// An executable: a bare name stays a name looked up on `PATH`; a path with a directory in
/// it (`./bin/claude`) is made absolute, since agents run in their worktree.
fn program(name: &'static str, value: String) -> Result<PathBuf, ConfigError> {
    let path = PathBuf::from(value);
    if path.components().count() > 1 {
        absolute(name, path)
    } else {
        Ok(path)
    }
}

/// `sqlite://relative/path` made `sqlite:///absolute/path`; other URLs unchanged.
fn absolute_sqlite_url(url: String) -> Result<String, ConfigError> {
    match url.strip_prefix("sqlite://") {
        Some(path)
            if !path.is_empty()
                && !path.starts_with('/')
                && !path.starts_with("file:")
                && !path.starts_with(':') =>
        {
            let path = absolute("AGENTRY_DATABASE_URL", PathBuf::from(path))?;
            Ok(format!("sqlite://{}", path.display()))
        }
        _ => Ok(url),
    }
}

/// The shortest accepted `CODEHOST_WEBHOOK_SECRET`, in bytes.
pub(crate) const MIN_WEBHOOK_SECRET_BYTES: usize = 16;

/// Whether `url`'s host is this machine: `localhost`, 127.0.0.0/8 or `::1`.
pub(crate) fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The budget alerts' outbound webhook (`AGENTRY_ALERT_WEBHOOK_URL`). Its `Debug` and `Display` show only the scheme and host: the
/// path of a chat webhook (Slack's `/services/…`) is itself the credential.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookUrl(url::Url);

impl WebhookUrl {
    /// Parses and checks a webhook URL: `https`, or plain `http` only to this machine
    /// (`localhost`, 127.0.0.0/8, `::1`); no user name or password in it.
    pub fn parse(text: &str) -> Result<WebhookUrl, String> {
        let url = url::Url::parse(text.trim()).map_err(|e| format!("not a URL: {e}"))?;
        if url.host_str().is_none() || !matches!(url.scheme(), "http" | "https") {
            return Err("not an http(s) URL such as https://hooks.slack.com/services/…".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("a user name or password in the URL is not accepted".into());
        }
        if url.scheme() == "http" && !is_loopback(&url) {
            return Err(
                "plain http would send budget figures unencrypted; use https (http is allowed \
                 only for 127.0.0.0/8, ::1 and localhost)"
                    .into(),
            );
        }
        Ok(WebhookUrl(url))
    }

    /// The full URL (it may carry a credential in its path: never log it).
    pub fn expose(&self) -> &url::Url {
        &self.0
    }
}

impl std::fmt::Debug for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookUrl({self})")
    }
}

impl std::fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}://{}/…",
            self.0.scheme(),
            self.0.host_str().unwrap_or("")
        )
    }
}

/// A loop interval in whole seconds, 1 to one day.
fn interval(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default_secs: u64,
) -> Result<Duration, ConfigError> {
    let secs = whole_number(
        name,
        get(name),
        default_secs,
        1..=MAX_INTERVAL_SECS,
        "whole seconds",
    )?;
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_lookup(pairs(vars))
    }

    /// The error of `name` set to `value` alone, checked to name that variable.
    fn refused(name: &str, value: &str) -> ConfigError {
        let e = cfg(&[(name, value)]).unwrap_err();
        assert_eq!(e.name, name, "{value}");
        e
    }

    /// Each `(value, why)` of `cases`, `name` set to `value` alone, is refused with a message
    /// that contains `why`.
    fn assert_refused(name: &str, cases: &[(&str, &str)]) {
        for (bad, why) in cases {
            let e = refused(name, bad);
            assert!(e.message.contains(why), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn a_short_webhook_secret_and_plain_http_off_this_machine_are_refused() {
        let short = cfg(&[("CODEHOST_WEBHOOK_SECRET", "fifteen-bytes!!")]).unwrap_err();
        assert_eq!(short.name, "CODEHOST_WEBHOOK_SECRET");
        assert!(short.to_string().contains("at least 16"), "{short}");
        assert!(
            !short.to_string().contains("fifteen"),
            "the secret is never shown"
        );
        let ok = cfg(&[("CODEHOST_WEBHOOK_SECRET", "sixteen-bytes!!!")]).unwrap();
        assert!(ok.webhook_secret.is_some());
        for url in [
            "http://api.github.com",
            "http://ghe.example/api/v3",
            "http://10.0.0.1:8080",
            "http://[fe80::1]/",
            "http://localhost.evil.example",
        ] {
            let e = refused("AGENTRY_CODEHOST_API_URL", url);
            assert!(e.to_string().contains("https"), "{e}");
        }
        for allowed in [
            "http://127.0.0.1:9",
            "http://127.1.2.3:8080/api",
            "http://[::1]:3000",
            "http://localhost:8080",
            "http://LOCALHOST",
            "https://ghe.example/api/v3",
        ] {
            assert!(
                cfg(&[("AGENTRY_CODEHOST_API_URL", allowed)]).is_ok(),
                "{allowed}"
            );
        }
    }

    #[test]
    fn defaults_run_on_a_fresh_machine() {
        let c = cfg(&[]).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(c.data_dir, cwd.join("agentry-data"));
        assert!(c.data_dir.is_absolute());
        assert_eq!(
            c.database_url,
            format!("sqlite://{}", cwd.join("agentry-data/agentry.db").display())
        );
        assert_eq!(c.codehost_api_url, "https://api.github.com");
        assert_eq!(c.master_key, None);
        assert_eq!(c.issue_sync_interval, Duration::from_secs(60));
        assert_eq!(c.poll_interval, Duration::from_secs(30));
        assert_eq!(c.webhook_secret, None);
        assert_eq!(c.runs.max_concurrent, 2);
        assert_eq!(c.claude_bin, PathBuf::from("claude"));
        assert_eq!(c.codex_bin, PathBuf::from("codex"));
        assert_eq!(c.prices_file, None);
        assert_eq!(c.runs.wall_time, Duration::from_secs(3600));
        assert_eq!(c.runs.lease, Duration::from_secs(60));
        assert_eq!(c.runs.sandbox, SandboxMode::Auto);
        assert_eq!(c.alert_webhook_url, None);
        assert!(c.egress_allow.is_empty());
    }

    #[test]
    fn the_alert_webhook_is_https_or_loopback_and_its_path_is_never_shown() {
        let c = cfg(&[(
            "AGENTRY_ALERT_WEBHOOK_URL",
            "https://hooks.slack.com/services/T0/B0/s3cr3t",
        )])
        .unwrap();
        let url = c.alert_webhook_url.as_ref().unwrap();
        assert_eq!(
            url.expose().as_str(),
            "https://hooks.slack.com/services/T0/B0/s3cr3t"
        );
        assert!(!format!("{c:?}").contains("s3cr3t"));
        for url in [
            "http://hooks.example.com/x",
            "hooks.slack.com/x",
            "ftp://a.example/",
        ] {
            refused("AGENTRY_ALERT_WEBHOOK_URL", url);
        }
        assert!(cfg(&[("AGENTRY_ALERT_WEBHOOK_URL", "http://127.0.0.1:9/hook")]).is_ok());
    }

    #[test]
    fn code_host_settings_are_checked_and_the_master_key_is_never_shown() {
        let c = cfg(&[
            ("AGENTRY_CODEHOST_API_URL", "https://ghe.example/api/v3/"),
            ("AGENTRY_MASTER_KEY", "c2VjcmV0LWtleS1tYXRlcmlhbA=="),
            ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS", "5"),
            ("AGENTRY_POLL_INTERVAL_SECS", "7"),
            ("CODEHOST_WEBHOOK_SECRET", "whsec-shared-secret"),
        ])
        .unwrap();
        assert_eq!(c.poll_interval, Duration::from_secs(7));
        assert!(!format!("{c:?}").contains("whsec"));
        assert_eq!(c.codehost_api_url, "https://ghe.example/api/v3");
        assert_eq!(c.issue_sync_interval, Duration::from_secs(5));
        assert!(!format!("{c:?}").contains("c2VjcmV0"));
        for (name, value) in [
            ("AGENTRY_CODEHOST_API_URL", "ftp://x.example"),
            ("AGENTRY_CODEHOST_API_URL", "not a url"),
            ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS", "0"),
            ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS", "1.5"),
            ("AGENTRY_ISSUE_SYNC_INTERVAL_SECS", "86401"),
            ("AGENTRY_POLL_INTERVAL_SECS", "-1"),
        ] {
            refused(name, value);
        }
    }

    #[test]
    fn the_database_follows_the_data_dir_and_bad_values_are_named() {
        assert_eq!(
            cfg(&[("AGENTRY_DATA_DIR", "/srv/a")]).unwrap().database_url,
            "sqlite:///srv/a/agentry.db"
        );
        refused("AGENTRY_DATABASE_URL", "mysql://x");
    }

    #[test]
    fn runner_settings_are_read_and_checked() {
        let c = cfg(&[
            ("AGENTRY_MAX_CONCURRENT_RUNS", "5"),
            ("AGENTRY_CLAUDE_BIN", "/opt/claude/bin/claude"),
            ("AGENTRY_CODEX_BIN", "codex-nightly"),
            ("AGENTRY_PRICES_FILE", "/etc/agentry/prices.json"),
            ("AGENTRY_RUN_TIME_LIMIT_SECS", "900"),
            ("AGENTRY_RUN_LEASE_SECS", "20"),
            ("AGENTRY_AGENT_SANDBOX", "off"),
        ])
        .unwrap();
        assert_eq!(c.runs.sandbox, SandboxMode::Off);
        assert_eq!(c.runs.agent_limits, agentry_runner::AgentLimits::default());
        assert_eq!(c.runs.max_concurrent, 5);
        assert_eq!(c.claude_bin, PathBuf::from("/opt/claude/bin/claude"));
        assert_eq!(c.codex_bin, PathBuf::from("codex-nightly"));
        assert_eq!(
            c.prices_file,
            Some(PathBuf::from("/etc/agentry/prices.json"))
        );
        assert_eq!(c.runs.wall_time, Duration::from_secs(900));
        assert_eq!(c.runs.lease, Duration::from_secs(20));
        let shown = format!("{c:?}");
        assert!(shown.contains("max_concurrent: 5"), "{shown}");
        assert!(shown.contains("sandbox: Off"), "{shown}");
        for (name, value) in [
            ("AGENTRY_MAX_CONCURRENT_RUNS", "65"),
            ("AGENTRY_MAX_CONCURRENT_RUNS", "-1"),
            ("AGENTRY_MAX_CONCURRENT_RUNS", "two"),
            ("AGENTRY_RUN_TIME_LIMIT_SECS", "0"),
            ("AGENTRY_RUN_LEASE_SECS", "2"),
            ("AGENTRY_AGENT_SANDBOX", "no"),
            ("AGENTRY_AGENT_SANDBOX", "bwrap"),
        ] {
            refused(name, value);
        }
        let blank = cfg(&[("AGENTRY_CLAUDE_BIN", " ")]).unwrap();
        assert_eq!(blank.claude_bin, PathBuf::from("claude"));
    }

    #[test]
    fn relative_paths_become_absolute_and_names_stay_names() {
        let cwd = std::env::current_dir().unwrap();
        let c = cfg(&[
            ("AGENTRY_DATA_DIR", "data"),
            ("AGENTRY_DATABASE_URL", "sqlite://db/agentry.db"),
            ("AGENTRY_CLAUDE_BIN", "./bin/claude"),
            ("AGENTRY_CODEX_BIN", "codex"),
            ("AGENTRY_PRICES_FILE", "prices.json"),
        ])
        .unwrap();
        assert_eq!(c.data_dir, cwd.join("data"));
        assert_eq!(
            c.database_url,
            format!("sqlite://{}", cwd.join("db/agentry.db").display())
        );
        assert_eq!(c.claude_bin, cwd.join("bin/claude"));
        assert_eq!(c.codex_bin, PathBuf::from("codex"));
        assert_eq!(c.prices_file, Some(cwd.join("prices.json")));
        let pg = cfg(&[("AGENTRY_DATABASE_URL", "postgres://u@h/db")]).unwrap();
        assert_eq!(pg.database_url, "postgres://u@h/db");
    }

    /// `AGENTRY_EGRESS_ALLOW` lists patterns separated by commas, normalised and each once;
    /// a bad one is named with the variable and why.
    #[test]
    fn debug_never_shows_the_database_password() {
        let c = cfg(&[(
            "AGENTRY_DATABASE_URL",
            "postgres://agentry:s3cr3t-pw@db.internal/agentry?sslmode=verify-full",
        )])
        .unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t-pw"), "{shown}");
        assert!(
            shown.contains("postgres://agentry:***@db.internal/agentry"),
            "{shown}"
        );
    }

    #[test]
    fn egress_allow_lists_host_patterns() {
        let c = cfg(&[(
            "AGENTRY_EGRESS_ALLOW",
            " PyPI.org , *.githubusercontent.com,,[::1],127.0.0.1, pypi.org , pypi.org:443, \
             PyPI.org:8080, [::1]:8080, *.npmjs.org:8443",
        )])
        .unwrap();
        let shown: Vec<String> = c.egress_allow.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "pypi.org",
                "*.githubusercontent.com",
                "::1",
                "127.0.0.1",
                "pypi.org:8080",
                "[::1]:8080",
                "*.npmjs.org:8443"
            ]
        );
        assert!(
            cfg(&[("AGENTRY_EGRESS_ALLOW", " , ")])
                .unwrap()
                .egress_allow
                .is_empty()
        );
        assert_refused(
            "AGENTRY_EGRESS_ALLOW",
            &[
                (
                    "pypi.org, https://files.pythonhosted.org",
                    "a URL is not a host name",
                ),
                ("pypi.org:0", "\"0\" is not a port"),
                ("pypi.org:https", "\"https\" is not a port"),
                ("*", "would allow every host"),
                ("*.com", "a wildcard must stand for hosts below"),
                ("pypi org", "no white space"),
            ],
        );
        let e = cfg(&[("AGENTRY_EGRESS_ALLOW", "a.org, https://x")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("AGENTRY_EGRESS_ALLOW: \"https://x\": a URL"),
            "{e}"
        );
    }

    /// The agents' resource limits: each variable read, a bad value named with its
    /// variable.
    #[test]
    fn agent_limits_are_read_and_checked() {
        let c = cfg(&[
            ("AGENTRY_AGENT_TMP_BYTES", "256M"),
            ("AGENTRY_AGENT_MAX_PROCESSES", "1024"),
            ("AGENTRY_AGENT_MAX_OPEN_FILES", "8192"),
            ("AGENTRY_AGENT_MAX_FILE_BYTES", "2G"),
            ("AGENTRY_AGENT_MAX_MEMORY_BYTES", "0"),
            ("AGENTRY_AGENT_TOTAL_MEMORY_BYTES", "0"),
        ])
        .unwrap();
        assert_eq!(
            c.runs.agent_limits,
            agentry_runner::AgentLimits {
                tmp_bytes: 256 << 20,
                max_processes: 1024,
                max_open_files: 8192,
                max_file_bytes: 2 << 30,
                max_memory_bytes: 0,
                total_memory_bytes: 0,
            }
        );
        for (name, value) in [
            ("AGENTRY_AGENT_TMP_BYTES", "1K"),
            ("AGENTRY_AGENT_TMP_BYTES", "big"),
            ("AGENTRY_AGENT_MAX_PROCESSES", "8"),
            ("AGENTRY_AGENT_MAX_OPEN_FILES", "many"),
            ("AGENTRY_AGENT_MAX_FILE_BYTES", "-1"),
            ("AGENTRY_AGENT_MAX_MEMORY_BYTES", "4X"),
            ("AGENTRY_AGENT_TOTAL_MEMORY_BYTES", "1M"),
        ] {
            let e = refused(name, value);
            assert!(e.to_string().starts_with(&format!("{name}: ")), "{e}");
        }
    }

    /// `AGENTRY_SANDBOX_SECCOMP` is `on` by default, `off` turns the filter off, anything
    /// else is refused.
    #[test]
    fn the_seccomp_filter_is_on_unless_turned_off() {
        assert!(cfg(&[]).unwrap().runs.sandbox_seccomp);
        for (value, on) in [("on", true), ("off", false)] {
            let c = cfg(&[("AGENTRY_SANDBOX_SECCOMP", value)]).unwrap();
            assert_eq!(c.runs.sandbox_seccomp, on, "{value}");
        }
        for bad in ["0", "false", "auto", "OFF"] {
            refused("AGENTRY_SANDBOX_SECCOMP", bad);
        }
    }

    /// As root, agents run as `nobody` by default, as `AGENTRY_AGENT_USER`, or as root with
    /// `AGENTRY_ALLOW_ROOT=1`; as another user, as that user, and naming an agent user is an
    /// error. `AGENTRY_ALLOW_ROOT` is `1` or `0`.
    #[test]
    fn the_agents_user_follows_the_services() {
        use agentry_runner::user::AgentUser;
        let user = |vars: &[(&str, &str)]| cfg(vars).map(|c| c.runs.agent_user);
        if agentry_runner::user::effective_uid() == Some(0) {
            let nobody = user(&[]).unwrap();
            assert_eq!(nobody.ids().map(|u| u.uid), Some(65534));
            assert_eq!(user(&[("AGENTRY_AGENT_USER", "65534")]).unwrap(), nobody);
            assert_eq!(
                user(&[("AGENTRY_ALLOW_ROOT", "1")]).unwrap(),
                AgentUser::Service
            );
            assert!(matches!(
                user(&[("AGENTRY_AGENT_USER", "no-such-user-here")]).unwrap(),
                AgentUser::Refused(_)
            ));
            assert!(matches!(
                user(&[("AGENTRY_AGENT_SANDBOX", "off")]).unwrap(),
                AgentUser::Refused(_)
            ));
        } else {
            assert_eq!(user(&[]).unwrap(), AgentUser::Service);
            let e = user(&[("AGENTRY_AGENT_USER", "nobody")]).unwrap_err();
            assert_eq!(e.name, "AGENTRY_AGENT_USER");
        }
        for bad in ["true", "yes", "2"] {
            let e = user(&[("AGENTRY_ALLOW_ROOT", bad)]).unwrap_err();
            assert_eq!(e.name, "AGENTRY_ALLOW_ROOT", "{bad}");
        }
    }

    /// `AGENTRY_SANDBOX_EXTRA_RO` with `bad` after a good path, under data dir
    /// `/var/lib/agentry`: the error, which must name the variable.
    #[track_caller]
    fn extra_ro_refused(bad: &str) -> ConfigError {
        let err = cfg(&[
            ("AGENTRY_DATA_DIR", "/var/lib/agentry"),
            ("AGENTRY_SANDBOX_EXTRA_RO", &format!("/opt/toolchain:{bad}")),
        ])
        .unwrap_err();
        assert_eq!(err.name, "AGENTRY_SANDBOX_EXTRA_RO", "{bad}");
        err
    }

    #[test]
    fn sandbox_extra_ro_is_absolute_and_never_the_data_dir() {
        assert!(cfg(&[]).unwrap().runs.sandbox_extra_ro.is_empty());
        let c = cfg(&[
            ("AGENTRY_DATA_DIR", "/var/lib/agentry"),
            ("AGENTRY_SANDBOX_EXTRA_RO", "/opt/toolchain::/nix/store"),
        ])
        .unwrap();
        assert_eq!(
            c.runs.sandbox_extra_ro,
            vec![PathBuf::from("/opt/toolchain"), PathBuf::from("/nix/store")]
        );
        for bad in [
            "relative/dir",
            "/var/lib/agentry",
            "/var/lib",
            "/",
            "/var/lib/agentry/runs",
        ] {
            extra_ro_refused(bad);
        }
        // What the sandbox replaces with its own: refused with the path and why. A path in
        // /tmp, /var/tmp or /run is accepted (agents see it over their own directory).
        for (bad, why) in [
            ("/tmp", "/tmp is /tmp, which the sandbox replaces"),
            (
                "/var/tmp/",
                "/var/tmp/ is /var/tmp, which the sandbox replaces",
            ),
            ("/run", "/run is /run, which the sandbox replaces"),
            (
                "/proc/self",
                "/proc/self lies in /proc, which the sandbox makes afresh",
            ),
            ("/dev/shm", "/dev/shm lies in /dev"),
            (
                "/run/agentry/x",
                "where the sandbox mounts the run's network sockets",
            ),
        ] {
            let err = extra_ro_refused(bad);
            assert!(
                err.message.contains(why) && err.message.contains("agents could never see it"),
                "{bad}: {}",
                err.message
            );
        }
        let c = cfg(&[
            ("AGENTRY_DATA_DIR", "/var/lib/agentry"),
            (
                "AGENTRY_SANDBOX_EXTRA_RO",
                "/tmp/toolchain:/var/tmp/cache:/run/current-system/sw",
            ),
        ])
        .unwrap();
        assert_eq!(c.runs.sandbox_extra_ro.len(), 3);
    }

    /// `AGENTRY_AGENT_ENV` lists the variables passed to agents; agentry's own settings,
    /// `PATH`, `HOME` and credentials cannot be listed, and a bad name is named.
    #[test]
    fn agent_env_lists_variable_names() {
        assert!(cfg(&[]).unwrap().agent_env.is_empty());
        let c = cfg(&[(
            "AGENTRY_AGENT_ENV",
            "HTTPS_PROXY, NO_PROXY\tNODE_EXTRA_CA_CERTS,,HTTPS_PROXY ANTHROPIC_BASE_URL",
        )])
        .unwrap();
        assert_eq!(
            c.agent_env,
            [
                "HTTPS_PROXY",
                "NO_PROXY",
                "NODE_EXTRA_CA_CERTS",
                "ANTHROPIC_BASE_URL"
            ]
        );
        assert_refused(
            "AGENTRY_AGENT_ENV",
            &[
                ("PATH", "agentry sets it"),
                ("HOME", "agentry sets it"),
                ("CODEX_HOME", "agentry sets it"),
                ("AGENTRY_MASTER_KEY", "agentry's own configuration"),
                ("CODEHOST_WEBHOOK_SECRET", "agentry's own configuration"),
                ("OPENAI_API_KEY", "credentials reach the agent"),
                ("1BAD", "not an environment variable name"),
                ("A-B", "not an environment variable name"),
            ],
        );
    }
}
