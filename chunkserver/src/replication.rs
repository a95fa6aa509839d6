//! Re-replication: copying a finalized replica to another chunkserver under the same
//! version, checksums verified on both ends.
//!
//! The source (on a master `Replicate` command) signs a token for `(handle, version,
//! ClientId::MASTER)` with the cluster key (the command carries none), connects to the
//! target and sends `ReceiveReplica { token, length }` as a request; the target answers
//! with a `WriteSetupReply` (or an error). The source then streams the replica as
//! 64 KiB [`Packet`]s, each read through the store (which verifies the block CRCs) and
//! carrying its own CRC32. The target checks every packet (token, CRC, contiguity),
//! writes a new replica in a temporary file, seals it finalized at `length`, renames
//! it into place (replacing an older-version replica) and answers one final [`Ack`]
//! whose only entry is its own result. Both sides then wake their heartbeat task so the
//! master hears about the change in the next chunk report.
//!
//! **Crash points** (`stampfs_proto::crash`): `copy-mid-stream` on the source,
//! `copy-before-rename` (in [`Incoming::finish`](crate::store::Incoming::finish)) and
//! `copy-before-ack` on the target.
//!
//! **A frozen peer** holds neither side forever; both apply `--idle-timeout`. The target
//! ends the copy when no packet arrives for that long (the same rule as an idle write
//! stream: every frame restarts the clock; the sender's 64 KiB packets make that "no
//! bytes for that long" for any link faster than about 1 KiB/s), answers the error if
//! it still can, and drops the unfinished [`Incoming`](crate::store::Incoming), which
//! removes its temporary file, exactly as when the sender closes early. Every write to
//! the peer, on both sides, goes through a [`StallGuard`]: a peer that takes no byte
//! for the idle timeout is gone (see [`crate::stall`]); the source's copy then fails,
//! gives back its `--max-replications` permit and is retried when the master asks again.

use crate::error::{Error, Result};
use crate::server::{Shared, StreamGuard};
use crate::stall::{self, GuardedWriteHalf};
use bytes::Bytes;
use stampfs_proto::net::ConnRead;
use stampfs_proto::rpc::reply_frame;
use stampfs_proto::{
    Ack, ChunkHandle, ChunkToken, ChunkVersion, ChunkserverAddr, ClientId, Frame, FrameReader,
    FrameWriter, Packet, ReceiveReplica, RemoteError, ReplicaAck, ReplicaReport, ReplicaState,
    RpcClient, WriteSetupReply, DEFAULT_PACKET_SIZE,
};
use std::net::SocketAddr;
use std::sync::Arc;

/// Starts copying the replica in the background (bounded by `--max-replications`).
pub(crate) fn spawn(
    shared: Arc<Shared>,
    handle: ChunkHandle,
    version: ChunkVersion,
    target: ChunkserverAddr,
) {
    let task_shared = shared.clone();
    shared.tracker.spawn(async move {
        let shared = task_shared;
        let Ok(_permit) = (tokio::select! {
            p = shared.replications.clone().acquire_owned() => p,
            _ = shared.cancel.cancelled() => return,
        }) else {
            return;
        };
        let outcome = tokio::select! {
            r = send(&shared, handle, version, &target) => r,
            _ = shared.cancel.cancelled() => return,
        };
        match outcome {
            Ok(length) => {
                tracing::info!(chunk = %handle, %version, target = %target.id, length, "replica copied")
            }
            Err(e) => {
                tracing::warn!(chunk = %handle, %version, target = %target.id, error = %e, "replication failed")
            }
        }
        shared.store.changed().notify_one();
    });
}

/// Copies the finalized replica at exactly `version` to `target`; returns its length.
#[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, target = %target.id))]
pub(crate) async fn send(
    shared: &Shared,
    handle: ChunkHandle,
    version: ChunkVersion,
    target: &ChunkserverAddr,
) -> Result<u64> {
    let report = shared.store.gated_info(handle, version).await?;
    if report.state != ReplicaState::Finalized {
        return Err(Error::bad_request(format!(
            "chunk {handle} is not finalized; only finalized replicas are copied"
        )));
    }
    let length = report.length;
    let token = ChunkToken::sign(&shared.key, handle, version, ClientId::MASTER);
    let timeout = shared.config.connect_timeout;
    let (r, w) = stall::dial(
        &shared.dialer,
        &target.addr,
        timeout,
        shared.config.idle_timeout,
    )
    .await?;
    let mut client = RpcClient::new(r, w);
    let setup =
        stampfs_proto::pause::timeout(timeout * 2, client.call(ReceiveReplica { token, length }))
            .await
            .map_err(|_| Error::Unavailable {
                reason: format!("{} did not answer the replica offer", target.id),
            })??;
    tracing::debug!(accepted = ?setup.accepted, "target accepted the replica");
    let (mut reader, mut writer) = client.into_parts();
    let mut offset = 0u64;
    let mut seq = 0u64;
    while offset < length {
        // Halfway through the packets, never after the last: the target has an
        // unfinished copy (only the offer, for a one-packet replica).
        stampfs_proto::crash_point!(
            "copy-mid-stream",
            if seq == length.div_ceil(DEFAULT_PACKET_SIZE as u64) / 2
        );
        let want = (DEFAULT_PACKET_SIZE as u64).min(length - offset);
        let (_, data) = shared.store.read(handle, version, offset, want).await?;
        if data.len() as u64 != want {
            return Err(Error::bad_request(format!(
                "chunk {handle} shrank while being copied"
            )));
        }
        let packet = Packet {
            token,
            seq,
            offset,
            crc: crc32fast::hash(&data),
            sync: false,
        };
        writer.feed(&Frame::new(&packet, data)?).await?;
        offset += want;
        seq += 1;
    }
    writer.flush().await?;
    let frame = stampfs_proto::pause::timeout(shared.config.ack_timeout, reader.read_frame())
        .await
        .map_err(|_| Error::Unavailable {
            reason: format!("{} did not confirm the replica", target.id),
        })??
        .ok_or_else(|| Error::Unavailable {
            reason: format!("{} closed before confirming the replica", target.id),
        })?;
    let ack: Ack = frame.decode()?;
    match ack.replicas.first().map(|r| &r.result) {
        Some(Ok(n)) if *n == length => Ok(length),
        Some(Ok(n)) => Err(Error::Unavailable {
            reason: format!("{} stored {n} of {length} bytes", target.id),
        }),
        Some(Err(e)) => Err(e.clone().into()),
        None => Err(Error::Unavailable {
            reason: format!("{} sent an empty ack", target.id),
        }),
    }
}

