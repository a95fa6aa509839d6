//! The end of a recovery attempt, as pure decisions: which length the bumped replicas
//! are cut to ([`recovered_length`]), whether they hold the same bytes at it
//! ([`compare_content`], DESIGN.md "Lease recovery compares content"), and what the
//! attempt does once its seal is done ([`after_seal`]).
//!
//! After the bump and the cut, every bumped replica is asked for its digest (a hash
//! of each 64 KiB block up to its length). Equal digests: the replicas hold the same
//! bytes and are all finalized at the recovery's version. Different ones (a writer
//! that died with an overwrite applied by some members only): the first replica of
//! the granted pipeline among those that answered is kept, alone, at one more
//! version; the others stay at the recovery's version, stale. Every acknowledged byte
//! is on every pipeline replica, so any of them is a correct choice; the pipeline
//! head is simply the one the writer sent every packet to first.

use stampfs_proto::{ChunkHandle, ChunkVersion, ChunkserverId, ReplicaDigest, ReplicaReport};

/// The length recovery commits: the shortest replica that took the bump (`None` when
/// none did).
pub fn recovered_length(lengths: impl IntoIterator<Item = u64>) -> Option<u64> {
    lengths.into_iter().min()
}

/// Whether a command's reply shows the replica of `handle` at exactly `version` and
/// `length` (what a truncate, a digest or a finalize of a recovery must answer; a
/// reply without a report, or with another version or length, counts as a failure).
pub fn replica_at(
    report: Option<&ReplicaReport>,
    handle: ChunkHandle,
    version: ChunkVersion,
    length: u64,
) -> bool {
    report.is_some_and(|r| r.handle == handle && r.version == version && r.length == length)
}

/// Puts `items` (one per replica) in the order of the granted `pipeline`; replicas
/// outside it, or all of them when the pipeline is not known (empty), follow by
/// chunkserver id.
pub fn in_pipeline_order<T>(items: &mut [(ChunkserverId, T)], pipeline: &[ChunkserverId]) {
    items.sort_by_key(|(id, _)| {
        (
            pipeline.iter().position(|p| p == id).unwrap_or(usize::MAX),
            *id,
        )
    });
}

/// What the digests of the cut replicas say ([`compare_content`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// No replica answered its digest request.
    Unknown,
    /// Every replica that answered holds the same bytes: finalize them all.
    Identical,
    /// The replicas hold different bytes. `keep` (the first in pipeline order) is
    /// finalized alone at a new version; `same` hold its bytes too and `differ` do
    /// not; both stay behind at the recovery's version, stale.
    Diverged {
        keep: ChunkserverId,
        same: Vec<ChunkserverId>,
        differ: Vec<ChunkserverId>,
    },
}

/// Compares the digests of the replicas that answered, given in pipeline order
/// ([`in_pipeline_order`]): equal lengths and equal block hashes are the same bytes.
pub fn compare_content(digests: &[(ChunkserverId, &ReplicaDigest)]) -> Content {
    let Some(((keep, first), rest)) = digests.split_first() else {
        return Content::Unknown;
    };
    let holds_first =
        |d: &ReplicaDigest| d.replica.length == first.replica.length && d.blocks == first.blocks;
    let (same, differ): (Vec<_>, Vec<_>) = rest.iter().partition(|(_, d)| holds_first(d));
    if differ.is_empty() {
        return Content::Identical;
    }
    Content::Diverged {
        keep: *keep,
        same: same.into_iter().map(|(id, _)| id).collect(),
        differ: differ.into_iter().map(|(id, _)| id).collect(),
    }
}

