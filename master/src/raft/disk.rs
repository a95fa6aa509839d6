//! The on-disk forms of the group's log entries, vote and snapshot metadata.
//!
//! openraft's types are serde types whose layout is openraft's to change. What the
//! master writes to its directory is its own: bincode-derived mirrors
//! ([`EntryDisk`], [`SnapshotMetaDisk`]) and a fixed-layout vote, pinned by golden bytes
//! in the tests below, converted to and from openraft's types at the storage
//! boundary. Decoding is bounded ([`MAX_ENTRY_BYTES`]) and checks everything openraft
//! would take on trust: a membership with a voter that is not a member is refused, and
//! so is a record batch whose LSNs would run past the last.
//!
//! Layouts (integers of the vote and the snapshot header big-endian; bincode's
//! standard varints inside the bincode parts):
//!
//! ```text
//! vote       "STMPVOTE" | term u64 | node u64 | committed u8 | crc32 of what precedes
//! entry      bincode(EntryDisk)       (framed by the log segment: length, CRC, index)
//! snapshot   "STMPSNP1" | meta_len u32 | crc32 of the meta | bincode(SnapshotMetaDisk)
//!            | the checkpoint's own bytes (STMPCKP1 ..., with their own CRC)
//! ```

use super::{Batch, Entry, MasterNode, NodeId, TypeConfig};
use crate::error::{Error, Result};
use openraft::{EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership, Vote};
use std::collections::{BTreeMap, BTreeSet};

/// The most bytes one encoded entry may take: the log's own record bound (a batch is
/// cut at 1 MiB of records, and one record is far smaller than this).
pub const MAX_ENTRY_BYTES: usize = crate::oplog::MAX_RECORD_LEN;
/// The first bytes of the vote file.
pub const VOTE_MAGIC: &[u8; 8] = b"STMPVOTE";
/// Bytes in the vote file.
pub const VOTE_LEN: usize = 8 + 8 + 8 + 1 + 4;
/// The first bytes of a snapshot file.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"STMPSNP1";
/// The most bytes a snapshot's metadata may take (a membership of a few members).
pub const MAX_SNAPSHOT_META_BYTES: usize = 1 << 20;

fn codec() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_ENTRY_BYTES>()
}

fn corrupt(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::Codec {
        reason: format!("{what}: {reason}"),
    }
}

fn encode<T: bincode::Encode>(value: &T, what: &str) -> Result<Vec<u8>> {
    bincode::encode_to_vec(value, codec()).map_err(|e| corrupt(what, e))
}

fn decode<T: bincode::Decode<()>>(bytes: &[u8], what: &str) -> Result<T> {
    let (value, used) = bincode::decode_from_slice(bytes, codec()).map_err(|e| corrupt(what, e))?;
    if used != bytes.len() {
        return Err(corrupt(
            what,
            format!("{} trailing bytes", bytes.len() - used),
        ));
    }
    Ok(value)
}

/// A log id: the leader that proposed the entry and the entry's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct LogIdDisk {
    pub term: u64,
    pub node: NodeId,
    pub index: u64,
}

impl From<&LogId<NodeId>> for LogIdDisk {
    fn from(id: &LogId<NodeId>) -> Self {
        Self {
            term: id.leader_id.term,
            node: id.leader_id.node_id,
            index: id.index,
        }
    }
}

impl From<LogIdDisk> for LogId<NodeId> {
    fn from(d: LogIdDisk) -> Self {
        LogId::new(openraft::CommittedLeaderId::new(d.term, d.node), d.index)
    }
}

/// A membership: its configs (one, or two during a joint change), each a sorted list
/// of voters, and the address of every member (voters and learners), sorted by id.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct MembershipDisk {
    pub configs: Vec<Vec<NodeId>>,
    pub nodes: Vec<(NodeId, String)>,
}

impl From<&Membership<NodeId, MasterNode>> for MembershipDisk {
    fn from(m: &Membership<NodeId, MasterNode>) -> Self {
        Self {
            configs: m
                .get_joint_config()
                .iter()
                .map(|c| c.iter().copied().collect())
                .collect(),
            nodes: m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
        }
    }
}

