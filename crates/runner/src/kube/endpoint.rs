//! The pod endpoint: the TCP port of a replica that its agents' pods dial
//! (`AGENTRY_KUBE_LISTEN`, reached as `AGENTRY_KUBE_ENDPOINT`).
//!
//! Every connection opens with a hello naming a channel and the run's key
//! ([`crate::pod::read_hello`]); the key picks the run among those this replica has in
//! progress ([`Endpoint::register`]), and nothing is served for any other:
//!
//! - `gateway`, `proxy`: the connection is joined to the run's model gateway or egress proxy
//!   socket, the same ones a local sandbox reaches ([`crate::network`]);
//! - `launch`: the run's launch (its command line and environment) and its prepared files,
//!   once;
//! - `control`: the run's control connection (the agent's output and result come in, the stop
//!   goes out), once; the runner takes it over;
//! - `history`: a git bundle of the history of the run's commit, once.
//!
//! `launch`, `history` and `control` are taken by `pod-run` before the agent starts, so an agent that
//! dials the endpoint itself with its key cannot take them; the gateway and the proxy it may
//! reach either way.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::oneshot;

use crate::network::{GATEWAY_SOCKET, PROXY_SOCKET};
use crate::pod::{self, Channel, Launch};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the endpoint waits before accepting again after an accept failed.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The most connections from one address (a pod) that have not said hello yet; more are
/// closed as they come. A pod-run opens a few at once (launch, history, control, then the
/// agent's gateway and proxy connections one by one).
const MAX_PENDING_PER_PEER: usize = 16;

/// The most connections, from every address, that have not said hello yet. Each holds a
/// file descriptor for up to [`HELLO_TIMEOUT`]: without a bound, an agent that dials the
/// endpoint without end would use up the descriptors of the whole replica (its API
/// included).
const MAX_PENDING: usize = 1024;

/// The runs a replica serves to pods.
#[derive(Debug, Default)]
pub struct Endpoint {
    runs: Mutex<HashMap<[u8; 32], Arc<Registered>>>,
    /// The connections waiting for their hello, by peer address.
    pending: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection counted among those waiting for their hello, until dropped.
struct Pending<'a> {
    endpoint: &'a Endpoint,
    peer: IpAddr,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut pending = self.endpoint.pending.lock();
        if let Some(n) = pending.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.peer);
            }
        }
    }
}

#[derive(Debug)]
struct Registered {
    /// The run's network directory, holding its gateway and proxy sockets.
    net_dir: PathBuf,
    /// The launch and the directory of its files, until `pod-run` takes them.
    launch: Mutex<Option<(Launch, PathBuf)>>,
    /// Where the control connection goes, until it came.
    control: Mutex<Option<oneshot::Sender<TcpStream>>>,
    /// The bundle of the run's history, until `pod-run` took it.
    history: Mutex<Option<PathBuf>>,
}

/// A run served to its pod as long as this value lives.
#[derive(Debug)]
pub struct Registration {
    endpoint: Arc<Endpoint>,
    id: [u8; 32],
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.endpoint.runs.lock().remove(&self.id);
    }
}

/// Connects to the Unix socket at `path`. A socket address holds at most 108 bytes of path,
/// so a longer one (a deep data directory) is reached through `/proc/self/fd/N/`, N being its
/// directory opened for the call (as the gateway binds it).
async fn connect_unix(path: &std::path::Path) -> std::io::Result<UnixStream> {
    use std::os::fd::AsRawFd;
    const MAX_SOCKET_PATH: usize = 100;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return UnixStream::connect(path).await;
    };
    if path.as_os_str().len() <= MAX_SOCKET_PATH {
        return UnixStream::connect(path).await;
    }
    let dir = std::fs::File::open(dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let stream = UnixStream::connect(&short).await;
    drop(dir);
    stream
}

