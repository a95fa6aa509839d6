//! `stampfs-proto`: the vocabulary every stampfs process speaks.
//!
//! - [`ids`]: [`ChunkHandle`], [`ChunkVersion`] (the fencing token's payload, ordered),
//!   [`ChunkserverId`], [`ClientId`], [`InodeId`].
//! - [`token`]: [`ChunkToken`], signed with HMAC-SHA256 under the [`ClusterKey`] shared
//!   by master and chunkservers, and [`Signed`] master commands.
//! - [`msg`]: every request and reply ([`MasterRequest`], [`ChunkRequest`],
//!   [`ChunkCommand`], pipeline [`Packet`]s and [`Ack`]s).
//! - [`rpc`]: the [`Rpc`] trait naming each request's response, and [`RpcClient`].
//! - [`net`]: connections, plain TCP or TLS ([`net::Dialer`], [`net::Acceptor`]).
//! - [`codec`]: the length-limited, CRC-checked [`Frame`] and its readers and writers.
//! - [`error`]: wire errors ([`RemoteError`], [`ErrorCode`]) and this crate's [`Error`].
//! - [`crash`]: crash points ([`crash_point!`]), where a server armed from its
//!   environment kills itself on purpose (cargo feature `crash-points`; compiled out
//!   without it), and the [`crash::CATALOGUE`] of every point.
//! - [`credentials`]: a user's [`Credentials`] (name and key) and their file.
//! - [`path`]: namespace path validation.
//! - [`dirlock`]: [`DirLock`], the exclusive lock a server holds on its data directory
//!   (one master or chunkserver per directory).
//! - [`limits`]: the open-file limit servers raise at start-up.
//! - [`pause`]: the pause-aware clock every deadline is measured on (a process that
//!   was frozen does not judge others by time it did not see).

pub mod auth;
pub mod codec;
pub mod crash;
pub mod credentials;
pub mod dirlock;
pub mod error;
pub mod ids;
pub mod limits;
pub mod msg;
pub mod net;
pub mod path;
pub mod pause;
pub mod replay;
pub mod rpc;
pub mod token;
pub mod units;

pub use codec::{
    Frame, FrameReader, FrameSink, FrameWriter, MAX_DATA_LEN, MAX_FRAME_LEN, MAX_HEADER_LEN,
};
pub use credentials::Credentials;
pub use dirlock::{DirLock, DirLockError};
pub use error::{Error, ErrorCode, RemoteError, Result};
pub use ids::{ChunkHandle, ChunkVersion, ChunkserverId, ClientId, InodeId};
pub use msg::*;
pub use replay::{Issue, MasterEpoch, ReplayWindow};
pub use rpc::{Rpc, RpcClient};
pub use token::{ChunkToken, ClusterKey, Signed, SignedBody};

/// Default packet payload size on the write pipeline.
pub const DEFAULT_PACKET_SIZE: usize = 64 << 10;
/// Checksum block size of replica data.
pub const CHECKSUM_BLOCK: usize = 64 << 10;
