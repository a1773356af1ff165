//! Connected repositories with their settings.

use agentry_domain::{AgentType, RepoSettings, RepoUrl, Usd};
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::convert::{self, from_db, opt_from_db, to_db};
use crate::error::touched;
use crate::fetch::Fetch;
use crate::schema::repositories;
use crate::{AnyConnection, DbError, write_tx};

/// A repository known to the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    /// Repository id.
    pub id: Uuid,
    /// Normalised URL.
    pub url: RepoUrl,
    /// Default branch on the code host.
    pub default_branch: String,
    /// The clone URL the code host reports.
    pub clone_url: String,
    /// The code host's numeric id of the repository, if known.
    pub codehost_id: Option<i64>,
    /// Agent settings.
    pub settings: RepoSettings,
    /// When it was (last) connected.
    pub connected_at: OffsetDateTime,
    /// When it was disconnected; `None` while connected.
    pub disconnected_at: Option<OffsetDateTime>,
    /// Creation time.
    pub created_at: OffsetDateTime,
    /// Last change.
    pub updated_at: OffsetDateTime,
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = repositories)]
struct RepoRow {
    id: String,
    url: String,
    default_branch: String,
    clone_url: String,
    codehost_id: Option<i64>,
    #[diesel(embed)]
    settings: SettingsRow,
    connected_at: PrimitiveDateTime,
    disconnected_at: Option<PrimitiveDateTime>,
    created_at: PrimitiveDateTime,
    updated_at: PrimitiveDateTime,
}

impl TryFrom<RepoRow> for Repository {
    type Error = DbError;
    fn try_from(r: RepoRow) -> Result<Repository, DbError> {
        Ok(Repository {
            id: convert::uuid(&r.id)?,
            url: convert::parse("repository URL", &r.url)?,
            default_branch: r.default_branch,
            clone_url: r.clone_url,
            codehost_id: r.codehost_id,
            settings: r.settings.try_into()?,
            connected_at: from_db(r.connected_at),
            disconnected_at: opt_from_db(r.disconnected_at),
            created_at: from_db(r.created_at),
            updated_at: from_db(r.updated_at),
        })
    }
}

/// The settings columns of a repository row, as read and as written (`egress_allow`: a JSON
/// array of the patterns' strings).
#[derive(Queryable, Selectable, Insertable, AsChangeset)]
#[diesel(
    table_name = repositories,
    treat_none_as_null = true,
    treat_none_as_default_value = false
)]
struct SettingsRow {
    coding_model: String,
    review_model: String,
    max_turns_coding: Option<i32>,
    max_turns_review: i32,
    agent_type: String,
    auto_review: bool,
    max_cost_per_task_nanos: Option<i64>,
    monthly_budget_nanos: Option<i64>,
    egress_allow: String,
    max_revisions: i32,
    revise_on_agent_review: bool,
    allow_provider_tools: bool,
}

impl SettingsRow {
    /// The columns that store `s`.
    fn of(s: &RepoSettings) -> Result<SettingsRow, DbError> {
        Ok(SettingsRow {
            coding_model: s.coding_model.clone(),
            review_model: s.review_model.clone(),
            max_turns_coding: s.max_turns_coding,
            max_turns_review: s.max_turns_review,
            agent_type: s.agent_type.as_str().to_owned(),
            auto_review: s.auto_review,
            max_cost_per_task_nanos: s.max_cost_per_task_usd.map(Usd::to_nanos),
            monthly_budget_nanos: s.monthly_budget_usd.map(Usd::to_nanos),
            egress_allow: serde_json::to_string(&s.egress_allow)
                .map_err(|e| DbError::Conflict(format!("egressAllow cannot be stored: {e}")))?,
            max_revisions: s.max_revisions,
            revise_on_agent_review: s.revise_on_agent_review,
            allow_provider_tools: s.allow_provider_tools,
        })
    }
}

