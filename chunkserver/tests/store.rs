//! The replica store on real files, with both I/O engines.

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::header::{Header, BLOCK, DATA_OFFSET, SLOT_SIZE};
use stampfs_chunkserver::store::Store;
use stampfs_chunkserver::{Error, IoEngineKind};
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};
use std::os::unix::fs::FileExt;
use std::path::Path;

const H: ChunkHandle = ChunkHandle(0x1234);

fn v(n: u64) -> ChunkVersion {
    ChunkVersion(n)
}

async fn open(dir: &Path, kind: IoEngineKind) -> Store {
    Store::open(dir, engine(kind)).await.expect("store opens")
}

fn replica_file(dir: &Path, h: ChunkHandle) -> std::path::PathBuf {
    stampfs_chunkserver::layout::replica_path(dir, h)
}

/// `replica_file` with `suffix` appended (a moved-aside or temporary file).
fn beside(dir: &Path, h: ChunkHandle, suffix: &str) -> std::path::PathBuf {
    let mut p = replica_file(dir, h).into_os_string();
    p.push(suffix);
    p.into()
}

/// Writes `data[range]` at its own offset under version 1 (synced when `sync`).
async fn put(s: &Store, data: &[u8], range: std::ops::Range<usize>, sync: bool) {
    let at = range.start as u64;
    s.write(H, v(1), at, Bytes::copy_from_slice(&data[range]), sync)
        .await
        .expect("write");
}

#[tokio::test]
async fn version_bump_survives_restart() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(100_000, 1);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            s.write(H, v(1), 0, Bytes::from(data.clone()), false)
                .await
                .expect("write");
            s.finalize(H, v(1), data.len() as u64)
                .await
                .expect("finalize");
            let r = s.bump_version(H, v(2), false).await.expect("bump");
            assert_eq!(
                (r.version, r.state),
                (v(2), ReplicaState::Writing),
                "{kind:?}"
            );
        }
        let s = open(dir.path(), kind).await;
        let r = s.info(H).await.expect("still there");
        assert_eq!(r.version, v(2), "{kind:?}");
        assert_eq!(r.length, data.len() as u64);
        assert_eq!(r.state, ReplicaState::Writing);
        // The old version is fenced after the restart too.
        let err = s
            .write(H, v(1), r.length, Bytes::from_static(b"late"), false)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::StaleToken { presented, current, .. } if presented == v(1) && current == v(2)),
            "{err}"
        );
        let (_, got) = s.read(H, v(2), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..]);
    }
}

#[tokio::test]
async fn the_gate_stale_equal_and_higher() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        s.bump_version(H, v(5), true).await.expect("create");
        let pkt = Bytes::from(pattern(70_000, 2));
        // Lower: StaleToken with the current version.
        let err = s.write(H, v(4), 0, pkt.clone(), false).await.unwrap_err();
        assert_eq!(
            err.to_remote(),
            stampfs_proto::RemoteError::StaleToken {
                handle: H,
                presented: v(4),
                current: v(5)
            }
        );
        // Equal: proceeds; an exact retry succeeds idempotently.
        assert_eq!(
            s.write(H, v(5), 0, pkt.clone(), false)
                .await
                .expect("write"),
            70_000
        );
        assert_eq!(
            s.write(H, v(5), 0, pkt.clone(), false)
                .await
                .expect("retry"),
            70_000
        );
        assert_eq!(s.info(H).await.expect("info").length, 70_000);
        // Higher: this replica missed a bump.
        let err = s
            .write(H, v(6), 70_000, pkt.clone(), false)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::ReplicaStale { presented, current, .. } if presented == v(6) && current == v(5)),
            "{err}"
        );
        // The same gate guards reads and info.
        assert!(matches!(
            s.read(H, v(4), 0, 10).await,
            Err(Error::StaleToken { .. })
        ));
        assert!(matches!(
            s.read(H, v(6), 0, 10).await,
            Err(Error::ReplicaStale { .. })
        ));
        assert!(matches!(
            s.gated_info(H, v(4)).await,
            Err(Error::StaleToken { .. })
        ));
        assert_eq!(s.gated_info(H, v(5)).await.expect("info").length, 70_000);
        // Bumps: lower refused, equal idempotent, missing without create is NotFound.
        assert!(matches!(
            s.bump_version(H, v(4), false).await,
            Err(Error::StaleToken { .. })
        ));
        assert_eq!(
            s.bump_version(H, v(5), false).await.expect("same").version,
            v(5)
        );
        assert!(matches!(
            s.bump_version(ChunkHandle(9), v(1), false).await,
            Err(Error::NotFound { .. })
        ));
        // A gap is refused.
        assert!(matches!(
            s.write(H, v(5), 80_000, pkt.clone(), false).await,
            Err(Error::ReplicaShort { offset: 80_000, .. })
        ));
    }
}

