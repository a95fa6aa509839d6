//! `stampfs-master`: the metadata server, and the one place chunk versions (the fencing
//! tokens) are minted.
//!
//! Run it with [`start`] and a [`MasterConfig`]; stop it with [`MasterHandle::shutdown`].
//! It serves [`stampfs_proto::MasterRequest`] on one TCP port.
//!
//! - [`namespace`]: directories and files ([`namespace::Namespace`]).
//! - [`chunk_table`]: handle → version, committed length and replicas
//!   ([`chunk_table::ChunkTable`]).
//! - [`registry`]: chunkservers, liveness and free space ([`registry::Registry`]).
//! - [`lease`]: file write leases with soft and hard limits, pure
//!   ([`lease::LeaseTable`]).
//! - [`placement`]: where new replicas go, pure ([`placement::choose`]).
//! - [`state`]: the replayable state machine ([`state::MasterState`], [`state::Record`]).
//! - [`oplog`]: the group-committed operation log and checkpoints ([`oplog::Oplog`]).
//! - [`commands`]: version bumps and finalizes pushed to chunkservers.
//! - [`service`]: the request logic; [`server`]: listener, handlers, start and shutdown.
//!
//! Invariant 1 (DESIGN.md) lives in [`state`] and [`service`]: every new handle and
//! version is carried by a log record that is durable before a bump or a token with
//! it leaves, and replay restores the counters from those records. Invariant 2: a
//! write grant is returned only after the bump reached the replicas in its pipeline.

pub mod chunk_table;
pub mod commands;
pub mod config;
pub mod error;
pub mod lease;
pub mod namespace;
pub mod oplog;
pub mod placement;
pub mod registry;
pub mod server;
pub mod service;
pub mod state;

pub use config::MasterConfig;
pub use error::{Error, Result};
pub use server::{start, MasterHandle};
