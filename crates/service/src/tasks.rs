//! Tasks as users change them (docs/contract.md#38-tasks, #37-assign, #39-import): create,
//! cancel and retry a task, assign an issue, import historical tasks, read a run's output.
//! Each use case commits, then wakes the loop that acts on the change.

use agentry_domain::{AgentType, Task, TaskType, Trigger};
use agentry_persistence::repos::{self, Repository};
use agentry_persistence::runner::{self as claims, RunLog};
use agentry_persistence::tasks::{self, ImportOutcome, NewTask, TransitionDetails};
use agentry_persistence::{AnyConnection, DbError};
use uuid::Uuid;

use crate::import::{self, ImportError};
use crate::wake::Loops;
use crate::{Service, ServiceError, codehost, now, runs};

/// The longest task title accepted.
pub const MAX_TITLE_CHARS: usize = 500;
/// The longest task prompt accepted (bytes).
pub const MAX_PROMPT_BYTES: usize = 256 * 1024;

/// A task title as given: trimmed, non-blank, at most [`MAX_TITLE_CHARS`] (NUL characters,
/// which are not stored, do not count).
pub(crate) fn task_title(raw: &str) -> Result<String, ServiceError> {
    let stored = raw.replace('\0', "");
    let title = stored.trim();
    if title.is_empty() {
        return Err(ServiceError::invalid("title", "must not be blank"));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(ServiceError::invalid(
            "title",
            format!("must be at most {MAX_TITLE_CHARS} characters"),
        ));
    }
    Ok(title.to_owned())
}

/// A repository a task may be created for: connected ([`ServiceError::NotFound`] otherwise).
pub(crate) fn connected_repository(
    conn: &mut AnyConnection,
    id: Uuid,
) -> Result<Repository, ServiceError> {
    match repos::get_repository(conn, id) {
        Ok(repo) if repo.disconnected_at.is_none() => Ok(repo),
        Ok(_) | Err(DbError::NotFound) => Err(ServiceError::NotFound(format!(
            "repository {id} is not connected"
        ))),
        Err(other) => Err(other.into()),
    }
}

/// A manual coding task to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCodingTask {
    /// A connected repository.
    pub repo_id: Uuid,
    /// The title (trimmed; non-blank, at most [`MAX_TITLE_CHARS`]).
    pub title: String,
    /// The instructions for the agent (at most [`MAX_PROMPT_BYTES`]).
    pub prompt: String,
    /// The agent; the repository's when `None`.
    pub agent_type: Option<AgentType>,
}

/// An issue to assign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// A connected repository.
    pub repo_id: Uuid,
    /// The issue's number (≥ 1).
    pub issue_number: i64,
    /// The task's title (trimmed; non-blank).
    pub title: String,
    /// The task's prompt.
    pub body: String,
    /// The agent; the repository's when `None`.
    pub agent_type: Option<AgentType>,
}

/// The agent output of a task's latest run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputTail {
    /// At most the last 8 MiB of the output.
    pub content: String,
    /// Whether the head of an oversized output was dropped.
    pub truncated: bool,
}

impl From<ImportError> for ServiceError {
    fn from(e: ImportError) -> Self {
        match e {
            ImportError::BadLine { .. } => ServiceError::Malformed(e.to_string()),
            ImportError::Db(db) => ServiceError::from(db),
        }
    }
}

impl Service {
    /// Creates a manual coding task in `queued` and wakes the runner.
    pub async fn create_task(&self, new: NewCodingTask) -> Result<Task, ServiceError> {
        let NewCodingTask {
            repo_id,
            title,
            prompt,
            agent_type,
        } = new;
        let title = task_title(&title)?;
        if prompt.len() > MAX_PROMPT_BYTES {
            return Err(ServiceError::invalid(
                "prompt",
                format!("must be at most {MAX_PROMPT_BYTES} bytes"),
            ));
        }
        self.commit(
            move |conn| {
                let repo = connected_repository(conn, repo_id)?;
                let new = NewTask {
                    id: Uuid::new_v4(),
                    title,
                    prompt,
                    repo_id: Some(repo.id),
                    repo_url: repo.url.clone(),
                    task_type: TaskType::Coding,
                    agent_type: agent_type.unwrap_or(repo.settings.agent_type),
                    issue_number: None,
                    parent_task_id: None,
                    created_at: now(),
                };
                Ok(tasks::create_task(conn, &new, "created")?)
            },
            |_| Loops::RUNNER,
        )
        .await
    }

    /// Applies a user's trigger (cancel, retry) to a task, with `reason` in its history,
    /// then wakes `wake`.
    async fn user_transition(
        &self,
        id: Uuid,
        trigger: Trigger,
        reason: String,
        wake: Loops,
    ) -> Result<Task, ServiceError> {
        let details = TransitionDetails {
            reason: Some(reason),
            error_message: None,
            pull_request: None,
        };
        self.commit(
            move |conn| {
                if tasks::find_task(conn, id)?.is_none() {
                    return Err(ServiceError::NotFound(format!("task {id} not found")));
                }
                let (task, _) = tasks::transition_task(conn, id, trigger, &details, now())?;
                Ok(task)
            },
            |_| wake,
        )
        .await
    }

