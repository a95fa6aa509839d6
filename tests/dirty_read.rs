//! The dirty read the randomized nemesis found (seed 103), made deterministic with real
//! processes: a reader of a file that is still being written must never see bytes that
//! lease recovery then cuts. Such bytes exist when the replicas of the open last chunk
//! hold different lengths: the writer sent them down the pipeline, some replicas
//! applied them, the others did not, and no ack ever came back. If the writer dies,
//! recovery keeps only what every replica holds (the shortest), so a reader may read no
//! more than that (`visible_length` in `client/src/reader.rs`).
//!
//! A master (`--dead-after 60s`, so a stopped chunkserver stays listed) and three
//! chunkservers; the file's pipeline is `head -> middle -> tail`.
//! 1. The writer, a separate process (this test binary again, running
//!    [`writer_process`]: the client library, so it can hsync and say when it has),
//!    creates the file, writes [`SYNCED`] bytes and hsyncs them: every replica holds
//!    them durably.
//! 2. The tail is SIGSTOPped; the writer writes [`UNACKED`] more bytes and hflushes.
//!    The head and the middle apply them (each writes locally while it forwards), the
//!    tail's kernel buffers them unread, and no ack comes back. Once the head and the
//!    middle report holding them, the writer is SIGSTOPped too: it still holds its
//!    lease, and it never learns what follows (else it would recover its pipeline
//!    without the tail, and the bytes would become acknowledged).
//! 3. First read, the tail still stopped: the master hands out all three replicas,
//!    the tail does not answer the reader's `ReplicaInfo`.
//! 4. The stopped tail is SIGKILLed and started again. The bytes that sat unread in
//!    its socket die with the process; it comes back holding exactly the hsynced bytes
//!    it applied before the stop, at the granted version: a current replica of the
//!    granted pipeline, handed out again.
//! 5. Second read: every replica answers, the tail with fewer bytes than the others.
//! 6. The writer is SIGKILLed and its lease recovered (`RecoverLease`): recovery bumps
//!    the three replicas, keeps the shortest and cuts the unacknowledged bytes.
//!
//! Then both reads must be prefixes of the recovered file, and the recovered file must
//! hold every hsynced byte.
//!
//! **Why the tail is killed and restarted, not continued.** A SIGCONTed tail reads the
//! packets waiting in its socket and applies them (same version, contiguous) at once,
//! before the master is even asked to recover, so every replica ends up with the
//! unacknowledged bytes, recovery keeps them, and what a reader saw is in the final
//! file whatever `visible_length` does: the test would pass with the bug. For the
//! tail to stay short it would have to take the recovery bump before those packets,
//! which is a race between two sockets of the resumed process that nothing outside it
//! decides. (Recovering while the tail is still stopped does not help either: its bump
//! times out, recovery seals the head and the middle at their common length, and
//! nothing is cut.) Killing the stopped process discards its unread socket data, so
//! what the tail holds is decided by the test. That is a fault the nemesis injects as
//! well (SIGKILL, restart).
//!
//! Nothing here waits for a time to pass: every wait is for a state, bounded by
//! [`WAIT`]. The master lists an open chunk's replicas in pipeline order (head first;
//! `MasterState::locations`), which is how the test knows which one is the tail; step 2
//! checks it, since only a stopped tail lets the two others reach the longer length.
//!
//! [`WAIT`]: common::WAIT

mod common;

use common::writer::{replica_length, Writer, WriterProcess, MORE};
use common::{common_prefix, runtime, wait_for, Opts, TestCluster};
use stampfs_client::ClientConfig;
use stampfs_proto::{ChunkVersion, LocatedChunk};
use std::time::{Duration, Instant};

const PATH: &str = "/dirty";
/// Bytes the writer hsyncs: acknowledged, on every replica.
const SYNCED: usize = 200_000;
/// Bytes the writer sends after the tail froze: never acknowledged.
const UNACKED: usize = 100_000;
/// The reader's request timeout: how long it waits for the stopped tail's answer.
const READER_TIMEOUT: Duration = Duration::from_secs(2);

