//! The client against chunkservers that close idle connections (`--idle-timeout`), on
//! real processes: a writer that pauses longer than the chunkservers' idle timeout
//! between writes keeps all its replicas (its stream is reopened with the same token,
//! no version bump), and a reader whose pooled chunkserver connections were closed
//! during a pause still reads everything, including the hflushed tail of a file that
//! is still being written.
//!
//! Two cases: the writer's own idle close off, so the chunkservers close the stream
//! and the writer must not blame the head for it; and the writer's idle close below
//! the chunkservers', so it closes the stream first.

mod common;

use common::{fsck_json, Opts, TestCluster};
use stampfs_client::{Client, ClientConfig, CreateOptions};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The chunkservers' idle timeout.
const SERVER_IDLE: &str = "1s";
/// The writer's and reader's pause: well past the chunkservers' idle timeout.
const PAUSE: Duration = Duration::from_millis(2500);
const PATH: &str = "/logs/app.log";
/// A file with one replica, kept open: a reader whose only replica's pooled
/// connection was closed has no other replica to fall back on.
const SINGLE: &str = "/logs/single.log";

fn cluster() -> TestCluster {
    TestCluster::with(Opts {
        chunkserver_args: vec![
            "--heartbeat".into(),
            "200ms".into(),
            "--idle-timeout".into(),
            SERVER_IDLE.into(),
        ],
        ..Opts::default()
    })
}

/// The last chunk's version at the master and how many replicas it hands out.
async fn last_chunk(client: &Client) -> (u64, usize) {
    let locs = client.locations(PATH).await.expect("locations");
    let last = locs.chunks.last().expect("a chunk");
    (last.version.0, last.replicas.len())
}

/// Everything a new reader sees of `path`.
async fn read_all(client: &Client, path: &str) -> Vec<u8> {
    let mut r = client.open(path).await.expect("open");
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.expect("read");
    got
}

/// Lines in every chunkserver's log containing `what`.
fn count_in_logs(c: &TestCluster, what: &str) -> usize {
    c.chunkservers
        .iter()
        .map(|cs| cs.log_text().matches(what).count())
        .sum()
}

/// `stream_idle_close`: the writer's own idle close. `pool_idle`: how long a pooled
/// chunkserver connection may idle and still be reused (above the chunkservers' idle
/// timeout, a reused connection is found closed and the read retried on a new one).
fn pausing_writer_keeps_its_replicas(stream_idle_close: Option<Duration>, pool_idle: Duration) {
    let c = cluster();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let config = ClientConfig {
        stream_idle_close,
        pooled_connection_max_idle: pool_idle,
        ..ClientConfig::default()
    };
    rt.block_on(async {
        let client = common::connect_with(&c.master.addr, config)
            .await
            .expect("connect");
        client.mkdir("/logs", true).await.expect("mkdir");
        let opts = CreateOptions {
            replication: Some(3),
            ..CreateOptions::default()
        };
        let mut w = client.create(PATH, opts).await.expect("create");
        let single_opts = CreateOptions {
            replication: Some(1),
            ..CreateOptions::default()
        };
        let mut single = client.create(SINGLE, single_opts).await.expect("create");
        let single_data = b"one replica, hflushed, still open\n".to_vec();
        single.write_all(&single_data).await.expect("write");
        single.hflush().await.expect("hflush");
        let mut want = Vec::new();
        let mut first = None;
        for i in 0..4 {
            let line = format!("line {i}: {}\n", "x".repeat(100 * (i + 1)));
            w.write_all(line.as_bytes()).await.expect("write");
            w.hflush()
                .await
                .unwrap_or_else(|e| panic!("hflush {i}: {e}"));
            want.extend_from_slice(line.as_bytes());
            let (version, replicas) = last_chunk(&client).await;
            let first = *first.get_or_insert(version);
            assert_eq!(
                version, first,
                "write {i}: a pause made the writer bump the chunk's version"
            );
            assert_eq!(replicas, 3, "write {i}: a replica was dropped");
            // A new reader sees every hflushed byte of the open files.
            assert!(
                read_all(&client, PATH).await == want,
                "write {i}: the hflushed tail is not readable"
            );
            assert!(read_all(&client, SINGLE).await == single_data);
            if i < 3 {
                tokio::time::sleep(PAUSE).await;
                // The chunkservers closed the pooled read connections meanwhile.
                assert!(
                    read_all(&client, SINGLE).await == single_data,
                    "after pause {i}: the hflushed tail of {SINGLE} is not readable"
                );
                assert!(
                    read_all(&client, PATH).await == want,
                    "after pause {i}: the hflushed tail is not readable"
                );
            }
        }
        single.close().await.expect("close");
        let status = w.close().await.expect("close");
        assert_eq!(status.length, want.len() as u64);
        let (version, replicas) = last_chunk(&client).await;
        assert_eq!(
            version,
            first.expect("a version"),
            "close bumped the version"
        );
        assert_eq!(replicas, 3);
        tokio::time::sleep(PAUSE).await;
        assert!(
            read_all(&client, PATH).await == want,
            "the file did not read back"
        );
        assert!(read_all(&client, SINGLE).await == single_data);
    });

    // Each write after a pause went out on a new stream (one per write, each set up
    // on all three chunkservers; plus the single-replica file's), and none of them
    // was a pipeline recovery (the versions did not move).
    let opened = count_in_logs(&c, "write stream open");
    assert!(
        opened > 4 * 3,
        "expected a stream per write, saw {opened} set-ups"
    );
    let server_closed = count_in_logs(&c, "upstream idle; ending the stream");
    eprintln!(
        "stream set-ups: {opened}; streams the chunkservers closed for idleness: {server_closed}"
    );
    if stream_idle_close.is_none() {
        assert!(
            server_closed > 0,
            "the chunkservers never closed an idle stream: the case was not exercised"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let report = loop {
        let (code, v) = fsck_json(&c, &[]);
        if code == Some(0) && v["healthy"] == true {
            break v;
        }
        assert!(Instant::now() < deadline, "fsck never became healthy: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let total = &report["total"];
    assert_eq!(total["stale_replicas"], 0, "{report}");
    assert_eq!(total["under_replicated"], 0, "{report}");
    assert_eq!(total["healthy"], total["chunks"], "{report}");
}

/// The chunkservers close the idle stream; the writer reopens it instead of dropping
/// the head. Pooled read connections are reused after the chunkservers closed them
/// (the default bound is far above their 1 s), found closed, and retried.
#[test]
fn a_stream_the_chunkservers_closed_for_idleness_is_reopened_without_a_version_bump() {
    pausing_writer_keeps_its_replicas(None, ClientConfig::default().pooled_connection_max_idle);
}

/// The writer closes its idle stream before the chunkservers do, and pooled read
/// connections are retired before the chunkservers close them.
#[test]
fn the_writer_closes_its_idle_stream_before_the_chunkservers_do() {
    pausing_writer_keeps_its_replicas(Some(Duration::from_millis(300)), Duration::from_millis(500));
}
