//! The dirty read the randomized nemesis found with a network partition (seed 21), made
//! deterministic with real processes: a reader of a file in lease recovery must never
//! see bytes that the recovery then cuts. While a file is `Recovering` the master hands
//! out only the replicas that already took the recovery's new version. If the longest
//! replica of the writer's pipeline is the only one that took it (the others, still at
//! the writer's version, unreachable for the moment), a reader that asks the listed
//! replicas how much they hold sees bytes that the others lack. Once those are back,
//! recovery keeps the shortest length and the bytes are gone. So a file in recovery is
//! read only up to its last chunk's committed length (`load_view` in
//! `client/src/reader.rs`).
//!
//! A master and three chunkservers; the file's pipeline is `head -> middle -> tail`.
//! 1. The writer, a separate process (this test binary again, running
//!    [`writer_process`]: the client library, so it can hsync and say when it has),
//!    creates the file, writes [`SYNCED`] bytes and hsyncs them: every replica holds
//!    them durably, at the writer's (granted) version.
//! 2. The middle is SIGSTOPped; the writer writes [`UNACKED`] more bytes and hflushes.
//!    The head applies them (it writes locally while it forwards), the middle's kernel
//!    buffers them unread, nothing reaches the tail, and no ack comes back. Once the
//!    head reports holding them, the writer is SIGKILLed.
//! 3. The tail is SIGSTOPped too, and the lease is recovered (`RecoverLease`, from a
//!    thread: it answers when the attempt has ended, or after 10 s). The master mints
//!    a new version, logs `RecoveryStarted` (the file is `Recovering`) and pushes the
//!    bump to the three replicas. The head takes it at once; the master then waits for
//!    the middle's and the tail's answers, which do not come while they are stopped.
//!    Meanwhile the head's next chunk report (`--report-every 200ms`) tells the master
//!    it holds the new version: the master lists it, and only it, for readers.
//!    `stat` says `Recovering`, and the head answers a `ReplicaInfo` under the new
//!    version with [`SYNCED`] + [`UNACKED`] bytes.
//! 4. A reader opens the file and reads it to the end (the bytes are recorded). With
//!    the fix it reads the last chunk's committed length, which for this open chunk is
//!    0 (the master learns the hsynced length only at recovery); without it, it asks
//!    the head and reads all [`SYNCED`] + [`UNACKED`] bytes.
//! 5. The head is SIGKILLed, then the stopped middle and tail. Their bumps fail, the
//!    master goes on to seal the head at the one length it has, and cannot reach it:
//!    the attempt fails and the file stays `Recovering`.
//! 6. The middle and the tail are started again. The bytes that sat unread in the
//!    middle's socket died with the process: both come back holding exactly the
//!    hsynced bytes, at the writer's version. The recovery worker retries (at once on
//!    their registration): the new attempt reaches them, keeps the shortest length and
//!    closes the file (on the middle alone if it runs before the tail is back: the
//!    outcome is the same). The head, started again last, is stale.
//!
//! Then the recovered file must hold every hsynced byte, must have lost the
//! unacknowledged ones (else the scenario did not come about), and what the reader saw
//! must be a prefix of it.
//!
//! **How this differs from the nemesis run, and why.** There, the master lost the head
//! (a partition) after the head had acknowledged the bump, so the seal failed while
//! readers, not cut off from the head, still reached it. On loopback there is no
//! partition to be had: the master and a reader reach a chunkserver alike.
//! So the read happens inside the attempt that bumped the head, before that attempt
//! seals anything (the master learns the head's new version from the head's chunk
//! report instead of from the bump reply, which it records only once every bump has
//! answered), and the head is then killed so that the attempt cannot seal it at its
//! length (a seal that reached it would close the file with the unacknowledged bytes:
//! nothing cut, nothing to catch). What the reader sees is the same in both: a
//! `Recovering` file whose only listed replica is the longest of the pipeline.
//!
//! **Why the middle and the tail are killed and restarted, not continued.** As in
//! `tests/dirty_read.rs`: a SIGCONTed middle reads the packets waiting in its socket
//! and applies them (same version, contiguous), racing the recovery bump on another
//! socket of the same process; if the packets win, every replica ends up long and
//! nothing is cut. Killing the stopped process discards its unread socket data, so
//! what the middle holds is decided by the test.
//!
//! **Determinism.** Every wait is for a state, bounded by [`WAIT`]; nothing waits for a
//! time to pass and no assertion is timed. The one ordering that matters, that the
//! master seals (or tries to seal) the head only after the reader read it and the head
//! was killed, is forced by the master itself: it seals only once every bump has
//! answered, and the stopped middle and tail answer only when they are killed. The
//! master's `--command-timeout` (600 s) outlasts every wait in between (a wait that
//! took that long would have failed the test first), and its `--dead-after` (600 s)
//! keeps the stopped chunkservers listed as live, so they are bump targets and the
//! master waits for them (a dead one is not a target: the attempt would bump the head
//! alone and seal it at once). The master lists an open chunk's replicas in pipeline
//! order (head first; `MasterState::locations`), which is how the test knows which one
//! is the middle; step 2 checks it, since only a stopped middle lets the head alone
//! reach the longer length.
//!
//! [`WAIT`]: common::WAIT

