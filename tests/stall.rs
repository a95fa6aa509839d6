//! Issue 13: a stall (SIGSTOP) of the master, of the chunkservers, or of both, while a
//! writer holds a file open with acknowledged bytes in it. When the stalled processes
//! wake up, the master sees every heartbeat and the lease as old at once; whatever it
//! decides, every byte the writer had acknowledged must still be in the file after
//! another client takes the file over, and the writer either goes on (its later bytes
//! land) or is fenced with a clear error. It is never silently cut.
//!
//! Each test: a master (`--lease-soft 1s --lease-hard 3s --dead-after 2s --chunk-size
//! 256KiB`) and four chunkservers (`--heartbeat 200ms`); a `put - /stall` writer that
//! writes six pieces of 30 000 bytes, each acknowledged (put hflushes when its stdin
//! pauses; the test waits until a reader sees the bytes), and keeps its stdin open; the
//! stall; then more bytes for the writer, its stdin closed, and an `append` by another
//! client (optionally after a `stampfs recover` while the writer still holds the file).

mod common;

use common::{pattern, Opts, Proc, TestCluster};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Output, Stdio};
use std::time::{Duration, Instant};

const PATH: &str = "/stall";
/// Bytes per acknowledged write, before and after the stall.
const PIECE: usize = 30_000;
/// Acknowledged writes before the stall.
const PIECES_BEFORE: usize = 6;
/// Writes offered after the stall.
const PIECES_AFTER: usize = 2;
/// The cap of every wait on a condition.
const WAIT: Duration = Duration::from_secs(30);

fn cluster() -> TestCluster {
    // The harness passes `--dead-after 2s` to the master already.
    TestCluster::with(Opts {
        chunkservers: 4,
        master_args: [
            "--lease-soft",
            "1s",
            "--lease-hard",
            "3s",
            "--chunk-size",
            "256KiB",
        ]
        .map(String::from)
        .to_vec(),
        ..Opts::default()
    })
}

/// Runs a `stampfs` command with `input` on stdin, killing it after `limit`.
/// `None` when it was killed.
fn run_bounded(c: &TestCluster, args: &[&str], input: &[u8], limit: Duration) -> Option<Output> {
    let mut child = c
        .cmd(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stampfs");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = feeder.join();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    status.map(|status| Output {
        status,
        stdout,
        stderr,
    })
}

/// What a reader sees of the file now (`None` when `cat` fails or hangs).
fn try_cat(c: &TestCluster, limit: Duration) -> Option<Vec<u8>> {
    run_bounded(c, &["cat", PATH], b"", limit.min(Duration::from_secs(10)))
        .filter(|o| o.status.success())
        .map(|o| o.stdout)
}

/// The file's state (`open`, `recovering`, `closed`), when `stat` answers.
fn file_state(c: &TestCluster) -> Option<String> {
    let out = run_bounded(c, &["stat", "--json", PATH], b"", Duration::from_secs(10))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["state"].as_str().map(String::from)
}

/// How many leading bytes `a` and `b` share.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A `put - PATH` that holds its file open: its stdin stays open between pieces.
struct Writer {
    child: Child,
    /// The writer's input; dropping it is the writer's cue to close the file.
    stdin: Option<ChildStdin>,
    stderr: PathBuf,
    /// Every byte fed to the writer, in order.
    fed: Vec<u8>,
    /// How many bytes of `fed` a reader has seen, that is, the writer has hflushed.
    acked: usize,
}

impl Writer {
    fn start(c: &TestCluster) -> Writer {
        let stderr = c.dir.path().join("writer.stderr");
        let file = std::fs::File::create(&stderr).expect("writer stderr file");
        let mut child = c
            .cmd(&["put", "-", PATH])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn writer");
        let stdin = child.stdin.take();
        Writer {
            child,
            stdin,
            stderr,
            fed: Vec::new(),
            acked: 0,
        }
    }

