//! The idle timeout on real sockets: a silent connection or write stream is closed and
//! frees its connection permit (and its downstream stream); a peer that keeps talking,
//! or whose packet is still in flight downstream, is not cut.
//!
//! Timing: the silent cases only assert that the close happens within a generous bound;
//! the busy cases talk at least five times more often than the idle timeout.

mod common;

use bytes::Bytes;
use common::*;
use stampfs_chunkserver::{ChunkserverConfig, ChunkserverHandle, IoEngineKind};
use stampfs_proto::rpc::{parse_request, reply_frame};
use stampfs_proto::{
    ChunkRequest, ChunkToken, ChunkserverAddr, ChunkserverId, FrameReader, FrameWriter,
    RemoteError, ReplicaInfo, RpcClient, WriteSetupReply,
};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// The idle timeout of the chunkservers that must close something.
const SHORT_IDLE: Duration = Duration::from_millis(300);
/// The idle timeout of the chunkservers that must keep a busy peer (five times the
/// busiest gap below, so a loaded machine does not make them flaky).
const BUSY_IDLE: Duration = Duration::from_secs(1);
/// The gap between requests or packets of a busy peer.
const GAP: Duration = Duration::from_millis(100);

fn config(cluster: &Cluster, n: u64, idle: Duration) -> ChunkserverConfig {
    let mut c = cluster.config(n, IoEngineKind::Threads);
    c.idle_timeout = idle;
    c
}