fn key_id(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Endpoint {
    /// Serves the run of `key` until the returned registration is dropped: its network in
    /// `net_dir`, its `launch` with the files of `files`, the bundle `history` of its
    /// commit; the receiver gets its control connection.
    pub fn register(
        self: &Arc<Self>,
        key: &str,
        net_dir: PathBuf,
        launch: Launch,
        files: PathBuf,
        history: Option<PathBuf>,
    ) -> (Registration, oneshot::Receiver<TcpStream>) {
        let (control, receiver) = oneshot::channel();
        let id = key_id(key);
        let registered = Registered {
            net_dir,
            launch: Mutex::new(Some((launch, files))),
            control: Mutex::new(Some(control)),
            history: Mutex::new(history),
        };
        self.runs.lock().insert(id, Arc::new(registered));
        let registration = Registration {
            endpoint: Arc::clone(self),
            id,
        };
        (registration, receiver)
    }

    /// Accepts pods' connections on `listener` for as long as the process runs.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    if let Err(e) = pod::detect_dead_peer(&stream) {
                        tracing::warn!(%peer, error = %e, "cannot set keepalive on a pod connection");
                    }
                    if !self.admit(peer.ip()) {
                        tracing::debug!(%peer, "too many pod connections waiting for their hello; closing one");
                        drop(stream);
                        continue;
                    }
                    let endpoint = Arc::clone(&self);
                    tokio::spawn(async move {
                        let pending = Pending {
                            endpoint: &endpoint,
                            peer: peer.ip(),
                        };
                        if let Err(e) = endpoint.handle(stream, pending).await {
                            tracing::debug!(%peer, error = %e, "a pod connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the pod endpoint could not accept a connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    }

    /// Counts a new connection from `peer` among those waiting for their hello, unless
    /// that peer or all have their most ([`MAX_PENDING_PER_PEER`], [`MAX_PENDING`]).
    fn admit(&self, peer: IpAddr) -> bool {
        let mut pending = self.pending.lock();
        let total: usize = pending.values().sum();
        let own = pending.get(&peer).copied().unwrap_or(0);
        if own >= MAX_PENDING_PER_PEER || total >= MAX_PENDING {
            return false;
        }
        // Counted only when admitted: a refused peer leaves no entry.
        *pending.entry(peer).or_insert(0) += 1;
        true
    }

    async fn handle(&self, mut stream: TcpStream, pending: Pending<'_>) -> std::io::Result<()> {
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, pod::read_hello(&mut stream)).await {
            Ok(Ok(hello)) => hello,
            Ok(Err(e)) => {
                let _ = pod::answer(&mut stream, Err(&e.to_string())).await;
                return Err(e);
            }
            Err(_) => {
                let _ = pod::answer(&mut stream, Err("no hello in time")).await;
                return Ok(());
            }
        };
        drop(pending);
        let run = self.runs.lock().get(&key_id(&hello.key)).cloned();
        let Some(run) = run else {
            return pod::answer(&mut stream, Err("no run in progress here has this key")).await;
        };
        match hello.channel {
            Channel::Gateway | Channel::Proxy => {
                let socket = run.net_dir.join(match hello.channel {
                    Channel::Gateway => GATEWAY_SOCKET,
                    _ => PROXY_SOCKET,
                });
                let mut upstream = match connect_unix(&socket).await {
                    Ok(upstream) => upstream,
                    Err(e) => {
                        let why = format!("the run's network is closed: {e}");
                        return pod::answer(&mut stream, Err(&why)).await;
                    }
                };
                pod::answer(&mut stream, Ok(())).await?;
                tokio::io::copy_bidirectional(&mut stream, &mut upstream)
                    .await
                    .map(drop)
            }
            Channel::Launch => {
                let taken = run.launch.lock().take();
                let Some((launch, files)) = taken else {
                    return pod::answer(&mut stream, Err("the run's launch was already taken"))
                        .await;
                };
                pod::answer(&mut stream, Ok(())).await?;
                pod::send_launch(stream, &launch, &files).await
            }
            Channel::History => {
                let taken = run.history.lock().take();
                let Some(bundle) = taken else {
                    return pod::answer(&mut stream, Err("the run has no history to send")).await;
                };
                let mut file = tokio::fs::File::open(&bundle).await?;
                pod::answer(&mut stream, Ok(())).await?;
                tokio::io::copy(&mut file, &mut stream).await?;
                tokio::io::AsyncWriteExt::shutdown(&mut stream).await
            }
            Channel::Control => {
                let taken = run.control.lock().take();
                let Some(control) = taken else {
                    return pod::answer(&mut stream, Err("the run already has its control")).await;
                };
                pod::answer(&mut stream, Ok(())).await?;
                // The runner gave up on the run if it is not listening any more.
                let _ = control.send(stream);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whether the endpoint closed `stream` (it reads the end at once) rather than waiting
    /// for its hello.
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_millis(300), stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// A peer refused because all are full leaves nothing counted; one admitted is counted
    /// until its guard is dropped.
    #[test]
    fn only_admitted_connections_are_counted() {
        let endpoint = Endpoint::default();
        let (full, other): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        endpoint.pending.lock().insert(full, MAX_PENDING);
        assert!(!endpoint.admit(other));
        assert!(!endpoint.pending.lock().contains_key(&other));
        endpoint.pending.lock().insert(full, MAX_PENDING - 1);
        assert!(endpoint.admit(other));
        assert!(!endpoint.admit([10, 0, 0, 3].into()));
        drop(Pending {
            endpoint: &endpoint,
            peer: other,
        });
        assert!(!endpoint.pending.lock().contains_key(&other));
    }

    /// Connections that say nothing are held at most 16 from one address: the 17th is
    /// closed at once; once one of the 16 said its hello, another is taken again.
    #[tokio::test]
    async fn silent_connections_from_one_pod_are_bounded() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let endpoint = Arc::new(Endpoint::default());
        tokio::spawn(Arc::clone(&endpoint).serve(listener));
        let mut silent = Vec::new();
        for _ in 0..MAX_PENDING_PER_PEER {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        // The endpoint counts them as it accepts them, in order.
        let mut extra = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed(&mut extra).await,
            "the 17th silent connection was kept"
        );
        for stream in &mut silent[1..] {
            assert!(
                !closed(stream).await,
                "a silent connection within the bound was closed"
            );
        }
        // A hello (here for no run) ends one's wait; then a new connection is kept.
        let first = &mut silent[0];
        first
            .write_all(format!("{} gateway nokey\n", pod::PROTOCOL).as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        first.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("ERR no run in progress"), "{answer}");
        let mut next = TcpStream::connect(addr).await.unwrap();
        assert!(
            !closed(&mut next).await,
            "a connection within the bound was closed"
        );
        assert_eq!(
            endpoint.pending.lock().values().sum::<usize>(),
            MAX_PENDING_PER_PEER
        );
    }
}
