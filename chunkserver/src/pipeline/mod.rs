//! The write pipeline: one stream per `WriteSetup` or `OverwriteSetup` connection.
//!
//! **Two kinds of stream, one machinery.** An append stream (`WriteSetup`) writes
//! packets at the end of the replica; an overwrite stream (`OverwriteSetup`, DESIGN.md
//! "Writes at any offset") writes each packet at its own offset, anywhere up to the
//! replica's length, in place below it. Both go through the same parts, checks and
//! acks below; the kind ([`WriteMode`]) decides the set-up (append: cut; overwrite:
//! never cut), how a packet past the end is refused (append: not contiguous;
//! overwrite: `ReplicaShort`), how the store writes the batch
//! ([`Store::write_batch`](crate::store::Store::write_batch)), the set-up forwarded
//! downstream (the same kind), and the end (an overwrite stream's end flushes the
//! replica and clears its overwrite marks,
//! [`Store::close_overwrite`](crate::store::Store::close_overwrite)).
//!
//! **Set-up.** The token is authenticated and gated under the per-chunk lock. For an
//! append stream, bytes beyond the setup offset (an unacknowledged tail of the writer
//! holding this version: pipeline recovery) are cut, a gap before it is refused; an
//! overwrite stream's set-up only requires the offset within the replica. Then the next chunkserver is
//! connected and sent the same setup with the rest of the chain. A downstream that
//! cannot be reached or refuses is listed in `failed` and the next one is tried in its
//! place; the reply lists `accepted` (this replica first) and `failed`.
//!
//! **Stream.** Five concurrent parts, joined in one task:
//!
//! ```text
//! upstream ──frames──▶ read_upstream ─┬─▶ write_local ──────────────────────┐ (result per seq)
//!                      (MAC, CRC,     ├─▶ forward ──frames──▶ downstream    │
//!                       offset,       │                     │               │
//!                       byte permits) │   read_downstream ◀─acks            │ (acks per seq)
//!                                     └─▶ ack_upstream ◀────────────────────┘
//! upstream ◀──acks── ack_upstream (in seq order, once local write AND downstream ack are done)
//! ```
//!
//! Every packet holds byte permits from a per-stream semaphore from the moment it is
//! read until its ack is written, so a slow downstream (or a slow upstream reader of
//! acks) stops this stream from reading: backpressure, never unbounded memory.
//! A packet rejected here (bad MAC, CRC, gap) is not forwarded; its ack lists only this
//! replica. After a local failure the failing seq is acked with the error and the
//! stream is closed. If the downstream connection dies (or its ack does not arrive
//! within `--ack-timeout`), its replicas' entries become `Unavailable`, naming it, and
//! the stream goes on locally.
//!
//! **Idle streams.** An upstream that sends no frame for `--idle-timeout` while none of
//! its packets is outstanding (received and not yet acknowledged) is treated as gone:
//! the stream ends exactly as on an upstream EOF (the parts drain, the downstream is
//! half-closed, the upstream socket is shut down), so a frozen or vanished writer can
//! not pin a stream, its connection permit and its downstream streams forever. The
//! clock restarts on every frame received and every ack sent, so only silence counts;
//! while a packet is outstanding the ack timeout is what applies ([`idle_check`]).
//!
//! **Peers that stop reading.** Idleness is about what a peer sends; the other
//! direction is bounded by progress ([`crate::stall`]): the acks (and the set-up reply)
//! go to the upstream through the connection's [`StallGuard`], so an upstream that
//! takes no byte of them for `--idle-timeout` is gone and the stream ends as on a broken socket (its packets'
//! byte permits would otherwise stay held, and with them the stream, forever).
//! Forwarded packets go downstream through a guard with `--ack-timeout`: a downstream
//! that takes no byte for as long as an ack may take is lost like one whose ack did not
//! come, and the stream goes on locally.
//!
//! **Throughput.** `write_local` takes whatever packets queued up while the previous
//! write was on disk as one batch ([`Store::write_batch`](crate::store::Store::write_batch)):
//! one hold of the per-chunk lock in which every packet still passes the version gate
//! in turn, one vectored write. Forwarding goes through a `FrameSink`: the frame CRC
//! is combined from the packet CRC verified on arrival ([`frame_prefix`](stampfs_proto::codec::frame_prefix)) and queued
//! frames leave in one vectored write; acks that are ready together are flushed
//! together.

