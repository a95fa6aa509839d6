//! The dirty read the randomized nemesis found with a killed chunkserver (seed 9009),
//! made deterministic with real processes: a member of the writer's pipeline died
//! before the writer's last bytes reached it, and the writer died before it could
//! exclude it. The master listed only the live members of the pipeline, so a reader
//! took the least of *their* lengths and read bytes the dead member lacked; once it
//! was back, lease recovery kept the shortest replica of the pipeline and the bytes
//! were gone. The master now says when a member of the granted pipeline is not listed
//! (`LocatedChunk::unconfirmed`), and readers then read only the committed length
//! (`load_view` in `client/src/reader.rs`; DESIGN.md, "Readers").
//!
//! A master and three chunkservers; the file's pipeline is `head -> middle -> tail`.
//! 1. The writer (this test binary running [`writer_process`]) hsyncs [`SYNCED`] bytes.
//! 2. The tail is SIGKILLed; the master is SIGSTOPped. The writer sends [`UNACKED`]
//!    more bytes: the head and the middle apply them, the middle finds the tail gone,
//!    and the writer's pipeline update waits on the stopped master.
//! 3. The writer and the stopped master are SIGKILLed (the update dies unread in the
//!    master's socket), and the master is started again: the head and the middle
//!    register, the tail does not.
//! 4. A reader reads the file.
//! 5. The tail is started again, with the hsynced bytes only; `RecoverLease` keeps the
//!    shortest replica. What the reader saw must be in the recovered file.
//!
//! Every wait is for a state, bounded by [`common::WAIT`]; no assertion is timed.

mod common;

use common::writer::{
    last_chunk, read_all, recover_and_read, replica_length, Writer, WriterProcess, MORE,
};
use common::{common_prefix, runtime, wait_for, Opts, TestCluster};
use stampfs_client::ClientConfig;
use std::time::Duration;

const PATH: &str = "/dead-member";
/// Bytes the writer hsyncs: acknowledged, on every replica.
const SYNCED: usize = 120_000;
/// Bytes the writer sends after the tail died: on the head and the middle only.
const UNACKED: usize = 50_000;
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

const WRITER: WriterProcess = WriterProcess {
    test: "writer_process",
    started_by: "a_reader_never_sees_bytes_a_dead_pipeline_member_lacks",
    master_env: "STAMPFS_DEAD_MEMBER_READ_MASTER",
    path: PATH,
    synced: SYNCED,
    synced_seed: 91,
    hsynced: HSYNCED,
    unacked: UNACKED,
    unacked_seed: 92,
    hflushed: "dead-member writer: hflush returned",
};
const HSYNCED: &str = "dead-member writer: hsynced";

/// The writer process, started by the test below (this binary with `writer_process
/// --exact --ignored`), never on its own; see [`WriterProcess::run`].
#[test]
#[ignore = "the dead-member-read test's writer process, started by that test"]
fn writer_process() {
    WRITER.run();
}

#[test]
fn a_reader_never_sees_bytes_a_dead_pipeline_member_lacks() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut c = TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--health-interval", "500ms"]),
        chunkserver_args: args(&["--heartbeat", "200ms", "--report-every", "200ms"]),
        ..Default::default()
    });
    let rt = runtime();
    let synced = WRITER.synced_bytes();
    let total = (SYNCED + UNACKED) as u64;

    // 1. Hsynced on every replica.
    let mut w = Writer::start(&c, &WRITER);
    w.wait_for_line(HSYNCED);
    let chunk = last_chunk(&rt.block_on(common::writer::locations(&c, PATH)));
    let pipeline: Vec<String> = chunk.replicas.iter().map(|r| r.addr.clone()).collect();
    assert_eq!(pipeline.len(), 3, "three replicas: {chunk:?}");
    let proc_at = |addr: &str| {
        c.chunkservers
            .iter()
            .position(|p| p.addr == addr)
            .expect("a chunkserver of the pipeline")
    };
    let tail = proc_at(&pipeline[2]);

    // 2. The tail dies; the master stops; the head and the middle take more bytes.
    c.chunkservers[tail].kill();
    c.master.stop();
    w.send(MORE);
    wait_for(
        "the head and the middle to hold the unacknowledged bytes",
        || {
            pipeline[..2].iter().all(|addr| {
                rt.block_on(replica_length(addr, chunk.token, ASK_TIMEOUT)) == Some(total)
            })
        },
    );

    // 3. No writer to exclude the tail; a master that never read its request.
    w.kill();
    c.master.kill();
    c.master.restart();
    c.wait_live(2);
    wait_for("the master to list the head and the middle", || {
        last_chunk(&rt.block_on(common::writer::locations(&c, PATH)))
            .replicas
            .len()
            == 2
    });

    // 4. A reader, while the tail is down.
    let seen = rt.block_on(read_all(&c, ClientConfig::default(), PATH));

    // 5. The tail is back with the hsynced bytes; recovery keeps the shortest.
    c.chunkservers[tail].restart();
    c.wait_live(3);
    wait_for("the master to list all three again", || {
        last_chunk(&rt.block_on(common::writer::locations(&c, PATH)))
            .replicas
            .len()
            == 3
    });
    let recovered = rt.block_on(recover_and_read(&c, PATH, &synced));
    assert_eq!(
        recovered.len(),
        SYNCED,
        "recovery kept the shortest replica, the tail's (otherwise the scenario did not \
         come about)"
    );
    assert!(
        recovered.starts_with(&seen),
        "dirty read: with the tail down a reader saw {} bytes, of which {} are not in the \
         recovered file ({} bytes)",
        seen.len(),
        seen.len() - common_prefix(&seen, &recovered),
        recovered.len()
    );
}
