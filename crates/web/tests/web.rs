//! The routes of `agentry_web::configure` on a real actix application: pages, the redirect,
//! assets with their types and validators, the security headers, and what it leaves alone.

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{App, HttpResponse, test, web};

/// The application the tests drive: the web routes, and a default service that marks what
/// fell through (as the API's JSON 404 does in the real application).
fn app() -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .configure(agentry_web::configure)
        .default_service(web::to(|| async {
            HttpResponse::NotFound().body("fell through")
        }))
}

const TASK: &str = "/tasks/0195f3b2-7c1d-7a2e-9f00-1234567890ab";

#[actix_web::test]
async fn every_page_is_the_shell_with_a_strict_policy() {
    let app = test::init_service(app()).await;
    for path in [
        "/costs",
        "/issues",
        "/settings",
        TASK,
        "/costs?days=7&repoUrl=x",
    ] {
        let res = test::call_service(&app, test::TestRequest::get().uri(path).to_request()).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let headers = res.headers().clone();
        assert_eq!(
            headers.get(header::CONTENT_TYPE).unwrap(),
            "text/html; charset=utf-8"
        );
        let csp = headers
            .get(header::CONTENT_SECURITY_POLICY)
            .unwrap()
            .to_str()
            .unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp} lacks {directive}");
        }
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(headers.get(header::CACHE_CONTROL).unwrap(), "no-cache");
        assert!(headers.get(header::ETAG).is_some());
        let body = test::read_body(res).await;
        let html = std::str::from_utf8(&body).unwrap();
        assert!(html.contains(r#"<script type="module" src="/assets/app.js">"#));
    }
}

#[actix_web::test]
async fn the_root_redirects_to_the_costs() {
    let app = test::init_service(app()).await;
    let res = test::call_service(&app, test::TestRequest::get().uri("/").to_request()).await;
    assert_eq!(res.status(), StatusCode::FOUND);
    assert_eq!(res.headers().get(header::LOCATION).unwrap(), "/costs");
}

#[actix_web::test]
async fn assets_have_their_types_and_revalidate_with_a_304() {
    let app = test::init_service(app()).await;
    for (name, ty) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("charts.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let uri = format!("/assets/{name}");
        let res = test::call_service(&app, test::TestRequest::get().uri(&uri).to_request()).await;
        assert_eq!(res.status(), StatusCode::OK, "{uri}");
        assert_eq!(res.headers().get(header::CONTENT_TYPE).unwrap(), ty);
        let etag = res.headers().get(header::ETAG).unwrap().clone();
        assert!(!test::read_body(res).await.is_empty());

        let again = test::TestRequest::get()
            .uri(&uri)
            .insert_header((header::IF_NONE_MATCH, etag.clone()))
            .to_request();
        let res = test::call_service(&app, again).await;
        assert_eq!(res.status(), StatusCode::NOT_MODIFIED, "{uri}");
        assert_eq!(res.headers().get(header::ETAG).unwrap(), &etag);
        assert!(test::read_body(res).await.is_empty());

        let stale = test::TestRequest::get()
            .uri(&uri)
            .insert_header((header::IF_NONE_MATCH, "\"0000\""))
            .to_request();
        assert_eq!(
            test::call_service(&app, stale).await.status(),
            StatusCode::OK
        );
    }
}

#[actix_web::test]
async fn head_answers_the_headers_only() {
    let app = test::init_service(app()).await;
    let req = test::TestRequest::default()
        .method(actix_web::http::Method::HEAD)
        .uri("/costs")
        .to_request();
    let res = test::call_service(&app, req).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get(header::CONTENT_SECURITY_POLICY).is_some());
}

#[actix_web::test]
async fn unknown_paths_are_left_to_the_application() {
    let app = test::init_service(app()).await;
    for path in [
        "/assets/missing.js",
        "/assets/",
        "/tasks/not-a-uuid",
        "/tasks/",
        "/costs/extra",
        "/index.html",
        "/api/anything",
    ] {
        let res = test::call_service(&app, test::TestRequest::get().uri(path).to_request()).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(test::read_body(res).await, "fell through", "{path}");
    }
}

/// Every file the shell or a module refers to (`/assets/…` in the HTML, `./x.js` imports)
/// is served, and nothing names another origin: the pages load nothing from outside.
#[actix_web::test]
async fn every_reference_resolves_and_nothing_comes_from_outside() {
    let app = test::init_service(app()).await;
    let shell =
        test::call_and_read_body(&app, test::TestRequest::get().uri("/costs").to_request()).await;
    let shell = String::from_utf8(shell.to_vec()).unwrap();
    let mut wanted: Vec<String> = references(&shell, "\"/assets/", '"');
    let names: Vec<&str> = agentry_web::asset_names().collect();
    for name in &names {
        let body = test::call_and_read_body(
            &app,
            test::TestRequest::get()
                .uri(&format!("/assets/{name}"))
                .to_request(),
        )
        .await;
        let text = String::from_utf8(body.to_vec()).unwrap();
        if name.ends_with(".js") {
            wanted.extend(references(&text, "from './", '\''));
            wanted.extend(references(&text, "import('./", '\''));
        }
        for line in text.lines() {
            let code = line.trim_start();
            // Comments may cite documentation; code may only name the SVG namespace.
            if code.starts_with("//") || code.starts_with('*') || code.starts_with("/*") {
                continue;
            }
            for scheme in ["http://", "https://"] {
                for (at, _) in code.match_indices(scheme) {
                    let rest = &code[at..];
                    assert!(
                        rest.starts_with("http://www.w3.org/2000/svg")
                            || rest.starts_with("https://github.com/org/repo"),
                        "{name} names another origin: {code}"
                    );
                }
            }
        }
    }
    for file in &wanted {
        assert!(
            names.contains(&file.as_str()),
            "{file} is referred to but not served"
        );
    }
    // And nothing served is unused.
    for name in names {
        assert!(
            wanted.iter().any(|w| w == name),
            "{name} is served but unused"
        );
    }
}

/// The file names after each `prefix` up to `end`.
fn references(text: &str, prefix: &str, end: char) -> Vec<String> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            rest.find(end).map(|stop| rest[..stop].to_owned())
        })
        .collect()
}
