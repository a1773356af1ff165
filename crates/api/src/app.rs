//! Assembly of the actix application and of its OpenAPI document from one route table.

use std::sync::LazyLock;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::{ErrorHandlers, Next, from_fn};
use actix_web::{App, HttpRequest, HttpResponse, ResponseError, web};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_actix_web::{AppExt, scope};

use crate::dto::names::{TaskStateName, TaskTypeName};
use crate::error::{ApiError, ErrorBody, envelope_fallback};
use crate::routes::webhooks::WebhookLimits;
use crate::routes::{
    self, analytics, budget, health, issues, me, repos, secrets, tasks, tokens, webhooks,
};
use crate::state::AppState;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentry",
        description = "Runs AI coding agents on tasks, records what every run costs, and works \
                       with a code host. Every /api route except /api/openapi.json needs \
                       `Authorization: Bearer <token>`. Errors are \
                       `{\"error\": {\"code\", \"message\"}}`."
    ),
    modifiers(&BearerAuth),
    // Every operation needs a bearer token unless its `#[utoipa::path]` says `security()`.
    security(("bearer" = [])),
    // Schemas named only by query parameters, which utoipa does not collect by itself.
    components(schemas(ErrorBody, TaskStateName, TaskTypeName))
)]
struct ApiDoc;

/// The route table: the one place routes are registered (and so documented).
fn routes(cfg: &mut ServiceConfig) {
    cfg.service(health::healthz)
        .service(health::readyz)
        .service(health::metrics)
        .service(
            scope::scope("/api")
                .service(health::openapi_json)
                // `/tasks/import` before `/tasks/{id}`: the first matching path wins.
                .service(tasks::import_tasks)
                .service(tasks::list_tasks)
                .service(tasks::create_task)
                .service(tasks::get_task)
                .service(tasks::cancel_task)
                .service(tasks::retry_task)
                .service(tasks::task_log)
                .service(tasks::task_calls)
                .service(me::me)
                .service(tokens::create_token)
                .service(tokens::list_tokens)
                .service(tokens::revoke_token)
                .service(analytics::cost_report)
                .service(budget::get_budget)
                .service(budget::put_budget)
                .service(budget::list_budget_alerts)
                .service(secrets::put_secret)
                .service(secrets::list_secrets)
                .service(secrets::delete_secret)
                .service(repos::connect_repo)
                .service(repos::list_repos)
                .service(repos::get_repo)
                .service(repos::disconnect_repo)
                .service(repos::get_settings)
                .service(repos::patch_settings)
                .service(issues::list_issues)
                .service(issues::sync_issues)
                .service(issues::assign_issue)
                .service(webhooks::codehost_webhook)
                .default_service(web::to(no_route)),
        );
}

/// The OpenAPI document of every registered route.
pub fn openapi() -> OpenApiDoc {
    let (_, doc) = App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .configure(routes)
        .split_for_parts();
    doc
}

/// Every documented path as its segments (`{id}` matches any one segment), with its methods.
static KNOWN_PATHS: LazyLock<Vec<(Vec<String>, Vec<&'static str>)>> = LazyLock::new(|| {
    openapi()
        .paths
        .paths
        .iter()
        .map(|(path, item)| {
            let methods = [
                ("GET", item.get.is_some()),
                ("POST", item.post.is_some()),
                ("PUT", item.put.is_some()),
                ("PATCH", item.patch.is_some()),
                ("DELETE", item.delete.is_some()),
            ]
            .into_iter()
            .filter_map(|(m, present)| present.then_some(m))
            .collect();
            (path.split('/').map(str::to_owned).collect(), methods)
        })
        .collect()
});

/// The methods the routes of `path` take (empty when no route has that path). When several
/// documented paths match, the most specific one decides (`/api/tasks/import` over
/// `/api/tasks/{id}`), as the document lists them.
fn allowed_methods(path: &str) -> Vec<&'static str> {
    let segments: Vec<&str> = path.split('/').collect();
    let mut best: Option<(usize, Vec<&'static str>)> = None;
    for (pattern, methods) in KNOWN_PATHS.iter() {
        let matches = pattern.len() == segments.len()
            && pattern.iter().zip(&segments).all(|(p, s)| {
                if p.starts_with('{') && p.ends_with('}') {
                    !s.is_empty()
                } else {
                    p == s
                }
            });
        if !matches {
            continue;
        }
        let literal = pattern.iter().filter(|p| !p.starts_with('{')).count();
        match &mut best {
            Some((most, allowed)) if *most == literal => {
                for m in methods {
                    if !allowed.contains(m) {
                        allowed.push(m);
                    }
                }
            }
            Some((most, _)) if *most > literal => {}
            _ => best = Some((literal, methods.clone())),
        }
    }
    let mut allowed = best.map(|(_, allowed)| allowed).unwrap_or_default();
    const ORDER: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
    allowed.sort_by_key(|m| ORDER.iter().position(|o| o == m));
    allowed
}

