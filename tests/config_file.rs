//! `stampfs master` and `stampfs chunkserver` started from TOML config files
//! (`--config FILE`, src/config_file.rs): a cluster comes up from files, a flag and an
//! environment variable override the file, `--log-format json --log-file F` (from flags
//! or from the file) writes JSON lines to F, and an unknown key or a bad value stops a
//! server before it starts, with a message naming the key and the file.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_stampfs");

/// A `stampfs` command without the caller's `STAMPFS_*` variables (a developer's
/// `STAMPFS_MASTER` would override the chunkserver's file), but for the suite's
/// `STAMPFS_MASTER_LOG`.
fn stampfs() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if name.starts_with("STAMPFS_") && name != "STAMPFS_MASTER_LOG" {
            c.env_remove(&k);
        }
    }
    c.env("RUST_LOG", "info").stdin(Stdio::null());
    c
}

/// A server process, killed and reaped on drop.
struct Server {
    name: &'static str,
    child: Option<Child>,
    /// Its stdout and stderr.
    output: PathBuf,
}

impl Server {
    fn start(name: &'static str, mut command: Command, output: PathBuf) -> Server {
        let out = std::fs::File::create(&output).expect("create the output file");
        let child = command
            .stdout(out.try_clone().expect("clone"))
            .stderr(out)
            .spawn()
            .expect("spawn stampfs");
        Server {
            name,
            child: Some(child),
            output,
        }
    }

    /// Waits (at most 30 s) for `file` to exist and hold a line; returns it.
    fn wait_file(&mut self, file: &Path) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(file) {
                if !s.trim().is_empty() {
                    return s.trim().to_string();
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "{} exited with {status} before writing {}:\n{}",
                    self.name,
                    file.display(),
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not write {} within 30 s:\n{}",
                self.name,
                file.display(),
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    /// SIGTERM; whether it exited with status 0 within 15 s.
    fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).expect("write a config file");
    path.to_path_buf()
}

/// The JSON objects of a log file; panics on a line that is not one.
fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("read the log file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line in {}: {e}: {l}", path.display()));
            assert!(
                v.get("timestamp").is_some() && v.get("level").is_some(),
                "a log line without timestamp and level: {l}"
            );
            v
        })
        .collect()
}

fn messages(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|v| v.pointer("/fields/message")?.as_str().map(String::from))
        .collect()
}

#[test]
fn a_cluster_starts_from_config_files_and_flags_and_the_environment_override_them() {
    let tmp = tempfile::Builder::new()
        .prefix("stampfs-config-")
        .tempdir()
        .expect("tempdir");
    let t = tmp.path();
    let mdir = t.join("master");
    let master_log = t.join("master.log");
    std::fs::write(
        &master_log,
        "{\"timestamp\":\"2026-01-01T00:00:00Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"an earlier run\"}}\n",
    )
    .expect("write the log file");
    // The file says text logs in a directory the flags replace.
    let master_toml = write(
        &t.join("master.toml"),
        &format!(
            "dir = \"{}\"\nlisten = \"127.0.0.1:0\"\nreplication = 1\ndead-after = \"2s\"\nlog-format = \"text\"\n",
            t.join("master-from-file").display()
        ),
    );
    let mut cmd = stampfs();
    cmd.arg("master")
        .arg("--config")
        .arg(&master_toml)
        .arg("--dir")
        .arg(&mdir)
        .args(["--log-format", "json", "--log-file"])
        .arg(&master_log);
    let mut master = Server::start("master", cmd, t.join("master.out"));
    let addr = master.wait_file(&mdir.join("addr"));
    assert!(
        !t.join("master-from-file").exists(),
        "--dir overrides the file's `dir`"
    );

    // The chunkserver: everything from its file but the directory, which the
    // environment overrides; JSON logs to a file, also from the file.
    let cdir = t.join("cs");
    let cs_log = t.join("chunkserver.log");
    let cs_toml = write(
        &t.join("chunkserver.toml"),
        &format!(
            "dir = \"{}\"\nlisten = \"127.0.0.1:0\"\nmaster = \"{addr}\"\ncluster_key_file = \"{}\"\n\
             heartbeat = \"200ms\"\nio-engine = \"threads\"\nlog-format = \"json\"\nlog-file = \"{}\"\n",
            t.join("cs-from-file").display(),
            mdir.join("cluster.key").display(),
            cs_log.display()
        ),
    );
    let mut cmd = stampfs();
    cmd.arg("chunkserver")
        .arg("--config")
        .arg(&cs_toml)
        .env("STAMPFS_CHUNKSERVER_DIR", &cdir);
    let mut cs = Server::start("chunkserver", cmd, t.join("chunkserver.out"));
    let cs_addr = cs.wait_file(&cdir.join("addr"));
    cs.wait_file(&cdir.join("chunkserver.id"));
    assert!(
        !t.join("cs-from-file").exists(),
        "STAMPFS_CHUNKSERVER_DIR overrides the file's `dir`"
    );

    // The master sees it, as an operator would check.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out: Output = stampfs()
            .args(["admin", "report", "--master", &addr, "--credentials"])
            .arg(mdir.join("admin.credentials"))
            .output()
            .expect("run stampfs admin report");
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && text.contains(&cs_addr) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "admin report never listed {cs_addr}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    assert!(master.terminate(), "master: SIGTERM ends it with status 0");
    assert!(cs.terminate(), "chunkserver: SIGTERM ends it with status 0");

    // --log-format json --log-file F: JSON lines in F, none on stderr.
    let lines = json_lines(&master_log);
    assert!(!lines.is_empty(), "the master logged nothing to its file");
    assert!(
        lines.iter().any(|l| l["level"] == "INFO"),
        "no INFO line: {lines:?}"
    );
    assert!(
        !master.output().contains(" INFO "),
        "the master's log went to stderr too:\n{}",
        master.output()
    );
    let cs_messages = messages(&json_lines(&cs_log));
    assert!(
        cs_messages.iter().any(|m| m.contains("registered")),
        "the chunkserver's JSON log (from its config file) does not say it registered: {cs_messages:?}"
    );
    assert_eq!(
        messages(&lines).first().map(String::as_str),
        Some("an earlier run"),
        "the log file is appended to"
    );
}

#[test]
fn a_bad_config_file_stops_the_server_naming_the_key() {
    let tmp = tempfile::Builder::new()
        .prefix("stampfs-config-")
        .tempdir()
        .expect("tempdir");
    let t = tmp.path();
    let dir = t.join("never");
    for (server, bad, key, says) in [
        (
            "chunkserver",
            "heartbeet = \"1s\"",
            "heartbeet",
            "did you mean `heartbeat`",
        ),
        (
            "master",
            "replication = \"three\"",
            "replication",
            "invalid digit",
        ),
        ("master", "join = \"yes\"", "join", "true or false"),
    ] {
        let file = write(
            &t.join(format!("{server}.toml")),
            &format!(
                "dir = \"{}\"\ncluster-key-file = \"{}\"\n{bad}\n",
                dir.display(),
                t.join("k").display()
            ),
        );
        let out = stampfs()
            .arg(server)
            .arg("--config")
            .arg(&file)
            .output()
            .expect("run stampfs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{server} with `{bad}`: {stderr}"
        );
        assert!(stderr.contains(&format!("`{key}")), "{stderr}");
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(!dir.exists(), "{server} started with a bad config file");
    }
}
