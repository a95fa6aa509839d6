//! The nemesis replica check ([`check_replicas`]) against real processes: a closed file
//! written over several chunks with replication 3 has byte-identical replicas; then two
//! replicas are changed on disk while their chunkservers are down, and once they are
//! back the check names each of them:
//!
//! - a flipped data byte, which the chunkserver's checksums catch when the check reads
//!   the replica ([`ViolationKind::UnreadableReplica`] at the failing block);
//! - a flipped data byte whose block checksum is rewritten to match, as a bug that
//!   wrote other bytes would leave it: only comparing the replicas finds it
//!   ([`ViolationKind::DivergentReplicas`] at that byte).
//!
//! The background scrub is off, so only the check's own reads touch the replicas.

mod common;

use common::{flip, pattern, proc_of, replica_file, Opts, TestCluster};
use stampfs_client::{Client, CreateOptions};
use stampfs_nemesis::checker::{Violation, ViolationKind};
use stampfs_nemesis::replicas::check_replicas;
use stampfs_proto::{ChunkHandle, ChunkserverId, FileLocations, ReplicaState};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const PATH: &str = "/replicas/f0";
/// Four checksum blocks per chunk.
const CHUNK: u64 = 256 << 10;
/// Three whole chunks and part of a fourth.
const LEN: usize = 3 * CHUNK as usize + 100_000;
/// Where the plain flip goes in its chunk (checksum block 0).
const PLAIN_AT: u64 = 1_000;
/// Where the flip with a rewritten checksum goes in its chunk (inside block 1, whole).
const MASKED_AT: u64 = 70_000;

fn cluster() -> TestCluster {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    TestCluster::with(Opts {
        chunkservers: 3,
        master_args: Vec::new(),
        chunkserver_args: args(&["--heartbeat", "200ms", "--scrub-rate", "0"]),
        ..Default::default()
    })
}

/// Polls `f` every 100 ms until it returns true, for at most 30 s.
async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The state every listed replica reports, or `None` when one does not answer.
async fn replica_states(client: &Client, locs: &FileLocations) -> Option<Vec<ReplicaState>> {
    let mut out = Vec::new();
    for chunk in &locs.chunks {
        for r in &chunk.replicas {
            let (report, _) = client.read_replica(&r.addr, chunk.token, 0).await.ok()?;
            out.push(report.state);
        }
    }
    Some(out)
}

/// True when the master hands out `server` for chunk `index` and that replica answers.
async fn serves(client: &Client, index: usize, server: ChunkserverId) -> bool {
    let Ok(locs) = client.locations(PATH).await else {
        return false;
    };
    let Some(chunk) = locs.chunks.get(index) else {
        return false;
    };
    let Some(r) = chunk.replicas.iter().find(|r| r.chunkserver == server) else {
        return false;
    };
    client.read_replica(&r.addr, chunk.token, 0).await.is_ok()
}

/// Flips the data byte at chunk offset `at` of a replica and rewrites the checksum of
/// its (whole) block to match, so that the chunkserver can not tell.
fn flip_masked(file: &std::path::Path, at: u64) {
    use stampfs_chunkserver::header::{table_entry_offset, BLOCK, DATA_OFFSET};
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .expect("open replica");
    let block = at / BLOCK;
    let mut data = vec![0u8; BLOCK as usize];
    f.read_exact_at(&mut data, DATA_OFFSET + block * BLOCK)
        .expect("read block");
    data[(at % BLOCK) as usize] ^= 0x5a;
    f.write_all_at(&data, DATA_OFFSET + block * BLOCK)
        .expect("write block");
    let crc = crc32fast::hash(&data);
    f.write_all_at(&crc.to_le_bytes(), table_entry_offset(block))
        .expect("write checksum");
    f.sync_all().expect("sync");
}

fn named(
    v: &[Violation],
    kind: ViolationKind,
    handle: ChunkHandle,
    server: ChunkserverId,
) -> Option<&Violation> {
    // "... of chunk H (index I, version V) on SERVER ...": the replica named, not a
    // reference replica the message compares it with.
    v.iter().find(|x| {
        x.kind == kind
            && x.message.contains(&format!("chunk {handle} "))
            && x.message.contains(&format!(") on {server} "))
    })
}

