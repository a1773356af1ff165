//! Every integration test of this crate, in one test binary (one link step instead of
//! 2); each module is one area, named as its file.

mod client;
mod webhook;
