//! `du`, `count`, `test` and `touchz` on a real cluster, as `hdfs dfs` users know them.

mod common;

use common::TestCluster;

fn out(c: &TestCluster, args: &[&str]) -> String {
    String::from_utf8(c.ok(args)).expect("utf-8")
}

fn status(c: &TestCluster, args: &[&str]) -> Option<i32> {
    c.run(args).status.code()
}

#[test]
fn du_count_test_and_touchz_answer_like_hdfs() {
    let c = TestCluster::start();
    c.ok(&["mkdir", "-p", "/a/b"]);
    c.put_bytes("/a/f", &common::pattern(1000, 1), &[]);
    c.put_bytes("/a/b/g", &common::pattern(2048, 2), &[]);
    c.ok(&["ln", "-s", "/a/f", "/a/link"]);

    // du: one line per entry of the directory; -s: the total; -h: binary units.
    let du = out(&c, &["du", "/a"]);
    let lines: Vec<Vec<&str>> = du.lines().map(|l| l.split_whitespace().collect()).collect();
    assert!(lines.contains(&vec!["1000", "/a/f"]), "{du}");
    assert!(lines.contains(&vec!["2048", "/a/b"]), "{du}");
    assert!(lines.contains(&vec!["0", "/a/link"]), "{du}");
    assert_eq!(
        out(&c, &["du", "-s", "/a"])
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["3048", "/a"]
    );
    assert!(out(&c, &["du", "-s", "-h", "/a"]).contains("3.0 KiB"));
    assert!(
        c.run(&["du", "--help"]).status.success(),
        "--help still works"
    );

    // count: directories (itself included), files and links, bytes.
    let count = out(&c, &["count", "/a"]);
    assert_eq!(
        count.split_whitespace().collect::<Vec<_>>(),
        ["2", "3", "3048", "/a"],
        "{count}"
    );

    // test: 0 yes, 1 no.
    assert_eq!(status(&c, &["test", "-e", "/a/f"]), Some(0));
    assert_eq!(status(&c, &["test", "-e", "/nope"]), Some(1));
    assert_eq!(status(&c, &["test", "-d", "/a"]), Some(0));
    assert_eq!(status(&c, &["test", "-d", "/a/f"]), Some(1));
    assert_eq!(status(&c, &["test", "-f", "/a/f"]), Some(0));
    assert_eq!(status(&c, &["test", "-z", "/a/f"]), Some(1));
    assert_ne!(status(&c, &["test", "/a/f"]), Some(0), "a test is required");
    // A master that cannot be asked is not a "no".
    let unreachable = c
        .cmd(&["test", "-e", "/a/f", "--master", "127.0.0.1:1"])
        .output()
        .expect("run");
    assert_eq!(unreachable.status.code(), Some(2), "{unreachable:?}");

    // touchz: an empty file; again: nothing; over bytes: an error.
    c.ok(&["touchz", "/a/empty"]);
    assert_eq!(status(&c, &["test", "-z", "/a/empty"]), Some(0));
    c.ok(&["touchz", "/a/empty"]);
    let over = c.run(&["touchz", "/a/f"]);
    assert!(!over.status.success());
    assert!(
        String::from_utf8_lossy(&over.stderr).contains("holds 1000 bytes"),
        "{}",
        String::from_utf8_lossy(&over.stderr)
    );
    assert_eq!(c.cat("/a/f"), common::pattern(1000, 1), "untouched");
}
