//! The use cases driven straight through `agentry-service`, as another Rust program would:
//! no HTTP, no actix; a real SQLite file under a temporary data directory.

use std::time::Duration;

use agentry_persistence::secrets::SecretValue;
use agentry_service::tasks::{Assignment, NewCodingTask};
use agentry_service::{Service, ServiceError};
use uuid::Uuid;

use crate::common::config;

fn record(day: u32, cost: &str, repo: &str) -> String {
    format!(
        r#"{{"title":"Task {day}","repoUrl":"https://github.com/acme/{repo}","taskType":"coding","state":"completed","costUsd":"{cost}","inputTokens":10,"outputTokens":5,"createdAt":"{}"}}"#,
        (agentry_persistence::now() - time::Duration::days(i64::from(day)))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    )
}

#[tokio::test]
async fn a_program_without_http_imports_tasks_and_reads_the_cost_report() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::open(&config(dir.path())).unwrap();
    assert!(dir.path().join("agentry.db").exists());
    let body = [
        record(1, "1.25", "web"),
        record(2, "0.0001", "web"),
        record(3, "10", "api"),
    ]
    .join("\n");
    let outcome = service.import(body.into_bytes()).await.unwrap();
    assert_eq!((outcome.imported, outcome.skipped), (3, 0));

    let window = agentry_service::costs::window_ending_now(30).unwrap();
    let report = service.cost_report(window, None).await.unwrap();
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["summary"]["totalCost"], "11.2501");
    assert_eq!(json["summary"]["taskCount"], 3);
    let web = agentry_domain::RepoUrl::parse("https://github.com/acme/web").unwrap();
    let report = service.cost_report(window, Some(web)).await.unwrap();
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["summary"]["totalCost"], "1.2501");
}

/// A data directory an older version left open to other users (SQLite's 0644, a umask's
/// 0755) is closed when the service opens it: the database, its WAL and the run logs are
/// the service's alone, the directories on the way to a run's paths are passages.
#[tokio::test]
async fn opening_an_older_installation_closes_its_data_directory() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let open = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    drop(Service::open(&config(&dir)).unwrap());
    let run = dir.join("runs").join(Uuid::new_v4().to_string()).join("1");
    std::fs::create_dir_all(run.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("workspaces/mirrors")).unwrap();
    std::fs::write(run.join("output.log"), "what the agent printed").unwrap();
    for path in [dir.join("agentry.db"), run.join("output.log")] {
        open(&path, 0o644);
    }
    for path in [&dir, &dir.join("runs"), &run, &dir.join("workspaces")] {
        open(path, 0o755);
    }

    let config = config(&dir);
    let service = Service::open(&config).unwrap();
    // Passed through by the agents' group when agents run as another user (as root).
    let own = match config.runs.agent_user.ids() {
        Some(_) => 0o710,
        None => 0o700,
    };
    assert_eq!(mode(&dir), own);
    for file in ["agentry.db", "agentry.db-wal", "agentry.db-shm"] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }
    assert_eq!(mode(&run.join("output.log")), 0o600);
    for passage in [
        dir.join("runs"),
        run.clone(),
        dir.join("workspaces/mirrors"),
    ] {
        assert_eq!(mode(&passage), 0o711, "{}", passage.display());
    }
    drop(service);
}

/// Requests that miss the kept report at the same time compute it once; a write makes the
/// next ones compute it again, once, and they see the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_compute_a_report_once() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::open(&config(dir.path())).unwrap();
    let body = (1..=20)
        .map(|d| record(d, "1.5", if d % 2 == 0 { "web" } else { "api" }))
        .collect::<Vec<_>>()
        .join("\n");
    service.import(body.into_bytes()).await.unwrap();
    let window = agentry_service::costs::window_ending_now(30).unwrap();
    let burst = |service: Service| async move {
        let asks = (0..32).map(|_| {
            let service = service.clone();
            tokio::spawn(async move { service.cost_report(window, None).await.unwrap() })
        });
        let mut totals = Vec::new();
        for ask in asks.collect::<Vec<_>>() {
            let report = serde_json::to_value(ask.await.unwrap()).unwrap();
            totals.push(report["summary"]["totalCost"].as_str().unwrap().to_owned());
        }
        totals
    };
    assert_eq!(service.cost_reports_computed(), 0);
    let totals = burst(service.clone()).await;
    assert!(totals.iter().all(|t| t == "30.0000"), "{totals:?}");
    assert_eq!(service.cost_reports_computed(), 1);
    service
        .import(record(3, "0.25", "web").into_bytes())
        .await
        .unwrap();
    let totals = burst(service.clone()).await;
    assert!(totals.iter().all(|t| t == "30.2500"), "{totals:?}");
    assert_eq!(service.cost_reports_computed(), 2);
}

#[tokio::test]
async fn use_cases_refuse_bad_input_with_typed_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::open(&config(dir.path())).unwrap();
    let unknown = Uuid::new_v4();
    let create = |title: &str, prompt: String| NewCodingTask {
        repo_id: unknown,
        title: title.into(),
        prompt,
        agent_type: None,
    };

    let blank = service.create_task(create("  ", String::new())).await;
    assert!(matches!(blank, Err(ServiceError::Invalid { ref field, .. }) if field == "title"));
    let long = "x".repeat(agentry_service::tasks::MAX_PROMPT_BYTES + 1);
    let too_long = service.create_task(create("Fix", long)).await;
    assert!(matches!(too_long, Err(ServiceError::Invalid { ref field, .. }) if field == "prompt"));
    let no_repo = service.create_task(create("Fix", String::new())).await;
    assert!(
        matches!(no_repo, Err(ServiceError::NotFound(_))),
        "{no_repo:?}"
    );

    let assign = service
        .assign_issue(Assignment {
            repo_id: unknown,
            issue_number: 0,
            title: "Fix".into(),
            body: String::new(),
            agent_type: None,
        })
        .await;
    assert!(
        matches!(assign, Err(ServiceError::Invalid { ref field, .. }) if field == "issueNumber")
    );
    assert!(matches!(
        service.cancel_task(unknown, "test".into()).await,
        Err(ServiceError::NotFound(_))
    ));
    assert!(matches!(
        service.retry_task(unknown, "test".into()).await,
        Err(ServiceError::NotFound(_))
    ));
    let padded = SecretValue::new(" ghp_token ");
    assert!(matches!(
        service.store_secret("CODEHOST_TOKEN".into(), padded).await,
        Err(ServiceError::Invalid { ref field, .. }) if field == "value"
    ));
    // Code-host use cases without a stored token say so before any request.
    assert_eq!(
        service.sync_issues(None).await.unwrap_err(),
        ServiceError::CodeHostTokenMissing
    );
    let bad_import = service.import(b"{\"title\":\"x\"}".to_vec()).await;
    assert!(matches!(bad_import, Err(ServiceError::Malformed(ref m)) if m.contains("line 1")));

    let tasks = service
        .db(|conn| Ok(agentry_persistence::meta::task_count(conn)?))
        .await
        .unwrap();
    assert_eq!(tasks, 0);
    assert!(service.secrets().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_background_loops_start_on_plain_tokio_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let service = Service::open(&config).unwrap();
    let background = service.start_background(&config).await;
    let stopped = tokio::time::timeout(Duration::from_secs(20), service.shut_down(background));
    assert!(stopped.await.is_ok(), "the service did not stop");
    assert_eq!(service.active_runs(), 0);
}
