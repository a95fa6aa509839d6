//! The downstream side of a stream: set-up with the next chunkserver (the same kind of
//! stream as this one's), forwarding packets to it and matching its acks.

use super::WriteMode;
use crate::server::Shared;
use crate::stall::{self, GuardedWriteHalf};
use bytes::Bytes;
use stampfs_proto::net::{ConnRead, Dialer};
use stampfs_proto::rpc::{parse_reply, request_frame};
use stampfs_proto::{
    Ack, ChunkserverId, Frame, FrameReader, FrameSink, OverwriteSetup, RemoteError, ReplicaAck,
    WriteSetup, WriteSetupReply,
};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A packet on its way downstream, as [`forward`] takes it.
pub(super) struct ForwardJob {
    pub(super) frame: Frame,
    /// CRC of the frame's data (verified on arrival).
    pub(super) crc: u32,
    pub(super) seq: u64,
    /// Passed on to `read_downstream`, which fills it with the downstream's ack
    /// entries; dropping it unfilled means the downstream was lost.
    pub(super) result: oneshot::Sender<Vec<ReplicaAck>>,
}

pub(super) type Expectation = (u64, oneshot::Sender<Vec<ReplicaAck>>);

/// Connects to `addr` and opens the stream there with `setup`, sent as a `WriteSetup`
/// or an `OverwriteSetup` by `mode` (what `RpcClient` would do, keeping the raw write
/// half for the [`FrameSink`]). Writes to it fail once it has taken no byte for
/// `stall` (see [`crate::stall`]).
async fn open_downstream(
    dialer: &Dialer,
    addr: &str,
    setup: WriteSetup,
    mode: WriteMode,
    timeout: Duration,
    stall: Duration,
) -> stampfs_proto::Result<(
    FrameReader<ConnRead>,
    FrameSink<GuardedWriteHalf>,
    WriteSetupReply,
)> {
    let (r, w) = stall::dial(dialer, addr, timeout, stall).await?;
    let mut reader = FrameReader::new(r);
    let mut sink = FrameSink::new(w);
    let frame = match mode {
        WriteMode::Append => request_frame(1, setup, Bytes::new())?,
        WriteMode::Overwrite => request_frame(1, OverwriteSetup { setup }, Bytes::new())?,
    };
    sink.feed_frame(&frame)?;
    sink.flush().await?;
    let frame = reader
        .read_frame()
        .await?
        .ok_or(stampfs_proto::Error::Truncated)?;
    let reply = parse_reply(1, &frame)?;
    Ok((reader, sink, reply))
}

/// The downstream side after set-up.
pub(super) struct Downstream {
    pub(super) link: Option<(FrameReader<ConnRead>, FrameSink<GuardedWriteHalf>)>,
    pub(super) accepted: Vec<ChunkserverId>,
    pub(super) failed: Vec<(ChunkserverId, RemoteError)>,
}

/// Opens the stream with the first reachable chunkserver of `setup.downstream` that
/// accepts it, the rest of the chain behind it; those that fail are listed.
pub(super) async fn connect_downstream(
    shared: &Shared,
    setup: &WriteSetup,
    mode: WriteMode,
) -> Downstream {
    let mut failed = Vec::new();
    let timeout = shared.config.connect_timeout;
    for (i, target) in setup.downstream.iter().enumerate() {
        let rest = setup.downstream[i + 1..].to_vec();
        // The next chunkserver may itself wait for the ones after it.
        let budget = timeout * (rest.len() as u32 + 2);
        let attempt = open_downstream(
            &shared.dialer,
            &target.addr,
            WriteSetup {
                token: setup.token,
                offset: setup.offset,
                downstream: rest,
            },
            mode,
            timeout,
            shared.config.ack_timeout,
        );
        let outcome = match stampfs_proto::pause::timeout(budget, attempt).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => Err(e.to_remote()),
            Err(_) => Err(RemoteError::Unavailable {
                reason: format!("pipeline set-up with {} timed out", target.id),
            }),
        };
        match outcome {
            Ok((reader, sink, reply)) => {
                failed.extend(reply.failed);
                return Downstream {
                    link: Some((reader, sink)),
                    accepted: reply.accepted,
                    failed,
                };
            }
            Err(e) => {
                tracing::warn!(downstream = %target.id, addr = %target.addr, error = %e, "downstream refused or unreachable; skipping it");
                failed.push((target.id, e));
            }
        }
    }
    Downstream {
        link: None,
        accepted: Vec::new(),
        failed,
    }
}

/// Sends packets downstream in order, registering each one's ack expectation first.
pub(super) async fn forward(
    mut writer: FrameSink<GuardedWriteHalf>,
    mut rx: mpsc::Receiver<ForwardJob>,
    expect: mpsc::Sender<Expectation>,
) {
    while let Some(job) = rx.recv().await {
        if expect.send((job.seq, job.result)).await.is_err() {
            return;
        }
        if let Err(e) = writer.feed(&job.frame, job.crc).await {
            tracing::warn!(error = %e, "downstream write failed");
            return;
        }
        if rx.is_empty() {
            if let Err(e) = writer.flush().await {
                tracing::warn!(error = %e, "downstream write failed");
                return;
            }
        }
    }
    let _ = writer.shutdown().await;
}

/// Matches downstream acks to the packets sent, in order. Returning drops every
/// outstanding expectation, which the acker reports as a lost downstream.
pub(super) async fn read_downstream(
    mut reader: FrameReader<ConnRead>,
    mut expect: mpsc::Receiver<Expectation>,
    ack_timeout: Duration,
) {
    while let Some((seq, result)) = expect.recv().await {
        let frame = match stampfs_proto::pause::timeout(ack_timeout, reader.read_frame()).await {
            Ok(Ok(Some(f))) => f,
            Ok(Ok(None)) => {
                tracing::warn!(seq, "downstream closed the pipeline");
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(seq, error = %e, "downstream connection failed");
                return;
            }
            Err(_) => {
                tracing::warn!(seq, timeout = ?ack_timeout, "downstream ack timed out");
                return;
            }
        };
        let ack: Ack = match frame.decode() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(seq, error = %e, "undecodable downstream ack");
                return;
            }
        };
        if ack.seq != seq {
            tracing::warn!(
                expected = seq,
                got = ack.seq,
                "downstream acked out of order"
            );
            return;
        }
        let _ = result.send(ack.replicas);
    }
}
