//! Writes at any offset on real files, with both I/O engines: in-place writes read back
//! like a model, the gate and the length checks, overwrite marks in the header, and
//! torn in-place writes planted as a crash would leave them (DESIGN.md, "Writes at any
//! offset").

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::header::{self, Header, BLOCK, DATA_OFFSET, REGION, SLOT_SIZE};
use stampfs_chunkserver::store::{PacketWrite, Store, WriteMode};
use stampfs_chunkserver::{Error, IoEngineKind};
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const H: ChunkHandle = ChunkHandle(0x0e1f);

fn v(n: u64) -> ChunkVersion {
    ChunkVersion(n)
}

async fn open(dir: &Path, kind: IoEngineKind) -> Store {
    Store::open(dir, engine(kind)).await.expect("store opens")
}

fn replica_file(dir: &Path) -> PathBuf {
    stampfs_chunkserver::layout::replica_path(dir, H)
}

fn newest_header(dir: &Path) -> Header {
    let bytes = std::fs::read(replica_file(dir)).expect("read");
    let slot = SLOT_SIZE as usize;
    Header::newest(&bytes[..slot], &bytes[slot..2 * slot]).expect("a valid header")
}

/// Writes `header` into its slot and fsyncs (as a crash after that write leaves it).
fn plant_header(dir: &Path, header: &Header) {
    let f = rw(dir);
    f.write_all_at(&header.encode_head(), header.slot_offset())
        .expect("write header");
    f.sync_all().expect("sync");
}

fn rw(dir: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(replica_file(dir))
        .expect("open replica file")
}

/// The replica's bytes and what a writer expects them to be.
struct Model(Vec<u8>);

impl Model {
    /// Applies a write at `offset` (at most the length), returning the new length.
    fn write(&mut self, offset: usize, data: &[u8]) -> u64 {
        assert!(
            offset <= self.0.len(),
            "the model never writes past its end"
        );
        let end = offset + data.len();
        if end > self.0.len() {
            self.0.resize(end, 0);
        }
        self.0[offset..end].copy_from_slice(data);
        self.0.len() as u64
    }

    fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

/// A new `Writing` replica holding `len` bytes of a pattern, hsynced.
async fn replica_with(s: &Store, len: usize, seed: u64) -> Model {
    s.bump_version(H, v(1), true).await.expect("create");
    let data = pattern(len, seed);
    s.write(H, v(1), 0, Bytes::from(data.clone()), true)
        .await
        .expect("append");
    Model(data)
}

async fn assert_reads_like(s: &Store, model: &Model, what: &str) {
    let (report, got) = s.read(H, v(1), 0, 1 << 24).await.expect("read verifies");
    assert_eq!(report.length, model.len(), "{what}: length");
    assert!(
        got[..] == model.0[..],
        "{what}: bytes differ from the model"
    );
}

fn packet(offset: u64, data: &[u8], sync: bool) -> PacketWrite {
    PacketWrite {
        version: v(1),
        offset,
        data: Bytes::copy_from_slice(data),
        crc: Some(crc32fast::hash(data)),
        sync,
    }
}

#[tokio::test]
async fn overwrites_at_block_packet_and_page_boundaries_read_back_like_the_model() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        let mut model = replica_with(&s, 5 * BLOCK as usize + 12_345, 1).await;
        let len = model.len();
        let b = BLOCK;
        // (offset, length) of each overwrite, in order.
        let writes: Vec<(u64, u64)> = vec![
            (0, b),              // one whole block
            (b, 2 * b),          // two whole blocks
            (4096, 4096),        // one page
            (4095, 2),           // across a page boundary
            (b - 100, 200),      // across a block boundary
            (3 * b + 10, 5),     // inside a block
            (2 * b - 1, b + 2),  // a block and a byte each side
            (len - 100, 50),     // inside the partial last block
            (5 * b, 12_345),     // the partial last block exactly
            (len - 100, 300),    // overwrite and extend in one packet
            (len + 200, 1000),   // appended (at the end)
            (0, 3 * b + 7),      // a long packet from the start
            (len + 1000, 2 * b), // ends on... past a block boundary
        ];
        for (i, (offset, n)) in writes.into_iter().enumerate() {
            let data = pattern(n as usize, 100 + i as u64);
            let want = model.write(offset as usize, &data);
            let got = s
                .overwrite(H, v(1), offset, Bytes::from(data), i % 3 == 0)
                .await
                .unwrap_or_else(|e| panic!("{kind:?} write {i} at {offset}: {e}"));
            assert_eq!(got, want, "{kind:?} write {i}: the length after it");
            assert_reads_like(&s, &model, &format!("{kind:?} after write {i}")).await;
        }
        // Several packets in one batch, each at its own offset; later ones see the
        // earlier ones (one overwrites bytes another appended in the same batch).
        let end = model.len();
        let batch: Vec<(u64, Vec<u8>)> = vec![
            (100, pattern(1000, 200)),
            (500, pattern(70_000, 201)),
            (600, pattern(10, 202)),
            (end, pattern(5000, 203)),
            (end + 4000, pattern(2000, 204)),
            (end + 5500, pattern(b as usize, 205)),
            (b, pattern(b as usize, 206)),
        ];
        let mut lengths = Vec::new();
        for (offset, data) in &batch {
            lengths.push(model.write(*offset as usize, data));
        }
        let packets = batch
            .iter()
            .enumerate()
            .map(|(i, (o, d))| packet(*o, d, i == 2))
            .collect();
        let out = s.write_batch(H, WriteMode::Overwrite, packets).await;
        assert!(out.error.is_none(), "{kind:?}: {:?}", out.error);
        assert_eq!(out.lengths, lengths, "{kind:?}");
        assert_reads_like(&s, &model, &format!("{kind:?} after the batch")).await;
        // The stream's end flushes and clears the marks; the bytes survive a restart.
        assert!(!newest_header(dir.path()).marks.is_empty());
        s.close_overwrite(H).await.expect("close");
        let h = newest_header(dir.path());
        assert!(h.marks.is_empty(), "{kind:?}: cleared at the stream's end");
        assert_eq!(h.length, model.len(), "{kind:?}: the flushed length");
        drop(s);
        let s = open(dir.path(), kind).await;
        assert!(s.take_corrupt().is_empty());
        assert_reads_like(&s, &model, &format!("{kind:?} after a restart")).await;
    }
}

#[tokio::test]
async fn the_length_the_gate_and_the_state_still_hold_for_overwrites() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        let model = replica_with(&s, 100_000, 2).await;
        let x = Bytes::from_static(b"x");
        // Past the length: the replica is short.
        let err = s.overwrite(H, v(1), 100_001, x.clone(), false).await;
        assert!(
            matches!(
                err,
                Err(Error::ReplicaShort {
                    offset: 100_001,
                    length: 100_000,
                    ..
                })
            ),
            "{kind:?}: {err:?}"
        );
        assert!(matches!(
            s.open_for_overwrite(H, v(1), 100_001).await,
            Err(Error::ReplicaShort { .. })
        ));
        // In a batch, the length includes the packets planned before.
        let out = s
            .write_batch(
                H,
                WriteMode::Overwrite,
                vec![
                    packet(100_000, b"abc", false),
                    packet(100_003, b"def", false),
                    packet(100_007, b"gap", false),
                ],
            )
            .await;
        assert_eq!(out.lengths, vec![100_003, 100_006], "{kind:?}");
        assert!(matches!(
            out.error,
            Some(Error::ReplicaShort {
                offset: 100_007,
                length: 100_006,
                ..
            })
        ));
        // The set-up never cuts.
        let r = s.open_for_overwrite(H, v(1), 10).await.expect("set-up");
        assert_eq!(r.length, 100_006, "{kind:?}: nothing cut");
        // The gate: lower fenced, higher stale.
        s.bump_version(H, v(2), false).await.expect("bump");
        let err = s.overwrite(H, v(1), 0, x.clone(), false).await;
        assert!(
            matches!(err, Err(Error::StaleToken { presented, current, .. }) if presented == v(1) && current == v(2)),
            "{kind:?}: {err:?}"
        );
        assert!(matches!(
            s.open_for_overwrite(H, v(1), 0).await,
            Err(Error::StaleToken { .. })
        ));
        assert!(matches!(
            s.overwrite(H, v(3), 0, x.clone(), false).await,
            Err(Error::ReplicaStale { .. })
        ));
        // A finalized replica takes no overwrite.
        s.finalize(H, v(2), 100_006).await.expect("finalize");
        assert!(matches!(
            s.overwrite(H, v(2), 0, x.clone(), false).await,
            Err(Error::ReplicaFinalized {
                length: 100_006,
                ..
            })
        ));
        assert!(matches!(
            s.open_for_overwrite(H, v(2), 0).await,
            Err(Error::ReplicaFinalized { .. })
        ));
        let (_, got) = s.read(H, v(2), 0, 1 << 20).await.expect("read");
        assert_eq!(
            &got[..100_000],
            &model.0[..],
            "{kind:?}: nothing overwritten"
        );
        assert_eq!(&got[100_000..], b"abcdef");
    }
}

