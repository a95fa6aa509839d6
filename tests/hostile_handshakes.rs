//! The chunkserver handshake under abuse, against a real master process (issue 18,
//! item 5): a proof sent without a challenge, a proof made with another key, a proof
//! replayed from another connection, and a chunkserver's message on a connection that
//! proved nothing are each refused with `Unauthenticated`, and the master closes that
//! connection; it keeps serving everyone else (a client that proved its user's key),
//! and an honest handshake still succeeds. A client's request on a connection that
//! proved nothing is refused the same way.

mod common;

use common::{refused_and_closed, runtime, test_credentials, TestCluster};
use stampfs_proto::auth::{authenticate_chunkserver, authenticate_client, nonce, server_proof};
use stampfs_proto::{
    ChunkserverId, ClusterKey, Heartbeat, RpcClient, ServerHello, ServerProve, Stat,
};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);

async fn connect(c: &TestCluster) -> RpcClient {
    RpcClient::connect(
        &stampfs_proto::net::Dialer::plain(),
        &c.master.addr,
        TIMEOUT,
    )
    .await
    .expect("connect to the master")
}

/// Someone else is still served: a plain request on a fresh connection of a client
/// that proved its user's key.
async fn still_serving(c: &TestCluster) {
    let mut conn = connect(c).await;
    authenticate_client(&mut conn, &test_credentials())
        .await
        .expect("the master takes a client's honest handshake");
    let st = conn
        .call(Stat {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("the master serves another connection");
    assert_eq!(st.path, "/");
}

#[test]
fn abused_handshakes_are_refused_and_close_only_their_connection() {
    let c = TestCluster::start();
    let key = ClusterKey::load(&c.key_file()).expect("the cluster key");
    runtime().block_on(async {
        // A proof with no challenge before it.
        let mut conn = connect(&c).await;
        let res = conn.call(ServerProve { proof: [7; 32] }).await;
        refused_and_closed("a proof without a challenge", res, &mut conn).await;
        still_serving(&c).await;

        // A proof made with another cluster's key.
        let mut conn = connect(&c).await;
        let mine = nonce();
        let challenge = conn
            .call(ServerHello { nonce: mine })
            .await
            .expect("a challenge");
        let other = ClusterKey::from_bytes([0x5a; 32]);
        let res = conn
            .call(ServerProve {
                proof: server_proof(&other, &mine, &challenge.nonce),
            })
            .await;
        refused_and_closed("a proof with another key", res, &mut conn).await;
        still_serving(&c).await;

        // A good proof, replayed on another connection with the same nonce of ours:
        // the master's challenge is new, so the old proof proves nothing.
        let mut first = connect(&c).await;
        let mine = nonce();
        let challenge = first
            .call(ServerHello { nonce: mine })
            .await
            .expect("a challenge");
        let proof = server_proof(&key, &mine, &challenge.nonce);
        first
            .call(ServerProve { proof })
            .await
            .expect("the honest proof is taken");
        let mut second = connect(&c).await;
        let again = second
            .call(ServerHello { nonce: mine })
            .await
            .expect("a second challenge");
        assert_ne!(again.nonce, challenge.nonce, "every challenge is fresh");
        let res = second.call(ServerProve { proof }).await;
        refused_and_closed("a replayed proof", res, &mut second).await;
        still_serving(&c).await;

        // A chunkserver's message on a connection that proved nothing.
        let mut conn = connect(&c).await;
        let res = conn
            .call(Heartbeat {
                id: ChunkserverId(1),
                capacity: 1 << 30,
                used: 0,
                replica_count: 0,
                active_streams: 0,
            })
            .await;
        refused_and_closed("a heartbeat before any handshake", res, &mut conn).await;
        still_serving(&c).await;

        // A client's request on a connection that proved nothing.
        let mut conn = connect(&c).await;
        let res = conn
            .call(Stat {
                path: "/".into(),
                caller: None,
            })
            .await;
        refused_and_closed("a client request before any handshake", res, &mut conn).await;
        still_serving(&c).await;

        // A chunkserver's message on a connection that proved a user's key, not the
        // cluster key.
        let mut conn = connect(&c).await;
        authenticate_client(&mut conn, &test_credentials())
            .await
            .expect("the client's handshake");
        let res = conn
            .call(Heartbeat {
                id: ChunkserverId(1),
                capacity: 1 << 30,
                used: 0,
                replica_count: 0,
                active_streams: 0,
            })
            .await;
        refused_and_closed("a heartbeat from a client", res, &mut conn).await;

        // After all that, an honest chunkserver handshake still succeeds.
        let mut honest = connect(&c).await;
        authenticate_chunkserver(&mut honest, &key)
            .await
            .expect("the honest handshake");
        still_serving(&c).await;
    });
    let warnings = c.warnings();
    assert!(
        warnings.contains("refusing it"),
        "the master logs each refusal: {warnings}"
    );
}
