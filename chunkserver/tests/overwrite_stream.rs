//! Overwrite streams (`OverwriteSetup`) through real chunkservers on loopback, with
//! both I/O engines: a pipeline of three writing at any offset, a replay from an
//! earlier packet converging, the length and gate checks over the wire, and the
//! append stream's set-up still cutting (DESIGN.md, "Writes at any offset").

mod common;

use common::*;
use stampfs_chunkserver::header::{Header, SLOT_SIZE};
use stampfs_chunkserver::{ChunkserverHandle, IoEngineKind};
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkToken, ChunkVersion, RemoteError, DEFAULT_PACKET_SIZE,
};
use std::time::Duration;

const P: u64 = DEFAULT_PACKET_SIZE as u64;

async fn start(cluster: &Cluster, ns: &[u64], kind: IoEngineKind) -> Vec<ChunkserverHandle> {
    let mut out = Vec::new();
    for n in ns {
        out.push(cluster.start(*n, kind).await);
    }
    out
}

/// Sends `packets` (offset, bytes, hsync) one at a time from `seq` on, each followed
/// by its ack; returns the acks.
async fn send_all(
    w: &mut Writer,
    seq: u64,
    packets: &[(u64, Vec<u8>, bool)],
) -> Vec<stampfs_proto::Ack> {
    let mut acks = Vec::new();
    for (i, (offset, data, sync)) in packets.iter().enumerate() {
        w.send(seq + i as u64, *offset, data, *sync).await;
        let ack = w.ack().await.expect("an ack");
        assert_eq!(ack.seq, seq + i as u64);
        acks.push(ack);
    }
    acks
}

/// Half-closes the stream and waits until the chunkserver ends it.
async fn finish(mut w: Writer) {
    w.writer.shutdown().await.expect("shutdown");
    if let Some(ack) = w.ack().await {
        panic!("unexpected ack {ack:?}");
    }
}

/// `len` bytes appended through an append stream over `cs` (in pipeline order).
async fn append(cs: &[ChunkserverHandle], token: ChunkToken, data: &[u8]) {
    let down = cs[1..].iter().map(addr_of).collect();
    let mut w = Writer::open(&cs[0], token, 0, down).await.expect("setup");
    let packets: Vec<_> = data
        .chunks(DEFAULT_PACKET_SIZE)
        .enumerate()
        .map(|(i, c)| (i as u64 * P, c.to_vec(), false))
        .collect();
    for ack in send_all(&mut w, 0, &packets).await {
        assert!(ack.replicas.iter().all(|r| r.result.is_ok()), "{ack:?}");
    }
    finish(w).await;
}

/// The model of a replica: the bytes a sequence of writes leaves.
fn apply(model: &mut Vec<u8>, packets: &[(u64, Vec<u8>, bool)]) -> Vec<u64> {
    packets
        .iter()
        .map(|(offset, data, _)| {
            let (at, end) = (*offset as usize, *offset as usize + data.len());
            assert!(at <= model.len());
            if end > model.len() {
                model.resize(end, 0);
            }
            model[at..end].copy_from_slice(data);
            model.len() as u64
        })
        .collect()
}

fn newest_header(cluster: &Cluster, n: u64, handle: u64) -> Header {
    let bytes = std::fs::read(stampfs_chunkserver::layout::replica_path(
        &cluster.dir(n),
        ChunkHandle(handle),
    ))
    .expect("replica file");
    let slot = SLOT_SIZE as usize;
    Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).expect("a valid header")
}

/// Waits until every chunkserver's replica header is free of overwrite marks (the
/// stream's end clears them after the stream closed).
async fn marks_cleared(cluster: &Cluster, ns: &[u64], handle: u64) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    for &n in ns {
        while !newest_header(cluster, n, handle).marks.is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "cs{n}: marks not cleared after the stream ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn assert_replicas_hold(
    cluster: &Cluster,
    cs: &[ChunkserverHandle],
    token: ChunkToken,
    model: &[u8],
    what: &str,
) {
    for (i, s) in cs.iter().enumerate() {
        let (report, got) = read(s, token, 0, 16 << 20).await.expect("read verifies");
        assert_eq!(
            report.length,
            model.len() as u64,
            "{what}: cs{} length",
            i + 1
        );
        assert!(got[..] == model[..], "{what}: cs{} differs via Read", i + 1);
        let id = s.id().expect("id").0;
        let on_disk = file_data(&cluster.dir(id), token.handle.0, model.len() as u64);
        assert!(on_disk == model, "{what}: cs{} differs on disk", i + 1);
    }
}

