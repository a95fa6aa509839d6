//! `stampfs mount`: wiring for the FUSE mount in `stampfs_client::mount`.
//!
//! With `--foreground` the process serves the mount until SIGINT/SIGTERM (then it
//! unmounts, waits for requests in progress and closes open files) or until someone
//! runs `umount`; it logs on stderr, or to `--log-file`.
//!
//! Without it (background mode) the command starts itself again as the server:
//!
//! ```text
//! caller ── spawn: mount --foreground --detach-when-ready --log-file LOG ... ──► server
//!   │  stdin /dev/null, stdout and stderr pipes                                  │ setsid
//!   │◄── stderr lines (errors before the mount is ready), relayed ───────────────│ logs → LOG
//!   │◄── stdout: "stampfs: mounted ... (pid N)" ─────────────────────────────────│ mounted
//!   │  prints where LOG is, exits 0                    stdin, stdout → /dev/null; │
//!   ▼  (server exited first: its error, exit 1)                  stderr → LOG    ▼ serves
//! ```
//!
//! So `out=$(stampfs mount mnt 2>&1)` returns as soon as the mount is ready: the
//! server keeps none of the caller's descriptors. The default log place is
//! [`default_log_path`].

use crate::cli::MountArgs;
use crate::{EXIT_ERROR, EXIT_OK};
use stampfs_client::mount::{check_mountpoint, resolve_mountpoint};
use stampfs_client::{Client, Mount, MountConfig};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The line the foreground server prints on stdout once the mount serves requests.
const READY: &str = "stampfs: mounted";
/// Longest log file name [`default_log_path`] makes (a file name may have 255 bytes).
const MAX_LOG_NAME: usize = 200;

/// Mounts stampfs at the mount point.
pub async fn run(args: MountArgs) -> u8 {
    if args.foreground {
        foreground(args).await
    } else {
        background(args).await
    }
}

/// Writes a line for the user on stderr. Unlike `eprintln!` it never panics: the
/// caller of a background mount may be gone (its pipe closed).
fn say(msg: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(msg);
    let _ = err.write_all(b"\n");
}

/// Where a background mount logs unless `--log-file` says: the runtime directory
/// (`$XDG_RUNTIME_DIR/stampfs/` when that is set to an absolute path, else
/// `/run/stampfs/` for root, else `/tmp/stampfs-$UID/`), in a file named after the
/// mount point (`/mnt/x` → `mount-mnt-x.log`; a name that would pass
/// [`MAX_LOG_NAME`] bytes keeps its end and gets a hash of the whole path).
pub fn default_log_path(mountpoint: &Path, runtime_dir: Option<&Path>, uid: u32) -> PathBuf {
    let dir = match runtime_dir {
        Some(d) if d.is_absolute() => d.join("stampfs"),
        _ if uid == 0 => PathBuf::from("/run/stampfs"),
        _ => PathBuf::from(format!("/tmp/stampfs-{uid}")),
    };
    let parts: Vec<String> = mountpoint
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    let mut name = std::iter::once("mount".to_string())
        .chain(parts)
        .collect::<Vec<_>>()
        .join("-");
    if name.len() > MAX_LOG_NAME {
        // FNV-1a of the whole path: long paths that share their end stay apart.
        let hash = mountpoint
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            });
        let keep = MAX_LOG_NAME - 24;
        let mut start = name.len() - keep;
        while !name.is_char_boundary(start) {
            start += 1;
        }
        name = format!("mount-{hash:016x}-{}", &name[start..]);
    }
    dir.join(format!("{name}.log"))
}

