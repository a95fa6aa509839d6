//! Attributes through a real FUSE mount (issue 17 item 2): modes, owners and times
//! stored by the master. New entries take the caller's umask; `chmod`, `chown` and
//! `touch -d` persist across a remount and a master restart; the exec bit runs a
//! script; `cp -p` keeps times set on the open file before its close; `cp -a`,
//! `rsync -a` (twice: the second transfers nothing) and `tar c` see the same tree as
//! the local source, links included; the CLI's `ls -l`, `stat --json`, `chmod` and
//! `chown` show and change the same attributes. Needs root and /dev/fuse: in CI
//! their absence is a failure; elsewhere the test prints `SKIPPED: <why>` and
//! returns.

mod common;

use common::mount::{fuse_or_skip, sh_in, MountGuard};
use common::TestCluster;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// What a tree copy must keep of an entry: kind, permission bits, owner,
/// modification time to the nanosecond, and the contents (a file's bytes, a link's
/// target).
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    contents: Vec<u8>,
}

fn entry(p: &Path) -> Entry {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ft = m.file_type();
    let (kind, contents) = if ft.is_symlink() {
        let t = std::fs::read_link(p).expect("readlink");
        ("link", t.into_os_string().into_encoded_bytes())
    } else if ft.is_dir() {
        ("dir", Vec::new())
    } else {
        ("file", std::fs::read(p).expect("read"))
    };
    Entry {
        kind,
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        contents,
    }
}

/// Every entry under `root` (itself included, as ""), by relative path.
fn tree(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let rel = p
            .strip_prefix(root)
            .expect("under the root")
            .display()
            .to_string();
        let e = entry(&p);
        if e.kind == "dir" {
            for child in std::fs::read_dir(&p).expect("read_dir") {
                stack.push(child.expect("entry").path());
            }
        }
        out.insert(rel, e);
    }
    out
}

fn assert_same_tree(src: &Path, dst: &Path, how: &str) {
    let (a, b) = (tree(src), tree(dst));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{how}: the same names"
    );
    for (name, e) in &a {
        assert_eq!(Some(e), b.get(name), "{how}: {name:?}");
    }
}

/// A local tree with modes, owners, sub-second times in the past and links: the
/// source every copy is compared with.
fn source_tree(dir: &Path) {
    sh_in(
        dir,
        "set -e
         mkdir -p src/bin src/secret src/empty
         printf '#!/bin/sh\\necho tool ran\\n' > src/bin/tool
         chmod 0755 src/bin/tool
         printf 'private' > src/secret/key
         chmod 0600 src/secret/key
         chmod 0750 src/secret
         head -c 300000 /dev/urandom > src/blob
         chmod 0644 src/blob
         printf 'x' > src/owned
         chown 1234:5678 src/owned
         chmod 2775 src/empty
         ln -s bin/tool src/tool-link
         ln -s /nowhere src/dangling
         touch -h -d '2003-04-05 06:07:08.123456789' src/tool-link src/dangling
         touch -d '2001-02-03 04:05:06.987654321' src/bin/tool src/secret/key src/blob src/owned
         touch -d '2002-01-01 00:00:00.5' src/bin src/secret src/empty src",
    );
}

