//! The `stampfs` command: servers, file commands, the local dev cluster and the demo.
//!
//! This crate is wiring only: argument parsing ([`cli`]), process set-up (tracing,
//! signals, exit statuses) and the presentation of results ([`commands`]). Storage
//! logic lives in `stampfs-master`, `stampfs-chunkserver` and `stampfs-client`.
//! [`cluster::LocalCluster`] runs a master and chunkservers in one process for
//! `stampfs dev`, the demo and benchmarks: [`bench`] (`stampfs bench pipeline`, the
//! write path next to the raw disk) and [`bench_master`] (`stampfs bench master`, the
//! master's throughput and memory against simulated chunkservers) and [`bench_mount`]
//! (`stampfs bench mount-metadata`, metadata operations through mounts) and
//! [`bench_mount_io`] (`stampfs bench mount-io`, data through mounts).
//! [`config_file`] reads the servers' TOML `--config` file (flags and `STAMPFS_*`
//! variables override it) and [`logging`] sets up their logs (`--log-format`,
//! `--log-file`). [`admin`] is `stampfs admin decommission|recommission|safemode|
//! balance` (`stampfs admin quota` is with the file commands).
//! [`tls`] makes a throwaway certificate authority and server certificate for
//! `stampfs dev --tls` and `stampfs bench pipeline --tls`.
//! [`FAULT_INJECTION`] tells whether this build has crash points (cargo feature
//! `fault-injection`, on in tests only).

pub mod admin;
pub mod bench;
pub mod bench_master;
pub mod bench_mount;
pub mod bench_mount_io;
pub mod bench_patterns;
pub mod cli;
pub mod cluster;
pub mod commands;
pub mod config_file;
pub mod demo;
pub mod health;
pub mod logging;
pub mod mount;
pub mod tls;
pub mod users;

use cli::{AdminCommand, BenchCommand, Cli, Command};
use std::process::ExitCode;

/// Whether this binary was built with the `fault-injection` feature: crash points
/// (`stampfs_proto::crash`, armed by `STAMPFS_CRASH_POINTS`) and the master's fail
/// points. `stampfs --version` says so too.
pub const FAULT_INJECTION: bool = cfg!(feature = "fault-injection");

/// What `stampfs --version` prints after the name.
pub const VERSION: &str = if FAULT_INJECTION {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (fault-injection: crash points)"
    )
} else {
    env!("CARGO_PKG_VERSION")
};

/// Exit status for success.
pub const EXIT_OK: u8 = 0;
/// Exit status for any failure other than fencing.
pub const EXIT_ERROR: u8 = 1;
/// Exit status for a subcommand that is not built yet, or bad usage.
pub const EXIT_UNAVAILABLE: u8 = 2;
/// Exit status when the writer was fenced by the storage.
pub const EXIT_FENCED: u8 = 3;

