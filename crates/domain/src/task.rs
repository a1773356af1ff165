//! Tasks and the task state machine.
//!
//! A task moves through the states of [`TaskState`] driven by [`Trigger`]s.
//! The whole state machine is the single pure function [`transition`]:
//! given the current state, a trigger, the task's type and its attempt
//! number, it returns the resulting [`Transition`] or refuses with a
//! [`TransitionError`]. Callers (the API, the runner, the pull-request
//! poller) never decide a next state themselves.
//!
//! | from                                 | trigger                       | to                         |
//! |--------------------------------------|-------------------------------|----------------------------|
//! | queued                               | `claim`                       | provisioning               |
//! | provisioning                         | `agent_started`               | running                    |
//! | running                              | `pull_request_opened` (coding)| pr_opened                  |
//! | running                              | `review_posted` (review)      | completed                  |
//! | pr_opened                            | `pull_request_merged`         | completed                  |
//! | pr_opened                            | `pull_request_closed`         | failed                     |
//! | queued, provisioning, running        | `cancel`                      | cancelled                  |
//! | provisioning, running                | `fail`                        | failed                     |
//! | failed, cancelled                    | `retry`                       | queued, attempt + 1        |
//! | provisioning, running                | `lease_expired`               | queued, attempt + 1, or failed at [`MAX_ATTEMPTS`] |
//! | pr_opened                            | `revision_requested` (coding) | queued, attempt + 1        |
//!
//! While a coding task's revision round runs (see [`transition_in`] and
//! [`Revision`]), the pull request stands whatever the run does: `cancel`
//! and `fail` from queued, provisioning or running lead back to pr_opened,
//! `lease_expired` past [`MAX_ATTEMPTS`] within the round too, and the pull
//! request's merge or close (`pull_request_merged` / `pull_request_closed`)
//! applies from those states as from pr_opened.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::money::Usd;
use crate::repo_url::RepoUrl;

/// The highest attempt number a task reaches through expired leases.
///
/// When a runner's lease on a provisioning or running task expires, the task
/// is re-queued with its attempt number incremented as long as the attempt is
/// below this limit; at the limit it fails instead. An explicit
/// [`Trigger::Retry`] is not limited.
pub const MAX_ATTEMPTS: i32 = 3;

/// A string that is not the wire name of any variant of an enumeration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}; expected one of: {expected}")]
pub struct UnknownValue {
    /// What was being parsed, e.g. `"task type"`.
    pub kind: &'static str,
    /// The text that was given.
    pub value: String,
    /// The accepted wire names, comma-separated, e.g. `"coding, review"`.
    pub expected: String,
}

/// Implements `ALL`, `as_str`, `Display` and `FromStr` (a string that names no
/// variant is an [`UnknownValue`]) for a fieldless enum whose wire names are the
/// given strings: the serde names of this crate's enums, and the stored names of
/// other crates' (which convert [`UnknownValue`] into their own error).
#[macro_export]
macro_rules! wire_enum {
    ($ty:ident, $kind:literal, [$($variant:ident => $wire:literal),+ $(,)?]) => {
        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: [$ty; <[&str]>::len(&[$(stringify!($variant)),+])] =
                [$($ty::$variant),+];

            /// The wire name, as used in JSON and in the database.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $wire),+
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::UnknownValue;

            /// Parses an exact wire name (case-sensitive, no surrounding
            /// whitespace).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $crate::UnknownValue {
                        kind: $kind,
                        value: s.to_owned(),
                        expected: Self::ALL.map(Self::as_str).join(", "),
                    })
            }
        }
    };
}

/// The lifecycle state of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a runner to claim it.
    Queued,
    /// Claimed by a runner, which is preparing a workspace and starting the
    /// agent.
    Provisioning,
    /// The agent is working on it.
    Running,
    /// A coding task's agent opened a pull request; waiting for it to be
    /// merged or closed.
    PrOpened,
    /// Done: the pull request was merged, or the review was posted.
    Completed,
    /// Did not succeed (error, agent failure, no changes, time limit,
    /// pull request closed unmerged, too many expired leases). Can be
    /// retried.
    Failed,
    /// Cancelled by a user. Can be retried.
    Cancelled,
}

