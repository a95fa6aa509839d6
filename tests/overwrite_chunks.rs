//! Writes into any chunk of a file, against real processes on loopback: a writer for
//! writes anywhere moves from chunk to chunk (`OpenChunk`: the chunk it leaves is
//! committed, the one it moves to gets a new version bumped on its replicas), with
//! both I/O engines, and reads its own writes; only the chunks written get new
//! versions; a paused writer whose
//! lease was recovered is fenced by the chunkservers when it writes into an earlier
//! chunk (the seed's timeline in chunk 0 of a bigger file); a writer SIGKILLed while
//! it overwrites earlier chunks leaves, after `recover`, every byte old or new and
//! identical replicas.

mod common;

use common::files::{apply, assert_replicas_identical, cluster, read_all, wait_replicated};
use common::{pattern, runtime, TestCluster};
use stampfs_client::{Client, CreateOptions, Error};
use stampfs_proto::FileState;
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const CHUNK: u64 = 256 << 10;

/// `data` as the new closed file `path` in chunks of `chunk_size`.
async fn put(client: &Client, path: &str, chunk_size: u64, data: &[u8]) {
    let mut w = client
        .create(
            path,
            CreateOptions {
                chunk_size: Some(chunk_size),
                ..Default::default()
            },
        )
        .await
        .expect("create");
    w.write_all(data).await.expect("write");
    w.close().await.expect("close");
}

async fn open_anywhere(client: &Client, path: &str) -> stampfs_client::FileWriter {
    client
        .open_options()
        .write(true)
        .open(path)
        .await
        .expect("open for writes anywhere")
}

/// The master's version of each chunk of `path`.
async fn versions(client: &Client, path: &str) -> Vec<u64> {
    let locs = client.locations(path).await.expect("locations");
    locs.chunks.iter().map(|c| c.version.0).collect()
}

async fn wait_closed(client: &Client, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.stat(path).await.expect("stat").state != FileState::Closed {
        assert!(Instant::now() < deadline, "{path} did not close");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn moves_between_chunks(engine: &str) {
    let c = cluster(engine);
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let path = "/chunks";
        // Five full chunks and 1000 bytes in a sixth.
        let mut model = pattern(5 * CHUNK as usize + 1000, 31);
        put(&client, path, CHUNK, &model).await;
        let before = versions(&client, path).await;
        assert_eq!(before.len(), 6);
        let mut w = open_anywhere(&client, path).await;
        let writes: Vec<(u64, Vec<u8>)> = vec![
            // Chunk 0, from the writer's start in the last chunk.
            (10, pattern(100, 32)),
            // Across the boundary of chunks 2 and 3, both existing.
            (3 * CHUNK - 50, pattern(100, 33)),
            // Most of chunk 1, more than a packet.
            (CHUNK + 5, pattern(200_000, 34)),
            // The end of the partial last chunk, past the end.
            (5 * CHUNK + 990, pattern(50, 35)),
            // Chunk 0 again.
            (0, pattern(5, 36)),
        ];
        for (offset, data) in &writes {
            w.write_at(*offset, data).await.expect("write_at");
            apply(&mut model, *offset, data);
        }
        // The writer reads its own writes (it hflushes first), across a boundary and
        // at the end.
        let at = 3 * CHUNK as usize - 60;
        let got = w.read_at(at as u64, 200).await.expect("read_at");
        assert_eq!(
            &got[..],
            &model[at..at + 200],
            "a writer reads its own writes"
        );
        let end = model.len();
        let got = w
            .read_at(end as u64 - 10, 100)
            .await
            .expect("read_at the end");
        assert_eq!(&got[..], &model[end - 10..]);
        assert!(w
            .read_at(end as u64 + 5, 10)
            .await
            .expect("past the end")
            .is_empty());
        w.hflush().await.expect("hflush");
        assert_eq!(w.len(), model.len() as u64);
        assert_eq!(read_all(&client, path).await, model, "while open");
        let status = w.close().await.expect("close");
        assert_eq!(status.length, model.len() as u64);
        assert_eq!(read_all(&client, path).await, model, "after close");
        assert_replicas_identical(&client, path).await;
        // Every chunk written got a new version; chunk 4 was not written.
        let after = versions(&client, path).await;
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            if i == 4 {
                assert_eq!(a, b, "chunk 4 was never written: {before:?} -> {after:?}");
            } else {
                assert!(a > b, "chunk {i} was written: {before:?} -> {after:?}");
            }
        }
        // `fsck` finds it healthy.
        let (code, fsck) = common::fsck_json(&c, &[path]);
        assert_eq!(code, Some(0), "{fsck}");
    });
}

