//! The sandbox of the runner's own git steps after the agent (docs/security.md#git-after-the-agent).
//!
//! After an agent, the runner builds the commit from the worktree the agent wrote:
//! `read-tree`, `update-index`, `add --all`, `write-tree`, `commit-tree`. Those steps read
//! agent-written files, so whatever git could be made to execute because of them (a filter,
//! a nested repository's configuration, a bug in git's parsing) must be as confined as the
//! agent was. In a sandboxed runner they run in a `bwrap` sandbox of their own:
//!
//! - the same system allow-list as an agent (`/usr`, `/bin`…, the needed `/etc` entries,
//!   `AGENTRY_SANDBOX_EXTRA_RO`), the data directory and `/run` hidden by empty read-only
//!   tmpfs, a small writable `/tmp`;
//! - **no network at all** (`--unshare-net` and nothing listening: none of these steps needs
//!   the remote, so no token is ever in reach; fetch and push run outside and never read the
//!   worktree);
//! - the worktree **read-only**; the repository's mirror **read-only**, its objects
//!   included: git writes the new objects into `objects/` of the task's own index directory
//!   (`GIT_OBJECT_DIRECTORY`, the mirror's objects an alternate), the only writable path,
//!   and the runner copies them into the mirror afterwards; the mirror's `worktrees/`
//!   hidden;
//! - **the agents' user**, not the service's: when the service runs as root, `bwrap` starts
//!   as `AGENTRY_AGENT_USER` with its supplementary groups dropped, so whatever git could
//!   be made to run is an unprivileged process, like the agent, and files it writes are
//!   that user's;
//! - the agent's namespaces, `--cap-drop ALL`, a new session, the seccomp filter and the
//!   rlimits (through the forwarder, when the runner has one), with at most
//!   [`MAX_PROCESSES`] processes and threads (`RLIMIT_NPROC`, which the kernel applies to
//!   any user but root: a reason more not to run the jail as root).
//!
//! The commands keep their paths (every mount is at its own path), so a command line is the
//! same inside and outside.

use std::path::{Path, PathBuf};

use super::{
    AgentLimits, BASE_ARGS, BwrapFeatures, bind_program, canonical, data_dir, feature_args,
    hiding_tmpfs, push_bind, push_remount_ro, push_system, resolve_program, seccomp_pipe,
    system_mounts, utf8,
};
use crate::process::PassedFd;
use crate::user::UserIds;

/// The most processes and threads a jailed git step may have (`RLIMIT_NPROC`, set by the
/// forwarder; lower when the agents' own limit is): git's own threads (at most 20 for
/// `add`'s preloading of the index) and nothing else, since it runs no hook, filter or
/// helper.
pub(crate) const MAX_PROCESSES: u64 = 64;

/// What a jailed git step may touch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GitJailLayout<'a> {
    /// The data directory (hidden but for the paths below).
    pub root: &'a Path,
    /// The repository's bare mirror (read-only but its `objects/`).
    pub mirror: &'a Path,
    /// The worktree the agent wrote (read-only).
    pub worktree: &'a Path,
    /// The directory of the task's own index file and new objects (writable).
    pub index_dir: &'a Path,
    /// The user git runs as, if not the service's (the agents' user of a root service): it
    /// must own `index_dir` and be able to read the worktree.
    pub user: Option<&'a UserIds>,
}

/// How to start git in a sandbox of its own: `bwrap` and the options before the command.
#[derive(Debug, Clone)]
pub(crate) struct GitJail {
    bwrap: PathBuf,
    /// `bwrap`'s options up to `--chdir`, without `--seccomp` (a pipe is read once: each
    /// command gets its own, see [`GitJail::command`]).
    mounts: Vec<String>,
    /// The forwarder's command line up to the jailed command (it sets the rlimits), if any.
    forwarder: Vec<String>,
    /// The git executable, by its absolute path.
    git: PathBuf,
    /// The seccomp filter, if the agents get one.
    seccomp: Option<Vec<u8>>,
    /// The user `bwrap` starts as, if not the service's.
    user: Option<UserIds>,
}

