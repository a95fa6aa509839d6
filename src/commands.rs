//! What each subcommand does: start servers, or call the client library and print
//! the result for a person (or as JSON for scripts).

use crate::cli::*;
use crate::cluster::LocalCluster;
use crate::{EXIT_ERROR, EXIT_FENCED, EXIT_OK};
use anyhow::{Context, Result};
use serde::Serialize;
use stampfs_client::Client;
use stampfs_proto::units::format_size;
use stampfs_proto::{FileKind, FileState, FileStatus};
use std::io::IsTerminal;

/// `println!` for a command's output, in a function returning `anyhow::Result`: a
/// write error returns from it ([`output_error`]) instead of panicking, and a closed
/// stdout (`stampfs ls | head`) ends the command quietly.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            return Err($crate::commands::output_error(e));
        }
    }};
}

/// `println!` for a long-running command's progress lines (dev, nemesis): a reader
/// that went away is ignored, never a panic that would take the servers down with it.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

mod attrs;
mod quota;
mod transfer;
mod trash;
mod usage;
mod view;
pub use attrs::{chmod, chown};
use attrs::{mode_string, time_string};
pub use quota::{quota, quota_columns};
pub use transfer::{append, cat, get, put, truncate, write};
pub use trash::{setrep, trash};
pub use usage::{count, du, test, touchz};
pub use view::{df, tail};

/// The reader of this command's standard output went away (`| head`): not a failure
/// of the command, which ends quietly.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// The error of a failed write to standard output: [`StdoutClosed`] for a closed pipe.
pub fn output_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(e).context("writing the output")
    }
}

/// Turns a command's result into an exit status, printing one line on failure.
pub fn report(result: Result<()>) -> u8 {
    match result {
        Ok(()) => EXIT_OK,
        Err(e) if e.downcast_ref::<StdoutClosed>().is_some() => EXIT_OK,
        Err(e) => {
            let fenced = e.chain().any(|c| {
                c.downcast_ref::<stampfs_client::Error>()
                    .is_some_and(|e| e.is_fenced())
            });
            if fenced {
                eprintln!("stampfs: fenced: {e:#}");
                EXIT_FENCED
            } else {
                eprintln!("stampfs: error: {e:#}");
                EXIT_ERROR
            }
        }
    }
}

/// Waits for SIGINT or SIGTERM and says which.
pub async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers we can only run until killed.
        std::future::pending::<()>().await;
        return "none";
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Runs a server until SIGINT/SIGTERM, then shuts it down cleanly.
async fn serve<H, E, S, F>(what: &str, started: Result<H, E>, shutdown: S) -> u8
where
    E: std::fmt::Display,
    S: FnOnce(H) -> F,
    F: std::future::Future<Output = Result<(), E>>,
{
    let handle = match started {
        Ok(h) => h,
        Err(e) => {
            eprintln!("stampfs {what}: {e}");
            return EXIT_ERROR;
        }
    };
    let sig = wait_for_signal().await;
    tracing::info!(signal = sig, "shutting down");
    match shutdown(handle).await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs {what}: shutdown: {e}");
            EXIT_ERROR
        }
    }
}

/// Arms the crash points that `STAMPFS_CRASH_POINTS` names (a `fault-injection` build
/// only), before the server touches its directory. False, having said why, when the
/// variables are malformed or set on a build without crash points.
fn arm_crash_points(what: &str) -> bool {
    match stampfs_proto::crash::arm_from_env() {
        Ok(None) => true,
        Ok(Some(arming)) => {
            tracing::warn!(
                points = %arming,
                seed = arming.seed,
                "crash points armed: this {what} kills itself (SIGKILL) where one fires"
            );
            true
        }
        Err(e) => {
            eprintln!("stampfs {what}: {e}");
            false
        }
    }
}

pub async fn serve_master(cfg: stampfs_master::MasterConfig) -> u8 {
    if !arm_crash_points("master") {
        return EXIT_ERROR;
    }
    let started = stampfs_master::start(cfg).await;
    serve("master", started, |h| h.shutdown()).await
}

