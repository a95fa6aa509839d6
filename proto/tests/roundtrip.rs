//! Every message type survives the real codec: encode into a [`Frame`] with random raw
//! data, write it with a [`FrameWriter`] into a `tokio::io::duplex` pipe (often tiny, so
//! the reader sees each frame in pieces), read it back with a [`FrameReader`], decode,
//! compare. Request/reply pairs also go through `rpc::request_frame` / `parse_request`
//! and `rpc::reply_frame` / `parse_reply`, and [`RpcClient`] talks to an in-test server.

mod common;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use stampfs_proto::rpc::{parse_reply, parse_request, reply_frame, request_frame};
use stampfs_proto::*;
use std::collections::BTreeSet;
use std::fmt::Debug;

/// One proptest per type: `name: strategy;`.
macro_rules! frame_round_trips {
    ($($name:ident: $strategy:expr;)*) => {
        proptest! {
            #![proptest_config(cfg())]
            $(
                #[test]
                fn $name(msg in $strategy, data in arb_data(), pipe in arb_pipe()) {
                    frame_round_trip(&msg, data, pipe)?;
                }
            )*
        }
    };
}

frame_round_trips! {
    // ids and tokens
    chunk_handle: arb_handle();
    chunk_version: arb_version();
    chunkserver_id: arb_cs();
    client_id: arb_client();
    inode_id: arb_inode();
    chunk_token: arb_token();
    signed_chunk_command: arb_signed_command();
    // errors
    remote_error: arb_remote_error();
    // shared shapes
    replica_state: arb_replica_state();
    chunkserver_addr: arb_cs_addr();
    replica_report: arb_replica_report();
    file_kind: arb_file_kind();
    file_state: arb_file_state();
    file_status: arb_file_status();
    replica_location: arb_replica_location();
    located_chunk: arb_located_chunk();
    file_locations: arb_file_locations();
    write_grant: arb_write_grant();
    chunk_commit: arb_chunk_commit();
    // client → master
    mkdir: arb_mkdir();
    create: arb_create();
    make_file: arb_make_file();
    cut_last_chunk: arb_cut_last_chunk();
    open_chunk: arb_open_chunk();
    drop_chunks: arb_drop_chunks();
    append: arb_append();
    append_reply: arb_append_reply();
    add_chunk: arb_add_chunk();
    update_pipeline: arb_update_pipeline();
    close: arb_close();
    renew_lease: arb_renew_lease();
    lease_terms: arb_lease_terms();
    get_locations: arb_get_locations();
    list: arb_list();
    stat: arb_stat();
    rename: arb_rename();
    delete: arb_delete();
    recover_lease: arb_recover_lease();
    recovery_outcome: arb_recovery_outcome();
    report_corrupt: arb_report_corrupt();
    // chunkserver → master
    register: arb_register();
    register_reply: arb_register_reply();
    heartbeat: arb_heartbeat();
    heartbeat_reply: arb_heartbeat_reply();
    chunk_report: arb_chunk_report();
    // replica health
    fsck: arb_fsck();
    health_counts: arb_health_counts();
    chunk_problem: arb_chunk_problem();
    file_health: arb_file_health();
    fsck_report: arb_fsck_report();
    cluster_report_request: arb_cluster_report_request();
    chunkserver_state: arb_chunkserver_state();
    chunkserver_status: arb_chunkserver_status();
    cluster_report: arb_cluster_report();
    master_request: arb_master_request();
    // → chunkserver
    write_setup: arb_write_setup();
    write_setup_reply: arb_write_setup_reply();
    packet: arb_packet();
    replica_ack: arb_replica_ack();
    ack: arb_ack();
    read: arb_read();
    read_reply: arb_read_reply();
    replica_info: arb_replica_info();
    receive_replica: arb_receive_replica();
    chunk_command: arb_chunk_command();
    chunk_request: arb_chunk_request();
    verify_replica: arb_verify_replica();
    signed_verify_replica: arb_signed_verify();
    verification: arb_verification();
    overwrite_setup: arb_overwrite_setup();
    signed_digest_replica: arb_signed_digest();
    replica_digest: arb_replica_digest();
}

