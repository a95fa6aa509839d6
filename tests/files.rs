//! End-to-end file commands against real processes on loopback.

mod common;

use common::{pattern, Opts, TestCluster};
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

const CHUNK: usize = 1 << 20;

fn small_chunks() -> Opts {
    Opts {
        master_args: vec!["--chunk-size".into(), "1MiB".into()],
        ..Opts::default()
    }
}

#[test]
fn files_of_every_boundary_size_round_trip() {
    let c = TestCluster::with(small_chunks());
    for (i, len) in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12_345]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u64);
        let remote = format!("/f{len}");
        c.put_bytes(&remote, &data, &[]);
        let back = c.cat(&remote);
        assert!(back == data, "file of {len} bytes did not round-trip");
        let st = c.stat_json(&remote);
        assert_eq!(st["length"], len as u64, "{st}");
        assert_eq!(st["state"], "closed");
        let chunks = st["chunks"].as_array().expect("chunks");
        assert_eq!(chunks.len(), len.div_ceil(CHUNK), "{st}");
        for ch in chunks {
            assert_eq!(
                ch["replicas"].as_array().expect("replicas").len(),
                3,
                "{st}"
            );
            assert!(ch["version"].as_u64().expect("version") >= 1);
        }
    }
}

#[test]
fn get_writes_a_local_file_and_stdin_put_works() {
    let c = TestCluster::start();
    let data = pattern(200_000, 7);
    let out = c.run_stdin(&["put", "-", "/in.bin"], &data);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let local = c.dir.path().join("got.bin");
    c.ok(&["get", "/in.bin", local.to_str().expect("utf8")]);
    assert_eq!(std::fs::read(&local).expect("read"), data);
}

#[test]
fn append_extends_a_closed_file() {
    let c = TestCluster::with(small_chunks());
    let a = pattern(CHUNK + 1000, 1);
    let b = pattern(CHUNK / 2, 2);
    c.put_bytes("/log", &a, &[]);
    let before = c.stat_json("/log");
    let out = c.run_stdin(&["append", "-", "/log"], &b);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want = a.clone();
    want.extend_from_slice(&b);
    assert!(c.cat("/log") == want, "append did not extend the file");
    let after = c.stat_json("/log");
    // The partial last chunk was re-leased under a new version.
    let v0 = before["chunks"][1]["version"].as_u64().expect("v");
    let v1 = after["chunks"][1]["version"].as_u64().expect("v");
    assert!(
        v1 > v0,
        "append must bump the last chunk's version: {v0} -> {v1}"
    );
}

#[test]
fn namespace_commands() {
    let c = TestCluster::start();
    c.ok(&["mkdir", "-p", "/a/b/c"]);
    c.ok(&["mkdir", "-p", "/a/b/c"]);
    let out = c.run(&["mkdir", "/a/b/c"]);
    assert_eq!(out.status.code(), Some(1));
    c.put_bytes("/a/b/c/file", b"xyz", &[]);
    let ls = String::from_utf8(c.ok(&["ls", "-l", "/a/b/c"])).expect("utf8");
    assert!(ls.contains("file") && ls.contains(" 3 "), "{ls}");
    let json: serde_json::Value =
        serde_json::from_slice(&c.ok(&["ls", "--json", "/a/b"])).expect("json");
    assert_eq!(json[0]["name"], "c");
    assert_eq!(json[0]["kind"], "directory");
    c.ok(&["mv", "/a/b/c/file", "/a/moved"]);
    assert_eq!(c.cat("/a/moved"), b"xyz");
    let out = c.run(&["cat", "/a/b/c/file"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not found"), "{err}");
    let out = c.run(&["rm", "/a"]);
    assert_eq!(out.status.code(), Some(1), "non-empty dir needs -r");
    c.ok(&["rm", "-r", "/a"]);
    let ls = String::from_utf8(c.ok(&["ls", "/"])).expect("utf8");
    assert!(!ls.contains('a'), "{ls}");
}

#[test]
fn bad_input_gets_one_clear_line() {
    let c = TestCluster::start();
    for args in [
        vec!["cat", "relative/path"],
        vec!["mkdir", "/a/../b"],
        vec!["stat", "/nope"],
    ] {
        let out = c.run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("stampfs: error:"), "{err}");
        assert!(!err.contains("Remote("), "no debug dumps: {err}");
    }
    let out = c.run(&["fsck", "/nope"]);
    assert_eq!(out.status.code(), Some(1), "fsck of a missing path");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("stampfs: error:"), "{err}");
}

