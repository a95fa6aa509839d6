//! `stampfs bench mount-metadata` at a tiny size on a plain directory, so it cannot rot:
//! every phase measured on every target, the JSON complete, nothing left behind. No
//! timing assertions (the comparison with a mount is a benchmark, not a test).

use std::process::Command;

#[test]
fn bench_mount_metadata_runs_every_phase_on_every_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).expect("a");
    std::fs::create_dir(&b).expect("b");
    let json = dir.path().join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_stampfs"))
        .args(["bench", "mount-metadata", "--files", "20", "--rounds", "2"])
        .args(["--sync-probe", "5", "--target"])
        .arg(format!("one={}", a.display()))
        .arg("--target")
        .arg(format!("two={}", b.display()))
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run the bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
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
