//! The JSON shapes of the API (camelCase), converted from domain and storage types.

use agentry_domain::Task;
use agentry_persistence::metering::{EgressBlocked, ModelCall};
use agentry_persistence::revisions::{Feedback, RunTrigger, RunTriggerKind};
use agentry_persistence::tasks::{Run, TaskEvent};
use serde::Serialize;
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

/// A time as RFC 3339 UTC text (`2026-11-22T10:00:00Z`), for places serde attributes cannot
/// reach (map values).
pub fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.to_string())
}

/// A task (docs/contract.md#21-task) with its prompt.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskDto {
    /// Everything but the prompt.
    #[serde(flatten)]
    pub summary: TaskSummaryDto,
    /// The prompt given to the agent (up to 256 KiB).
    pub prompt: String,
}

impl From<Task> for TaskDto {
    fn from(mut t: Task) -> Self {
        let prompt = std::mem::take(&mut t.prompt);
        TaskDto {
            summary: TaskSummaryDto::from(t),
            prompt,
        }
    }
}

/// A task (docs/contract.md#21-task) without its prompt, as lists show it: a page of 200 tasks stays small
/// whatever their prompts (`GET /api/tasks/{id}` has the prompt).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskSummaryDto {
    /// Task id.
    pub id: Uuid,
    /// Title (the issue title for issue tasks).
    pub title: String,
    /// The repository; null only for imported history of a repository not connected.
    pub repo_id: Option<Uuid>,
    /// Normalised repository URL.
    pub repo_url: String,
    /// `coding` or `review`.
    #[schema(example = "coding")]
    pub task_type: String,
    /// `queued`, `provisioning`, `running`, `pr_opened`, `completed`, `failed` or `cancelled`.
    #[schema(example = "queued")]
    pub state: String,
    /// `claude-code` or `codex`.
    #[schema(example = "claude-code")]
    pub agent_type: String,
    /// The model the agent reported (or was launched with).
    pub model_used: Option<String>,
    /// Sum of the costs of the task's runs, exact decimal USD; null until a run reports one.
    #[schema(example = "0.123456")]
    pub cost_usd: Option<String>,
    /// Input tokens over all runs (cache reads and writes included).
    pub input_tokens: i64,
    /// Output tokens over all runs.
    pub output_tokens: i64,
    /// The pull request opened for the task.
    pub pr_url: Option<String>,
    /// Its number.
    pub pr_number: Option<i64>,
    /// The linked issue's number.
    pub issue_number: Option<i64>,
    /// The coding task a review task reviews.
    pub parent_task_id: Option<Uuid>,
    /// 1 for the first run, +1 per retry or recovery.
    pub attempt: i32,
    /// Why the task failed.
    pub error_message: Option<String>,
    /// Creation time (RFC 3339 UTC).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last change.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// When the latest attempt started.
    #[serde(with = "time::serde::rfc3339::option")]
    pub started_at: Option<OffsetDateTime>,
    /// When the task finished.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Why a queued task is not being started: `budget_exhausted` while a monthly budget
    /// has nothing left (docs/contract.md#67-budgets); null otherwise.
    pub blocked_reason: Option<String>,
    /// The budget that blocks it: `repository` or `instance`; null when not blocked.
    pub blocked_by: Option<String>,
    /// History brought in by an import (docs/contract.md#39-import): never run here, and a
    /// retry of it is refused.
    pub imported: bool,
    /// How many revision rounds review feedback started on the task's pull request
    /// (docs/contract.md#57-revisions).
    pub revisions: i32,
}

