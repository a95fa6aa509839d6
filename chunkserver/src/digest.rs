//! `Digest`: the master's signed request for a hash of each block of a replica, which
//! lease recovery compares across the replicas of a chunk before it finalizes them
//! (DESIGN.md, "Writes at any offset", "Lease recovery compares content").
//!
//! The request is a [`Signed`] [`DigestReplica`] under its own MAC domain; one that
//! does not verify is refused like any master command ([`Error::BadCommand`]). The
//! replica must be at exactly the requested version (the gate); the answer is read
//! from the data, verified against its checksums, under the per-chunk lock
//! ([`Store::digest`]).
//!
//! [`Store::digest`]: crate::store::Store::digest

use crate::server::Shared;
use stampfs_proto::{DigestReplica, RemoteError, ReplicaDigest, Signed};

/// Authenticates and answers one [`DigestReplica`].
#[tracing::instrument(skip_all, fields(chunk = %req.body.handle, version = %req.body.version))]
pub(crate) async fn serve(
    shared: &Shared,
    req: Signed<DigestReplica>,
) -> std::result::Result<ReplicaDigest, RemoteError> {
    let req = shared
        .admit(req, "digest request")
        .map_err(|e| e.to_remote())?;
    match shared.store.digest(req.handle, req.version).await {
        Ok(digest) => {
            tracing::debug!(
                length = digest.replica.length,
                blocks = digest.blocks.len(),
                "replica digest"
            );
            Ok(digest)
        }
        Err(e) => {
            tracing::info!(error = %e, "replica digest refused");
            Err(e.to_remote())
        }
    }
}
