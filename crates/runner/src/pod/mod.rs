//! The agent's pod (docs/security.md#the-agents-pod): the wire protocol between a replica
//! and `agentry pod-run`, and pod-run itself ([`pod_run_main`]).
//!
//! On Kubernetes every agent run is a Job whose pod runs `agentry pod-run`. Git and every
//! credential stay in the replica that claimed the run; the pod reaches that replica over
//! TCP at one address (its *pod endpoint*) and every connection starts with a hello line
//! naming its [`Channel`] and the run's key:
//!
//! ```text
//! pod     -> replica   AGENTRY-POD/1 <gateway|proxy|launch|control> <key>\n
//! replica -> pod       OK\n                       (or ERR <sentence>\n, then close)
//! ```
//!
//! After `OK` the connection carries, by channel:
//!
//! - **launch** (replica to pod, once): one frame with the [`Launch`] as JSON, then the
//!   run's files as a tar stream until the replica closes its side ([`send_launch`],
//!   [`receive_launch`]).
//! - **control** (both ways, for the whole run): frames [`FromPod`] (the agent's stdout as
//!   it comes, the patch in chunks, then the [`PodResult`]) and [`ToPod`] (`Stop`). The
//!   replica keeps its side open until it has read the result, then closes; a control
//!   connection that ends earlier means the replica is gone and the agent is stopped.
//! - **gateway**, **proxy**: the bytes of one connection the agent made to
//!   `127.0.0.1:4810` (the model gateway) or `127.0.0.1:4811` (the egress proxy), both ways.
//!
//! A frame is 1 byte of kind, a big-endian `u32` length and that many bytes of payload (at
//! most [`MAX_FRAME_BYTES`]).

use std::fmt;
use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

mod launch;
mod run;

pub use launch::{receive_launch, send_launch};
pub use run::{
    DEFAULT_MAX_WORKSPACE_BYTES, ENV_ENDPOINT, ENV_KEY, ENV_LISTEN_PORTS, ENV_MAX_WORKSPACE_BYTES,
    EXIT_FAILED, pod_run_main,
};

/// The protocol's name and version, the first word of every hello.
pub const PROTOCOL: &str = "AGENTRY-POD/1";

/// The longest hello line and the longest answer line, newline included.
pub const MAX_LINE_BYTES: usize = 512;

/// The largest payload of one frame: 4 MiB.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// How long [`connect`] waits for the connection and the replica's answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What a connection from a pod carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// One connection of the agent to the model gateway.
    Gateway,
    /// One connection of the agent to the egress proxy.
    Proxy,
    /// The run's launch: its [`Launch`] and its files.
    Launch,
    /// The run's control connection: stdout, patch and result to the replica, stop to the
    /// pod.
    Control,
    /// The history of the run's commit ([`Launch::history`]): a git bundle, raw until the
    /// replica closes.
    History,
}

impl Channel {
    /// Every channel.
    const ALL: [Channel; 5] = [
        Channel::Gateway,
        Channel::Proxy,
        Channel::Launch,
        Channel::Control,
        Channel::History,
    ];

    /// The channel's word in a hello (`gateway`, `proxy`, `launch`, `control`, `history`).
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Gateway => "gateway",
            Channel::Proxy => "proxy",
            Channel::Launch => "launch",
            Channel::Control => "control",
            Channel::History => "history",
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first line of a connection from a pod.
#[derive(Clone, PartialEq, Eq)]
pub struct Hello {
    /// What the connection carries.
    pub channel: Channel,
    /// The run's key, as the pod holds it (to be checked by the replica).
    pub key: String,
}

/// Never shows the key.
impl fmt::Debug for Hello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hello")
            .field("channel", &self.channel)
            .field("key", &"…")
            .finish()
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Reads one line of at most [`MAX_LINE_BYTES`] (newline included) byte by byte, so that
/// nothing after the newline is consumed; returns it without the newline. `what` names the
/// line in errors.
async fn read_line<R: AsyncRead + Unpin>(r: &mut R, what: &str) -> io::Result<String> {
    let mut line = Vec::with_capacity(64);
    loop {
        let mut byte = [0u8; 1];
        let n = r.read(&mut byte).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the connection ended before the end of the {what} line"),
            ));
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() >= MAX_LINE_BYTES {
            return Err(invalid(format!(
                "the {what} line is longer than {MAX_LINE_BYTES} bytes"
            )));
        }
    }
    String::from_utf8(line).map_err(|_| invalid(format!("the {what} line is not UTF-8")))
}

