//! `agentry serve`: migrate, issue the first admin token if needed, serve until a signal.

use std::io::Write;
use std::path::Path;

use actix_web::{HttpServer, web};
use agentry_codehost::ClientConfig;
use agentry_persistence::secrets::{MasterKey, SecretValue};
use agentry_persistence::{Backend, Db, tokens};
use agentry_runner::PriceTable;

use crate::auth::{FirstTokenFile, generate_token, hash_token};
use crate::codehost::{self, CodeHost, Timing};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runs::{RunSettings, Runs};
use crate::state::AppState;

/// How long a client may take to send a request's head (method, path, headers).
pub const CLIENT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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

fn io(context: &str, e: impl std::fmt::Display) -> StartError {
    StartError::Io(format!("{context}: {e}"))
}

/// Creates the data directory (mode 0700: it holds the database and secrets).
pub fn ensure_data_dir(dir: &Path) -> Result<(), StartError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| {
        io(
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

/// Writes `contents` to `path` readable by the owner only (0600), replacing any old file.
fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    #[cfg(unix)]
    std::os::unix::fs::PermissionsExt::set_mode(&mut file.metadata()?.permissions(), 0o600);
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// On an installation without any API token, creates an admin token, prints it once on
/// stdout and writes it to `$AGENTRY_DATA_DIR/admin-token` (mode 0600).
///
/// The file is not kept: the returned [`FirstTokenFile`] (registered with the application)
/// removes it when the token is first used. A file a previous start left behind is watched
/// the same way while its token is still active, and removed at once otherwise.
pub fn bootstrap_admin_token(
    db: &Db,
    data_dir: &Path,
) -> Result<Option<FirstTokenFile>, StartError> {
    let token = generate_token().map_err(|e| io("no randomness for the admin token", e))?;
    let mut conn = db.conn()?;
    let path = data_dir.join("admin-token");
    let created = tokens::bootstrap_admin(
        &mut conn,
        "initial admin",
        &hash_token(&token),
        agentry_persistence::now(),
    )?;
    if let Some(created) = created {
        write_private(&path, &format!("{token}\n"))
            .map_err(|e| io(&format!("cannot write {}", path.display()), e))?;
        println!(
            "agentry: first start: created an admin API token (shown once; also saved to {} \
             until its first use):",
            path.display()
        );
        println!("{token}");
        let _ = std::io::stdout().flush();
        return Ok(Some(FirstTokenFile::new(created.id, path)));
    }
    let Ok(left) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    match tokens::find_by_hash(&mut conn, &hash_token(left.trim()))? {
        Some(active) => Ok(Some(FirstTokenFile::new(active.id, path))),
        None => {
            std::fs::remove_file(&path)
                .map_err(|e| io(&format!("cannot remove {}", path.display()), e))?;
            tracing::info!(file = %path.display(), "removed the file of a revoked admin token");
            Ok(None)
        }
    }
}

/// The code-host integration of `config`: the master key (`AGENTRY_MASTER_KEY`, or the key
/// file `$AGENTRY_DATA_DIR/master.key`, generated on first start) and the client settings.
pub fn code_host(config: &Config) -> Result<CodeHost, StartError> {
    let master_key = MasterKey::load_or_create(
        config.master_key.as_ref().map(SecretValue::expose),
        &config.data_dir.join("master.key"),
    )
    .map_err(|e| io("cannot load the master key", e))?;
    let client = ClientConfig {
        api_url: config.codehost_api_url.clone(),
        user_agent: format!("agentry/{}", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Ok(CodeHost::new(master_key, client, Timing::default())
        .with_webhook_secret(config.webhook_secret.clone()))
}

/// The agent-run orchestrator of `config`: a [`agentry_runner::LocalRunner`] under the data directory with
/// the configured executables and price table (the built-in one, with
/// `AGENTRY_PRICES_FILE` merged over it).
pub fn runs(config: &Config) -> Result<Runs, StartError> {
    let mut prices = PriceTable::builtin();
    if let Some(path) = &config.prices_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            io(
                &format!("cannot read AGENTRY_PRICES_FILE {}", path.display()),
                e,
            )
        })?;
        let overrides = PriceTable::from_json(&text)
            .map_err(|e| io(&format!("AGENTRY_PRICES_FILE {}", path.display()), e))?;
        prices = prices.merged_with(overrides);
    }
    Ok(Runs::local(
        config.data_dir.clone(),
        config.claude_bin.clone(),
        config.codex_bin.clone(),
        prices,
        RunSettings {
            max_concurrent: config.max_concurrent_runs,
            lease: config.run_lease,
            wall_time: config.run_time_limit,
            sandbox: config.agent_sandbox,
            ..RunSettings::default()
        },
    ))
}

/// Runs the service until SIGTERM or SIGINT, then stops accepting connections and lets
/// in-flight requests finish (up to 30 s).
pub async fn serve(config: Config) -> Result<(), StartError> {
    let db = open_database(&config)?;
    let first_token_file = bootstrap_admin_token(&db, &config.data_dir)?.map(web::Data::new);
    let openapi_json = serde_json::to_string(&crate::app::openapi())
        .map_err(|e| io("cannot render the OpenAPI document", e))?;
    let metrics = Metrics::new().map_err(|e| io("cannot create metrics", e))?;
    let state = web::Data::new(AppState {
        db,
        metrics,
        openapi_json,
        codehost: code_host(&config)?,
        runs: runs(&config)?,
    });
    let cors = config.cors_origins.clone();
    let app_state = state.clone();
    // One set of webhook limits for all the workers, so the limits are per process.
    let webhook_limits = web::Data::new(crate::routes::webhooks::WebhookLimits::default());
    let server = HttpServer::new(move || {
        let app =
            crate::app::build_app_with(app_state.clone(), cors.clone(), webhook_limits.clone());
        match &first_token_file {
            Some(file) => app.app_data(file.clone()),
            None => app,
        }
    })
    // A client has 10 s to send a request's head (else 408 and the connection is closed),
    // an idle kept-alive connection is closed after 30 s, and a closing connection gets 2 s
    // to go away cleanly: slow or silent clients cannot hold connections for long.
    .client_request_timeout(CLIENT_REQUEST_TIMEOUT)
    .keep_alive(std::time::Duration::from_secs(30))
    .client_disconnect_timeout(std::time::Duration::from_secs(2))
    .shutdown_timeout(30)
    .bind(config.bind)
    .map_err(|e| io(&format!("cannot listen on {}", config.bind), e))?;
    for addr in server.addrs() {
        tracing::info!(%addr, "agentry listening on http://{addr}");
    }
    let backend = state.db.backend();
    crate::runs::recover_at_start(&state, backend).await;
    let workers = [
        actix_web::rt::spawn(crate::runs::runner_loop(state.clone())),
        actix_web::rt::spawn(crate::runs::recovery_loop(state.clone())),
        actix_web::rt::spawn(codehost::issue_sync_loop(
            state.clone(),
            config.issue_sync_interval,
        )),
        actix_web::rt::spawn(codehost::outbox_loop(state.clone())),
        actix_web::rt::spawn(crate::routes::webhooks::delivery_pruning_loop(
            state.clone(),
            crate::routes::webhooks::DELIVERY_PRUNE_EVERY,
        )),
        actix_web::rt::spawn(crate::tracking::poll_loop(
            state.clone(),
            config.poll_interval,
            config.database_url.clone(),
        )),
    ];
    let served = server.run().await;
    // Agents still running are stopped; their tasks stay leased and are recovered (with
    // the cost their output shows) when the service starts again.
    state
        .runs
        .shut_down(std::time::Duration::from_secs(15))
        .await;
    // Every effect and sync is recorded in the database as it happens, so stopping the
    // loops mid-way loses nothing: the next start picks up where they were.
    for worker in workers {
        worker.abort();
    }
    served.map_err(|e| io("server stopped", e))?;
    tracing::info!("agentry stopped");
    Ok(())
}
