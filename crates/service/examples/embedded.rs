//! agentry inside another Rust program, without the HTTP API (and without actix).
//!
//! ```sh
//! # The cost report of the last 30 days (or DAYS), as the API's JSON:
//! cargo run -p agentry-service --example embedded -- costs [DAYS]
//! # The whole product's background work (agent runs, issue sync, the outbox, pull-request
//! # tracking) until Ctrl-C:
//! cargo run -p agentry-service --example embedded -- run
//! ```
//!
//! Both read the same configuration as `agentry serve` (AGENTRY_DATA_DIR,
//! AGENTRY_DATABASE_URL, …; docs/contract.md#12-configuration).

use agentry_service::Service;
use agentry_service::config::Config;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = Config::from_env()?;
    let service = Service::open(&config)?;
    match args.first().map(String::as_str) {
        Some("costs") => {
            let days = match args.get(1) {
                Some(days) => days.parse()?,
                None => 30,
            };
            let window = agentry_service::costs::window_ending_now(days)?;
            let report = service.cost_report(window, None).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Some("run") => {
            let background = service.start_background(&config).await;
            eprintln!("agentry's background work is running; Ctrl-C stops it");
            tokio::signal::ctrl_c().await?;
            service.shut_down(background).await;
        }
        _ => {
            eprintln!("usage: embedded costs [DAYS] | embedded run");
            std::process::exit(2);
        }
    }
    Ok(())
}
