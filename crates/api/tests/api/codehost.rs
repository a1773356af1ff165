//! The code-host capability end to end, in process, against the fake GitHub over HTTP on
//! 127.0.0.1: secrets, repositories and settings, the issues view and its sync, assignment,
//! and the outbox's exactly-once label and comment (docs/contract.md#33-secrets–#37-assign, #51-token–#54-effects-of-assignment).

use crate::common::env::*;
use crate::common::rig::{COMMENTS, ISSUE_LABELS};
use crate::common::*;
use actix_web::test::TestRequest;
use agentry_fake_github::Fault;
use agentry_persistence::secrets;
use agentry_persistence::test_support::TestDb;
use agentry_testkit::json::elements_of;
use serde_json::{Value, json};
use uuid::Uuid;

fn assign_body(repo: Uuid, number: u64) -> Value {
    json!({ "issueNumber": number, "repoId": repo, "title": "Fix the login redirect", "body": "It loops." })
}

#[actix_web::test]
async fn secrets_are_checked_encrypted_and_never_returned() {
    let env = Env::new(sqlite());
    let app = service_with(env.state.clone()).await;
    let admin = client(&app, &env.t.admin);

    // A token the code host refuses is not stored.
    let (status, body) = admin.put_secret("CODEHOST_TOKEN", "ghp_unknown").await;
    assert_eq!(status, 422, "{body}");
    envelope(&body, "codehost_rejected");
    assert_eq!(env.count("secrets"), 0);

    // A good one is checked with GET /user and stored encrypted.
    let (status, body) = admin.put_secret("CODEHOST_TOKEN", GH_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "CODEHOST_TOKEN");
    assert!(!body.to_string().contains(GH_TOKEN));
    assert_eq!(env.fake.count("GET", "/user"), 2);
    let (status, body) = admin.get("/api/secrets").await;
    assert_eq!(status, 200);
    assert_eq!(body["secrets"].as_array().unwrap().len(), 1);
    assert_eq!(body["secrets"][0].as_object().unwrap().len(), 3, "{body}");
    assert!(!body.to_string().contains(GH_TOKEN));

    // Other secrets are stored without a code-host call; names are checked.
    let (status, _) = admin.put_secret("ANTHROPIC_API_KEY", "sk-ant-x").await;
    assert_eq!(status, 200);
    assert_eq!(env.fake.count("GET", "/user"), 2);

    // The code host down: 503, nothing stored or replaced.
    env.fake
        .fail_next(Some(("GET", "/user")), 10, Fault::Status(502));
    let (status, body) = admin.put_secret("CODEHOST_TOKEN", "ghp_other").await;
    assert_eq!(status, 503, "{body}");
    envelope(&body, "codehost_unavailable");
    env.fake.clear_faults();
    let stored = secrets::get(
        &mut env.db().conn().unwrap(),
        env.state.service.master_key(),
        "CODEHOST_TOKEN",
    )
    .unwrap()
    .unwrap();
    assert_eq!(stored.expose(), GH_TOKEN);

    let (status, _) = call(
        &app,
        bare("DELETE", "/api/secrets/ANTHROPIC_API_KEY", &env.t.admin),
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = call(
        &app,
        bare("DELETE", "/api/secrets/ANTHROPIC_API_KEY", &env.t.admin),
    )
    .await;
    assert_eq!(status, 404);
    envelope(&body, "not_found");
}

#[actix_web::test]
async fn repositories_connect_once_and_settings_change_all_or_nothing() {
    let env = Env::new(sqlite());
    let app = service_with(env.state.clone()).await;
    let admin = client(&app, &env.t.admin);

    // No token yet: 412, nothing written.
    let (status, body) = admin.connect_repo("https://github.com/acme/web").await;
    assert_eq!(status, 412);
    envelope(&body, "codehost_token_missing");
    env.store_token();

    let (status, body) = admin.connect_repo("https://github.com/acme/missing").await;
    assert_eq!(status, 422, "{body}");
    envelope(&body, "codehost_rejected");
    assert_eq!(env.count("repositories"), 0);

    env.fake.set_default_branch("acme", "web", "trunk");
    let (status, first) = admin.connect_repo("git@github.com:Acme/Web.git").await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["repoUrl"], "https://github.com/acme/web");
    assert_eq!(first["defaultBranch"], "trunk");
    assert_eq!(first["cloneUrl"], "https://github.com/acme/web.git");
    assert_eq!(first["settings"]["codingModel"], "sonnet");
    let (status, again) = admin.connect_repo("https://github.com/acme/web/").await;
    assert_eq!((status, &again["id"]), (200, &first["id"]));
    assert_eq!(env.count("repositories"), 1);

    let id = first["id"].as_str().unwrap().to_owned();
    let (status, list) = call(&app, get("/api/repos", &env.t.viewer)).await;
    assert_eq!((status, list["repos"].as_array().unwrap().len()), (200, 1));
    let (status, one) = call(&app, get(&format!("/api/repos/{id}"), &env.t.viewer)).await;
    assert_eq!((status, &one["id"]), (200, &first["id"]));

    // Settings: a valid subset changes; any bad member changes nothing.
    let settings_path = format!("/api/repos/{id}/settings");
    let (status, s) = call(&app, json_req("PATCH", &settings_path, &env.t.admin, &json!({ "reviewModel": "haiku-4-5", "maxTurnsCoding": null, "maxCostPerTaskUsd": "2.50" }))).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        (
            s["reviewModel"].as_str(),
            s["maxTurnsCoding"].is_null(),
            s["maxCostPerTaskUsd"].as_str()
        ),
        (Some("haiku-4-5"), true, Some("2.5"))
    );
    for (bad, field) in [
        (json!({ "codingModel": "" }), "codingModel"),
        (json!({ "maxTurnsReview": 0 }), "maxTurnsReview"),
        (json!({ "maxTurnsReview": 1001 }), "maxTurnsReview"),
        (json!({ "maxTurnsCoding": 5.5 }), "maxTurnsCoding"),
        (json!({ "agentType": "gpt" }), "agentType"),
        (json!({ "autoReview": "yes" }), "autoReview"),
        (json!({ "maxCostPerTaskUsd": "0" }), "maxCostPerTaskUsd"),
        (json!({ "maxCostPerTaskUsd": 5 }), "maxCostPerTaskUsd"),
        (
            json!({ "egressAllow": ["pypi.org", "https://x"] }),
            "egressAllow[1]: a URL",
        ),
        (
            json!({ "egressAllow": "pypi.org" }),
            "egressAllow: must be an array",
        ),
        (json!({ "codingModel": "opus", "color": "red" }), "color"),
    ] {
        let (status, body) =
            call(&app, json_req("PATCH", &settings_path, &env.t.admin, &bad)).await;
        assert_eq!(status, 400, "{bad}");
        assert!(
            envelope(&body, "invalid_parameter").starts_with(field),
            "{body}"
        );
    }
    // Not an object: refused by the body extractor, as every body of the API.
    let bad = json!(["codingModel"]);
    let (status, body) = call(&app, json_req("PATCH", &settings_path, &env.t.admin, &bad)).await;
    assert_eq!(status, 400, "{bad}");
    assert!(envelope(&body, "invalid_request").contains("must be a JSON object"));
    let (_, unchanged) = call(&app, get(&settings_path, &env.t.viewer)).await;
    assert_eq!(unchanged, s);
    let (status, _) = call(
        &app,
        json_req(
            "PATCH",
            &settings_path,
            &env.t.member,
            &json!({ "autoReview": false }),
        ),
    )
    .await;
    assert_eq!(status, 403);

    // Disconnecting keeps the row; the list no longer shows it; connecting again revives it.
    let del = bare("DELETE", &format!("/api/repos/{id}"), &env.t.admin);
    let (status, gone) = call(&app, del).await;
    assert_eq!(status, 200);
    assert!(gone["disconnectedAt"].is_string());
    let (_, list) = call(&app, get("/api/repos", &env.t.viewer)).await;
    assert_eq!(list["repos"].as_array().unwrap().len(), 0);
    let (status, back) = admin.connect_repo("https://github.com/acme/web").await;
    assert_eq!((status, &back["id"]), (200, &first["id"]));
    assert!(back["disconnectedAt"].is_null());
    assert_eq!(back["settings"]["reviewModel"], "haiku-4-5");
}

