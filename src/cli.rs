//! Command-line arguments of the `stampfs` binary.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

mod admin;
pub use admin::{AdminCommand, MastersCommand, QuotaCommand, SafemodeArg, UserCommand};

/// stampfs: a distributed block store whose chunk versions fence stale writers.
#[derive(Parser, Debug)]
#[command(name = "stampfs", version = crate::VERSION, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The master to talk to.
#[derive(Args, Debug, Clone)]
pub struct MasterAddr {
    /// Address of the master.
    #[arg(long, env = "STAMPFS_MASTER", default_value = "127.0.0.1:7070")]
    pub master: String,
    /// The user's credentials file (its name and key). Default: the file named by
    /// STAMPFS_CREDENTIALS, else ~/.config/stampfs/credentials. A master writes its
    /// superuser's to DIR/admin.credentials at its first start.
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
    /// Certificate authority (PEM) of a cluster that serves TLS: the master and the
    /// chunkservers are dialed over TLS and their certificates checked against it.
    #[arg(long, env = "STAMPFS_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the master (namespace, chunk versions, leases, placement).
    Master(stampfs_master::MasterConfig),
    /// Run a chunkserver (replicas on local disk, the fenced write pipeline).
    Chunkserver(stampfs_chunkserver::ChunkserverConfig),
    /// Run a master and N chunkservers in this process, for trying stampfs out.
    Dev(DevArgs),
    /// Store a local file (or stdin with `-`) as REMOTE.
    Put(PutArgs),
    /// Append a local file (or stdin with `-`) to REMOTE.
    Append(AppendArgs),
    /// Write a local file (or stdin with `-`) into REMOTE at --offset, over what is
    /// there (anywhere in the file, or past its end: a gap reads as zeros).
    Write(WriteArgs),
    /// Set REMOTE's length: a longer file reads zeros past its old end; a shorter one is
    /// cut (the chunks past the new end are dropped).
    Truncate(TruncateArgs),
    /// Copy REMOTE to a local file (or stdout with `-`).
    Get(GetArgs),
    /// Print REMOTE on stdout.
    Cat(CatArgs),
    /// List a directory.
    Ls(LsArgs),
    /// Space used under each entry of PATH (`-s`: PATH's total), as `hdfs dfs -du`.
    Du(DuArgs),
    /// Directories, files and bytes under PATH, as `hdfs dfs -count`.
    Count(CountArgs),
    /// The cluster's raw capacity, used and available space over its live
    /// chunkservers (every replica counts), as `hdfs dfs -df`.
    Df(DfArgs),
    /// Print the last 1 KiB of a file (`-f`: and what is appended to it after), as
    /// `hdfs dfs -tail`.
    Tail(TailArgs),
    /// Exit 0 when PATH passes the test (`-e` exists, `-d` directory, `-f` file, `-z`
    /// empty file), 1 when it does not, 2 when it cannot tell (as `hdfs dfs -test`).
    Test(TestArgs),
    /// Create an empty file (nothing when an empty file is there; an error for one
    /// that holds bytes), as `hdfs dfs -touchz`.
    Touchz(TouchzArgs),
    /// Create a directory.
    Mkdir(MkdirArgs),
    /// Create a symbolic link (`ln -s TARGET LINK`; stampfs stores the target and
    /// never follows it: a mount's kernel does).
    Ln(LnArgs),
    /// Print the target of a symbolic link.
    Readlink(ReadlinkArgs),
    /// Change the permission bits of PATH (octal, as `chmod 0755`; a symbolic link's
    /// mode cannot change).
    Chmod(ChmodArgs),
    /// Change the owner of PATH: numeric `UID`, `UID:GID` or `:GID` (stampfs keeps
    /// numbers; a mount shows them as the local names of those ids).
    Chown(ChownArgs),
    /// Remove a file or directory: into the trash (`/.trash/<user>/Current/<path>`)
    /// while the master keeps one (`--trash-for`), at once with --skip-trash.
    Rm(RmArgs),
    /// Set the replication factor of a file, or of every file under a directory
    /// (`hdfs dfs -setrep`); the master copies or trims replicas in the background.
    Setrep(SetrepArgs),
    /// What `rm` kept in the trash: list it, restore it.
    #[command(subcommand)]
    Trash(TrashCommand),
    /// Rename a file or directory.
    Mv(MvArgs),
    /// Show a file's status, chunks, versions and replicas.
    Stat(StatArgs),
    /// Recover the write lease of a file whose writer died or hung, and close it.
    Recover(RecoverArgs),
    /// Check replica health of the files under PATH (default /); exit 0 only when healthy.
    Fsck(FsckArgs),
    /// Cluster administration.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Mount stampfs with FUSE.
    Mount(MountArgs),
    /// Show lease recovery and fencing of a paused writer on a local cluster.
    Demo(DemoArgs),
    /// Benchmarks: the write pipeline, and the master.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Randomized process faults against a real local cluster, judged by a history
    /// checker; exits non-zero when a run finds a violation.
    Nemesis(NemesisArgs),
    /// One client process of `stampfs nemesis` (started by it).
    #[command(hide = true)]
    NemesisClient(stampfs_nemesis::workload::WorkloadConfig),
    /// The writer process of `stampfs demo` (started by it): writes each stdin line
    /// `OFFSET TEXT` as `TEXT\n` at OFFSET of PATH and hsyncs it.
    #[command(hide = true)]
    DemoWriter(DemoWriterArgs),
}

