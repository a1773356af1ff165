//! agentry's use cases, without any HTTP: what the product does, for the HTTP API
//! (`agentry-api`), the command line, and any other Rust program.
//!
//! One [`Service`] holds the database, the code-host integration and the agent-run
//! orchestrator. Its methods are the use cases (create, cancel and retry a task, assign an
//! issue, connect a repository, store a secret, sync issues, handle a verified webhook
//! event, import tasks, build the cost report); each commits its change and then wakes the
//! background loop that acts on it, so no caller wakes anything by hand. Errors are
//! [`ServiceError`]s, which say what went wrong in the product's terms; the adapter decides
//! how to show them.
//!
//! [`Service::start_background`] runs the loops (agent runs and lease recovery, issue sync,
//! the outbox, budget alerts and their webhook, pull-request polling, pruning of webhook
//! delivery ids) as plain tokio tasks.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = agentry_service::config::Config::from_env()?;
//! let service = agentry_service::Service::open(&config)?;
//! let background = service.start_background(&config).await;
//! // … serve requests, or call the use cases directly …
//! service.shut_down(background).await;
//! # Ok(()) }
//! ```

pub mod alerts;
pub mod background;
pub mod budgets;
pub mod closing_refs;
pub mod codehost;
pub mod config;
pub mod costs;
mod delivery;
mod error;
pub mod import;
mod posted_text;
mod repos;
pub mod revisions;
pub mod runs;
mod secrets;
pub mod start;
pub mod tasks;
mod tokens;
pub mod tracking;
pub mod views;
mod wake;

use std::sync::Arc;

/// The model gateway's defaults the configuration and `agentry doctor` name (its upstreams,
/// its key variables), as `crate::gateway`.
use agentry_agent_network::gateway;

use agentry_persistence::secrets::{MasterKey, SecretValue};
use agentry_persistence::{AnyConnection, Db};

pub use background::{Background, BackgroundLoop};
pub use error::ServiceError;
pub use start::StartError;

use crate::alerts::Alerts;
use crate::codehost::CodeHost;
use crate::runs::{RunSettings, Runs};

/// The product's use cases over one database (cheap to clone: a handle to shared parts).
#[derive(Clone)]
pub struct Service {
    parts: Arc<Parts>,
}

/// What a [`Service`] is made of: only the service's own modules reach these.
struct Parts {
    /// The database pool.
    db: Db,
    /// The key that encrypts stored secrets (docs/contract.md#33-secrets).
    master_key: MasterKey,
    /// The code-host integration: client, outbox, webhook secret, revisions.
    codehost: CodeHost,
    /// The agent-run orchestrator.
    runs: Runs,
    /// The budget alerts' webhook (docs/contract.md#67-budgets).
    alerts: Alerts,
    /// One permit per pooled connection: [`Service::db`] takes one before it uses a blocking
    /// thread, so waiting calls wait as futures, not as parked blocking threads.
    db_permits: Arc<tokio::sync::Semaphore>,
    /// How many cost reports were computed rather than served from the kept ones.
    reports_computed: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("backend", &self.parts.db.backend())
            .field("codehost", &self.parts.codehost)
            .field("runs", &self.parts.runs)
            .field("alerts", &self.parts.alerts)
            .finish()
    }
}

impl Service {
    /// The service over `db`, its secrets encrypted with `master_key`, the code-host
    /// integration `codehost` and the orchestrator `runs`. No loop runs until
    /// [`Service::start_background`]. Budget alerts are recorded but go to no webhook
    /// ([`Service::with_alerts`] sends them).
    pub fn new(db: Db, master_key: MasterKey, codehost: CodeHost, runs: Runs) -> Self {
        Service::with_alerts(db, master_key, codehost, runs, Alerts::disabled())
    }

    /// [`Service::new`] with budget alerts delivered as `alerts` says.
    pub fn with_alerts(
        db: Db,
        master_key: MasterKey,
        codehost: CodeHost,
        runs: Runs,
        alerts: Alerts,
    ) -> Self {
        let permits = usize::try_from(db.max_connections())
            .unwrap_or(usize::MAX)
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Service {
            parts: Arc::new(Parts {
                db_permits: Arc::new(tokio::sync::Semaphore::new(permits)),
                reports_computed: std::sync::atomic::AtomicU64::new(0),
                db,
                master_key,
                codehost,
                runs,
                alerts,
            }),
        }
    }

    /// The webhook's shared secret, if the webhook is enabled.
    pub fn webhook_secret(&self) -> Option<&SecretValue> {
        self.parts.codehost.webhook_secret()
    }

    /// The key that encrypts stored secrets.
    pub fn master_key(&self) -> &MasterKey {
        &self.parts.master_key
    }

    /// The agent runs' settings.
    pub fn run_settings(&self) -> &RunSettings {
        self.parts.runs.settings()
    }

    /// How many agent runs are in progress in this process.
    pub fn active_runs(&self) -> usize {
        self.parts.runs.active()
    }

    /// How many connections the database pool holds at most.
    pub fn max_connections(&self) -> u32 {
        self.parts.db.max_connections()
    }

    /// Runs blocking database work on tokio's blocking pool with a pooled connection: the
    /// use cases' own access, and reads for programs that embed the service. Changes go
    /// through the use cases, which wake the loops that act on them.
    ///
    /// At most as many calls as the pool has connections run at once; the others wait (as
    /// futures) for a permit before they take a blocking thread.
    pub async fn db<T, F>(&self, f: F) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce(&mut AnyConnection) -> Result<T, ServiceError> + Send + 'static,
    {
        let db = self.parts.db.clone();
        // The semaphore is never closed, so acquiring fails only on a defect.
        let permit = self
            .parts
            .db_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| ServiceError::internal(&e))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut conn = db.conn()?;
            f(&mut conn)
        })
        .await?
    }

    /// Runs blocking work (file reads, CPU-heavy parsing) on tokio's blocking pool.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        Ok(tokio::task::spawn_blocking(f).await?)
    }
}

/// The current time as stored (microsecond precision).
pub(crate) fn now() -> time::OffsetDateTime {
    agentry_persistence::now()
}