#[test]
fn modes_owners_and_times_are_stored_by_the_master() {
    if !fuse_or_skip("modes_owners_and_times_are_stored_by_the_master") {
        return;
    }
    let mut c = TestCluster::start();
    let m = MountGuard::start(&c);

    // New entries take the caller's umask.
    sh_in(&m.root, "umask 027; touch f; mkdir d; printf data > g");
    assert_eq!(sh_in(&m.root, "stat -c %a f d g"), "640\n750\n640\n");

    // chmod, and the exec bit runs a script.
    sh_in(&m.root, "chmod 600 f");
    assert_eq!(sh_in(&m.root, "stat -c %a f"), "600\n");
    sh_in(&m.root, "printf '#!/bin/sh\\necho ran\\n' > run.sh");
    let out = Command::new(m.path("run.sh")).output();
    assert!(
        out.as_ref().map_or(true, |o| !o.status.success()),
        "a file without the exec bit does not run: {out:?}"
    );
    sh_in(&m.root, "chmod +x run.sh");
    assert_eq!(sh_in(&m.root, "./run.sh"), "ran\n");

    // chown, and times to the nanosecond (touch -d, touch -a, before the epoch too).
    sh_in(&m.root, "chown 1234:5678 g");
    assert_eq!(sh_in(&m.root, "stat -c %u:%g g"), "1234:5678\n");
    sh_in(&m.root, "touch -m -d '2001-02-03 04:05:06.123456789 UTC' g");
    sh_in(&m.root, "touch -a -d '1969-07-20 20:17:40 UTC' g");
    let meta = std::fs::metadata(m.path("g")).expect("stat g");
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (981_173_106, 123_456_789)
    );
    assert_eq!((meta.atime(), meta.atime_nsec()), (-14_182_940, 0));
    assert!(meta.ctime() > 1_700_000_000, "ctime is the master's clock");
    assert_eq!(std::fs::read(m.path("g")).expect("read"), b"data");

    // The CLI sees and changes the same attributes.
    let st = c.stat_json("/g");
    assert_eq!(st["mode"], 0o640);
    assert_eq!(
        (st["uid"].as_u64(), st["gid"].as_u64()),
        (Some(1234), Some(5678))
    );
    assert_eq!(st["mtime_ns"].as_i64(), Some(981_173_106_123_456_789));
    let ls = String::from_utf8(c.ok(&["ls", "-l", "/"])).expect("utf8");
    let line = ls.lines().find(|l| l.ends_with(" g")).expect("g listed");
    assert!(line.starts_with("-rw-r----- "), "{line}");
    assert!(line.contains(" 1234  5678 "), "{line}");
    assert!(line.contains("2001-02-03T04:05:06Z"), "{line}");
    c.ok(&["chmod", "4711", "/f"]);
    assert_eq!(c.stat_json("/f")["mode"].as_u64(), Some(0o4711));
    c.ok(&["chown", ":42", "/f"]);
    let st = c.stat_json("/f");
    // A new group drops the set-uid bit, as on Linux.
    assert_eq!(
        (st["mode"].as_u64(), st["gid"].as_u64()),
        (Some(0o711), Some(42))
    );
    for bad in [
        &["chmod", "10000", "/f"][..],
        &["chmod", "rwx", "/f"],
        &["chown", "x", "/f"],
    ] {
        let out = c.run(bad);
        assert!(!out.status.success(), "{bad:?} is refused");
    }
    assert_eq!(c.stat_json("/f")["mode"].as_u64(), Some(0o711), "unchanged");
    // -R: everything below too; chmod skips links, chown changes links themselves.
    sh_in(&m.root, "mkdir -p t/sub && touch t/sub/x && ln -s sub t/l");
    c.ok(&["chown", "-R", "7:8", "/t"]);
    c.ok(&["chmod", "-R", "700", "/t"]);
    for (p, mode) in [
        ("/t", 0o700),
        ("/t/sub", 0o700),
        ("/t/sub/x", 0o700),
        ("/t/l", 0o777),
    ] {
        let st = c.stat_json(p);
        let got = (st["mode"].as_u64(), st["uid"].as_u64(), st["gid"].as_u64());
        assert_eq!(got, (Some(mode), Some(7), Some(8)), "{p}");
    }
    let out = c.run(&["chmod", "-R", "700", "/t/l"]);
    assert!(!out.status.success(), "a link's mode cannot change");

    // Kept across a remount and a master restart.
    drop(m);
    c.master.restart();
    c.wait_live(3);
    let m = MountGuard::start(&c);
    assert_eq!(
        sh_in(&m.root, "stat -c '%a %u:%g' f g d run.sh"),
        "711 0:42\n640 1234:5678\n750 0:0\n755 0:0\n"
    );
    let meta = std::fs::metadata(m.path("g")).expect("stat g");
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (981_173_106, 123_456_789)
    );
    assert_eq!(sh_in(&m.root, "./run.sh"), "ran\n");

    // cp -p sets the times on the open copy before closing it: the close keeps them.
    sh_in(&m.root, "cp -p g g2");
    let (a, b) = (
        std::fs::metadata(m.path("g")).expect("g"),
        std::fs::metadata(m.path("g2")).expect("g2"),
    );
    assert_eq!((b.mtime(), b.mtime_nsec()), (a.mtime(), a.mtime_nsec()));
    assert_eq!(b.mode() & 0o7777, 0o640);
    // A write moves the modification time again; reading a file whose access time
    // is older than its modification moves the access time (relatime).
    sh_in(&m.root, "printf more >> g2");
    let after = std::fs::metadata(m.path("g2")).expect("g2");
    assert!(after.mtime() > 1_700_000_000, "{after:?}");
    drop(m);
    let before = c.stat_json("/g2")["atime_ns"].as_i64().expect("atime");
    assert_eq!(c.cat("/g2"), b"datamore");
    let later = c.stat_json("/g2")["atime_ns"].as_i64().expect("atime");
    assert!(
        later > before,
        "a read moved the access time: {before} -> {later}"
    );
}

