//! The replica check: once the cluster has healed, every replica of every chunk is
//! byte-identical at the master's version (DESIGN.md contracts 2, 4 and 5 seen from the
//! storage, not through a reader, which reads one replica and stops at the committed
//! length).
//!
//! [`check_replicas`] asks the master where a file's chunks are
//! ([`Client::locations`]), reads every replica it lists whole, straight from its
//! chunkserver ([`Client::read_replica`]), and hands each chunk's reads to the pure
//! [`compare`]. A replica is reported when:
//!
//! | what                                                   | kind                  |
//! |--------------------------------------------------------|-----------------------|
//! | its version is not the master's                        | [`DivergentReplicas`] |
//! | its length is not the master's committed length        | [`DivergentReplicas`] |
//! | its bytes differ from the reference replicas' (below)  | [`DivergentReplicas`] |
//! | it cannot be read, or serves fewer bytes than it holds | [`UnreadableReplica`] |
//!
//! A chunk the master lists no replica for is [`UnreadableReplica`] too: its bytes are
//! nowhere to be read. The version comes from the chunkserver's gate: a replica at
//! another version refuses the master's read token and names its own version
//! (`StaleToken` when it is above the master's, `ReplicaStale` when below). The
//! *reference* bytes are those of the largest group of replicas with equal bytes (on a
//! tie, the group of the replica listed first); every other replica is reported with
//! its first byte that differs from the reference. A replica that is a prefix of the
//! reference, or the reference of it, differs only in length, which the length rule
//! reports. Bytes past the master's committed length are not read: that a replica has
//! them is already a length violation.
//!
//! The check changes nothing itself, with one exception that every read shares: a
//! replica that fails its checksums is moved aside by its chunkserver and reported, and
//! the master repairs the chunk, so a second check may find it healthy again.
//!
//! Scope: only chunks the master marks complete (the last chunk of a file still being
//! written may hold unacknowledged bytes on some replicas), and only the replicas the
//! master hands out (stale ones pending deletion, and those on dead chunkservers, are
//! never read by anyone). Run it after the heal once `fsck` is healthy: a chunkserver
//! that has not re-registered yet, or a re-replication still running, shows up here.
//!
//! [`DivergentReplicas`]: ViolationKind::DivergentReplicas
//! [`UnreadableReplica`]: ViolationKind::UnreadableReplica

use crate::checker::{Violation, ViolationKind};
use bytes::Bytes;
use stampfs_client::Client;
use stampfs_proto::{
    ChunkHandle, ChunkVersion, ChunkserverId, FileState, LocatedChunk, RemoteError, ReplicaReport,
};

/// What the master says about one chunk: what every replica must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MasterChunk {
    pub handle: ChunkHandle,
    /// Index of the chunk in the file.
    pub index: usize,
    /// The master's version.
    pub version: ChunkVersion,
    /// Offset of the chunk's first byte in the file.
    pub file_offset: u64,
    /// The master's committed length.
    pub length: u64,
}

impl MasterChunk {
    /// The master's view of chunk `index` of a file's locations.
    pub fn of(index: usize, chunk: &LocatedChunk) -> Self {
        Self {
            handle: chunk.handle,
            index,
            version: chunk.version,
            file_offset: chunk.file_offset,
            length: chunk.length,
        }
    }
}

/// One replica as read from its chunkserver: the chunkserver's report of the replica
/// and its bytes (see [`Client::read_replica`]), or why it could not be read.
pub type ReplicaRead = (
    ChunkserverId,
    stampfs_client::Result<(ReplicaReport, Bytes)>,
);

