//! Zeros written as holes: a pure rewrite of a chain's data writes.
//!
//! A writer that writes past the end of a file, or grows it with `set_len`, sends the
//! gap as zeros (DESIGN.md, "Writes at any offset"). Written as they come, those zeros
//! would take as much disk as data. [`elide_zeros`] rewrites the data writes of a
//! chain so that a run of zeros of at least [`MIN_RUN`] bytes costs no disk blocks:
//! its page-aligned middle becomes [`IoOp::PunchHole`] (`fallocate(PUNCH_HOLE |
//! KEEP_SIZE)`: whatever was there, the range now reads as zeros and holds no blocks,
//! and nothing happens past the end of the file) and only its unaligned head and its
//! last page are written, the last page so that the file reaches the run's end as a
//! write of zeros would have taken it. A run past the end of the file is thus a hole
//! plus one page; one inside it (an overwrite with zeros, or bytes a failed write left
//! past the replica's length) frees its blocks.
//!
//! The rewrite changes no byte that a read returns: each byte of the run reads as
//! zero either way. A crash in the middle leaves each byte of the run old or zero,
//! like a torn write of zeros (the chain's flush and header come after it, as
//! before). The checksums are computed from the packets' bytes, which are zeros, by
//! the caller, unchanged.
//!
//! Only the store's data writes go through it: zeros written ahead on purpose (to
//! keep small hsyncs from growing the file) and headers must stay written.

use super::IoOp;
use bytes::Bytes;

/// The page the holes are aligned to (the data region starts on one).
pub const PAGE: u64 = 4096;

/// The shortest run of zeros turned into a hole: a shorter one is written.
pub const MIN_RUN: u64 = 4 * PAGE;

static ZERO_PAGE: [u8; PAGE as usize] = [0; PAGE as usize];

/// One piece of a data write: its bytes at `offset`, all zeros or not.
struct Piece {
    offset: u64,
    bufs: Vec<Bytes>,
    len: u64,
    zeros: bool,
}

/// `ops` with every run of at least [`MIN_RUN`] zero bytes in a `Write` or `Writev`
/// made a hole (see the module docs), in a write that holds a buffer of a page or more
/// of zeros (packets are 64 KiB; a run of small buffers alone is written as it is). Other ops are kept as they are, in order. The
/// result never holds more than `max_ops` ops unless `ops` did: a write whose rewrite
/// would pass that is kept as it is.
pub fn elide_zeros(ops: Vec<IoOp>, max_ops: usize) -> Vec<IoOp> {
    let mut left = ops.len();
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        left -= 1;
        let rewritten = match &op {
            IoOp::Write { offset, data } => rewrite(*offset, std::slice::from_ref(data)),
            IoOp::Writev { offset, bufs } => rewrite(*offset, bufs),
            _ => None,
        };
        let room = max_ops.saturating_sub(out.len() + left);
        match rewritten {
            Some(new) if new.len() <= room => out.extend(new),
            // Kept as it came (a write of data is the common case: no copy, no
            // change of op).
            _ => out.push(op),
        }
    }
    out
}

/// The rewrite of one data write, or `None` when it holds no run worth a hole.
fn rewrite(offset: u64, bufs: &[Bytes]) -> Option<Vec<IoOp>> {
    // The hot path: packets of data. Their first bytes are not zero, so this stops at
    // once and nothing is allocated.
    if !bufs.iter().any(|b| b.len() as u64 >= PAGE && is_zeros(b)) {
        return None;
    }
    let pieces = pieces(offset, bufs);
    if !pieces.iter().any(|p| p.zeros) {
        return None;
    }
    let mut ops = Vec::new();
    for p in pieces {
        if !p.zeros {
            ops.push(data_write(p.offset, p.bufs));
            continue;
        }
        let end = p.offset + p.len;
        let start = p.offset.next_multiple_of(PAGE);
        // The last page is written, so the file ends where the run does.
        let hole_end = if end % PAGE == 0 {
            end - PAGE
        } else {
            end - end % PAGE
        };
        if start > p.offset {
            ops.push(zero_write(p.offset, start - p.offset));
        }
        ops.push(IoOp::PunchHole {
            offset: start,
            len: hole_end - start,
        });
        ops.push(zero_write(hole_end, end - hole_end));
    }
    Some(ops)
}

/// `bufs` at `offset` cut into alternating pieces of data and of zero runs worth a
/// hole (a zero run shorter than that, or without a whole page in it, stays data).
fn pieces(offset: u64, bufs: &[Bytes]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let mut at = offset;
    for b in bufs.iter().filter(|b| !b.is_empty()) {
        let zeros = is_zeros(b);
        let len = b.len() as u64;
        match out.last_mut() {
            Some(last) if last.zeros == zeros => {
                last.bufs.push(b.clone());
                last.len += len;
            }
            _ => out.push(Piece {
                offset: at,
                bufs: vec![b.clone()],
                len,
                zeros,
            }),
        }
        at += len;
    }
    // Runs too short for a hole go back to being data, merged with their neighbours.
    let mut merged: Vec<Piece> = Vec::with_capacity(out.len());
    for mut p in out {
        if p.zeros && !worth_a_hole(p.offset, p.len) {
            p.zeros = false;
        }
        match merged.last_mut() {
            Some(last) if !last.zeros && !p.zeros => {
                last.bufs.append(&mut p.bufs);
                last.len += p.len;
            }
            _ => merged.push(p),
        }
    }
    merged
}

