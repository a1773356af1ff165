//! `agentry doctor`: what an agent run needs, checked one thing at a time, each answer with
//! its fix (docs/contract.md#1-running-it). A command beside the service, not part of it: it
//! reads the service's configuration and asks the runner, the database and the code host,
//! and the service never calls it.
//!
//! [`diagnose`] reads the same [`Config`] as `agentry serve` and checks git, the agents'
//! sandbox, each agent CLI (found and of a supported version), the credentials of the
//! agents the connected repositories use, how many agent runs this process takes, the
//! database, the code-host token (stored, and accepted by the code host) and the prices of
//! the Codex models in use. A [`Check`] that fails ([`Status::Fail`]) means no run can
//! succeed as configured; a warning means something works differently than it might
//! ([`Report::can_run`]).
//!
//! It changes nothing: it creates no data directory, database, master key or temporary
//! file under the data directory, and applies no migration. On a database that exists,
//! reading its migration state creates diesel's bookkeeping table if it is missing, as
//! `agentry migrate` and `/readyz` do; opening an SQLite database may create its `-wal` and
//! `-shm` files beside it.

use agentry_runner::user::{AgentUser, effective_uid};
use agentry_service::config::kube::{KubeSettings, RunnerKind};
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentry_codehost::ClientConfig;
use agentry_domain::AgentType;
use agentry_domain::quote::{excerpt, one_line};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::secrets::{self, MasterKey, SecretValue};
use agentry_persistence::{AnyConnection, DatabaseUrl};
use agentry_runner::agent::{self, Launch, ServiceEnv};
use agentry_runner::process::helper_output;
use agentry_runner::sandbox::search_path;
use agentry_runner::version::{self, CliProblem};
use agentry_runner::{PriceTable, Sandbox, SandboxMode};

use agentry_service::ServiceError;
use agentry_service::codehost::{CodeHost, TOKEN_SECRET, Timing};
use agentry_service::config::{Config, ConfigError};

/// How long `git --version` may take.
const GIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one attempt to ask the code host about the token may take.
const CODEHOST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most characters of a program's output or an error quoted in a line.
const QUOTED_CHARS: usize = 300;

/// How to store the code-host token, the fix of every missing or refused token.
const STORE_TOKEN: &str = "store a GitHub token on the Settings page of `agentry serve`, or \
                           with PUT /api/secrets/CODEHOST_TOKEN (it is checked with GET /user \
                           before it is stored)";

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// What runs need is there.
    Ok,
    /// Runs can succeed, but something is not as it might be.
    Warn,
    /// No run can succeed until this is fixed.
    Fail,
}

impl Status {
    /// How the status is printed: `ok`, `warn` or `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One check: what was looked at, what was found and, when it is not fine, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// A short name (`git`, `sandbox`, `claude-code`, `database`…).
    pub name: String,
    /// The outcome.
    pub status: Status,
    /// What was found, one sentence. Never a secret's value.
    pub detail: String,
    /// What to do about it, when there is something to do.
    pub fix: Option<String>,
}

impl Check {
    /// A check that passed.
    pub fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check {
            name: name.to_owned(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A check that passed with a warning, and its fix.
    pub fn warn(name: &str, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            name: name.to_owned(),
            status: Status::Warn,
            detail: detail.into(),
            fix,
        }
    }

    /// A check that failed, and its fix.
    pub fn fail(name: &str, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            name: name.to_owned(),
            status: Status::Fail,
            detail: detail.into(),
            fix,
        }
    }
}

impl fmt::Display for Check {
    /// One line: status, name, detail, and `— fix: …` when there is one. Line breaks and
    /// other control characters in the texts become spaces, so a check is always one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<5} {:<16} {}",
            self.status.as_str(),
            one_line(&self.name),
            one_line(&self.detail)
        )?;
        if let Some(fix) = &self.fix {
            write!(f, " — fix: {}", one_line(fix))?;
        }
        Ok(())
    }
}

/// Every check of one diagnosis, in the order they are printed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether an agent run can succeed as configured: no check failed.
    pub fn can_run(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The report of a configuration that cannot be read: one failed check naming the
    /// variable (`agentry serve` would not start either).
    pub fn config_error(error: &ConfigError) -> Report {
        Report {
            checks: vec![Check::fail(
                "config",
                error.to_string(),
                Some(format!(
                    "correct or unset {} (README.md, Configuration)",
                    error.name
                )),
            )],
        }
    }
}

impl fmt::Display for Report {
    /// One line per check ([`Check`]'s `Display`), each ending with a line break.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            writeln!(f, "{check}")?;
        }
        Ok(())
    }
}

/// Checks what an agent run needs under `config`, with the agents' credentials and the
/// variables of `AGENTRY_AGENT_ENV` read from this process's environment (as `agentry
/// serve` reads them). Changes nothing (see the [module docs](self)).
pub async fn diagnose(config: &Config) -> Report {
    let env = ServiceEnv::read(&config.agent_env, |name| std::env::var(name).ok());
    diagnose_with(config, &env).await
}