wire_enum!(TaskState, "task state", [
    Queued => "queued",
    Provisioning => "provisioning",
    Running => "running",
    PrOpened => "pr_opened",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
]);

impl TaskState {
    /// Whether no runner or poller work is pending for a task in this state
    /// (completed, failed, cancelled).
    ///
    /// Failed and cancelled tasks are terminal in this sense even though a
    /// user can still [retry](Trigger::Retry) them.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled
        )
    }
}

/// What a task asks the agent to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// Change code and open a pull request.
    Coding,
    /// Review a pull request and post the review.
    Review,
}

wire_enum!(TaskType, "task type", [
    Coding => "coding",
    Review => "review",
]);

/// Which coding agent runs a task.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum AgentType {
    /// Anthropic's Claude Code (the default).
    #[default]
    #[serde(rename = "claude-code")]
    ClaudeCode,
    /// OpenAI's Codex.
    #[serde(rename = "codex")]
    Codex,
}

wire_enum!(AgentType, "agent type", [
    ClaudeCode => "claude-code",
    Codex => "codex",
]);

impl AgentType {
    /// The model a coding task of this agent runs with unless the repository names another:
    /// Claude Code's alias `sonnet`; Codex's own default, `gpt-6.1-sol`.
    pub fn default_coding_model(self) -> &'static str {
        match self {
            AgentType::ClaudeCode => "sonnet",
            AgentType::Codex => "gpt-6.1-sol",
        }
    }

    /// The model a review task of this agent runs with unless the repository names
    /// another: the small model of each family, Claude Code's `haiku`, Codex's
    /// `gpt-6-luna`.
    pub fn default_review_model(self) -> &'static str {
        match self {
            AgentType::ClaudeCode => "haiku",
            AgentType::Codex => "gpt-6-luna",
        }
    }
}

/// An event that may move a task to another state; see [`transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// A runner claims a queued task: queued → provisioning.
    Claim,
    /// The agent process started: provisioning → running.
    AgentStarted,
    /// The agent's work was pushed and a pull request opened: running →
    /// pr_opened. Coding tasks only.
    PullRequestOpened,
    /// The agent's review was posted on the pull request: running →
    /// completed. Review tasks only.
    ReviewPosted,
    /// The task's pull request was merged: pr_opened → completed.
    PullRequestMerged,
    /// The task's pull request was closed without being merged: pr_opened →
    /// failed.
    PullRequestClosed,
    /// A user cancels the task: queued, provisioning or running → cancelled.
    Cancel,
    /// The run failed (an error, an agent failure, no changes, the time
    /// limit): provisioning or running → failed.
    Fail,
    /// A user retries a failed or cancelled task: → queued with the attempt
    /// number incremented.
    Retry,
    /// The runner's lease on a provisioning or running task expired: →
    /// queued with the attempt number incremented while the attempt is below
    /// [`MAX_ATTEMPTS`], otherwise → failed with the attempt unchanged.
    LeaseExpired,
    /// Review feedback asks for changes on the task's open pull request: pr_opened →
    /// queued with the attempt number incremented, the start of a revision round.
    /// Coding tasks only.
    RevisionRequested,
}

wire_enum!(Trigger, "trigger", [
    Claim => "claim",
    AgentStarted => "agent_started",
    PullRequestOpened => "pull_request_opened",
    ReviewPosted => "review_posted",
    PullRequestMerged => "pull_request_merged",
    PullRequestClosed => "pull_request_closed",
    Cancel => "cancel",
    Fail => "fail",
    Retry => "retry",
    LeaseExpired => "lease_expired",
    RevisionRequested => "revision_requested",
]);

/// An allowed state change, as computed by [`transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: TaskState,
    /// The state after.
    pub to: TaskState,
    /// What caused it.
    pub trigger: Trigger,
    /// The task's attempt number after the transition.
    pub attempt: i32,
}

