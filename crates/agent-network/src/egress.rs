//! The egress proxy: a sandboxed agent's only way to the network besides the model gateway.
//!
//! Each sandboxed run gets its own proxy socket (a Unix socket, reached from inside the
//! sandbox through the forwarder as `HTTPS_PROXY`/`HTTP_PROXY`), served by [`serve`] with the
//! run's [`EgressPolicy`]: the union of the repository's `egressAllow` setting and the
//! instance's `AGENTRY_EGRESS_ALLOW`.
//!
//! A connection sends one request head (at most [`MAX_HEAD_BYTES`], within [`HEAD_TIMEOUT`],
//! else `431` or `408`):
//!
//! - `CONNECT host:port`: when allowed, the proxy answers `200 Connection established` and
//!   passes bytes both ways. TLS is passed through, never opened.
//! - An absolute-form plain HTTP request, `GET http://host[:port]/path HTTP/1.1`: when
//!   allowed, the proxy connects and sends the request with an origin-form target (`/path`),
//!   `Host` set to the target, without `Proxy-*` and hop-by-hop headers, with `Connection:
//!   close`, then passes bytes both ways.
//! - Anything else (an origin-form request, `https://` without `CONNECT`, bad syntax, a
//!   `CONNECT` without a port) answers `400`.
//!
//! A tunnel (either kind) that passes no byte either way for [`IDLE_TIMEOUT`] is closed.
//!
//! The decision: the host must be allowed on the port asked for ([`EgressAllow::check`]: a
//! pattern allows the port it names, else 443 only, so a plain `http://` request to port 80
//! needs `host:80`). An IP address is allowed only when listed itself. A name is resolved
//! once, and each of its addresses must be one a name may lead to: a public one; a
//! loopback, private, unique-local, shared (CGNAT), local-use NAT64 or benchmarking one only
//! when the name is listed
//! itself (not only covered by a wildcard: the operator chose it, as for `localhost:8080`
//! or an internal registry); any other special one ([`special_use`]: link-local, where
//! clouds serve instance metadata, the known metadata addresses outside it, multicast…)
//! never, unless that address is listed itself on the port. The proxy connects to the
//! addresses it checked, never resolving again. A refusal answers `403` with a plain-text body saying
//! why and how to allow the host, and is reported to [`EgressEvents::blocked`]; a host that
//! cannot be resolved or reached answers `502`. The answers never tell the agent what a
//! name resolves to (under a wildcard that would make the proxy an oracle of internal
//! DNS): only that it resolves to a non-public address, or that it could not be reached;
//! the address goes to [`EgressEvents::blocked`]'s reason and the service's log.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agentry_domain::egress::allow_member;
use agentry_domain::{EgressAllow, EgressMatch, EgressPattern};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::timeout;

/// The largest request head read, in bytes; a longer one answers `431`.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a client may take to send its request head; then it gets `408`.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long resolving a host name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most lookups of the system's resolver at once, across every run's proxy.
const MAX_LOOKUPS: usize = 32;

/// The permits of [`MAX_LOOKUPS`].
static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LOOKUPS);

/// How long connecting to one address of the host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long writing an error answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The most connections served at once on one socket; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;

/// How long a tunnel (a `CONNECT`, or a plain HTTP request passed on) may pass no byte
/// either way before the proxy closes it: 10 minutes. A quiet server working on an answer
/// (a large `git fetch` being packed, a slow build service) usually sends within that, and
/// clients reopen idle kept-alive connections; a tunnel an agent abandoned no longer holds
/// two of the service's file descriptors until the run ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The most header fields of a request head.
const MAX_HEADERS: usize = 128;

/// Where refused connections are reported (the run's record of blocked egress).
pub trait EgressEvents: Send + Sync {
    /// A connection to `host` (in normal form: lower case, an IPv6 address without
    /// brackets) on `port` was refused with `403`; `why` says why in a few words, e.g.
    /// `not in egressAllow`. Called before the answer is written; must not block.
    fn blocked(&self, host: &str, port: u16, why: &str);
}

/// What a run's agent may reach: the union of the repository's and the instance's
/// patterns.
#[derive(Clone)]
pub struct EgressPolicy {
    allow: EgressAllow,
    /// How long a tunnel may pass nothing ([`IDLE_TIMEOUT`]; shorter in tests).
    idle_timeout: Duration,
    /// Test-only: names resolved from this table instead of the system's resolver.
    #[cfg(test)]
    hosts: Option<std::collections::HashMap<String, Vec<IpAddr>>>,
}

impl fmt::Debug for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressPolicy")
            .field("allow", &self.allow)
            .finish_non_exhaustive()
    }
}

impl EgressPolicy {
    /// The policy allowing `patterns`, each once: the union of the repository's
    /// (`egressAllow`) and the instance's (`AGENTRY_EGRESS_ALLOW`).
    pub fn new(patterns: impl IntoIterator<Item = EgressPattern>) -> EgressPolicy {
        EgressPolicy::from_allow(patterns.into_iter().collect())
    }

    /// The policy allowing exactly `allow`.
    pub fn from_allow(allow: EgressAllow) -> EgressPolicy {
        EgressPolicy {
            allow,
            idle_timeout: IDLE_TIMEOUT,
            #[cfg(test)]
            hosts: None,
        }
    }

    /// The patterns allowed.
    pub fn allow(&self) -> &EgressAllow {
        &self.allow
    }

    /// Whether `host` (normal form, `ip` when it is an address) may be reached on `port`,
    /// and at which addresses. Nothing is connected to here.
    async fn decide(
        &self,
        host: &str,
        ip: Option<IpAddr>,
        port: u16,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        let matched = self.allow.check(host, port);
        if let Some(ip) = ip {
            return match matched {
                Some(EgressMatch::Literal) => Ok(vec![SocketAddr::new(ip, port)]),
                _ => Err(Refusal::not_listed(&self.allow, host, port, true)),
            };
        }
        let Some(matched) = matched else {
            return Err(Refusal::not_listed(&self.allow, host, port, false));
        };
        let addrs = self
            .resolve(host, port)
            .await
            .map_err(Refusal::Unreachable)?;
        let refused = addrs.iter().find_map(|a| {
            address_refusal(&self.allow, matched, a.ip(), port).map(|kind| (a.ip(), kind))
        });
        let Some((addr, kind)) = refused else {
            return Ok(addrs);
        };
        // The reason (the log, the record) names the address; the body names neither the
        // address nor its kind, which would tell the agent what internal names resolve to.
        let never = "A link-local address (where clouds serve instance metadata) or another \
                     special-use one is reached through no name: only by listing the address \
                     itself.";
        Err(match matched {
            EgressMatch::Wildcard => {
                let member = allow_member(host, port);
                Refusal::Blocked {
                    why: format!("resolves to {addr} ({kind}), allowed only through a wildcard"),
                    body: format!(
                        "agentry's egress proxy refused {host}:{port}: {host} resolves to a \
                         non-public address, and only a wildcard of egressAllow covers it. A \
                         host that resolves to a loopback or private address must be listed by \
                         its own name: to allow it, add \"{member}\" to the repository's \
                         egressAllow setting, or to AGENTRY_EGRESS_ALLOW for every repository. \
                         {never}\n"
                    ),
                }
            }
            EgressMatch::Literal => Refusal::Blocked {
                why: format!("resolves to {addr} ({kind}), which no name may lead to"),
                body: format!(
                    "agentry's egress proxy refused {host}:{port}: {host} resolves to a \
                     non-public address that no name of egressAllow may lead to (a name listed \
                     itself may resolve to loopback and private addresses). {never}\n"
                ),
            },
        })
    }

