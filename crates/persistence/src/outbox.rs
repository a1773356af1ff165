//! The outbox: side effects on the code host (docs/contract.md#54-effects-of-assignment), written in the transaction of the
//! change that causes them and delivered after commit by a worker.
//!
//! An effect is written with [`enqueue`] inside the caller's transaction, so it exists if
//! and only if the change committed. Workers deliver effects through the outbox's leased
//! delivery [`QUEUE`] ([`crate::delivery`]): claimed under a lease, performed, then marked
//! delivered or failed (which schedules the retry); a worker that dies leaves its effects to
//! become due again when the lease runs out. At most one effect of each kind exists per task
//! (the unique index on `(task_id, kind)`).

use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::connection::insert_once;
use crate::convert::{self, from_db, opt_from_db, to_db};
use crate::fetch::Fetch;
use crate::schema::outbox;
use crate::{AnyConnection, DbError, write_tx};

/// What an effect does on the code host; stored as `add_label`, `comment`, `close_issue`,
/// `reply` or `react`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EffectKind {
    /// Create the service's label in the repository if missing and add it to the issue.
    AddLabel,
    /// Post the one comment the service writes on an issue.
    Comment,
    /// Close the linked issue (its pull request was merged).
    CloseIssue,
    /// Post a comment that carries its own marker, on an issue or pull request; a task may
    /// have several (the replies of its revision rounds), so these are written without a task.
    Reply,
    /// Add a reaction to a comment or review comment (the acknowledgement of feedback).
    React,
}

agentry_domain::wire_enum!(EffectKind, "effect kind", [
    AddLabel => "add_label",
    Comment => "comment",
    CloseIssue => "close_issue",
    Reply => "reply",
    React => "react",
]);

/// What an effect does on the code host, with what the worker needs to do it.
///
/// Stored as its [`EffectKind`] and a JSON payload of its fields in camelCase
/// (`{"issueNumber": 7, "label": "agentry"}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create `label` in the repository if missing and add it to the issue.
    AddLabel {
        /// The issue.
        issue_number: i64,
        /// The label's name.
        label: String,
    },
    /// Post `body` as a comment on the issue.
    Comment {
        /// The issue.
        issue_number: i64,
        /// The comment's text.
        body: String,
    },
    /// Close the issue if it is still open.
    CloseIssue {
        /// The issue.
        issue_number: i64,
    },
    /// Post `body` on the issue or pull request unless a comment there already holds
    /// `marker` (which `body` contains).
    Reply {
        /// The issue or pull request.
        issue_number: i64,
        /// The comment's text.
        body: String,
        /// The text that identifies this reply among the comments.
        marker: String,
    },
    /// React with `content` (GitHub's names: `eyes`, `+1`, …) to a comment.
    React {
        /// The issue or pull request the comment is on.
        issue_number: i64,
        /// The comment's id.
        comment_id: i64,
        /// Whether it is a review comment (on a line of the diff) rather than an issue
        /// comment.
        review_comment: bool,
        /// The reaction.
        content: String,
    },
}

/// The stored form of an [`Action`]'s fields.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    issue_number: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    comment_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    review_comment: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
}

impl Action {
    /// Its kind (the unit of de-duplication per task).
    pub fn kind(&self) -> EffectKind {
        match self {
            Action::AddLabel { .. } => EffectKind::AddLabel,
            Action::Comment { .. } => EffectKind::Comment,
            Action::CloseIssue { .. } => EffectKind::CloseIssue,
            Action::Reply { .. } => EffectKind::Reply,
            Action::React { .. } => EffectKind::React,
        }
    }

    /// The issue it acts on.
    pub fn issue_number(&self) -> i64 {
        match self {
            Action::AddLabel { issue_number, .. }
            | Action::Comment { issue_number, .. }
            | Action::CloseIssue { issue_number }
            | Action::Reply { issue_number, .. }
            | Action::React { issue_number, .. } => *issue_number,
        }
    }

    fn payload(&self) -> Payload {
        let mut p = Payload {
            issue_number: self.issue_number(),
            label: None,
            body: None,
            marker: None,
            comment_id: None,
            review_comment: None,
            content: None,
        };
        match self {
            Action::AddLabel { label, .. } => p.label = Some(label.clone()),
            Action::Comment { body, .. } => p.body = Some(body.clone()),
            Action::CloseIssue { .. } => {}
            Action::Reply { body, marker, .. } => {
                p.body = Some(body.clone());
                p.marker = Some(marker.clone());
            }
            Action::React {
                comment_id,
                review_comment,
                content,
                ..
            } => {
                p.comment_id = Some(*comment_id);
                p.review_comment = Some(*review_comment);
                p.content = Some(content.clone());
            }
        }
        p
    }

    fn from_stored(kind: EffectKind, payload: &str) -> Result<Action, DbError> {
        let corrupt =
            |why: String| DbError::Corrupt(format!("{kind} effect payload {payload:?}: {why}"));
        let p: Payload = serde_json::from_str(payload).map_err(|e| corrupt(e.to_string()))?;
        let missing = |member: &str| corrupt(format!("no {member}"));
        Ok(match kind {
            EffectKind::AddLabel => Action::AddLabel {
                issue_number: p.issue_number,
                label: p.label.ok_or_else(|| missing("label"))?,
            },
            EffectKind::Comment => Action::Comment {
                issue_number: p.issue_number,
                body: p.body.ok_or_else(|| missing("body"))?,
            },
            EffectKind::CloseIssue => Action::CloseIssue {
                issue_number: p.issue_number,
            },
            EffectKind::Reply => Action::Reply {
                issue_number: p.issue_number,
                body: p.body.ok_or_else(|| missing("body"))?,
                marker: p.marker.ok_or_else(|| missing("marker"))?,
            },
            EffectKind::React => Action::React {
                issue_number: p.issue_number,
                comment_id: p.comment_id.ok_or_else(|| missing("commentId"))?,
                review_comment: p.review_comment.unwrap_or(false),
                content: p.content.ok_or_else(|| missing("content"))?,
            },
        })
    }
}

