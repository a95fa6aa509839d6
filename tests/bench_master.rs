//! `stampfs bench master` at a tiny size, so it cannot rot: every operation measured
//! with successful calls, the memory figures present. No timing assertions.

use std::process::Command;

const OPERATIONS: &[&str] = &[
    "register",
    "mkdirs",
    "create+close",
    "add chunk",
    "append",
    "close (chunks)",
    "stat",
    "open",
    "list",
    "rename",
    "delete",
    "heartbeat",
    "report",
    "report (dense, new)",
    "report (dense, known)",
];

fn run(via: &str) -> serde_json::Value {
    run_with(via, "1")
}

fn run_with(via: &str, masters: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_stampfs"))
        .args([
            "bench",
            "master",
            "--files",
            "300",
            "--chunks-per-file",
            "2",
        ])
        .args(["--chunkservers", "20", "--threads", "8", "--ops", "300"])
        .args(["--report-replicas", "200", "--files-per-dir", "50"])
        .args(["--via", via, "--masters", masters, "--dir"])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run stampfs bench master");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in OPERATIONS {
        assert!(
            stdout.contains(name),
            "{name} missing from the table:\n{stdout}"
        );
    }
    let text = std::fs::read_to_string(&json).expect("read the JSON");
    let report: serde_json::Value = serde_json::from_str(&text).expect("parse the JSON");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .flatten()
        .filter(|e| e.file_name() != "bench.json")
        .collect();
    assert!(leftovers.is_empty(), "the master's directory is removed");
    report
}

fn check(report: &serde_json::Value) {
    let ops = report["operations"].as_array().expect("operations");
    for name in OPERATIONS {
        let op = ops
            .iter()
            .find(|o| o["name"] == *name)
            .unwrap_or_else(|| panic!("{name} missing: {report:#}"));
        assert!(op["count"].as_u64().expect("count") > 0, "{name}: {op:#}");
        assert_eq!(op["errors"].as_u64(), Some(0), "{name}: {op:#}");
        for field in ["ops_per_s", "p50_us", "p99_us", "max_us"] {
            assert!(op[field].is_number(), "{name}.{field}: {op:#}");
        }
    }
    let m = &report["memory"];
    assert_eq!(m["chunks"].as_u64(), Some(600), "{m:#}");
    assert_eq!(m["files"].as_u64(), Some(300), "{m:#}");
    for field in [
        "heap_per_file",
        "rss_per_file",
        "heap_per_chunk",
        "rss_per_chunk",
    ] {
        assert!(m[field].is_number(), "memory.{field}: {m:#}");
    }
    assert!(m["replicas_per_chunk"].as_f64().expect("replicas") > 0.0);
    let big = &report["big_report"];
    assert!(
        big["replicas"].as_u64().expect("dense replicas") >= 200,
        "{big:#}"
    );
    let stalls = report["stalls"].as_array().expect("stalls");
    assert_eq!(
        stalls.len(),
        4,
        "checkpoint, health pass, two dense reports"
    );
    assert!(stalls.iter().all(|s| s["requests"].as_u64() > Some(0)));
}

#[test]
fn the_master_benchmark_measures_every_operation_through_the_service_layer() {
    check(&run("service"));
}

#[test]
fn the_master_benchmark_measures_every_operation_over_the_wire() {
    check(&run("rpc"));
}

#[test]
fn the_master_benchmark_drives_the_leader_of_a_group_of_three() {
    let report = run_with("service", "3");
    check(&report);
    assert_eq!(report["masters"], 3);
    assert_eq!(report["log"], "group");
}