#[test]
fn a_second_writer_gets_lease_conflict() {
    let c = TestCluster::start();
    let mut w1 = c
        .cmd(&["put", "-", "/busy"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = w1.stdin.take().expect("stdin");
    stdin.write_all(b"first writer").expect("write");
    wait_for(
        || c.run(&["stat", "/busy"]).status.success(),
        "file created",
    );
    let out = c.run_stdin(&["append", "-", "/busy"], b"second");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("being written by"), "{err}");
    drop(stdin);
    let status = w1.wait().expect("wait");
    assert!(status.success());
    assert_eq!(c.cat("/busy"), b"first writer");
}

#[test]
fn concurrent_writers_to_different_files() {
    let c = TestCluster::with(small_chunks());
    let datas: Vec<Vec<u8>> = (0..4)
        .map(|i| pattern(2 * CHUNK + i * 777, i as u64))
        .collect();
    let children: Vec<_> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let local = c.dir.path().join(format!("cw{i}"));
            std::fs::write(&local, d).expect("write");
            c.cmd(&["put", local.to_str().expect("utf8"), &format!("/cw{i}")])
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for ch in children {
        let out = ch.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (i, d) in datas.iter().enumerate() {
        assert!(&c.cat(&format!("/cw{i}")) == d, "file {i} differs");
    }
}

#[test]
fn cat_of_a_file_being_written_returns_its_hflushed_prefix() {
    let c = TestCluster::start();
    let mut w = c
        .cmd(&["put", "-", "/growing"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = w.stdin.take().expect("stdin");
    let first = pattern(100_000, 3);
    stdin.write_all(&first).expect("write");
    stdin.flush().expect("flush");
    // put hflushes when its input pauses; a reader must then see the whole prefix.
    let mut seen = Vec::new();
    wait_for(
        || {
            let out = c.run(&["cat", "/growing"]);
            seen = out.stdout;
            out.status.success() && seen.len() >= first.len()
        },
        "hflushed bytes visible to cat",
    );
    assert_eq!(seen, first);
    let st = c.stat_json("/growing");
    assert_eq!(st["state"], "open");
    let second = pattern(50_000, 4);
    stdin.write_all(&second).expect("write");
    drop(stdin);
    let out = w.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut all = first;
    all.extend_from_slice(&second);
    assert!(c.cat("/growing") == all);
}

#[test]
fn put_survives_a_chunkserver_killed_mid_write() {
    let mut c = TestCluster::with(Opts {
        chunkservers: 4,
        master_args: vec!["--chunk-size".into(), "4MiB".into()],
        ..Opts::default()
    });
    let data = pattern(24 << 20, 11);
    let mut w = c
        .cmd(&["put", "-", "/survivor"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = w.stdin.take().expect("stdin");
    let (head, tail) = data.split_at(6 << 20);
    stdin.write_all(head).expect("write");
    stdin.flush().expect("flush");
    std::thread::sleep(Duration::from_millis(300));
    // Kill a chunkserver that holds a replica of the chunk being written.
    let st = c.stat_json("/survivor");
    let victim_addr = st["chunks"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|ch| ch["replicas"][0]["addr"].as_str())
        .map(str::to_string);
    let victim = victim_addr
        .and_then(|a| c.chunkservers.iter().position(|p| p.addr == a))
        .unwrap_or(0);
    c.chunkservers[victim].kill();
    let feeder = std::thread::spawn({
        let tail = tail.to_vec();
        move || {
            for piece in tail.chunks(1 << 20) {
                stdin.write_all(piece).expect("write");
            }
        }
    });
    feeder.join().expect("feeder");
    let out = w.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "put failed after a chunkserver died: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.cat("/survivor") == data, "file differs after recovery");
}

fn wait_for(mut f: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
