//! A fake Kubernetes API server for agentry's tests (never shipped).
//!
//! It serves the Kubernetes API over plain HTTP on `127.0.0.1` (discovery, namespaces, pods,
//! secrets, config maps, `batch/v1` jobs, watches, patches, deletion with garbage collection,
//! self subject access reviews), runs a Job controller and a kubelet that runs each pod's
//! container under bubblewrap (its own PID, IPC, UTS and network namespaces, the network
//! through `slirp4netns`), and enforces the RBAC of a rendered Role when given one. Real
//! `kubectl` and kube-rs drive it. See the crate's README for what it does and does not do.
//!
//! [`FakeKube::start`] runs it in-process (a server thread and a small runtime for the
//! controllers); dropping the handle stops it and kills every container it started.
//! [`FakeKube::fail_next`] makes requests fail as an API server's sometimes do.

mod api;
mod controller;
mod fault;
mod kubelet;
mod proto;
pub mod rbac;
pub mod store;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::thread::JoinHandle;

pub use fault::Fault;
pub use rbac::Rbac;
pub use store::RequestRecord;
use store::Store;

/// How the fake is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen (loopback only; port 0 picks a free one).
    pub listen: SocketAddr,
    /// Where to write the kubeconfig (`None`: `kubeconfig` in the state directory).
    pub kubeconfig_out: Option<PathBuf>,
    /// Image name → the root file system its containers run on (`host` → `/`).
    pub images: BTreeMap<String, PathBuf>,
    /// Namespaces besides `default` and `kube-system`; the first is the kubeconfig's.
    pub namespaces: Vec<String>,
    /// The Role every request is checked against, if any.
    pub role: Option<Rbac>,
    /// Where pod logs, volumes and tokens go (`None`: a temporary directory).
    pub state_dir: Option<PathBuf>,
    /// How many watch events are kept for watches that resume from a version.
    pub watch_window: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kubeconfig_out: None,
            images: BTreeMap::new(),
            namespaces: Vec::new(),
            role: None,
            state_dir: None,
            watch_window: 1000,
        }
    }
}

impl Options {
    /// Maps image `name` to the root file system `rootfs`.
    #[must_use]
    pub fn image(mut self, name: &str, rootfs: impl Into<PathBuf>) -> Self {
        self.images.insert(name.to_owned(), rootfs.into());
        self
    }

    /// Adds a namespace.
    #[must_use]
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_owned());
        self
    }
}

/// What the server, the controllers and the kubelet share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    /// The faults still to happen ([`FakeKube::fail_next`]).
    pub faults: Mutex<fault::Faults>,
    pub images: BTreeMap<String, PathBuf>,
    pub role: Option<Rbac>,
    pub state_dir: PathBuf,
    pub token: String,
    pub addr: SocketAddr,
}

impl Shared {
    /// Locks the store.
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock()
    }
}

/// A running fake. See the [crate docs](crate).
#[derive(Debug)]
pub struct FakeKube {
    shared: Arc<Shared>,
    kubeconfig: PathBuf,
    server: Option<actix_web::dev::ServerHandle>,
    thread: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    _temp: Option<tempfile::TempDir>,
}

fn kubeconfig_text(addr: SocketAddr, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake-kube\n  cluster:\n    server: http://{addr}\nusers:\n- name: fake-kube\n  user:\n    token: {token}\ncontexts:\n- name: fake-kube\n  context:\n    cluster: fake-kube\n    user: fake-kube\n    namespace: {namespace}\ncurrent-context: fake-kube\n"
    )
}