/// Runs one invocation and returns its exit status: `cli` and, for a server, its
/// config file and logging flags (`process`), as [`config_file::parse`] read them.
pub fn run(cli: Cli, process: config_file::ServerArgs) -> ExitCode {
    let server = matches!(
        cli.command,
        Command::Master(_) | Command::Chunkserver(_) | Command::Dev(_) | Command::NemesisClient(_)
    );
    // A server with --log-file, and a mount server with --log-file, log there
    // (appended), not on stderr.
    let log_file = match &cli.command {
        Command::Mount(args) if args.foreground => args.log_file.as_deref(),
        Command::Master(_) | Command::Chunkserver(_) => process.log.log_file.as_deref(),
        _ => None,
    };
    let log_file = match log_file.map(|p| {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p)
            .map_err(|e| (p, e))
    }) {
        Some(Ok(f)) => Some(f),
        Some(Err((p, e))) => {
            eprintln!("stampfs: cannot open the log file {}: {e}", p.display());
            return ExitCode::from(EXIT_ERROR);
        }
        None => None,
    };
    // The demo tells the servers' log lines in its own story.
    if !matches!(cli.command, Command::Demo(_)) {
        // File commands say what they wait for (lease recovery) and when they recover
        // a pipeline; everything else only when it goes wrong.
        let default = if server {
            "info"
        } else if log_file.is_some() {
            // A mount server's own log: what it did, as the servers log.
            "info,fuser=error"
        } else {
            "warn,stampfs_client=info,fuser=error"
        };
        logging::init(default, process.log.log_format, log_file);
        if let Some(file) = &process.config {
            tracing::info!(file = %file.display(), "settings from the config file (flags and STAMPFS_* variables override it)");
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stampfs: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let code = runtime.block_on(dispatch(cli.command));
    // Do not wait for stray background tasks (lease renewal, idle connections).
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    ExitCode::from(code)
}

async fn dispatch(command: Command) -> u8 {
    match command {
        Command::Master(cfg) => commands::serve_master(cfg).await,
        Command::Chunkserver(cfg) => commands::serve_chunkserver(cfg).await,
        Command::Dev(args) => commands::dev(args).await,
        Command::Put(args) => commands::report(commands::put(args).await),
        Command::Append(args) => commands::report(commands::append(args).await),
        Command::Write(args) => commands::report(commands::write(args).await),
        Command::Truncate(args) => commands::report(commands::truncate(args).await),
        Command::Get(args) => commands::report(commands::get(args).await),
        Command::Cat(args) => commands::report(commands::cat(args).await),
        Command::Ls(args) => commands::report(commands::ls(args).await),
        Command::Du(args) => commands::report(commands::du(args).await),
        Command::Count(args) => commands::report(commands::count(args).await),
        Command::Df(args) => commands::report(commands::df(args).await),
        Command::Tail(args) => commands::report(commands::tail(args).await),
        Command::Test(args) => commands::test(args).await,
        Command::Touchz(args) => commands::report(commands::touchz(args).await),
        Command::Mkdir(args) => commands::report(commands::mkdir(args).await),
        Command::Ln(args) => commands::report(commands::ln(args).await),
        Command::Readlink(args) => commands::report(commands::readlink(args).await),
        Command::Chmod(args) => commands::report(commands::chmod(args).await),
        Command::Chown(args) => commands::report(commands::chown(args).await),
        Command::Rm(args) => commands::report(commands::rm(args).await),
        Command::Mv(args) => commands::report(commands::mv(args).await),
        Command::Stat(args) => commands::report(commands::stat(args).await),
        Command::Recover(args) => commands::report(commands::recover(args).await),
        Command::Fsck(args) => health::fsck(args).await,
        Command::Admin(AdminCommand::Report { master, json }) => {
            health::admin_report(&master, json).await
        }
        Command::Admin(AdminCommand::User(cmd)) => users::run(cmd).await,
        Command::Admin(AdminCommand::Quota(cmd)) => commands::report(commands::quota(cmd).await),
        Command::Admin(AdminCommand::Masters(cmd)) => users::masters(cmd).await,
        Command::Admin(AdminCommand::Decommission {
            master,
            server,
            wait,
        }) => admin::run_decommission(master, server, true, wait).await,
        Command::Admin(AdminCommand::Recommission { master, server }) => {
            admin::run_decommission(master, server, false, false).await
        }
        Command::Admin(AdminCommand::Safemode { master, action }) => {
            admin::run_safemode(master, action).await
        }
        Command::Admin(AdminCommand::Balance {
            master,
            threshold,
            stop,
            status,
            no_wait,
        }) => admin::run_balance(master, threshold, stop, status, no_wait).await,
        Command::Setrep(args) => commands::report(commands::setrep(args).await),
        Command::Trash(cmd) => commands::report(commands::trash(cmd).await),
        Command::Mount(args) => mount::run(args).await,
        Command::Demo(_) => demo::run().await,
        Command::Bench(BenchCommand::Pipeline(args)) => bench::run(args).await,
        Command::Bench(BenchCommand::Master(args)) => bench_master::run(args).await,
        Command::Bench(BenchCommand::MountMetadata(args)) => bench_mount::run(args).await,
        Command::Bench(BenchCommand::MountIo(args)) => bench_mount_io::run(args).await,
        Command::Nemesis(args) => commands::nemesis(args).await,
        Command::NemesisClient(cfg) => commands::nemesis_client(cfg).await,
        Command::DemoWriter(args) => commands::report(demo::writer(args).await),
    }
}
