//! The idle timeout on real sockets: a silent connection or write stream is closed and
//! frees its connection permit (and its downstream stream); a peer that keeps talking,
//! or whose packet is still in flight downstream, is not cut. The same timeout bounds
//! writes to a peer that stops reading (a frozen reader of a large reply, a frozen
//! replica copy target) without cutting a slow reader that keeps taking bytes, and ends
//! a replica copy whose sender falls silent, removing its temporary file.
//!
//! Timing: the silent cases only assert that the close happens within a generous bound;
//! the busy cases talk at least five times more often than the idle timeout.

mod common;

use bytes::Bytes;
use common::*;
use stampfs_chunkserver::{ChunkserverConfig, ChunkserverHandle, IoEngineKind};
use stampfs_proto::rpc::{parse_reply, parse_request, reply_frame};
use stampfs_proto::{
    Ack, ChunkCommand, ChunkHandle, ChunkRequest, ChunkToken, ChunkVersion, ChunkserverAddr,
    ChunkserverId, Frame, FrameReader, FrameWriter, Packet, Read, ReadReply, ReceiveReplica,
    RemoteError, ReplicaInfo, RpcClient, WriteSetupReply, DEFAULT_PACKET_SIZE,
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

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
    let mut c = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &cs.addr().to_string(),
        TIMEOUT,
    )
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
    let mut holder = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &cs.addr().to_string(),
        TIMEOUT,
    )
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
    let mut c = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &cs.addr().to_string(),
        TIMEOUT,
    )
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

// ---------------------------------------------------------------------------------
// Peers that stop reading (bounded writes) and replica copies that stop.
// ---------------------------------------------------------------------------------

/// A reply larger than every socket buffer on the way (a read's maximum).
const LARGE: usize = 16 << 20;
/// The idle timeout of the chunkserver that serves the slow reader (see
/// `a_slow_reader_of_a_large_reply_gets_all_of_it`).
const SLOW_IDLE: Duration = Duration::from_secs(1);

/// Writes `len` bytes as chunk `handle` version 1 on `cs` (one replica, no
/// downstream), optionally finalized; returns the data.
async fn store_replica(
    cluster: &Cluster,
    cs: &ChunkserverHandle,
    handle: u64,
    len: usize,
    finalize: bool,
) -> Vec<u8> {
    bump(cluster, cs, handle, 1).await;
    let token = cluster.token(handle, 1);
    let data = pattern(len, handle);
    let Writer {
        mut reader,
        mut writer,
        ..
    } = Writer::open(cs, token, 0, vec![]).await.expect("setup");
    let sent = data.clone();
    let sender = tokio::spawn(async move {
        for (seq, chunk) in sent.chunks(DEFAULT_PACKET_SIZE).enumerate() {
            let packet = Packet {
                token,
                seq: seq as u64,
                offset: (seq * DEFAULT_PACKET_SIZE) as u64,
                crc: crc32fast::hash(chunk),
                sync: false,
            };
            writer
                .feed(&Frame::new(&packet, Bytes::copy_from_slice(chunk)).expect("frame"))
                .await
                .expect("send");
        }
        writer.shutdown().await.expect("shutdown");
    });
    let mut last = None;
    while let Some(frame) = tokio::time::timeout(TIMEOUT, reader.read_frame())
        .await
        .expect("ack in time")
        .expect("ack frame")
    {
        let ack: Ack = frame.decode().expect("ack");
        assert!(ack.replicas.iter().all(|r| r.result.is_ok()), "{ack:?}");
        last = Some(ack);
    }
    sender.await.expect("sender");
    let last = last.expect("acks");
    assert_eq!(last.replicas[0].result, Ok(len as u64));
    if finalize {
        command(
            cs,
            cluster.command(
                cs,
                ChunkCommand::Finalize {
                    handle: ChunkHandle(handle),
                    version: ChunkVersion(1),
                    length: len as u64,
                },
            ),
        )
        .await
        .expect("finalize");
    }
    data
}

/// A connection whose receive buffer is small, so the server's reply cannot hide in it.
async fn small_window_connection(cs: &ChunkserverHandle) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(64 << 10).expect("SO_RCVBUF");
    socket.connect(cs.addr()).await.expect("connect")
}