impl FakeKube {
    /// Starts the fake.
    ///
    /// # Errors
    ///
    /// An address that is not loopback or cannot be bound, a state directory or kubeconfig
    /// that cannot be written, or a thread that cannot start.
    pub fn start(options: Options) -> std::io::Result<Self> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        if !options.listen.ip().is_loopback() {
            return Err(invalid(format!(
                "fake-kube listens on loopback only, not {}",
                options.listen
            )));
        }
        for name in &options.namespaces {
            if !api::valid_name(name, 63) {
                return Err(invalid(format!("{name:?} is not a valid namespace name")));
            }
        }
        let (temp, state_dir) = match &options.state_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                (None, dir.clone())
            }
            None => {
                let temp = tempfile::Builder::new().prefix("fake-kube-").tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        // Pods run as other users: they must reach their volumes under the state directory.
        set_mode(&state_dir, 0o755)?;
        let listener = std::net::TcpListener::bind(options.listen)?;
        let addr = listener.local_addr()?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut store = Store::new(options.watch_window);
        let ns =
            store::resource("", "namespaces").ok_or_else(|| invalid("no namespaces".into()))?;
        let mut names = vec!["default".to_owned(), "kube-system".to_owned()];
        for name in &options.namespaces {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        for name in &names {
            let object = api::default_namespace(name);
            store.insert(ns, "", object);
        }
        let namespace = options
            .namespaces
            .first()
            .cloned()
            .unwrap_or_else(|| "default".into());
        let kubeconfig = options
            .kubeconfig_out
            .clone()
            .unwrap_or_else(|| state_dir.join("kubeconfig"));
        std::fs::write(&kubeconfig, kubeconfig_text(addr, &token, &namespace))?;
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            faults: Mutex::new(fault::Faults::default()),
            images: options.images.clone(),
            role: options.role.clone(),
            state_dir,
            token,
            addr,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fake-kube-controllers")
            .enable_all()
            .build()?;
        runtime.spawn(controller::run(shared.clone()));
        runtime.spawn(kubelet::run(shared.clone()));
        let (tx, rx) = std::sync::mpsc::channel();
        let served = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fake-kube-server".into())
            .spawn(move || {
                let system = actix_web::rt::System::new();
                let started = tx.clone();
                let result = system.block_on(async move {
                    let data = actix_web::web::Data::new(served);
                    let server = actix_web::HttpServer::new(move || {
                        actix_web::App::new()
                            .app_data(data.clone())
                            .app_data(actix_web::web::PayloadConfig::new(4 << 20))
                            .default_service(actix_web::web::to(api::handle))
                    })
                    .workers(2)
                    .disable_signals()
                    .shutdown_timeout(1)
                    .listen(listener)?
                    .run();
                    let _ = started.send(Ok(server.handle()));
                    server.await
                });
                if let Err(e) = result {
                    let _ = tx.send(Err(e));
                }
            })?;
        let server = rx
            .recv()
            .map_err(|_| std::io::Error::other("the server thread ended at start"))??;
        Ok(Self {
            shared,
            kubeconfig,
            server: Some(server),
            thread: Some(thread),
            runtime: Some(runtime),
            _temp: temp,
        })
    }

    /// The address the API listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The kubeconfig written at start.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The bearer token the kubeconfig's user presents.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The state directory (pod logs and volumes).
    pub fn state_dir(&self) -> &Path {
        &self.shared.state_dir
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// Answers the next `n` requests matching `route` with `fault` (see [`Fault`]).
    /// `route` is `(method, resource)`: the method in any case, the resource as URLs and
    /// Roles name it (`secrets`, `jobs`, `pods/log`); `None` is any request. Faults come
    /// before authentication and RBAC; rules apply in the order they were added. Each
    /// faulted request is recorded with the status it answered and `faulted`.
    pub fn fail_next(&self, route: Option<(&str, &str)>, n: usize, fault: Fault) {
        self.shared.faults.lock().add(route, n, fault);
    }

    /// The stored object, if any (`resource` as in URLs: `pods`, `jobs`, `secrets`, …).
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let store = self.shared.lock();
        store
            .objects
            .iter()
            .find(|((r, ns, n), _)| *r == resource && ns == namespace && n == name)
            .map(|(_, v)| v.clone())
    }

    /// The stored objects of `resource` in `namespace`.
    pub fn objects(&self, resource: &str, namespace: &str) -> Vec<serde_json::Value> {
        let store = self.shared.lock();
        store
            .objects
            .iter()
            .filter(|((r, ns, _), _)| *r == resource && ns == namespace)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The current `resourceVersion`.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        // Dropping the runtime drops the kubelet's tasks: their children are killed on drop
        // (bwrap with --die-with-parent takes its sandbox along, slirp4netns is killed).
        if let Some(runtime) = self.runtime.take() {
            if let Some(server) = self.server.take() {
                runtime.block_on(server.stop(false));
            }
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
