//! agentry's HTTP API and command line.
//!
//! [`app::build_app`] assembles the actix-web application (routes, authentication, the error
//! envelope, metrics, CORS) over an [`state::AppState`]; [`server::serve`] runs it;
//! [`cli::main`] is the `agentry` binary. Handlers stay thin: they check the caller and the
//! request's shape, call a use case or a read view of `agentry-service`, and map results to
//! the JSON shapes of [`dto`] and errors to the envelope of [`error`].
//!
//! The configuration is [`config::Config`]: `agentry-service`'s and the HTTP server's own.

pub mod app;
pub mod auth;
pub mod body;
pub mod cli;
pub mod config;
pub mod costs_table;
pub mod dto;
pub mod error;
pub mod logging;
pub mod metrics;
pub mod query;
pub mod routes;
pub mod server;
pub mod state;