/// Checks every complete chunk of the file at `path` (see the module docs): each
/// replica the master lists is read whole from its chunkserver, one chunk at a time
/// (memory: the chunk's committed length times its replicas). `file` is the nemesis
/// file id the violations carry. Fails only when the master can not say where the
/// chunks are; a replica that can not be read is a violation, not an error.
pub async fn check_replicas(
    client: &Client,
    path: &str,
    file: Option<u32>,
) -> crate::Result<Vec<Violation>> {
    let locations = client.locations(path).await?;
    if locations.status.state != FileState::Closed {
        tracing::warn!(%path, state = ?locations.status.state, "replica check of a file that is not closed: its last chunk is skipped");
    }
    let mut out = Vec::new();
    for (index, chunk) in locations.chunks.iter().enumerate() {
        if !chunk.complete {
            continue;
        }
        let master = MasterChunk::of(index, chunk);
        let mut reads: Vec<ReplicaRead> = Vec::with_capacity(chunk.replicas.len());
        for replica in &chunk.replicas {
            let read = client
                .read_replica(&replica.addr, chunk.token, chunk.length)
                .await;
            reads.push((replica.chunkserver, read));
        }
        out.extend(compare(file, &master, &reads));
    }
    Ok(out)
}

/// The violations of one chunk's replicas, from the master's view of the chunk and
/// what each replica's chunkserver answered (in the master's order). Pure.
pub fn compare(file: Option<u32>, chunk: &MasterChunk, reads: &[ReplicaRead]) -> Vec<Violation> {
    let mut out = Vec::new();
    let name = format!(
        "chunk {} (index {}, version {})",
        chunk.handle, chunk.index, chunk.version
    );
    let at = |offset: u64| Some(chunk.file_offset.saturating_add(offset));
    let violation = |kind, offset, message| Violation {
        kind,
        file,
        offset,
        session: None,
        seq: None,
        message,
    };
    if reads.is_empty() {
        out.push(violation(
            ViolationKind::UnreadableReplica,
            at(0),
            format!("the master lists no replica of {name}"),
        ));
        return out;
    }
    // Replicas at the master's version whose bytes are all here, for the comparison.
    let mut whole: Vec<(ChunkserverId, &Bytes)> = Vec::new();
    for (server, read) in reads {
        let (report, data) = match read {
            Ok(r) => r,
            Err(e) => {
                let (kind, offset, message) = match e {
                    stampfs_client::Error::Remote(
                        RemoteError::StaleToken { current, .. }
                        | RemoteError::ReplicaStale { current, .. },
                    ) => (
                        ViolationKind::DivergentReplicas,
                        at(0),
                        format!(
                            "the replica of {name} on {server} is at version {current}, not the \
                             master's {}",
                            chunk.version
                        ),
                    ),
                    stampfs_client::Error::Remote(RemoteError::ChecksumMismatch {
                        offset, ..
                    }) => (
                        ViolationKind::UnreadableReplica,
                        at(*offset),
                        format!(
                            "the replica of {name} on {server} failed its checksum at chunk \
                             offset {offset}"
                        ),
                    ),
                    _ => (
                        ViolationKind::UnreadableReplica,
                        at(0),
                        format!("the replica of {name} on {server} could not be read: {e}"),
                    ),
                };
                out.push(violation(kind, offset, message));
                continue;
            }
        };
        if report.version != chunk.version {
            // The gate lets a read through only at the token's version; a reply that
            // says otherwise comes from a replica whose bytes are not this version's.
            out.push(violation(
                ViolationKind::DivergentReplicas,
                at(0),
                format!(
                    "the replica of {name} on {server} answered at version {}, not the \
                     master's {}",
                    report.version, chunk.version
                ),
            ));
            continue;
        }
        if report.length != chunk.length {
            out.push(violation(
                ViolationKind::DivergentReplicas,
                at(report.length.min(chunk.length)),
                format!(
                    "the replica of {name} on {server} holds {} bytes, not the master's \
                     committed {}",
                    report.length, chunk.length
                ),
            ));
        }
        let expected = report.length.min(chunk.length);
        if (data.len() as u64) < expected {
            out.push(violation(
                ViolationKind::UnreadableReplica,
                at(data.len() as u64),
                format!(
                    "the replica of {name} on {server} served {} of its {expected} bytes",
                    data.len()
                ),
            ));
            continue;
        }
        whole.push((*server, data));
    }
    // Groups of replicas with equal bytes, in the order their first member was listed.
    let mut groups: Vec<(Vec<ChunkserverId>, &Bytes)> = Vec::new();
    for (server, data) in &whole {
        match groups.iter_mut().find(|(_, b)| *b == *data) {
            Some((members, _)) => members.push(*server),
            None => groups.push((vec![*server], *data)),
        }
    }
    let mut reference: Option<&(Vec<ChunkserverId>, &Bytes)> = None;
    for g in &groups {
        if reference.is_none_or(|r| g.0.len() > r.0.len()) {
            reference = Some(g);
        }
    }
    let Some((ref_servers, ref_bytes)) = reference else {
        return out;
    };
    let ref_names = ref_servers
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    for (server, data) in &whole {
        if ref_servers.contains(server) {
            continue;
        }
        if let Some(offset) = first_difference(ref_bytes, data) {
            let (theirs, ours) = (data[offset], ref_bytes[offset]);
            let (count, last) = differences(ref_bytes, data);
            out.push(violation(
                ViolationKind::DivergentReplicas,
                at(offset as u64),
                format!(
                    "the bytes of the replica of {name} on {server} differ from those on \
                     {ref_names} first at chunk offset {offset}: {theirs:#04x} instead of \
                     {ours:#04x} ({count} bytes differ, the last at {last}; there it holds \
                     {}, they hold {})",
                    record_at(data, offset),
                    record_at(ref_bytes, offset),
                ),
            ));
        }
    }
    out
}

