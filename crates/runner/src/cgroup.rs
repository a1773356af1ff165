//! A control group per sandboxed run, where one can be created (docs/security.md#resource-limits).
//!
//! The rlimits of [`crate::AgentLimits`] bound each process of the sandbox; a control group
//! bounds the sandbox as a whole: all its memory (`AGENTRY_AGENT_TOTAL_MEMORY_BYTES`, page
//! cache of the files it writes included) and its processes and threads
//! (`AGENTRY_AGENT_MAX_PROCESSES` again, counted by the kernel for the group whatever the
//! user). Past the memory limit the kernel's OOM killer ends a process of the group, never
//! one of the service.
//!
//! The group is made under the service's own: with cgroup v2, `<its group>/agentry-<run>`
//! when its parent delegates the `memory` and `pids` controllers; with cgroup v1, one
//! directory per controller (`/sys/fs/cgroup/memory/<its group>/agentry-<run>`, the same
//! under `pids`). Where neither can be made (not root, no delegation, a read-only
//! `/sys/fs/cgroup`), runs go on with their rlimits alone and the log says so once.
//!
//! A sandbox enters its group before it runs anything: `bwrap --block-fd` holds the
//! sandbox's first process after its setup until the runner has moved `bwrap` and that
//! process into the group ([`RunCgroup::attach_tree`]); everything they start is then in it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup file system.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long the runner waits for `bwrap`'s first child to appear before it gives up on the
/// group (the sandbox then runs with its rlimits alone).
const CHILD_WAIT: Duration = Duration::from_secs(5);

/// The control group of one run; removed when dropped (once its processes are gone).
#[derive(Debug)]
pub struct RunCgroup {
    /// Its directory per hierarchy: one with cgroup v2, the `memory` and `pids` ones with
    /// v1.
    dirs: Vec<PathBuf>,
    /// The cgroup version.
    v2: bool,
}

impl RunCgroup {
    /// Makes the group `agentry-<name>` with `memory_bytes` of memory (0: no limit) and
    /// `pids` processes and threads (0: no limit), or says why it cannot be made here.
    ///
    /// # Errors
    ///
    /// A sentence saying why no group can be made (not an error of the run: it goes on
    /// without one).
    pub fn create(name: &str, memory_bytes: u64, pids: u64) -> Result<RunCgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let leaf = format!("agentry-{name}");
        let unified = own.lines().find_map(|l| l.strip_prefix("0::"));
        let v1 = |controller: &str| {
            own.lines().find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then(|| under(&Path::new(CGROUP_ROOT).join(controller), path))
            })
        };
        let (dirs, v2) = match (v1("memory"), v1("pids")) {
            (Some(memory), Some(pids)) => (vec![memory.join(&leaf), pids.join(&leaf)], false),
            _ => match unified {
                Some(path) => (vec![under(Path::new(CGROUP_ROOT), path).join(&leaf)], true),
                None => return Err("no cgroup hierarchy holds this process".to_owned()),
            },
        };
        // Made one by one; those made so far are removed (by the drop) if one fails.
        let mut group = RunCgroup {
            dirs: Vec::new(),
            v2,
        };
        for dir in dirs {
            if let Err(e) = std::fs::create_dir(&dir)
                && e.kind() != std::io::ErrorKind::AlreadyExists
            {
                return Err(format!("cannot create {}: {e}", dir.display()));
            }
            group.dirs.push(dir);
        }
        let memory = match memory_bytes {
            0 => "max".to_owned(),
            n => n.to_string(),
        };
        let pids = match pids {
            0 => "max".to_owned(),
            n => n.to_string(),
        };
        let writes: Vec<(PathBuf, &str)> = if v2 {
            vec![
                (group.dirs[0].join("memory.max"), memory.as_str()),
                (group.dirs[0].join("memory.swap.max"), "0"),
                (group.dirs[0].join("pids.max"), pids.as_str()),
            ]
        } else {
            let v1_memory = if memory_bytes == 0 {
                "-1"
            } else {
                memory.as_str()
            };
            vec![
                (group.dirs[0].join("memory.limit_in_bytes"), v1_memory),
                (group.dirs[1].join("pids.max"), pids.as_str()),
            ]
        };
        for (file, value) in writes {
            // Without swap accounting there is no `memory.swap.max`: nothing to turn off.
            if file.ends_with("memory.swap.max") && !file.exists() {
                continue;
            }
            std::fs::write(&file, value)
                .map_err(|e| format!("cannot write {value} to {}: {e}", file.display()))?;
        }
        Ok(group)
    }

    /// Moves `pid` and its children (`bwrap` and the sandbox's first process, held by
    /// `--block-fd`) into the group, waiting up to 5 s for a child to appear.
    ///
    /// # Errors
    ///
    /// A process that cannot be moved, or no child in time.
    pub fn attach_tree(&self, pid: u32) -> Result<(), String> {
        let children = format!("/proc/{pid}/task/{pid}/children");
        let deadline = Instant::now() + CHILD_WAIT;
        let child = loop {
            let listed = std::fs::read_to_string(&children)
                .map_err(|e| format!("cannot read {children}: {e}"))?;
            if let Some(child) = listed.split_whitespace().next() {
                break child.to_owned();
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the sandbox's first process did not appear within {} s",
                    CHILD_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        for dir in &self.dirs {
            for moved in [pid.to_string(), child.clone()] {
                let procs = dir.join("cgroup.procs");
                std::fs::write(&procs, &moved)
                    .map_err(|e| format!("cannot move {moved} into {}: {e}", procs.display()))?;
            }
        }
        Ok(())
    }

    /// How many times the kernel's OOM killer ended a process of the group.
    pub fn oom_kills(&self) -> u64 {
        oom_kills_in(&self.dirs[0], self.v2).unwrap_or(0)
    }

    /// The group's directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // The sandbox's processes are gone once `bwrap` is (its PID namespace ends
            // with it); the kernel may take a moment to let go of the group.
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}

/// The OOM kills counted in the memory cgroup directory `dir` (`memory.events` on cgroup v2,
/// `memory.oom_control` on v1), if it says.
fn oom_kills_in(dir: &Path, v2: bool) -> Option<u64> {
    let file = dir.join(if v2 {
        "memory.events"
    } else {
        "memory.oom_control"
    });
    std::fs::read_to_string(file).ok().and_then(|text| {
        text.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == "oom_kill").then(|| value.trim().parse().ok())?
        })
    })
}

/// How many times the kernel's OOM killer ended a process of this process's own memory
/// cgroup (a container's, read from `/proc/self/cgroup`), if it can be read: what
/// `agentry pod-run` reads around its agent.
pub fn own_oom_kills() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    groups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.is_empty() {
            oom_kills_in(&under(Path::new("/sys/fs/cgroup"), path), true)
        } else if controllers.split(',').any(|c| c == "memory") {
            oom_kills_in(&under(Path::new("/sys/fs/cgroup/memory"), path), false)
        } else {
            None
        }
    })
}

/// `root` joined with the absolute cgroup path `path`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}
