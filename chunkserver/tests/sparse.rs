//! Zeros written as holes (`io::sparse`), with both I/O engines: a gap a writer fills
//! with zeros costs no disk, an overwrite with zeros frees the blocks it covers, and
//! either way every byte reads back as written, after a restart too.

mod common;

use bytes::Bytes;
use common::{engine, engines, init_tracing, pattern};
use stampfs_chunkserver::store::{PacketWrite, Store, WriteMode};
use stampfs_chunkserver::IoEngineKind;
use stampfs_proto::{ChunkHandle, ChunkVersion};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const H: ChunkHandle = ChunkHandle(0x5a5a);
const PACKET: usize = 64 << 10;

fn v1() -> ChunkVersion {
    ChunkVersion(1)
}

async fn open(dir: &Path, kind: IoEngineKind) -> Store {
    Store::open(dir, engine(kind)).await.expect("store opens")
}

/// Disk bytes the replica's file holds (its allocated blocks).
fn allocated(dir: &Path) -> u64 {
    let path = stampfs_chunkserver::layout::replica_path(dir, H);
    std::fs::metadata(path).expect("replica file").blocks() * 512
}

/// Whether `dir`'s file system punches holes (the store writes zeros where not).
fn holes_work(dir: &Path) -> bool {
    let path = dir.join("probe");
    let f = std::fs::File::create(&path).expect("probe file");
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[1; 12288], 0).expect("write");
    let ok = rustix::fs::fallocate(
        &f,
        rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
        4096,
        4096,
    )
    .is_ok();
    std::fs::remove_file(path).expect("remove probe");
    ok
}

/// A store in a fresh directory holding an empty replica of `H` at version 1;
/// `None` (the test skipped, saying why) where the file system punches no holes.
async fn new_replica(kind: IoEngineKind) -> Option<(tempfile::TempDir, Store)> {
    let dir = tempfile::tempdir().expect("tempdir");
    if !holes_work(dir.path()) {
        eprintln!("skipped: {} does not punch holes", dir.path().display());
        return None;
    }
    let s = open(dir.path(), kind).await;
    s.bump_version(H, v1(), true).await.expect("create");
    Some((dir, s))
}

/// `data` at `offset` as packets of [`PACKET`] bytes, the last one synced.
fn packets(offset: u64, data: &[u8]) -> Vec<PacketWrite> {
    let n = data.len().div_ceil(PACKET);
    data.chunks(PACKET)
        .enumerate()
        .map(|(i, c)| PacketWrite {
            version: v1(),
            offset: offset + (i * PACKET) as u64,
            data: Bytes::copy_from_slice(c),
            crc: Some(crc32fast::hash(c)),
            sync: i + 1 == n,
        })
        .collect()
}

async fn assert_reads(s: &Store, model: &[u8], what: &str) {
    let mut got = Vec::new();
    while got.len() < model.len() {
        let (_, part) = s
            .read(H, v1(), got.len() as u64, 1 << 20)
            .await
            .unwrap_or_else(|e| panic!("{what}: read at {}: {e}", got.len()));
        assert!(!part.is_empty(), "{what}: short at {}", got.len());
        got.extend_from_slice(&part);
    }
    assert_eq!(got.len(), model.len(), "{what}: length");
    assert!(got == model, "{what}: bytes differ");
}

/// The store opened again on `dir` finds nothing corrupt and reads `model` back.
async fn reads_back_after_a_restart(dir: &Path, kind: IoEngineKind, model: &[u8]) {
    let s = open(dir, kind).await;
    assert!(
        s.take_corrupt().is_empty(),
        "{kind:?}: nothing corrupt after a restart"
    );
    assert_reads(&s, model, &format!("{kind:?} after a restart")).await;
}

#[tokio::test]
async fn a_gap_of_zeros_costs_no_disk_and_reads_back() {
    init_tracing();
    for kind in engines() {
        let Some((dir, s)) = new_replica(kind).await else {
            return;
        };
        // Data, a 16 MiB gap of zeros (as a writer past the end sends it), data.
        let mut model = Vec::new();
        for part in [pattern(10_000, 1), vec![0u8; 16 << 20], pattern(70_000, 2)] {
            let out = s
                .write_batch(H, WriteMode::Append, packets(model.len() as u64, &part))
                .await;
            assert!(out.error.is_none(), "{kind:?}: {:?}", out.error);
            model.extend_from_slice(&part);
        }
        let disk = allocated(dir.path());
        assert!(
            disk < 2 << 20,
            "{kind:?}: {disk} bytes allocated for {} bytes of which 16 MiB are zeros",
            model.len()
        );
        assert_reads(&s, &model, &format!("{kind:?}")).await;
        s.finalize(H, v1(), model.len() as u64)
            .await
            .expect("finalize");
        drop(s);
        reads_back_after_a_restart(dir.path(), kind, &model).await;
    }
}

#[tokio::test]
async fn an_overwrite_with_zeros_frees_its_blocks_and_keeps_the_rest() {
    init_tracing();
    for kind in engines() {
        let Some((dir, s)) = new_replica(kind).await else {
            return;
        };
        let mut model = pattern(8 << 20, 3);
        let out = s
            .write_batch(H, WriteMode::Append, packets(0, &model))
            .await;
        assert!(out.error.is_none(), "{kind:?}: {:?}", out.error);
        let before = allocated(dir.path());
        // Zeros over 5 MiB starting inside a block and a page, ending inside another.
        let (at, len) = (1_000_003usize, 5 << 20);
        let zeros = vec![0u8; len];
        s.open_for_overwrite(H, v1(), at as u64)
            .await
            .expect("overwrite stream");
        let out = s
            .write_batch(H, WriteMode::Overwrite, packets(at as u64, &zeros))
            .await;
        assert!(out.error.is_none(), "{kind:?}: {:?}", out.error);
        s.close_overwrite(H).await.expect("close");
        model[at..at + len].fill(0);
        let after = allocated(dir.path());
        // Each chain writes its run's unaligned head and last page: a batch this long
        // goes as several chains, so a little less than 5 MiB is freed.
        assert!(
            after + (7 << 19) < before,
            "{kind:?}: {before} bytes allocated before, {after} after 5 MiB of zeros"
        );
        assert_reads(&s, &model, &format!("{kind:?}")).await;
        drop(s);
        reads_back_after_a_restart(dir.path(), kind, &model).await;
    }
}
