//! The two `agentry serve` replicas (started, killed with SIGKILL, restarted on the same data
//! directory and port) and an API client that fails over to the other replica.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::Value;

/// Unix time in milliseconds (the fake agent's `date +%s%3N` clock).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One replica: its name (the data directory's), port and process.
#[derive(Debug)]
struct Replica {
    name: String,
    port: u16,
    child: Option<Child>,
    starts: u32,
}

/// A kill -9 the chaos did.
#[derive(Debug, Clone)]
pub struct Kill {
    /// The replica's name.
    pub replica: String,
    /// When (unix ms).
    pub at_ms: u64,
    /// The runs (task id, attempt) whose output log held the agent's result when the
    /// replica died: their cost was on the replica's disk, so it must not be lost.
    pub results_on_disk: BTreeSet<(String, i64)>,
}

/// The runs under `data_dir/runs/<task>/<attempt>/` whose `output.log` holds a `result`
/// event. Read after the replica died, so nothing writes them any more.
fn results_on_disk(data_dir: &Path) -> BTreeSet<(String, i64)> {
    let mut out = BTreeSet::new();
    let Ok(tasks) = std::fs::read_dir(data_dir.join("runs")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(attempts) = std::fs::read_dir(task.path()) else {
            continue;
        };
        for attempt in attempts.flatten() {
            let Ok(n) = attempt.file_name().to_string_lossy().parse::<i64>() else {
                continue;
            };
            let log =
                std::fs::read_to_string(attempt.path().join("output.log")).unwrap_or_default();
            if log.contains("\"type\":\"result\"") {
                out.insert((task.file_name().to_string_lossy().into_owned(), n));
            }
        }
    }
    out
}

/// The replicas and how to start them.
#[derive(Debug)]
pub struct Cluster {
    binary: PathBuf,
    work: PathBuf,
    env: Vec<(String, String)>,
    replicas: Mutex<Vec<Replica>>,
    kills: Mutex<Vec<Kill>>,
}

/// A free port on 127.0.0.1 (bound, then released for the replica to take).
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

impl Cluster {
    /// Replicas `names` (each a data directory `work/<name>` and a free port) running
    /// `binary` with `env` besides their own `AGENTRY_DATA_DIR` and `AGENTRY_BIND`.
    pub fn new(
        binary: &Path,
        work: &Path,
        names: &[&str],
        env: Vec<(String, String)>,
    ) -> Result<Cluster, String> {
        let mut replicas = Vec::new();
        for name in names {
            replicas.push(Replica {
                name: (*name).to_owned(),
                port: free_port()?,
                child: None,
                starts: 0,
            });
        }
        Ok(Cluster {
            binary: binary.to_owned(),
            work: work.to_owned(),
            env,
            replicas: Mutex::new(replicas),
            kills: Mutex::new(Vec::new()),
        })
    }

    /// How many replicas there are.
    pub fn len(&self) -> usize {
        self.replicas.lock().len()
    }

