//! Unit tests of the store's write path and replica table (real files, both I/O
//! engines).

use super::*;

const H: ChunkHandle = ChunkHandle(0xb47c);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn packet(version: u64, offset: u64, data: &[u8], sync: bool) -> PacketWrite {
    PacketWrite {
        version: ChunkVersion(version),
        offset,
        data: Bytes::copy_from_slice(data),
        crc: Some(crc32fast::hash(data)),
        sync,
    }
}

fn engines() -> Vec<Arc<dyn IoEngine>> {
    let mut out: Vec<Arc<dyn IoEngine>> = vec![Arc::new(crate::io::ThreadsEngine::new())];
    match crate::io::UringEngine::new() {
        Ok(e) => out.push(Arc::new(e)),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "io_uring must be available in CI: {e}"
            );
            println!("SKIPPED: io_uring unavailable: {e}");
        }
    }
    out
}

#[tokio::test]
async fn a_batch_gates_every_packet_and_keeps_the_ones_before_a_stale_one() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine).await.expect("open");
        s.bump_version(H, ChunkVersion(2), true)
            .await
            .expect("create");
        let data = pattern(150_010, 1);
        let out = s
            .write_batch(
                H,
                WriteMode::Append,
                vec![
                    packet(2, 0, &data[..65_536], false),
                    packet(2, 65_536, &data[65_536..150_000], false),
                    packet(1, 150_000, &data[150_000..], false),
                    packet(2, 150_000, &data[150_000..], false),
                ],
            )
            .await;
        assert_eq!(out.lengths, vec![65_536, 150_000]);
        assert!(
            matches!(out.error, Some(Error::StaleToken { .. })),
            "{:?}",
            out.error
        );
        let (report, got) = s.read(H, ChunkVersion(2), 0, 1 << 20).await.expect("read");
        assert_eq!(report.length, 150_000);
        assert_eq!(&got[..], &data[..150_000]);
        // A newer token than the replica's is refused the same way, and a gap too.
        let out = s
            .write_batch(H, WriteMode::Append, vec![packet(3, 150_000, b"x", false)])
            .await;
        assert!(matches!(out.error, Some(Error::ReplicaStale { .. })));
        let out = s
            .write_batch(
                H,
                WriteMode::Append,
                vec![
                    packet(2, 150_000, b"ok", false),
                    packet(2, 150_010, b"gap", false),
                ],
            )
            .await;
        assert_eq!(out.lengths, vec![150_002]);
        assert!(matches!(
            out.error,
            Some(Error::ReplicaShort {
                offset: 150_010,
                length: 150_002,
                ..
            })
        ));
    }
}

#[tokio::test]
async fn a_batch_handles_retries_overlaps_and_unaligned_packets() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine).await.expect("open");
        s.bump_version(H, ChunkVersion(1), true)
            .await
            .expect("create");
        let data = pattern(300_000, 2);
        let out = s
            .write_batch(
                H,
                WriteMode::Append,
                vec![
                    packet(1, 0, &data[..1000], false),
                    // An exact retry of bytes already planned.
                    packet(1, 0, &data[..1000], false),
                    // Overlapping the end: takes the general path.
                    packet(1, 500, &data[500..70_000], false),
                    // Unaligned, crossing block boundaries, with a CRC hint.
                    packet(1, 70_000, &data[70_000..200_000], false),
                    // Block aligned, one block, the CRC reused for the table.
                    packet(1, 200_000, &data[200_000..262_144], false),
                    packet(1, 262_144, &data[262_144..], true),
                ],
            )
            .await;
        assert!(out.error.is_none(), "{:?}", out.error);
        assert_eq!(
            out.lengths,
            vec![1000, 1000, 70_000, 200_000, 262_144, 300_000]
        );
        // Reads verify every block against the checksum table.
        let (_, got) = s.read(H, ChunkVersion(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..]);
        drop(s);
        // And so does recovery at start-up.
        let s = Store::open(dir.path(), Arc::new(crate::io::ThreadsEngine::new()))
            .await
            .expect("reopen");
        assert_eq!(s.info(H).await.expect("info").length, 300_000);
        assert!(s.take_corrupt().is_empty());
    }
}

