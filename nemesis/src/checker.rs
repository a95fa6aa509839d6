//! The checker: a pure function of the final bytes of each file, the acknowledged
//! records and the prefixes readers saw, returning every [`Violation`].
//!
//! Rules (DESIGN.md invariants 5 and 3 seen from the outside):
//! 1. **Lost**: every acknowledged record is in its file, intact, with the acknowledged
//!    length ([`ViolationKind::LostAck`], [`ViolationKind::Corrupt`]).
//! 2. **Session order**: a session's records appear as seq 0, 1, 2, ... with no gap and
//!    no repeat ([`ViolationKind::SessionOrder`]): a writer appends them in that order
//!    and never writes one again.
//! 3. **Stale write**: sessions follow each other; once a record of session `S` is in
//!    the file, no record of a session that appeared *earlier* in the file comes after
//!    it ([`ViolationKind::StaleWrite`]: a fenced writer's bytes accepted after its
//!    successor's).
//! 4. **Garbage** (bytes that are not an intact record) only directly after a session's
//!    last record, before the next session's first record or the end of the file (an
//!    unacknowledged tail cut by a crash), never between two records of one session
//!    ([`ViolationKind::Garbage`]).
//! 5. **Dirty read**: every prefix a reader saw (length, digest) is a prefix of the final
//!    file ([`ViolationKind::DirtyRead`]: it read bytes that recovery later cut).
//!
//! Records carry their file id, so a record found in another file is
//! [`ViolationKind::Corrupt`].

use crate::history::{digest, Ack, ReadObservation};
use crate::record::{self, Item, SessionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What rule a [`Violation`] broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// An acknowledged record is not in its file.
    LostAck,
    /// A record is in the file but not as acknowledged (length, file).
    Corrupt,
    /// A session's records are out of order, repeated or have a gap.
    SessionOrder,
    /// A record of an earlier session follows a later session's record.
    StaleWrite,
    /// Unparseable bytes inside a session's records.
    Garbage,
    /// A reader saw bytes that are not the final file's.
    DirtyRead,
    /// `fsck` was not healthy after the heal (found by the run, not the checker).
    FsckUnhealthy,
    /// A process log contains a panic (found by the run, not the checker).
    Panic,
    /// Replicas of a chunk the master hands out disagree: one is at another version
    /// than the master's, holds another length than the committed one, or holds other
    /// bytes than the others (found by [`crate::replicas`], not the checker).
    DivergentReplicas,
    /// A replica the master hands out could not be read whole from its chunkserver
    /// (unreachable, absent, failed its checksums, served fewer bytes than it holds),
    /// or the master hands out no replica of a chunk (found by [`crate::replicas`]).
    UnreadableReplica,
    /// A file could not be closed by lease recovery, or not be read, after the heal
    /// (found by the run; its records are then not checked).
    Unavailable,
    /// A server exited by itself, not at a crash point (found by the run).
    ServerExited,
    /// The master's kept use of a directory's quota differs from what a walk of the
    /// directory counts (found by the run, `--admin` only).
    QuotaUse,
}

/// One broken rule, with where it was seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub file: Option<u32>,
    pub offset: Option<u64>,
    pub session: Option<SessionId>,
    pub seq: Option<u32>,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind)?;
        if let Some(file) = self.file {
            write!(f, " file f{file}")?;
        }
        if let Some(o) = self.offset {
            write!(f, " @{o}")?;
        }
        if let Some(s) = self.session {
            write!(f, " session {s}")?;
        }
        if let Some(q) = self.seq {
            write!(f, " seq {q}")?;
        }
        write!(f, ": {}", self.message)
    }
}

fn v(
    kind: ViolationKind,
    file: u32,
    offset: Option<u64>,
    session: Option<SessionId>,
    seq: Option<u32>,
    message: String,
) -> Violation {
    Violation {
        kind,
        file: Some(file),
        offset,
        session,
        seq,
        message,
    }
}

/// Where each record of a file is.
struct Found {
    /// (session, seq) -> (offset, header)
    at: HashMap<(SessionId, u32), (u64, record::RecordHeader)>,
    /// Each session's offset just past its last record.
    session_end: HashMap<SessionId, u64>,
}

