//! The README's first command: `stampfs demo` tells the fencing story and checks it.

#[test]
fn the_demo_runs_and_every_claim_holds() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stampfs"))
        .arg("demo")
        .output()
        .expect("run the demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("every claim of the story held"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    // The rejection is told as the chunkservers' own log line, with both versions.
    assert!(
        text.contains("chunkserver  local write failed: stale token"),
        "{text}"
    );
    assert!(
        !text.contains("\x1b["),
        "no colours when stdout is not a terminal"
    );
}
