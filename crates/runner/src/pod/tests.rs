//! The protocol's hello, answer and frames, and the launch's tar stream.

use std::path::Path;

use tokio::io::AsyncWriteExt;

use super::*;

async fn hello_of(bytes: &[u8]) -> io::Result<Hello> {
    let mut reader = bytes;
    read_hello(&mut reader).await
}

#[tokio::test]
async fn a_hello_names_its_channel_and_key_and_nothing_after_it_is_read() {
    let mut stream: &[u8] = b"AGENTRY-POD/1 control agr_abc-123\nAFTER";
    let hello = read_hello(&mut stream).await.unwrap();
    assert_eq!(hello.channel, Channel::Control);
    assert_eq!(hello.key, "agr_abc-123");
    assert_eq!(stream, b"AFTER");
    for channel in Channel::ALL {
        let line = format!("{PROTOCOL} {channel} k\n");
        assert_eq!(hello_of(line.as_bytes()).await.unwrap().channel, channel);
    }
    // The key never shows in a debug print.
    assert!(!format!("{hello:?}").contains("agr_abc"));
}

#[tokio::test]
async fn bad_hellos_are_refused_with_a_sentence() {
    let long = format!("{PROTOCOL} gateway {}\n", "k".repeat(MAX_LINE_BYTES));
    let cases: Vec<(&[u8], &str)> = vec![
        (
            b"AGENTRY-POD/2 gateway k\n",
            "does not start with AGENTRY-POD/1",
        ),
        (b"GET / HTTP/1.1\n", "does not start with AGENTRY-POD/1"),
        (b"AGENTRY-POD/1 shell k\n", "unknown channel \"shell\""),
        (b"AGENTRY-POD/1 Gateway k\n", "unknown channel"),
        (b"AGENTRY-POD/1 gateway\n", "has no key"),
        (b"AGENTRY-POD/1 gateway \n", "has no key"),
        (b"AGENTRY-POD/1 gateway k\xc3\xa9\n", "has no key, or a key"),
        (b"AGENTRY-POD/1 gateway k\r\n", "has no key, or a key"),
        (b"AGENTRY-POD/1 gateway k extra\n", "more than a protocol"),
        (b"AGENTRY-POD/1  gateway k\n", "unknown channel"),
        (b"AGENTRY-POD/1 gateway \xff\n", "not UTF-8"),
        (long.as_bytes(), "longer than 512 bytes"),
    ];
    for (line, why) in cases {
        let err = hello_of(line).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{line:?}");
        assert!(err.to_string().contains(why), "{line:?}: {err}");
    }
    let err = hello_of(b"AGENTRY-POD/1 gateway k").await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
}

/// A line of exactly the limit (newline included) is accepted; one more byte is not.
#[tokio::test]
async fn the_hello_limit_counts_the_newline() {
    let prefix = format!("{PROTOCOL} launch ");
    let fits = format!(
        "{prefix}{}\n",
        "k".repeat(MAX_LINE_BYTES - prefix.len() - 1)
    );
    assert_eq!(fits.len(), MAX_LINE_BYTES);
    assert!(hello_of(fits.as_bytes()).await.is_ok());
    let over = format!("{prefix}{}\n", "k".repeat(MAX_LINE_BYTES - prefix.len()));
    assert!(hello_of(over.as_bytes()).await.is_err());
}

#[tokio::test]
async fn answers_are_one_line() {
    let mut out = Vec::new();
    answer(&mut out, Ok(())).await.unwrap();
    answer(&mut out, Err("no such run:\nthe key\tis unknown"))
        .await
        .unwrap();
    answer(&mut out, Err(&"é".repeat(400))).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.split_terminator('\n').collect();
    assert_eq!(lines.len(), 3, "{text:?}");
    assert_eq!(lines[0], "OK");
    assert_eq!(lines[1], "ERR no such run: the key is unknown");
    assert!(lines[2].len() < MAX_LINE_BYTES && lines[2].starts_with("ERR éé"));
}