impl MembershipDisk {
    /// The membership, checked: at least one config, each with at least one voter
    /// listed once, no member listed twice, and every voter among the members.
    pub fn to_membership(&self) -> Result<Membership<NodeId, MasterNode>> {
        let what = "membership";
        if self.configs.is_empty() {
            return Err(corrupt(what, "no config"));
        }
        let mut nodes = BTreeMap::new();
        for (id, addr) in &self.nodes {
            let node = MasterNode { addr: addr.clone() };
            if nodes.insert(*id, node).is_some() {
                return Err(corrupt(what, format!("member {id} listed twice")));
            }
        }
        let mut configs = Vec::with_capacity(self.configs.len());
        for c in &self.configs {
            let voters: BTreeSet<NodeId> = c.iter().copied().collect();
            if voters.is_empty() || voters.len() != c.len() {
                return Err(corrupt(what, format!("bad voter list {c:?}")));
            }
            if let Some(v) = voters.iter().find(|v| !nodes.contains_key(v)) {
                return Err(corrupt(what, format!("voter {v} is not a member")));
            }
            configs.push(voters);
        }
        Ok(Membership::new(configs, nodes))
    }
}

/// What an entry carries.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum PayloadDisk {
    /// The empty entry a new leader commits.
    Blank,
    /// A batch of records (see [`Batch`]).
    Normal {
        first_lsn: u64,
        records: Vec<Vec<u8>>,
    },
    /// A membership change.
    Membership(MembershipDisk),
}

/// An entry of the group's log as it is stored.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct EntryDisk {
    pub log_id: LogIdDisk,
    pub payload: PayloadDisk,
}

impl From<&Entry> for EntryDisk {
    fn from(e: &Entry) -> Self {
        let payload = match &e.payload {
            EntryPayload::Blank => PayloadDisk::Blank,
            EntryPayload::Normal(b) => PayloadDisk::Normal {
                first_lsn: b.first_lsn,
                records: b.records.iter().map(|r| r.to_vec()).collect(),
            },
            EntryPayload::Membership(m) => PayloadDisk::Membership(m.into()),
        };
        Self {
            log_id: (&e.log_id).into(),
            payload,
        }
    }
}

impl EntryDisk {
    /// The openraft entry, checked (see [`MembershipDisk::to_membership`]; a batch's
    /// LSNs must not run past `u64::MAX`).
    pub fn to_entry(&self) -> Result<Entry> {
        let payload: EntryPayload<TypeConfig> = match &self.payload {
            PayloadDisk::Blank => EntryPayload::Blank,
            PayloadDisk::Normal { first_lsn, records } => {
                let batch = Batch {
                    first_lsn: *first_lsn,
                    records: records
                        .iter()
                        .map(|r| serde_bytes::ByteBuf::from(r.clone()))
                        .collect(),
                };
                if !batch.records.is_empty() && batch.last_lsn().is_none() {
                    return Err(corrupt("log entry", "its LSNs run past the last"));
                }
                EntryPayload::Normal(batch)
            }
            PayloadDisk::Membership(m) => EntryPayload::Membership(m.to_membership()?),
        };
        Ok(Entry {
            log_id: self.log_id.into(),
            payload,
        })
    }
}

/// Encodes an entry as the log stores it.
pub fn encode_entry(entry: &Entry) -> Result<Vec<u8>> {
    encode(&EntryDisk::from(entry), "log entry")
}

/// Decodes an entry the log stored; refuses trailing bytes and anything
/// [`EntryDisk::to_entry`] refuses.
pub fn decode_entry(bytes: &[u8]) -> Result<Entry> {
    decode::<EntryDisk>(bytes, "log entry")?.to_entry()
}