mod common;

use common::writer::{last_chunk, replica_info, replica_length, Writer, WriterProcess, MORE};
use common::{common_prefix, runtime, wait_for, Opts, TestCluster};
use stampfs_client::{Client, ClientConfig};
use stampfs_proto::{ChunkVersion, FileLocations, FileState, RecoveryOutcome, ReplicaReport};
use std::time::{Duration, Instant};

const PATH: &str = "/recovering";
/// Bytes the writer hsyncs: acknowledged, on every replica.
const SYNCED: usize = 200_000;
/// Bytes the writer sends after the middle froze: never acknowledged, on the head only.
const UNACKED: usize = 100_000;
/// How long the test's own requests to a chunkserver may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The writer process, [`writer_process`]. `STAMPFS_RECOVERING_READ_MASTER` names the
/// master in its environment; without it [`writer_process`] is not the writer and does
/// nothing.
const WRITER: WriterProcess = WriterProcess {
    test: "writer_process",
    started_by: "a_reader_of_a_file_in_lease_recovery_never_sees_bytes_that_recovery_cuts",
    master_env: "STAMPFS_RECOVERING_READ_MASTER",
    path: PATH,
    synced: SYNCED,
    synced_seed: 21,
    hsynced: HSYNCED,
    unacked: UNACKED,
    unacked_seed: 22,
    hflushed: "recovering-read writer: hflush returned",
};
/// What the writer process prints once its hsync returned.
const HSYNCED: &str = "recovering-read writer: hsynced";

/// The writer process. Run by
/// [`a_reader_of_a_file_in_lease_recovery_never_sees_bytes_that_recovery_cuts`] (this
/// binary with `writer_process --exact --ignored`), never on its own: it creates
/// [`PATH`], writes and hsyncs [`SYNCED`] bytes, prints [`HSYNCED`], and on a line on
/// its stdin writes [`UNACKED`] bytes and hflushes them, which does not return while
/// the middle is stopped. The test SIGKILLs it.
#[test]
#[ignore = "the recovering-read test's writer process, started by that test"]
fn writer_process() {
    WRITER.run();
}

async fn client(c: &TestCluster) -> Client {
    common::connect(&c.master.addr)
        .await
        .expect("connect to the master")
}

/// The file as the master hands it to readers now.
async fn locations(c: &TestCluster) -> FileLocations {
    common::writer::locations(c, PATH).await
}

/// Everything a new reader sees of the file now.
async fn read_all(c: &TestCluster) -> Vec<u8> {
    common::writer::read_all(c, ClientConfig::default(), PATH).await
}

async fn file_state(c: &TestCluster) -> FileState {
    client(c).await.stat(PATH).await.expect("stat").state
}

