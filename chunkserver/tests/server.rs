//! Real chunkservers on loopback, driven with tokens and commands signed by the test's
//! cluster key (the same protocol the master and clients speak), with both I/O engines.

mod common;

use bytes::Bytes;
use common::*;
use stampfs_chunkserver::header::{Header, SLOT_SIZE};
use stampfs_chunkserver::IoEngineKind;
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, ChunkserverAddr, ChunkserverId, RemoteError,
    ReplicaInfo, ReplicaState, DEFAULT_PACKET_SIZE,
};
use std::os::unix::fs::FileExt;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `data` through an open pipeline in 64 KiB packets from a separate task while
/// this one collects the acks; returns the acks.
async fn stream_all(w: Writer, data: Vec<u8>, start: u64) -> Vec<stampfs_proto::Ack> {
    let Writer {
        mut reader,
        mut writer,
        token,
        ..
    } = w;
    let n_packets = data.len().div_ceil(DEFAULT_PACKET_SIZE);
    let sender = tokio::spawn(async move {
        for (seq, chunk) in data.chunks(DEFAULT_PACKET_SIZE).enumerate() {
            let packet = stampfs_proto::Packet {
                token,
                seq: seq as u64,
                offset: start + (seq * DEFAULT_PACKET_SIZE) as u64,
                crc: crc32fast::hash(chunk),
                sync: false,
            };
            writer
                .feed(
                    &stampfs_proto::Frame::new(&packet, Bytes::copy_from_slice(chunk))
                        .expect("frame"),
                )
                .await
                .expect("send");
        }
        writer.shutdown().await.expect("shutdown");
    });
    let mut acks = Vec::new();
    while let Some(frame) = tokio::time::timeout(TIMEOUT, reader.read_frame())
        .await
        .expect("ack in time")
        .expect("ack frame")
    {
        acks.push(frame.decode().expect("ack"));
    }
    sender.await.expect("sender");
    assert_eq!(acks.len(), n_packets);
    acks
}

#[tokio::test]
async fn three_chunkserver_pipeline_produces_identical_replicas() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs: Vec<_> = futures_join(&cluster, &[1, 2, 3], kind).await;
        for s in &cs {
            bump(&cluster, s, 7, 1).await;
        }
        let token = cluster.token(7, 1);
        let w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1]), addr_of(&cs[2])])
            .await
            .expect("setup");
        assert_eq!(w.setup.accepted, ids(&[1, 2, 3]));
        assert!(w.setup.failed.is_empty());
        let data = pattern(20 * DEFAULT_PACKET_SIZE + 12_345, 11);
        let acks = stream_all(w, data.clone(), 0).await;
        for (i, ack) in acks.iter().enumerate() {
            assert_eq!(ack.seq, i as u64);
            let expected_len = ((i + 1) * DEFAULT_PACKET_SIZE).min(data.len()) as u64;
            let got: Vec<_> = ack
                .replicas
                .iter()
                .map(|r| (r.chunkserver, r.result.clone()))
                .collect();
            assert_eq!(
                got,
                vec![
                    (ChunkserverId(1), Ok(expected_len)),
                    (ChunkserverId(2), Ok(expected_len)),
                    (ChunkserverId(3), Ok(expected_len)),
                ],
                "{kind:?}"
            );
        }
        for (n, s) in cs.iter().enumerate() {
            let (report, got) = read(s, token, 0, 4 << 20).await.expect("read");
            assert_eq!(report.length, data.len() as u64);
            assert!(got == data, "{kind:?}: cs{} differs via Read", n + 1);
            let on_disk = file_data(&cluster.dir(n as u64 + 1), 7, data.len() as u64);
            assert!(on_disk == data, "{kind:?}: cs{} differs on disk", n + 1);
        }
        // Finalize everywhere; the replicas stay identical.
        for s in &cs {
            let r = command(
                s,
                cluster.command(
                    s,
                    ChunkCommand::Finalize {
                        handle: ChunkHandle(7),
                        version: ChunkVersion(1),
                        length: data.len() as u64,
                    },
                ),
            )
            .await
            .expect("finalize")
            .expect("report");
            assert_eq!(r.state, ReplicaState::Finalized);
        }
        let files: Vec<_> = (1..=3)
            .map(|n| {
                std::fs::read(stampfs_chunkserver::layout::replica_path(
                    &cluster.dir(n),
                    ChunkHandle(7),
                ))
                .expect("file")
            })
            .collect();
        assert!(
            files[0] == files[1] && files[1] == files[2],
            "{kind:?}: files differ"
        );
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

