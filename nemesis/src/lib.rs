//! `stampfs-nemesis`: randomized faults against a real stampfs cluster, judged by a
//! history checker (the Jepsen method).
//!
//! One run ([`run::run_once`]) starts a [`cluster::Cluster`] of real `stampfs master` and
//! `stampfs chunkserver` processes in a temp dir and several independent client
//! processes ([`clients`]): library clients (`stampfs nemesis-client`, the loop in
//! [`workload`]) and FUSE clients (a `stampfs mount` plus the loop in
//! [`mount_workload`]). Every process runs in its place of the run's [`net::Net`]: on
//! loopback, or, as root, in a network namespace of its own so the network can be
//! partitioned. Chunkservers' data dirs can be small file systems ([`disk`]) that the
//! run fills up. The run injects the faults of a seeded [`schedule`] (SIGKILL and
//! restart, SIGSTOP and SIGCONT, partitions, full disks), heals everything, lets the
//! writers finish, recovers what is still open ([`finish`]), reads the final files and hands them
//! with the clients' [`history`] to the pure [`checker`], which returns
//! [`checker::Violation`]s. `fsck` must be healthy after the heal and no process log
//! may contain a panic. The result is a [`report::RunReport`].
//!
//! Every reader also keeps its last read of each file in a [`read_watch::ReadWatch`],
//! which saves two reads that contradict each other, so a dirty read can be explained
//! from the bytes and not only found.
//!
//! [`replicas::check_replicas`] checks the storage itself after the heal: every replica
//! the master hands out of every chunk, read whole from its chunkserver, is
//! byte-identical to the others at the master's version and committed length.
//!
//! Records are self-describing ([`record`]): magic, file, session, sequence number,
//! payload length, a payload derived from the header, and a CRC32 of all of it, so the
//! checker can parse a file without trusting anything else.
//!
//! With `--admin`, [`admin_churn`] also changes replication factors, balances,
//! decommissions and enters safe mode while the faults run, and undoes it all after
//! the heal; the run's directory also gets a quota before anything is in it, and the
//! use the master kept through the faults must equal what a walk of the directory
//! counts ([`checker::ViolationKind::QuotaUse`]).
//!
//! In a binary built with crash points (`fault-injection`), the servers are also
//! started with seeded [`crash`] points armed: they kill themselves in the middle of
//! lease recovery, version bumps and replica copies.
//!
//! Overwrites: besides the append files, library clients write whole records over
//! random slots of a slot file with `hsync`, judged slot by slot by [`slots::check`]
//! (no acknowledged overwrite lost, none of a session that held the lease before it
//! in its place, torn bytes only after an unacknowledged write). The slot file is four
//! small chunks, so writers move between chunks under the faults too.

pub mod admin_churn;
pub mod checker;
pub mod clients;
pub mod cluster;
pub mod crash;
pub mod disk;
pub mod finish;
pub mod history;
pub mod mount_workload;
pub mod net;
pub mod read_watch;
pub mod record;
pub mod replicas;
pub mod report;
pub mod run;
pub mod schedule;
pub mod slots;
pub mod workload;

use std::path::PathBuf;

/// Errors of the nemesis harness itself (not violations: those are results).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot spawn {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} exited ({status}) before it was ready; see {log}")]
    EarlyExit {
        name: String,
        status: String,
        log: PathBuf,
    },
    #[error("{what} did not happen within {secs} s")]
    Timeout { what: String, secs: u64 },
    #[error("cannot signal {name}: {source}")]
    Signal {
        name: String,
        #[source]
        source: nix::Error,
    },
    #[error(transparent)]
    Client(#[from] stampfs_client::Error),
    #[error("run with seed {seed} failed (data dir and logs kept in {}): {source}", dir.display())]
    RunFailed {
        seed: u64,
        dir: PathBuf,
        #[source]
        source: Box<Error>,
    },
    #[error("interrupted during the run with seed {seed} (its processes were stopped; data dir and logs kept in {})", dir.display())]
    Interrupted { seed: u64, dir: PathBuf },
    #[error("credentials: {0}")]
    Credentials(#[from] stampfs_proto::Error),
    #[error("cannot encode or decode JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("network set-up failed: {what}: {detail}")]
    Net { what: String, detail: String },
    #[error("disk fault on {}: {what}: {detail}", dir.display())]
    Disk {
        dir: PathBuf,
        what: String,
        detail: String,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}

/// Result with the nemesis [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
