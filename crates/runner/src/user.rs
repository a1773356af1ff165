//! Which user agents run as (docs/security.md#the-agents-user).
//!
//! A service run as its own user runs its agents as that user, inside the sandbox. A service
//! run as `root` never runs them as root on the host: they run as an unprivileged user
//! (`AGENTRY_AGENT_USER`, default `nobody`). The runner gives that user the run's worktree,
//! its git metadata entry, its `HOME` and its network directory before the agent starts,
//! starts `bwrap` as that user (which mounts the run's paths from descriptors the service
//! opened, so the user needs no access to the data directory), and takes the worktree back
//! before the git steps that follow. Where no such user can be had, agents are refused with
//! the reason, unless the operator allows root (`AGENTRY_ALLOW_ROOT=1`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The user agents run as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AgentUser {
    /// The service's own user (a service not run as root, or root with
    /// `AGENTRY_ALLOW_ROOT=1`).
    #[default]
    Service,
    /// Another user: the runner switches to it (the service runs as root).
    Switch(UserIds),
    /// Agents are refused, for this reason (a sentence naming the fix).
    Refused(String),
}

/// A user's name, id and primary group id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserIds {
    /// The name (or the number as given).
    pub name: String,
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
}

/// The user `AGENTRY_AGENT_USER` names when it is not set.
pub const DEFAULT_AGENT_USER: &str = "nobody";

impl AgentUser {
    /// The user agents run as, for a service of effective user id `service_uid`, with
    /// `configured` (`AGENTRY_AGENT_USER`: a user name or a numeric id, `None` when unset),
    /// `allow_root` (`AGENTRY_ALLOW_ROOT=1`) and `sandboxed` (whether agents run in the
    /// sandbox). The user is looked up in the system's user database.
    ///
    /// # Errors
    ///
    /// `AGENTRY_AGENT_USER` set while the service does not run as root (it cannot switch
    /// users): a sentence saying so. Every other problem refuses agents
    /// ([`AgentUser::Refused`]) rather than the service.
    pub fn resolve(
        service_uid: u32,
        configured: Option<&str>,
        allow_root: bool,
        sandboxed: bool,
    ) -> Result<AgentUser, String> {
        if service_uid != 0 {
            return match configured {
                Some(name) => Err(format!(
                    "AGENTRY_AGENT_USER={name:?} needs the service to run as root (only root \
                     can start agents as another user); unset it to run agents as the \
                     service's own user"
                )),
                None => Ok(AgentUser::Service),
            };
        }
        if allow_root {
            return Ok(AgentUser::Service);
        }
        if !sandboxed {
            return Ok(AgentUser::Refused(
                "the service runs as root and agents run unsandboxed \
                 (AGENTRY_AGENT_SANDBOX=off), so they would run as root on the host: run the \
                 service as a user of its own, turn the sandbox on (agents then run as \
                 AGENTRY_AGENT_USER), or set AGENTRY_ALLOW_ROOT=1"
                    .to_owned(),
            ));
        }
        let name = configured.unwrap_or(DEFAULT_AGENT_USER);
        Ok(match lookup(name) {
            Ok(ids) if ids.uid == 0 => AgentUser::Refused(format!(
                "AGENTRY_AGENT_USER={name:?} is root: agents never run as root on the host \
                 unless AGENTRY_ALLOW_ROOT=1"
            )),
            Ok(ids) => AgentUser::Switch(ids),
            Err(why) => AgentUser::Refused(format!(
                "the service runs as root and agents run as AGENTRY_AGENT_USER={name:?}, \
                 but {why}: create that user, name another one in AGENTRY_AGENT_USER, or \
                 set AGENTRY_ALLOW_ROOT=1 to run agents as root"
            )),
        })
    }

    /// The ids to switch to, if any.
    pub fn ids(&self) -> Option<&UserIds> {
        match self {
            AgentUser::Switch(ids) => Some(ids),
            _ => None,
        }
    }
}

/// The user `name` (or numeric id) of the system's user database.
fn lookup(name: &str) -> Result<UserIds, String> {
    use nix::unistd::{Uid, User};
    let found = match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(name),
    };
    match found {
        Ok(Some(user)) => Ok(UserIds {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }),
        Ok(None) => Err(format!("there is no user {name:?} on this machine")),
        Err(e) => Err(format!("the user {name:?} cannot be looked up: {e}")),
    }
}

/// The most entries [`chown_tree`] changes before it gives up (a worktree the agent filled
/// with more is refused anyway by the nested-repository walk's own bound).
const MAX_ENTRIES: u64 = 2_000_000;