/// The vote file's bytes.
pub fn encode_vote(vote: &Vote<NodeId>) -> [u8; VOTE_LEN] {
    let mut out = [0u8; VOTE_LEN];
    out[..8].copy_from_slice(VOTE_MAGIC);
    out[8..16].copy_from_slice(&vote.leader_id.term.to_be_bytes());
    out[16..24].copy_from_slice(&vote.leader_id.node_id.to_be_bytes());
    out[24] = u8::from(vote.committed);
    let crc = crc32fast::hash(&out[..25]);
    out[25..].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes the vote file: its magic, length, CRC and committed flag checked.
pub fn decode_vote(bytes: &[u8]) -> Result<Vote<NodeId>> {
    let what = "vote";
    if bytes.len() != VOTE_LEN {
        return Err(corrupt(
            what,
            format!("{} bytes, not {VOTE_LEN}", bytes.len()),
        ));
    }
    if &bytes[..8] != VOTE_MAGIC {
        return Err(corrupt(what, "bad magic"));
    }
    let crc = u32::from_be_bytes([bytes[25], bytes[26], bytes[27], bytes[28]]);
    if crc32fast::hash(&bytes[..25]) != crc {
        return Err(corrupt(what, "CRC mismatch"));
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let (term, node) = (u64_at(8), u64_at(16));
    match bytes[24] {
        0 => Ok(Vote::new(term, node)),
        1 => Ok(Vote::new_committed(term, node)),
        other => Err(corrupt(what, format!("committed flag {other}"))),
    }
}

/// A snapshot's metadata as its file's header stores it.
#[derive(Clone, Debug, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct SnapshotMetaDisk {
    pub last_log_id: Option<LogIdDisk>,
    pub membership_log_id: Option<LogIdDisk>,
    pub membership: MembershipDisk,
    pub snapshot_id: String,
}

impl From<&SnapshotMeta<NodeId, MasterNode>> for SnapshotMetaDisk {
    fn from(m: &SnapshotMeta<NodeId, MasterNode>) -> Self {
        Self {
            last_log_id: m.last_log_id.as_ref().map(LogIdDisk::from),
            membership_log_id: m.last_membership.log_id().as_ref().map(LogIdDisk::from),
            membership: m.last_membership.membership().into(),
            snapshot_id: m.snapshot_id.clone(),
        }
    }
}

impl SnapshotMetaDisk {
    /// The openraft metadata, checked (see [`MembershipDisk::to_membership`]).
    pub fn to_meta(&self) -> Result<SnapshotMeta<NodeId, MasterNode>> {
        Ok(SnapshotMeta {
            last_log_id: self.last_log_id.map(LogId::from),
            last_membership: StoredMembership::new(
                self.membership_log_id.map(LogId::from),
                self.membership.to_membership()?,
            ),
            snapshot_id: self.snapshot_id.clone(),
        })
    }
}

/// A snapshot file's header: magic, the metadata's length and CRC, the metadata. The
/// checkpoint's bytes follow it.
pub fn encode_snapshot_header(meta: &SnapshotMeta<NodeId, MasterNode>) -> Result<Vec<u8>> {
    let body = encode(&SnapshotMetaDisk::from(meta), "snapshot metadata")?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| *l as usize <= MAX_SNAPSHOT_META_BYTES)
        .ok_or_else(|| corrupt("snapshot metadata", format!("{} bytes", body.len())))?;
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a snapshot file's header from the start of `bytes`: the metadata and the
/// header's length (where the checkpoint starts). `Ok(None)`: `bytes` ends before the
/// header does (read more).
pub fn decode_snapshot_header(
    bytes: &[u8],
) -> Result<Option<(SnapshotMeta<NodeId, MasterNode>, usize)>> {
    let what = "snapshot header";
    if bytes.len() < 16 {
        if !SNAPSHOT_MAGIC.starts_with(&bytes[..bytes.len().min(8)]) {
            return Err(corrupt(what, "bad magic"));
        }
        return Ok(None);
    }
    if &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(corrupt(what, "bad magic"));
    }
    let len = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if len > MAX_SNAPSHOT_META_BYTES {
        return Err(corrupt(what, format!("metadata of {len} bytes")));
    }
    let crc = u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    let Some(body) = bytes.get(16..16 + len) else {
        return Ok(None);
    };
    if crc32fast::hash(body) != crc {
        return Err(corrupt(what, "CRC mismatch"));
    }
    let meta = decode::<SnapshotMetaDisk>(body, "snapshot metadata")?.to_meta()?;
    Ok(Some((meta, 16 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, node: u64, index: u64) -> LogId<NodeId> {
        LogId::new(openraft::CommittedLeaderId::new(term, node), index)
    }

    fn three() -> Membership<NodeId, MasterNode> {
        let nodes: BTreeMap<_, _> = [(1, "10.0.0.1:7070"), (2, "10.0.0.2:7070"), (3, "h3:1")]
            .into_iter()
            .map(|(id, a)| (id, MasterNode { addr: a.into() }))
            .collect();
        Membership::new(vec![[1, 2].into_iter().collect()], nodes)
    }

    fn entries() -> Vec<Entry> {
        vec![
            Entry {
                log_id: log_id(1, 1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(1, 1, 2),
                payload: EntryPayload::Normal(Batch {
                    first_lsn: 300,
                    records: vec![
                        serde_bytes::ByteBuf::from(vec![1, 2, 3]),
                        serde_bytes::ByteBuf::from(Vec::new()),
                    ],
                }),
            },
            Entry {
                log_id: log_id(7, 3, 1 << 40),
                payload: EntryPayload::Membership(three()),
            },
        ]
    }

    #[test]
    fn entries_round_trip_and_their_bytes_never_change() {
        let golden: [&[u8]; 3] = [
            &[1, 1, 1, 0],
            &[1, 1, 2, 1, 251, 44, 1, 2, 3, 1, 2, 3, 0],
            &[
                7, 3, 253, 0, 0, 0, 0, 0, 1, 0, 0, 2, 1, 2, 1, 2, 3, 1, 13, 49, 48, 46, 48, 46, 48,
                46, 49, 58, 55, 48, 55, 48, 2, 13, 49, 48, 46, 48, 46, 48, 46, 50, 58, 55, 48, 55,
                48, 3, 4, 104, 51, 58, 49,
            ],
        ];
        for (e, want) in entries().iter().zip(golden) {
            let bytes = encode_entry(e).expect("encode");
            assert_eq!(bytes, want, "the stored form of {e:?} changed");
            let back = decode_entry(&bytes).expect("decode");
            assert_eq!(&back, e);
        }
    }

    #[test]
    fn damaged_entries_are_refused() {
        let bytes = encode_entry(&entries()[2]).expect("encode");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_entry(&longer).is_err(), "trailing bytes");
        assert!(
            decode_entry(&bytes[..bytes.len() - 1]).is_err(),
            "cut short"
        );
        // A voter that is not a member, a member listed twice, no config at all, a
        // voter listed twice.
        for m in [
            MembershipDisk {
                configs: vec![vec![1, 4]],
                nodes: vec![(1, "a:1".into())],
            },
            MembershipDisk {
                configs: vec![vec![1]],
                nodes: vec![(1, "a:1".into()), (1, "b:1".into())],
            },
            MembershipDisk {
                configs: vec![],
                nodes: vec![(1, "a:1".into())],
            },
            MembershipDisk {
                configs: vec![vec![1, 1]],
                nodes: vec![(1, "a:1".into())],
            },
        ] {
            let e = EntryDisk {
                log_id: LogIdDisk {
                    term: 1,
                    node: 1,
                    index: 1,
                },
                payload: PayloadDisk::Membership(m.clone()),
            };
            let bytes = encode(&e, "test").expect("encode");
            assert!(decode_entry(&bytes).is_err(), "{m:?} taken");
        }
        let past_the_end = EntryDisk {
            log_id: LogIdDisk {
                term: 1,
                node: 1,
                index: 1,
            },
            payload: PayloadDisk::Normal {
                first_lsn: u64::MAX,
                records: vec![vec![], vec![]],
            },
        };
        let bytes = encode(&past_the_end, "test").expect("encode");
        assert!(decode_entry(&bytes).is_err());
    }

    #[test]
    fn the_vote_round_trips_and_its_bytes_never_change() {
        let v = Vote::new_committed(5, 2);
        let bytes = encode_vote(&v);
        let mut want = Vec::new();
        want.extend_from_slice(b"STMPVOTE");
        want.extend_from_slice(&5u64.to_be_bytes());
        want.extend_from_slice(&2u64.to_be_bytes());
        want.push(1);
        want.extend_from_slice(&crc32fast::hash(&want).to_be_bytes());
        assert_eq!(bytes.as_slice(), want.as_slice());
        assert_eq!(decode_vote(&bytes).expect("decode"), v);
        let open = Vote::new(6, 3);
        assert_eq!(decode_vote(&encode_vote(&open)).expect("decode"), open);
        for at in 0..VOTE_LEN {
            let mut bad = bytes;
            bad[at] ^= 0x10;
            assert!(decode_vote(&bad).is_err(), "a flipped byte {at} taken");
        }
        assert!(decode_vote(&bytes[..VOTE_LEN - 1]).is_err());
    }

    #[test]
    fn a_snapshot_header_round_trips_and_finds_where_the_checkpoint_starts() {
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(3, 2, 99)),
            last_membership: StoredMembership::new(Some(log_id(2, 1, 40)), three()),
            snapshot_id: "99-1".into(),
        };
        let mut file = encode_snapshot_header(&meta).expect("encode");
        let header = file.len();
        file.extend_from_slice(b"STMPCKP1 and the rest");
        for cut in 0..header {
            assert!(
                decode_snapshot_header(&file[..cut])
                    .expect("a prefix")
                    .is_none(),
                "{cut} bytes are not a header"
            );
        }
        let (back, len) = decode_snapshot_header(&file)
            .expect("decode")
            .expect("whole");
        assert_eq!(back, meta);
        assert_eq!(len, header);
        assert_eq!(&file[len..len + 8], b"STMPCKP1");
        let mut bad = file.clone();
        bad[header - 1] ^= 1;
        assert!(decode_snapshot_header(&bad).is_err(), "CRC");
        assert!(decode_snapshot_header(b"STMPCKP1xxxxxxxxxxxxxxxx").is_err());
        assert!(decode_snapshot_header(b"X").is_err());
    }
}
