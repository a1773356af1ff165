//! The `agentry` binary; everything it does lives in `agentry_api::cli`.

fn main() -> std::process::ExitCode {
    agentry_api::cli::main()
}