#[test]
fn a_writer_moves_between_chunks_io_uring() {
    moves_between_chunks("uring");
}

#[test]
fn a_writer_moves_between_chunks_threads() {
    moves_between_chunks("threads");
}

/// The seed's timeline in chunk 0 of a three-chunk file: A writes `value=0` there
/// and hsyncs, then is "paused" (its lease is recovered by force); B writes
/// `value=100` in the same place; A wakes and writes `value=1`: the chunkservers
/// refuse its stale version and the file keeps `value=100`.
#[test]
fn a_paused_writer_is_fenced_in_an_earlier_chunk() {
    let c = cluster("auto");
    runtime().block_on(async {
        let a = common::connect(&c.master.addr).await.expect("connect a");
        let b = common::connect(&c.master.addr).await.expect("connect b");
        let path = "/seed";
        let old = pattern(2 * CHUNK as usize + 300, 41);
        put(&a, path, CHUNK, &old).await;
        let mut wa = open_anywhere(&a, path).await;
        wa.write_at(0, b"value=0").await.expect("a writes");
        wa.hsync().await.expect("a hsyncs");
        // A is paused: its lease is taken away.
        c.ok(&["recover", path]);
        wait_closed(&b, path).await;
        let mut wb = open_anywhere(&b, path).await;
        wb.write_at(0, b"value=100").await.expect("b writes");
        wb.hsync().await.expect("b hsyncs");
        wb.close().await.expect("b closes");
        // A wakes up in chunk 0, where its stream and token still are.
        let late = match wa.write_at(0, b"value=1").await {
            Err(e) => Err(e),
            Ok(()) => wa.hsync().await,
        };
        let e = late.expect_err("a's late write is refused");
        assert!(matches!(e, Error::Fenced { .. }), "{e}");
        // Nothing more goes through that writer, in any chunk.
        let again = wa.write_at(2 * CHUNK, b"x").await;
        assert!(again.is_err(), "a fenced writer stays fenced");
        let got = read_all(&b, path).await;
        assert_eq!(&got[..9], b"value=100");
        assert_eq!(&got[9..], &old[9..]);
        assert_replicas_identical(&b, path).await;
    });
}

