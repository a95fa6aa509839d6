//! Master configuration: the flags of `stampfs master` (clap), with documented defaults.
//!
//! Each flag `--foo-bar` can also be set by the environment variable
//! `STAMPFS_MASTER_FOO_BAR` (`--metrics-listen`: `STAMPFS_METRICS_LISTEN`, shared with
//! the chunkservers) and by the key `foo-bar` of the `--config FILE` the binary reads
//! (`src/config_file.rs` in the `stampfs` crate; the command line wins over the
//! environment, which wins over the file). A new flag here is a new config key; give it
//! its variable too (a test there checks that every flag has one).

use crate::error::{Error, Result};
use stampfs_proto::net::TlsFiles;
use std::path::PathBuf;
use std::time::Duration;

/// Largest replication factor a file may ask for.
pub const MAX_REPLICATION: u8 = 16;
/// Smallest chunk size accepted (per cluster or per file).
pub const MIN_CHUNK_SIZE: u64 = 4 << 10;
/// Largest chunk size accepted.
pub const MAX_CHUNK_SIZE: u64 = 1 << 40;

/// A share from 0 to 1 (`0.999`).
fn parse_share(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share from 0 to 1 (e.g. 0.999)")),
    }
}

/// How the master runs. Every field is a `stampfs master` flag.
#[derive(clap::Args, Debug, Clone)]
pub struct MasterConfig {
    /// Metadata directory (oplog, checkpoints, addr file, default cluster key).
    #[arg(long, env = "STAMPFS_MASTER_DIR")]
    pub dir: PathBuf,
    /// Address to listen on for clients and chunkservers (port 0: any free port; the
    /// chosen address is written to DIR/addr).
    #[arg(long, env = "STAMPFS_MASTER_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Cluster key file; created (32 random bytes hex, 0600) when missing. Default DIR/cluster.key.
    #[arg(long, env = "STAMPFS_MASTER_CLUSTER_KEY_FILE")]
    pub cluster_key_file: Option<PathBuf>,
    /// TLS on the master's port, and to the chunkservers it commands.
    #[command(flatten)]
    pub tls: TlsFiles,
    /// Default replication factor of new files.
    #[arg(long, env = "STAMPFS_MASTER_REPLICATION", default_value_t = 3)]
    pub replication: u8,
    /// Default chunk size of new files.
    #[arg(long, env = "STAMPFS_MASTER_CHUNK_SIZE", value_parser = stampfs_proto::units::parse_size, default_value = "64MiB")]
    pub chunk_size: u64,
    /// Fewest replicas a write may proceed with (a new chunk, a re-leased chunk, a
    /// recovered pipeline); fewer live chunkservers is `NotEnoughReplicas`.
    #[arg(long, env = "STAMPFS_MASTER_MIN_REPLICATION", default_value_t = 1)]
    pub min_replication: u8,
    /// A chunkserver with no heartbeat for this long is dead: its replicas are not handed out.
    #[arg(long, env = "STAMPFS_MASTER_DEAD_AFTER", value_parser = humantime::parse_duration, default_value = "10s")]
    pub dead_after: Duration,
    /// Write lease soft limit: after it, an append (by anyone) starts lease recovery of
    /// the file (`stampfs recover` forces recovery at any time).
    #[arg(long, env = "STAMPFS_MASTER_LEASE_SOFT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub lease_soft: Duration,
    /// Write lease hard limit: after it, the master starts lease recovery on its own.
    #[arg(long, env = "STAMPFS_MASTER_LEASE_HARD", value_parser = humantime::parse_duration, default_value = "300s")]
    pub lease_hard: Duration,
    /// The metadata log: `oplog`, the operation log (`DIR/oplog.*`, `DIR/checkpoint`), or
    /// `group`, the master group's replicated log (`DIR/raft`, a group of one for now).
    /// An operation-log directory started with `group` is upgraded (its files kept in
    /// `DIR/pre-raft`); a group's directory stays one whatever this says.
    #[arg(
        long = "log",
        value_enum,
        env = "STAMPFS_MASTER_LOG",
        default_value = "oplog"
    )]
    pub log: LogKind,
    /// Write a checkpoint (and trim the log) at least this often when the log has grown.
    #[arg(long, env = "STAMPFS_MASTER_CHECKPOINT_INTERVAL", value_parser = humantime::parse_duration, default_value = "10m")]
    pub checkpoint_interval: Duration,
    /// Write a checkpoint as soon as the log has grown by this many bytes since the last one.
    #[arg(long, env = "STAMPFS_MASTER_CHECKPOINT_LOG_SIZE", value_parser = stampfs_proto::units::parse_size, default_value = "64MiB")]
    pub checkpoint_log_size: u64,
    /// Most client and chunkserver connections served at once; further ones wait.
    #[arg(long, env = "STAMPFS_MASTER_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Timeout of each command the master sends to a chunkserver (connect and reply).
    #[arg(long, env = "STAMPFS_MASTER_COMMAND_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub command_timeout: Duration,
    /// How often the replica-health worker runs (stale and orphan replica deletion,
    /// re-replication, over-replication, trash expiry); 0 turns it off.
    #[arg(long, env = "STAMPFS_MASTER_HEALTH_INTERVAL", value_parser = humantime::parse_duration, default_value = "2s")]
    pub health_interval: Duration,
    /// Re-replications running at once per chunkserver (as source or as target).
    #[arg(
        long,
        env = "STAMPFS_MASTER_MAX_REPLICATION_STREAMS",
        default_value_t = 2
    )]
    pub max_replication_streams: usize,
    /// How long a re-replication (or a deletion or finalize sent in a heartbeat reply)
    /// may take before it is considered lost and ordered again.
    #[arg(long, env = "STAMPFS_MASTER_REPLICATION_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub replication_timeout: Duration,
    /// How long `rm` keeps a file in the trash (/.trash/<user>/Current, then a
    /// checkpoint taken at most half this later) before its chunks are deleted; 0
    /// deletes at once.
    #[arg(long, env = "STAMPFS_MASTER_TRASH_FOR", value_parser = humantime::parse_duration, default_value = "1h")]
    pub trash_for: Duration,
    /// Safe mode (no replica deletions or copies after a start) ends once this share
    /// of the chunks has a replica reported (0 to 1).
    #[arg(long, env = "STAMPFS_MASTER_SAFEMODE_THRESHOLD", value_parser = parse_share, default_value = "0.999")]
    pub safemode_threshold: f64,
    /// How long the safe mode threshold must hold before safe mode ends.
    #[arg(long, env = "STAMPFS_MASTER_SAFEMODE_EXTENSION", value_parser = humantime::parse_duration, default_value = "0s")]
    pub safemode_extension: Duration,
    /// How long a replica of a chunk the master does not know (or knows only as
    /// deleted) may stay on a chunkserver before it is deleted.
    #[arg(long, env = "STAMPFS_MASTER_ORPHAN_GRACE", value_parser = humantime::parse_duration, default_value = "10m")]
    pub orphan_grace: Duration,
    /// This master's member id in its group (`--peers` names each member by id).
    #[arg(long, env = "STAMPFS_MASTER_ID", default_value_t = 1)]
    pub id: u64,
    /// The master group's members, `ID=HOST:PORT,...` (1, 3 or 5 of them; this master's
    /// `--id` among them at its `--listen` address; all with the same
    /// `--cluster-key-file`). Implies `--log group`. Read when the directory is new:
    /// after that the membership is in the group's log.
    #[arg(long, env = "STAMPFS_MASTER_PEERS", value_delimiter = ',', value_parser = parse_peer)]
    pub peers: Vec<PeerArg>,
    /// Start as a new member of an existing master group, on a new directory: it
    /// serves nothing until the leader adds it (`stampfs admin masters add ID ADDR`)
    /// and sends it the group's state. Implies `--log group`; needs `--id` and the
    /// group's `--cluster-key-file`.
    #[arg(long, env = "STAMPFS_MASTER_JOIN")]
    pub join: bool,
    /// Serve Prometheus metrics over HTTP on this address (`GET /metrics`; port 0:
    /// any free port, written to DIR/metrics-addr). None without it.
    #[arg(long, env = "STAMPFS_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// With it, the metrics port answers only requests that present the token in this
    /// file (`Authorization: Bearer TOKEN`, or as the password of HTTP basic
    /// authentication); others get 401. Without it, anyone who reaches the port may
    /// read the metrics (and the master's status page, which names paths and clients).
    #[arg(long, env = "STAMPFS_METRICS_TOKEN_FILE", requires = "metrics_listen")]
    pub metrics_token_file: Option<PathBuf>,
    /// Entries of the group's log kept behind each snapshot, for members that fall
    /// behind; a member further behind is sent the leader's snapshot instead.
    #[arg(long, env = "STAMPFS_MASTER_GROUP_LOG_KEEP", default_value_t = DEFAULT_GROUP_LOG_KEEP)]
    pub group_log_keep: u64,
}

