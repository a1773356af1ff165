//! The `agentry` command line (docs/contract.md#1-running-it).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use agentry_domain::Role;
use clap::{Parser, Subcommand, ValueEnum};

use crate::auth::{generate_token, hash_token};
use crate::config::Config;
use agentry_service::Service;

use crate::server::StartError;

#[derive(Parser)]
#[command(
    name = "agentry",
    version,
    about = "Runs AI coding agents on tasks and accounts for every dollar they spend."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply migrations, then serve the HTTP API until SIGTERM/SIGINT.
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Manage API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Import historical task records from a JSON Lines file (all or nothing).
    Import {
        /// The file, one JSON task record per line.
        file: PathBuf,
    },
    /// Print the cost report (the API's /api/analytics/costs) straight from the database.
    Costs {
        /// Period length in days, ending today (UTC).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=365))]
        days: u32,
        /// Only this repository.
        #[arg(long)]
        repo: Option<String>,
        /// Print the API's JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Check what an agent run needs (git, the sandbox, the agent CLIs and their keys, the
    /// database, the code-host token, prices), one line each with its fix; changes nothing.
    /// Exits 1 when a run cannot succeed.
    Doctor,
    /// Print the OpenAPI document of the HTTP API (what GET /api/openapi.json serves), with
    /// no database and no configuration needed.
    Openapi,
    /// Inside an agent's sandbox: forward loopback ports to the run's sockets and run the
    /// agent (`sandbox-net --listen PORT=SOCKET... -- PROGRAM [ARGS...]`; see
    /// `agentry_runner::network::forwarder`). Reads no configuration and no database.
    #[command(hide = true, disable_help_flag = true)]
    SandboxNet {
        /// `--listen PORT=SOCKET_PATH`..., `--`, the program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
    /// The main program of an agent's pod on Kubernetes: fetch the run from the replica at
    /// `AGENTRY_POD_ENDPOINT` with the key `AGENTRY_POD_KEY`, run the agent, send back its
    /// output, patch and result (see `agentry_runner::pod`). Reads no configuration and no
    /// database; prints nothing on stdout but the agent's stdout.
    #[command(hide = true)]
    PodRun,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print it once (only its hash is stored).
    Create {
        /// What the token may do.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// A name to recognise it by.
        #[arg(long, default_value = "cli")]
        name: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Admin,
    Member,
    Viewer,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Admin => Role::Admin,
            RoleArg::Member => Role::Member,
            RoleArg::Viewer => Role::Viewer,
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Service(#[from] agentry_service::ServiceError),
    #[error("{0}")]
    Other(String),
}

/// Runs the command line; the binary's `main` is this function.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor => return doctor(),
        Command::SandboxNet { args } => {
            let code = agentry_runner::network::forwarder_main(args);
            return ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
        }
        Command::PodRun => {
            let code = agentry_runner::pod::pod_run_main();
            return ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
        }
        _ => {}
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentry: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `agentry doctor`: the report on stdout; exit 1 when a check failed (a configuration
/// that cannot be read is one).
fn doctor() -> ExitCode {
    use agentry_doctor::{self as doctor, Report};
    let report = match Config::from_env() {
        Ok(config) => {
            // The report says everything; logs (stderr) only when RUST_LOG asks for them.
            crate::logging::init_with_default(config.log_format, "off");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build();
            match runtime {
                Ok(runtime) => runtime.block_on(doctor::diagnose(&config.service)),
                Err(e) => {
                    eprintln!("agentry: error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Err(e) => Report::config_error(&e),
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = write!(out, "{report}").and_then(|()| out.flush())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("agentry: error: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    if report.can_run() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    if let Command::Openapi = cli.command {
        let text = serde_json::to_string_pretty(&crate::app::openapi())
            .map_err(|e| CliError::Other(e.to_string()))?;
        let mut out = std::io::stdout().lock();
        return match writeln!(out, "{text}").and_then(|()| out.flush()) {
            // A reader that stopped early (`agentry openapi | head`) is not an error.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(CliError::Other(format!("cannot write the document: {e}")))
            }
            _ => Ok(()),
        };
    }
    let config = Config::from_env()?;
    crate::logging::init(config.log_format);
    if let Command::Serve = cli.command {
        actix_web::rt::System::new().block_on(crate::server::serve(config))?;
        return Ok(());
    }
    // The other commands are use cases of a service that runs nothing in the background.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Other(format!("cannot start the runtime: {e}")))?;
    let open = || Service::open_for_command(&config.service);
    match cli.command {
        Command::Migrate => {
            let pending = runtime.block_on(open()?.pending_migrations())?;
            println!("database is up to date ({pending} pending)");
        }
        Command::Token {
            command: TokenCommand::Create { role, name },
        } => {
            let name = name.trim();
            if name.is_empty() || name.chars().count() > 100 {
                return Err(CliError::Other("--name must be 1 to 100 characters".into()));
            }
            let service = open()?;
            let token = generate_token().map_err(|e| CliError::Other(e.to_string()))?;
            let record = runtime.block_on(service.create_token(
                name.to_owned(),
                role.into(),
                hash_token(&token),
            ))?;
            eprintln!(
                "created {} token {:?} ({}); it is shown only once:",
                record.role, record.name, record.id
            );
            println!("{token}");
        }
        Command::Import { file } => {
            let started = Instant::now();
            let body = std::fs::read(&file)
                .map_err(|e| CliError::Other(format!("cannot read {}: {e}", file.display())))?;
            let outcome = runtime.block_on(open()?.import(body))?;
            eprintln!(
                "imported {} and skipped {} records from {} in {:.1} s",
                outcome.imported,
                outcome.skipped,
                file.display(),
                started.elapsed().as_secs_f64()
            );
            println!(
                r#"{{"imported": {}, "skipped": {}}}"#,
                outcome.imported, outcome.skipped
            );
        }
        Command::Costs { days, repo, json } => {
            let repo = repo
                .map(|r| agentry_domain::RepoUrl::parse(&r))
                .transpose()
                .map_err(|e| CliError::Other(format!("--repo: {e}")))?;
            let window = agentry_service::costs::window_ending_now(days)
                .map_err(|e| CliError::Other(e.to_string()))?;
            let report = runtime.block_on(open()?.cost_report(window, repo.clone()))?;
            if json {
                let text =
                    json_for_terminal(&report).map_err(|e| CliError::Other(e.to_string()))?;
                println!("{text}");
            } else {
                print!("{}", crate::costs_table::render(&report, repo.as_ref()));
            }
        }
        Command::Serve
        | Command::Openapi
        | Command::Doctor
        | Command::SandboxNet { .. }
        | Command::PodRun => {}
    }
    Ok(())
}

/// Pretty JSON in which every character of [`crate::costs_table::is_unsafe_for_terminal`]
/// is written as a `\uXXXX` escape (serde_json escapes only C0 itself), so that strings
/// from issues (titles) printed by `agentry costs --json` cannot act on the terminal. The
/// document means the same.
fn json_for_terminal<T: serde::Serialize>(value: &T) -> Result<String, serde_json::Error> {
    use serde_json::ser::{Formatter, PrettyFormatter};
    use std::io::{self, Write};

    /// The layout methods of `Formatter`, passed on to the pretty formatter as they are
    /// (`(first)`: the method also takes whether this is the first member).
    macro_rules! delegate_to_pretty {
        ($($method:ident $(($first:ident))?),+ $(,)?) => {$(
            fn $method<W: ?Sized + Write>(
                &mut self,
                w: &mut W,
                $($first: bool,)?
            ) -> io::Result<()> {
                self.0.$method(w, $($first)?)
            }
        )+};
    }

    struct Safe(PrettyFormatter<'static>);
    impl Formatter for Safe {
        fn write_string_fragment<W: ?Sized + Write>(
            &mut self,
            w: &mut W,
            fragment: &str,
        ) -> io::Result<()> {
            let mut start = 0;
            for (i, c) in fragment.char_indices() {
                if crate::costs_table::is_unsafe_for_terminal(c) {
                    w.write_all(&fragment.as_bytes()[start..i])?;
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        write!(w, "\\u{unit:04x}")?;
                    }
                    start = i + c.len_utf8();
                }
            }
            w.write_all(&fragment.as_bytes()[start..])
        }
        delegate_to_pretty! {
            begin_array, end_array, begin_array_value(first), end_array_value,
            begin_object, end_object, begin_object_key(first), begin_object_value,
            end_object_value,
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Safe(PrettyFormatter::new()));
    value.serialize(&mut ser)?;
    // serde_json writes UTF-8 only.
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_for_terminal_escapes_controls_and_bidi_overrides_and_still_parses() {
        let title = "\x1b]0;pwned\x07 a\u{202e}b\u{9b}c \"q\" é";
        let text = json_for_terminal(&serde_json::json!({ "title": title, "n": [1, 2] })).unwrap();
        assert!(
            !text
                .chars()
                .any(|c| crate::costs_table::is_unsafe_for_terminal(c) && c != '\n'),
            "{text:?}"
        );
        assert!(
            text.contains("\\u001b]0;pwned\\u0007 a\\u202eb\\u009bc"),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["title"], title);
        assert_eq!(back["n"], serde_json::json!([1, 2]));
    }

    /// `pod-run` takes no arguments: everything comes from its environment and the replica.
    #[test]
    fn pod_run_takes_no_arguments() {
        let cli = Cli::try_parse_from(["agentry", "pod-run"]).unwrap();
        assert!(matches!(cli.command, Command::PodRun));
        assert!(Cli::try_parse_from(["agentry", "pod-run", "--endpoint", "x"]).is_err());
    }

    /// `sandbox-net` takes everything after it as the forwarder's arguments, `--` and
    /// options included.
    #[test]
    fn sandbox_net_passes_its_arguments_through() {
        let forwarded = [
            "--listen",
            "4810=/run/agentry/gateway.sock",
            "--listen",
            "4811=/run/agentry/proxy.sock",
            "--",
            "/usr/bin/claude",
            "-p",
            "--help",
            "--",
            "x",
        ];
        let cli =
            Cli::try_parse_from(["agentry", "sandbox-net"].into_iter().chain(forwarded)).unwrap();
        let Command::SandboxNet { args } = cli.command else {
            panic!("not sandbox-net");
        };
        assert_eq!(args, forwarded.map(std::ffi::OsString::from));
        let parsed = agentry_runner::network::forwarder::ForwarderArgs::parse(args).unwrap();
        assert_eq!(parsed.program, "/usr/bin/claude");
        assert_eq!(
            parsed.args,
            ["-p", "--help", "--", "x"].map(std::ffi::OsString::from)
        );
    }
}
