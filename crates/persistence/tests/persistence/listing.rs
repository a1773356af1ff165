//! The task list (docs/contract.md#38-tasks): newest first, keyset cursor, filters.

use std::collections::HashSet;

use crate::common::*;
use agentry_domain::{Task, TaskState, TaskType, Trigger};
use agentry_persistence::Db;
use agentry_persistence::repos::Repository;
use agentry_persistence::tasks::{self, NewTask, TaskCursor, TaskFilter, TransitionDetails};
use uuid::Uuid;

/// Pages through the whole list with `limit`, following the cursors.
fn all_pages(db: &Db, filter: &TaskFilter, limit: i64) -> Vec<Vec<Task>> {
    let mut conn = db.conn().unwrap();
    let mut pages = vec![];
    let mut cursor: Option<TaskCursor> = None;
    loop {
        let page = tasks::list_tasks(&mut conn, filter, limit, cursor.as_ref()).unwrap();
        assert!(page.tasks.len() as i64 <= limit);
        match page.next {
            Some(next) => {
                // The cursor is the last task of the page, and the page is full.
                let last = page.tasks.last().unwrap();
                assert_eq!((next.created_at, next.id), (last.created_at, last.id));
                assert_eq!(page.tasks.len() as i64, limit);
            }
            None => {
                pages.push(page.tasks);
                return pages;
            }
        }
        cursor = page.next;
        pages.push(page.tasks);
        assert!(pages.len() < 1000, "the cursor does not advance");
    }
}

/// The ids of `tasks` sorted the way the list must return them: created_at desc, id desc.
fn expected_order<'a>(tasks: impl IntoIterator<Item = &'a Task>) -> Vec<Uuid> {
    let mut tasks: Vec<&Task> = tasks.into_iter().collect();
    tasks.sort_by_key(|t| std::cmp::Reverse((t.created_at, t.id)));
    tasks.iter().map(|t| t.id).collect()
}

/// With each page size of `limits`, the pages of the unfiltered list hold exactly `all`, in
/// list order.
fn assert_listed_in_order(db: &Db, all: &[Task], limits: &[i64]) {
    for &limit in limits {
        let listed: Vec<Uuid> = all_pages(db, &TaskFilter::default(), limit)
            .iter()
            .flatten()
            .map(|t| t.id)
            .collect();
        assert_eq!(listed, expected_order(all), "limit {limit}");
    }
}

/// 25 tasks over two repositories, types and states, with groups of identical creation
/// times (so that the id tie-break matters).
fn seed(db: &Db) -> (Repository, Repository, Vec<Task>) {
    let (a, b) = (repo(db), connect(db, "o", "b"));
    let mut conn = db.conn().unwrap();
    let mut all = vec![];
    for i in 0..25_i64 {
        let repo = if i % 3 == 0 { &b } else { &a };
        let new = NewTask {
            task_type: if i % 4 == 0 {
                TaskType::Review
            } else {
                TaskType::Coding
            },
            // Five tasks share each creation time.
            ..new_task(repo, at(i / 5))
        };
        tasks::create_task(&mut conn, &new, "created").unwrap();
        if i % 2 == 0 {
            tasks::transition_task(
                &mut conn,
                new.id,
                Trigger::Claim,
                &TransitionDetails::default(),
                at(100),
            )
            .unwrap();
        }
        all.push(tasks::get_task(&mut conn, new.id).unwrap());
    }
    (a, b, all)
}

/// The filter of `state`, `repo_id` and `task_type` (`None`: any).
fn filter(
    state: Option<TaskState>,
    repo_id: Option<Uuid>,
    task_type: Option<TaskType>,
) -> TaskFilter {
    TaskFilter {
        state,
        repo_id,
        task_type,
    }
}