async fn foreground(args: MountArgs) -> u8 {
    // An error is for the user (stderr) and, when the log is a file, for the log too.
    let fail = |msg: String| {
        if args.log_file.is_some() {
            tracing::error!("{msg}");
        }
        say(format_args!("{msg}"));
    };
    if args.detach_when_ready {
        // Our own session: no controlling terminal, no SIGHUP when the caller's
        // terminal closes, no signals meant for the caller's process group.
        if let Err(e) = nix::unistd::setsid() {
            tracing::warn!(error = %e, "cannot start a session of its own");
        }
    }
    tracing::info!(
        pid = std::process::id(),
        mountpoint = %args.mountpoint.display(),
        "stampfs mount starting"
    );
    // The mount point first: a bad one is refused without asking the cluster.
    if let Err(e) = check_mountpoint(&args.mountpoint, args.nonempty).await {
        fail(format!("stampfs mount: {e}"));
        return EXIT_ERROR;
    }
    let master = &args.master.master;
    let config = match crate::users::client_config(&args.master) {
        Ok(c) => c,
        Err(e) => {
            fail(format!("stampfs mount: {e:#}"));
            return EXIT_ERROR;
        }
    };
    let client = match Client::connect_with(master, config).await {
        Ok(c) => c,
        Err(e) => {
            fail(format!(
                "stampfs mount: cannot reach the master at {master}: {e}"
            ));
            return EXIT_ERROR;
        }
    };
    let config = MountConfig {
        fsname: format!("stampfs:{master}"),
        nonempty: args.nonempty,
        allow_other: args.allow_other,
        attr_ttl: args.cache_timeout,
        negative_ttl: args.negative_timeout,
        threads: usize::from(args.threads),
        ..MountConfig::default()
    };
    let mut mount = match Mount::start(client, &args.mountpoint, config).await {
        Ok(m) => m,
        Err(e) => {
            fail(format!("stampfs mount: {e}"));
            return EXIT_ERROR;
        }
    };
    {
        // The caller of a background mount waits for this line; it may be gone later,
        // so nothing else is ever written to stdout.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{READY} {master} at {} (pid {})",
            mount.mountpoint().display(),
            std::process::id()
        );
        let _ = out.flush();
    }
    if args.detach_when_ready {
        if let Some(log) = &args.log_file {
            detach_from_caller(log);
        }
    }
    tokio::select! {
        sig = crate::commands::wait_for_signal() => {
            tracing::info!(signal = sig, "unmounting");
        }
        _ = mount.ended() => {
            tracing::info!("unmounted from outside (umount)");
        }
    }
    match mount.unmount().await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            fail(format!("stampfs mount: {e}"));
            EXIT_ERROR
        }
    }
}

/// Lets go of the caller's descriptors: stdin and stdout become /dev/null, stderr the
/// log file (so a late message or a panic still lands somewhere).
fn detach_from_caller(log: &Path) {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let log_file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log);
    let (null, log_file) = match (null, log_file) {
        (Ok(n), Ok(l)) => (n, l),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot detach from the caller's stdin/stdout/stderr");
            return;
        }
    };
    for (from, to) in [
        (null.as_raw_fd(), libc::STDIN_FILENO),
        (null.as_raw_fd(), libc::STDOUT_FILENO),
        (log_file.as_raw_fd(), libc::STDERR_FILENO),
    ] {
        if let Err(e) = nix::unistd::dup2(from, to) {
            tracing::error!(fd = to, error = %e, "cannot detach from the caller's descriptor");
        }
    }
    tracing::info!("detached from the caller; serving in the background");
}

/// The log file a background mount uses: `--log-file` made absolute (the server runs
/// in `/`), or [`default_log_path`], its directory created.
fn background_log_path(args: &MountArgs, mountpoint: &Path) -> std::io::Result<PathBuf> {
    let path = match &args.log_file {
        Some(p) => std::path::absolute(p)?,
        None => {
            let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
            let uid = nix::unistd::geteuid().as_raw();
            let path = default_log_path(mountpoint, runtime.as_deref(), uid);
            if let Some(dir) = path.parent() {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
            }
            path
        }
    };
    // Fail here, with the caller still listening, when the server could not log.
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)?;
    Ok(path)
}

