//! Whether a test suite runs its agents in the sandbox.

/// The tests' answer to `works` (whether the agents' sandbox works on this machine, as
/// `agentry_runner::sandbox::works_here()` says): `true` where it works; where it does not,
/// `false` with a note on stderr, so that the suite still passes on a machine with only the
/// Rust toolchain (agents then run unsandboxed and the sandbox's own tests return early).
/// With `AGENTRY_TEST_REQUIRE_SANDBOX=1` (CI sets it) a sandbox that does not work fails the
/// test instead, so the sandboxed variant is never skipped silently.
///
/// # Panics
///
/// When the sandbox does not work and `AGENTRY_TEST_REQUIRE_SANDBOX=1`.
pub fn sandboxed(works: Result<(), String>) -> bool {
    match works {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("AGENTRY_TEST_REQUIRE_SANDBOX").as_deref() != Ok("1"),
                "AGENTRY_TEST_REQUIRE_SANDBOX=1 but the agents' sandbox does not work here: {why}"
            );
            eprintln!("note: agents run unsandboxed in this test: {why}");
            false
        }
    }
}