#[derive(Args, Debug)]
pub struct DemoWriterArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// The file, opened for writes anywhere (created when missing).
    pub path: String,
}

#[derive(Args, Debug)]
pub struct DevArgs {
    /// Data directory (a temporary one by default, removed on exit).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Number of chunkservers.
    #[arg(long, default_value_t = 3)]
    pub chunkservers: usize,
    /// Master listen address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Default replication factor of new files (at most the number of chunkservers).
    #[arg(long, default_value_t = 3)]
    pub replication: u8,
    /// Default chunk size of new files.
    #[arg(long, value_parser = stampfs_proto::units::parse_size, default_value = "64MiB")]
    pub chunk_size: u64,
    /// Serve TLS on every port, with a throwaway certificate authority and a
    /// certificate for 127.0.0.1 and localhost written to DIR/tls.
    #[arg(long)]
    pub tls: bool,
}

#[derive(Args, Debug)]
pub struct PutArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Local file, or `-` for stdin.
    pub local: String,
    /// Destination path in stampfs.
    pub remote: String,
    /// Replicas per chunk (master default when absent).
    #[arg(long)]
    pub replication: Option<u8>,
    /// Chunk size, e.g. 64MiB (master default when absent).
    #[arg(long, value_parser = stampfs_proto::units::parse_size)]
    pub chunk_size: Option<u64>,
    /// Replace REMOTE if it exists.
    #[arg(long, short)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct AppendArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Local file, or `-` for stdin.
    pub local: String,
    /// File in stampfs to append to.
    pub remote: String,
}

#[derive(Args, Debug)]
pub struct WriteArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// File in stampfs to write into.
    pub remote: String,
    /// Local file, or `-` for stdin.
    #[arg(default_value = "-")]
    pub local: String,
    /// Byte offset in REMOTE where the first byte goes, e.g. 0 or 4KiB.
    #[arg(long, value_parser = stampfs_proto::units::parse_size)]
    pub offset: u64,
    /// Create REMOTE when it does not exist.
    #[arg(long)]
    pub create: bool,
}

#[derive(Args, Debug)]
pub struct TruncateArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub remote: String,
    /// The new length, e.g. 0 or 1MiB.
    #[arg(value_parser = stampfs_proto::units::parse_size)]
    pub size: u64,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub remote: String,
    /// Local file (into an existing directory: under REMOTE's name there), or `-` for
    /// stdout.
    pub local: String,
    /// Replace an existing local file.
    #[arg(long, short)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct CatArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub remote: String,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Long listing: mode, owner, replication, length, state, modification time, name.
    #[arg(short = 'l')]
    pub long: bool,
    /// Recursive: every entry below PATH, by full path, each directory followed by
    /// its own entries (depth first, in name order), as `hdfs dfs -ls -R`.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
    #[arg(default_value = "/")]
    pub path: String,
}

#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct DuArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Print help (`-h` is `--human`, as in `hdfs dfs`).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// One line: PATH's total.
    #[arg(short = 's')]
    pub summary: bool,
    /// Sizes in binary units (KiB, MiB, ...).
    #[arg(short = 'h', long = "human")]
    pub human: bool,
    #[arg(default_value = "/")]
    pub path: String,
}

