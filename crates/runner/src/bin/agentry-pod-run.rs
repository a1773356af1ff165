//! `agentry-pod-run`: the main program of an agent's pod ([`agentry_runner::pod`]), as a
//! program of its own for the runner's tests. The agent image runs the same code as
//! `agentry pod-run`.

fn main() -> std::process::ExitCode {
    let code = agentry_runner::pod::pod_run_main();
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