#[tokio::test]
async fn a_client_that_stops_reading_a_large_reply_is_disconnected() {
    let cluster = Cluster::new();
    let mut c = config(&cluster, 1, SHORT_IDLE);
    c.max_connections = 1;
    let cs = cluster.start_with(1, c).await;
    store_replica(&cluster, &cs, 20, LARGE, false).await;
    let token = cluster.token(20, 1);
    // A frozen client: asks for 16 MiB, then never reads. The reply cannot fit in the
    // socket buffers, so the server's write blocks.
    let mut frozen = small_window_connection(&cs).await;
    let read = Read {
        token,
        offset: 0,
        len: LARGE as u32,
    };
    frozen
        .write_all(&raw_request(1, read))
        .await
        .expect("request");
    // The only connection permit comes back: a second connection is served.
    serves_a_new_connection(&cs, token, "while the first client is frozen").await;
    // The frozen connection was ended: what it finds when it wakes up is part of the
    // reply, then the end of the stream.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match tokio::time::timeout(TIMEOUT, frozen.read(&mut buf))
            .await
            .expect("the frozen connection ends")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < LARGE, "the whole reply arrived ({got} bytes)");
    cs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_slow_reader_of_a_large_reply_gets_all_of_it() {
    let cluster = Cluster::new();
    let cs = cluster.start_with(1, config(&cluster, 1, SLOW_IDLE)).await;
    let data = store_replica(&cluster, &cs, 21, LARGE, false).await;
    let token = cluster.token(21, 1);
    let mut slow = small_window_connection(&cs).await;
    let read = Read {
        token,
        offset: 0,
        len: LARGE as u32,
    };
    slow.write_all(&raw_request(7, read))
        .await
        .expect("request");
    // At most 64 KiB at a time with a 5 ms pause (a two-hundredth of the idle
    // timeout): at least 256 pauses, so the 16 MiB reply takes longer than the idle
    // timeout, while the server's write never waits more than a fraction of it for
    // progress (the kernel wakes it each time a few MiB have drained: ~0.2 s here).
    let started = std::time::Instant::now();
    let mut wire = Vec::with_capacity(LARGE + 4096);
    let mut buf = vec![0u8; 64 << 10];
    let whole = loop {
        let n = tokio::time::timeout(TIMEOUT, slow.read(&mut buf))
            .await
            .expect("the reply keeps coming")
            .expect("read");
        assert!(n > 0, "cut after {} bytes", wire.len());
        wire.extend_from_slice(&buf[..n]);
        if let Some((frame, used)) = Frame::parse(&wire).expect("frame") {
            assert_eq!(used, wire.len());
            break frame;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(started.elapsed() > SLOW_IDLE, "{:?}", started.elapsed());
    let reply: ReadReply = parse_reply(7, &whole).expect("reply");
    assert_eq!(reply.replica.length, LARGE as u64);
    assert!(whole.data == data[..], "the reply's data differs");
    cs.shutdown().await.expect("shutdown");
}

/// Temporary files of incoming replicas in `dir`.
fn incoming_files(dir: &std::path::Path) -> Vec<String> {
    data_file_names(dir)
        .into_iter()
        .filter(|name| name.contains(".recv-"))
        .collect()
}

#[tokio::test]
async fn a_replica_copy_that_stops_sending_is_ended_and_its_temp_file_removed() {
    let cluster = Cluster::new();
    let mut c = config(&cluster, 1, SHORT_IDLE);
    c.max_connections = 1;
    let cs = cluster.start_with(1, c).await;
    let token = cluster.token(30, 1);
    let length = 1u64 << 20;
    let mut sender = connect(&cs).await;
    let setup = sender
        .call(ReceiveReplica { token, length })
        .await
        .expect("the copy is accepted");
    assert_eq!(setup.accepted, ids(&[1]));
    let (mut reader, mut writer) = sender.into_parts();
    // Two packets of sixteen, then silence (the sender froze; its socket stays open).
    let data = pattern(2 * DEFAULT_PACKET_SIZE, 30);
    for (seq, chunk) in data.chunks(DEFAULT_PACKET_SIZE).enumerate() {
        let packet = Packet {
            token,
            seq: seq as u64,
            offset: (seq * DEFAULT_PACKET_SIZE) as u64,
            crc: crc32fast::hash(chunk),
            sync: false,
        };
        writer
            .write_frame(&Frame::new(&packet, Bytes::copy_from_slice(chunk)).expect("frame"))
            .await
            .expect("send");
    }
    assert_eq!(
        incoming_files(&cluster.dir(1)).len(),
        1,
        "the copy is underway"
    );
    // The target gives up: an error in the final ack, then the end of the stream.
    let frame = tokio::time::timeout(TIMEOUT, reader.read_frame())
        .await
        .expect("the silent copy is ended")
        .expect("the final ack")
        .expect("an ack before the end");
    let ack: Ack = frame.decode().expect("ack");
    assert!(
        matches!(
            ack.replicas.first().map(|r| &r.result),
            Some(Err(RemoteError::Unavailable { .. }))
        ),
        "{ack:?}"
    );
    let end = tokio::time::timeout(TIMEOUT, reader.read_frame())
        .await
        .expect("closed after the ack");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    // The partial copy is gone, nothing was installed, and the permit is free again.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !incoming_files(&cluster.dir(1)).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "temp file left: {:?}",
            incoming_files(&cluster.dir(1))
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        read(&cs, token, 0, 10).await,
        Err(RemoteError::NotFound { .. })
    ));
    serves_a_new_connection(&cs, token, "after the copy ended").await;
    cs.shutdown().await.expect("shutdown");
}