impl TryFrom<SettingsRow> for RepoSettings {
    type Error = DbError;
    fn try_from(r: SettingsRow) -> Result<RepoSettings, DbError> {
        Ok(RepoSettings {
            coding_model: r.coding_model,
            review_model: r.review_model,
            max_turns_coding: r.max_turns_coding,
            max_turns_review: r.max_turns_review,
            agent_type: convert::parse::<AgentType>("agent type", &r.agent_type)?,
            auto_review: r.auto_review,
            max_cost_per_task_usd: convert::usd(r.max_cost_per_task_nanos)?,
            monthly_budget_usd: convert::usd(r.monthly_budget_nanos)?,
            // Each pattern is parsed (so validated) again as it is read.
            egress_allow: serde_json::from_str(&r.egress_allow).map_err(|e| {
                DbError::Corrupt(format!("invalid egressAllow {:?}: {e}", r.egress_allow))
            })?,
            max_revisions: r.max_revisions,
            revise_on_agent_review: r.revise_on_agent_review,
            allow_provider_tools: r.allow_provider_tools,
        })
    }
}

/// A repository to connect, as the code host describes it.
#[derive(Debug, Clone)]
pub struct NewRepository {
    /// Normalised URL.
    pub url: RepoUrl,
    /// Default branch.
    pub default_branch: String,
    /// Clone URL.
    pub clone_url: String,
    /// The code host's numeric id.
    pub codehost_id: Option<i64>,
}

/// Connects a repository with default settings, or returns the one already stored for that
/// URL (reconnecting it if it was disconnected). The boolean says whether it was created.
pub fn connect_repository(
    conn: &mut AnyConnection,
    new: &NewRepository,
    now: OffsetDateTime,
) -> Result<(Repository, bool), DbError> {
    let result = write_tx::<_, DbError, _>(conn, |conn| {
        if let Some(existing) = find_by_url(conn, &new.url)? {
            if existing.disconnected_at.is_some() {
                diesel::update(repositories::table.find(existing.id.to_string()))
                    .set((
                        repositories::disconnected_at.eq(None::<PrimitiveDateTime>),
                        repositories::connected_at.eq(to_db(now)),
                        repositories::default_branch.eq(&new.default_branch),
                        repositories::clone_url.eq(&new.clone_url),
                        repositories::updated_at.eq(to_db(now)),
                    ))
                    .execute(conn)?;
                return Ok((get_repository(conn, existing.id)?, false));
            }
            return Ok((existing, false));
        }
        let id = Uuid::new_v4();
        diesel::insert_into(repositories::table)
            .values((
                repositories::id.eq(id.to_string()),
                repositories::url.eq(new.url.as_str()),
                repositories::owner.eq(new.url.owner()),
                repositories::name.eq(new.url.name()),
                repositories::default_branch.eq(&new.default_branch),
                repositories::clone_url.eq(&new.clone_url),
                repositories::codehost_id.eq(new.codehost_id),
                SettingsRow::of(&RepoSettings::default())?,
                repositories::connected_at.eq(to_db(now)),
                repositories::created_at.eq(to_db(now)),
                repositories::updated_at.eq(to_db(now)),
            ))
            .execute(conn)?;
        Ok((get_repository(conn, id)?, true))
    });
    match result {
        // Two replicas connecting the same URL at once: the second returns the first's row.
        Err(e) if e.is_unique_violation() => {
            let existing = find_by_url(conn, &new.url)?.ok_or(e)?;
            Ok((existing, false))
        }
        other => other,
    }
}

/// One repository by id (connected or not).
pub fn get_repository(conn: &mut AnyConnection, id: Uuid) -> Result<Repository, DbError> {
    repositories::table
        .find(id.to_string())
        .select(RepoRow::as_select())
        .get_as(conn)
}

/// The repository stored for a normalised URL, if any.
pub fn find_by_url(conn: &mut AnyConnection, url: &RepoUrl) -> Result<Option<Repository>, DbError> {
    repositories::table
        .filter(repositories::url.eq(url.as_str()))
        .select(RepoRow::as_select())
        .first_as(conn)
}

/// Connected repositories, by URL.
pub fn list_connected(conn: &mut AnyConnection) -> Result<Vec<Repository>, DbError> {
    repositories::table
        .filter(repositories::disconnected_at.is_null())
        .order(repositories::url.asc())
        .select(RepoRow::as_select())
        .load_as(conn)
}

/// Marks a connected repository disconnected. Its row, tasks, costs and synced issues stay;
/// it leaves the list of connected repositories, the issues view and the sync loop.
/// Idempotent: disconnecting it again changes nothing (the first time is kept).
/// [`DbError::NotFound`] if no repository has this id.
pub fn disconnect_repository(
    conn: &mut AnyConnection,
    id: Uuid,
    now: OffsetDateTime,
) -> Result<Repository, DbError> {
    write_tx(conn, |conn| {
        // The condition makes a concurrent second disconnect a no-op instead of moving the time.
        diesel::update(
            repositories::table
                .find(id.to_string())
                .filter(repositories::disconnected_at.is_null()),
        )
        .set((
            repositories::disconnected_at.eq(Some(to_db(now))),
            repositories::updated_at.eq(to_db(now)),
        ))
        .execute(conn)?;
        get_repository(conn, id)
    })
}