    /// Cancels a queued, provisioning or running task; an agent running it in this process
    /// is stopped (other replicas notice at their next lease renewal).
    pub async fn cancel_task(&self, id: Uuid, reason: String) -> Result<Task, ServiceError> {
        let task = self
            .user_transition(id, Trigger::Cancel, reason, Loops::NONE)
            .await?;
        self.parts.runs.stop_local(id);
        Ok(task)
    }

    /// Queues a failed or cancelled task again (attempt + 1) and wakes the runner.
    pub async fn retry_task(&self, id: Uuid, reason: String) -> Result<Task, ServiceError> {
        self.user_transition(id, Trigger::Retry, reason, Loops::RUNNER)
            .await
    }

    /// Assigns an issue: creates its coding task with the label and comment effects, or
    /// returns the task already linked to it (`false`) without changing anything. Only a
    /// known open issue gets a task: a number the synced view lacks is looked up once with a
    /// sync of its repository; a pull request's number or an unknown one is
    /// [`ServiceError::NotFound`], and nothing is written.
    pub async fn assign_issue(&self, assignment: Assignment) -> Result<(Task, bool), ServiceError> {
        let Assignment {
            repo_id,
            issue_number,
            title,
            body,
            agent_type,
        } = assignment;
        if issue_number < 1 {
            return Err(ServiceError::invalid(
                "issueNumber",
                "must be an integer of at least 1",
            ));
        }
        let title = task_title(&title)?;
        let (repo_url, linked) = self
            .db(move |conn| {
                let repo = connected_repository(conn, repo_id)?;
                let linked = tasks::linked_task(conn, repo.id, issue_number)?;
                Ok((repo.url, linked.is_some()))
            })
            .await?;
        if !linked && !self.known_open_issue(repo_id, issue_number).await? {
            return Err(ServiceError::NotFound(format!(
                "issue #{issue_number} is not an open issue of {repo_url}: the code host lists \
                 no open issue with that number (it is a pull request, closed, or does not \
                 exist)"
            )));
        }
        self.commit(
            move |conn| {
                let repo = connected_repository(conn, repo_id)?;
                let agent = agent_type.unwrap_or(repo.settings.agent_type);
                Ok(codehost::assign(
                    conn,
                    &repo,
                    issue_number,
                    &title,
                    &body,
                    agent,
                    now(),
                )?)
            },
            |(_, created)| (Loops::OUTBOX | Loops::RUNNER).when(*created),
        )
        .await
    }

    /// Imports historical task records (JSON Lines): every line is validated first; one bad
    /// line rejects the whole import ([`ServiceError::Malformed`] naming the line).
    pub async fn import(&self, body: Vec<u8>) -> Result<ImportOutcome, ServiceError> {
        self.db(move |conn| Ok(import::import(conn, &body)?)).await
    }

    /// The agent output of the task's latest run: the live output while a run is in progress
    /// in this process, else the stored log of the last recorded run; `None` before any.
    pub async fn task_output(&self, id: Uuid) -> Result<Option<OutputTail>, ServiceError> {
        let (task, stored) = self
            .db(move |conn| {
                let task = tasks::find_task(conn, id)?
                    .ok_or_else(|| ServiceError::NotFound(format!("task {id} not found")))?;
                let stored = claims::latest_run_log(conn, id)?;
                Ok((task, stored))
            })
            .await?;
        // The live output is a file read: on the blocking pool, and cut to the stored log's
        // size there, so at most that much crosses back.
        let live = if runs::is_running(task.state) {
            let service = self.clone();
            let attempt = task.attempt;
            self.blocking(move || {
                service
                    .parts
                    .runs
                    .runner()
                    .live_output(id, attempt)
                    .map(|output| RunLog::of(&output))
            })
            .await?
        } else {
            None
        };
        Ok(match (live, stored) {
            (Some(log), _) | (None, Some((_, _, log))) => Some(OutputTail {
                content: log.content,
                truncated: log.truncated,
            }),
            (None, None) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_is_trimmed_and_its_nul_characters_do_not_count() {
        assert_eq!(task_title("  a\0b ").unwrap(), "ab");
        for blank in ["", "  ", "\0", " \0 \0"] {
            assert!(
                matches!(task_title(blank), Err(ServiceError::Invalid { ref field, .. }) if field == "title"),
                "{blank:?}"
            );
        }
        let long = "x".repeat(MAX_TITLE_CHARS);
        assert!(task_title(&format!("{long}\0")).is_ok());
        assert!(task_title(&format!("{long}x")).is_err());
    }
}
