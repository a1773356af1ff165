//! The worker of a leased delivery queue ([`agentry_persistence::delivery`]), once for the
//! outbox (code-host effects, [`crate::codehost`]) and the budget alerts' webhook
//! ([`crate::alerts`]).
//!
//! A round ([`deliver_due`]) claims the due entries under a lease, hands each to the
//! queue's own send step, and marks it delivered, or failed with the retry time of the
//! [`Backoff`]. The loop (a [`crate::background`] loop of [`step`]s on [`schedule`]) does rounds and
//! waits in between until the next entry is due, it is woken (an entry was written), or the
//! idle time passes. Entries of a worker
//! that dies are claimed again, by any replica, when their lease runs out; so an entry may
//! be sent more than once, and each send step is safe to repeat.

use std::future::Future;
use std::time::Duration;

use agentry_domain::backoff::Backoff;
use agentry_persistence::delivery::{Entry, Queue};
use time::OffsetDateTime;

use crate::background::{Pass, Schedule, StepResult};
use crate::wake::Loops;
use crate::{Service, ServiceError, now};

/// How many due entries one round claims.
const BATCH: i64 = 20;

/// The shortest sleep between two rounds.
const MIN_SLEEP: Duration = Duration::from_millis(10);

/// One queue's worker: what it delivers, its timing, and its wake-up.
pub(crate) struct Worker<T: 'static> {
    /// The queue.
    queue: &'static Queue<T>,
    /// What an entry is, for the log (`code-host effect`, `budget alert`).
    what: &'static str,
    /// How long a claimed entry stays this worker's.
    lease: time::Duration,
    /// When a failed entry is tried again.
    backoff: Backoff,
    /// The longest sleep when nothing is due.
    idle: Duration,
    /// Wakes the loop (an entry was written).
    pub(crate) wake: tokio::sync::Notify,
}

impl<T> std::fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("what", &self.what)
            .field("lease", &self.lease)
            .field("backoff", &self.backoff)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<T: Entry + Send + 'static> Worker<T> {
    /// The worker of `queue`, whose entries are `what`, with these timings (a lease beyond
    /// what a timestamp holds counts as a minute).
    pub(crate) fn new(
        queue: &'static Queue<T>,
        what: &'static str,
        lease: Duration,
        backoff: Backoff,
        idle: Duration,
    ) -> Self {
        Worker {
            queue,
            what,
            lease: time::Duration::try_from(lease).unwrap_or(time::Duration::MINUTE),
            backoff,
            idle,
            wake: tokio::sync::Notify::new(),
        }
    }
}

/// One round: claims the entries due at `at`, sends each with `send` (`Err` holds why it
/// failed, stored as the entry's last error), and marks it delivered or failed. Returns how
/// many were delivered.
pub(crate) async fn deliver_due<T, S, F>(
    service: &Service,
    worker: &Worker<T>,
    at: OffsetDateTime,
    mut send: S,
) -> Result<usize, ServiceError>
where
    T: Entry + Send + 'static,
    S: FnMut(T) -> F,
    F: Future<Output = Result<(), String>>,
{
    let (queue, lease) = (worker.queue, worker.lease);
    let claimed = service
        .db(move |conn| Ok(queue.claim_due(conn, at, lease, BATCH)?))
        .await?;
    let mut delivered = 0;
    for entry in claimed {
        let (id, attempts, claimed_until) = (entry.id(), entry.attempts(), entry.next_attempt_at());
        // The batch is sent one entry after the other: each entry's lease starts again just
        // before it is sent, and is renewed while it is being sent (a send may wait out the
        // code host's rate limit), so no other worker (or replica) claims an entry while this
        // one may still be sending it.
        let renewed = service
            .db(move |conn| Ok(queue.renew(conn, id, claimed_until, now(), lease)?))
            .await?;
        let Some(held) = renewed else {
            tracing::info!(what = worker.what, id = %id, "lease lost before sending; left to the worker that holds it");
            continue;
        };
        let Some((sent, held)) = send_leased(service, worker, id, held, send(entry)).await? else {
            tracing::warn!(what = worker.what, id = %id, "lease lost while sending; the send is given up, left to the worker that holds it");
            continue;
        };
        match sent {
            Ok(()) => {
                service
                    .db(move |conn| Ok(queue.mark_delivered(conn, id, now())?))
                    .await?;
                tracing::info!(what = worker.what, id = %id, "delivered");
                delivered += 1;
            }
            Err(message) => {
                let delay = worker.backoff.delay(attempts);
                tracing::warn!(
                    what = worker.what, id = %id, attempts = attempts + 1, retry_in = ?delay,
                    error = %message, "delivery failed; will retry"
                );
                let retry_at = now() + delay;
                service
                    .db(move |conn| Ok(queue.mark_failed(conn, id, held, &message, retry_at)?))
                    .await?;
            }
        }
    }
    Ok(delivered)
}

/// Runs `send`, the send of entry `id` leased until `held`, renewing the lease every third of
/// it while the send lasts. Returns how the send ended and the lease's end then, or `None`
/// when a renewal found the lease lost (its end passed while the database did not answer, and
/// another worker claimed the entry): the send is then dropped, given up, and the entry left
/// to that worker.
async fn send_leased<T, F>(
    service: &Service,
    worker: &Worker<T>,
    id: uuid::Uuid,
    mut held: OffsetDateTime,
    send: F,
) -> Result<Option<(Result<(), String>, OffsetDateTime)>, ServiceError>
where
    T: Entry + Send + 'static,
    F: Future<Output = Result<(), String>>,
{
    let (queue, lease) = (worker.queue, worker.lease);
    let every = Duration::try_from(lease / 3)
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(1));
    let mut renewals = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut send = std::pin::pin!(send);
    loop {
        tokio::select! {
            sent = &mut send => return Ok(Some((sent, held))),
            _ = renewals.tick() => {
                let at = held;
                let renewed = service
                    .db(move |conn| Ok(queue.renew(conn, id, at, now(), lease)?))
                    .await?;
                match renewed {
                    Some(until) => held = until,
                    None => return Ok(None),
                }
            }
        }
    }
}

/// The schedule of `worker`'s loop, woken by `wake`: every idle time at most, at least
/// [`MIN_SLEEP`] between two rounds; a failed round is retried after [`MIN_SLEEP`],
/// doubling up to the idle time.
pub(crate) fn schedule<T>(worker: &Worker<T>, wake: Loops) -> Schedule {
    Schedule::woken(wake, worker.idle)
        .at_least(MIN_SLEEP)
        .backing_off(Backoff {
            base: MIN_SLEEP,
            max: worker.idle,
        })
        .quiet()
}

/// A step of the loop: runs `round` (a [`deliver_due`] with the queue's send step), then
/// says when the next entry is due.
pub(crate) async fn step<T, R, F>(service: &Service, worker: &Worker<T>, round: R) -> StepResult
where
    T: Entry + Send + 'static,
    R: FnOnce() -> F,
    F: Future<Output = Result<usize, ServiceError>>,
{
    round().await?;
    let queue = worker.queue;
    let next = service.db(move |conn| Ok(queue.next_due(conn)?)).await?;
    Ok(next.map_or(Pass::Idle, |due| {
        Pass::DueIn(Duration::try_from(due - now()).unwrap_or(Duration::ZERO))
    }))
}