/// Stores a repository's settings (already validated: [`RepoSettings`] values are always
/// within bounds) and returns the repository. [`DbError::NotFound`] if no repository has this id.
pub fn update_settings(
    conn: &mut AnyConnection,
    id: Uuid,
    settings: &RepoSettings,
    now: OffsetDateTime,
) -> Result<Repository, DbError> {
    write_tx(conn, |conn| {
        touched(
            diesel::update(repositories::table.find(id.to_string()))
                .set((
                    SettingsRow::of(settings)?,
                    repositories::updated_at.eq(to_db(now)),
                ))
                .execute(conn)?,
        )?;
        // A changed budget may pay for the repository's blocked tasks: they are candidates
        // again (a claim blocks them anew if not).
        crate::budgets::unblock(conn, Some(id))?;
        get_repository(conn, id)
    })
}

/// Changes a repository's settings as one read-modify-write (a PATCH): in one write
/// transaction, reads the current settings, passes them to `change`, and stores what it
/// returns. When `change` refuses (`Err(e)`), nothing is written and the result is
/// `Ok(Err(e))`. [`DbError::NotFound`] if no repository has this id.
///
/// The row is locked before it is read (on PostgreSQL by updating it first; SQLite's
/// immediate transaction already excludes other writers), so two concurrent patches of
/// different settings both take effect instead of one overwriting the other.
pub fn patch_settings<E, F>(
    conn: &mut AnyConnection,
    id: Uuid,
    now: OffsetDateTime,
    change: F,
) -> Result<Result<Repository, E>, DbError>
where
    F: FnOnce(&RepoSettings) -> Result<RepoSettings, E>,
{
    use crate::error::Rollback;
    let result = write_tx(conn, |conn| {
        let locked = diesel::update(repositories::table.find(id.to_string()))
            .set(repositories::updated_at.eq(to_db(now)))
            .execute(conn)?;
        if locked == 0 {
            return Err(Rollback::Db(DbError::NotFound));
        }
        let current = get_repository(conn, id)?;
        let settings = change(&current.settings).map_err(Rollback::Refused)?;
        Ok(update_settings(conn, id, &settings, now)?)
    });
    match result {
        Ok(repo) => Ok(Ok(repo)),
        Err(Rollback::Refused(e)) => Ok(Err(e)),
        Err(Rollback::Db(e)) => Err(e),
    }
}

/// Where a repository's issue sync stands (docs/contract.md#53-issue-sync).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IssueSyncState {
    /// The ETag of the last issue list stored (sent as `If-None-Match` on the next sync).
    pub etag: Option<String>,
    /// When the synced copy was last confirmed current (a 200 stored or a 304); `None`
    /// before the first successful sync.
    pub synced_at: Option<OffsetDateTime>,
    /// The message of the last sync if it failed; cleared by the next successful one.
    pub error: Option<String>,
}

/// A repository with its `issues_etag`, `issues_synced_at` and `issues_sync_error`.
type SyncStateRow = (
    RepoRow,
    Option<String>,
    Option<PrimitiveDateTime>,
    Option<String>,
);

/// The sync state of every connected repository, by URL (for the issues view's `syncedAt`
/// and `errors`, and for the sync loop).
pub fn issue_sync_states(
    conn: &mut AnyConnection,
) -> Result<Vec<(Repository, IssueSyncState)>, DbError> {
    let rows: Vec<SyncStateRow> = repositories::table
        .filter(repositories::disconnected_at.is_null())
        .order(repositories::url.asc())
        .select((
            RepoRow::as_select(),
            repositories::issues_etag,
            repositories::issues_synced_at,
            repositories::issues_sync_error,
        ))
        .load(conn)?;
    rows.into_iter()
        .map(|(row, etag, synced_at, error)| {
            Ok((
                Repository::try_from(row)?,
                IssueSyncState {
                    etag,
                    synced_at: opt_from_db(synced_at),
                    error,
                },
            ))
        })
        .collect()
}
