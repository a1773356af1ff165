//! The forwarder inside a sandbox with a network of its own (`agentry sandbox-net`, also the
//! `agentry-sandbox-net` test binary): it listens on ports of the sandbox's loopback, passes
//! every connection to a Unix socket of the service, and runs the agent.
//!
//! ```text
//! agentry sandbox-net [--rlimit NAME=VALUE]... [--listen PORT=SOCKET_PATH]... \
//!                     -- PROGRAM [ARGS...]
//! agentry sandbox-net --rlimit NPROC=512 --rlimit NOFILE=4096 \
//!                     --listen 4810=/run/agentry/gateway.sock \
//!                     --listen 4811=/run/agentry/proxy.sock -- PROGRAM [ARGS...]
//! ```
//!
//! It is the first process of every sandbox (docs/security.md#resource-limits), with no
//! `--listen` at all when the sandbox has no network of its own. In this order: each
//! `--rlimit` (`NPROC`, `NOFILE`, `FSIZE`, `DATA`, `AS`; the value a whole number) is set
//! as both the soft and the hard limit of the forwarder itself, so that the program and
//! everything it starts inherit it and cannot raise it; `SIGINT`, `SIGTERM` and `SIGHUP` are caught and ignored (the stop ladder
//! signals every process of the sandbox's process group: the agent must get the time to
//! print what it spent, with its connections still forwarded, so the forwarder never dies
//! of them first; handlers, unlike an ignored disposition, are not inherited by the
//! program); the listeners are bound on `127.0.0.1`; `PROGRAM` is started with this
//! process's stdin, stdout, stderr, environment and working directory. Every accepted TCP
//! connection gets a new connection to its socket and bytes are copied both ways (a half
//! close is passed on). When `PROGRAM` exits, so does the forwarder, with its exit code, or
//! 128 + the signal's number if a signal killed it.
//!
//! Its own failures are one line on stderr starting with `agentry sandbox-net:` and an exit
//! code as `env` and shells use them: [`EXIT_FAILED`] (bad arguments, a port that cannot be
//! bound, …), [`EXIT_CANNOT_EXECUTE`] (`PROGRAM` found but not executable),
//! [`EXIT_NOT_FOUND`] (`PROGRAM` not found).

use std::ffi::{OsStr, OsString};
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The exit code of a forwarder that failed itself (bad arguments, a port it could not
/// bind, no runtime, waiting for the program failed).
pub const EXIT_FAILED: i32 = 125;

/// The exit code when the program was found but could not be executed.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;

/// The exit code when the program was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// The prefix of every message the forwarder prints.
const PREFIX: &str = "agentry sandbox-net:";

/// How long the forwarder waits before accepting again after an accept failed (out of file
/// descriptors…), so that a persistent failure does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What the forwarder was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwarderArgs {
    /// The resource limits to set (soft and hard) before the program starts.
    pub rlimits: Vec<(Rlimit, u64)>,
    /// The loopback ports to listen on, each with the Unix socket its connections go to
    /// (none: nothing is forwarded).
    pub listen: Vec<(u16, PathBuf)>,
    /// The program to run.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl ForwarderArgs {
    /// Reads `--rlimit NAME=VALUE` (each name once) and `--listen PORT=SOCKET_PATH` (or
    /// `--listen=PORT=SOCKET_PATH`; each port once), then `--` then the program and its
    /// arguments (`args` without the forwarder's own name). The `--` may be left out when
    /// the program's name does not start with `-`.
    ///
    /// # Errors
    ///
    /// A sentence saying what is wrong with the arguments.
    pub fn parse(args: Vec<OsString>) -> Result<ForwarderArgs, String> {
        let mut listen: Vec<(u16, PathBuf)> = Vec::new();
        let mut rlimits: Vec<(Rlimit, u64)> = Vec::new();
        let mut rest = args.into_iter();
        let program = loop {
            let Some(arg) = rest.next() else {
                return Err("no program to run: expected `-- PROGRAM [ARGS...]`".to_owned());
            };
            let value = if arg == "--" {
                break rest.next().ok_or_else(|| {
                    "no program to run after `--`: expected `-- PROGRAM [ARGS...]`".to_owned()
                })?;
            } else if arg == "--rlimit" || arg.to_string_lossy().starts_with("--rlimit=") {
                let value = match arg.to_str().and_then(|a| a.strip_prefix("--rlimit=")) {
                    Some(value) => OsString::from(value),
                    None => rest
                        .next()
                        .ok_or_else(|| "--rlimit needs a value NAME=VALUE".to_owned())?,
                };
                let (resource, value) = rlimit_value(&value)?;
                if rlimits.iter().any(|(r, _)| *r == resource) {
                    return Err(format!(
                        "--rlimit {} is given more than once",
                        resource.name()
                    ));
                }
                rlimits.push((resource, value));
                continue;
            } else if arg == "--listen" {
                rest.next()
                    .ok_or_else(|| "--listen needs a value PORT=SOCKET_PATH".to_owned())?
            } else if let Some(value) = arg.to_str().and_then(|a| a.strip_prefix("--listen=")) {
                OsString::from(value)
            } else if arg.to_string_lossy().starts_with('-') {
                return Err(format!(
                    "unknown option {:?}: expected --rlimit NAME=VALUE, --listen \
                     PORT=SOCKET_PATH or `--`",
                    arg.to_string_lossy()
                ));
            } else {
                break arg;
            };
            let (port, path) = listen_value(&value)?;
            if listen.iter().any(|(p, _)| *p == port) {
                return Err(format!("port {port} is given more than once"));
            }
            listen.push((port, path));
        };
        Ok(ForwarderArgs {
            rlimits,
            listen,
            program,
            args: rest.collect(),
        })
    }
}

