//! Connections: TCP, or TLS over TCP.
//!
//! Every stampfs connection is made by a [`Dialer`] and taken in by an [`Acceptor`].
//! Both are plain TCP unless TLS is configured:
//! - a server given a certificate and its key ([`Acceptor::tls`]) speaks TLS only, on
//!   every connection of its port;
//! - a process given the certificate authority ([`Dialer::tls`]) dials TLS, and checks
//!   that the server's certificate was issued by that authority for the host it dialed
//!   (an address's IP, or its DNS name).
//!
//! Either way a connection is a [`ConnRead`] and a [`ConnWrite`], so the frame readers
//! and writers above do not know which. A plain connection keeps tokio's owned halves
//! (no lock between reads and writes); a TLS stream is split by [`tokio::io::split`].
//!
//! TLS here is for privacy and for knowing the server: who the *peer* is, client or
//! chunkserver, is still proven by the handshakes of [`crate::auth`], under TLS or not.

use crate::codec::{decode_prefix, FrameWriter, PREFIX_LEN};
use crate::error::{Error, RemoteError, Result};
use crate::rpc::reply_frame;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

/// How a process dials its peers: plain TCP (the default), or TLS checked against a
/// certificate authority.
#[derive(Clone, Default)]
pub struct Dialer {
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.tls.is_some() {
            "Dialer(tls)"
        } else {
            "Dialer(plain)"
        })
    }
}

impl Dialer {
    /// Plain TCP.
    pub fn plain() -> Self {
        Self::default()
    }

    /// TLS, trusting the certificates of the PEM file `ca` (one or more) as authorities.
    pub fn tls(ca: &Path) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        let certs = read_certs(ca)?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| tls_file(ca, format!("not a usable certificate authority: {e}")))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_file(ca, e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            tls: Some(TlsConnector::from(Arc::new(config))),
        })
    }

    /// `Dialer::tls(ca)` with `ca` given, plain without.
    pub fn from_ca(ca: Option<&Path>) -> Result<Self> {
        ca.map_or_else(|| Ok(Self::plain()), Self::tls)
    }

    /// Whether this dialer speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connects to `addr` (`host:port`) with `TCP_NODELAY`, and under TLS completes the
    /// handshake, all within `timeout`. Failures are [`RemoteError::Unavailable`],
    /// naming the address and why.
    pub async fn connect(&self, addr: &str, timeout: Duration) -> Result<Conn> {
        let unavailable = |reason: String| Error::Remote(RemoteError::Unavailable { reason });
        let work = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| unavailable(format!("cannot connect to {addr}: {e}")))?;
            stream.set_nodelay(true)?;
            let peer = stream.peer_addr()?;
            let Some(connector) = &self.tls else {
                return Ok(Conn::plain(stream, peer));
            };
            let name = server_name(addr).map_err(unavailable)?;
            let tls = connector.connect(name, stream).await.map_err(|e| {
                unavailable(format!(
                    "TLS handshake with {addr} failed: {e} (does it serve TLS, with a \
                     certificate for this address from the authority given?)"
                ))
            })?;
            Ok(Conn::tls(TlsStream::Client(tls), peer))
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| unavailable(format!("connecting to {addr} timed out")))?
    }
}

/// How a server takes in connections: plain TCP (the default), or TLS with its
/// certificate.
#[derive(Clone, Default)]
pub struct Acceptor {
    tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.tls.is_some() {
            "Acceptor(tls)"
        } else {
            "Acceptor(plain)"
        })
    }
}

/// How long a server waits for a client's TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS connection (a handshake record). A stampfs frame never
/// starts with it: its first byte is the top of a length of at most 2^25, so 0, 1 or 2.
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

impl Acceptor {
    /// Plain TCP.
    pub fn plain() -> Self {
        Self::default()
    }

