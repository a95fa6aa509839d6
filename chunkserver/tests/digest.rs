//! `Digest`: a hash of each block of a replica on the master's signed request (lease recovery
//! compares replicas with it), on the store and over TCP, with both I/O engines.

mod common;

use bytes::Bytes;
use common::*;
use stampfs_chunkserver::header::BLOCK;
use stampfs_chunkserver::store::block_hashes;
use stampfs_chunkserver::store::Store;
use stampfs_chunkserver::Error;
use stampfs_proto::{
    ChunkCommand, ChunkHandle, ChunkVersion, DigestReplica, RemoteError, ReplicaDigest,
    ReplicaState, Signed,
};

const H: ChunkHandle = ChunkHandle(0x77);

fn v(n: u64) -> ChunkVersion {
    ChunkVersion(n)
}

#[tokio::test]
async fn a_digest_lists_the_hash_of_every_block_up_to_the_length() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine(kind)).await.expect("store");
        s.bump_version(H, v(1), true).await.expect("create");
        let empty = s.digest(H, v(1)).await.expect("digest of an empty replica");
        assert_eq!((empty.replica.length, empty.blocks.len()), (0, 0));

        let data = pattern(2 * BLOCK as usize + 1000, 5);
        // Two appends, the second inside the first's partial block.
        s.write(H, v(1), 0, Bytes::copy_from_slice(&data[..70_000]), false)
            .await
            .expect("write");
        s.write(
            H,
            v(1),
            70_000,
            Bytes::copy_from_slice(&data[70_000..]),
            true,
        )
        .await
        .expect("write");
        let d = s.digest(H, v(1)).await.expect("digest");
        assert_eq!(
            (d.replica.version, d.replica.length, d.replica.state),
            (v(1), data.len() as u64, ReplicaState::Writing)
        );
        assert_eq!(d.blocks, block_hashes(&data), "{kind:?}");

        // Cut inside a block: the last entry is the hash of the bytes up to the length.
        let cut = BLOCK + 123;
        s.truncate(H, v(1), cut).await.expect("truncate");
        let d = s.digest(H, v(1)).await.expect("digest after a cut");
        assert_eq!(d.replica.length, cut);
        assert_eq!(d.blocks, block_hashes(&data[..cut as usize]));
        s.finalize(H, v(1), cut).await.expect("finalize");
        let d = s
            .digest(H, v(1))
            .await
            .expect("digest of a finalized replica");
        assert_eq!(d.replica.state, ReplicaState::Finalized);
        assert_eq!(d.blocks, block_hashes(&data[..cut as usize]));
    }
}

#[tokio::test]
async fn a_digest_passes_the_version_gate() {
    init_tracing();
    for kind in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path(), engine(kind)).await.expect("store");
        assert!(matches!(
            s.digest(H, v(1)).await,
            Err(Error::NotFound { handle: H })
        ));
        s.bump_version(H, v(3), true).await.expect("create");
        assert!(matches!(
            s.digest(H, v(2)).await,
            Err(Error::StaleToken {
                presented: ChunkVersion(2),
                current: ChunkVersion(3),
                ..
            })
        ));
        assert!(matches!(
            s.digest(H, v(4)).await,
            Err(Error::ReplicaStale {
                presented: ChunkVersion(4),
                current: ChunkVersion(3),
                ..
            })
        ));
        s.digest(H, v(3)).await.expect("equal version");
    }
}