impl From<Task> for TaskSummaryDto {
    fn from(t: Task) -> Self {
        TaskSummaryDto {
            id: t.id,
            title: t.title,
            repo_id: t.repo_id,
            repo_url: t.repo_url.to_string(),
            task_type: t.task_type.to_string(),
            state: t.state.to_string(),
            agent_type: t.agent_type.to_string(),
            model_used: t.model_used,
            cost_usd: t.cost_usd.map(|c| c.to_string()),
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            pr_url: t.pr_url,
            pr_number: t.pr_number,
            issue_number: t.issue_number,
            parent_task_id: t.parent_task_id,
            attempt: t.attempt,
            error_message: t.error_message,
            created_at: t.created_at,
            updated_at: t.updated_at,
            started_at: t.started_at,
            finished_at: t.finished_at,
            blocked_reason: t.blocked_by.map(|_| "budget_exhausted".to_owned()),
            blocked_by: t.blocked_by.map(|b| b.as_str().to_owned()),
            imported: t.imported,
            revisions: t.revisions,
        }
    }
}

/// One page of tasks.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskListDto {
    /// Tasks, newest first (without their prompts).
    pub tasks: Vec<TaskSummaryDto>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// One agent run of a task.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunDto {
    /// Run id.
    pub id: Uuid,
    /// The task's attempt during this run.
    pub attempt: i32,
    /// The agent.
    pub agent_type: String,
    /// The model.
    pub model: Option<String>,
    /// Exact decimal USD, or null when the agent reported no cost.
    pub cost_usd: Option<String>,
    /// Uncached input tokens.
    pub input_tokens: i64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: i64,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Agent turns.
    pub turns: Option<i32>,
    /// `succeeded`, `failed`, `cancelled`, `timed_out` or `lost`.
    pub outcome: String,
    /// The agent process's exit code.
    pub exit_code: Option<i32>,
    /// What went wrong.
    pub error_message: Option<String>,
    /// Start.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// End.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Whether the agent ran in the sandbox: `false` for runs of a service started with
    /// `AGENTRY_AGENT_SANDBOX=off`, null when not known (a run recovered after its service
    /// died, or recorded before this was kept).
    pub sandboxed: Option<bool>,
    /// How many model calls the model gateway metered for this run; null for a run whose
    /// calls did not go through the gateway (unsandboxed), whose `costUsd` is then the
    /// agent's own word.
    pub model_calls: Option<i64>,
    /// The sum of the run's metered calls (exact decimal USD): for a metered run, the same
    /// as `costUsd`; null for a run that was not metered or whose calls include an unpriced
    /// model.
    pub metered_cost_usd: Option<String>,
    /// What the agent itself printed as its cost (exact decimal USD), kept beside the
    /// metered cost; null when it printed none.
    pub reported_cost_usd: Option<String>,
    /// Why the run happened: `assignment` (the first attempt), `retry` (a retry or a
    /// recovery) or `revision` (review feedback; docs/contract.md#57-revisions).
    #[schema(example = "assignment")]
    pub trigger: String,
    /// For a revision: the web address of the feedback that started its round.
    pub trigger_url: Option<String>,
    /// For a revision: that feedback's author (a code-host login).
    pub trigger_author: Option<String>,
}

impl RunDto {
    /// The run with why it happened.
    pub fn with_trigger(r: Run, trigger: Option<RunTrigger>) -> Self {
        let trigger = trigger.unwrap_or(RunTrigger {
            kind: if r.attempt > 1 {
                RunTriggerKind::Retry
            } else {
                RunTriggerKind::Assignment
            },
            url: None,
            author: None,
        });
        RunDto {
            trigger: trigger.kind.as_str().to_owned(),
            trigger_url: trigger.url,
            trigger_author: trigger.author,
            ..RunDto::from(r)
        }
    }
}

impl From<Run> for RunDto {
    fn from(r: Run) -> Self {
        RunDto {
            trigger: if r.attempt > 1 { "retry" } else { "assignment" }.to_owned(),
            trigger_url: None,
            trigger_author: None,
            id: r.id,
            attempt: r.attempt,
            agent_type: r.agent_type.to_string(),
            model: r.model,
            cost_usd: r.cost_usd.map(|c| c.to_string()),
            input_tokens: r.tokens.uncached(),
            cache_read_tokens: r.tokens.cache_read,
            cache_write_tokens: r.tokens.cache_write,
            output_tokens: r.tokens.output,
            turns: r.turns,
            outcome: r.outcome.as_str().to_owned(),
            exit_code: r.exit_code,
            error_message: r.error_message,
            started_at: r.started_at,
            finished_at: r.finished_at,
            sandboxed: r.sandboxed,
            model_calls: r.model_calls,
            metered_cost_usd: r.model_calls.and(r.cost_usd).map(|c| c.to_string()),
            reported_cost_usd: r.reported_cost_usd.map(|c| c.to_string()),
        }
    }
}