    /// The addresses of `name` on `port`, each once, in the resolver's order.
    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        #[cfg(test)]
        if let Some(hosts) = &self.hosts {
            return hosts
                .get(name)
                .map(|ips| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
                .ok_or_else(|| format!("cannot resolve {name}: unknown host"));
        }
        // The system's resolver blocks a thread of the runtime's blocking pool, which the
        // model gateway's budget holds and records use too, until it answers (a timeout here
        // does not stop it): at most MAX_LOOKUPS of them at once, across every run, each
        // holding its permit until its thread is free again.
        let target = (name.to_owned(), port);
        let lookup = bounded_blocking(&LOOKUPS, move || {
            std::net::ToSocketAddrs::to_socket_addrs(&target).map(Iterator::collect::<Vec<_>>)
        });
        let found = timeout(RESOLVE_TIMEOUT, lookup)
            .await
            .map_err(|_| format!("cannot resolve {name}: no answer within 5 seconds"))?
            .map_err(|e| format!("cannot resolve {name}: {e}"))?
            .map_err(|e| format!("cannot resolve {name}: {e}"))?;
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for addr in found {
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        if addrs.is_empty() {
            return Err(format!("cannot resolve {name}: no address"));
        }
        Ok(addrs)
    }
}

/// Runs `work` on the blocking pool once `permits` has a permit for it, which its thread
/// holds until `work` returns: dropping the returned future (a timeout) frees no permit
/// while the thread is still busy, so at most `permits`' count of threads ever run such work.
async fn bounded_blocking<T: Send + 'static>(
    permits: &'static tokio::sync::Semaphore,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let permit = permits.acquire().await.map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|e| e.to_string())
}

/// Why a request is not passed on.
#[derive(Debug)]
enum Refusal {
    /// Not allowed: `403`, reported as blocked.
    Blocked {
        /// A few words for [`EgressEvents::blocked`].
        why: String,
        /// The answer's body.
        body: String,
    },
    /// Allowed, but the host cannot be resolved: `502`.
    Unreachable(String),
}

impl Refusal {
    /// `host` is not in the allow-list of `allow` on `port` (perhaps on other ports).
    fn not_listed(allow: &EgressAllow, host: &str, port: u16, address: bool) -> Refusal {
        let member = allow_member(host, port);
        let how = if address {
            format!("add \"{member}\" itself (wildcards never cover an IP address)")
        } else {
            match host.split_once('.') {
                Some((_, parent)) if parent.contains('.') => {
                    let wildcard = allow_member(&format!("*.{parent}"), port);
                    format!("add \"{member}\" (or a wildcard such as \"{wildcard}\")")
                }
                _ => format!("add \"{member}\""),
            }
        };
        let ports = allow.ports_of(host);
        let (why, what) = if ports.is_empty() {
            (
                "not in egressAllow".to_owned(),
                format!("{host} is not in egressAllow"),
            )
        } else {
            let listed: Vec<String> = ports.iter().map(u16::to_string).collect();
            (
                format!("port {port} not in egressAllow"),
                format!(
                    "egressAllow allows {host} on port {} only (a member without a port \
                     allows 443 only)",
                    listed.join(", ")
                ),
            )
        };
        Refusal::Blocked {
            why,
            body: format!(
                "agentry's egress proxy refused {host}:{port}: {what}. To allow it, {how} to \
                 the repository's egressAllow setting, or to AGENTRY_EGRESS_ALLOW for every \
                 repository.\n"
            ),
        }
    }
}

/// The kinds of [`special_use`] addresses a name listed itself in egressAllow may resolve
/// to: the operator's own networks (`localhost:8080`, an internal registry at `10.x`, a
/// host of a VPN in the shared range).
const OWN_NETWORK_KINDS: &[&str] = &[
    "loopback",
    "private",
    "unique local",
    "shared (CGNAT)",
    // A site's own NAT64 (DNS64 on 64:ff9b:1::/48 gives every IPv4-only host such an
    // address) and the fake-IP resolvers' range: what a listed name resolves to there.
    "local-use NAT64",
    "benchmarking",
];

/// Why `ip`, an address of a name allowed on `port` by `matched`, may not be connected to
/// (its [`special_use`] kind), or `None` when it may: when it is public, when `allow`
/// lists the address itself on `port`, or when the name is listed itself
/// ([`EgressMatch::Literal`]) and the address is loopback, private, unique-local, shared
/// (CGNAT), a site's own NAT64 or benchmarking (fake-IP resolvers). Link-local addresses (where clouds serve instance metadata), the known metadata
/// addresses outside them and every other special-use address are never reached through a
/// name.
fn address_refusal(
    allow: &EgressAllow,
    matched: EgressMatch,
    ip: IpAddr,
    port: u16,
) -> Option<&'static str> {
    let kind = special_use(ip)?;
    if allow.check(&ip.to_canonical().to_string(), port) == Some(EgressMatch::Literal) {
        return None;
    }
    if matched == EgressMatch::Literal && OWN_NETWORK_KINDS.contains(&kind) {
        return None;
    }
    Some(kind)
}

/// What an address is when it is not a public unicast address, e.g. `"loopback"`, or
/// `None` for a public one.
///
/// Not public: IPv4 0.0.0.0/8 (unspecified), 127.0.0.0/8 (loopback), 10.0.0.0/8,
/// 172.16.0.0/12, 192.168.0.0/16 (private), 169.254.0.0/16 (link-local, where clouds serve
/// instance metadata), 100.100.100.200 (cloud metadata: Alibaba Cloud's), 100.64.0.0/10
/// (shared, CGNAT), 192.0.0.0/24 and 240.0.0.0/4 (reserved), 198.18.0.0/15 (benchmarking),
/// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 (documentation), 224.0.0.0/4 (multicast),
/// 255.255.255.255 (broadcast); IPv6 `::` (unspecified), `::1` (loopback), fe80::/10
/// (link-local), fd00:ec2::254 and fd20:ce::254 (cloud metadata: AWS's and Google Cloud's
/// over IPv6), fec0::/10 (site-local), fc00::/7 (unique local), ff00::/8 (multicast),
/// 2001:db8::/32 and 3fff::/20 (documentation), 100::/64 (discard), 64:ff9b:1::/48
/// (local-use NAT64: a translator of the site's own, into its own IPv4 network); and an
/// IPv4 address of these kinds embedded in IPv6: IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::a.b.c.d`), 6to4 (`2002:AABB:CCDD::`) and Teredo (`2001::/32`: its server's
/// address, and its client's, stored inverted in the last 32 bits).
pub fn special_use(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_use_v4(v4),
        IpAddr::V6(v6) => special_use_v6(v6),
    }
}

/// [`special_use`] of an IPv4 address.
fn special_use_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => "private",
        (169, 254, _) => "link-local",
        _ if ip == Ipv4Addr::new(100, 100, 100, 200) => "cloud metadata",
        (100, 64..=127, _) => "shared (CGNAT)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (192, 0, 0) => "reserved",
        (224..=239, _, _) => "multicast",
        _ if ip == Ipv4Addr::BROADCAST => "broadcast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

/// [`special_use`] of an IPv6 address.
fn special_use_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if [
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
        Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),
    ]
    .contains(&ip)
    {
        return Some("cloud metadata");
    }
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        special_use_v4(Ipv4Addr::new(a, b, c, d))
    };
    match s {
        // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d.
        [0, 0, 0, 0, 0, 0xffff | 0, hi, lo] => embedded(hi, lo),
        // IPv4-translated ::ffff:0:a.b.c.d.
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => embedded(hi, lo),
        // NAT64's well-known prefix 64:ff9b::/96.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => embedded(hi, lo),
        [0x64, 0xff9b, 1, ..] => Some("local-use NAT64"),
        // 6to4 2002:AABB:CCDD::/48.
        [0x2002, hi, lo, ..] => embedded(hi, lo),
        // Teredo 2001::/32: the server's IPv4 address, then the client's, inverted, last.
        [0x2001, 0, server_hi, server_lo, _, _, client_hi, client_lo] => {
            embedded(server_hi, server_lo).or_else(|| embedded(!client_hi, !client_lo))
        }
        _ if s[0] & 0xffc0 == 0xfe80 => Some("link-local"),
        _ if s[0] & 0xffc0 == 0xfec0 => Some("site-local"),
        _ if s[0] & 0xfe00 == 0xfc00 => Some("unique local"),
        _ if s[0] & 0xff00 == 0xff00 => Some("multicast"),
        [0x2001, 0xdb8, ..] => Some("documentation"),
        [0x3fff, b, ..] if b & 0xf000 == 0 => Some("documentation"),
        [0x100, 0, 0, 0, ..] => Some("reserved"),
        _ => None,
    }
}