/// [`diagnose`] with the service environment `env` (`PATH` and credentials).
pub async fn diagnose_with(config: &Config, env: &ServiceEnv) -> Report {
    let key = master_key(config);
    let stored = {
        let config = config.clone();
        let key = key.as_ref().ok().cloned();
        tokio::task::spawn_blocking(move || read_database(&config, key.as_ref()))
            .await
            .unwrap_or_else(|e| Stored::unreadable(format!("reading the database failed: {e}")))
    };
    let agents = Agents::of(stored.repos.as_deref());
    let (git, sandbox, claude, codex, codehost) = tokio::join!(
        check_git(env.path.as_deref()),
        check_sandbox(config.runs.sandbox),
        check_cli(AgentType::ClaudeCode, &config.claude_bin, env, &agents),
        check_cli(AgentType::Codex, &config.codex_bin, env, &agents),
        check_codehost(config, &key, &stored.token),
    );
    let kube = match &config.runner {
        RunnerKind::Kubernetes(settings) => Some(settings),
        RunnerKind::Local => None,
    };
    // With the Kubernetes runner the agents, their CLIs and their sandbox are the pods'.
    let mut checks = match kube {
        Some(settings) => vec![git, check_kubernetes(settings).await],
        None => vec![git, sandbox, claude, codex],
    };
    for agent in [AgentType::ClaudeCode, AgentType::Codex] {
        if agents.required(agent) {
            checks.push(match config.runs.sandbox {
                _ if kube.is_some() => check_gateway_key(agent, config, &stored.secrets),
                SandboxMode::Auto => check_gateway_key(agent, config, &stored.secrets),
                SandboxMode::Off => check_credentials(agent, env),
            });
        }
    }
    if agents.required(AgentType::ClaudeCode)
        && let Some(check) = check_claude_telemetry(env)
    {
        checks.push(check);
    }
    if agents.required(AgentType::Codex)
        && let Some(check) = check_codex_home(&config.data_dir, &std::env::temp_dir())
    {
        checks.push(check);
    }
    checks.push(check_runner(config.runs.max_concurrent));
    if let Some(check) = check_user(
        effective_uid(),
        &config.runs.agent_user,
        config.runs.max_concurrent,
    ) {
        checks.push(check);
    }
    checks.push(stored.database);
    checks.push(codehost);
    checks.push(check_prices(
        agentry_service::start::price_table(config).map_err(|e| e.to_string()),
        config.prices_file.as_deref(),
        stored.repos.as_deref().unwrap_or_default(),
    ));
    Report { checks }
}

/// What the Kubernetes runner needs of its cluster ([`agentry_runner::kube::check_cluster`]):
/// the API, the namespace of `settings` and the permissions there.
async fn check_kubernetes(settings: &KubeSettings) -> Check {
    const NAME: &str = "kubernetes";
    let problems = agentry_runner::kube::check_cluster(&settings.namespace).await;
    if problems.is_empty() {
        Check::ok(
            NAME,
            format!(
                "the API answers and agentry may run Jobs in the namespace {} (image {})",
                settings.namespace, settings.image
            ),
        )
    } else {
        Check::fail(
            NAME,
            problems.join("; "),
            Some(
                "install the chart with runner.kind=kubernetes (it grants the Role), or check \
                 KUBECONFIG and AGENTRY_KUBE_NAMESPACE"
                    .to_owned(),
            ),
        )
    }
}

/// The name of `agent` in a report: `claude-code` or `codex`.
fn agent_name(agent: AgentType) -> &'static str {
    agent.as_str()
}

/// Which agents the connected repositories use, and why each is or is not needed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Agents {
    /// The required agents, each with the reason.
    required: Vec<(AgentType, String)>,
}

impl Agents {
    /// The agents of `repos` (the connected repositories; `None` when they could not be
    /// read); Claude Code, the default agent, when there is none.
    fn of(repos: Option<&[Repository]>) -> Agents {
        let Some(repos) = repos else {
            return Agents {
                required: vec![(
                    AgentType::ClaudeCode,
                    "the default agent (the connected repositories could not be read)".into(),
                )],
            };
        };
        if repos.is_empty() {
            return Agents {
                required: vec![(
                    AgentType::ClaudeCode,
                    "the default agent; no repository is connected yet".into(),
                )],
            };
        }
        let required = [AgentType::ClaudeCode, AgentType::Codex]
            .into_iter()
            .filter_map(|agent| {
                let n = repos
                    .iter()
                    .filter(|r| r.settings.agent_type == agent)
                    .count();
                (n > 0).then(|| (agent, format!("used by {}", repositories(n))))
            })
            .collect();
        Agents { required }
    }

    fn required(&self, agent: AgentType) -> bool {
        self.why(agent).is_some()
    }

    fn why(&self, agent: AgentType) -> Option<&str> {
        self.required
            .iter()
            .find(|(a, _)| *a == agent)
            .map(|(_, why)| why.as_str())
    }
}

/// `1 repository`, `2 repositories`.
fn repositories(n: usize) -> String {
    if n == 1 {
        "1 repository".into()
    } else {
        format!("{n} repositories")
    }
}

/// `git --version`, with the `git` of `path` (the service's `PATH`), which the agents'
/// workspaces use.
async fn check_git(path: Option<&str>) -> Check {
    const NAME: &str = "git";
    let fix = Some("install git (Debian: apt-get install git) on the service's PATH".to_owned());
    let Some(git) = search_path(OsStr::new("git"), OsStr::new(path.unwrap_or_default())) else {
        return Check::fail(
            NAME,
            format!(
                "git was not found on PATH ({})",
                path.unwrap_or("PATH is not set")
            ),
            fix,
        );
    };
    match version_output(&git).await {
        Ok(text) if text.trim().starts_with("git version") => {
            Check::ok(NAME, format!("{} ({})", text.trim(), git.display()))
        }
        Ok(text) => Check::fail(
            NAME,
            format!(
                "{} --version printed {:?}, not a git version",
                git.display(),
                quote(&text)
            ),
            fix,
        ),
        Err(e) => Check::fail(
            NAME,
            format!("{} --version failed: {e}", git.display()),
            fix,
        ),
    }
}