/// The writer process, [`writer_process`]. `STAMPFS_DIRTY_READ_MASTER` names the
/// master in its environment; without it [`writer_process`] is not the writer and does
/// nothing.
const WRITER: WriterProcess = WriterProcess {
    test: "writer_process",
    started_by: "a_reader_never_sees_bytes_that_lease_recovery_cuts",
    master_env: "STAMPFS_DIRTY_READ_MASTER",
    path: PATH,
    synced: SYNCED,
    synced_seed: 103,
    hsynced: HSYNCED,
    unacked: UNACKED,
    unacked_seed: 104,
    hflushed: "dirty-read writer: hflush returned",
};
/// What the writer process prints once its hsync returned.
const HSYNCED: &str = "dirty-read writer: hsynced";

/// The writer process. Run by [`a_reader_never_sees_bytes_that_lease_recovery_cuts`]
/// (this binary with `writer_process --exact --ignored`), never on its own: it creates
/// [`PATH`], writes and hsyncs [`SYNCED`] bytes, prints [`HSYNCED`], and on a line on
/// its stdin writes [`UNACKED`] bytes and hflushes them, which does not return while
/// the tail is stopped. The test SIGSTOPs and then SIGKILLs it.
#[test]
#[ignore = "the dirty-read test's writer process, started by that test"]
fn writer_process() {
    WRITER.run();
}

fn reader_config() -> ClientConfig {
    ClientConfig {
        request_timeout: READER_TIMEOUT,
        ..ClientConfig::default()
    }
}

/// The file's last chunk as the master hands it to readers.
async fn last_chunk(c: &TestCluster) -> LocatedChunk {
    let client = common::connect_with(&c.master.addr, reader_config())
        .await
        .expect("connect to the master");
    let locs = client.locations(PATH).await.expect("locations");
    locs.chunks.last().cloned().expect("the file has a chunk")
}

/// Everything a new reader sees of the file now.
async fn read_all(c: &TestCluster) -> Vec<u8> {
    common::writer::read_all(c, reader_config(), PATH).await
}