/// One state change.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventDto {
    /// State before; null for the creation event.
    pub from: Option<String>,
    /// State after.
    pub to: String,
    /// Why.
    pub reason: String,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// `transition` (a state change), or `cost_mismatch` (a metered run whose agent printed
    /// a different cost; `from` = `to`, the state at the time).
    #[schema(example = "transition")]
    pub kind: String,
}

impl From<TaskEvent> for EventDto {
    fn from(e: TaskEvent) -> Self {
        EventDto {
            from: e.from.map(|s| s.to_string()),
            to: e.to.to_string(),
            reason: e.reason,
            at: e.at,
            kind: e.kind.as_str().to_owned(),
        }
    }
}

/// Connections the egress proxy refused to one destination during one run.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressBlockedDto {
    /// The run's attempt.
    pub attempt: i32,
    /// The host asked for (a name or an IP literal), or `*` for the row that sums the
    /// run's refusals to destinations beyond its first 32.
    pub host: String,
    /// The port asked for; 0 in the `*` row.
    pub port: i32,
    /// How many connections were refused.
    pub count: i64,
    /// The first refusal.
    #[serde(with = "time::serde::rfc3339")]
    pub first_at: OffsetDateTime,
    /// The last refusal.
    #[serde(with = "time::serde::rfc3339")]
    pub last_at: OffsetDateTime,
}

impl From<EgressBlocked> for EgressBlockedDto {
    fn from(b: EgressBlocked) -> Self {
        EgressBlockedDto {
            attempt: b.attempt,
            host: b.host,
            port: b.port,
            count: b.count,
            first_at: b.first_at,
            last_at: b.last_at,
        }
    }
}

/// One model call of a run, as the model gateway metered it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCallDto {
    /// Call id.
    pub id: Uuid,
    /// The run's attempt.
    pub attempt: i32,
    /// When the gateway received it.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// `anthropic` or `openai`.
    pub provider: String,
    /// The model that answered (else the one asked for).
    pub model: Option<String>,
    /// The HTTP status the agent got.
    pub status: i32,
    /// `completed`, `refused` (by the gateway: `budget reached`), `upstream_error` (the
    /// provider answered an error, or could not be reached), `interrupted` (the call broke off
    /// before its usage came: the answer, the agent or the run ended) or `unmetered` (the
    /// answer ended without its usage); the last two cost at least their reservation.
    pub outcome: String,
    /// Uncached input tokens.
    pub input_tokens: i64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: i64,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: i64,
    /// Output tokens (reasoning included).
    pub output_tokens: i64,
    /// The part of the output spent on reasoning.
    pub reasoning_tokens: i64,
    /// Its priced cost, exact decimal USD; null only for a call recorded before the gateway
    /// refused models without a price.
    pub cost_usd: Option<String>,
    /// Until its answer ended, in milliseconds.
    pub duration_ms: i64,
}

impl From<ModelCall> for ModelCallDto {
    fn from(c: ModelCall) -> Self {
        ModelCallDto {
            id: c.id,
            attempt: c.attempt,
            at: c.started_at,
            provider: c.provider,
            model: c.model,
            status: c.status,
            outcome: c.outcome,
            input_tokens: c.tokens.uncached(),
            cache_read_tokens: c.tokens.cache_read,
            cache_write_tokens: c.tokens.cache_write,
            output_tokens: c.tokens.output,
            reasoning_tokens: c.reasoning_tokens,
            cost_usd: c.cost_usd.map(|v| v.to_string()),
            duration_ms: c.duration_ms,
        }
    }
}

