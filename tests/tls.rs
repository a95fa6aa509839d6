//! Transport encryption (issue 18, item 4).
//!
//! With real master and chunkserver processes serving TLS, behind recording proxies
//! that see every byte between the client, the master and the chunkservers (and
//! between the chunkservers of the write pipeline): a file is stored and read back,
//! a user is added, and none of the file's bytes, its name or the new user's key
//! crosses the wire in the clear. A client without TLS, or trusting another
//! authority, is refused with an error that says why.
//!
//! In-process, on real loopback sockets: a certificate for another name is refused,
//! a TLS client on a plain port is named in the server's error, and an idle TLS
//! connection closed by its server is seen as unusable (the pools rely on it), and
//! garbage handshakes are closed while the server serves on.

mod common;

use common::{runtime, TestCluster};
use stampfs::tls::{generate, Pki};
use stampfs_proto::net::{Acceptor, Dialer};
use stampfs_proto::rpc::{parse_request, reply_frame};
use stampfs_proto::{Error, FrameReader, FrameWriter, MasterRequest, RemoteError, RpcClient, Stat};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes a [`Tap`] keeps.
const TAP_LIMIT: usize = 64 << 20;

/// A TCP proxy on loopback that keeps every byte it forwards, both ways.
struct Tap {
    addr: String,
    target: Arc<Mutex<Option<String>>>,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    /// Listens now; forwards to the target once [`Tap::forward_to`] names it.
    fn start() -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a tap");
        let addr = listener.local_addr().expect("tap address").to_string();
        let target: Arc<Mutex<Option<String>>> = Arc::default();
        let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
        let (t, s) = (target.clone(), seen.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (t, s) = (t.clone(), s.clone());
                std::thread::spawn(move || splice(client, &t, &s));
            }
        });
        Tap { addr, target, seen }
    }

    fn forward_to(&self, target: &str) {
        *self.target.lock().expect("tap target") = Some(target.to_string());
    }

    fn seen(&self) -> Vec<u8> {
        self.seen.lock().expect("tap bytes").clone()
    }
}

