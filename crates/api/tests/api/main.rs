//! Every integration test of this crate, in one test binary (one link step instead of
//! 6); each module is one area, named as its file.

mod codehost;
mod common;
mod costs;
mod hardening;
mod http;
mod runs;
mod tracking;