/// A copy target that accepts the offer and then never reads; its receive buffer is
/// small, so the copy cannot hide in it. Signals once it has answered the offer.
async fn frozen_target() -> (
    ChunkserverAddr,
    tokio::sync::oneshot::Receiver<()>,
    tokio::task::JoinHandle<()>,
) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(64 << 10).expect("SO_RCVBUF");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(4).expect("listen");
    let addr = listener.local_addr().expect("addr").to_string();
    let (offered, offered_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        let (r, w) = s.into_split();
        let mut reader = FrameReader::new(r);
        let mut writer = FrameWriter::new(w);
        let frame = reader.read_frame().await.expect("read").expect("offer");
        let (id, _): (u64, ChunkRequest) = parse_request(&frame).expect("request");
        let reply = WriteSetupReply {
            accepted: vec![ChunkserverId(9)],
            failed: Vec::new(),
        };
        let frame = reply_frame(id, &Ok::<_, RemoteError>(reply), Bytes::new()).expect("reply");
        writer.write_frame(&frame).await.expect("reply");
        let _ = offered.send(());
        // Frozen: holds the connection, never reads.
        std::future::pending::<()>().await;
    });
    (
        ChunkserverAddr {
            id: ChunkserverId(9),
            addr,
        },
        offered_rx,
        task,
    )
}

#[tokio::test]
async fn a_copy_to_a_target_that_stops_reading_gives_its_permit_back() {
    let cluster = Cluster::new();
    let mut c = config(&cluster, 1, SHORT_IDLE);
    c.max_replications = 1;
    let source = cluster.start_with(1, c).await;
    let target = cluster.start(2, IoEngineKind::Threads).await;
    let data = store_replica(&cluster, &source, 40, LARGE, true).await;
    let token = cluster.token(40, 1);
    let replicate = |to: ChunkserverAddr| {
        cluster.command(
            &source,
            ChunkCommand::Replicate {
                handle: ChunkHandle(40),
                version: ChunkVersion(1),
                target: to,
            },
        )
    };
    // The first copy takes the only replication permit and goes to a frozen target.
    let (frozen, offered, task) = frozen_target().await;
    command(&source, replicate(frozen)).await.expect("accepted");
    tokio::time::timeout(TIMEOUT, offered)
        .await
        .expect("the frozen target got the offer")
        .expect("offer");
    // The second waits for that permit: it runs once the first copy gave up.
    command(&source, replicate(addr_of(&target)))
        .await
        .expect("accepted");
    let deadline = tokio::time::Instant::now() + 2 * TIMEOUT;
    let (report, got) = loop {
        match read(&target, token, 0, LARGE as u32).await {
            Ok(x) => break x,
            Err(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the second copy never ran"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(report.length, LARGE as u64);
    assert!(got == data[..], "the copy differs");
    task.abort();
    source.shutdown().await.expect("shutdown");
    target.shutdown().await.expect("shutdown");
}
