//! `agentry serve`: open the service (migrating its database), issue the first admin token
//! if needed, start the background loops and serve until a signal.

use std::io::Write;
use std::path::Path;

use actix_web::{HttpServer, web};
use agentry_service::Service;
use agentry_service::start::io_error;
pub use agentry_service::start::{StartError, open_database};

use crate::auth::{FirstTokenFile, generate_token, hash_token};
use crate::config::Config;
use crate::state::AppState;

/// How long a client may take to send a request's head (method, path, headers).
pub const CLIENT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn io(context: &str, e: impl std::fmt::Display) -> StartError {
    io_error(context, e)
}

/// Writes `contents` to `path` readable by the owner only (0600), replacing any old file.
fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
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
pub async fn bootstrap_admin_token(
    service: &Service,
    data_dir: &Path,
) -> Result<Option<FirstTokenFile>, StartError> {
    let token = generate_token().map_err(|e| io("no randomness for the admin token", e))?;
    let path = data_dir.join("admin-token");
    let created = service
        .bootstrap_admin_token("initial admin".to_owned(), hash_token(&token))
        .await
        .map_err(|e| io("cannot issue the first admin token", e))?;
    if let Some(created) = created {
        // The token is stored: it is shown whatever happens to its file, or nobody could
        // ever use it (a later start finds a token and issues none).
        let saved = write_private(&path, &format!("{token}\n"));
        match &saved {
            Ok(()) => println!(
                "agentry: first start: created an admin API token (shown once; also saved to \
                 {} until its first use):",
                path.display()
            ),
            Err(_) => println!("agentry: first start: created an admin API token (shown once):"),
        }
        println!("{token}");
        let _ = std::io::stdout().flush();
        return match saved {
            Ok(()) => Ok(Some(FirstTokenFile::new(created.id, path))),
            Err(e) => {
                tracing::warn!(
                    file = %path.display(),
                    error = %e,
                    "could not save the first admin token to its file; it is printed above only"
                );
                let _ = std::fs::remove_file(&path);
                Ok(None)
            }
        };
    }
    let Ok(left) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let left = service
        .token_by_hash(hash_token(left.trim()))
        .await
        .map_err(|e| io("cannot read the API tokens", e))?;
    match left {
        Some(active) => Ok(Some(FirstTokenFile::new(active.id, path))),
        None => {
            std::fs::remove_file(&path)
                .map_err(|e| io(&format!("cannot remove {}", path.display()), e))?;
            tracing::info!(file = %path.display(), "removed the file of a revoked admin token");
            Ok(None)
        }
    }
}

/// The most [`raise_open_files_limit`] raises the soft limit of open files to: far more
/// than the service uses (each run's proxy holds at most 512), and not the "infinity" some
/// hard limits are, which the agents and git inherit (some tools loop over every possible
/// descriptor).
pub const MAX_OPEN_FILES: u64 = 65_536;

/// Raises this process's soft limit of open files (`RLIMIT_NOFILE`) to its hard limit (at
/// most [`MAX_OPEN_FILES`]) and
/// logs the limit it runs with. Every connection (API clients, the webhook, each run's
/// gateway and egress proxy, two descriptors per tunnel) takes a descriptor, and
/// containers often start with a soft limit of 1024 under a far higher hard one; the soft
/// limit is the process's own to raise, up to the hard one. A limit that cannot be read or
/// raised is logged, and the service starts with the limit it has.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Err(e) => tracing::warn!(error = %e, "cannot read the limit of open files"),
        Ok((soft, hard)) if soft >= hard.min(MAX_OPEN_FILES) => {
            tracing::info!(limit = soft, "open files: the soft limit is high enough");
        }
        Ok((soft, hard)) => {
            match setrlimit(Resource::RLIMIT_NOFILE, hard.min(MAX_OPEN_FILES), hard) {
                Ok(()) => tracing::info!(
                    limit = hard.min(MAX_OPEN_FILES),
                    was = soft,
                    "open files: raised the soft limit towards the hard limit"
                ),
                Err(e) => tracing::warn!(
                    soft,
                    hard,
                    error = %e,
                    "open files: cannot raise the soft limit to the hard limit; it stays at {soft}"
                ),
            }
        }
    }
}

/// Runs the service until SIGTERM or SIGINT, then stops accepting connections and lets
/// in-flight requests finish (up to 30 s). First raises the limit of open files
/// ([`raise_open_files_limit`]).
pub async fn serve(config: Config) -> Result<(), StartError> {
    raise_open_files_limit();
    let service = Service::open(&config.service)?;
    let first_token_file = bootstrap_admin_token(&service, &config.service.data_dir)
        .await?
        .map(web::Data::new);
    let state = web::Data::new(
        AppState::new(service.clone())
            .map_err(StartError::Io)?
            .with_metrics_public(config.metrics_public),
    );
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
    let background = service.start_background(&config.service).await;
    let served = server.run().await;
    service.shut_down(background).await;
    served.map_err(|e| io("server stopped", e))?;
    tracing::info!("agentry stopped");
    Ok(())
}