#[test]
fn a_reader_never_sees_bytes_that_lease_recovery_cuts() {
    let t0 = Instant::now();
    let say = |what: String| eprintln!("[dirty_read +{:.1}s] {what}", t0.elapsed().as_secs_f64());
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // A long `--dead-after` (instead of the harness's 2 s), so the stopped tail is still
    // handed out to the first reader: a replica the master does not list cannot hold a
    // reader back (the gap the read path in docs/DESIGN.md leaves open).
    let mut c = TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--dead-after", "60s"]),
        chunkserver_args: args(&["--heartbeat", "200ms", "--ack-timeout", "300s"]),
        ..Default::default()
    });
    let rt = runtime();
    let synced = WRITER.synced_bytes();
    let total = (SYNCED + UNACKED) as u64;

    // 1. SYNCED bytes hsynced: on every replica.
    let mut w = Writer::start(&c, &WRITER);
    w.wait_for_line(HSYNCED);
    let chunk = rt.block_on(last_chunk(&c));
    let granted: ChunkVersion = chunk.version;
    let pipeline: Vec<String> = chunk.replicas.iter().map(|r| r.addr.clone()).collect();
    assert_eq!(pipeline.len(), 3, "three replicas: {chunk:?}");
    let lengths = rt.block_on(async {
        let mut l = Vec::new();
        for addr in &pipeline {
            l.push(replica_length(addr, chunk.token, READER_TIMEOUT).await);
        }
        l
    });
    assert!(
        lengths.iter().all(|l| *l == Some(SYNCED as u64)),
        "after the hsync every replica holds the {SYNCED} bytes: {lengths:?}"
    );
    let tail = c
        .chunkservers
        .iter()
        .position(|p| p.addr == pipeline[2])
        .expect("the tail's chunkserver");
    say(format!(
        "{SYNCED} bytes hsynced on {pipeline:?} at version {granted}; stopping the tail {}",
        c.chunkservers[tail].name
    ));

    // 2. The tail freezes; UNACKED more bytes reach the head and the middle only.
    c.chunkservers[tail].stop();
    w.send(MORE);
    wait_for(
        "the head and the middle to hold the unacknowledged bytes (if they do not, the \
         last replica listed was not the pipeline's tail)",
        || {
            rt.block_on(async {
                for addr in &pipeline[..2] {
                    if replica_length(addr, chunk.token, READER_TIMEOUT).await != Some(total) {
                        return false;
                    }
                }
                true
            })
        },
    );
    w.stop();
    say(format!(
        "head and middle hold {total} bytes, the stopped tail {SYNCED}; writer stopped"
    ));

    // 3. A reader while the tail is stopped (it does not answer).
    let first = rt.block_on(read_all(&c));
    say(format!(
        "first reader (tail stopped) saw {} bytes",
        first.len()
    ));

    // 4. The stopped tail is killed (its unread packets die with it) and restarted.
    let registrations = |c: &TestCluster| {
        c.chunkservers[tail]
            .log_text()
            .matches("registered with the master")
            .count()
    };
    let before = registrations(&c);
    c.chunkservers[tail].restart();
    wait_for("the restarted tail to register again", || {
        registrations(&c) > before
    });
    wait_for("the master to hand out the restarted tail again", || {
        let now = rt.block_on(last_chunk(&c));
        now.replicas.iter().any(|r| r.addr == pipeline[2])
    });
    let chunk = rt.block_on(last_chunk(&c));
    assert_eq!(
        chunk.version, granted,
        "the chunk's version moved: the writer recovered its pipeline, the scenario did \
         not come about ({chunk:?})"
    );
    let lengths = rt.block_on(async {
        let mut l = Vec::new();
        for r in &chunk.replicas {
            l.push((
                r.addr.clone(),
                replica_length(&r.addr, chunk.token, READER_TIMEOUT).await,
            ));
        }
        l
    });
    let of = |addr: &str| {
        lengths
            .iter()
            .find(|(a, _)| a == addr)
            .and_then(|(_, l)| *l)
    };
    assert!(
        chunk.replicas.len() == 3
            && of(&pipeline[0]) == Some(total)
            && of(&pipeline[1]) == Some(total)
            && of(&pipeline[2]) == Some(SYNCED as u64),
        "the replicas of the open chunk should hold {total}, {total} and {SYNCED} bytes \
         (head, middle, restarted tail): {lengths:?}"
    );

    // 5. A reader while every replica answers, with different lengths.
    let second = rt.block_on(read_all(&c));
    say(format!(
        "replicas hold {lengths:?}; second reader saw {} bytes",
        second.len()
    ));

    // 6. The writer dies; its lease is recovered.
    w.kill();
    let outcome = rt.block_on(async {
        let client = common::connect(&c.master.addr)
            .await
            .expect("connect to the master");
        client.recover_lease(PATH).await.expect("recover the lease")
    });
    assert!(outcome.closed, "recovery closed the file: {outcome:?}");
    let recovered = rt.block_on(read_all(&c));
    say(format!(
        "recovery closed the file at {} bytes ({outcome:?})",
        recovered.len()
    ));

    assert!(
        recovered.starts_with(&synced),
        "the recovered file ({} bytes) lost hsynced bytes: it keeps {} of the {SYNCED}",
        recovered.len(),
        common_prefix(&recovered, &synced)
    );
    assert_eq!(
        recovered.len(),
        SYNCED,
        "recovery kept the shortest replica, cutting the {UNACKED} unacknowledged bytes \
         (otherwise the scenario did not come about)"
    );
    let dirty: Vec<String> = [
        ("the first reader (tail stopped, not answering)", &first),
        ("the second reader (every replica answering)", &second),
    ]
    .iter()
    .filter(|(_, seen)| !recovered.starts_with(seen))
    .map(|(who, seen)| {
        format!(
            "{who} saw {} bytes, of which {} are not in the recovered file",
            seen.len(),
            seen.len() - common_prefix(seen, &recovered)
        )
    })
    .collect();
    assert!(
        dirty.is_empty(),
        "dirty read: readers of the open file saw bytes that lease recovery then cut (the \
         file closed at {} bytes): {}",
        recovered.len(),
        dirty.join("; ")
    );
}
