//! What adapters show, read from the database: the task list and a task's details and
//! model calls (docs/contract.md#38-tasks), the issues view (#36-issues-view), the figures
//! behind `/metrics` and the readiness check (#311-operations). Nothing here changes
//! anything.

use agentry_domain::Task;
use agentry_persistence::issues::{self, IssueViewCursor, IssueViewPage};
use agentry_persistence::metering::{self, EgressBlocked, ModelCall};
use agentry_persistence::repos::{self, IssueSyncState, Repository};
use agentry_persistence::revisions::{self, Feedback, RunTrigger};
use agentry_persistence::scrape::{self, Scrape};
use agentry_persistence::tasks::{self, Run, TaskCursor, TaskEvent, TaskFilter, TaskPage};
use uuid::Uuid;

use crate::{Service, ServiceError, now};

/// One task with everything its detail view shows.
#[derive(Debug, Clone)]
pub struct TaskDetail {
    /// The task.
    pub task: Task,
    /// Its runs, oldest first.
    pub runs: Vec<Run>,
    /// Its state history, oldest first.
    pub events: Vec<TaskEvent>,
    /// Its review subtasks, oldest first.
    pub reviews: Vec<Task>,
    /// The egress its runs' sandboxes blocked.
    pub egress_blocked: Vec<EgressBlocked>,
    /// What started each run that a revision round started, by run id.
    pub run_triggers: Vec<(Uuid, RunTrigger)>,
    /// The review feedback recorded for it.
    pub feedback: Vec<Feedback>,
}

/// One page of the issues view with the sync state of the repositories it covers.
#[derive(Debug, Clone)]
pub struct IssuesView {
    /// The open issues of the page.
    pub page: IssueViewPage,
    /// Each connected repository the view covers with its issue sync's state.
    pub sync_states: Vec<(Repository, IssueSyncState)>,
}

/// [`ServiceError::NotFound`] naming task `id`.
fn task_not_found(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("task {id} not found"))
}

impl Service {
    /// Succeeds when the database answers.
    pub async fn check_database(&self) -> Result<(), ServiceError> {
        self.db(|_conn| Ok(())).await
    }

    /// The figures `/metrics` reports, read from the database's rollups now.
    pub async fn metrics_scrape(&self) -> Result<Scrape, ServiceError> {
        let at = now();
        self.db(move |conn| Ok(scrape::scrape(conn, at)?)).await
    }

    /// One page of the tasks `filter` selects, newest first, after `cursor`.
    pub async fn tasks(
        &self,
        filter: TaskFilter,
        limit: i64,
        cursor: Option<TaskCursor>,
    ) -> Result<TaskPage, ServiceError> {
        self.db(move |conn| Ok(tasks::list_tasks(conn, &filter, limit, cursor.as_ref())?))
            .await
    }

    /// Task `id` with its runs, state history, review subtasks, blocked egress, run triggers
    /// and feedback.
    ///
    /// All of it is read on one snapshot (a run is never shown that the task's totals do not
    /// count yet).
    pub async fn task_detail(&self, id: Uuid) -> Result<TaskDetail, ServiceError> {
        self.db(move |conn| {
            agentry_persistence::read_tx(conn, |conn| {
                let task = tasks::find_task(conn, id)?.ok_or_else(|| task_not_found(id))?;
                Ok(TaskDetail {
                    task,
                    runs: tasks::task_runs(conn, id)?,
                    events: tasks::task_events(conn, id)?,
                    reviews: tasks::review_tasks(conn, id)?,
                    egress_blocked: metering::task_blocked(conn, id)?,
                    run_triggers: revisions::run_triggers(conn, id)?,
                    feedback: revisions::of_task(conn, id)?,
                })
            })
        })
        .await
    }

    /// The model calls the gateway metered for task `id` (only `attempt`'s, if given).
    pub async fn task_calls(
        &self,
        id: Uuid,
        attempt: Option<i32>,
    ) -> Result<Vec<ModelCall>, ServiceError> {
        self.db(move |conn| {
            tasks::find_task(conn, id)?.ok_or_else(|| task_not_found(id))?;
            Ok(metering::task_calls(conn, id, attempt)?)
        })
        .await
    }

    /// One page of the open issues (of repository `repo_id`, or of every connected one)
    /// after `cursor`, with the repositories' sync states. [`ServiceError::NotFound`] when
    /// `repo_id` is not connected.
    pub async fn issues_view(
        &self,
        repo_id: Option<Uuid>,
        limit: i64,
        cursor: Option<IssueViewCursor>,
    ) -> Result<IssuesView, ServiceError> {
        self.db(move |conn| {
            let mut sync_states = repos::issue_sync_states(conn)?;
            if let Some(id) = repo_id {
                if !sync_states.iter().any(|(r, _)| r.id == id) {
                    return Err(ServiceError::NotFound(format!(
                        "repository {id} is not connected"
                    )));
                }
                sync_states.retain(|(r, _)| r.id == id);
            }
            let page = issues::open_issues_page(conn, repo_id, limit, cursor.as_ref())?;
            Ok(IssuesView { page, sync_states })
        })
        .await
    }
}