/// The effective user id of this process, read from `/proc/self/status` (`None` where
/// there is no such file).
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Gives `root` and everything below it to `uid`:`gid`, without following a symbolic link
/// (`lchown`), so a link the agent made cannot hand a file elsewhere to anyone.
///
/// # Errors
///
/// An entry that cannot be read or changed, or more than two million entries.
pub fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), String> {
    walk_tree(root, uid, gid, false)
}

/// Gives `root` and everything below it to `uid`:`gid` as [`chown_tree`] does, and makes
/// it readable by that group and nobody else: directories `0750`, files `0640`, or `0750`
/// when their owner could run them (the one bit of the mode git records, so a commit is
/// the same). The worktree after the agent, for the git steps that run as the agents'
/// user, which is in no other way able to read a file the agent made private.
///
/// # Errors
///
/// An entry that cannot be read or changed, or more than two million entries.
pub fn share_tree(root: &Path, uid: u32, gid: u32) -> Result<(), String> {
    walk_tree(root, uid, gid, true)
}

/// [`chown_tree`], and with `share` the modes of [`share_tree`].
fn walk_tree(root: &Path, uid: u32, gid: u32, share: bool) -> Result<(), String> {
    let mut stack: Vec<PathBuf> = vec![root.to_owned()];
    let mut seen: u64 = 0;
    while let Some(path) = stack.pop() {
        seen += 1;
        if seen > MAX_ENTRIES {
            return Err(format!(
                "{} holds more than {MAX_ENTRIES} entries",
                root.display()
            ));
        }
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to {uid}:{gid}: {e}", path.display()))?;
        }
        if share && !meta.file_type().is_symlink() {
            let mode = if meta.is_dir() || meta.mode() & 0o100 != 0 {
                0o750
            } else {
                0o640
            };
            set_mode(&path, mode)?;
        }
        if meta.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            for entry in entries {
                let entry = entry.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                stack.push(entry.path());
            }
        }
    }
    Ok(())
}

/// The first of `path`'s ancestors that `user` cannot pass through (no `x` for it), or
/// `path` itself when `user` cannot pass through it (a directory) or read it (nor, with
/// `run`, run it: a file), by the permission bits
/// (owner, primary group, others; ACLs are not read). `None` when `user` reaches it.
pub fn unreachable(path: &Path, user: &UserIds, run: bool) -> Option<PathBuf> {
    let allows = |meta: &std::fs::Metadata, bits: u32| {
        let mode = meta.mode();
        let class = if meta.uid() == user.uid {
            mode >> 6
        } else if meta.gid() == user.gid {
            mode >> 3
        } else {
            mode
        };
        class & bits == bits
    };
    let ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    for dir in ancestors.into_iter().rev() {
        match std::fs::metadata(dir) {
            Ok(meta) if allows(&meta, 0o1) => {}
            _ => return Some(dir.to_owned()),
        }
    }
    let wanted = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => 0o1,
        Ok(_) if run => 0o5,
        Ok(_) => 0o4,
        Err(_) => return Some(path.to_owned()),
    };
    match std::fs::metadata(path) {
        Ok(meta) if allows(&meta, wanted) => None,
        _ => Some(path.to_owned()),
    }
}

