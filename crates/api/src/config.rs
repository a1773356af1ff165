//! The `agentry` binary's configuration (docs/contract.md#12-configuration): the service's
//! ([`agentry_service::config::Config`]) and what only the HTTP server uses (listen address,
//! CORS origins, log format, whether `/metrics` needs a token), read from the same
//! environment. A bad value is a [`ConfigError`] naming its variable, whichever part reads it.

use std::net::SocketAddr;

pub use agentry_service::config::ConfigError;
use agentry_service::config::choice;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// The configuration of `agentry serve` and the other commands: the service's and the HTTP
/// server's. Its `Debug` never shows a secret (the service's redacts them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The service's configuration.
    pub service: agentry_service::config::Config,
    /// `AGENTRY_BIND`: listen address.
    pub bind: SocketAddr,
    /// `AGENTRY_CORS_ORIGINS`: origins of the separately deployed frontend.
    pub cors_origins: Vec<String>,
    /// `AGENTRY_LOG_FORMAT`: `pretty` or `json`.
    pub log_format: LogFormat,
    /// `AGENTRY_METRICS_PUBLIC`: `1` serves `/metrics` without a token; `0` or unset
    /// (default) requires a valid API token of any role.
    pub metrics_public: bool,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads configuration through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let service = agentry_service::config::Config::from_lookup(&lookup)?;
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let bind = get("AGENTRY_BIND")
            .unwrap_or_else(|| "127.0.0.1:8080".into())
            .parse()
            .map_err(|e| ConfigError {
                name: "AGENTRY_BIND",
                message: format!("{e} (expected HOST:PORT)"),
            })?;
        let cors_origins = get("AGENTRY_CORS_ORIGINS")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|o| !o.is_empty())
                    .map(|o| {
                        let u = url::Url::parse(o).map_err(|e| ConfigError {
                            name: "AGENTRY_CORS_ORIGINS",
                            message: format!("{o:?}: {e}"),
                        })?;
                        if u.path() != "/"
                            || u.query().is_some()
                            || !matches!(u.scheme(), "http" | "https")
                        {
                            return Err(ConfigError {
                                name: "AGENTRY_CORS_ORIGINS",
                                message: format!(
                                    "{o:?} is not an origin like https://app.example.com"
                                ),
                            });
                        }
                        Ok(o.trim_end_matches('/').to_owned())
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        let log_format = choice(
            &get,
            "AGENTRY_LOG_FORMAT",
            &[("pretty", LogFormat::Pretty), ("json", LogFormat::Json)],
            "; expected pretty or json",
        )?;
        let metrics_public = choice(
            &get,
            "AGENTRY_METRICS_PUBLIC",
            &[("0", false), ("1", true)],
            " is neither 1 nor 0",
        )?;
        Ok(Config {
            service,
            bind,
            cors_origins,
            log_format,
            metrics_public,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_lookup(agentry_service::config::pairs(vars))
    }

    /// Checks that `name` set to `value` alone is refused, naming that variable.
    fn refused(name: &str, value: &str) {
        assert_eq!(cfg(&[(name, value)]).unwrap_err().name, name, "{value}");
    }

    #[test]
    fn http_defaults_run_on_a_fresh_machine() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.bind.to_string(), "127.0.0.1:8080");
        assert!(c.cors_origins.is_empty());
        assert_eq!(c.log_format, LogFormat::Pretty);
        assert_eq!(
            c.service,
            agentry_service::config::Config::from_lookup(|_| None).unwrap()
        );
    }

    #[test]
    fn bad_http_values_are_named() {
        refused("AGENTRY_BIND", "nope");
        refused("AGENTRY_LOG_FORMAT", "xml");
        let c = cfg(&[("AGENTRY_LOG_FORMAT", " json ")]).unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        refused("AGENTRY_CORS_ORIGINS", "https://a.example/path");
        let c = cfg(&[(
            "AGENTRY_CORS_ORIGINS",
            "https://a.example, http://localhost:5173/",
        )])
        .unwrap();
        assert_eq!(
            c.cors_origins,
            ["https://a.example", "http://localhost:5173"]
        );
        // The service's variables are read too, and named the same way.
        refused("AGENTRY_DATABASE_URL", "mysql://x");
    }

    #[test]
    fn metrics_need_a_token_unless_made_public() {
        assert!(!cfg(&[]).unwrap().metrics_public);
        for (value, public) in [("0", false), ("1", true)] {
            let c = cfg(&[("AGENTRY_METRICS_PUBLIC", value)]).unwrap();
            assert_eq!(c.metrics_public, public, "{value}");
        }
        for bad in ["true", "yes", "2", "on"] {
            refused("AGENTRY_METRICS_PUBLIC", bad);
        }
    }
}