#[tokio::test]
async fn flipped_data_byte_is_detected_and_the_replica_moved_aside() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        s.bump_version(H, v(1), true).await.expect("create");
        let data = pattern(3 * BLOCK as usize + 100, 3);
        s.write(H, v(1), 0, Bytes::from(data.clone()), true)
            .await
            .expect("write");
        s.finalize(H, v(1), data.len() as u64)
            .await
            .expect("finalize");
        let path = replica_file(dir.path(), H);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        let at = DATA_OFFSET + 2 * BLOCK + 17;
        f.write_all_at(&[data[(2 * BLOCK + 17) as usize] ^ 0x01], at)
            .expect("flip");
        drop(f);
        // Blocks before the damage still read.
        let (_, got) = s.read(H, v(1), 10, 1000).await.expect("clean block");
        assert_eq!(&got[..], &data[10..1010]);
        let err = s.read(H, v(1), BLOCK, 2 * BLOCK).await.unwrap_err();
        assert!(
            matches!(err, Error::ChecksumMismatch { offset, .. } if offset == 2 * BLOCK),
            "{err}"
        );
        assert!(!path.exists(), "{kind:?}: the corrupt file must be moved");
        let aside = beside(dir.path(), H, ".corrupt");
        assert!(aside.exists(), "{kind:?}: renamed aside, never deleted");
        assert!(matches!(s.info(H).await, Err(Error::NotFound { .. })));
        assert_eq!(s.take_corrupt(), vec![H]);
    }
}

#[tokio::test]
async fn garbage_header_slots_are_moved_aside_at_startup() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
        }
        let bad = ChunkHandle(0xbad);
        std::fs::write(replica_file(dir.path(), bad), pattern(100_000, 4)).expect("garbage");
        std::fs::write(beside(dir.path(), bad, ".tmp"), b"leftover").expect("tmp");
        let s = open(dir.path(), kind).await;
        assert!(s.info(H).await.is_ok());
        assert!(matches!(s.info(bad).await, Err(Error::NotFound { .. })));
        assert!(!replica_file(dir.path(), bad).exists());
        assert!(beside(dir.path(), bad, ".corrupt").exists());
        assert!(!beside(dir.path(), bad, ".tmp").exists());
        assert_eq!(s.take_corrupt(), vec![bad]);
    }
}

#[tokio::test]
async fn a_torn_newest_header_slot_falls_back_to_the_previous_version() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            s.bump_version(H, v(2), false).await.expect("bump");
        }
        let path = replica_file(dir.path(), H);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let mut slots = vec![0u8; 2 * SLOT_SIZE as usize];
        f.read_exact_at(&mut slots, 0).expect("slots");
        let (a, b) = slots.split_at(SLOT_SIZE as usize);
        let newest = Header::newest(a, b).expect("valid");
        assert_eq!(newest.version, v(2));
        // Tear the newest slot: its second half never reached the disk.
        f.write_all_at(&[0u8; 40], newest.slot_offset() + 20)
            .expect("tear");
        drop(f);
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("previous slot").version, v(1));
    }
}