agentry_persistence::backend_tests! {
    // Pages of 10 following the cursor visit every task exactly once, in (created_at desc,
    // id desc) order, ties on created_at included.
    fn cursor_pages_visit_every_task_once_in_order(db) {
        let (_, _, all) = seed(db);
        let pages = all_pages(db, &TaskFilter::default(), 10);
        let sizes: Vec<_> = pages.iter().map(Vec::len).collect();
        assert_eq!(sizes, [10, 10, 5]);
        let listed: Vec<Uuid> = pages.iter().flatten().map(|t| t.id).collect();
        assert_eq!(
            listed.iter().collect::<HashSet<_>>().len(),
            25,
            "no task twice"
        );
        assert_eq!(listed, expected_order(&all));
        // The listed tasks are complete task records.
        let by_id: std::collections::HashMap<_, _> = all.iter().map(|t| (t.id, t)).collect();
        for t in pages.iter().flatten() {
            assert_eq!(&t, by_id.get(&t.id).unwrap());
        }
        // Any page size gives the same sequence.
        assert_listed_in_order(db, &all, &[1, 3, 5, 7, 24, 25, 26, 200]);
    }

    // Filters by state, repository and type, each alone and combined, through every page.
    fn filters_alone_and_combined(db) {
        let (a, b, all) = seed(db);
        // (state, repository, type)
        let filters = [
            filter(Some(TaskState::Queued), None, None),
            filter(Some(TaskState::Provisioning), None, None),
            filter(Some(TaskState::Completed), None, None),
            filter(None, Some(a.id), None),
            filter(None, Some(b.id), None),
            filter(None, Some(Uuid::new_v4()), None),
            filter(None, None, Some(TaskType::Review)),
            filter(None, None, Some(TaskType::Coding)),
            filter(Some(TaskState::Provisioning), Some(b.id), None),
            filter(Some(TaskState::Queued), None, Some(TaskType::Coding)),
            filter(None, Some(a.id), Some(TaskType::Review)),
            filter(Some(TaskState::Provisioning), Some(a.id), Some(TaskType::Review)),
        ];
        for filter in filters {
            let matching: Vec<&Task> = all
                .iter()
                .filter(|t| {
                    filter.state.is_none_or(|s| t.state == s)
                        && filter.repo_id.is_none_or(|r| t.repo_id == Some(r))
                        && filter.task_type.is_none_or(|ty| t.task_type == ty)
                })
                .collect();
            let listed: Vec<Uuid> = all_pages(db, &filter, 4)
                .iter()
                .flatten()
                .map(|t| t.id)
                .collect();
            assert_eq!(listed, expected_order(matching), "{filter:?}");
        }
        // Sanity: the seed really has mixed groups.
        let count = |f: TaskFilter| all_pages(db, &f, 100).concat().len();
        assert_eq!(
            count(TaskFilter {
                state: Some(TaskState::Queued),
                ..Default::default()
            }),
            12
        );
        assert_eq!(
            count(TaskFilter {
                repo_id: Some(b.id),
                ..Default::default()
            }),
            9
        );
        assert_eq!(
            count(TaskFilter {
                task_type: Some(TaskType::Review),
                ..Default::default()
            }),
            7
        );
    }

    // limit 1 returns the newest task with a cursor; a cursor past the end (or before the
    // oldest task) gives an empty last page.
    fn limit_one_and_cursor_past_the_end(db) {
        let (_, _, all) = seed(db);
        let order = expected_order(&all);
        let mut conn = db.conn().unwrap();
        let page = tasks::list_tasks(&mut conn, &TaskFilter::default(), 1, None).unwrap();
        assert_eq!(
            page.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![order[0]]
        );
        assert!(page.next.is_some());

        // The cursor of the oldest task: nothing after it.
        let oldest = all.iter().find(|t| t.id == order[24]).unwrap();
        let end = TaskCursor {
            created_at: oldest.created_at,
            id: oldest.id,
        };
        let page = tasks::list_tasks(&mut conn, &TaskFilter::default(), 10, Some(&end)).unwrap();
        assert!(page.tasks.is_empty());
        assert_eq!(page.next, None);

        // A cursor older than everything.
        let before_all = TaskCursor {
            created_at: at(-3600),
            id: Uuid::max(),
        };
        let page =
            tasks::list_tasks(&mut conn, &TaskFilter::default(), 1, Some(&before_all)).unwrap();
        assert!(page.tasks.is_empty());
        assert_eq!(page.next, None);

        // An exactly full last page has no next cursor.
        let second_oldest = all.iter().find(|t| t.id == order[23]).unwrap();
        let cursor = TaskCursor {
            created_at: second_oldest.created_at,
            id: second_oldest.id,
        };
        let page = tasks::list_tasks(&mut conn, &TaskFilter::default(), 1, Some(&cursor)).unwrap();
        assert_eq!(
            page.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![order[24]]
        );
        assert_eq!(page.next, None);

        // A cursor newer than everything starts at the beginning.
        let after_all = TaskCursor {
            created_at: at(3600),
            id: Uuid::nil(),
        };
        let page =
            tasks::list_tasks(&mut conn, &TaskFilter::default(), 25, Some(&after_all)).unwrap();
        assert_eq!(page.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), order);
        assert_eq!(page.next, None);
    }

    // A cursor in the middle of a group of equal creation times continues by id.
    fn cursor_inside_a_tie_continues_by_id(db) {
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let mut ids: Vec<Uuid> = (0..6)
            .map(|_| {
                let new = new_task(&repo, T0);
                tasks::create_task(&mut conn, &new, "created").unwrap();
                new.id
            })
            .collect();
        ids.sort_by_key(|id| std::cmp::Reverse(*id));
        let cursor = TaskCursor {
            created_at: T0,
            id: ids[2],
        };
        let page = tasks::list_tasks(&mut conn, &TaskFilter::default(), 10, Some(&cursor)).unwrap();
        assert_eq!(
            page.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
            ids[3..].to_vec()
        );
    }

    // An empty database lists nothing.
    fn empty_list(db) {
        let mut conn = db.conn().unwrap();
        let page = tasks::list_tasks(&mut conn, &TaskFilter::default(), 10, None).unwrap();
        assert!(page.tasks.is_empty());
        assert_eq!(page.next, None);
    }

    // Creation times differing only below the second (down to one microsecond, with and
    // without a fractional part) sort and page correctly: the stored form compares as time,
    // not as arbitrary text.
    fn sub_second_creation_times_order_correctly(db) {
        use time::macros::datetime;
        let repo = repo(db);
        let mut conn = db.conn().unwrap();
        let times = [
            datetime!(2026-05-05 12:00:00 UTC),
            datetime!(2026-05-05 12:00:00.000001 UTC),
            datetime!(2026-05-05 12:00:00.00001 UTC),
            datetime!(2026-05-05 12:00:00.1 UTC),
            datetime!(2026-05-05 12:00:00.123456 UTC),
            datetime!(2026-05-05 12:00:00.5 UTC),
            datetime!(2026-05-05 12:00:00.999999 UTC),
            datetime!(2026-05-05 12:00:01 UTC),
            datetime!(2026-05-05 11:59:59.999999 UTC),
            datetime!(2026-05-06 00:00:00 UTC),
            datetime!(2025-12-31 23:59:59.9 UTC),
        ];
        let mut all = vec![];
        for t in times {
            let new = new_task(&repo, t);
            all.push(tasks::create_task(&mut conn, &new, "created").unwrap());
        }
        drop(conn);
        assert_listed_in_order(db, &all, &[1, 2, 3]);
    }
}

