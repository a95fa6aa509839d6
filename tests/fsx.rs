//! A random-I/O checker in the spirit of fsx: seeded sequences of writes at random
//! offsets (in place, across chunk boundaries, past the end), truncates (growing and
//! shrinking, below the last chunk too), syncs, reopens and reads, against a model of
//! the file in memory. Every read must equal the model. Files use 64 KiB chunks, so a
//! writer moves between chunks and drops chunks all the time. Run through the client
//! library and through the FUSE mount (with writes through a shared `mmap` too). Any
//! divergence fails with the seed, the operation number and the operation.

mod common;

use common::files::{apply, read_all};
use common::mount::{fuse_or_skip, MountGuard};
use common::{runtime, Opts, TestCluster};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stampfs_client::{Client, CreateOptions};
use stampfs_nemesis::replicas::check_replicas;

const CHUNK: u64 = 64 << 10;
/// The file never grows past this (so a run stays quick).
const MAX_LEN: u64 = 12 * CHUNK;

fn cluster() -> TestCluster {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    TestCluster::with(Opts {
        chunkservers: 3,
        master_args: args(&["--chunk-size", "64KiB"]),
        chunkserver_args: args(&["--heartbeat", "200ms"]),
        ..Default::default()
    })
}

/// One step of a run.
#[derive(Clone, Debug)]
enum Op {
    Write {
        offset: u64,
        len: usize,
        seed: u64,
    },
    Truncate {
        len: u64,
    },
    /// Flush (library: `hflush`; mount: nothing, reads see the writes) and check
    /// `len` bytes at `offset` (the whole file when `len` is 0).
    Check {
        offset: u64,
        len: u64,
    },
    /// `hsync` / `fsync`.
    Sync,
    /// Close the writer (or file) and open it again: a new lease.
    Reopen,
    /// Through a shared `mmap` of the file (the mount only; the library writes).
    MapWrite {
        offset: u64,
        len: usize,
        seed: u64,
    },
}

/// A random step for a file of `len` bytes.
fn next_op(rng: &mut StdRng, len: u64, mmap: bool) -> Op {
    let any_offset = |rng: &mut StdRng| {
        if len == 0 || rng.gen_ratio(1, 5) {
            // At or past the end.
            len + rng.gen_range(0..CHUNK / 2)
        } else {
            rng.gen_range(0..len)
        }
    };
    match rng.gen_range(0..100) {
        0..=54 => {
            let offset = any_offset(rng).min(MAX_LEN - 1);
            // Small, or spanning a chunk boundary.
            let max = if rng.gen_ratio(1, 4) { 100_000 } else { 5_000 };
            let len = rng.gen_range(1..=max).min((MAX_LEN - offset) as usize);
            Op::Write {
                offset,
                len,
                seed: rng.gen(),
            }
        }
        55..=66 => {
            let to = if rng.gen_ratio(1, 3) {
                // To a chunk boundary.
                rng.gen_range(0..=MAX_LEN / CHUNK) * CHUNK
            } else {
                rng.gen_range(0..=(len + CHUNK).min(MAX_LEN))
            };
            Op::Truncate { len: to }
        }
        67..=79 => {
            if len > 0 && rng.gen_ratio(1, 2) {
                let offset = rng.gen_range(0..len);
                Op::Check {
                    offset,
                    len: rng.gen_range(1..=(len - offset).min(200_000)),
                }
            } else {
                Op::Check { offset: 0, len: 0 }
            }
        }
        80..=87 => Op::Sync,
        88..=91 => Op::Reopen,
        _ if mmap && len > 0 => {
            let offset = rng.gen_range(0..len);
            Op::MapWrite {
                offset,
                len: rng.gen_range(1..=(len - offset).min(20_000) as usize),
                seed: rng.gen(),
            }
        }
        _ => Op::Sync,
    }
}

fn bytes_of(len: usize, seed: u64) -> Vec<u8> {
    common::pattern(len, seed)
}

/// The first offset where `got` and `want` differ, for the failure message.
fn first_difference(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!(
            "first difference at {i} (chunk {}, offset {} in it): got {} want {}",
            i as u64 / CHUNK,
            i as u64 % CHUNK,
            got[i],
            want[i]
        ),
        None => format!("lengths {} and {}", got.len(), want.len()),
    }
}

/// What the master and the replicas say of the file's last chunk, for a failure.
async fn last_chunk_seen(client: &Client, path: &str) -> String {
    let locs = match client.locations(path).await {
        Ok(l) => l,
        Err(e) => return format!("locations failed: {e}"),
    };
    let Some(last) = locs.chunks.last() else {
        return format!("no chunks; status {:?}", locs.status);
    };
    let mut out = format!(
        "last chunk {} v{} at {} committed {} complete {} unconfirmed {}, replicas:",
        last.handle, last.version, last.file_offset, last.length, last.complete, last.unconfirmed
    );
    for r in &last.replicas {
        match client.read_replica(&r.addr, last.token, 0).await {
            Ok((report, _)) => out += &format!(" {}: {report:?};", r.chunkserver),
            Err(e) => out += &format!(" {}: {e};", r.chunkserver),
        }
    }
    out
}