/// A resource `--rlimit` limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rlimit {
    /// `NPROC`: processes (and threads) of the user.
    Nproc,
    /// `NOFILE`: open file descriptors.
    Nofile,
    /// `FSIZE`: the largest file written, in bytes.
    Fsize,
    /// `DATA`: the data segment (heap, private writable mappings), in bytes.
    Data,
    /// `AS`: the address space, in bytes.
    As,
}

impl Rlimit {
    /// Every resource, with its name.
    const ALL: [(Rlimit, &'static str); 5] = [
        (Rlimit::Nproc, "NPROC"),
        (Rlimit::Nofile, "NOFILE"),
        (Rlimit::Fsize, "FSIZE"),
        (Rlimit::Data, "DATA"),
        (Rlimit::As, "AS"),
    ];

    /// The name used by `--rlimit` (`NPROC`…).
    pub fn name(self) -> &'static str {
        Rlimit::ALL
            .iter()
            .find(|(r, _)| *r == self)
            .map(|(_, name)| *name)
            .unwrap_or_default()
    }

    fn resource(self) -> nix::sys::resource::Resource {
        use nix::sys::resource::Resource;
        match self {
            Rlimit::Nproc => Resource::RLIMIT_NPROC,
            Rlimit::Nofile => Resource::RLIMIT_NOFILE,
            Rlimit::Fsize => Resource::RLIMIT_FSIZE,
            Rlimit::Data => Resource::RLIMIT_DATA,
            Rlimit::As => Resource::RLIMIT_AS,
        }
    }
}

/// One `--rlimit` value: `NAME=VALUE`, the name one of [`Rlimit`]'s, the value a whole
/// number.
fn rlimit_value(value: &OsStr) -> Result<(Rlimit, u64), String> {
    let text = value.to_string_lossy();
    let (name, number) = text
        .split_once('=')
        .ok_or_else(|| format!("bad --rlimit value {text:?}: expected NAME=VALUE"))?;
    let resource = Rlimit::ALL
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(r, _)| *r)
        .ok_or_else(|| {
            format!("unknown --rlimit {name:?}: expected NPROC, NOFILE, FSIZE, DATA or AS")
        })?;
    let number = number
        .parse::<u64>()
        .map_err(|_| format!("bad --rlimit value {text:?}: expected a whole number"))?;
    Ok((resource, number))
}

/// Sets each limit as the soft and hard limit of this process.
fn set_rlimits(rlimits: &[(Rlimit, u64)]) -> Result<(), String> {
    for (resource, value) in rlimits {
        nix::sys::resource::setrlimit(resource.resource(), *value, *value)
            .map_err(|e| format!("cannot set the limit {}={value}: {e}", resource.name()))?;
    }
    Ok(())
}

