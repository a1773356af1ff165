//! Marks the binary's PostgreSQL-only tests `#[ignore]` when no server is configured (see
//! `crates/testkit/build/postgres_cfg.rs`).
include!("crates/testkit/build/postgres_cfg.rs");

fn main() {
    declare_postgres_cfg();
}
