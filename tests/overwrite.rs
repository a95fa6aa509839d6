//! Writes at any offset against real processes on loopback, with both I/O engines:
//! overwrites at block, packet and chunk boundaries, across the end and past it (a
//! gap of zeros), read back while the file is open and after it is closed, with
//! byte-identical replicas; shrinks and growth through the CLI; a chunkserver SIGKILLed in the middle of an
//! overwrite stream costs nothing acknowledged; a writer SIGKILLed in the middle of
//! one leaves, after `recover`, every byte old or new and every replica identical.

mod common;

use common::files::{apply, assert_replicas_identical, cluster, read_all, wait_replicated};
use common::{pattern, runtime};
use stampfs_client::{Client, CreateOptions};
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Four checksum blocks per chunk.
const CHUNK: u64 = 256 << 10;
const BLOCK: u64 = 64 << 10;

/// Writes `data` as the new file `path` in chunks of `chunk_size` and closes it, then
/// opens it again for writes anywhere.
async fn written_then_reopened(
    client: &Client,
    path: &str,
    chunk_size: u64,
    data: &[u8],
) -> stampfs_client::FileWriter {
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
    client
        .open_options()
        .write(true)
        .open(path)
        .await
        .expect("open for writes anywhere")
}

fn round_trips(engine: &str) {
    let c = cluster(engine);
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let path = "/ow/f";
        client.mkdir("/ow", true).await.expect("mkdir");
        // Chunk 0 full, chunk 1 holding 37 856 bytes.
        let mut model = pattern(300_000, 1);
        let mut w = written_then_reopened(&client, path, CHUNK, &model).await;
        assert_eq!((w.position(), w.len(), w.writable_from()), (0, 300_000, 0));
        let writes: Vec<(u64, Vec<u8>)> = vec![
            // The first bytes of the last chunk.
            (CHUNK, pattern(10, 2)),
            // Across a checksum-block boundary.
            (CHUNK + BLOCK - 5, pattern(10, 3)),
            // More than a packet, from inside a block.
            (CHUNK + 1_000, pattern(70_000, 4)),
            // Over the partial last block and past the end.
            (290_000, pattern(20_000, 5)),
            // Past the end: zeros from 310 000 up to it, across the next chunk
            // boundary (524 288).
            (600_000, pattern(1_000, 6)),
            // Back into the new last chunk, over the zeros.
            (2 * CHUNK + 10, pattern(100, 7)),
        ];
        for (offset, data) in &writes {
            w.write_at(*offset, data).await.expect("write_at");
            apply(&mut model, *offset, data);
        }
        w.hsync().await.expect("hsync");
        assert_eq!(w.len(), model.len() as u64);
        // A reader of the open file sees what was hsynced.
        assert_eq!(read_all(&client, path).await, model, "while open");

        // Before the chunk being written: the writer moves there and back.
        w.write_at(100, b"x")
            .await
            .expect("a write into an earlier chunk");
        apply(&mut model, 100, b"x");
        // Shrink within the last chunk (its start is 2 × CHUNK now), then write past
        // the new end: the gap reads as zeros, not as the cut bytes.
        let cut = 2 * CHUNK + 50;
        w.set_len(cut).await.expect("shrink");
        model.truncate(cut as usize);
        assert_eq!(w.len(), cut);
        w.write_at(cut + 20, b"after the cut").await.expect("write");
        apply(&mut model, cut + 20, b"after the cut");
        // Growing writes zeros; the position stays.
        let pos = w.position();
        let grown = model.len() as u64 + 70_000;
        w.set_len(grown).await.expect("grow");
        model.resize(grown as usize, 0);
        assert_eq!((w.position(), w.len()), (pos, grown));
        let status = w.close().await.expect("close");
        assert_eq!(status.length, model.len() as u64);
        assert_eq!(read_all(&client, path).await, model, "after close");
        assert_replicas_identical(&client, path).await;
    });
}

#[test]
fn overwrites_round_trip_at_block_packet_and_chunk_boundaries_io_uring() {
    round_trips("uring");
}

#[test]
fn overwrites_round_trip_at_block_packet_and_chunk_boundaries_threads() {
    round_trips("threads");
}

#[test]
fn the_cli_writes_at_an_offset_and_refuses_what_it_does_not_support() {
    let c = cluster("auto");
    c.put_bytes("/cli", b"hello, world\n", &[]);
    let out = c.run_stdin(&["write", "/cli", "--offset", "7", "-"], b"stamp");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.cat("/cli"), b"hello, stamp\n");
    // Past the end: a gap of zeros.
    let out = c.run_stdin(&["write", "/cli", "--offset", "16", "-"], b"!");
    assert!(out.status.success());
    assert_eq!(c.cat("/cli"), b"hello, stamp\n\0\0\0!");
    // Growing reads zeros past the old end; shrinking cuts.
    c.ok(&["truncate", "/cli", "20"]);
    assert_eq!(c.cat("/cli"), b"hello, stamp\n\0\0\0!\0\0\0");
    c.ok(&["truncate", "/cli", "5"]);
    assert_eq!(c.cat("/cli"), b"hello");
    assert_eq!(c.stat_json("/cli")["length"], 5);
    // Below the last chunk: the chunks past the new end go.
    c.put_bytes("/two", &pattern(300_000, 9), &["--chunk-size", "256KiB"]);
    c.ok(&["truncate", "/two", "3"]);
    assert_eq!(c.cat("/two"), pattern(300_000, 9)[..3]);
    let st = c.stat_json("/two");
    assert_eq!(
        (st["state"].as_str(), st["length"].as_u64()),
        (Some("closed"), Some(3))
    );
    assert_eq!(st["chunks"].as_array().map(Vec::len), Some(1));

    // `--create` makes a new file; without it a missing file is an error.
    let out = c.run_stdin(&["write", "/new", "--offset", "0", "-"], b"x");
    assert!(!out.status.success());
    let out = c.run_stdin(&["write", "/new", "--offset", "2", "--create", "-"], b"x");
    assert!(out.status.success());
    assert_eq!(c.cat("/new"), b"\0\0x");
}

