//! Namespace changes through the FUSE mount are durable when the system call returns:
//! the master is SIGKILLed right after the last `close(2)`, `unlink(2)` or `mkdir(2)`
//! and restarted, and everything the program was told happened is there (DESIGN.md,
//! "FUSE mount": a created file is made closed and empty at the master in one durable
//! step, its lease taken by the first write). Needs root and /dev/fuse: in CI
//! (`CI=true`) their absence is a failure; elsewhere the tests print `SKIPPED: <why>`.

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::{Opts, TestCluster};
use std::fs::{File, OpenOptions};
use std::io::Write;

fn stat_field(c: &TestCluster, remote: &str, field: &str) -> serde_json::Value {
    c.stat_json(remote)[field].clone()
}

fn exists(c: &TestCluster, remote: &str) -> bool {
    c.run(&["stat", "--json", remote]).status.success()
}

#[test]
fn created_unlinked_and_made_entries_survive_a_master_kill_right_after_the_call() {
    if !fuse_or_skip("created_unlinked_and_made_entries_survive_a_master_kill_right_after_the_call")
    {
        return;
    }
    let mut c = TestCluster::with(Opts {
        chunkservers: 1,
        master_args: vec!["--replication".into(), "1".into()],
        ..Opts::default()
    });
    let m = MountGuard::start(&c);
    for i in 0..20 {
        File::create(m.path(&format!("doomed{i}"))).expect("create");
    }
    for i in 0..20 {
        std::fs::remove_file(m.path(&format!("doomed{i}"))).expect("unlink");
    }
    std::fs::create_dir(m.path("dir")).expect("mkdir");
    for i in 0..20 {
        // open(O_CREAT | O_WRONLY) and close, nothing written.
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(m.path(&format!("dir/empty{i}")))
            .expect("create");
    }
    // The last close returned: kill the master before anything else can happen.
    c.master.restart();

    for i in 0..20 {
        let path = format!("/dir/empty{i}");
        assert_eq!(stat_field(&c, &path, "state"), "closed", "{path}");
        assert_eq!(stat_field(&c, &path, "length"), 0, "{path}");
        assert!(
            !exists(&c, &format!("/doomed{i}")),
            "/doomed{i} came back after the master restarted"
        );
    }
    assert_eq!(stat_field(&c, "/dir", "kind"), "directory");

    // A file created through the mount and left unwritten is closed, so another client
    // can write it; the mount then reads what that client wrote.
    c.put_bytes("/dir/empty0", b"from another client", &["--force"]);
    assert_eq!(c.cat("/dir/empty0"), b"from another client");

    // A created file that is written through the mount takes its lease at the first
    // write and commits its length at the last close, across the restart too.
    {
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.path("dir/empty1"))
            .expect("open for append after the restart");
        f.write_all(b"appended").expect("write");
    }
    {
        let mut f = File::create(m.path("dir/written")).expect("create");
        f.write_all(b"hello").expect("write");
        f.sync_all().expect("fsync");
    }
    common::wait_for("the written file to be closed", || {
        stat_field(&c, "/dir/written", "state") == "closed"
    });
    assert_eq!(c.cat("/dir/written"), b"hello");
    common::wait_for("the appended file to be closed", || {
        stat_field(&c, "/dir/empty1", "state") == "closed"
    });
    assert_eq!(c.cat("/dir/empty1"), b"appended");
    drop(m);
}