/// Checks one file's bytes against rules 2-4; returns what it found for rule 1.
fn check_layout(file: u32, bytes: &[u8], out: &mut Vec<Violation>) -> Found {
    let items = record::parse(bytes);
    let mut found = Found {
        at: HashMap::new(),
        session_end: HashMap::new(),
    };
    // The session whose records are being read, with its last seq.
    let mut current: Option<(SessionId, u32)> = None;
    // Sessions that have been followed by another one.
    let mut finished: HashSet<SessionId> = HashSet::new();
    // Garbage seen since the last record (offset), for rule 4.
    let mut garbage: Option<(u64, u64)> = None;
    for item in items {
        let (offset, h) = match item {
            Item::Garbage { offset, len } => {
                garbage = Some((offset, len));
                continue;
            }
            Item::Record { offset, header } => (offset, header),
        };
        let s = h.session;
        if h.file != file {
            out.push(v(
                ViolationKind::Corrupt,
                file,
                Some(offset),
                Some(s),
                Some(h.seq),
                format!("a record of file f{} is in file f{file}", h.file),
            ));
        }
        if found.at.insert((s, h.seq), (offset, h)).is_some() {
            out.push(v(
                ViolationKind::SessionOrder,
                file,
                Some(offset),
                Some(s),
                Some(h.seq),
                "the record appears twice in the file".into(),
            ));
        }
        found.session_end.insert(s, offset + h.encoded_len() as u64);
        match current {
            Some((cur, last)) if cur == s => {
                if let Some((g, len)) = garbage {
                    out.push(v(
                        ViolationKind::Garbage,
                        file,
                        Some(g),
                        Some(s),
                        Some(h.seq),
                        format!(
                            "{len} unparseable bytes between records {last} and {} of one session",
                            h.seq
                        ),
                    ));
                }
                if h.seq != last.wrapping_add(1) {
                    out.push(v(
                        ViolationKind::SessionOrder,
                        file,
                        Some(offset),
                        Some(s),
                        Some(h.seq),
                        format!("record {} follows record {last} of the same session", h.seq),
                    ));
                }
                current = Some((s, h.seq));
            }
            _ if finished.contains(&s) => {
                let later = current.map(|(c, _)| c.to_string()).unwrap_or_default();
                out.push(v(
                    ViolationKind::StaleWrite,
                    file,
                    Some(offset),
                    Some(s),
                    Some(h.seq),
                    format!(
                        "a record of session {s} follows records of session {later}, which \
                         started after it in the file: a stale write was accepted"
                    ),
                ));
                // The later session stays current: its records may go on.
            }
            _ => {
                if let Some((cur, _)) = current {
                    finished.insert(cur);
                }
                if h.seq != 0 {
                    out.push(v(
                        ViolationKind::SessionOrder,
                        file,
                        Some(offset),
                        Some(s),
                        Some(h.seq),
                        format!(
                            "the session's first record in the file is {}; 0..{} are missing",
                            h.seq, h.seq
                        ),
                    ));
                }
                current = Some((s, h.seq));
            }
        }
        garbage = None;
    }
    found
}