/// Sends `req` as request `id` and `resp` as its reply through the codec and checks
/// both come back equal through the rpc helpers.
fn rpc_round_trip<Q>(
    id: u64,
    req: Q,
    resp: std::result::Result<Q::Response, RemoteError>,
    data: Bytes,
    pipe: usize,
) -> std::result::Result<(), TestCaseError>
where
    Q: Rpc + Clone,
    Q::Request: PartialEq + Debug,
    Q::Response: PartialEq + Debug + Clone,
{
    let expected_req = req.clone().into_request();
    let request = request_frame(id, req, data.clone()).map_err(fail)?;
    let reply = reply_frame(id, &resp, data.clone()).map_err(fail)?;
    let got = through_pipe(&[request, reply], pipe).map_err(fail)?;
    prop_assert_eq!(got.len(), 2);

    let (got_id, got_req): (u64, Q::Request) = parse_request(&got[0]).map_err(fail)?;
    prop_assert_eq!(got_id, id);
    prop_assert_eq!(&got_req, &expected_req);
    prop_assert_eq!(&got[0].data, &data);

    let decoded = parse_reply::<Q::Response>(id, &got[1]);
    match (&resp, decoded) {
        (Ok(want), Ok(have)) => prop_assert_eq!(want, &have),
        (Err(want), Err(Error::Remote(have))) => prop_assert_eq!(want, &have),
        (want, have) => {
            return Err(TestCaseError::fail(format!(
                "reply {want:?} decoded as {have:?}"
            )))
        }
    }
    prop_assert_eq!(&got[1].data, &data);

    // The same reply awaited under another id is refused, whatever it carries.
    let other = id.wrapping_add(1);
    match parse_reply::<Q::Response>(other, &got[1]) {
        Err(Error::UnexpectedReply { expected, got }) => {
            prop_assert_eq!(expected, other);
            prop_assert_eq!(got, id);
        }
        wrong => {
            return Err(TestCaseError::fail(format!(
                "wrong-id reply gave {wrong:?}"
            )))
        }
    }
    Ok(())
}

/// One proptest per `rpc!` line: `name: request strategy => response strategy;`.
macro_rules! rpc_round_trips {
    ($($name:ident: $req:expr => $resp:expr;)*) => {
        proptest! {
            #![proptest_config(cfg())]
            $(
                #[test]
                fn $name(id in arb_u64(), req in $req, resp in arb_result($resp),
                         data in arb_data(), pipe in arb_pipe()) {
                    rpc_round_trip(id, req, resp, data, pipe)?;
                }
            )*
        }
    };
}

mod rpc {
    use super::*;

    rpc_round_trips! {
        mkdir: arb_mkdir() => arb_file_status();
        create: arb_create() => arb_file_status();
        append: arb_append() => arb_append_reply();
        add_chunk: arb_add_chunk() => arb_write_grant();
        update_pipeline: arb_update_pipeline() => arb_write_grant();
        close: arb_close() => arb_file_status();
        renew_lease: arb_renew_lease() => arb_lease_terms();
        get_locations: arb_get_locations() => arb_file_locations();
        list: arb_list() => prop::collection::vec(arb_file_status(), 0..4);
        stat: arb_stat() => arb_file_status();
        rename: arb_rename() => Just(());
        delete: arb_delete() => Just(());
        recover_lease: arb_recover_lease() => arb_recovery_outcome();
        report_corrupt: arb_report_corrupt() => Just(());
        register: arb_register() => arb_register_reply();
        heartbeat: arb_heartbeat() => arb_heartbeat_reply();
        chunk_report: arb_chunk_report() => Just(());
        fsck: arb_fsck() => arb_fsck_report();
        cluster_report: arb_cluster_report_request() => arb_cluster_report();
        report_part: arb_report_part() => Just(());
        make_file: arb_make_file() => arb_file_status();
        cut_last_chunk: arb_cut_last_chunk() => Just(());
        open_chunk: arb_open_chunk() => arb_write_grant();
        drop_chunks: arb_drop_chunks() => Just(());
        symlink: arb_symlink() => arb_file_status();
        read_link: arb_string().prop_map(|path| ReadLink { path, caller: None }) => arb_string();
        write_setup: arb_write_setup() => arb_write_setup_reply();
        read: arb_read() => arb_read_reply();
        replica_info: arb_replica_info() => arb_replica_report();
        receive_replica: arb_receive_replica() => arb_write_setup_reply();
        command: arb_signed_command() => prop::option::of(arb_replica_report());
        verify: arb_signed_verify() => arb_verification();
        overwrite_setup: arb_overwrite_setup() => arb_write_setup_reply();
        digest: arb_signed_digest() => arb_replica_digest();
        set_replication: (arb_string(), any::<u8>()).prop_map(|(path, replication)| {
            SetReplication { path, replication, caller: None }
        }) => arb_file_status();
        decommission: (arb_cs(), any::<bool>()).prop_map(|(server, on)| Decommission { server, on })
            => arb_decommission_state();
        safe_mode: Just(SafeModeRequest { action: SafeModeAction::Leave }) => arb_safe_mode_status();
        delete_now: (arb_string(), any::<bool>()).prop_map(|(path, recursive)| {
            DeleteNow { path, recursive, caller: None }
        }) => Just(());
        restore_trash: (arb_string(), arb_string()).prop_map(|(path, to)| {
            RestoreTrash { path, to, caller: None }
        }) => arb_file_status();
        balance: Just(BalanceRequest { action: BalanceAction::Start { threshold_pct: 10 } })
            => arb_balance_status();
        set_quota: (arb_string(), arb_quota_change(), arb_quota_change())
            .prop_map(|(path, names, bytes)| SetQuota { path, names, bytes })
            => arb_quota_report();
        get_quota: arb_string().prop_map(|path| GetQuota { path, caller: None })
            => arb_quota_report();
        list_quotas: Just(ListQuotas {}) => prop::collection::vec(arb_quota_report(), 0..4);
    }
}