/// `connect` against a replica of the test: the hello it reads, and what the pod makes of
/// each answer.
#[tokio::test]
async fn connect_says_hello_and_reads_the_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let replica = tokio::spawn(async move {
        let mut hellos = Vec::new();
        for verdict in [Ok(()), Err("the run is over"), Err("")] {
            let (mut stream, _) = listener.accept().await.unwrap();
            hellos.push(read_hello(&mut stream).await.unwrap());
            answer(&mut stream, verdict).await.unwrap();
            if verdict.is_ok() {
                stream.write_all(b"data").await.unwrap();
            }
        }
        let (mut stream, _) = listener.accept().await.unwrap();
        read_hello(&mut stream).await.unwrap();
        stream.write_all(b"HTTP/1.1 400\n").await.unwrap();
        hellos
    });
    let mut ok = connect(&endpoint, Channel::Proxy, "key-1").await.unwrap();
    let mut data = [0u8; 4];
    ok.read_exact(&mut data).await.unwrap();
    assert_eq!(&data, b"data", "nothing after OK is consumed");
    let err = connect(&endpoint, Channel::Control, "key-2")
        .await
        .unwrap_err();
    assert!(
        err.contains(&endpoint) && err.contains("refused the control connection: the run is over"),
        "{err}"
    );
    connect(&endpoint, Channel::Launch, "k").await.unwrap_err();
    let err = connect(&endpoint, Channel::Gateway, "k").await.unwrap_err();
    assert!(err.contains("something else than OK or ERR"), "{err}");
    let hellos = replica.await.unwrap();
    assert_eq!(hellos[0].channel, Channel::Proxy);
    assert_eq!(hellos[0].key, "key-1");
    assert_eq!(hellos[1].channel, Channel::Control);

    // Nothing listening: the sentence names the endpoint.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = closed.local_addr().unwrap().to_string();
    drop(closed);
    let err = connect(&gone, Channel::Gateway, "k").await.unwrap_err();
    assert!(
        err.contains(&format!("cannot connect to the replica at {gone}")),
        "{err}"
    );
}

#[tokio::test]
async fn frames_round_trip() {
    let frames = vec![
        FromPod::Stdout(b"{\"type\":\"system\"}\n".to_vec()),
        FromPod::Stdout(Vec::new()),
        FromPod::Patch(vec![0u8; MAX_FRAME_BYTES]),
        FromPod::Result(PodResult {
            ended: PodEnded::Exited {
                code: Some(0),
                signal: None,
            },
            stderr_tail: "warn\n".to_owned(),
            failure: None,
            oom_kills: 2,
        }),
        FromPod::Result(PodResult {
            ended: PodEnded::NotStarted,
            stderr_tail: String::new(),
            failure: Some("git init failed".to_owned()),
            oom_kills: 0,
        }),
        FromPod::Result(PodResult {
            ended: PodEnded::Stopped,
            stderr_tail: String::new(),
            failure: None,
            oom_kills: 0,
        }),
    ];
    let mut wire = Vec::new();
    for frame in &frames {
        write_from_pod(&mut wire, frame).await.unwrap();
    }
    let mut reader = wire.as_slice();
    let mut read = Vec::new();
    while let Some(frame) = read_from_pod(&mut reader).await.unwrap() {
        read.push(frame);
    }
    assert_eq!(read, frames);

    let mut wire = Vec::new();
    write_to_pod(&mut wire, &ToPod::Stop).await.unwrap();
    write_to_pod(&mut wire, &ToPod::Stop).await.unwrap();
    assert_eq!(wire, b"S\0\0\0\0S\0\0\0\0");
    let mut reader = wire.as_slice();
    assert_eq!(read_to_pod(&mut reader).await.unwrap(), Some(ToPod::Stop));
    assert_eq!(read_to_pod(&mut reader).await.unwrap(), Some(ToPod::Stop));
    assert_eq!(read_to_pod(&mut reader).await.unwrap(), None);
}

