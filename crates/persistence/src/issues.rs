//! The service's synced copy of open code-host issues (docs/contract.md#36-issues-view, #53-issue-sync).
//!
//! The issues view reads only this copy, so it never waits on the code host. A sync stores
//! a repository's complete list of open issues in one transaction ([`replace_open_issues`],
//! [`store_full_read`]), or the issues changed since its watermark
//! ([`apply_issue_changes`]: open ones stored, closed ones removed), records that nothing
//! changed ([`mark_issues_unchanged`]) or records its failure ([`mark_issues_sync_failed`]);
//! the repository row carries the ETag, the watermark and the sync state
//! ([`sync_cursor`]). The view is read a page at a time ([`open_issues_page`]).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};

use agentry_domain::{RepoUrl, TaskState};
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::convert::{self, from_db, opt_from_db, text, to_db};
use crate::error::touched;
use crate::fetch::Fetch;
use crate::schema::{issue_links, repositories, synced_issues, tasks};
use crate::{AnyConnection, DbError, write_tx};

/// The value of `synced_issues.state` for the open issues this module stores (closed issues
/// are deleted from the copy, so it is the only value written).
const OPEN: &str = "open";

/// A label of an issue, as the code host shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IssueLabel {
    /// The label's name.
    pub name: String,
    /// Its colour: six hex digits without `#`, as the code host gives it.
    pub color: String,
}

/// An open issue as read from the code host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedIssue {
    /// The issue number in its repository.
    pub number: i64,
    /// Title.
    pub title: String,
    /// Body (empty when the issue has none).
    pub body: String,
    /// The issue's page on the code host.
    pub html_url: String,
    /// The login of the author.
    pub author: String,
    /// The labels it carries now, in the code host's order.
    pub labels: Vec<IssueLabel>,
    /// When it was opened.
    pub created_at: OffsetDateTime,
    /// When it last changed on the code host.
    pub updated_at: OffsetDateTime,
}

/// The columns of a synced issue that come from the code host, as read and as written
/// (`number`, part of the key, is not updated).
#[derive(Debug, PartialEq, Eq, Queryable, Selectable, Insertable, AsChangeset)]
#[diesel(table_name = synced_issues, primary_key(number))]
struct IssueRow {
    number: i64,
    title: String,
    body: String,
    html_url: String,
    author: String,
    labels: String,
    created_at: PrimitiveDateTime,
    updated_at: PrimitiveDateTime,
}

impl TryFrom<IssueRow> for SyncedIssue {
    type Error = DbError;

    fn try_from(r: IssueRow) -> Result<SyncedIssue, DbError> {
        Ok(SyncedIssue {
            number: r.number,
            labels: decode_labels(&r.labels)?,
            title: r.title,
            body: r.body,
            html_url: r.html_url,
            author: r.author,
            created_at: from_db(r.created_at),
            updated_at: from_db(r.updated_at),
        })
    }
}

impl IssueRow {
    /// The row that stores `issue` (its text without NUL characters: the code host passes on
    /// whatever its users wrote).
    fn of(issue: &SyncedIssue) -> Result<IssueRow, DbError> {
        Ok(IssueRow {
            number: issue.number,
            title: text(&issue.title).into_owned(),
            body: text(&issue.body).into_owned(),
            html_url: text(&issue.html_url).into_owned(),
            author: text(&issue.author).into_owned(),
            labels: encode_labels(&issue.labels)?,
            created_at: to_db(issue.created_at),
            updated_at: to_db(issue.updated_at),
        })
    }
}

fn encode_labels(labels: &[IssueLabel]) -> Result<String, DbError> {
    serde_json::to_string(labels).map_err(|e| DbError::Corrupt(format!("issue labels: {e}")))
}

fn decode_labels(text: &str) -> Result<Vec<IssueLabel>, DbError> {
    serde_json::from_str(text).map_err(|e| DbError::Corrupt(format!("issue labels {text:?}: {e}")))
}