/// `allowProviderTools` is off for a new repository; an admin turns it on and off through
/// the settings, a non-boolean is a 400 naming it that changes nothing, and a member may not
/// change it. The document's settings schema lists exactly the members the API serves, all
/// required.
#[actix_web::test]
async fn settings_allow_provider_tools_is_off_until_an_admin_turns_it_on() {
    let (env, id) = Env::connected(sqlite());
    let app = service_with(env.state.clone()).await;
    let path = format!("/api/repos/{id}/settings");
    let (status, initial) = call(&app, get(&path, &env.t.viewer)).await;
    assert_eq!(status, 200, "{initial}");
    assert_eq!(initial["allowProviderTools"], false);
    let (_, repo) = call(&app, get(&format!("/api/repos/{id}"), &env.t.viewer)).await;
    assert_eq!(repo["settings"], initial);

    let patch = |token: &str, body: Value| json_req("PATCH", &path, token, &body);
    let (status, on) = call(
        &app,
        patch(&env.t.admin, json!({ "allowProviderTools": true })),
    )
    .await;
    assert_eq!(status, 200, "{on}");
    assert_eq!(on["allowProviderTools"], true);
    let mut expected = initial.clone();
    expected["allowProviderTools"] = json!(true);
    assert_eq!(on, expected, "nothing else changed");
    let (_, stored) = call(&app, get(&path, &env.t.viewer)).await;
    assert_eq!(stored, on);

    for bad in [json!("true"), json!(1), json!(null)] {
        let (status, body) = call(
            &app,
            patch(
                &env.t.admin,
                json!({ "allowProviderTools": bad, "autoReview": false }),
            ),
        )
        .await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(
            envelope(&body, "invalid_parameter"),
            "allowProviderTools: must be true or false"
        );
    }
    let (status, _) = call(
        &app,
        patch(&env.t.member, json!({ "allowProviderTools": false })),
    )
    .await;
    assert_eq!(status, 403);
    let (_, unchanged) = call(&app, get(&path, &env.t.viewer)).await;
    assert_eq!(unchanged, on);

    let (status, off) = call(
        &app,
        patch(&env.t.admin, json!({ "allowProviderTools": false })),
    )
    .await;
    assert_eq!((status, off), (200, initial.clone()));

    let doc = serde_json::to_value(agentry_api::app::openapi()).unwrap();
    let schema = &doc["components"]["schemas"]["RepoSettingsDto"];
    let mut served: Vec<&str> = initial
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    served.sort_unstable();
    let mut documented: Vec<&str> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    documented.sort_unstable();
    assert_eq!(documented, served);
    let mut required: Vec<&str> = elements_of(schema, "required")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, served);
    assert_eq!(
        schema["properties"]["allowProviderTools"]["type"],
        "boolean"
    );
    for (route, method) in [("get", "200"), ("patch", "200")] {
        assert_eq!(
            doc["paths"]["/api/repos/{id}/settings"][route]["responses"][method]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/RepoSettingsDto"
        );
    }
    let patch_doc = doc["paths"]["/api/repos/{id}/settings"]["patch"]["requestBody"]["description"]
        .as_str()
        .unwrap();
    for member in &served {
        assert!(patch_doc.contains(member), "{member}: {patch_doc}");
    }
}

