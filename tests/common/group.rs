//! A master group of three `stampfs master` processes on loopback (`--peers`), the
//! chunkservers given every member, and helpers to find which member leads.

use super::{test_credentials, Proc};
use stampfs_client::{ClientConfig, Error as ClientError};
use stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE;
use stampfs_proto::{ClusterKey, RemoteError};
use std::time::{Duration, Instant};

pub const ELECTION: Duration = Duration::from_secs(30);

pub fn free_addrs(n: usize) -> Vec<String> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect()
}

pub fn quick() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        ..ClientConfig::default()
    }
}

/// Whether member `addr` serves: a mkdir of `probe` succeeds there (`NotLeader` and
/// transport failures say no).
pub async fn serves(addr: &str, probe: &str) -> bool {
    let Ok(c) = super::connect_with(addr, quick()).await else {
        return false;
    };
    match c.mkdir(probe, true).await {
        Ok(_) => true,
        Err(ClientError::Remote(RemoteError::NotLeader { .. })) => false,
        Err(_) => false,
    }
}

/// The index of the member that serves, asking the members in `among`.
pub async fn leader(addrs: &[String], among: &[usize]) -> usize {
    let started = Instant::now();
    let mut round = 0;
    loop {
        for &i in among {
            round += 1;
            if serves(&addrs[i], &format!("/probe/{round}")).await {
                return i;
            }
        }
        assert!(
            started.elapsed() < ELECTION,
            "no member serves after {ELECTION:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three members on new directories, started.
pub fn spawn_group() -> (tempfile::TempDir, Vec<String>, Vec<Proc>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let addrs = free_addrs(3);
    let key = tmp.path().join("cluster.key");
    ClusterKey::load_or_create(&key).expect("cluster key");
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let members: Vec<Proc> = (0..3)
        .map(|i| {
            let dir = tmp.path().join(format!("m{}", i + 1));
            std::fs::create_dir_all(&dir).expect("dir");
            test_credentials()
                .write(&dir.join(ADMIN_CREDENTIALS_FILE), true)
                .expect("credentials");
            let args = [
                "master",
                "--dir",
                dir.to_str().expect("utf-8"),
                "--listen",
                &addrs[i],
                "--id",
                &(i + 1).to_string(),
                "--peers",
                &peers,
                "--cluster-key-file",
                key.to_str().expect("utf-8"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            Proc::spawn(&format!("master{}", i + 1), &dir, args, &logs)
        })
        .collect();

    (tmp, addrs, members)
}

/// Live chunkservers the leader the client follows sees (registered since it leads).
pub async fn live_chunkservers(c: &stampfs_client::Client) -> usize {
    match c.cluster_report().await {
        Ok(r) => r
            .chunkservers
            .iter()
            .filter(|s| {
                s.state == stampfs_proto::ChunkserverState::Live
                    && s.last_heartbeat_ms_ago.is_some()
            })
            .count(),
        Err(_) => 0,
    }
}

pub async fn wait_live(c: &stampfs_client::Client, n: usize) {
    let started = Instant::now();
    while live_chunkservers(c).await < n {
        assert!(
            started.elapsed() < ELECTION,
            "{n} chunkservers never registered with the leader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn put(c: &stampfs_client::Client, path: &str, data: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let mut w = c
        .create(path, stampfs_client::CreateOptions::default())
        .await
        .unwrap_or_else(|e| panic!("create {path}: {e}"));
    w.write_all(data).await.expect("write");
    w.close().await.expect("close");
}

pub async fn get(c: &stampfs_client::Client, path: &str) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut r = c
        .open(path)
        .await
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.expect("read");
    out
}

/// Three chunkservers given every member of the group (`all`, comma-separated), with
/// quick heartbeats, in `tmp`'s `cs0`..`cs2`.
pub fn spawn_chunkservers(tmp: &std::path::Path, all: &str) -> Vec<Proc> {
    let key = tmp.join("cluster.key");
    let logs = tmp.join("logs");
    (0..3)
        .map(|i| {
            let dir = tmp.join(format!("cs{i}"));
            let args = [
                "chunkserver",
                "--dir",
                dir.to_str().expect("utf-8"),
                "--listen",
                "127.0.0.1:0",
                "--master",
                all,
                "--cluster-key-file",
                key.to_str().expect("utf-8"),
                "--heartbeat",
                "200ms",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            Proc::spawn(&format!("cs{i}"), &dir, args, &logs)
        })
        .collect()
}