/// What `program --version` prints on stdout, within [`GIT_TIMEOUT`].
async fn version_output(program: &Path) -> Result<String, String> {
    let mut command = tokio::process::Command::new(program);
    command
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let output = helper_output(&mut command, GIT_TIMEOUT)
        .await
        .map_err(|failure| failure.to_string())?;
    match output.status {
        Ok(status) if status.success() => Ok(output.stdout),
        Ok(status) => Err(format!("{status}")),
        Err(e) => Err(format!("waiting for it: {e}")),
    }
}

/// The agents' sandbox as `AGENTRY_AGENT_SANDBOX` sets it: in `auto`, whether bubblewrap
/// works here (the probe the runner makes before its first agent).
async fn check_sandbox(mode: SandboxMode) -> Check {
    const NAME: &str = "sandbox";
    match mode {
        SandboxMode::Off => Check::warn(
            NAME,
            "AGENTRY_AGENT_SANDBOX=off: agents run unsandboxed as the service's user",
            Some(
                "install bubblewrap (apt-get install bubblewrap) and unset \
                 AGENTRY_AGENT_SANDBOX (docs/security.md)"
                    .into(),
            ),
        ),
        SandboxMode::Auto => match Sandbox::new(SandboxMode::Auto).launcher().await {
            Ok(bwrap) => {
                let bwrap =
                    bwrap.unwrap_or_else(|| PathBuf::from(agentry_runner::sandbox::DEFAULT_BWRAP));
                Check::ok(NAME, format!("bubblewrap works ({})", bwrap.display()))
            }
            // The runner's message names its fix.
            Err(message) => Check::fail(NAME, message, None),
        },
    }
}

/// `agent`'s CLI: found, and a supported version ([`version::check`], run as the runner
/// runs it: the service's `PATH`, a fresh `HOME`, nothing else of the environment).
async fn check_cli(agent: AgentType, program: &Path, env: &ServiceEnv, agents: &Agents) -> Check {
    let home = match tempfile::Builder::new().prefix("agentry-doctor-").tempdir() {
        Ok(home) => home,
        Err(e) => {
            return Check::fail(
                agent_name(agent),
                format!("cannot create a temporary HOME to ask its version: {e}"),
                Some("make the temporary directory (TMPDIR or /tmp) writable".into()),
            );
        }
    };
    let cli_env = agent::environment(
        agent,
        Launch::default(),
        home.path(),
        &ServiceEnv {
            path: env.path.clone(),
            ..ServiceEnv::default()
        },
    );
    let result = version::check(agent, program, &cli_env).await;
    drop(home);
    cli_check(agent, result, agents.why(agent))
}

/// The check of `agent`'s CLI from what [`version::check`] found; `why` is why the agent
/// is needed (`None`: no connected repository uses it, so a problem is only a warning).
fn cli_check(
    agent: AgentType,
    result: Result<version::Found, CliProblem>,
    why: Option<&str>,
) -> Check {
    let name = agent_name(agent);
    let supported = version::supported(agent);
    let why_text = why.map_or_else(
        || format!("no connected repository uses {}", supported.name),
        str::to_owned,
    );
    match result {
        Ok(found) if found.version == supported.tested => Check::ok(
            name,
            format!("{} ({}); {why_text}", found.version, found.path.display()),
        ),
        Ok(found) => Check::ok(
            name,
            format!(
                "{} ({}): newer than the tested {}, within the supported range {}; {why_text}",
                found.version,
                found.path.display(),
                supported.tested,
                supported.range()
            ),
        ),
        Err(problem) => {
            let (detail, fix) = match problem {
                CliProblem::NotFound {
                    name,
                    detail,
                    install,
                    variable,
                } => (
                    format!("the {name} CLI was not found ({detail})"),
                    format!("{install}, or set {variable} to its path"),
                ),
                CliProblem::Broken {
                    name,
                    path,
                    detail,
                    install,
                } => (
                    format!("the {name} CLI at {path} did not report its version ({detail})"),
                    format!("reinstall it: {install}"),
                ),
                CliProblem::Unsupported {
                    name,
                    path,
                    version,
                    range,
                    install,
                } => (
                    format!(
                        "the {name} CLI at {path} is version {version}, which agentry does not \
                         support (supported: {range})"
                    ),
                    format!("install a supported version: {install}"),
                ),
            };
            let detail = format!("{detail}; {why_text}");
            if why.is_some() {
                Check::fail(name, detail, Some(fix))
            } else {
                Check::warn(name, detail, Some(fix))
            }
        }
    }
}

/// Whether one of `agent`'s credential variables is set for the service (names only; a
/// value is never shown).
fn check_credentials(agent: AgentType, env: &ServiceEnv) -> Check {
    let name = match agent {
        AgentType::ClaudeCode => "claude-code-key",
        AgentType::Codex => "codex-key",
    };
    let vars = agent::api_key_vars(agent);
    let set: Vec<&str> = vars
        .iter()
        .copied()
        .filter(|var| env.credentials.iter().any(|(k, _)| k == var))
        .collect();
    if set.is_empty() {
        let first = vars.first().copied().unwrap_or("the API key");
        Check::fail(
            name,
            format!(
                "{} has no credentials: none of {} is set in this environment",
                version::supported(agent).name,
                vars.join(", ")
            ),
            Some(format!(
                "export {first}=… in the environment of `agentry serve`"
            )),
        )
    } else {
        Check::ok(name, format!("{} is set", set.join(", ")))
    }
}