/// What the seal finalizes, given the digests (in pipeline order) and whether some
/// replica may hold the recovery's version without having been compared
/// (`must_fence`: a bump, truncate or digest that was not answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SealDecision {
    /// Every replica that answered, at the attempt's version.
    All,
    /// `keep` (the first of the pipeline and every replica holding its bytes), alone
    /// at one more version; `stale` (other bytes) and every replica not compared stay
    /// below it. A replica of unknown bytes at the version the file closes at would
    /// be served as current: one that applied a bump without answering holds the
    /// version at the right length, perhaps with other bytes (an overwrite changes no
    /// length).
    Fence {
        keep: Vec<ChunkserverId>,
        stale: Vec<ChunkserverId>,
    },
}

/// See [`SealDecision`].
pub fn seal_decision(
    digests: &[(ChunkserverId, &ReplicaDigest)],
    must_fence: bool,
) -> SealDecision {
    match compare_content(digests) {
        Content::Unknown => SealDecision::All,
        Content::Identical if !must_fence => SealDecision::All,
        Content::Identical => SealDecision::Fence {
            keep: digests.iter().map(|(id, _)| *id).collect(),
            stale: Vec::new(),
        },
        Content::Diverged { keep, same, differ } => SealDecision::Fence {
            keep: std::iter::once(keep).chain(same).collect(),
            stale: differ,
        },
    }
}

/// What a recovery attempt does after its seal (`Truncate`, `Digest` and `Finalize` at
/// the recovered length on every bumped replica, or on the kept one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterSeal {
    /// Some replicas are sealed: commit the length and close the file; the replicas
    /// in `drop` failed their seal and leave the chunk's replica list (they are not
    /// handed out; a later report at the sealed version brings one back).
    Commit { drop: Vec<ChunkserverId> },
    /// No replica is sealed: nothing is dropped and the file stays in recovery. Every
    /// bumped replica holds at least the recovered length and stays listed, so the
    /// next attempt bumps and seals it again. (Dropping them would let the next
    /// attempt find no replica at all and take them for gone.)
    Retry,
}

