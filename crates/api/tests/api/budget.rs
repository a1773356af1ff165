//! `GET|PUT /api/budget` and the repository setting `monthlyBudgetUsd`
//! (docs/contract.md#67-budgets): roles, exact values, and bad input refused with the
//! envelope, changing nothing.

use crate::common::env::json_req;
use crate::common::*;
use serde_json::{Value, json};

#[actix_web::test]
async fn the_instance_budget_is_read_by_viewers_and_set_by_admins() {
    let (_db, t, app) = sqlite_app().await;
    let (status, body) = call(&app, get("/api/budget", &t.viewer)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["monthlyBudgetUsd"], Value::Null);
    assert_eq!(body["monthToDateUsd"], "0");
    assert_eq!(body["reservedUsd"], "0");
    assert_eq!(body["remainingUsd"], Value::Null);
    let month = time::OffsetDateTime::now_utc();
    assert_eq!(
        body["month"],
        format!("{:04}-{:02}", month.year(), u8::from(month.month()))
    );

    let put = |token: &str, value: Value| {
        json_req(
            "PUT",
            "/api/budget",
            token,
            &json!({ "monthlyBudgetUsd": value }),
        )
    };
    let (status, body) = call(&app, put(&t.member, json!("10"))).await;
    assert_eq!(status, 403, "{body}");
    envelope(&body, "forbidden");

    let (status, body) = call(&app, put(&t.admin, json!("500.123456789"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["monthlyBudgetUsd"], "500.123456789");
    assert_eq!(body["remainingUsd"], "500.123456789");
    // Nothing spent yet: a zero forecast and no day it runs out.
    assert_eq!(body["forecastUsd"], "0.0000");
    assert_eq!(body["exhaustsOn"], Value::Null);
    // The cost report lists it too (this month's, whatever the period).
    let (status, report) = client(&app, &t.viewer).report("days=7").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["budgets"],
        json!([{"scope": "instance", "repoUrl": null, "monthlyBudgetUsd": "500.1235",
                "monthToDateUsd": "0.0000", "forecastUsd": "0.0000", "exhaustsOn": null}])
    );

    // Bad values: 400 naming the member; the budget stays as it was.
    for bad in [
        json!("-1"),
        json!("ten"),
        json!("1.0000000001"),
        json!(10),
        json!(""),
    ] {
        let (status, body) = call(&app, put(&t.admin, bad.clone())).await;
        assert_eq!(status, 400, "{bad}: {body}");
        let message = envelope(&body, "invalid_parameter");
        assert!(message.starts_with("monthlyBudgetUsd"), "{message}");
    }
    let (status, body) = call(
        &app,
        json_req("PUT", "/api/budget", &t.admin, &json!({"monthly": "1"})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (_, body) = call(&app, get("/api/budget", &t.viewer)).await;
    assert_eq!(body["monthlyBudgetUsd"], "500.123456789");

    let (status, body) = call(&app, put(&t.admin, Value::Null)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["monthlyBudgetUsd"], Value::Null);
}