async fn fifty_concurrent_assignments_make_one_task_one_label_one_comment(db: TestDb) {
    let (env, repo) = Env::connected(db);
    let number = env.fake.add_issue(
        "acme",
        "web",
        "Fix the login redirect",
        Some("It loops."),
        &[],
    );
    let app = service_with(env.state.clone()).await;

    let (member, body) = (client(&app, &env.t.member), assign_body(repo, number));
    let answers = futures_util::future::join_all((0..50).map(|_| member.assign(&body))).await;
    let created: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|(s, b)| (*s == 200 && b["created"] == false) || *s == 201),
        "{answers:?}"
    );
    let task_id = created[0]["task"]["id"].clone();
    assert!(answers.iter().all(|(_, b)| b["task"]["id"] == task_id));
    assert_eq!(created[0]["task"]["state"], "queued");
    assert_eq!(created[0]["task"]["issueNumber"], number);
    assert_eq!(created[0]["task"]["prompt"], "It loops.");
    // The issue was not in the synced view yet: its repository was synced to find it.
    assert_eq!(env.written()[2..], [1, 2, 1, 1]);

    // Nothing reaches the code host before the outbox runs; then exactly once each.
    assert_eq!(env.fake.count("POST", COMMENTS), 0);
    assert_eq!(env.deliver(0).await, 2);
    let issue = env.fake.issue("acme", "web", number).unwrap();
    assert_eq!(issue.labels, [("agentry".to_owned(), "6f42c1".to_owned())]);
    assert_eq!(
        env.fake.labels("acme", "web"),
        [("agentry".to_owned(), "6f42c1".to_owned())]
    );
    let comments = env.comments_of(number);
    assert_eq!(comments.len(), 1);
    assert!(comments[0].contains(task_id.as_str().unwrap()));
    assert_eq!(env.fake.count("POST", ISSUE_LABELS), 1);
    assert_eq!(env.fake.count("POST", COMMENTS), 1);

    // Re-assignment: 200, nothing created, nothing posted.
    let (status, body) = client(&app, &env.t.member)
        .assign(&assign_body(repo, number))
        .await;
    assert_eq!(
        (status, &body["created"], &body["task"]["id"]),
        (200, &json!(false), &task_id)
    );
    assert_eq!(env.deliver(3600).await, 0);
    assert_eq!(env.fake.count("POST", COMMENTS), 1);
    assert_eq!(env.written()[2..], [1, 2, 1, 1]);
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    fifty_concurrent_assignments_make_one_task_one_label_one_comment
);

