//! Rebuild when a migration is added, so `embed_migrations!` picks it up.
//!
//! Also marks the PostgreSQL variants of `backend_tests!` `#[ignore]` when no server is
//! configured (see `crates/testkit/build/postgres_cfg.rs`).
include!("../testkit/build/postgres_cfg.rs");

fn main() {
    declare_postgres_cfg();
    println!("cargo:rerun-if-changed=../../migrations");
}
