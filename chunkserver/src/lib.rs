//! `stampfs-chunkserver`: stores chunk replicas on local disk and enforces the fencing
//! contract where the data lives (DESIGN.md invariants 2, 3 and 7).
//!
//! Start one with [`start`] and a [`ChunkserverConfig`]; stop it with
//! [`ChunkserverHandle::shutdown`]. It serves clients and peers without a master, and
//! registers / heartbeats in the background, retrying while the master is away.
//!
//! Rooms:
//! - [`header`]: the replica file layout and its two-slot header (encode/decode/verify),
//!   with the overwrite marks ([`header::Marks`]) that make in-place writes crash safe.
//! - [`checksum`]: per-64 KiB-block CRC32 arithmetic (pure).
//! - [`gate`]: the version comparison every data-path request passes (pure).
//! - [`io`]: the [`io::IoEngine`] trait with io_uring ([`io::UringEngine`]) and
//!   plain-threads ([`io::ThreadsEngine`]) implementations.
//! - [`layout`]: where replica files live (`DIR/<hh>/<handle>.chunk`, 256
//!   subdirectories) and how files of the flat layout are put in place.
//! - [`store`]: the [`store::Store`] of replicas, per-chunk locks, durability rules,
//!   the one write path ([`store::Store::write_batch`], appends or writes at any
//!   offset by [`store::WriteMode`]), the streaming start-up scan and recovery,
//!   corrupt replicas moved aside, the chunk report in pages.
//! - [`fdcache`]: the bounded LRU of open replica files ([`fdcache::FileCache`],
//!   `--max-open-files`), so replicas are not limited by the open-file limit.
//! - [`pipeline`]: the write pipeline (setup, packets, acks, backpressure), for append
//!   streams (`WriteSetup`) and overwrite streams (`OverwriteSetup`) alike.
//! - [`replication`]: copying a finalized replica to another chunkserver.
//! - [`scrub`]: background checksum verification of every replica at a bounded rate,
//!   and the on-request check of one replica that the master asks for when a client
//!   reports it corrupt (a client's report is only a hint).
//! - [`deletion`]: paced deletion of replicas the master orders removed.
//! - [`digest`]: a hash of each block of a replica on the master's signed request, which
//!   lease recovery compares across replicas before it finalizes them.
//! - [`heartbeat`]: registration, heartbeats, chunk reports, master commands.
//! - [`stall`]: the bound on writes to a peer that stopped reading (a timeout on
//!   progress, restarted by every byte it takes).
//! - [`server`]: start-up, listener, connection handlers, request dispatch, shutdown.
//! - [`bench`](mod@bench): a generator of replica files and the measure of the start-up scan
//!   and the chunk report over them (`cargo bench --bench scan`).
//! - [`config`] and [`error`].

pub mod bench;
pub mod checksum;
pub mod config;
pub mod counters;
pub mod deletion;
pub mod digest;
pub mod epoch;
pub mod error;
pub mod fdcache;
pub mod gate;
pub mod header;
pub mod heartbeat;
pub mod io;
pub mod layout;
pub mod metrics;
pub mod pipeline;
pub mod replication;
pub mod scrub;
pub mod server;
pub mod stall;
pub mod store;

pub use config::{ChunkserverConfig, IoEngineKind};
pub use error::{Error, Result};
pub use server::{start, ChunkserverHandle, ADDR_FILE, ID_FILE};
