//! The webhook under slow uploads, through `agentry serve` (docs/security.md#what-the-webhook-accepts):
//! 120 connections keep trickling unauthenticated bodies to `POST /api/webhooks/codehost`
//! (each cut off is replaced at once), and genuine signed deliveries sent meanwhile are each
//! answered 200 promptly, while every slow upload is cut off within a bounded time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_testkit::wait::eventually;

use crate::Server;

const SECRET: &str = "the-webhook-secret-of-this-test";

/// Slow uploads kept open at once.
const SLOW_UPLOADS: usize = 120;

/// How long the genuine deliveries go on under the slow uploads: longer than the longest a
/// body may take (10 s), so every slow upload has been cut off and replaced at least once.
const UNDER_LOAD: Duration = Duration::from_secs(12);

/// How long a genuine delivery may take to be answered.
const PROMPT: Duration = Duration::from_secs(2);

/// How soon a slow upload must be answered: its first second, the wait for a large slot
/// (2 s) at most, and slack for a loaded machine.
const ANSWERED_WITHIN: Duration = Duration::from_secs(5);

/// How soon after its answer a slow upload's connection must be closed: the server's
/// `client_disconnect_timeout` (2 s) and slack.
const CLOSED_WITHIN: Duration = Duration::from_secs(3);

/// How a slow upload ended.
#[derive(Debug, Clone, Copy)]
struct Ended {
    /// When the server's answer began, from the head on; `None` without one.
    answered: Option<Duration>,
    /// When the connection was closed (or broke), from the head on.
    closed: Duration,
    /// The answer's status.
    status: Option<u16>,
}

/// One slow upload: a well-formed but wrong signature, a declared body of `length` bytes, of
/// which 16 bytes are sent every 50 ms until the server answers, then read until the server
/// closes the connection (or a minute has passed).
fn slow_upload(addr: &str, id: usize, length: usize) -> Ended {
    let mut conn = TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST /api/webhooks/codehost HTTP/1.1\r\nHost: {addr}\r\n\
         X-Hub-Signature-256: sha256={zeros}\r\nX-GitHub-Event: ping\r\n\
         X-GitHub-Delivery: slow-{id}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n",
        zeros = "0".repeat(64)
    );
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut answered = None;
    let ended = |answer: &[u8], answered| Ended {
        answered,
        closed: started.elapsed(),
        status: status_of(answer),
    };
    if conn.write_all(head.as_bytes()).is_err() {
        return ended(&answer, answered);
    }
    // The read timeout paces the upload: 16 bytes, then up to 50 ms for an answer.
    conn.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0_u8; 1024];
    while started.elapsed() < Duration::from_secs(60) {
        if answered.is_none() && conn.write_all(&[b' '; 16]).is_err() {
            break;
        }
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answered = answered.or(Some(started.elapsed()));
                answer.extend_from_slice(&buf[..n]);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    ended(&answer, answered)
}

/// The status of an HTTP answer's head, if one came.
fn status_of(answer: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(answer);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[test]
fn the_webhook_answers_genuine_deliveries_under_120_slow_uploads() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        tmp.path(),
        None,
        false,
        &[("CODEHOST_WEBHOOK_SECRET", SECRET)],
    );
    let addr = server.base.trim_start_matches("http://").to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Ended>>> = Arc::default();
    // Most declare 1 MiB, the largest body not limited to the two large slots; every
    // tenth declares 20 MiB.
    let uploaders: Vec<_> = (0..SLOW_UPLOADS)
        .map(|i| {
            let (addr, stop, open, seen) = (addr.clone(), stop.clone(), open.clone(), seen.clone());
            let length = if i % 10 == 0 { 20 << 20 } else { 1 << 20 };
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    open.fetch_add(1, Ordering::Relaxed);
                    let outcome = slow_upload(&addr, i * 1000 + n, length);
                    open.fetch_sub(1, Ordering::Relaxed);
                    seen.lock().unwrap().push(outcome);
                    n += 1;
                }
            })
        })
        .collect();
    eventually(
        Duration::from_secs(20),
        "every slow upload under way",
        || (open.load(Ordering::Relaxed) == SLOW_UPLOADS).then_some(()),
    );

    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let body = br#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    let signature = agentry_codehost::webhook::sign(SECRET.as_bytes(), body);
    let load_started = Instant::now();
    let mut genuine = Vec::new();
    let mut i = 0;
    while load_started.elapsed() < UNDER_LOAD {
        let sent = Instant::now();
        let res = client
            .post(format!("{}/api/webhooks/codehost", server.base))
            .header("X-Hub-Signature-256", &signature)
            .header("X-GitHub-Event", "ping")
            .header("X-GitHub-Delivery", format!("genuine-{i}"))
            .header("Content-Type", "application/json")
            .body(body.to_vec())
            .send()
            .unwrap();
        let took = sent.elapsed();
        let status = res.status().as_u16();
        let text = res.text().unwrap_or_default();
        assert_eq!(status, 200, "genuine delivery {i} after {took:?}: {text}");
        assert!(
            took < PROMPT,
            "genuine delivery {i} took {took:?} under {} slow uploads",
            open.load(Ordering::Relaxed)
        );
        genuine.push(took);
        i += 1;
    }
    let still_open = open.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for uploader in uploaders {
        uploader.join().unwrap();
    }

    let seen = seen.lock().unwrap();
    let answered: Vec<Duration> = seen.iter().filter_map(|e| e.answered).collect();
    let longest = answered.iter().max().copied().unwrap_or_default();
    let mut by_status = std::collections::BTreeMap::new();
    for ended in seen.iter() {
        *by_status.entry(ended.status).or_insert(0) += 1;
    }
    genuine.sort();
    eprintln!(
        "{} genuine deliveries under {still_open} slow uploads: median {:?}, slowest {:?}; \
         {} slow uploads cut off, the longest answered after {longest:?}, by status \
         {by_status:?}",
        genuine.len(),
        genuine[genuine.len() / 2],
        genuine[genuine.len() - 1],
        seen.len(),
    );
    assert!(
        still_open >= SLOW_UPLOADS * 9 / 10,
        "the load held: {still_open} slow uploads open at the end"
    );
    // Every slow upload was answered, none accepted: 408 for falling behind the pace, 503 for
    // a large body that found no slot; then its connection was closed.
    for ended in seen.iter() {
        assert!(matches!(ended.status, Some(408 | 503)), "{ended:?}");
        let answered = ended.answered.unwrap();
        assert!(answered <= ANSWERED_WITHIN, "{ended:?}");
        assert!(ended.closed <= answered + CLOSED_WITHIN, "{ended:?}");
    }
    drop(server);
}
