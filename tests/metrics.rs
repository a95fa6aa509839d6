//! `--metrics-listen`: a master and three chunkservers serving Prometheus metrics over
//! HTTP. After a put, the master counts the requests by operation (with latency
//! histograms), its chunks and log records, and says it leads; each chunkserver counts
//! its requests and replicas and names its I/O engine. A writer fenced by a lease
//! recovery shows as a fenced refusal on the chunkservers. The master's status page at
//! `/` lists the chunkservers and the files open for writing, and loads in headless
//! Chromium (its DOM checked, a phone-sized screenshot taken). With
//! `--metrics-token-file`, master and chunkservers answer only requests that present
//! the token.

mod common;

use common::{Opts, TestCluster};
use std::io::{Read, Write};
use std::path::Path;
use tokio::io::AsyncWriteExt;

/// `GET /metrics` from the server whose directory is `dir`: its exposition.
fn scrape(dir: &Path) -> String {
    // Written before the server says it listens, which the cluster waited for.
    let addr = std::fs::read_to_string(dir.join("metrics-addr")).expect("DIR/metrics-addr");
    let mut s = std::net::TcpStream::connect(addr.trim()).expect("connect to the metrics port");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// `GET PATH` with the extra header lines `headers` from the server whose directory
/// is `dir`: the whole answer.
fn get(dir: &Path, path: &str, headers: &str) -> String {
    let addr = std::fs::read_to_string(dir.join("metrics-addr")).expect("DIR/metrics-addr");
    let mut s = std::net::TcpStream::connect(addr.trim()).expect("connect to the metrics port");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n").as_bytes(),
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn with_a_token_file_the_metrics_ports_answer_only_who_presents_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("metrics.token");
    std::fs::write(&token_file, "the-operators-scrape-token\n").expect("token file");
    let args = |more: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--metrics-listen", "127.0.0.1:0", "--metrics-token-file"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(token_file.display().to_string());
        v.extend(more.iter().map(|s| s.to_string()));
        v
    };
    let c = TestCluster::with(Opts {
        master_args: args(&[]),
        chunkserver_args: args(&["--heartbeat", "200ms"]),
        ..Opts::default()
    });
    let bearer = "Authorization: Bearer the-operators-scrape-token\r\n";
    // base64("prometheus:the-operators-scrape-token")
    let basic = "Authorization: Basic cHJvbWV0aGV1czp0aGUtb3BlcmF0b3JzLXNjcmFwZS10b2tlbg==\r\n";
    let servers = std::iter::once(&c.master).chain(c.chunkservers.iter());
    for p in servers {
        for path in ["/metrics", "/"] {
            let refused = get(&p.dir, path, "");
            assert!(refused.starts_with("HTTP/1.1 401"), "{path}: {refused}");
            assert!(!refused.contains("stampfs_"), "{path}: {refused}");
            let wrong = get(
                &p.dir,
                path,
                "Authorization: Bearer not-the-token-at-all\r\n",
            );
            assert!(wrong.starts_with("HTTP/1.1 401"), "{path}: {wrong}");
        }
        let ok = get(&p.dir, "/metrics", bearer);
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.contains("# EOF"),
            "{ok}"
        );
        assert!(get(&p.dir, "/", basic).starts_with("HTTP/1.1 200"));
    }
    let page = get(&c.master.dir, "/", basic);
    assert!(page.contains("stampfs master"), "{page}");
}