/// Forwards one connection both ways, recording what passes.
fn splice(client: TcpStream, target: &Mutex<Option<String>>, seen: &Arc<Mutex<Vec<u8>>>) {
    let deadline = Instant::now() + TIMEOUT;
    let to = loop {
        if let Some(t) = target.lock().expect("tap target").clone() {
            break t;
        }
        if Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let Ok(server) = TcpStream::connect(&to) else {
        return;
    };
    let pump = |mut from: TcpStream, mut to: TcpStream, seen: Arc<Mutex<Vec<u8>>>| {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                {
                    let mut s = seen.lock().expect("tap bytes");
                    if s.len() + n <= TAP_LIMIT {
                        s.extend_from_slice(&buf[..n]);
                    }
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Write);
        })
    };
    let (c2, s2) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let a = pump(client, server, seen.clone());
    let b = pump(s2, c2, seen.clone());
    let _ = a.join();
    let _ = b.join();
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn tls_args(pki: &Pki) -> Vec<String> {
    [
        "--tls-cert",
        pki.cert.to_str().expect("path"),
        "--tls-key",
        pki.key.to_str().expect("path"),
        "--tls-ca",
        pki.ca.to_str().expect("path"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A cluster of three chunkservers serving TLS with `pki`, each advertised through a
/// [`Tap`] (so clients and the other chunkservers reach it through the tap), and a
/// tap in front of the master for clients.
fn tapped_tls_cluster(pki: &Pki) -> (TestCluster, Tap, Vec<Tap>) {
    let mut cs_args: Vec<String> = vec!["--heartbeat".into(), "200ms".into()];
    cs_args.extend(tls_args(pki));
    let mut c = TestCluster::with(common::Opts {
        chunkservers: 0,
        master_args: tls_args(pki),
        chunkserver_args: cs_args,
        client_env: vec![("STAMPFS_TLS_CA".into(), pki.ca.display().to_string())],
    });
    let mut taps = Vec::new();
    for _ in 0..3 {
        let tap = Tap::start();
        let i = c.add_chunkserver_with(&[], &["--advertise", &tap.addr]);
        tap.forward_to(&c.chunkservers[i].addr);
        taps.push(tap);
    }
    c.wait_live(3);
    let master_tap = Tap::start();
    master_tap.forward_to(&c.master.addr);
    (c, master_tap, taps)
}

#[test]
fn a_tls_cluster_stores_and_serves_with_nothing_in_the_clear() {
    let certs = tempfile::tempdir().expect("tempdir");
    let pki = generate(certs.path(), &["127.0.0.1", "localhost"]).expect("certificates");
    let (c, master_tap, cs_taps) = tapped_tls_cluster(&pki);
    let via_tap = |args: &[&str]| {
        let out = c
            .cmd(args)
            .env("STAMPFS_MASTER", &master_tap.addr)
            .output()
            .expect("run stampfs");
        assert!(
            out.status.success(),
            "stampfs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };

    let marker = b"stampfs-plaintext-marker/";
    let payload: Vec<u8> = marker.iter().copied().cycle().take(3 << 20).collect();
    let local = c.dir.path().join("payload");
    std::fs::write(&local, &payload).expect("write payload");
    let remote = "/confidential-report-name.txt";
    via_tap(&["put", local.to_str().expect("path"), remote]);
    assert_eq!(via_tap(&["cat", remote]), payload, "read back over TLS");
    let carol_file = c.dir.path().join("carol.credentials");
    via_tap(&[
        "admin",
        "user",
        "add",
        "carol",
        "--uid",
        "4242",
        "--output",
        carol_file.to_str().expect("path"),
    ]);
    let carol = stampfs_proto::Credentials::load(&carol_file).expect("carol's credentials");
    let carol_key = carol.key_bytes();
    let carol_hex = hex_of(&carol_key);

    let master_bytes = master_tap.seen();
    assert!(
        master_bytes.len() > 1000,
        "the master's tap saw the traffic ({} bytes)",
        master_bytes.len()
    );
    assert!(!contains(&master_bytes, b"confidential-report-name"));
    assert!(!contains(&master_bytes, b"carol"));
    assert!(!contains(&master_bytes, carol_hex.as_bytes()));
    assert!(!contains(&master_bytes, &carol_key));
    let mut data_bytes = 0;
    for (i, tap) in cs_taps.iter().enumerate() {
        let seen = tap.seen();
        data_bytes += seen.len();
        assert!(
            !contains(&seen, marker),
            "chunkserver {i}'s tap saw file bytes in the clear"
        );
    }
    // The client's stream to the head and the head's to the next replicas, the read.
    assert!(
        data_bytes > 3 * payload.len(),
        "the data went through the taps ({data_bytes} bytes)"
    );
    let logs = c.logs();
    assert!(!logs.contains("panicked"), "{logs}");
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn plain_and_untrusting_clients_are_told_why_they_are_refused() {
    let certs = tempfile::tempdir().expect("tempdir");
    let pki = generate(&certs.path().join("cluster"), &["127.0.0.1"]).expect("certificates");
    let other = generate(&certs.path().join("other"), &["127.0.0.1"]).expect("certificates");
    let mut cs_args: Vec<String> = vec!["--heartbeat".into(), "200ms".into()];
    cs_args.extend(tls_args(&pki));
    let c = TestCluster::with(common::Opts {
        chunkservers: 1,
        master_args: [tls_args(&pki), vec!["--replication".into(), "1".into()]].concat(),
        chunkserver_args: cs_args,
        client_env: vec![("STAMPFS_TLS_CA".into(), pki.ca.display().to_string())],
    });
    c.put_bytes("/f", b"over tls\n", &[]);
    assert_eq!(c.cat("/f"), b"over tls\n");

    // `stampfs cat /f` with STAMPFS_TLS_CA set to `ca` (removed with `None`): it
    // fails, and says this.
    let refused = |ca: Option<&Path>| {
        let mut cmd = c.cmd(&["cat", "/f"]);
        match ca {
            Some(ca) => cmd.env("STAMPFS_TLS_CA", ca),
            None => cmd.env_remove("STAMPFS_TLS_CA"),
        };
        let out = cmd.output().expect("run");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(None);
    assert!(
        err.contains("accepts TLS connections only") && err.contains("--tls-ca"),
        "{err}"
    );
    let err = refused(Some(&other.ca));
    assert!(
        err.contains("TLS handshake") && err.contains("invalid peer certificate"),
        "{err}"
    );
    let err = refused(Some(&certs.path().join("nonexistent.pem")));
    assert!(err.contains("nonexistent.pem"), "{err}");

    // The master served everyone else throughout, and says whom it refused.
    assert_eq!(c.cat("/f"), b"over tls\n");
    let logs = c.logs();
    assert!(logs.contains("plain-TCP client on this TLS port"), "{logs}");
    assert!(!logs.contains("panicked"), "{logs}");
}

/// A TLS server on loopback that answers every request with `NotFound` and ends each
/// connection after `answers` replies.
async fn tls_server(acceptor: Acceptor, answers: usize) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(conn) = acceptor.accept(stream, peer).await else {
                    return;
                };
                let mut reader = FrameReader::new(conn.read);
                let mut writer = FrameWriter::new(conn.write);
                for _ in 0..answers {
                    let Ok(Some(frame)) = reader.read_frame().await else {
                        return;
                    };
                    let (id, _): (u64, MasterRequest) = parse_request(&frame).expect("request");
                    let reply: Result<(), RemoteError> = Err(RemoteError::NotFound {
                        what: "nothing here".into(),
                    });
                    let frame = reply_frame(id, &reply, bytes::Bytes::new()).expect("frame");
                    writer.write_frame(&frame).await.expect("reply");
                }
            });
        }
    });
    addr
}

fn stat() -> Stat {
    Stat {
        path: "/".into(),
        caller: None,
    }
}

#[test]
fn certificates_are_checked_for_the_name_dialed() {
    let certs = tempfile::tempdir().expect("tempdir");
    let good = generate(&certs.path().join("good"), &["127.0.0.1", "localhost"]).expect("pki");
    let elsewhere =
        generate(&certs.path().join("elsewhere"), &["not-this-host.invalid"]).expect("pki");
    runtime().block_on(async {
        let dialer = Dialer::tls(&good.ca).expect("dialer");
        let acceptor = Acceptor::tls(&good.cert, &good.key).expect("acceptor");
        let addr = tls_server(acceptor, 10).await;
        let port = addr.rsplit_once(':').expect("port").1;
        for name in [addr.clone(), format!("localhost:{port}")] {
            let mut conn = RpcClient::connect(&dialer, &name, TIMEOUT)
                .await
                .expect("dial");
            let answer = conn.call(stat()).await;
            assert!(
                matches!(answer, Err(Error::Remote(RemoteError::NotFound { .. }))),
                "{name}: {answer:?}"
            );
        }

        let dialer = Dialer::tls(&elsewhere.ca).expect("dialer");
        let acceptor = Acceptor::tls(&elsewhere.cert, &elsewhere.key).expect("acceptor");
        let addr = tls_server(acceptor, 10).await;
        let err = RpcClient::connect(&dialer, &addr, TIMEOUT)
            .await
            .expect_err("a certificate for another name");
        let text = err.to_string();
        assert!(
            text.contains("TLS handshake") && text.contains("not valid for name"),
            "{text}"
        );
    });
}

#[test]
fn a_tls_client_on_a_plain_port_is_named_in_the_servers_error() {
    let certs = tempfile::tempdir().expect("tempdir");
    let pki = generate(certs.path(), &["127.0.0.1"]).expect("pki");
    runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = tokio::spawn(async move {
            let (stream, peer) = listener.accept().await.expect("accept");
            let conn = Acceptor::plain().accept(stream, peer).await.expect("plain");
            FrameReader::new(conn.read).read_frame().await
        });
        let dialer = Dialer::tls(&pki.ca).expect("dialer");
        let err = RpcClient::connect(&dialer, &addr, TIMEOUT)
            .await
            .expect_err("a plain server");
        assert!(err.to_string().contains("TLS handshake"), "{err}");
        let seen = server.await.expect("server task");
        match seen {
            Err(Error::Malformed { reason }) => {
                assert!(
                    reason.contains("TLS handshake where a stampfs frame"),
                    "{reason}"
                )
            }
            other => panic!("expected a malformed frame naming TLS, got {other:?}"),
        }
    });
}

