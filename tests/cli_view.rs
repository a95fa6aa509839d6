//! `df`, `tail [-f]` and `ls -R` on a real cluster, as `hdfs dfs` users know them:
//! `df` adds up what `admin report` shows and moves with a put; `tail` prints exactly
//! a file's last 1024 bytes, across a chunk boundary too; `tail -f` prints what
//! another process appends while it writes, and ends on SIGTERM, on a closed stdout
//! and (with an error) when the file is removed; `ls -R` walks a tree depth first in
//! name order, with `-l` and `--json`, and ends quietly under `| head`.

mod common;

use common::{Opts, TestCluster};
use std::io::{Read, Write};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

fn out(c: &TestCluster, args: &[&str]) -> String {
    String::from_utf8(c.ok(args)).expect("utf-8")
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A child process, killed and reaped on drop.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kid {
    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), sig)
            .expect("signal");
    }

    /// Waits (at most `limit`) for the exit, then returns its status and stderr.
    fn wait_exit(&mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                let mut err = String::new();
                if let Some(mut e) = self.0.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return (status, err);
            }
            assert!(Instant::now() < deadline, "did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What a child writes on stdout, gathered by a thread.
struct Output {
    rx: mpsc::Receiver<Vec<u8>>,
    got: Vec<u8>,
}

impl Output {
    fn of(mut stdout: ChildStdout) -> Output {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Output {
            rx,
            got: Vec::new(),
        }
    }

    /// Waits (at most 30 s) until `want` bytes came, and returns them all.
    fn until(&mut self, want: usize) -> &[u8] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.got.len() < want {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(piece) => self.got.extend(piece),
                Err(_) => panic!(
                    "{} bytes came within 30 s, not {want}: {:?}",
                    self.got.len(),
                    String::from_utf8_lossy(&self.got)
                ),
            }
        }
        &self.got
    }
}