#[tokio::test]
async fn replicas_with_different_bytes_of_one_length_have_different_digests() {
    init_tracing();
    let kind = engines()[0];
    let (a, b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (sa, sb) = (
        Store::open(a.path(), engine(kind)).await.expect("a"),
        Store::open(b.path(), engine(kind)).await.expect("b"),
    );
    let data = pattern(3 * BLOCK as usize, 9);
    let mut other = data.clone();
    other[BLOCK as usize + 17] ^= 1;
    for (s, d) in [(&sa, &data), (&sb, &other)] {
        s.bump_version(H, v(1), true).await.expect("create");
        s.write(H, v(1), 0, Bytes::copy_from_slice(d), true)
            .await
            .expect("write");
    }
    let (da, db) = (
        sa.digest(H, v(1)).await.expect("a"),
        sb.digest(H, v(1)).await.expect("b"),
    );
    assert_eq!(da.replica.length, db.replica.length);
    assert_eq!(da.blocks[0], db.blocks[0]);
    assert_ne!(da.blocks[1], db.blocks[1], "the block that differs");
    assert_eq!(da.blocks[2], db.blocks[2]);
}

/// 512-byte records, each ending with the CRC32 of its first 508 bytes, as the
/// nemesis's slot file holds them.
fn self_checksummed(tags: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for tag in tags {
        let mut r: Vec<u8> = (0..508u32)
            .map(|i| (i as u8).wrapping_mul(3) ^ tag)
            .collect();
        let crc = crc32fast::hash(&r);
        r.extend_from_slice(&crc.to_le_bytes());
        out.extend(r);
    }
    out
}

/// The divergence the nemesis found (seed 9037): an overwrite of one slot reached two
/// replicas of an 8 KiB chunk of such records and not the third, and the three had
/// equal checksum tables (CRC32 is linear: a record followed by its own CRC32 adds the
/// same to a block's CRC whatever it says), so lease recovery took them for identical.
/// The digest hashes the data instead.
#[tokio::test]
async fn replicas_of_different_self_checksummed_records_have_different_digests() {
    init_tracing();
    for kind in engines() {
        let (a, b) = (
            tempfile::tempdir().expect("a"),
            tempfile::tempdir().expect("b"),
        );
        let (sa, sb) = (
            Store::open(a.path(), engine(kind)).await.expect("a"),
            Store::open(b.path(), engine(kind)).await.expect("b"),
        );
        let tags: Vec<u8> = (0..16).collect();
        let old = self_checksummed(&tags);
        let mut new_tags = tags.clone();
        new_tags[15] = 99;
        let new = self_checksummed(&new_tags);
        assert_eq!(
            crc32fast::hash(&old),
            crc32fast::hash(&new),
            "the records are the kind CRC32 cannot tell apart"
        );
        for s in [&sa, &sb] {
            s.bump_version(H, v(1), true).await.expect("create");
            s.write(H, v(1), 0, Bytes::copy_from_slice(&old), true)
                .await
                .expect("write");
        }
        // The last slot overwritten in place on one replica only.
        sb.overwrite(
            H,
            v(1),
            15 * 512,
            Bytes::copy_from_slice(&new[15 * 512..]),
            true,
        )
        .await
        .expect("overwrite");
        let (da, db) = (
            sa.digest(H, v(1)).await.expect("a"),
            sb.digest(H, v(1)).await.expect("b"),
        );
        assert_eq!(da.replica.length, db.replica.length);
        assert_eq!(da.blocks, block_hashes(&old), "{kind:?}");
        assert_eq!(db.blocks, block_hashes(&new), "{kind:?}");
        assert_ne!(
            da.blocks, db.blocks,
            "{kind:?}: the digests tell them apart"
        );
    }
}

#[tokio::test]
async fn digest_requests_are_authenticated_and_gated_over_tcp() {
    for kind in engines() {
        let cluster = Cluster::new();
        let cs = cluster.start(1, kind).await;
        let mut c = connect(&cs).await;
        let ask = |version| {
            Signed::new(
                &cluster.key,
                cluster.issue(&cs),
                DigestReplica {
                    handle: H,
                    version: v(version),
                },
            )
            .expect("sign")
        };
        let refused = |e: stampfs_proto::Error| match e {
            stampfs_proto::Error::Remote(r) => r,
            other => panic!("transport error: {other}"),
        };
        // No replica.
        let e = refused(c.call(ask(1)).await.unwrap_err());
        assert!(matches!(e, RemoteError::NotFound { .. }), "{e}");
        bump(&cluster, &cs, H.0, 2).await;
        let mut w = Writer::open(&cs, cluster.token(H.0, 2), 0, vec![])
            .await
            .expect("setup");
        let data = pattern(BLOCK as usize + 4321, 4);
        w.send(0, 0, &data, true).await;
        assert_eq!(
            w.ack().await.expect("ack").replicas[0].result,
            Ok(data.len() as u64)
        );
        drop(w);
        // Signed with another key: refused as a forged command is; the connection
        // keeps serving.
        let forged = Signed::new(
            &stampfs_proto::ClusterKey::generate(),
            cluster.issue(&cs),
            DigestReplica {
                handle: H,
                version: v(2),
            },
        )
        .expect("sign");
        let e = refused(c.call(forged).await.unwrap_err());
        let forged_command = refused(
            c.call(
                Signed::new(
                    &stampfs_proto::ClusterKey::generate(),
                    cluster.issue(&cs),
                    ChunkCommand::Info { handle: H },
                )
                .expect("sign"),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(e, forged_command);
        // The gate.
        let e = refused(c.call(ask(1)).await.unwrap_err());
        assert!(
            matches!(
                e,
                RemoteError::StaleToken {
                    presented: ChunkVersion(1),
                    current: ChunkVersion(2),
                    ..
                }
            ),
            "{e}"
        );
        let e = refused(c.call(ask(3)).await.unwrap_err());
        assert!(
            matches!(
                e,
                RemoteError::ReplicaStale {
                    presented: ChunkVersion(3),
                    current: ChunkVersion(2),
                    ..
                }
            ),
            "{e}"
        );
        let ReplicaDigest { replica, blocks } = c.call(ask(2)).await.expect("digest");
        assert_eq!(
            (replica.handle, replica.version, replica.length),
            (H, v(2), data.len() as u64)
        );
        assert_eq!(blocks, block_hashes(&data));
        cs.shutdown().await.expect("shutdown");
    }
}