#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct CountArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Print help (`-h` is `--human`, as in `hdfs dfs`).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Sizes in binary units (KiB, MiB, ...).
    #[arg(short = 'h', long = "human")]
    pub human: bool,
    /// Quotas first: QUOTA REM_QUOTA SPACE_QUOTA REM_SPACE_QUOTA, then the counts.
    #[arg(short = 'q')]
    pub quotas: bool,
    /// Quotas and their use only (no walk of the tree).
    #[arg(short = 'u', conflicts_with = "quotas")]
    pub quota_use: bool,
    /// A header line naming the columns.
    #[arg(short = 'v')]
    pub header: bool,
    #[arg(default_value = "/")]
    pub path: String,
}

#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct DfArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Print help (`-h` is `--human`, as in `hdfs dfs`).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Sizes in binary units (KiB, MiB, ...).
    #[arg(short = 'h', long = "human")]
    pub human: bool,
    /// A path of the file system (it must exist; stampfs has one file system, so
    /// every path shows the same space).
    #[arg(default_value = "/")]
    pub path: String,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Follow: print what is appended to the file as it grows (what its writer has
    /// made visible), until Ctrl-C, SIGTERM or a closed stdout; the file's removal
    /// ends it with an error.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// How often `-f` looks for new bytes.
    #[arg(short = 's', long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub sleep_interval: std::time::Duration,
    pub path: String,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true)))]
pub struct TestArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// PATH exists.
    #[arg(short = 'e', group = "what")]
    pub exists: bool,
    /// PATH is a directory.
    #[arg(short = 'd', group = "what")]
    pub directory: bool,
    /// PATH is a file.
    #[arg(short = 'f', group = "what")]
    pub file: bool,
    /// PATH is a file of length 0.
    #[arg(short = 'z', group = "what")]
    pub empty: bool,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct TouchzArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct MkdirArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Create missing parents; no error if it exists.
    #[arg(short = 'p')]
    pub parents: bool,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct LnArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Make a symbolic link (the only kind of link stampfs has; required).
    #[arg(short = 's', long = "symbolic", required = true)]
    pub symbolic: bool,
    /// What the link points to, stored as given.
    pub target: String,
    /// The link to create.
    pub link: String,
}

#[derive(Args, Debug)]
pub struct ChmodArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Change every entry below PATH too (symbolic links are skipped: their mode is
    /// always 0777).
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Octal mode, up to 7777.
    pub mode: String,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct ChownArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Change every entry below PATH too (links themselves, never followed): what an
    /// upgrade from before attributes needs, where everything is root's.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// `UID`, `UID:GID` or `:GID`, numeric.
    pub owner: String,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct ReadlinkArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Remove directories and their contents.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Delete at once, not into the trash.
    #[arg(long)]
    pub skip_trash: bool,
    pub path: String,
}

#[derive(Args, Debug)]
pub struct SetrepArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// Accepted for HDFS's sake: a directory is always walked.
    #[arg(short = 'R')]
    pub recursive: bool,
    /// Wait until every chunk has exactly N replicas.
    #[arg(short = 'w')]
    pub wait: bool,
    /// The replication factor (1 to 16).
    pub replication: u8,
    pub path: String,
}

#[derive(Subcommand, Debug)]
pub enum TrashCommand {
    /// What your trash holds: each entry with its original path, and when it was
    /// removed (`Current`) or checkpointed (a checkpoint goes `--trash-for` after it
    /// was taken).
    List {
        #[command(flatten)]
        master: MasterAddr,
        /// Another user's trash (superusers).
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Put an entry back where it was removed from: PATH is its original path (the
    /// entry at that path in Current, else in the newest checkpoint that holds one;
    /// one kept under a second name, `name.<ms>`, is restored by its trash path) or
    /// its path in the trash.
    Restore {
        #[command(flatten)]
        master: MasterAddr,
        path: String,
        /// Restore it here instead of at its original path.
        #[arg(long)]
        to: Option<String>,
        /// Another user's trash (superusers).
        #[arg(long)]
        user: Option<String>,
    },
}

#[derive(Args, Debug)]
pub struct MvArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub src: String,
    /// The new path; an existing directory takes SRC under its own name.
    pub dst: String,
}

#[derive(Args, Debug)]
pub struct StatArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub path: String,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub path: String,
    /// When no replica of the file's last chunk is reachable, declare them lost and
    /// close the file at the master's committed length (bytes acknowledged past it are
    /// lost). Without it such a file waits in recovery until a replica is back.
    #[arg(long)]
    pub accept_loss: bool,
}