/// Replica: reads the first line of a connection from a pod,
/// `AGENTRY-POD/1 <gateway|proxy|launch|control> <key>\n` (at most [`MAX_LINE_BYTES`]),
/// byte by byte: nothing after the newline is consumed.
///
/// # Errors
///
/// An I/O error, or [`io::ErrorKind::InvalidData`] with a sentence for a line that is not a
/// hello: too long, not UTF-8, another protocol, an unknown channel, a key that is empty or
/// holds other than visible ASCII, extra words.
pub async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Hello> {
    let line = read_line(r, "hello").await?;
    let mut words = line.split(' ');
    let protocol = words.next().unwrap_or_default();
    if protocol != PROTOCOL {
        return Err(invalid(format!(
            "the hello does not start with {PROTOCOL} (another protocol or version)"
        )));
    }
    let channel_word = words.next().unwrap_or_default();
    let channel = Channel::ALL
        .into_iter()
        .find(|c| c.as_str() == channel_word)
        .ok_or_else(|| {
            invalid(format!(
                "unknown channel {:?} in the hello: expected gateway, proxy, launch or control",
                excerpt(channel_word)
            ))
        })?;
    let key = words.next().unwrap_or_default();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "the hello has no key, or a key with other than visible ASCII characters".to_owned(),
        ));
    }
    if words.next().is_some() {
        return Err(invalid(
            "the hello has more than a protocol, a channel and a key".to_owned(),
        ));
    }
    Ok(Hello {
        channel,
        key: key.to_owned(),
    })
}

/// At most 40 characters of `text`, for an error message.
fn excerpt(text: &str) -> String {
    agentry_domain::quote::excerpt(text, 40)
}

/// Replica: answers a hello: `OK\n`, or `ERR <sentence>\n` (line breaks and other control
/// characters of the sentence become spaces; cut to fit [`MAX_LINE_BYTES`]).
///
/// # Errors
///
/// Writing failed.
pub async fn answer<W: AsyncWrite + Unpin>(w: &mut W, verdict: Result<(), &str>) -> io::Result<()> {
    let line = match verdict {
        Ok(()) => "OK\n".to_owned(),
        Err(sentence) => {
            let mut line = String::from("ERR ");
            for c in sentence.chars() {
                let c = if c.is_control() { ' ' } else { c };
                if line.len() + c.len_utf8() > MAX_LINE_BYTES - 1 {
                    break;
                }
                line.push(c);
            }
            line.push('\n');
            line
        }
    };
    w.write_all(line.as_bytes()).await?;
    w.flush().await
}

/// How long a pod connection may be idle before TCP probes its peer.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// The time between two probes of an idle pod connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How many probes go unanswered before the connection is given up.
pub const KEEPALIVE_PROBES: u32 = 3;

/// Both ends: makes a pod connection fail, instead of waiting for ever, when its peer is gone
/// without closing it (its node lost power or its network): TCP probes an idle connection
/// ([`KEEPALIVE_IDLE`], then every [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`] times); a
/// read then fails, and the run ends as its pod's death does, about a minute later instead
/// of at its time limit. (No user timeout: it would also end a live connection whose reader
/// paused, a model stream the agent reads slowly.)
///
/// # Errors
///
/// The socket options could not be set.
pub fn detect_dead_peer(stream: &TcpStream) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&keepalive)
}