#[tokio::test]
async fn marks_are_durable_before_in_place_writes_and_cleared_only_after_a_full_flush() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        let mut model = replica_with(&s, 3 * REGION as usize, 3).await;
        // Appends through an overwrite write nothing in place: no mark.
        let more = pattern(1000, 4);
        let end = model.len();
        model.write(end as usize, &more);
        s.overwrite(H, v(1), end, Bytes::from(more), false)
            .await
            .expect("append");
        assert!(newest_header(dir.path()).marks.is_empty(), "{kind:?}");
        // An in-place write marks its regions in a durable header first.
        let data = pattern(2000, 5);
        let at = REGION - 1000;
        model.write(at as usize, &data);
        s.overwrite(H, v(1), at, Bytes::from(data), false)
            .await
            .expect("overwrite");
        let marks = newest_header(dir.path()).marks;
        assert_eq!(marks.count(), 2, "{kind:?}: the two regions it touches");
        assert!(marks.contains(0) && marks.contains(1) && !marks.contains(2));
        // An hsync keeps them.
        let data = pattern(10, 6);
        model.write(10, &data);
        s.overwrite(H, v(1), 10, Bytes::from(data), true)
            .await
            .expect("hsync");
        assert_eq!(newest_header(dir.path()).marks, marks, "{kind:?}");
        // A finalize (a flush, then its header) clears them.
        s.finalize(H, v(1), model.len()).await.expect("finalize");
        let h = newest_header(dir.path());
        assert!(h.marks.is_empty(), "{kind:?}");
        assert_eq!(h.state, ReplicaState::Finalized);
        // So does a bump, and a truncate to the same length.
        s.bump_version(H, v(2), false).await.expect("reopen");
        let data = pattern(10, 7);
        s.overwrite(H, v(2), 2 * REGION, Bytes::from(data.clone()), false)
            .await
            .expect("overwrite");
        assert!(newest_header(dir.path()).marks.contains(2));
        s.truncate(H, v(2), model.len()).await.expect("truncate");
        assert!(newest_header(dir.path()).marks.is_empty(), "{kind:?}");
        s.overwrite(H, v(2), 0, Bytes::from(data), false)
            .await
            .expect("overwrite");
        assert!(newest_header(dir.path()).marks.contains(0));
        s.bump_version(H, v(3), false).await.expect("bump");
        assert!(newest_header(dir.path()).marks.is_empty(), "{kind:?}");
    }
}

#[tokio::test]
async fn an_in_place_write_under_an_hsync_header_not_yet_durable_makes_it_durable() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        s.bump_version(H, v(1), true).await.expect("create");
        let mut model = Model(Vec::new());
        let data = pattern(50_000, 8);
        model.write(0, &data);
        s.write(H, v(1), 0, Bytes::from(data), true)
            .await
            .expect("hsync");
        // The hsync's header rides on the next flush: on disk, the creation's header.
        // Its record vouches for the 50 000 bytes; an in-place write into them first
        // makes a header durable at that length (recovery checks records strictly).
        let data = pattern(100, 9);
        model.write(20_000, &data);
        s.overwrite(H, v(1), 20_000, Bytes::from(data), false)
            .await
            .expect("overwrite");
        let f = std::fs::File::open(replica_file(dir.path())).expect("open");
        f.sync_all().expect("sync");
        let h = newest_header(dir.path());
        assert_eq!(h.length, 50_000, "{kind:?}");
        assert!(h.marks.contains(0), "{kind:?}");
        assert_reads_like(&s, &model, &format!("{kind:?}")).await;
    }
}