/// A run of `ops` steps through the client library, from seed `seed`.
fn run_library(seed: u64, ops: usize) {
    let c = cluster();
    runtime().block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let path = "/fsx-lib";
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model: Vec<u8> = Vec::new();
        let mut w = client
            .create(path, CreateOptions::default())
            .await
            .expect("create");
        w.close().await.expect("close");
        let open = || async {
            client
                .open_options()
                .write(true)
                .open(path)
                .await
                .expect("open for writes anywhere")
        };
        let mut w = open().await;
        for n in 0..ops {
            let op = next_op(&mut rng, model.len() as u64, false);
            let ctx = || format!("seed {seed}, op {n}: {op:?}");
            match &op {
                Op::Write { offset, len, seed } => {
                    let data = bytes_of(*len, *seed);
                    w.write_at(*offset, &data)
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                    apply(&mut model, *offset, &data);
                }
                Op::Truncate { len } => {
                    w.set_len(*len)
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                    model.resize(*len as usize, 0);
                }
                Op::Check { offset, len } => {
                    w.hflush()
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                    let got = read_all(&client, path).await;
                    let (from, to) = if *len == 0 {
                        (0, model.len())
                    } else {
                        (*offset as usize, (*offset + *len) as usize)
                    };
                    if got.len() != model.len() || got[from..to] != model[from..to] {
                        let seen = last_chunk_seen(&client, path).await;
                        panic!("{}: {}; {seen}", ctx(), first_difference(&got, &model));
                    }
                }
                Op::Sync => w.hsync().await.unwrap_or_else(|e| panic!("{}: {e}", ctx())),
                Op::Reopen | Op::MapWrite { .. } => {
                    let st = w.close().await.unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                    assert_eq!(st.length, model.len() as u64, "{}", ctx());
                    w = open().await;
                }
            }
            assert_eq!(w.len(), model.len() as u64, "seed {seed}, op {n}: {op:?}");
        }
        w.close().await.expect("close");
        let got = read_all(&client, path).await;
        assert!(
            got == model,
            "seed {seed}, at the end: {}",
            first_difference(&got, &model)
        );
        let v = check_replicas(&client, path, None)
            .await
            .expect("replica check");
        assert!(v.is_empty(), "seed {seed}: replicas differ: {v:?}");
    });
    let (code, fsck) = common::fsck_json(&c, &["/fsx-lib"]);
    assert_eq!(code, Some(0), "{fsck}");
}

#[test]
fn fsx_through_the_library_seed_1() {
    run_library(1, 1500);
}

#[test]
fn fsx_through_the_library_seed_2() {
    run_library(2, 1500);
}

/// Writes `data` at `offset` of the open file through a shared mapping of it.
fn map_write(file: &std::fs::File, offset: u64, data: &[u8]) -> nix::Result<()> {
    use nix::sys::mman::{mmap, msync, munmap, MapFlags, MsFlags, ProtFlags};
    let page = 4096u64;
    let start = offset - offset % page;
    let len = (offset + data.len() as u64 - start) as usize;
    let size = std::num::NonZeroUsize::new(len).ok_or(nix::Error::EINVAL)?;
    // SAFETY: a fresh shared mapping of `len` bytes of `file` from `start` (within the
    // file: the caller writes below its size); written through a slice of exactly that
    // length, synced, and unmapped before returning; nothing else aliases it.
    unsafe {
        let base = mmap(
            None,
            size,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            file,
            start as i64,
        )?;
        let slice = std::slice::from_raw_parts_mut(base.as_ptr().cast::<u8>(), len);
        let at = (offset - start) as usize;
        slice[at..at + data.len()].copy_from_slice(data);
        let synced = msync(base, len, MsFlags::MS_SYNC);
        munmap(base, len)?;
        synced
    }
}

/// A run through the FUSE mount: `pwrite`, `ftruncate`, `pread`, `fsync`, close and
/// open again, and writes through a shared `mmap`.
#[test]
fn fsx_through_the_mount() {
    use std::os::unix::fs::FileExt;
    if !fuse_or_skip("fsx_through_the_mount") {
        return;
    }
    let c = cluster();
    let m = MountGuard::start(&c);
    let seed = 3;
    let ops = 1200;
    let path = m.path("fsx-mount");
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .expect("open")
    };
    let mut f = open();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    for n in 0..ops {
        let op = next_op(&mut rng, model.len() as u64, true);
        let ctx = || format!("seed {seed}, op {n}: {op:?}");
        match &op {
            Op::Write { offset, len, seed } => {
                let data = bytes_of(*len, *seed);
                f.write_all_at(&data, *offset)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                apply(&mut model, *offset, &data);
            }
            Op::Truncate { len } => {
                f.set_len(*len).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                model.resize(*len as usize, 0);
            }
            Op::Check { offset, len } => {
                let (from, to) = if *len == 0 {
                    (0, model.len())
                } else {
                    (*offset as usize, (*offset + *len) as usize)
                };
                let mut got = vec![0u8; to - from];
                if let Err(e) = f.read_exact_at(&mut got, from as u64) {
                    let seen = runtime().block_on(async {
                        let client = common::connect(&c.master.addr).await.expect("connect");
                        last_chunk_seen(&client, "/fsx-mount").await
                    });
                    panic!("{}: {e}; {seen}", ctx());
                }
                assert!(
                    got[..] == model[from..to],
                    "{}: {}",
                    ctx(),
                    first_difference(&got, &model[from..to])
                );
            }
            Op::Sync => f.sync_all().unwrap_or_else(|e| panic!("{}: {e}", ctx())),
            Op::Reopen => {
                drop(f);
                f = open();
            }
            Op::MapWrite { offset, len, seed } => {
                let data = bytes_of(*len, *seed);
                map_write(&f, *offset, &data).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                apply(&mut model, *offset, &data);
            }
        }
        let size = f.metadata().expect("fstat").len();
        assert_eq!(size, model.len() as u64, "seed {seed}, op {n}: {op:?}");
    }
    f.sync_all().expect("fsync");
    drop(f);
    let got = std::fs::read(&path).expect("read back");
    assert!(
        got == model,
        "through the mount: {}",
        first_difference(&got, &model)
    );
    drop(m);
    let got = c.cat("/fsx-mount");
    assert!(
        got == model,
        "through the CLI: {}",
        first_difference(&got, &model)
    );
}
