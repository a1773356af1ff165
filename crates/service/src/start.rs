//! Starting and stopping the product: the database, the code-host integration and the
//! orchestrator of a [`Config`], and the background loops.

use std::path::Path;
use std::time::Duration;

use agentry_codehost::ClientConfig;
use agentry_persistence::secrets::{MasterKey, SecretValue};
use agentry_persistence::{Backend, Db};
use agentry_runner::PriceTable;

use agentry_agent_network::AgentNetwork;
use agentry_agent_network::gateway::{self, GatewayConfig};

use crate::Service;
use crate::background::{Background, BackgroundLoop};
use crate::codehost::{CodeHost, Timing};
use crate::config::Config;
use crate::config::kube::RunnerKind;
use crate::runs::{Runs, SandboxNetwork};

/// How long running agents get to stop when the service shuts down.
pub(crate) const SHUTDOWN_WAIT: Duration = Duration::from_secs(15);

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Db(#[from] agentry_persistence::DbError),
    /// A file or socket operation failed.
    #[error("{0}")]
    Io(String),
}

/// A [`StartError::Io`] with its context.
pub fn io_error(context: &str, e: impl std::fmt::Display) -> StartError {
    StartError::Io(format!("{context}: {e}"))
}

/// Creates the data directory (mode 0700: it holds the database and secrets).
pub(crate) fn ensure_data_dir(dir: &Path) -> Result<(), StartError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| {
        io_error(
            &format!("cannot create data directory {}", dir.display()),
            e,
        )
    })
}

/// Opens the database of `config` and applies pending migrations.
pub fn open_database(config: &Config) -> Result<Db, StartError> {
    ensure_data_dir(&config.data_dir)?;
    let pool_size = match agentry_persistence::DatabaseUrl::parse(&config.database_url)?.backend() {
        Backend::Sqlite => 8,
        Backend::Postgres => 16,
    };
    let db = Db::connect(&config.database_url, pool_size)?;
    let applied = db.migrate()?;
    if !applied.is_empty() {
        tracing::info!(migrations = ?applied, "applied migrations");
    }
    Ok(db)
}

/// The master key of `config`: `AGENTRY_MASTER_KEY`, or the key file
/// `$AGENTRY_DATA_DIR/master.key`, generated on first start.
pub fn master_key(config: &Config) -> Result<MasterKey, StartError> {
    MasterKey::load_or_create(
        config.master_key.as_ref().map(SecretValue::expose),
        &config.data_dir.join("master.key"),
    )
    .map_err(|e| io_error("cannot load the master key", e))
}

/// The code-host integration of `config`: the client settings, the webhook secret and the
/// revision settings.
pub fn code_host(config: &Config) -> CodeHost {
    CodeHost::new(client_config(config), Timing::default())
        .with_webhook_secret(config.webhook_secret.clone())
        .with_revisions(crate::revisions::RevisionSettings {
            mention: config.mention.clone(),
            quiet: config.revision_quiet,
        })
}

/// The code-host client settings of `config`: its base URL and agentry's user agent.
pub fn client_config(config: &Config) -> ClientConfig {
    ClientConfig {
        api_url: config.codehost_api_url.clone(),
        user_agent: format!("agentry/{}", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    }
}

/// The price table of `config`: the built-in one, with `AGENTRY_PRICES_FILE` merged over it.
pub fn price_table(config: &Config) -> Result<PriceTable, StartError> {
    let mut prices = PriceTable::builtin();
    if let Some(path) = &config.prices_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            io_error(
                &format!("cannot read AGENTRY_PRICES_FILE {}", path.display()),
                e,
            )
        })?;
        let overrides = PriceTable::from_json(&text)
            .map_err(|e| io_error(&format!("AGENTRY_PRICES_FILE {}", path.display()), e))?;
        prices = prices.merged_with(overrides);
    }
    Ok(prices)
}