/// Stores the result of a sync that got the list (a 200 from the code host).
///
/// In one transaction: inserts or updates each of these open issues of the repository
/// (issues whose stored copy is already identical are left alone), deletes the repository's
/// synced issues that are not in the list (closed on the code host, so they leave the view),
/// and sets the repository's `issues_etag = etag`, `issues_synced_at = now`,
/// `issues_sync_error = NULL`. If `issues` holds the same number twice (pagination can
/// shift while a list is read), the copy with the later `updated_at` is kept.
///
/// Concurrent calls for one repository are serialised by the update of its row, which
/// comes first. [`DbError::NotFound`] if no repository has this id.
pub fn replace_open_issues(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    issues: &[SyncedIssue],
    etag: Option<&str>,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    replace(conn, repo_id, issues, &[], etag, None, now)
}

/// Stores a full read of the repository's open issues (the first sync, or the rare
/// safety-net read) as [`replace_open_issues`] does, and in the same transaction records it:
/// `issues_full_synced_at = now`, `issues_watermark` = the later of the stored one and
/// `watermark` (the latest `updated_at` the read saw; never a clock's time), and
/// `issues_etag = etag`. Stored issues absent from the read are removed, except `keep`.
/// [`DbError::NotFound`] if no repository has this id.
pub fn store_full_read(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    read: &FullRead<'_>,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    replace(
        conn,
        repo_id,
        read.issues,
        read.keep,
        read.etag,
        Some(read.watermark),
        now,
    )
}

/// A full read of a repository's open issues, for [`store_full_read`].
#[derive(Debug, Clone, Copy)]
pub struct FullRead<'a> {
    /// Every open issue read.
    pub issues: &'a [SyncedIssue],
    /// Numbers of stored issues absent from `issues` that stay in the copy all the same
    /// (checked open one by one: a list read while issues close can skip some).
    pub keep: &'a [i64],
    /// The ETag to store (only meaningful for the query that gave it).
    pub etag: Option<&'a str>,
    /// The latest `updated_at` the read saw.
    pub watermark: Option<OffsetDateTime>,
}

/// The numbers of the repository's issues in the synced copy.
pub fn synced_numbers(conn: &mut AnyConnection, repo_id: Uuid) -> Result<Vec<i64>, DbError> {
    Ok(synced_issues::table
        .filter(synced_issues::repo_id.eq(repo_id.to_string()))
        .order(synced_issues::number.asc())
        .select(synced_issues::number)
        .load(conn)?)
}

fn replace(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    issues: &[SyncedIssue],
    keep: &[i64],
    etag: Option<&str>,
    full_read: Option<Option<OffsetDateTime>>,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    let repo = repo_id.to_string();
    let at = to_db(now);
    // One entry per number: the latest copy wins.
    let mut wanted: BTreeMap<i64, &SyncedIssue> = BTreeMap::new();
    for issue in issues {
        let keep = wanted
            .get(&issue.number)
            .is_none_or(|known| issue.updated_at >= known.updated_at);
        if keep {
            wanted.insert(issue.number, issue);
        }
    }
    write_tx(conn, |conn| {
        // First, so that a second sync of the same repository waits for this one (on
        // PostgreSQL the row lock; on SQLite the immediate transaction already serialises).
        mark_synced(conn, &repo, etag, at)?;
        if let Some(watermark) = full_read {
            diesel::update(repositories::table.find(&repo))
                .set(repositories::issues_full_synced_at.eq(Some(at)))
                .execute(conn)?;
            raise_watermark(conn, &repo, watermark)?;
        }
        let stored: HashMap<i64, IssueRow> = synced_issues::table
            .filter(synced_issues::repo_id.eq(&repo))
            .select(IssueRow::as_select())
            .load(conn)?
            .into_iter()
            .map(|row| (row.number, row))
            .collect();
        let linked = linked_numbers(conn, &repo, None)?;
        let gone: Vec<i64> = stored
            .keys()
            .filter(|n| !wanted.contains_key(n) && !keep.contains(n))
            .copied()
            .collect();
        // In chunks, well under both backends' limits on bound parameters.
        for chunk in gone.chunks(500) {
            diesel::delete(
                synced_issues::table
                    .filter(synced_issues::repo_id.eq(&repo))
                    .filter(synced_issues::number.eq_any(chunk)),
            )
            .execute(conn)?;
        }
        for issue in wanted.into_values() {
            let link = linked.contains(&issue.number);
            store_issue(conn, &repo, stored.get(&issue.number), issue, link, at)?;
        }
        Ok(())
    })
}

