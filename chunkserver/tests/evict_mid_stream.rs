//! The descriptor cache's eviction under the per-chunk lock: a replica whose file is
//! evicted in the middle of a write stream (between two packets, or while a packet's
//! chain runs under its lock) is reopened by path on its next use, and the stream goes
//! on as if nothing happened: same bytes, same checksums, hsyncs durable, a cut in the
//! middle of the stream exact, all of it borne out by start-up recovery.

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::store::{PacketWrite, Store};
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const STREAM: ChunkHandle = ChunkHandle(0xa11);
const OTHERS: [ChunkHandle; 2] = [ChunkHandle(0xb22), ChunkHandle(0xc33)];
const PACKET: usize = 20_000;

fn v1() -> ChunkVersion {
    ChunkVersion(1)
}

fn packet(offset: u64, data: &[u8], sync: bool) -> PacketWrite {
    PacketWrite {
        version: v1(),
        offset,
        data: Bytes::copy_from_slice(data),
        crc: Some(crc32fast::hash(data)),
        sync,
    }
}

/// Uses another replica, so that the cache (of capacity 1) evicts the stream's file.
async fn evict(s: &Store, other: ChunkHandle) {
    s.read(other, v1(), 0, 10)
        .await
        .expect("read another replica");
}

#[tokio::test]
async fn an_evicted_replica_reopens_between_the_packets_of_a_stream() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine(kind))
            .await
            .expect("open")
            .with_max_open_files(1);
        for h in OTHERS {
            s.bump_version(h, v1(), true).await.expect("create other");
            s.write(h, v1(), 0, Bytes::from(pattern(100, 7)), true)
                .await
                .expect("write other");
        }
        s.bump_version(STREAM, v1(), true).await.expect("create");
        s.open_for_write(STREAM, v1(), 0).await.expect("set-up");
        let data = pattern(40 * PACKET + 123, 1);
        let mut offset = 0usize;
        for (i, piece) in data.chunks(PACKET).enumerate() {
            // Every packet finds its file evicted; every fifth is an hsync, every
            // third goes as a two-packet batch.
            evict(&s, OTHERS[i % 2]).await;
            let before = s.reopened_files();
            if i % 3 == 0 && piece.len() > 1 {
                let half = piece.len() / 2;
                let out = s
                    .write_batch(
                        STREAM,
                        stampfs_chunkserver::store::WriteMode::Append,
                        vec![
                            packet(offset as u64, &piece[..half], false),
                            packet((offset + half) as u64, &piece[half..], i % 5 == 0),
                        ],
                    )
                    .await;
                assert!(out.error.is_none(), "{kind:?} batch {i}: {:?}", out.error);
                assert_eq!(out.lengths.last(), Some(&((offset + piece.len()) as u64)));
            } else {
                let len = s
                    .write(
                        STREAM,
                        v1(),
                        offset as u64,
                        Bytes::copy_from_slice(piece),
                        i % 5 == 0,
                    )
                    .await
                    .expect("write");
                assert_eq!(len, (offset + piece.len()) as u64);
            }
            assert!(
                s.reopened_files() > before,
                "{kind:?}: packet {i} reopened the stream's evicted file"
            );
            offset += piece.len();
            assert!(s.open_files() <= 1);
        }

        // A stream set-up behind the end (the cut of an unacknowledged tail) with the
        // file evicted between each of the cut's flushed steps' users.
        evict(&s, OTHERS[0]).await;
        let cut = 25 * PACKET as u64 + 77;
        s.open_for_write(STREAM, v1(), cut).await.expect("cut");
        evict(&s, OTHERS[1]).await;
        let resent = pattern(5 * PACKET, 2);
        s.write(STREAM, v1(), cut, Bytes::from(resent.clone()), true)
            .await
            .expect("resend after the cut");
        let mut want = data[..cut as usize].to_vec();
        want.extend_from_slice(&resent);
        evict(&s, OTHERS[0]).await;
        let (report, got) = s.read(STREAM, v1(), 0, 1 << 30).await.expect("read");
        assert_eq!(report.length, want.len() as u64, "{kind:?}");
        assert!(got[..] == want[..], "{kind:?}: the stream's bytes");
        assert!(s.take_corrupt().is_empty());

        // Start-up recovery agrees, and the replica finalizes after another eviction.
        drop(s);
        let s = Store::open(dir.path(), engine(kind))
            .await
            .expect("reopen")
            .with_max_open_files(1);
        assert!(
            s.take_corrupt().is_empty(),
            "{kind:?}: nothing looks corrupt"
        );
        assert_eq!(
            s.info(STREAM).await.expect("info").length,
            want.len() as u64
        );
        evict(&s, OTHERS[1]).await;
        let report = s
            .finalize(STREAM, v1(), want.len() as u64)
            .await
            .expect("finalize");
        assert_eq!(report.state, ReplicaState::Finalized);
        evict(&s, OTHERS[0]).await;
        let (_, got) = s.read(STREAM, v1(), 0, 1 << 30).await.expect("read");
        assert!(got[..] == want[..], "{kind:?}: after the restart");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evictions_racing_a_stream_under_its_lock_change_nothing_it_writes() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Arc::new(
            Store::open(dir.path(), engine(kind))
                .await
                .expect("open")
                .with_max_open_files(1),
        );
        for h in OTHERS {
            s.bump_version(h, v1(), true).await.expect("create other");
            s.write(h, v1(), 0, Bytes::from(pattern(100, 7)), true)
                .await
                .expect("write other");
        }
        s.bump_version(STREAM, v1(), true).await.expect("create");
        // Other replicas are used without pause while the stream writes: the stream's
        // file is evicted at any point, between packets or while a packet's chain (a
        // data write, its table entry, an hsync's flush and header) runs under the
        // stream's lock, which the evictions never take.
        let stop = Arc::new(AtomicBool::new(false));
        let mut evictors = Vec::new();
        for other in OTHERS {
            let (s, stop) = (s.clone(), stop.clone());
            evictors.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    evict(&s, other).await;
                    n += 1;
                }
                n
            }));
        }
        let data = pattern(120 * PACKET / 7, 3);
        let mut offset = 0u64;
        let step = PACKET / 7;
        for (i, piece) in data.chunks(step).enumerate() {
            let out = s
                .write_batch(
                    STREAM,
                    stampfs_chunkserver::store::WriteMode::Append,
                    vec![packet(offset, piece, i % 4 == 0)],
                )
                .await;
            assert!(out.error.is_none(), "{kind:?} packet {i}: {:?}", out.error);
            offset += piece.len() as u64;
            // Reads share the lock with nothing that writes; they reopen too.
            if i % 10 == 0 {
                let (_, got) = s.read(STREAM, v1(), 0, offset).await.expect("read");
                assert!(got[..] == data[..offset as usize], "{kind:?} read at {i}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        let mut evictions = 0;
        for e in evictors {
            evictions += e.await.expect("evictor");
        }
        assert!(evictions > 0);
        s.finalize(STREAM, v1(), offset)
            .await
            .expect("finalize while evicted");
        let (_, got) = s.read(STREAM, v1(), 0, 1 << 30).await.expect("read");
        assert!(got[..] == data[..], "{kind:?}: the stream's bytes");
        assert!(s.take_corrupt().is_empty());
        drop(s);
        let s = Store::open(dir.path(), engine(kind)).await.expect("reopen");
        assert!(s.take_corrupt().is_empty());
        let r = s.info(STREAM).await.expect("info");
        assert_eq!(
            (r.state, r.length),
            (ReplicaState::Finalized, data.len() as u64)
        );
    }
}