#[tokio::test]
async fn bad_frames_are_refused() {
    // Too large to write.
    let mut wire = Vec::new();
    let err = write_from_pod(&mut wire, &FromPod::Stdout(vec![0; MAX_FRAME_BYTES + 1]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(wire.is_empty(), "nothing of a refused frame is written");

    async fn from_pod(bytes: &[u8]) -> io::Error {
        let mut reader = bytes;
        read_from_pod(&mut reader).await.unwrap_err()
    }
    async fn to_pod(bytes: &[u8]) -> io::Error {
        let mut reader = bytes;
        read_to_pod(&mut reader).await.unwrap_err()
    }
    let over = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
    let oversize = [&[b'O'][..], &over].concat();
    use io::ErrorKind::{InvalidData, UnexpectedEof};
    let cases = [
        (
            from_pod(&oversize).await,
            InvalidData,
            "more than the limit",
        ),
        (from_pod(b"O\0\0").await, UnexpectedEof, "middle of a frame"),
        (
            from_pod(b"O\0\0\0\x05abc").await,
            UnexpectedEof,
            "middle of a frame",
        ),
        (
            from_pod(b"X\0\0\0\0").await,
            InvalidData,
            "unknown frame kind 0x58",
        ),
        (
            from_pod(b"S\0\0\0\0").await,
            InvalidData,
            "unknown frame kind",
        ),
        (
            from_pod(b"R\0\0\0\x02{}").await,
            InvalidData,
            "not a pod result",
        ),
        (to_pod(b"S\0\0\0\x01x").await, InvalidData, "has a payload"),
        (
            to_pod(b"O\0\0\0\0").await,
            InvalidData,
            "unknown frame kind",
        ),
        (to_pod(b"S\0").await, UnexpectedEof, "middle of a frame"),
        (
            to_pod(&[&[b'S'][..], &over].concat()).await,
            InvalidData,
            "limit",
        ),
    ];
    for (i, (err, kind, why)) in cases.into_iter().enumerate() {
        assert_eq!(err.kind(), kind, "case {i}: {err}");
        assert!(err.to_string().contains(why), "case {i}: {err}");
    }
}

fn launch_into(workdir: &Path) -> Launch {
    Launch {
        argv: vec!["sh".into(), "-c".into(), "true".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        stdin: String::new(),
        workdir: workdir.display().to_string(),
        home: "/work/home".into(),
        patch: true,
        stop_grace_ms: 500,
        allow_api_reach: false,
        history: None,
    }
}

/// Sends `launch` and the files of `files` through a real TCP connection and receives them.
async fn round_trip(launch: &Launch, files: &Path, max_bytes: u64) -> Result<Launch, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (launch, files) = (launch.clone(), files.to_owned());
    let sender = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        // The pod may close early when it refuses the files.
        let _ = send_launch(stream, &launch, &files).await;
    });
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let received = receive_launch(stream, max_bytes).await;
    sender.await.unwrap();
    received
}

/// Sends a hand-made launch frame and tar stream (`tar` as given) and receives them.
async fn receive_raw(launch: &Launch, tar: Vec<u8>, max_bytes: u64) -> Result<Launch, String> {
    let mut wire = Vec::new();
    let json = serde_json::to_vec(launch).unwrap();
    write_frame(&mut wire, KIND_LAUNCH, &json).await.unwrap();
    wire.extend(tar);
    receive_launch(wire.as_slice(), max_bytes).await
}

