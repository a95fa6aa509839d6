//! Tests of the operation log: its format, replay, checkpoints and group commit.

use super::commit::SWEEP_AFTER;
use super::*;
use std::sync::Arc;

fn payload(lsn: u64) -> Vec<u8> {
    format!("record number {lsn}").into_bytes()
}

fn collect(dir: &Path, after: u64) -> (Vec<(u64, Vec<u8>)>, ReplayStats) {
    let mut got = Vec::new();
    let stats = replay(dir, after, |lsn, p| {
        got.push((lsn, p.to_vec()));
        Ok(())
    })
    .expect("replay");
    (got, stats)
}

async fn write_records(dir: &Path, from: u64, to: u64) {
    let log = Oplog::open(dir, from).expect("open");
    for lsn in from..=to {
        log.append(lsn, &payload(lsn)).expect("append");
    }
    log.wait_durable(to).await.expect("durable");
    log.close().expect("close");
}

#[tokio::test]
async fn records_overwrite_preallocated_zeros_and_a_crash_leaves_them_to_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    let seg = last_segment(dir.path());
    let size = || std::fs::metadata(&seg).expect("stat").len();
    let prepared = size();
    assert_eq!(prepared, SEGMENT_MAGIC.len() as u64 + PREALLOC);
    for lsn in 1..=100 {
        log.append(lsn, &payload(lsn)).expect("append");
        log.wait_durable(lsn).await.expect("durable");
    }
    // Small batches never grow the file: each fdatasync overwrites zeros.
    assert_eq!(size(), prepared);
    log.halt(); // a crash: the zeros stay
    drop(log);
    let (got, stats) = collect(dir.path(), 0);
    assert_eq!(got.len(), 100);
    assert_eq!(got[99], (100, payload(100)));
    assert_eq!(stats.truncated_bytes, 0, "zeros are not a torn tail");
    assert!(stats.preallocated_bytes > 0);
    assert!(size() < prepared, "replay cut the zeros off");
    // The log goes on in a new segment; both replay.
    write_records(dir.path(), 101, 110).await;
    let (got, _) = collect(dir.path(), 0);
    assert_eq!(got.len(), 110);
}

#[tokio::test]
async fn a_batch_past_the_zeros_pads_further_and_rotation_cuts_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    let big = vec![7u8; 600 << 10];
    for lsn in 1..=3 {
        log.append(lsn, &big).expect("append");
        log.wait_durable(lsn).await.expect("durable");
    }
    let first = last_segment(dir.path());
    let len = std::fs::metadata(&first).expect("stat").len();
    assert!(
        len >= 3 * (600 << 10) + PREALLOC_MARGIN,
        "padded ahead: {len}"
    );
    log.rotate(4).expect("rotate");
    log.append(4, b"after").expect("append");
    log.wait_durable(4).await.expect("durable");
    let sealed = std::fs::metadata(&first).expect("stat").len();
    assert_eq!(
        sealed,
        SEGMENT_MAGIC.len() as u64 + 3 * (RECORD_HEADER as u64 + (600 << 10)),
        "a rotated segment holds only records"
    );
    log.close().expect("close");
    let (got, stats) = collect(dir.path(), 0);
    assert_eq!(got.len(), 4);
    assert_eq!(stats.preallocated_bytes, 0, "close cut the zeros");
}

#[tokio::test]
async fn zeros_in_an_older_segment_are_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 5).await;
    let seg = last_segment(dir.path());
    write_records(dir.path(), 6, 8).await;
    let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
    f.write_all(&[0u8; 64]).expect("zeros");
    drop(f);
    let err = replay(dir.path(), 0, |_, _| Ok(())).expect_err("refused");
    assert!(matches!(err, Error::CorruptLog { .. }), "{err}");
}

#[tokio::test]
async fn records_replay_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 20).await;
    let (got, stats) = collect(dir.path(), 0);
    assert_eq!(got.len(), 20);
    for (i, (lsn, p)) in got.iter().enumerate() {
        assert_eq!(*lsn, i as u64 + 1);
        assert_eq!(p, &payload(*lsn));
    }
    assert_eq!(stats.last_lsn, 20);
    assert_eq!(stats.truncated_bytes, 0);
    // A restart appends in a new segment; both replay.
    write_records(dir.path(), 21, 25).await;
    let (got, stats) = collect(dir.path(), 0);
    assert_eq!(got.len(), 25);
    assert_eq!(stats.segments, 2);
    // Records a checkpoint covers are skipped.
    let (got, _) = collect(dir.path(), 22);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![23, 24, 25]
    );
}