async fn futures_join(
    cluster: &Cluster,
    ns: &[u64],
    kind: IoEngineKind,
) -> Vec<stampfs_chunkserver::ChunkserverHandle> {
    let mut out = Vec::new();
    for n in ns {
        out.push(cluster.start(*n, kind).await);
    }
    out
}

#[tokio::test]
async fn a_killed_downstream_is_named_in_the_ack() {
    for kind in engines() {
        let cluster = Cluster::new();
        let mut cs = futures_join(&cluster, &[1, 2, 3], kind).await;
        for s in &cs {
            bump(&cluster, s, 8, 1).await;
        }
        let token = cluster.token(8, 1);
        let mut w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1]), addr_of(&cs[2])])
            .await
            .expect("setup");
        let data = pattern(40_000, 12);
        let mut offset = 0u64;
        for seq in 0..3u64 {
            w.send(seq, offset, &data, false).await;
            offset += data.len() as u64;
            let ack = w.ack().await.expect("ack");
            assert!(ack.replicas.iter().all(|r| r.result.is_ok()), "{ack:?}");
            assert_eq!(ack.replicas.len(), 3);
        }
        let third = cs.pop().expect("cs3");
        third.shutdown().await.expect("shutdown cs3");
        let mut named = None;
        for seq in 3..50u64 {
            w.send(seq, offset, &data, false).await;
            offset += data.len() as u64;
            let ack = w.ack().await.expect("ack");
            assert_eq!(ack.seq, seq);
            assert_eq!(
                ack.replicas[0].result,
                Ok(offset),
                "{kind:?}: cs1 keeps writing"
            );
            if let Some(e) = ack.replicas.iter().find(|r| r.result.is_err()) {
                named = Some((ack.clone(), e.clone()));
                break;
            }
        }
        let (ack, failed) = named.expect("an ack names the failed downstream");
        assert_eq!(failed.chunkserver, ChunkserverId(3), "{ack:?}");
        assert!(
            matches!(failed.result, Err(RemoteError::Unavailable { .. })),
            "{ack:?}"
        );
        assert_eq!(ack.replicas[1].chunkserver, ChunkserverId(2));
        assert!(ack.replicas[1].result.is_ok(), "cs2 succeeds: {ack:?}");
        // The two survivors hold every acknowledged byte.
        for s in &cs {
            let (r, _) = read(s, token, 0, 1).await.expect("read");
            assert_eq!(r.length, offset, "{kind:?}");
        }
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn an_unreachable_downstream_is_skipped_at_setup() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = futures_join(&cluster, &[1, 3], kind).await;
        for s in &cs {
            bump(&cluster, s, 9, 2).await;
        }
        let token = cluster.token(9, 2);
        let dead = ChunkserverAddr {
            id: ChunkserverId(2),
            addr: dead_addr(),
        };
        let mut w = Writer::open(&cs[0], token, 0, vec![dead, addr_of(&cs[1])])
            .await
            .expect("setup");
        assert_eq!(w.setup.accepted, ids(&[1, 3]));
        assert_eq!(w.setup.failed.len(), 1);
        assert_eq!(w.setup.failed[0].0, ChunkserverId(2));
        w.send(0, 0, b"hello", false).await;
        let ack = w.ack().await.expect("ack");
        assert_eq!(ack.replicas.len(), 2);
        assert!(
            ack.replicas.iter().all(|r| r.result == Ok(5)),
            "{kind:?}: {ack:?}"
        );
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn hsync_makes_the_length_durable_before_the_ack() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = futures_join(&cluster, &[1, 2], kind).await;
        for s in &cs {
            bump(&cluster, s, 10, 1).await;
        }
        let token = cluster.token(10, 1);
        let mut w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1])])
            .await
            .expect("setup");
        w.send(0, 0, &pattern(1000, 1), false).await;
        w.ack().await.expect("ack");
        w.send(1, 1000, &pattern(2345, 2), true).await;
        let ack = w.ack().await.expect("ack");
        assert!(ack.replicas.iter().all(|r| r.result == Ok(3345)), "{ack:?}");
        for n in 1..=2 {
            let f = std::fs::File::open(stampfs_chunkserver::layout::replica_path(
                &cluster.dir(n),
                ChunkHandle(10),
            ))
            .expect("file");
            let mut slots = vec![0u8; 2 * SLOT_SIZE as usize];
            f.read_exact_at(&mut slots, 0).expect("header");
            let (a, b) = slots.split_at(SLOT_SIZE as usize);
            let h = Header::newest(a, b).expect("header");
            assert_eq!(h.length, 3345, "{kind:?}: cs{n} durable header length");
        }
        drop(w);
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn backpressure_with_a_slow_ack_reader_does_not_deadlock() {
    for kind in engines() {
        let cluster = Cluster::new();
        let mut cs = Vec::new();
        for n in [1u64, 2] {
            let mut c = cluster.config(n, kind);
            c.stream_buffer = 256 << 10;
            cs.push(cluster.start_with(n, c).await);
        }
        for s in &cs {
            bump(&cluster, s, 11, 1).await;
        }
        let token = cluster.token(11, 1);
        let w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1])])
            .await
            .expect("setup");
        let Writer {
            mut reader,
            mut writer,
            ..
        } = w;
        let data = pattern(8 << 20, 13);
        let send_data = data.clone();
        let sender = tokio::spawn(async move {
            for (seq, chunk) in send_data.chunks(DEFAULT_PACKET_SIZE).enumerate() {
                let packet = stampfs_proto::Packet {
                    token,
                    seq: seq as u64,
                    offset: (seq * DEFAULT_PACKET_SIZE) as u64,
                    crc: crc32fast::hash(chunk),
                    sync: false,
                };
                writer
                    .write_frame(
                        &stampfs_proto::Frame::new(&packet, Bytes::copy_from_slice(chunk))
                            .expect("frame"),
                    )
                    .await
                    .expect("send");
            }
            writer.shutdown().await.expect("shutdown");
        });
        let mut seq = 0u64;
        let run = async {
            while let Some(frame) = reader.read_frame().await.expect("frame") {
                let ack: stampfs_proto::Ack = frame.decode().expect("ack");
                assert_eq!(ack.seq, seq);
                assert!(ack.replicas.iter().all(|r| r.result.is_ok()));
                seq += 1;
                if seq < 40 {
                    // A slow reader of acks: the server must stop reading, not buffer.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("no deadlock");
        sender.await.expect("sender");
        assert_eq!(seq, (data.len() / DEFAULT_PACKET_SIZE) as u64);
        for s in &cs {
            let (r, got) = read(s, token, 0, 16 << 20).await.expect("read");
            assert_eq!(r.length, data.len() as u64);
            assert!(got == data, "{kind:?}");
        }
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn a_resent_packet_with_the_same_token_is_accepted() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = futures_join(&cluster, &[1, 2], kind).await;
        for s in &cs {
            bump(&cluster, s, 18, 1).await;
        }
        let token = cluster.token(18, 1);
        let (a, b) = (pattern(70_000, 1), pattern(30_000, 2));
        let mut w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1])])
            .await
            .expect("setup");
        w.send(0, 0, &a, false).await;
        assert!(w
            .ack()
            .await
            .expect("ack")
            .replicas
            .iter()
            .all(|r| r.result == Ok(70_000)));
        // The client missed that ack and resends the packet: accepted, nothing changes.
        w.send(1, 0, &a, false).await;
        let ack = w.ack().await.expect("ack");
        assert!(
            ack.replicas.iter().all(|r| r.result == Ok(70_000)),
            "{kind:?}: {ack:?}"
        );
        w.send(2, 70_000, &b, false).await;
        assert!(w
            .ack()
            .await
            .expect("ack")
            .replicas
            .iter()
            .all(|r| r.result == Ok(100_000)));
        drop(w);
        // A new stream with the same token from the last length the writer trusts cuts
        // the tail and takes the resent bytes.
        let mut w = Writer::open(&cs[0], token, 70_000, vec![addr_of(&cs[1])])
            .await
            .expect("reopen");
        assert_eq!(w.setup.accepted, ids(&[1, 2]));
        w.send(0, 70_000, &b, true).await;
        assert!(w
            .ack()
            .await
            .expect("ack")
            .replicas
            .iter()
            .all(|r| r.result == Ok(100_000)));
        let mut expected = a.clone();
        expected.extend_from_slice(&b);
        for s in &cs {
            let (_, got) = read(s, token, 0, 1 << 20).await.expect("read");
            assert!(got == expected, "{kind:?}");
        }
        drop(w);
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn a_bump_fences_the_writer_mid_stream() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = futures_join(&cluster, &[1, 2], kind).await;
        for s in &cs {
            bump(&cluster, s, 12, 1).await;
        }
        let old = cluster.token(12, 1);
        let mut w = Writer::open(&cs[0], old, 0, vec![addr_of(&cs[1])])
            .await
            .expect("setup");
        w.send(0, 0, b"first", false).await;
        assert!(w
            .ack()
            .await
            .expect("ack")
            .replicas
            .iter()
            .all(|r| r.result == Ok(5)));
        // The master bumps the version (lease recovery / new writer).
        for s in &cs {
            bump(&cluster, s, 12, 2).await;
        }
        w.send(1, 5, b"second", false).await;
        let ack = w.ack().await.expect("ack");
        let stale = RemoteError::StaleToken {
            handle: ChunkHandle(12),
            presented: ChunkVersion(1),
            current: ChunkVersion(2),
        };
        assert_eq!(ack.replicas[0].result, Err(stale.clone()), "{kind:?}");
        assert_eq!(ack.replicas[1].result, Err(stale), "{kind:?}");
        // The stream is closed after the failure.
        assert!(w.ack().await.is_none());
        // A retry with the old token is refused at setup too; the new one works.
        assert!(matches!(
            Writer::open(&cs[0], old, 5, vec![]).await,
            Err(RemoteError::StaleToken { .. })
        ));
        let mut w = Writer::open(&cs[0], cluster.token(12, 2), 5, vec![addr_of(&cs[1])])
            .await
            .expect("new writer");
        w.send(0, 5, b"second", true).await;
        assert!(w
            .ack()
            .await
            .expect("ack")
            .replicas
            .iter()
            .all(|r| r.result == Ok(11)));
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn bad_packets_are_rejected_and_not_forwarded() {
    let cluster = Cluster::new();
    let kind = IoEngineKind::Threads;
    let cs = futures_join(&cluster, &[1, 2], kind).await;
    for s in &cs {
        bump(&cluster, s, 13, 1).await;
    }
    let token = cluster.token(13, 1);
    // A corrupted payload.
    let mut w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1])])
        .await
        .expect("setup");
    let packet = stampfs_proto::Packet {
        token,
        seq: 0,
        offset: 0,
        crc: crc32fast::hash(b"abc") ^ 1,
        sync: false,
    };
    w.send_packet(&packet, b"abc").await;
    let ack = w.ack().await.expect("ack");
    assert_eq!(ack.replicas.len(), 1);
    assert!(matches!(
        ack.replicas[0].result,
        Err(RemoteError::ChecksumMismatch { .. })
    ));
    assert!(w.ack().await.is_none());
    // A forged token (version raised by the client).
    let mut w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1])])
        .await
        .expect("setup");
    let mut forged = token;
    forged.version = ChunkVersion(2);
    let packet = stampfs_proto::Packet {
        token: forged,
        seq: 0,
        offset: 0,
        crc: crc32fast::hash(b"abc"),
        sync: false,
    };
    w.send_packet(&packet, b"abc").await;
    let ack = w.ack().await.expect("ack");
    assert!(matches!(
        ack.replicas[0].result,
        Err(RemoteError::BadToken { .. })
    ));
    // A gap.
    let mut w = Writer::open(&cs[0], token, 0, vec![addr_of(&cs[1])])
        .await
        .expect("setup");
    w.send(0, 10, b"abc", false).await;
    let ack = w.ack().await.expect("ack");
    assert!(matches!(
        ack.replicas[0].result,
        Err(RemoteError::BadRequest { .. })
    ));
    // Nothing reached either replica.
    for s in &cs {
        let (r, _) = read(s, token, 0, 10).await.expect("read");
        assert_eq!(r.length, 0);
    }
    // A forged setup token is refused.
    assert!(matches!(
        Writer::open(&cs[0], forged, 0, vec![]).await,
        Err(RemoteError::BadToken { .. })
    ));
    for s in cs {
        s.shutdown().await.expect("shutdown");
    }
}

