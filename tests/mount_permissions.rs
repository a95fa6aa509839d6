//! Permissions (issue 17 item 3), for real: a mount with `--allow-other` used by
//! other users (`setpriv` to uids 1234 and 1235), each with their own permissions on
//! the stored modes: no writes in a root directory of mode 0755, no reads of another
//! user's private file, entries of their own in a sticky world-writable directory that
//! the other user may not remove, chmod or touch. And the master's own checks, through
//! the client library over real sockets with a claimed identity: what the kernel
//! checks for the mount, the master checks for every client. Needs root and
//! /dev/fuse: in CI their absence is a failure; elsewhere the test prints
//! `SKIPPED: <why>` and returns.

mod common;

use common::mount::{fuse_or_skip, MountGuard};
use common::TestCluster;
use stampfs_client::{Client, CreateOptions, Error};
use stampfs_proto::{Caller, RemoteError, SetAttr, SetTime};
use std::process::{Command, Output};

/// Runs `script` in the mount as `uid` (and gid `uid`, no other groups).
fn sh_as(m: &MountGuard, uid: u32, script: &str) -> Output {
    Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ])
        .current_dir(&m.root)
        .output()
        .expect("setpriv")
}

fn ok_as(m: &MountGuard, uid: u32, script: &str) -> String {
    let out = sh_as(m, uid, script);
    assert!(
        out.status.success(),
        "uid {uid}: {script}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `script` fails as `uid`, with `why` (an strerror text) in its stderr.
fn refused_as(m: &MountGuard, uid: u32, script: &str, why: &str) {
    let out = sh_as(m, uid, script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(why),
        "uid {uid}: {script} should fail with {why:?}: {}\n{err}",
        out.status
    );
}

#[test]
fn other_users_of_the_mount_get_their_own_permissions() {
    if !fuse_or_skip("other_users_of_the_mount_get_their_own_permissions") {
        return;
    }
    let c = TestCluster::start();
    let m = MountGuard::start_with(&c, &["--allow-other"]);
    ok_as(
        &m,
        0,
        "set -e; mkdir pub priv; chmod 1777 pub; chmod 700 priv
         printf secret > priv/s; printf rootfile > rootf; chmod 644 rootf",
    );
    const DENIED: &str = "Permission denied";
    const EPERM: &str = "Operation not permitted";

    // A user reads what others may read, and nothing else.
    assert_eq!(ok_as(&m, 1234, "cat rootf"), "rootfile");
    refused_as(&m, 1234, "cat priv/s", DENIED);
    refused_as(&m, 1234, "ls priv", DENIED);
    refused_as(&m, 1234, "printf x >> rootf", DENIED);
    refused_as(&m, 1234, "touch new", DENIED);
    refused_as(&m, 1234, "mkdir newdir", DENIED);
    refused_as(&m, 1234, "rm rootf", DENIED);
    refused_as(&m, 1234, "mv rootf pub/stolen", DENIED);

    // In a sticky world-writable directory a user makes entries of its own...
    assert_eq!(
        ok_as(
            &m,
            1234,
            "set -e; umask 022; printf mine > pub/mine; mkdir pub/d
             chmod 600 pub/mine; stat -c '%u:%g %a' pub/mine pub/d"
        ),
        "1234:1234 600\n1234:1234 755\n"
    );
    // A file created read-only is still written and truncated through the descriptor
    // that created it (as git writes its objects; dd's ftruncate).
    assert_eq!(
        ok_as(
            &m,
            1234,
            "set -e; umask 0222; printf object > pub/ro
             dd if=/dev/null of=pub/ro-dd bs=1 seek=10 2>/dev/null
             stat -c '%s %a' pub/ro pub/ro-dd; cat pub/ro"
        ),
        "6 444\n10 444\nobject"
    );
    refused_as(&m, 1234, "printf more >> pub/ro", DENIED);
    // ...which another user may not read, remove, rename, chmod or touch -d.
    refused_as(&m, 1235, "cat pub/mine", DENIED);
    refused_as(&m, 1235, "rm -f pub/mine", EPERM);
    refused_as(&m, 1235, "mv pub/mine pub/taken", EPERM);
    refused_as(&m, 1235, "chmod 666 pub/mine", EPERM);
    // touch opens the file first (EACCES, as on ext4).
    refused_as(&m, 1235, "touch -d 2000-01-01 pub/mine", DENIED);
    refused_as(&m, 1235, "chown 1235 pub/mine", EPERM);
    // A file another user may write may be touched to now, not to another time.
    ok_as(&m, 1234, "printf shared > pub/shared; chmod 666 pub/shared");
    ok_as(&m, 1235, "touch pub/shared");
    refused_as(&m, 1235, "touch -d 2000-01-01 pub/shared", EPERM);
    // Another user's write to a set-uid file clears the bit (the kernel asks for that
    // as the writer) and goes through.
    ok_as(&m, 1234, "printf s > pub/suid; chmod 4666 pub/suid");
    ok_as(&m, 1235, "printf x >> pub/suid");
    assert_eq!(ok_as(&m, 0, "stat -c %a pub/suid; cat pub/suid"), "666\nsx");
    // The owner and root may.
    ok_as(&m, 1234, "chmod 644 pub/mine; mv pub/mine pub/mine2");
    assert_eq!(ok_as(&m, 1235, "cat pub/mine2"), "mine");
    ok_as(&m, 0, "rm pub/mine2; chown 1235:1235 pub/shared");
    assert_eq!(
        ok_as(&m, 0, "stat -c '%u:%g' pub/shared pub/d"),
        "1235:1235\n1234:1234\n"
    );
}

#[test]
fn the_master_checks_permissions_for_the_callers_identity() {
    let c = TestCluster::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let root = common::connect(&c.master.addr).await.expect("connect");
        root.mkdir("/pub", false).await.expect("mkdir");
        root.set_attr(SetAttr {
            mode: Some(0o1777),
            ..SetAttr::new("/pub")
        })
        .await
        .expect("chmod 1777");
        let user = |uid| {
            root.as_caller(Caller {
                uid,
                gid: uid,
                groups: Vec::new(),
            })
        };
        let (alice, bob) = (user(1234), user(1235));
        let denied = |r: Result<_, Error>| {
            matches!(r, Err(Error::Remote(RemoteError::PermissionDenied { .. })))
        };
        let not_permitted =
            |r: Result<_, Error>| matches!(r, Err(Error::Remote(RemoteError::NotPermitted { .. })));
        // No writes in a root directory of mode 0755.
        assert!(denied(
            alice
                .make_file("/f", CreateOptions::default())
                .await
                .map(|_| ())
        ));
        assert!(denied(alice.mkdir("/d", false).await.map(|_| ())));
        // A file of its own in the sticky directory, owned by the claimed identity
        // (the library takes the process's mode and umask, the caller's ids).
        let opts = CreateOptions {
            attr: Some(stampfs_proto::NewAttr {
                mode: 0o600,
                uid: 1234,
                gid: 1234,
            }),
            ..CreateOptions::default()
        };
        let mut w = alice.create("/pub/a", opts).await.expect("alice creates");
        use tokio::io::AsyncWriteExt;
        w.write_all(b"alice's").await.expect("write");
        w.close().await.expect("close");
        let st = root.stat("/pub/a").await.expect("stat");
        assert_eq!((st.attr.uid, st.attr.mode), (1234, 0o600));
        // Bob may not read, append, remove, chmod or set its times.
        assert!(denied(bob.open("/pub/a").await.map(|_| ())));
        assert!(denied(bob.append("/pub/a").await.map(|_| ())));
        assert!(not_permitted(bob.delete("/pub/a", false).await));
        let chmod = |who: Client, mode| async move {
            who.set_attr(SetAttr {
                mode: Some(mode),
                ..SetAttr::new("/pub/a")
            })
            .await
        };
        assert!(not_permitted(chmod(bob.clone(), 0o666).await.map(|_| ())));
        let touch = bob.set_attr(SetAttr {
            mtime: Some(SetTime::At(0)),
            ..SetAttr::new("/pub/a")
        });
        assert!(not_permitted(touch.await.map(|_| ())));
        // Nor create a file owned by Alice.
        let forged = CreateOptions {
            attr: Some(stampfs_proto::NewAttr {
                mode: 0o4755,
                uid: 1234,
                gid: 1234,
            }),
            ..CreateOptions::default()
        };
        assert!(not_permitted(
            bob.make_file("/pub/forged", forged).await.map(|_| ())
        ));
        // Alice opens it to Bob; then he reads it.
        chmod(alice.clone(), 0o644).await.expect("alice's chmod");
        let mut r = bob.open("/pub/a").await.expect("bob opens");
        let mut text = String::new();
        use tokio::io::AsyncReadExt;
        r.read_to_string(&mut text).await.expect("read");
        assert_eq!(text, "alice's");
        assert!(alice.delete("/pub/a", false).await.is_ok());
    });
}
