//! The `agentry` binary's configuration (docs/contract.md#12-configuration): the service's
//! ([`agentry_service::config::Config`]) and what only the HTTP server uses (listen address,
//! CORS origins, log format, whether `/metrics` needs a token), read from the same
//! environment. A bad value is a [`ConfigError`] naming its variable, whichever part reads it.

use std::net::SocketAddr;

pub use agentry_service::config::ConfigError;

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
        let log_format = match get("AGENTRY_LOG_FORMAT").as_deref() {
            None | Some("pretty") => LogFormat::Pretty,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError {
                    name: "AGENTRY_LOG_FORMAT",
                    message: format!("{other:?}; expected pretty or json"),
                });
            }
        };
        let metrics_public = match get("AGENTRY_METRICS_PUBLIC").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(ConfigError {
                    name: "AGENTRY_METRICS_PUBLIC",
                    message: format!("{other:?} is neither 1 nor 0"),
                });
            }
        };
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
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
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
        assert_eq!(
            cfg(&[("AGENTRY_BIND", "nope")]).unwrap_err().name,
            "AGENTRY_BIND"
        );
        assert_eq!(
            cfg(&[("AGENTRY_LOG_FORMAT", "xml")]).unwrap_err().name,
            "AGENTRY_LOG_FORMAT"
        );
        assert_eq!(
            cfg(&[("AGENTRY_CORS_ORIGINS", "https://a.example/path")])
                .unwrap_err()
                .name,
            "AGENTRY_CORS_ORIGINS"
        );
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
        assert_eq!(
            cfg(&[("AGENTRY_DATABASE_URL", "mysql://x")])
                .unwrap_err()
                .name,
            "AGENTRY_DATABASE_URL"
        );
    }

    #[test]
    fn metrics_need_a_token_unless_made_public() {
        assert!(!cfg(&[]).unwrap().metrics_public);
        assert!(
            !cfg(&[("AGENTRY_METRICS_PUBLIC", "0")])
                .unwrap()
                .metrics_public
        );
        assert!(
            cfg(&[("AGENTRY_METRICS_PUBLIC", "1")])
                .unwrap()
                .metrics_public
        );
        for bad in ["true", "yes", "2", "on"] {
            let e = cfg(&[("AGENTRY_METRICS_PUBLIC", bad)]).unwrap_err();
            assert_eq!(e.name, "AGENTRY_METRICS_PUBLIC", "{bad}");
        }
    }
}