/// `--group-log-keep`'s default.
pub const DEFAULT_GROUP_LOG_KEEP: u64 = 4096;

/// One `--peers` entry: a member's id and address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerArg {
    pub id: u64,
    pub addr: String,
}

fn parse_peer(s: &str) -> std::result::Result<PeerArg, String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not ID=HOST:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("`{id}` in `{s}` is not a member id (a number above 0)"))?;
    let addr = addr.trim();
    if id == 0 || addr.is_empty() {
        return Err(format!("`{s}` is not ID=HOST:PORT with an id above 0"));
    }
    Ok(PeerArg {
        id,
        addr: addr.to_string(),
    })
}

/// Which log the master keeps its metadata in (`--log`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogKind {
    /// The operation log with group commit.
    #[default]
    Oplog,
    /// The master group's log through openraft, as a group of one.
    Group,
}

impl LogKind {
    /// `STAMPFS_MASTER_LOG` (`oplog` or `group`) when set, else the operation log:
    /// what [`MasterConfig::new`] starts with, so a test suite runs either way. Any
    /// other value is named in a warning and the operation log used.
    pub fn from_env() -> Self {
        match std::env::var("STAMPFS_MASTER_LOG").as_deref() {
            Ok("group") => LogKind::Group,
            Ok("oplog") | Err(std::env::VarError::NotPresent) => LogKind::Oplog,
            Ok(other) => {
                tracing::warn!(
                    value = other,
                    "STAMPFS_MASTER_LOG is neither `oplog` nor `group`: using the operation log"
                );
                LogKind::Oplog
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                tracing::warn!("STAMPFS_MASTER_LOG is not UTF-8: using the operation log");
                LogKind::Oplog
            }
        }
    }
}