/// Draws `n` values from `strategy` with a fixed seed and names their variants.
fn variants_drawn<T: Debug>(
    strategy: impl Strategy<Value = T>,
    name: fn(&T) -> &'static str,
    n: usize,
) -> BTreeSet<&'static str> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| name(&strategy.new_tree(&mut runner).expect("value").current()))
        .collect()
}

#[test]
fn strategies_cover_every_enum_variant() {
    // The counts are the number of arms in the exhaustive `*_variant` functions.
    let master = variants_drawn(arb_master_request(), master_request_variant, 800);
    assert_eq!(master.len(), 51, "MasterRequest variants drawn: {master:?}");
    let chunk = variants_drawn(arb_chunk_request(), chunk_request_variant, 200);
    assert_eq!(chunk.len(), 8, "ChunkRequest variants drawn: {chunk:?}");
    let cmd = variants_drawn(arb_chunk_command(), chunk_command_variant, 200);
    assert_eq!(cmd.len(), 6, "ChunkCommand variants drawn: {cmd:?}");
    let verification = variants_drawn(arb_verification(), verification_variant, 100);
    assert_eq!(
        verification.len(),
        3,
        "Verification variants drawn: {verification:?}"
    );
    let err = variants_drawn(arb_remote_error(), remote_error_variant, 800);
    assert_eq!(err.len(), 30, "RemoteError variants drawn: {err:?}");
}

// ---------------------------------------------------------------- RpcClient

fn status(path: &str) -> FileStatus {
    FileStatus {
        path: path.into(),
        inode: InodeId(7),
        kind: FileKind::File,
        length: 1234,
        replication: 3,
        chunk_size: 64 << 20,
        state: FileState::Closed,
        attr: Attr {
            mode: 0o644,
            mtime_ns: 1_700_000_000_000_000_000,
            ..Attr::default()
        },
    }
}