/// The metered model calls of a task.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCallListDto {
    /// Oldest first, by attempt (at most 10,000).
    pub calls: Vec<ModelCallDto>,
    /// Their summed cost, exact decimal USD; null when one of them has no price.
    pub total_cost_usd: Option<String>,
}

/// The issue a task is linked to.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssueRefDto {
    /// Issue number.
    pub number: i64,
    /// Its page on the code host.
    pub html_url: String,
}

/// A task with everything a dashboard row opens: runs, state history, issue and reviews.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskDetailDto {
    /// The task.
    #[serde(flatten)]
    pub task: TaskDto,
    /// Its agent runs, oldest first.
    pub runs: Vec<RunDto>,
    /// Its state history, oldest first.
    pub events: Vec<EventDto>,
    /// The linked issue.
    pub issue: Option<IssueRefDto>,
    /// Its review subtasks (without their prompts).
    pub reviews: Vec<TaskSummaryDto>,
    /// The connections its runs' egress proxy refused, by destination.
    pub egress_blocked: Vec<EgressBlockedDto>,
    /// The review feedback that asked for changes on its pull request, oldest first, with
    /// the round that took each (docs/contract.md#57-revisions).
    pub feedback: Vec<FeedbackDto>,
}

/// Review feedback that asked for changes on a task's pull request.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackDto {
    /// `review` (changes requested), `issue_comment` or `review_comment` (a mention), or
    /// `agent_review` (agentry's own review agent).
    #[schema(example = "review")]
    pub source: String,
    /// Its author (a code-host login).
    pub author: String,
    /// What it says.
    pub body: String,
    /// Its web address.
    pub url: String,
    /// The file of a review comment.
    pub path: Option<String>,
    /// The line of a review comment.
    pub line: Option<i64>,
    /// When agentry received it.
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// The attempt that started the revision round that took it; null when none did.
    pub round_attempt: Option<i32>,
    /// `waiting` (for the next round), `taken`, `over_limit` (maxRevisions reached) or
    /// `dropped` (the pull request closed first).
    #[schema(example = "taken")]
    pub outcome: String,
}

impl From<Feedback> for FeedbackDto {
    fn from(f: Feedback) -> Self {
        FeedbackDto {
            source: f.source.as_str().to_owned(),
            author: f.author,
            body: f.body,
            url: f.url,
            path: f.path,
            line: f.line,
            received_at: f.received_at,
            round_attempt: f.round_attempt,
            outcome: f.outcome.as_str().to_owned(),
        }
    }
}

/// Result of an import.
#[derive(Debug, Serialize, ToSchema)]
pub struct ImportResultDto {
    /// Records written.
    pub imported: u64,
    /// Records skipped because their id already existed.
    pub skipped: u64,
}

/// Documentation-only schemas: the closed sets of values the API accepts, so that the OpenAPI
/// document says exactly what the server takes.
pub mod names {
    use serde::Serialize;
    use utoipa::ToSchema;

    /// An agent.
    #[derive(Serialize, ToSchema)]
    #[serde(rename_all = "kebab-case")]
    pub enum AgentTypeName {
        /// Claude Code.
        ClaudeCode,
        /// Codex.
        Codex,
    }

    /// A task state.
    #[derive(Serialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum TaskStateName {
        /// Waiting for a runner.
        Queued,
        /// A runner prepares its workspace.
        Provisioning,
        /// The agent runs.
        Running,
        /// A pull request is open.
        PrOpened,
        /// Done.
        Completed,
        /// Failed.
        Failed,
        /// Cancelled.
        Cancelled,
    }

    /// A task type.
    #[derive(Serialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum TaskTypeName {
        /// Changes code and opens a pull request.
        Coding,
        /// Reviews a coding task's pull request.
        Review,
    }

    /// A token's role.
    #[derive(Serialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum RoleName {
        /// Reads everything but secrets' values.
        Viewer,
        /// Also creates, cancels and retries tasks.
        Member,
        /// Also manages tokens, secrets, repositories and imports.
        Admin,
    }
}
