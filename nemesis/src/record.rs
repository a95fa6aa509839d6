//! Self-describing records, the unit the workload writes and the checker parses.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "NEMREC01"
//!      8     4  file id              (u32 le)
//!     12     4  session: client      (u32 le)
//!     16     8  session: nonce       (u64 le, the client process's incarnation)
//!     24     4  session: counter     (u32 le, per process)
//!     28     4  seq within session   (u32 le, from 0)
//!     32     4  payload length       (u32 le, at most MAX_PAYLOAD)
//!     36     n  payload              (derived from the header: see `payload`)
//!   36+n     4  CRC32 of bytes 0..36+n
//! ```
//!
//! A record is *intact* when its magic, length bound, payload and CRC all check.
//! [`parse`] never trusts a length it has not verified: after bytes that are not a
//! record it resynchronises at the next magic.

use serde::{Deserialize, Serialize};

/// The first bytes of every record.
pub const MAGIC: [u8; 8] = *b"NEMREC01";
/// Bytes before the payload.
pub const HEADER_LEN: usize = 36;
/// Bytes after the payload (the CRC).
pub const TRAILER_LEN: usize = 4;
/// The largest payload a record may claim.
pub const MAX_PAYLOAD: u32 = 1 << 20;

/// One writer session: a client process (`client`, `nonce` = its incarnation) and the
/// how-manieth file it opened for append (`counter`). Unique across a run.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub struct SessionId {
    pub client: u32,
    pub nonce: u64,
    pub counter: u32,
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}.{}.{}", self.client, self.nonce, self.counter)
    }
}

/// The fields of a record; the payload follows from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordHeader {
    pub file: u32,
    pub session: SessionId,
    pub seq: u32,
    pub payload_len: u32,
}

impl RecordHeader {
    /// Bytes of the whole encoded record.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize + TRAILER_LEN
    }

    fn header_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&self.file.to_le_bytes());
        h[12..16].copy_from_slice(&self.session.client.to_le_bytes());
        h[16..24].copy_from_slice(&self.session.nonce.to_le_bytes());
        h[24..28].copy_from_slice(&self.session.counter.to_le_bytes());
        h[28..32].copy_from_slice(&self.seq.to_le_bytes());
        h[32..36].copy_from_slice(&self.payload_len.to_le_bytes());
        h
    }

    /// The encoded record: header, payload, CRC.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(&self.header_bytes());
        out.extend_from_slice(&payload(&self.header_bytes(), self.payload_len as usize));
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// The payload of a record with header bytes `header`: xorshift seeded by their CRC.
fn payload(header: &[u8; HEADER_LEN], len: usize) -> Vec<u8> {
    let mut x = u64::from(crc32fast::hash(header)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Decodes an intact record starting at `bytes[0]`, or `None`.
pub fn decode(bytes: &[u8]) -> Option<RecordHeader> {
    if bytes.get(0..8)? != MAGIC {
        return None;
    }
    let h = RecordHeader {
        file: u32_at(bytes, 8)?,
        session: SessionId {
            client: u32_at(bytes, 12)?,
            nonce: u64_at(bytes, 16)?,
            counter: u32_at(bytes, 24)?,
        },
        seq: u32_at(bytes, 28)?,
        payload_len: u32_at(bytes, 32)?,
    };
    if h.payload_len > MAX_PAYLOAD {
        return None;
    }
    let body_end = HEADER_LEN + h.payload_len as usize;
    let body = bytes.get(..body_end)?;
    if u32_at(bytes, body_end)? != crc32fast::hash(body) {
        return None;
    }
    if body[HEADER_LEN..] != payload(&h.header_bytes(), h.payload_len as usize)[..] {
        return None;
    }
    Some(h)
}

/// A run of a file's bytes: an intact record, or bytes that are not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    Record { offset: u64, header: RecordHeader },
    Garbage { offset: u64, len: u64 },
}

/// Splits `bytes` into intact records and the garbage between them; after garbage the
/// scan resumes at the next occurrence of [`MAGIC`].
pub fn parse(bytes: &[u8]) -> Vec<Item> {
    let mut items = Vec::new();
    let mut pos = 0usize;
    let mut garbage_from: Option<usize> = None;
    while pos < bytes.len() {
        if let Some(header) = decode(&bytes[pos..]) {
            if let Some(g) = garbage_from.take() {
                items.push(Item::Garbage {
                    offset: g as u64,
                    len: (pos - g) as u64,
                });
            }
            items.push(Item::Record {
                offset: pos as u64,
                header,
            });
            pos += header.encoded_len();
        } else {
            garbage_from.get_or_insert(pos);
            pos = find_magic(bytes, pos + 1).unwrap_or(bytes.len());
        }
    }
    if let Some(g) = garbage_from {
        items.push(Item::Garbage {
            offset: g as u64,
            len: (bytes.len() - g) as u64,
        });
    }
    items
}

fn find_magic(bytes: &[u8], from: usize) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(MAGIC.len())
        .position(|w| w == MAGIC)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(seq: u32, len: u32) -> RecordHeader {
        RecordHeader {
            file: 1,
            session: SessionId {
                client: 2,
                nonce: 3,
                counter: 4,
            },
            seq,
            payload_len: len,
        }
    }

    #[test]
    fn an_encoded_record_decodes_to_its_header() {
        let r = h(7, 1000);
        let bytes = r.encode();
        assert_eq!(bytes.len(), r.encoded_len());
        assert_eq!(decode(&bytes), Some(r));
    }

    #[test]
    fn a_flipped_byte_anywhere_makes_the_record_not_intact() {
        let bytes = h(0, 100).encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            assert_eq!(decode(&b), None, "flip at {i}");
        }
    }

    #[test]
    fn a_torn_record_is_garbage_and_the_scan_resyncs_at_the_next_magic() {
        let a = h(0, 50).encode();
        let b = h(1, 60).encode();
        let mut bytes = a.clone();
        bytes.extend_from_slice(&b[..30]); // torn
        bytes.extend_from_slice(b"junk");
        let c = h(2, 10).encode();
        bytes.extend_from_slice(&c);
        let items = parse(&bytes);
        assert_eq!(
            items,
            vec![
                Item::Record {
                    offset: 0,
                    header: h(0, 50)
                },
                Item::Garbage {
                    offset: a.len() as u64,
                    len: 34
                },
                Item::Record {
                    offset: (a.len() + 34) as u64,
                    header: h(2, 10)
                },
            ]
        );
    }

    #[test]
    fn a_huge_claimed_length_is_not_trusted() {
        let mut bytes = h(0, 10).encode();
        bytes[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            parse(&bytes),
            vec![Item::Garbage {
                offset: 0,
                len: bytes.len() as u64
            }]
        );
    }

    #[test]
    fn trailing_zeros_are_one_garbage_item() {
        let mut bytes = h(0, 10).encode();
        let n = bytes.len() as u64;
        bytes.extend_from_slice(&[0u8; 100]);
        assert_eq!(
            parse(&bytes)[1],
            Item::Garbage {
                offset: n,
                len: 100
            }
        );
    }
}