/// The costliest tasks of a period (the cost report's top tasks and anomaly candidates).
mod costliest {
    use super::*;
    use agentry_persistence::tasks::{CostWindow, SPARSE_PERIOD_TASKS, costliest_in_window};

    agentry_persistence::backend_tests! {
        // A sparse period is read through the creation-time index, a dense one through the
        // cost index: both give the same tasks in the same order (cost, then creation, then
        // id, descending), limited, filtered by repository and minimum cost; an empty period
        // reads nothing.
        fn both_ways_find_the_same_tasks_in_the_same_order(db) {
            let (a, b) = (repo(db), connect(db, "o", "b"));
            let mut conn = db.conn().unwrap();
            for i in 0..30_i64 {
                let repo = if i % 3 == 0 { &b } else { &a };
                // Days 0–5 of T0, five tasks a day; costs repeat, so ties are ordered.
                let task = create(db, repo, T0 + time::Duration::days(i / 5));
                let cost = ["0.5", "2", "0.5", "1", "3"][(i % 5) as usize];
                tasks::record_run(&mut conn, &sonnet_run(task.id, 1, cost, at(1))).unwrap();
            }
            let from = T0.replace_time(time::Time::MIDNIGHT) + time::Duration::days(1);
            let to = from + time::Duration::days(3);
            for repo_url in [None, Some(a.url.as_str()), Some(b.url.as_str())] {
                for (min, limit) in [(0, Some(10)), (0, None), (1_000_000_000, None), (0, Some(1))] {
                    let mut find = |costed| {
                        let window = CostWindow { from, to, repo_url, costed };
                        costliest_in_window(&mut conn, window, min, limit).unwrap()
                    };
                    let sparse = find(15);
                    let dense = find(SPARSE_PERIOD_TASKS + 1);
                    let ids = |found: &[Task]| found.iter().map(|t| t.id).collect::<Vec<_>>();
                    assert_eq!(ids(&sparse), ids(&dense), "{repo_url:?} {min} {limit:?}");
                    assert!(!sparse.is_empty());
                    assert!(sparse.iter().all(|t| t.created_at >= from && t.created_at < to));
                    assert!(sparse.iter().all(|t| t.cost_usd.unwrap().to_nanos() >= min));
                    assert!(limit.is_none_or(|l| sparse.len() <= l));
                    let order: Vec<_> = sparse
                        .iter()
                        .map(|t| (std::cmp::Reverse(t.cost_usd), std::cmp::Reverse(t.created_at), t.id.to_string()))
                        .collect();
                    assert!(order.is_sorted(), "{repo_url:?} {min} {limit:?}");
                }
            }
            let empty = CostWindow { from, to, repo_url: None, costed: 0 };
            assert!(costliest_in_window(&mut conn, empty, 0, Some(10)).unwrap().is_empty());
        }
    }
}
