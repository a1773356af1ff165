//! `GET /api/me` (docs/contract.md#310-api-tokens): the calling token's name and role, for
//! every role; without a valid token the 401 envelope.

use crate::common::*;
use actix_web::test::TestRequest;
use serde_json::json;

#[actix_web::test]
async fn me_names_the_calling_token_and_its_role() {
    let (_db, t, app) = sqlite_app().await;
    // `tokens` names each token after its role.
    for (token, role) in [
        (&t.viewer, "viewer"),
        (&t.member, "member"),
        (&t.admin, "admin"),
    ] {
        let (status, body) = call(&app, get("/api/me", token)).await;
        assert_eq!(status, 200, "{role}: {body}");
        assert_eq!(body, json!({ "name": role, "role": role }));
    }
}

#[actix_web::test]
async fn me_without_a_valid_token_is_the_401_envelope() {
    let (_db, t, app) = sqlite_app().await;
    assert_unauthenticated(&app, anonymous_get("/api/me")).await;
    for header in [
        "Bearer agt_nope".to_owned(),
        format!("Basic {}", t.admin),
        "Bearer ".to_owned(),
    ] {
        let req = TestRequest::get()
            .uri("/api/me")
            .insert_header(("Authorization", header.as_str()))
            .to_request();
        let (status, body) = call(&app, req).await;
        assert_eq!(status, 401, "{header}: {body}");
        envelope(&body, "unauthenticated");
    }
    // A revoked token is refused too.
    let (status, list) = call(&app, get("/api/tokens", &t.admin)).await;
    assert_eq!(status, 200, "{list}");
    let viewer_id = list["tokens"]
        .as_array()
        .and_then(|all| all.iter().find(|x| x["name"] == "viewer"))
        .map(|x| x["id"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let revoke = TestRequest::delete()
        .uri(&format!("/api/tokens/{viewer_id}"))
        .insert_header(("Authorization", format!("Bearer {}", t.admin)))
        .to_request();
    let (status, _) = call(&app, revoke).await;
    assert_eq!(status, 204);
    assert_unauthenticated(&app, get("/api/me", &t.viewer)).await;
}