/// Sandboxed agents hold no key: the model gateway needs `agent`'s provider key, a stored
/// secret or the service's variable (names only; a value is never shown).
fn check_gateway_key(agent: AgentType, config: &Config, stored: &[String]) -> Check {
    let (name, secret, from_env) = match agent {
        AgentType::ClaudeCode => (
            "claude-code-key",
            agentry_agent_network::gateway::ANTHROPIC_KEY,
            config.anthropic_key.is_some(),
        ),
        AgentType::Codex => (
            "codex-key",
            agentry_agent_network::gateway::OPENAI_KEY,
            config.openai_key.is_some(),
        ),
    };
    if stored.iter().any(|s| s == secret) {
        Check::ok(
            name,
            format!("the model gateway's key is the stored secret {secret}"),
        )
    } else if from_env {
        Check::ok(
            name,
            format!("the model gateway's key is {secret} of this environment (no secret stored)"),
        )
    } else {
        Check::fail(
            name,
            format!(
                "the model gateway has no key for {}: no secret {secret} is stored and it is \
                 not set in this environment; the agent's calls would be refused",
                version::supported(agent).name
            ),
            Some(format!(
                "PUT /api/secrets/{secret} with the key, or export {secret}=… for `agentry serve`"
            )),
        )
    }
}

/// The variables that make Claude Code 2.1.197 print no `result` event on `SIGINT`, so that
/// a cancelled or timed-out run's cost is lost: a warning when `AGENTRY_AGENT_ENV` passes one.
fn check_claude_telemetry(env: &ServiceEnv) -> Option<Check> {
    const SILENCING: [&str; 2] = [
        "DISABLE_TELEMETRY",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    ];
    let passed: Vec<&str> = SILENCING
        .into_iter()
        .filter(|name| env.passed(name).is_some())
        .collect();
    if passed.is_empty() {
        return None;
    }
    Some(Check::warn(
        "claude-code-stop",
        format!(
            "{} reaches Claude Code (AGENTRY_AGENT_ENV): with it, a stopped run prints no \
             result event, so a cancelled or timed-out run's cost is unknown",
            passed.join(" and ")
        ),
        Some(format!(
            "remove {} from AGENTRY_AGENT_ENV unless less telemetry is worth that",
            passed.join(" and ")
        )),
    ))
}

/// Codex refuses to create its helper binaries (`apply_patch`) when its home is under the
/// temporary directory, which a run's `HOME` is when the data directory lies there.
fn check_codex_home(data_dir: &Path, temp: &Path) -> Option<Check> {
    let temp = std::fs::canonicalize(temp).unwrap_or_else(|_| temp.to_owned());
    let data = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    data.starts_with(&temp).then(|| {
        Check::warn(
            "codex-home",
            format!(
                "the data directory {} is under the temporary directory {}: Codex refuses to \
                 create its helper binaries there (its apply_patch command fails)",
                data_dir.display(),
                temp.display()
            ),
            Some("set AGENTRY_DATA_DIR to a directory outside it".into()),
        )
    })
}

/// A service run as root: its agents run as another user (ok), as root because
/// `AGENTRY_ALLOW_ROOT=1` (a warning), or are refused (a failure with the reason).
fn check_user(uid: Option<u32>, user: &AgentUser, max_concurrent: usize) -> Option<Check> {
    const NAME: &str = "user";
    if uid != Some(0) || max_concurrent == 0 {
        return None;
    }
    Some(match user {
        AgentUser::Switch(ids) => Check::ok(
            NAME,
            format!(
                "agentry runs as root; its agents run as {} (uid {})",
                ids.name, ids.uid
            ),
        ),
        AgentUser::Service => Check::warn(
            NAME,
            "agentry runs as root and AGENTRY_ALLOW_ROOT=1, so its agents do too: inside the \
             sandbox they hold no capabilities, but they read what root owns (such as \
             /etc/shadow) and the process limit does not apply to them",
            Some("run `agentry serve` as a user of its own (docs/security.md)".into()),
        ),
        AgentUser::Refused(why) => Check::fail(NAME, why.clone(), None),
    })
}

/// How many agent runs this process takes at once (`AGENTRY_MAX_CONCURRENT_RUNS`).
fn check_runner(max_concurrent: usize) -> Check {
    const NAME: &str = "runner";
    if max_concurrent == 0 {
        Check::warn(
            NAME,
            "AGENTRY_MAX_CONCURRENT_RUNS=0: this process runs no agents (tasks wait for a \
             replica that does)",
            Some(
                "set AGENTRY_MAX_CONCURRENT_RUNS to 1 or more on a replica that runs agents".into(),
            ),
        )
    } else {
        Check::ok(NAME, format!("up to {max_concurrent} agent runs at once"))
    }
}

/// Why the master key cannot be had.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyProblem {
    /// Neither `AGENTRY_MASTER_KEY` nor the key file: `agentry serve` has not run yet.
    Missing(PathBuf),
    /// There is one, and it cannot be used.
    Bad(String),
}

