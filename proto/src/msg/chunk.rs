//! → chunkserver: pipeline streams, reads, replica transfers and master commands.

use super::shared::{ChunkserverAddr, ReplicaReport};
use crate::error::RemoteError;
use crate::ids::{ChunkHandle, ChunkVersion, ChunkserverId};
use crate::token::ChunkToken;
#[cfg(doc)]
use crate::token::Signed;
use bincode::{Decode, Encode};

/// Opens a pipeline stream: from here on the connection carries [`Packet`]s one way
/// and [`Ack`]s the other.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WriteSetup {
    pub token: ChunkToken,
    /// Chunk offset of the first packet.
    pub offset: u64,
    /// The rest of the pipeline, in order.
    pub downstream: Vec<ChunkserverAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WriteSetupReply {
    /// Replicas that accepted the stream, this one first.
    pub accepted: Vec<ChunkserverId>,
    /// Replicas that refused or could not be reached, with the reason.
    pub failed: Vec<(ChunkserverId, RemoteError)>,
}

/// One packet of a pipeline stream; its payload is the frame's data section.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Packet {
    pub token: ChunkToken,
    pub seq: u64,
    /// Chunk offset of the payload's first byte.
    pub offset: u64,
    /// CRC32 of the payload, computed by the client.
    pub crc: u32,
    /// fdatasync before acknowledging (hsync).
    pub sync: bool,
}

/// One replica's outcome for a packet.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReplicaAck {
    pub chunkserver: ChunkserverId,
    /// The replica's length after the packet, or why it failed.
    pub result: Result<u64, RemoteError>,
}

/// Acknowledgement of a packet, with a status for every replica of the pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Ack {
    pub seq: u64,
    pub replicas: Vec<ReplicaAck>,
}

/// Reads a byte range of a replica; the bytes come back as the reply's data section.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Read {
    pub token: ChunkToken,
    pub offset: u64,
    pub len: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReadReply {
    /// The replica's length and state at the time of the read.
    pub replica: ReplicaReport,
}

/// Asks a replica for its version, length and state (readers of open files use it to
/// learn how much has been acknowledged).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReplicaInfo {
    pub token: ChunkToken,
}

/// Pushes a finalized replica to another chunkserver (re-replication). The bytes follow
/// as [`Packet`]s on the same connection, then a final [`Ack`] confirms.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReceiveReplica {
    /// Signed by the master for the chunk's current version.
    pub token: ChunkToken,
    pub length: u64,
}

/// A command the master authenticates with the cluster key.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum ChunkCommand {
    /// Raise the replica to `version` durably (header write + fsync), creating an empty
    /// replica when `create` is set and none exists.
    BumpVersion {
        handle: ChunkHandle,
        version: ChunkVersion,
        create: bool,
    },
    /// Delete the replica if its version is at most `max_version`.
    Delete {
        handle: ChunkHandle,
        max_version: ChunkVersion,
    },
    /// Copy the finalized replica at `version` to `target`.
    Replicate {
        handle: ChunkHandle,
        version: ChunkVersion,
        target: ChunkserverAddr,
    },
    /// Cut the replica at `version` to `length`.
    Truncate {
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    },
    /// Seal the replica at `version` with `length`.
    Finalize {
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    },
    /// Report version, length and state.
    Info { handle: ChunkHandle },
}

/// Asks a chunkserver to check every block of its replica of `handle` against its
/// checksums now (the check the background scrub makes), because someone reported the
/// replica corrupt. Sent by the master inside a [`Signed`] envelope. A block that fails
/// is handled like any corruption the chunkserver finds itself: the replica is moved
/// aside and reported.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct VerifyReplica {
    pub handle: ChunkHandle,
}

/// What a [`VerifyReplica`] found.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum Verification {
    /// Every block matched its checksum; the replica as it is now.
    Clean { replica: ReplicaReport },
    /// The block at `offset` did not: the replica (at `version`) was moved aside.
    Corrupt { version: ChunkVersion, offset: u64 },
    /// No such replica here (never held, deleted, or moved aside already).
    Absent,
}

/// Opens a pipeline stream for writes at any offset of the chunk (overwrites), in
/// place of [`WriteSetup`]'s append stream. The set-up never cuts the replica; each
/// packet is written at its own offset, which may be anywhere up to the replica's
/// length (bytes below it are overwritten in place, bytes past it appended), so a
/// resend of the same packets in the same order is an idempotent retry. Forwarded
/// downstream as an `OverwriteSetup` too. See DESIGN.md, "Writes at any offset".
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct OverwriteSetup {
    pub setup: WriteSetup,
}

/// Asks a chunkserver for the checksum table of its replica of `handle` at exactly
/// `version` (lease recovery compares the replicas of a chunk that may have been
/// overwritten unevenly). Sent by the master inside a [`Signed`] envelope.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct DigestReplica {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
}

/// What a [`DigestReplica`] found: the replica, and the XXH3-64 hash of each 64 KiB
/// block of its data up to its length (the last entry covers a partial block up to
/// the length), read from the data and verified against its checksums. Two replicas
/// with equal lengths and equal hashes hold the same bytes. Not the blocks' CRC32s:
/// CRC is linear, and data made of fixed-length records that each end with their own
/// CRC32 (a common log layout, and the nemesis's slot file) has the same CRC32 whatever
/// the records say, so two replicas holding different records would look the same.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ReplicaDigest {
    pub replica: ReplicaReport,
    pub blocks: Vec<u64>,
}
