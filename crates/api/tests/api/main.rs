//! Every integration test of this crate, in one test binary (one link step instead of
//! 7); each module is one area, named as its file.

mod alerts;
mod budget;
mod codehost;
mod common;
mod costs;
mod hardening;
mod http;
mod me;
// Before `revisions`, which uses its `app!`.
#[macro_use]
mod runs;
mod revisions;
mod tracking;