/// One `--listen` value: `PORT=SOCKET_PATH`, the port from 1 to 65535, the path not empty.
fn listen_value(value: &OsStr) -> Result<(u16, PathBuf), String> {
    let text = value.to_string_lossy();
    let bad = || format!("bad --listen value {text:?}: expected PORT=SOCKET_PATH");
    let bytes = value.as_encoded_bytes();
    let eq = bytes.iter().position(|b| *b == b'=').ok_or_else(bad)?;
    let port = std::str::from_utf8(&bytes[..eq])
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("bad port in --listen value {text:?}: expected 1 to 65535"))?;
    let path = value
        .to_str()
        .map(|v| v[eq + 1..].to_owned())
        .map(PathBuf::from)
        .or_else(|| {
            // Not UTF-8: split the raw bytes (the `=` is ASCII, so both halves stay valid
            // platform strings).
            use std::os::unix::ffi::OsStrExt;
            Some(PathBuf::from(OsStr::from_bytes(&bytes[eq + 1..])))
        })
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(bad)?;
    Ok((port, path))
}

/// Runs the forwarder with `args` (the arguments after its own name or subcommand: see the
/// module docs) and returns the process's exit code: the program's, 128 + the number of the
/// signal that killed it, or [`EXIT_FAILED`], [`EXIT_CANNOT_EXECUTE`] or
/// [`EXIT_NOT_FOUND`] (with one line on stderr) when the forwarder could not do its part.
pub fn forwarder_main(args: Vec<OsString>) -> i32 {
    let args = match ForwarderArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{PREFIX} {message}");
            return EXIT_FAILED;
        }
    };
    if let Err(message) = set_rlimits(&args.rlimits) {
        eprintln!("{PREFIX} {message}");
        return EXIT_FAILED;
    }
    let Some(runtime) = start_runtime(tokio::runtime::Builder::new_current_thread(), PREFIX) else {
        return EXIT_FAILED;
    };
    runtime.block_on(forward(args))
}

/// The async runtime `builder` makes (with all its drivers) for a program of the sandbox or
/// the pod; `None`, with a line on stderr starting with `prefix`, when it cannot be started.
pub(crate) fn start_runtime(
    mut builder: tokio::runtime::Builder,
    prefix: &str,
) -> Option<tokio::runtime::Runtime> {
    match builder.enable_all().build() {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("{prefix} cannot start the async runtime: {e}");
            None
        }
    }
}

/// The forwarder, once its arguments are read.
async fn forward(args: ForwarderArgs) -> i32 {
    // Caught and ignored: as long as these streams live, a signal only marks them (they are
    // never read), and since tokio never removes its handlers, afterwards too.
    let mut signals: Vec<Signal> = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        match signal(kind) {
            Ok(stream) => signals.push(stream),
            Err(e) => {
                eprintln!("{PREFIX} cannot handle signal {}: {e}", kind.as_raw_value());
                return EXIT_FAILED;
            }
        }
    }
    let mut listeners = Vec::new();
    for (port, socket) in args.listen {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            Ok(listener) => listeners.push((listener, socket)),
            Err(e) => {
                eprintln!("{PREFIX} cannot listen on 127.0.0.1:{port}: {e}");
                return EXIT_FAILED;
            }
        }
    }
    let mut child = match tokio::process::Command::new(&args.program)
        .args(&args.args)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let program = PathBuf::from(&args.program);
            eprintln!("{PREFIX} cannot run {}: {e}", program.display());
            return if e.kind() == io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            };
        }
    };
    for (listener, socket) in listeners {
        tokio::spawn(serve(listener, socket));
    }
    let status = child.wait().await;
    // The handlers stay until the end (they only had to be there while the program ran).
    drop(signals);
    match status {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(EXIT_FAILED),
        Err(e) => {
            eprintln!("{PREFIX} waiting for the program failed: {e}");
            EXIT_FAILED
        }
    }
}