#[tokio::test]
async fn an_hsynced_overwrite_survives_a_restart_without_a_clean_close() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut model;
        {
            let s = open(dir.path(), kind).await;
            model = replica_with(&s, 4 * BLOCK as usize + 777, 10).await;
            for (i, (at, n)) in [(1000u64, 300usize), (BLOCK - 5, 10), (4 * BLOCK + 700, 200)]
                .into_iter()
                .enumerate()
            {
                let data = pattern(n, 20 + i as u64);
                model.write(at as usize, &data);
                s.overwrite(H, v(1), at, Bytes::from(data), true)
                    .await
                    .expect("hsynced overwrite");
            }
            // Dropped without close_overwrite: the marks stay on disk.
        }
        assert!(!newest_header(dir.path()).marks.is_empty());
        let s = open(dir.path(), kind).await;
        assert!(s.take_corrupt().is_empty(), "{kind:?}");
        assert_reads_like(&s, &model, &format!("{kind:?} after the restart")).await;
        drop(s);
        // Start-up settled the replica: a durable header at its length, no marks.
        let h = newest_header(dir.path());
        assert!(h.marks.is_empty(), "{kind:?}");
        assert_eq!(h.length, model.len());
    }
}

/// A torn in-place write, as a crash may leave it on disk.
#[derive(Clone, Copy, Debug)]
enum Torn {
    /// The new bytes reached the disk, the block's table entry (or tail CRC) did not.
    DataNotEntry,
    /// The new table entry reached the disk, the bytes did not.
    EntryNotData,
    /// Half of the new bytes reached the disk (the first half), the entry did not.
    HalfDataNotEntry,
    /// Half of the new bytes (the second half) and the new entry.
    HalfDataAndEntry,
}

const TORN: [Torn; 4] = [
    Torn::DataNotEntry,
    Torn::EntryNotData,
    Torn::HalfDataNotEntry,
    Torn::HalfDataAndEntry,
];

/// Plants `torn` for an overwrite at `at` over `old` (the replica's bytes before it),
/// after the store wrote that overwrite in full (so the marks, the new
/// bytes and the new entry are on disk). `block` is the block the write lies in;
/// `old_entry` that block's entry before it.
fn plant_torn(dir: &Path, torn: Torn, at: u64, old: &[u8], block: u64, old_entry: u32) {
    let f = rw(dir);
    let half = old.len() / 2;
    let entry_at = header::table_entry_offset(block);
    match torn {
        Torn::DataNotEntry => {
            f.write_all_at(&old_entry.to_le_bytes(), entry_at)
                .expect("entry");
        }
        Torn::EntryNotData => {
            f.write_all_at(old, DATA_OFFSET + at).expect("data");
        }
        Torn::HalfDataNotEntry => {
            f.write_all_at(&old[half..], DATA_OFFSET + at + half as u64)
                .expect("data");
            f.write_all_at(&old_entry.to_le_bytes(), entry_at)
                .expect("entry");
        }
        Torn::HalfDataAndEntry => {
            f.write_all_at(&old[..half], DATA_OFFSET + at)
                .expect("data");
        }
    }
    f.sync_all().expect("sync");
}

/// Every byte of `got` (the bytes at the overwrite's range after recovery) is the old
/// or the new one.
fn each_byte_old_or_new(got: &[u8], old: &[u8], new: &[u8]) -> bool {
    got.iter()
        .zip(old.iter().zip(new))
        .all(|(g, (o, n))| g == o || g == n)
}