/// Waits (at most [`TIMEOUT`]) for the server to close `s`: EOF or a reset.
async fn closed_by_server(s: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(TIMEOUT, s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{what}: the idle connection was not closed"))
        .unwrap_or(0);
    assert_eq!(n, 0, "{what}: the server sent bytes instead of closing");
}

/// One request that must be answered (a typed error is an answer too) within
/// [`TIMEOUT`]; a transport error or no answer fails the test.
async fn answered(c: &mut RpcClient, token: ChunkToken, what: &str) {
    match tokio::time::timeout(TIMEOUT, c.call(ReplicaInfo { token })).await {
        Ok(Ok(_)) | Ok(Err(stampfs_proto::Error::Remote(_))) => {}
        Ok(Err(e)) => panic!("{what}: transport error: {e}"),
        Err(_) => panic!("{what}: no answer within {TIMEOUT:?}"),
    }
}

/// A request on a new connection is answered: proof that a connection permit is free.
async fn serves_a_new_connection(cs: &ChunkserverHandle, token: ChunkToken, what: &str) {
    let mut c = RpcClient::connect(&cs.addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    answered(&mut c, token, what).await;
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let cluster = Cluster::new();
    let cs = cluster.start_with(1, config(&cluster, 1, SHORT_IDLE)).await;
    let mut s = TcpStream::connect(cs.addr()).await.expect("connect");
    closed_by_server(&mut s, "silent from the start").await;
    // The server goes on serving others.
    serves_a_new_connection(&cs, cluster.token(1, 1), "after the close").await;
    cs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn an_idle_connection_gives_its_permit_back() {
    let cluster = Cluster::new();
    let mut c = config(&cluster, 1, SHORT_IDLE);
    c.max_connections = 1;
    let cs = cluster.start_with(1, c).await;
    let token = cluster.token(2, 1);
    // This connection holds the only permit (it was served), then falls silent.
    let mut holder = RpcClient::connect(&cs.addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    answered(&mut holder, token, "the holder").await;
    // A second connection waits in the backlog until the holder is closed as idle.
    serves_a_new_connection(&cs, token, "waiting for the permit").await;
    match tokio::time::timeout(TIMEOUT, holder.call(ReplicaInfo { token })).await {
        Ok(Err(stampfs_proto::Error::Remote(e))) => panic!("the idle holder was served: {e}"),
        Ok(Ok(_)) => panic!("the idle holder was served"),
        Ok(Err(_)) => {}
        Err(_) => panic!("the idle holder was neither served nor closed"),
    }
    cs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_connection_that_keeps_asking_is_not_closed() {
    let cluster = Cluster::new();
    let cs = cluster.start_with(1, config(&cluster, 1, BUSY_IDLE)).await;
    let token = cluster.token(3, 1);
    let mut c = RpcClient::connect(&cs.addr().to_string(), TIMEOUT)
        .await
        .expect("connect");
    // Requests every 100 ms for well over twice the idle timeout, on one connection.
    for i in 0..25 {
        answered(&mut c, token, &format!("request {i}")).await;
        tokio::time::sleep(GAP).await;
    }
    // Silent from here on: the same connection is closed.
    let (mut reader, _writer) = c.into_parts();
    let end = tokio::time::timeout(TIMEOUT, reader.read_frame())
        .await
        .expect("closed once silent");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    cs.shutdown().await.expect("shutdown");
}

/// Two chunkservers: the head with `idle`, the second with the default idle timeout
/// and a single connection permit (so serving anyone else proves its stream ended).
async fn two(cluster: &Cluster, idle: Duration) -> (ChunkserverHandle, ChunkserverHandle) {
    let head = cluster.start_with(1, config(cluster, 1, idle)).await;
    let mut c2 = cluster.config(2, IoEngineKind::Threads);
    c2.max_connections = 1;
    let second = cluster.start_with(2, c2).await;
    for s in [&head, &second] {
        bump(cluster, s, 10, 1).await;
    }
    (head, second)
}

#[tokio::test]
async fn an_idle_write_stream_ends_like_a_closed_one_and_can_be_reopened() {
    let cluster = Cluster::new();
    let (head, second) = two(&cluster, SHORT_IDLE).await;
    let token = cluster.token(10, 1);
    let mut w = Writer::open(&head, token, 0, vec![addr_of(&second)])
        .await
        .expect("setup");
    assert_eq!(w.setup.accepted, ids(&[1, 2]));
    let data = pattern(5000, 1);
    w.send(0, 0, &data, true).await;
    let ack = w.ack().await.expect("ack");
    assert!(ack.replicas.iter().all(|r| r.result == Ok(5000)), "{ack:?}");
    // Silence: the head ends the stream (EOF on the ack side) ...
    let end = tokio::time::timeout(TIMEOUT, w.reader.read_frame())
        .await
        .expect("the idle stream is closed");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    // ... and its downstream stream with it: the second chunkserver's only permit,
    // held by the head's downstream connection, is free again.
    serves_a_new_connection(&second, token, "the second chunkserver").await;
    // What a writer does on its next write: the same token, from the acknowledged
    // length, through the same pipeline. Nothing acknowledged was lost.
    let mut w = Writer::open(&head, token, 5000, vec![addr_of(&second)])
        .await
        .expect("reopen with the same token");
    assert_eq!(w.setup.accepted, ids(&[1, 2]));
    assert!(w.setup.failed.is_empty(), "{:?}", w.setup.failed);
    w.send(1, 5000, &data, false).await;
    let ack = w.ack().await.expect("ack after reopening");
    assert!(
        ack.replicas.iter().all(|r| r.result == Ok(10_000)),
        "{ack:?}"
    );
    drop(w);
    for s in [&head, &second] {
        let (report, got) = read(s, token, 0, 10_000).await.expect("read");
        assert_eq!(report.length, 10_000);
        assert!(got[..5000] == data[..] && got[5000..] == data[..]);
    }
    head.shutdown().await.expect("shutdown");
    second.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_slow_writer_is_not_cut() {
    let cluster = Cluster::new();
    let (head, second) = two(&cluster, BUSY_IDLE).await;
    let token = cluster.token(10, 1);
    let mut w = Writer::open(&head, token, 0, vec![addr_of(&second)])
        .await
        .expect("setup");
    let data = pattern(1000, 2);
    // A small packet every 100 ms for well over twice the idle timeout, some synced.
    let mut offset = 0u64;
    for seq in 0..25u64 {
        w.send(seq, offset, &data, seq % 5 == 0).await;
        offset += data.len() as u64;
        let ack = w.ack().await.expect("the stream is still open");
        assert_eq!(ack.seq, seq);
        assert!(
            ack.replicas.iter().all(|r| r.result == Ok(offset)),
            "{ack:?}"
        );
        tokio::time::sleep(GAP).await;
    }
    head.shutdown().await.expect("shutdown");
    second.shutdown().await.expect("shutdown");
}

/// A downstream that accepts the stream and then never acknowledges anything.
async fn mute_downstream() -> (ChunkserverAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let task = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        let (r, w) = s.into_split();
        let mut reader = FrameReader::new(r);
        let mut writer = FrameWriter::new(w);
        let frame = reader.read_frame().await.expect("read").expect("setup");
        let (id, _): (u64, ChunkRequest) = parse_request(&frame).expect("request");
        let reply = WriteSetupReply {
            accepted: vec![ChunkserverId(9)],
            failed: Vec::new(),
        };
        let frame = reply_frame(id, &Ok::<_, RemoteError>(reply), Bytes::new()).expect("reply");
        writer.write_frame(&frame).await.expect("reply");
        // Swallow packets, never ack.
        while let Ok(Some(_)) = reader.read_frame().await {}
    });
    (
        ChunkserverAddr {
            id: ChunkserverId(9),
            addr,
        },
        task,
    )
}

#[tokio::test]
async fn a_packet_in_flight_downstream_keeps_the_ack_timeout() {
    let cluster = Cluster::new();
    let mut c = config(&cluster, 1, BUSY_IDLE);
    // The downstream ack timeout is three idle timeouts long.
    c.ack_timeout = 3 * BUSY_IDLE;
    let head = cluster.start_with(1, c).await;
    bump(&cluster, &head, 11, 1).await;
    let token = cluster.token(11, 1);
    let (mute, task) = mute_downstream().await;
    let mut w = Writer::open(&head, token, 0, vec![mute])
        .await
        .expect("setup");
    assert_eq!(w.setup.accepted, ids(&[1, 9]));
    let data = pattern(1000, 3);
    w.send(0, 0, &data, false).await;
    // The writer waits silently for this ack for longer than the idle timeout: it
    // comes after the ack timeout, naming the mute downstream.
    let ack = w.ack().await.expect("the ack after the ack timeout");
    assert_eq!(ack.replicas[0].result, Ok(1000), "{ack:?}");
    assert!(
        matches!(ack.replicas[1].result, Err(RemoteError::Unavailable { .. })),
        "{ack:?}"
    );
    // The stream was not ended while the packet was in flight: it takes the next one
    // (sent well within an idle timeout of that ack).
    w.send(1, 1000, &data, false).await;
    let ack = w.ack().await.expect("the stream is still open");
    assert_eq!(ack.seq, 1);
    assert_eq!(ack.replicas[0].result, Ok(2000), "{ack:?}");
    // Then silence ends it.
    let end = tokio::time::timeout(TIMEOUT, w.reader.read_frame())
        .await
        .expect("the idle stream is closed");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    task.abort();
    head.shutdown().await.expect("shutdown");
}
