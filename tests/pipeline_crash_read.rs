//! The dirty read the randomized nemesis found at a master crash point (seed 8126), made
//! deterministic with real processes: a pipeline update excluded a frozen replica and
//! bumped the survivor, and the master died before it logged the grant. Readers were
//! then handed the survivor alone (the master's version) and read bytes the excluded
//! replicas lack; lease recovery, still starting from the version the writer was
//! granted, took the excluded replicas too and cut the file to the shortest of them,
//! so bytes readers had read were gone. Recovery of an open file now starts from the
//! highest version a replica of the pipeline holds (`open_floor` in
//! `master/src/recovery.rs`; DESIGN.md, "Lease recovery").
//!
//! A master armed with the crash point `pipeline-after-bump` and three chunkservers
//! whose head gives up on a silent downstream after `--ack-timeout 2s`; the file's
//! pipeline is `head -> middle -> tail`.
//! 1. The writer (a process of its own: this test binary running [`writer_process`])
//!    writes and hsyncs [`SYNCED`] bytes: on every replica, at the granted version.
//! 2. The middle is SIGSTOPped; the writer writes [`UNACKED`] more bytes and hflushes.
//!    The head applies them; the middle never acks; after its ack timeout the head
//!    acks the writer with the middle (and what is behind it) unavailable. The writer
//!    excludes them: `UpdatePipeline` mints a version, bumps the head, and the master
//!    kills itself at the crash point before logging the grant or answering.
//! 3. The writer is SIGKILLed (alive, it would retry the update once the master is
//!    back and be granted a version, which is not the case under test). The stopped
//!    middle is SIGKILLed too and started again: the bytes that sat unread in its
//!    socket died with it, so it holds exactly the hsynced bytes (see
//!    `tests/recovering_read.rs`, "Why ... killed and restarted, not continued").
//! 4. The master is started again, disarmed. Every chunkserver registers: the head at
//!    the update's version with every byte, the middle and the tail at the granted one
//!    with the hsynced bytes. A reader is handed the head alone and reads all of it.
//! 5. `RecoverLease`. The recovered file must hold every hsynced byte and everything
//!    the reader saw; and the file must become healthy again (the excluded replicas are
//!    stale, and replica health copies the survivor).
//!
//! Every wait is for a state, bounded by [`common::WAIT`]; no assertion is timed.

mod common;

use common::writer::{
    last_chunk, read_all, recover_and_read, replica_length, Writer, WriterProcess, MORE,
};
use common::{common_prefix, runtime, wait_for, Opts, TestCluster};
use stampfs_client::ClientConfig;
use stampfs_proto::{FileLocations, FileState};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const PATH: &str = "/pipeline-crash";
/// Bytes the writer hsyncs: acknowledged, on every replica.
const SYNCED: usize = 150_000;
/// Bytes the writer sends after the middle froze: never acknowledged, on the head only.
const UNACKED: usize = 60_000;
/// How long the test's own requests to a chunkserver may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

const WRITER: WriterProcess = WriterProcess {
    test: "writer_process",
    started_by:
        "a_reader_of_the_survivor_of_a_pipeline_update_the_master_crashed_in_keeps_its_bytes",
    master_env: "STAMPFS_PIPELINE_CRASH_READ_MASTER",
    path: PATH,
    synced: SYNCED,
    synced_seed: 81,
    hsynced: HSYNCED,
    unacked: UNACKED,
    unacked_seed: 82,
    hflushed: "pipeline-crash writer: hflush returned",
};
const HSYNCED: &str = "pipeline-crash writer: hsynced";

/// The writer process, started by the test below (this binary with `writer_process
/// --exact --ignored`), never on its own; see [`WriterProcess::run`].
#[test]
#[ignore = "the pipeline-crash-read test's writer process, started by that test"]
fn writer_process() {
    WRITER.run();
}

/// The file as the master hands it to readers now.
async fn locations(c: &TestCluster) -> FileLocations {
    common::writer::locations(c, PATH).await
}

