//! Chunkserver configuration (`stampfs chunkserver ...` flags).
//!
//! Each flag `--foo-bar` can also be set by the environment variable
//! `STAMPFS_CHUNKSERVER_FOO_BAR` (except `--master`: `STAMPFS_MASTER`, as for every
//! client; `--metrics-listen`: `STAMPFS_METRICS_LISTEN`, shared with the master) and by
//! the key `foo-bar` of the `--config FILE` the binary reads (`src/config_file.rs` in the
//! `stampfs` crate; the command line wins over the environment, which wins over the
//! file). A new flag here is a new config key; give it its variable too (a test there
//! checks that every flag has one).

use crate::error::{Error, Result};
use stampfs_proto::net::TlsFiles;
use stampfs_proto::units::parse_size;
use std::path::PathBuf;
use std::time::Duration;

/// Which disk I/O engine runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoEngineKind {
    /// io_uring when a probe succeeds, plain threads otherwise.
    #[default]
    Auto,
    /// io_uring; start-up fails when it is unavailable.
    Uring,
    /// Blocking pread/pwrite/fdatasync on a thread pool.
    Threads,
}

/// Everything a chunkserver needs to start.
#[derive(clap::Args, Debug, Clone)]
pub struct ChunkserverConfig {
    /// Data directory (replicas, chunkserver.id, addr file).
    #[arg(long, env = "STAMPFS_CHUNKSERVER_DIR")]
    pub dir: PathBuf,
    /// Listen address; port 0 picks a free one.
    #[arg(
        long,
        env = "STAMPFS_CHUNKSERVER_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub listen: String,
    /// The master's address.
    #[arg(long, env = "STAMPFS_MASTER", default_value = "127.0.0.1:7070")]
    pub master: String,
    /// Cluster key file shared with the master (required: the chunkserver refuses to
    /// start when it is unreadable).
    #[arg(long, env = "STAMPFS_CHUNKSERVER_CLUSTER_KEY_FILE")]
    pub cluster_key_file: PathBuf,
    /// TLS on this chunkserver's port, and to the master and chunkservers it dials.
    #[command(flatten)]
    pub tls: TlsFiles,
    /// Disk I/O engine: auto probes io_uring and falls back to threads.
    #[arg(
        long,
        env = "STAMPFS_CHUNKSERVER_IO_ENGINE",
        value_enum,
        default_value = "auto"
    )]
    pub io_engine: IoEngineKind,
    /// Interval between heartbeats to the master.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_HEARTBEAT", value_parser = humantime::parse_duration, default_value = "1s")]
    pub heartbeat: Duration,
    /// Interval between full chunk reports to the master.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_REPORT_EVERY", value_parser = humantime::parse_duration, default_value = "60s")]
    pub report_every: Duration,
    /// Address announced to the master (and through it to clients and peers); defaults
    /// to the bound listen address.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_ADVERTISE")]
    pub advertise: Option<String>,
    /// Capacity to report instead of the file system's size (e.g. 10GiB); used space is
    /// then the sum of replica lengths.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_CAPACITY", value_parser = parse_size)]
    pub capacity: Option<u64>,
    /// Most client/peer connections served at once; further ones wait in the backlog.
    #[arg(
        long,
        env = "STAMPFS_CHUNKSERVER_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
    /// Bytes of packets a write stream may hold in flight (received but not yet
    /// acknowledged upstream) before it stops reading: backpressure.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_STREAM_BUFFER", value_parser = parse_size, default_value = "16MiB")]
    pub stream_buffer: u64,
    /// Timeout for connecting to a peer or the master.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_CONNECT_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub connect_timeout: Duration,
    /// How long a pipeline waits for a downstream ack before declaring it lost (keep it
    /// below the clients' ack timeout, 15 s, so the failed replica is named precisely);
    /// also how long a downstream may take no byte of the packets forwarded to it.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_ACK_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub ack_timeout: Duration,
    /// How long a peer may stay silent before its connection is closed: a request/reply
    /// connection that sends no request, or a write stream whose upstream sends no
    /// packet while none of its packets waits for an ack (packets in flight are
    /// governed by `--ack-timeout` instead), or a replica copy whose sender sends no
    /// packet. Every frame received (and, on a write stream, every ack sent) restarts
    /// it. It also bounds writes: a peer that takes no byte of a reply, an ack or a
    /// replica copy for this long has stopped reading and is treated as gone (every
    /// byte it takes restarts the clock, so a slow reader of a large reply is not cut).
    /// Frees the connection permit, the stream and the read budget of a frozen or
    /// vanished peer.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_IDLE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub idle_timeout: Duration,
    /// Replications to other chunkservers running at once.
    #[arg(
        long,
        env = "STAMPFS_CHUNKSERVER_MAX_REPLICATIONS",
        default_value_t = 4
    )]
    pub max_replications: usize,
    /// Background scrub rate: replicas are read back and their checksums verified at
    /// this many bytes per second (e.g. 8MiB); 0 turns the scrub off.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_SCRUB_RATE", value_parser = parse_size, default_value = "8MiB")]
    pub scrub_rate: u64,
    /// Most replica deletions (ordered by the master) run per second.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_DELETE_RATE", default_value_t = 50)]
    pub delete_rate: u32,
    /// Start writing a replica's appended data back to disk every this many bytes,
    /// without waiting (write-behind), so syncs find little left to flush and the
    /// disk works while packets stream in; 0 turns it off.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_WRITE_BEHIND", value_parser = parse_size, default_value = "2MiB")]
    pub write_behind: u64,
    /// Most replica files kept open at once (least recently used closed first; a
    /// replica not open costs no descriptor). Operations in flight keep an evicted
    /// file open until they finish, so descriptors may exceed it by those. 0 picks
    /// max(64, soft open-file limit / 2), leaving the rest for sockets.
    #[arg(long, env = "STAMPFS_CHUNKSERVER_MAX_OPEN_FILES", default_value_t = 0)]
    pub max_open_files: usize,
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
}