#[test]
fn replicas_of_a_closed_file_are_identical_until_one_is_changed_on_disk() {
    let mut c = cluster();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let client = rt
        .block_on(common::connect(&c.master.addr))
        .expect("connect");
    let data = pattern(LEN, 42);

    // A closed file of four chunks, every one on all three chunkservers.
    let locs = rt.block_on(async {
        client.mkdir("/replicas", true).await.expect("mkdir");
        let opts = CreateOptions {
            replication: Some(3),
            chunk_size: Some(CHUNK),
            overwrite: false,
            attr: None,
        };
        let mut w = client.create(PATH, opts).await.expect("create");
        w.write_all(&data).await.expect("write");
        let status = w.close().await.expect("close");
        assert_eq!(status.length, LEN as u64);
        let locs = client.locations(PATH).await.expect("locations");
        assert_eq!(locs.chunks.len(), 4);
        for chunk in &locs.chunks {
            assert!(chunk.complete, "{chunk:?}");
            assert_eq!(chunk.replicas.len(), 3, "{chunk:?}");
        }
        // Sealed everywhere, so a restart does not re-check the data (it does for a
        // replica still being written).
        wait_for("every replica finalized", async || {
            replica_states(&client, &locs)
                .await
                .is_some_and(|s| s.iter().all(|s| *s == ReplicaState::Finalized))
        })
        .await;
        locs
    });

    let v = rt
        .block_on(check_replicas(&client, PATH, Some(0)))
        .expect("check");
    assert!(v.is_empty(), "identical replicas reported: {v:#?}");

    // Change chunk 1 on one chunkserver and chunk 2 on another, each while it is down.
    let (plain, masked) = (&locs.chunks[1], &locs.chunks[2]);
    let a = plain.replicas[0].chunkserver;
    let b = masked
        .replicas
        .iter()
        .map(|r| r.chunkserver)
        .find(|s| *s != a)
        .expect("another replica");
    let index_of = |id: ChunkserverId| {
        let p = proc_of(&c, id.0);
        c.chunkservers
            .iter()
            .position(|q| q.name == p.name)
            .expect("a chunkserver process")
    };
    let (ia, ib) = (index_of(a), index_of(b));
    c.chunkservers[ia].kill();
    flip(&c.chunkservers[ia], &plain.handle.to_string(), PLAIN_AT);
    c.chunkservers[ib].kill();
    flip_masked(
        &replica_file(&c.chunkservers[ib], &masked.handle.to_string()),
        MASKED_AT,
    );
    c.chunkservers[ia].restart();
    c.chunkservers[ib].restart();
    rt.block_on(async {
        wait_for("both changed replicas handed out again", async || {
            serves(&client, 1, a).await && serves(&client, 2, b).await
        })
        .await;
    });

    let v = rt
        .block_on(check_replicas(&client, PATH, Some(0)))
        .expect("check");
    assert_eq!(v.len(), 2, "{v:#?}");
    let unreadable = named(&v, ViolationKind::UnreadableReplica, plain.handle, a)
        .unwrap_or_else(|| panic!("no unreadable replica of chunk 1 on {a}: {v:#?}"));
    assert_eq!(unreadable.file, Some(0));
    assert_eq!(
        unreadable.offset,
        Some(plain.file_offset),
        "the failing block is the chunk's first: {unreadable}"
    );
    let divergent = named(&v, ViolationKind::DivergentReplicas, masked.handle, b)
        .unwrap_or_else(|| panic!("no divergent replica of chunk 2 on {b}: {v:#?}"));
    assert_eq!(
        divergent.offset,
        Some(masked.file_offset + MASKED_AT),
        "{divergent}"
    );
    assert!(
        divergent
            .message
            .contains(&format!("chunk offset {MASKED_AT}")),
        "{divergent}"
    );
}