pub async fn serve_chunkserver(cfg: stampfs_chunkserver::ChunkserverConfig) -> u8 {
    if !arm_crash_points("chunkserver") {
        return EXIT_ERROR;
    }
    let handle = match stampfs_chunkserver::start(cfg).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("stampfs chunkserver: {e}");
            return EXIT_ERROR;
        }
    };
    // A chunkserver that cannot serve (the master does not share its cluster key)
    // stops itself; it exits saying why instead of waiting for a signal.
    let failure = tokio::select! {
        sig = wait_for_signal() => {
            tracing::info!(signal = sig, "shutting down");
            None
        }
        reason = handle.failed() => Some(reason),
    };
    let stopped = handle.shutdown().await;
    if let Some(reason) = failure {
        eprintln!("stampfs chunkserver: {reason}");
        return EXIT_ERROR;
    }
    match stopped {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs chunkserver: shutdown: {e}");
            EXIT_ERROR
        }
    }
}

pub async fn dev(args: DevArgs) -> u8 {
    let (dir, _temp) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => match tempfile::Builder::new().prefix("stampfs-dev-").tempdir() {
            Ok(t) => (t.path().to_path_buf(), Some(t)),
            Err(e) => {
                eprintln!("stampfs dev: cannot make a temporary directory: {e}");
                return EXIT_ERROR;
            }
        },
    };
    if args.replication == 0 || usize::from(args.replication) > args.chunkservers {
        eprintln!(
            "stampfs dev: --replication {} needs between 1 and --chunkservers ({}) chunkservers",
            args.replication, args.chunkservers
        );
        return EXIT_ERROR;
    }
    let (replication, chunk_size) = (args.replication, args.chunk_size);
    let mut builder = LocalCluster::builder(&dir)
        .chunkservers(args.chunkservers)
        .master_listen(&args.listen)
        .master_config(|m| {
            m.replication = replication;
            m.chunk_size = chunk_size;
        });
    if args.tls {
        match crate::tls::generate(&dir.join("tls"), &["127.0.0.1", "localhost"]) {
            Ok(pki) => builder = builder.tls(pki),
            Err(e) => {
                eprintln!("stampfs dev: making the TLS certificates: {e:#}");
                return EXIT_ERROR;
            }
        }
    }
    let cluster = match builder.start().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stampfs dev: {e:#}");
            return EXIT_ERROR;
        }
    };
    say!("stampfs dev cluster is up");
    say!("  master        {}", cluster.master_addr());
    for (i, cs) in cluster.chunkserver_addrs().iter().enumerate() {
        say!("  chunkserver {i} {cs}");
    }
    say!("  data          {}", dir.display());
    say!(
        "  credentials   {} (the superuser)",
        cluster.credentials_file().display()
    );
    if let Some(ca) = cluster.tls_ca() {
        say!("  TLS authority {} (every port serves TLS)", ca.display());
    }
    say!();
    say!(
        "try:  export STAMPFS_MASTER={} STAMPFS_CREDENTIALS={}{}",
        cluster.master_addr(),
        cluster.credentials_file().display(),
        cluster
            .tls_ca()
            .map(|ca| format!(" STAMPFS_TLS_CA={}", ca.display()))
            .unwrap_or_default()
    );
    say!("      echo hello | stampfs put - /hello.txt");
    say!("      stampfs cat /hello.txt");
    say!("Ctrl-C stops it.");
    let sig = wait_for_signal().await;
    say!("{sig}: stopping");
    match cluster.shutdown().await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs dev: shutdown: {e:#}");
            EXIT_ERROR
        }
    }
}

async fn connect(m: &MasterAddr) -> Result<Client> {
    let config = crate::users::client_config(m)?;
    Client::connect_with(&m.master, config)
        .await
        .with_context(|| format!("cannot connect to the master at {}", m.master))
}

#[derive(Serialize)]
struct EntryJson<'a> {
    name: &'a str,
    path: &'a str,
    kind: FileKind,
    length: u64,
    replication: u8,
    chunk_size: u64,
    state: FileState,
    mtime_ms: u64,
    #[serde(flatten)]
    attr: stampfs_proto::Attr,
}

fn base_name(path: &str) -> &str {
    path.rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("/")
}

fn state_word(s: FileState) -> &'static str {
    match s {
        FileState::Open => "open",
        FileState::Closed => "closed",
        FileState::Recovering => "recovering",
    }
}