/// Stores a successful sync on the repository row: its ETag, `issues_synced_at = at` and
/// `issues_sync_error = NULL`. [`DbError::NotFound`] if there is no such row.
fn mark_synced(
    conn: &mut AnyConnection,
    repo: &str,
    etag: Option<&str>,
    at: PrimitiveDateTime,
) -> Result<(), DbError> {
    touched(
        diesel::update(repositories::table.find(repo))
            .set((
                repositories::issues_etag.eq(etag),
                repositories::issues_synced_at.eq(Some(at)),
                repositories::issues_sync_error.eq(None::<String>),
            ))
            .execute(conn)?,
    )
}

/// Inserts or updates one open issue of the copy (`stored`: its current row, if any); an
/// identical copy is left alone. `linked`: whether the issue has a linked task (written on
/// insert; an existing row keeps its own, which [`mark_linked`] maintains).
fn store_issue(
    conn: &mut AnyConnection,
    repo: &str,
    stored: Option<&IssueRow>,
    issue: &SyncedIssue,
    linked: bool,
    at: PrimitiveDateTime,
) -> Result<(), DbError> {
    let row = IssueRow::of(issue)?;
    match stored {
        Some(old) if *old == row => {}
        Some(_) => {
            diesel::update(synced_issues::table.find((repo, issue.number)))
                .set((
                    &row,
                    synced_issues::state.eq(OPEN),
                    synced_issues::synced_at.eq(at),
                ))
                .execute(conn)?;
        }
        None => {
            diesel::insert_into(synced_issues::table)
                .values((
                    synced_issues::repo_id.eq(repo),
                    &row,
                    synced_issues::state.eq(OPEN),
                    synced_issues::synced_at.eq(at),
                    synced_issues::linked.eq(linked),
                ))
                .execute(conn)?;
        }
    }
    Ok(())
}

/// The numbers of the repository's issues that have a linked task: all of them, or those
/// among `among`. Read after the repository row is locked by the calling sync (see
/// [`mark_linked`]).
fn linked_numbers(
    conn: &mut AnyConnection,
    repo: &str,
    among: Option<&[i64]>,
) -> Result<HashSet<i64>, DbError> {
    let mut found = HashSet::new();
    match among {
        None => {
            let numbers: Vec<i64> = issue_links::table
                .filter(issue_links::repo_id.eq(repo))
                .select(issue_links::issue_number)
                .load(conn)?;
            found.extend(numbers);
        }
        Some(among) => {
            for chunk in among.chunks(500) {
                let numbers: Vec<i64> = issue_links::table
                    .filter(issue_links::repo_id.eq(repo))
                    .filter(issue_links::issue_number.eq_any(chunk))
                    .select(issue_links::issue_number)
                    .load(conn)?;
                found.extend(numbers);
            }
        }
    }
    Ok(found)
}

/// Records in the synced copy that the issue `number` of the repository now has a linked
/// task (its `linked` flag, which orders the issues view). Call it in the transaction that
/// writes the `issue_links` row.
///
/// On PostgreSQL it first locks the repository's row, which every sync updates before it
/// reads the links: a sync that stores the issue concurrently either commits first (and
/// this update then sees its row) or waits for this transaction (and then sees the link).
/// SQLite's write lock serialises the two already.
pub fn mark_linked(conn: &mut AnyConnection, repo_id: Uuid, number: i64) -> Result<(), DbError> {
    let repo = repo_id.to_string();
    if let AnyConnection::Postgresql(pg) = conn {
        repositories::table
            .find(&repo)
            .select(repositories::id)
            .for_no_key_update()
            .first::<String>(pg)
            .optional()?;
    }
    diesel::update(synced_issues::table.find((&repo, number)))
        .set(synced_issues::linked.eq(true))
        .execute(conn)?;
    Ok(())
}

/// Sets the repository's `issues_watermark` to `to` when that is later than the stored one.
fn raise_watermark(
    conn: &mut AnyConnection,
    repo: &str,
    to: Option<OffsetDateTime>,
) -> Result<(), DbError> {
    let Some(to) = to else { return Ok(()) };
    let stored: Option<PrimitiveDateTime> = repositories::table
        .find(repo)
        .select(repositories::issues_watermark)
        .first(conn)?;
    if stored.is_none_or(|w| w < to_db(to)) {
        diesel::update(repositories::table.find(repo))
            .set(repositories::issues_watermark.eq(Some(to_db(to))))
            .execute(conn)?;
    }
    Ok(())
}

