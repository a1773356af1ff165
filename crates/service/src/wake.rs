//! Commit, then wake: the one way a use case tells a background loop that there is work.
//!
//! A loop sleeps until its timer or a wake-up; a change it must act on (a queued task, an
//! outbox effect, feedback waiting for its round, an alert to deliver) wakes it, and only
//! once the change has committed, so the loop finds it. [`Service::commit`] runs a write
//! and wakes the loops its result concerns; [`Service::wake`] is for a pass of several
//! transactions that wakes once at its end.

use agentry_persistence::AnyConnection;

use crate::{Service, ServiceError};

/// The background loops a committed change concerns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Loops {
    runner: bool,
    outbox: bool,
    revisions: bool,
    alerts: bool,
}

impl Loops {
    /// No loop.
    pub(crate) const NONE: Loops = Loops {
        runner: false,
        outbox: false,
        revisions: false,
        alerts: false,
    };
    /// The runner: a task may be claimed (queued, unblocked, a slot freed).
    pub(crate) const RUNNER: Loops = Loops {
        runner: true,
        ..Loops::NONE
    };
    /// The outbox: a code-host effect waits for delivery.
    pub(crate) const OUTBOX: Loops = Loops {
        outbox: true,
        ..Loops::NONE
    };
    /// The revision scheduler: feedback waits for its round.
    pub(crate) const REVISIONS: Loops = Loops {
        revisions: true,
        ..Loops::NONE
    };
    /// The budget alerts' delivery: an alert waits to be sent.
    pub(crate) const ALERTS: Loops = Loops {
        alerts: true,
        ..Loops::NONE
    };

    /// These loops and `other`'s.
    pub(crate) const fn and(self, other: Loops) -> Loops {
        Loops {
            runner: self.runner || other.runner,
            outbox: self.outbox || other.outbox,
            revisions: self.revisions || other.revisions,
            alerts: self.alerts || other.alerts,
        }
    }

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
        if loops.runner {
            self.parts.runs.wake();
        }
        if loops.outbox {
            self.parts.codehost.wake_outbox();
        }
        if loops.revisions {
            self.parts.codehost.revisions().wake();
        }
        if loops.alerts {
            self.parts.alerts.wake();
        }
    }
}
