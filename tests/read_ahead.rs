//! The reader's read-ahead, against real processes on loopback: a sequential reader
//! keeps fetches of what follows in flight, and whatever it fetched ahead it returns
//! exactly the file's bytes: across chunk boundaries that cut a fetch short, after a
//! seek forward or back (the prefetches elsewhere are dropped), with odd read sizes,
//! and never past the length the reader may read (a file still being written).

mod common;

use common::{pattern, runtime, TestCluster};
use stampfs_client::{Client, CreateOptions};
use std::io::SeekFrom;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Not a multiple of the 1 MiB fetch: every chunk's last fetch is short.
const CHUNK: u64 = 1536 << 10;

/// A new file `path` in chunks of [`CHUNK`], open for writing.
async fn create(client: &Client, path: &str) -> stampfs_client::FileWriter {
    client
        .create(
            path,
            CreateOptions {
                chunk_size: Some(CHUNK),
                ..Default::default()
            },
        )
        .await
        .expect("create")
}

/// Reads `len` bytes (fewer at the end) in reads of `step` bytes.
async fn read_in_steps(r: &mut stampfs_client::FileReader, len: usize, step: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut buf = vec![0u8; step];
    while out.len() < len {
        let want = step.min(len - out.len());
        let n = r.read(&mut buf[..want]).await.expect("read");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[test]
fn sequential_reads_with_read_ahead_return_the_files_bytes_across_chunks_and_seeks() {
    let c = TestCluster::start();
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let data = pattern((9 << 20) + 12_345, 17);
        let mut w = create(&client, "/f").await;
        w.write_all(&data).await.expect("write");
        w.close().await.expect("close");

        let mut r = client.open("/f").await.expect("open");
        let got = read_in_steps(&mut r, data.len() + 1, 77_777).await;
        assert_eq!(got.len(), data.len(), "the whole file, then EOF");
        assert!(got == data, "sequential read differs from what was written");

        // Forward into another chunk while prefetches run elsewhere, then on from there.
        let at = (5 << 20) + 3;
        r.seek(SeekFrom::Start(at as u64)).await.expect("seek");
        let got = read_in_steps(&mut r, 2 << 20, 131_072).await;
        assert!(
            got == data[at..at + (2 << 20)],
            "read after a forward seek differs"
        );
        // Back to the start, whole reads of 1 MiB and more.
        r.seek(SeekFrom::Start(0)).await.expect("seek");
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.expect("read_to_end");
        assert!(all == data, "read after seeking back differs");
        // A seek to exactly where the reader is keeps reading right.
        r.seek(SeekFrom::Start(1 << 20)).await.expect("seek");
        let a = read_in_steps(&mut r, 4096, 4096).await;
        r.seek(SeekFrom::Start((1 << 20) + 4096))
            .await
            .expect("seek");
        let b = read_in_steps(&mut r, 4096, 4096).await;
        assert!(a == data[1 << 20..(1 << 20) + 4096]);
        assert!(b == data[(1 << 20) + 4096..(1 << 20) + 8192]);
    });
}

#[test]
fn read_ahead_of_a_file_being_written_stops_at_what_the_reader_may_read() {
    let c = TestCluster::start();
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let first = pattern((3 << 20) + 999, 5);
        let mut w = create(&client, "/g").await;
        w.write_all(&first).await.expect("write");
        w.hflush().await.expect("hflush");

        let mut r = client.open("/g").await.expect("open");
        assert_eq!(r.len(), first.len() as u64, "hflushed bytes are readable");
        // Reads go on while the writer adds more: this reader still ends where it
        // could read when it looked, with no byte it must not see.
        let more = pattern(2 << 20, 6);
        let got_head = read_in_steps(&mut r, 1 << 20, 65_536).await;
        w.write_all(&more).await.expect("write more");
        w.hflush().await.expect("hflush more");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.expect("read_to_end");
        let mut got = got_head;
        got.extend_from_slice(&rest);
        assert!(
            got == first,
            "a reader returned bytes other than the first ones"
        );

        let mut whole = first.clone();
        whole.extend_from_slice(&more);
        w.close().await.expect("close");
        let mut r = client.open("/g").await.expect("open");
        let got = read_in_steps(&mut r, whole.len() + 10, 300_001).await;
        assert!(got == whole, "a new reader reads everything");
    });
}
