//! Serves the fake model API for runs of the real agent CLIs by hand:
//! `cargo run -p agentry-fake-models --example serve [DUMP_DIR]`.
//!
//! It prints one JSON line on stdout (`{"baseUrl", "openaiBaseUrl", "key"}`), then one JSON
//! line per request answered (without headers and body), and serves until its standard
//! input closes. With `DUMP_DIR`, each call is also written whole (headers, body) to
//! `DUMP_DIR/NNNN.json`. With `FAKE_MODELS_NO_WEBSOCKET` set, the WebSocket transport is
//! refused (Codex then falls back to server-sent events).

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agentry_fake_models::FakeModels;

fn main() -> std::io::Result<()> {
    let dump = std::env::args().nth(1).map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir)?;
    }
    let fake = FakeModels::try_start()?;
    if std::env::var_os("FAKE_MODELS_NO_WEBSOCKET").is_some() {
        fake.set_websocket_enabled(false);
    }
    let mut out = std::io::stdout();
    writeln!(
        out,
        "{}",
        serde_json::json!({"baseUrl": fake.base_url(), "openaiBaseUrl": fake.openai_base_url(),
                           "key": fake.key()})
    )?;
    out.flush()?;
    let closed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        flag.store(true, Ordering::SeqCst);
    });
    let mut shown = 0;
    let mut unanswered: Vec<u64> = Vec::new();
    while !closed.load(Ordering::SeqCst) {
        let calls = fake.calls();
        for call in calls.iter().skip(shown) {
            print_call(&mut out, call, dump.as_deref())?;
            if call.answered_at.is_none() {
                unanswered.push(call.seq);
            }
        }
        shown = calls.len();
        unanswered.retain(|seq| {
            let Some(call) = calls.iter().find(|c| c.seq == *seq) else {
                return false;
            };
            if call.answered_at.is_some() {
                let _ = writeln!(out, "{}", serde_json::json!({"answered": seq}));
                false
            } else {
                true
            }
        });
        out.flush()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn print_call(
    out: &mut impl Write,
    call: &agentry_fake_models::Call,
    dump: Option<&std::path::Path>,
) -> std::io::Result<()> {
    let mut summary = serde_json::to_value(call).unwrap_or_default();
    if let Some(obj) = summary.as_object_mut() {
        obj.remove("headers");
        obj.remove("body");
    }
    writeln!(out, "{summary}")?;
    if let Some(dir) = dump {
        let whole = serde_json::to_string_pretty(call).unwrap_or_default();
        std::fs::write(dir.join(format!("{:04}.json", call.seq)), whole)?;
    }
    Ok(())
}
