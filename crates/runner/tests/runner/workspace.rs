//! Git workspaces with the real `git`: mirrors, task worktrees, commit and push, retries,
//! reviews, concurrency, crash leftovers, and the token reaching git only as a header.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::support::{assert_no_file_holds, git, peak_rss_kib};
use agentry_runner::workspace::{
    Checkout, GitAuth, GitError, RepoSpec, Workspaces, Worktree, branch_name,
};
use base64::Engine;
use tempfile::TempDir;
use uuid::Uuid;

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
        self.commit_to("main", file, text, file)
    }

    /// Commits `file` holding `text` in the working clone with `message`, pushes it to
    /// `branch` of the bare repository, and returns the commit.
    fn commit_to(&self, branch: &str, file: &str, text: &str, message: &str) -> String {
        std::fs::write(self.work.join(file), text).unwrap();
        git(&["add", file], &self.work);
        git(&["commit", "-m", message], &self.work);
        git(
            &["push", "origin", &format!("HEAD:refs/heads/{branch}")],
            &self.work,
        );
        git(&["rev-parse", "HEAD"], &self.work)
    }

    /// The commit `branch` of the bare repository points at.
    fn head_of(&self, branch: &str) -> String {
        git(&["rev-parse", branch], &self.bare)
    }

    fn spec(&self) -> RepoSpec {
        RepoSpec {
            key: "repo-1".into(),
            clone_url: self.bare.to_str().unwrap().to_owned(),
            default_branch: "main".into(),
            host: "github.com".into(),
            allow_local: true,
        }
    }
}

/// A source repository and a workspace root to prepare its worktrees in.
struct Rig {
    source: Source,
    root: TempDir,
    ws: Workspaces,
}

impl Rig {
    fn new() -> Rig {
        let source = Source::new();
        let root = TempDir::new().unwrap();
        let ws = Workspaces::new(root.path());
        Rig { source, root, ws }
    }

    /// A coding worktree for `task` on the source's `main`.
    async fn coding(&self, task: Uuid) -> Worktree {
        self.ws
            .prepare(
                &self.source.spec(),
                task,
                Checkout::NewBranch,
                &GitAuth::none(),
            )
            .await
            .unwrap()
    }

    /// One attempt at `task`: its worktree with `text` committed into `fix.txt`, pushed,
    /// then removed. Returns the commit and what the push answered.
    async fn attempt(&self, task: Uuid, text: &str) -> (String, Result<(), GitError>) {
        let wt = self.coding(task).await;
        let commit = fix(&wt, text).await.unwrap().unwrap();
        let pushed = wt.push(&GitAuth::none()).await;
        wt.remove().await.unwrap();
        (commit, pushed)
    }
}

/// Writes `text` into `fix.txt` of `wt` and commits all as "Fix it".
async fn fix(wt: &Worktree, text: &str) -> Result<Option<String>, GitError> {
    std::fs::write(wt.path().join("fix.txt"), text).unwrap();
    wt.commit_all("Fix it").await
}

#[tokio::test]
async fn coding_worktree_commit_push_and_remove() {
    let rig = Rig::new();
    let Rig { source, root, .. } = &rig;
    let main = source.head_of("main");
    let task = Uuid::new_v4();
    let wt = rig.coding(task).await;
    let branch = branch_name(task);
    assert_eq!(wt.branch(), Some(branch.as_str()));
    assert_eq!(wt.base_commit(), main);
    assert!(wt.path().join("README.md").exists());
    // Nothing changed: nothing to publish.
    assert_eq!(wt.commit_all("nothing").await.unwrap(), None);
    let commit = fix(&wt, "fixed\n").await.unwrap().unwrap();
    wt.push(&GitAuth::none()).await.unwrap();
    assert_eq!(source.head_of(&branch), commit);
    assert_eq!(
        git(&["show", &format!("{branch}:fix.txt")], &source.bare),
        "fixed"
    );
    assert_eq!(
        git(
            &["log", "-1", "--format=%an <%ae>|%cn|%P", &branch],
            &source.bare
        ),
        format!("agentry <agentry@localhost>|agentry|{main}")
    );
    // The message, with the task's trailer.
    assert_eq!(
        git(&["log", "-1", "--format=%B", &branch], &source.bare),
        format!("Fix it\n\nAgentry-Task: {task}")
    );
    let path = wt.path().to_owned();
    wt.remove().await.unwrap();
    assert!(!path.exists());
    let mirror = root.path().join("mirrors/repo-1.git");
    let listed = git(&["worktree", "list"], &mirror);
    assert!(!listed.contains(&task.to_string()), "{listed}");
    assert!(git(&["branch", "--list", &branch], &mirror).is_empty());
    // The mirror's configuration names no remote: fetch and push name the clone URL.
    assert_eq!(
        std::fs::read_to_string(mirror.join("config")).unwrap(),
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n"
    );
}

