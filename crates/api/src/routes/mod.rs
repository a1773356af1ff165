//! HTTP handlers, one module per resource. Every handler is annotated for OpenAPI and
//! registered through `utoipa_actix_web`, so registering a route documents it.

pub mod analytics;
pub mod budget;
pub mod health;
pub mod issues;
pub mod me;
pub mod repos;
pub mod secrets;
pub mod tasks;
pub mod tokens;
pub mod webhooks;

use actix_web::HttpResponse;
use actix_web::ResponseError;
use uuid::Uuid;

use crate::error::ApiError;

/// Parses a path segment as a UUID, naming the parameter on failure.
pub(crate) fn path_uuid(name: &str, value: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(value).map_err(|_| ApiError::invalid_parameter(name, "must be a UUID"))
}

/// The answer for a route that does not exist.
pub(crate) async fn unknown_route(req: actix_web::HttpRequest) -> HttpResponse {
    ApiError::not_found(format!("no route {} {}", req.method(), req.path())).error_response()
}