/// Accepts connections on `listener` for as long as the forwarder runs, each passed to
/// `socket`.
async fn serve(listener: TcpListener, socket: PathBuf) {
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                tokio::spawn(pass(tcp, socket.clone()));
            }
            Err(e) => {
                eprintln!("{PREFIX} accepting a connection failed: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}

/// Copies bytes between `tcp` and a new connection to `socket`, both ways, until both
/// sides have closed; a side that cannot be reached closes `tcp`.
async fn pass(mut tcp: TcpStream, socket: PathBuf) {
    let mut unix = match UnixStream::connect(&socket).await {
        Ok(unix) => unix,
        Err(e) => {
            eprintln!("{PREFIX} cannot connect to {}: {e}", socket.display());
            return;
        }
    };
    // A reset or a broken pipe on either side ends the connection; nothing to report.
    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn listens_then_the_program_and_its_arguments() {
        let parsed = ForwarderArgs::parse(args(&[
            "--listen",
            "4810=/run/agentry/gateway.sock",
            "--listen=4811=/run/agentry/proxy.sock",
            "--",
            "/usr/bin/claude",
            "-p",
            "--",
            "--listen",
        ]))
        .unwrap();
        assert_eq!(
            parsed,
            ForwarderArgs {
                rlimits: Vec::new(),
                listen: vec![
                    (4810, PathBuf::from("/run/agentry/gateway.sock")),
                    (4811, PathBuf::from("/run/agentry/proxy.sock")),
                ],
                program: "/usr/bin/claude".into(),
                args: args(&["-p", "--", "--listen"]),
            }
        );
        // Without `--`, the first argument that is not an option is the program.
        let parsed = ForwarderArgs::parse(args(&["--listen", "1=a=b", "prog", "--x"])).unwrap();
        assert_eq!(parsed.listen, vec![(1, PathBuf::from("a=b"))]);
        assert_eq!(parsed.program, "prog");
        assert_eq!(parsed.args, args(&["--x"]));
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        // The command line's words, and what the refusal says.
        let cases = [
            ("", "no program to run"),
            ("--listen 4810=/s", "no program to run"),
            ("--listen 4810=/s --", "no program to run after `--`"),
            ("--rlimit", "--rlimit needs a value"),
            ("--rlimit NPROC -- p", "expected NAME=VALUE"),
            ("--rlimit CPU=1 -- p", "unknown --rlimit \"CPU\""),
            ("--rlimit NPROC=-1 -- p", "expected a whole number"),
            (
                "--rlimit NPROC=1 --rlimit=NPROC=2 -- p",
                "--rlimit NPROC is given more than once",
            ),
            ("--listen", "--listen needs a value"),
            ("--listen 4810 -- p", "expected PORT=SOCKET_PATH"),
            ("--listen 4810= -- p", "expected PORT=SOCKET_PATH"),
            ("--listen 0=/s -- p", "bad port"),
            ("--listen 65536=/s -- p", "bad port"),
            ("--listen x=/s -- p", "bad port"),
            ("--listen =/s -- p", "bad port"),
            (
                "--listen 1=/a --listen 1=/b -- p",
                "port 1 is given more than once",
            ),
            ("--verbose -- p", "unknown option \"--verbose\""),
        ];
        for (line, why) in cases {
            let list: Vec<&str> = line.split_whitespace().collect();
            let err = ForwarderArgs::parse(args(&list)).unwrap_err();
            assert!(err.contains(why), "{list:?}: {err}");
        }
    }

    /// Limits and no listener at all (a sandbox without a network): the forwarder only
    /// sets the limits and runs the program.
    #[test]
    fn rlimits_without_listeners() {
        let parsed = ForwarderArgs::parse(args(&[
            "--rlimit",
            "NPROC=512",
            "--rlimit=FSIZE=1073741824",
            "--",
            "prog",
            "x",
        ]))
        .unwrap();
        assert_eq!(
            parsed.rlimits,
            vec![(Rlimit::Nproc, 512), (Rlimit::Fsize, 1 << 30)]
        );
        assert!(parsed.listen.is_empty());
        assert_eq!(parsed.program, "prog");
        assert_eq!(
            ForwarderArgs::parse(args(&["prog"])).unwrap().program,
            "prog"
        );
    }

    #[test]
    fn bad_arguments_exit_125() {
        assert_eq!(forwarder_main(args(&["--listen", "nope"])), EXIT_FAILED);
    }

    #[test]
    fn a_socket_path_need_not_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let mut value = b"4810=/run/\xff.sock".to_vec();
        let parsed = ForwarderArgs::parse(vec![
            "--listen".into(),
            OsString::from_vec(std::mem::take(&mut value)),
            "--".into(),
            "p".into(),
        ])
        .unwrap();
        assert_eq!(
            parsed.listen[0].1.as_os_str().as_encoded_bytes(),
            b"/run/\xff.sock"
        );
    }
}
