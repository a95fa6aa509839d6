//! The checks a packet passes on arrival, before it is written or forwarded.

use super::WriteMode;
use crate::header::MAX_CHUNK_SIZE;
use stampfs_proto::{ChunkToken, ClusterKey, Packet, RemoteError};

/// Where the next packet must start, given one at `offset` with `len` bytes when
/// `expected` was next: contiguous (`offset == expected`) or a retry of bytes already
/// sent (`offset < expected`). A gap is refused.
pub fn next_offset(offset: u64, len: u64, expected: u64) -> std::result::Result<u64, String> {
    let end = offset
        .checked_add(len)
        .ok_or_else(|| "packet offset overflows".to_string())?;
    if end > MAX_CHUNK_SIZE {
        return Err(format!(
            "packet ending at {end} exceeds the chunk limit of {MAX_CHUNK_SIZE} bytes"
        ));
    }
    if offset > expected {
        return Err(format!(
            "packet at offset {offset} is not contiguous: expected {expected}"
        ));
    }
    Ok(end.max(expected))
}

/// Checks a packet before it is written or forwarded: same chunk as the setup, MAC (a
/// token equal to the last verified one is not re-verified), CRC (`data_crc` is
/// `crc32` of the packet's `data_len` bytes, from the frame reader's verifying pass),
/// where it starts: at most at `expected` (an append stream's next byte: a gap is
/// not contiguous; an overwrite stream's replica length so far: past it the replica
/// is short, as the store would say) and within the chunk limit. Returns the next
/// `expected`.
pub(super) fn check_packet(
    mode: WriteMode,
    key: &ClusterKey,
    verified: &mut ChunkToken,
    packet: &Packet,
    (data_len, data_crc): (u64, u32),
    expected: u64,
) -> std::result::Result<u64, RemoteError> {
    let handle = verified.handle;
    if packet.token.handle != handle {
        return Err(RemoteError::BadRequest {
            reason: format!(
                "packet for chunk {} on a stream of chunk {handle}",
                packet.token.handle
            ),
        });
    }
    if packet.token != *verified {
        packet
            .token
            .verify(key)
            .map_err(|_| RemoteError::BadToken { handle })?;
        *verified = packet.token;
    }
    if data_crc != packet.crc {
        return Err(RemoteError::ChecksumMismatch {
            handle,
            offset: packet.offset,
        });
    }
    if mode == WriteMode::Overwrite && packet.offset > expected {
        return Err(RemoteError::ReplicaShort {
            handle,
            offset: packet.offset,
            length: expected,
        });
    }
    next_offset(packet.offset, data_len, expected)
        .map_err(|reason| RemoteError::BadRequest { reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ChunkHandle, ChunkVersion};
    #[test]
    fn contiguous_retry_and_gap() {
        assert_eq!(next_offset(0, 10, 0), Ok(10));
        assert_eq!(next_offset(10, 5, 10), Ok(15));
        // An exact retry of bytes already sent keeps the expectation.
        assert_eq!(next_offset(0, 10, 15), Ok(15));
        // Overlapping the end moves it.
        assert_eq!(next_offset(12, 10, 15), Ok(22));
        assert!(next_offset(16, 1, 15).is_err());
        assert!(next_offset(MAX_CHUNK_SIZE, 1, MAX_CHUNK_SIZE).is_err());
        assert!(next_offset(u64::MAX, 2, 0).is_err());
    }

    #[test]
    fn packet_checks() {
        let key = ClusterKey::from_bytes([1; 32]);
        let token = ChunkToken::sign(
            &key,
            ChunkHandle(9),
            ChunkVersion(2),
            stampfs_proto::ClientId(5),
        );
        let mut verified = token;
        let data = b"hello";
        let sum = |d: &[u8]| (d.len() as u64, crc32fast::hash(d));
        let good = Packet {
            token,
            seq: 0,
            offset: 0,
            crc: crc32fast::hash(data),
            sync: false,
        };
        assert_eq!(
            check_packet(WriteMode::Append, &key, &mut verified, &good, sum(data), 0),
            Ok(5)
        );
        let mut bad_crc = good.clone();
        bad_crc.crc ^= 1;
        assert!(matches!(
            check_packet(
                WriteMode::Append,
                &key,
                &mut verified,
                &bad_crc,
                sum(data),
                0
            ),
            Err(RemoteError::ChecksumMismatch { .. })
        ));
        let mut forged = good.clone();
        forged.token.version = ChunkVersion(3);
        assert!(matches!(
            check_packet(
                WriteMode::Append,
                &key,
                &mut verified,
                &forged,
                sum(data),
                0
            ),
            Err(RemoteError::BadToken { .. })
        ));
        let gap = Packet {
            offset: 6,
            ..good.clone()
        };
        assert!(matches!(
            check_packet(WriteMode::Append, &key, &mut verified, &gap, sum(data), 5),
            Err(RemoteError::BadRequest { .. })
        ));
        // A newer genuine token for the same chunk is verified and cached.
        let newer = ChunkToken::sign(
            &key,
            ChunkHandle(9),
            ChunkVersion(3),
            stampfs_proto::ClientId(5),
        );
        let p = Packet {
            token: newer,
            ..good
        };
        assert_eq!(
            check_packet(WriteMode::Append, &key, &mut verified, &p, sum(data), 5),
            Ok(5)
        );
        assert_eq!(verified, newer);
    }

    #[test]
    fn an_overwrite_packet_may_start_anywhere_up_to_the_length() {
        let key = ClusterKey::from_bytes([1; 32]);
        let token = ChunkToken::sign(
            &key,
            ChunkHandle(9),
            ChunkVersion(2),
            stampfs_proto::ClientId(5),
        );
        let mut verified = token;
        let data = b"hello";
        let sum = (data.len() as u64, crc32fast::hash(data));
        let at = |offset| Packet {
            token,
            seq: 0,
            offset,
            crc: crc32fast::hash(data),
            sync: false,
        };
        let mode = WriteMode::Overwrite;
        // Below the length (in place) and at it: the length moves only past it.
        assert_eq!(
            check_packet(mode, &key, &mut verified, &at(3), sum, 100),
            Ok(100)
        );
        assert_eq!(
            check_packet(mode, &key, &mut verified, &at(98), sum, 100),
            Ok(103)
        );
        assert_eq!(
            check_packet(mode, &key, &mut verified, &at(100), sum, 100),
            Ok(105)
        );
        // Past the length: the replica is short, as the store would answer.
        assert_eq!(
            check_packet(mode, &key, &mut verified, &at(101), sum, 100),
            Err(RemoteError::ReplicaShort {
                handle: ChunkHandle(9),
                offset: 101,
                length: 100
            })
        );
        // The chunk limit holds for overwrites too.
        assert!(matches!(
            check_packet(
                mode,
                &key,
                &mut verified,
                &at(MAX_CHUNK_SIZE - 2),
                sum,
                MAX_CHUNK_SIZE
            ),
            Err(RemoteError::BadRequest { .. })
        ));
    }
}
