//! The CLI where a user with HDFS and coreutils habits expects it to behave, against a
//! real cluster: `mv` into a directory; a closed stdout (`| head`) ends a command
//! quietly, without a panic; `put` of a directory, or of an input that fails to read,
//! leaves no file behind (a leftover open file would block the retry for a whole
//! lease); `get` into a directory, never over an existing file without `-f`, never
//! leaving a partial file; `stampfs dev --replication --chunk-size`.

mod common;

use common::TestCluster;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_stampfs");

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn mv_into_an_existing_directory_keeps_the_name() {
    let c = TestCluster::start();
    c.put_bytes("/f", b"data", &[]);
    c.ok(&["mkdir", "/d"]);
    c.ok(&["mv", "/f", "/d"]);
    assert_eq!(c.cat("/d/f"), b"data");
    assert!(!c.run(&["stat", "/f"]).status.success(), "/f is gone");
    // A directory moves into another one the same way; a file over a file still
    // refuses.
    c.ok(&["mkdir", "/e"]);
    c.ok(&["mv", "/e", "/d/"]);
    c.ok(&["stat", "/d/e"]);
    c.put_bytes("/g", b"g", &[]);
    let out = c.run(&["mv", "/g", "/d/f"]);
    assert!(!out.status.success(), "a file over a file is refused");
    assert!(stderr_of(&out).contains("exists"), "{}", stderr_of(&out));
    assert_eq!(c.cat("/d/f"), b"data");
}

#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    let c = TestCluster::start();
    c.put_bytes("/big", &common::pattern(3 << 20, 1), &[]);
    for args in [
        &["cat", "/big"][..],
        &["stat", "/big"],
        &["stat", "--json", "/big"],
        &["ls", "-l", "/"],
        &["get", "/big", "-"],
        &["admin", "report"],
        &["fsck"],
    ] {
        let mut child = c
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader goes away before the command writes anything (`| head -0`).
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let err = stderr_of(&out);
        assert!(
            out.status.success(),
            "stampfs {args:?} with a closed stdout: {}\n{err}",
            out.status
        );
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "stampfs {args:?} said: {err}"
        );
    }
}

#[test]
fn a_put_that_cannot_read_its_input_leaves_no_file() {
    let c = TestCluster::start();
    let dir = c.dir.path().display().to_string();
    let out = c.run(&["put", &dir, "/x"]);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("is a directory"),
        "{}",
        stderr_of(&out)
    );
    assert!(!c.run(&["stat", "/x"]).status.success(), "/x was not made");
    // An input that opens but fails on its first read: the file the put created is
    // removed, so a retry is not blocked by its lease.
    let out = c.run(&["put", "/proc/self/mem", "/y"]);
    assert!(!out.status.success(), "reading /proc/self/mem fails");
    assert!(
        stderr_of(&out).contains("not stored"),
        "{}",
        stderr_of(&out)
    );
    assert!(!c.run(&["stat", "/y"]).status.success(), "/y was removed");
    c.put_bytes("/y", b"retry", &[]);
    assert_eq!(c.cat("/y"), b"retry");
}

#[test]
fn get_goes_into_a_directory_and_replaces_a_file_only_with_force() {
    let c = TestCluster::start();
    c.ok(&["mkdir", "/a"]);
    c.put_bytes("/a/f.bin", b"remote bytes", &[]);
    let local = tempfile::tempdir().expect("tempdir");
    let dir = local.path().display().to_string();
    c.ok(&["get", "/a/f.bin", &dir]);
    let file = local.path().join("f.bin");
    assert_eq!(std::fs::read(&file).expect("read"), b"remote bytes");

    std::fs::write(&file, b"local edits").expect("write");
    let f = file.display().to_string();
    let out = c.run(&["get", "/a/f.bin", &f]);
    assert!(!out.status.success(), "an existing file is not replaced");
    assert!(stderr_of(&out).contains("-f"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(&file).expect("read"), b"local edits");
    c.ok(&["get", "-f", "/a/f.bin", &f]);
    assert_eq!(std::fs::read(&file).expect("read"), b"remote bytes");

    // A get that fails leaves nothing, next to the target or in it.
    let missing = local.path().join("missing.bin").display().to_string();
    assert!(!c.run(&["get", "/a/none", &missing]).status.success());
    let names: Vec<_> = std::fs::read_dir(local.path())
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["f.bin"], "only the file got");
}

#[test]
fn dev_takes_the_default_replication_and_chunk_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = Command::new(BIN)
        .args(["dev", "--chunkservers", "1", "--replication", "2"])
        .arg("--dir")
        .arg(dir.path().join("bad"))
        .output()
        .expect("run dev");
    assert!(!bad.status.success(), "more replicas than chunkservers");
    assert!(
        stderr_of(&bad).contains("--replication"),
        "{}",
        stderr_of(&bad)
    );

    let mut dev = Command::new(BIN)
        .args(["dev", "--chunkservers", "2", "--replication", "2"])
        .args(["--chunk-size", "1MiB", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir.path().join("good"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dev");
    let mut lines = BufReader::new(dev.stdout.take().expect("stdout")).lines();
    let mut master = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in lines.by_ref() {
        let line = line.expect("read dev's output");
        if let Some(addr) = line.trim().strip_prefix("master") {
            master = Some(addr.trim().to_string());
            break;
        }
        assert!(Instant::now() < deadline, "dev did not start");
    }
    let master = master.expect("dev printed its master's address");
    // The reader goes away: what dev prints next must not take its servers down (it
    // did: a panic on the broken pipe ended the process).
    drop(lines);
    // dev's master wrote its superuser's credentials at its first start.
    let creds = common::wait_credentials_file(
        &dir.path()
            .join("good")
            .join("master")
            .join("admin.credentials"),
    );
    let stampfs = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("STAMPFS_MASTER", &master)
            .env(common::CREDENTIALS_ENV, &creds)
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert!(out.status.success(), "{args:?}: {}", stderr_of(&out));
        out.stdout
    };
    let local = dir.path().join("in.bin");
    std::fs::write(&local, common::pattern(3 << 20, 2)).expect("write");
    stampfs(&["put", &local.display().to_string(), "/f"]);
    let st: serde_json::Value =
        serde_json::from_slice(&stampfs(&["stat", "--json", "/f"])).expect("json");
    assert_eq!(st["replication"], 2);
    assert_eq!(st["chunk_size"], 1 << 20);
    assert_eq!(st["chunks"].as_array().map(Vec::len), Some(3));
    let _ = dev.kill();
    let _ = dev.wait();
}