/// A trigger that does not apply to a task in its current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot apply {trigger} to a {task_type} task in state {from}")]
pub struct TransitionError {
    /// The task's current state.
    pub from: TaskState,
    /// The refused trigger.
    pub trigger: Trigger,
    /// The task's type.
    pub task_type: TaskType,
}

/// The task state machine: applies `trigger` to a `task_type` task in state
/// `from` whose attempt number is `attempt`, outside any revision round.
///
/// Returns the resulting [`Transition`] (new state and attempt number), or a
/// [`TransitionError`] for every combination not listed on [`Trigger`].
/// Attempt increments saturate at `i32::MAX`. The same as [`transition_in`]
/// with no revision round.
pub fn transition(
    from: TaskState,
    trigger: Trigger,
    task_type: TaskType,
    attempt: i32,
) -> Result<Transition, TransitionError> {
    transition_in(from, trigger, task_type, attempt, None)
}

/// A coding task's revision round: the runs that answer review feedback on
/// its open pull request (docs/contract.md#57-revisions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revision {
    /// The attempt number the round started with (the one
    /// [`Trigger::RevisionRequested`] gave the task).
    pub first_attempt: i32,
}

impl Revision {
    /// The round a task is in: `Some` when the task is queued, provisioning
    /// or running and its latest revision round started at or before its
    /// current attempt.
    pub fn of(state: TaskState, attempt: i32, round_start: Option<i32>) -> Option<Revision> {
        let working = matches!(
            state,
            TaskState::Queued | TaskState::Provisioning | TaskState::Running
        );
        match round_start {
            Some(first_attempt) if working && attempt >= first_attempt => {
                Some(Revision { first_attempt })
            }
            _ => None,
        }
    }
}

/// The task state machine with the revision round the task is in, if any
/// (see the module's table).
///
/// Within a round the pull request stands: what would fail or cancel the
/// task leads back to pr_opened instead, the attempt limit of
/// [`Trigger::LeaseExpired`] counts the round's attempts only, and the pull
/// request's merge or close applies from queued, provisioning and running.
pub fn transition_in(
    from: TaskState,
    trigger: Trigger,
    task_type: TaskType,
    attempt: i32,
    revision: Option<Revision>,
) -> Result<Transition, TransitionError> {
    use TaskState as S;
    use TaskType as T;
    use Trigger as G;

    let next = attempt.saturating_add(1);
    let refused = TransitionError {
        from,
        trigger,
        task_type,
    };
    if let (Some(round), T::Coding) = (revision, task_type)
        && matches!(from, S::Queued | S::Provisioning | S::Running)
    {
        let within = attempt
            .saturating_sub(round.first_attempt)
            .saturating_add(1);
        let to = match (from, trigger) {
            (_, G::Cancel) => Some((S::PrOpened, attempt)),
            (S::Provisioning | S::Running, G::Fail) => Some((S::PrOpened, attempt)),
            (S::Provisioning | S::Running, G::LeaseExpired) if within < MAX_ATTEMPTS => {
                Some((S::Queued, next))
            }
            (S::Provisioning | S::Running, G::LeaseExpired) => Some((S::PrOpened, attempt)),
            (_, G::PullRequestMerged) => Some((S::Completed, attempt)),
            (_, G::PullRequestClosed) => Some((S::Failed, attempt)),
            _ => None,
        };
        if let Some((to, attempt)) = to {
            return Ok(Transition {
                from,
                to,
                trigger,
                attempt,
            });
        }
    }
    let (to, attempt) = match (from, trigger, task_type) {
        (S::Queued, G::Claim, _) => (S::Provisioning, attempt),
        (S::Provisioning, G::AgentStarted, _) => (S::Running, attempt),
        (S::Running, G::PullRequestOpened, T::Coding) => (S::PrOpened, attempt),
        (S::Running, G::ReviewPosted, T::Review) => (S::Completed, attempt),
        (S::PrOpened, G::PullRequestMerged, _) => (S::Completed, attempt),
        (S::PrOpened, G::PullRequestClosed, _) => (S::Failed, attempt),
        (S::PrOpened, G::RevisionRequested, T::Coding) => (S::Queued, next),
        (S::Queued | S::Provisioning | S::Running, G::Cancel, _) => (S::Cancelled, attempt),
        (S::Provisioning | S::Running, G::Fail, _) => (S::Failed, attempt),
        (S::Failed | S::Cancelled, G::Retry, _) => (S::Queued, next),
        (S::Provisioning | S::Running, G::LeaseExpired, _) if attempt < MAX_ATTEMPTS => {
            (S::Queued, next)
        }
        (S::Provisioning | S::Running, G::LeaseExpired, _) => (S::Failed, attempt),
        _ => return Err(refused),
    };
    Ok(Transition {
        from,
        to,
        trigger,
        attempt,
    })
}

