//! A writer's pipeline recovery must not cut bytes a reader has seen (found by the
//! nemesis with crash points; the unit tests of the rule are `resume_offset` in
//! client/src/writer/policy.rs and the writer engine's in client/src/writer/tests).
//!
//! The writer hsyncs `A`, then sends `B`: every replica takes it, but the head's acks
//! never reach the writer (in the writer's network namespace, nftables drops what
//! arrives from the head: a one-way partition). A reader meanwhile reads `A + B` (a
//! reader reads what every replica of the open chunk holds). The writer's ack timeout
//! excludes the head and reopens the stream on the two others, and dies at the crash
//! point `writer-reopen-before-resend`, after the new stream's set-up and before it
//! resends `B`. Lease recovery then closes the file at what the replicas hold.
//!
//! Reopened at the acknowledged offset (`A`), the set-up cut both replicas back to `A`,
//! the file ended as `A`, and the reader had seen bytes that are not in it. Reopened
//! where every member's replica ends, the file is `A + B`.
//!
//! Root with iproute2 and nftables only (CI has them); elsewhere it says SKIPPED.

mod common;

use common::pattern;
use stampfs_client::{ClientConfig, CreateOptions};
use stampfs_nemesis::cluster::{Cluster, ClusterConfig};
use stampfs_nemesis::net::{enter_on_exec, Net, NetMode};
use stampfs_nemesis::schedule::Target;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_stampfs");
const PATH: &str = "/resume";
const MASTER_ENV: &str = "STAMPFS_TEST_RESUME_MASTER";
const WRITER_TEST: &str = "writer_process_of_the_resume_test";
/// The writer's ack timeout: the window in which the test's reader must see `B`.
const ACK_TIMEOUT: Duration = Duration::from_secs(4);
const WAIT: Duration = Duration::from_secs(60);

fn synced() -> Vec<u8> {
    pattern(100_000, 7)
}

fn unacked() -> Vec<u8> {
    pattern(30_000, 8)
}

