//! The FUSE mount end to end: a real cluster, `stampfs mount --foreground` as a child
//! process, and ordinary tools (`cp`, `cmp`, `ls`, `mkdir`, `mv`, `rm`, `cat`, `dd`)
//! working through it. Needs root and /dev/fuse: in CI (`CI=true`) their absence is a
//! failure; elsewhere the tests print `SKIPPED: <why>` and return.

mod common;

use common::mount::{fuse_or_skip, is_fuse_mount, MountGuard};
use common::{pattern, wait_for, Opts, TestCluster};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// Cleans up after a background `stampfs mount` if its test fails half-way.
struct BackgroundServer {
    root: PathBuf,
    pid: Option<i32>,
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if is_fuse_mount(&self.root) {
            let _ = Command::new("umount").arg("-l").arg(&self.root).output();
        }
        if let Some(pid) = self.pid {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("stampfs"));
            if ours {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Runs a tool and returns its output.
fn tool(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
}

/// Runs a tool that must succeed and returns its stdout.
fn tool_ok(cmd: &str, args: &[&str]) -> Vec<u8> {
    let out = tool(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn file_state(c: &TestCluster, remote: &str) -> String {
    c.stat_json(remote)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn ordinary_tools_work_through_the_mount() {
    if !fuse_or_skip("ordinary_tools_work_through_the_mount") {
        return;
    }
    let c = TestCluster::start();
    let m = MountGuard::start(&c);

    // `cat` of a file written through the CLI.
    let cli = pattern(300_000, 1);
    c.put_bytes("/from-cli.bin", &cli, &[]);
    assert!(
        tool_ok("cat", &[&m.p("from-cli.bin")]) == cli,
        "cat through the mount differs from what the CLI wrote"
    );

    // `cp` 100 MiB in and `cmp` it back.
    let local = c.dir.path().join("big.bin");
    {
        let mut f = File::create(&local).expect("local file");
        for i in 0..100 {
            f.write_all(&pattern(MIB, 100 + i))
                .expect("write local file");
        }
    }
    let local_s = local.display().to_string();
    tool_ok("cp", &[&local_s, &m.p("big.bin")]);
    tool_ok("cmp", &[&local_s, &m.p("big.bin")]);
    wait_for("the copied file to be closed", || {
        file_state(&c, "/big.bin") == "closed"
    });
    assert_eq!(c.stat_json("/big.bin")["length"], (100 * MIB) as u64);

    // `ls -l` shows names and sizes.
    let ls = String::from_utf8(tool_ok("ls", &["-l", &m.p("")])).expect("utf8");
    let line = ls
        .lines()
        .find(|l| l.ends_with(" big.bin"))
        .unwrap_or_else(|| panic!("big.bin missing from ls -l:\n{ls}"));
    assert!(line.starts_with("-rw-r--r--"), "{line}");
    assert!(line.contains(&(100 * MIB).to_string()), "{line}");
    assert!(ls.contains(" from-cli.bin"), "{ls}");

    // `mkdir -p`.
    tool_ok("mkdir", &["-p", &m.p("a/b/c")]);
    let listed = String::from_utf8(c.ok(&["ls", "/a/b"])).expect("utf8");
    assert!(
        listed.contains("c/"),
        "the CLI sees the new directory: {listed}"
    );
    assert!(m.path("a/b/c").is_dir());

    // `mv` into a subdirectory.
    tool_ok("mv", &[&m.p("from-cli.bin"), &m.p("a/b/moved.bin")]);
    assert!(c.cat("/a/b/moved.bin") == cli, "moved file differs");
    assert!(!c.run(&["stat", "/from-cli.bin"]).status.success());
    assert!(!m.path("from-cli.bin").exists());

    // `mv` over an existing file replaces it, as rename(2) does.
    c.put_bytes("/a/b/old.bin", b"old", &[]);
    tool_ok("mv", &[&m.p("a/b/moved.bin"), &m.p("a/b/old.bin")]);
    assert!(
        c.cat("/a/b/old.bin") == cli,
        "rename did not replace its target"
    );

    // `rm` of a file, and of an empty directory.
    tool_ok("rm", &[&m.p("a/b/old.bin")]);
    assert!(!c.run(&["stat", "/a/b/old.bin"]).status.success());
    tool_ok("rmdir", &[&m.p("a/b/c")]);
    let listed = String::from_utf8(c.ok(&["ls", "/a/b"])).expect("utf8");
    assert!(listed.trim().is_empty(), "{listed}");
    let out = tool("rmdir", &[&m.p("a")]);
    assert!(!out.status.success(), "rmdir of a non-empty directory");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not empty"),
        "{out:?}"
    );

    // `dd conv=notrunc seek=...` into the first chunk of a two-chunk file (64 MiB
    // chunks): the writer moves to that chunk, and only those bytes change.
    let out = tool(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", m.p("big.bin")),
            "bs=4096",
            "count=1",
            "seek=10",
            "conv=notrunc",
        ],
    );
    assert!(
        out.status.success(),
        "a write into an earlier chunk: {out:?}"
    );
    let mut expect = std::fs::read(&local_s).expect("local copy");
    expect[10 * 4096..11 * 4096].fill(0);
    std::fs::write(&local_s, &expect).expect("local copy");
    tool_ok("cmp", &[&local_s, &m.p("big.bin")]);

    // ... while `dd` at the very end appends, and so does `>>`.
    let head = pattern(4096, 7);
    let tail = pattern(4096, 8);
    std::fs::write(c.dir.path().join("head"), &head).expect("head");
    std::fs::write(c.dir.path().join("tail"), &tail).expect("tail");
    tool_ok(
        "cp",
        &[
            &c.dir.path().join("head").display().to_string(),
            &m.p("log"),
        ],
    );
    tool_ok(
        "dd",
        &[
            &format!("if={}", c.dir.path().join("tail").display()),
            &format!("of={}", m.p("log")),
            "bs=4096",
            "seek=1",
            "conv=notrunc",
        ],
    );
    tool_ok("sh", &["-c", &format!("printf 'end' >> '{}'", m.p("log"))]);
    let mut want = head.clone();
    want.extend_from_slice(&tail);
    want.extend_from_slice(b"end");
    assert!(std::fs::read(m.path("log")).expect("read log") == want);
    assert!(c.cat("/log") == want);

    // In the last chunk (here the whole file), `dd conv=notrunc` writes in place, and
    // a reader through the mount sees it at once.
    tool_ok(
        "sh",
        &[
            "-c",
            &format!(
                "printf 'XYZ' | dd of='{}' bs=1 seek=4090 conv=notrunc",
                m.p("log")
            ),
        ],
    );
    want[4090..4093].copy_from_slice(b"XYZ");
    assert!(std::fs::read(m.path("log")).expect("read log") == want);
    assert!(c.cat("/log") == want);

    // `truncate -s` grows with zeros and shrinks; `O_TRUNC` empties a file of one
    // chunk, and one of two (its chunks dropped); `truncate -s` below the last chunk
    // of a bigger one drops the chunks past it and cuts the new last one.
    tool_ok("truncate", &["-s", "10000", &m.p("log")]);
    want.resize(10_000, 0);
    assert!(c.cat("/log") == want);
    tool_ok("truncate", &["-s", "100", &m.p("log")]);
    assert!(c.cat("/log") == want[..100]);
    assert_eq!(std::fs::metadata(m.path("log")).expect("stat").len(), 100);
    File::create(m.path("log")).expect("O_TRUNC of a one-chunk file");
    assert_eq!(c.stat_json("/log")["length"], 0);
    let cut = 3 * MIB + 17;
    tool_ok("truncate", &["-s", &cut.to_string(), &m.p("big.bin")]);
    assert_eq!(c.stat_json("/big.bin")["length"], cut as u64);
    let whole = std::fs::read(&local_s).expect("local copy");
    assert!(
        c.cat("/big.bin") == whole[..cut],
        "cut below its last chunk"
    );
    assert_eq!(
        c.stat_json("/big.bin")["chunks"].as_array().map(Vec::len),
        Some(1)
    );
    File::options()
        .write(true)
        .truncate(true)
        .open(m.path("big.bin"))
        .expect("O_TRUNC of a bigger file");
    assert_eq!(c.stat_json("/big.bin")["length"], 0);
    assert!(c.cat("/big.bin").is_empty());
    File::create(m.path("empty")).expect("create");
    File::create(m.path("empty")).expect("O_TRUNC of an empty file");
    assert_eq!(c.stat_json("/empty")["length"], 0);
}

#[test]
fn open_files_show_flushed_data_and_many_stay_open_at_once() {
    if !fuse_or_skip("open_files_show_flushed_data_and_many_stay_open_at_once") {
        return;
    }
    let c = TestCluster::start();
    let m = MountGuard::start(&c);
    tool_ok("mkdir", &[&m.p("many")]);
    let mut files = Vec::new();
    for i in 0..40 {
        let f = File::create(m.path(&format!("many/f{i}"))).expect("create");
        files.push(f);
    }
    for (i, f) in files.iter_mut().enumerate() {
        f.write_all(&pattern(10_000 + i, i as u64)).expect("write");
    }
    // fsync is hsync: the bytes are on every replica and any client reads them while
    // the file is still open.
    files[3].sync_all().expect("fsync");
    assert!(c.cat("/many/f3") == pattern(10_003, 3));
    assert_eq!(file_state(&c, "/many/f3"), "open");
    // Through the mount, the writer's size is what it wrote.
    assert_eq!(
        std::fs::metadata(m.path("many/f5")).expect("stat").len(),
        10_005
    );
    // A file that another client is writing shows its hflushed length.
    let mut put = c
        .cmd(&["put", "-", "/growing"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn put");
    let mut stdin = put.stdin.take().expect("stdin");
    let first = pattern(70_000, 50);
    stdin.write_all(&first).expect("feed put");
    stdin.flush().expect("flush");
    wait_for("the CLI writer's bytes to be acknowledged", || {
        c.run(&["cat", "/growing"]).stdout.len() == first.len()
    });
    wait_for("the mount to show the open file's flushed length", || {
        std::fs::metadata(m.path("growing")).is_ok_and(|md| md.len() == first.len() as u64)
    });
    let mut got = Vec::new();
    File::open(m.path("growing"))
        .expect("open growing")
        .read_to_end(&mut got)
        .expect("read growing");
    assert!(
        got == first,
        "a reader sees the flushed bytes of an open file"
    );
    drop(stdin);
    assert!(put.wait().expect("wait put").success());

    // Every file reads back through the mount while it is still open for writing (the
    // mount hflushes its own writers before such a read), many readers at once.
    let readers: Vec<File> = (0..40)
        .map(|i| File::open(m.path(&format!("many/f{i}"))).expect("open reader"))
        .collect();
    for (i, mut r) in readers.into_iter().enumerate() {
        let mut got = Vec::new();
        r.read_to_end(&mut got).expect("read an open file");
        assert!(got == pattern(10_000 + i, i as u64), "many/f{i} read back");
    }
    drop(files);
    for i in 0..40 {
        let remote = format!("/many/f{i}");
        wait_for("files to be closed", || file_state(&c, &remote) == "closed");
        assert!(c.cat(&remote) == pattern(10_000 + i, i as u64), "{remote}");
    }
    let f = File::open(m.path("many/f39")).expect("open");
    let mut buf = vec![0u8; 100];
    f.read_exact_at(&mut buf, 9_000).expect("pread");
    assert!(buf[..] == pattern(10_039, 39)[9_000..9_100]);

    // A read stuck on frozen chunkservers does not hold up `ls -l` (the namespace
    // comes from the master, and requests are served concurrently).
    let slow = pattern(3 * MIB, 77);
    c.put_bytes("/slow.bin", &slow, &[]);
    for cs in &c.chunkservers {
        cs.stop();
    }
    let p = m.path("slow.bin");
    let reader = std::thread::spawn(move || std::fs::read(p));
    std::thread::sleep(Duration::from_millis(300));
    let ls = tool("timeout", &["20", "ls", "-l", &m.p("")]);
    for cs in &c.chunkservers {
        cs.cont();
    }
    assert!(ls.status.success(), "ls during a stuck read: {ls:?}");
    assert!(String::from_utf8_lossy(&ls.stdout).contains(" slow.bin"));
    let got = reader
        .join()
        .expect("reader thread")
        .expect("read slow.bin");
    assert!(got == slow, "the slow read completes correctly");
}

#[test]
fn sigterm_and_umount_unmount_cleanly_and_close_open_files() {
    if !fuse_or_skip("sigterm_and_umount_unmount_cleanly_and_close_open_files") {
        return;
    }
    let c = TestCluster::start();
    let mut m = MountGuard::start(&c);
    // A file left open across SIGTERM: the mount is busy, so it is detached lazily,
    // and the writer is closed with every byte it accepted.
    let data = pattern(2 * MIB + 99, 5);
    let mut f = File::create(m.path("open.bin")).expect("create");
    f.write_all(&data).expect("write");
    let status = m.stop_with(Signal::SIGTERM);
    assert!(status.success(), "SIGTERM exit: {status}\n{}", m.log_text());
    assert!(!is_fuse_mount(&m.root), "still mounted after SIGTERM");
    drop(f);
    assert_eq!(file_state(&c, "/open.bin"), "closed");
    assert!(
        c.cat("/open.bin") == data,
        "the open file was not closed whole"
    );

    // `umount` from outside ends the server, cleanly.
    let mut m = MountGuard::start(&c);
    assert!(std::fs::read_dir(m.path("")).expect("readdir").count() == 1);
    let out = tool("umount", &[&m.p("")]);
    assert!(out.status.success(), "umount: {out:?}");
    let status = m.wait();
    assert!(
        status.success(),
        "exit after umount: {status}\n{}",
        m.log_text()
    );

    // Without --foreground the command returns once the mount is ready, leaving a
    // server in the background; `umount` ends that server too.
    let dir = tempfile::Builder::new()
        .prefix("stampfs-mnt-")
        .tempdir()
        .expect("tempdir");
    let root = dir.path().join("mnt");
    std::fs::create_dir(&root).expect("mount point");
    let root = root.canonicalize().expect("canonical");
    // The command's own stderr (a file: a pipe would do too, now that the server
    // detaches from it once ready); the server logs to --log-file in the temp dir.
    let bg_log = dir.path().join("background.log");
    let server_log = dir.path().join("server.log");
    let out = c
        .cmd(&[
            "mount",
            root.to_str().expect("utf8"),
            "--log-file",
            server_log.to_str().expect("utf8"),
        ])
        .stdin(Stdio::null())
        .stderr(File::create(&bg_log).expect("log file"))
        .output()
        .expect("run stampfs mount");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        std::fs::read_to_string(&bg_log).unwrap_or_default()
    );
    let mut bg = BackgroundServer {
        root: root.clone(),
        pid: None,
    };
    assert!(out.status.success(), "background mount: {text}");
    assert!(
        is_fuse_mount(&root),
        "mounted when the command returns: {text}"
    );
    let pid: i32 = text
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {text:?}"));
    bg.pid = Some(pid);
    assert!(std::fs::read_dir(&root).expect("readdir").count() == 1);
    assert!(tool("umount", &[root.to_str().expect("utf8")])
        .status
        .success());
    wait_for("the background server to exit after umount", || {
        // Gone, or a zombie waiting for whoever adopted it.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    });

    // SIGINT works the same way on an idle mount.
    let mut m = MountGuard::start(&c);
    let status = m.stop_with(Signal::SIGINT);
    assert!(status.success(), "SIGINT exit: {status}\n{}", m.log_text());
    assert!(!is_fuse_mount(&m.root));
}

#[test]
fn a_killed_mount_leaves_a_file_that_recover_closes() {
    if !fuse_or_skip("a_killed_mount_leaves_a_file_that_recover_closes") {
        return;
    }
    let c = TestCluster::with(Opts {
        master_args: vec![
            "--lease-soft".into(),
            "1s".into(),
            "--lease-hard".into(),
            "60s".into(),
        ],
        ..Opts::default()
    });
    let mut m = MountGuard::start(&c);
    let data = pattern(3 * MIB + 12_345, 9);
    let synced = 2 * MIB;
    let mut f = File::create(m.path("crash.bin")).expect("create");
    f.write_all(&data[..synced]).expect("write");
    f.sync_all().expect("fsync: acknowledged by every replica");
    f.write_all(&data[synced..]).expect("write more");
    // The mount process dies in the middle of the writer's life.
    let pid = m.pid();
    kill(pid, Signal::SIGKILL).expect("SIGKILL the mount");
    m.wait();
    assert!(
        f.write_all(b"more").is_err(),
        "a write through a dead mount must fail"
    );
    drop(f);
    m.lazy_umount();
    assert_eq!(file_state(&c, "/crash.bin"), "open");

    // Lease recovery closes it (after the soft limit, on request).
    let deadline = Instant::now() + Duration::from_secs(30);
    let closed_at = loop {
        let out = c.run(&["recover", "/crash.bin"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            if let Some(n) = text
                .split("closed at ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<usize>().ok())
            {
                break n;
            }
        }
        assert!(
            Instant::now() < deadline,
            "recover did not close the file within 30 s: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(file_state(&c, "/crash.bin"), "closed");
    let got = c.cat("/crash.bin");
    assert_eq!(got.len(), closed_at, "cat length vs recover's report");
    assert!(
        got.len() >= synced,
        "recovery cut acknowledged (fsynced) bytes: {} < {synced}",
        got.len()
    );
    assert!(
        data.starts_with(&got),
        "the recovered file is not a prefix of what was written"
    );
}

/// `df -B1 --output=size,used,avail` of the mount, in bytes.
fn df(m: &MountGuard) -> (u64, u64, u64) {
    // `timeout`: a statfs that hung on the master would otherwise hang the test.
    let out = tool_ok(
        "timeout",
        &["20", "df", "-B1", "--output=size,used,avail", &m.p("")],
    );
    let text = String::from_utf8(out).expect("utf8");
    let numbers: Vec<u64> = text
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no values in df output:\n{text}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap_or_else(|_| panic!("df: {n:?} in\n{text}")))
        .collect();
    assert_eq!(numbers.len(), 3, "df output:\n{text}");
    (numbers[0], numbers[1], numbers[2])
}

#[test]
fn df_shows_the_clusters_raw_capacity_and_it_fills_up() {
    if !fuse_or_skip("df_shows_the_clusters_raw_capacity_and_it_fills_up") {
        return;
    }
    // With --capacity each chunkserver reports exactly that much, and its replica
    // bytes as used: the numbers do not move with whatever else is on this disk.
    const CAPACITY: u64 = 1 << 30;
    let c = TestCluster::with(Opts {
        chunkserver_args: vec![
            "--heartbeat".into(),
            "200ms".into(),
            "--capacity".into(),
            "1GiB".into(),
        ],
        ..Opts::default()
    });
    let m = MountGuard::start(&c);

    let (size, used, avail) = df(&m);
    assert_eq!(size, 3 * CAPACITY, "raw capacity of three chunkservers");
    assert!(used <= size, "used {used} > size {size}");
    assert_eq!(used + avail, size, "free = total - used");

    // 4 MiB written through the mount lands on `replication` chunkservers; once the
    // heartbeats and the mount's 2 s cache have caught up, df shows it used.
    let data = pattern(4 * MIB, 21);
    std::fs::write(m.path("space.bin"), &data).expect("write through the mount");
    wait_for("the written file to be closed", || {
        file_state(&c, "/space.bin") == "closed"
    });
    let replication = c.stat_json("/space.bin")["replication"]
        .as_u64()
        .expect("replication");
    let want = replication * (4 * MIB) as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (size, used, avail);
    while last.1 < want {
        assert!(
            Instant::now() < deadline,
            "df never showed the {want} bytes of replicas as used; last (size, used, \
             avail): {last:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
        last = df(&m);
    }
    let (size2, used2, avail2) = last;
    assert!(used2 > used, "used did not grow: {used} -> {used2}");
    assert_eq!(size2, size);
    assert!(used2 <= size2);
    assert_eq!(used2 + avail2, size2);
}

/// `df` must answer while the master is frozen: the root's getattr falls back to its
/// last known attributes and `statfs` to the last known capacity, each after about a
/// second, instead of waiting for the client's 30 s request timeout.
#[test]
fn df_answers_while_the_master_is_frozen() {
    if !fuse_or_skip("df_answers_while_the_master_is_frozen") {
        return;
    }
    let c = TestCluster::with(Opts {
        chunkserver_args: vec!["--capacity".into(), "1GiB".into()],
        ..Opts::default()
    });
    let m = MountGuard::start(&c);
    let (size, _, _) = df(&m);
    assert_eq!(size, 3 << 30);
    // Let the statfs cache expire, so the frozen master is really asked.
    std::thread::sleep(Duration::from_secs(3));
    c.master.stop();
    let out = Command::new("timeout")
        .args(["20", "df", "-B1", "--output=size", &m.p("")])
        .output()
        .expect("run df");
    c.master.cont();
    assert!(
        out.status.success(),
        "df on the mount failed or hung while the master was frozen: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("a size line");
    assert_eq!(shown, 3 << 30, "the last known capacity");
}