#[tokio::test]
async fn the_files_cross_with_symlinks_as_symlinks_and_without_the_git_entry() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let files = tmp.path().join("files");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(files.join("src/deep")).unwrap();
    std::fs::create_dir_all(files.join("empty")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "outside").unwrap();
    std::fs::write(files.join(".git"), "gitdir: /elsewhere/.git/worktrees/x\n").unwrap();
    std::fs::write(files.join("README.md"), "# hi\n").unwrap();
    std::fs::write(files.join("src/deep/lib.rs"), vec![7u8; 200_000]).unwrap();
    std::fs::write(files.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(files.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&outside, files.join("out")).unwrap();
    std::os::unix::fs::symlink("README.md", files.join("src/readme")).unwrap();

    let workdir = tmp.path().join("pod/repo");
    let launch = launch_into(&workdir);
    let received = round_trip(&launch, &files, u64::MAX).await.unwrap();
    assert_eq!(received, launch);
    assert!(
        !workdir.join(".git").exists(),
        "the worktree's .git is not sent"
    );
    assert_eq!(
        std::fs::read_to_string(workdir.join("README.md")).unwrap(),
        "# hi\n"
    );
    assert_eq!(
        std::fs::read(workdir.join("src/deep/lib.rs")).unwrap(),
        vec![7u8; 200_000]
    );
    assert!(workdir.join("empty").is_dir());
    let mode = std::fs::metadata(workdir.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "the executable bit crosses: {mode:o}");
    assert_eq!(std::fs::read_link(workdir.join("out")).unwrap(), outside);
    assert_eq!(
        std::fs::read_link(workdir.join("src/readme")).unwrap(),
        Path::new("README.md")
    );
}

#[tokio::test]
async fn more_than_the_limit_is_refused_before_it_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let files = tmp.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("a"), vec![1u8; 600]).unwrap();
    std::fs::write(files.join("b"), vec![2u8; 600]).unwrap();
    let workdir = tmp.path().join("repo");
    let err = round_trip(&launch_into(&workdir), &files, 1000)
        .await
        .unwrap_err();
    assert!(err.contains("larger than the limit of 1000 bytes"), "{err}");
    assert!(err.contains("\"b\""), "{err}");
    assert!(workdir.join("a").exists());
    assert!(!workdir.join("b").exists());
    // Exactly at the limit is fine.
    let workdir = tmp.path().join("repo2");
    round_trip(&launch_into(&workdir), &files, 1200)
        .await
        .unwrap();
}

/// A tar header for `path` (written raw, so `..` and absolute paths survive), of `kind`,
/// with `data`.
fn raw_entry(tar: &mut Vec<u8>, path: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut header = tar::Header::new_old();
    let name = &mut header.as_old_mut().name;
    name[..path.len()].copy_from_slice(path.as_bytes());
    if !link.is_empty() {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    header.set_cksum();
    tar.extend_from_slice(header.as_bytes());
    tar.extend_from_slice(data);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
}

fn end_marker(tar: &mut Vec<u8>) {
    tar.extend_from_slice(&[0u8; 1024]);
}

/// One entry of a raw tar stream ([`raw_entry`]): its path, kind, link target and data.
type RawEntry<'a> = (&'a str, tar::EntryType, &'a str, &'a [u8]);

/// A regular file at `path` holding `x`.
fn regular(path: &str) -> RawEntry<'_> {
    (path, tar::EntryType::Regular, "", b"x")
}

/// The raw tar entries of `entries`, without the end marker.
fn raw_entries(entries: &[RawEntry]) -> Vec<u8> {
    let mut tar = Vec::new();
    for &(path, kind, link, data) in entries {
        raw_entry(&mut tar, path, kind, link, data);
    }
    tar
}

/// A whole raw tar stream: the entries of `entries`, then the end marker.
fn raw_archive(entries: &[RawEntry]) -> Vec<u8> {
    let mut tar = raw_entries(entries);
    end_marker(&mut tar);
    tar
}

