//! Git workspaces with the real `git`: mirrors, task worktrees, commit and push, retries,
//! reviews, concurrency, crash leftovers, and the token reaching git only as a header.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use agentry_runner::workspace::{GitAuth, GitError, RepoSpec, Workspaces, branch_name};
use base64::Engine;
use tempfile::TempDir;
use uuid::Uuid;

fn git(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(cwd)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

struct Source {
    _dir: TempDir,
    bare: PathBuf,
    work: PathBuf,
}

impl Source {
    /// A bare repository with a README on `main`, and a working clone to add commits.
    fn new() -> Source {
        let dir = TempDir::new().unwrap();
        let bare = dir.path().join("source.git");
        std::fs::create_dir_all(&bare).unwrap();
        git(&["init", "--bare", "-b", "main"], &bare);
        let work = dir.path().join("work");
        git(
            &["clone", bare.to_str().unwrap(), work.to_str().unwrap()],
            dir.path(),
        );
        let source = Source {
            _dir: dir,
            bare,
            work,
        };
        source.commit("README.md", "# hello\n");
        source
    }

    fn commit(&self, file: &str, text: &str) -> String {
        std::fs::write(self.work.join(file), text).unwrap();
        git(&["add", file], &self.work);
        git(&["commit", "-m", file], &self.work);
        git(&["push", "origin", "HEAD:refs/heads/main"], &self.work);
        git(&["rev-parse", "HEAD"], &self.work)
    }

    fn spec(&self) -> RepoSpec {
        RepoSpec {
            key: "repo-1".into(),
            clone_url: self.bare.to_str().unwrap().to_owned(),
            default_branch: "main".into(),
        }
    }
}

#[tokio::test]
async fn coding_worktree_commit_push_and_remove() {
    let source = Source::new();
    let main = git(&["rev-parse", "main"], &source.bare);
    let root = TempDir::new().unwrap();
    let ws = Workspaces::new(root.path());
    let task = Uuid::new_v4();
    let wt = ws
        .prepare_coding(&source.spec(), task, &GitAuth::none())
        .await
        .unwrap();
    let branch = branch_name(task);
    assert_eq!(wt.branch(), Some(branch.as_str()));
    assert_eq!(wt.base_commit(), main);
    assert!(wt.path().join("README.md").exists());
    // Nothing changed: nothing to publish.
    assert_eq!(wt.commit_all("nothing").await.unwrap(), None);
    std::fs::write(wt.path().join("fix.txt"), "fixed\n").unwrap();
    let commit = wt.commit_all("Fix it").await.unwrap().unwrap();
    wt.push(&GitAuth::none()).await.unwrap();
    assert_eq!(git(&["rev-parse", &branch], &source.bare), commit);
    assert_eq!(
        git(&["show", &format!("{branch}:fix.txt")], &source.bare),
        "fixed"
    );
    assert_eq!(
        git(
            &["log", "-1", "--format=%an <%ae>|%cn", &branch],
            &source.bare
        ),
        "agentry <agentry@localhost>|agentry"
    );
    let path = wt.path().to_owned();
    wt.remove().await.unwrap();
    assert!(!path.exists());
    let mirror = root.path().join("mirrors/repo-1.git");
    let listed = git(&["worktree", "list"], &mirror);
    assert!(!listed.contains(&task.to_string()), "{listed}");
    assert!(git(&["branch", "--list", &branch], &mirror).is_empty());
    // The mirror's remote is the plain clone URL.
    assert_eq!(
        git(&["remote", "get-url", "origin"], &mirror),
        source.bare.to_str().unwrap()
    );
}

#[tokio::test]
async fn agent_commits_count_retries_reuse_the_branch_and_fetch_sees_new_commits() {
    let source = Source::new();
    let root = TempDir::new().unwrap();
    let ws = Workspaces::new(root.path());
    let task = Uuid::new_v4();
    let wt = ws
        .prepare_coding(&source.spec(), task, &GitAuth::none())
        .await
        .unwrap();
    // The agent committed by itself; nothing is left uncommitted.
    std::fs::write(wt.path().join("a.txt"), "a\n").unwrap();
    git(&["add", "a.txt"], wt.path());
    git(&["commit", "-m", "agent's own"], wt.path());
    let head = git(&["rev-parse", "HEAD"], wt.path());
    assert_eq!(wt.commit_all("x").await.unwrap(), Some(head));
    wt.push(&GitAuth::none()).await.unwrap();
    wt.remove().await.unwrap();

    // A new commit on main, then a retry of the same task: a fresh branch from the new main,
    // force-pushed over the old one.
    let new_main = source.commit("CHANGELOG.md", "v2\n");
    let wt = ws
        .prepare_coding(&source.spec(), task, &GitAuth::none())
        .await
        .unwrap();
    assert_eq!(wt.base_commit(), new_main);
    assert!(!wt.path().join("a.txt").exists());
    std::fs::write(wt.path().join("b.txt"), "b\n").unwrap();
    let commit = wt.commit_all("second try").await.unwrap().unwrap();
    wt.push(&GitAuth::none()).await.unwrap();
    assert_eq!(
        git(&["rev-parse", &branch_name(task)], &source.bare),
        commit
    );
    wt.remove().await.unwrap();

    // A review checks the pushed branch out, detached.
    let review = ws
        .prepare_review(
            &source.spec(),
            Uuid::new_v4(),
            &branch_name(task),
            &GitAuth::none(),
        )
        .await
        .unwrap();
    assert_eq!(review.branch(), None);
    assert_eq!(review.base_commit(), commit);
    assert!(review.path().join("b.txt").exists());
    review.remove().await.unwrap();
}

#[tokio::test]
async fn leftovers_of_a_crashed_run_are_repaired() {
    let source = Source::new();
    let root = TempDir::new().unwrap();
    let ws = Workspaces::new(root.path());
    let task = Uuid::new_v4();
    let first = ws
        .prepare_coding(&source.spec(), task, &GitAuth::none())
        .await
        .unwrap();
    std::fs::write(first.path().join("half.txt"), "half\n").unwrap();
    // The process "died": the worktree was never removed.
    std::mem::forget(first);
    let again = ws
        .prepare_coding(&source.spec(), task, &GitAuth::none())
        .await
        .unwrap();
    assert!(!again.path().join("half.txt").exists());
    again.remove().await.unwrap();
}

#[tokio::test]
async fn concurrent_tasks_on_one_repository() {
    let source = Source::new();
    let root = TempDir::new().unwrap();
    let ws = Arc::new(Workspaces::new(root.path()));
    let spec = source.spec();
    let mut handles = Vec::new();
    for i in 0..4 {
        let ws = ws.clone();
        let spec = spec.clone();
        handles.push(tokio::spawn(async move {
            let task = Uuid::new_v4();
            let wt = ws
                .prepare_coding(&spec, task, &GitAuth::none())
                .await
                .unwrap();
            std::fs::write(wt.path().join(format!("f{i}.txt")), "x\n").unwrap();
            wt.commit_all("change").await.unwrap().unwrap();
            wt.push(&GitAuth::none()).await.unwrap();
            wt.remove().await.unwrap();
            branch_name(task)
        }));
    }
    for (i, handle) in handles.into_iter().enumerate() {
        let branch = handle.await.unwrap();
        git(&["show", &format!("{branch}:f{i}.txt")], &source.bare);
    }
}

#[tokio::test]
async fn bad_keys_branches_and_unreachable_remotes_are_errors() {
    let root = TempDir::new().unwrap();
    let ws = Workspaces::new(root.path());
    let mut spec = RepoSpec {
        key: "../escape".into(),
        clone_url: "/nonexistent/repo.git".into(),
        default_branch: "main".into(),
    };
    let err = ws
        .prepare_coding(&spec, Uuid::new_v4(), &GitAuth::none())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::InvalidKey(_)), "{err}");
    spec.key = "r".into();
    let err = ws
        .prepare_coding(&spec, Uuid::new_v4(), &GitAuth::none())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("git fetch"), "{err}");
    let err = ws
        .prepare_review(&spec, Uuid::new_v4(), "--upload-pack=x", &GitAuth::none())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::InvalidBranch(_)), "{err}");
}

