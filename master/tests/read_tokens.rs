//! Review finding: read tokens and write tokens are the same thing. `GetLocations`
//! hands any client a token at the chunk's current version, and the chunkserver's
//! `WriteSetup` only checks the MAC and the version, so a *reader* of a file that is
//! being written can open a write stream on its last chunk; the setup offset then
//! "cuts the unacknowledged tail", destroying bytes the writer already had
//! acknowledged (invariant 5), while the writer still holds its lease.

mod common;

use common::*;
use stampfs_proto::*;

#[tokio::test]
async fn a_read_token_cannot_cut_a_writers_acknowledged_bytes() {
    let cl = Cluster::start(|_| {}).await;
    let mut c = cl.client().await;
    let g = create_with_chunk(&mut c, "/f").await;
    let h = g.token.handle;
    let data = pattern(100_000, 5);
    let mut s = Stream::open(&g).await;
    assert_eq!(s.write_acked(&data, 3).await, data.len() as u64);

    // B only reads: it asks where the file is.
    let locs = c
        .call(GetLocations {
            path: "/f".into(),
            client: B,
            access: false,
            caller: None,
        })
        .await
        .expect("locations");
    let chunk = &locs.chunks[0];
    assert_eq!(chunk.token.client, B);
    let head = &chunk.replicas[0];
    let mut cs = RpcClient::connect(&stampfs_proto::net::Dialer::plain(), &head.addr, TIMEOUT)
        .await
        .expect("connect");
    let res = cs
        .call(WriteSetup {
            token: chunk.token,
            offset: 0,
            downstream: Vec::new(),
        })
        .await;
    let hd = cl.header(head.chunkserver, h);
    let on_disk = std::fs::metadata(stampfs_chunkserver::layout::replica_path(
        &cl.dirs[&head.chunkserver],
        h,
    ))
    .expect("replica file")
    .len();
    assert!(
        res.is_err() && hd.length == data.len() as u64,
        "a reader's token opened a write stream ({res:?}); the replica on {} now has \
         header length {} and file size {on_disk} (the writer had {} bytes acknowledged)",
        head.chunkserver,
        hd.length,
        data.len()
    );
    cl.shutdown().await;
}
