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

/// What to do.
#[derive(clap::Parser)]
enum Command {
    /// Print the cost report of the last DAYS days, as the API's JSON.
    Costs {
        /// Days ending today.
        #[arg(default_value_t = 30)]
        days: u32,
    },
    /// Run the product's background work until Ctrl-C.
    Run,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let command: Command = clap::Parser::parse();
    let config = Config::from_env()?;
    let service = Service::open(&config)?;
    match command {
        Command::Costs { days } => {
            let window = agentry_service::costs::window_ending_now(days)?;
            let report = service.cost_report(window, None).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Run => {
            let background = service.start_background(&config).await;
            eprintln!("agentry's background work is running; Ctrl-C stops it");
            tokio::signal::ctrl_c().await?;
            service.shut_down(background).await;
        }
    }
    Ok(())
}