/// A task: one unit of agent work on one repository, as every crate passes
/// it around.
///
/// Plain data; the API has its own serialisable representation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The task's identifier.
    pub id: Uuid,
    /// A short human title.
    pub title: String,
    /// The instructions given to the agent.
    pub prompt: String,
    /// The registered repository this task belongs to, if any.
    pub repo_id: Option<Uuid>,
    /// The repository the agent works on.
    pub repo_url: RepoUrl,
    /// Coding or review.
    pub task_type: TaskType,
    /// The lifecycle state.
    pub state: TaskState,
    /// The agent that runs (or ran) the task.
    pub agent_type: AgentType,
    /// The model the agent reported using, once known.
    pub model_used: Option<String>,
    /// The exact cost of the run in USD, once known.
    pub cost_usd: Option<Usd>,
    /// Input tokens consumed by the agent.
    pub input_tokens: i64,
    /// Output tokens produced by the agent.
    pub output_tokens: i64,
    /// The pull request opened (coding) or reviewed (review), if any.
    pub pr_url: Option<String>,
    /// The number of that pull request, if any.
    pub pr_number: Option<i64>,
    /// The issue the task was created from, if any.
    pub issue_number: Option<i64>,
    /// The task this one was derived from (e.g. the coding task a review
    /// task reviews), if any.
    pub parent_task_id: Option<Uuid>,
    /// The attempt number, starting at 1; incremented by retries and expired
    /// leases.
    pub attempt: i32,
    /// Why the task failed, if it did.
    pub error_message: Option<String>,
    /// When the task was created.
    pub created_at: OffsetDateTime,
    /// When the task was last changed.
    pub updated_at: OffsetDateTime,
    /// When the current attempt started running, if it did.
    pub started_at: Option<OffsetDateTime>,
    /// When the task reached a terminal state, if it did.
    pub finished_at: Option<OffsetDateTime>,
    /// The monthly budget that keeps this queued task from being claimed, if one does
    /// (docs/contract.md#67-budgets).
    pub blocked_by: Option<BudgetScope>,
    /// History brought in by an import (docs/contract.md#39-import): never claimed, and a
    /// retry of it is refused.
    pub imported: bool,
    /// How many revision rounds review feedback started on the task's pull request
    /// (docs/contract.md#57-revisions).
    pub revisions: i32,
    /// The first attempt of the task's latest revision round, if one started since the
    /// task was last retried.
    pub revision_attempt: Option<i32>,
    /// What the task's revision runs cost (runs of a revision round), exactly; part of
    /// `cost_usd`, which sums every run. Zero when none recorded a cost.
    pub revision_cost_usd: Usd,
}

impl Task {
    /// The revision round the task is in, if any (see [`Revision::of`]).
    pub fn revision(&self) -> Option<Revision> {
        Revision::of(self.state, self.attempt, self.revision_attempt)
    }
}

/// Which monthly budget a limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// The instance-wide budget.
    Instance,
    /// The task's repository's budget.
    Repository,
}

