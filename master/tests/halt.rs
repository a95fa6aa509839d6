//! Fail-stop: a committed record that cannot be handed to the operation log leaves the
//! master's state ahead of its log. The master then refuses every request, reads
//! included, with an `Internal` error (it never shows or builds on a change a restart
//! would take back); a restart replays the log, which holds exactly what was
//! acknowledged.
//!
//! Uses the `fail-points` feature; fail points are process-wide, so this file holds
//! the only test that enables `log-append`.

mod admin;

use stampfs_master::{fail, start, MasterConfig};
use stampfs_proto::*;
use std::time::Duration;

const CLIENT: ClientId = ClientId(7);

fn mkdir(path: &str) -> Mkdir {
    Mkdir {
        path: path.into(),
        parents: false,
        attr: None,
        caller: None,
    }
}

fn remote(e: Error) -> RemoteError {
    match e {
        Error::Remote(r) => r,
        other => panic!("expected a remote error, got {other}"),
    }
}

#[tokio::test]
async fn a_record_the_log_refuses_halts_the_master_until_a_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = MasterConfig::new(tmp.path().join("master"));
    cfg.health_interval = Duration::ZERO;
    let master = start(cfg.clone()).await.expect("master");
    cfg.listen = master.addr().to_string();
    let mut c = admin::connect(&cfg.listen, &cfg.dir).await;
    c.call(mkdir("/kept")).await.expect("mkdir");

    fail::enable("log-append");
    let e = remote(c.call(mkdir("/lost")).await.unwrap_err());
    fail::disable("log-append");
    assert_eq!(e.code(), ErrorCode::Internal, "{e}");

    // Everything is refused now, reads too (the state holds /lost, the log does not).
    let e = remote(
        c.call(Stat {
            path: "/".into(),
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::Internal, "{e}");
    let e = remote(
        c.call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::Internal, "{e}");
    let e = remote(c.call(mkdir("/after")).await.unwrap_err());
    assert_eq!(e.code(), ErrorCode::Internal, "{e}");
    let e = remote(
        c.call(Create {
            path: "/f".into(),
            client: CLIENT,
            replication: None,
            chunk_size: None,
            overwrite: false,
            attr: None,
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::Internal, "{e}");
    assert!(
        !master.checkpoint().await.unwrap_or(false),
        "a halted master never checkpoints its state"
    );
    master.shutdown().await.expect("shutdown");

    // The restart replays what was logged: /kept, not /lost.
    let master = start(cfg.clone()).await.expect("restart");
    let mut c = admin::connect(&cfg.listen, &cfg.dir).await;
    c.call(Stat {
        path: "/kept".into(),
        caller: None,
    })
    .await
    .expect("kept");
    let e = remote(
        c.call(Stat {
            path: "/lost".into(),
            caller: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    c.call(mkdir("/lost")).await.expect("mkdir again");
    master.shutdown().await.expect("shutdown");
}
