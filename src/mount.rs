//! `stampfs mount`: wiring for the FUSE mount in `stampfs_client::mount`.
//!
//! With `--foreground` the process serves the mount until SIGINT/SIGTERM (then it
//! unmounts, waits for requests in progress and closes open files) or until someone
//! runs `umount`. Without it, the command starts itself again with `--foreground` in
//! a new process group, waits until the mount is ready, prints the server's pid and
//! returns; the server keeps logging to the same stderr.

use crate::cli::MountArgs;
use crate::{EXIT_ERROR, EXIT_OK};
use stampfs_client::{Client, Mount, MountConfig};
use std::io::Write;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The line the foreground server prints on stdout once the mount serves requests.
const READY: &str = "stampfs: mounted";

/// Mounts stampfs at the mount point.
pub async fn run(args: MountArgs) -> u8 {
    if args.foreground {
        foreground(args).await
    } else {
        background(args).await
    }
}

async fn foreground(args: MountArgs) -> u8 {
    let master = &args.master.master;
    let client = match Client::connect(master).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stampfs mount: cannot reach the master at {master}: {e}");
            return EXIT_ERROR;
        }
    };
    let config = MountConfig {
        fsname: format!("stampfs:{master}"),
        ..MountConfig::default()
    };
    let mut mount = match Mount::start(client, &args.mountpoint, config).await {
        Ok(m) => m,
        Err(e) => {
            eprintln!("stampfs mount: {e}");
            return EXIT_ERROR;
        }
    };
    {
        // The parent of a background mount waits for this line; it may be gone later,
        // so nothing else is ever written to stdout.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{READY} {master} at {} (pid {})",
            args.mountpoint.display(),
            std::process::id()
        );
        let _ = out.flush();
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
            eprintln!("stampfs mount: {e}");
            EXIT_ERROR
        }
    }
}

/// Starts `stampfs mount --foreground` detached (new process group, cwd `/`) and
/// returns once it reports the mount ready, or with its error.
async fn background(args: MountArgs) -> u8 {
    let mountpoint = match std::fs::canonicalize(&args.mountpoint) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "stampfs mount: mount point {}: {e}",
                args.mountpoint.display()
            );
            return EXIT_ERROR;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "stampfs mount: cannot find the stampfs binary to start in the background: {e}"
            );
            return EXIT_ERROR;
        }
    };
    let spawned = tokio::process::Command::new(exe)
        .arg("mount")
        .arg("--foreground")
        .arg("--master")
        .arg(&args.master.master)
        .arg(&mountpoint)
        .current_dir("/")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stampfs mount: cannot start the background server: {e}");
            return EXIT_ERROR;
        }
    };
    let Some(stdout) = child.stdout.take() else {
        eprintln!("stampfs mount: the background server has no stdout");
        return EXIT_ERROR;
    };
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.starts_with(READY) {
            println!(
                "{line}; serving in the background. Stop it with `umount {}`.",
                mountpoint.display()
            );
            return EXIT_OK;
        }
    }
    // The server exited before it was ready; its error is already on stderr.
    match child.wait().await {
        Ok(status) => {
            eprintln!(
                "stampfs mount: the background server exited ({status}) before the mount was ready"
            );
        }
        Err(e) => eprintln!("stampfs mount: waiting for the background server: {e}"),
    }
    EXIT_ERROR
}