#[tokio::test]
async fn malformed_input_closes_only_that_connection() {
    for kind in engines() {
        malformed_input_case(kind).await;
    }
}

async fn malformed_input_case(kind: IoEngineKind) {
    let cluster = Cluster::new();
    let cs = cluster.start(1, kind).await;
    bump(&cluster, &cs, 14, 1).await;
    let token = cluster.token(14, 1);
    let mut keeper = connect(&cs).await;
    keeper.call(ReplicaInfo { token }).await.expect("info");
    let addr = cs.addr();

    let good = raw_request(1, ReplicaInfo { token });
    let mut bad_crc = good.to_vec();
    bad_crc[5] ^= 0xff;
    let mut huge = vec![0xffu8, 0xff, 0xff, 0xff, 0, 0, 0, 0];
    huge.extend_from_slice(&[0u8; 16]);
    let garbage_body = {
        let body = vec![0u8, 0, 0, 3, 0xde, 0xad, 0xbe];
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        f.extend_from_slice(&body);
        f
    };
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("random bytes", pattern(5000, 99), true),
        ("truncated frame", good[..good.len() - 3].to_vec(), true),
        ("huge length prefix", huge, false),
        ("bad frame CRC", bad_crc, false),
        ("undecodable request", garbage_body, false),
    ];
    for (what, bytes, close_write) in cases {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&bytes).await.expect("write");
        if close_write {
            s.shutdown().await.expect("half-close");
        }
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(TIMEOUT, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{what}: connection not closed"))
            .unwrap_or(0);
        assert_eq!(n, 0, "{what}: expected the server to close");
        // The long-lived connection and new ones keep being served.
        keeper
            .call(ReplicaInfo { token })
            .await
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
        let (r, _) = read(&cs, token, 0, 1).await.expect("new connection");
        assert_eq!(r.version, ChunkVersion(1));
    }
    cs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn commands_are_authenticated_and_carried_out() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = cluster.start(1, kind).await;
        let mut c = connect(&cs).await;
        let h = ChunkHandle(15);
        // A command signed with another key is refused; the connection keeps serving.
        let other = stampfs_proto::ClusterKey::generate();
        let forged = stampfs_proto::Signed::new(
            &other,
            cluster.issue(&cs),
            ChunkCommand::BumpVersion {
                handle: h,
                version: ChunkVersion(1),
                create: true,
            },
        )
        .expect("sign");
        let err = c.call(forged).await.unwrap_err();
        assert!(
            matches!(
                err,
                stampfs_proto::Error::Remote(RemoteError::BadRequest { .. })
            ),
            "{err}"
        );
        assert!(!stampfs_chunkserver::layout::replica_path(&cluster.dir(1), h).exists());
        let info = c
            .call(cluster.command(&cs, ChunkCommand::Info { handle: h }))
            .await
            .unwrap_err();
        assert!(matches!(
            info,
            stampfs_proto::Error::Remote(RemoteError::NotFound { .. })
        ));
        let r = c
            .call(cluster.command(
                &cs,
                ChunkCommand::BumpVersion {
                    handle: h,
                    version: ChunkVersion(3),
                    create: true,
                },
            ))
            .await
            .expect("create")
            .expect("report");
        assert_eq!(
            (r.version, r.length, r.state),
            (ChunkVersion(3), 0, ReplicaState::Writing)
        );
        let lower = c
            .call(cluster.command(
                &cs,
                ChunkCommand::BumpVersion {
                    handle: h,
                    version: ChunkVersion(2),
                    create: false,
                },
            ))
            .await
            .unwrap_err();
        assert!(matches!(
            lower,
            stampfs_proto::Error::Remote(RemoteError::StaleToken {
                presented: ChunkVersion(2),
                current: ChunkVersion(3),
                ..
            })
        ));
        let mut w = Writer::open(&cs, cluster.token(15, 3), 0, vec![])
            .await
            .expect("setup");
        w.send(0, 0, &pattern(5000, 3), false).await;
        assert_eq!(w.ack().await.expect("ack").replicas[0].result, Ok(5000));
        drop(w);
        let r = c
            .call(cluster.command(
                &cs,
                ChunkCommand::Truncate {
                    handle: h,
                    version: ChunkVersion(3),
                    length: 4000,
                },
            ))
            .await
            .expect("truncate")
            .expect("report");
        assert_eq!(r.length, 4000);
        let r = c
            .call(cluster.command(
                &cs,
                ChunkCommand::Finalize {
                    handle: h,
                    version: ChunkVersion(3),
                    length: 4000,
                },
            ))
            .await
            .expect("finalize")
            .expect("report");
        assert_eq!(r.state, ReplicaState::Finalized);
        // ReplicaInfo with a token: version, length, state; the gate applies.
        let r = c
            .call(ReplicaInfo {
                token: cluster.token(15, 3),
            })
            .await
            .expect("info");
        assert_eq!((r.length, r.state), (4000, ReplicaState::Finalized));
        let stale = c
            .call(ReplicaInfo {
                token: cluster.token(15, 2),
            })
            .await
            .unwrap_err();
        assert!(matches!(
            stale,
            stampfs_proto::Error::Remote(RemoteError::StaleToken { .. })
        ));
        let kept = c
            .call(cluster.command(
                &cs,
                ChunkCommand::Delete {
                    handle: h,
                    max_version: ChunkVersion(2),
                },
            ))
            .await
            .expect("delete below");
        assert!(kept.is_some());
        let gone = c
            .call(cluster.command(
                &cs,
                ChunkCommand::Delete {
                    handle: h,
                    max_version: ChunkVersion(3),
                },
            ))
            .await
            .expect("delete");
        assert!(gone.is_none());
        assert!(!stampfs_chunkserver::layout::replica_path(&cluster.dir(1), h).exists());
        cs.shutdown().await.expect("shutdown");
    }
}