#[tokio::test]
async fn a_writing_replica_recovers_its_length_from_the_file() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(100_000, 5);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            // Odd-sized appends exercise the extended partial-block CRCs on disk.
            let mut off = 0usize;
            for n in [1usize, 4095, 60_000, 5, 35_899] {
                s.write(
                    H,
                    v(1),
                    off as u64,
                    Bytes::copy_from_slice(&data[off..off + n]),
                    false,
                )
                .await
                .expect("append");
                off += n;
            }
            assert_eq!(off, data.len());
        }
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, 100_000, "{kind:?}");
        let (_, got) = s.read(H, v(1), 0, 200_000).await.expect("read");
        assert_eq!(&got[..], &data[..]);
        drop(s);
        // Bytes that reached the file without their checksum entry are cut.
        let path = replica_file(dir.path(), H);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.write_all_at(&pattern(3000, 6), DATA_OFFSET + 100_000)
            .expect("append garbage");
        drop(f);
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, 100_000);
        // Appending continues right after the recovered length.
        s.write(H, v(1), 100_000, Bytes::from_static(b"more"), true)
            .await
            .expect("append after recovery");
        let (_, got) = s.read(H, v(1), 99_998, 10).await.expect("read");
        assert_eq!(
            &got[..],
            &[data[99_998], data[99_999], b'm', b'o', b'r', b'e']
        );
        drop(s);
        // Damage below the durable (synced) length is corruption, not a shorter replica.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.write_all_at(&[data[5] ^ 0xff], DATA_OFFSET + 5)
            .expect("flip");
        drop(f);
        let s = open(dir.path(), kind).await;
        assert!(matches!(s.info(H).await, Err(Error::NotFound { .. })));
        assert_eq!(s.take_corrupt(), vec![H]);
        assert!(beside(dir.path(), H, ".corrupt").exists());
    }
}

#[tokio::test]
async fn truncate_finalize_and_stream_setup() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(150_000, 7);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            s.write(H, v(1), 0, Bytes::from(data.clone()), false)
                .await
                .expect("write");
            assert!(matches!(
                s.truncate(H, v(1), 150_001).await,
                Err(Error::ReplicaShort {
                    offset: 150_001,
                    length: 150_000,
                    ..
                })
            ));
            assert!(matches!(
                s.truncate(H, v(2), 10).await,
                Err(Error::ReplicaStale { .. })
            ));
            let r = s.truncate(H, v(1), 100_000).await.expect("truncate");
            assert_eq!(r.length, 100_000);
            // Appends continue from the cut with correct checksums.
            s.write(
                H,
                v(1),
                100_000,
                Bytes::from(data[100_000..120_000].to_vec()),
                false,
            )
            .await
            .expect("append after truncate");
            // A setup at an earlier offset cuts the unacknowledged tail...
            assert_eq!(
                s.open_for_write(H, v(1), 110_000)
                    .await
                    .expect("setup")
                    .length,
                110_000
            );
            // ...and a gap is refused.
            assert!(matches!(
                s.open_for_write(H, v(1), 110_001).await,
                Err(Error::ReplicaShort {
                    offset: 110_001,
                    length: 110_000,
                    ..
                })
            ));
            s.write(
                H,
                v(1),
                110_000,
                Bytes::from(data[110_000..130_000].to_vec()),
                false,
            )
            .await
            .expect("append");
            assert!(matches!(
                s.finalize(H, v(1), 130_001).await,
                Err(Error::ReplicaShort {
                    offset: 130_001,
                    ..
                })
            ));
            let r = s.finalize(H, v(1), 125_000).await.expect("finalize");
            assert_eq!((r.length, r.state), (125_000, ReplicaState::Finalized));
            s.finalize(H, v(1), 125_000).await.expect("idempotent");
            assert!(matches!(
                s.write(H, v(1), 125_000, Bytes::from_static(b"x"), false)
                    .await,
                Err(Error::ReplicaFinalized {
                    length: 125_000,
                    ..
                })
            ));
            assert!(matches!(
                s.open_for_write(H, v(1), 125_000).await,
                Err(Error::ReplicaFinalized {
                    length: 125_000,
                    ..
                })
            ));
        }
        let s = open(dir.path(), kind).await;
        let r = s.info(H).await.expect("info");
        assert_eq!(
            (r.length, r.state),
            (125_000, ReplicaState::Finalized),
            "{kind:?}"
        );
        let (_, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..125_000]);
        let file_len = std::fs::metadata(replica_file(dir.path(), H))
            .expect("meta")
            .len();
        assert_eq!(file_len, DATA_OFFSET + 125_000);
    }
}

#[tokio::test]
async fn overlapping_rewrite_recomputes_the_block_from_disk() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        s.bump_version(H, v(1), true).await.expect("create");
        let data = pattern(90_000, 8);
        s.write(H, v(1), 0, Bytes::from(data[..80_000].to_vec()), false)
            .await
            .expect("write");
        // A resent packet that overlaps the end (same bytes, then new ones).
        s.write(
            H,
            v(1),
            70_000,
            Bytes::from(data[70_000..90_000].to_vec()),
            false,
        )
        .await
        .expect("overlap");
        assert_eq!(s.info(H).await.expect("info").length, 90_000);
        drop(s);
        let s = open(dir.path(), kind).await;
        let (_, got) = s.read(H, v(1), 0, 100_000).await.expect("read verifies");
        assert_eq!(&got[..], &data[..]);
    }
}

