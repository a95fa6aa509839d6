//! Clients authenticate (issue 18, item 3), against real master and chunkserver
//! processes:
//! - a superuser adds a user with `stampfs admin user add`, whose credentials file is
//!   private; the user's CLI and library act as its own uid, gid and groups, and may
//!   neither administer the cluster nor name another caller;
//! - requests without credentials, with a wrong key, for an unknown user, or with a
//!   proof replayed from another connection are refused with `Unauthenticated`, the
//!   connection is closed, and the master serves everyone else;
//! - a client id belongs to the user that first used it, and a client's leases stay
//!   its user's across a master restart;
//! - a removed user can no longer connect; the CLI without credentials says how to
//!   get some.

mod common;

use common::{refused_and_closed, runtime, test_credentials, TestCluster};
use stampfs_proto::auth::{authenticate_client, client_proof, nonce};
use stampfs_proto::{
    Caller, ClientHello, ClientId, ClientProve, Credentials, RenewLease, RpcClient, Stat,
};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);

fn cluster() -> TestCluster {
    TestCluster::with(common::Opts {
        chunkservers: 1,
        master_args: vec!["--replication".into(), "1".into()],
        ..Default::default()
    })
}

/// `stampfs ARGS` as the user whose credentials are in `creds`.
fn run_as(c: &TestCluster, creds: &Path, args: &[&str]) -> std::process::Output {
    c.cmd(args)
        .env(stampfs_proto::credentials::CREDENTIALS_ENV, creds)
        .output()
        .expect("run stampfs")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A raw connection to the master, before any handshake.
async fn raw_connect(c: &TestCluster) -> RpcClient {
    let dialer = stampfs_proto::net::Dialer::plain();
    RpcClient::connect(&dialer, &c.master.addr, TIMEOUT)
        .await
        .expect("connect")
}

/// A raw connection to the master that proved the key in `creds`.
async fn connect_as(c: &TestCluster, creds: &Path) -> RpcClient {
    let mut conn = raw_connect(c).await;
    let creds = Credentials::load(creds).expect("credentials");
    authenticate_client(&mut conn, &creds)
        .await
        .expect("the user proves its key");
    conn
}

fn add_user(c: &TestCluster, name: &str, uid: u32, extra: &[&str]) -> std::path::PathBuf {
    let path = c.dir.path().join(format!("{name}.credentials"));
    let uid = uid.to_string();
    let mut args = vec!["admin", "user", "add", name, "--uid", &uid, "-o"];
    let p = path.display().to_string();
    args.push(&p);
    args.extend_from_slice(extra);
    c.ok(&args);
    path
}

#[test]
fn users_act_as_themselves_and_only_superusers_administer() {
    let c = cluster();
    // The superuser's file is private, and so is the one `user add` writes.
    let admin_mode = std::fs::metadata(c.credentials_file())
        .expect("admin credentials")
        .permissions()
        .mode();
    assert_eq!(admin_mode & 0o777, 0o600);
    let alice = add_user(&c, "alice", 1000, &["--gid", "100", "--groups", "200,300"]);
    let mode = std::fs::metadata(&alice)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // A second user of the same name or uid is refused, and no file is replaced.
    let again = c.run(&["admin", "user", "add", "alice", "--uid", "1001", "-o"]);
    assert!(!again.status.success());
    let dup = c.run(&[
        "admin",
        "user",
        "add",
        "bob",
        "--uid",
        "1000",
        "-o",
        &c.dir.path().join("bob.credentials").display().to_string(),
    ]);
    assert!(!dup.status.success(), "uid 1000 is alice's");
    assert!(
        stderr(&dup).contains("uid 1000 belongs to user alice"),
        "{}",
        stderr(&dup)
    );

    let list = String::from_utf8(c.ok(&["admin", "user", "list", "--json"])).expect("utf8");
    let users: serde_json::Value = serde_json::from_str(&list).expect("json");
    let names: Vec<&str> = users
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|u| u["name"].as_str())
        .collect();
    assert_eq!(names, vec!["admin", "alice"]);
    assert!(!list.contains("key"), "keys are never listed: {list}");

    // The root directory is root's: alice may not create in it, but in her own.
    let denied = run_as(&c, &alice, &["mkdir", "/mine"]);
    assert!(!denied.status.success());
    assert!(
        stderr(&denied).to_lowercase().contains("permission denied"),
        "{}",
        stderr(&denied)
    );
    c.ok(&["mkdir", "-p", "/home/alice"]);
    c.ok(&["chown", "1000:100", "/home/alice"]);
    let put = c
        .cmd(&["put", "-", "/home/alice/notes"])
        .env(stampfs_proto::credentials::CREDENTIALS_ENV, &alice)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(b"hello from alice\n")?;
            child.wait_with_output()
        })
        .expect("put as alice");
    assert!(put.status.success(), "{}", stderr(&put));
    let st: serde_json::Value = serde_json::from_slice(
        &run_as(&c, &alice, &["stat", "--json", "/home/alice/notes"]).stdout,
    )
    .expect("stat json");
    assert_eq!(st["uid"], 1000, "{st}");
    assert_eq!(st["gid"], 100, "{st}");

    // No administration for her.
    for args in [
        &["admin", "report"][..],
        &["fsck"][..],
        &["admin", "user", "list"][..],
    ] {
        let out = run_as(&c, &alice, args);
        assert!(!out.status.success(), "{args:?} as alice");
        assert!(
            stderr(&out).contains("not a superuser"),
            "{args:?}: {}",
            stderr(&out)
        );
    }

    // Through the library: her identity, and no other caller.
    runtime().block_on(async {
        let creds = Credentials::load(&alice).expect("load");
        let client = common::connect_with(
            &c.master.addr,
            stampfs_client::ClientConfig {
                credentials: Some(creds),
                ..Default::default()
            },
        )
        .await
        .expect("connect as alice");
        assert_eq!(client.identity().name, "alice");
        assert_eq!(client.identity().groups, vec![200, 300]);
        let as_root = client.as_caller(Caller {
            uid: 0,
            gid: 0,
            groups: vec![],
        });
        let err = as_root.stat("/").await.expect_err("alice acting as root");
        assert!(err.to_string().contains("may not act as uid 0"), "{err}");
        client
            .stat("/home/alice/notes")
            .await
            .expect("her own file");
    });
}

