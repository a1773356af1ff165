//! Repository administration (docs/contract.md#34-repositories, #35-repository-settings): disconnecting, settings, and the issue-sync
//! state of connected repositories.

use crate::common::*;
use agentry_domain::{AgentType, RepoSettings, Tokens};
use agentry_persistence::issues;
use agentry_persistence::repos::{self, IssueSyncState};
use agentry_persistence::tasks;
use agentry_persistence::{DbError, write_tx};
use serde_json::json;
use uuid::Uuid;

agentry_persistence::backend_tests! {
    // Disconnecting keeps the row, its tasks and its costs; it leaves the connected list.
    // Doing it again changes nothing; an unknown id is not found.
    fn disconnect_keeps_the_repository_and_its_tasks(db) {
        let repo = repo(db);
        let other = connect(db, "o", "other");
        let task = create(db, &repo, T0);
        let mut conn = db.conn().unwrap();
        let run = tasks::Run {
            model: Some("sonnet".into()),
            cost_usd: Some(usd("1.25")),
            tokens: Tokens { input: 10, output: 5, ..Tokens::default() },
            turns: Some(2),
            finished_at: Some(at(2)),
            ..agentry_persistence::test_support::succeeded_run(task.id, 1, at(1))
        };
        write_tx(&mut conn, |conn| tasks::record_run(conn, &run)).unwrap();

        let gone = repos::disconnect_repository(&mut conn, repo.id, at(10)).unwrap();
        assert_eq!(gone.disconnected_at, Some(at(10)));
        assert_eq!(gone.updated_at, at(10));
        assert_eq!(gone.connected_at, repo.connected_at);
        assert_eq!((gone.id, &gone.url, &gone.settings), (repo.id, &repo.url, &repo.settings));
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap(), gone);
        let connected: Vec<Uuid> = repos::list_connected(&mut conn).unwrap().iter().map(|r| r.id).collect();
        assert_eq!(connected, vec![other.id]);
        let kept = tasks::get_task(&mut conn, task.id).unwrap();
        assert_eq!(kept.repo_id, Some(repo.id));
        assert_eq!(kept.cost_usd, Some(usd("1.25")));
        assert_eq!(task_count(db), 1);

        // Idempotent: the first disconnection time stays.
        let again = repos::disconnect_repository(&mut conn, repo.id, at(20)).unwrap();
        assert_eq!(again, gone);
        assert!(matches!(
            repos::disconnect_repository(&mut conn, Uuid::new_v4(), at(30)),
            Err(DbError::NotFound)
        ));
        // The other repository is untouched.
        assert_eq!(repos::get_repository(&mut conn, other.id).unwrap(), other);
        // Connecting the URL again brings the same row back.
        let (back, created) = repos::connect_repository(&mut conn, &new_repo("o", "r"), at(40)).unwrap();
        assert!(!created);
        assert_eq!(back.id, repo.id);
        assert_eq!(back.disconnected_at, None);
    }

    // Settings round-trip exactly, every member; the rest of the row is unchanged.
    fn update_settings_round_trips(db) {
        let repo = repo(db);
        assert_eq!(repo.settings, RepoSettings::default());
        let mut conn = db.conn().unwrap();
        let custom = RepoSettings {
            coding_model: "claude-opus-4-1".into(),
            review_model: "a model name with spaces and ü".into(),
            max_turns_coding: None,
            max_turns_review: 1000,
            agent_type: AgentType::Codex,
            auto_review: false,
            max_cost_per_task_usd: Some(usd("12.345678901")),
            monthly_budget_usd: Some(usd("250.000000001")),
            egress_allow: ["pypi.org", "*.npmjs.org", "10.0.0.7", "::1"]
                .iter()
                .map(|p| p.parse().unwrap())
                .collect(),
            max_revisions: 0,
            revise_on_agent_review: true,
            allow_provider_tools: true,
        };
        let updated = repos::update_settings(&mut conn, repo.id, &custom, at(5)).unwrap();
        assert_eq!(updated.settings, custom);
        assert_eq!(updated.updated_at, at(5));
        assert_eq!(
            (&updated.url, &updated.default_branch, &updated.clone_url, updated.codehost_id),
            (&repo.url, &repo.default_branch, &repo.clone_url, repo.codehost_id)
        );
        assert_eq!((updated.created_at, updated.connected_at), (repo.created_at, repo.connected_at));
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap(), updated);

        let other = RepoSettings {
            max_turns_coding: Some(1),
            max_cost_per_task_usd: None,
            ..custom.clone()
        };
        let updated = repos::update_settings(&mut conn, repo.id, &other, at(6)).unwrap();
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap().settings, other);
        assert_eq!(updated.settings, other);
        let back = repos::update_settings(&mut conn, repo.id, &RepoSettings::default(), at(7)).unwrap();
        assert_eq!(back.settings, RepoSettings::default());

        assert!(matches!(
            repos::update_settings(&mut conn, Uuid::new_v4(), &custom, at(8)),
            Err(DbError::NotFound)
        ));
        // A disconnected repository's settings can still be changed (they apply on reconnect).
        repos::disconnect_repository(&mut conn, repo.id, at(9)).unwrap();
        let stored = repos::update_settings(&mut conn, repo.id, &custom, at(10)).unwrap();
        assert_eq!(stored.settings, custom);
        assert_eq!(stored.disconnected_at, Some(at(9)));
    }

    // A PATCH is a read-modify-write: the change sees the stored settings and its result is
    // stored; a refused change writes nothing; an unknown id is not found.
    fn patch_settings_applies_or_refuses_a_change(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let patched = repos::patch_settings(&mut conn, repo.id, at(5), |current| {
            current.apply_patch(&json!({ "codingModel": "opus", "maxCostPerTaskUsd": "2.50" }))
        })
        .unwrap()
        .unwrap();
        let expected = RepoSettings {
            coding_model: "opus".into(),
            max_cost_per_task_usd: Some(usd("2.5")),
            ..RepoSettings::default()
        };
        assert_eq!(patched.settings, expected);
        assert_eq!(patched.updated_at, at(5));
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap(), patched);

        // Refused (a bad value): nothing changes, not even updated_at.
        let refused = repos::patch_settings(&mut conn, repo.id, at(6), |current| {
            current.apply_patch(&json!({ "reviewModel": "cheap", "maxTurnsReview": 0 }))
        })
        .unwrap();
        assert!(refused.is_err());
        assert_eq!(repos::get_repository(&mut conn, repo.id).unwrap(), patched);

        let unknown = repos::patch_settings(&mut conn, Uuid::new_v4(), at(7), |current| {
            Ok::<_, ()>(current.clone())
        });
        assert!(matches!(unknown, Err(DbError::NotFound)));
    }

    // Two patches of different settings at the same moment (two replicas): both take
    // effect, neither overwrites the other with the settings it read.
    fn concurrent_patches_both_take_effect(db) {
        let repo = repo(db);
        let pool = wide_pool(db, 2);
        let results = race(&pool, 2, |i, conn| {
            repos::patch_settings(conn, repo.id, at(10), |current| {
                // Hold the transaction open so the other patch runs into it.
                std::thread::sleep(std::time::Duration::from_millis(200));
                if i == 0 {
                    current.apply_patch(&json!({ "codingModel": "first" }))
                } else {
                    current.apply_patch(&json!({ "reviewModel": "second" }))
                }
            })
        });
        for r in results {
            r.unwrap().unwrap();
        }
        let mut conn = db.conn().unwrap();
        let settings = repos::get_repository(&mut conn, repo.id).unwrap().settings;
        assert_eq!((settings.coding_model.as_str(), settings.review_model.as_str()), ("first", "second"));
    }

    // The sync state of each connected repository, by URL; disconnected ones are left out.
    fn issue_sync_states_of_connected_repositories(db) {
        let b = connect(db, "b", "y");
        let a = connect(db, "a", "x");
        let c = connect(db, "c", "z");
        let mut conn = db.conn().unwrap();
        let states = repos::issue_sync_states(&mut conn).unwrap();
        assert_eq!(
            states,
            vec![
                (a.clone(), IssueSyncState::default()),
                (b.clone(), IssueSyncState::default()),
                (c.clone(), IssueSyncState::default()),
            ]
        );
        issues::replace_open_issues(&mut conn, a.id, &[synced_issue(1, 1, &[])], Some("\"abc\""), at(10)).unwrap();
        issues::mark_issues_sync_failed(&mut conn, b.id, "401 Bad credentials").unwrap();
        repos::disconnect_repository(&mut conn, c.id, at(11)).unwrap();
        assert_eq!(
            repos::issue_sync_states(&mut conn).unwrap(),
            vec![
                (
                    a,
                    IssueSyncState {
                        etag: Some("\"abc\"".into()),
                        synced_at: Some(at(10)),
                        error: None,
                    }
                ),
                (
                    b,
                    IssueSyncState {
                        etag: None,
                        synced_at: None,
                        error: Some("401 Bad credentials".into()),
                    }
                ),
            ]
        );
    }
}