/// Overwrites `path` (one chunk of `len` bytes) from the start with `data`, hsyncing
/// every `every` bytes, and SIGKILLs chunkserver `victim` a third of the way.
fn kill_a_chunkserver_mid_stream(engine: &str) {
    let mut c = cluster(engine);
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let path = "/killcs";
        let len = 1_000_000usize;
        let old = pattern(len, 11);
        let new = pattern(len, 12);
        let mut w = written_then_reopened(&client, path, 4 << 20, &old).await;
        let every = 100_000;
        for (i, piece) in new.chunks(every).enumerate() {
            if i == 3 {
                c.chunkservers[1].kill();
            }
            w.write_all(piece).await.expect("write");
            w.hsync().await.expect("hsync survives a lost replica");
        }
        w.close().await.expect("close");
        // The writer lived: every byte it wrote was acknowledged, so all are there.
        assert_eq!(read_all(&client, path).await, new);
        assert_replicas_identical(&client, path).await;
    });
    c.chunkservers[1].restart();
}

#[test]
fn a_chunkserver_killed_in_the_middle_of_an_overwrite_stream_loses_nothing_acknowledged() {
    kill_a_chunkserver_mid_stream("uring");
}

#[test]
fn a_chunkserver_killed_in_the_middle_of_an_overwrite_stream_threads() {
    kill_a_chunkserver_mid_stream("threads");
}

#[test]
fn a_writer_killed_in_the_middle_of_an_overwrite_leaves_old_or_new_bytes_and_identical_replicas() {
    let c = cluster("auto");
    let len = 3_000_000usize;
    let old = pattern(len, 21);
    let new = pattern(len, 22);
    c.put_bytes("/killw", &old, &["--chunk-size", "8MiB"]);
    // The writer streams the new bytes from a pipe; it is killed once part of them
    // went out (what it had in flight reached the replicas unevenly, or not at all).
    let mut child = c
        .cmd(&["write", "/killw", "--offset", "0", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&new[..len / 2]).expect("feed the writer");
    stdin.flush().expect("flush");
    let client_rt = runtime();
    let client = client_rt
        .block_on(common::connect(&c.master.addr))
        .expect("connect");
    // Wait until the replicas hold some of the new bytes, then kill the writer.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = client_rt.block_on(read_all(&client, "/killw"));
        if got.get(..1000) == Some(&new[..1000]) {
            break;
        }
        assert!(Instant::now() < deadline, "the overwrite never showed");
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the writer");
    let _ = child.wait();
    c.ok(&["recover", "/killw"]);
    client_rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.stat("/killw").await.expect("stat").state != stampfs_proto::FileState::Closed {
            assert!(Instant::now() < deadline, "recovery did not close the file");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let got = read_all(&client, "/killw").await;
        assert_eq!(
            got.len(),
            len,
            "an overwrite within the file keeps its length"
        );
        let torn = (0..len).find(|&i| got[i] != old[i] && got[i] != new[i]);
        assert_eq!(torn, None, "every byte is old or new");
        assert_replicas_identical(&client, "/killw").await;
        // Replica health brings every chunk back to three identical replicas.
        wait_replicated(&client, "/killw", 3).await;
        assert_eq!(read_all(&client, "/killw").await, got);
    });
}

#[test]
fn a_writer_killed_between_lowering_the_length_and_cutting_leaves_a_recoverable_file() {
    // The master lowers the committed length before any replica is cut: a writer that
    // dies in between leaves replicas longer than the committed length, which lease
    // recovery keeps (had it cut first, recovery would have found every replica
    // shorter than the committed length, short, and kept none).
    let c = cluster("auto");
    let data = pattern(100_000, 31);
    c.put_bytes("/cut", &data, &[]);
    let out = c
        .cmd(&["truncate", "/cut", "1000"])
        .env("STAMPFS_CRASH_POINTS", "writer-cut-before-setup=1")
        .output()
        .expect("run truncate");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(9),
        "killed at the crash point: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.ok(&["recover", "/cut"]);
    common::wait_for("the file to close", || {
        c.stat_json("/cut")["state"] == "closed"
    });
    // Nothing was cut: recovery closed the file at what the replicas hold.
    assert_eq!(c.cat("/cut"), data);
    let (code, report) = common::fsck_json(&c, &["/cut"]);
    assert_eq!(code, Some(0), "{report}");
}