#[test]
fn a_reader_of_a_file_in_lease_recovery_never_sees_bytes_that_recovery_cuts() {
    let t0 = Instant::now();
    let say = |what: String| {
        eprintln!(
            "[recovering_read +{:.1}s] {what}",
            t0.elapsed().as_secs_f64()
        )
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // See the module comment, "Determinism", for the master's settings.
    let mut c = TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--dead-after", "600s", "--command-timeout", "600s"]),
        chunkserver_args: args(&[
            "--heartbeat",
            "200ms",
            "--report-every",
            "200ms",
            "--ack-timeout",
            "300s",
        ]),
        ..Default::default()
    });
    let rt = runtime();
    let synced = WRITER.synced_bytes();
    let total = (SYNCED + UNACKED) as u64;

    // 1. SYNCED bytes hsynced: on every replica.
    let mut w = Writer::start(&c, &WRITER);
    w.wait_for_line(HSYNCED);
    let chunk = last_chunk(&rt.block_on(locations(&c)));
    let granted: ChunkVersion = chunk.version;
    let pipeline: Vec<String> = chunk.replicas.iter().map(|r| r.addr.clone()).collect();
    assert_eq!(pipeline.len(), 3, "three replicas: {chunk:?}");
    let lengths = rt.block_on(async {
        let mut l = Vec::new();
        for addr in &pipeline {
            l.push(replica_length(addr, chunk.token, ASK_TIMEOUT).await);
        }
        l
    });
    assert!(
        lengths.iter().all(|l| *l == Some(SYNCED as u64)),
        "after the hsync every replica holds the {SYNCED} bytes: {lengths:?}"
    );
    let proc_at = |addr: &str| {
        c.chunkservers
            .iter()
            .position(|p| p.addr == addr)
            .expect("a chunkserver of the pipeline")
    };
    let (head, middle, tail) = (
        proc_at(&pipeline[0]),
        proc_at(&pipeline[1]),
        proc_at(&pipeline[2]),
    );
    say(format!(
        "{SYNCED} bytes hsynced on {pipeline:?} at version {granted}; stopping the middle \
         {}",
        pipeline[1]
    ));

    // 2. The middle freezes; UNACKED more bytes reach the head only. The writer dies.
    c.chunkservers[middle].stop();
    w.send(MORE);
    wait_for(
        "the head to hold the unacknowledged bytes (if it does not, the first replica \
         listed was not the pipeline's head, or the second not its middle)",
        || rt.block_on(replica_length(&pipeline[0], chunk.token, ASK_TIMEOUT)) == Some(total),
    );
    let tail_length = rt.block_on(replica_length(&pipeline[2], chunk.token, ASK_TIMEOUT));
    assert_eq!(
        tail_length,
        Some(SYNCED as u64),
        "with the middle stopped the tail holds only the hsynced bytes (if not, the \
         replicas listed are not in pipeline order)"
    );
    w.kill();
    say(format!(
        "head holds {total} bytes, the stopped middle and the tail {SYNCED}; writer killed"
    ));

    // 3. The tail freezes too; lease recovery starts, and its bump reaches the head
    // alone. It waits for the stopped two (see "Determinism").
    c.chunkservers[tail].stop();
    let master = c.master.addr.clone();
    let recover = std::thread::spawn(move || -> stampfs_client::Result<RecoveryOutcome> {
        runtime().block_on(async { common::connect(&master).await?.recover_lease(PATH).await })
    });
    let mut recovering = None;
    wait_for(
        "the master to list the head, alone, at the recovery's new version",
        || {
            let locs = rt.block_on(locations(&c));
            let now = last_chunk(&locs);
            let listed: Vec<&str> = now.replicas.iter().map(|r| r.addr.as_str()).collect();
            let ok = locs.status.state == FileState::Recovering
                && now.version > granted
                && listed == [pipeline[0].as_str()];
            if ok {
                recovering = Some(now);
            }
            ok
        },
    );
    let recovering = recovering.expect("the chunk in recovery");
    let state = rt.block_on(file_state(&c));
    assert_eq!(
        state,
        FileState::Recovering,
        "stat of the file while its lease recovery waits for the middle and the tail"
    );
    let report = rt.block_on(replica_info(&pipeline[0], recovering.token, ASK_TIMEOUT));
    assert!(
        matches!(report, Ok(r) if r.version == recovering.version && r.length == total),
        "the head took the recovery's version {} and still holds the {total} bytes: \
         {report:?}",
        recovering.version
    );
    say(format!(
        "file Recovering at version {} (writer's: {granted}); listed for readers: the head \
         alone, holding {total} bytes",
        recovering.version
    ));

    // 4. A reader of the file in recovery.
    let seen = rt.block_on(read_all(&c));
    say(format!(
        "reader of the recovering file saw {} bytes",
        seen.len()
    ));

    // 5. The head dies, then the stopped middle and tail: the attempt cannot seal.
    let failed_attempts = |c: &TestCluster| {
        c.master
            .log_text()
            .matches("lease recovery did not finish; it will be retried")
            .count()
    };
    let before = failed_attempts(&c);
    c.chunkservers[head].kill();
    c.chunkservers[middle].kill();
    c.chunkservers[tail].kill();
    wait_for("the recovery attempt to fail (no replica to seal)", || {
        failed_attempts(&c) > before
    });
    let state = rt.block_on(file_state(&c));
    assert_eq!(
        state,
        FileState::Recovering,
        "the attempt that bumped the head alone could not seal it: the file stays in \
         recovery"
    );
    say("head, middle and tail killed; the attempt failed, the file is still Recovering".into());

    // 6. The middle and the tail come back with the hsynced bytes only; recovery
    // retries, reaches them and closes the file. Then the head comes back, stale.
    let registrations = |c: &TestCluster, i: usize| {
        c.chunkservers[i]
            .log_text()
            .matches("registered with the master")
            .count()
    };
    let start_again = |c: &mut TestCluster, i: usize| {
        let before = registrations(c, i);
        c.chunkservers[i].restart();
        let name = c.chunkservers[i].name.clone();
        wait_for(&format!("the restarted {name} to register again"), || {
            registrations(c, i) > before
        });
    };
    start_again(&mut c, middle);
    start_again(&mut c, tail);
    wait_for("lease recovery to close the file", || {
        rt.block_on(file_state(&c)) == FileState::Closed
    });
    let first_call = recover.join().expect("the recover thread");
    let closed = last_chunk(&rt.block_on(locations(&c)));
    let sealed = rt.block_on(async {
        let mut l = Vec::new();
        for r in &closed.replicas {
            l.push((
                r.addr.clone(),
                replica_info(&r.addr, closed.token, ASK_TIMEOUT).await,
            ));
        }
        l
    });
    say(format!(
        "recovery closed the file at version {} (first RecoverLease answered {first_call:?}); \
         replicas: {sealed:?}",
        closed.version
    ));
    let short_and_sealed = |(addr, r): &(String, Result<ReplicaReport, String>)| {
        *addr != pipeline[0]
            && matches!(r, Ok(r) if r.version == closed.version && r.length == SYNCED as u64)
    };
    assert!(
        !sealed.is_empty() && sealed.iter().all(short_and_sealed),
        "the closed file's replicas are the restarted middle and/or tail, sealed at version \
         {} with {SYNCED} bytes: {sealed:?}",
        closed.version
    );
    start_again(&mut c, head);
    let recovered = rt.block_on(read_all(&c));
    say(format!(
        "head back (stale); the recovered file holds {} bytes",
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
        "recovery kept the shortest replicas, cutting the {UNACKED} unacknowledged bytes \
         the head alone held (otherwise the scenario did not come about)"
    );
    assert!(
        recovered.starts_with(&seen),
        "dirty read: a reader of the file in lease recovery (version {}, the head alone \
         listed) saw {} bytes, of which {} are not in the recovered file ({} bytes)",
        recovering.version,
        seen.len(),
        seen.len() - common_prefix(&seen, &recovered),
        recovered.len()
    );
}