#[tokio::test]
async fn hsync_header_rides_on_the_next_flush_and_carries_its_tail_crc() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine).await.expect("open");
        s.bump_version(H, ChunkVersion(1), true)
            .await
            .expect("create");
        let data = pattern(10_000, 3);
        let out = s
            .write_batch(H, WriteMode::Append, vec![packet(1, 0, &data, true)])
            .await;
        assert_eq!(out.lengths, vec![10_000]);
        let slot = s.slot(H).expect("slot");
        {
            let guard = slot.read().await;
            let SlotState::Live(r) = &*guard else {
                panic!("live replica expected")
            };
            assert_eq!(r.header.length, 10_000, "the hsync header holds the length");
            assert_eq!(r.header.tail_crc, Some(crc32fast::hash(&data)));
            assert!(!r.header_durable, "written without a second flush");
        }
        // A truncate to the same length must still make that header durable.
        s.truncate(H, ChunkVersion(1), 10_000)
            .await
            .expect("truncate");
        let guard = slot.read().await;
        let SlotState::Live(r) = &*guard else {
            panic!("live replica expected")
        };
        assert!(r.header_durable);
        assert_eq!(r.header.length, 10_000);
    }
}

#[tokio::test]
async fn a_received_copy_renamed_over_an_older_replica_is_what_the_cache_serves() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine)
            .await
            .expect("open")
            .with_max_open_files(1);
        let (old, new) = (pattern(70_000, 5), pattern(90_000, 6));
        s.bump_version(H, ChunkVersion(1), true)
            .await
            .expect("create");
        s.write(H, ChunkVersion(1), 0, Bytes::from(old.clone()), true)
            .await
            .expect("write");
        let (_, got) = s.read(H, ChunkVersion(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &old[..], "the old inode is the cached one");
        let old_id = match &*s.slot(H).expect("slot").read().await {
            SlotState::Live(r) => r.id,
            _ => panic!("live replica expected"),
        };
        let mut incoming = s
            .receive(H, ChunkVersion(2), new.len() as u64)
            .await
            .expect("receive");
        incoming
            .append(Bytes::from(new.clone()))
            .await
            .expect("append");
        incoming.finish(&s).await.expect("finish");
        let (report, got) = s.read(H, ChunkVersion(2), 0, 1 << 20).await.expect("read");
        assert_eq!(report.length, new.len() as u64);
        assert_eq!(
            &got[..],
            &new[..],
            "the renamed-in inode, never the old one"
        );
        assert!(
            !s.disk.cache.holds(old_id),
            "the old replica's entry is dropped"
        );
        assert_eq!(s.open_files(), 1);
        // Another replica evicts it; a reopen by path finds the new inode too.
        let other = ChunkHandle(0xb47d);
        s.bump_version(other, ChunkVersion(1), true)
            .await
            .expect("create other");
        let (_, got) = s
            .read(H, ChunkVersion(2), 0, 1 << 20)
            .await
            .expect("reread");
        assert_eq!(&got[..], &new[..]);
        // Deleting drops the entry.
        s.delete(H, ChunkVersion(2)).await.expect("delete");
        assert_eq!(s.open_files(), 0);
    }
}