/// Where a repository's issue sync stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IssueSyncCursor {
    /// The ETag of the last answer stored by [`apply_issue_changes`], sent as
    /// `If-None-Match` on the next read of the same query.
    pub etag: Option<String>,
    /// The latest `updated_at` read so far; `None` before the first full read.
    pub watermark: Option<OffsetDateTime>,
    /// When the open issues were last read in full; `None` before the first full read.
    pub full_synced_at: Option<OffsetDateTime>,
}

/// The sync state of one repository. [`DbError::NotFound`] if no repository has this id.
pub fn sync_cursor(conn: &mut AnyConnection, repo_id: Uuid) -> Result<IssueSyncCursor, DbError> {
    let (etag, watermark, full): (
        Option<String>,
        Option<PrimitiveDateTime>,
        Option<PrimitiveDateTime>,
    ) = repositories::table
        .find(repo_id.to_string())
        .select((
            repositories::issues_etag,
            repositories::issues_watermark,
            repositories::issues_full_synced_at,
        ))
        .existing(conn)?;
    Ok(IssueSyncCursor {
        etag,
        watermark: opt_from_db(watermark),
        full_synced_at: opt_from_db(full),
    })
}

/// Stores the issues of the repository that changed since its watermark, in one
/// transaction: each of `open` is inserted or updated, each of `closed` (number and the
/// `updated_at` it was closed with) leaves the copy, `issues_etag = etag`,
/// `issues_synced_at = now`, `issues_sync_error = NULL`, and `issues_watermark` becomes
/// `watermark` if that is later (the latest `updated_at` read; never a clock's time).
///
/// A change older than the stored copy (`updated_at` before the stored one: a lagging
/// answer) is ignored, so an issue reopened after it was closed is not removed by a stale
/// closing, nor an update undone. [`DbError::NotFound`] if no repository has this id.
pub fn apply_issue_changes(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    open: &[SyncedIssue],
    closed: &[(i64, OffsetDateTime)],
    etag: Option<&str>,
    watermark: Option<OffsetDateTime>,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    let repo = repo_id.to_string();
    let at = to_db(now);
    write_tx(conn, |conn| {
        mark_synced(conn, &repo, etag, at)?;
        raise_watermark(conn, &repo, watermark)?;
        let numbers: Vec<i64> = open
            .iter()
            .map(|i| i.number)
            .chain(closed.iter().map(|(n, _)| *n))
            .collect();
        let mut stored: HashMap<i64, IssueRow> = HashMap::new();
        for chunk in numbers.chunks(500) {
            let rows: Vec<IssueRow> = synced_issues::table
                .filter(synced_issues::repo_id.eq(&repo))
                .filter(synced_issues::number.eq_any(chunk))
                .select(IssueRow::as_select())
                .load(conn)?;
            stored.extend(rows.into_iter().map(|row| (row.number, row)));
        }
        for &(number, closed_at) in closed {
            let newer_copy = stored
                .get(&number)
                .is_some_and(|row| row.updated_at > to_db(closed_at));
            if stored.contains_key(&number) && !newer_copy {
                diesel::delete(synced_issues::table.find((&repo, number))).execute(conn)?;
                stored.remove(&number);
            }
        }
        let inserted: Vec<i64> = open
            .iter()
            .map(|i| i.number)
            .filter(|n| !stored.contains_key(n))
            .collect();
        let linked = linked_numbers(conn, &repo, Some(&inserted))?;
        for issue in open {
            let row = stored.get(&issue.number);
            if row.is_some_and(|row| row.updated_at > to_db(issue.updated_at)) {
                continue;
            }
            let link = linked.contains(&issue.number);
            store_issue(conn, &repo, row, issue, link, at)?;
        }
        Ok(())
    })
}

/// Whether `number` is an open issue of the repository in the synced copy.
pub fn is_open_issue(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    number: i64,
) -> Result<bool, DbError> {
    let found: Option<i64> = synced_issues::table
        .filter(synced_issues::repo_id.eq(repo_id.to_string()))
        .filter(synced_issues::number.eq(number))
        .filter(synced_issues::state.eq(OPEN))
        .select(synced_issues::number)
        .first(conn)
        .optional()?;
    Ok(found.is_some())
}