/// The answer when no route matched: 405 `method_not_allowed` with `Allow` when the path
/// exists with other methods (`TRACE /api/tasks`), else 404.
async fn no_route(req: HttpRequest) -> HttpResponse {
    let allowed = allowed_methods(req.path());
    // A documented method that reached this fallback is not served: a missing route.
    if allowed.is_empty() || allowed.contains(&req.method().as_str()) {
        return routes::unknown_route(req).await;
    }
    let allow = allowed.join(", ");
    let mut res = ApiError::method_not_allowed(format!(
        "{} does not take {}; it takes {allow}",
        req.path(),
        req.method()
    ))
    .error_response();
    if let Ok(value) = HeaderValue::from_str(&allow) {
        res.headers_mut().insert(header::ALLOW, value);
    }
    res
}

/// Middleware: `X-Content-Type-Options: nosniff` on every response, and
/// `Cache-Control: no-store` on every `/api/` response (they carry tokens, secrets' names and
/// costs, which no cache should keep).
async fn security_headers(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let api = req.path() == "/api" || req.path().starts_with("/api/");
    let mut res = next.call(req).await?;
    let headers = res.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if api {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    Ok(res)
}

/// The service factory inside the application [`build_app`] builds, whatever the type of
/// its responses' bodies (what an `HttpServer` or a test service takes).
pub trait AppFactory:
    ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<Self::Body>,
        Error = actix_web::Error,
        InitError = (),
    >
{
    /// The body of its responses.
    type Body: MessageBody;
}

impl<T, B> AppFactory for T
where
    T: ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<B>,
            Error = actix_web::Error,
            InitError = (),
        >,
    B: MessageBody,
{
    type Body = B;
}

/// The application: routes, shared state, CORS for the configured origins, metrics and
/// request logging, and the error envelope for every error; the webhook gets limits of its
/// own (see [`build_app_with`] to share them between the workers of a server).
pub fn build_app(state: web::Data<AppState>, cors_origins: Vec<String>) -> App<impl AppFactory> {
    build_app_with(
        state,
        cors_origins,
        web::Data::new(WebhookLimits::default()),
    )
}

/// [`build_app`] with the webhook's `limits` (one value for all the workers of a server).
pub fn build_app_with(
    state: web::Data<AppState>,
    cors_origins: Vec<String>,
    limits: web::Data<WebhookLimits>,
) -> App<impl AppFactory> {
    let (app, _) = App::new()
        .into_utoipa_app()
        .configure(routes)
        .split_for_parts();
    // The web pages and their assets: served, but no part of the API's document.
    let app = app.configure(agentry_web::configure);
    let mut cors = actix_cors::Cors::default()
        .allow_any_header()
        .allowed_methods(["GET", "POST", "PUT", "PATCH", "DELETE"])
        .max_age(3600);
    for origin in cors_origins {
        cors = cors.allowed_origin(&origin);
    }
    let metrics = web::Data::from(state.metrics.clone());
    app.app_data(state)
        .app_data(metrics)
        .app_data(limits)
        .default_service(web::to(no_route))
        .wrap(ErrorHandlers::new().default_handler(envelope_fallback))
        .wrap(cors)
        .wrap(from_fn(security_headers))
        .wrap(from_fn(crate::metrics::track))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document needs the bearer token for every operation but the health checks, the
    /// document itself and the code host's (signed) webhook, which opt out with an empty
    /// list.
    #[test]
    fn every_operation_but_the_public_ones_needs_the_bearer_token() {
        let doc = serde_json::to_value(openapi()).expect("the document serialises");
        assert_eq!(doc["security"], serde_json::json!([{ "bearer": [] }]));
        let mut public = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                match op.get("security") {
                    None => {}
                    Some(s) if s == &serde_json::json!([]) => {
                        public.push(format!("{method} {path}"))
                    }
                    Some(other) => panic!("{method} {path}: {other}"),
                }
            }
        }
        public.sort();
        assert_eq!(
            public,
            [
                "get /api/openapi.json",
                "get /healthz",
                "get /readyz",
                "post /api/webhooks/codehost"
            ]
        );
    }
}