/// Serves the egress proxy on `listener` with `policy`, reporting refusals to `events`,
/// until the returned task is aborted. Must be called within a Tokio runtime.
///
/// Aborting the task ([`JoinHandle::abort`]) stops accepting and closes every connection
/// and tunnel still open (each is owned by the task). Dropping the handle without aborting
/// leaves the proxy running; removing the socket's file is the caller's business.
pub fn serve(
    listener: UnixListener,
    policy: EgressPolicy,
    events: Arc<dyn EgressEvents>,
) -> JoinHandle<()> {
    tokio::spawn(accept_loop(listener, Arc::new(policy), events))
}

/// Accepts connections and serves each in its own task, owned by this one.
async fn accept_loop(
    listener: UnixListener,
    policy: Arc<EgressPolicy>,
    events: Arc<dyn EgressEvents>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept(), if connections.len() < MAX_CONNECTIONS => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, policy.clone(), events.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the egress proxy could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A request head, read and parsed.
#[derive(Debug)]
struct Head {
    method: String,
    target: String,
    /// The minor version: `HTTP/1.0` or `HTTP/1.1`.
    minor: u8,
    headers: Vec<(String, Vec<u8>)>,
    /// Bytes read after the head (the start of a body, or of the tunnelled stream).
    rest: Vec<u8>,
}

/// Why no request head could be read.
#[derive(Debug)]
enum HeadError {
    /// The connection ended (or failed) before a complete head.
    Closed,
    /// The head is over [`MAX_HEAD_BYTES`] or has too many header fields.
    TooLarge,
    /// Not an HTTP/1 request head.
    Invalid(String),
}

/// Reads one request head from `stream`.
async fn read_head(stream: &mut UnixStream) -> Result<Head, HeadError> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut fields);
        match request.parse(&buf) {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD_BYTES => {
                let head = Head {
                    method: request.method.unwrap_or_default().to_owned(),
                    target: request.path.unwrap_or_default().to_owned(),
                    minor: request.version.unwrap_or(1),
                    headers: request
                        .headers
                        .iter()
                        .map(|h| (h.name.to_owned(), h.value.to_vec()))
                        .collect(),
                    rest: buf[len..].to_vec(),
                };
                return Ok(head);
            }
            Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLarge),
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
                return Err(HeadError::TooLarge);
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(e) => return Err(HeadError::Invalid(e.to_string())),
        }
    }
}

/// Where a request goes.
#[derive(Debug)]
struct Target {
    /// The host in normal form.
    host: String,
    /// The host's address, when it is one.
    ip: Option<IpAddr>,
    port: u16,
    /// For plain HTTP, the origin-form target (`/path?query`); `None` for `CONNECT`.
    path: Option<String>,
}

impl Target {
    /// The `Host` header of a plain HTTP request to this target.
    fn authority(&self) -> String {
        let host = match self.ip {
            Some(IpAddr::V6(_)) => format!("[{}]", self.host),
            _ => self.host.clone(),
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// Where `head` asks to go, or why it cannot be served (the body of a `400`).
fn target(head: &Head) -> Result<Target, String> {
    if head.method == "CONNECT" {
        let (host, ip, port) = authority(&head.target, None).map_err(|e| {
            format!("{e}; a CONNECT request names a host and a port, e.g. CONNECT pypi.org:443")
        })?;
        return Ok(Target {
            host,
            ip,
            port,
            path: None,
        });
    }
    let lower = head.target.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err("an https:// URL is reached with CONNECT, not as a plain request".into());
    }
    if !lower.starts_with("http://") {
        return Err(
            "this is a proxy: a request names an absolute http:// URL (GET http://host/path), \
             or is a CONNECT host:port"
                .into(),
        );
    }
    let rest = &head.target["http://".len()..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority_text, path) = rest.split_at(end);
    if authority_text.contains('@') {
        return Err("credentials in the URL are not passed on".into());
    }
    let (host, ip, port) = authority(authority_text, Some(80))?;
    let path = match path.split_once('#').map_or(path, |(p, _)| p) {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    Ok(Target {
        host,
        ip,
        port,
        path: Some(path),
    })
}

/// The host in normal form, its address when it is one, and the port of `text`
/// (`host:port`, `[v6]:port`, or without `:port` when a `default` port is given).
fn authority(text: &str, default: Option<u16>) -> Result<(String, Option<IpAddr>, u16), String> {
    let (host, port) = if text.starts_with('[') {
        match text.split_once(']') {
            Some((v6, "")) => (format!("{v6}]"), None),
            Some((v6, tail)) => match tail.strip_prefix(':') {
                Some(port) => (format!("{v6}]"), Some(port)),
                None => return Err(format!("{text:?} is not host:port")),
            },
            None => return Err(format!("{text:?} is not host:port")),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => (host.to_owned(), Some(port)),
            Some(_) => {
                return Err(format!(
                    "{text:?} is not host:port (an IPv6 address is given in brackets)"
                ));
            }
            None => (text.to_owned(), None),
        }
    };
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("{port:?} is not a port"))?,
        None => default.ok_or_else(|| format!("{text:?} has no port"))?,
    };
    let pattern = EgressPattern::parse(&host)
        .ok()
        .filter(|p| !p.is_wildcard() && p.port() == agentry_domain::egress::DEFAULT_PORT)
        .ok_or_else(|| format!("{host:?} is not a host name or an IP address"))?;
    Ok((pattern.host(), pattern.ip_addr(), port))
}

/// Serves one connection.
async fn serve_connection(
    mut client: UnixStream,
    policy: Arc<EgressPolicy>,
    events: Arc<dyn EgressEvents>,
) {
    let head = match timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Err(_) => {
            let body = "the request head did not arrive within 10 seconds\n";
            return answer(&mut client, 408, "Request Timeout", body).await;
        }
        Ok(Err(HeadError::Closed)) => return,
        Ok(Err(HeadError::TooLarge)) => {
            let body = "the request head is over 16 KiB or has too many header fields\n";
            return answer(&mut client, 431, "Request Header Fields Too Large", body).await;
        }
        Ok(Err(HeadError::Invalid(why))) => {
            let body = format!("not an HTTP/1 request: {why}\n");
            return answer(&mut client, 400, "Bad Request", &body).await;
        }
        Ok(Ok(head)) => head,
    };
    let target = match target(&head) {
        Ok(target) => target,
        Err(why) => return answer(&mut client, 400, "Bad Request", &format!("{why}\n")).await,
    };
    let addrs = match policy.decide(&target.host, target.ip, target.port).await {
        Ok(addrs) => addrs,
        Err(Refusal::Blocked { why, body }) => {
            tracing::debug!(host = %target.host, port = target.port, why = %why, "egress refused");
            events.blocked(&target.host, target.port, &why);
            return answer(&mut client, 403, "Forbidden", &body).await;
        }
        Err(Refusal::Unreachable(why)) => {
            return answer(&mut client, 502, "Bad Gateway", &format!("{why}\n")).await;
        }
    };
    let mut upstream = match connect(&addrs).await {
        Ok(upstream) => upstream,
        Err(failed) => {
            // Each address and its error for the log; the agent gets the last error alone.
            let tried: Vec<String> = failed.iter().map(|(a, e)| format!("{a}: {e}")).collect();
            tracing::debug!(
                host = %target.host,
                port = target.port,
                tried = %tried.join("; "),
                "egress upstream unreachable"
            );
            let why = failed.last().map_or("no address", |(_, e)| e.as_str());
            let body = format!("cannot connect to {}:{}: {why}\n", target.host, target.port);
            return answer(&mut client, 502, "Bad Gateway", &body).await;
        }
    };
    let sent = match &target.path {
        None => {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            match client.write_all(established).await {
                Ok(()) => upstream.write_all(&head.rest).await,
                Err(e) => Err(e),
            }
        }
        Some(path) => {
            let mut out = request_head(&head, &target, path);
            out.extend_from_slice(&head.rest);
            upstream.write_all(&out).await
        }
    };
    if sent.is_err() {
        return;
    }
    let activity = Activity::new();
    let mut client = Watched::new(&mut client, &activity);
    let mut upstream = Watched::new(&mut upstream, &activity);
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(e) = copied {
                tracing::debug!(
                    host = %target.host,
                    port = target.port,
                    error = %e,
                    "an egress tunnel ended with an error"
                );
            }
        }
        () = activity.idle_for(policy.idle_timeout) => {
            tracing::debug!(
                host = %target.host,
                port = target.port,
                idle_secs = policy.idle_timeout.as_secs(),
                "closed an idle egress tunnel"
            );
        }
    }
}