wire_enum!(BudgetScope, "budget scope", [
    Instance => "instance",
    Repository => "repository",
]);

#[cfg(test)]
mod tests {

    use super::*;
    use TaskState as S;
    use TaskType as T;
    use Trigger as G;

    /// How the attempt number changes on an allowed row.
    #[derive(Debug, Clone, Copy)]
    enum Attempt {
        Same,
        Increment,
    }

    /// Both task types.
    const BOTH: &[TaskType] = &[T::Coding, T::Review];
    /// Coding tasks only.
    const CODING: &[TaskType] = &[T::Coding];
    /// Review tasks only.
    const REVIEW: &[TaskType] = &[T::Review];

    /// Every allowed (from, trigger) row, the task types it applies to and its result,
    /// written out independently of `transition`. `LeaseExpired` rows are listed
    /// separately because their result depends on the attempt number.
    const TABLE: &[(TaskState, Trigger, &[TaskType], TaskState, Attempt)] = &[
        (S::Queued, G::Claim, BOTH, S::Provisioning, Attempt::Same),
        (
            S::Provisioning,
            G::AgentStarted,
            BOTH,
            S::Running,
            Attempt::Same,
        ),
        (
            S::Running,
            G::PullRequestOpened,
            CODING,
            S::PrOpened,
            Attempt::Same,
        ),
        (
            S::Running,
            G::ReviewPosted,
            REVIEW,
            S::Completed,
            Attempt::Same,
        ),
        (
            S::PrOpened,
            G::PullRequestMerged,
            BOTH,
            S::Completed,
            Attempt::Same,
        ),
        (
            S::PrOpened,
            G::PullRequestClosed,
            BOTH,
            S::Failed,
            Attempt::Same,
        ),
        (S::Queued, G::Cancel, BOTH, S::Cancelled, Attempt::Same),
        (
            S::Provisioning,
            G::Cancel,
            BOTH,
            S::Cancelled,
            Attempt::Same,
        ),
        (S::Running, G::Cancel, BOTH, S::Cancelled, Attempt::Same),
        (S::Provisioning, G::Fail, BOTH, S::Failed, Attempt::Same),
        (S::Running, G::Fail, BOTH, S::Failed, Attempt::Same),
        (S::Failed, G::Retry, BOTH, S::Queued, Attempt::Increment),
        (S::Cancelled, G::Retry, BOTH, S::Queued, Attempt::Increment),
        (
            S::PrOpened,
            G::RevisionRequested,
            CODING,
            S::Queued,
            Attempt::Increment,
        ),
    ];

    /// States from which an expired lease is allowed.
    const LEASE_STATES: &[TaskState] = &[S::Provisioning, S::Running];

    /// The expected result of a (from, trigger, type, attempt) combination
    /// according to the tables above.
    fn expected(from: S, trigger: G, task_type: T, attempt: i32) -> Option<(S, i32)> {
        if trigger == G::LeaseExpired {
            return LEASE_STATES.contains(&from).then(|| {
                if attempt < MAX_ATTEMPTS {
                    (S::Queued, attempt + 1)
                } else {
                    (S::Failed, attempt)
                }
            });
        }
        TABLE
            .iter()
            .find(|row| row.0 == from && row.1 == trigger && row.2.contains(&task_type))
            .map(|&(_, _, _, to, change)| match change {
                Attempt::Same => (to, attempt),
                Attempt::Increment => (to, attempt + 1),
            })
    }