/// A tiny master: answers `Stat` requests on one connection until it closes. `/missing`
/// gets `NotFound`, `/wrong-id` gets a reply under the wrong id, `/echo` echoes the
/// request's data in the reply's data section; anything else gets a status.
async fn serve(stream: tokio::io::DuplexStream) -> Result<u64> {
    let (r, w) = tokio::io::split(stream);
    let mut reader = FrameReader::new(r);
    let mut writer = FrameWriter::new(w);
    let mut served = 0;
    while let Some(frame) = reader.read_frame().await? {
        let (id, req): (u64, MasterRequest) = parse_request(&frame)?;
        let MasterRequest::Stat(Stat { path, .. }) = req else {
            let err: std::result::Result<FileStatus, _> = Err(RemoteError::NotSupported {
                reason: "only stat".into(),
            });
            writer
                .write_frame(&reply_frame(id, &err, Bytes::new())?)
                .await?;
            continue;
        };
        let reply = match path.as_str() {
            "/missing" => reply_frame(
                id,
                &Err::<FileStatus, _>(RemoteError::NotFound { what: path }),
                Bytes::new(),
            )?,
            "/wrong-id" => reply_frame(id + 100, &Ok(status(&path)), Bytes::new())?,
            "/echo" => reply_frame(id, &Ok(status(&path)), frame.data.clone())?,
            _ => reply_frame(id, &Ok(status(&path)), Bytes::new())?,
        };
        writer.write_frame(&reply).await?;
        served += 1;
    }
    Ok(served)
}

#[tokio::test]
async fn rpc_client_talks_to_a_server_over_a_duplex_stream() {
    let (client_side, server_side) = tokio::io::duplex(256);
    let server = tokio::spawn(serve(server_side));
    let (r, w) = tokio::io::split(client_side);
    let mut client = RpcClient::new(r, w);

    let got = client
        .call(Stat {
            path: "/a/b".into(),
            caller: None,
        })
        .await
        .expect("stat");
    assert_eq!(got, status("/a/b"));

    let payload = Bytes::from((0..5000u32).map(|i| i as u8).collect::<Vec<_>>());
    let (got, data) = client
        .call_with_data(
            Stat {
                path: "/echo".into(),
                caller: None,
            },
            payload.clone(),
        )
        .await
        .expect("stat with data");
    assert_eq!(got, status("/echo"));
    assert_eq!(data, payload);

    let err = client
        .call(Stat {
            path: "/missing".into(),
            caller: None,
        })
        .await
        .expect_err("missing");
    assert!(
        matches!(&err, Error::Remote(RemoteError::NotFound { what }) if what == "/missing"),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::NotFound);

    // The connection is still in step after a remote error.
    let got = client
        .call(Stat {
            path: "/again".into(),
            caller: None,
        })
        .await
        .expect("stat after error");
    assert_eq!(got, status("/again"));

    // This is the client's fifth request: ids start at 1.
    let err = client
        .call(Stat {
            path: "/wrong-id".into(),
            caller: None,
        })
        .await
        .expect_err("wrong id");
    assert!(
        matches!(
            err,
            Error::UnexpectedReply {
                expected: 5,
                got: 105
            }
        ),
        "{err:?}"
    );

    let err = client
        .call(Mkdir {
            path: "/d".into(),
            parents: false,
            attr: None,
            caller: None,
        })
        .await
        .expect_err("not supported");
    assert!(
        matches!(err, Error::Remote(RemoteError::NotSupported { .. })),
        "{err:?}"
    );

    drop(client);
    assert_eq!(server.await.expect("join").expect("server"), 5);
}

#[tokio::test]
async fn rpc_client_reports_a_server_that_hangs_up_as_truncated() {
    let (client_side, server_side) = tokio::io::duplex(256);
    let server = tokio::spawn(async move {
        let (r, _w) = tokio::io::split(server_side);
        let mut reader = FrameReader::new(r);
        // Read the request, then hang up without replying.
        reader.read_frame().await.map(|f| f.is_some())
    });
    let (r, w) = tokio::io::split(client_side);
    let mut client = RpcClient::new(r, w);
    let err = client
        .call(RenewLease {
            client: ClientId(1),
        })
        .await
        .expect_err("no reply");
    assert!(matches!(err, Error::Truncated), "{err:?}");
    assert!(server.await.expect("join").expect("read"));
}

#[tokio::test]
async fn an_idle_connection_the_server_closed_is_seen_unusable_before_reuse() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let mut client = RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &addr,
        std::time::Duration::from_secs(5),
    )
    .await
    .expect("connect");
    let (server_side, _) = listener.accept().await.expect("accept");
    // Open and idle: usable.
    assert!(!client.unusable_while_idle());
    // The server goes away (a restarted master): unusable, seen without a call.
    drop(server_side);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !client.unusable_while_idle() {
        assert!(
            std::time::Instant::now() < deadline,
            "a closed connection still looks usable"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