#[test]
fn forged_replayed_and_missing_credentials_are_refused_and_the_master_serves_on() {
    let c = cluster();
    runtime().block_on(async {
        // No handshake at all.
        let mut conn = raw_connect(&c).await;
        let res = conn
            .call(Stat {
                path: "/".into(),
                caller: None,
            })
            .await;
        refused_and_closed("a request before any handshake", res, &mut conn).await;

        // A wrong key for the superuser, and an unknown user: refused alike.
        let admin = test_credentials();
        for (what, creds) in [
            (
                "a wrong key",
                Credentials::new(&admin.user, [9; 32]).expect("creds"),
            ),
            (
                "an unknown user",
                Credentials::new("mallory", [9; 32]).expect("creds"),
            ),
        ] {
            let mut conn = raw_connect(&c).await;
            let err = authenticate_client(&mut conn, &creds)
                .await
                .expect_err(what);
            assert!(
                err.to_string().contains("unknown user") && err.to_string().contains("wrong key"),
                "{what}: {err}"
            );
            let after = conn
                .call(Stat {
                    path: "/".into(),
                    caller: None,
                })
                .await;
            assert!(after.is_err(), "{what}: the connection is closed");
        }

        // A proof recorded on one connection, replayed on another: the master's
        // challenge differs, so it proves nothing.
        let mut first = raw_connect(&c).await;
        let mine = nonce();
        let ch = first
            .call(ClientHello {
                user: admin.user.clone(),
                nonce: mine,
            })
            .await
            .expect("challenge");
        let proof = client_proof(admin.key(), &admin.user, &mine, &ch.nonce);
        first
            .call(ClientProve { proof })
            .await
            .expect("a good proof");
        let mut replay = raw_connect(&c).await;
        replay
            .call(ClientHello {
                user: admin.user.clone(),
                nonce: mine,
            })
            .await
            .expect("challenge");
        let res = replay.call(ClientProve { proof }).await;
        refused_and_closed("a replayed proof", res, &mut replay).await;
        // A user name far past any real one: refused at the hello, not kept.
        let mut huge = raw_connect(&c).await;
        let res = huge
            .call(ClientHello {
                user: "u".repeat(4 << 20),
                nonce: mine,
            })
            .await;
        refused_and_closed("an oversized user name", res, &mut huge).await;
        // A proof with no hello before it.
        let mut bare = raw_connect(&c).await;
        let res = bare.call(ClientProve { proof }).await;
        refused_and_closed("a proof without a challenge", res, &mut bare).await;

        // The honest connection still works, and so does a new client.
        first
            .call(Stat {
                path: "/".into(),
                caller: None,
            })
            .await
            .expect("the first connection serves on");
        let client = common::connect(&c.master.addr).await.expect("connect");
        client.stat("/").await.expect("the master serves on");
    });
    let warnings = c.master.log_text();
    assert!(
        warnings.contains("failed to prove a user's key"),
        "the master logs the refusals"
    );
    assert!(!warnings.contains("panicked"), "{warnings}");
}