fn last_segment(dir: &Path) -> PathBuf {
    segments(dir).expect("list").pop().expect("a segment").1
}

#[tokio::test]
async fn torn_tail_half_record_is_truncated() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 5).await;
    let seg = last_segment(dir.path());
    let good_len = std::fs::metadata(&seg).expect("meta").len();
    let half = encode_record(6, &payload(6)).expect("encode");
    let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
    f.write_all(&half[..half.len() / 2]).expect("write");
    drop(f);
    let (got, stats) = collect(dir.path(), 0);
    assert_eq!(got.len(), 5);
    assert_eq!(stats.truncated_bytes, (half.len() / 2) as u64);
    assert_eq!(std::fs::metadata(&seg).expect("meta").len(), good_len);
    // The log continues after the cut.
    write_records(dir.path(), 6, 7).await;
    let (got, _) = collect(dir.path(), 0);
    assert_eq!(got.len(), 7);
}

#[tokio::test]
async fn torn_tail_garbage_and_bad_crc_are_truncated() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 3).await;
    let seg = last_segment(dir.path());
    let mut rec = encode_record(4, &payload(4)).expect("encode");
    let last = rec.len() - 1;
    rec[last] ^= 0xff; // bad CRC
    let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
    f.write_all(&rec).expect("write");
    f.write_all(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3])
        .expect("write");
    drop(f);
    let (got, stats) = collect(dir.path(), 0);
    assert_eq!(got.len(), 3);
    assert_eq!(stats.truncated_bytes, rec.len() as u64 + 7);
    // Pure garbage after the header only.
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 1).await;
    let seg = last_segment(dir.path());
    let mut f = OpenOptions::new().append(true).open(&seg).expect("open");
    f.write_all(&[0xff; 40]).expect("write");
    drop(f);
    let (got, _) = collect(dir.path(), 0);
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn damage_in_an_older_segment_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 3).await;
    write_records(dir.path(), 4, 6).await;
    let first = segments(dir.path()).expect("list")[0].1.clone();
    let mut bytes = std::fs::read(&first).expect("read");
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&first, bytes).expect("write");
    let err = replay(dir.path(), 0, |_, _| Ok(())).unwrap_err();
    assert!(matches!(err, Error::CorruptLog { .. }), "{err}");
}

#[tokio::test]
async fn a_gap_after_the_checkpoint_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 10, 12).await;
    let err = replay(dir.path(), 5, |_, _| Ok(())).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    // With the checkpoint covering up to 9 it is fine.
    let (got, _) = collect(dir.path(), 9);
    assert_eq!(got.len(), 3);
}

// Several workers: the leader blocks its own while others queue the next batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_shares_fsyncs_and_everything_is_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Oplog::open(dir.path(), 1).expect("open"));
    // The LSN counter stands in for the state lock: append order == LSN order.
    let next = Arc::new(Mutex::new(1u64));
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let log = log.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let lsn = {
                    let mut n = lock(&next);
                    let lsn = *n;
                    log.append(lsn, &t.to_be_bytes()).expect("append");
                    *n += 1;
                    lsn
                };
                log.wait_durable(lsn).await.expect("durable");
                assert!(log.durable_lsn() >= lsn);
            }
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    let stats = log.stats();
    assert_eq!(stats.records, 640);
    assert!(
        stats.fsyncs < stats.records,
        "group commit: {} fsyncs for {} records",
        stats.fsyncs,
        stats.records
    );
    log.close().expect("close");
    let (got, _) = collect(dir.path(), 0);
    assert_eq!(got.len(), 640);
}

#[tokio::test]
async fn rotation_checkpoint_and_trim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    for lsn in 1..=4 {
        log.append(lsn, &payload(lsn)).expect("append");
    }
    log.rotate(5).expect("rotate");
    for lsn in 5..=6 {
        log.append(lsn, &payload(lsn)).expect("append");
    }
    log.wait_durable(6).await.expect("durable");
    assert_eq!(segments(dir.path()).expect("list").len(), 2);
    write_checkpoint(dir.path(), 4, b"state up to 4").expect("checkpoint");
    assert_eq!(trim(dir.path(), 5).expect("trim"), 1);
    log.close().expect("close");
    let (lsn, state) = read_checkpoint(dir.path()).expect("read").expect("some");
    assert_eq!((lsn, state.as_slice()), (4, &b"state up to 4"[..]));
    let (got, stats) = collect(dir.path(), lsn);
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![5, 6]);
    assert_eq!(stats.last_lsn, 6);
}