async fn labelling_an_issue_on_the_code_host_then_syncing_makes_exactly_one_task(db: TestDb) {
    let (env, repo) = Env::connected(db);
    let plain = env
        .fake
        .add_issue("acme", "web", "Not for agents", None, &["bug"]);
    let labelled = env
        .fake
        .add_issue("acme", "web", "Add dark mode", Some("Please."), &[]);
    let app = service_with(env.state.clone()).await;
    let sync = || bare("POST", "/api/issues/sync", &env.t.member);

    let (status, view) = call(&app, sync()).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["issues"].as_array().unwrap().len(), 2);
    assert_eq!(env.count("tasks"), 0);

    env.fake.add_label("acme", "web", labelled, "agentry");
    let (_, view) = call(&app, sync()).await;
    assert_eq!(env.count("tasks"), 1);
    let linked: Vec<&Value> = elements_of(&view, "issues")
        .iter()
        .filter(|i| !i["task"].is_null())
        .collect();
    assert_eq!(linked.len(), 1);
    assert_eq!(linked[0]["number"], labelled);
    assert_eq!(linked[0]["task"]["state"], "queued");
    // Issues without a task come first.
    assert_eq!(view["issues"][0]["number"], plain);
    assert!(view["syncedAt"][repo.to_string()].is_string());
    assert_eq!(view["errors"], json!([]));

    // Syncing again (changed or not) makes no second task; the comment is posted once.
    call(&app, sync()).await;
    env.fake.add_issue("acme", "web", "Another", None, &[]);
    call(&app, sync()).await;
    assert_eq!(env.count("tasks"), 1);
    assert_eq!(env.deliver(0).await, 2);
    assert_eq!(env.comments_of(labelled).len(), 1);

    // An issue closed on the code host leaves the view.
    env.fake.close_issue("acme", "web", plain);
    let (_, view) = call(&app, get("/api/issues", &env.t.viewer)).await;
    assert_eq!(
        view["issues"].as_array().unwrap().len(),
        3,
        "the view reads the synced copy"
    );
    let (_, view) = call(&app, sync()).await;
    let numbers = numbers_of(&view);
    assert!(!numbers.contains(&plain), "{view}");
    assert_eq!(numbers.len(), 2);
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    labelling_an_issue_on_the_code_host_then_syncing_makes_exactly_one_task
);

