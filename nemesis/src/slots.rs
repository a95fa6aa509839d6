//! Overwrites: the slot file and its checker.
//!
//! Besides the shared append files, every run has one **slot file** (`DIR/s0`, file id
//! [`SLOT_FILE`]): [`SLOTS`] slots of [`SLOT_LEN`] bytes, over four chunks of
//! [`SLOT_CHUNK`] bytes, so that a session's writer moves between chunks (each move
//! commits the chunk it leaves and bumps the one it goes to).
//! A slot session opens it for writes anywhere and writes a few records, each over a
//! random slot (a whole [`crate::record`] of exactly `SLOT_LEN` bytes at `slot ×
//! SLOT_LEN`), each followed by `hsync`. Before each write it logs a
//! [`Event::SlotWrite`](crate::history::Event::SlotWrite) intent (durably: every write
//! that may reach the storage has one) and after the `hsync` a `SlotAck`. A slot past
//! the file's end is reached through zeros (the writer fills the gap).
//!
//! The checker ([`check`]) judges each slot of the final file on its own, with no
//! global clock beyond the system clock of the one host (the times of a session's
//! start and of each intent):
//!
//! 1. **Intact**: a slot holds zeros, or an intact record whose intent names this slot
//!    ([`ViolationKind::Corrupt`] otherwise). Bytes that are neither are allowed only
//!    when some write to the slot was not acknowledged (a torn, unacknowledged
//!    overwrite may leave each byte old or new).
//! 2. **Not lost**: after an acknowledged write `A` of session `S`, the slot holds `A`,
//!    or a later write of `S` (higher seq), or a write of a session that took the lease
//!    after `A` was issued; zeros only when nothing was ever acknowledged there
//!    ([`ViolationKind::LostAck`]).
//! 3. **No stale write**: a record of a session that held the lease *before* `A` was
//!    issued (it logged its start before `A`'s intent) never holds the slot: its write
//!    was either overwritten by `A` or accepted after `S` took the lease
//!    ([`ViolationKind::StaleWrite`]). Lease exclusivity is what makes this sound: `A`
//!    was accepted, so `S` held the lease from before `A`'s intent to its ack, and a
//!    session that took the lease earlier had lost it before `S` took it.
//!
//! A session that logs its start late (frozen between taking the lease and logging)
//! only makes rule 3 weaker, never wrong: it looks later than it was.

use crate::checker::{Violation, ViolationKind};
use crate::history::SlotWrite;
use crate::record::{self, RecordHeader, SessionId, HEADER_LEN, TRAILER_LEN};
use std::collections::HashMap;

/// The slot file's id (in records and violations), apart from the append files'.
pub const SLOT_FILE: u32 = 100;
/// Slots in the slot file.
pub const SLOTS: u32 = 64;
/// Bytes of a slot, and of every record written over one.
pub const SLOT_LEN: usize = 512;
/// The slot file's chunk size: 16 slots per chunk.
pub const SLOT_CHUNK: u64 = 8 << 10;

/// The slot file's path under `dir`.
pub fn path(dir: &str) -> String {
    format!("{dir}/s0")
}

/// Record `seq` of `session`, sized to fill one slot exactly.
pub fn record(session: SessionId, seq: u32) -> RecordHeader {
    RecordHeader {
        file: SLOT_FILE,
        session,
        seq,
        payload_len: (SLOT_LEN - HEADER_LEN - TRAILER_LEN) as u32,
    }
}

/// The offset of slot `slot`.
pub fn offset(slot: u32) -> u64 {
    u64::from(slot) * SLOT_LEN as u64
}

fn violation(
    kind: ViolationKind,
    slot: u32,
    session: Option<SessionId>,
    seq: Option<u32>,
    message: String,
) -> Violation {
    Violation {
        kind,
        file: Some(SLOT_FILE),
        offset: Some(offset(slot)),
        session,
        seq,
        message: format!("slot {slot}: {message}"),
    }
}