#[test]
fn an_idle_tls_connection_closed_by_its_server_is_not_reused() {
    let certs = tempfile::tempdir().expect("tempdir");
    let pki = generate(certs.path(), &["127.0.0.1"]).expect("pki");
    runtime().block_on(async {
        let dialer = Dialer::tls(&pki.ca).expect("dialer");
        let acceptor = Acceptor::tls(&pki.cert, &pki.key).expect("acceptor");
        // The server answers one request per connection, then closes it.
        let addr = tls_server(acceptor, 1).await;
        let mut conn = RpcClient::connect(&dialer, &addr, TIMEOUT)
            .await
            .expect("dial");
        assert!(!conn.unusable_while_idle(), "a fresh connection is usable");
        let answer = conn.call(stat()).await;
        assert!(matches!(
            answer,
            Err(Error::Remote(RemoteError::NotFound { .. }))
        ));
        let deadline = Instant::now() + TIMEOUT;
        while !conn.unusable_while_idle() {
            assert!(
                Instant::now() < deadline,
                "a closed TLS connection still looks usable"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // One that stays open stays usable while idle (session tickets and all).
        let acceptor = Acceptor::tls(&pki.cert, &pki.key).expect("acceptor");
        let addr = tls_server(acceptor, 100).await;
        let mut conn = RpcClient::connect(&dialer, &addr, TIMEOUT)
            .await
            .expect("dial");
        let _ = conn.call(stat()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !conn.unusable_while_idle(),
            "an open idle connection is usable"
        );
        let answer = conn.call(stat()).await;
        assert!(matches!(
            answer,
            Err(Error::Remote(RemoteError::NotFound { .. }))
        ));
    });
}

#[test]
fn a_tls_client_that_goes_away_between_requests_ends_cleanly() {
    let certs = tempfile::tempdir().expect("tempdir");
    let pki = generate(certs.path(), &["127.0.0.1"]).expect("pki");
    runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let acceptor = Acceptor::tls(&pki.cert, &pki.key).expect("acceptor");
        let server = tokio::spawn(async move {
            let (stream, peer) = listener.accept().await.expect("accept");
            let conn = acceptor.accept(stream, peer).await.expect("handshake");
            let mut reader = FrameReader::new(conn.read);
            let mut writer = FrameWriter::new(conn.write);
            let frame = reader.read_frame().await.expect("read").expect("a request");
            let (id, _): (u64, MasterRequest) = parse_request(&frame).expect("request");
            let reply: Result<(), RemoteError> = Err(RemoteError::NotFound {
                what: "nothing".into(),
            });
            let frame = reply_frame(id, &reply, bytes::Bytes::new()).expect("frame");
            writer.write_frame(&frame).await.expect("reply");
            // The client drops its connection without a TLS close_notify.
            reader.read_frame().await
        });
        let dialer = Dialer::tls(&pki.ca).expect("dialer");
        let mut conn = RpcClient::connect(&dialer, &addr, TIMEOUT)
            .await
            .expect("dial");
        let _ = conn.call(stat()).await;
        drop(conn);
        let end = server.await.expect("server task");
        assert!(matches!(end, Ok(None)), "a clean end, got {end:?}");
    });
}