/// Size, used and available bytes in `df`'s output (no `-h`).
fn df_numbers(c: &TestCluster) -> (u64, u64, u64) {
    let text = out(c, &["df"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["Filesystem", "Size", "Used", "Available", "Use%"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row.len(), 5, "{text}");
    assert_eq!(row[0], format!("stampfs://{}", c.master.addr));
    let n = |s: &str| s.parse::<u64>().unwrap_or_else(|_| panic!("{s}: {text}"));
    (n(row[1]), n(row[2]), n(row[3]))
}

/// Capacity and used of the live chunkservers in `admin report --json`.
fn report_numbers(c: &TestCluster) -> (u64, u64) {
    let report: serde_json::Value =
        serde_json::from_slice(&c.ok(&["admin", "report", "--json"])).expect("json");
    let live: Vec<&serde_json::Value> = report["chunkservers"]
        .as_array()
        .expect("chunkservers")
        .iter()
        .filter(|cs| cs["state"] == "live")
        .collect();
    let sum = |k: &str| live.iter().map(|cs| cs[k].as_u64().expect(k)).sum();
    (sum("capacity"), sum("used"))
}

#[test]
fn df_adds_up_the_admin_report_and_grows_with_a_put() {
    let mut opts = Opts::default();
    // A stated capacity: used space is then the replicas' bytes, not the disk's.
    opts.chunkserver_args
        .extend(["--capacity".to_string(), "1GiB".to_string()]);
    let c = TestCluster::with(opts);

    // Heartbeats move the numbers between the two commands; at rest they agree.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (size, used, avail) = loop {
        let (rsize, rused) = report_numbers(&c);
        let (size, used, avail) = df_numbers(&c);
        if (rsize, rused) == (size, used) {
            break (size, used, avail);
        }
        assert!(
            Instant::now() < deadline,
            "df {size} {used}, report {rsize} {rused}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(size, 3 * GIB);
    assert_eq!(avail, size - used);

    c.put_bytes("/f", &common::pattern(1 << 20, 1), &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, now, _) = df_numbers(&c);
        // Three replicas of 1 MiB.
        if now >= used + (3 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "df's used stayed at {now} (was {used}) after a put of 3 MiB of replicas"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let human = out(&c, &["df", "-h", "/f"]);
    assert!(human.contains("3.0 GiB"), "{human}");
    assert!(human.contains("Use%"), "{human}");
    assert!(
        c.run(&["df", "--help"]).status.success(),
        "--help still works"
    );
    let missing = c.run(&["df", "/nope"]);
    assert!(!missing.status.success(), "a path that is not there");
    assert!(
        stderr_of(&missing).contains("/nope"),
        "{}",
        stderr_of(&missing)
    );
}

#[test]
fn tail_prints_exactly_the_last_kilobyte() {
    let c = TestCluster::start();
    // Shorter than 1 KiB: all of it.
    let small = common::pattern(300, 1);
    c.put_bytes("/small", &small, &[]);
    assert_eq!(c.ok(&["tail", "/small"]), small);
    // Empty: nothing.
    c.ok(&["touchz", "/empty"]);
    assert!(c.ok(&["tail", "/empty"]).is_empty());
    // Four chunks of 64 KiB, the last 1024 bytes straddling the last boundary.
    let big = common::pattern(3 * 65536 + 500, 2);
    c.put_bytes("/big", &big, &["--chunk-size", "64KiB"]);
    assert_eq!(
        c.stat_json("/big")["chunks"].as_array().map(Vec::len),
        Some(4)
    );
    let tail = c.ok(&["tail", "/big"]);
    assert_eq!(tail.len(), 1024);
    assert_eq!(tail, big[big.len() - 1024..]);

    c.ok(&["mkdir", "/d"]);
    let dir = c.run(&["tail", "/d"]);
    assert!(!dir.status.success());
    assert!(
        stderr_of(&dir).contains("is a directory"),
        "{}",
        stderr_of(&dir)
    );
    let missing = c.run(&["tail", "/nope"]);
    assert!(!missing.status.success());
}

/// `tail -f -s 100ms PATH`, with its stdout and its stderr kept.
fn follow(c: &TestCluster, path: &str) -> (Kid, ChildStdout) {
    let mut child = c
        .cmd(&["tail", "-f", "-s", "100ms", path])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tail -f");
    let stdout = child.stdout.take().expect("stdout");
    (Kid(child), stdout)
}

#[test]
fn tail_f_prints_what_another_process_appends_until_stopped() {
    let c = TestCluster::start();
    let first = common::pattern(2000, 3);
    c.put_bytes("/log", &first, &["--chunk-size", "64KiB"]);
    let (mut tail, stdout) = follow(&c, "/log");
    let mut seen = Output::of(stdout);
    assert_eq!(seen.until(1024), &first[first.len() - 1024..]);

    // Another process appends and keeps the file open for write: what it hflushes is
    // printed while it writes, across chunk boundaries.
    let mut writer = Kid(c
        .cmd(&["append", "-", "/log"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn append"));
    let mut input = writer.0.stdin.take().expect("stdin");
    let mut expected = first[first.len() - 1024..].to_vec();
    for i in 0..3u64 {
        let piece = common::pattern(50_000, 10 + i);
        input.write_all(&piece).expect("feed append");
        input.flush().expect("flush");
        expected.extend_from_slice(&piece);
        assert_eq!(
            seen.until(expected.len()),
            expected,
            "piece {i} while its writer holds the file"
        );
    }
    drop(input);
    let (status, err) = writer.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "append: {err}");
    // One more by a writer that closes at once.
    let last = common::pattern(777, 20);
    let out = c.run_stdin(&["append", "-", "/log"], &last);
    assert!(out.status.success(), "append: {}", stderr_of(&out));
    expected.extend_from_slice(&last);
    assert_eq!(seen.until(expected.len()), expected);

    // SIGTERM (as Ctrl-C's SIGINT) ends it quietly.
    tail.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, err) = tail.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "tail -f after SIGTERM: {status}: {err}");
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");
    assert_eq!(
        seen.until(expected.len()).len(),
        expected.len(),
        "nothing more"
    );
    assert_eq!(c.cat("/log").len(), 2000 + 150_000 + 777);
}

#[test]
fn tail_f_ends_on_a_closed_stdout_and_on_removal() {
    let c = TestCluster::start();
    c.put_bytes("/a", b"hello\n", &[]);
    c.put_bytes("/b", b"bye\n", &[]);

    // The reader goes away while the file does not grow (nothing is written that
    // could fail): tail -f still ends, quietly.
    let (mut tail, mut stdout) = follow(&c, "/a");
    let mut first = [0u8; 6];
    stdout.read_exact(&mut first).expect("the file");
    assert_eq!(&first, b"hello\n");
    drop(stdout);
    let (status, err) = tail.wait_exit(Duration::from_secs(10));
    assert!(
        status.success(),
        "tail -f with a closed stdout: {status}: {err}"
    );
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");

    // The file is removed: tail -f says so and fails.
    let (mut tail, stdout) = follow(&c, "/b");
    let mut seen = Output::of(stdout);
    assert_eq!(seen.until(4), b"bye\n");
    c.ok(&["rm", "/b"]);
    let (status, err) = tail.wait_exit(Duration::from_secs(10));
    assert!(!status.success(), "tail -f of a removed file: {err}");
    assert!(err.contains("/b was removed"), "{err}");
}

/// A tree: directories /t, /t/a, /t/a/b, /t/c (empty), files and a link.
fn make_tree(c: &TestCluster) {
    c.ok(&["mkdir", "-p", "/t/a/b"]);
    c.ok(&["mkdir", "/t/c"]);
    c.put_bytes("/t/a/b/f", b"12345", &[]);
    c.put_bytes("/t/a/g", b"1", &[]);
    c.put_bytes("/t/z", b"zz", &[]);
    c.ok(&["ln", "-s", "/t/z", "/t/l"]);
}

#[test]
fn ls_r_walks_depth_first_in_name_order() {
    let c = TestCluster::start();
    make_tree(&c);
    let short = out(&c, &["ls", "-R", "/t"]);
    assert_eq!(
        short.lines().collect::<Vec<_>>(),
        ["/t/a/", "/t/a/b/", "/t/a/b/f", "/t/a/g", "/t/c/", "/t/l@", "/t/z"],
        "{short}"
    );
    // Without -R: the names in /t alone, as before.
    assert_eq!(
        out(&c, &["ls", "/t"]).lines().collect::<Vec<_>>(),
        ["a/", "c/", "l@", "z"]
    );

    // With -l: ls -l's columns, full paths last.
    let long = out(&c, &["ls", "-l", "-R", "/t"]);
    let lines: Vec<Vec<&str>> = long
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 7, "{long}");
    let kinds: String = lines
        .iter()
        .map(|l| l[0].chars().next().expect("mode"))
        .collect();
    assert_eq!(kinds, "dd--dl-", "{long}");
    let f = &lines[2];
    assert_eq!(f.last(), Some(&"/t/a/b/f"), "{long}");
    assert!(f.contains(&"5"), "the length: {long}");
    assert_eq!(&lines[5][lines[5].len() - 3..], ["/t/l", "->", "/t/z"]);

    // --json: one array of every entry.
    let json: serde_json::Value =
        serde_json::from_slice(&c.ok(&["ls", "-R", "--json", "/t"])).expect("json");
    let paths: Vec<&str> = json
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["path"].as_str().expect("path"))
        .collect();
    assert_eq!(
        paths,
        ["/t/a", "/t/a/b", "/t/a/b/f", "/t/a/g", "/t/c", "/t/l", "/t/z"]
    );

    // A file: itself; something missing: an error naming it.
    assert_eq!(out(&c, &["ls", "-R", "/t/z"]), "/t/z\n");
    let missing = c.run(&["ls", "-R", "/nope"]);
    assert!(!missing.status.success());
    assert!(
        stderr_of(&missing).contains("/nope"),
        "{}",
        stderr_of(&missing)
    );
}

#[test]
fn ls_r_under_head_ends_quietly() {
    let c = TestCluster::start();
    make_tree(&c);
    // More than a pipe holds (64 KiB) in `ls -l -R` lines, so that the command is
    // still writing when its reader goes.
    let rt = common::runtime();
    rt.block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        for d in 0..20 {
            client
                .mkdir(&format!("/t/many/d{d:02}"), true)
                .await
                .expect("mkdir");
            for f in 0..60 {
                client
                    .make_file(
                        &format!("/t/many/d{d:02}/file-with-a-longer-name-{f:03}"),
                        stampfs_client::CreateOptions::default(),
                    )
                    .await
                    .expect("make_file");
            }
        }
    });
    let whole = c.ok(&["ls", "-l", "-R", "/t"]);
    assert!(whole.len() > 96 << 10, "{} bytes", whole.len());

    // `| head -1`: one line read, then the reader goes.
    let mut child = Kid(c
        .cmd(&["ls", "-l", "-R", "/t"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn"));
    let mut stdout = child.0.stdout.take().expect("stdout");
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).expect("the first bytes");
    drop(stdout);
    let (status, err) = child.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "ls -R | head: {status}: {err}");
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");

    // `| head -0`: the reader is gone before the first line.
    let mut child = Kid(c
        .cmd(&["ls", "-R", "/t"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn"));
    drop(child.0.stdout.take());
    let (status, err) = child.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "ls -R | head -0: {status}: {err}");
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");
}