    /// Feeds `bytes`; false when the writer no longer reads its input.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        let Some(stdin) = self.stdin.as_mut() else {
            return false;
        };
        if stdin.write_all(bytes).and_then(|()| stdin.flush()).is_err() {
            return false;
        }
        self.fed.extend_from_slice(bytes);
        true
    }

    /// Waits until a reader sees everything fed so far. False when the writer exited
    /// first, the file was closed under it (nothing more of its can be acknowledged),
    /// or 30 s passed.
    fn wait_acked(&mut self, c: &TestCluster) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(got) = try_cat(c, deadline.saturating_duration_since(Instant::now())) {
                if got.starts_with(&self.fed) {
                    self.acked = self.fed.len();
                    return true;
                }
            }
            if !matches!(self.child.try_wait(), Ok(None))
                || Instant::now() >= deadline
                || file_state(c).as_deref() == Some("closed")
            {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Feeds one piece and insists it is acknowledged.
    fn write_acked(&mut self, c: &TestCluster, piece: &[u8]) {
        assert!(self.feed(piece), "the writer stopped reading its input");
        assert!(
            self.wait_acked(c),
            "a reader did not see the writer's {} bytes within 30 s (writer: {})",
            self.fed.len(),
            self.stderr_text()
        );
    }

    /// Closes the writer's input and waits (30 s at most) for it to exit: its exit code.
    fn finish(&mut self) -> Option<i32> {
        drop(self.stdin.take());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            assert!(
                Instant::now() < deadline,
                "the writer did not exit within 30 s of its input closing (stderr: {})",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `stampfs recover PATH` until it says the file is closed (30 s at most).
fn recover(c: &TestCluster) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Some(out) = run_bounded(c, &["recover", PATH], b"", left) {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && text.contains("closed at") {
                return Ok(text);
            }
            last = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("recover did not close {PATH} within 30 s: {last}"))
}

/// Another client's `append - PATH`, retried while the file is still being written or
/// recovered (30 s at most). Err carries the last error.
fn append_by_another_client(c: &TestCluster, data: &[u8]) -> Result<(), String> {
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("(no attempt finished)");
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        match run_bounded(c, &["append", "-", PATH], data, left) {
            Some(out) if out.status.success() => return Ok(()),
            Some(out) => {
                last = String::from_utf8_lossy(&out.stderr).into_owned();
                let busy = last.contains("being written by") || last.contains("recovery");
                if !busy {
                    return Err(last);
                }
            }
            None => last = "append still waiting at the deadline".into(),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("within 30 s: {last}"))
}

/// What the other client does once the stall is over.
#[derive(Clone, Copy, PartialEq)]
enum Takeover {
    /// The writer gets more bytes and closes; then another client appends.
    Append,
    /// `stampfs recover` while the writer still holds the file; then the writer gets
    /// more bytes and closes, and another client appends.
    RecoverThenAppend,
}

/// The whole scenario around `stall`, which stops and continues processes.
fn acknowledged_bytes_survive(stall: impl FnOnce(&TestCluster), takeover: Takeover) {
    let t0 = Instant::now();
    let name = std::thread::current().name().unwrap_or("stall").to_string();
    let say = |what: String| eprintln!("[{name} +{:.1}s] {what}", t0.elapsed().as_secs_f64());
    let c = cluster();
    let mut w = Writer::start(&c);
    for i in 0..PIECES_BEFORE {
        w.write_acked(&c, &pattern(PIECE, 100 + i as u64));
    }
    let acked_before = w.acked;
    assert_eq!(acked_before, PIECE * PIECES_BEFORE);
    say(format!("{acked_before} bytes acknowledged; stalling"));

    stall(&c);
    say("stall over".into());

    let mut recovered = None;
    if takeover == Takeover::RecoverThenAppend {
        let r = recover(&c);
        let now = try_cat(&c, WAIT).unwrap_or_default();
        recovered = Some((r, now));
    }
    // The writer's later bytes: acknowledged only if a reader sees them.
    for i in 0..PIECES_AFTER {
        if !w.feed(&pattern(PIECE, 200 + i as u64)) || !w.wait_acked(&c) {
            break;
        }
    }
    let code = w.finish();
    let werr = w.stderr_text();
    say(format!(
        "writer fed {} bytes, {} acknowledged, exited {code:?}: {werr}",
        w.fed.len(),
        w.acked
    ));

    let other = pattern(50_000, 300);
    let appended = append_by_another_client(&c, &other);
    say(format!("the other client's append: {appended:?}"));
    let got = c.cat(PATH);
    let have = common_prefix(&got, &w.fed);
    let fate = format!(
        "writer fed {} bytes, {} acknowledged ({acked_before} before the stall), exited \
         {code:?} with stderr {werr:?}; the other client's append: {appended:?}; the file \
         is {} bytes",
        w.fed.len(),
        w.acked,
        got.len()
    );

    if let Some((r, now)) = &recovered {
        let kept = common_prefix(now, &w.fed[..acked_before]);
        assert!(
            kept == acked_before,
            "after recover the file has {kept} of {acked_before} acknowledged bytes ({r:?}; {fate})"
        );
        assert!(r.is_ok(), "{r:?} ({fate})");
    }
    assert!(
        have >= acked_before,
        "file has {have} of {acked_before} acknowledged bytes ({fate})"
    );
    assert!(
        have >= w.acked,
        "file has {have} of {} acknowledged bytes (the writer's later {} were seen by a \
         reader, then lost; {fate})",
        w.acked,
        w.acked - acked_before
    );
    match code {
        Some(0) => assert!(
            have == w.fed.len(),
            "the writer exited 0 but the file has {have} of its {} bytes ({fate})",
            w.fed.len()
        ),
        _ => {
            let e = werr.to_lowercase();
            assert!(
                e.contains("fenced") || e.contains("stale"),
                "the writer failed without a fencing error ({fate})"
            );
        }
    }
    if takeover == Takeover::RecoverThenAppend {
        assert!(
            code != Some(0),
            "the writer closed the file successfully after its lease was recovered ({fate})"
        );
    }
    match appended {
        Ok(()) => {
            let head = got.len().saturating_sub(other.len());
            assert!(
                got[head..] == other[..],
                "the other client's {} appended bytes are not at the end of the file ({fate})",
                other.len()
            );
            assert!(
                w.fed.starts_with(&got[..head]) && head >= w.acked,
                "before the other client's bytes the file holds {head} bytes of which {have} \
                 are the writer's; expected at least its {} acknowledged bytes and nothing \
                 else ({fate})",
                w.acked
            );
        }
        Err(e) => panic!("no other client could append to the file after the stall: {e} ({fate})"),
    }
}

/// SIGSTOPs `procs`, waits `d`, SIGCONTs them.
fn stop_for(procs: &[&Proc], d: Duration) {
    for p in procs {
        p.stop();
    }
    std::thread::sleep(d);
    for p in procs {
        p.cont();
    }
}

fn master_stall(d: Duration) -> impl FnOnce(&TestCluster) {
    move |c: &TestCluster| stop_for(&[&c.master], d)
}

fn all_chunkservers(c: &TestCluster) -> Vec<&Proc> {
    c.chunkservers.iter().collect()
}

/// The chunkservers holding a replica of the file's last chunk.
fn replica_holders(c: &TestCluster) -> Vec<&Proc> {
    let st = c.stat_json(PATH);
    let replicas = st["chunks"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|ch| ch["replicas"].as_array())
        .cloned()
        .unwrap_or_default();
    let addrs: Vec<&str> = replicas.iter().filter_map(|r| r["addr"].as_str()).collect();
    let holders: Vec<&Proc> = c
        .chunkservers
        .iter()
        .filter(|p| addrs.contains(&p.addr.as_str()))
        .collect();
    assert_eq!(holders.len(), 3, "three replicas of the chunk: {st}");
    holders
}

#[test]
fn acknowledged_bytes_survive_a_master_stall_shorter_than_dead_after() {
    acknowledged_bytes_survive(master_stall(Duration::from_millis(1500)), Takeover::Append);
}

#[test]
fn acknowledged_bytes_survive_a_master_stall_between_dead_after_and_the_hard_limit() {
    acknowledged_bytes_survive(master_stall(Duration::from_millis(2500)), Takeover::Append);
}

#[test]
fn acknowledged_bytes_survive_a_master_stall_past_the_hard_limit() {
    acknowledged_bytes_survive(master_stall(Duration::from_secs(4)), Takeover::Append);
}

#[test]
fn acknowledged_bytes_survive_a_master_stall_of_twice_the_hard_limit_and_a_recover() {
    acknowledged_bytes_survive(
        master_stall(Duration::from_secs(6)),
        Takeover::RecoverThenAppend,
    );
}

#[test]
fn acknowledged_bytes_survive_all_chunkservers_stalling_past_dead_after() {
    acknowledged_bytes_survive(
        |c: &TestCluster| stop_for(&all_chunkservers(c), Duration::from_secs(3)),
        Takeover::Append,
    );
}

#[test]
fn acknowledged_bytes_survive_the_three_replica_holders_stalling_past_dead_after() {
    acknowledged_bytes_survive(
        |c: &TestCluster| stop_for(&replica_holders(c), Duration::from_secs(3)),
        Takeover::RecoverThenAppend,
    );
}

#[test]
fn acknowledged_bytes_survive_a_master_stall_overlapping_a_chunkserver_stall() {
    // Master stopped 0..4 s, chunkservers 1..5.5 s: the master wakes to heartbeats it
    // missed while the chunkservers still sleep.
    acknowledged_bytes_survive(
        |c: &TestCluster| {
            c.master.stop();
            std::thread::sleep(Duration::from_secs(1));
            let cs = all_chunkservers(c);
            cs.iter().for_each(|p| p.stop());
            std::thread::sleep(Duration::from_secs(3));
            c.master.cont();
            std::thread::sleep(Duration::from_millis(1500));
            cs.iter().for_each(|p| p.cont());
        },
        Takeover::Append,
    );
}

#[test]
fn acknowledged_bytes_survive_a_chunkserver_stall_overlapping_a_master_stall() {
    // Chunkservers stopped 0..3.5 s, master 1..5 s: the chunkservers wake first and
    // heartbeat to a master that is still asleep.
    acknowledged_bytes_survive(
        |c: &TestCluster| {
            let cs = all_chunkservers(c);
            cs.iter().for_each(|p| p.stop());
            std::thread::sleep(Duration::from_secs(1));
            c.master.stop();
            std::thread::sleep(Duration::from_millis(2500));
            cs.iter().for_each(|p| p.cont());
            std::thread::sleep(Duration::from_millis(1500));
            c.master.cont();
        },
        Takeover::RecoverThenAppend,
    );
}