#[tokio::test]
async fn crafted_archives_write_nothing_outside() {
    use tar::EntryType;
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let outside_text = outside.display().to_string();
    let absolute = format!("{outside_text}/absolute");
    let secret = format!("{outside_text}/secret");
    let link_out = |name| (name, EntryType::Symlink, outside_text.as_str(), &b""[..]);

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            raw_archive(&[regular("../outside/dotdot")]),
            "its path has `..`",
        ),
        (
            raw_archive(&[regular("a/../../outside/dotdot")]),
            "its path has `..`",
        ),
        (raw_archive(&[regular(&absolute)]), "its path is absolute"),
        // A symlink pointing out, then a file written through it.
        (
            raw_archive(&[link_out("link"), regular("link/through")]),
            "cannot unpack \"link/through\"",
        ),
        // A symlink pointing out, then a directory and a file under it.
        (
            raw_archive(&[link_out("link2"), regular("link2/sub/file")]),
            "cannot unpack \"link2/sub/file\"",
        ),
        (
            raw_archive(&[("hard", EntryType::Link, &secret, b"")]),
            "only files, directories and symlinks",
        ),
        (
            raw_archive(&[("fifo", EntryType::Fifo, "", b"")]),
            "only files, directories and symlinks",
        ),
        // Cut at an entry's boundary, without the end marker.
        (
            raw_entries(&[regular("fine")]),
            "ended before its end marker",
        ),
        // Cut inside an entry.
        (
            {
                let mut tar = raw_entries(&[("cut", EntryType::Regular, "", &[1u8; 2000])]);
                tar.truncate(1000);
                tar
            },
            "cannot",
        ),
    ];
    for (i, (tar, why)) in cases.into_iter().enumerate() {
        let workdir = tmp.path().join(format!("repo{i}"));
        let err = receive_raw(&launch_into(&workdir), tar, u64::MAX)
            .await
            .unwrap_err();
        assert!(err.contains(why), "case {i}: {err}");
        let written: Vec<_> = std::fs::read_dir(&outside).unwrap().collect();
        assert!(written.is_empty(), "case {i}: wrote outside: {written:?}");
    }

    // A symlink pointing out is made as a symlink, and a later file of its name replaces
    // the link instead of writing through it.
    let target = format!("{outside_text}/target");
    let tar = raw_archive(&[
        ("link", EntryType::Symlink, &target, b""),
        ("link", EntryType::Regular, "", b"mine"),
    ]);
    let workdir = tmp.path().join("replace");
    receive_raw(&launch_into(&workdir), tar, u64::MAX)
        .await
        .unwrap();
    assert_eq!(std::fs::read(workdir.join("link")).unwrap(), b"mine");
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
}

#[tokio::test]
async fn a_launch_with_relative_directories_is_refused() {
    let mut launch = launch_into(Path::new("repo"));
    let tar = raw_archive(&[]);
    let err = receive_raw(&launch, tar.clone(), 10).await.unwrap_err();
    assert!(
        err.contains("workdir \"repo\" is not an absolute path"),
        "{err}"
    );
    launch.workdir = "/nonexistent-agentry/repo".into();
    launch.home = "home".into();
    let err = receive_raw(&launch, tar, 10).await.unwrap_err();
    assert!(
        err.contains("home \"home\" is not an absolute path"),
        "{err}"
    );
    let err = receive_launch(&b"O\0\0\0\0"[..], 10).await.unwrap_err();
    assert!(err.contains("instead of the launch"), "{err}");
    let err = receive_launch(&b""[..], 10).await.unwrap_err();
    assert!(err.contains("closed the launch connection"), "{err}");
}

/// A pod connection whose peer vanishes without a FIN (a lost node) must fail within about
/// a minute, not wait for ever: both ends probe an idle connection. `connect` (the pod's
/// end) sets it on the stream it returns.
#[tokio::test]
async fn both_ends_of_a_pod_connection_notice_a_vanished_peer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let replica = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        detect_dead_peer(&stream).unwrap();
        read_hello(&mut stream).await.unwrap();
        answer(&mut stream, Ok(())).await.unwrap();
        stream
    });
    let pod = connect(&endpoint, Channel::Control, "k").await.unwrap();
    let replica = replica.await.unwrap();
    for stream in [&pod, &replica] {
        let socket = socket2::SockRef::from(stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
    }
}