#[tokio::test]
async fn a_three_chunkserver_overwrite_stream_leaves_identical_replicas() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = start(&cluster, &[1, 2, 3], kind).await;
        for s in &cs {
            bump(&cluster, s, 21, 1).await;
        }
        let token = cluster.token(21, 1);
        let mut model = pattern(6 * P as usize + 1234, 1);
        append(&cs, token, &model).await;
        let len = model.len() as u64;
        let packets: Vec<(u64, Vec<u8>, bool)> = vec![
            (0, pattern(P as usize, 2), false),
            (100, pattern(5000, 3), false),
            (P - 10, pattern(P as usize + 20, 4), false),
            (len - 500, pattern(2000, 5), false),
            (3 * P + 7, pattern(100, 6), true),
            (len + 1500, pattern(P as usize, 7), false),
            (4096, pattern(4096, 8), true),
        ];
        let lengths = apply(&mut model, &packets);
        let mut w =
            Writer::open_overwrite(&cs[0], token, 0, vec![addr_of(&cs[1]), addr_of(&cs[2])])
                .await
                .expect("overwrite set-up");
        assert_eq!(w.setup.accepted, ids(&[1, 2, 3]), "{kind:?}");
        let acks = send_all(&mut w, 0, &packets).await;
        for (ack, want) in acks.iter().zip(&lengths) {
            let got: Vec<_> = ack
                .replicas
                .iter()
                .map(|r| (r.chunkserver, r.result.clone()))
                .collect();
            assert_eq!(
                got,
                ids(&[1, 2, 3])
                    .into_iter()
                    .map(|id| (id, Ok(*want)))
                    .collect::<Vec<_>>(),
                "{kind:?}: every replica's length after the packet"
            );
        }
        finish(w).await;
        marks_cleared(&cluster, &[1, 2, 3], 21).await;
        assert_replicas_hold(&cluster, &cs, token, &model, &format!("{kind:?}")).await;
        for n in 1..=3 {
            assert_eq!(
                newest_header(&cluster, n, 21).length,
                model.len() as u64,
                "{kind:?}: flushed at the end"
            );
        }
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn replaying_an_overwrite_stream_from_an_earlier_packet_converges() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = start(&cluster, &[1, 2, 3], kind).await;
        for s in &cs {
            bump(&cluster, s, 22, 1).await;
        }
        let token = cluster.token(22, 1);
        let base = pattern(3 * P as usize + 999, 10);
        append(&cs, token, &base).await;
        let len = base.len() as u64;
        // Overlapping writes, some extending the replica, some rewriting what an
        // earlier one of the sequence wrote.
        let seq: Vec<(u64, Vec<u8>, bool)> = vec![
            (1000, pattern(3000, 11), false),
            (len - 10, pattern(P as usize, 12), false),
            (2000, pattern(P as usize, 13), false),
            (len + P - 100, pattern(500, 14), true),
            (1500, pattern(700, 15), false),
            (len - 10, pattern(20, 16), false),
            (0, pattern(2 * P as usize + 3, 17), false),
            (len + P + 300, pattern(1000, 18), false),
        ];
        let mut model = base.clone();
        apply(&mut model, &seq);
        let down = |from: usize| cs[from..].iter().map(addr_of).collect::<Vec<_>>();
        // The first stream applies packets 0..5 everywhere, then breaks.
        let mut w = Writer::open_overwrite(&cs[0], token, 0, down(1))
            .await
            .expect("setup");
        for ack in send_all(&mut w, 0, &seq[..5]).await {
            assert!(ack.replicas.iter().all(|r| r.result.is_ok()), "{ack:?}");
        }
        drop(w);
        // cs3 alone got further (the others' acks were lost on the way back).
        let mut w = Writer::open_overwrite(&cs[2], token, 0, Vec::new())
            .await
            .expect("setup");
        send_all(&mut w, 5, &seq[5..7]).await;
        finish(w).await;
        // The writer's recovery resends from its first unacknowledged packet (3 here:
        // its acks never came back), in order, over the same replicas.
        let mut w = Writer::open_overwrite(&cs[0], token, seq[3].0, down(1))
            .await
            .expect("setup");
        assert_eq!(w.setup.accepted, ids(&[1, 2, 3]));
        let acks = send_all(&mut w, 100, &seq[3..]).await;
        let last = acks.last().expect("acks");
        assert!(
            last.replicas
                .iter()
                .all(|r| r.result == Ok(model.len() as u64)),
            "{kind:?}: {last:?}"
        );
        finish(w).await;
        marks_cleared(&cluster, &[1, 2, 3], 22).await;
        assert_replicas_hold(&cluster, &cs, token, &model, &format!("{kind:?} converged")).await;
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn past_the_length_is_short_and_the_gate_fences_overwrite_streams() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = start(&cluster, &[1, 2], kind).await;
        for s in &cs {
            bump(&cluster, s, 23, 1).await;
        }
        let token = cluster.token(23, 1);
        let data = pattern(100_000, 20);
        append(&cs, token, &data).await;
        // A set-up past the end is refused.
        let err = Writer::open_overwrite(&cs[0], token, 100_001, vec![addr_of(&cs[1])])
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(
                err,
                RemoteError::ReplicaShort {
                    offset: 100_001,
                    length: 100_000,
                    ..
                }
            ),
            "{kind:?}: {err:?}"
        );
        // Below it: accepted, nothing cut.
        let mut w = Writer::open_overwrite(&cs[0], token, 10, vec![addr_of(&cs[1])])
            .await
            .expect("setup");
        for s in &cs {
            assert_eq!(
                read(s, token, 0, 1).await.expect("read").0.length,
                100_000,
                "{kind:?}"
            );
        }
        // A packet past the length: short, answered here, not forwarded; the stream ends.
        w.send(0, 100_001, b"gap", false).await;
        let ack = w.ack().await.expect("ack");
        assert_eq!(ack.replicas.len(), 1, "{kind:?}: {ack:?}");
        assert!(
            matches!(
                ack.replicas[0].result,
                Err(RemoteError::ReplicaShort {
                    offset: 100_001,
                    length: 100_000,
                    ..
                })
            ),
            "{kind:?}: {ack:?}"
        );
        assert!(w.ack().await.is_none(), "{kind:?}: the stream is closed");
        // An append stream's set-up still cuts the tail behind its offset.
        let w = Writer::open(&cs[0], token, 50_000, vec![addr_of(&cs[1])])
            .await
            .expect("append setup");
        finish(w).await;
        for s in &cs {
            let (r, got) = read(s, token, 0, 1 << 20).await.expect("read");
            assert_eq!(r.length, 50_000, "{kind:?}: cut");
            assert!(got[..] == data[..50_000]);
        }
        // After a bump the old token is fenced at set-up and on packets.
        for s in &cs {
            bump(&cluster, s, 23, 2).await;
        }
        let err = Writer::open_overwrite(&cs[0], token, 0, vec![addr_of(&cs[1])])
            .await
            .err()
            .expect("fenced");
        assert!(
            matches!(
                err,
                RemoteError::StaleToken {
                    presented: ChunkVersion(1),
                    current: ChunkVersion(2),
                    ..
                }
            ),
            "{kind:?}: {err:?}"
        );
        // A finalized replica takes no overwrite stream.
        let token = cluster.token(23, 2);
        for s in &cs {
            command(
                s,
                cluster.command(
                    s,
                    ChunkCommand::Finalize {
                        handle: ChunkHandle(23),
                        version: ChunkVersion(2),
                        length: 50_000,
                    },
                ),
            )
            .await
            .expect("finalize");
        }
        let err = Writer::open_overwrite(&cs[0], token, 0, Vec::new())
            .await
            .err()
            .expect("finalized");
        assert!(
            matches!(err, RemoteError::ReplicaFinalized { length: 50_000, .. }),
            "{kind:?}: {err:?}"
        );
        // Nothing in this test wrote in place.
        assert!(newest_header(&cluster, 1, 23).marks.is_empty());
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}