impl MasterConfig {
    /// A configuration with every default, listening on an ephemeral loopback port.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            listen: "127.0.0.1:0".to_string(),
            cluster_key_file: None,
            tls: TlsFiles::default(),
            replication: 3,
            chunk_size: 64 << 20,
            min_replication: 1,
            dead_after: Duration::from_secs(10),
            lease_soft: Duration::from_secs(60),
            lease_hard: Duration::from_secs(300),
            log: LogKind::from_env(),
            checkpoint_interval: Duration::from_secs(600),
            checkpoint_log_size: 64 << 20,
            max_connections: 1024,
            command_timeout: Duration::from_secs(5),
            health_interval: Duration::from_secs(2),
            max_replication_streams: 2,
            replication_timeout: Duration::from_secs(60),
            trash_for: Duration::from_secs(3600),
            safemode_threshold: 0.999,
            safemode_extension: Duration::ZERO,
            orphan_grace: Duration::from_secs(600),
            id: 1,
            peers: Vec::new(),
            group_log_keep: DEFAULT_GROUP_LOG_KEEP,
            join: false,
            metrics_listen: None,
            metrics_token_file: None,
        }
    }

    /// Whether the master keeps its records in the group's log (`--log group`, or
    /// `--peers`).
    pub fn uses_group(&self) -> bool {
        self.log == LogKind::Group || !self.peers.is_empty() || self.join
    }

    /// The cluster key file: `--cluster-key-file` or `DIR/cluster.key`.
    pub fn key_file(&self) -> PathBuf {
        self.cluster_key_file
            .clone()
            .unwrap_or_else(|| self.dir.join("cluster.key"))
    }

    fn validate_peers(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::Config {
                field: "peers",
                reason,
            })
        };
        if self.join {
            if !self.peers.is_empty() {
                return bad(
                    "--join adds this master to a group that exists: give it no --peers".into(),
                );
            }
            if self.cluster_key_file.is_none() {
                return bad(
                    "a joining member proves the group's cluster key: give it --cluster-key-file"
                        .into(),
                );
            }
            return Ok(());
        }
        if self.peers.is_empty() {
            return Ok(());
        }
        if ![1, 3, 5].contains(&self.peers.len()) {
            return bad(format!(
                "{} members: a group has 1, 3 or 5 (a majority of them must be up)",
                self.peers.len()
            ));
        }
        let ids: std::collections::BTreeSet<u64> = self.peers.iter().map(|p| p.id).collect();
        if ids.len() != self.peers.len() {
            return bad("two members share an id".into());
        }
        let Some(me) = self.peers.iter().find(|p| p.id == self.id) else {
            return bad(format!("this master's --id {} is not among them", self.id));
        };
        if me.addr != self.listen {
            return bad(format!(
                "member {} is at {}, but this master listens on {} (--listen)",
                me.id, me.addr, self.listen
            ));
        }
        if self.peers.len() > 1 && self.cluster_key_file.is_none() {
            return bad(
                "the members of a group prove the same cluster key to each other: give each \
                 the same --cluster-key-file"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks the values make sense together.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::Config { field, reason });
        if self.dir.as_os_str().is_empty() {
            return bad("dir", "must not be empty".into());
        }
        check_replication(self.replication).map_err(|reason| Error::Config {
            field: "replication",
            reason,
        })?;
        if self.min_replication == 0 || self.min_replication > self.replication {
            return bad(
                "min-replication",
                format!(
                    "{} must be between 1 and --replication ({})",
                    self.min_replication, self.replication
                ),
            );
        }
        check_chunk_size(self.chunk_size).map_err(|reason| Error::Config {
            field: "chunk-size",
            reason,
        })?;
        if self.dead_after.is_zero() {
            return bad("dead-after", "must be above zero".into());
        }
        if self.lease_soft.is_zero() {
            return bad("lease-soft", "must be above zero".into());
        }
        if self.lease_hard < self.lease_soft {
            return bad(
                "lease-hard",
                format!(
                    "{} is below --lease-soft ({})",
                    humantime::format_duration(self.lease_hard),
                    humantime::format_duration(self.lease_soft)
                ),
            );
        }
        if self.checkpoint_interval.is_zero() {
            return bad("checkpoint-interval", "must be above zero".into());
        }
        if self.checkpoint_log_size == 0 {
            return bad("checkpoint-log-size", "must be above zero".into());
        }
        if self.max_connections == 0 {
            return bad("max-connections", "must be above zero".into());
        }
        self.validate_peers()?;
        if self.command_timeout.is_zero() {
            return bad("command-timeout", "must be above zero".into());
        }
        if self.max_replication_streams == 0 {
            return bad("max-replication-streams", "must be at least 1".into());
        }
        if self.replication_timeout.is_zero() {
            return bad("replication-timeout", "must be above zero".into());
        }
        Ok(())
    }
}