#[test]
fn garbage_handshakes_are_closed_and_the_server_serves_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs = tempfile::tempdir().expect("tempdir");
    let pki = generate(certs.path(), &["127.0.0.1"]).expect("pki");
    runtime().block_on(async {
        let acceptor = Acceptor::tls(&pki.cert, &pki.key).expect("acceptor");
        let addr = tls_server(acceptor, 10).await;
        let mut oversized = vec![0x16, 0x03, 0x01, 0xff, 0xff];
        oversized.extend(std::iter::repeat_n(0xab, 70_000));
        let hostile: [Vec<u8>; 3] = [
            // A handshake record of garbage.
            [&[0x16u8, 0x03, 0x01, 0x00, 0x20][..], &[0x5a; 32]].concat(),
            // A record longer than TLS allows, and more bytes than it announced.
            oversized,
            // Not TLS and not a frame either: a frame length over the limit.
            vec![0xff; 64],
        ];
        for bytes in hostile {
            let mut s = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let _ = s.write_all(&bytes).await;
            let mut buf = vec![0u8; 4096];
            let closed = tokio::time::timeout(TIMEOUT, async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => continue,
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "the server closes a garbage handshake");
        }
        let dialer = Dialer::tls(&pki.ca).expect("dialer");
        let mut conn = RpcClient::connect(&dialer, &addr, TIMEOUT)
            .await
            .expect("an honest client after them");
        let answer = conn.call(stat()).await;
        assert!(matches!(
            answer,
            Err(Error::Remote(RemoteError::NotFound { .. }))
        ));
    });
}