/// Checks the final files against the acknowledged records and the reads.
///
/// `files` maps each file id to its final bytes; an acknowledged record of a file not
/// in it is lost.
pub fn check(
    files: &BTreeMap<u32, Vec<u8>>,
    acks: &[Ack],
    reads: &[ReadObservation],
) -> Vec<Violation> {
    let mut out = Vec::new();
    let found: BTreeMap<u32, Found> = files
        .iter()
        .map(|(&id, bytes)| (id, check_layout(id, bytes, &mut out)))
        .collect();
    for a in acks {
        let Some(f) = found.get(&a.file) else {
            out.push(v(
                ViolationKind::LostAck,
                a.file,
                None,
                Some(a.session),
                Some(a.seq),
                "acknowledged record of a file that does not exist".into(),
            ));
            continue;
        };
        match f.at.get(&(a.session, a.seq)) {
            Some((offset, h)) if h.payload_len != a.payload_len => out.push(v(
                ViolationKind::Corrupt,
                a.file,
                Some(*offset),
                Some(a.session),
                Some(a.seq),
                format!(
                    "acknowledged with {} payload bytes, the file's record has {}",
                    a.payload_len, h.payload_len
                ),
            )),
            Some(_) => {}
            None => {
                let after = f.session_end.get(&a.session).copied();
                let message = match after {
                    Some(end) => format!(
                        "acknowledged record is not in the file (the session's last record \
                         there ends at {end})"
                    ),
                    None => "acknowledged record is not in the file (no record of its \
                             session is)"
                        .to_string(),
                };
                out.push(v(
                    ViolationKind::LostAck,
                    a.file,
                    after,
                    Some(a.session),
                    Some(a.seq),
                    message,
                ));
            }
        }
    }
    for r in reads {
        let Some(bytes) = files.get(&r.file) else {
            out.push(v(
                ViolationKind::DirtyRead,
                r.file,
                None,
                None,
                None,
                format!(
                    "a reader read {} bytes of a file that does not exist",
                    r.len
                ),
            ));
            continue;
        };
        let final_len = bytes.len() as u64;
        if r.len > final_len {
            out.push(v(
                ViolationKind::DirtyRead,
                r.file,
                Some(final_len),
                None,
                None,
                format!(
                    "a reader saw {} bytes, the final file has {final_len}: bytes it read were cut",
                    r.len
                ),
            ));
        } else if digest(&bytes[..r.len as usize]) != r.digest {
            let offset = first_bad_record_offset(bytes, r.len);
            out.push(v(
                ViolationKind::DirtyRead,
                r.file,
                offset,
                None,
                None,
                format!(
                    "the {} bytes a reader saw differ from the final file's first {} bytes",
                    r.len, r.len
                ),
            ));
        }
    }
    out
}

