//! Assembly of the actix application and of its OpenAPI document from one route table.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::{ErrorHandlers, from_fn};
use actix_web::{App, web};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_actix_web::{AppExt, scope};

use crate::error::{ErrorBody, envelope_fallback};
use crate::routes::{self, analytics, health, issues, repos, secrets, tasks, tokens, webhooks};
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
    components(schemas(ErrorBody))
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
                .service(tokens::create_token)
                .service(tokens::list_tokens)
                .service(tokens::revoke_token)
                .service(analytics::cost_report)
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
                .default_service(web::to(routes::unknown_route)),
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

/// The application: routes, shared state, CORS for the configured origins, metrics and
/// request logging, and the error envelope for every error.
pub fn build_app(
    state: web::Data<AppState>,
    cors_origins: Vec<String>,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let (app, _) = App::new()
        .into_utoipa_app()
        .configure(routes)
        .split_for_parts();
    let mut cors = actix_cors::Cors::default()
        .allow_any_header()
        .allowed_methods(["GET", "POST", "PUT", "PATCH", "DELETE"])
        .max_age(3600);
    for origin in cors_origins {
        cors = cors.allowed_origin(&origin);
    }
    app.app_data(state)
        .default_service(web::to(routes::unknown_route))
        .wrap(ErrorHandlers::new().default_handler(envelope_fallback))
        .wrap(cors)
        .wrap(from_fn(crate::metrics::track))
}
