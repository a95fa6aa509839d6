//! `stampfs bench mount-metadata` at a tiny size on a plain directory, and
//! `stampfs bench mount-io` on a real stampfs mount (chunks of 1 MiB, so its random
//! writes move from chunk to chunk) next to a plain directory, so neither can rot:
//! every phase measured on every target, the JSON complete, the data checked by the
//! benchmark itself, nothing left behind. No timing assertions (the comparison with a
//! mount is a benchmark, not a test).

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::{Opts, TestCluster};
use std::path::Path;
use std::process::Command;

/// Runs `stampfs bench ARGS --json JSON`; asserts success (showing `context` too when
/// it failed) and returns the report and the printed table.
fn run_bench(
    args: &[String],
    json: &Path,
    context: impl Fn() -> String,
) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stampfs"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run the bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        context()
    );
    let report =
        serde_json::from_str(&std::fs::read_to_string(json).expect("json")).expect("parse");
    (report, stdout)
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn bench_mount_metadata_runs_every_phase_on_every_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).expect("a");
    std::fs::create_dir(&b).expect("b");
    let json = dir.path().join("bench.json");
    let mut args = strings(&["mount-metadata", "--files", "20", "--rounds", "2"]);
    args.extend(strings(&["--sync-probe", "5", "--target"]));
    args.push(format!("one={}", a.display()));
    args.push("--target".into());
    args.push(format!("two={}", b.display()));
    args.push("--dir".into());
    args.push(dir.path().display().to_string());
    let (report, stdout) = run_bench(&args, &json, String::new);
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2 * 5 * 2, "rounds × phases × targets");
    for phase in ["create+close", "stat", "unlink", "mkdir", "rmdir"] {
        for target in ["one", "two"] {
            assert!(
                results
                    .iter()
                    .any(|r| r["phase"] == phase && r["target"] == target && r["ops"] == 20),
                "{phase} on {target} missing:\n{stdout}"
            );
        }
    }
    assert_eq!(report["fdatasync"].as_array().map(Vec::len), Some(2));
    for d in [&a, &b] {
        assert_eq!(
            std::fs::read_dir(d).expect("list").count(),
            0,
            "left behind"
        );
    }
    let strays = std::fs::read_dir(dir.path())
        .expect("list")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("fdatasync"))
        .count();
    assert_eq!(strays, 0, "probe files left behind");
}

#[test]
fn bench_mount_io_checks_its_data_through_a_real_mount() {
    if !fuse_or_skip("bench_mount_io_checks_its_data_through_a_real_mount") {
        return;
    }
    let c = TestCluster::with(Opts {
        master_args: vec!["--chunk-size".into(), "1MiB".into()],
        ..Opts::default()
    });
    let m = MountGuard::start(&c);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("io.json");
    let mut args = strings(&["mount-io", "--size", "5MiB", "--block", "256KiB"]);
    args.extend(strings(&[
        "--sync-ops",
        "40",
        "--rounds",
        "2",
        "--warm",
        "--target",
    ]));
    args.push(format!("stampfs={}", m.root.display()));
    args.push("--target".into());
    args.push(format!("disk={}", dir.path().display()));
    let (report, stdout) = run_bench(&args, &json, || m.log_text());
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2 * 3 * 2, "rounds × phases × targets");
    for target in ["stampfs", "disk"] {
        for (phase, ops) in [("seq-write", 20), ("seq-read", 21), ("pwrite+fsync", 40)] {
            assert!(
                results
                    .iter()
                    .any(|r| r["phase"] == phase && r["target"] == target && r["ops"] == ops),
                "{phase} on {target} with {ops} calls missing:\n{stdout}"
            );
        }
    }
    let left: Vec<_> = std::fs::read_dir(&m.root)
        .expect("list the mount")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".trash")
        .collect();
    assert!(left.is_empty(), "left behind on the mount: {left:?}");
}