#[actix_web::test]
async fn one_repository_failing_does_not_stop_the_others() {
    let env = Env::new(sqlite());
    env.store_token();
    env.fake.add_repo("acme", "api", "main");
    let good = env.connect("acme", "web");
    let bad = env.connect("acme", "api");
    env.fake.add_issue("acme", "web", "Works", None, &[]);
    env.fake.fail_next(
        Some(("GET", "/repos/acme/api/issues")),
        100,
        Fault::Status(500),
    );
    let app = service_with(env.state.clone()).await;
    let (status, view) = call(&app, bare("POST", "/api/issues/sync", &env.t.admin)).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["issues"].as_array().unwrap().len(), 1);
    assert_eq!(view["errors"].as_array().unwrap().len(), 1, "{view}");
    assert_eq!(view["errors"][0]["repoId"], bad.to_string());
    assert!(view["syncedAt"][good.to_string()].is_string());
    assert!(view["syncedAt"].get(bad.to_string()).is_none());
    // Filtered to one repository.
    let (status, one) = call(
        &app,
        get(&format!("/api/issues?repoId={good}"), &env.t.viewer),
    )
    .await;
    assert_eq!((status, one["errors"].as_array().unwrap().len()), (200, 0));
    // Once it recovers, the error clears.
    env.fake.clear_faults();
    let (_, view) = call(&app, bare("POST", "/api/issues/sync", &env.t.admin)).await;
    assert_eq!(view["errors"], json!([]));
}

/// The numbers of the issues of a view, in order.
fn numbers_of(view: &Value) -> Vec<u64> {
    elements_of(view, "issues")
        .iter()
        .map(|i| i["number"].as_u64().unwrap())
        .collect()
}

async fn changes_on_the_second_page_within_one_second_reach_the_view_at_the_next_sync(db: TestDb) {
    let (env, repo) = Env::connected(db);
    // GitHub's timestamps have whole seconds and it does not order one second's updates:
    // the fake puts them by number, so an update does not move an issue to the front.
    env.fake.freeze_clock();
    env.fake.order_same_second_by_number(true);
    for n in 1..=11 {
        env.fake
            .add_issue("acme", "web", &format!("Old {n}"), None, &[]);
    }
    env.fake.advance_clock(std::time::Duration::from_secs(60));
    // 100 issues of one second fill the first page (newest first): #111 … #12.
    for n in 12..=111 {
        env.fake
            .add_issue("acme", "web", &format!("Issue {n}"), None, &[]);
    }
    let app = service_with(env.state.clone()).await;
    let sync = || bare("POST", "/api/issues/sync?limit=200", &env.t.member);
    let (status, view) = call(&app, sync()).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(numbers_of(&view).len(), 111);

    // In that same second, on page 2: #5 gets the service's label, #3 is closed. The
    // first page of the open-issue list is unchanged.
    env.fake.add_label("acme", "web", 5, "agentry");
    env.fake.close_issue("acme", "web", 3);
    let (status, view) = call(&app, sync()).await;
    assert_eq!(status, 200, "{view}");
    let numbers = numbers_of(&view);
    assert_eq!(numbers.len(), 110, "the closed issue left the view");
    assert!(!numbers.contains(&3));
    let five = elements_of(&view, "issues")
        .iter()
        .find(|i| i["number"] == 5)
        .unwrap();
    assert_eq!(five["labels"][0]["name"], "agentry", "{five}");
    assert_eq!(five["task"]["state"], "queued", "{five}");
    assert_eq!(env.count("tasks"), 1);
    assert_eq!(view["errors"], json!([]));
    assert!(view["syncedAt"][repo.to_string()].is_string());
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    changes_on_the_second_page_within_one_second_reach_the_view_at_the_next_sync
);