#[test]
fn cp_rsync_and_tar_see_the_tree_the_source_has() {
    if !fuse_or_skip("cp_rsync_and_tar_see_the_tree_the_source_has") {
        return;
    }
    let c = TestCluster::start();
    let m = MountGuard::start(&c);
    let local = tempfile::tempdir().expect("tempdir");
    source_tree(local.path());
    let src = local.path().join("src");

    // cp -a: modes, owners, times and links as the source has them.
    let out = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(m.path("cp"))
        .output()
        .expect("cp");
    assert!(out.status.success(), "cp -a: {out:?}");
    assert_same_tree(&src, &m.path("cp"), "cp -a");
    assert_eq!(
        sh_in(&m.path("cp"), "./bin/tool; ./tool-link"),
        "tool ran\ntool ran\n"
    );

    // rsync -a, then again: the second run has nothing to change.
    let rsync = |extra: &[&str]| {
        let out = Command::new("rsync")
            .arg("-a")
            .args(extra)
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", m.p("rs")))
            .output()
            .expect("rsync");
        assert!(
            out.status.success(),
            "rsync: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    rsync(&[]);
    assert_same_tree(&src, &m.path("rs"), "rsync -a");
    let changes = rsync(&["--itemize-changes"]);
    assert_eq!(
        changes, "",
        "a second rsync -a transfers and changes nothing"
    );
    // A changed mode is all the next run sends.
    sh_in(&src, "chmod 0640 blob");
    let changes = rsync(&["--itemize-changes"]);
    assert_eq!(changes.trim(), ".f...p..... blob", "{changes}");
    assert_same_tree(&src, &m.path("rs"), "rsync -a after a chmod");

    // tar c of the copy is tar c of the source, byte for byte.
    let tar = |dir: &Path| {
        let out = Command::new("tar")
            .args(["--sort=name", "--numeric-owner", "-C"])
            .arg(dir)
            .args(["-cf", "-", "."])
            .output()
            .expect("tar");
        assert!(out.status.success(), "tar: {out:?}");
        out.stdout
    };
    let (a, b) = (tar(&src), tar(&m.path("rs")));
    assert!(a.len() > 300_000);
    assert!(
        a == b,
        "tar c of the mount differs from tar c of the source"
    );
}

/// setxattr(2) on `path`; the errno on failure.
fn set_xattr(path: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    // SAFETY: valid NUL-terminated strings and a buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// getxattr(2) of `path`; the errno on failure.
fn get_xattr(path: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    let mut buf = vec![0u8; 70_000];
    // SAFETY: valid NUL-terminated strings and a buffer of `buf.len()` bytes.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(rc as usize);
    Ok(buf)
}

/// listxattr(2) of `path`, the names.
fn list_xattr(path: &Path) -> Vec<String> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid NUL-terminated string and a buffer of `buf.len()` bytes.
    let rc = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(rc >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buf.truncate(rc as usize);
    buf.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

#[test]
fn user_extended_attributes_are_stored_by_the_master() {
    if !fuse_or_skip("user_extended_attributes_are_stored_by_the_master") {
        return;
    }
    let mut c = TestCluster::start();
    let m = MountGuard::start(&c);
    sh_in(&m.root, "printf data > f; mkdir d");
    let f = m.path("f");
    set_xattr(&f, "user.color", b"blue", 0).expect("setxattr");
    set_xattr(&m.path("d"), "user.dir", b"", 0).expect("setxattr on a directory");
    assert_eq!(get_xattr(&f, "user.color"), Ok(b"blue".to_vec()));
    assert_eq!(get_xattr(&m.path("d"), "user.dir"), Ok(Vec::new()));
    assert_eq!(list_xattr(&f), vec!["user.color"]);
    // setxattr(2)'s flags and errors.
    assert_eq!(
        set_xattr(&f, "user.color", b"red", libc::XATTR_CREATE),
        Err(libc::EEXIST)
    );
    assert_eq!(
        set_xattr(&f, "user.none", b"x", libc::XATTR_REPLACE),
        Err(libc::ENODATA)
    );
    assert_eq!(get_xattr(&f, "user.none"), Err(libc::ENODATA));
    set_xattr(&f, "user.color", b"red", libc::XATTR_REPLACE).expect("replace");
    assert_eq!(set_xattr(&f, "security.x", b"x", 0), Err(libc::EOPNOTSUPP));
    assert_eq!(get_xattr(&f, "security.capability"), Err(libc::ENODATA));
    assert_eq!(
        set_xattr(&f, "user.big", &vec![1u8; 70_000], 0),
        Err(libc::E2BIG)
    );
    assert_eq!(
        set_xattr(&f, "user.near", &vec![1u8; 65_530], 0),
        Err(libc::E2BIG),
        "past the entry's limit"
    );
    // cp -a keeps them; the file's bytes are untouched.
    sh_in(&m.root, "cp -a f g");
    assert_eq!(get_xattr(&m.path("g"), "user.color"), Ok(b"red".to_vec()));
    assert_eq!(std::fs::read(m.path("g")).expect("g"), b"data");
    // Kept across a remount and a master restart; removable.
    drop(m);
    c.master.restart();
    c.wait_live(3);
    let m = MountGuard::start(&c);
    let f = m.path("f");
    assert_eq!(get_xattr(&f, "user.color"), Ok(b"red".to_vec()));
    let p = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).expect("path");
    for (name, want) in [("user.color", 0), ("user.color", -1)] {
        let n = std::ffi::CString::new(name).expect("name");
        // SAFETY: valid NUL-terminated strings.
        let rc = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
        assert_eq!(rc, want, "removexattr {name}");
    }
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENODATA)
    );
    assert!(list_xattr(&f).is_empty());
}
