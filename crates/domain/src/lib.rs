//! # agentry-domain
//!
//! The pure domain model of agentry, the service that runs AI coding agents
//! on tasks, records the exact USD cost of every run and integrates with
//! GitHub.
//!
//! Every other agentry crate (persistence, code host, runner, analytics,
//! API) speaks in the types defined here:
//!
//! - [`task`]: the [`Task`] record, its [`TaskState`], [`TaskType`] and
//!   [`AgentType`], and the task state machine, [`transition`], a single
//!   pure function from `(state, trigger, task type, attempt)` to the next
//!   state.
//! - [`money`]: [`Usd`], an exact, non-negative dollar amount with nano-dollar
//!   precision, its strict and lenient parsers, and [`format_decimal`] for
//!   fixed-decimal display of summaries.
//! - [`repo_url`]: [`RepoUrl`], a normalised `https://HOST/OWNER/REPO`
//!   repository URL parsed from the many ways people write one.
//! - [`pull_request`]: [`pull_request_trigger`], what a pull request's state on
//!   the code host means for the task that opened it.
//! - [`settings`]: [`RepoSettings`], per-repository settings with bounds and
//!   JSON merge-patch style updates.
//! - [`backoff`]: [`backoff::Backoff`], the service's one retry schedule (a capped
//!   doubling).
//! - [`egress`]: [`EgressPattern`] and [`EgressAllow`], the hosts a sandboxed agent may
//!   reach through the egress proxy.
//! - [`tokens`]: [`Tokens`], the input, cache-read, cache-write and output token counts
//!   of a run or a model call.
//! - [`error`]: [`FieldError`], a validation error naming the offending JSON
//!   member.
//! - [`quote`]: how every crate quotes text from outside in its messages (cut, with `…`,
//!   on one line).
//!
//! The crate performs no I/O at all, and money never passes through
//! floating point.

/// For a type whose wire form is its text: `FromStr` through the type's `parse` (failing
/// with `$err`), `Serialize` as the `Display` text and `Deserialize` from a string through
/// `parse`; `$expecting` words what a string must hold.
macro_rules! text_form {
    ($ty:ident, $err:ty, $expecting:literal) => {
        impl std::str::FromStr for $ty {
            type Err = $err;

            /// Same as the type's `parse`.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $ty::parse(s)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visitor;

                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $ty;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }

                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$ty, E> {
                        v.parse().map_err(E::custom)
                    }
                }

                deserializer.deserialize_str(Visitor)
            }
        }
    };
}

pub mod backoff;
pub mod egress;
pub mod error;
pub mod money;
pub mod pull_request;
pub mod quote;
pub mod repo_url;
pub mod role;
pub mod settings;
pub mod task;
pub mod tokens;

pub use egress::{EgressAllow, EgressMatch, EgressPattern, EgressPatternError};
pub use error::FieldError;
pub use money::{MoneyError, Usd, format_decimal};
pub use pull_request::{PullRequestRef, PullRequestState, pull_request_trigger};
pub use repo_url::{RepoUrl, RepoUrlError};
pub use role::Role;
pub use settings::RepoSettings;
pub use task::{
    AgentType, BudgetScope, MAX_ATTEMPTS, Revision, Task, TaskState, TaskType, Transition,
    TransitionError, Trigger, UnknownValue, transition, transition_in,
};
pub use tokens::Tokens;