#[actix_web::test]
async fn the_issues_view_is_paginated_in_its_order_and_refuses_bad_bounds() {
    let env = Env::new(sqlite());
    env.store_token_and_connect();
    for n in 1..=7 {
        env.fake
            .add_issue("acme", "web", &format!("Issue {n}"), None, &[]);
        env.fake.advance_clock(std::time::Duration::from_secs(1));
    }
    env.fake.add_label("acme", "web", 4, "agentry");
    let app = service_with(env.state.clone()).await;
    // The sync answers the first page.
    let (status, first) = call(
        &app,
        bare("POST", "/api/issues/sync?limit=3", &env.t.member),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(numbers_of(&first), [7, 6, 5]);
    assert!(first["nextCursor"].is_string());
    let (_, all) = call(&app, get("/api/issues", &env.t.viewer)).await;
    assert_eq!(
        numbers_of(&all),
        [7, 6, 5, 3, 2, 1, 4],
        "unassigned first, newest first"
    );
    assert!(all["nextCursor"].is_null());
    // Page by page, the same order.
    let mut seen = Vec::new();
    let mut path = "/api/issues?limit=2".to_owned();
    loop {
        let (status, page) = call(&app, get(&path, &env.t.viewer)).await;
        assert_eq!(status, 200, "{page}");
        let numbers = numbers_of(&page);
        assert!(numbers.len() <= 2);
        seen.extend(numbers);
        match page["nextCursor"].as_str() {
            Some(c) => path = format!("/api/issues?limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, numbers_of(&all));
    // Bounds are refused, never clamped.
    let garbage = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("1:x:3:https://github.com/a/b")
    };
    for query in [
        "limit=0".to_owned(),
        "limit=201".to_owned(),
        "limit=ten".to_owned(),
        "cursor=%%%".to_owned(),
        "cursor=bm90IGEgY3Vyc29y".to_owned(),
        format!("cursor={garbage}"),
    ] {
        let (status, body) = call(&app, get(&format!("/api/issues?{query}"), &env.t.viewer)).await;
        assert_eq!(status, 400, "{query}: {body}");
        envelope(&body, "invalid_parameter");
    }
    let (status, body) = call(
        &app,
        bare("POST", "/api/issues/sync?limit=500", &env.t.member),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    envelope(&body, "invalid_parameter");
}

async fn only_known_open_issues_are_assigned(db: TestDb) {
    let (env, repo) = Env::connected(db);
    let issue = env.fake.add_issue("acme", "web", "Real", None, &[]);
    let pull = env
        .fake
        .add_pull("acme", "web", "A pull", "feature", "main");
    let closed = env.fake.add_issue("acme", "web", "Done", None, &[]);
    env.fake.close_issue("acme", "web", closed);
    let app = service_with(env.state.clone()).await;
    let (status, _) = call(&app, bare("POST", "/api/issues/sync", &env.t.member)).await;
    assert_eq!(status, 200);
    env.fake.reset_counts();

    // A pull request's number, a closed issue, a number that does not exist: 404, and
    // nothing created, labelled or commented on.
    for number in [pull, closed, 999] {
        let (status, body) = client(&app, &env.t.member)
            .assign(&assign_body(repo, number))
            .await;
        assert_eq!(status, 404, "#{number}: {body}");
        let message = envelope(&body, "not_found");
        assert!(message.contains(&format!("#{number}")), "{message}");
    }
    assert_eq!(env.count("tasks"), 0);
    assert_eq!(env.count("outbox"), 0);
    assert_eq!(env.count("issue_links"), 0);
    assert_eq!(env.deliver(3600).await, 0);
    let writes: Vec<_> = env
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .collect();
    assert!(writes.is_empty(), "{writes:?}");

    // An issue opened on the code host after the last sync: looked up, then assigned.
    let fresh = env.fake.add_issue("acme", "web", "New", None, &[]);
    let (status, body) = client(&app, &env.t.member)
        .assign(&assign_body(repo, fresh))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["task"]["issueNumber"], fresh);
    // A known one is assigned without asking the code host.
    env.fake.reset_counts();
    let (status, _) = client(&app, &env.t.member)
        .assign(&assign_body(repo, issue))
        .await;
    assert_eq!(status, 201);
    assert_eq!(env.fake.requests().len(), 0);
    assert_eq!(env.count("tasks"), 2);
}

agentry_testkit::on_both_backends!(
    #[actix_web::test]
    only_known_open_issues_are_assigned
);

#[actix_web::test]
async fn bad_input_on_every_code_host_endpoint_is_a_4xx_envelope_and_writes_nothing() {
    let (env, repo) = Env::connected(sqlite());
    let app = service_with(env.state.clone()).await;
    let before = env.written();
    let missing = Uuid::new_v4();
    let (a, m, v) = (&env.t.admin, &env.t.member, &env.t.viewer);
    /// A refusal: its status and error code.
    type Refusal = (u16, &'static str);
    const BAD_PARAMETER: Refusal = (400, "invalid_parameter");
    const BAD_REQUEST: Refusal = (400, "invalid_request");
    const FORBIDDEN: Refusal = (403, "forbidden");
    const NOT_FOUND: Refusal = (404, "not_found");
    const NO_BODY: Value = Value::Null;
    let cases: Vec<(&str, String, &String, Value, Refusal)> = vec![
        (
            "PUT",
            "/api/secrets/CODEHOST_TOKEN".into(),
            m,
            json!({ "value": GH_TOKEN }),
            FORBIDDEN,
        ),
        (
            "PUT",
            "/api/secrets/lower_case".into(),
            a,
            json!({ "value": "x" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/X".into(),
            a,
            json!({ "value": "" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/X".into(),
            a,
            json!({ "value": 5 }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/X".into(),
            a,
            json!({ "val": "x" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/X".into(),
            a,
            json!({ "value": "x".repeat(20_000) }),
            BAD_PARAMETER,
        ),
        // A secret sent as a header value is visible ASCII, nothing else (before, an inner
        // space or a control character in the token answered 500, and a model key with a
        // trailing line break was stored and failed every model call).
        (
            "PUT",
            "/api/secrets/CODEHOST_TOKEN".into(),
            a,
            json!({ "value": "ghp_abc def" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/CODEHOST_TOKEN".into(),
            a,
            json!({ "value": "ghp_\u{0}x" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/CODEHOST_TOKEN".into(),
            a,
            json!({ "value": "ghp_\u{e4}" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/ANTHROPIC_API_KEY".into(),
            a,
            json!({ "value": "sk-ant-key\n" }),
            BAD_PARAMETER,
        ),
        (
            "PUT",
            "/api/secrets/OPENAI_API_KEY".into(),
            a,
            json!({ "value": "sk-key\twith-tab" }),
            BAD_PARAMETER,
        ),
        ("GET", "/api/secrets".into(), m, NO_BODY, FORBIDDEN),
        (
            "DELETE",
            "/api/secrets/bad-name".into(),
            a,
            NO_BODY,
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/repos".into(),
            m,
            json!({ "repoUrl": "https://github.com/acme/web" }),
            FORBIDDEN,
        ),
        (
            "POST",
            "/api/repos".into(),
            a,
            json!({ "repoUrl": "not a url" }),
            BAD_PARAMETER,
        ),
        ("POST", "/api/repos".into(), a, json!({}), BAD_REQUEST),
        (
            "POST",
            "/api/repos".into(),
            a,
            json!({ "repoUrl": 7 }),
            BAD_PARAMETER,
        ),
        ("GET", "/api/repos/nope".into(), v, NO_BODY, BAD_PARAMETER),
        (
            "GET",
            format!("/api/repos/{missing}"),
            v,
            NO_BODY,
            NOT_FOUND,
        ),
        (
            "DELETE",
            format!("/api/repos/{missing}"),
            a,
            NO_BODY,
            NOT_FOUND,
        ),
        (
            "DELETE",
            format!("/api/repos/{repo}"),
            m,
            NO_BODY,
            FORBIDDEN,
        ),
        (
            "GET",
            format!("/api/repos/{missing}/settings"),
            v,
            NO_BODY,
            NOT_FOUND,
        ),
        (
            "PATCH",
            format!("/api/repos/{missing}/settings"),
            a,
            json!({ "autoReview": false }),
            NOT_FOUND,
        ),
        (
            "GET",
            "/api/issues?repoId=abc".into(),
            v,
            NO_BODY,
            BAD_PARAMETER,
        ),
        (
            "GET",
            "/api/issues?page=2".into(),
            v,
            NO_BODY,
            BAD_PARAMETER,
        ),
        (
            "GET",
            format!("/api/issues?repoId={missing}"),
            v,
            NO_BODY,
            NOT_FOUND,
        ),
        ("POST", "/api/issues/sync".into(), v, NO_BODY, FORBIDDEN),
        (
            "POST",
            format!("/api/issues/sync?repoId={missing}"),
            m,
            NO_BODY,
            NOT_FOUND,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            v,
            assign_body(repo, 1),
            FORBIDDEN,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 0, "repoId": repo, "title": "t" }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": -3, "repoId": repo, "title": "t" }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1.5, "repoId": repo, "title": "t" }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": "1", "repoId": repo, "title": "t" }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1, "repoId": "x", "title": "t" }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1, "repoId": repo, "title": "  " }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1, "repoId": repo, "title": "t".repeat(501) }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1, "repoId": repo }),
            BAD_REQUEST,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1, "repoId": repo, "title": "t", "agentType": "gpt" }),
            BAD_PARAMETER,
        ),
        (
            "POST",
            "/api/issues/assign".into(),
            m,
            json!({ "issueNumber": 1, "repoId": missing, "title": "t" }),
            NOT_FOUND,
        ),
    ];
    for (method, path, token, body, (status, code)) in cases {
        let mut req = TestRequest::default()
            .method(method.parse().unwrap())
            .uri(&path)
            .insert_header(("Authorization", format!("Bearer {token}")));
        if !body.is_null() {
            req = req.set_json(&body);
        }
        let (got, answer) = call(&app, req.to_request()).await;
        assert_eq!(got, status, "{method} {path} {body}: {answer}");
        envelope(&answer, code);
        assert_eq!(env.written(), before, "{method} {path} wrote something");
    }
    // Malformed JSON and a wrong media type on each JSON endpoint.
    for (method, path) in [
        ("PUT", "/api/secrets/X".to_owned()),
        ("POST", "/api/repos".into()),
        ("PATCH", format!("/api/repos/{repo}/settings")),
        ("POST", "/api/issues/assign".into()),
    ] {
        for (content_type, payload) in [("application/json", "{not json"), ("text/plain", "{}")] {
            let req = raw_req(method, &path, a, content_type, payload);
            let (got, answer) = call(&app, req).await;
            assert_eq!(got, 400, "{method} {path} {content_type}: {answer}");
            envelope(&answer, "invalid_request");
        }
    }
    assert_eq!(env.written(), before);
}

/// Every route that calls the code host answers its failures as the contract says (412 with
/// no token stored, 422 when the code host refuses, 503 when it cannot be reached; a sync
/// answers 200 with the failure in `errors`), and the OpenAPI document lists each of those
/// answers for the operation.
#[actix_web::test]
async fn code_host_failures_are_answered_and_documented() {
    let (env, repo) = Env::connected(sqlite());
    let app = service_with(env.state.clone()).await;
    let (_, doc) = call(&app, get("/api/openapi.json", &env.t.admin)).await;
    let token = json!({ "value": GH_TOKEN });
    let other = json!({ "repoUrl": "https://github.com/acme/other" });
    // (method, path as documented, path, body)
    let routes = [
        (
            "PUT",
            "/api/secrets/{name}",
            "/api/secrets/CODEHOST_TOKEN",
            &token,
        ),
        ("POST", "/api/repos", "/api/repos", &other),
        ("POST", "/api/issues/sync", "/api/issues/sync", &Value::Null),
        (
            "POST",
            "/api/issues/assign",
            "/api/issues/assign",
            &assign_body(repo, 999),
        ),
    ];
    let documented = |method: &str, template: &str, status: u16| {
        doc["paths"][template][method.to_ascii_lowercase()]["responses"][status.to_string()]
            .is_object()
    };
    let answer = |method, path, body| call(&app, json_req(method, path, &env.t.admin, body));
    for (fault, status, code) in [
        (Fault::Status(401), 422, "codehost_rejected"),
        (Fault::Status(502), 503, "codehost_unavailable"),
    ] {
        for (method, template, path, body) in routes {
            env.fake.fail_next(None, 100, fault.clone());
            let (answered, reply) = answer(method, path, body).await;
            env.fake.clear_faults();
            if path == "/api/issues/sync" {
                assert_eq!(answered, 200, "{reply}");
                assert_eq!(reply["errors"][0]["repoId"], repo.to_string(), "{reply}");
                continue;
            }
            assert_eq!(answered, status, "{method} {path} with {fault:?}: {reply}");
            envelope(&reply, code);
            assert!(
                documented(method, template, status),
                "{method} {template} answers {status}, which its document does not list"
            );
        }
    }
    // Without a stored token, each route that needs it answers 412.
    let (deleted, _) = call(
        &app,
        bare("DELETE", "/api/secrets/CODEHOST_TOKEN", &env.t.admin),
    )
    .await;
    assert_eq!(deleted, 204);
    for (method, template, path, body) in &routes[1..] {
        let (answered, reply) = answer(method, path, body).await;
        assert_eq!(answered, 412, "{method} {path}: {reply}");
        envelope(&reply, "codehost_token_missing");
        assert!(
            documented(method, template, 412),
            "{method} {template} answers 412, which its document does not list"
        );
    }
}