#[tokio::test]
async fn agent_commits_count_retries_reuse_the_branch_and_fetch_sees_new_commits() {
    let rig = Rig::new();
    let Rig { source, ws, .. } = &rig;
    let task = Uuid::new_v4();
    let wt = rig.coding(task).await;
    // The agent committed by itself; nothing is left uncommitted. Its commit is folded into
    // agentry's one commit on the base.
    std::fs::write(wt.path().join("a.txt"), "a\n").unwrap();
    git(&["add", "a.txt"], wt.path());
    git(&["commit", "-m", "agent's own"], wt.path());
    let head = git(&["rev-parse", "HEAD"], wt.path());
    let commit = wt.commit_all("x").await.unwrap().unwrap();
    assert_ne!(commit, head);
    wt.push(&GitAuth::none()).await.unwrap();
    let branch = branch_name(task);
    assert_eq!(
        git(&["log", "-1", "--format=%P|%an", &branch], &source.bare),
        format!("{}|agentry", wt.base_commit())
    );
    assert_eq!(
        git(&["show", &format!("{branch}:a.txt")], &source.bare),
        "a"
    );
    wt.remove().await.unwrap();

    // A new commit on main, then a retry of the same task: a fresh branch from the new main,
    // force-pushed over the old one.
    let new_main = source.commit("CHANGELOG.md", "v2\n");
    let wt = rig.coding(task).await;
    assert_eq!(wt.base_commit(), new_main);
    assert!(!wt.path().join("a.txt").exists());
    std::fs::write(wt.path().join("b.txt"), "b\n").unwrap();
    let commit = wt.commit_all("second try").await.unwrap().unwrap();
    wt.push(&GitAuth::none()).await.unwrap();
    assert_eq!(source.head_of(&branch_name(task)), commit);
    wt.remove().await.unwrap();

    // A review checks the pushed branch out, detached.
    let review = ws
        .prepare(
            &source.spec(),
            Uuid::new_v4(),
            Checkout::Detached(&branch_name(task)),
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
    let rig = Rig::new();
    let task = Uuid::new_v4();
    let first = rig.coding(task).await;
    std::fs::write(first.path().join("half.txt"), "half\n").unwrap();
    // The process "died": the worktree was never removed.
    std::mem::forget(first);
    let again = rig.coding(task).await;
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
                .prepare(&spec, task, Checkout::NewBranch, &GitAuth::none())
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
        host: "github.com".into(),
        allow_local: true,
    };
    let err = ws
        .prepare(&spec, Uuid::new_v4(), Checkout::NewBranch, &GitAuth::none())
        .await
        .unwrap_err();
    assert!(matches!(err, GitError::InvalidKey(_)), "{err}");
    spec.key = "r".into();
    let err = ws
        .prepare(&spec, Uuid::new_v4(), Checkout::NewBranch, &GitAuth::none())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fetch"), "{err}");
    let err = ws
        .prepare(
            &spec,
            Uuid::new_v4(),
            Checkout::Detached("--upload-pack=x"),
            &GitAuth::none(),
        )
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
        host: "github.com".into(),
        allow_local: true,
    };
    let auth = GitAuth::token(TOKEN);
    assert!(!format!("{auth:?}").contains(TOKEN));
    let err = ws
        .prepare(&spec, Uuid::new_v4(), Checkout::NewBranch, &auth)
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
    assert_no_file_holds(root.path(), &[TOKEN, &encoded]);
}

/// A clone URL the code host reports is checked before any git command runs.
#[tokio::test]
async fn refused_clone_urls_run_no_git_at_all() {
    let rig = Rig::new();
    let Rig { source, root, ws } = &rig;
    for (url, allow_local) in [
        (source.bare.to_str().unwrap().to_owned(), false),
        ("https://evil.example/o/r.git".to_owned(), false),
        ("ext::sh -c touch% /tmp/pwned".to_owned(), true),
        ("--upload-pack=touch /tmp/pwned".to_owned(), true),
        (
            "https://x-access-token:t@github.com/o/r.git".to_owned(),
            false,
        ),
    ] {
        let spec = RepoSpec {
            clone_url: url.clone(),
            allow_local,
            ..source.spec()
        };
        let err = ws
            .prepare(&spec, Uuid::new_v4(), Checkout::NewBranch, &GitAuth::none())
            .await
            .unwrap_err();
        assert!(
            matches!(err, GitError::CloneUrlRefused { .. }),
            "{url}: {err}"
        );
        assert!(err.to_string().starts_with("the clone URL"), "{url}: {err}");
    }
    assert!(!root.path().join("mirrors").exists());
}