    /// The data directory of replica `i`.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.work.join(&self.replicas.lock()[i].name)
    }

    /// The name of replica `i`.
    pub fn name(&self, i: usize) -> String {
        self.replicas.lock()[i].name.clone()
    }

    /// The base URL of replica `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.replicas.lock()[i].port)
    }

    /// The kills so far.
    pub fn kills(&self) -> Vec<Kill> {
        self.kills.lock().clone()
    }

    /// Starts replica `i` (its output appended to `work/<name>.log`).
    pub fn start(&self, i: usize) -> Result<(), String> {
        let mut replicas = self.replicas.lock();
        let r = &mut replicas[i];
        let dir = self.work.join(&r.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log_path = self.work.join(format!("{}.log", r.name));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(&self.binary)
            .arg("serve")
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("AGENTRY_DATA_DIR", &dir)
            .env("AGENTRY_BIND", format!("127.0.0.1:{}", r.port))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.binary.display()))?;
        r.child = Some(child);
        r.starts += 1;
        Ok(())
    }

    /// SIGKILLs replica `i` and starts it again at once on the same data directory and port.
    pub fn kill_and_restart(&self, i: usize) -> Result<(), String> {
        {
            let mut replicas = self.replicas.lock();
            let r = &mut replicas[i];
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let at_ms = now_ms();
            self.kills.lock().push(Kill {
                replica: r.name.clone(),
                at_ms,
                results_on_disk: results_on_disk(&self.work.join(&r.name)),
            });
        }
        self.start(i)
    }

    /// Whether replica `i`'s process still runs (it may have exited on its own).
    pub fn alive(&self, i: usize) -> bool {
        let mut replicas = self.replicas.lock();
        match replicas[i].child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Stops every replica: SIGTERM (through `kill`), up to 30 s, then SIGKILL.
    pub fn stop_all(&self) {
        let mut replicas = self.replicas.lock();
        for r in replicas.iter_mut() {
            if let Some(child) = r.child.as_ref() {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for r in replicas.iter_mut() {
            if let Some(mut child) = r.child.take() {
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) | Err(_) => break,
                        Ok(None) if Instant::now() >= deadline => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                        Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for r in self.replicas.lock().iter_mut() {
            if let Some(mut child) = r.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// An answer of the API: status and JSON body (`Value::Null` when not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body as JSON.
    pub body: Value,
}

/// What [`Api::call`] does with a 5xx answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On5xx {
    /// Returns it.
    Return,
    /// Sends the request again, to the next replica, until `patience` has passed.
    Retry,
}

/// The API of the replicas, with failover: a request that cannot reach its replica (killed
/// and restarting) is sent to the next one, until `patience` has passed.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::blocking::Client,
    urls: Vec<String>,
    token: String,
    patience: Duration,
}

impl Api {
    /// A client of `urls` with the bearer `token`.
    pub fn new(urls: Vec<String>, token: &str) -> Result<Api, String> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Api {
            http,
            urls,
            token: token.to_owned(),
            patience: Duration::from_secs(120),
        })
    }

    /// Sends `method path` (with a JSON `body`) to replica `first`, then the others in turn
    /// while none answers; with [`On5xx::Retry`], also while the answer is a 5xx (a code
    /// host failing under the request, a database restarting), until `patience`. Any other
    /// answer is returned as it is.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        first: usize,
        on_5xx: On5xx,
    ) -> Result<Answer, String> {
        let method_ =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| format!("{method}: {e}"))?;
        let retry_5xx = on_5xx == On5xx::Retry;
        let resp = self.failover(first, &format!("{method} {path}"), retry_5xx, |base| {
            let mut req = self
                .http
                .request(method_.clone(), format!("{base}{path}"))
                .bearer_auth(&self.token);
            if let Some(body) = body {
                req = req.json(body);
            }
            req.send()
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// Sends `send(replica URL)` to replica `first`, then the others in turn while none
    /// answers (and, with `retry_5xx`, while the answer is a 5xx) until `patience` has
    /// passed: then the last answer, or the error naming `what`.
    fn failover(
        &self,
        first: usize,
        what: &str,
        retry_5xx: bool,
        send: impl Fn(&str) -> reqwest::Result<reqwest::blocking::Response>,
    ) -> Result<reqwest::blocking::Response, String> {
        let deadline = Instant::now() + self.patience;
        let mut i = first % self.urls.len();
        loop {
            match send(&self.urls[i]) {
                Ok(resp) if !retry_5xx || resp.status().as_u16() < 500 => return Ok(resp),
                Ok(resp) if Instant::now() >= deadline => return Ok(resp),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("{what}: no replica answered: {e}"));
                }
                _ => {
                    i = (i + 1) % self.urls.len();
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// Sends a raw signed webhook delivery to replica `first` (the others if it is down).
    pub fn webhook(
        &self,
        event: &str,
        delivery: &str,
        body: &[u8],
        signature: &str,
        first: usize,
    ) -> Result<u16, String> {
        let resp = self.failover(first, &format!("webhook {delivery}"), true, |base| {
            self.http
                .post(format!("{base}/api/webhooks/codehost"))
                .header("Content-Type", "application/json")
                .header("X-GitHub-Event", event)
                .header("X-GitHub-Delivery", delivery)
                .header("X-Hub-Signature-256", signature)
                .body(body.to_vec())
                .send()
        })?;
        Ok(resp.status().as_u16())
    }

    /// Waits until replica `i` answers `GET /readyz` with 200, or `within` passes.
    pub fn wait_ready(&self, i: usize, within: Duration) -> bool {
        let url = format!("{}/readyz", self.urls[i]);
        agentry_testkit::wait::poll(within, Duration::from_millis(100), || {
            self.http
                .get(&url)
                .send()
                .is_ok_and(|resp| resp.status().is_success())
        })
        .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_on_disk_are_the_runs_whose_log_holds_a_result() {
        let dir = std::env::temp_dir().join(format!("soak-results-{}", std::process::id()));
        let run = |task: &str, attempt: &str, log: &str| {
            let d = dir.join("runs").join(task).join(attempt);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("output.log"), log).unwrap();
        };
        run(
            "t1",
            "1",
            "{\"type\":\"system\"}\n{\"type\":\"result\",\"total_cost_usd\":0.1}\n",
        );
        run("t1", "2", "{\"type\":\"system\"}\n");
        run("t2", "1", "{\"type\":\"result\"}\n");
        std::fs::create_dir_all(dir.join("runs/t3/home")).unwrap();
        let found = results_on_disk(&dir);
        let want: BTreeSet<(String, i64)> = [("t1".to_owned(), 1), ("t2".to_owned(), 1)].into();
        assert_eq!(found, want);
        assert!(results_on_disk(&dir.join("nothing")).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
