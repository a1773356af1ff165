//! agentry's HTTP API and command line.
//!
//! [`app::build_app`] assembles the actix-web application (routes, authentication, the error
//! envelope, metrics, CORS) over an [`state::AppState`]; [`server::serve`] runs it;
//! [`cli::main`] is the `agentry` binary. Handlers stay thin: they validate input, call
//! `agentry-persistence` on the blocking pool, and map results to the JSON shapes of [`dto`].

pub mod app;
pub mod auth;
pub mod body;
pub mod cli;
pub mod codehost;
pub mod config;
pub mod costs;
pub mod costs_table;
pub mod dto;
pub mod error;
pub mod import;
pub mod logging;
pub mod metrics;
pub mod query;
pub mod routes;
pub mod runs;
pub mod server;
pub mod state;
pub mod tracking;
