//! The group log: openraft's storage suite, restarts, torn tails, damage, rotation,
//! truncation across segments and purging.

use super::segment::HEADER_LEN;
use super::*;
use crate::raft::{Applied, Batch, MasterNode, SnapshotFile};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, EntryPayload, Membership, RaftSnapshotBuilder, SnapshotMeta,
    StoredMembership,
};
use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

fn log_id(term: u64, node: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn batch(term: u64, index: u64, lsn: u64) -> Entry {
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Normal(Batch {
            first_lsn: lsn,
            records: vec![serde_bytes::ByteBuf::from(vec![index as u8; 100])],
        }),
    }
}

fn members() -> Membership<NodeId, MasterNode> {
    let nodes: BTreeMap<_, _> = (1..=3)
        .map(|i| {
            (
                i,
                MasterNode {
                    addr: format!("127.0.0.1:{}", 7070 + i),
                },
            )
        })
        .collect();
    Membership::new(vec![[1, 2, 3].into_iter().collect()], nodes)
}

/// Entries 0..n: a membership at 0, then batches.
fn entries(term: u64, from: u64, to: u64) -> Vec<Entry> {
    (from..to)
        .map(|i| {
            if i == 0 {
                Entry {
                    log_id: log_id(term, 1, 0),
                    payload: EntryPayload::Membership(members()),
                }
            } else {
                batch(term, i, i)
            }
        })
        .collect()
}

fn append(s: &LogStore, es: Vec<Entry>) {
    lock(&s.inner).append(es).expect("append");
}

fn all(s: &LogStore) -> Vec<Entry> {
    lock(&s.inner).entries(0, None).expect("read")
}

fn indices(es: &[Entry]) -> Vec<u64> {
    es.iter().map(|e| e.log_id.index).collect()
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    list_segments(dir)
        .expect("list")
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

#[test]
fn entries_the_vote_and_the_commit_point_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = LogStore::open(dir.path()).expect("open");
        append(&s, entries(1, 0, 5));
        append(&s, entries(1, 5, 9));
        let mut i = lock(&s.inner);
        i.save_vote(&Vote::new_committed(2, 3)).expect("vote");
        i.save_committed(Some(log_id(1, 1, 7))).expect("committed");
    }
    let s = LogStore::open(dir.path()).expect("reopen");
    let got = all(&s);
    assert_eq!(got, entries(1, 0, 9));
    let i = lock(&s.inner);
    assert_eq!(i.vote, Some(Vote::new_committed(2, 3)));
    assert_eq!(i.committed, Some(log_id(1, 1, 7)));
    assert_eq!(i.purged, None);
}

#[test]
fn a_torn_tail_is_cut_and_appending_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open(dir.path()).expect("open");
    append(&s, entries(1, 0, 4));
    let (path, end) = {
        let i = lock(&s.inner);
        let seg = &i.segs[0];
        (seg.z.path.clone(), seg.z.pos)
    };
    drop(s);
    // The last entry half written, over the zeros: a crash inside an append.
    let f = OpenOptions::new().write(true).open(&path).expect("open");
    f.write_all_at(&[0, 0, 0, 200, 1, 2, 3, 4, 0, 0], end)
        .expect("tear");
    drop(f);
    let s = LogStore::open(dir.path()).expect("reopen cuts the tail");
    assert_eq!(indices(&all(&s)), vec![0, 1, 2, 3]);
    append(&s, entries(1, 4, 6));
    drop(s);
    let s = LogStore::open(dir.path()).expect("reopen");
    assert_eq!(all(&s), entries(1, 0, 6));
}

#[test]
fn damage_before_the_newest_segment_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open_with(dir.path(), 300).expect("open");
    for i in 0..12 {
        append(&s, entries(1, i, i + 1));
    }
    drop(s);
    let files = segment_files(dir.path());
    assert!(files.len() >= 3, "rotated: {files:?}");
    let mut bytes = std::fs::read(&files[0]).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&files[0], bytes).expect("damage");
    let err = LogStore::open(dir.path()).expect_err("damage in a sealed segment");
    assert!(matches!(err, Error::CorruptLog { .. }), "{err}");
}