/// One planted crash state: a replica of `len` bytes, an overwrite of `n` bytes at `at`
/// written by the store (not closed), the damage `torn`, and, when `unmark`, a header
/// that marks only a region far from the damage. Returns the store reopened and the
/// bytes before the overwrite.
async fn torn_case(
    dir: &Path,
    kind: IoEngineKind,
    len: usize,
    at: u64,
    n: usize,
    torn: Torn,
    unmark: bool,
) -> (Store, Vec<u8>, Vec<u8>) {
    let block = at / BLOCK;
    let (old, new);
    {
        let s = open(dir, kind).await;
        let model = replica_with(&s, len, 30).await;
        old = model.0.clone();
        new = pattern(n, 31);
        s.overwrite(H, v(1), at, Bytes::from(new.clone()), false)
            .await
            .expect("overwrite");
        // The rest of the stream's bytes hit the disk too (nothing else is torn).
        std::fs::File::open(replica_file(dir))
            .expect("open")
            .sync_all()
            .expect("sync");
    }
    let start = (block * BLOCK) as usize;
    let end = (start + BLOCK as usize).min(len);
    let old_entry = crc32fast::hash(&old[start..end]);
    let range = at as usize..at as usize + n;
    plant_torn(dir, torn, at, &old[range], block, old_entry);
    if unmark {
        let h = newest_header(dir);
        assert!(h.marks.covers(at), "the store marked the region");
        let mut far = stampfs_chunkserver::header::Marks::NONE;
        far.set(200);
        plant_header(dir, &h.unmarked().with_marks(far));
    }
    (open(dir, kind).await, old, new)
}

#[tokio::test]
async fn a_torn_in_place_write_in_a_marked_region_is_recomputed_and_the_replica_kept() {
    init_tracing();
    for kind in engines() {
        // (replica length, overwrite offset, overwrite length): a partial block in
        // the middle, and the partial last block (checked by the header's tail CRC).
        let len = 3 * BLOCK as usize + 5000;
        for (at, n) in [(BLOCK + 1000, 2000usize), (3 * BLOCK + 1000, 3000)] {
            for torn in TORN {
                let dir = tempfile::tempdir().expect("tempdir");
                let what = format!("{kind:?} {torn:?} at {at}");
                let (s, old, new) = torn_case(dir.path(), kind, len, at, n, torn, false).await;
                assert!(s.take_corrupt().is_empty(), "{what}: kept");
                let (report, got) = s.read(H, v(1), 0, 1 << 20).await.expect("read verifies");
                assert_eq!(report.length, len as u64, "{what}: length");
                let range = at as usize..at as usize + n;
                assert!(
                    each_byte_old_or_new(&got[range.clone()], &old[range.clone()], &new),
                    "{what}: a byte neither old nor new"
                );
                assert!(
                    got[..range.start] == old[..range.start],
                    "{what}: before the range"
                );
                assert!(
                    got[range.end..] == old[range.end..],
                    "{what}: after the range"
                );
                // The replica takes writes again, and recovery settled it for good.
                drop(s);
                let h = newest_header(dir.path());
                assert!(
                    h.marks.is_empty() && h.length == len as u64,
                    "{what}: {h:?}"
                );
                let s = open(dir.path(), kind).await;
                let (_, again) = s.read(H, v(1), 0, 1 << 20).await.expect("read");
                assert!(again == got, "{what}: stable after a second restart");
            }
        }
    }
}

#[tokio::test]
async fn the_same_damage_outside_a_marked_region_is_still_corruption() {
    init_tracing();
    for kind in engines() {
        let len = 3 * BLOCK as usize + 5000;
        for (at, n) in [(BLOCK + 1000, 2000usize), (3 * BLOCK + 1000, 3000)] {
            for torn in TORN {
                if at / BLOCK == 3 && matches!(torn, Torn::EntryNotData) {
                    // Not damage: the partial last block is checked against the
                    // header's tail CRC, which the old bytes match.
                    continue;
                }
                let dir = tempfile::tempdir().expect("tempdir");
                let what = format!("{kind:?} {torn:?} at {at}");
                let (s, _, _) = torn_case(dir.path(), kind, len, at, n, torn, true).await;
                assert_eq!(s.take_corrupt(), vec![H], "{what}: reported");
                assert!(
                    matches!(s.info(H).await, Err(Error::NotFound { .. })),
                    "{what}"
                );
                let mut aside = replica_file(dir.path()).into_os_string();
                aside.push(".corrupt");
                assert!(
                    Path::new(&aside).exists(),
                    "{what}: moved aside, never deleted"
                );
            }
        }
    }
}