/// How many bytes `a` and `b` differ in over their common length, and the last one.
fn differences(a: &[u8], b: &[u8]) -> (usize, usize) {
    a.iter()
        .zip(b)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .fold((0, 0), |(n, _), (i, _)| (n + 1, i))
}

/// The record whose bytes `offset` is in, for a person reading a divergence: the
/// nearest record header at or before it (its session and seq), or what is there.
fn record_at(bytes: &[u8], offset: usize) -> String {
    let upto = (offset + crate::record::MAGIC.len()).min(bytes.len());
    let start = bytes[..upto]
        .windows(crate::record::MAGIC.len())
        .rposition(|w| w == crate::record::MAGIC);
    match start.and_then(|s| Some((s, crate::record::decode(&bytes[s..])?))) {
        Some((s, h)) => format!(
            "a record of session {} seq {} at {s} (file {})",
            h.session, h.seq, h.file
        ),
        None => "no record header before it".to_string(),
    }
}

/// The first offset at which `a` and `b` hold different bytes, over their common length.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::ReplicaState;

    const LEN: u64 = 1000;

    fn chunk() -> MasterChunk {
        MasterChunk {
            handle: ChunkHandle(0x2a),
            index: 3,
            version: ChunkVersion(7),
            file_offset: 30_000,
            length: LEN,
        }
    }

    fn bytes(len: u64) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn report(version: u64, length: u64) -> ReplicaReport {
        ReplicaReport {
            handle: ChunkHandle(0x2a),
            version: ChunkVersion(version),
            length,
            state: ReplicaState::Finalized,
        }
    }

    /// A replica on `cs{server}` that answered with `data` at the master's version and
    /// its own length.
    fn good(server: u64, data: Vec<u8>) -> ReplicaRead {
        let len = data.len() as u64;
        (
            ChunkserverId(server),
            Ok((report(7, len), Bytes::from(data))),
        )
    }

    fn failed(server: u64, e: RemoteError) -> ReplicaRead {
        (ChunkserverId(server), Err(stampfs_client::Error::Remote(e)))
    }

    fn kinds(v: &[Violation]) -> Vec<ViolationKind> {
        v.iter().map(|v| v.kind).collect()
    }

    fn flipped(at: usize) -> Vec<u8> {
        let mut b = bytes(LEN);
        b[at] ^= 0x5a;
        b
    }

    #[test]
    fn identical_replicas_at_the_masters_version_and_length_pass() {
        let reads = [
            good(1, bytes(LEN)),
            good(2, bytes(LEN)),
            good(3, bytes(LEN)),
        ];
        assert_eq!(compare(Some(0), &chunk(), &reads), vec![]);
    }

    #[test]
    fn a_replica_with_other_bytes_is_named_with_its_first_differing_offset() {
        let reads = [
            good(1, bytes(LEN)),
            good(2, flipped(517)),
            good(3, bytes(LEN)),
        ];
        let v = compare(Some(4), &chunk(), &reads);
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas], "{v:?}");
        assert_eq!(v[0].file, Some(4));
        assert_eq!(v[0].offset, Some(30_000 + 517), "file offset of the byte");
        let m = &v[0].message;
        assert!(m.contains("000000000000002a"), "{m}");
        assert!(m.contains("on cs2"), "{m}");
        assert!(m.contains("chunk offset 517"), "{m}");
        assert!(m.contains("cs1, cs3"), "the reference replicas: {m}");
    }

    #[test]
    fn a_divergence_names_the_records_each_side_holds_there() {
        use crate::record::{RecordHeader, SessionId};
        let rec = |client, seq| {
            RecordHeader {
                file: 100,
                session: SessionId {
                    client,
                    nonce: 1,
                    counter: 2,
                },
                seq,
                payload_len: 60,
            }
            .encode()
        };
        // Two records; the second one differs (another client's write over it).
        let (first, a, b) = (rec(0, 0), rec(1, 5), rec(2, 9));
        let ours = [first.clone(), a].concat();
        let theirs = [first.clone(), b].concat();
        let v = compare(
            Some(100),
            &MasterChunk {
                length: ours.len() as u64,
                ..chunk()
            },
            &[good(1, ours.clone()), good(2, theirs), good(3, ours)],
        );
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas], "{v:?}");
        let m = &v[0].message;
        let at = first.len();
        assert!(
            m.contains(&format!("first at chunk offset {}", at + 12)),
            "{m}"
        );
        assert!(
            m.contains(&format!(
                "there it holds a record of session c2.1.2 seq 9 at {at}"
            )),
            "{m}"
        );
        assert!(
            m.contains(&format!(
                "they hold a record of session c1.1.2 seq 5 at {at}"
            )),
            "{m}"
        );
        assert_eq!(record_at(&[0u8; 40], 10), "no record header before it");
    }

    #[test]
    fn without_a_majority_the_replica_listed_first_is_the_reference() {
        let reads = [good(5, flipped(10)), good(6, bytes(LEN))];
        let v = compare(None, &chunk(), &reads);
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas]);
        assert!(v[0].message.contains("on cs6"), "{}", v[0].message);
        assert!(v[0].message.contains("on cs5 first"), "{}", v[0].message);
    }

    #[test]
    fn three_different_replicas_give_two_violations() {
        let reads = [
            good(1, flipped(1)),
            good(2, flipped(2)),
            good(3, flipped(3)),
        ];
        let v = compare(None, &chunk(), &reads);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].offset, Some(30_001), "cs2 differs from cs1 at byte 1");
        assert_eq!(v[1].offset, Some(30_001), "so does cs3");
    }

    #[test]
    fn a_replica_of_another_length_is_a_length_violation_and_no_byte_one() {
        let reads = [
            good(1, bytes(LEN)),
            good(2, bytes(LEN - 24)),
            good(3, bytes(LEN)),
        ];
        let v = compare(None, &chunk(), &reads);
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas], "{v:?}");
        let m = &v[0].message;
        assert!(m.contains("on cs2 holds 976 bytes"), "{m}");
        assert!(m.contains("committed 1000"), "{m}");
        assert_eq!(v[0].offset, Some(30_976));
    }

    #[test]
    fn a_longer_replica_is_only_compared_up_to_the_committed_length() {
        // Read capped at the master's length: the tail was not read at all.
        let long = (
            ChunkserverId(2),
            Ok((report(7, LEN + 100), Bytes::from(bytes(LEN)))),
        );
        let reads = [good(1, bytes(LEN)), long];
        let v = compare(None, &chunk(), &reads);
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas], "{v:?}");
        assert!(
            v[0].message.contains("holds 1100 bytes"),
            "{}",
            v[0].message
        );
    }

    #[test]
    fn a_replica_at_another_version_is_divergent_with_both_versions() {
        let ahead = failed(
            2,
            RemoteError::StaleToken {
                handle: ChunkHandle(0x2a),
                presented: ChunkVersion(7),
                current: ChunkVersion(9),
            },
        );
        let behind = failed(
            3,
            RemoteError::ReplicaStale {
                handle: ChunkHandle(0x2a),
                presented: ChunkVersion(7),
                current: ChunkVersion(6),
            },
        );
        let v = compare(None, &chunk(), &[good(1, bytes(LEN)), ahead, behind]);
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas; 2]);
        assert!(
            v[0].message.contains("on cs2 is at version 9"),
            "{}",
            v[0].message
        );
        assert!(
            v[1].message.contains("on cs3 is at version 6"),
            "{}",
            v[1].message
        );
        assert!(v[1].message.contains("master's 7"), "{}", v[1].message);
    }

    #[test]
    fn a_reply_at_another_version_is_divergent_and_not_compared() {
        let odd = (
            ChunkserverId(2),
            Ok((report(8, LEN), Bytes::from(flipped(0)))),
        );
        let v = compare(None, &chunk(), &[good(1, bytes(LEN)), odd]);
        assert_eq!(kinds(&v), vec![ViolationKind::DivergentReplicas], "{v:?}");
        assert!(v[0].message.contains("version 8"), "{}", v[0].message);
    }

    #[test]
    fn a_replica_that_fails_its_checksum_is_unreadable_at_that_offset() {
        let corrupt = failed(
            2,
            RemoteError::ChecksumMismatch {
                handle: ChunkHandle(0x2a),
                offset: 65_536,
            },
        );
        let v = compare(None, &chunk(), &[good(1, bytes(LEN)), corrupt]);
        assert_eq!(kinds(&v), vec![ViolationKind::UnreadableReplica]);
        assert_eq!(v[0].offset, Some(30_000 + 65_536));
        assert!(
            v[0].message.contains("000000000000002a"),
            "{}",
            v[0].message
        );
        assert!(v[0].message.contains("on cs2"), "{}", v[0].message);
    }

    #[test]
    fn an_unreachable_replica_is_unreadable_and_the_others_still_compared() {
        let gone = failed(
            2,
            RemoteError::Unavailable {
                reason: "connection refused".into(),
            },
        );
        let io = (
            ChunkserverId(4),
            Err(stampfs_client::Error::Io(std::io::Error::from(
                std::io::ErrorKind::UnexpectedEof,
            ))),
        );
        let reads = [good(1, bytes(LEN)), gone, io, good(3, flipped(999))];
        let v = compare(None, &chunk(), &reads);
        assert_eq!(
            kinds(&v),
            vec![
                ViolationKind::UnreadableReplica,
                ViolationKind::UnreadableReplica,
                ViolationKind::DivergentReplicas
            ],
            "{v:?}"
        );
        assert!(
            v[0].message.contains("connection refused"),
            "{}",
            v[0].message
        );
        assert!(v[1].message.contains("on cs4"), "{}", v[1].message);
        assert!(
            v[2].message.contains("chunk offset 999"),
            "{}",
            v[2].message
        );
    }

    #[test]
    fn a_replica_that_serves_fewer_bytes_than_it_holds_is_unreadable() {
        let short = (
            ChunkserverId(2),
            Ok((report(7, LEN), Bytes::from(bytes(300)))),
        );
        let v = compare(None, &chunk(), &[good(1, bytes(LEN)), short]);
        assert_eq!(kinds(&v), vec![ViolationKind::UnreadableReplica], "{v:?}");
        assert!(
            v[0].message.contains("served 300 of its 1000"),
            "{}",
            v[0].message
        );
        assert_eq!(v[0].offset, Some(30_300));
    }

    #[test]
    fn a_chunk_without_any_replica_is_unreadable() {
        let v = compare(Some(1), &chunk(), &[]);
        assert_eq!(kinds(&v), vec![ViolationKind::UnreadableReplica]);
        assert!(v[0].message.contains("no replica"), "{}", v[0].message);
    }

    #[test]
    fn an_empty_chunk_with_empty_replicas_passes() {
        let empty = MasterChunk {
            length: 0,
            ..chunk()
        };
        let v = compare(None, &empty, &[good(1, vec![]), good(2, vec![])]);
        assert_eq!(v, vec![]);
    }
}