mod ack;
mod checks;
mod downstream;
mod idle;
mod stream;

pub use ack::{compose_ack, DownResult};
pub use checks::next_offset;
pub use idle::{idle_check, Idleness};

use crate::error::Error;
use crate::server::{Shared, StreamGuard};
use crate::stall::GuardedWriteHalf;
pub use crate::store::WriteMode;
use bytes::Bytes;
use downstream::connect_downstream;
use idle::Activity;
use stampfs_proto::net::ConnRead;
use stampfs_proto::rpc::reply_frame;
use stampfs_proto::{FrameReader, FrameWriter, WriteSetup, WriteSetupReply};
use std::net::SocketAddr;
use std::sync::Arc;
use stream::Stream;

/// Packets queued between the parts of a stream (bytes are bounded by permits).
const QUEUE: usize = 1024;
/// Most packets written to disk as one batch (one lock hold, one I/O chain).
const MAX_BATCH: usize = 128;
/// Most chunkservers a setup may list downstream.
pub const MAX_DOWNSTREAM: usize = 16;

/// Serves a `WriteSetup` (`mode` append) or `OverwriteSetup` (`mode` overwrite)
/// connection to its end.
#[tracing::instrument(skip_all, fields(chunk = %setup.token.handle, version = %setup.token.version, offset = setup.offset, ?mode, %peer))]
pub(crate) async fn serve(
    shared: Arc<Shared>,
    id: u64,
    setup: WriteSetup,
    mode: WriteMode,
    reader: FrameReader<ConnRead>,
    mut writer: FrameWriter<GuardedWriteHalf>,
    peer: SocketAddr,
) {
    let _active = StreamGuard::new(&shared.active_streams);
    let own = shared.own_id();
    let (handle, version) = (setup.token.handle, setup.token.version);
    let local = async {
        setup.token.verify(&shared.key).map_err(Error::from)?;
        if setup.downstream.len() > MAX_DOWNSTREAM {
            return Err(Error::bad_request(format!(
                "a pipeline of {} downstream chunkservers exceeds the limit of {MAX_DOWNSTREAM}",
                setup.downstream.len()
            )));
        }
        match mode {
            WriteMode::Append => {
                shared
                    .store
                    .open_for_write(handle, version, setup.offset)
                    .await
            }
            WriteMode::Overwrite => {
                shared
                    .store
                    .open_for_overwrite(handle, version, setup.offset)
                    .await
            }
        }
    }
    .await;
    let report = match local {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "write stream refused");
            if let Ok(frame) = reply_frame::<WriteSetupReply>(id, &Err(e.to_remote()), Bytes::new())
            {
                let _ = writer.write_frame(&frame).await;
            }
            return;
        }
    };
    // Where a packet may start at most: an append stream's next byte; anywhere in the
    // replica for an overwrite stream (the store checks again, against its length).
    let expected = match mode {
        WriteMode::Append => setup.offset,
        WriteMode::Overwrite => report.length.max(setup.offset),
    };
    let down = tokio::select! {
        d = connect_downstream(&shared, &setup, mode) => d,
        _ = shared.cancel.cancelled() => return,
    };
    let reply = WriteSetupReply {
        accepted: std::iter::once(own)
            .chain(down.accepted.iter().copied())
            .collect(),
        failed: down.failed,
    };
    tracing::info!(accepted = ?reply.accepted, failed = ?reply.failed, "write stream open");
    match reply_frame(id, &Ok(reply), Bytes::new()) {
        Ok(frame) => {
            if writer.write_frame(&frame).await.is_err() {
                return;
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the setup reply");
            return;
        }
    }
    let stream = Stream {
        shared: shared.clone(),
        handle,
        mode,
        own,
        down_ids: down.accepted,
        peer,
        activity: Activity::new(),
        stop: shared.cancel.child_token(),
    };
    stream
        .run(setup.token, expected, reader, writer, down.link)
        .await;
    if mode == WriteMode::Overwrite {
        if let Err(e) = shared.store.close_overwrite(handle).await {
            tracing::warn!(error = %e, "cannot clear the overwrite marks at the end of the stream");
        }
    }
    tracing::info!("write stream closed");
}