/// A branch of the task's name that holds someone else's commit is never overwritten.
#[tokio::test]
async fn a_foreign_branch_of_the_same_name_is_refused_and_left_as_it_was() {
    let rig = Rig::new();
    let Rig { source, .. } = &rig;
    let task = Uuid::new_v4();
    let branch = branch_name(task);
    // Someone else's commit on that branch, even one naming the task in its message.
    let theirs = source.commit_to(
        &branch,
        "theirs.txt",
        "theirs\n",
        &format!("theirs\n\nAgentry-Task: {}", Uuid::new_v4()),
    );

    let err = rig.attempt(task, "fixed\n").await.1.unwrap_err();
    assert!(matches!(err, GitError::BranchTaken { .. }), "{err}");
    assert!(err.to_string().contains("is not this task's"), "{err}");
    assert_eq!(source.head_of(&branch), theirs);

    // A retry replaces the task's own branch, but not once someone else pushed onto it.
    git(
        &["push", "origin", &format!(":refs/heads/{branch}")],
        &source.work,
    );
    for text in ["first\n", "second\n"] {
        let (commit, pushed) = rig.attempt(task, text).await;
        pushed.unwrap();
        assert_eq!(source.head_of(&branch), commit);
    }
    git(&["fetch", "origin"], &source.work);
    git(
        &["checkout", "-q", "-B", "human", &format!("origin/{branch}")],
        &source.work,
    );
    let human = source.commit_to(&branch, "human.txt", "human\n", "a human's fix on top");
    let err = rig.attempt(task, "third\n").await.1.unwrap_err();
    assert!(matches!(err, GitError::BranchTaken { .. }), "{err}");
    assert_eq!(source.head_of(&branch), human);
}

