// The one build-script step that every crate with PostgreSQL test variants shares; each
// such `build.rs` takes it in with `include!` and calls it from its `main`.

/// Tells the crate's tests whether a PostgreSQL server is configured: without
/// `AGENTRY_TEST_PG_URL` (and without `AGENTRY_TEST_REQUIRE_PG=1`, which makes a missing
/// server a failure) the cfg `agentry_pg_skipped` is set, and the PostgreSQL variants are
/// marked `#[ignore]`, so `cargo test` counts them as ignored instead of passing them
/// silently.
fn declare_postgres_cfg() {
    println!("cargo::rustc-check-cfg=cfg(agentry_pg_skipped)");
    println!("cargo:rerun-if-env-changed=AGENTRY_TEST_PG_URL");
    println!("cargo:rerun-if-env-changed=AGENTRY_TEST_REQUIRE_PG");
    let configured = std::env::var("AGENTRY_TEST_PG_URL").is_ok_and(|url| !url.is_empty());
    let required = std::env::var("AGENTRY_TEST_REQUIRE_PG").is_ok_and(|v| v == "1");
    if !configured && !required {
        println!("cargo:rustc-cfg=agentry_pg_skipped");
    }
}