pub async fn ls(args: LsArgs) -> Result<()> {
    if args.recursive {
        return view::ls_recursive(args).await;
    }
    let client = connect(&args.master).await?;
    let entries = client
        .list(&args.path)
        .await
        .with_context(|| format!("cannot list {}", args.path))?;
    if args.json {
        let out: Vec<EntryJson> = entries.iter().map(entry_json).collect();
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for e in &entries {
        let line = entry_line(&client, e, args.long, base_name(&e.path)).await;
        outln!("{line}");
    }
    Ok(())
}

/// One line of `ls` about `e`, shown as `name` (`-R` shows full paths): the name
/// alone, marked `/` for a directory and `@` for a link, or (`long`) mode, owner,
/// replication, length, state, modification time and name (a link's with its target).
async fn entry_line(client: &Client, e: &FileStatus, long: bool, name: &str) -> String {
    if !long {
        return match e.kind {
            FileKind::Directory => format!("{name}/"),
            FileKind::File => name.to_string(),
            FileKind::Symlink => format!("{name}@"),
        };
    }
    let (kind, name) = match e.kind {
        FileKind::Directory => ('d', format!("{name}/")),
        FileKind::File => ('-', name.to_string()),
        FileKind::Symlink => {
            let target = client
                .read_link(&e.path)
                .await
                .unwrap_or_else(|err| format!("? ({err})"));
            ('l', format!("{name} -> {target}"))
        }
    };
    format!(
        "{kind}{} {:>5} {:>5} {:>2} {:>14} {:<10} {} {name}",
        mode_string(e.attr.mode),
        e.attr.uid,
        e.attr.gid,
        e.replication,
        e.length,
        state_word(e.state),
        time_string(e.attr.mtime_ns),
    )
}

fn entry_json(e: &FileStatus) -> EntryJson<'_> {
    EntryJson {
        name: base_name(&e.path),
        path: &e.path,
        kind: e.kind,
        length: e.length,
        replication: e.replication,
        chunk_size: e.chunk_size,
        state: e.state,
        mtime_ms: u64::try_from(e.attr.mtime_ns / 1_000_000).unwrap_or(0),
        attr: e.attr,
    }
}

pub async fn mkdir(args: MkdirArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    client
        .mkdir(&args.path, args.parents)
        .await
        .with_context(|| format!("cannot create directory {}", args.path))?;
    Ok(())
}

pub async fn ln(args: LnArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    client
        .symlink(&args.link, &args.target)
        .await
        .with_context(|| format!("cannot create symbolic link {}", args.link))?;
    Ok(())
}

pub async fn readlink(args: ReadlinkArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let target = client
        .read_link(&args.path)
        .await
        .with_context(|| format!("cannot read symbolic link {}", args.path))?;
    outln!("{target}");
    Ok(())
}

pub async fn rm(args: RmArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let removed = if args.skip_trash {
        client.delete_now(&args.path, args.recursive).await
    } else {
        client.delete(&args.path, args.recursive).await
    };
    removed.with_context(|| format!("cannot remove {}", args.path))?;
    Ok(())
}

pub async fn mv(args: MvArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    // Into an existing directory, under the source's own name (as mv(1) and
    // `hdfs dfs -mv`).
    let mut dst = args.dst.clone();
    if let Ok(st) = client.stat(&args.dst).await {
        if st.kind == FileKind::Directory {
            if let Some(name) = args.src.rsplit('/').find(|c| !c.is_empty()) {
                dst = format!("{}/{name}", args.dst.trim_end_matches('/'));
            }
        }
    }
    client
        .rename(&args.src, &dst)
        .await
        .with_context(|| format!("cannot move {} to {dst}", args.src))?;
    Ok(())
}

#[derive(Serialize)]
struct StatJson {
    path: String,
    kind: FileKind,
    length: u64,
    replication: u8,
    chunk_size: u64,
    state: FileState,
    #[serde(flatten)]
    attr: stampfs_proto::Attr,
    chunks: Vec<ChunkJson>,
}

#[derive(Serialize)]
struct ChunkJson {
    handle: String,
    version: u64,
    length: u64,
    replicas: Vec<ReplicaJson>,
}

#[derive(Serialize)]
struct ReplicaJson {
    chunkserver: u64,
    addr: String,
    version: u64,
    state: stampfs_proto::ReplicaState,
    /// On a chunkserver being decommissioned (not counted toward the factor).
    decommissioning: bool,
}

