//! The Kubernetes runner's settings (`AGENTRY_RUNNER=kubernetes`, docs/kubernetes.md).

use std::net::SocketAddr;
use std::time::Duration;

pub use agentry_runner::kube::KubeSettings;

use super::{ConfigError, choice, whole_number};

/// Which runner executes agent runs (`AGENTRY_RUNNER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerKind {
    /// Local processes in bubblewrap sandboxes (the default).
    Local,
    /// Kubernetes Jobs.
    Kubernetes(Box<KubeSettings>),
}

/// A Kubernetes quantity as the API takes it (`2`, `500m`, `4Gi`, `1.5`): digits, at most one
/// point, and an optional suffix.
fn quantity(name: &'static str, value: String) -> Result<String, ConfigError> {
    let value = value.trim().to_owned();
    let digits_end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(digits_end);
    let valid_number = !number.is_empty()
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let suffixes = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    if valid_number && suffixes.contains(&suffix) {
        Ok(value)
    } else {
        Err(ConfigError {
            name,
            message: format!(
                "{value:?}; expected a Kubernetes quantity such as 2, 500m, 4Gi or 512Mi"
            ),
        })
    }
}

impl RunnerKind {
    /// Reads `AGENTRY_RUNNER` and, for `kubernetes`, the `AGENTRY_KUBE_*` variables and
    /// `AGENTRY_AGENT_IMAGE` through `get` (blank values count as unset).
    ///
    /// # Errors
    ///
    /// The first variable that is wrong, and why.
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<RunnerKind, ConfigError> {
        let kube = choice(
            get,
            "AGENTRY_RUNNER",
            &[("local", false), ("kubernetes", true)],
            "; expected local or kubernetes",
        )?;
        if !kube {
            return Ok(RunnerKind::Local);
        }
        let required = |name: &'static str, what: &str| {
            get(name).ok_or_else(|| ConfigError {
                name,
                message: format!("is required with AGENTRY_RUNNER=kubernetes: {what}"),
            })
        };
        let image = required("AGENTRY_AGENT_IMAGE", "the agent image the Jobs run")?;
        let endpoint = required(
            "AGENTRY_KUBE_ENDPOINT",
            "the host:port agent pods dial to reach this replica",
        )?;
        let valid = match endpoint.rsplit_once(':') {
            Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
            None => !endpoint.is_empty(),
        };
        if !valid || endpoint.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(ConfigError {
                name: "AGENTRY_KUBE_ENDPOINT",
                message: format!(
                    "{endpoint:?}; expected host:port, or a host alone for the port agentry \
                     listens on"
                ),
            });
        }
        let listen = match get("AGENTRY_KUBE_LISTEN") {
            None => SocketAddr::from(([0, 0, 0, 0], 4812)),
            Some(text) => text.trim().parse().map_err(|_| ConfigError {
                name: "AGENTRY_KUBE_LISTEN",
                message: format!("{text:?}; expected an address and port such as 0.0.0.0:4812"),
            })?,
        };
        let pod_command = get("AGENTRY_KUBE_POD_COMMAND")
            .map(|text| text.split_whitespace().map(str::to_owned).collect());
        let cpu = quantity(
            "AGENTRY_KUBE_AGENT_CPU",
            get("AGENTRY_KUBE_AGENT_CPU").unwrap_or_else(|| "2".into()),
        )?;
        let memory = quantity(
            "AGENTRY_KUBE_AGENT_MEMORY",
            get("AGENTRY_KUBE_AGENT_MEMORY").unwrap_or_else(|| "4Gi".into()),
        )?;
        let work_size = quantity(
            "AGENTRY_KUBE_WORK_SIZE",
            get("AGENTRY_KUBE_WORK_SIZE").unwrap_or_else(|| "10Gi".into()),
        )?;
        let start_timeout = Duration::from_secs(whole_number(
            "AGENTRY_KUBE_START_TIMEOUT",
            get("AGENTRY_KUBE_START_TIMEOUT"),
            300,
            1..=86_400,
            "whole seconds",
        )?);
        let allow_api_reach = choice(
            get,
            "AGENTRY_KUBE_ALLOW_API_REACH",
            &[("0", false), ("1", true)],
            "; expected 0 or 1",
        )?;
        Ok(RunnerKind::Kubernetes(Box::new(KubeSettings {
            namespace: get("AGENTRY_KUBE_NAMESPACE").unwrap_or_else(|| "default".into()),
            image,
            pod_command,
            listen,
            endpoint,
            cpu: Some(cpu),
            memory: Some(memory),
            work_size,
            start_timeout,
            allow_api_reach,
            instance: get("AGENTRY_KUBE_INSTANCE").unwrap_or_else(|| "agentry".into()),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::pairs;

    #[test]
    fn local_is_the_default_and_kubernetes_needs_its_image_and_endpoint() {
        let read = |vars: &[(&str, &str)]| RunnerKind::from_lookup(&pairs(vars));
        assert_eq!(read(&[]).unwrap(), RunnerKind::Local);
        assert_eq!(
            read(&[("AGENTRY_RUNNER", "local")]).unwrap(),
            RunnerKind::Local
        );
        let e = read(&[("AGENTRY_RUNNER", "k8s")]).unwrap_err();
        assert_eq!(e.name, "AGENTRY_RUNNER");
        let e = read(&[("AGENTRY_RUNNER", "kubernetes")]).unwrap_err();
        assert_eq!(e.name, "AGENTRY_AGENT_IMAGE");
        let base = [
            ("AGENTRY_RUNNER", "kubernetes"),
            (
                "AGENTRY_AGENT_IMAGE",
                "registry.example/agentry-agent:0.1.0",
            ),
            ("AGENTRY_KUBE_ENDPOINT", "10.1.2.3:4812"),
        ];
        let RunnerKind::Kubernetes(settings) = read(&base).unwrap() else {
            panic!("expected kubernetes");
        };
        assert_eq!(settings.namespace, "default");
        assert_eq!(settings.listen.to_string(), "0.0.0.0:4812");
        assert_eq!(settings.memory.as_deref(), Some("4Gi"));
        assert_eq!(settings.start_timeout, Duration::from_secs(300));
        assert!(!settings.allow_api_reach);
        // Blanks around a word are ignored, as for every variable.
        let mut spaced = base.to_vec();
        spaced[0].1 = " kubernetes\n";
        spaced.push(("AGENTRY_KUBE_ALLOW_API_REACH", "1 "));
        let RunnerKind::Kubernetes(settings) = read(&spaced).unwrap() else {
            panic!("expected kubernetes");
        };
        assert!(settings.allow_api_reach);
        for (name, value) in [
            ("AGENTRY_KUBE_ENDPOINT", "10.1.2.3:http"),
            ("AGENTRY_KUBE_LISTEN", "anywhere"),
            ("AGENTRY_KUBE_AGENT_MEMORY", "4 GB"),
            ("AGENTRY_KUBE_AGENT_CPU", "two"),
            ("AGENTRY_KUBE_START_TIMEOUT", "0"),
            ("AGENTRY_KUBE_ALLOW_API_REACH", "yes"),
        ] {
            let mut vars = base.to_vec();
            vars.push((name, value));
            assert_eq!(read(&vars).unwrap_err().name, name, "{name}={value}");
        }
    }
}