/// Whether zeros at `offset..offset + len` leave a hole of at least one page once the
/// unaligned head and the last page are written.
fn worth_a_hole(offset: u64, len: u64) -> bool {
    if len < MIN_RUN {
        return false;
    }
    let end = offset + len;
    let start = offset.next_multiple_of(PAGE);
    let hole_end = if end % PAGE == 0 {
        end - PAGE
    } else {
        end - end % PAGE
    };
    hole_end >= start + PAGE
}

fn is_zeros(b: &[u8]) -> bool {
    // The OR over each 64-byte piece vectorises; the first non-zero piece stops it.
    b.chunks(64)
        .all(|c| c.iter().fold(0u8, |acc, x| acc | x) == 0)
}

fn data_write(offset: u64, mut bufs: Vec<Bytes>) -> IoOp {
    if bufs.len() == 1 {
        IoOp::Write {
            offset,
            data: bufs.pop().unwrap_or_default(),
        }
    } else {
        IoOp::Writev { offset, bufs }
    }
}

/// `len` (at most a page) zero bytes at `offset`.
fn zero_write(offset: u64, len: u64) -> IoOp {
    IoOp::Write {
        offset,
        data: Bytes::from_static(&ZERO_PAGE[..len as usize]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a chain does to a file's bytes, with holes as zeros; and the blocks
    /// written (pages touched by writes, not by holes).
    fn apply(ops: &[IoOp], file: &mut Vec<u8>) -> u64 {
        let mut written = 0;
        for op in ops {
            let (offset, data): (u64, Vec<u8>) = match op {
                IoOp::Write { offset, data } => (*offset, data.to_vec()),
                IoOp::Writev { offset, bufs } => (*offset, bufs.concat()),
                IoOp::PunchHole { offset, len } => {
                    let (s, e) = (*offset as usize, (*offset + *len) as usize);
                    for b in file.iter_mut().take(e).skip(s) {
                        *b = 0;
                    }
                    continue;
                }
                _ => continue,
            };
            let end = offset as usize + data.len();
            if file.len() < end {
                file.resize(end, 0);
            }
            file[offset as usize..end].copy_from_slice(&data);
            written += data.len() as u64;
        }
        written
    }

    fn zeros(n: usize) -> Bytes {
        Bytes::from(vec![0u8; n])
    }

    #[test]
    fn a_run_of_zeros_becomes_a_hole_and_its_last_page() {
        let ops = vec![IoOp::Writev {
            offset: 4096,
            bufs: vec![
                Bytes::from_static(b"abc"),
                zeros(1 << 20),
                Bytes::from_static(b"xyz"),
            ],
        }];
        let out = elide_zeros(ops.clone(), 16);
        let kinds: Vec<&str> = out
            .iter()
            .map(|o| match o {
                IoOp::Write { .. } => "write",
                IoOp::Writev { .. } => "writev",
                IoOp::PunchHole { .. } => "hole",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["write", "write", "hole", "write", "write"]);
        let (mut a, mut b) = (vec![0xee; 8192], vec![0xee; 8192]);
        apply(&ops, &mut a);
        let written = apply(&out, &mut b);
        assert_eq!(a, b);
        assert!(written <= 3 * PAGE + 6, "{written} bytes written");
    }

    #[test]
    fn short_runs_data_and_other_ops_are_kept() {
        let ops = vec![
            IoOp::Write {
                offset: 0,
                data: zeros(MIN_RUN as usize - 1),
            },
            IoOp::Write {
                offset: 0,
                data: Bytes::from(vec![1u8; 1 << 16]),
            },
            IoOp::SyncData,
        ];
        let out = elide_zeros(ops, 16);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|o| !matches!(o, IoOp::PunchHole { .. })));
    }

    #[test]
    fn the_op_budget_is_kept() {
        let ops = vec![
            IoOp::Write {
                offset: 0,
                data: zeros(1 << 20),
            },
            IoOp::SyncData,
        ];
        assert_eq!(elide_zeros(ops.clone(), 2).len(), 2, "no room: kept");
        assert_eq!(elide_zeros(ops, 3).len(), 3, "a hole and its last page");
    }

    proptest! {
        /// Whatever the pieces, offsets and the file's old bytes, the rewrite leaves
        /// the file exactly as the writes would.
        #[test]
        fn the_rewrite_changes_no_byte(
            offset in 0u64..20_000,
            pieces in proptest::collection::vec((any::<bool>(), 1usize..40_000), 1..8),
            old in 0usize..120_000,
        ) {
            let bufs: Vec<Bytes> = pieces
                .iter()
                .enumerate()
                .map(|(i, (z, n))| if *z { zeros(*n) } else { Bytes::from(vec![(i % 250 + 1) as u8; *n]) })
                .collect();
            let ops = vec![IoOp::Writev { offset, bufs }, IoOp::SyncData];
            let (mut a, mut b) = (vec![0x5a; old], vec![0x5a; old]);
            apply(&ops, &mut a);
            apply(&elide_zeros(ops, 64), &mut b);
            prop_assert_eq!(a, b);
        }
    }
}