/// Issue 18, item 2: a captured command cannot be applied again, nor one signed for
/// another chunkserver or an earlier registration, nor one older than the window; the
/// connection keeps serving after each refusal, and nothing changes on disk.
#[tokio::test]
async fn commands_are_applied_once_and_only_in_their_session() {
    let cluster = Cluster::new();
    let cs = cluster.start(1, IoEngineKind::Threads).await;
    let mut c = connect(&cs).await;
    let h = ChunkHandle(31);
    let refused = |e: stampfs_proto::Error, what: &str| match e {
        stampfs_proto::Error::Remote(RemoteError::BadRequest { reason }) => {
            assert!(reason.contains(what), "{reason}");
        }
        other => panic!("expected a refusal saying {what:?}, got {other}"),
    };
    let bump = |v: u64| ChunkCommand::BumpVersion {
        handle: h,
        version: ChunkVersion(v),
        create: true,
    };
    // A bump to 5, captured and sent again after a bump to 6: the replay is refused,
    // and the replica stays at 6.
    let to5 = cluster.command(&cs, bump(5));
    c.call(to5.clone()).await.expect("bump to 5");
    c.call(cluster.command(&cs, bump(6)))
        .await
        .expect("bump to 6");
    refused(c.call(to5).await.unwrap_err(), "already applied");
    let info = c
        .call(cluster.command(&cs, ChunkCommand::Info { handle: h }))
        .await
        .expect("info")
        .expect("report");
    assert_eq!(info.version, ChunkVersion(6));

    // Signed for another chunkserver.
    let mut other = cluster.issue(&cs);
    other.chunkserver = stampfs_proto::ChunkserverId(2);
    let misaddressed = stampfs_proto::Signed::new(&cluster.key, other, bump(9)).expect("sign");
    refused(
        c.call(misaddressed).await.unwrap_err(),
        "for chunkserver cs2",
    );

    // Far behind the newest number: older than the window.
    let mut ahead = cluster.issue(&cs);
    ahead.seq += stampfs_proto::replay::WINDOW + 10;
    c.call(
        stampfs_proto::Signed::new(&cluster.key, ahead, ChunkCommand::Info { handle: h })
            .expect("sign"),
    )
    .await
    .expect("a command far ahead is new");
    refused(
        c.call(cluster.command(&cs, bump(7))).await.unwrap_err(),
        "older than the replay window",
    );

    // A new registration: everything signed before it is refused, even unused.
    let unused = cluster.command(&cs, bump(8));
    cs.begin_registration();
    refused(c.call(unused).await.unwrap_err(), "earlier registration");
    let info = c
        .call(cluster.command_fresh(&cs, ChunkCommand::Info { handle: h }))
        .await
        .expect("a command of the new session")
        .expect("report");
    assert_eq!(
        info.version,
        ChunkVersion(6),
        "no refused command changed it"
    );
    cs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_corrupt_block_is_detected_on_read_over_tcp() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = cluster.start(1, kind).await;
        bump(&cluster, &cs, 16, 1).await;
        let token = cluster.token(16, 1);
        let w = Writer::open(&cs, token, 0, vec![]).await.expect("setup");
        let data = pattern(300_000, 16);
        stream_all(w, data.clone(), 0).await;
        let path = stampfs_chunkserver::layout::replica_path(&cluster.dir(1), ChunkHandle(16));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.write_all_at(
            &[data[200_000] ^ 0x80],
            stampfs_chunkserver::header::DATA_OFFSET + 200_000,
        )
        .expect("flip");
        drop(f);
        let err = read(&cs, token, 0, 300_000).await.unwrap_err();
        assert!(
            matches!(
                err,
                RemoteError::ChecksumMismatch {
                    offset: 196_608,
                    ..
                }
            ),
            "{kind:?}: {err}"
        );
        assert!(!path.exists());
        let mut aside = path.clone().into_os_string();
        aside.push(".corrupt");
        assert!(std::path::Path::new(&aside).exists());
        assert!(matches!(
            read(&cs, token, 0, 10).await,
            Err(RemoteError::NotFound { .. })
        ));
        cs.shutdown().await.expect("shutdown");
    }
}