#[tokio::test]
async fn delete_honours_the_version_bound() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        s.bump_version(H, v(3), true).await.expect("create");
        let kept = s.delete(H, v(2)).await.expect("delete");
        assert_eq!(kept.expect("kept").version, v(3));
        assert!(replica_file(dir.path(), H).exists());
        assert_eq!(s.delete(H, v(3)).await.expect("delete"), None);
        assert!(!replica_file(dir.path(), H).exists());
        assert_eq!(s.delete(H, v(3)).await.expect("again"), None);
        assert!(s.reports().await.is_empty());
        // A deleted chunk can be created again.
        s.bump_version(H, v(4), true).await.expect("recreate");
        assert_eq!(s.reports().await.len(), 1);
    }
}

/// Writes `header` into its slot of the replica file and fsyncs, as a crash right
/// after that step of a store operation would leave it.
fn plant_header(dir: &Path, header: &Header) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(replica_file(dir, H))
        .expect("open");
    f.write_all_at(&header.encode(), header.slot_offset())
        .expect("write header");
    f.sync_all().expect("sync");
}

fn newest_header(dir: &Path) -> Header {
    let bytes = std::fs::read(replica_file(dir, H)).expect("read");
    let slot = SLOT_SIZE as usize;
    Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).expect("a valid header")
}

#[tokio::test]
async fn a_cut_interrupted_by_a_crash_never_brings_the_cut_bytes_back() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(300_000, 11);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            s.write(H, v(1), 0, Bytes::from(data.clone()), true)
                .await
                .expect("write");
        }
        // The first step of a cut to 100 000 bytes reached the disk, nothing after it:
        // the header is capped, the cut bytes and their checksums are all still there.
        let cut = newest_header(dir.path())
            .next(v(1), ReplicaState::Writing, 100_000)
            .capped();
        plant_header(dir.path(), &cut);
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, 100_000, "{kind:?}");
        let (_, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..100_000]);
        drop(s);
        // Start-up finished the cut: file cut, header rewritten without the cap.
        let len = std::fs::metadata(replica_file(dir.path(), H))
            .expect("meta")
            .len();
        assert_eq!(len, DATA_OFFSET + 100_000);
        let h = newest_header(dir.path());
        assert!(!h.capped);
        assert_eq!(h.length, 100_000);
        // The same header without the cap is what an hsync leaves, and there the
        // checksummed bytes past the header's length are recovered (none are left now).
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, 100_000);
        // Appends after the finished cut are recovered past the header again.
        put(&s, &data, 100_000..150_000, false).await;
        drop(s);
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, 150_000);
    }
}

#[tokio::test]
async fn truncate_leaves_no_checksums_that_could_revive_the_cut_tail() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(400_000, 12);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            s.write(H, v(1), 0, Bytes::from(data.clone()), true)
                .await
                .expect("write");
            for cut in [3 * BLOCK + 4464, 2 * BLOCK] {
                s.truncate(H, v(1), cut).await.expect("truncate");
            }
        }
        // Even if the old bytes came back into the file (as if the ftruncate had been
        // lost), the table no longer vouches for them.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(replica_file(dir.path(), H))
            .expect("open");
        let cut = 2 * BLOCK;
        f.write_all_at(&data[cut as usize..], DATA_OFFSET + cut)
            .expect("old bytes");
        drop(f);
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, cut, "{kind:?}");
    }
}

