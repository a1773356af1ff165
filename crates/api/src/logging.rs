//! Log output: human-readable or one JSON object per line, on stderr (stdout is kept for
//! what a command prints, such as a new token). The level comes from `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; a second call is a no-op.
pub fn init(format: LogFormat) {
    init_with_default(format, "info");
}

/// [`init`] with `default` as the filter when `RUST_LOG` is unset or invalid (`agentry
/// doctor` logs nothing unless asked: its report says it all).
pub fn init_with_default(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}