    /// TLS with the certificate chain of the PEM file `cert` (the server's own first)
    /// and the private key of the PEM file `key`.
    pub fn tls(cert: &Path, key: &Path) -> Result<Self> {
        let chain = read_certs(cert)?;
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| tls_file(key, format!("no usable private key: {e}")))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_file(cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| tls_file(cert, format!("certificate and key do not go together: {e}")))?;
        Ok(Self {
            tls: Some(TlsAcceptor::from(Arc::new(config))),
        })
    }

    /// `Acceptor::tls` with both files given, plain with neither; one without the other
    /// is an error.
    pub fn from_files(cert: Option<&Path>, key: Option<&Path>) -> Result<Self> {
        match (cert, key) {
            (None, None) => Ok(Self::plain()),
            (Some(cert), Some(key)) => Self::tls(cert, key),
            (Some(path), None) | (None, Some(path)) => Err(tls_file(
                path,
                "TLS needs both a certificate (--tls-cert) and its key (--tls-key)".into(),
            )),
        }
    }

    /// Whether this acceptor speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Takes in an accepted TCP stream: sets `TCP_NODELAY`, and under TLS completes the
    /// handshake within [`HANDSHAKE_TIMEOUT`]. A client that sends a stampfs frame to a
    /// TLS port is answered with an `Unauthenticated` error saying to dial with TLS,
    /// and refused.
    pub async fn accept(&self, mut stream: TcpStream, peer: SocketAddr) -> io::Result<Conn> {
        let _ = stream.set_nodelay(true);
        let Some(acceptor) = &self.tls else {
            return Ok(Conn::plain(stream, peer));
        };
        let timed_out = |_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out");
        let mut first = [0u8; 1];
        let n = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first))
            .await
            .map_err(timed_out)??;
        if n == 0 {
            // A port probe: connected and closed. Nothing to log above debug.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before its TLS handshake",
            ));
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, refuse_plain(&mut stream)).await;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a plain-TCP client on this TLS port (told to dial with TLS)",
            ));
        }
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
            .await
            .map_err(timed_out)??;
        Ok(Conn::tls(TlsStream::Server(tls), peer))
    }
}

/// A server's TLS options: its own certificate and key, and the authority it checks
/// its peers' certificates against. All absent is plain TCP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct TlsFiles {
    /// Certificate chain (PEM, this server's own certificate first) to serve TLS with:
    /// every connection to this port must then speak TLS. Needs --tls-key.
    #[cfg_attr(feature = "clap", arg(long, requires = "tls_key"))]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[cfg_attr(feature = "clap", arg(long, requires = "tls_cert"))]
    pub tls_key: Option<PathBuf>,
    /// Certificate authority (PEM) that issued the certificates of the servers this one
    /// dials: with it, connections to them speak TLS and their certificates are checked.
    /// (A server does not read STAMPFS_TLS_CA, the clients' variable.)
    #[cfg_attr(feature = "clap", arg(long))]
    pub tls_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Reads the files: how this process takes in connections, and how it dials.
    pub fn load(&self) -> Result<(Acceptor, Dialer)> {
        Ok((
            Acceptor::from_files(self.tls_cert.as_deref(), self.tls_key.as_deref())?,
            Dialer::from_ca(self.tls_ca.as_deref())?,
        ))
    }
}

/// One connection, taken apart into its two directions.
pub struct Conn {
    pub read: ConnRead,
    pub write: ConnWrite,
    pub peer: SocketAddr,
}

impl Conn {
    fn plain(stream: TcpStream, peer: SocketAddr) -> Self {
        let (r, w) = stream.into_split();
        Self {
            read: ConnRead::Plain(r),
            write: ConnWrite::Plain(w),
            peer,
        }
    }

    fn tls(stream: TlsStream<TcpStream>, peer: SocketAddr) -> Self {
        let (r, w) = tokio::io::split(stream);
        Self {
            read: ConnRead::Tls(r),
            write: ConnWrite::Tls(w),
            peer,
        }
    }
}

/// The reading half of a connection.
#[derive(Debug)]
pub enum ConnRead {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsStream<TcpStream>>),
}

/// The writing half of a connection.
#[derive(Debug)]
pub enum ConnWrite {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<TcpStream>>),
}

/// What an idle connection holds when looked at without waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleState {
    /// Nothing: it can carry the next request.
    Quiet,
    /// Closed by the peer, failed, or holding bytes nobody asked for.
    Unusable,
}

impl ConnRead {
    /// Looks at the connection without waiting (see [`IdleState`]). Under TLS, records
    /// that carry no data (a session ticket) are taken in and do not count.
    pub fn idle_state(&mut self) -> IdleState {
        let mut probe = [0u8; 1];
        match self {
            // Asked of the kernel (a peek that does not wait): the runtime's own view of
            // the socket, which `try_read` consults first, may not have caught up with a
            // close that arrived while the connection sat idle (a master restarted a
            // moment ago), and a request sent then is lost with the connection.
            ConnRead::Plain(r) => {
                let peeked = rustix::net::recv(
                    AsRef::<TcpStream>::as_ref(r),
                    &mut probe[..],
                    rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
                );
                match peeked {
                    Err(e) if e == rustix::io::Errno::WOULDBLOCK => IdleState::Quiet,
                    // EOF, bytes nobody asked for, or an error.
                    _ => IdleState::Unusable,
                }
            }
            ConnRead::Tls(r) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                match Pin::new(r).poll_read(&mut cx, &mut buf) {
                    Poll::Pending => IdleState::Quiet,
                    Poll::Ready(_) => IdleState::Unusable,
                }
            }
        }
    }
}

