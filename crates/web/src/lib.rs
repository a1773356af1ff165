//! agentry's web frontend: the pages `/costs`, `/issues`, `/tasks/{id}` and `/settings`,
//! static files written for agentry (HTML, CSS and JavaScript modules, no framework, nothing
//! loaded from elsewhere), compiled into the binary so that `agentry serve` serves them with
//! no build step.
//!
//! Every page is the one HTML shell (`index.html`); its script reads the path and draws the
//! page from the JSON API. The same files work from any static host (see docs/frontend.md):
//! the shell's `<meta name="agentry-api-base">` names the API's origin, which then lists the
//! host's origin in `AGENTRY_CORS_ORIGINS`.
//!
//! [`configure`] registers the routes on an actix application. Paths it does not know are
//! left to the application's default service, so they keep the API's JSON 404.

use std::sync::LazyLock;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};

/// One file served under `/assets/`.
struct Asset {
    /// The file name (the URL is `/assets/{name}`).
    name: &'static str,
    /// Its `Content-Type`.
    content_type: &'static str,
    /// Its bytes.
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every asset; [`configure`] serves exactly these.
static ASSETS: &[Asset] = &[
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("format.js", JS),
    asset!("charts.js", JS),
    asset!("costs.js", JS),
    asset!("issues.js", JS),
    asset!("task.js", JS),
    asset!("settings.js", JS),
    asset!("icon.svg", "image/svg+xml"),
];

/// The HTML shell every page is.
static SHELL: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/index.html"));

/// The pages (besides `/`, which redirects to `/costs`). `{id}` is a task id (a UUID);
/// anything else under `/tasks/` is an unknown path.
pub const PAGES: [&str; 4] = [
    "/costs",
    "/issues",
    "/tasks/{id:[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}}",
    "/settings",
];

/// The Content-Security-Policy of every page: everything from this origin only, no inline
/// script or style, no frames, no plugins; the API is this origin too.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// Pages and assets are revalidated on every use (`no-cache` with a strong `ETag`): an
/// upgraded binary is never shown with stale scripts, and an unchanged file costs a 304.
const CACHE_CONTROL: &str = "no-cache";

/// A strong validator of `body`: FNV-1a 64 of its bytes, quoted.
fn etag_of(body: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in body {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("\"{hash:016x}\"")
}

/// The shell's ETag, computed once.
static SHELL_ETAG: LazyLock<String> = LazyLock::new(|| etag_of(SHELL));

/// Each asset's ETag, in the order of [`ASSETS`], computed once.
static ASSET_ETAGS: LazyLock<Vec<String>> =
    LazyLock::new(|| ASSETS.iter().map(|a| etag_of(a.body)).collect());

/// Registers the pages, the `/` redirect and the assets. Only `GET` and `HEAD` are routed;
/// other methods on these paths answer 405, and unknown paths reach the application's default
/// service.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/")
            .route(web::get().to(redirect_to_costs))
            .route(web::head().to(redirect_to_costs)),
    );
    for page in PAGES {
        cfg.service(
            web::resource(page)
                .route(web::get().to(shell))
                .route(web::head().to(shell)),
        );
    }
    for (index, asset) in ASSETS.iter().enumerate() {
        let serve = move |req: HttpRequest| async move { serve_asset(&req, index) };
        cfg.service(
            web::resource(format!("/assets/{}", asset.name))
                .route(web::get().to(serve))
                .route(web::head().to(serve)),
        );
    }
}

/// The names under `/assets/` that [`configure`] serves.
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|a| a.name)
}

async fn redirect_to_costs() -> HttpResponse {
    HttpResponse::Found()
        .insert_header((header::LOCATION, "/costs"))
        .insert_header((header::CACHE_CONTROL, CACHE_CONTROL))
        .finish()
}

async fn shell(req: HttpRequest) -> HttpResponse {
    let mut res = respond(&req, "text/html; charset=utf-8", SHELL, &SHELL_ETAG);
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

fn serve_asset(req: &HttpRequest, index: usize) -> HttpResponse {
    match (ASSETS.get(index), ASSET_ETAGS.get(index)) {
        (Some(asset), Some(etag)) => respond(req, asset.content_type, asset.body, etag),
        // Unreachable: `configure` registers indexes of ASSETS only.
        _ => HttpResponse::NotFound().finish(),
    }
}

/// `body` with its type, ETag and cache policy; 304 when the request's `If-None-Match`
/// names the ETag.
fn respond(
    req: &HttpRequest,
    content_type: &'static str,
    body: &'static [u8],
    etag: &str,
) -> HttpResponse {
    let fresh = req
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == etag || t == "*");
    let status = if fresh {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    };
    let mut res = HttpResponse::build(status);
    res.insert_header((header::CACHE_CONTROL, CACHE_CONTROL));
    if let Ok(value) = HeaderValue::from_str(etag) {
        res.insert_header((header::ETAG, value));
    }
    if fresh {
        return res.finish();
    }
    res.insert_header((header::CONTENT_TYPE, content_type));
    // For HEAD, actix sends the headers (with the body's length) and no body.
    res.body(body)
}