#[derive(Args, Debug)]
pub struct FsckArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    pub path: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// Mount stampfs at MOUNTPOINT with FUSE (as root: through /dev/fuse, nothing else
/// needed). Writes may go anywhere in a file; close(2) is hflush, fsync(2) is hsync.
/// Unmount with `umount MOUNTPOINT`, or SIGINT/SIGTERM to the server; both close open
/// files first.
#[derive(Args, Debug)]
pub struct MountArgs {
    #[command(flatten)]
    pub master: MasterAddr,
    /// An existing, empty directory (any directory with --nonempty), not already a
    /// stampfs mount.
    ///
    /// close(2) is hflush (visible to every reader), fsync(2) is hsync. A live stampfs
    /// mount there, or a stale one whose server died (`umount -l` it), is refused.
    pub mountpoint: PathBuf,
    /// Mount over a directory that is not empty, hiding what it holds until the
    /// unmount (libfuse's `-o nonempty`).
    #[arg(long)]
    pub nonempty: bool,
    /// Let users other than root use the mount, each with their own permissions
    /// (checked by the kernel on the stored modes, and by the master). Only for a
    /// mount run as root. Identities are not authenticated yet.
    #[arg(long)]
    pub allow_other: bool,
    /// How long the mount and the kernel trust the attributes and directory entries
    /// they learned (a directory walked name by name is listed whole, once per this
    /// time). Another client's changes show within it (like mfsmount's attribute and
    /// entry cache timeouts). 0 asks the master every time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub cache_timeout: std::time::Duration,
    /// How long a name missing from the mount's listing of its directory is taken not
    /// to exist: the lookup that starts every create of a new name is then answered
    /// without the master. A name another client makes meanwhile is not seen for that
    /// long (mfsmount's negative entry cache timeout). Default 0: always ask.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub negative_timeout: std::time::Duration,
    /// Threads reading requests from the kernel. All but one serve a namespace request
    /// (lookup, create, mkdir, unlink, rename, listing...) to its end themselves, as
    /// mfsmount's worker threads do; one always stays free to read, and reads and
    /// writes of open files run on the mount's runtime. With 1, every request runs
    /// on the runtime.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// Serve in this process until SIGINT/SIGTERM or `umount`, logging on stderr (or
    /// to --log-file).
    ///
    /// Without it, stampfs starts a server in the background (its own session, cwd
    /// `/`), waits until the mount is ready, prints the server's pid and where it logs
    /// and exits 0 (or prints the error and exits 1). The server then holds none of
    /// this command's stdin, stdout or stderr.
    #[arg(long)]
    pub foreground: bool,
    /// Where the server logs (appended). Default in the background:
    /// `$XDG_RUNTIME_DIR/stampfs/`, else `/run/stampfs/` as root, else
    /// `/tmp/stampfs-$UID/`, named after the mount point (`/mnt/x` logs to
    /// `mount-mnt-x.log`). Default with --foreground: stderr.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Internal: set on the server a background `stampfs mount` starts. It starts a
    /// session of its own and, once the mount is ready, points stdin and stdout at
    /// /dev/null and stderr at --log-file.
    #[arg(long, hide = true, requires = "log_file")]
    pub detach_when_ready: bool,
}

#[derive(Args, Debug)]
pub struct DemoArgs {}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Write throughput and latency through the full pipeline, next to the raw disk.
    Pipeline(BenchPipelineArgs),
    /// The master's throughput, latency and memory per file and chunk, driven by client
    /// tasks and simulated chunkservers (after HDFS's NNThroughputBenchmark).
    Master(BenchMasterArgs),
    /// Metadata operations (create+close, stat, unlink, mkdir, rmdir) through mounted
    /// file systems, single-threaded, each target in turn in the same run.
    MountMetadata(BenchMountArgs),
    /// Data through mounted file systems: sequential write and read of --size, and
    /// 4 KiB pwrite+fsync at random offsets, each target in turn in the same run.
    MountIo(BenchMountIoArgs),
}