/// A format-1 header slot, byte for byte as chunkservers before overwrite marks wrote
/// it (see `header.rs`).
fn format_1_head(h: &Header) -> Vec<u8> {
    let mut out = vec![0u8; 512];
    out[0..8].copy_from_slice(b"STAMPCHK");
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    out[12..16].copy_from_slice(&65536u32.to_le_bytes());
    out[16..24].copy_from_slice(&h.handle.0.to_le_bytes());
    out[24..32].copy_from_slice(&h.version.0.to_le_bytes());
    out[32..40].copy_from_slice(&h.length.to_le_bytes());
    out[40..48].copy_from_slice(&h.seq.to_le_bytes());
    out[48] = match h.state {
        ReplicaState::Writing => 1,
        ReplicaState::Finalized => 2,
    };
    out[49] = if h.tail_crc.is_some() { 2 } else { 0 };
    out[50..54].copy_from_slice(&h.tail_crc.unwrap_or(0).to_le_bytes());
    let crc = crc32fast::hash(&out[..56]);
    out[56..60].copy_from_slice(&crc.to_le_bytes());
    out
}

#[tokio::test]
async fn replicas_with_format_1_headers_still_load_and_take_overwrites() {
    init_tracing();
    for kind in engines() {
        for state in [ReplicaState::Writing, ReplicaState::Finalized] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut model;
            {
                let s = open(dir.path(), kind).await;
                model = replica_with(&s, 2 * BLOCK as usize + 999, 40).await;
                if state == ReplicaState::Finalized {
                    s.finalize(H, v(1), model.len()).await.expect("finalize");
                }
            }
            // Both slots rewritten as an older chunkserver would have left them.
            let h = newest_header(dir.path());
            let older = Header {
                seq: h.seq - 1,
                ..h
            };
            let f = rw(dir.path());
            for hd in [h, older] {
                f.write_all_at(&format_1_head(&hd), hd.slot_offset())
                    .expect("format-1 header");
            }
            f.sync_all().expect("sync");
            drop(f);
            let s = open(dir.path(), kind).await;
            assert!(s.take_corrupt().is_empty(), "{kind:?} {state:?}");
            let r = s.info(H).await.expect("loaded");
            assert_eq!((r.length, r.state), (model.len(), state), "{kind:?}");
            assert_reads_like(&s, &model, &format!("{kind:?} {state:?}")).await;
            if state == ReplicaState::Writing {
                let data = pattern(3000, 41);
                model.write(BLOCK as usize - 1000, &data);
                s.overwrite(H, v(1), BLOCK - 1000, Bytes::from(data), true)
                    .await
                    .expect("overwrite");
                drop(s);
                assert_eq!(newest_header(dir.path()).marks.count(), 1);
                let s = open(dir.path(), kind).await;
                assert_reads_like(&s, &model, &format!("{kind:?} format 2 again")).await;
            }
        }
    }
}

#[tokio::test]
async fn a_batch_of_scattered_overwrites_is_split_into_chains_the_engine_takes() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), kind).await;
        let mut model = replica_with(&s, 255 * BLOCK as usize, 50).await;
        // 128 packets, each in a block of its own (every other one), the last an
        // hsync: 128 data writes and 128 table writes, more than one chain links.
        let packets: Vec<PacketWrite> = (0..128u64)
            .map(|i| {
                let at = 2 * i * BLOCK + 100 + i;
                let data = pattern(50 + i as usize, 60 + i);
                model.write(at as usize, &data);
                packet(at, &data, i == 127)
            })
            .collect();
        let out = s.write_batch(H, WriteMode::Overwrite, packets).await;
        assert!(out.error.is_none(), "{kind:?}: {:?}", out.error);
        assert_eq!(out.lengths, vec![model.len(); 128]);
        assert_reads_like(&s, &model, &format!("{kind:?}")).await;
        drop(s);
        let s = open(dir.path(), kind).await;
        assert_reads_like(&s, &model, &format!("{kind:?} after a restart")).await;
    }
}
