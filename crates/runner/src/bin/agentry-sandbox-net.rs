//! `agentry-sandbox-net`: the forwarder of a sandbox with a network of its own
//! ([`agentry_runner::network::forwarder`]), as a program of its own for the runner's tests.
//! The service runs the same code as `agentry sandbox-net`.

fn main() -> std::process::ExitCode {
    let code = agentry_runner::network::forwarder_main(std::env::args_os().skip(1).collect());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
