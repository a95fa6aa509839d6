//! A group of one, end to end on the real log store: records queued by concurrent
//! requests are committed in batches, in LSN order, survive a restart of the group, and
//! a stopped group fails its waiters instead of hanging them.

use super::group::Group;
use super::log_store::LogStore;
use super::proposer::Proposer;
use super::{Entry, TypeConfig};
use crate::namespace::ROOT;
use crate::oplog::DirLock;
use crate::state::{encode_record, Record};
use openraft::{EntryPayload, Raft, RaftLogReader};
use stampfs_proto::InodeId;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A started group and clones of its parts. The group itself must outlive them: its
/// openraft tasks run on its own runtime, which goes with it.
async fn start_group(dir: &Path) -> (Group, Raft<TypeConfig>, Arc<Proposer>, LogStore) {
    let lock = Arc::new(DirLock::acquire(dir).expect("lock"));
    let (g, _) = Group::open(dir, &lock).await.expect("a group of one");
    let (raft, proposer, log) = (g.raft.clone(), g.proposer.clone(), g.log.clone());
    (g, raft, proposer, log)
}

/// The generation a group of one leads in.
fn leading(p: &Proposer) -> u64 {
    p.generation().expect("a group of one leads")
}

/// The records the log holds, in order: (LSN, bytes).
async fn logged(log: &LogStore) -> Vec<(u64, Vec<u8>)> {
    let mut reader = log.clone();
    let entries: Vec<Entry> = reader.try_get_log_entries(0..).await.expect("read");
    let mut out = Vec::new();
    for e in entries {
        if let EntryPayload::Normal(b) = e.payload {
            for (i, r) in b.records.iter().enumerate() {
                out.push((b.first_lsn + i as u64, r.to_vec()));
            }
        }
    }
    out
}

/// Whether the commit point reaches `lsn` within 10 s, without waiting for it
/// ([`Proposer::wait_committed`] would submit).
async fn committed_soon(raft: &Raft<TypeConfig>, proposer: &Proposer, lsn: u64) -> bool {
    let mut rx = raft.metrics();
    tokio::time::timeout(Duration::from_secs(10), async {
        while proposer.committed_lsn() < lsn {
            let _ = rx.changed().await;
        }
    })
    .await
    .is_ok()
}

/// A runtime like the master's on this machine: two workers.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A real record (a restart replays it into the master's state): a directory under
/// the root, its inode numbered after the LSN.
fn record(lsn: u64) -> Vec<u8> {
    encode_record(&Record::Mkdir {
        parent: ROOT,
        dirs: vec![(format!("d{lsn}"), InodeId(1000 + lsn))],
        mtime_ms: 0,
    })
    .expect("encode")
}