#[tokio::test]
async fn write_behind_is_asked_for_every_threshold_of_appended_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine: Arc<dyn IoEngine> = Arc::new(crate::io::ThreadsEngine::new());
    let s = Store::open(dir.path(), engine.clone()).await.expect("open");
    s.bump_version(H, ChunkVersion(1), true)
        .await
        .expect("create");
    let slot = s.slot(H).expect("slot");
    let mut guard = slot.write().await;
    let SlotState::Live(r) = &mut *guard else {
        panic!("live replica expected")
    };
    let data = pattern(100_000, 4);
    let (out, hint) = r
        .write_batch(
            engine.as_ref(),
            WriteMode::Append,
            vec![packet(1, 0, &data[..60_000], false)],
            64 << 10,
        )
        .await;
    assert!(out.error.is_none());
    assert!(hint.is_none(), "below the threshold");
    let (_, hint) = r
        .write_batch(
            engine.as_ref(),
            WriteMode::Append,
            vec![packet(1, 60_000, &data[60_000..], false)],
            64 << 10,
        )
        .await;
    match hint {
        Some(op @ IoOp::WriteBehind { offset, len }) => {
            assert_eq!((offset, len), (DATA_OFFSET, 100_000));
            // The hint runs on the engine like any op.
            engine
                .run(r.file().await.expect("file"), vec![op])
                .await
                .expect("hint runs");
        }
        other => panic!("expected a write-behind hint, got {other:?}"),
    }
    // Off when the threshold is zero; a sync counts as written back.
    let (_, hint) = r
        .write_batch(
            engine.as_ref(),
            WriteMode::Append,
            vec![packet(1, 100_000, &data[..10], true)],
            0,
        )
        .await;
    assert!(hint.is_none());
    assert_eq!(r.behind, 100_010);
}

#[tokio::test]
async fn an_in_place_write_into_bytes_only_a_sync_record_vouches_for_makes_a_header_durable() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine).await.expect("open");
        s.bump_version(H, ChunkVersion(1), true)
            .await
            .expect("create");
        let data = pattern(100_000, 5);
        let state = |s: &Store| {
            let slot = s.slot(H).expect("slot");
            let guard = slot.try_read_owned().expect("unlocked");
            let SlotState::Live(r) = &*guard else {
                panic!("live replica expected")
            };
            (
                r.header_durable,
                r.durable_length,
                r.header.length,
                r.header.marks.count(),
            )
        };
        let write = |offset: u64, bytes: &[u8], sync: bool| {
            s.write_batch(
                H,
                WriteMode::Overwrite,
                vec![packet(1, offset, bytes, sync)],
            )
        };
        assert!(write(0, &data[..50_000], true).await.error.is_none());
        assert_eq!(state(&s), (false, 0, 50_000, 0), "the hsync's header rides");
        // The first in-place write marks region 0 in a durable header (the hsync's
        // header again, same slot) at the hsync's length.
        assert!(write(100, &data[100..200], false).await.error.is_none());
        assert_eq!(state(&s), (true, 50_000, 50_000, 1));
        assert!(write(50_000, &data[50_000..], true).await.error.is_none());
        assert_eq!(state(&s), (false, 50_000, 100_000, 1));
        // Region 0 is marked already, but bytes 50 000..100 000 are vouched for by the
        // sync record alone: an in-place write into their blocks makes a header
        // durable first.
        assert!(write(70_000, &data[70_000..70_010], false)
            .await
            .error
            .is_none());
        assert_eq!(state(&s), (true, 100_000, 100_000, 1));
        // Below the block of the durable length, after another hsync: no extra flush.
        assert!(write(100_000, &data[..10], true).await.error.is_none());
        assert_eq!(state(&s), (false, 100_000, 100_010, 1));
        assert!(write(10, &data[10..20], false).await.error.is_none());
        assert_eq!(
            state(&s),
            (false, 100_000, 100_010, 1),
            "nothing to make durable"
        );
        // The next hsync's flush makes the previous hsync's header durable.
        assert!(write(100_010, &data[..10], true).await.error.is_none());
        assert_eq!(state(&s), (false, 100_010, 100_020, 1));
        assert!(write(100_005, &data[..10], false).await.error.is_none());
        assert_eq!(state(&s), (true, 100_020, 100_020, 1));
    }
}
