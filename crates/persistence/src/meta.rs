//! Schema information for operators (`agentry migrate`, `/readyz`).

use diesel::prelude::*;
use diesel_migrations::MigrationHarness;

use crate::connection::MIGRATIONS;
use crate::{AnyConnection, DbError};

/// Migrations compiled into this binary that the database has not applied yet.
pub fn pending_migrations(conn: &mut AnyConnection) -> Result<Vec<String>, DbError> {
    conn.pending_migrations(MIGRATIONS)
        .map(|m| m.iter().map(|m| m.name().version().to_string()).collect())
        .map_err(|e| DbError::Migration(e.to_string()))
}

/// Number of rows in `tasks` (for logs and tests).
pub fn task_count(conn: &mut AnyConnection) -> Result<i64, DbError> {
    Ok(crate::schema::tasks::table.count().get_result(conn)?)
}