/// The master key of `config`, without creating one: `AGENTRY_MASTER_KEY`, else the key
/// file, read if it exists.
fn master_key(config: &Config) -> Result<MasterKey, KeyProblem> {
    if let Some(text) = &config.master_key {
        return MasterKey::from_base64(text.expose())
            .map_err(|e| KeyProblem::Bad(format!("AGENTRY_MASTER_KEY is not a usable key ({e})")));
    }
    let path = config.data_dir.join("master.key");
    match std::fs::read_to_string(&path) {
        Ok(text) => MasterKey::from_base64(&text).map_err(|e| {
            KeyProblem::Bad(format!(
                "the key file {} is not a usable key ({e})",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(KeyProblem::Missing(path)),
        Err(e) => Err(KeyProblem::Bad(format!(
            "cannot read the key file {}: {e}",
            path.display()
        ))),
    }
}

/// What was read from the database.
struct Stored {
    /// The database's own check.
    database: Check,
    /// The connected repositories; `None` when they could not be read.
    repos: Option<Vec<Repository>>,
    /// The stored code-host token (`None`: none stored); `Err` when it could not be read.
    token: Result<Option<SecretValue>, String>,
    /// The names of the stored secrets (the model gateway's keys among them).
    secrets: Vec<String>,
}

impl Stored {
    fn unreadable(detail: String) -> Stored {
        Stored {
            database: Check::fail("database", detail.clone(), None),
            repos: None,
            token: Err(detail),
            secrets: Vec::new(),
        }
    }
}

/// The database's address without a user name, password or query: what may be shown.
fn shown_url(url: &DatabaseUrl) -> String {
    match url {
        DatabaseUrl::Sqlite(path) => format!("sqlite://{path}"),
        DatabaseUrl::Postgres(text) => match url::Url::parse(text) {
            Ok(u) => format!(
                "{}://{}{}{}",
                u.scheme(),
                u.host_str().unwrap_or_default(),
                u.port().map(|p| format!(":{p}")).unwrap_or_default(),
                u.path()
            ),
            Err(_) => "the PostgreSQL database of AGENTRY_DATABASE_URL".into(),
        },
    }
}

/// Opens the database of `config` without creating or migrating it, and reads the
/// migration state, the connected repositories and (with `key`) the stored token.
fn read_database(config: &Config, key: Option<&MasterKey>) -> Stored {
    const NAME: &str = "database";
    let url = match DatabaseUrl::parse(&config.database_url) {
        Ok(url) => url,
        Err(e) => return Stored::unreadable(format!("AGENTRY_DATABASE_URL: {e}")),
    };
    let shown = shown_url(&url);
    if let DatabaseUrl::Sqlite(path) = &url
        && !path.starts_with("file:")
        && !path.starts_with(':')
        && !Path::new(path).exists()
    {
        return Stored {
            database: Check::warn(
                NAME,
                format!("no database yet at {path}"),
                Some("start `agentry serve` (or run `agentry migrate`), which creates it".into()),
            ),
            repos: Some(Vec::new()),
            token: Ok(None),
            secrets: Vec::new(),
        };
    }
    let mut conn = match url.connect() {
        Ok(conn) => conn,
        Err(e) => {
            let fix = match url {
                DatabaseUrl::Sqlite(_) => {
                    "check AGENTRY_DATABASE_URL (or AGENTRY_DATA_DIR) and that the file is \
                     readable and writable by the service's user"
                }
                DatabaseUrl::Postgres(_) => {
                    "check AGENTRY_DATABASE_URL, and that the server runs and accepts this user"
                }
            };
            let detail = format!("{shown}: cannot connect: {}", quote(&e.to_string()));
            return Stored {
                database: Check::fail(NAME, detail, Some(fix.into())),
                repos: None,
                token: Err("the database cannot be reached".into()),
                secrets: Vec::new(),
            };
        }
    };
    read_stored(&mut conn, &shown, key)
}

/// [`read_database`] once connected.
fn read_stored(conn: &mut AnyConnection, shown: &str, key: Option<&MasterKey>) -> Stored {
    const NAME: &str = "database";
    let pending = match agentry_persistence::meta::pending_migrations(conn) {
        Ok(pending) => pending,
        Err(e) => {
            let detail = format!(
                "{shown}: cannot read its migration state: {}",
                quote(&e.to_string())
            );
            return Stored {
                database: Check::fail(NAME, detail.clone(), None),
                repos: None,
                token: Err(detail),
                secrets: Vec::new(),
            };
        }
    };
    let repos = repos::list_connected(conn);
    let token = match key {
        Some(key) => secrets::get(conn, key, TOKEN_SECRET).map_err(|e| e.to_string()),
        None => Ok(None),
    };
    let database = match (&repos, pending.is_empty()) {
        (Ok(list), true) => Check::ok(
            NAME,
            format!(
                "{shown}: schema up to date, {} connected",
                repositories(list.len())
            ),
        ),
        (Err(e), true) => Check::fail(
            NAME,
            format!(
                "{shown}: cannot read the connected repositories: {}",
                quote(&e.to_string())
            ),
            None,
        ),
        (_, false) => Check::warn(
            NAME,
            format!(
                "{shown}: {} pending migration(s) ({})",
                pending.len(),
                pending.join(", ")
            ),
            Some("run `agentry migrate`, or start `agentry serve`, which applies them".into()),
        ),
    };
    let secrets = secrets::list(conn)
        .map(|list| list.into_iter().map(|s| s.name).collect())
        .unwrap_or_default();
    Stored {
        database,
        repos: repos.ok(),
        token,
        secrets,
    }
}

/// The code-host token: the master key loads, a token is stored, and the code host
/// accepts it (`GET /user`, as when it is stored).
async fn check_codehost(
    config: &Config,
    key: &Result<MasterKey, KeyProblem>,
    token: &Result<Option<SecretValue>, String>,
) -> Check {
    const NAME: &str = "code-host";
    match key {
        Ok(_) => {}
        Err(KeyProblem::Missing(path)) => {
            return Check::fail(
                NAME,
                format!(
                    "no code-host token can be stored yet: there is no master key \
                     (AGENTRY_MASTER_KEY is unset and {} does not exist)",
                    path.display()
                ),
                Some(format!(
                    "start `agentry serve`, which generates the key file (or set \
                     AGENTRY_MASTER_KEY to the key of the other replicas), then {STORE_TOKEN}"
                )),
            );
        }
        Err(KeyProblem::Bad(detail)) => {
            return Check::fail(
                NAME,
                format!("the stored secrets cannot be read: {detail}"),
                Some(
                    "use the key the secrets were stored with: 32 bytes in base64 (openssl \
                     rand -base64 32 for a new instance)"
                        .into(),
                ),
            );
        }
    }
    let token = match token {
        Ok(Some(token)) => token,
        Ok(None) => {
            return Check::fail(
                NAME,
                "no code-host token is stored",
                Some(STORE_TOKEN.into()),
            );
        }
        Err(e) => {
            return Check::fail(
                NAME,
                format!("the stored code-host token cannot be read: {}", quote(e)),
                Some(format!(
                    "fix the database (see its line); if the master key changed, use the one \
                     the token was stored with, or {STORE_TOKEN}"
                )),
            );
        }
    };
    // One quick attempt and a retry: a diagnosis does not wait out a code host that is down.
    let client = ClientConfig {
        request_timeout: CODEHOST_TIMEOUT,
        max_retries: 1,
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(1),
        max_rate_limit_wait: Duration::ZERO,
        ..agentry_service::start::client_config(config)
    };
    let codehost = CodeHost::new(client, Timing::default());
    let api = &config.codehost_api_url;
    match codehost.check_token(token).await {
        Ok(user) => Check::ok(
            NAME,
            format!("{api} accepts the stored token (user {})", user.login),
        ),
        Err(ServiceError::CodeHostUnavailable(e)) => Check::warn(
            NAME,
            format!(
                "a token is stored, but {api} could not be asked about it: {}",
                quote(&e)
            ),
            Some(
                "check that this machine reaches the code host (AGENTRY_CODEHOST_API_URL, \
                 proxies)"
                    .into(),
            ),
        ),
        Err(e) => Check::fail(
            NAME,
            format!(
                "{api} does not accept the stored token: {}",
                quote(&e.to_string())
            ),
            Some(format!("{STORE_TOKEN}; a working one replaces it")),
        ),
    }
}

/// The price table loads, and every model the Codex repositories run has a price (Codex
/// reports tokens, not dollars).
fn check_prices(
    table: Result<PriceTable, String>,
    prices_file: Option<&Path>,
    repos: &[Repository],
) -> Check {
    const NAME: &str = "prices";
    let table = match table {
        Ok(table) => table,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("{e}; `agentry serve` does not start with it"),
                Some("correct AGENTRY_PRICES_FILE (docs/runner.md), or unset it".into()),
            );
        }
    };
    let unpriced = unpriced_models(&table, repos);
    if unpriced.is_empty() {
        let codex = repos
            .iter()
            .any(|r| r.settings.agent_type == AgentType::Codex);
        let detail = format!(
            "{} models priced (built-in table of {}{}){}",
            table.models().count(),
            agentry_runner::PRICES_AS_OF,
            prices_file
                .map(|file| format!(", {} merged over it", file.display()))
                .unwrap_or_default(),
            if codex {
                "; every model the Codex repositories run has a price"
            } else {
                ""
            }
        );
        return Check::ok(NAME, detail);
    }
    let listed: Vec<String> = unpriced
        .iter()
        .map(|(model, uses)| format!("{model:?} ({})", uses.join(", ")))
        .collect();
    Check::warn(
        NAME,
        format!(
            "Codex model(s) without a price: {}: runs of this model cost null and a capped run \
             is refused",
            listed.join("; ")
        ),
        Some("add it to AGENTRY_PRICES_FILE (docs/runner.md)".into()),
    )
}

/// The models of Codex repositories that `table` has no price for, each with where it is
/// used (`https://github.com/acme/web coding`), in the order first met.
fn unpriced_models(table: &PriceTable, repos: &[Repository]) -> Vec<(String, Vec<String>)> {
    let mut unpriced: Vec<(String, Vec<String>)> = Vec::new();
    for repo in repos
        .iter()
        .filter(|r| r.settings.agent_type == AgentType::Codex)
    {
        for (model, role) in [
            (&repo.settings.coding_model, "coding"),
            (&repo.settings.review_model, "review"),
        ] {
            if table.get(model).is_some() {
                continue;
            }
            let usage = format!("{} {role}", repo.url);
            match unpriced.iter_mut().find(|(m, _)| m == model) {
                Some((_, uses)) => uses.push(usage),
                None => unpriced.push((model.clone(), vec![usage])),
            }
        }
    }
    unpriced
}

/// `text` trimmed and cut to [`QUOTED_CHARS`] characters.
fn quote(text: &str) -> String {
    excerpt(text.trim(), QUOTED_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_domain::{RepoSettings, RepoUrl};
    use agentry_runner::version::{Found, Version};

    fn repo(url: &str, agent: AgentType, coding: &str, review: &str) -> Repository {
        let now = time::OffsetDateTime::UNIX_EPOCH;
        Repository {
            id: uuid::Uuid::nil(),
            url: RepoUrl::parse(url).unwrap(),
            default_branch: "main".into(),
            clone_url: format!("{url}.git"),
            codehost_id: None,
            settings: RepoSettings {
                agent_type: agent,
                coding_model: coding.into(),
                review_model: review.into(),
                ..RepoSettings::default()
            },
            connected_at: now,
            disconnected_at: None,
            created_at: now,
            updated_at: now,
        }
    }

    #[test]
    fn lines_align_and_name_their_fix_on_one_line() {
        let report = Report {
            checks: vec![
                Check::ok("git", "git version 2.47.3 (/usr/bin/git)"),
                Check::fail(
                    "codex",
                    "the Codex CLI was not found\n(nowhere)",
                    Some("npm install -g @openai/codex@0.169.0".into()),
                ),
                Check::warn("sandbox", "off", None),
            ],
        };
        assert_eq!(
            report.to_string(),
            "ok    git              git version 2.47.3 (/usr/bin/git)\n\
             FAIL  codex            the Codex CLI was not found (nowhere) — fix: npm install -g \
             @openai/codex@0.169.0\n\
             warn  sandbox          off\n"
        );
        assert_eq!(report.to_string().lines().count(), 3);
    }

    #[test]
    fn only_a_failure_stops_runs() {
        let mut report = Report {
            checks: vec![
                Check::ok("git", "fine"),
                Check::warn("sandbox", "off", None),
            ],
        };
        assert!(report.can_run());
        assert!(Report::default().can_run());
        report.checks.push(Check::fail("database", "gone", None));
        assert!(!report.can_run());
        let config_error = ConfigError {
            name: "AGENTRY_BIND",
            message: "nope".into(),
        };
        let report = Report::config_error(&config_error);
        assert!(!report.can_run());
        assert!(report.to_string().contains("AGENTRY_BIND"), "{report}");
    }

    #[test]
    fn required_agents_come_from_the_connected_repositories() {
        let none = Agents::of(Some(&[]));
        assert!(none.required(AgentType::ClaudeCode) && !none.required(AgentType::Codex));
        let unknown = Agents::of(None);
        assert!(unknown.required(AgentType::ClaudeCode) && !unknown.required(AgentType::Codex));
        let repos = [
            repo("https://github.com/a/b", AgentType::Codex, "gpt-5", "gpt-5"),
            repo("https://github.com/a/c", AgentType::Codex, "gpt-5", "gpt-5"),
        ];
        let codex = Agents::of(Some(&repos));
        assert!(!codex.required(AgentType::ClaudeCode));
        assert_eq!(codex.why(AgentType::Codex), Some("used by 2 repositories"));
    }

    #[test]
    fn a_cli_problem_fails_only_for_a_required_agent() {
        let missing = || {
            Err(CliProblem::NotFound {
                name: "Codex",
                detail: "no codex on PATH".into(),
                install: "npm install -g @openai/codex@0.169.0",
                variable: "AGENTRY_CODEX_BIN",
            })
        };
        let required = cli_check(AgentType::Codex, missing(), Some("used by 1 repository"));
        assert_eq!(required.status, Status::Fail);
        assert_eq!(
            required.to_string(),
            "FAIL  codex            the Codex CLI was not found (no codex on PATH); used by 1 \
             repository — fix: npm install -g @openai/codex@0.169.0, or set AGENTRY_CODEX_BIN \
             to its path"
        );
        let unused = cli_check(AgentType::Codex, missing(), None);
        assert_eq!(unused.status, Status::Warn);
        assert!(unused.detail.contains("no connected repository uses Codex"));

        let old = cli_check(
            AgentType::ClaudeCode,
            Err(CliProblem::Unsupported {
                name: "Claude Code",
                path: "/bin/claude".into(),
                version: Version::new(1, 0, 0),
                range: ">= 2.1.197, < 3.0.0".into(),
                install: "npm install -g @anthropic-ai/claude-code@2.1.197",
            }),
            Some("used by 1 repository"),
        );
        assert_eq!(old.status, Status::Fail);
        assert!(old.detail.contains("does not support"), "{old}");

        let newer = cli_check(
            AgentType::ClaudeCode,
            Ok(Found {
                path: "/usr/local/bin/claude".into(),
                version: Version::new(2, 1, 332),
            }),
            Some("used by 1 repository"),
        );
        assert_eq!(newer.status, Status::Ok);
        assert_eq!(
            newer.detail,
            "2.1.332 (/usr/local/bin/claude): newer than the tested 2.1.197, within the \
             supported range >= 2.1.197, < 3.0.0; used by 1 repository"
        );
        let tested = cli_check(
            AgentType::ClaudeCode,
            Ok(Found {
                path: "/usr/local/bin/claude".into(),
                version: Version::new(2, 1, 197),
            }),
            None,
        );
        assert_eq!(tested.status, Status::Ok);
        assert!(!tested.detail.contains("newer"), "{tested}");
    }

    #[test]
    fn credentials_are_named_never_shown() {
        let with = ServiceEnv::read(&[], |name| {
            (name == "OPENAI_API_KEY").then(|| "sk-secret-value".to_owned())
        });
        let ok = check_credentials(AgentType::Codex, &with);
        assert_eq!(ok.status, Status::Ok);
        assert_eq!(ok.detail, "OPENAI_API_KEY is set");
        let missing = check_credentials(AgentType::ClaudeCode, &with);
        assert_eq!(missing.status, Status::Fail);
        let line = missing.to_string();
        assert!(
            line.contains("export ANTHROPIC_API_KEY=… in the environment of `agentry serve`"),
            "{line}"
        );
        assert!(!line.contains("sk-secret") && !ok.to_string().contains("sk-secret"));
    }

    #[test]
    fn unpriced_codex_models_are_named_with_their_repositories() {
        let table = PriceTable::builtin();
        let repos = [
            repo(
                "https://github.com/a/b",
                AgentType::Codex,
                "gpt-unlisted",
                "gpt-5",
            ),
            repo(
                "https://github.com/a/c",
                AgentType::Codex,
                "gpt-5",
                "gpt-unlisted",
            ),
            repo(
                "https://github.com/a/d",
                AgentType::ClaudeCode,
                "opus",
                "haiku",
            ),
        ];
        assert_eq!(
            unpriced_models(&table, &repos),
            [(
                "gpt-unlisted".to_owned(),
                vec![
                    "https://github.com/a/b coding".to_owned(),
                    "https://github.com/a/c review".to_owned()
                ]
            )]
        );
        let warn = check_prices(Ok(table.clone()), None, &repos);
        assert_eq!(warn.status, Status::Warn);
        assert!(warn.detail.contains("cost null"), "{warn}");
        assert_eq!(
            check_prices(Ok(table), None, &repos[2..]).status,
            Status::Ok
        );
        assert_eq!(
            check_prices(Err("AGENTRY_PRICES_FILE x: bad".into()), None, &[]).status,
            Status::Fail
        );
    }

    #[test]
    fn a_postgres_password_is_never_shown() {
        let url =
            DatabaseUrl::parse("postgres://agentry:hunter2@db.example:5433/agentry?password=x")
                .unwrap();
        assert_eq!(shown_url(&url), "postgres://db.example:5433/agentry");
    }

    /// On a data directory that does not exist, nothing is created, and what is missing
    /// fails with its fix.
    #[tokio::test]
    async fn a_fresh_machine_is_diagnosed_without_creating_anything() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let config = Config::from_lookup(|name| match name {
            "AGENTRY_DATA_DIR" => Some(data.display().to_string()),
            "AGENTRY_CLAUDE_BIN" => Some(dir.path().join("no-claude").display().to_string()),
            "AGENTRY_CODEX_BIN" => Some(dir.path().join("no-codex").display().to_string()),
            "AGENTRY_AGENT_SANDBOX" => Some("off".into()),
            _ => None,
        })
        .unwrap();
        let env = ServiceEnv::read(&[], |name| match name {
            "PATH" => std::env::var("PATH").ok(),
            _ => None,
        });
        let report = diagnose_with(&config, &env).await;
        assert!(!data.exists(), "doctor created the data directory");
        assert!(!report.can_run(), "{report}");
        let status = |name: &str| {
            report
                .checks
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("no {name} line in\n{report}"))
                .status
        };
        assert_eq!(status("claude-code"), Status::Fail, "{report}");
        assert_eq!(status("codex"), Status::Warn, "{report}");
        assert_eq!(status("claude-code-key"), Status::Fail, "{report}");
        assert_eq!(status("sandbox"), Status::Warn, "{report}");
        assert_eq!(status("database"), Status::Warn, "{report}");
        assert_eq!(status("code-host"), Status::Fail, "{report}");
        assert_eq!(status("prices"), Status::Ok, "{report}");
        assert!(report.checks.iter().all(|c| c.name != "codex-key"));
        assert!(
            report
                .to_string()
                .contains("no code-host token can be stored yet"),
            "{report}"
        );
    }

    /// As root, agents of another user are fine, root's own (allowed) a warning, and a
    /// refused user a failure with its reason; a service of its own user says nothing.
    #[test]
    fn root_runs_agents_as_another_user_or_says_why_not() {
        let nobody = AgentUser::Switch(agentry_runner::user::UserIds {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        });
        let ok = check_user(Some(0), &nobody, 2).unwrap();
        assert_eq!(ok.status, Status::Ok, "{ok}");
        assert!(ok.detail.contains("run as nobody (uid 65534)"), "{ok}");
        let warn = check_user(Some(0), &AgentUser::Service, 2).unwrap();
        assert_eq!(warn.status, Status::Warn, "{warn}");
        assert!(warn.detail.contains("AGENTRY_ALLOW_ROOT=1"), "{warn}");
        let refused = AgentUser::Refused("there is no user \"x\"".into());
        let fail = check_user(Some(0), &refused, 2).unwrap();
        assert_eq!(fail.status, Status::Fail, "{fail}");
        assert!(fail.detail.contains("no user"), "{fail}");
        assert!(check_user(Some(1000), &AgentUser::Service, 2).is_none());
        assert!(check_user(Some(0), &nobody, 0).is_none());
        assert!(effective_uid().is_some());
    }

    #[test]
    fn the_gateway_key_is_a_stored_secret_or_the_environments() {
        let config = |key: Option<&str>| {
            let key = key.map(str::to_owned);
            Config::from_lookup(move |name| match name {
                "AGENTRY_DATA_DIR" => Some("/srv/agentry".into()),
                "ANTHROPIC_API_KEY" => key.clone(),
                _ => None,
            })
            .unwrap()
        };
        let none = check_gateway_key(AgentType::ClaudeCode, &config(None), &[]);
        assert_eq!(none.status, Status::Fail, "{none}");
        assert!(
            none.detail
                .contains("no secret ANTHROPIC_API_KEY is stored"),
            "{none}"
        );
        let stored = check_gateway_key(
            AgentType::ClaudeCode,
            &config(None),
            &["ANTHROPIC_API_KEY".to_owned()],
        );
        assert_eq!(stored.status, Status::Ok, "{stored}");
        let env = check_gateway_key(AgentType::ClaudeCode, &config(Some("sk-ant-secret")), &[]);
        assert_eq!(env.status, Status::Ok);
        assert!(!env.detail.contains("sk-ant-secret"), "{env}");
        let codex = check_gateway_key(AgentType::Codex, &config(Some("sk-ant")), &[]);
        assert_eq!(codex.status, Status::Fail, "{codex}");
    }

    #[test]
    fn claude_telemetry_switches_are_a_warning() {
        let quiet = ServiceEnv::read(&["DISABLE_TELEMETRY".to_owned()], |name| {
            (name == "DISABLE_TELEMETRY").then(|| "1".to_owned())
        });
        let check = check_claude_telemetry(&quiet).unwrap();
        assert_eq!(check.status, Status::Warn);
        assert!(check.detail.contains("DISABLE_TELEMETRY"), "{check:?}");
        assert!(check_claude_telemetry(&ServiceEnv::default()).is_none());
    }

    /// A data directory under the temporary directory is a warning for Codex.
    #[test]
    fn a_data_directory_under_tmp_is_a_warning_for_codex() {
        let check = check_codex_home(Path::new("/tmp/x/agentry-data"), Path::new("/tmp")).unwrap();
        assert_eq!(check.status, Status::Warn);
        assert!(check.detail.contains("helper binaries"), "{check:?}");
        assert!(check_codex_home(Path::new("/var/lib/agentry"), Path::new("/tmp")).is_none());
    }
}
