//! `stampfs-master`: the metadata server, and the one place chunk versions (the fencing
//! tokens) are minted.
//!
//! Run it with [`start`] and a [`MasterConfig`]; stop it with [`MasterHandle::shutdown`].
//! It serves [`stampfs_proto::MasterRequest`] on one TCP port.
//!
//! - [`namespace`]: directories, files and symbolic links with their attributes
//!   ([`namespace::Namespace`]).
//! - [`perm`]: POSIX permission decisions for the caller a request names, pure.
//! - [`chunk_table`]: handle → version, committed length and replicas
//!   ([`chunk_table::ChunkTable`]).
//! - [`registry`]: chunkservers, liveness and free space ([`registry::Registry`]).
//! - [`retry_cache`]: the answers of recent `Once` calls, for a repeat of the call
//!   after a failover lost the first answer ([`retry_cache::RetryCache`]).
//! - [`lease`]: file write leases with soft and hard limits, pure
//!   ([`lease::LeaseTable`]).
//! - [`placement`]: where new replicas go, pure ([`placement::choose`]).
//! - [`state`]: the replayable state machine ([`state::MasterState`], [`state::Record`]).
//! - [`oplog`]: the group-committed operation log and checkpoints ([`oplog::Oplog`]),
//!   and the one-master-per-directory lock ([`oplog::DirLock`]).
//! - [`checkpoint`]: checkpoints built from the previous one and the durable log, off
//!   the state lock ([`checkpoint::build`]).
//! - [`pacing`]: how sliced background work gives way between its slices
//!   ([`pacing::Pacer`]).
//! - [`commands`]: version bumps, finalizes and recovery's truncates and digest
//!   requests pushed to chunkservers.
//! - [`health`]: replica health, pure: stale / corrupt / orphan / surplus replica
//!   deletion, prioritised re-replication, trash expiry, decided in slices of bounded
//!   work ([`health::Pass`]; [`health::plan`] in one piece); commands
//!   travel in heartbeat replies. [`trash`]: where `rm` puts files for `--trash-for`.
//! - [`recovery`]: lease recovery of files whose writer died or hung: triggers, the
//!   bump / shortest length / truncate / digest comparison / finalize / commit
//!   procedure (replicas that diverged: the pipeline head kept alone at one more
//!   version), restart.
//! - [`auth`]: who a connection proved to be (a chunkserver with the cluster key, a
//!   client with a user's key), whom its requests act as, and which user each client
//!   id belongs to, pure; the users themselves are state (`state/users.rs`).
//! - [`raft`]: the master group's replicated log (openraft 0.9), served as a group of
//!   one with `--log group`; [`journal`]: the one interface the request logic has to
//!   either log ([`journal::Journal`]).
//! - [`service`]: the request logic; [`server`]: listener, handlers, start and shutdown.
//! - [`metrics`]: the Prometheus metrics served with `--metrics-listen`, and
//!   [`status_page`], the HTML page at `/` of the same port.
//! - `fail` (cargo feature `fail-points`): fault injection points for tests.
//!
//! Invariant 1 (DESIGN.md) lives in [`state`] and [`service`]: every new handle and
//! version is carried by a log record that is durable before a bump or a token with
//! it leaves, and replay restores the counters from those records. Invariant 2: a
//! write grant is returned only after the bump reached the replicas in its pipeline.
//! Lease recovery ([`recovery`]) reads replica lengths only from the bump's replies,
//! so every length that counts comes from a replica that already fences the old writer.
//! Invariant 5: recovery starts from the version the writer was last *granted*
//! (`Record::GrantedPipeline`, logged after a bump succeeded), never from one minted
//! for a bump that failed, so the replicas holding the acknowledged bytes always count;
//! only the replicas of that granted pipeline vote on the length (one that applied a
//! bump late is not in it); a replica reported shorter than the committed length is
//! never served, copied or allowed to vote; and a file whose replicas cannot be reached
//! is fenced and waits in recovery, never closed at the master's committed length while
//! a pipeline replica may still exist. Every deadline is in seen time
//! ([`lease::Clock`]), so a master that was frozen judges no one by its own pause.
//!
//! Fail-stop: if a committed record cannot be handed to the log, the state is ahead of
//! the log for good; the master then refuses every request with an `Internal` error
//! until it is restarted (see `service::Core::check_running`).

/// Returns `Err` from the enclosing function when the named fail point is enabled
/// (cargo feature `fail-points`, see `fail`); expands to nothing without the feature.
#[cfg(feature = "fail-points")]
macro_rules! fail_point {
    ($name:literal) => {
        if $crate::fail::is_enabled($name) {
            tracing::warn!(point = $name, "fail point hit");
            return Err($crate::fail::error($name));
        }
    };
}
#[cfg(not(feature = "fail-points"))]
macro_rules! fail_point {
    ($name:literal) => {};
}

pub mod auth;
pub mod checkpoint;
pub mod chunk_table;
pub mod commands;
pub mod config;
pub mod error;
#[cfg(feature = "fail-points")]
pub mod fail;
pub mod handle_set;
pub mod health;
pub mod journal;
pub mod lease;
pub mod metrics;
pub mod namespace;
pub mod oplog;
pub mod pacing;
pub mod perm;
pub mod placement;
pub mod raft;
pub mod recovery;
pub mod registry;
pub mod retry_cache;
pub mod safe_mode;
pub mod server;
pub mod service;
pub mod slab;
pub mod state;
pub mod status_page;
pub mod trash;

pub use config::MasterConfig;
pub use error::{Error, Result};
pub use server::{start, MasterHandle};