    #[test]
    fn exactly_the_table_is_allowed() {
        let mut allowed = 0;
        for from in S::ALL {
            for trigger in G::ALL {
                for task_type in T::ALL {
                    for attempt in 1..=4 {
                        let got = transition(from, trigger, task_type, attempt);
                        match expected(from, trigger, task_type, attempt) {
                            Some((to, new_attempt)) => {
                                allowed += 1;
                                assert_eq!(
                                    got,
                                    Ok(Transition {
                                        from,
                                        to,
                                        trigger,
                                        attempt: new_attempt
                                    }),
                                    "{from} + {trigger} ({task_type}, attempt {attempt})"
                                );
                            }
                            None => assert_eq!(
                                got,
                                Err(TransitionError {
                                    from,
                                    trigger,
                                    task_type
                                }),
                                "{from} + {trigger} ({task_type}, attempt {attempt}) must be refused"
                            ),
                        }
                    }
                }
            }
        }
        // Each table row once per task type it names, and each lease state once per task
        // type, each at 4 attempts: 25 + 4 combinations.
        let rows: usize = TABLE.iter().map(|row| row.2.len()).sum();
        assert_eq!(rows, 25);
        assert_eq!(allowed, (rows + LEASE_STATES.len() * T::ALL.len()) * 4);
    }

    #[test]
    fn lease_expiry_requeues_until_the_last_attempt() {
        for from in [S::Provisioning, S::Running] {
            for task_type in T::ALL {
                let t1 = transition(from, G::LeaseExpired, task_type, 1).unwrap();
                assert_eq!((t1.to, t1.attempt), (S::Queued, 2));
                let t2 = transition(from, G::LeaseExpired, task_type, 2).unwrap();
                assert_eq!((t2.to, t2.attempt), (S::Queued, 3));
                let t3 = transition(from, G::LeaseExpired, task_type, 3).unwrap();
                assert_eq!((t3.to, t3.attempt), (S::Failed, 3));
            }
        }
    }

    #[test]
    fn lease_expiry_does_not_apply_elsewhere() {
        for from in [
            S::Queued,
            S::PrOpened,
            S::Completed,
            S::Failed,
            S::Cancelled,
        ] {
            assert!(transition(from, G::LeaseExpired, T::Coding, 1).is_err());
        }
    }

    #[test]
    fn retry_increments_attempt_without_limit() {
        for attempt in [1, 2, 3, 7] {
            let t = transition(S::Failed, G::Retry, T::Coding, attempt).unwrap();
            assert_eq!((t.to, t.attempt), (S::Queued, attempt + 1));
        }
        let t = transition(S::Cancelled, G::Retry, T::Review, 1).unwrap();
        assert_eq!((t.to, t.attempt), (S::Queued, 2));
        let t = transition(S::Failed, G::Retry, T::Review, i32::MAX).unwrap();
        assert_eq!(t.attempt, i32::MAX);
    }

    #[test]
    fn type_specific_triggers() {
        assert!(transition(S::Running, G::PullRequestOpened, T::Review, 1).is_err());
        assert!(transition(S::Running, G::ReviewPosted, T::Coding, 1).is_err());
    }

    #[test]
    fn transition_error_message() {
        let err = transition(S::Running, G::PullRequestOpened, T::Review, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot apply pull_request_opened to a review task in state running"
        );
    }