/// The token goes to the remote as an `Authorization` header, and nowhere else: not in the
/// error, not in any file under the workspace root, not in `Debug`.
#[tokio::test]
async fn the_token_reaches_git_only_as_a_header() {
    const TOKEN: &str = "s3cret-token-0123456789";
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorded = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten().take(4) {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_owned());
            }
            recorded.lock().unwrap().extend(head);
            let mut stream = stream;
            let _ = stream.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let root = TempDir::new().unwrap();
    let ws = Workspaces::new(root.path());
    let spec = RepoSpec {
        key: "remote".into(),
        clone_url: format!("http://127.0.0.1:{port}/o/r.git"),
        default_branch: "main".into(),
    };
    let auth = GitAuth::token(TOKEN);
    assert!(!format!("{auth:?}").contains(TOKEN));
    let err = ws
        .prepare_coding(&spec, Uuid::new_v4(), &auth)
        .await
        .unwrap_err();
    assert!(!err.to_string().contains(TOKEN), "{err}");
    let expected = format!(
        "Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"))
    );
    let headers = seen.lock().unwrap().clone();
    assert!(
        headers.iter().any(|h| h.eq_ignore_ascii_case(&expected)),
        "{headers:?}"
    );
    // No file under the root holds the token or its header.
    let encoded = expected.rsplit(' ').next().unwrap().to_owned();
    let mut stack = vec![root.path().to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                let text = String::from_utf8_lossy(&bytes);
                assert!(
                    !text.contains(TOKEN) && !text.contains(&encoded),
                    "{} holds the token",
                    path.display()
                );
            }
        }
    }
}
