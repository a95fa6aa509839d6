//! `stampfs admin ...`: the operator's subcommands (chunkservers, safe mode, the
//! balancer, quotas, users, the master group).

use super::MasterAddr;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Drain a chunkserver (its id or address, as `admin report` shows them): it gets
    /// no new replicas, and its chunks are copied elsewhere until none needs it; then
    /// it can be stopped. `admin report` shows its state.
    Decommission {
        #[command(flatten)]
        master: MasterAddr,
        server: String,
        /// Wait until it is decommissioned.
        #[arg(long)]
        wait: bool,
    },
    /// End a chunkserver's decommission: it takes new replicas again.
    Recommission {
        #[command(flatten)]
        master: MasterAddr,
        server: String,
    },
    /// Safe mode: while it is on, the master deletes no replica and copies none (it
    /// is on after a start until enough replicas have been reported).
    Safemode {
        #[command(flatten)]
        master: MasterAddr,
        #[arg(value_enum)]
        action: SafemodeArg,
    },
    /// Move replicas from the most used chunkservers to the least used until every
    /// one is within the threshold of the cluster's use; waits for it unless
    /// --no-wait.
    Balance {
        #[command(flatten)]
        master: MasterAddr,
        /// How far (in points of use) a chunkserver may be from the cluster's.
        #[arg(long, default_value = "10%", value_parser = parse_percent)]
        threshold: u8,
        /// Stop a balancer that runs.
        #[arg(long, conflicts_with_all = ["status", "no_wait"])]
        stop: bool,
        /// Only show the balancer's state.
        #[arg(long)]
        status: bool,
        /// Start it and return.
        #[arg(long)]
        no_wait: bool,
    },
    /// Chunkservers (address, state, last heartbeat, space, replicas) and chunk health.
    Report {
        #[command(flatten)]
        master: MasterAddr,
        #[arg(long)]
        json: bool,
    },
    /// Directory quotas on names and bytes (set, clear and list: superusers only).
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Users clients authenticate as (superusers only).
    #[command(subcommand)]
    User(UserCommand),
    /// The members of the master group (superusers only; `admin report` shows them).
    #[command(subcommand)]
    Masters(MastersCommand),
}

/// `stampfs admin quota`: as HDFS's `dfsadmin -setQuota`/`-setSpaceQuota`, a name
/// quota limits the files, directories and links below a directory (itself
/// included), a space quota its bytes, counted once per replica (a chunk being
/// written counts whole).
#[derive(Subcommand, Debug)]
pub enum QuotaCommand {
    /// Set a directory's name quota, space quota, or both (the other stays).
    Set {
        #[command(flatten)]
        master: MasterAddr,
        path: String,
        /// Most names below it, itself included (at least 1).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        names: Option<u64>,
        /// Most bytes below it, every replica counted (64MiB, 10GiB, ...).
        #[arg(long, value_parser = stampfs_proto::units::parse_size)]
        bytes: Option<u64>,
    },
    /// Remove a directory's quotas (both unless --names or --bytes says which).
    Clear {
        #[command(flatten)]
        master: MasterAddr,
        path: String,
        #[arg(long)]
        names: bool,
        #[arg(long)]
        bytes: bool,
    },
    /// A directory's quotas and what is used of them.
    Get {
        #[command(flatten)]
        master: MasterAddr,
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Every directory with a quota.
    List {
        #[command(flatten)]
        master: MasterAddr,
        #[arg(long)]
        json: bool,
    },
}

/// What `stampfs admin safemode` does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SafemodeArg {
    /// Show whether it is on, and why.
    Get,
    /// Turn it on until `leave`.
    Enter,
    /// End it now.
    Leave,
    /// Wait until it is off.
    Wait,
}

/// A percentage from 1 to 99, with or without `%`.
fn parse_percent(s: &str) -> Result<u8, String> {
    let n: u8 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage (e.g. 10%)"))?;
    if (1..=99).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{s} is not between 1% and 99%"))
    }
}

#[derive(Subcommand, Debug)]
pub enum MastersCommand {
    /// Add member ID at ADDR: a master started with `--join --id ID --listen ADDR`
    /// on a new directory. It is sent the group's state, then votes.
    Add {
        #[command(flatten)]
        master: MasterAddr,
        id: u64,
        addr: String,
    },
    /// Remove member ID from the group (stop its process afterwards).
    Remove {
        #[command(flatten)]
        master: MasterAddr,
        id: u64,
    },
    /// Hand the lead to member ID (writes wait about a second meanwhile).
    TransferLeader {
        #[command(flatten)]
        master: MasterAddr,
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user and write its credentials file (mode 0600): hand that file to
    /// the user, who passes it with --credentials or STAMPFS_CREDENTIALS.
    Add {
        #[command(flatten)]
        master: MasterAddr,
        /// The user's name (letters, digits, '_', '-', '.').
        name: String,
        /// Its uid (unique among users).
        #[arg(long)]
        uid: u32,
        /// Its primary group (default: the uid).
        #[arg(long)]
        gid: Option<u32>,
        /// Supplementary groups, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
        /// May administer the cluster and act as any uid (a mount serving others).
        #[arg(long)]
        superuser: bool,
        /// Where to write the credentials (default: ./NAME.credentials); never
        /// replaces an existing file.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// List users (never their keys).
    List {
        #[command(flatten)]
        master: MasterAddr,
        #[arg(long)]
        json: bool,
    },
    /// Remove a user: new connections with its credentials are refused.
    Remove {
        #[command(flatten)]
        master: MasterAddr,
        name: String,
    },
}
