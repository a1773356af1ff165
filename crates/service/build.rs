//! Marks this crate's PostgreSQL test variants `#[ignore]` when no server is configured (see
//! `crates/testkit/build/postgres_cfg.rs`).
include!("../testkit/build/postgres_cfg.rs");

fn main() {
    declare_postgres_cfg();
}