/// Pod: connects to the replica at `endpoint` (`host:port`), says hello for `channel` with
/// `key` and reads the answer (within [`CONNECT_TIMEOUT`]). After `Ok` the stream carries
/// the channel's bytes; nothing of them was consumed.
///
/// # Errors
///
/// A sentence naming the endpoint and the replica's `ERR` sentence, or the I/O error.
pub async fn connect(endpoint: &str, channel: Channel, key: &str) -> Result<TcpStream, String> {
    let attempt = async {
        let mut stream = TcpStream::connect(endpoint)
            .await
            .map_err(|e| format!("cannot connect to the replica at {endpoint}: {e}"))?;
        // Frames are small and should go at once (stdout as the agent prints it).
        let _ = stream.set_nodelay(true);
        if let Err(e) = detect_dead_peer(&stream) {
            tracing::warn!(error = %e, "cannot set keepalive on the connection to the replica");
        }
        let hello = format!("{PROTOCOL} {channel} {key}\n");
        stream
            .write_all(hello.as_bytes())
            .await
            .map_err(|e| format!("cannot say hello to the replica at {endpoint}: {e}"))?;
        let line = read_line(&mut stream, "answer").await.map_err(|e| {
            format!("the replica at {endpoint} did not answer the {channel} hello: {e}")
        })?;
        if line == "OK" {
            Ok(stream)
        } else if let Some(sentence) = line.strip_prefix("ERR ") {
            Err(format!(
                "the replica at {endpoint} refused the {channel} connection: {sentence}"
            ))
        } else {
            Err(format!(
                "the replica at {endpoint} answered the {channel} hello with something else \
                 than OK or ERR: {:?}",
                excerpt(&line)
            ))
        }
    };
    tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the replica at {endpoint} did not answer the {channel} hello within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })
}

/// What pod-run is to do, sent by the replica on the launch connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Launch {
    /// The agent's program and its arguments.
    pub argv: Vec<String>,
    /// The agent's whole environment (it includes the run's key as its API key); nothing
    /// of pod-run's is inherited.
    pub env: Vec<(String, String)>,
    /// What the agent reads on its stdin (its instructions), which is then closed.
    pub stdin: String,
    /// Where the files go and the agent runs (an absolute path, e.g. `/work/repo`).
    pub workdir: String,
    /// The agent's `HOME` (an absolute path, e.g. `/work/home`), created if missing.
    pub home: String,
    /// Whether to return the agent's change as a patch (false for review runs).
    pub patch: bool,
    /// The time each step of the SIGINT → SIGTERM → SIGKILL ladder gets, in milliseconds.
    pub stop_grace_ms: u64,
    /// Skip the check that the Kubernetes API is out of the pod's reach.
    pub allow_api_reach: bool,
    /// The commit the files are (the worktree's base), when the replica sends its history on
    /// the [`Channel::History`] connection: a git bundle of the default branch (and of the
    /// pull request's branch for a review or a revision) as `refs/remotes/origin/*`. The
    /// pod's repository is then that history, its `HEAD` this commit (detached), so that
    /// `git diff origin/<base>...HEAD` and `git log` work as in a local worktree. `None`: a
    /// repository of one commit of the files.
    #[serde(default)]
    pub history: Option<String>,
}

/// A frame from the pod to the replica, on the control connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromPod {
    /// A chunk of the agent's stdout, as it came.
    Stdout(Vec<u8>),
    /// One chunk of the patch (`git diff --binary` against the base commit); many may
    /// follow, and the patch is their concatenation. Only for a run whose [`PodResult`] has
    /// no failure.
    Patch(Vec<u8>),
    /// How the run ended; the last frame.
    Result(PodResult),
}

/// A frame from the replica to the pod, on the control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToPod {
    /// Stop the agent (the SIGINT → SIGTERM → SIGKILL ladder).
    Stop,
}

/// How a pod run ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodResult {
    /// How the agent ended.
    pub ended: PodEnded,
    /// The end of the agent's stderr (at most [`crate::process::STDERR_TAIL_BYTES`]).
    pub stderr_tail: String,
    /// A sentence when pod-run itself failed (then [`PodResult::ended`] is
    /// [`PodEnded::NotStarted`], or how the agent ended when the failure came after it,
    /// and the patch frames, if any, are not to be used).
    pub failure: Option<String>,
    /// How many of the pod's processes the kernel's OOM killer ended while the agent ran
    /// (read from the container's memory cgroup; 0 where it cannot be read).
    #[serde(default)]
    pub oom_kills: u64,
}

/// How the agent of a pod run ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum PodEnded {
    /// It exited on its own: with an exit code, or killed by a signal pod-run did not send.
    Exited {
        /// The exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
    /// It was stopped (a `Stop` frame, a signal to pod-run, or the control connection
    /// ending).
    Stopped,
    /// It was never started.
    NotStarted,
}

/// Frame kinds.
const KIND_LAUNCH: u8 = b'L';
const KIND_STDOUT: u8 = b'O';
const KIND_PATCH: u8 = b'P';
const KIND_RESULT: u8 = b'R';
const KIND_STOP: u8 = b'S';