/// The agent-run orchestrator of `config`: a [`agentry_runner::LocalRunner`] under the data
/// directory with the configured executables and price table (the built-in one, with
/// `AGENTRY_PRICES_FILE` merged over it). Sandboxed agents (the default) get the model
/// gateway and the egress proxy as their only network, metered into `db`; the forwarder
/// inside each sandbox is this very executable (`agentry sandbox-net`).
pub fn runs(config: &Config, db: &Db, master_key: &MasterKey) -> Result<Runs, StartError> {
    let prices = price_table(config)?;
    let agent_network = || -> Result<AgentNetwork, StartError> {
        AgentNetwork::start(
            GatewayConfig {
                anthropic_upstream: config.anthropic_upstream.clone(),
                openai_upstream: config.openai_upstream.clone(),
                anthropic_key: config.anthropic_key.clone(),
                openai_key: config.openai_key.clone(),
                body_timeout: gateway::BODY_TIMEOUT,
            },
            config.egress_allow.clone(),
            prices.clone(),
            db.clone(),
            master_key.clone(),
        )
        .map_err(|e| io_error("cannot start the model gateway", e))
    };
    let exe = || {
        std::env::current_exe()
            .map(|exe| exe.to_string_lossy().into_owned())
            .map_err(|e| io_error("cannot find agentry's own executable", e))
    };
    if let RunnerKind::Kubernetes(settings) = &config.runner {
        // The pod is the sandbox; its only network is the gateway and the egress proxy.
        return Runs::kube(
            config.data_dir.clone(),
            settings,
            config.claude_bin.clone(),
            config.codex_bin.clone(),
            prices.clone(),
            &config.agent_env,
            config.runs.clone(),
            agent_network()?,
            vec![exe()?, "sandbox-net".to_owned()],
        )
        .map_err(|e| io_error("cannot start the Kubernetes runner", e));
    }
    let network = match config.runs.sandbox {
        agentry_runner::SandboxMode::Off => None,
        agentry_runner::SandboxMode::Auto => Some(SandboxNetwork {
            network: agent_network()?,
            forwarder: vec![exe()?, "sandbox-net".to_owned()],
        }),
    };
    Ok(Runs::local(
        config.data_dir.clone(),
        config.claude_bin.clone(),
        config.codex_bin.clone(),
        prices,
        &config.agent_env,
        config.runs.clone(),
        network,
    ))
}

impl Service {
    /// The service of `config`: its database (created and migrated), code-host integration
    /// and orchestrator. Nothing runs in the background yet.
    pub fn open(config: &Config) -> Result<Service, StartError> {
        let alerts = crate::alerts::Alerts::new(
            config.alert_webhook_url.clone(),
            crate::alerts::AlertTiming::default(),
        )
        .map_err(StartError::Io)?;
        let db = open_database(config)?;
        // What an older version or the umask left open to the agents' user is closed.
        agentry_runner::user::close_data_dir(&config.data_dir, config.runs.agent_user.ids())
            .map_err(|e| io_error("cannot restrict the data directory", e))?;
        let master_key = master_key(config)?;
        let runs = runs(config, &db, &master_key)?;
        Ok(Service::with_alerts(
            db,
            master_key,
            code_host(config),
            runs,
            alerts,
        ))
    }

    /// The service of `config` for one command of the command line (`agentry migrate`,
    /// `token create`, `import`, `costs`): its database (created and migrated), master key
    /// and code-host settings, with runs disabled. Nothing runs in the background, no agent
    /// can start, and no socket is opened.
    pub fn open_for_command(config: &Config) -> Result<Service, StartError> {
        let db = open_database(config)?;
        let master_key = master_key(config)?;
        Ok(Service::new(
            db,
            master_key,
            code_host(config),
            Runs::disabled(config.data_dir.clone()),
        ))
    }

    /// How many of the database's migrations are not applied ([`Service::open`] and
    /// [`Service::open_for_command`] apply them all).
    pub async fn pending_migrations(&self) -> Result<usize, crate::ServiceError> {
        self.db(|conn| Ok(agentry_persistence::meta::pending_migrations(conn)?.len()))
            .await
    }

    /// Recovers the tasks a stopped process left leased, then starts the background loops on
    /// the current tokio runtime: the list [`BackgroundLoop::all`] (agent runs and lease
    /// recovery, revision rounds, the periodic issue sync, the outbox, the budget alerts (a
    /// check, then their webhook), the pruning of webhook delivery ids and the pull-request
    /// poller).
    pub async fn start_background(&self, config: &Config) -> Background {
        if config.runs.max_concurrent > 0 && agentry_runner::user::effective_uid() == Some(0) {
            use agentry_runner::user::AgentUser;
            match &config.runs.agent_user {
                AgentUser::Switch(user) => tracing::info!(
                    user = %user.name,
                    uid = user.uid,
                    "agentry runs as root: its agents run as another user"
                ),
                AgentUser::Service => tracing::warn!(
                    "agentry runs as root and AGENTRY_ALLOW_ROOT=1, so its agents do too \
                     (without capabilities, inside the sandbox): run it as a user of its own \
                     (docs/security.md)"
                ),
                AgentUser::Refused(why) => tracing::error!("agents are refused: {why}"),
            }
        }
        self.recover_at_start(self.parts.db.backend()).await;
        Background::start(self, BackgroundLoop::all(config))
    }

    /// Stops the service: running agents are stopped (their tasks stay leased and are
    /// recovered, with the cost their output shows, at the next start), then the loops.
    /// Every effect and sync is recorded as it happens, so stopping loops mid-way loses
    /// nothing.
    pub async fn shut_down(&self, background: Background) {
        self.parts.runs.shut_down(SHUTDOWN_WAIT).await;
        drop(background);
    }
}