#[derive(Args, Debug, Clone)]
pub struct BenchMountIoArgs {
    /// A directory to measure in, as NAME=DIR (repeatable; the first is the baseline of
    /// the `vs first` column). One file is written there per round and removed after.
    #[arg(long = "target", value_parser = crate::bench_mount::parse_target, required = true)]
    pub targets: Vec<(String, PathBuf)>,
    /// Bytes of the sequentially written and read file.
    #[arg(long, value_parser = stampfs_proto::units::parse_size, default_value = "2GiB")]
    pub size: u64,
    /// Bytes per write and read call of the sequential phases (a multiple of 4KiB).
    #[arg(long, value_parser = stampfs_proto::units::parse_size, default_value = "1MiB")]
    pub block: u64,
    /// 4 KiB pwrite+fsync pairs at random offsets of the file.
    #[arg(long, default_value_t = 1000)]
    pub sync_ops: u64,
    /// The random offsets fall in the first SPAN bytes of the file (default: all of
    /// it). A span within one chunk shows a stampfs writer's steady state; a wider one
    /// its move from chunk to chunk (a new lease on each, DESIGN.md).
    #[arg(long, value_parser = stampfs_proto::units::parse_size)]
    pub sync_span: Option<u64>,
    /// Seed of the data pattern and the random offsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Rounds; every phase runs on every target once per round.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Keep the page cache before the read phase (by default it is dropped, as root).
    #[arg(long)]
    pub warm: bool,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchMountArgs {
    /// A directory to measure in, as NAME=DIR (repeatable; the first is the baseline of
    /// the `vs first` column). A fresh subdirectory is made there per round.
    #[arg(long = "target", value_parser = crate::bench_mount::parse_target, required = true)]
    pub targets: Vec<(String, PathBuf)>,
    /// Files (and directories) per phase.
    #[arg(long, default_value_t = 5000)]
    pub files: u64,
    /// Rounds; every phase runs on every target once per round.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Small writes plus fdatasync timed on `--dir`'s disk, appending and overwriting
    /// (0: none).
    #[arg(long, default_value_t = 500)]
    pub sync_probe: u64,
    /// Directory for the fdatasync probe (default: the current directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// How `stampfs bench master` reaches the master.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchVia {
    /// Direct calls to the master's request layer (`stampfs_master::service::Core`),
    /// the methods its connection handlers call: the master alone, no wire.
    Service,
    /// The wire protocol over loopback TCP (`RpcClient`, the client library's
    /// transport), one request at a time per connection: the master plus framing,
    /// sockets and wake-ups on both sides.
    Rpc,
}

#[derive(Args, Debug, Clone)]
pub struct BenchMasterArgs {
    /// Files built: each created and closed empty (create+close, and the memory per
    /// file), then reopened and given `--chunks-per-file` chunks (add chunk, and the
    /// memory per chunk).
    #[arg(long, default_value_t = 100_000)]
    pub files: u64,
    /// Chunks added to each built file.
    #[arg(long, default_value_t = 10)]
    pub chunks_per_file: u64,
    /// Simulated chunkservers (plus one dense one when `--report-replicas` is set).
    #[arg(long, default_value_t = 1000)]
    pub chunkservers: usize,
    /// Concurrent client tasks.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Operations measured for each of mkdirs, stat, open, list, rename, delete and
    /// heartbeat.
    #[arg(long, default_value_t = 100_000)]
    pub ops: u64,
    /// Size of the big full chunk report: one more simulated chunkserver (full, so
    /// placement passes it by) takes a copy of this many built chunks after the build
    /// and sends its full report, first with every replica new to the master, then
    /// twice more with every replica known (other requests timed meanwhile). 0: none.
    #[arg(long, default_value_t = 1_000_000)]
    pub report_replicas: u64,
    /// Files per directory of the built namespace (what one `list` returns).
    #[arg(long, default_value_t = 100)]
    pub files_per_dir: u64,
    /// Replication factor of the built files (1 to 3).
    #[arg(long, default_value_t = 3)]
    pub replication: u8,
    /// How client tasks and simulated chunkservers reach the master.
    #[arg(long, value_enum, default_value_t = BenchVia::Service)]
    pub via: BenchVia,
    /// The master's `--health-interval` (its default; 0 turns the replica-health
    /// worker off, whose pass scans every chunk under the state lock).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub health_interval: std::time::Duration,
    /// Masters: 1 (one master, on the log `--log` or `STAMPFS_MASTER_LOG` names), or a
    /// group of 3 or 5 in this process, replicating over loopback, each on its own
    /// directory; the benchmark drives the leader. Memory figures then hold every
    /// member's state.
    #[arg(long, default_value_t = 1)]
    pub masters: u8,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for the master's log and checkpoint (a temp dir under it, removed at
    /// the end; default: the current directory, so the disk measured is the one you
    /// are on).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchPipelineArgs {
    /// Bytes written per configuration.
    #[arg(long, value_parser = stampfs_proto::units::parse_size, default_value = "2GiB")]
    pub size: u64,
    /// Replication factors to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub replication: Vec<u8>,
    /// Packet payload size.
    #[arg(long, value_parser = stampfs_proto::units::parse_size, default_value = "64KiB")]
    pub packet: u64,
    /// Bytes in flight per writer.
    #[arg(long, value_parser = stampfs_proto::units::parse_size, default_value = "8MiB")]
    pub window: u64,
    /// I/O engines to measure (embedded cluster only), comma separated: uring, threads.
    #[arg(long, value_delimiter = ',', default_value = "uring,threads")]
    pub engine: Vec<String>,
    /// Chunk size of the benchmark files (the master's default when absent).
    #[arg(long, value_parser = stampfs_proto::units::parse_size)]
    pub chunk_size: Option<u64>,
    /// Number of small appends (4 KiB + hsync) measured per configuration (and of
    /// random 4 KiB writes + hsync with `--pattern random`).
    #[arg(long, default_value_t = 200)]
    pub small_writes: usize,
    /// Write patterns, comma separated: append (always measured: the others are
    /// compared with it), overwrite (the appended bytes written again from offset 0;
    /// needs --size below --chunk-size), random (4 KiB at random aligned offsets,
    /// each followed by hsync).
    #[arg(long, value_delimiter = ',', default_value = "append")]
    pub pattern: Vec<String>,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw throughput and ratio per configuration as an SVG plot.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Also measure every configuration over TLS (an embedded cluster serving TLS
    /// with a throwaway certificate), next to the same configuration in plain TCP.
    #[arg(long, conflicts_with = "master")]
    pub tls: bool,
    /// Use a running cluster instead of an embedded one.
    #[arg(long)]
    pub master: Option<String>,
    /// The certificate authority of a running cluster (--master) that serves TLS.
    #[arg(long, requires = "master", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Directory for the embedded cluster and the raw-disk baseline (a temp dir under
    /// the current directory by default, so it is on the disk being measured).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Start a master (or a group of 3 or 5), 4 chunkservers and N writer/reader client
/// processes in a temp dir, SIGKILL / SIGSTOP them, partition the network and fill
/// disks at random (seeded), heal, and check that every acknowledged record is intact, no stale write was
/// accepted, no reader saw bytes that were later cut and all replicas agree. A failing
/// run's data dir and logs are kept and named.
#[derive(Args, Debug)]
pub struct NemesisArgs {
    /// Seed of the first run (run i uses SEED + i); random when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Number of runs.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// How long faults are injected per run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub duration: std::time::Duration,
    /// Client processes (each a writer and a reader).
    #[arg(long, default_value_t = 3)]
    pub clients: usize,
    /// Masters: 1 (a master on its operation log), or 3 or 5 (a master group through
    /// openraft, whose members are killed, stopped and partitioned like the other
    /// processes).
    #[arg(long, default_value_t = 1, value_parser = masters_count)]
    pub masters: usize,
    /// How many of the clients write and read through a FUSE mount of their own
    /// instead of the client library (default 1 where FUSE works, else 0).
    #[arg(long)]
    pub mounts: Option<usize>,
    /// Write the report of every run as JSON to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep every run's data dir and logs under DIR (failing runs are always kept).
    #[arg(long)]
    pub keep_dir: Option<PathBuf>,
    /// `namespaces`: every process in a network namespace of its own, so the network
    /// can be partitioned (root, iproute2 and nftables); `loopback`: no partitions;
    /// `auto`: namespaces when possible.
    #[arg(long, default_value = "auto")]
    pub net: String,
    /// Put each chunkserver's data dir on a tmpfs of this size so its disk can be
    /// filled up (root only; `0` to keep them on the run's dir; default 512MiB as root).
    #[arg(long, value_parser = stampfs_proto::units::parse_size)]
    pub small_disks: Option<u64>,
    /// Administration under the faults too: setrep of the shared files, the balancer,
    /// a chunkserver decommissioned and recommissioned, safe mode entered and left,
    /// every few seconds (all undone before the final checks).
    #[arg(long)]
    pub admin: bool,
}

/// `--masters`: 1, 3 or 5.
fn masters_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!("{s:?}: a master group has 1, 3 or 5 members")),
    }
}