#[test]
fn entries_read_back_across_rotated_segments_and_a_truncation_spans_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open_with(dir.path(), 400).expect("open");
    for i in 0..12 {
        append(&s, entries(1, i, i + 1));
    }
    let segs = segment_files(dir.path()).len();
    assert!(segs >= 4, "{segs} segments");
    assert_eq!(all(&s), entries(1, 0, 12));
    // A follower's conflicting tail from 5 on: later segments go whole.
    lock(&s.inner).truncate(5).expect("truncate");
    assert_eq!(indices(&all(&s)), vec![0, 1, 2, 3, 4]);
    assert!(segment_files(dir.path()).len() < segs);
    // The new leader's entries take their place, and all of it survives a reopen.
    let mut newer = entries(2, 5, 8);
    newer
        .iter_mut()
        .for_each(|e| e.log_id.leader_id.node_id = 2);
    append(&s, newer.clone());
    drop(s);
    let s = LogStore::open_with(dir.path(), 400).expect("reopen");
    let mut want = entries(1, 0, 5);
    want.extend(newer);
    assert_eq!(all(&s), want);
    // A truncation at a segment's first entry leaves its header, and a reopen agrees.
    let first_of_last = lock(&s.inner).segs.last().map(|x| x.first).expect("seg");
    lock(&s.inner).truncate(first_of_last).expect("truncate");
    drop(s);
    let s = LogStore::open_with(dir.path(), 400).expect("reopen");
    assert_eq!(indices(&all(&s)), (0..first_of_last).collect::<Vec<_>>());
    // Truncating past the end changes nothing.
    lock(&s.inner).truncate(100).expect("truncate past the end");
    assert_eq!(all(&s).len() as u64, first_of_last);
}

#[test]
fn purging_drops_whole_old_segments_and_a_reopen_finds_the_oldest_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open_with(dir.path(), 400).expect("open");
    for i in 0..12 {
        append(&s, entries(1, i, i + 1));
    }
    let before = segment_files(dir.path()).len();
    lock(&s.inner).purge(log_id(1, 1, 6)).expect("purge");
    let got = all(&s);
    assert_eq!(
        indices(&got),
        (7..12).collect::<Vec<_>>(),
        "purged ones unserved"
    );
    let after = segment_files(dir.path()).len();
    assert!(after < before, "{before} -> {after}");
    drop(s);
    let s = LogStore::open_with(dir.path(), 400).expect("reopen");
    let purged = lock(&s.inner).purged.expect("a purge point");
    assert!(purged.index <= 6, "{purged:?}");
    let got = all(&s);
    assert_eq!(got.first().map(|e| e.log_id.index), Some(purged.index + 1));
    assert_eq!(got.last().map(|e| e.log_id.index), Some(11));
    // Purging everything keeps the newest segment and reports the purge point as the
    // last log id.
    lock(&s.inner).purge(log_id(1, 1, 11)).expect("purge all");
    assert!(all(&s).is_empty());
    assert_eq!(segment_files(dir.path()).len(), 1);
}

#[test]
fn out_of_order_appends_and_a_damaged_vote_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open(dir.path()).expect("open");
    append(&s, entries(1, 0, 3));
    assert!(lock(&s.inner).append(entries(1, 4, 5)).is_err(), "a gap");
    assert!(lock(&s.inner).append(entries(1, 2, 3)).is_err(), "a repeat");
    lock(&s.inner).save_vote(&Vote::new(4, 1)).expect("vote");
    drop(s);
    let vote = dir.path().join(VOTE_FILE);
    let mut b = std::fs::read(&vote).expect("read");
    b[10] ^= 1;
    std::fs::write(&vote, b).expect("damage");
    assert!(LogStore::open(dir.path()).is_err(), "a damaged vote");
    // A damaged commit point is only forgotten (it is never synced).
    std::fs::write(&vote, disk::encode_vote(&Vote::new(4, 1))).expect("repair");
    std::fs::write(dir.path().join(COMMITTED_FILE), b"junk").expect("junk");
    let s = LogStore::open(dir.path()).expect("open");
    assert_eq!(lock(&s.inner).committed, None);
    assert_eq!(all(&s).len(), 3);
}

/// A state machine of just a commit point and a membership, with snapshots that are
/// files of a [`disk::encode_snapshot_header`]: enough for openraft's suite, which
/// tests the log store above all.
#[derive(Clone)]
struct ToySm {
    inner: Arc<Mutex<ToyInner>>,
}

struct ToyInner {
    dir: PathBuf,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, MasterNode>,
    snapshot: Option<(SnapshotMeta<NodeId, MasterNode>, PathBuf)>,
    seq: u64,
}

fn sto(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::error(e)).into()
}

async fn open_snapshot(
    path: &Path,
) -> std::result::Result<Box<SnapshotFile>, StorageError<NodeId>> {
    Ok(Box::new(SnapshotFile {
        path: path.to_path_buf(),
        file: tokio::fs::File::open(path).await.map_err(sto)?,
    }))
}

impl RaftSnapshotBuilder<TypeConfig> for ToySm {
    async fn build_snapshot(
        &mut self,
    ) -> std::result::Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let (meta, path) = {
            let mut i = lock(&self.inner);
            i.seq += 1;
            let meta = SnapshotMeta {
                last_log_id: i.last_applied,
                last_membership: i.membership.clone(),
                snapshot_id: format!("{}-{}", i.last_applied.map_or(0, |l| l.index), i.seq),
            };
            let path = i.dir.join(format!("snapshot-{}", meta.snapshot_id));
            (meta, path)
        };
        let bytes = disk::encode_snapshot_header(&meta).map_err(sto)?;
        tokio::fs::write(&path, bytes).await.map_err(sto)?;
        lock(&self.inner).snapshot = Some((meta.clone(), path.clone()));
        Ok(Snapshot {
            meta,
            snapshot: open_snapshot(&path).await?,
        })
    }
}

