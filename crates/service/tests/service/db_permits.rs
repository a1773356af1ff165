//! `Service::db` waits for a database permit as a future, before it takes a blocking thread:
//! calls queued behind a busy pool leave tokio's blocking pool free for other work (and do
//! not each hold a parked thread with its own allocator arena).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use agentry_service::{Service, ServiceError};
use agentry_testkit::wait::eventually;

use crate::common::config;

#[test]
fn waiting_database_calls_do_not_hold_blocking_threads() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let service = Service::open(&config).unwrap();
    let pool = service.max_connections() as usize;
    // One blocking thread more than the pool has connections.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(pool + 1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let entered = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let mut calls = Vec::new();
        // Every connection busy until the gate opens.
        for _ in 0..pool {
            let (service, entered, gate) = (service.clone(), entered.clone(), gate.clone());
            calls.push(tokio::spawn(async move {
                service
                    .db(move |_conn| {
                        entered.fetch_add(1, Ordering::SeqCst);
                        let (open, cv) = &*gate;
                        let mut open = open.lock().unwrap();
                        while !*open {
                            open = cv.wait(open).unwrap();
                        }
                        Ok::<_, ServiceError>(())
                    })
                    .await
            }));
        }
        // `eventually` sleeps on this thread: this wait must not depend on the runtime's timer.
        eventually(Duration::from_secs(10), "the pool to fill", || {
            entered.load(Ordering::SeqCst) >= pool
        });
        // More calls than there are threads left, each polled once so that it has gone as far
        // as it can (to its permit, or to a blocking thread) before the other work is sent.
        let mut waiting = Vec::new();
        for _ in 0..4 * pool {
            let service = service.clone();
            let mut call =
                Box::pin(async move { service.db(|_conn| Ok::<_, ServiceError>(())).await });
            let mut cx = Context::from_waker(Waker::noop());
            assert!(call.as_mut().poll(&mut cx).is_pending());
            waiting.push(call);
        }
        // The one thread left still runs other blocking work at once. (Waited for on this
        // thread, not with a tokio timer: without the permits the worker may be stuck too.)
        let (sent, received) = std::sync::mpsc::channel();
        let mut other_call = Box::pin(service.blocking(move || sent.send(42)));
        let mut cx = Context::from_waker(Waker::noop());
        let _ = other_call.as_mut().poll(&mut cx);
        let other = received.recv_timeout(Duration::from_secs(3));
        // Open the gate first, so that a failure ends the test instead of hanging it.
        let (open, cv) = &*gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
        assert_eq!(
            other.ok(),
            Some(42),
            "waiting database calls took every blocking thread"
        );
        for call in calls {
            call.await.unwrap().unwrap();
        }
        for call in waiting {
            call.await.unwrap();
        }
    });
}
