//! The server commands as a person runs them: `stampfs dev`, and clean SIGTERM/SIGINT
//! shutdowns of `stampfs master` and `stampfs chunkserver`.

mod common;

use common::{Opts, TestCluster, BIN};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn dev_runs_a_cluster_that_file_commands_can_use_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut dev = Command::new(BIN)
        .args(["dev", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dev");
    let stdout = dev.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut master = None;
    for line in lines.by_ref() {
        let line = line.expect("line");
        if let Some(rest) = line.trim().strip_prefix("master") {
            master = Some(rest.trim().to_string());
        }
        if line.contains("Ctrl-C") {
            break;
        }
    }
    let master = master.expect("dev prints the master address");
    // dev's master wrote its superuser's credentials at its first start: the file
    // commands present them.
    let creds = common::wait_credentials_file(&dir.path().join("master").join("admin.credentials"));
    let put = Command::new(BIN)
        .args(["put", "-", "/hello", "--master", &master])
        .env(common::CREDENTIALS_ENV, &creds)
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(b"hello dev")?;
            c.wait()
        })
        .expect("put");
    assert!(put.success());
    let out = Command::new(BIN)
        .args(["cat", "/hello", "--master", &master, "--credentials"])
        .arg(&creds)
        .output()
        .expect("cat");
    assert_eq!(out.stdout, b"hello dev");
    kill(Pid::from_raw(dev.id() as i32), Signal::SIGINT).expect("SIGINT");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = dev.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "dev did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "dev exits 0 on Ctrl-C: {status}");
    assert!(dir.path().join("master").join("cluster.key").exists());
}

#[test]
fn servers_stop_cleanly_on_sigterm_and_restart_with_their_data() {
    let mut c = TestCluster::start();
    c.put_bytes("/kept", b"still here", &[]);
    for cs in &mut c.chunkservers {
        assert!(cs.terminate(), "chunkserver exits 0 on SIGTERM");
    }
    assert!(c.master.terminate(), "master exits 0 on SIGTERM");
    c.master.restart();
    for cs in &mut c.chunkservers {
        cs.restart();
    }
    c.wait_live(3);
    assert_eq!(c.cat("/kept"), b"still here");
}

#[test]
fn a_chunkserver_without_a_readable_key_refuses_to_start_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["chunkserver", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir.path())
        .arg("--cluster-key-file")
        .arg(dir.path().join("missing.key"))
        .output()
        .expect("run chunkserver");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.key"), "{err}");
}

#[test]
fn a_second_master_on_a_directory_in_use_refuses_to_start_and_names_the_holder() {
    let mut c = TestCluster::with(Opts {
        chunkservers: 0,
        ..Opts::default()
    });
    let mdir = c.master.dir.clone();
    let addr_before = std::fs::read_to_string(mdir.join("addr")).expect("addr file");
    c.ok(&["mkdir", "/before"]);

    let out = Command::new(BIN)
        .args(["master", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&mdir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run a second master");
    assert_eq!(out.status.code(), Some(1), "the second master must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&mdir.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("pid {}", c.master.pid())),
        "the error names the running master: {err}"
    );

    // The first master lost nothing: its address file and its service.
    assert_eq!(
        std::fs::read_to_string(mdir.join("addr")).expect("addr file"),
        addr_before
    );
    c.ok(&["mkdir", "/after"]);

    // A SIGKILLed master leaves no lock behind: the restart takes the directory over.
    c.master.kill();
    c.master.restart();
    c.ok(&["stat", "/before"]);
    c.ok(&["stat", "/after"]);
}

#[test]
fn a_second_chunkserver_on_a_directory_in_use_refuses_to_start_and_names_the_holder() {
    let mut c = TestCluster::with(Opts {
        chunkservers: 1,
        ..Opts::default()
    });
    let cdir = c.chunkservers[0].dir.clone();
    let addr_before = std::fs::read_to_string(cdir.join("addr")).expect("addr file");
    let id_before = std::fs::read_to_string(cdir.join("chunkserver.id")).expect("id file");
    c.put_bytes("/before", b"written before", &["--replication", "1"]);

    let mut second = Command::new(BIN)
        .args(["chunkserver", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&cdir)
        .args(["--master", &c.master.addr, "--cluster-key-file"])
        .arg(c.key_file())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a second chunkserver");
    // It must exit by itself; one that starts serving is killed and the test fails.
    let deadline = Instant::now() + Duration::from_secs(15);
    while second.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second chunkserver started on a directory in use");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = second
        .wait_with_output()
        .expect("second chunkserver output");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the second chunkserver must fail"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "chunkserver directory {} is in use by another chunkserver (pid {})",
            cdir.display(),
            c.chunkservers[0].pid()
        )),
        "the error names the directory and the running chunkserver: {err}"
    );

    // The first chunkserver lost nothing: its address and id files and its service.
    assert_eq!(
        std::fs::read_to_string(cdir.join("addr")).expect("addr file"),
        addr_before
    );
    assert_eq!(
        std::fs::read_to_string(cdir.join("chunkserver.id")).expect("id file"),
        id_before
    );
    assert_eq!(c.cat("/before"), b"written before");
    c.put_bytes("/after", b"written after", &["--replication", "1"]);

    // A SIGKILLed chunkserver leaves no lock behind: the restart takes the directory
    // over and serves both files.
    c.chunkservers[0].kill();
    c.chunkservers[0].restart();
    c.wait_live(1);
    let deadline = Instant::now() + Duration::from_secs(15);
    for (path, want) in [
        ("/before", &b"written before"[..]),
        ("/after", &b"written after"[..]),
    ] {
        loop {
            let out = c.run(&["cat", path]);
            if out.status.success() {
                assert_eq!(out.stdout, want, "{path}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cat {path} after the restart: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