/// A writer streaming new bytes over chunks 0 and 1 of a three-chunk file is killed
/// in chunk 1: chunk 0 was committed when it moved on; chunk 1 is recovered.
#[test]
fn a_writer_killed_in_an_earlier_chunk_leaves_old_or_new_bytes_and_identical_replicas() {
    let c = cluster("auto");
    let chunk = 1u64 << 20;
    let len = 2 * chunk as usize + 500_000;
    let old = pattern(len, 51);
    let new = pattern(2 * chunk as usize, 52);
    c.put_bytes("/killed", &old, &["--chunk-size", "1MiB"]);
    let mut child = c
        .cmd(&["write", "/killed", "--offset", "0", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    let mut stdin = child.stdin.take().expect("stdin");
    // Chunk 0 and half of chunk 1.
    stdin
        .write_all(&new[..chunk as usize + chunk as usize / 2])
        .expect("feed the writer");
    stdin.flush().expect("flush");
    let rt = runtime();
    let client = rt
        .block_on(common::connect(&c.master.addr))
        .expect("connect");
    // Wait until the replicas hold new bytes of chunk 1, then kill the writer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let at = chunk as usize;
    loop {
        let got = rt.block_on(read_all(&client, "/killed"));
        if got.get(at..at + 1000) == Some(&new[at..at + 1000]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the overwrite of chunk 1 never showed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the writer");
    let _ = child.wait();
    c.ok(&["recover", "/killed"]);
    rt.block_on(async {
        wait_closed(&client, "/killed").await;
        let got = read_all(&client, "/killed").await;
        assert_eq!(got.len(), len, "overwrites keep the length");
        assert_eq!(&got[..at], &new[..at], "chunk 0 was committed whole");
        let torn = (at..new.len()).find(|&i| got[i] != old[i] && got[i] != new[i]);
        assert_eq!(torn, None, "every byte of chunk 1 is old or new");
        assert_eq!(&got[new.len()..], &old[new.len()..], "chunk 2 untouched");
        assert_replicas_identical(&client, "/killed").await;
        // Replica health brings every chunk back to three identical replicas.
        wait_replicated(&client, "/killed", 3).await;
        assert_eq!(read_all(&client, "/killed").await, got);
    });
}

/// `set_len` below the last chunk: the chunks past the new end are dropped (their
/// replicas deleted by the chunkservers), the new last chunk is cut, the writer goes on
/// writing; at a chunk boundary and to zero too.
#[test]
fn a_shrink_below_the_last_chunk_drops_chunks_and_their_replicas() {
    let c = cluster("auto");
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let path = "/shrink";
        let mut model = pattern(6 * CHUNK as usize + 123, 61);
        put(&client, path, CHUNK, &model).await;
        let replicas = |c: &TestCluster| -> u64 {
            let r: serde_json::Value =
                serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("report");
            r["chunkservers"]
                .as_array()
                .expect("chunkservers")
                .iter()
                .map(|cs| cs["replicas"].as_u64().expect("replicas"))
                .sum()
        };
        assert_eq!(replicas(&c), 7 * 3);
        let mut w = open_anywhere(&client, path).await;
        // Into chunk 2, from the last chunk; then a write in chunk 0, still allowed.
        let cut = 2 * CHUNK + 1000;
        w.set_len(cut).await.expect("shrink below the last chunk");
        model.truncate(cut as usize);
        assert_eq!(w.len(), cut);
        w.write_at(5, b"after")
            .await
            .expect("write after the shrink");
        apply(&mut model, 5, b"after");
        // Past the new end: zeros, not the dropped bytes.
        w.write_at(cut + 10, b"tail")
            .await
            .expect("write past the new end");
        apply(&mut model, cut + 10, b"tail");
        let status = w.close().await.expect("close");
        assert_eq!(status.length, model.len() as u64);
        assert_eq!(read_all(&client, path).await, model);
        assert_eq!(versions(&client, path).await.len(), 3);
        assert_replicas_identical(&client, path).await;
        // The dropped chunks' replicas are deleted.
        let deadline = Instant::now() + Duration::from_secs(30);
        while replicas(&c) != 3 * 3 {
            assert!(Instant::now() < deadline, "replicas left: {}", replicas(&c));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // To a chunk boundary, then to nothing.
        let mut w = open_anywhere(&client, path).await;
        w.set_len(CHUNK).await.expect("to a boundary");
        w.close().await.expect("close");
        model.truncate(CHUNK as usize);
        assert_eq!(read_all(&client, path).await, model);
        let mut w = open_anywhere(&client, path).await;
        w.set_len(0).await.expect("to nothing");
        w.write_at(3, b"new")
            .await
            .expect("write into the empty file");
        w.close().await.expect("close");
        assert_eq!(read_all(&client, path).await, b"\0\0\0new");
        assert_replicas_identical(&client, path).await;
        let (code, fsck) = common::fsck_json(&c, &[path]);
        assert_eq!(code, Some(0), "{fsck}");
    });
}