#[test]
fn a_client_id_belongs_to_the_user_that_first_used_it() {
    let c = cluster();
    let bob = add_user(&c, "bob", 1001, &[]);
    runtime().block_on(async {
        let admin = common::connect(&c.master.addr).await.expect("connect");
        let mut w = admin
            .create("/held", Default::default())
            .await
            .expect("create");
        use tokio::io::AsyncWriteExt;
        w.write_all(b"x").await.expect("write");
        let id: ClientId = admin.id();
        let as_bob = || connect_as(&c, &bob);
        // Bob renews the superuser's client's leases under its id: refused.
        let mut conn = as_bob().await;
        let res = conn.call(RenewLease { client: id }).await;
        refused_and_closed("another user's client id", res, &mut conn).await;
        // Bob's own id is his.
        let mut conn = as_bob().await;
        conn.call(RenewLease {
            client: ClientId(id.0.wrapping_add(1)),
        })
        .await
        .expect("a fresh id is bob's");
        // Bob may write the file, but it is open: the conflict does not name the
        // holder's client id to him (it is what he would need to take its place).
        admin
            .set_attr(stampfs_proto::SetAttr {
                mode: Some(0o666),
                ..stampfs_proto::SetAttr::new("/held")
            })
            .await
            .expect("chmod while open");
        let local = c.dir.path().join("more");
        std::fs::write(&local, b"more").expect("write local");
        let out = run_as(&c, &bob, &["append", &local.display().to_string(), "/held"]);
        assert!(!out.status.success());
        let msg = stderr(&out);
        assert!(msg.contains("being written by another client"), "{msg}");
        assert!(!msg.contains(&id.to_string()), "{msg}");
        w.close().await.expect("the holder closes its file");
    });
}

