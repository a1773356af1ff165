//! What every handler can reach.

use std::sync::Arc;

use agentry_service::Service;

use crate::metrics::Metrics;

/// Shared application state (one per process, behind `web::Data`): the product's use cases
/// and what only the HTTP side has.
pub struct AppState {
    /// The use cases, the database and the background loops' parts.
    pub service: Service,
    /// Request metrics (also registered on their own, for the metrics middleware).
    pub metrics: Arc<Metrics>,
    /// The OpenAPI document, rendered once at start.
    pub openapi_json: String,
    /// `AGENTRY_METRICS_PUBLIC=1`: `/metrics` answers without a token (by default it
    /// requires a valid API token of any role).
    pub metrics_public: bool,
}

impl AppState {
    /// The state of an application over `service`, with fresh metrics and the rendered
    /// OpenAPI document.
    pub fn new(service: Service) -> Result<Self, String> {
        Ok(AppState {
            service,
            metrics: Arc::new(Metrics::new().map_err(|e| format!("cannot create metrics: {e}"))?),
            openapi_json: serde_json::to_string(&crate::app::openapi())
                .map_err(|e| format!("cannot render the OpenAPI document: {e}"))?,
            metrics_public: false,
        })
    }

    /// This state with `/metrics` served without a token (`true`) or only to a valid API
    /// token (`false`, the default).
    pub fn with_metrics_public(mut self, public: bool) -> Self {
        self.metrics_public = public;
        self
    }
}
