//! After the heal (`stampfs nemesis`, see [`crate::run`]): waiting for every
//! chunkserver to register again, closing what is still open by lease recovery,
//! reading the final files, waiting for `fsck` to say healthy, and scanning the
//! process logs for panics.

use crate::checker::{Violation, ViolationKind};
use crate::net::Net;
use crate::run::MasterAccess;
use crate::workload;
use crate::{Error, Result};
use stampfs_client::Client;
use stampfs_proto::{ChunkserverState, FileState};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long recovery of a still-open file may take after the heal.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the chunkservers may take to be live after the heal, and a final read to
/// find a replica.
const LIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `fsck` may take to turn healthy after the heal (re-replication, GC).
pub(crate) const FSCK_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until the master counts `n` chunkservers live and registered since it started.
pub(crate) async fn wait_all_live(admin: &Client, n: usize) -> Result<()> {
    let deadline = Instant::now() + LIVE_TIMEOUT;
    loop {
        let live = match admin.cluster_report().await {
            Ok(r) => r
                .chunkservers
                .iter()
                .filter(|c| c.state == ChunkserverState::Live && c.last_heartbeat_ms_ago.is_some())
                .count(),
            Err(_) => 0,
        };
        if live >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("{n} chunkservers live after the heal ({live} are)"),
                secs: LIVE_TIMEOUT.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads a closed file, retrying a read that finds no replica for a bounded time (a
/// replica's chunkserver may still be reporting it).
pub(crate) async fn read_final(admin: &Client, path: &str) -> Result<Vec<u8>> {
    let deadline = Instant::now() + LIVE_TIMEOUT;
    loop {
        match workload::read_file(admin, path).await {
            Ok(b) => return Ok(b),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(e) => {
                tracing::info!(%path, error = %e, "final read failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Recovers `path`'s lease until the file is closed.
pub(crate) async fn recover(admin: &Client, path: &str) -> Result<()> {
    let deadline = Instant::now() + RECOVER_TIMEOUT;
    loop {
        let closed = matches!(admin.stat(path).await, Ok(s) if s.state == FileState::Closed);
        if closed {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("{path} closed by lease recovery"),
                secs: RECOVER_TIMEOUT.as_secs(),
            });
        }
        match admin.recover_lease(path).await {
            Ok(out) if out.closed => return Ok(()),
            Ok(_) => {}
            Err(e) => tracing::info!(%path, error = %e, "recover_lease failed; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Runs `stampfs fsck --json` until it reports healthy; the last answer otherwise.
pub(crate) async fn wait_fsck_healthy(
    bin: &Path,
    master: &MasterAccess,
    net: &Net,
) -> Result<(), String> {
    let deadline = Instant::now() + FSCK_TIMEOUT;
    loop {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["fsck", "--json"])
            .env("STAMPFS_MASTER", &master.addr)
            .env(stampfs_proto::credentials::CREDENTIALS_ENV, &master.creds)
            .env("RUST_LOG", "warn");
        if let Some(ns) = net.runner_netns() {
            crate::net::enter_on_exec(&mut cmd, &ns).map_err(|e| e.to_string())?;
        }
        let out = tokio::process::Command::from(cmd).output().await;
        let last = match out {
            Ok(o) => match fsck_verdict(&o.stdout) {
                Some(true) => return Ok(()),
                Some(false) => String::from_utf8_lossy(&o.stdout).into_owned(),
                None => format!(
                    "no fsck JSON ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                ),
            },
            Err(e) => format!("cannot run fsck: {e}"),
        };
        if Instant::now() > deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `Some(healthy)` from `fsck --json` output, `None` when it is not such JSON.
pub fn fsck_verdict(stdout: &[u8]) -> Option<bool> {
    let v: serde_json::Value = serde_json::from_slice(stdout).ok()?;
    v.get("healthy")?.as_bool()
}

/// The lines of a log that report a panic.
pub fn panic_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("panicked")).collect()
}

/// A [`ViolationKind::Panic`] per log line with "panicked" in any log under `logs`.
pub(crate) fn scan_logs(logs: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(logs).map_err(Error::io(logs))?;
    for e in entries.flatten() {
        let path = e.path();
        let text = std::fs::read(&path).map_err(Error::io(&path))?;
        let text = String::from_utf8_lossy(&text);
        for line in panic_lines(&text) {
            out.push(Violation {
                kind: ViolationKind::Panic,
                file: None,
                offset: None,
                session: None,
                seq: None,
                message: format!("{}: {line}", path.display()),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsck_verdict_reads_the_healthy_field() {
        assert_eq!(
            fsck_verdict(br#"{"healthy": true, "files": []}"#),
            Some(true)
        );
        assert_eq!(fsck_verdict(br#"{"healthy": false}"#), Some(false));
        assert_eq!(fsck_verdict(b"error: cannot reach"), None);
        assert_eq!(fsck_verdict(br#"{"files": []}"#), None);
    }

    #[test]
    fn panic_lines_finds_a_panic_among_ordinary_lines() {
        let log = "INFO started\nthread 'main' panicked at src/x.rs:1:2:\nboom\nINFO ok\n";
        assert_eq!(
            panic_lines(log),
            vec!["thread 'main' panicked at src/x.rs:1:2:"]
        );
        assert!(panic_lines("INFO all good\n").is_empty());
    }
}