impl RaftStateMachine<TypeConfig> for ToySm {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> std::result::Result<
        (Option<LogId<NodeId>>, StoredMembership<NodeId, MasterNode>),
        StorageError<NodeId>,
    > {
        let i = lock(&self.inner);
        Ok((i.last_applied, i.membership.clone()))
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> std::result::Result<Vec<Applied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut i = lock(&self.inner);
        let mut out = Vec::new();
        for e in entries {
            i.last_applied = Some(e.log_id);
            if let EntryPayload::Membership(m) = e.payload {
                i.membership = StoredMembership::new(Some(e.log_id), m);
            }
            out.push(Applied::default());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> std::result::Result<Box<SnapshotFile>, StorageError<NodeId>> {
        let path = {
            let mut i = lock(&self.inner);
            i.seq += 1;
            i.dir.join(format!("receiving-{}", i.seq))
        };
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .await
            .map_err(sto)?;
        Ok(Box::new(SnapshotFile { path, file }))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, MasterNode>,
        mut snapshot: Box<SnapshotFile>,
    ) -> std::result::Result<(), StorageError<NodeId>> {
        let mut bytes = Vec::new();
        snapshot
            .file
            .seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(sto)?;
        snapshot.file.read_to_end(&mut bytes).await.map_err(sto)?;
        let (own, _) = disk::decode_snapshot_header(&bytes)
            .map_err(sto)?
            .ok_or_else(|| sto("a snapshot cut short"))?;
        if &own != meta {
            return Err(sto("the snapshot's file carries other metadata"));
        }
        let mut i = lock(&self.inner);
        i.last_applied = meta.last_log_id;
        i.membership = meta.last_membership.clone();
        i.snapshot = Some((meta.clone(), snapshot.path.clone()));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> std::result::Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let current = lock(&self.inner).snapshot.clone();
        match current {
            None => Ok(None),
            Some((meta, path)) => Ok(Some(Snapshot {
                meta,
                snapshot: open_snapshot(&path).await?,
            })),
        }
    }
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, ToySm, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> std::result::Result<(tempfile::TempDir, LogStore, ToySm), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(sto)?;
        let log = LogStore::open_with(&dir.path().join("log"), 400).map_err(write_err)?;
        let sm_dir = dir.path().join("sm");
        std::fs::create_dir_all(&sm_dir).map_err(sto)?;
        let sm = ToySm {
            inner: Arc::new(Mutex::new(ToyInner {
                dir: sm_dir,
                last_applied: None,
                membership: StoredMembership::default(),
                snapshot: None,
                seq: 0,
            })),
        };
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_group_log() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    Suite::test_all(Builder).expect("openraft storage suite");
}

#[test]
fn a_log_that_starts_after_a_purge_point_keeps_one_segment_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open(dir.path()).expect("open");
    append(&s, entries(1, 0, 10));
    // A snapshot installed up to 100: everything held is purged, the log goes on at
    // 101, in a segment that follows the purge point.
    lock(&s.inner).purge(log_id(1, 1, 100)).expect("purge");
    append(&s, vec![batch(1, 101, 500)]);
    let files = segment_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with(segment_name(101)));
    drop(s);
    let s = LogStore::open(dir.path()).expect("reopen");
    assert_eq!(all(&s), vec![batch(1, 101, 500)]);
    assert_eq!(lock(&s.inner).purged, Some(log_id(1, 1, 100)));
}

#[test]
fn a_newest_segment_whose_header_never_reached_the_disk_is_removed() {
    for header in [[0u8; HEADER_LEN], {
        // The magic made it, the rest did not.
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(SEGMENT_MAGIC);
        h
    }] {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LogStore::open(dir.path()).expect("open");
        append(&s, entries(1, 0, 3));
        drop(s);
        // A crash inside the creation of the next segment: its size, not its bytes.
        let mut bytes = header.to_vec();
        bytes.resize(crate::oplog::PREALLOC as usize, 0);
        std::fs::write(dir.path().join(segment_name(3)), bytes).expect("write");
        let s = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(segment_files(dir.path()).len(), 1);
        assert_eq!(all(&s), entries(1, 0, 3));
        append(&s, entries(1, 3, 4));
        assert_eq!(all(&s), entries(1, 0, 4));
    }
    // A header that is neither (garbage over records) stays an error.
    let dir = tempfile::tempdir().expect("tempdir");
    let s = LogStore::open(dir.path()).expect("open");
    append(&s, entries(1, 0, 3));
    drop(s);
    let path = &segment_files(dir.path())[0];
    let mut bytes = std::fs::read(path).expect("read");
    bytes[20] ^= 0xff;
    std::fs::write(path, bytes).expect("damage");
    assert!(LogStore::open(dir.path()).is_err());
}
