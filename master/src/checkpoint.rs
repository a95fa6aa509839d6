//! Checkpoints built **off the state lock**, from the disk, as a restart would build
//! them.
//!
//! Encoding the live state needs it frozen: at a million chunks that is a stall of
//! a few hundred milliseconds for every request. Instead, the master only rotates the
//! log under the lock (records up to `lsn` stay in the older segments, later ones go
//! to a new segment) and waits until `lsn` is durable; then a blocking thread
//! ([`build`]) decodes the previous checkpoint, replays the durable records after it up
//! to exactly `lsn` with the same `apply` that replay at start-up uses, and encodes
//! the result. That is, by construction, the state a master restarted at `lsn` would
//! have (invariant 1 rests on replay being faithful already). It costs a second copy
//! of the persisted state for the time of the build, and CPU, never the lock.
//!
//! The reader here never truncates anything: every record up to `lsn` is durable and
//! must be whole, so a short or corrupt record below it is an error (and the master
//! falls back to encoding under the lock, logging why). The segment the log
//! is appending to starts above `lsn` and is never opened.

use crate::error::{Error, Result};
use crate::oplog::{self, MAX_RECORD_LEN, SEGMENT_MAGIC};
use crate::state::{decode_record, MasterState, Settings};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// The checkpoint payload of the state at `lsn`: the previous checkpoint in `dir`
/// plus the durable records after it, up to `lsn`.
pub fn build(dir: &Path, settings: Settings, lsn: u64) -> Result<Vec<u8>> {
    let mut st = match oplog::read_checkpoint(dir)? {
        Some((_, bytes)) => MasterState::decode_snapshot(settings, &bytes, 0)?,
        None => MasterState::new(settings),
    };
    if st.last_lsn > lsn {
        return Err(corrupt(
            dir,
            format!("the checkpoint is at LSN {} past {lsn}", st.last_lsn),
        ));
    }
    let from = st.last_lsn;
    replay_durable(dir, from, lsn, |l, bytes| {
        let rec = decode_record(bytes).map_err(|e| Error::Replay {
            lsn: l,
            reason: e.to_string(),
        })?;
        st.apply(l, &rec, 0)
            .map_err(|reason| Error::Replay { lsn: l, reason })
    })?;
    if st.last_lsn != lsn {
        return Err(corrupt(
            dir,
            format!("the log ends at LSN {} before {lsn}", st.last_lsn),
        ));
    }
    st.encode_snapshot()
}

fn corrupt(dir: &Path, reason: String) -> Error {
    Error::CorruptLog {
        path: dir.to_path_buf(),
        offset: 0,
        reason,
    }
}