#[tokio::test]
async fn a_downstream_refusing_the_overwrite_set_up_is_listed_and_skipped() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = start(&cluster, &[1, 2, 3], kind).await;
        for s in &cs {
            bump(&cluster, s, 24, 1).await;
        }
        let token = cluster.token(24, 1);
        let data = pattern(10_000, 30);
        append(&cs, token, &data).await;
        // cs2 is shorter (it missed the last bytes): the forwarded overwrite set-up
        // is refused there, as the client's would be.
        command(
            &cs[1],
            cluster.command(
                &cs[1],
                ChunkCommand::Truncate {
                    handle: ChunkHandle(24),
                    version: ChunkVersion(1),
                    length: 5000,
                },
            ),
        )
        .await
        .expect("truncate");
        let w = Writer::open_overwrite(&cs[0], token, 8000, vec![addr_of(&cs[1]), addr_of(&cs[2])])
            .await
            .expect("setup");
        assert_eq!(w.setup.accepted, ids(&[1, 3]), "{kind:?}");
        assert_eq!(w.setup.failed.len(), 1);
        assert!(
            matches!(w.setup.failed[0], (id, RemoteError::ReplicaShort { .. }) if id == ids(&[2])[0]),
            "{kind:?}: {:?}",
            w.setup.failed
        );
        finish(w).await;
        for s in cs {
            s.shutdown().await.expect("shutdown");
        }
    }
}