/// Stores the result of a sync the code host answered with 304 Not Modified:
/// `issues_synced_at = now` and `issues_sync_error = NULL`; the copy and the ETag stay.
/// [`DbError::NotFound`] if no repository has this id.
pub fn mark_issues_unchanged(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    write_tx(conn, |conn| {
        touched(
            diesel::update(repositories::table.find(repo_id.to_string()))
                .set((
                    repositories::issues_synced_at.eq(Some(to_db(now))),
                    repositories::issues_sync_error.eq(None::<String>),
                ))
                .execute(conn)?,
        )
    })
}

/// Records that a sync of the repository failed: `issues_sync_error = message`. The synced
/// copy, the ETag and `issues_synced_at` stay as they were, so the view keeps showing the
/// last good copy beside the error. [`DbError::NotFound`] if no repository has this id.
pub fn mark_issues_sync_failed(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    message: &str,
) -> Result<(), DbError> {
    write_tx(conn, |conn| {
        touched(
            diesel::update(repositories::table.find(repo_id.to_string()))
                .set(repositories::issues_sync_error.eq(Some(message)))
                .execute(conn)?,
        )
    })
}

/// The task linked to an issue, as the issues view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedTaskRef {
    /// The task's id.
    pub id: Uuid,
    /// Its current state.
    pub state: TaskState,
    /// The pull request it opened, if any.
    pub pr_url: Option<String>,
}

/// One entry of the issues view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueView {
    /// The repository of the issue.
    pub repo_id: Uuid,
    /// Its normalised URL.
    pub repo_url: RepoUrl,
    /// The issue.
    pub issue: SyncedIssue,
    /// The task linked to the issue, if it was assigned.
    pub task: Option<LinkedTaskRef>,
}

/// A row of the issues view: repository id and URL, the issue, its linked task's id, state
/// and pull request, and the issue's own state (`open` or `closed`).
type ViewRow = (
    String,
    String,
    IssueRow,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
);

/// Every synced issue ([`ViewRow`]) with its repository and its linked task, if any.
#[diesel::dsl::auto_type]
fn view_rows() -> _ {
    let issue: diesel::dsl::AsSelect<IssueRow, <AnyConnection as Connection>::Backend> =
        IssueRow::as_select();
    synced_issues::table
        .inner_join(repositories::table)
        .left_join(
            issue_links::table.on(issue_links::repo_id
                .eq(synced_issues::repo_id)
                .and(issue_links::issue_number.eq(synced_issues::number))),
        )
        .left_join(tasks::table.on(tasks::id.eq(issue_links::task_id)))
        .select((
            repositories::id,
            repositories::url,
            issue,
            tasks::id.nullable(),
            tasks::state.nullable(),
            tasks::pr_url.nullable(),
            synced_issues::state,
        ))
}

/// The open synced issues of every connected repository, or of the repository `repo_id`
/// (nothing if it is disconnected), each with its linked task.
///
/// Ordered as the issues view (docs/contract.md#36-issues-view): issues with no linked task first, then
/// `updated_at` descending, then repository URL ascending, then number ascending. The order
/// is applied in Rust so that it is the same on both backends (string collation of
/// PostgreSQL depends on the database's locale).
pub fn open_issues(
    conn: &mut AnyConnection,
    repo_id: Option<Uuid>,
) -> Result<Vec<IssueView>, DbError> {
    let mut query = view_rows()
        .filter(repositories::disconnected_at.is_null())
        .filter(synced_issues::state.eq(OPEN))
        .into_boxed();
    if let Some(id) = repo_id {
        query = query.filter(synced_issues::repo_id.eq(id.to_string()));
    }
    let rows: Vec<ViewRow> = query.load(conn)?;
    let mut views = rows
        .into_iter()
        .map(view_of)
        .collect::<Result<Vec<_>, DbError>>()?;
    views.sort_by(|a, b| {
        a.task
            .is_some()
            .cmp(&b.task.is_some())
            .then_with(|| b.issue.updated_at.cmp(&a.issue.updated_at))
            .then_with(|| a.repo_url.as_str().cmp(b.repo_url.as_str()))
            .then_with(|| a.issue.number.cmp(&b.issue.number))
    });
    Ok(views)
}

