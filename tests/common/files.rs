//! Helpers of the tests that write files at any offset: a cluster for them, reading a
//! file whole through the library, the in-memory model of a file, and the check that
//! every chunk's replicas hold the same bytes.

use super::{Opts, TestCluster};
use stampfs_client::Client;
use stampfs_nemesis::replicas::check_replicas;
use tokio::io::AsyncReadExt;

/// Three chunkservers on I/O engine `engine` ("uring", "threads", "auto"), leases of
/// 2 s (soft) and 4 s (hard).
pub fn cluster(engine: &str) -> TestCluster {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--lease-soft", "2s", "--lease-hard", "4s"]),
        chunkserver_args: args(&["--heartbeat", "200ms", "--io-engine", engine]),
        ..Default::default()
    })
}

/// The whole of `path`, read through a fresh reader.
pub async fn read_all(client: &Client, path: &str) -> Vec<u8> {
    let mut r = client.open(path).await.expect("open for reading");
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.expect("read");
    out
}

/// `data` written at `offset` of `model`, a gap past its end filled with zeros.
pub fn apply(model: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[offset as usize..end].copy_from_slice(data);
}

/// The replicas of every chunk of `path` at the master's version are byte-identical.
pub async fn assert_replicas_identical(client: &Client, path: &str) {
    let v = check_replicas(client, path, None)
        .await
        .expect("replica check");
    assert!(v.is_empty(), "replicas differ: {v:?}");
}

/// Waits (60 s at most) until every chunk of `path` lists `n` replicas (replica health
/// re-replicated what recovery left), then checks they are identical.
pub async fn wait_replicated(client: &Client, path: &str, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let locs = client.locations(path).await.expect("locations");
        if locs.chunks.iter().all(|ch| ch.replicas.len() == n) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "replication did not recover"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_replicas_identical(client, path).await;
}