/// The seal rule, from the replicas that sealed and those that failed.
pub fn after_seal(sealed: &[ChunkserverId], failed: &[ChunkserverId]) -> AfterSeal {
    if sealed.is_empty() {
        AfterSeal::Retry
    } else {
        AfterSeal::Commit {
            drop: failed.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::ReplicaState;

    const H: ChunkHandle = ChunkHandle(4);

    fn id(n: u64) -> ChunkserverId {
        ChunkserverId(n)
    }

    fn digest(length: u64, blocks: &[u64]) -> ReplicaDigest {
        ReplicaDigest {
            replica: ReplicaReport {
                handle: H,
                version: ChunkVersion(3),
                length,
                state: ReplicaState::Writing,
            },
            blocks: blocks.to_vec(),
        }
    }

    #[test]
    fn a_seal_that_failed_everywhere_keeps_the_replicas_for_the_next_attempt() {
        let (a, b) = (id(1), id(2));
        assert_eq!(after_seal(&[], &[a, b]), AfterSeal::Retry);
        assert_eq!(after_seal(&[a], &[b]), AfterSeal::Commit { drop: vec![b] });
        assert_eq!(after_seal(&[a, b], &[]), AfterSeal::Commit { drop: vec![] });
    }

    #[test]
    fn the_shortest_bumped_replica_decides_the_length() {
        assert_eq!(recovered_length([4096, 1000, 65536]), Some(1000));
        assert_eq!(recovered_length([7]), Some(7));
        assert_eq!(recovered_length([]), None);
    }

    #[test]
    fn identical_replicas_are_fenced_only_when_another_may_hold_the_version_unseen() {
        let (a, b) = (digest(70_000, &[1, 2]), digest(70_000, &[1, 2]));
        let view = [(id(2), &a), (id(1), &b)];
        assert_eq!(seal_decision(&view, false), SealDecision::All);
        assert_eq!(
            seal_decision(&view, true),
            SealDecision::Fence {
                keep: vec![id(2), id(1)],
                stale: vec![]
            }
        );
        assert_eq!(
            seal_decision(&[], true),
            SealDecision::All,
            "nothing to seal"
        );
    }

    #[test]
    fn diverged_replicas_keep_the_head_and_every_replica_holding_its_bytes() {
        let (a, b, c) = (
            digest(70_000, &[1, 2]),
            digest(70_000, &[1, 9]),
            digest(70_000, &[1, 2]),
        );
        let view = [(id(3), &a), (id(1), &b), (id(2), &c)];
        for must_fence in [false, true] {
            assert_eq!(
                seal_decision(&view, must_fence),
                SealDecision::Fence {
                    keep: vec![id(3), id(2)],
                    stale: vec![id(1)]
                }
            );
        }
    }

    #[test]
    fn identical_digests_finalize_every_replica() {
        let (a, b, c) = (
            digest(70_000, &[1, 2]),
            digest(70_000, &[1, 2]),
            digest(70_000, &[1, 2]),
        );
        assert_eq!(
            compare_content(&[(id(2), &a), (id(1), &b), (id(3), &c)]),
            Content::Identical
        );
        assert_eq!(
            compare_content(&[(id(2), &a)]),
            Content::Identical,
            "one answer"
        );
        let empty = digest(0, &[]);
        assert_eq!(
            compare_content(&[(id(1), &empty), (id(2), &empty)]),
            Content::Identical
        );
    }

    #[test]
    fn no_digest_at_all_is_unknown_content() {
        assert_eq!(compare_content(&[]), Content::Unknown);
    }

    #[test]
    fn diverged_digests_keep_the_first_in_pipeline_order() {
        let (a, b, c) = (
            digest(70_000, &[1, 2]),
            digest(70_000, &[1, 9]),
            digest(70_000, &[1, 2]),
        );
        // Pipeline order 3, 1, 2: the head is kept even though it holds what the
        // majority holds; one that holds its bytes stays behind all the same.
        assert_eq!(
            compare_content(&[(id(3), &a), (id(1), &b), (id(2), &c)]),
            Content::Diverged {
                keep: id(3),
                same: vec![id(2)],
                differ: vec![id(1)],
            }
        );
        // The head is the odd one out: it is still the one kept.
        assert_eq!(
            compare_content(&[(id(1), &b), (id(3), &a), (id(2), &c)]),
            Content::Diverged {
                keep: id(1),
                same: vec![],
                differ: vec![id(3), id(2)],
            }
        );
    }

    #[test]
    fn equal_tables_at_different_lengths_are_different_bytes() {
        // A partial block's CRC equal by chance, or a length that changed: the length
        // is part of the content.
        let (a, b) = (digest(10, &[5]), digest(11, &[5]));
        assert_eq!(
            compare_content(&[(id(1), &a), (id(2), &b)]),
            Content::Diverged {
                keep: id(1),
                same: vec![],
                differ: vec![id(2)],
            }
        );
    }

    #[test]
    fn replies_follow_the_granted_pipeline_then_the_id() {
        let mut items = vec![(id(1), 'a'), (id(5), 'e'), (id(2), 'b'), (id(3), 'c')];
        in_pipeline_order(&mut items, &[id(3), id(1), id(2)]);
        assert_eq!(
            items.iter().map(|(i, _)| i.0).collect::<Vec<_>>(),
            vec![3, 1, 2, 5],
            "5 is outside the pipeline"
        );
        in_pipeline_order(&mut items, &[]);
        assert_eq!(
            items.iter().map(|(i, _)| i.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 5],
            "unknown pipeline: by id"
        );
    }

    #[test]
    fn a_reply_counts_only_at_the_version_and_length_asked() {
        let rep = digest(100, &[]).replica;
        let v = ChunkVersion(3);
        assert!(replica_at(Some(&rep), H, v, 100));
        assert!(!replica_at(None, H, v, 100), "no report");
        assert!(!replica_at(Some(&rep), H, ChunkVersion(4), 100));
        assert!(!replica_at(Some(&rep), H, v, 99));
        assert!(!replica_at(Some(&rep), ChunkHandle(5), v, 100));
    }
}