#[test]
fn damaged_checkpoint_is_refused_and_stray_temp_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(read_checkpoint(dir.path()).expect("none").is_none());
    std::fs::write(dir.path().join(CHECKPOINT_TMP), b"half").expect("write");
    write_checkpoint(dir.path(), 9, b"hello").expect("write");
    let path = dir.path().join(CHECKPOINT_FILE);
    let mut bytes = std::fs::read(&path).expect("read");
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&path, bytes).expect("write");
    assert!(matches!(
        read_checkpoint(dir.path()),
        Err(Error::CorruptCheckpoint { .. })
    ));
    assert!(!dir.path().join(CHECKPOINT_TMP).exists());
}

#[tokio::test]
async fn appends_are_refused_after_close_and_halt_fails_waiters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    log.append(1, b"a").expect("append");
    log.close().expect("close");
    assert!(matches!(log.append(2, b"b"), Err(Error::ShuttingDown)));
    log.wait_durable(1)
        .await
        .expect("the drained record is durable");

    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    log.halt();
    assert!(log.wait_durable(1).await.is_err());
    assert!(log.append(3, b"x").is_err(), "out of order and stopped");
}

#[tokio::test]
async fn a_record_nobody_waits_for_is_written_by_the_sweeper() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    log.append(1, &payload(1)).expect("append");
    // No wait_durable: the request that queued it is gone. The bound is generous; the
    // sweeper writes after SWEEP_AFTER.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while log.durable_lsn() < 1 {
        assert!(std::time::Instant::now() < deadline, "never swept");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert_eq!(log.stats().swept, 1);
    assert_eq!(log.stats().records, 1);
    // Then the sweeper parks; a record queued after that wakes it.
    tokio::time::sleep(SWEEP_AFTER * 30).await;
    log.append(2, &payload(2)).expect("append");
    while log.durable_lsn() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "never swept after parking"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    log.halt();
    let (got, _) = collect(dir.path(), 0);
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
}

// Leaders, followers, rotations and a close racing each other: every record waited
// for is durable when its wait returns, and the segments replay all of them in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn concurrent_leaders_and_rotations_lose_and_reorder_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Oplog::open(dir.path(), 1).expect("open"));
    let next = Arc::new(Mutex::new(1u64));
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let log = log.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..50u64 {
                let lsn = {
                    let mut n = lock(&next);
                    if (t + i) % 17 == 0 {
                        log.rotate(*n).expect("rotate");
                    }
                    let lsn = *n;
                    log.append(lsn, &payload(lsn)).expect("append");
                    *n += 1;
                    lsn
                };
                // Some requests are dropped before they wait: the others or the
                // sweeper write their records.
                if i % 5 != 0 {
                    log.wait_durable(lsn).await.expect("durable");
                    assert!(log.durable_lsn() >= lsn);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    log.close().expect("close");
    let (got, _) = collect(dir.path(), 0);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=400).collect::<Vec<_>>()
    );
    for (lsn, p) in got {
        assert_eq!(p, payload(lsn));
    }
    assert!(segments(dir.path()).expect("list").len() > 2);
}

#[tokio::test]
async fn a_rotation_is_done_when_waited_for_even_with_nothing_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Oplog::open(dir.path(), 1).expect("open");
    log.append(1, &payload(1)).expect("append");
    log.wait_durable(1).await.expect("durable");
    // The checkpoint's order: rotate after the last record, which is durable already;
    // nothing follows to carry the rotation, and the checkpoint must not read or trim
    // before it is done.
    log.rotate(2).expect("rotate");
    log.wait_rotated(2).await.expect("rotated");
    let segs = segments(dir.path()).expect("list");
    assert_eq!(segs.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 2]);
    // The first segment is sealed: records only, no zeros.
    let len = std::fs::metadata(&segs[0].1).expect("stat").len();
    assert_eq!(
        len,
        (SEGMENT_MAGIC.len() + encode_record(1, &payload(1)).expect("enc").len()) as u64
    );
    log.close().expect("close");
}
