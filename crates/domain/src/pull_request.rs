//! What a pull request's state on the code host means for the task that opened it
//! (docs/contract.md#55-pull-request-tracking, #56-webhook): the one decision the poller and the webhook share.

use crate::task::{Revision, TaskState, Trigger};

/// A pull request as a task records it: its web URL and its number in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PullRequestRef {
    /// The web URL (`https://github.com/org/repo/pull/7`).
    pub url: String,
    /// The number in its repository.
    pub number: i64,
}

/// A pull request's state as the code host reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullRequestState {
    /// Open (or reopened): its task keeps waiting.
    Open,
    /// Merged (`merged_at` set).
    Merged,
    /// Closed without being merged.
    Closed,
}

impl PullRequestState {
    /// The state from the code host's `state` member (`open` or `closed`) and whether the
    /// pull request was merged. A merged pull request is closed; `merged` decides.
    pub fn from_codehost(state: &str, merged: bool) -> PullRequestState {
        if merged {
            PullRequestState::Merged
        } else if state.eq_ignore_ascii_case("closed") {
            PullRequestState::Closed
        } else {
            PullRequestState::Open
        }
    }
}

/// The trigger to apply to a task in `task_state`, in the revision round `revision` if any
/// ([`Task::revision`](crate::Task::revision)), whose pull request is in `pr`: merged →
/// [`Trigger::PullRequestMerged`], closed → [`Trigger::PullRequestClosed`], for a task
/// waiting on its pull request: in `pr_opened`, or queued, provisioning or running in a
/// revision round (the round is over: its agent is to be stopped, and nothing is pushed to a
/// pull request that is merged or closed). `None` (nothing to do) for an open pull request
/// or a task in any other state (already completed by the other of poller and webhook,
/// cancelled, running its first attempt, …).
pub fn pull_request_trigger(
    task_state: TaskState,
    revision: Option<Revision>,
    pr: PullRequestState,
) -> Option<Trigger> {
    let in_round = revision.is_some()
        && matches!(
            task_state,
            TaskState::Queued | TaskState::Provisioning | TaskState::Running
        );
    if task_state != TaskState::PrOpened && !in_round {
        return None;
    }
    match pr {
        PullRequestState::Open => None,
        PullRequestState::Merged => Some(Trigger::PullRequestMerged),
        PullRequestState::Closed => Some(Trigger::PullRequestClosed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{TaskType, transition_in};

    #[test]
    fn the_code_host_state_reads_merged_first() {
        use PullRequestState::*;
        for (state, merged, want) in [
            ("open", false, Open),
            ("closed", false, Closed),
            ("closed", true, Merged),
            ("CLOSED", false, Closed),
            // A merged pull request is closed; should a payload say otherwise, merged wins.
            ("open", true, Merged),
            ("draft", false, Open),
        ] {
            assert_eq!(
                PullRequestState::from_codehost(state, merged),
                want,
                "{state} {merged}"
            );
        }
    }

    /// A task waits on its pull request in `pr_opened`, and in a revision round (queued,
    /// provisioning or running): a merge or a close then ends the round
    /// (docs/contract.md#22-states-and-transitions).
    #[test]
    fn only_a_task_waiting_on_its_pull_request_moves() {
        use PullRequestState::*;
        use TaskState as S;
        let round = Some(Revision { first_attempt: 2 });
        for state in TaskState::ALL {
            for revision in [None, round] {
                for pr in [Open, Merged, Closed] {
                    let got = pull_request_trigger(state, revision, pr);
                    let waiting = state == S::PrOpened
                        || (revision.is_some()
                            && matches!(state, S::Queued | S::Provisioning | S::Running));
                    let want = match (waiting, pr) {
                        (true, Merged) => Some(Trigger::PullRequestMerged),
                        (true, Closed) => Some(Trigger::PullRequestClosed),
                        _ => None,
                    };
                    assert_eq!(got, want, "{state:?} {revision:?} {pr:?}");
                    // Whatever it decides, the state machine accepts.
                    if let Some(trigger) = got {
                        let t =
                            transition_in(state, trigger, TaskType::Coding, 2, revision).unwrap();
                        let to = if pr == Merged {
                            TaskState::Completed
                        } else {
                            TaskState::Failed
                        };
                        assert_eq!(t.to, to, "{state:?} {revision:?} {pr:?}");
                    }
                }
            }
        }
    }
}