/// Writes one frame: `kind`, the payload's length as a big-endian `u32`, the payload.
async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, kind: u8, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} bytes is larger than the limit of {MAX_FRAME_BYTES}",
                payload.len()
            ),
        ));
    }
    let length = u32::try_from(payload.len()).map_err(io::Error::other)?;
    let mut header = [0u8; 5];
    header[0] = kind;
    header[1..].copy_from_slice(&length.to_be_bytes());
    w.write_all(&header).await?;
    w.write_all(payload).await?;
    w.flush().await
}

/// Reads one frame; `None` at a clean end of the stream (before its first byte).
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut kind = [0u8; 1];
    if r.read(&mut kind).await? == 0 {
        return Ok(None);
    }
    let mut length = [0u8; 4];
    let mid_frame = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection ended in the middle of a frame",
            )
        } else {
            e
        }
    };
    r.read_exact(&mut length).await.map_err(mid_frame)?;
    let length = u32::from_be_bytes(length) as usize;
    if length > MAX_FRAME_BYTES {
        return Err(invalid(format!(
            "a frame announces {length} bytes, more than the limit of {MAX_FRAME_BYTES}"
        )));
    }
    let mut payload = vec![0u8; length];
    r.read_exact(&mut payload).await.map_err(mid_frame)?;
    Ok(Some((kind[0], payload)))
}

/// Writes one [`FromPod`] frame (a [`PodResult`] as JSON).
///
/// # Errors
///
/// Writing failed, or the payload is larger than [`MAX_FRAME_BYTES`]
/// ([`io::ErrorKind::InvalidInput`]).
pub async fn write_from_pod<W: AsyncWrite + Unpin>(w: &mut W, frame: &FromPod) -> io::Result<()> {
    match frame {
        FromPod::Stdout(bytes) => write_frame(w, KIND_STDOUT, bytes).await,
        FromPod::Patch(bytes) => write_frame(w, KIND_PATCH, bytes).await,
        FromPod::Result(result) => {
            let json = serde_json::to_vec(result).map_err(io::Error::other)?;
            write_frame(w, KIND_RESULT, &json).await
        }
    }
}

/// Reads one [`FromPod`] frame; `None` at a clean end of the stream.
///
/// # Errors
///
/// Reading failed, the stream ended in the middle of a frame
/// ([`io::ErrorKind::UnexpectedEof`]), or the frame is not one from a pod: an unknown kind,
/// a length over [`MAX_FRAME_BYTES`], a result that is not a [`PodResult`]
/// ([`io::ErrorKind::InvalidData`]).
pub async fn read_from_pod<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<FromPod>> {
    let Some((kind, payload)) = read_frame(r).await? else {
        return Ok(None);
    };
    let frame = match kind {
        KIND_STDOUT => FromPod::Stdout(payload),
        KIND_PATCH => FromPod::Patch(payload),
        KIND_RESULT => FromPod::Result(
            serde_json::from_slice(&payload)
                .map_err(|e| invalid(format!("a result frame is not a pod result: {e}")))?,
        ),
        other => {
            return Err(invalid(format!(
                "unknown frame kind {other:#04x} from the pod"
            )));
        }
    };
    Ok(Some(frame))
}

/// Writes one [`ToPod`] frame.
///
/// # Errors
///
/// Writing failed.
pub async fn write_to_pod<W: AsyncWrite + Unpin>(w: &mut W, frame: &ToPod) -> io::Result<()> {
    match frame {
        ToPod::Stop => write_frame(w, KIND_STOP, &[]).await,
    }
}

/// Reads one [`ToPod`] frame; `None` at a clean end of the stream.
///
/// # Errors
///
/// Reading failed, the stream ended in the middle of a frame, or the frame is not one to a
/// pod (an unknown kind, a stop with a payload, a length over [`MAX_FRAME_BYTES`]).
pub async fn read_to_pod<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<ToPod>> {
    let Some((kind, payload)) = read_frame(r).await? else {
        return Ok(None);
    };
    match kind {
        KIND_STOP if payload.is_empty() => Ok(Some(ToPod::Stop)),
        KIND_STOP => Err(invalid("a stop frame has a payload".to_owned())),
        other => Err(invalid(format!(
            "unknown frame kind {other:#04x} from the replica"
        ))),
    }
}

#[cfg(test)]
mod tests;
