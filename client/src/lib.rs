//! `stampfs-client`: the library applications use to talk to a stampfs cluster.
//!
//! - [`Client`]: connects to the master, proving a user's key on every connection
//!   ([`ClientConfig::credentials`], else `STAMPFS_CREDENTIALS` or
//!   `~/.config/stampfs/credentials`; requests act as that user); namespace calls ([`Client::mkdir`],
//!   [`Client::list`], [`Client::stat`], [`Client::rename`], [`Client::delete`],
//!   [`Client::recover_lease`]) and the entry points for data; for checkers,
//!   [`Client::read_replica`] reads one replica whole as its chunkserver holds it.
//! - [`FileWriter`]: from [`Client::create`] / [`Client::append`]; a tokio
//!   `AsyncWrite` that streams packets through a chain of chunkservers with a window
//!   of packets in flight, plus [`FileWriter::hflush`], [`FileWriter::hsync`] and
//!   [`FileWriter::close`]. It renews its lease in the background and recovers the
//!   pipeline when a replica fails. A writer whose token the storage rejects gets
//!   [`Error::Fenced`] and never retries with the old token.
//! - [`OpenOptions`]: from [`Client::open_options`], `std::fs::OpenOptions` style; its
//!   `write` mode gives a [`FileWriter`] that also seeks (`AsyncSeek`) and writes at any
//!   offset of the file's last chunk and past its end ([`FileWriter::write_at`]),
//!   fenced by the same chunk versions as appends.
//! - [`FileReader`]: from [`Client::open`]; `AsyncRead + AsyncSeek` and
//!   [`FileReader::read_at`], reading only replicas at the current version.
//! - [`mount`]: the FUSE mount ([`Mount`]) built on the above; writes anywhere in a
//!   file's last chunk and past its end.

mod client;
mod error;
pub mod mount;
mod open;
mod pipeline;
mod reader;
mod writer;

pub use client::{process_attr, Client, ClientConfig, CreateOptions};
pub use error::{Error, Result};
pub use mount::{Mount, MountConfig};
pub use open::OpenOptions;
pub use reader::FileReader;
pub use writer::{FileWriter, WriteMode};
