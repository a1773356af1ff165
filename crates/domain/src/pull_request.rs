//! What a pull request's state on the code host means for the task that opened it
//! (docs/contract.md#55-pull-request-tracking, #56-webhook): the one decision the poller and the webhook share.

use crate::task::{TaskState, Trigger};

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

/// The trigger to apply to a task in `task_state` whose pull request is in `pr`: merged →
/// [`Trigger::PullRequestMerged`], closed → [`Trigger::PullRequestClosed`], for a task in
/// `pr_opened` only; `None` (nothing to do) for an open pull request or a task in any other
/// state (already completed by the other of poller and webhook, cancelled, …).
pub fn pull_request_trigger(task_state: TaskState, pr: PullRequestState) -> Option<Trigger> {
    if task_state != TaskState::PrOpened {
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
    use crate::task::{TaskType, transition};

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

    #[test]
    fn only_a_task_waiting_on_its_pull_request_moves() {
        use PullRequestState::*;
        for state in TaskState::ALL {
            for pr in [Open, Merged, Closed] {
                let got = pull_request_trigger(state, pr);
                let want = match (state, pr) {
                    (TaskState::PrOpened, Merged) => Some(Trigger::PullRequestMerged),
                    (TaskState::PrOpened, Closed) => Some(Trigger::PullRequestClosed),
                    _ => None,
                };
                assert_eq!(got, want, "{state:?} {pr:?}");
                // Whatever it decides, the state machine accepts.
                if let Some(trigger) = got {
                    let t = transition(state, trigger, TaskType::Coding, 1).unwrap();
                    let to = if pr == Merged {
                        TaskState::Completed
                    } else {
                        TaskState::Failed
                    };
                    assert_eq!(t.to, to);
                }
            }
        }
    }
}
