//! Composing a packet's ack from this replica's result and the downstream's.

use stampfs_proto::{Ack, ChunkserverId, RemoteError, ReplicaAck};

/// What became of a packet downstream, for [`compose_ack`].
#[derive(Debug)]
pub enum DownResult {
    /// This replica is the last of the pipeline.
    NoDownstream,
    /// The packet was rejected here and not forwarded.
    NotForwarded,
    /// The downstream acked it with these entries.
    Acked(Vec<ReplicaAck>),
    /// The downstream connection died before acking it.
    Lost,
}

/// The ack for one packet: this replica's result, then the downstream replicas'.
/// When the downstream was lost, every replica behind this one (`down_ids`, as the
/// downstream accepted at set-up) is `Unavailable`, the first named as the failed one.
pub fn compose_ack(
    seq: u64,
    own: ChunkserverId,
    local: std::result::Result<u64, RemoteError>,
    down: DownResult,
    down_ids: &[ChunkserverId],
) -> Ack {
    let mut replicas = vec![ReplicaAck {
        chunkserver: own,
        result: local,
    }];
    match down {
        DownResult::NoDownstream | DownResult::NotForwarded => {}
        DownResult::Acked(entries) => replicas.extend(entries),
        DownResult::Lost => {
            let first = down_ids.first().copied();
            replicas.extend(down_ids.iter().map(|id| ReplicaAck {
                chunkserver: *id,
                result: Err(RemoteError::Unavailable {
                    reason: match first {
                        Some(f) if f != *id => format!("unreachable: pipeline broken at {f}"),
                        _ => format!("lost the pipeline connection to {id}"),
                    },
                }),
            }));
        }
    }
    Ack { seq, replicas }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::ChunkHandle;
    fn ids(v: &[u64]) -> Vec<ChunkserverId> {
        v.iter().map(|i| ChunkserverId(*i)).collect()
    }

    #[test]
    fn ack_lists_this_replica_then_downstream() {
        let down = vec![
            ReplicaAck {
                chunkserver: ChunkserverId(2),
                result: Ok(100),
            },
            ReplicaAck {
                chunkserver: ChunkserverId(3),
                result: Ok(100),
            },
        ];
        let ack = compose_ack(
            7,
            ChunkserverId(1),
            Ok(100),
            DownResult::Acked(down.clone()),
            &ids(&[2, 3]),
        );
        assert_eq!(ack.seq, 7);
        assert_eq!(ack.replicas[0].chunkserver, ChunkserverId(1));
        assert_eq!(&ack.replicas[1..], &down[..]);
    }

    #[test]
    fn a_lost_downstream_names_it_and_everything_behind_it() {
        let ack = compose_ack(1, ChunkserverId(1), Ok(5), DownResult::Lost, &ids(&[2, 3]));
        assert_eq!(ack.replicas.len(), 3);
        assert_eq!(ack.replicas[0].result, Ok(5));
        for (entry, id) in ack.replicas[1..].iter().zip([2u64, 3]) {
            assert_eq!(entry.chunkserver, ChunkserverId(id));
            match &entry.result {
                Err(RemoteError::Unavailable { reason }) => {
                    assert!(reason.contains("cs2"), "{reason}")
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
    }

    #[test]
    fn rejected_or_last_packets_list_only_this_replica() {
        let err = RemoteError::ChecksumMismatch {
            handle: ChunkHandle(1),
            offset: 0,
        };
        let ack = compose_ack(
            1,
            ChunkserverId(1),
            Err(err.clone()),
            DownResult::NotForwarded,
            &ids(&[2]),
        );
        assert_eq!(ack.replicas.len(), 1);
        assert_eq!(ack.replicas[0].result, Err(err));
        let ack = compose_ack(1, ChunkserverId(3), Ok(1), DownResult::NoDownstream, &[]);
        assert_eq!(ack.replicas.len(), 1);
    }
}