/// The value of the sample named exactly `name` (with its labels), if any.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn masters_and_chunkservers_serve_metrics_and_count_fenced_writes() {
    let metrics = ["--metrics-listen".to_string(), "127.0.0.1:0".to_string()];
    let c = TestCluster::with(Opts {
        master_args: metrics.to_vec(),
        chunkserver_args: ["--heartbeat".to_string(), "200ms".to_string()]
            .into_iter()
            .chain(metrics.iter().cloned())
            .collect(),
        ..Opts::default()
    });
    c.put_bytes("/m", &common::pattern(300_000, 1), &[]);

    let m = scrape(&c.master.dir);
    for (name, at_least) in [
        ("stampfs_master_requests_total{op=\"create\"}", 1.0),
        ("stampfs_master_requests_total{op=\"add_chunk\"}", 1.0),
        ("stampfs_master_request_seconds_count{op=\"create\"}", 1.0),
        ("stampfs_master_chunks", 1.0),
        ("stampfs_master_chunkservers_live", 3.0),
        ("stampfs_master_leading", 1.0),
        ("stampfs_master_log_records_total", 1.0),
        ("stampfs_master_log_sync_seconds_count", 1.0),
        ("stampfs_master_log_batch_records_count", 1.0),
        ("stampfs_master_log_batch_records_sum", 1.0),
    ] {
        let v = sample(&m, name).unwrap_or_else(|| panic!("no {name} in:\n{m}"));
        assert!(v >= at_least, "{name} = {v}, want at least {at_least}");
    }
    // Safe mode ends at the first pass of a fresh master (no chunks then); nothing is
    // being decommissioned.
    assert_eq!(
        sample(&m, "stampfs_master_chunkservers_decommissioning"),
        Some(0.0)
    );
    assert!(sample(&m, "stampfs_master_safe_mode").is_some(), "{m}");

    let mut streams = 0.0;
    for cs in &c.chunkservers {
        let t = scrape(&cs.dir);
        streams +=
            sample(&t, "stampfs_chunkserver_requests_total{op=\"write_setup\"}").unwrap_or(0.0);
        assert_eq!(
            sample(
                &t,
                "stampfs_chunkserver_request_seconds_count{op=\"write_setup\"}"
            ),
            None,
            "a stream is counted, not timed: {t}"
        );
        assert!(
            sample(&t, "stampfs_chunkserver_replicas").unwrap_or(0.0) >= 1.0,
            "{t}"
        );
        assert!(t.contains("stampfs_chunkserver_io_engine{engine="), "{t}");
        assert_eq!(
            sample(&t, "stampfs_chunkserver_fenced_total"),
            Some(0.0),
            "{t}"
        );
        assert!(
            sample(&t, "stampfs_chunkserver_bytes_written_total").unwrap_or(0.0) >= 300_000.0,
            "every replica took the file's bytes: {t}"
        );
        assert!(
            sample(&t, "stampfs_chunkserver_pipeline_ack_seconds_count").unwrap_or(0.0) >= 1.0,
            "every replica acked packets: {t}"
        );
        assert!(t.contains("stampfs_chunkserver_scrub_bytes_total"), "{t}");
        assert!(
            sample(&t, "stampfs_chunkserver_io_in_flight").is_some_and(|v| v >= 0.0),
            "{t}"
        );
        assert!(
            sample(&t, "stampfs_chunkserver_io_waiting").is_some(),
            "{t}"
        );
    }
    assert!(streams >= 1.0, "no write stream counted");

    // A writer whose lease is recovered under it is fenced by the chunkservers.
    let rt = common::runtime();
    rt.block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let mut w = common::hflushed_writer(&client, "/f", &common::pattern(1000, 2)).await;
        let out = c.run(&["recover", "/f"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        w.write_all(&common::pattern(1000, 3))
            .await
            .expect("buffered");
        let e = w
            .hflush()
            .await
            .expect_err("the recovered writer is fenced");
        assert!(e.is_fenced(), "{e}");
    });
    let fenced: f64 = c
        .chunkservers
        .iter()
        .map(|cs| sample(&scrape(&cs.dir), "stampfs_chunkserver_fenced_total").unwrap_or(0.0))
        .sum();
    assert!(fenced >= 1.0, "no fenced refusal counted");
    let m = scrape(&c.master.dir);
    assert!(
        sample(&m, "stampfs_master_lease_recoveries_total").unwrap_or(0.0) >= 1.0,
        "the recovery is counted: {m}"
    );
    // The status page lists it.
    let html = page(&c.master.dir);
    let listed = html
        .split("id=\"recoveries\"")
        .nth(1)
        .is_some_and(|t| t.contains("<td>/f</td>"));
    assert!(listed, "{html}");
}