/// Hands every record with an LSN in `(after, upto]` to `apply`, in order, from the
/// segments that can hold them. Strict: any gap, bad frame or checksum is an error.
fn replay_durable(
    dir: &Path,
    after: u64,
    upto: u64,
    mut apply: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let segs = oplog::segments(dir)?;
    let mut expect = after + 1;
    for (i, (first, path)) in segs.iter().enumerate() {
        if *first > upto {
            break;
        }
        // A segment ends where the next one starts: skip those wholly at or below
        // `after`.
        if segs.get(i + 1).is_some_and(|(next, _)| *next <= expect) {
            continue;
        }
        let bad = |reason: String| Error::CorruptLog {
            path: path.clone(),
            offset: 0,
            reason,
        };
        let io = |e: std::io::Error| Error::io(format!("read {}", path.display()), e);
        let mut r = BufReader::with_capacity(
            1 << 20,
            File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?,
        );
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(io)?;
        if &magic != SEGMENT_MAGIC {
            return Err(bad("not a stampfs log segment".into()));
        }
        let mut payload = Vec::new();
        while expect <= upto {
            let mut head = [0u8; 16];
            match r.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(io(e)),
            }
            let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            let mut lsn_bytes = [0u8; 8];
            lsn_bytes.copy_from_slice(&head[8..16]);
            let lsn = u64::from_be_bytes(lsn_bytes);
            if !(8..=MAX_RECORD_LEN + 8).contains(&len) {
                return Err(bad(format!("impossible record length {len} at LSN {lsn}")));
            }
            payload.resize(len - 8, 0);
            r.read_exact(&mut payload).map_err(io)?;
            let mut h = crc32fast::Hasher::new();
            h.update(&lsn_bytes);
            h.update(&payload);
            if h.finalize() != crc {
                return Err(bad(format!("record checksum mismatch at LSN {lsn}")));
            }
            if lsn < expect {
                continue;
            }
            if lsn != expect {
                return Err(bad(format!("LSN {lsn} where {expect} was expected")));
            }
            apply(lsn, &payload)?;
            expect += 1;
        }
        if expect > upto {
            return Ok(());
        }
    }
    if expect <= upto {
        return Err(corrupt(
            dir,
            format!("records {expect}..={upto} are not in the log"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::oplog::Oplog;
    use crate::state::{encode_record, Record};
    use stampfs_proto::{ChunkserverId, InodeId};

    fn settings() -> Settings {
        Settings::for_tests()
    }

    fn mkdir(st: &mut MasterState, log: &Oplog, name: &str) {
        let ino = InodeId(st.ns.next_inode().0);
        let lsn = st
            .commit(
                Record::Mkdir {
                    parent: crate::namespace::ROOT,
                    dirs: vec![(name.to_string(), ino)],
                    mtime_ms: 1,
                },
                0,
            )
            .expect("commit");
        for (l, bytes) in st.take_outbox() {
            log.append(l, &bytes).expect("append");
        }
        assert_eq!(lsn, st.last_lsn);
    }

    #[tokio::test]
    async fn a_checkpoint_built_from_the_log_is_the_live_state_at_its_lsn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Oplog::open(dir.path(), 1).expect("log");
        let mut live = MasterState::new(settings());
        for i in 0..10 {
            mkdir(&mut live, &log, &format!("d{i}"));
        }
        let rec = Record::RegisterChunkserver {
            id: ChunkserverId(1),
            addr: "a".into(),
        };
        encode_record(&rec).expect("encodes");
        live.commit(rec, 0).expect("commit");
        for (l, bytes) in live.take_outbox() {
            log.append(l, &bytes).expect("append");
        }
        // First checkpoint: from nothing, over a rotation in the middle.
        log.rotate(live.last_lsn + 1).expect("rotate");
        let lsn = live.last_lsn;
        log.wait_durable(lsn).await.expect("durable");
        let bytes = build(dir.path(), settings(), lsn).expect("build");
        let back = MasterState::decode_snapshot(settings(), &bytes, 0).expect("decode");
        assert!(back.same_persisted(&live));
        oplog::write_checkpoint(dir.path(), lsn, &bytes).expect("write");
        // Later records, some past the LSN asked for (in the segment being written).
        for i in 10..20 {
            mkdir(&mut live, &log, &format!("d{i}"));
        }
        let lsn2 = live.last_lsn;
        log.rotate(lsn2 + 1).expect("rotate");
        mkdir(&mut live, &log, "later");
        log.wait_durable(live.last_lsn).await.expect("durable");
        let snap = build(dir.path(), settings(), lsn2).expect("build");
        let back = MasterState::decode_snapshot(settings(), &snap, 0).expect("decode");
        assert_eq!(back.last_lsn, lsn2);
        assert_eq!(
            back.ns.len(),
            live.ns.len() - 1,
            "the later record is not in"
        );
        assert!(back.resolve_path("/d19").is_ok() && back.resolve_path("/later").is_err());
        // Asking past the log is an error, not a short checkpoint.
        assert!(build(dir.path(), settings(), live.last_lsn + 5).is_err());
        log.close().expect("close");
    }
}