/// A position in the issues view: the sort key of the last issue of a page (docs/contract.md#36-issues-view
/// order: unlinked first, `updated_at` descending, repository URL, number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueViewCursor {
    /// Whether that issue had a linked task.
    pub linked: bool,
    /// Its `updated_at`.
    pub updated_at: OffsetDateTime,
    /// Its repository's normalised URL.
    pub repo_url: String,
    /// Its number.
    pub number: i64,
}

/// One page of the issues view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueViewPage {
    /// The issues of the page, in the view's order.
    pub issues: Vec<IssueView>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<IssueViewCursor>,
}

/// The sort order of the view over cursors.
fn view_order(a: &IssueViewCursor, b: &IssueViewCursor) -> Ordering {
    a.linked
        .cmp(&b.linked)
        .then_with(|| b.updated_at.cmp(&a.updated_at))
        .then_with(|| a.repo_url.cmp(&b.repo_url))
        .then_with(|| a.number.cmp(&b.number))
}

/// At most `limit` issues of the view ([`open_issues`]'s selection and order) after `after`
/// (from the start without it), and the cursor of the next page if there is one.
///
/// A page is a range read of the index on the view's order (`linked`, then `updated_at`
/// descending): its cost is the page's size, whatever the number of open issues. The ties
/// of the order's last keys (repository URL, number) are decided in Rust over the issues
/// that share the page's boundary `updated_at` (the same on both backends: PostgreSQL's
/// string collation depends on the database's locale), so pages neither repeat nor skip an
/// issue when many share a timestamp. Issues that change between two pages may move across
/// the cursor: each page is consistent, the sequence of pages is not a snapshot.
pub fn open_issues_page(
    conn: &mut AnyConnection,
    repo_id: Option<Uuid>,
    limit: i64,
    after: Option<&IssueViewCursor>,
) -> Result<IssueViewPage, DbError> {
    let limit = usize::try_from(limit.max(1)).unwrap_or(1);
    let repo = repo_id.map(|id| id.to_string());
    let repo = repo.as_deref();
    // Enough keys to fill the page and know whether another follows.
    let want = limit.saturating_add(1);
    let mut keys: Vec<(IssueViewCursor, String)> = Vec::new();
    for linked in [false, true] {
        if after.is_some_and(|a| a.linked && !linked) {
            continue;
        }
        let mut before = None;
        if let Some(a) = after.filter(|a| a.linked == linked) {
            // The issues that share the cursor's timestamp: those after it in the view's order.
            let at = to_db(a.updated_at);
            let from = Some((a.repo_url.as_str(), a.number));
            let need = want - keys.len();
            keys.extend(tie_group(conn, repo, linked, at, from, need)?);
            before = Some(at);
        }
        if keys.len() >= want {
            break;
        }
        let need = want - keys.len();
        let range = before.map_or(KeyRange::All, KeyRange::Before);
        let mut read = view_keys(conn, repo, linked, range, Some(need))?;
        if read.len() < need {
            keys.append(&mut read);
            continue;
        }
        // The segment may go on: the issues sharing the last `updated_at` read may sort
        // before some of those read, so that whole group is read.
        let Some(last) = read.last().map(|(key, _)| to_db(key.updated_at)) else {
            break;
        };
        read.retain(|(key, _)| to_db(key.updated_at) != last);
        keys.append(&mut read);
        let need = want - keys.len();
        keys.extend(tie_group(conn, repo, linked, last, None, need)?);
        break;
    }
    keys.sort_by(|a, b| view_order(&a.0, &b.0));
    let more = keys.len() > limit;
    keys.truncate(limit);
    let next = if more {
        keys.last().map(|(key, _)| key.clone())
    } else {
        None
    };
    // The page's numbers per repository: one query per repository of the page.
    let mut wanted: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (key, repo) in &keys {
        wanted.entry(repo.as_str()).or_default().push(key.number);
    }
    let mut found: HashMap<(Uuid, i64), IssueView> = HashMap::new();
    for (repo, numbers) in wanted {
        for view in load_views(conn, repo, &numbers)? {
            found.insert((view.repo_id, view.issue.number), view);
        }
    }
    let mut issues = Vec::with_capacity(keys.len());
    for (key, repo) in keys {
        // A row deleted since its key was read is skipped.
        if let Some(view) = found.remove(&(convert::uuid(&repo)?, key.number)) {
            issues.push(view);
        }
    }
    Ok(IssueViewPage { issues, next })
}