/// Starts `stampfs mount --foreground --detach-when-ready` (its own session, cwd `/`)
/// and returns once it reports the mount ready, or with its error.
async fn background(args: MountArgs) -> u8 {
    let mountpoint = match resolve_mountpoint(&args.mountpoint) {
        Ok(p) => p,
        Err(e) => {
            say(format_args!(
                "stampfs mount: mount point {}: {e}",
                args.mountpoint.display()
            ));
            return EXIT_ERROR;
        }
    };
    let log = match background_log_path(&args, &mountpoint) {
        Ok(p) => p,
        Err(e) => {
            say(format_args!("stampfs mount: cannot open a log file: {e}"));
            return EXIT_ERROR;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            say(format_args!(
                "stampfs mount: cannot find the stampfs binary to start in the background: {e}"
            ));
            return EXIT_ERROR;
        }
    };
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("mount")
        .arg("--foreground")
        .arg("--detach-when-ready")
        .arg("--log-file")
        .arg(&log)
        .arg("--master")
        .arg(&args.master.master);
    // The server runs in `/`: its credentials file by absolute path, found here so
    // that a missing one is reported before anything starts.
    let creds = match stampfs_proto::Credentials::discover(args.master.credentials.as_deref()) {
        Ok(Some((_, path))) => std::path::absolute(&path).unwrap_or(path),
        Ok(None) => {
            if let Err(e) = crate::users::credentials(&args.master) {
                say(format_args!("stampfs mount: {e:#}"));
            }
            return EXIT_ERROR;
        }
        Err(e) => {
            say(format_args!("stampfs mount: {e}"));
            return EXIT_ERROR;
        }
    };
    cmd.arg("--credentials").arg(&creds);
    if let Some(ca) = &args.master.tls_ca {
        cmd.arg("--tls-ca")
            .arg(std::path::absolute(ca).unwrap_or_else(|_| ca.clone()));
    }
    if args.nonempty {
        cmd.arg("--nonempty");
    }
    if args.allow_other {
        cmd.arg("--allow-other");
    }
    cmd.arg("--cache-timeout")
        .arg(humantime::format_duration(args.cache_timeout).to_string())
        .arg("--negative-timeout")
        .arg(humantime::format_duration(args.negative_timeout).to_string())
        .arg("--threads")
        .arg(args.threads.to_string());
    let spawned = cmd
        .arg(&mountpoint)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            say(format_args!(
                "stampfs mount: cannot start the background server: {e}"
            ));
            return EXIT_ERROR;
        }
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        say(format_args!(
            "stampfs mount: the background server has no stdout or stderr"
        ));
        return EXIT_ERROR;
    };
    // What the server says before it is ready (its errors) is the caller's to see.
    let relay = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            say(format_args!("{line}"));
        }
    });
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.starts_with(READY) {
            println!(
                "{line}; serving in the background, logging to {}. Stop it with `umount {}`.",
                log.display(),
                mountpoint.display()
            );
            return EXIT_OK;
        }
    }
    // The server exited before it was ready; its error came through the relay.
    let status = child.wait().await;
    let _ = relay.await;
    match status {
        Ok(status) => say(format_args!(
            "stampfs mount: the background server exited ({status}) before the mount was \
             ready; its log: {}",
            log.display()
        )),
        Err(e) => say(format_args!(
            "stampfs mount: waiting for the background server: {e}"
        )),
    }
    EXIT_ERROR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_log_is_named_after_the_mount_point_in_the_runtime_dir() {
        assert_eq!(
            default_log_path(Path::new("/mnt/x"), Some(Path::new("/run/user/1000")), 1000),
            PathBuf::from("/run/user/1000/stampfs/mount-mnt-x.log")
        );
    }

    #[test]
    fn without_a_runtime_dir_root_logs_in_run_and_others_in_tmp() {
        let p = Path::new("/srv/data");
        assert_eq!(
            default_log_path(p, None, 0),
            PathBuf::from("/run/stampfs/mount-srv-data.log")
        );
        assert_eq!(
            default_log_path(p, None, 1000),
            PathBuf::from("/tmp/stampfs-1000/mount-srv-data.log")
        );
        // A relative XDG_RUNTIME_DIR is ignored, as the spec says.
        assert_eq!(
            default_log_path(p, Some(Path::new("rel")), 0),
            PathBuf::from("/run/stampfs/mount-srv-data.log")
        );
    }

    #[test]
    fn a_very_long_mount_point_gets_a_short_hashed_log_name() {
        let deep: PathBuf = std::iter::once("/".to_string())
            .chain((0..40).map(|i| format!("dir{i:03}")))
            .collect();
        let other = deep.join("y");
        let a = default_log_path(&deep, None, 0);
        let b = default_log_path(&other, None, 0);
        let name = a.file_name().expect("name").to_string_lossy().into_owned();
        assert!(name.len() <= MAX_LOG_NAME + 4, "{name}");
        assert!(name.ends_with("dir039.log"), "{name}");
        assert_ne!(a, b);
    }
}