/// What an agent writes into git metadata: a rewritten `.git` or a changed mirror
/// configuration stops the run before anything is committed; hooks and an fsmonitor
/// planted in the mirror never run.
#[tokio::test]
async fn tampered_git_metadata_is_refused_and_planted_programs_never_run() {
    let rig = Rig::new();
    let Rig { source, root, .. } = &rig;
    let mirror = root.path().join("mirrors/repo-1.git");
    let marker_dir = TempDir::new().unwrap();
    let marker = |name: &str| marker_dir.path().join(name);
    let plant = |path: &Path, name: &str| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            path,
            format!("#!/bin/sh\ntouch '{}'\nexit 0\n", marker(name).display()),
        )
        .unwrap();
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    };

    // 1. The `.git` file rewritten: nothing is committed.
    let task = Uuid::new_v4();
    let wt = rig.coding(task).await;
    std::fs::write(wt.path().join("fix.txt"), "fixed\n").unwrap();
    let elsewhere = marker_dir.path().join("evil.git");
    git(
        &["init", "--bare", "-q", elsewhere.to_str().unwrap()],
        marker_dir.path(),
    );
    std::fs::write(
        wt.path().join(".git"),
        format!("gitdir: {}\n", elsewhere.display()),
    )
    .unwrap();
    let err = wt.commit_all("Fix it").await.unwrap_err();
    assert!(matches!(err, GitError::Tampered(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "the agent modified the worktree's .git; nothing was committed or pushed"
    );
    assert!(git(&["branch", "--list", "agentry/*"], &source.bare).is_empty());
    wt.remove().await.unwrap();

    // 2. Hooks and an fsmonitor planted in the mirror and the worktree's metadata (the
    //    mirror's own configuration untouched): they never run; the push happens.
    let task = Uuid::new_v4();
    let wt = rig.coding(task).await;
    let meta = mirror.join("worktrees").join(task.to_string());
    for hook in [
        "pre-commit",
        "post-commit",
        "pre-push",
        "reference-transaction",
        "post-checkout",
        "pre-auto-gc",
    ] {
        plant(&mirror.join("hooks").join(hook), hook);
        plant(&meta.join("hooks").join(hook), hook);
    }
    plant(&marker_dir.path().join("fsmonitor"), "fsmonitor");
    std::fs::write(
        meta.join("config.worktree"),
        format!(
            "[core]\n\tfsmonitor = {}\n\thooksPath = {}\n",
            marker_dir.path().join("fsmonitor").display(),
            mirror.join("hooks").display()
        ),
    )
    .unwrap();
    let commit = fix(&wt, "fixed\n").await.unwrap().unwrap();
    wt.push(&GitAuth::none()).await.unwrap();
    assert_eq!(source.head_of(&branch_name(task)), commit);
    wt.remove().await.unwrap();
    let ran: Vec<_> = std::fs::read_dir(marker_dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !["evil.git", "fsmonitor"].contains(&name.as_str()))
        .collect();
    assert!(ran.is_empty(), "these ran: {ran:?}");

    // 3. The mirror's configuration changed: refused; the next run repairs it.
    let task = Uuid::new_v4();
    let wt = rig.coding(task).await;
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(mirror.join("config"))
        .unwrap();
    writeln!(
        config,
        "[url \"/nonexistent/\"]\n\tinsteadOf = {}",
        source.bare.display()
    )
    .unwrap();
    drop(config);
    let err = fix(&wt, "fixed\n").await.unwrap_err();
    assert!(matches!(err, GitError::Tampered(_)), "{err}");
    wt.remove().await.unwrap();
    assert!(git(&["branch", "--list", &branch_name(task)], &source.bare).is_empty());
    let wt = rig.coding(task).await;
    fix(&wt, "fixed\n").await.unwrap().unwrap();
    wt.push(&GitAuth::none()).await.unwrap();
    wt.remove().await.unwrap();
}

/// A patch of an agent's changes made elsewhere (a Kubernetes pod sends one) changes the
/// worktree and nothing else: git refuses the paths outside it, and a copy, whose source
/// git does not check, is refused before git reads the patch.
#[tokio::test]
async fn a_patch_reads_and_writes_nothing_outside_the_worktree() {
    let rig = Rig::new();
    let wt = rig.coding(Uuid::new_v4()).await;
    // A file of the service's next to the workspaces, as its master key is.
    let root = wt.path().parent().unwrap().parent().unwrap();
    assert_eq!(root, rig.root.path());
    let secret = root.join("master.key");
    std::fs::write(&secret, "the service's key\n").unwrap();
    let copies = [
        "diff --git a/../../master.key b/leak.key\nsimilarity index 100%\n\
         copy from ../../master.key\ncopy to leak.key\n",
        &format!(
            "diff --git a/{0} b/leak.key\nsimilarity index 100%\ncopy from {0}\ncopy to leak.key\n",
            secret.display()
        ),
        // A copy within the worktree is refused too: no honest pod sends one.
        "diff --git a/README.md b/leak.key\nsimilarity index 100%\n\
         copy from README.md\ncopy to leak.key\n",
    ];
    for patch in copies {
        match wt.apply_patch(patch.as_bytes().to_vec()).await {
            Err(GitError::PatchCopies(line)) => assert!(line.starts_with("copy "), "{line}"),
            other => panic!("{patch}: {other:?}"),
        }
        assert!(!wt.path().join("leak.key").exists(), "{patch}");
    }
    // What git itself refuses: a rename or a change of a file outside.
    let outside = [
        "diff --git a/../../master.key b/leak.key\nsimilarity index 100%\n\
         rename from ../../master.key\nrename to leak.key\n",
        "diff --git a/../../master.key b/../../master.key\n--- a/../../master.key\n\
         +++ b/../../master.key\n@@ -1 +1 @@\n-the service's key\n+replaced\n",
    ];
    for patch in outside {
        let refused = wt.apply_patch(patch.as_bytes().to_vec()).await;
        assert!(
            matches!(refused, Err(GitError::Command { .. })),
            "{patch}: {refused:?}"
        );
        assert!(!wt.path().join("leak.key").exists(), "{patch}");
    }
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "the service's key\n"
    );
    // An honest patch, with a rename in it, applies and is committed.
    let honest = "diff --git a/README.md b/docs.md\nsimilarity index 100%\n\
                  rename from README.md\nrename to docs.md\n\
                  diff --git a/fix.txt b/fix.txt\nnew file mode 100644\n--- /dev/null\n\
                  +++ b/fix.txt\n@@ -0,0 +1 @@\n+fixed\n";
    wt.apply_patch(honest.as_bytes().to_vec()).await.unwrap();
    let commit = wt.commit_all("Fix it").await.unwrap().unwrap();
    let mirror = root.join("mirrors/repo-1.git");
    assert_eq!(
        git(&["ls-tree", "--name-only", &commit], &mirror),
        "docs.md\nfix.txt"
    );
    // The patch file is gone.
    let left: Vec<_> = std::fs::read_dir(wt.path().parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

/// An agent's `.gitattributes` makes `git add` print a warning per line: some 600 MB of
/// stderr here. The runner keeps only the tail of what git prints, so its memory stays
/// flat, and the commit is made.
#[tokio::test]
async fn what_git_prints_is_not_kept_in_memory() {
    let rig = Rig::new();
    let wt = rig.coding(Uuid::new_v4()).await;
    std::fs::write(wt.path().join(".gitattributes"), "!a\n".repeat(6_000_000)).unwrap();
    let before = peak_rss_kib();
    let commit = wt.commit_all("Attributes").await.unwrap().unwrap();
    let grown = peak_rss_kib().saturating_sub(before);
    eprintln!("600 MB of git warnings: peak RSS grew by {grown} KiB");
    assert!(grown < 200 * 1024, "the peak RSS grew by {grown} KiB");
    let mirror = rig.root.path().join("mirrors/repo-1.git");
    assert_eq!(
        git(&["ls-tree", "--name-only", &commit], &mirror),
        ".gitattributes\nREADME.md"
    );
}
