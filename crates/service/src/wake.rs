//! Commit, then wake: the one way a use case tells a background loop that there is work.
//!
//! A loop sleeps until its timer or a wake-up; a change it must act on (a queued task, an
//! outbox effect, feedback waiting for its round, an alert to deliver, a repository whose
//! sync a webhook asked for) wakes it, and only once the change has committed, so the loop
//! finds it. [`Service::commit`] runs a write and wakes the loops its result concerns;
//! [`Service::wake`] is for a pass of several transactions that wakes once at its end.

use agentry_persistence::AnyConnection;
use tokio::sync::Notify;

use crate::{Service, ServiceError};

bitflags::bitflags! {
    /// The background loops a committed change concerns; `|` joins them.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub(crate) struct Loops: u8 {
        /// The runner: a task may be claimed (queued, unblocked, a slot freed).
        const RUNNER = 1;
        /// The outbox: a code-host effect waits for delivery.
        const OUTBOX = 1 << 1;
        /// The revision scheduler: feedback waits for its round.
        const REVISIONS = 1 << 2;
        /// The budget alerts' delivery: an alert waits to be sent.
        const ALERTS = 1 << 3;
        /// The issue sync: a webhook asked for a repository's sync (an issue was labelled).
        const ISSUE_SYNC = 1 << 4;
    }
}

impl Loops {
    /// No loop.
    pub(crate) const NONE: Loops = Loops::empty();

    /// These loops if `condition` holds, else none.
    pub(crate) const fn when(self, condition: bool) -> Loops {
        if condition { self } else { Loops::NONE }
    }
}

impl Service {
    /// Runs the write `f` on the blocking pool and, once it has committed, wakes the loops
    /// `wake` picks from its result. Nothing is woken when `f` fails.
    pub(crate) async fn commit<T, F, W>(&self, f: F, wake: W) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce(&mut AnyConnection) -> Result<T, ServiceError> + Send + 'static,
        W: FnOnce(&T) -> Loops,
    {
        let committed = self.db(f).await?;
        self.wake(wake(&committed));
        Ok(committed)
    }

    /// Wakes `loops` after changes that have committed: the end of a pass of several
    /// transactions (each use case of one transaction uses [`Service::commit`]).
    pub(crate) fn wake(&self, loops: Loops) {
        for one in loops.iter() {
            if let Some(wakeup) = self.wakeup(one) {
                wakeup.notify_one();
            }
        }
    }

    /// The wake-up of the one loop `one` (none for [`Loops::NONE`] or several).
    pub(crate) fn wakeup(&self, one: Loops) -> Option<&Notify> {
        match one {
            Loops::RUNNER => Some(&self.parts.runs.wake),
            Loops::OUTBOX => Some(&self.parts.codehost.outbox.wake),
            Loops::REVISIONS => Some(&self.parts.codehost.revisions().wake),
            Loops::ALERTS => Some(&self.parts.alerts.delivery.wake),
            Loops::ISSUE_SYNC => Some(&self.parts.codehost.issue_sync.wake),
            _ => None,
        }
    }
}