pub async fn stat(args: StatArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let status = client
        .stat(&args.path)
        .await
        .with_context(|| format!("cannot stat {}", args.path))?;
    let chunks = if status.kind == FileKind::File {
        client
            .locations(&args.path)
            .await
            .with_context(|| format!("cannot get the chunks of {}", args.path))?
            .chunks
    } else {
        Vec::new()
    };
    let out = StatJson {
        path: status.path.clone(),
        kind: status.kind,
        length: status.length,
        replication: status.replication,
        chunk_size: status.chunk_size,
        state: status.state,
        attr: status.attr,
        chunks: chunks
            .iter()
            .map(|c| ChunkJson {
                handle: c.handle.to_string(),
                version: c.version.0,
                length: c.length,
                replicas: c
                    .replicas
                    .iter()
                    .map(|r| ReplicaJson {
                        chunkserver: r.chunkserver.0,
                        addr: r.addr.clone(),
                        version: r.version.0,
                        state: r.state,
                        decommissioning: r.decommissioning,
                    })
                    .collect(),
            })
            .collect(),
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!("path         {}", out.path);
    outln!("kind         {:?}", out.kind);
    outln!(
        "mode         {:04o} ({})",
        out.attr.mode,
        mode_string(out.attr.mode)
    );
    outln!("owner        {}:{}", out.attr.uid, out.attr.gid);
    outln!("modified     {}", time_string(out.attr.mtime_ns));
    outln!("accessed     {}", time_string(out.attr.atime_ns));
    outln!("changed      {}", time_string(out.attr.ctime_ns));
    if out.kind == FileKind::File {
        outln!("length       {} ({})", out.length, format_size(out.length));
        outln!("replication  {}", out.replication);
        outln!("chunk size   {}", format_size(out.chunk_size));
        outln!("state        {}", state_word(out.state));
        for (i, c) in out.chunks.iter().enumerate() {
            let replicas: Vec<String> = c
                .replicas
                .iter()
                .map(|r| {
                    let draining = if r.decommissioning {
                        " (decommissioning)"
                    } else {
                        ""
                    };
                    format!("cs{}@{} v{}{draining}", r.chunkserver, r.addr, r.version)
                })
                .collect();
            outln!(
                "chunk {i:<4} {} v{} {:>12} B  [{}]",
                c.handle,
                c.version,
                c.length,
                replicas.join(", ")
            );
        }
    }
    Ok(())
}

pub async fn recover(args: RecoverArgs) -> Result<()> {
    let client = connect(&args.master).await?;
    let out = if args.accept_loss {
        client.recover_lease_accepting_loss(&args.path).await
    } else {
        client.recover_lease(&args.path).await
    };
    let out = out.with_context(|| format!("cannot recover the lease of {}", args.path))?;
    let v = |v: Option<stampfs_proto::ChunkVersion>| v.map_or("-".to_string(), |v| v.to_string());
    if out.closed {
        outln!(
            "{}: recovered; last chunk version {} -> {}; closed at {} bytes",
            out.path,
            v(out.old_version),
            v(out.new_version),
            out.length
        );
    } else {
        outln!(
            "{}: recovery in progress (version {} -> {}); a file whose replicas are unreachable \
             stays in recovery until one is back (see `stampfs fsck`; `--accept-loss` gives them up)",
            out.path,
            v(out.old_version),
            v(out.new_version)
        );
    }
    Ok(())
}

/// `stampfs nemesis`: runs the nemesis and prints each run's summary.
pub async fn nemesis(args: NemesisArgs) -> u8 {
    let bin = match std::env::current_exe() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("stampfs: error: nemesis: cannot find the stampfs binary: {e}");
            return EXIT_ERROR;
        }
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    use stampfs_nemesis::net::NetMode;
    let (net, why_not) = match args.net.as_str() {
        "auto" => NetMode::detect(),
        other => match other.parse::<NetMode>() {
            Ok(m) => (m, None),
            Err(e) => {
                eprintln!("stampfs: error: nemesis: --net: {e}");
                return EXIT_ERROR;
            }
        },
    };
    let root = nix::unistd::geteuid().is_root();
    let small_disk_mib = match args.small_disks {
        Some(0) => None,
        Some(bytes) if root => Some(bytes.div_ceil(1 << 20).max(16)),
        Some(_) => {
            eprintln!("stampfs: error: nemesis: --small-disks needs root (it mounts a tmpfs)");
            return EXIT_ERROR;
        }
        None if root => Some(512),
        None => None,
    };
    let fuse_missing = stampfs_nemesis::clients::fuse_unavailable();
    let mounts = match (args.mounts, &fuse_missing) {
        (Some(0), _) | (None, Some(_)) => 0,
        (Some(n), None) => n.min(args.clients),
        (None, None) => 1.min(args.clients),
        (Some(_), Some(why)) => {
            eprintln!("stampfs: error: nemesis: --mounts: FUSE cannot run here: {why}");
            return EXIT_ERROR;
        }
    };
    let cfg = stampfs_nemesis::run::RunConfig {
        bin,
        seed,
        duration: args.duration,
        clients: args.clients,
        mounts,
        keep_dir: args.keep_dir,
        cluster: stampfs_nemesis::cluster::ClusterConfig {
            masters: args.masters,
            small_disk_mib,
            ..Default::default()
        },
        net,
        crash_points: stampfs_proto::crash::CRASH_POINTS,
        admin: args.admin,
    };
    say!(
        "nemesis: {} run(s) from seed {seed}, {} of faults each, {}, {} clients ({mounts} through FUSE), network: {}, disks: {}",
        args.runs,
        humantime::format_duration(args.duration),
        match args.masters {
            1 => "one master".to_string(),
            n => format!("a group of {n} masters"),
        },
        args.clients,
        match net {
            NetMode::Namespaces => "a namespace per process (partitions)",
            NetMode::Loopback => "loopback (no partitions)",
        },
        match small_disk_mib {
            Some(m) => format!("{m} MiB tmpfs each (disk-full faults)"),
            None => "the run's dir (no disk-full faults)".into(),
        }
    );
    if let Some(why) = why_not {
        say!("nemesis: {why}");
    }
    if !stampfs_proto::crash::CRASH_POINTS {
        say!(
            "nemesis: no crash points in this build (build with `--features fault-injection` to arm them)"
        );
    }
    if let (Some(why), None) = (&fuse_missing, args.mounts) {
        say!("nemesis: no FUSE clients: {why}");
    }
    let bar = nemesis_bar(args.runs, seed);
    let mut failed = 0usize;
    let interrupt = async {
        let sig = wait_for_signal().await;
        bar.suspend(|| say!("nemesis: {sig}: stopping the run under way"));
    };
    let many = stampfs_nemesis::run::run_many(&cfg, args.runs, interrupt, |r| {
        bar.suspend(|| say!("{}", r.summary()));
        failed += usize::from(!r.passed());
        bar.inc(1);
        bar.set_message(format!(
            "seed {} running; {failed} failing run(s) so far",
            r.seed.wrapping_add(1)
        ));
    })
    .await;
    bar.finish_and_clear();
    let report = many.report;
    // The runs that finished are reported whatever stopped the rest.
    if let Some(path) = &args.json {
        let written = serde_json::to_vec_pretty(&report)
            .map_err(anyhow::Error::from)
            .and_then(|j| std::fs::write(path, j).map_err(anyhow::Error::from));
        if let Err(e) = written {
            eprintln!("stampfs: error: cannot write {}: {e}", path.display());
            return EXIT_ERROR;
        }
    }
    if let Some(e) = many.stopped {
        eprintln!(
            "stampfs: error: nemesis: {e} ({} run(s) finished before, {} of them failing)",
            report.runs.len(),
            report.failed_runs
        );
        return EXIT_ERROR;
    }
    if report.failed_runs > 0 {
        eprintln!(
            "stampfs: nemesis: {} of {} runs found {} violations",
            report.failed_runs,
            report.runs.len(),
            report.violations
        );
        EXIT_ERROR
    } else {
        say!("nemesis: {} run(s), no violations", report.runs.len());
        EXIT_OK
    }
}

/// The nemesis's progress over its runs on a terminal (ticking, so a long run shows
/// it is alive); hidden otherwise.
fn nemesis_bar(runs: u64, seed: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(runs);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} runs (eta {eta}) {msg}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(format!("seed {seed} running"));
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    bar
}

/// `stampfs nemesis-client`: one client process of the nemesis.
pub async fn nemesis_client(cfg: stampfs_nemesis::workload::WorkloadConfig) -> u8 {
    if !arm_crash_points("nemesis client") {
        return EXIT_ERROR;
    }
    match stampfs_nemesis::workload::run(cfg).await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs: error: nemesis client: {e}");
            EXIT_ERROR
        }
    }
}