#[test]
fn a_clients_leases_stay_its_users_across_a_master_restart() {
    let mut c = cluster();
    let alice = add_user(&c, "alice", 1002, &[]);
    let bob = add_user(&c, "bob", 1001, &[]);
    runtime().block_on(async {
        use tokio::io::AsyncWriteExt;
        let admin = common::connect(&c.master.addr).await.expect("connect");
        admin.mkdir("/shared", true).await.expect("mkdir");
        admin
            .set_attr(stampfs_proto::SetAttr {
                mode: Some(0o777),
                ..stampfs_proto::SetAttr::new("/shared")
            })
            .await
            .expect("chmod");
        let config = stampfs_client::ClientConfig {
            credentials: Some(Credentials::load(&alice).expect("alice")),
            ..Default::default()
        };
        let client = common::connect_with(&c.master.addr, config)
            .await
            .expect("alice connects");
        let mut w = client
            .create("/shared/a", Default::default())
            .await
            .expect("alice creates");
        w.write_all(b"before ").await.expect("write");
        w.hflush().await.expect("hflush");
        let id = client.id();

        // The master restarts: nobody has used alice's client id since.
        c.master.restart();
        let mut conn = connect_as(&c, &bob).await;
        let res = conn.call(RenewLease { client: id }).await;
        if let Err(stampfs_proto::Error::Remote(stampfs_proto::RemoteError::Unauthenticated {
            reason,
        })) = &res
        {
            assert!(reason.contains("belongs to another user"), "{reason}");
        }
        refused_and_closed("alice's client id after a restart", res, &mut conn).await;

        // Alice goes on under her id and closes her file.
        w.write_all(b"after")
            .await
            .expect("write after the restart");
        w.close().await.expect("alice closes");
        // Read back once the restarted master has the chunkserver's report again.
        use tokio::io::AsyncReadExt;
        let deadline = std::time::Instant::now() + TIMEOUT;
        let text = loop {
            let mut text = String::new();
            let read = async {
                let mut r = client.open("/shared/a").await?;
                r.read_to_string(&mut text).await?;
                Ok::<_, Box<dyn std::error::Error>>(())
            };
            match read.await {
                Ok(()) => break text,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("read back: {e}; again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("read back: {e}"),
            }
        };
        assert_eq!(text, "before after");
    });
}

#[test]
fn a_removed_user_is_refused_and_the_cli_says_how_to_get_credentials() {
    let c = cluster();
    let carol = add_user(&c, "carol", 1002, &[]);
    let ok = run_as(&c, &carol, &["ls", "/"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    // Carol's open connection, proven before her removal, ends with it.
    let rt = runtime();
    let open = rt.block_on(async {
        let client = common::connect_with(
            &c.master.addr,
            stampfs_client::ClientConfig {
                credentials: Some(Credentials::load(&carol).expect("carol")),
                ..Default::default()
            },
        )
        .await
        .expect("connect as carol");
        client.stat("/").await.expect("carol is served");
        client
    });
    c.ok(&["admin", "user", "remove", "carol"]);
    let err = rt
        .block_on(open.stat("/"))
        .expect_err("a removed user's open connection");
    assert!(err.to_string().contains("was removed"), "{err}");
    let gone = run_as(&c, &carol, &["ls", "/"]);
    assert!(!gone.status.success());
    assert!(
        stderr(&gone).contains("refused user carol"),
        "{}",
        stderr(&gone)
    );
    // The last superuser stays.
    let last = c.run(&["admin", "user", "remove", "admin"]);
    assert!(!last.status.success());
    assert!(
        stderr(&last).contains("last superuser"),
        "{}",
        stderr(&last)
    );

    // No credentials anywhere: the error says where they come from.
    let none = c
        .cmd(&["ls", "/"])
        .env_remove(stampfs_proto::credentials::CREDENTIALS_ENV)
        .env("HOME", c.dir.path())
        .output()
        .expect("run");
    assert!(!none.status.success());
    let msg = stderr(&none);
    assert!(
        msg.contains("--credentials") && msg.contains("admin.credentials"),
        "{msg}"
    );
    // A damaged file: its name and what is wrong.
    let bad = c.dir.path().join("bad.credentials");
    std::fs::write(&bad, "user = x\n").expect("write");
    let out = run_as(&c, &bad, &["ls", "/"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("bad.credentials") && stderr(&out).contains("key"),
        "{}",
        stderr(&out)
    );
}
