//! API tokens. Only a token's SHA-256 is stored; the token itself is shown once.

use agentry_domain::Role;
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::convert::{self, from_db, to_db};
use crate::schema::{api_tokens, service_meta};
use crate::{AnyConnection, DbError, write_tx};

/// A stored API token (without the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Token id.
    pub id: Uuid,
    /// Human name given at creation.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Creation time.
    pub created_at: OffsetDateTime,
}

type TokenRow = (String, String, String, PrimitiveDateTime);

fn decode(row: TokenRow) -> Result<ApiToken, DbError> {
    Ok(ApiToken {
        id: convert::uuid(&row.0)?,
        name: row.1,
        role: convert::parse("role", &row.2)?,
        created_at: from_db(row.3),
    })
}

/// Stores a new token by its hash.
pub fn create_token(
    conn: &mut AnyConnection,
    name: &str,
    role: Role,
    token_hash: &str,
    now: OffsetDateTime,
) -> Result<ApiToken, DbError> {
    // Stored as PostgreSQL can hold it (no NUL), and answered as stored.
    let name = crate::convert::text(name);
    let token = ApiToken {
        id: Uuid::new_v4(),
        name: name.clone().into_owned(),
        role,
        created_at: now,
    };
    write_tx(conn, |conn| {
        diesel::insert_into(api_tokens::table)
            .values((
                api_tokens::id.eq(token.id.to_string()),
                api_tokens::name.eq(name.as_ref()),
                api_tokens::role.eq(role.as_str()),
                api_tokens::token_hash.eq(token_hash),
                api_tokens::created_at.eq(to_db(now)),
            ))
            .execute(conn)?;
        Ok(token)
    })
}

/// The active (not revoked) token with this hash.
pub fn find_by_hash(
    conn: &mut AnyConnection,
    token_hash: &str,
) -> Result<Option<ApiToken>, DbError> {
    api_tokens::table
        .filter(api_tokens::token_hash.eq(token_hash))
        .filter(api_tokens::revoked_at.is_null())
        .select((
            api_tokens::id,
            api_tokens::name,
            api_tokens::role,
            api_tokens::created_at,
        ))
        .first::<TokenRow>(conn)
        .optional()?
        .map(decode)
        .transpose()
}

const ADMIN_ISSUED: &str = "first_admin_token_issued";

/// Issues the first admin token of an installation: only when no token exists and none was
/// ever issued this way. Safe against replicas starting together: the marker row's primary
/// key lets exactly one of them win. Returns `None` when there was nothing to do.
pub fn bootstrap_admin(
    conn: &mut AnyConnection,
    name: &str,
    token_hash: &str,
    now: OffsetDateTime,
) -> Result<Option<ApiToken>, DbError> {
    let result = write_tx(conn, |conn| {
        let tokens: i64 = api_tokens::table.count().get_result(conn)?;
        let marker: i64 = service_meta::table
            .filter(service_meta::key.eq(ADMIN_ISSUED))
            .count()
            .get_result(conn)?;
        if tokens > 0 || marker > 0 {
            return Ok(None);
        }
        diesel::insert_into(service_meta::table)
            .values((
                service_meta::key.eq(ADMIN_ISSUED),
                service_meta::value.eq(now.to_string()),
                service_meta::updated_at.eq(to_db(now)),
            ))
            .execute(conn)?;
        create_token(conn, name, Role::Admin, token_hash, now).map(Some)
    });
    match result {
        Err(e) if e.is_unique_violation() => Ok(None),
        other => other,
    }
}

/// Active tokens, oldest first.
pub fn list_active(conn: &mut AnyConnection) -> Result<Vec<ApiToken>, DbError> {
    api_tokens::table
        .filter(api_tokens::revoked_at.is_null())
        .order((api_tokens::created_at.asc(), api_tokens::id.asc()))
        .select((
            api_tokens::id,
            api_tokens::name,
            api_tokens::role,
            api_tokens::created_at,
        ))
        .load::<TokenRow>(conn)?
        .into_iter()
        .map(decode)
        .collect()
}

/// Revokes an active token; `false` when there is no active token with that id.
pub fn revoke(conn: &mut AnyConnection, id: Uuid, now: OffsetDateTime) -> Result<bool, DbError> {
    let n = diesel::update(
        api_tokens::table
            .filter(api_tokens::id.eq(id.to_string()))
            .filter(api_tokens::revoked_at.is_null()),
    )
    .set(api_tokens::revoked_at.eq(Some(to_db(now))))
    .execute(conn)?;
    Ok(n == 1)
}