/// Which `updated_at` values of a segment of the view [`view_keys`] reads.
#[derive(Debug, Clone, Copy)]
enum KeyRange {
    /// Every one.
    All,
    /// Those before this time.
    Before(PrimitiveDateTime),
}

/// The first `need` keys, in the view's order, of the issues of one segment (`linked`) that
/// share the timestamp `at`, after (repository URL, number) `from` when given. Ordered by
/// repository URL (compared in Rust), then number: the group's repositories are found from
/// the index alone, then each is a range read by number, in URL order, until `need` keys
/// are found; so a page costs its size even when thousands of issues share a timestamp.
fn tie_group(
    conn: &mut AnyConnection,
    repo: Option<&str>,
    linked: bool,
    at: PrimitiveDateTime,
    from: Option<(&str, i64)>,
    need: usize,
) -> Result<Vec<(IssueViewCursor, String)>, DbError> {
    let ids: Vec<String> = match repo {
        Some(repo) => vec![repo.to_owned()],
        None => group_repositories(conn, linked, at)?,
    };
    let mut repos: Vec<(String, String)> = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        let found: Vec<(String, String)> = repositories::table
            .filter(repositories::id.eq_any(chunk))
            .filter(repositories::disconnected_at.is_null())
            .select((repositories::url, repositories::id))
            .load(conn)?;
        repos.extend(found);
    }
    repos.sort();
    let mut keys = Vec::new();
    for (url, id) in repos {
        if keys.len() >= need {
            break;
        }
        let mut query = synced_issues::table
            .filter(synced_issues::repo_id.eq(&id))
            .filter(synced_issues::state.eq(OPEN))
            .filter(synced_issues::linked.eq(linked))
            .filter(synced_issues::updated_at.eq(at))
            .select(synced_issues::number)
            .order(synced_issues::number.asc())
            .limit(i64::try_from(need - keys.len()).unwrap_or(i64::MAX))
            .into_boxed();
        match from {
            Some((from_url, _)) if url.as_str() < from_url => continue,
            Some((from_url, number)) if url.as_str() == from_url => {
                query = query.filter(synced_issues::number.gt(number));
            }
            _ => {}
        }
        let numbers: Vec<i64> = query.load(conn)?;
        keys.extend(numbers.into_iter().map(|number| {
            (
                IssueViewCursor {
                    linked,
                    updated_at: from_db(at),
                    repo_url: url.clone(),
                    number,
                },
                id.clone(),
            )
        }));
    }
    Ok(keys)
}