/// The writer, run by the test below as a process of its own in its own namespace.
#[test]
#[ignore = "the writer process of a_pipeline_recovery_keeps_what_a_reader_saw_when_the_writer_dies_before_resending"]
fn writer_process_of_the_resume_test() {
    let Ok(master) = std::env::var(MASTER_ENV) else {
        eprintln!("SKIPPED: the writer of a_pipeline_recovery_keeps_what_a_reader_saw_... runs only under it");
        return;
    };
    stampfs_proto::crash::arm_from_env().expect("arm the crash points");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // The run's superuser, whose credentials file the test names.
    let creds = std::env::var_os(common::CREDENTIALS_ENV).expect("the writer is given credentials");
    let config = ClientConfig {
        ack_timeout: ACK_TIMEOUT,
        credentials: Some(stampfs_proto::Credentials::load(creds.as_ref()).expect("credentials")),
        ..ClientConfig::default()
    };
    let (_client, mut writer) = rt.block_on(async {
        let client = common::connect_with(&master, config)
            .await
            .expect("connect");
        let opts = CreateOptions {
            replication: Some(3),
            ..CreateOptions::default()
        };
        let mut w = client.create(PATH, opts).await.expect("create");
        w.write_all(&synced()).await.expect("write");
        w.hsync().await.expect("hsync");
        (client, w)
    });
    println!("hsynced");
    std::io::stdout().flush().expect("stdout");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    rt.block_on(async {
        writer.write_all(&unacked()).await.expect("write");
        // Does not return: the crash point kills this process in the recovery.
        let r = writer.hflush().await;
        println!("hflushed {r:?}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_recovery_keeps_what_a_reader_saw_when_the_writer_dies_before_resending() {
    if let (NetMode::Loopback, Some(why)) = NetMode::detect() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI must run this test: {why}"
        );
        eprintln!("SKIPPED: {why}");
        return;
    }
    let hosts = [
        Target::Master(0),
        Target::Chunkserver(0),
        Target::Chunkserver(1),
        Target::Chunkserver(2),
        Target::Client(0),
    ];
    let net = Net::namespaces(&hosts).expect("network namespaces");
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ClusterConfig {
        chunkservers: 3,
        chunk_size: "1MiB".into(),
        ..ClusterConfig::default()
    };
    let cluster = Cluster::start(BIN.as_ref(), dir.path(), &cfg, &net)
        .await
        .expect("cluster");
    let master = cluster.master_addr().to_string();
    // Its master wrote its superuser's credentials at its first start: every client of
    // this test presents them.
    let creds_file = stampfs_nemesis::cluster::credentials_file(dir.path());
    let creds = stampfs_proto::Credentials::load(&creds_file).expect("the superuser's credentials");
    let connect = move |m: String| {
        let config = ClientConfig {
            credentials: Some(creds.clone()),
            ..ClientConfig::default()
        };
        async move { common::connect_with(&m, config).await }
    };

    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new(exe);
    cmd.args([WRITER_TEST, "--exact", "--ignored", "--nocapture"])
        .env(MASTER_ENV, &master)
        .env(common::CREDENTIALS_ENV, &creds_file)
        .env(
            stampfs_proto::crash::ENV_POINTS,
            "writer-reopen-before-resend=1",
        )
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("writer.log")).expect("writer log"),
        ));
    enter_on_exec(&mut cmd, &net.netns_of(Target::Client(0)).expect("netns")).expect("netns");
    let mut child = cmd.spawn().expect("spawn the writer");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let writer_log = || std::fs::read_to_string(dir.path().join("writer.log")).unwrap_or_default();
    // The test harness prints lines of its own around the writer's.
    let hsynced = lines.by_ref().map_while(Result::ok).any(|l| l == "hsynced");
    assert!(hsynced, "the writer did not hsync:\n{}", writer_log());

    // The head of the open chunk's pipeline (listed first).
    let (m, conn) = (master.clone(), connect.clone());
    let head_addr = net
        .admin(move || async move {
            let c = conn(m).await.expect("connect");
            let loc = c.locations(PATH).await.expect("locations");
            Ok(loc.chunks[0].replicas[0].addr.clone())
        })
        .await
        .expect("admin");
    let head = cluster
        .chunkservers
        .iter()
        .position(|p| p.addr == head_addr)
        .expect("the head is one of the chunkservers");
    net.drop_arriving(Target::Client(0), &[Target::Chunkserver(head)])
        .expect("drop the head's answers");
    writeln!(stdin, "more").expect("tell the writer");
    stdin.flush().expect("flush");

    // A reader sees B while the writer waits for its acks.
    let want: Vec<u8> = [synced(), unacked()].concat();
    let (m, conn) = (master.clone(), connect.clone());
    let seen = net
        .admin(move || async move {
            let c = conn(m).await.expect("connect");
            let deadline = Instant::now() + ACK_TIMEOUT;
            let mut got = Vec::new();
            while Instant::now() < deadline {
                let mut r = c.open(PATH).await.expect("open");
                got.clear();
                r.read_to_end(&mut got).await.expect("read");
                if got.len() == want.len() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(got)
        })
        .await
        .expect("admin");
    assert_eq!(
        seen.len(),
        synced().len() + unacked().len(),
        "the reader never saw the unacknowledged bytes on every replica"
    );

    // The writer dies at the crash point.
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the writer did not reach its crash point:\n{}",
            writer_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = writer_log();
    assert!(
        log.contains("crash point writer-reopen-before-resend hit"),
        "the writer ended otherwise ({status}):\n{log}"
    );
    net.heal().expect("heal");

    // Lease recovery (the hard limit passed) closes the file at what the replicas hold.
    let (m, conn) = (master.clone(), connect.clone());
    let (state, after) = net
        .admin(move || async move {
            let c = conn(m).await.expect("connect");
            let deadline = Instant::now() + WAIT;
            loop {
                let st = c.stat(PATH).await.expect("stat");
                if st.state == stampfs_proto::FileState::Closed {
                    let mut r = c.open(PATH).await.expect("open");
                    let mut got = Vec::new();
                    r.read_to_end(&mut got).await.expect("read");
                    return Ok((st.state, got));
                }
                if Instant::now() > deadline {
                    return Ok((st.state, Vec::new()));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("admin");
    assert_eq!(
        state,
        stampfs_proto::FileState::Closed,
        "lease recovery did not close the file"
    );
    assert!(
        after.len() >= seen.len() && after[..seen.len()] == seen[..],
        "the reader saw {} bytes, the recovered file holds {}: bytes a reader saw were cut",
        seen.len(),
        after.len()
    );
    assert_eq!(after, [synced(), unacked()].concat());
}