/// When a tunnel last passed a byte, either way.
struct Activity {
    start: tokio::time::Instant,
    /// Milliseconds from `start` to the last byte read from either side.
    last: std::sync::atomic::AtomicU64,
}

impl Activity {
    /// Activity as of now.
    fn new() -> Activity {
        Activity {
            start: tokio::time::Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes passed now.
    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Returns once nothing has passed for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let last = self.last.load(std::sync::atomic::Ordering::Relaxed);
            let deadline = self.start + Duration::from_millis(last) + limit;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One side of a tunnel, whose reads count as the tunnel's [`Activity`] (every byte
/// written was read from the other side first).
struct Watched<'a, S> {
    stream: &'a mut S,
    activity: &'a Activity,
}

impl<'a, S> Watched<'a, S> {
    fn new(stream: &'a mut S, activity: &'a Activity) -> Self {
        Watched { stream, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut *self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The head of a plain HTTP request as passed on: origin-form `path`, `Host` set to the
/// target, without `Proxy-*` and hop-by-hop fields (`Connection`, `Keep-Alive`, `TE`,
/// `Trailer`, `Upgrade` and those `Connection` names), with `Connection: close`.
/// `Transfer-Encoding` and `Content-Length` are kept: the body passes unchanged.
fn request_head(head: &Head, target: &Target, path: &str) -> Vec<u8> {
    let named: Vec<String> = head
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, value)| {
            String::from_utf8_lossy(value)
                .split(',')
                .map(|token| token.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let dropped = |name: &str| {
        let name = name.to_ascii_lowercase();
        name.starts_with("proxy-")
            || matches!(
                name.as_str(),
                "host" | "connection" | "keep-alive" | "te" | "trailer" | "upgrade"
            )
            || named.contains(&name)
    };
    let mut out = format!(
        "{} {path} HTTP/1.{}\r\nHost: {}\r\n",
        head.method,
        head.minor,
        target.authority()
    )
    .into_bytes();
    for (name, value) in head.headers.iter().filter(|(name, _)| !dropped(name)) {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// A connection to the first of `addrs` that answers; else each address tried, with why it
/// failed (the error alone, without the address).
async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, Vec<(SocketAddr, String)>> {
    let mut failed = Vec::new();
    for addr in addrs {
        // Tests reach loopback only, whatever a policy under test lets through.
        #[cfg(test)]
        if !addr.ip().to_canonical().is_loopback() {
            failed.push((*addr, "tests connect to loopback only".to_owned()));
            continue;
        }
        match timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => failed.push((*addr, e.to_string())),
            Err(_) => failed.push((*addr, "no answer within 10 seconds".to_owned())),
        }
    }
    Err(failed)
}

/// Writes a plain-text answer and closes the connection.
async fn answer(client: &mut UnixStream, status: u16, reason: &str, body: &str) {
    let text = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = timeout(ANSWER_TIMEOUT, async {
        client.write_all(text.as_bytes()).await?;
        client.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncRead;
    use tokio::net::TcpListener;

    /// How long any step of a test may take.
    const DEADLINE: Duration = Duration::from_secs(20);

    fn pattern(text: &str) -> EgressPattern {
        EgressPattern::parse(text).unwrap()
    }

    fn policy(patterns: &[&str]) -> EgressPolicy {
        EgressPolicy::new(patterns.iter().map(|p| pattern(p)))
    }

    /// A proxy whose policy lists `origin`'s address literally, and that address
    /// (`127.0.0.1:PORT`).
    fn proxy_listing(origin: &Origin) -> (Proxy, String) {
        let listed = format!("127.0.0.1:{}", origin.port());
        (Proxy::start(policy(&[&listed])), listed)
    }

    /// A policy resolving names from `hosts` only.
    fn policy_with_hosts(patterns: &[&str], hosts: &[(&str, &[IpAddr])]) -> EgressPolicy {
        EgressPolicy {
            hosts: Some(
                hosts
                    .iter()
                    .map(|(name, ips)| ((*name).to_owned(), ips.to_vec()))
                    .collect(),
            ),
            ..policy(patterns)
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(String, u16, String)>>);

    impl EgressEvents for Recorder {
        fn blocked(&self, host: &str, port: u16, why: &str) {
            self.0
                .lock()
                .unwrap()
                .push((host.to_owned(), port, why.to_owned()));
        }
    }

    impl Recorder {
        fn events(&self) -> Vec<(String, u16, String)> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A test HTTP server on 127.0.0.1: records each request (head and body) and answers
    /// `hello from origin`.
    struct Origin {
        addr: SocketAddr,
        requests: Arc<Mutex<Vec<String>>>,
        accepted: Arc<AtomicUsize>,
        _task: tokio::task::JoinHandle<()>,
    }

    impl Origin {
        async fn start() -> Origin {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let accepted = Arc::new(AtomicUsize::new(0));
            let (r, a) = (requests.clone(), accepted.clone());
            let task = tokio::spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else {
                        return;
                    };
                    a.fetch_add(1, Ordering::SeqCst);
                    let r = r.clone();
                    tokio::spawn(async move {
                        let mut buf = read_until_head_end(&mut stream).await;
                        let text = String::from_utf8_lossy(&buf).to_string();
                        let length = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        let head_len = text.find("\r\n\r\n").unwrap() + 4;
                        while buf.len() < head_len + length {
                            let mut more = [0u8; 1024];
                            let n = stream.read(&mut more).await.unwrap();
                            assert!(n > 0, "the body ended early");
                            buf.extend_from_slice(&more[..n]);
                        }
                        r.lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&buf).to_string());
                        let body = "hello from origin";
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        stream.write_all(answer.as_bytes()).await.unwrap();
                        stream.shutdown().await.unwrap();
                    });
                }
            });
            Origin {
                addr,
                requests,
                accepted,
                _task: task,
            }
        }

        fn port(&self) -> u16 {
            self.addr.port()
        }

        fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }
    }

    /// Reads until the end of a head (`\r\n\r\n`), returning all bytes read.
    async fn read_until_head_end(stream: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
        let mut buf = Vec::new();
        timeout(DEADLINE, async {
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                let n = stream.read(&mut byte).await.unwrap();
                assert!(
                    n > 0,
                    "closed before a head: {:?}",
                    String::from_utf8_lossy(&buf)
                );
                buf.push(byte[0]);
            }
        })
        .await
        .unwrap();
        buf
    }

    /// A proxy serving `policy` on a socket in a temporary directory.
    struct Proxy {
        _dir: tempfile::TempDir,
        socket: PathBuf,
        events: Arc<Recorder>,
        task: JoinHandle<()>,
    }

    impl Proxy {
        fn start(policy: EgressPolicy) -> Proxy {
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("proxy.sock");
            let listener = UnixListener::bind(&socket).unwrap();
            let events = Arc::new(Recorder::default());
            let task = serve(listener, policy, events.clone());
            Proxy {
                _dir: dir,
                socket,
                events,
                task,
            }
        }

        /// Sends `request` on a new connection and reads the whole answer.
        async fn exchange(&self, request: &[u8]) -> String {
            exchange(&self.socket, request).await
        }

        /// A GET to the origin at `authority` through a new tunnel, asserting that the
        /// origin answered; the whole answer.
        async fn get_from_origin(&self, authority: &str) -> String {
            let answer = get_through(tunnel(&self.socket, authority).await, authority).await;
            assert!(answer.ends_with("hello from origin"), "{answer}");
            answer
        }

        /// Sends each request of `cases` on a new connection, asserting that the answer's
        /// status is `code` and that the answer contains each of the case's parts.
        async fn expect(&self, code: u16, cases: &[(&[u8], &[&str])]) {
            let expected = format!("HTTP/1.1 {code}");
            for (request, parts) in cases {
                let answer = self.exchange(request).await;
                assert!(
                    status(&answer).starts_with(&expected),
                    "{:?}: {answer}",
                    String::from_utf8_lossy(request)
                );
                for part in *parts {
                    assert!(answer.contains(part), "{part:?} missing: {answer}");
                }
            }
        }
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn exchange(socket: &Path, request: &[u8]) -> String {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        stream.write_all(request).await.unwrap();
        read_to_end(&mut stream).await
    }

    /// Reads until the proxy closes the connection. A reset after the answer counts as the
    /// end: a Unix socket closed with unread input (an oversized head) resets its peer.
    async fn read_to_end(stream: &mut UnixStream) -> String {
        let mut out = Vec::new();
        timeout(DEADLINE, async {
            let mut chunk = [0u8; 4096];
            loop {
                match stream.read(&mut chunk).await {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                    Err(e) => panic!("reading the answer: {e}"),
                }
            }
        })
        .await
        .unwrap();
        String::from_utf8_lossy(&out).to_string()
    }

    /// What `stream` still sends until it closes (within the deadline).
    async fn rest_of(stream: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
        let mut rest = Vec::new();
        timeout(DEADLINE, stream.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        rest
    }

    /// Opens a CONNECT tunnel to `authority`, asserting it is established.
    async fn tunnel(socket: &Path, authority: &str) -> UnixStream {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let head = read_until_head_end(&mut stream).await;
        assert_eq!(head, b"HTTP/1.1 200 Connection established\r\n\r\n");
        stream
    }

    /// A GET through an open tunnel, returning the whole answer.
    async fn get_through(mut stream: UnixStream, host: &str) -> String {
        let request = format!("GET /inside HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        read_to_end(&mut stream).await
    }

    /// The event of a refused `host:port` that the policy does not list.
    fn unlisted_event(host: &str, port: u16) -> (String, u16, String) {
        (host.to_owned(), port, "not in egressAllow".to_owned())
    }

    /// The event of `host` refused on `port` only (the host is allowed on another port).
    fn other_port_event(host: &str, port: u16) -> (String, u16, String) {
        (
            host.to_owned(),
            port,
            format!("port {port} not in egressAllow"),
        )
    }

    fn status(answer: &str) -> &str {
        answer.lines().next().unwrap_or_default()
    }

    #[test]
    fn addresses_are_classified() {
        for (text, kind) in [
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("unspecified")),
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.254", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("100.100.100.200", Some("cloud metadata")),
            ("100.100.100.201", Some("shared (CGNAT)")),
            ("100.64.0.1", Some("shared (CGNAT)")),
            ("100.127.255.255", Some("shared (CGNAT)")),
            ("192.0.2.1", Some("documentation")),
            ("198.51.100.1", Some("documentation")),
            ("203.0.113.1", Some("documentation")),
            ("198.18.0.1", Some("benchmarking")),
            ("192.0.0.8", Some("reserved")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("240.0.0.1", Some("reserved")),
            ("255.255.255.255", Some("broadcast")),
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", Some("site-local")),
            ("fc00::1", Some("unique local")),
            ("fd12:3456::1", Some("unique local")),
            ("fd00:ec2::254", Some("cloud metadata")),
            ("fd20:ce::254", Some("cloud metadata")),
            ("fd00:ec2::253", Some("unique local")),
            ("::ffff:100.100.100.200", Some("cloud metadata")),
            ("ff02::1", Some("multicast")),
            ("2001:db8::1", Some("documentation")),
            ("3fff::1", Some("documentation")),
            ("100::1", Some("reserved")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:10.0.0.1", Some("private")),
            ("::ffff:169.254.169.254", Some("link-local")),
            ("::127.0.0.1", Some("loopback")),
            ("::192.168.0.1", Some("private")),
            ("64:ff9b::7f00:1", Some("loopback")),
            ("2002:a00:1::1", Some("private")),
            ("::ffff:0:7f00:1", Some("loopback")),
            ("::ffff:0:a9fe:a9fe", Some("link-local")),
            ("64:ff9b:1::808:808", Some("local-use NAT64")),
            // Teredo: a private server, and a client 10.0.0.1 (inverted: f5ff:fffe).
            ("2001:0:a00:1::1", Some("private")),
            ("2001:0:808:808:0:0:f5ff:fffe", Some("private")),
            // Public.
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("172.15.255.255", None),
            ("172.32.0.1", None),
            ("100.63.255.255", None),
            ("100.128.0.1", None),
            ("169.253.1.1", None),
            ("223.255.255.255", None),
            ("2606:4700:4700::1111", None),
            ("2a00:1450:4001::1", None),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
            ("2002:808:808::1", None),
            ("::ffff:0:808:808", None),
            ("2001:0:808:808:0:0:f7f7:f7f7", None),
            ("fe00::1", None),
        ] {
            assert_eq!(special_use(ip(text)), kind, "{text}");
        }
    }

    #[test]
    fn targets_are_parsed_from_connect_and_absolute_forms() {
        let head = |method: &str, target: &str| Head {
            method: method.into(),
            target: target.into(),
            minor: 1,
            headers: Vec::new(),
            rest: Vec::new(),
        };
        let t = target(&head("CONNECT", "API.Example.com:443")).unwrap();
        assert_eq!(
            (t.host.as_str(), t.ip, t.port, t.path),
            ("api.example.com", None, 443, None)
        );
        let t = target(&head("CONNECT", "[::1]:8443")).unwrap();
        assert_eq!(
            (t.host.as_str(), t.ip, t.port),
            ("::1", Some(ip("::1")), 8443)
        );
        let t = target(&head("GET", "http://Example.com")).unwrap();
        assert_eq!(
            (t.port, t.path.as_deref(), t.authority()),
            (80, Some("/"), "example.com".into())
        );
        let t = target(&head("POST", "HTTP://[::1]:81/a/b?c=d#frag")).unwrap();
        assert_eq!(
            (t.port, t.path.as_deref(), t.authority()),
            (81, Some("/a/b?c=d"), "[::1]:81".into())
        );
        let t = target(&head("GET", "http://a.org?q")).unwrap();
        assert_eq!(t.path.as_deref(), Some("/?q"));
        for (method, bad) in [
            ("CONNECT", "example.com"),
            ("CONNECT", "example.com:"),
            ("CONNECT", "example.com:0"),
            ("CONNECT", "example.com:65536"),
            ("CONNECT", "example.com:+443"),
            ("CONNECT", "::1:443"),
            ("CONNECT", "[::1]"),
            ("CONNECT", "*.example.com:443"),
            ("CONNECT", "exa_mple.com:443"),
            ("CONNECT", "http://example.com:443"),
            ("GET", "/path"),
            ("GET", "https://example.com/"),
            ("GET", "http://user:pw@example.com/"),
            ("GET", "http:///path"),
            ("GET", "ftp://example.com/"),
        ] {
            assert!(target(&head(method, bad)).is_err(), "{method} {bad}");
        }
    }

    /// The forwarded head drops Proxy-* and hop-by-hop fields, sets Host to the target and
    /// asks for Connection: close.
    #[test]
    fn forwarded_heads_drop_proxy_and_hop_by_hop_fields() {
        let head = Head {
            method: "POST".into(),
            target: "http://a.org:8080/x".into(),
            minor: 1,
            headers: [
                ("Host", "evil.example"),
                ("Proxy-Authorization", "Basic x"),
                ("Proxy-Connection", "keep-alive"),
                ("Connection", "keep-alive, X-Hop"),
                ("X-Hop", "1"),
                ("Keep-Alive", "timeout=5"),
                ("TE", "trailers"),
                ("Upgrade", "websocket"),
                ("Content-Length", "3"),
                ("Accept", "*/*"),
            ]
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
            .collect(),
            rest: Vec::new(),
        };
        let target = target(&head).unwrap();
        let out = request_head(&head, &target, target.path.as_deref().unwrap());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /x HTTP/1.1\r\nHost: a.org:8080\r\nContent-Length: 3\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn connect_tunnels_to_a_literally_listed_address() {
        let origin = Origin::start().await;
        let (proxy, authority) = proxy_listing(&origin);
        let answer = proxy.get_from_origin(&authority).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        let requests = origin.requests();
        assert_eq!(requests.len(), 1);
        assert!(
            requests[0].starts_with("GET /inside HTTP/1.1\r\n"),
            "{}",
            requests[0]
        );
        assert!(proxy.events.events().is_empty());
    }

    /// Bytes sent right after the CONNECT head (before the 200 arrives) reach the origin.
    #[tokio::test]
    async fn bytes_sent_with_the_connect_head_are_passed_on() {
        let origin = Origin::start().await;
        let (proxy, authority) = proxy_listing(&origin);
        let answer = proxy
            .exchange(
                format!(
                    "CONNECT {authority} HTTP/1.1\r\n\r\nGET /early HTTP/1.1\r\nHost: x\r\n\r\n"
                )
                .as_bytes(),
            )
            .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
            "{answer}"
        );
        assert!(origin.requests()[0].starts_with("GET /early HTTP/1.1\r\n"));
    }

    #[tokio::test]
    async fn plain_http_is_forwarded_in_origin_form_without_proxy_fields() {
        let origin = Origin::start().await;
        let (proxy, _) = proxy_listing(&origin);
        let port = origin.port();
        let request = format!(
            "POST http://127.0.0.1:{port}/upload?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\
             Connection: keep-alive\r\nContent-Length: 11\r\nX-Kept: yes\r\n\r\nhello world"
        );
        let answer = proxy.exchange(request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("hello from origin"), "{answer}");
        let requests = origin.requests();
        assert_eq!(
            requests,
            [format!(
                "POST /upload?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 11\r\n\
                 X-Kept: yes\r\nConnection: close\r\n\r\nhello world"
            )]
        );
    }

    /// `localhost` listed by name resolves (through the system's resolver) to loopback and
    /// is reached, since it is listed itself.
    #[tokio::test]
    async fn localhost_listed_by_name_is_reached_through_both_forms() {
        let origin = Origin::start().await;
        let listed = format!("localhost:{}", origin.port());
        let proxy = Proxy::start(policy(&[&listed]));
        let authority = format!("localhost:{}", origin.port());
        proxy.get_from_origin(&authority).await;
        let answer = proxy
            .exchange(format!("GET http://{authority}/plain HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert!(answer.ends_with("hello from origin"), "{answer}");
        assert!(
            origin.requests()[1]
                .starts_with(&format!("GET /plain HTTP/1.1\r\nHost: {authority}\r\n"))
        );
        assert!(proxy.events.events().is_empty());
    }

    #[tokio::test]
    async fn a_host_not_listed_is_refused_with_403_and_an_event() {
        let origin = Origin::start().await;
        let proxy = Proxy::start(policy(&["pypi.org", "*.example.com", "*.example.org:8443"]));
        let port = origin.port();
        let localhost = format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n");
        let add_localhost = format!("add \"localhost:{port}\"");
        let cases: &[(&[u8], &[&str])] = &[
            (
                localhost.as_bytes(),
                &["localhost is not in egressAllow", &add_localhost],
            ),
            (
                b"GET http://Files.PythonHosted.org/x HTTP/1.1\r\n\r\n",
                &[
                    "add \"files.pythonhosted.org:80\"",
                    "\"*.pythonhosted.org:80\"",
                ],
            ),
            // Wildcards cover names strictly below their domain only.
            (
                b"CONNECT example.com:443 HTTP/1.1\r\n\r\n",
                &["add \"example.com\""],
            ),
            // A member without a port allows 443 only; the answer says which ports are.
            (
                b"CONNECT pypi.org:8080 HTTP/1.1\r\n\r\n",
                &[
                    "egressAllow allows pypi.org on port 443 only",
                    "add \"pypi.org:8080\"",
                ],
            ),
            (
                b"GET http://a.example.com/ HTTP/1.1\r\n\r\n",
                &["port 443 only"],
            ),
            (
                b"CONNECT a.example.org:443 HTTP/1.1\r\n\r\n",
                &["a.example.org on port 8443 only", "add \"a.example.org\""],
            ),
        ];
        proxy.expect(403, cases).await;
        assert_eq!(
            proxy.events.events(),
            [
                unlisted_event("localhost", port),
                unlisted_event("files.pythonhosted.org", 80),
                unlisted_event("example.com", 443),
                other_port_event("pypi.org", 8080),
                other_port_event("a.example.com", 80),
                other_port_event("a.example.org", 443),
            ]
        );
        assert_eq!(origin.accepted.load(Ordering::SeqCst), 0);
    }

    /// A name covered only by a wildcard that resolves to a private address is refused
    /// before any connection; listed by its own name it is reached.
    #[tokio::test]
    async fn a_wildcard_name_resolving_to_loopback_is_refused() {
        let origin = Origin::start().await;
        let loopback = [ip("127.0.0.1")];
        let hosts: &[(&str, &[IpAddr])] = &[("api.example.test", &loopback)];
        let wildcard = format!("*.example.test:{}", origin.port());
        let proxy = Proxy::start(policy_with_hosts(&[&wildcard], hosts));
        let authority = format!("api.example.test:{}", origin.port());
        let connect = format!("CONNECT {authority} HTTP/1.1\r\n\r\n");
        let parts = [
            "api.example.test resolves to a non-public address",
            &format!("add \"api.example.test:{}\"", origin.port()),
        ];
        proxy.expect(403, &[(connect.as_bytes(), &parts)]).await;
        // The agent is not told what the name resolves to, nor what kind of address it is.
        let answer = proxy.exchange(connect.as_bytes()).await;
        assert!(
            !answer.contains("127.0.0.1") && !answer.contains("a loopback address"),
            "{answer}"
        );
        let events = proxy.events.events();
        assert_eq!(events.len(), 2);
        assert_eq!(
            (events[0].0.as_str(), events[0].1),
            ("api.example.test", origin.port())
        );
        assert!(events[0].2.contains("127.0.0.1 (loopback)"), "{events:?}");
        assert_eq!(origin.accepted.load(Ordering::SeqCst), 0);

        let listed = Proxy::start(policy_with_hosts(&[&wildcard, &authority], hosts));
        listed.get_from_origin(&authority).await;
        assert!(listed.events.events().is_empty());
    }

    /// The decision alone: a wildcard name is refused when any of its addresses is private,
    /// allowed when all are public (nothing is connected to).
    #[tokio::test]
    async fn a_wildcard_allows_only_names_with_public_addresses() {
        let mixed = [ip("8.8.8.8"), ip("::ffff:10.0.0.1")];
        let public = [ip("8.8.8.8"), ip("2606:4700:4700::1111")];
        let hosts: &[(&str, &[IpAddr])] = &[
            ("mixed.example.com", &mixed),
            ("public.example.com", &public),
        ];
        let policy = policy_with_hosts(&["*.example.com"], hosts);
        match policy.decide("mixed.example.com", None, 443).await {
            Err(Refusal::Blocked { why, .. }) => assert!(why.contains("(private)"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            policy
                .decide("public.example.com", None, 443)
                .await
                .unwrap(),
            [
                SocketAddr::new(public[0], 443),
                SocketAddr::new(public[1], 443)
            ]
        );
        assert!(matches!(
            policy.decide("unknown.example.com", None, 443).await,
            Err(Refusal::Unreachable(_))
        ));
    }

    /// A name listed itself whose DNS answers a link-local address (cloud metadata) is
    /// refused before any connection, as a wildcard's name would be.
    #[tokio::test]
    async fn a_listed_name_resolving_to_cloud_metadata_is_refused() {
        let origin = Origin::start().await;
        let metadata = [ip("169.254.169.254")];
        let hosts: &[(&str, &[IpAddr])] = &[("registry.example.test", &metadata)];
        let proxy = Proxy::start(policy_with_hosts(
            &["registry.example.test", "registry.example.test:80"],
            hosts,
        ));
        let cases: &[(&[u8], &[&str])] = &[
            (
                b"CONNECT registry.example.test:443 HTTP/1.1\r\n\r\n",
                &[
                    "refused registry.example.test:443",
                    "only by listing the address itself",
                ],
            ),
            (
                b"GET http://registry.example.test/latest/meta-data/ HTTP/1.1\r\n\r\n",
                &["refused registry.example.test:80"],
            ),
        ];
        proxy.expect(403, cases).await;
        let events = proxy.events.events();
        let answer = proxy
            .exchange(b"CONNECT registry.example.test:443 HTTP/1.1\r\n\r\n")
            .await;
        assert!(
            answer.contains("resolves to a non-public address")
                && !answer.contains("169.254")
                && !answer.contains("link-local ("),
            "{answer}"
        );
        assert_eq!(events.len(), 2, "{events:?}");
        for (event, port) in events.iter().zip([443, 80]) {
            assert_eq!((event.0.as_str(), event.1), ("registry.example.test", port));
            assert!(
                event.2.contains("169.254.169.254 (link-local)"),
                "{events:?}"
            );
        }
        assert_eq!(origin.accepted.load(Ordering::SeqCst), 0);
    }

    /// The decision of `policy` on `name`: allowed, or refused with its reason.
    async fn verdict(policy: &EgressPolicy, name: &str, port: u16) -> Result<(), String> {
        match policy.decide(name, None, port).await {
            Ok(_) => Ok(()),
            Err(Refusal::Blocked { why, .. }) => Err(why),
            Err(other) => panic!("{name}: {other:?}"),
        }
    }

    /// The decision alone: a name listed itself may lead to loopback, private,
    /// unique-local, shared, a site's own NAT64 and fake-IP (benchmarking) addresses, never to link-local, cloud metadata or other
    /// special-use ones (any of its addresses being one refuses it), unless that address
    /// is listed itself on the port; a wildcard's name to public addresses only, or to one
    /// listed itself.
    #[tokio::test]
    async fn a_name_leads_to_a_special_address_only_as_the_operator_chose() {
        let names: &[(&str, &str)] = &[
            ("loopback", "127.0.0.1"),
            ("loopback6", "::1"),
            ("private", "10.1.2.3"),
            ("private172", "172.20.0.5"),
            ("ula", "fd12:3456::1"),
            ("cgnat", "100.101.102.103"),
            ("dns64", "64:ff9b:1::808:808"),
            ("fake-ip", "198.18.0.7"),
            ("metadata", "169.254.169.254"),
            ("metadata-mapped", "::ffff:169.254.169.254"),
            ("link-local6", "fe80::1"),
            ("aws6", "fd00:ec2::254"),
            ("gcp6", "fd20:ce::254"),
            ("alibaba", "100.100.100.200"),
            ("unspecified", "0.0.0.0"),
            ("multicast", "239.1.2.3"),
            ("documentation", "192.0.2.10"),
        ];
        let ips: Vec<(String, [IpAddr; 1])> = names
            .iter()
            .map(|(name, addr)| (format!("{name}.corp.test"), [ip(addr)]))
            .collect();
        let mixed = [ip("8.8.8.8"), ip("169.254.169.254")];
        let mut hosts: Vec<(&str, &[IpAddr])> = ips
            .iter()
            .map(|(name, addrs)| (name.as_str(), &addrs[..]))
            .collect();
        hosts.push(("mixed.corp.test", &mixed));
        let mut listed: Vec<&str> = ips.iter().map(|(name, _)| name.as_str()).collect();
        listed.extend(["mixed.corp.test", "*.wild.test", "169.254.169.254:8443"]);
        let policy = policy_with_hosts(&listed, &hosts);
        for name in [
            "loopback",
            "loopback6",
            "private",
            "private172",
            "ula",
            "cgnat",
            "dns64",
            "fake-ip",
        ] {
            let host = format!("{name}.corp.test");
            assert_eq!(verdict(&policy, &host, 443).await, Ok(()), "{name}");
        }
        for (name, kind) in [
            ("metadata", "link-local"),
            ("metadata-mapped", "link-local"),
            ("link-local6", "link-local"),
            ("aws6", "cloud metadata"),
            ("gcp6", "cloud metadata"),
            ("alibaba", "cloud metadata"),
            ("unspecified", "unspecified"),
            ("multicast", "multicast"),
            ("documentation", "documentation"),
            ("mixed", "link-local"),
        ] {
            let why = verdict(&policy, &format!("{name}.corp.test"), 443)
                .await
                .unwrap_err();
            assert!(
                why.contains(&format!("({kind}), which no name may lead to")),
                "{name}: {why}"
            );
        }
        // The address listed itself on the port: the name may lead there too.
        let listed_too =
            policy_with_hosts(&["metadata.corp.test:8443", "169.254.169.254:8443"], &hosts);
        assert_eq!(
            verdict(&listed_too, "metadata.corp.test", 8443).await,
            Ok(())
        );

        // Through a wildcard: public addresses only, or one listed itself on the port.
        let wild_hosts: &[(&str, &[IpAddr])] = &[
            ("private.wild.test", &[ip("10.0.0.1")]),
            ("loopback.wild.test", &[ip("127.0.0.1")]),
        ];
        let wild = policy_with_hosts(&["*.wild.test", "127.0.0.1"], wild_hosts);
        let why = verdict(&wild, "private.wild.test", 443).await.unwrap_err();
        assert!(why.contains("allowed only through a wildcard"), "{why}");
        assert_eq!(verdict(&wild, "loopback.wild.test", 443).await, Ok(()));
    }

    /// An address not listed itself is refused before any connection, whatever it is.
    #[tokio::test]
    async fn an_unlisted_ip_literal_is_refused_before_any_connection() {
        let origin = Origin::start().await;
        let port = origin.port();
        let listed = [
            format!("localhost:{port}"),
            "*.example.com:80".to_owned(),
            format!("127.0.0.2:{port}"),
            "127.0.0.1".to_owned(),
            "169.254.169.254".to_owned(),
        ];
        let proxy = Proxy::start(policy(
            &listed.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
        for request in [
            "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n".to_owned(),
            "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n".to_owned(),
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
            format!("GET http://[::ffff:127.0.0.1]:{port}/ HTTP/1.1\r\n\r\n"),
            "CONNECT 127.0.0.3:443 HTTP/1.1\r\n\r\n".to_owned(),
            "CONNECT [::1]:8080 HTTP/1.1\r\n\r\n".to_owned(),
        ] {
            let parts = ["wildcards never cover an IP address"];
            proxy.expect(403, &[(request.as_bytes(), &parts)]).await;
        }
        assert_eq!(
            proxy.events.events(),
            [
                other_port_event("169.254.169.254", 80),
                other_port_event("169.254.169.254", 80),
                other_port_event("127.0.0.1", port),
                other_port_event("127.0.0.1", port),
                unlisted_event("127.0.0.3", 443),
                unlisted_event("::1", 8080),
            ]
        );
        let answer = proxy.exchange(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n").await;
        assert!(answer.contains("add \"[::1]:8080\" itself"), "{answer}");
        assert_eq!(origin.accepted.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn port_less_origin_form_and_malformed_requests_get_400() {
        let proxy = Proxy::start(policy(&["127.0.0.1", "example.com"]));
        for request in [
            &b"CONNECT example.com HTTP/1.1\r\n\r\n"[..],
            b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
            b"GET https://example.com/ HTTP/1.1\r\n\r\n",
            b"garbage\r\n\r\n",
            b"GET http://example.com/ HTTP/2.0\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        ] {
            proxy.expect(400, &[(request, &[])]).await;
        }
        let example = b"CONNECT example.com HTTP/1.1\r\n\r\n";
        proxy
            .expect(400, &[(example, &["CONNECT pypi.org:443"])])
            .await;
        assert!(proxy.events.events().is_empty());
    }

    #[tokio::test]
    async fn an_oversized_head_gets_431() {
        let proxy = Proxy::start(policy(&["example.com"]));
        let mut request = b"GET http://example.com/ HTTP/1.1\r\nX-Big: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES + 1024));
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: 1\r\n"))
            .collect();
        let many_headers = format!("GET http://example.com/ HTTP/1.1\r\n{many}\r\n");
        proxy
            .expect(431, &[(&request, &[]), (many_headers.as_bytes(), &[])])
            .await;
        assert!(proxy.events.events().is_empty());
    }

    #[tokio::test]
    async fn an_unreachable_upstream_gets_502() {
        // A port nothing listens on: bound, then closed.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let loopback = [ip("127.0.0.1")];
        let hosts: &[(&str, &[IpAddr])] = &[("closed.example.test", &loopback)];
        let listed = format!("127.0.0.1:{port}");
        let listed_name = format!("closed.example.test:{port}");
        let proxy = Proxy::start(policy_with_hosts(
            &[&listed, &listed_name, "gone.example.com"],
            hosts,
        ));
        let closed_port = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n");
        let closed_name = format!("CONNECT closed.example.test:{port} HTTP/1.1\r\n\r\n");
        let cannot_connect = format!("cannot connect to closed.example.test:{port}: ");
        let cases: &[(&[u8], &[&str])] = &[
            (closed_port.as_bytes(), &[]),
            (closed_name.as_bytes(), &[&cannot_connect]),
            (
                b"CONNECT gone.example.com:443 HTTP/1.1\r\n\r\n",
                &["cannot resolve gone.example.com"],
            ),
        ];
        proxy.expect(502, cases).await;
        // The name's address is not told.
        let answer = proxy.exchange(closed_name.as_bytes()).await;
        assert!(!answer.contains("127.0.0.1"), "{answer}");
        assert!(proxy.events.events().is_empty());
    }

    /// Lookups that hang keep their threads, but never more than the permits: a timed-out
    /// lookup still holds its permit until its thread is free, so the blocking pool the
    /// gateway's budget holds use is never filled by one run's DNS.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hanging_lookups_never_hold_more_threads_than_the_permits() {
        static PERMITS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = std::sync::Arc::new(Mutex::new(released));
        let mut lookups = Vec::new();
        for _ in 0..6 {
            let released = released.clone();
            let lookup = bounded_blocking(&PERMITS, move || {
                let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
                MOST.fetch_max(now, Ordering::SeqCst);
                let _ = released.lock().unwrap().recv();
                RUNNING.fetch_sub(1, Ordering::SeqCst);
            });
            // Each caller gives up at once, as a resolve that times out does.
            lookups.push(timeout(Duration::from_millis(50), lookup));
        }
        for lookup in lookups {
            assert!(lookup.await.is_err(), "a hanging lookup finished");
        }
        // The two that got a permit run on, holding it, though their callers gave up.
        agentry_testkit::wait::eventually_async(DEADLINE, "two lookups hanging", async || {
            RUNNING.load(Ordering::SeqCst) == 2
        })
        .await;
        assert_eq!(PERMITS.available_permits(), 0);
        // Once they answer, their permits come back.
        for _ in 0..6 {
            let _ = release.send(());
        }
        agentry_testkit::wait::eventually_async(DEADLINE, "the permits back", async || {
            PERMITS.available_permits() == 2
        })
        .await;
        assert_eq!(MOST.load(Ordering::SeqCst), 2);
    }

    /// "ping" from the agent's side of a tunnel reaches the upstream, and "pong" comes back.
    async fn ping_pong(client: &mut UnixStream, upstream: &mut TcpStream) {
        let mut got = [0u8; 4];
        client.write_all(b"ping").await.unwrap();
        timeout(DEADLINE, upstream.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"ping");
        upstream.write_all(b"pong").await.unwrap();
        timeout(DEADLINE, client.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"pong");
    }

    /// A tunnel that passes nothing either way for the idle timeout is closed, on both
    /// sides; every byte passed puts that off.
    #[tokio::test]
    async fn an_idle_tunnel_is_closed() {
        let idle = Duration::from_secs(2);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let listed = format!("127.0.0.1:{port}");
        let proxy = Proxy::start(EgressPolicy {
            idle_timeout: idle,
            ..policy(&[&listed])
        });
        let mut client = tunnel(&proxy.socket, &listed).await;
        let (mut upstream, _) = timeout(DEADLINE, listener.accept()).await.unwrap().unwrap();
        let opened = tokio::time::Instant::now();
        ping_pong(&mut client, &mut upstream).await;
        // Half the idle time later (pacing, not a wait for anything), bytes pass again.
        tokio::time::sleep(idle / 2).await;
        let last = tokio::time::Instant::now();
        ping_pong(&mut client, &mut upstream).await;

        // Closed: the agent's side and the upstream's end, no sooner than the idle timeout
        // after the last byte (to the millisecond the proxy counts in).
        assert!(rest_of(&mut client).await.is_empty());
        let closed = tokio::time::Instant::now();
        assert!(rest_of(&mut upstream).await.is_empty());
        assert!(
            closed - last + Duration::from_millis(2) >= idle,
            "closed {:?} after the last byte",
            closed - last
        );
        assert!(closed - opened >= idle + idle / 2 - Duration::from_millis(2));
    }

    /// Aborting the server closes the tunnels it holds open.
    #[tokio::test]
    async fn aborting_the_server_closes_live_tunnels() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let listed = format!("127.0.0.1:{port}");
        let proxy = Proxy::start(policy(&[&listed]));
        let mut client = tunnel(&proxy.socket, &format!("127.0.0.1:{port}")).await;
        let (mut upstream, _) = timeout(DEADLINE, listener.accept()).await.unwrap().unwrap();
        ping_pong(&mut client, &mut upstream).await;

        proxy.task.abort();
        assert!(rest_of(&mut client).await.is_empty());
        assert!(rest_of(&mut upstream).await.is_empty());
        // The listener went with the task: nothing accepts on the socket any more.
        assert!(UnixStream::connect(&proxy.socket).await.is_err());
    }
}