impl ChunkserverConfig {
    /// A configuration with every default.
    pub fn new(dir: PathBuf, master: String, cluster_key_file: PathBuf) -> Self {
        Self {
            dir,
            listen: "127.0.0.1:0".into(),
            master,
            cluster_key_file,
            tls: TlsFiles::default(),
            io_engine: IoEngineKind::Auto,
            heartbeat: Duration::from_secs(1),
            report_every: Duration::from_secs(60),
            advertise: None,
            capacity: None,
            max_connections: 1024,
            stream_buffer: 16 << 20,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_replications: 4,
            scrub_rate: 8 << 20,
            delete_rate: 50,
            write_behind: crate::store::DEFAULT_WRITE_BEHIND,
            max_open_files: 0,
            metrics_listen: None,
            metrics_token_file: None,
        }
    }

    /// The replica file cache's capacity for a soft open-file limit of `soft` (`None`:
    /// unlimited): `--max-open-files`, or [`crate::fdcache::auto_capacity`] when 0.
    pub fn open_files_capacity(&self, soft: Option<u64>) -> usize {
        match self.max_open_files {
            0 => crate::fdcache::auto_capacity(soft),
            n => n,
        }
    }

    /// Checks every value; the error names the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: &str| {
            Err(Error::Config {
                field,
                reason: reason.into(),
            })
        };
        if self.dir.as_os_str().is_empty() {
            return bad("dir", "must not be empty");
        }
        if self.listen.trim().is_empty() {
            return bad("listen", "must not be empty");
        }
        if self.master.trim().is_empty() {
            return bad("master", "must not be empty");
        }
        if self.heartbeat.is_zero() {
            return bad("heartbeat", "must be greater than zero");
        }
        if self.report_every.is_zero() {
            return bad("report-every", "must be greater than zero");
        }
        if self.connect_timeout.is_zero() {
            return bad("connect-timeout", "must be greater than zero");
        }
        if self.ack_timeout.is_zero() {
            return bad("ack-timeout", "must be greater than zero");
        }
        if self.idle_timeout.is_zero() {
            return bad("idle-timeout", "must be greater than zero");
        }
        if self.max_connections == 0 {
            return bad("max-connections", "must be at least 1");
        }
        if self.max_replications == 0 {
            return bad("max-replications", "must be at least 1");
        }
        if self.delete_rate == 0 {
            return bad("delete-rate", "must be at least 1");
        }
        if !(64 << 10..=1 << 30).contains(&self.stream_buffer) {
            return bad("stream-buffer", "must be between 64KiB and 1GiB");
        }
        if self.max_open_files as u64 > stampfs_proto::limits::UNLIMITED_WANT {
            return bad(
                "max-open-files",
                "must be at most 1048576 (the kernel's default ceiling); 0 picks it",
            );
        }
        if let Some(a) = &self.advertise {
            if a.trim().is_empty() {
                return bad("advertise", "must not be empty");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cs: ChunkserverConfig,
    }

    #[test]
    fn defaults_are_valid() {
        let c = ChunkserverConfig::new("/tmp/x".into(), "127.0.0.1:7070".into(), "k".into());
        c.validate().expect("defaults validate");
    }

    #[test]
    fn flags_parse_with_humantime_and_sizes() {
        let cli = Cli::try_parse_from([
            "cs",
            "--dir",
            "/d",
            "--cluster-key-file",
            "/k",
            "--master",
            "m:1",
            "--io-engine",
            "threads",
            "--heartbeat",
            "250ms",
            "--stream-buffer",
            "4MiB",
            "--capacity",
            "1GiB",
            "--idle-timeout",
            "300ms",
        ])
        .expect("parses");
        assert_eq!(cli.cs.io_engine, IoEngineKind::Threads);
        assert_eq!(cli.cs.heartbeat, Duration::from_millis(250));
        assert_eq!(cli.cs.stream_buffer, 4 << 20);
        assert_eq!(cli.cs.capacity, Some(1 << 30));
        assert_eq!(cli.cs.idle_timeout, Duration::from_millis(300));
        assert_eq!(cli.cs.report_every, Duration::from_secs(60));
        assert_eq!(cli.cs.write_behind, crate::store::DEFAULT_WRITE_BEHIND);
        cli.cs.validate().expect("valid");
        let defaults =
            Cli::try_parse_from(["cs", "--dir", "/d", "--cluster-key-file", "/k"]).expect("parses");
        assert_eq!(defaults.cs.idle_timeout, Duration::from_secs(60));
        assert_eq!(defaults.cs.max_open_files, 0, "auto by default");
        assert_eq!(defaults.cs.open_files_capacity(Some(4096)), 2048);
        let set = Cli::try_parse_from([
            "cs",
            "--dir",
            "/d",
            "--cluster-key-file",
            "/k",
            "--max-open-files",
            "16",
        ])
        .expect("parses");
        assert_eq!(set.cs.open_files_capacity(Some(4096)), 16);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let mut c = ChunkserverConfig::new("/d".into(), "m:1".into(), "k".into());
        c.heartbeat = Duration::ZERO;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("--heartbeat"), "{err}");
        let mut c = ChunkserverConfig::new("/d".into(), "m:1".into(), "k".into());
        c.stream_buffer = 10;
        assert!(c.validate().is_err());
        let mut c = ChunkserverConfig::new("/d".into(), "m:1".into(), "k".into());
        c.idle_timeout = Duration::ZERO;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("--idle-timeout"), "{err}");
        let mut c = ChunkserverConfig::new("/d".into(), "m:1".into(), "k".into());
        c.max_open_files = 1 << 21;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("--max-open-files"), "{err}");
    }
}