/// The offset of the last record that starts below `len` (where a differing prefix
/// most likely went wrong), for the violation's location.
fn first_bad_record_offset(bytes: &[u8], len: u64) -> Option<u64> {
    record::parse(&bytes[..len as usize])
        .iter()
        .map(|i| match i {
            Item::Record { offset, .. } | Item::Garbage { offset, .. } => *offset,
        })
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RecordHeader;

    fn session(client: u32, counter: u32) -> SessionId {
        SessionId {
            client,
            nonce: 0,
            counter,
        }
    }

    fn rec(file: u32, s: SessionId, seq: u32, len: u32) -> Vec<u8> {
        RecordHeader {
            file,
            session: s,
            seq,
            payload_len: len,
        }
        .encode()
    }

    fn ack(file: u32, s: SessionId, seq: u32, len: u32) -> Ack {
        Ack {
            file,
            session: s,
            seq,
            payload_len: len,
        }
    }

    fn one(bytes: Vec<u8>) -> BTreeMap<u32, Vec<u8>> {
        BTreeMap::from([(0, bytes)])
    }

    fn kinds(vs: &[Violation]) -> Vec<ViolationKind> {
        vs.iter().map(|v| v.kind).collect()
    }

    /// Two sessions, each fully acknowledged, with a torn tail between them.
    fn clean_file() -> (Vec<u8>, Vec<Ack>) {
        let (a, b) = (session(1, 0), session(2, 0));
        let mut f = Vec::new();
        f.extend(rec(0, a, 0, 100));
        f.extend(rec(0, a, 1, 200));
        f.extend(&rec(0, a, 2, 300)[..50]); // a's unacknowledged torn tail
        f.extend(rec(0, b, 0, 10));
        f.extend(rec(0, b, 1, 20)); // complete but never acknowledged: fine
        (
            f,
            vec![ack(0, a, 0, 100), ack(0, a, 1, 200), ack(0, b, 0, 10)],
        )
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let (f, acks) = clean_file();
        let reads = vec![
            ReadObservation {
                file: 0,
                len: 0,
                digest: digest(&[]),
            },
            ReadObservation {
                file: 0,
                len: 120,
                digest: digest(&f[..120]),
            },
            ReadObservation {
                file: 0,
                len: f.len() as u64,
                digest: digest(&f),
            },
        ];
        assert_eq!(check(&one(f), &acks, &reads), vec![]);
    }

    #[test]
    fn a_torn_tail_at_the_end_of_the_file_is_allowed() {
        let a = session(1, 0);
        let mut f = rec(0, a, 0, 100);
        f.extend(&rec(0, a, 1, 100)[..70]);
        f.extend([0u8; 33]);
        assert_eq!(check(&one(f), &[ack(0, a, 0, 100)], &[]), vec![]);
    }

    #[test]
    fn garbage_at_the_start_before_the_first_session_is_allowed() {
        let a = session(1, 0);
        let mut f = rec(0, session(9, 9), 0, 100)[..40].to_vec();
        f.extend(rec(0, a, 0, 10));
        assert_eq!(check(&one(f), &[ack(0, a, 0, 10)], &[]), vec![]);
    }

    #[test]
    fn an_acknowledged_record_missing_from_the_file_is_lost() {
        let a = session(1, 0);
        let f = rec(0, a, 0, 100);
        let vs = check(&one(f.clone()), &[ack(0, a, 0, 100), ack(0, a, 1, 5)], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::LostAck]);
        assert_eq!(vs[0].seq, Some(1));
        assert_eq!(vs[0].offset, Some(f.len() as u64));
    }

    #[test]
    fn an_acknowledged_record_cut_in_half_is_lost() {
        let a = session(1, 0);
        let mut f = rec(0, a, 0, 100);
        f.extend(&rec(0, a, 1, 100)[..60]);
        let vs = check(&one(f), &[ack(0, a, 0, 100), ack(0, a, 1, 100)], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::LostAck]);
    }

    #[test]
    fn an_acknowledged_record_of_a_missing_file_is_lost() {
        let vs = check(&BTreeMap::new(), &[ack(3, session(1, 0), 0, 1)], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::LostAck]);
        assert_eq!(vs[0].file, Some(3));
    }

    #[test]
    fn a_flipped_byte_in_an_acknowledged_record_is_garbage_and_lost() {
        let a = session(1, 0);
        let mut f = rec(0, a, 0, 100);
        let at = f.len() + 50;
        f.extend(rec(0, a, 1, 100));
        f.extend(rec(0, a, 2, 100));
        f[at] ^= 0xff;
        let acks = [ack(0, a, 0, 100), ack(0, a, 1, 100), ack(0, a, 2, 100)];
        let vs = check(&one(f), &acks, &[]);
        let mut k = kinds(&vs);
        k.sort();
        assert_eq!(
            k,
            vec![
                ViolationKind::LostAck,
                ViolationKind::SessionOrder,
                ViolationKind::Garbage
            ]
        );
    }

    #[test]
    fn an_acknowledged_length_that_differs_is_corrupt() {
        let a = session(1, 0);
        let vs = check(&one(rec(0, a, 0, 100)), &[ack(0, a, 0, 99)], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::Corrupt]);
    }

    #[test]
    fn a_record_of_another_file_is_corrupt() {
        let a = session(1, 0);
        let vs = check(&one(rec(1, a, 0, 10)), &[], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::Corrupt]);
    }

    #[test]
    fn records_of_a_session_out_of_order_break_session_order() {
        let a = session(1, 0);
        let mut f = rec(0, a, 0, 10);
        f.extend(rec(0, a, 2, 10));
        f.extend(rec(0, a, 1, 10));
        let vs = check(&one(f), &[], &[]);
        assert_eq!(
            kinds(&vs),
            vec![ViolationKind::SessionOrder, ViolationKind::SessionOrder]
        );
    }

    #[test]
    fn a_repeated_record_breaks_session_order() {
        let a = session(1, 0);
        let mut f = rec(0, a, 0, 10);
        f.extend(rec(0, a, 0, 10));
        let vs = check(&one(f), &[ack(0, a, 0, 10)], &[]);
        assert_eq!(
            kinds(&vs),
            vec![ViolationKind::SessionOrder, ViolationKind::SessionOrder]
        );
    }

    #[test]
    fn a_session_starting_past_seq_0_breaks_session_order() {
        let a = session(1, 0);
        let vs = check(&one(rec(0, a, 3, 10)), &[], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::SessionOrder]);
        assert_eq!(vs[0].offset, Some(0));
    }

    #[test]
    fn a_fenced_sessions_record_after_its_successors_is_a_stale_write() {
        let (a, b) = (session(1, 0), session(2, 0));
        let mut f = rec(0, a, 0, 10);
        f.extend(rec(0, b, 0, 10));
        let stale_at = f.len() as u64;
        f.extend(rec(0, a, 1, 10));
        f.extend(rec(0, b, 1, 10));
        let vs = check(&one(f), &[ack(0, b, 0, 10), ack(0, b, 1, 10)], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::StaleWrite]);
        assert_eq!(vs[0].offset, Some(stale_at));
        assert_eq!(vs[0].session, Some(a));
        assert_eq!(vs[0].seq, Some(1));
    }

    #[test]
    fn a_stale_write_after_garbage_is_still_a_stale_write() {
        let (a, b) = (session(1, 0), session(2, 0));
        let mut f = rec(0, a, 0, 10);
        f.extend(rec(0, b, 0, 10));
        f.extend(b"xxxx");
        f.extend(rec(0, a, 1, 10));
        assert_eq!(
            kinds(&check(&one(f), &[], &[])),
            vec![ViolationKind::StaleWrite]
        );
    }

    #[test]
    fn three_sessions_in_turn_are_fine() {
        let (a, b, c) = (session(1, 0), session(2, 0), session(1, 1));
        let mut f = Vec::new();
        for s in [a, b, c] {
            f.extend(rec(0, s, 0, 10));
            f.extend(rec(0, s, 1, 10));
        }
        assert_eq!(check(&one(f), &[ack(0, c, 1, 10)], &[]), vec![]);
    }

    #[test]
    fn garbage_between_two_records_of_one_session_is_a_violation() {
        let a = session(1, 0);
        let mut f = rec(0, a, 0, 10);
        let g = f.len() as u64;
        f.extend([0u8; 16]);
        f.extend(rec(0, a, 1, 10));
        let vs = check(&one(f), &[], &[]);
        assert_eq!(kinds(&vs), vec![ViolationKind::Garbage]);
        assert_eq!(vs[0].offset, Some(g));
    }

    #[test]
    fn a_read_longer_than_the_final_file_is_dirty() {
        let a = session(1, 0);
        let f = rec(0, a, 0, 10);
        let mut seen = f.clone();
        seen.extend(rec(0, a, 1, 10));
        let r = ReadObservation {
            file: 0,
            len: seen.len() as u64,
            digest: digest(&seen),
        };
        let vs = check(&one(f), &[], &[r]);
        assert_eq!(kinds(&vs), vec![ViolationKind::DirtyRead]);
    }

    #[test]
    fn a_read_whose_bytes_differ_from_the_final_prefix_is_dirty() {
        let (a, b) = (session(1, 0), session(2, 0));
        let mut f = rec(0, a, 0, 10);
        let mut seen = f.clone();
        seen.extend(rec(0, a, 1, 10)); // a's tail, cut by recovery
        f.extend(rec(0, b, 0, 10)); // b's record in its place, same length
        let r = ReadObservation {
            file: 0,
            len: seen.len() as u64,
            digest: digest(&seen),
        };
        let vs = check(&one(f), &[], &[r]);
        assert_eq!(kinds(&vs), vec![ViolationKind::DirtyRead]);
    }

    #[test]
    fn a_read_of_a_missing_file_is_dirty() {
        let r = ReadObservation {
            file: 5,
            len: 0,
            digest: 0,
        };
        assert_eq!(
            kinds(&check(&BTreeMap::new(), &[], &[r])),
            vec![ViolationKind::DirtyRead]
        );
    }

    #[test]
    fn files_are_checked_independently() {
        let (a, b) = (session(1, 0), session(2, 0));
        let mut f0 = rec(0, a, 0, 10);
        f0.extend(rec(0, b, 0, 10));
        let mut f1 = rec(1, b, 1, 10);
        f1.extend(rec(1, a, 1, 10));
        // Different sessions per file in any order are fine only within each file's
        // own rules; here f1 starts b at seq 1 and a at seq 1: two order violations.
        let files = BTreeMap::from([(0, f0), (1, f1)]);
        let vs = check(&files, &[ack(0, a, 0, 10)], &[]);
        assert_eq!(
            kinds(&vs),
            vec![ViolationKind::SessionOrder, ViolationKind::SessionOrder]
        );
        assert!(vs.iter().all(|v| v.file == Some(1)));
    }
}