#[test]
fn a_reader_of_the_survivor_of_a_pipeline_update_the_master_crashed_in_keeps_its_bytes() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut c = TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--health-interval", "500ms"]),
        chunkserver_args: args(&[
            "--heartbeat",
            "200ms",
            "--report-every",
            "200ms",
            "--ack-timeout",
            "2s",
        ]),
        ..Default::default()
    });
    c.master.set_env(
        stampfs_proto::crash::ENV_POINTS,
        Some("pipeline-after-bump=1"),
    );
    c.master.set_env(stampfs_proto::crash::ENV_SEED, Some("1"));
    c.master.restart();
    c.wait_live(3);
    let rt = runtime();
    let synced = WRITER.synced_bytes();
    let total = (SYNCED + UNACKED) as u64;

    // 1. Hsynced on every replica.
    let mut w = Writer::start(&c, &WRITER);
    w.wait_for_line(HSYNCED);
    let chunk = last_chunk(&rt.block_on(locations(&c)));
    let granted = chunk.version;
    let pipeline: Vec<String> = chunk.replicas.iter().map(|r| r.addr.clone()).collect();
    assert_eq!(pipeline.len(), 3, "three replicas: {chunk:?}");
    let proc_at = |addr: &str| {
        c.chunkservers
            .iter()
            .position(|p| p.addr == addr)
            .expect("a chunkserver of the pipeline")
    };
    let middle = proc_at(&pipeline[1]);

    // 2. The middle freezes; the head alone takes the next bytes; the writer's pipeline
    // update kills the master after the bump.
    c.chunkservers[middle].stop();
    w.send(MORE);
    let status = c
        .master
        .wait_exit(common::WAIT)
        .expect("the master to die at pipeline-after-bump");
    assert_eq!(
        status.signal(),
        Some(nix::sys::signal::Signal::SIGKILL as i32),
        "the master died of its crash point, not {status}"
    );
    let log = c.master.log_text();
    assert!(
        log.contains("crash point pipeline-after-bump hit"),
        "the master died at the pipeline update's crash point:\n{log}"
    );

    // 3. No writer to retry the update; the middle comes back with the hsynced bytes.
    w.kill();
    c.chunkservers[middle].kill();
    c.chunkservers[middle].restart();

    // 4. The master again; the head is the one replica at its version.
    c.master.set_env(stampfs_proto::crash::ENV_POINTS, None);
    c.master.restart();
    c.wait_live(3);
    let mut survivor = None;
    wait_for(
        "the master to hand readers the head alone, above the granted version",
        || {
            let now = last_chunk(&rt.block_on(locations(&c)));
            let listed: Vec<&str> = now.replicas.iter().map(|r| r.addr.as_str()).collect();
            let ok = now.version > granted && listed == [pipeline[0].as_str()];
            if ok {
                survivor = Some(now);
            }
            ok
        },
    );
    let survivor = survivor.expect("the chunk at the update's version");
    let held = rt.block_on(replica_length(&pipeline[0], survivor.token, ASK_TIMEOUT));
    assert_eq!(
        held,
        Some(total),
        "the head holds the hsynced and the unacknowledged bytes at version {}",
        survivor.version
    );
    let seen = rt.block_on(read_all(&c, ClientConfig::default(), PATH));
    assert_eq!(
        seen.len() as u64,
        total,
        "a reader handed the head alone reads all it holds (else the scenario did not come \
         about)"
    );

    // 5. Lease recovery keeps what the reader saw.
    let recovered = rt.block_on(recover_and_read(&c, PATH, &synced));
    assert!(
        recovered.starts_with(&seen),
        "dirty read: a reader saw {} bytes of which {} are not in the recovered file ({} \
         bytes)",
        seen.len(),
        seen.len() - common_prefix(&seen, &recovered),
        recovered.len()
    );
    let st = c.stat_json(PATH);
    assert_eq!(st["state"], "closed", "{st}");
    assert_eq!(
        rt.block_on(async {
            common::connect(&c.master.addr)
                .await
                .expect("connect")
                .stat(PATH)
                .await
                .expect("stat")
                .state
        }),
        FileState::Closed
    );
    wait_for("fsck to find the file healthy again", || {
        common::fsck_json(&c, &[PATH]).0 == Some(0)
    });
}