#[tokio::test]
async fn small_hsyncs_write_zeros_ahead_which_never_count_as_data() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(40 * 4096 + 100, 13);
        let file_len = || {
            std::fs::metadata(replica_file(dir.path(), H))
                .expect("meta")
                .len()
        };
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            for (i, part) in data.chunks(4096).enumerate() {
                let off = (i * 4096) as u64;
                s.write(H, v(1), off, Bytes::copy_from_slice(part), true)
                    .await
                    .expect("hsync");
            }
            // The file holds zeros ahead of the data...
            assert!(file_len() > DATA_OFFSET + data.len() as u64, "{kind:?}");
            let r = s.info(H).await.expect("info");
            assert_eq!(r.length, data.len() as u64);
            // ...which reads never see.
            let (_, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
            assert_eq!(&got[..], &data[..]);
        }
        // A crash: the length comes back exact, zeros and all.
        let s = open(dir.path(), kind).await;
        assert_eq!(
            s.info(H).await.expect("info").length,
            data.len() as u64,
            "{kind:?}"
        );
        let (_, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..]);
        // Appending continues over the zeros, and finalize cuts the file to its data.
        let more = pattern(5000, 14);
        s.write(H, v(1), data.len() as u64, Bytes::from(more.clone()), true)
            .await
            .expect("append");
        let total = (data.len() + more.len()) as u64;
        s.finalize(H, v(1), total).await.expect("finalize");
        assert_eq!(file_len(), DATA_OFFSET + total);
        let (_, got) = s
            .read(H, v(1), data.len() as u64, 1 << 20)
            .await
            .expect("read");
        assert_eq!(&got[..], &more[..]);
    }
}

#[tokio::test]
async fn a_finalized_replica_left_longer_than_its_length_is_cut_at_startup() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(10_000, 15);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            s.write(H, v(1), 0, Bytes::from(data.clone()), true)
                .await
                .expect("hsync");
            s.finalize(H, v(1), 10_000).await.expect("finalize");
        }
        // As if the crash came between finalize's header and its cut of the zeros.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(replica_file(dir.path(), H))
            .expect("open");
        f.set_len(DATA_OFFSET + (1 << 20)).expect("grow");
        drop(f);
        let s = open(dir.path(), kind).await;
        let r = s.info(H).await.expect("info");
        assert_eq!(
            (r.length, r.state),
            (10_000, ReplicaState::Finalized),
            "{kind:?}"
        );
        let len = std::fs::metadata(replica_file(dir.path(), H))
            .expect("meta")
            .len();
        assert_eq!(len, DATA_OFFSET + 10_000);
        let (_, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..]);
    }
}

#[tokio::test]
async fn recovery_forgets_checksums_past_the_recovered_length() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(300_000, 16);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            put(&s, &data, 0..100_000, true).await;
            put(&s, &data, 100_000..data.len(), false).await;
        }
        // A crash kept the appended checksums but not the appended bytes.
        let path = replica_file(dir.path(), H);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(DATA_OFFSET + 100_000).expect("lose the tail");
        drop(f);
        let s = open(dir.path(), kind).await;
        assert_eq!(s.info(H).await.expect("info").length, 100_000, "{kind:?}");
        drop(s);
        // Every entry past the recovered length is gone, the tail entry is the CRC of
        // the recovered partial block.
        let bytes = std::fs::read(&path).expect("read");
        let table = &bytes[2 * SLOT_SIZE as usize..DATA_OFFSET as usize];
        let entry = |i: usize| u32::from_le_bytes(table[4 * i..4 * i + 4].try_into().expect("4"));
        let block = BLOCK as usize;
        assert_eq!(entry(1), crc32fast::hash(&data[block..100_000]));
        assert!((2..table.len() / 4).all(|i| entry(i) == 0), "{kind:?}");
    }
}

#[tokio::test]
async fn an_hsync_whose_header_missed_the_disk_is_recovered_from_its_sync_record() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = pattern(110_000, 17);
        {
            let s = open(dir.path(), kind).await;
            s.bump_version(H, v(1), true).await.expect("create");
            put(&s, &data, 0..50_000, true).await;
            put(&s, &data, 50_000..100_000, true).await;
            // An append moves block 1's checksum entry past the hsynced length.
            put(&s, &data, 100_000..data.len(), false).await;
        }
        // Power loss: the second hsync's header (written after its flush) and the
        // appended bytes never reached the disk; the moved checksum entry did.
        let path = replica_file(dir.path(), H);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        let first = Header::new(H, v(1), ReplicaState::Writing, 0).with_tail(0);
        f.write_all_at(&first.encode_head(), first.slot_offset())
            .expect("old header back");
        f.write_all_at(&[0u8; 10_000], DATA_OFFSET + 100_000)
            .expect("lose the append");
        drop(f);
        let s = open(dir.path(), kind).await;
        assert_eq!(
            s.info(H).await.expect("info").length,
            100_000,
            "{kind:?}: every hsynced byte is back"
        );
        let (_, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
        assert_eq!(&got[..], &data[..100_000]);
    }
}