/// One jailed git command: run `program` with `args` (the git arguments appended by the
/// caller), giving it `pass_fd`.
#[derive(Debug)]
pub(crate) struct JailedCommand {
    /// `bwrap`.
    pub program: PathBuf,
    /// Everything up to and including the git executable.
    pub args: Vec<String>,
    /// The seccomp filter's pipe, to be passed at its own number.
    pub pass_fd: Option<PassedFd>,
    /// The user to start `program` as (its supplementary groups dropped), if not the
    /// service's.
    pub user: Option<UserIds>,
}

impl GitJail {
    /// The jail for `layout`, with what the agents get: `features` of the probed `bwrap`,
    /// `limits`, `extra_ro`, the forwarder (for the rlimits) and the seccomp filter.
    /// `path` is the `PATH` git is looked for on.
    ///
    /// # Errors
    ///
    /// A path that cannot be resolved or is not UTF-8, or a git inside the data directory.
    #[allow(
        clippy::too_many_arguments,
        reason = "the agent sandbox's settings, one by one"
    )]
    pub(crate) fn new(
        bwrap: &Path,
        features: BwrapFeatures,
        limits: AgentLimits,
        extra_ro: &[PathBuf],
        forwarder: Option<&[String]>,
        seccomp: Option<Vec<u8>>,
        path: &str,
        layout: GitJailLayout<'_>,
    ) -> Result<GitJail, String> {
        let root = data_dir(layout.root)?;
        let mirror = canonical(layout.mirror)?;
        let worktree = canonical(layout.worktree)?;
        let index_dir = canonical(layout.index_dir)?;
        let env = [("PATH".to_owned(), path.to_owned())];
        let (system, visible) = system_mounts(&root, extra_ro);
        let tmpfs = hiding_tmpfs(&root);
        let git = resolve_program(Path::new("git"), &env)
            .map_err(|e| format!("git for the commit: {e}"))?;
        let mut binds = Vec::new();
        let git = bind_program("git", &git, &env, &root, &visible, &mut binds)?;
        let forwarder = match forwarder {
            None => Vec::new(),
            Some(command) => {
                let (first, leading) = command
                    .split_first()
                    .ok_or_else(|| "the forwarder's command is empty".to_owned())?;
                let program = resolve_program(Path::new(first), &env)
                    .map_err(|e| format!("the forwarder: {e}"))?;
                let program =
                    bind_program("the forwarder", &program, &env, &root, &visible, &mut binds)?;
                let mut line = vec![utf8(&program)?];
                line.extend(leading.iter().cloned());
                let max_processes = match limits.max_processes {
                    0 => MAX_PROCESSES,
                    agents => agents.min(MAX_PROCESSES),
                };
                line.extend(
                    AgentLimits {
                        max_processes,
                        ..limits
                    }
                    .rlimit_args(),
                );
                line.push("--".to_owned());
                line
            }
        };

        let mut mounts: Vec<String> = BASE_ARGS
            .iter()
            .chain(feature_args(features))
            .map(|a| (*a).to_owned())
            .collect();
        mounts.push("--unshare-net".to_owned());
        push_system(&mut mounts, &system, &tmpfs, &binds, features, limits)?;
        let hidden = mirror.join("worktrees");
        for (option, path) in [
            ("--ro-bind", &mirror),
            ("--ro-bind", &worktree),
            ("--bind", &index_dir),
        ] {
            push_bind(&mut mounts, option, path)?;
        }
        let hidden: Vec<PathBuf> = Some(hidden).filter(|h| h.is_dir()).into_iter().collect();
        for dir in &hidden {
            mounts.extend(["--tmpfs".to_owned(), utf8(dir)?]);
        }
        push_remount_ro(&mut mounts, tmpfs.iter().chain(&hidden))?;
        Ok(GitJail {
            bwrap: bwrap.to_owned(),
            mounts,
            forwarder,
            git,
            seccomp,
            user: layout.user.cloned(),
        })
    }

    /// The command line that runs git in the jail from `cwd` (a path the jail shows: the
    /// mirror, the worktree or the index directory); the caller appends git's arguments.
    ///
    /// # Errors
    ///
    /// `cwd` not UTF-8, or the seccomp filter's pipe could not be made.
    pub(crate) fn command(&self, cwd: &Path) -> Result<JailedCommand, String> {
        let mut args = self.mounts.clone();
        let pass_fd = match &self.seccomp {
            None => None,
            Some(program) => {
                let passed = seccomp_pipe(program)?;
                args.extend(["--seccomp".to_owned(), passed.number().to_string()]);
                Some(passed)
            }
        };
        let cwd = cwd
            .to_str()
            .ok_or_else(|| format!("the path {} is not valid UTF-8", cwd.display()))?;
        args.extend(["--chdir".to_owned(), cwd.to_owned(), "--".to_owned()]);
        args.extend(self.forwarder.iter().cloned());
        let git = self
            .git
            .to_str()
            .ok_or_else(|| format!("the path {} is not valid UTF-8", self.git.display()))?;
        args.push(git.to_owned());
        Ok(JailedCommand {
            program: self.bwrap.clone(),
            args,
            pass_fd,
            user: self.user.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Sandbox, SandboxMode, works_here};
    use command_fds::{CommandFdExt, FdMapping};
    use std::io::Read;
    use std::net::TcpListener;

    /// Runs `script` with `sh` as a git alias inside the jail (what git would run if
    /// agent-written content could make it run a command) and returns what it printed.
    fn run_in_jail(jail: &GitJail, cwd: &Path, script: &str) -> String {
        run_in_jail_as(jail, cwd, script, None)
    }

    /// [`run_in_jail`], `bwrap` started as `user` (from `/`) when there is one.
    fn run_in_jail_as(jail: &GitJail, cwd: &Path, script: &str, user: Option<&UserIds>) -> String {
        use std::os::unix::process::CommandExt;
        let jailed = jail.command(cwd).unwrap();
        let mut command = std::process::Command::new(&jailed.program);
        if let Some(user) = user {
            command.uid(user.uid).gid(user.gid).current_dir("/");
        }
        command
            .args(&jailed.args)
            .args(["-c", &format!("alias.probe=!sh -c '{script}'"), "probe"])
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stdin(std::process::Stdio::null());
        if let Some(passed) = &jailed.pass_fd {
            command
                .fd_mappings(vec![FdMapping {
                    parent_fd: passed.0.try_clone().unwrap(),
                    child_fd: passed.number(),
                }])
                .unwrap();
        }
        let out = command.output().unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        text
    }

    /// A git jail of `sandbox` (probed) over `layout`, with the default limits and the
    /// seccomp filter, started by `forwarder` when one is given.
    async fn jail_in(
        sandbox: &Sandbox,
        forwarder: Option<&[String]>,
        layout: GitJailLayout<'_>,
    ) -> GitJail {
        let (bwrap, features) = sandbox.probed().await.unwrap().unwrap();
        GitJail::new(
            &bwrap,
            features,
            AgentLimits::default(),
            &[],
            forwarder,
            crate::sandbox::seccomp::program().ok(),
            "/usr/local/bin:/usr/bin:/bin",
            layout,
        )
        .unwrap()
    }

    /// A task's mirror (a bare repository with `mirror_dirs` in it), worktree and index
    /// directory (with `index_sub` in it) under the data directory `root`.
    fn jail_tree(
        root: &Path,
        mirror_dirs: [&str; 2],
        index_sub: Option<&str>,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let mirror = root.join("workspaces/mirrors/repo.git");
        let worktree = root.join("workspaces/worktrees/task");
        let index_dir = root.join("workspaces/indexes/task");
        let made = mirror_dirs.iter().map(|dir| mirror.join(dir)).chain([
            worktree.clone(),
            index_sub.map_or_else(|| index_dir.clone(), |sub| index_dir.join(sub)),
        ]);
        for dir in made {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(mirror.join("config"), "[core]\n\tbare = true\n").unwrap();
        (mirror, worktree, index_dir)
    }

    #[tokio::test]
    async fn git_after_the_agent_sees_no_secret_no_network_and_writes_only_its_index_directory() {
        if !agentry_testkit::sandbox::sandboxed(works_here()) {
            return;
        }
        let data = tempfile::TempDir::new().unwrap();
        let root = data.path();
        std::fs::write(root.join("master.key"), "the master key").unwrap();
        let (mirror, worktree, index_dir) = jail_tree(root, ["objects", "worktrees/other"], None);
        std::fs::write(mirror.join("worktrees/other/index"), "other").unwrap();
        std::fs::write(worktree.join("file.txt"), "agent's file").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();

        let sandbox = Sandbox::new(SandboxMode::Auto);
        let jail = jail_in(
            &sandbox,
            None,
            GitJailLayout {
                root,
                mirror: &mirror,
                worktree: &worktree,
                index_dir: &index_dir,
                user: None,
            },
        )
        .await;
        let key = root.join("master.key");
        let script = format!(
            "cat {key} 2>/dev/null && echo READ-KEY; \
             cat {worktree}/file.txt; echo; \
             touch {worktree}/planted 2>/dev/null && echo WROTE-WORKTREE; \
             echo x >> {config} 2>/dev/null && echo WROTE-CONFIG; \
             ls {mirror}/worktrees; \
             touch {objects}/ok && echo WROTE-OBJECTS; \
             touch {index}/index && echo WROTE-INDEX; \
             touch /tmp/ok && echo WROTE-TMP; \
             grep -c : /proc/net/dev; \
             curl -s -m 3 http://127.0.0.1:{port}/ >/dev/null 2>&1 || echo NO-NETWORK",
            key = key.display(),
            worktree = worktree.display(),
            config = mirror.join("config").display(),
            mirror = mirror.display(),
            objects = mirror.join("objects").display(),
            index = index_dir.display(),
        );
        let out = run_in_jail(&jail, &worktree, &script);
        assert!(
            !out.contains("READ-KEY") && !out.contains("the master key"),
            "{out}"
        );
        assert!(out.contains("agent's file"), "{out}");
        assert!(!out.contains("WROTE-WORKTREE"), "{out}");
        assert!(!worktree.join("planted").exists());
        assert!(!out.contains("WROTE-CONFIG"), "{out}");
        assert!(
            !out.contains("other"),
            "another run's worktree entry is hidden: {out}"
        );
        assert!(!out.contains("WROTE-OBJECTS"), "{out}");
        assert!(out.contains("WROTE-INDEX"), "{out}");
        assert!(out.contains("WROTE-TMP"), "{out}");
        // `lo` alone: the header's two lines have no `:`.
        assert!(out.lines().any(|l| l.trim() == "1"), "{out}");
        assert!(out.contains("NO-NETWORK"), "{out}");
        let mut buf = [0_u8; 1];
        match listener.accept() {
            Ok((mut stream, _)) => panic!(
                "git's sandbox reached the host: {:?}",
                stream.read(&mut buf)
            ),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
        }
        assert_eq!(
            std::fs::read_to_string(mirror.join("config")).unwrap(),
            "[core]\n\tbare = true\n"
        );
    }

    /// The forwarder built beside this test (`agentry-sandbox-net`, which `cargo test`
    /// builds for the crate's integration tests), copied into `dir` where another user can
    /// run it.
    fn forwarder_in(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let built = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.join("agentry-sandbox-net")))
            .filter(|path| path.is_file())
            .expect(
                "the forwarder agentry-sandbox-net is built beside the tests \
                 (cargo build -p agentry-runner --bin agentry-sandbox-net)",
            );
        let copy = dir.join("agentry-sandbox-net");
        std::fs::copy(built, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    }

    /// As root, git's jail runs as the agents' user (`nobody`): what it writes is that
    /// user's, it cannot write the worktree or the mirror (objects included), and it cannot
    /// have more than [`MAX_PROCESSES`] processes, though `nobody` already runs more than
    /// that outside.
    #[tokio::test]
    async fn as_root_git_runs_as_the_agents_user_with_a_process_limit() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        use std::os::unix::process::CommandExt;
        if !agentry_testkit::sandbox::sandboxed(works_here())
            || nix::unistd::geteuid().as_raw() != 0
        {
            return;
        }
        let user = crate::user::AgentUser::resolve(0, None, false, true).unwrap();
        let nobody = user.ids().unwrap().clone();
        let tmp = tempfile::TempDir::new().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let root = tmp.path().join("agentry");
        let (mirror, worktree, index_dir) =
            jail_tree(&root, ["objects/ab", "worktrees/task"], Some("objects"));
        std::fs::write(root.join("agentry.db"), "the database").unwrap();
        std::fs::write(worktree.join("private.txt"), "the agent's private file").unwrap();
        std::fs::set_permissions(
            worktree.join("private.txt"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        crate::user::close_data_dir(&root, Some(&nobody)).unwrap();
        crate::user::share_tree(&worktree, 0, nobody.gid).unwrap();
        crate::user::chown_tree(&index_dir, nobody.uid, nobody.gid).unwrap();
        let forwarder = vec![forwarder_in(tmp.path()).display().to_string()];
        // 80 processes of `nobody` outside: the limit counts the jail's own.
        let mut outside: Vec<std::process::Child> = (0..80)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("60")
                    .uid(nobody.uid)
                    .gid(nobody.gid)
                    .spawn()
                    .unwrap()
            })
            .collect();

        let sandbox = Sandbox::new(SandboxMode::Auto).with_agent_user(user.clone());
        let jail = jail_in(
            &sandbox,
            Some(&forwarder),
            GitJailLayout {
                root: &root,
                mirror: &mirror,
                worktree: &worktree,
                index_dir: &index_dir,
                user: Some(&nobody),
            },
        )
        .await;
        let script = format!(
            "echo uid-$(id -u); cat {worktree}/private.txt; echo; \
             cat {db} 2>/dev/null && echo READ-DB; \
             touch {worktree}/planted 2>/dev/null && echo WROTE-WORKTREE; \
             touch {objects}/planted 2>/dev/null && echo WROTE-MIRROR; \
             touch {index}/written && echo WROTE-INDEX",
            worktree = worktree.display(),
            db = root.join("agentry.db").display(),
            objects = mirror.join("objects/ab").display(),
            index = index_dir.join("objects").display(),
        );
        let out = run_in_jail_as(&jail, &worktree, &script, Some(&nobody));
        assert!(out.contains("uid-65534"), "{out}");
        assert!(out.contains("the agent's private file"), "{out}");
        assert!(
            !out.contains("READ-DB") && !out.contains("the database"),
            "{out}"
        );
        assert!(!out.contains("WROTE-WORKTREE"), "{out}");
        assert!(!out.contains("WROTE-MIRROR"), "{out}");
        assert!(!mirror.join("objects/ab/planted").exists());
        assert!(out.contains("WROTE-INDEX"), "{out}");
        let written = std::fs::metadata(index_dir.join("objects/written")).unwrap();
        assert_eq!((written.uid(), written.gid()), (nobody.uid, nobody.gid));

        // Forking: 40 processes fit under the limit; 100 do not.
        let forks = |n: u32| {
            format!(
                "i=0; while [ $i -lt {n} ]; do sleep 5 & i=$((i+1)); echo forked-$i; done; \
                 echo ALL-FORKED"
            )
        };
        let few = run_in_jail_as(&jail, &worktree, &forks(40), Some(&nobody));
        assert!(few.contains("ALL-FORKED"), "{few}");
        let many = run_in_jail_as(&jail, &worktree, &forks(100), Some(&nobody));
        let forked = many.lines().filter(|l| l.starts_with("forked-")).count();
        assert!(!many.contains("ALL-FORKED"), "{many}");
        assert!(
            (40..MAX_PROCESSES as usize).contains(&forked),
            "{forked} forks: {many}"
        );
        for child in &mut outside {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
