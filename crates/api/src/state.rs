//! What every handler can reach.

use actix_web::web;
use agentry_persistence::{AnyConnection, Db};

use crate::codehost::CodeHost;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::runs::Runs;

/// Shared application state (one per process, behind `web::Data`).
pub struct AppState {
    /// The database pool.
    pub db: Db,
    /// Request metrics.
    pub metrics: Metrics,
    /// The OpenAPI document, rendered once at start.
    pub openapi_json: String,
    /// The code-host integration: secrets key, client, outbox.
    pub codehost: CodeHost,
    /// The agent-run orchestrator.
    pub runs: Runs,
}

impl AppState {
    /// Runs blocking database work on actix's blocking pool with a pooled connection.
    pub async fn db<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut AnyConnection) -> Result<T, ApiError> + Send + 'static,
    {
        let db = self.db.clone();
        web::block(move || {
            let mut conn = db.conn().map_err(ApiError::from)?;
            f(&mut conn)
        })
        .await?
    }
}