/// Serves a `ReceiveReplica` connection (this chunkserver is the target).
#[tracing::instrument(skip_all, fields(chunk = %req.token.handle, version = %req.token.version, length = req.length, %peer))]
pub(crate) async fn receive(
    shared: Arc<Shared>,
    id: u64,
    req: ReceiveReplica,
    mut reader: FrameReader<ConnRead>,
    mut writer: FrameWriter<GuardedWriteHalf>,
    peer: SocketAddr,
) {
    let own = shared.own_id();
    let token = req.token;
    let handle = token.handle;
    let started = async {
        token.verify(&shared.key).map_err(Error::from)?;
        shared
            .store
            .receive(handle, token.version, req.length)
            .await
    }
    .await;
    let mut incoming = match started {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, "replica refused");
            if let Ok(f) = reply_frame::<WriteSetupReply>(id, &Err(e.to_remote()), Bytes::new()) {
                let _ = writer.write_frame(&f).await;
            }
            return;
        }
    };
    let reply = WriteSetupReply {
        accepted: vec![own],
        failed: Vec::new(),
    };
    match reply_frame(id, &Ok(reply), Bytes::new()) {
        Ok(f) => {
            if writer.write_frame(&f).await.is_err() {
                return;
            }
        }
        Err(_) => return,
    }
    let _active = StreamGuard::new(&shared.active_streams);
    let idle_timeout = shared.config.idle_timeout;
    let mut last_seq = 0u64;
    let received: Result<ReplicaReport> = async {
        while incoming.received() < incoming.expected() {
            // The idle clock runs only while waiting for the next packet, not while the
            // previous one is written to disk.
            let frame = tokio::select! {
                f = stampfs_proto::pause::timeout(idle_timeout, reader.read_frame()) => match f {
                    Ok(f) => f?,
                    Err(_) => {
                        tracing::info!(%peer, ?idle_timeout, received = incoming.received(), "the sender fell silent; ending the copy");
                        return Err(Error::Unavailable {
                            reason: format!("no packet from the sender for {idle_timeout:?}"),
                        });
                    }
                },
                _ = shared.cancel.cancelled() => return Err(Error::Unavailable { reason: "shutting down".into() }),
            }
            .ok_or_else(|| Error::Unavailable {
                reason: "the sender closed before the end of the replica".into(),
            })?;
            let packet: Packet = frame.decode()?;
            if packet.token != token {
                return Err(Error::bad_request("packet token differs from the offer's"));
            }
            if crc32fast::hash(&frame.data) != packet.crc {
                return Err(Error::ChecksumMismatch {
                    handle,
                    offset: packet.offset,
                });
            }
            if packet.offset != incoming.received() {
                return Err(Error::bad_request(format!(
                    "packet at {} is not contiguous: expected {}",
                    packet.offset,
                    incoming.received()
                )));
            }
            last_seq = packet.seq;
            incoming.append(frame.data).await?;
        }
        incoming.finish(&shared.store).await
    }
    .await;
    // The replica is in place and durable; the source has not heard.
    stampfs_proto::crash_point!("copy-before-ack", if received.is_ok());
    let result: std::result::Result<u64, RemoteError> = match &received {
        Ok(r) => {
            tracing::info!(length = r.length, "replica received");
            Ok(r.length)
        }
        Err(e) => {
            tracing::warn!(error = %e, "receiving the replica failed");
            Err(e.to_remote())
        }
    };
    let ack = Ack {
        seq: last_seq,
        replicas: vec![ReplicaAck {
            chunkserver: own,
            result,
        }],
    };
    if let Ok(f) = Frame::message(&ack) {
        let _ = writer.write_frame(&f).await;
    }
    let _ = writer.shutdown().await;
}