    #[test]
    fn terminal_states() {
        let terminal: Vec<_> = S::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [S::Completed, S::Failed, S::Cancelled]);
    }

    #[test]
    fn display_from_str_round_trips() {
        for s in S::ALL {
            assert_eq!(s.to_string().parse::<S>(), Ok(s));
        }
        for t in T::ALL {
            assert_eq!(t.to_string().parse::<T>(), Ok(t));
        }
        for a in AgentType::ALL {
            assert_eq!(a.to_string().parse::<AgentType>(), Ok(a));
        }
    }

    #[test]
    fn unknown_values_are_refused() {
        assert_eq!(
            "pull_request".parse::<T>(),
            Err(UnknownValue {
                kind: "task type",
                value: "pull_request".into(),
                expected: "coding, review".into(),
            })
        );
        let err = "Coding".parse::<T>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown task type \"Coding\"; expected one of: coding, review"
        );
        assert!(" queued".parse::<S>().is_err());
        assert!("".parse::<S>().is_err());
        assert!("PrOpened".parse::<S>().is_err());
        assert_eq!(
            "claude_code".parse::<AgentType>().unwrap_err().expected,
            "claude-code, codex"
        );
        assert_eq!(
            "x".parse::<S>().unwrap_err().expected,
            "queued, provisioning, running, pr_opened, completed, failed, cancelled"
        );
    }

    #[test]
    fn serde_wire_names_match_as_str() {
        let wire = |v: serde_json::Value| v.as_str().unwrap().to_owned();
        for s in S::ALL {
            assert_eq!(wire(serde_json::to_value(s).unwrap()), s.as_str());
            assert_eq!(serde_json::from_value::<S>(s.as_str().into()).unwrap(), s);
        }
        for t in T::ALL {
            assert_eq!(wire(serde_json::to_value(t).unwrap()), t.as_str());
            assert_eq!(serde_json::from_value::<T>(t.as_str().into()).unwrap(), t);
        }
        for a in AgentType::ALL {
            assert_eq!(wire(serde_json::to_value(a).unwrap()), a.as_str());
            assert_eq!(
                serde_json::from_value::<AgentType>(a.as_str().into()).unwrap(),
                a
            );
        }
        assert_eq!(S::PrOpened.as_str(), "pr_opened");
        assert_eq!(AgentType::ClaudeCode.as_str(), "claude-code");
        assert_eq!(AgentType::default(), AgentType::ClaudeCode);
        assert!(serde_json::from_str::<AgentType>("\"claude_code\"").is_err());
    }

    #[test]
    fn trigger_names_are_unique_snake_case() {
        let names: std::collections::HashSet<_> = G::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names.len(), G::ALL.len());
        for name in names {
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        }
        assert_eq!(G::LeaseExpired.to_string(), "lease_expired");
    }

    #[test]
    fn a_revision_round_keeps_the_pull_request() {
        let round = Some(Revision { first_attempt: 2 });
        for from in [S::Queued, S::Provisioning, S::Running] {
            let t = transition_in(from, G::Cancel, T::Coding, 2, round).unwrap();
            assert_eq!((t.to, t.attempt), (S::PrOpened, 2));
            let merged = transition_in(from, G::PullRequestMerged, T::Coding, 2, round).unwrap();
            assert_eq!(merged.to, S::Completed);
            let closed = transition_in(from, G::PullRequestClosed, T::Coding, 2, round).unwrap();
            assert_eq!(closed.to, S::Failed);
        }
        for from in [S::Provisioning, S::Running] {
            let t = transition_in(from, G::Fail, T::Coding, 2, round).unwrap();
            assert_eq!(t.to, S::PrOpened);
            // The round's attempts count, not the task's: 2 and 3 requeue, 4 gives up.
            for (attempt, to) in [(2, S::Queued), (3, S::Queued), (4, S::PrOpened)] {
                let t = transition_in(from, G::LeaseExpired, T::Coding, attempt, round).unwrap();
                assert_eq!(t.to, to, "attempt {attempt}");
            }
        }
        // Everything else is the ordinary machine.
        let t = transition_in(S::Running, G::PullRequestOpened, T::Coding, 2, round).unwrap();
        assert_eq!(t.to, S::PrOpened);
        assert!(transition_in(S::PrOpened, G::Cancel, T::Coding, 2, round).is_err());
        // Outside a round a merge applies only to pr_opened.
        assert!(transition(S::Running, G::PullRequestMerged, T::Coding, 2).is_err());
        assert!(transition(S::PrOpened, G::RevisionRequested, T::Review, 1).is_err());
    }

    #[test]
    fn the_round_is_the_current_attempts_only() {
        assert_eq!(
            Revision::of(S::Queued, 2, Some(2)),
            Some(Revision { first_attempt: 2 })
        );
        assert_eq!(
            Revision::of(S::Running, 3, Some(2)),
            Some(Revision { first_attempt: 2 })
        );
        assert_eq!(Revision::of(S::PrOpened, 2, Some(2)), None);
        assert_eq!(Revision::of(S::Queued, 1, Some(2)), None);
        assert_eq!(Revision::of(S::Queued, 2, None), None);
    }
}
