//! The network of sandboxed agents, as the service serves it (docs/security.md#network): for
//! each run, the model gateway ([`crate::gateway`]) and the egress proxy
//! ([`crate::egress`]) on the run's own Unix sockets, which the runner binds into the
//! sandbox ([`agentry_runner::network`]).

use std::path::Path;
use std::sync::Arc;

use agentry_domain::egress::EgressPattern;
use agentry_persistence::{Db, metering, repos};
use agentry_runner::network::{
    GATEWAY_SOCKET, Network, OpenFuture, PROXY_SOCKET, RunInfo, RunNetwork,
};
use uuid::Uuid;

use crate::egress::{self, EgressEvents, EgressPolicy};
use crate::gateway::{Gateway, SocketServer};

/// Serves the gateway and the egress proxy of every sandboxed run.
#[derive(Debug, Clone)]
pub struct AgentNetwork {
    gateway: Gateway,
    db: Db,
    /// `AGENTRY_EGRESS_ALLOW`: hosts every repository's agents may reach.
    instance_allow: Vec<EgressPattern>,
}

impl AgentNetwork {
    /// The network of `gateway`, with the instance's egress allow-list; refused connections
    /// are recorded in `db`.
    pub fn new(gateway: Gateway, db: Db, instance_allow: Vec<EgressPattern>) -> Self {
        AgentNetwork {
            gateway,
            db,
            instance_allow,
        }
    }

    /// The model gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    async fn open_run(&self, run: &RunInfo, dir: &Path) -> Result<RunNetwork, String> {
        let RepoNetwork {
            egress_allow,
            allow_provider_tools,
        } = self.repo_network(&run.repo_key).await?;
        let (key, meter, gate) = self
            .gateway
            .open_run(run, &dir.join(GATEWAY_SOCKET), allow_provider_tools)
            .await?;
        let mut allow = egress_allow;
        allow.extend(self.instance_allow.iter().cloned());
        let events = Arc::new(Refusals {
            db: self.db.clone(),
            task_id: run.task_id,
            attempt: run.attempt,
            repo_key: run.repo_key.clone(),
        });
        let proxy = SocketServer::start(&dir.join(PROXY_SOCKET), "the egress proxy socket", |l| {
            egress::serve(l, EgressPolicy::new(allow), events)
        })?;
        Ok(RunNetwork {
            key,
            meter,
            guard: Box::new((proxy, gate)),
        })
    }

    /// What the repository's settings allow its agents on the network.
    async fn repo_network(&self, repo_key: &str) -> Result<RepoNetwork, String> {
        let Ok(repo_id) = repo_key.parse::<Uuid>() else {
            return Ok(RepoNetwork::default());
        };
        let db = self.db.clone();
        let repo = tokio::task::spawn_blocking(move || {
            let mut conn = db.conn().map_err(|e| e.to_string())?;
            repos::get_repository(&mut conn, repo_id).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|e| format!("cannot read the repository's network settings: {e}"))?;
        Ok(RepoNetwork {
            egress_allow: repo.settings.egress_allow.clone(),
            allow_provider_tools: repo.settings.allow_provider_tools,
        })
    }
}

/// A repository's network settings, as a run of it gets them.
#[derive(Debug, Default)]
struct RepoNetwork {
    /// `egressAllow`.
    egress_allow: Vec<EgressPattern>,
    /// `allowProviderTools`.
    allow_provider_tools: bool,
}

impl Network for AgentNetwork {
    fn open<'a>(&'a self, run: &'a RunInfo, dir: &'a Path) -> OpenFuture<'a> {
        Box::pin(self.open_run(run, dir))
    }
}

/// Records the connections a run's egress proxy refused.
struct Refusals {
    db: Db,
    task_id: Uuid,
    attempt: i32,
    repo_key: String,
}

impl EgressEvents for Refusals {
    fn blocked(&self, host: &str, port: u16, why: &str) {
        tracing::warn!(
            task = %self.task_id,
            attempt = self.attempt,
            repo = %self.repo_key,
            host,
            port,
            why,
            "egress refused"
        );
        let db = self.db.clone();
        let (task_id, attempt, host) = (self.task_id, self.attempt, host.to_owned());
        let write = move || {
            let written = db.conn().map_err(|e| e.to_string()).and_then(|mut conn| {
                metering::record_blocked(
                    &mut conn,
                    task_id,
                    attempt,
                    &host,
                    port,
                    agentry_persistence::now(),
                )
                .map_err(|e| e.to_string())
            });
            if let Err(e) = written {
                tracing::error!(task = %task_id, error = %e, "could not record a refused connection");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(write);
            }
            Err(_) => write(),
        }
    }
}