/// An effect to write into the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEffect {
    /// The task that causes it. Effects of a task are unique per kind; effects without a
    /// task are not de-duplicated.
    pub task_id: Option<Uuid>,
    /// The repository it acts on.
    pub repo_id: Uuid,
    /// What it does.
    pub action: Action,
}

impl Effect {
    /// Its kind.
    pub fn kind(&self) -> EffectKind {
        self.action.kind()
    }
}

/// An effect in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// Its id (UUID v7, time-ordered).
    pub id: Uuid,
    /// The task that caused it.
    pub task_id: Option<Uuid>,
    /// The repository it acts on.
    pub repo_id: Uuid,
    /// What it does.
    pub action: Action,
    /// Failed delivery attempts so far.
    pub attempts: i32,
    /// When it is due next: the retry time after a failure, the end of the lease while a
    /// worker holds it.
    pub next_attempt_at: OffsetDateTime,
    /// When it was delivered; `None` while pending.
    pub delivered_at: Option<OffsetDateTime>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// When it was written.
    pub created_at: OffsetDateTime,
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = outbox)]
struct EffectRow {
    id: String,
    task_id: Option<String>,
    repo_id: String,
    kind: String,
    payload: String,
    attempts: i32,
    next_attempt_at: PrimitiveDateTime,
    delivered_at: Option<PrimitiveDateTime>,
    last_error: Option<String>,
    created_at: PrimitiveDateTime,
}

impl TryFrom<EffectRow> for Effect {
    type Error = DbError;

    fn try_from(r: EffectRow) -> Result<Effect, DbError> {
        Ok(Effect {
            id: convert::uuid(&r.id)?,
            task_id: convert::opt_uuid(r.task_id.as_deref())?,
            repo_id: convert::uuid(&r.repo_id)?,
            action: Action::from_stored(convert::parse("effect kind", &r.kind)?, &r.payload)?,
            attempts: r.attempts,
            next_attempt_at: from_db(r.next_attempt_at),
            delivered_at: opt_from_db(r.delivered_at),
            last_error: r.last_error,
            created_at: from_db(r.created_at),
        })
    }
}

/// Writes an effect, due at once (`next_attempt_at = now`). Meant to run inside the
/// transaction of the change that causes it (it goes through [`write_tx`], so it nests as a
/// savepoint and commits or rolls back with the caller).
///
/// At most one effect per (task, kind): if the task already has an effect of this kind,
/// nothing is written and the result is `false`. The existing row is looked for first, and
/// the insert runs in its own savepoint, so even a concurrent insert of the same effect (a
/// unique violation) leaves the caller's transaction usable and yields `false`.
pub fn enqueue(
    conn: &mut AnyConnection,
    effect: &NewEffect,
    now: OffsetDateTime,
) -> Result<bool, DbError> {
    let task_id = effect.task_id.map(|id| id.to_string());
    let kind = effect.action.kind().as_str();
    let payload = serde_json::to_string(&effect.action.payload())
        .map_err(|e| DbError::Corrupt(format!("effect payload: {e}")))?;
    write_tx(conn, |conn| {
        if let Some(task_id) = &task_id {
            let existing = outbox::table
                .filter(outbox::task_id.eq(task_id))
                .filter(outbox::kind.eq(kind))
                .select(outbox::id)
                .first::<String>(conn)
                .optional()?;
            if existing.is_some() {
                return Ok(false);
            }
        }
        let at = to_db(now);
        insert_once(conn, |conn| {
            diesel::insert_into(outbox::table)
                .values((
                    outbox::id.eq(Uuid::now_v7().to_string()),
                    outbox::task_id.eq(&task_id),
                    outbox::repo_id.eq(effect.repo_id.to_string()),
                    outbox::kind.eq(kind),
                    outbox::payload.eq(&payload),
                    outbox::attempts.eq(0),
                    outbox::next_attempt_at.eq(at),
                    outbox::delivered_at.eq(None::<PrimitiveDateTime>),
                    outbox::last_error.eq(None::<String>),
                    outbox::created_at.eq(at),
                ))
                .execute(conn)
        })
    })
}

crate::delivery::queue! {
    /// The outbox as a leased delivery queue ([`crate::delivery`]): undelivered effects,
    /// claimed oldest written first; delivery sets `delivered_at`.
    pub const QUEUE: Queue<Effect> = outbox as EffectRow {
        pending: "delivered_at IS NULL",
        delivered: "delivered_at = #1",
        order: "created_at, id",
    }
}

/// All effects of a task, oldest written first (tests and task detail).
pub fn effects_of_task(conn: &mut AnyConnection, task_id: Uuid) -> Result<Vec<Effect>, DbError> {
    outbox::table
        .filter(outbox::task_id.eq(task_id.to_string()))
        .order((outbox::created_at.asc(), outbox::id.asc()))
        .select(EffectRow::as_select())
        .load_as(conn)
}