/// Lets `user` (and nobody else but the owner) pass through the data directory `dir` to
/// the run's paths: its group becomes the user's primary group, its mode `0710` (no listing,
/// no reading of the files in it by name unless they allow it: the master key and the
/// database stay the owner's).
///
/// # Errors
///
/// The directory cannot be changed.
pub fn open_data_dir(dir: &Path, user: &UserIds) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    if meta.gid() != user.gid {
        std::os::unix::fs::chown(dir, None, Some(user.gid))
            .map_err(|e| format!("cannot give {} to group {}: {e}", dir.display(), user.gid))?;
    }
    if meta.mode() & 0o7777 != 0o710 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
            .map_err(|e| format!("cannot change the mode of {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// The mode of the directories a run's paths lie in (`runs/`, `runs/<task>/<attempt>/`,
/// `workspaces/`, `workspaces/mirrors/`, …): passed through by the agents' user, whose
/// `bwrap` mounts those paths by name, but never listed or read.
pub const PASSAGE_MODE: u32 = 0o711;

/// Creates `dir` and its missing parents up to (not including) `base` as passages
/// ([`PASSAGE_MODE`], whatever the process's umask), and makes `dir` and every directory
/// between it and `base` one if it already exists.
///
/// # Errors
///
/// A directory that cannot be created or changed, or `dir` not inside `base`.
pub fn passage(base: &Path, dir: &Path) -> Result<(), String> {
    let relative = dir
        .strip_prefix(base)
        .map_err(|_| format!("{} is not inside {}", dir.display(), base.display()))?;
    let mut path = base.to_owned();
    for part in relative.components() {
        path.push(part);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
        set_mode(&path, PASSAGE_MODE)?;
    }
    Ok(())
}

/// `path` created (or emptied) for writing, readable and writable by the service's user
/// alone (mode 0600, whatever the umask).
///
/// # Errors
///
/// The file cannot be opened or changed.
pub fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file an older version left keeps its mode through `open`.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Makes `path` of mode `mode` unless it is already, never following a symbolic link (a
/// link is left alone: its own mode means nothing).
fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.file_type().is_symlink() || meta.mode() & 0o7777 == mode {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot change the mode of {}: {e}", path.display()))
}

/// Takes every permission of the group and of others from `path` (`chmod go=`), never
/// following a symbolic link.
///
/// # Errors
///
/// `path` cannot be read or changed.
pub fn private(path: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.file_type().is_symlink() || meta.mode() & 0o077 == 0 {
        return Ok(());
    }
    set_mode(path, meta.mode() & 0o7700)
}

/// The entries of the directory `dir` (none if it does not exist).
fn entries(dir: &Path) -> Result<Vec<(PathBuf, std::fs::FileType)>, String> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    read.map(|entry| {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let kind = entry
            .file_type()
            .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
        Ok((entry.path(), kind))
    })
    .collect()
}

/// Closes the data directory `dir` to everyone but the service's user, except the way to
/// the paths agents must reach (docs/security.md#the-agents-user), whatever an older
/// version or the umask left:
///
/// - `dir` itself: `0700`, or, for agents of another user `agent`, that user's group and
///   `0710` ([`open_data_dir`]);
/// - on the way to a run's paths, passages ([`PASSAGE_MODE`]: passed through, never
///   listed): `runs/`, each `runs/<task>/` and `runs/<task>/<attempt>/`, `workspaces/`, its
///   `mirrors/`, `worktrees/` and `indexes/`, and each mirror's `worktrees/`;
/// - everything else at those levels loses its group's and others' permissions: the
///   database and its WAL, the master key, the admin token, the CLI check's `HOME`, git's
///   `HOME`, each run's `output.log` and `agent.pid`;
/// - left as they are: a run's `home/` and `net/` and a task's worktree, index directory and
///   git metadata entry (the agent's own while it runs), and the mirrors' content, which
///   an agent reads (its own repository's history).
///
/// # Errors
///
/// An entry that cannot be read or changed.
pub fn close_data_dir(dir: &Path, agent: Option<&UserIds>) -> Result<(), String> {
    match agent {
        Some(user) => open_data_dir(dir, user)?,
        None => set_mode(dir, 0o700)?,
    }
    for (path, kind) in entries(dir)? {
        match path.file_name().and_then(|n| n.to_str()) {
            Some("runs") if kind.is_dir() => close_runs(&path)?,
            Some("workspaces") if kind.is_dir() => close_workspaces(&path)?,
            _ => private(&path)?,
        }
    }
    Ok(())
}

/// [`close_data_dir`] for `runs/`.
fn close_runs(runs: &Path) -> Result<(), String> {
    set_mode(runs, PASSAGE_MODE)?;
    for (task, kind) in entries(runs)? {
        if !kind.is_dir() {
            private(&task)?;
            continue;
        }
        set_mode(&task, PASSAGE_MODE)?;
        for (attempt, kind) in entries(&task)? {
            if !kind.is_dir() {
                private(&attempt)?;
                continue;
            }
            set_mode(&attempt, PASSAGE_MODE)?;
            for (path, _) in entries(&attempt)? {
                let name = path.file_name().and_then(|n| n.to_str());
                if !matches!(name, Some("home" | "net")) {
                    private(&path)?;
                }
            }
        }
    }
    Ok(())
}

/// [`close_data_dir`] for `workspaces/`.
fn close_workspaces(workspaces: &Path) -> Result<(), String> {
    set_mode(workspaces, PASSAGE_MODE)?;
    for (path, kind) in entries(workspaces)? {
        let name = path.file_name().and_then(|n| n.to_str());
        match name {
            Some("worktrees" | "indexes" | "agent-git") if kind.is_dir() => {
                set_mode(&path, PASSAGE_MODE)?;
            }
            Some("mirrors") if kind.is_dir() => {
                set_mode(&path, PASSAGE_MODE)?;
                for (mirror, kind) in entries(&path)? {
                    let metadata = mirror.join("worktrees");
                    if kind.is_dir() && metadata.is_dir() {
                        set_mode(&metadata, PASSAGE_MODE)?;
                    }
                }
            }
            _ => private(&path)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_of_its_own_runs_agents_as_itself_and_refuses_a_switch() {
        assert_eq!(
            AgentUser::resolve(1000, None, false, true),
            Ok(AgentUser::Service)
        );
        let err = AgentUser::resolve(1000, Some("nobody"), false, true).unwrap_err();
        assert!(err.contains("needs the service to run as root"), "{err}");
    }

    #[test]
    fn root_switches_to_nobody_by_default_and_refuses_what_it_cannot_use() {
        let nobody = AgentUser::resolve(0, None, false, true).unwrap();
        let ids = nobody.ids().expect("nobody exists here");
        assert_eq!((ids.name.as_str(), ids.uid), ("nobody", 65534));
        assert_eq!(
            AgentUser::resolve(0, Some("65534"), false, true).unwrap(),
            nobody
        );
        for (configured, expected) in [
            (
                Some("no-such-user-here"),
                "there is no user \"no-such-user-here\"",
            ),
            (Some("root"), "is root"),
            (Some("0"), "is root"),
        ] {
            match AgentUser::resolve(0, configured, false, true).unwrap() {
                AgentUser::Refused(why) => {
                    assert!(why.contains(expected), "{why}");
                    assert!(why.contains("AGENTRY_ALLOW_ROOT=1"), "{why}");
                }
                other => panic!("{configured:?}: {other:?}"),
            }
        }
        match AgentUser::resolve(0, None, false, false).unwrap() {
            AgentUser::Refused(why) => assert!(why.contains("unsandboxed"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            AgentUser::resolve(0, None, true, false),
            Ok(AgentUser::Service)
        );
    }

    #[test]
    fn what_another_user_can_reach_follows_the_permission_bits() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = base.join("open");
        let closed = base.join("closed");
        for d in [&open, &closed] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let tool = open.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let hidden = closed.join("tool");
        std::fs::write(&hidden, "").unwrap();
        let other = UserIds {
            name: "other".into(),
            uid: 4_000_000,
            gid: 4_000_000,
        };
        assert_eq!(unreachable(&tool, &other, true), None);
        assert_eq!(unreachable(&hidden, &other, false), Some(closed.clone()));
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(unreachable(&tool, &other, true), Some(tool.clone()));
        assert_eq!(unreachable(&tool, &other, false), None);
        assert_eq!(
            unreachable(&base.join("missing"), &other, false),
            Some(base.join("missing"))
        );
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    /// A data directory as an older version left it (everything 0755 or 0644) is closed to
    /// everyone but the service's user, but for the passages to a run's paths.
    #[test]
    fn an_open_data_directory_is_closed_but_for_the_passages_to_the_runs() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let run = dir.join("runs/task-a/1");
        let mirror = dir.join("workspaces/mirrors/repo.git");
        let dirs = [
            run.join("home/.codex"),
            run.join("net"),
            run.join("stray-dir"),
            mirror.join("worktrees/task-a"),
            mirror.join("objects/ab"),
            dir.join("workspaces/worktrees/task-a/src"),
            dir.join("workspaces/indexes/task-a"),
            dir.join("workspaces/git-home"),
            dir.join("cli-home/.claude"),
        ];
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap();
        }
        let files = [
            dir.join("agentry.db"),
            dir.join("agentry.db-wal"),
            dir.join("agentry.db-shm"),
            dir.join("backup.sql"),
            dir.join("runs/task-a/1/output.log"),
            dir.join("runs/task-a/1/output.log.1"),
            dir.join("runs/task-a/1/agent.pid"),
            dir.join("runs/stray-file"),
            run.join("home/.codex/auth.json"),
            mirror.join("objects/ab/cdef"),
            mirror.join("config"),
            dir.join("workspaces/worktrees/task-a/src/lib.rs"),
        ];
        for f in &files {
            std::fs::write(f, "x").unwrap();
        }
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        let mut all: Vec<PathBuf> = walk(&dir);
        all.push(dir.clone());
        for path in &all {
            let open = if path.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(open)).unwrap();
        }

        close_data_dir(&dir, None).unwrap();

        assert_eq!(mode(&dir), 0o700);
        for passage in [
            dir.join("runs"),
            dir.join("runs/task-a"),
            run.clone(),
            dir.join("workspaces"),
            dir.join("workspaces/mirrors"),
            dir.join("workspaces/worktrees"),
            dir.join("workspaces/indexes"),
            mirror.join("worktrees"),
        ] {
            assert_eq!(mode(&passage), PASSAGE_MODE, "{}", passage.display());
        }
        for closed in [
            "agentry.db",
            "agentry.db-wal",
            "agentry.db-shm",
            "backup.sql",
            "runs/task-a/1/output.log",
            "runs/task-a/1/output.log.1",
            "runs/task-a/1/agent.pid",
            "runs/stray-file",
        ] {
            assert_eq!(mode(&dir.join(closed)), 0o600, "{closed}");
        }
        for closed in ["cli-home", "runs/task-a/1/stray-dir", "workspaces/git-home"] {
            assert_eq!(mode(&dir.join(closed)), 0o700, "{closed}");
        }
        // What the agent reads or owns during its run is left as it was; so is what a
        // symbolic link points to.
        for kept in [
            run.join("home"),
            run.join("net"),
            mirror.clone(),
            mirror.join("objects/ab"),
            dir.join("workspaces/worktrees/task-a"),
            dir.join("workspaces/indexes/task-a"),
        ] {
            assert_eq!(mode(&kept), 0o755, "{}", kept.display());
        }
        assert_eq!(mode(&mirror.join("objects/ab/cdef")), 0o644);
        assert_eq!(mode(&outside), 0o644);

        // Idempotent, and with agents of another user the directory is theirs to pass.
        close_data_dir(&dir, None).unwrap();
        assert_eq!(mode(&dir.join("agentry.db")), 0o600);
        if nix::unistd::geteuid().as_raw() == 0 {
            let nobody = UserIds {
                name: "nobody".into(),
                uid: 65534,
                gid: 65534,
            };
            close_data_dir(&dir, Some(&nobody)).unwrap();
            let meta = std::fs::metadata(&dir).unwrap();
            assert_eq!((meta.mode() & 0o7777, meta.gid()), (0o710, 65534));
            // nobody reaches a run's HOME and its mirror, and nothing else by name.
            assert_eq!(unreachable(&run.join("home"), &nobody, false), None);
            assert_eq!(unreachable(&mirror.join("config"), &nobody, false), None);
            for file in &files[..8] {
                assert!(
                    unreachable(file, &nobody, false).is_some(),
                    "{}",
                    file.display()
                );
            }
        }
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                found.extend(walk(&path));
            }
            if !std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
            {
                found.push(path);
            }
        }
        found
    }

    #[test]
    fn a_passage_is_made_whatever_the_umask_left() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::create_dir(base.join("a")).unwrap();
        std::fs::set_permissions(base.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
        passage(base, &base.join("a/b/c")).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&base.join(d)), PASSAGE_MODE, "{d}");
        }
        assert!(passage(&base.join("a"), base).is_err());
        let file = base.join("a/f");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        drop(private_file(&file).unwrap());
        assert_eq!(mode(&file), 0o600);
    }

    /// The worktree shared with the git steps: readable by the group, writable by nobody
    /// else, and the owner's execute bit (what git records) kept.
    #[test]
    fn share_tree_opens_the_tree_to_the_group_and_keeps_what_git_records() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("private")).unwrap();
        for (name, mode) in [
            ("script.sh", 0o700),
            ("secret", 0o600),
            ("open", 0o666),
            ("odd", 0o077),
        ] {
            std::fs::write(tree.join(name), "x").unwrap();
            std::fs::set_permissions(tree.join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        std::fs::set_permissions(tree.join("private"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("link")).unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        share_tree(&tree, uid, gid).unwrap();
        for (name, expected) in [
            ("", 0o750),
            ("private", 0o750),
            ("script.sh", 0o750),
            ("secret", 0o640),
            ("open", 0o640),
            ("odd", 0o640),
        ] {
            assert_eq!(mode(&tree.join(name)), expected, "{name}");
        }
        assert_eq!(mode(&outside), 0o600);
    }

    #[test]
    fn chown_tree_never_follows_a_link() {
        if nix::unistd::geteuid().as_raw() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), "x").unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "kept").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("link")).unwrap();
        chown_tree(&tree, 65534, 65534).unwrap();
        for path in ["", "a", "a/b", "a/b/f", "link"] {
            let meta = std::fs::symlink_metadata(tree.join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{path}");
        }
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
    }
}