#[test]
fn concurrent_records_commit_in_batches_in_lsn_order_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = two_workers();
    let (tasks, per_task) = (16u64, 25u64);
    let total = tasks * per_task;
    rt.block_on(async {
        let (_group, raft, proposer, log) = start_group(dir.path()).await;
        // The master's state lock: LSNs are taken and queued under it, in order.
        let next = Arc::new(Mutex::new(0u64));
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let (proposer, next) = (proposer.clone(), next.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..per_task {
                    let lsn = {
                        let mut n = next.lock().expect("lock");
                        *n += 1;
                        proposer.append(*n, &record(*n)).expect("queue");
                        *n
                    };
                    proposer
                        .wait_committed(lsn, leading(&proposer))
                        .await
                        .expect("committed");
                    assert!(proposer.committed_lsn() >= lsn);
                }
            }));
        }
        for h in handles {
            h.await.expect("task");
        }
        let got = logged(&log).await;
        let want: Vec<_> = (1..=total).map(|l| (l, record(l))).collect();
        assert_eq!(got, want, "every record once, in LSN order");
        let entries = log
            .clone()
            .try_get_log_entries(0..)
            .await
            .expect("read")
            .len() as u64;
        assert!(
            entries < total,
            "{total} records in {entries} entries: concurrent records share batches"
        );
        // A record nobody waits for is committed by the sweeper.
        {
            let mut n = next.lock().expect("lock");
            *n += 1;
            proposer.append(*n, &record(*n)).expect("queue");
        }
        assert!(
            committed_soon(&raft, &proposer, total + 1).await,
            "the sweeper submitted the lone record"
        );
        proposer.stop();
        raft.shutdown().await.expect("shutdown");
    });
    // The group restarts from its directory: same records, and it goes on after them.
    rt.block_on(async {
        let (_group, raft, proposer, log) = start_group(dir.path()).await;
        let got = logged(&log).await;
        assert_eq!(got.len() as u64, total + 1);
        assert_eq!(got.last(), Some(&(total + 1, record(total + 1))));
        // The restarted state machine learned the commit point from the log.
        assert!(
            committed_soon(&raft, &proposer, total + 1).await,
            "replayed up to the last record"
        );
        let lsn = total + 2;
        proposer.append(lsn, &record(lsn)).expect("queue");
        proposer
            .wait_committed(lsn, leading(&proposer))
            .await
            .expect("committed");
        assert_eq!(logged(&log).await.last(), Some(&(lsn, record(lsn))));
        // Out of order is refused; after a stop nothing is taken.
        assert!(proposer.append(lsn + 2, b"gap").is_err());
        proposer.stop();
        assert!(proposer.append(lsn + 1, b"late").is_err());
        raft.shutdown().await.expect("shutdown");
    });
}

#[test]
fn waiters_fail_instead_of_hanging_when_the_group_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = two_workers();
    rt.block_on(async {
        let (_group, raft, proposer, _log) = start_group(dir.path()).await;
        let generation = leading(&proposer);
        proposer.append(1, &record(1)).expect("queued");
        raft.shutdown().await.expect("shutdown");
        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            proposer.wait_committed(1, generation),
        )
        .await
        .expect("answered, not hung");
        if let Err(err) = waited {
            let said = err.to_string();
            assert!(
                said.contains("stopped") || said.contains("lost the lead"),
                "{err}"
            );
        }
        // Committed or not, the stopped group takes nothing more.
        let refused = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = proposer.append(2, &record(2)) {
                    return e;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a stopped group refuses records");
        assert!(!refused.to_string().is_empty());
    });
}

#[test]
fn a_queue_over_the_batch_bound_goes_in_several_entries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (_group, raft, proposer, log) = start_group(dir.path()).await;
        // Five records of 400 KiB queued before anyone waits: 2 MB, over the 1 MiB
        // bound, so they cannot all go in one entry; one of 2 MiB goes alone.
        let big = |lsn: u64| vec![lsn as u8; 400 << 10];
        for lsn in 1..=5 {
            proposer.append(lsn, &big(lsn)).expect("queue");
        }
        let huge = vec![6u8; 2 << 20];
        proposer.append(6, &huge).expect("queue");
        proposer
            .wait_committed(6, leading(&proposer))
            .await
            .expect("committed");
        let mut reader = log.clone();
        let entries: Vec<Entry> = reader.try_get_log_entries(0..).await.expect("read");
        let batches: Vec<(u64, usize, usize)> = entries
            .iter()
            .filter_map(|e| match &e.payload {
                EntryPayload::Normal(b) => Some((
                    b.first_lsn,
                    b.records.len(),
                    b.records.iter().map(|r| r.len()).sum(),
                )),
                _ => None,
            })
            .collect();
        assert!(batches.len() >= 3, "{batches:?}");
        for (first, n, bytes) in &batches {
            assert!(
                *bytes <= super::proposer::MAX_BATCH_BYTES || *n == 1,
                "batch at {first}: {n} records, {bytes} bytes"
            );
        }
        let got = logged(&log).await;
        let mut want: Vec<(u64, Vec<u8>)> = (1..=5).map(|l| (l, big(l))).collect();
        want.push((6, huge));
        assert_eq!(got, want);
        proposer.stop();
        raft.shutdown().await.expect("shutdown");
    });
}