/// Checks a replication factor (cluster default or per file).
pub(crate) fn check_replication(r: u8) -> std::result::Result<(), String> {
    if r == 0 || r > MAX_REPLICATION {
        Err(format!(
            "replication {r} is not between 1 and {MAX_REPLICATION}"
        ))
    } else {
        Ok(())
    }
}

/// Checks a chunk size (cluster default or per file).
pub(crate) fn check_chunk_size(s: u64) -> std::result::Result<(), String> {
    if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&s) {
        Err(format!(
            "chunk size {s} is not between {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE} bytes"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        master: MasterConfig,
    }

    #[test]
    fn defaults_validate() {
        MasterConfig::new("/tmp/x".into())
            .validate()
            .expect("valid");
        let cli = Cli::try_parse_from(["t", "--dir", "/d"]).expect("parse");
        assert_eq!(cli.master.chunk_size, 64 << 20);
        assert_eq!(cli.master.listen, "127.0.0.1:7070");
        assert_eq!(cli.master.lease_hard, Duration::from_secs(300));
        cli.master.validate().expect("valid");
        assert_eq!(cli.master.key_file(), PathBuf::from("/d/cluster.key"));
    }

    #[test]
    fn flags_parse_units() {
        let cli = Cli::try_parse_from([
            "t",
            "--dir",
            "/d",
            "--chunk-size",
            "1MiB",
            "--lease-soft",
            "2s",
            "--lease-hard",
            "5s",
        ])
        .expect("parse");
        assert_eq!(cli.master.chunk_size, 1 << 20);
        assert_eq!(cli.master.lease_soft, Duration::from_secs(2));
    }

    #[test]
    fn replica_health_flags_parse_and_validate() {
        let cli = Cli::try_parse_from([
            "t",
            "--dir",
            "/d",
            "--health-interval",
            "0",
            "--trash-for",
            "0",
            "--orphan-grace",
            "1s",
            "--max-replication-streams",
            "5",
        ])
        .expect("parse");
        assert!(
            cli.master.health_interval.is_zero(),
            "0 turns the worker off"
        );
        assert!(cli.master.trash_for.is_zero());
        assert_eq!(cli.master.orphan_grace, Duration::from_secs(1));
        assert_eq!(cli.master.max_replication_streams, 5);
        cli.master.validate().expect("valid");
        let d = Cli::try_parse_from(["t", "--dir", "/d"]).expect("defaults");
        assert_eq!(d.master.trash_for, Duration::from_secs(3600));
        assert_eq!(d.master.max_replication_streams, 2);
        let mut c = MasterConfig::new("/d".into());
        c.max_replication_streams = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max-replication-streams"));
    }

    #[test]
    fn bad_values_name_the_flag() {
        let mut c = MasterConfig::new("/d".into());
        c.min_replication = 4;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("min-replication"));
        let mut c = MasterConfig::new("/d".into());
        c.lease_hard = Duration::from_secs(1);
        assert!(c.validate().unwrap_err().to_string().contains("lease-hard"));
        let mut c = MasterConfig::new("/d".into());
        c.chunk_size = 10;
        assert!(c.validate().unwrap_err().to_string().contains("chunk-size"));
        let mut c = MasterConfig::new("/d".into());
        c.replication = 0;
        assert!(c.validate().is_err());
    }
}