/// The repository ids of the open synced issues of one segment (`linked`) that share the
/// timestamp `at`: one index seek per repository (a loose index scan of `synced_issues_view`,
/// written as a recursive query on both backends), where `SELECT DISTINCT` would read every
/// issue of the group: all 5,000 issues of the load benchmark share one timestamp.
fn group_repositories(
    conn: &mut AnyConnection,
    linked: bool,
    at: PrimitiveDateTime,
) -> Result<Vec<String>, DbError> {
    #[derive(QueryableByName)]
    struct Repo {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    const SQL: &str = "WITH RECURSIVE r(id) AS (\
         SELECT (SELECT MIN(repo_id) FROM synced_issues \
         WHERE state = #1 AND linked = #2 AND updated_at = #3) \
         UNION ALL \
         SELECT (SELECT MIN(repo_id) FROM synced_issues \
         WHERE state = #1 AND linked = #2 AND updated_at = #3 AND repo_id > r.id) \
         FROM r WHERE r.id IS NOT NULL) \
         SELECT id FROM r WHERE id IS NOT NULL";
    let rows: Vec<Repo> = match conn {
        AnyConnection::Postgresql(pg) => diesel::sql_query(SQL.replace('#', "$"))
            .bind::<diesel::sql_types::Text, _>(OPEN)
            .bind::<diesel::sql_types::Bool, _>(linked)
            .bind::<diesel::sql_types::Timestamp, _>(at)
            .load(pg)?,
        AnyConnection::Sqlite(lite) => diesel::sql_query(SQL.replace('#', "?"))
            .bind::<diesel::sql_types::Text, _>(OPEN)
            .bind::<diesel::sql_types::Bool, _>(linked)
            .bind::<diesel::sql_types::Timestamp, _>(at)
            .load(lite)?,
    };
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// The sort keys (and repository ids) of the open synced issues of connected repositories
/// (or of `repo`) whose `linked` flag is `linked`, in `range`, newest `updated_at` first;
/// at most `limit` of them. A range read of `synced_issues_view` (`synced_issues_repo_view`
/// for one repository).
fn view_keys(
    conn: &mut AnyConnection,
    repo: Option<&str>,
    linked: bool,
    range: KeyRange,
    limit: Option<usize>,
) -> Result<Vec<(IssueViewCursor, String)>, DbError> {
    let mut query = synced_issues::table
        .inner_join(repositories::table)
        .filter(repositories::disconnected_at.is_null())
        .filter(synced_issues::state.eq(OPEN))
        .filter(synced_issues::linked.eq(linked))
        .select((
            synced_issues::repo_id,
            repositories::url,
            synced_issues::number,
            synced_issues::updated_at,
        ))
        .order(synced_issues::updated_at.desc())
        .into_boxed();
    if let Some(repo) = repo {
        query = query.filter(synced_issues::repo_id.eq(repo.to_owned()));
    }
    query = match range {
        KeyRange::All => query,
        KeyRange::Before(at) => query.filter(synced_issues::updated_at.lt(at)),
    };
    if let Some(limit) = limit {
        query = query.limit(i64::try_from(limit).unwrap_or(i64::MAX));
    }
    let rows: Vec<(String, String, i64, PrimitiveDateTime)> = query.load(conn)?;
    Ok(rows
        .into_iter()
        .map(|(repo, url, number, updated_at)| {
            (
                IssueViewCursor {
                    linked,
                    updated_at: from_db(updated_at),
                    repo_url: url,
                    number,
                },
                repo,
            )
        })
        .collect())
}

/// The views of the open synced issues of `repo` whose number is in `numbers` (at most a
/// page long).
fn load_views(
    conn: &mut AnyConnection,
    repo: &str,
    numbers: &[i64],
) -> Result<Vec<IssueView>, DbError> {
    let rows = view_rows()
        .filter(synced_issues::repo_id.eq(repo))
        .filter(synced_issues::number.eq_any(numbers))
        .load::<ViewRow>(conn)?;
    // Open issues only, checked here: with `state` in the statement SQLite reads the
    // repository's whole `synced_issues_repo_view` range (every open issue of it) and
    // filters the numbers, instead of seeking each (repo_id, number) in the primary key.
    rows.into_iter()
        .filter(|row| row.6 == OPEN)
        .map(view_of)
        .collect()
}

fn view_of(
    (repo_id, repo_url, issue, task_id, task_state, pr_url, _): ViewRow,
) -> Result<IssueView, DbError> {
    let task = match (task_id, task_state) {
        (Some(id), Some(state)) => Some(LinkedTaskRef {
            id: convert::uuid(&id)?,
            state: convert::parse("task state", &state)?,
            pr_url,
        }),
        _ => None,
    };
    Ok(IssueView {
        repo_id: convert::uuid(&repo_id)?,
        repo_url: convert::parse("repository URL", &repo_url)?,
        issue: SyncedIssue::try_from(issue)?,
        task,
    })
}

/// The open synced issues of one repository that carry the label `label` (exact,
/// case-sensitive name) and have no linked task, by number: the issues the sync turns into
/// tasks (docs/contract.md#53-issue-sync).
pub fn unlinked_with_label(
    conn: &mut AnyConnection,
    repo_id: Uuid,
    label: &str,
) -> Result<Vec<SyncedIssue>, DbError> {
    let rows: Vec<IssueRow> = synced_issues::table
        .left_join(
            issue_links::table.on(issue_links::repo_id
                .eq(synced_issues::repo_id)
                .and(issue_links::issue_number.eq(synced_issues::number))),
        )
        .filter(synced_issues::repo_id.eq(repo_id.to_string()))
        .filter(synced_issues::state.eq(OPEN))
        .filter(issue_links::task_id.is_null())
        .order(synced_issues::number.asc())
        .select(IssueRow::as_select())
        .load(conn)?;
    // Labels are JSON text: decode and match here rather than pattern-match the JSON in SQL.
    let mut found = Vec::new();
    for row in rows {
        let issue = SyncedIssue::try_from(row)?;
        if issue.labels.iter().any(|l| l.name == label) {
            found.push(issue);
        }
    }
    Ok(found)
}