/// Checks the final bytes of the slot file against every write over it and the
/// sessions' start times (see the module docs).
pub fn check(
    bytes: &[u8],
    writes: &[SlotWrite],
    starts: &HashMap<SessionId, u64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_slot: HashMap<u32, Vec<&SlotWrite>> = HashMap::new();
    for w in writes {
        by_slot.entry(w.slot).or_default().push(w);
    }
    let slots = (bytes.len().div_ceil(SLOT_LEN) as u32).max(
        by_slot
            .keys()
            .copied()
            .max()
            .map_or(0, |s| s.saturating_add(1)),
    );
    for slot in 0..slots {
        let at = offset(slot) as usize;
        let cell = bytes
            .get(at..(at + SLOT_LEN).min(bytes.len()))
            .unwrap_or(&[]);
        let ws = by_slot.get(&slot).map(Vec::as_slice).unwrap_or(&[]);
        check_slot(slot, cell, ws, starts, &mut out);
    }
    out
}

fn check_slot(
    slot: u32,
    cell: &[u8],
    writes: &[&SlotWrite],
    starts: &HashMap<SessionId, u64>,
    out: &mut Vec<Violation>,
) {
    let zeros = cell.iter().all(|&b| b == 0);
    let held = record::decode(cell).filter(|h| cell.len() == h.encoded_len());
    let acked: Vec<&&SlotWrite> = writes.iter().filter(|w| w.acked).collect();
    let unacked = writes.iter().any(|w| !w.acked);
    let Some(h) = held else {
        if zeros {
            if let Some(a) = acked.first() {
                out.push(violation(
                    ViolationKind::LostAck,
                    slot,
                    Some(a.session),
                    Some(a.seq),
                    format!(
                        "holds zeros, but {} acknowledged write(s) went there",
                        acked.len()
                    ),
                ));
            }
        } else if !unacked {
            out.push(violation(
                ViolationKind::Corrupt,
                slot,
                None,
                None,
                "holds bytes that are no intact record, and every write there was acknowledged"
                    .into(),
            ));
        }
        return;
    };
    let Some(mine) = writes
        .iter()
        .find(|w| w.session == h.session && w.seq == h.seq)
    else {
        out.push(violation(
            ViolationKind::Corrupt,
            slot,
            Some(h.session),
            Some(h.seq),
            "holds a record that no intent wrote to this slot".into(),
        ));
        return;
    };
    if h.file != SLOT_FILE {
        out.push(violation(
            ViolationKind::Corrupt,
            slot,
            Some(h.session),
            Some(h.seq),
            format!("holds a record of file {}", h.file),
        ));
    }
    for a in &acked {
        if a.session == mine.session {
            if mine.seq < a.seq {
                out.push(violation(
                    ViolationKind::LostAck,
                    slot,
                    Some(a.session),
                    Some(a.seq),
                    format!(
                        "holds seq {} of the same session, written before this acknowledged one",
                        mine.seq
                    ),
                ));
            }
            continue;
        }
        // Another session's record: fine if that session took the lease after `a`
        // was issued; a session that had started before is a stale write (or `a`
        // lost). Without a start time, it is not judged.
        let Some(&start) = starts.get(&mine.session) else {
            continue;
        };
        if start != 0 && start < a.at_us {
            out.push(violation(
                ViolationKind::StaleWrite,
                slot,
                Some(mine.session),
                Some(mine.seq),
                format!(
                    "holds a record of a session that started {} µs before {} seq {}, \
                     acknowledged here, was issued",
                    a.at_us - start,
                    a.session,
                    a.seq
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(counter: u32) -> SessionId {
        SessionId {
            client: 1,
            nonce: 7,
            counter,
        }
    }

    fn w(session: u32, seq: u32, slot: u32, at_us: u64, acked: bool) -> SlotWrite {
        SlotWrite {
            session: s(session),
            seq,
            slot,
            at_us,
            acked,
        }
    }

    /// A file of `n` slots with `(slot, session, seq)` records in them, zeros elsewhere.
    fn file(n: u32, recs: &[(u32, u32, u32)]) -> Vec<u8> {
        let mut b = vec![0u8; n as usize * SLOT_LEN];
        for &(slot, session, seq) in recs {
            let r = record(s(session), seq).encode();
            let at = offset(slot) as usize;
            b[at..at + SLOT_LEN].copy_from_slice(&r);
        }
        b
    }

    fn starts(v: &[(u32, u64)]) -> HashMap<SessionId, u64> {
        v.iter().map(|&(c, t)| (s(c), t)).collect()
    }

    fn kinds(v: &[Violation]) -> Vec<ViolationKind> {
        v.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_record_fills_a_slot_exactly() {
        assert_eq!(record(s(0), 0).encode().len(), SLOT_LEN);
    }

    #[test]
    fn the_last_acknowledged_write_or_a_later_one_passes() {
        let writes = [
            w(0, 0, 3, 100, true),
            w(0, 1, 3, 200, true),
            w(1, 0, 3, 900, false),
        ];
        let st = starts(&[(0, 50), (1, 800)]);
        assert!(check(&file(4, &[(3, 0, 1)]), &writes, &st).is_empty());
        // The later session's unacknowledged write landed: fine too.
        assert!(check(&file(4, &[(3, 1, 0)]), &writes, &st).is_empty());
    }

    #[test]
    fn an_older_write_of_the_same_session_is_a_lost_ack() {
        let writes = [w(0, 0, 3, 100, true), w(0, 1, 3, 200, true)];
        let st = starts(&[(0, 50)]);
        assert_eq!(
            kinds(&check(&file(4, &[(3, 0, 0)]), &writes, &st)),
            vec![ViolationKind::LostAck]
        );
    }

    #[test]
    fn a_session_that_started_before_an_acknowledged_write_must_not_hold_the_slot() {
        // Session 0 started at 50 and was fenced; session 1 took over at 400 and its
        // write at 500 was acknowledged; session 0's late write must not be there.
        let writes = [w(0, 0, 2, 600, false), w(1, 0, 2, 500, true)];
        let st = starts(&[(0, 50), (1, 400)]);
        assert_eq!(
            kinds(&check(&file(4, &[(2, 0, 0)]), &writes, &st)),
            vec![ViolationKind::StaleWrite]
        );
    }

    #[test]
    fn zeros_are_lost_only_where_something_was_acknowledged() {
        let writes = [w(0, 0, 1, 100, true), w(0, 1, 2, 100, false)];
        let st = starts(&[(0, 50)]);
        let v = check(&file(4, &[]), &writes, &st);
        assert_eq!(kinds(&v), vec![ViolationKind::LostAck]);
        assert_eq!(v[0].offset, Some(offset(1)));
        // A file shorter than the acknowledged slot: its zeros are missing too.
        let v = check(&[], &writes, &st);
        assert_eq!(kinds(&v), vec![ViolationKind::LostAck]);
    }

    #[test]
    fn torn_bytes_pass_only_after_an_unacknowledged_write() {
        let mut b = file(2, &[(1, 0, 0)]);
        b[offset(1) as usize + 100] ^= 0xff;
        let st = starts(&[(0, 50)]);
        let torn_ok = [w(0, 0, 1, 100, true), w(0, 1, 1, 200, false)];
        assert!(check(&b, &torn_ok, &st).is_empty());
        let all_acked = [w(0, 0, 1, 100, true)];
        assert_eq!(
            kinds(&check(&b, &all_acked, &st)),
            vec![ViolationKind::Corrupt]
        );
    }

    #[test]
    fn a_record_in_a_slot_it_was_not_written_to_is_corrupt() {
        let writes = [w(0, 0, 1, 100, true)];
        let st = starts(&[(0, 50)]);
        let v = check(&file(3, &[(1, 0, 0), (2, 0, 0)]), &writes, &st);
        assert_eq!(kinds(&v), vec![ViolationKind::Corrupt]);
        assert_eq!(v[0].offset, Some(offset(2)));
    }
}