impl AsyncRead for ConnRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ConnRead::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ConnWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_write(cx, buf),
            ConnWrite::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            ConnWrite::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ConnWrite::Plain(w) => w.is_write_vectored(),
            ConnWrite::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_flush(cx),
            ConnWrite::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnWrite::Plain(w) => Pin::new(w).poll_shutdown(cx),
            ConnWrite::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// Answers the first request of a plain client on a TLS port with the reason it is
/// refused.
async fn refuse_plain(stream: &mut TcpStream) -> Result<()> {
    use tokio::io::AsyncReadExt;
    // Only the request id is needed: the prefix, the header length and the start of
    // the header (an id is a varint of at most 9 bytes), never the whole frame.
    let mut start = [0u8; PREFIX_LEN + 4];
    stream.read_exact(&mut start).await?;
    let hlen = u32::from_be_bytes([start[8], start[9], start[10], start[11]]) as usize;
    let mut header = vec![0u8; hlen.min(16)];
    stream.read_exact(&mut header).await?;
    let (id, _): (u64, usize) = decode_prefix(&header)?;
    let (_, w) = stream.split();
    let refusal: std::result::Result<(), RemoteError> = Err(RemoteError::Unauthenticated {
        reason: "this server accepts TLS connections only: dial it with TLS, trusting \
                 its certificate authority (--tls-ca or STAMPFS_TLS_CA)"
            .into(),
    });
    FrameWriter::new(w)
        .write_frame(&reply_frame(id, &refusal, bytes::Bytes::new())?)
        .await
}

/// The cryptography under every TLS connection (ring's).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The name a certificate must be for, from `host:port` (an IP address, bracketed for
/// IPv6, or a DNS name).
fn server_name(addr: &str) -> std::result::Result<ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((host, _port)) => host,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("{addr}: {host:?} cannot be checked against a certificate: {e}"))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_file(path, e.to_string()))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_file(path, e.to_string()))?;
    if certs.is_empty() {
        return Err(tls_file(path, "holds no PEM certificate".into()));
    }
    Ok(certs)
}

fn tls_file(path: &Path, reason: String) -> Error {
    Error::TlsFile {
        path: path.display().to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection the peer closed while it sat idle is unusable at once, before the
    /// runtime has polled its socket (here: never, the runtime's only thread sleeps).
    #[test]
    fn an_idle_connection_closed_by_the_peer_is_seen_closed_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr").to_string();
            let mut conn = Dialer::plain()
                .connect(&addr, Duration::from_secs(5))
                .await
                .expect("connect");
            let (server, _) = listener.accept().await.expect("accept");
            assert_eq!(conn.read.idle_state(), IdleState::Quiet);
            drop(server);
            // The FIN arrives; the runtime does not run meanwhile.
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(conn.read.idle_state(), IdleState::Unusable);
        });
    }

    #[test]
    fn server_names_come_from_the_host_part() {
        assert!(matches!(
            server_name("127.0.0.1:9000"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("[::1]:9000"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("cs1.example:9000"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name("bad host:9000").is_err());
    }

    #[test]
    fn half_a_server_configuration_is_refused() {
        let path = Path::new("/nonexistent/cert.pem");
        let err = Acceptor::from_files(Some(path), None).unwrap_err();
        assert!(err.to_string().contains("--tls-key"), "{err}");
        let err = Dialer::tls(path).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }
}

/// The addresses in a `--master` value: one master, or a master group's members
/// separated by commas (blanks around them ignored, empty ones dropped).
pub fn master_addrs(master: &str) -> Vec<String> {
    master
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

/// The member of `members` after `current` (the first when `current` is not among
/// them): where to go when `current` cannot be reached or names no leader.
pub fn next_master(members: &[String], current: &str) -> String {
    let at = members.iter().position(|m| m == current);
    members
        .get(at.map_or(0, |i| (i + 1) % members.len().max(1)))
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod master_list_tests {
    use super::*;

    #[test]
    fn a_master_list_is_split_and_walked_round() {
        let m = master_addrs(" a:1, b:2 ,,c:3,");
        assert_eq!(m, ["a:1", "b:2", "c:3"]);
        assert_eq!(next_master(&m, "a:1"), "b:2");
        assert_eq!(next_master(&m, "c:3"), "a:1");
        assert_eq!(next_master(&m, "z:9"), "a:1");
        assert_eq!(next_master(&[], "z:9"), "");
        assert_eq!(master_addrs("127.0.0.1:7070"), ["127.0.0.1:7070"]);
    }
}
