//! Webhook de-duplication (docs/contract.md#56-webhook): every delivery id (`X-GitHub-Delivery`) is recorded
//! once in `webhook_deliveries`, whose primary key decides between concurrent requests and
//! replicas receiving the same delivery.

use diesel::prelude::*;
use time::OffsetDateTime;

use crate::connection::insert_once;
use crate::convert::to_db;
use crate::schema::webhook_deliveries;
use crate::{AnyConnection, DbError, write_tx};

/// Records a webhook delivery id with its event (`X-GitHub-Event`) and action. Returns
/// `Ok(true)` when this call recorded it, `Ok(false)` when the id was recorded before.
///
/// Runs through [`write_tx`], so inside a caller's transaction it is a savepoint of it: the
/// delivery is recorded exactly when the caller's processing commits, and a redelivery after
/// a failed attempt is processed again. The existing row is looked for first and the insert
/// runs in its own savepoint, so a concurrent insert of the same id (a unique violation, on
/// PostgreSQL after waiting for the other transaction to commit) yields `false` and leaves
/// the caller's transaction usable.
pub fn record_delivery(
    conn: &mut AnyConnection,
    delivery_id: &str,
    event: &str,
    action: Option<&str>,
    now: OffsetDateTime,
) -> Result<bool, DbError> {
    write_tx(conn, |conn| {
        let seen = webhook_deliveries::table
            .find(delivery_id)
            .select(webhook_deliveries::delivery_id)
            .first::<String>(conn)
            .optional()?;
        if seen.is_some() {
            return Ok(false);
        }
        insert_once(conn, |conn| {
            diesel::insert_into(webhook_deliveries::table)
                .values((
                    webhook_deliveries::delivery_id.eq(delivery_id),
                    webhook_deliveries::event.eq(event),
                    webhook_deliveries::action.eq(action),
                    webhook_deliveries::received_at.eq(to_db(now)),
                ))
                .execute(conn)
        })
    })
}

/// A recorded delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The `X-GitHub-Delivery` id.
    pub delivery_id: String,
    /// The `X-GitHub-Event` name.
    pub event: String,
    /// The payload's `action`, when it has one.
    pub action: Option<String>,
    /// When it was first received.
    pub received_at: OffsetDateTime,
}

/// The recorded delivery with this id, if any.
pub fn find_delivery(
    conn: &mut AnyConnection,
    delivery_id: &str,
) -> Result<Option<Delivery>, DbError> {
    let row = webhook_deliveries::table
        .find(delivery_id)
        .select((
            webhook_deliveries::delivery_id,
            webhook_deliveries::event,
            webhook_deliveries::action,
            webhook_deliveries::received_at,
        ))
        .first::<(String, String, Option<String>, time::PrimitiveDateTime)>(conn)
        .optional()?;
    Ok(
        row.map(|(delivery_id, event, action, received_at)| Delivery {
            delivery_id,
            event,
            action,
            received_at: crate::convert::from_db(received_at),
        }),
    )
}

/// Forgets deliveries received before `before`; returns how many. GitHub redelivers only
/// recent deliveries (days, not weeks), so ids older than that can never arrive again and
/// the table need not grow forever.
pub fn forget_deliveries_before(
    conn: &mut AnyConnection,
    before: OffsetDateTime,
) -> Result<usize, DbError> {
    write_tx(conn, |conn| {
        Ok(diesel::delete(
            webhook_deliveries::table.filter(webhook_deliveries::received_at.lt(to_db(before))),
        )
        .execute(conn)?)
    })
}