/// `GET /` from the master whose directory is `dir`: the status page's HTML.
fn page(dir: &Path) -> String {
    let addr = std::fs::read_to_string(dir.join("metrics-addr")).expect("DIR/metrics-addr");
    let mut s = std::net::TcpStream::connect(addr.trim()).expect("connect to the metrics port");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("text/html"), "{out}");
    out
}

/// The Chromium binary, if installed (CI installs it).
fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|b| {
        std::process::Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_master_status_page_shows_the_cluster_in_a_real_browser() {
    let metrics = ["--metrics-listen".to_string(), "127.0.0.1:0".to_string()];
    let c = TestCluster::with(Opts {
        master_args: metrics.to_vec(),
        ..Opts::default()
    });
    c.put_bytes("/done", &common::pattern(100_000, 4), &[]);
    c.ok(&["mkdir", "/home"]);
    c.ok(&["admin", "quota", "set", "/home", "--names", "2"]);
    c.ok(&["touchz", "/home/x"]);
    let rt = common::runtime();
    // A file open for writing, and a path that needs escaping.
    let (_client, _w) = rt.block_on(async {
        let client = common::connect(&c.master.addr).await.expect("connect");
        let w = common::hflushed_writer(&client, "/open <&> file", &common::pattern(500, 5)).await;
        (client, w)
    });
    let html = page(&c.master.dir);
    for cs in &c.chunkservers {
        assert!(html.contains(&format!("<td>{}</td>", cs.addr)), "{html}");
    }
    assert!(html.contains("<td>/open &lt;&amp;&gt; file</td>"), "{html}");
    assert!(html.contains("Chunkservers live</th><td>3 of 3"), "{html}");
    assert!(
        html.contains("<tr><td>/home</td><td class=\"bad\">2 of 2</td><td>no limit</td></tr>"),
        "a full quota stands out: {html}"
    );

    let Some(browser) = chromium() else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI must load the page in Chromium (.ci/run installs it)"
        );
        eprintln!("SKIPPED the browser half: no chromium");
        return;
    };
    let addr = std::fs::read_to_string(c.master.dir.join("metrics-addr")).expect("addr");
    let url = format!("http://{}/", addr.trim());
    let profile = c.dir.path().join("chromium-profile");
    let headless = |extra: &[&str]| {
        let out = std::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(&url)
            .output()
            .expect("run chromium");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The DOM as the browser built it: the tables are there, with their rows.
    let dom = headless(&["--dump-dom"]);
    for id in ["summary", "chunkservers", "open-files", "quotas"] {
        assert!(dom.contains(&format!("id=\"{id}\"")), "no #{id} in:\n{dom}");
    }
    assert!(dom.contains("/open &lt;&amp;&gt; file"), "{dom}");
    assert_eq!(dom.matches("<td>live</td>").count(), 3, "{dom}");
    // A phone-sized screenshot, kept with the test's files.
    let shot = c.dir.path().join("status-page.png");
    headless(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=390,844",
        "--hide-scrollbars",
    ]);
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.len() > 1000 && png.starts_with(b"\x89PNG"),
        "{} bytes",
        png.len()
    );
    // Kept where STAMPFS_SCREENSHOT_DIR says (the test's own directory goes with it).
    let kept = match std::env::var_os("STAMPFS_SCREENSHOT_DIR") {
        Some(d) => {
            let to = Path::new(&d).join("status-page.png");
            std::fs::copy(&shot, &to).expect("keep the screenshot");
            to
        }
        None => shot,
    };
    eprintln!(
        "status page screenshot: {} ({} bytes)",
        kept.display(),
        png.len()
    );
}
