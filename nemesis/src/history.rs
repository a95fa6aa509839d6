//! The clients' histories: what each was acknowledged and what it read, logged outside
//! stampfs as JSON lines, one file per client incarnation, each line fsynced before the
//! client goes on.
//!
//! A record is *acknowledged* once its `hsync` returned `Ok`; the [`Event::Ack`] line is
//! written after that. A client killed between the two leaves the record unacknowledged
//! in the history (it may or may not be in the file: both are fine). A torn last line
//! (killed mid-write) is ignored when loading.

use crate::record::SessionId;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A writer session opened `file` (for append, or for writes anywhere: the slot
    /// file), at `at_us` (microseconds of the system clock, logged once the lease was
    /// taken; 0 in histories of older versions).
    SessionStart {
        file: u32,
        session: SessionId,
        #[serde(default)]
        at_us: u64,
    },
    /// Record `seq` of `session` is about to be written over slot `slot` of the slot
    /// file (logged, durably, before the write is issued: every write that may have
    /// reached the storage has one), at `at_us`.
    SlotWrite {
        session: SessionId,
        seq: u32,
        slot: u32,
        at_us: u64,
    },
    /// That write was hsynced.
    SlotAck {
        session: SessionId,
        seq: u32,
        slot: u32,
    },
    /// Record `seq` of `session` (with `payload_len` payload bytes) was hsynced.
    Ack {
        file: u32,
        session: SessionId,
        seq: u32,
        payload_len: u32,
    },
    /// The session ended: `closed`, `fenced`, or another failure.
    SessionEnd {
        file: u32,
        session: SessionId,
        outcome: String,
    },
    /// A reader read the first `len` bytes of `file`; `digest` is their [`digest`].
    Read { file: u32, len: u64, digest: u64 },
}

/// The digest of a prefix a reader saw: 64-bit FNV-1a.
///
/// Not CRC32: the files are made of records that each end in their own CRC32, and
/// CRC32 is linear, so the CRC32 of a prefix of whole records depends only on the
/// records' lengths, not on their contents (a reader that saw a record later replaced
/// by another of the same length would go unnoticed).
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// An acknowledged record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub file: u32,
    pub session: SessionId,
    pub seq: u32,
    pub payload_len: u32,
}

/// A prefix a reader saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadObservation {
    pub file: u32,
    pub len: u64,
    pub digest: u64,
}

/// A write over a slot of the slot file (see [`crate::slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotWrite {
    pub session: SessionId,
    pub seq: u32,
    pub slot: u32,
    /// When its intent was logged (before the write was issued).
    pub at_us: u64,
    pub acked: bool,
}

/// Microseconds of the system clock (shared by every process of a run: one host).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Every client's history, merged.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub acks: Vec<Ack>,
    /// Writes over the slot file's slots, acknowledged or not.
    pub slot_writes: Vec<SlotWrite>,
    /// When each session started (its lease taken), by its `SessionStart`.
    pub session_starts: std::collections::HashMap<SessionId, u64>,
    pub reads: Vec<ReadObservation>,
    pub sessions: u64,
    pub fenced_sessions: u64,
    /// Lines that did not parse (torn last lines of killed clients).
    pub torn_lines: u64,
}

impl History {
    /// Adds one event.
    pub fn push(&mut self, e: Event) {
        match e {
            Event::SessionStart { session, at_us, .. } => {
                self.sessions += 1;
                self.session_starts.insert(session, at_us);
            }
            Event::SlotWrite {
                session,
                seq,
                slot,
                at_us,
            } => self.slot_writes.push(SlotWrite {
                session,
                seq,
                slot,
                at_us,
                acked: false,
            }),
            Event::SlotAck { session, seq, slot } => {
                if let Some(w) = self
                    .slot_writes
                    .iter_mut()
                    .rev()
                    .find(|w| w.session == session && w.seq == seq && w.slot == slot)
                {
                    w.acked = true;
                }
            }
            Event::Ack {
                file,
                session,
                seq,
                payload_len,
            } => self.acks.push(Ack {
                file,
                session,
                seq,
                payload_len,
            }),
            Event::SessionEnd { outcome, .. } => {
                if outcome == "fenced" {
                    self.fenced_sessions += 1;
                }
            }
            Event::Read { file, len, digest } => {
                self.reads.push(ReadObservation { file, len, digest })
            }
        }
    }

    /// Adds the events of one history file's text.
    pub fn extend_from_text(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Event>(line) {
                Ok(e) => self.push(e),
                Err(_) => self.torn_lines += 1,
            }
        }
    }

    /// Loads every `*.jsonl` file in `dir`.
    pub fn load_dir(dir: &Path) -> Result<History> {
        let mut h = History::default();
        let entries = std::fs::read_dir(dir).map_err(Error::io(dir))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        paths.sort();
        for p in paths {
            let text = std::fs::read_to_string(&p).map_err(Error::io(&p))?;
            h.extend_from_text(&text);
        }
        Ok(h)
    }
}

/// Appends events to one history file, each line fsynced before `log` returns.
pub struct HistoryWriter {
    path: PathBuf,
    /// Serializes the writer and reader tasks' lines; held only for one write + fsync.
    file: Mutex<std::fs::File>,
}

impl HistoryWriter {
    /// Opens (creates) `path` for appending.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(Error::io(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    /// Writes one event as a line and makes it durable.
    pub fn log(&self, e: &Event) -> Result<()> {
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        (&*f).write_all(&line).map_err(Error::io(&self.path))?;
        f.sync_data().map_err(Error::io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_sees_contents_that_crc32_of_whole_records_does_not() {
        use crate::record::RecordHeader;
        let rec = |client| {
            RecordHeader {
                file: 0,
                session: SessionId {
                    client,
                    nonce: 0,
                    counter: 0,
                },
                seq: 0,
                payload_len: 10,
            }
            .encode()
        };
        let (a, b) = (rec(1), rec(2));
        assert_ne!(a, b);
        // The pitfall the digest avoids: equal CRC32 for different records.
        assert_eq!(crc32fast::hash(&a), crc32fast::hash(&b));
        assert_ne!(digest(&a), digest(&b));
    }

    #[test]
    fn events_round_trip_and_a_torn_line_is_counted_not_fatal() {
        let s = SessionId {
            client: 1,
            nonce: 2,
            counter: 3,
        };
        let ack = Event::Ack {
            file: 0,
            session: s,
            seq: 5,
            payload_len: 9,
        };
        let mut text = serde_json::to_string(&ack).unwrap_or_default();
        text.push('\n');
        text.push_str(r#"{"kind":"read","file":1,"len":10"#); // torn
        let mut h = History::default();
        h.extend_from_text(&text);
        assert_eq!(h.acks.len(), 1);
        assert_eq!(h.acks[0].seq, 5);
        assert_eq!(h.torn_lines, 1);
    }

    #[test]
    fn the_writer_appends_lines_a_loader_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = HistoryWriter::open(&dir.path().join("c0.jsonl")).expect("open");
        w.log(&Event::Read {
            file: 1,
            len: 7,
            digest: 42,
        })
        .expect("log");
        w.log(&Event::SessionEnd {
            file: 1,
            session: SessionId::default(),
            outcome: "fenced".into(),
        })
        .expect("log");
        let h = History::load_dir(dir.path()).expect("load");
        assert_eq!(
            h.reads,
            vec![ReadObservation {
                file: 1,
                len: 7,
                digest: 42
            }]
        );
        assert_eq!(h.fenced_sessions, 1);
    }
}