#[tokio::test]
async fn replicate_copies_a_finalized_replica_to_another_chunkserver() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = futures_join(&cluster, &[1, 2], kind).await;
        bump(&cluster, &cs[0], 17, 4).await;
        let token = cluster.token(17, 4);
        let w = Writer::open(&cs[0], token, 0, vec![]).await.expect("setup");
        let data = pattern(5 * DEFAULT_PACKET_SIZE + 99, 17);
        stream_all(w, data.clone(), 0).await;
        command(
            &cs[0],
            cluster.command(
                &cs[0],
                ChunkCommand::Finalize {
                    handle: ChunkHandle(17),
                    version: ChunkVersion(4),
                    length: data.len() as u64,
                },
            ),
        )
        .await
        .expect("finalize");
        // The target holds an older, stale replica: it is replaced.
        bump(&cluster, &cs[1], 17, 2).await;
        let out = command(
            &cs[0],
            cluster.command(
                &cs[0],
                ChunkCommand::Replicate {
                    handle: ChunkHandle(17),
                    version: ChunkVersion(4),
                    target: addr_of(&cs[1]),
                },
            ),
        )
        .await
        .expect("replicate accepted");
        assert!(out.is_none());
        let mut copied = None;
        for _ in 0..200 {
            if let Ok((r, got)) = read(&cs[1], token, 0, 4 << 20).await {
                copied = Some((r, got));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (r, got) = copied.expect("replica arrives");
        assert_eq!(
            (r.version, r.state, r.length),
            (ChunkVersion(4), ReplicaState::Finalized, data.len() as u64)
        );
        assert!(got == data, "{kind:?}");
        let a = std::fs::read(stampfs_chunkserver::layout::replica_path(
            &cluster.dir(1),
            ChunkHandle(17),
        ))
        .expect("a");
        let b = std::fs::read(stampfs_chunkserver::layout::replica_path(
            &cluster.dir(2),
            ChunkHandle(17),
        ))
        .expect("b");
        assert_eq!(a.len(), b.len());
        assert!(
            a[stampfs_chunkserver::header::TABLE_OFFSET as usize..]
                == b[stampfs_chunkserver::header::TABLE_OFFSET as usize..]
        );
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
        // No temporary files are left behind.
        for n in 1..=2 {
            for name in data_file_names(&cluster.dir(n)) {
                assert!(!name.ends_with(".tmp"), "{name}");
            }
        }
    }
}

#[tokio::test]
async fn start_writes_the_addr_file_and_needs_the_key() {
    let cluster = Cluster::new();
    let cs = cluster.start(1, IoEngineKind::Auto).await;
    let written = std::fs::read_to_string(cluster.dir(1).join("addr")).expect("addr file");
    assert_eq!(written.trim(), cs.addr().to_string());
    assert!(["uring", "threads"].contains(&cs.engine()));
    assert_eq!(cs.id(), Some(ChunkserverId(1)));
    cs.shutdown().await.expect("shutdown");

    let mut config = cluster.config(2, IoEngineKind::Threads);
    config.cluster_key_file = cluster.root.path().join("missing.key");
    let err = stampfs_chunkserver::start(config)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.key"), "{err}");
}
