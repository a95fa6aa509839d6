//! One write stream through a chain of chunkservers: setup, packets out, acks back.

use crate::error::{Error, Result};
use bytes::Bytes;
use stampfs_proto::codec::{Frame, FrameReader, FrameWriter};
use stampfs_proto::rpc::{parse_reply, request_frame};
use stampfs_proto::{
    Ack, ChunkToken, ChunkserverId, Packet, RemoteError, WriteGrant, WriteSetup, WriteSetupReply,
};
use std::time::Duration;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Acks buffered between the socket reader and the writer task; the window bounds
/// how many packets can be outstanding, so this never fills in practice.
const ACK_QUEUE: usize = 4096;

/// An open pipeline stream to the head chunkserver.
pub(crate) struct PipelineStream {
    writer: FrameWriter<OwnedWriteHalf>,
    /// Acks (or the reason the stream ended) from the reader task; closed when the
    /// reader task exits.
    acks: mpsc::Receiver<Result<Ack>>,
    /// The task reading acks off the socket; aborted when the stream is dropped.
    reader: tokio::task::JoinHandle<()>,
    pub(crate) head: ChunkserverId,
}

impl Drop for PipelineStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Why a setup failed: the head could not be reached, or it answered with an error.
pub(crate) enum SetupError {
    Head(ChunkserverId, Error),
    Rejected(RemoteError),
}

impl PipelineStream {
    /// Connects to the first replica of `grant` and opens a stream at chunk `offset`.
    pub(crate) async fn open(
        grant: &WriteGrant,
        offset: u64,
        timeout: Duration,
    ) -> std::result::Result<(Self, WriteSetupReply), SetupError> {
        let Some(head) = grant.pipeline.first() else {
            return Err(SetupError::Rejected(RemoteError::NotEnoughReplicas {
                live: 0,
                needed: 1,
            }));
        };
        let head_err = |e: Error| SetupError::Head(head.id, e);
        let stream = tokio::time::timeout(timeout, TcpStream::connect(&head.addr))
            .await
            .map_err(|_| {
                head_err(Error::Remote(RemoteError::Unavailable {
                    reason: format!("connecting to {} timed out", head.addr),
                }))
            })?
            .map_err(|e| head_err(Error::Io(e)))?;
        stream
            .set_nodelay(true)
            .map_err(|e| head_err(Error::Io(e)))?;
        let (r, w) = stream.into_split();
        let mut reader = FrameReader::new(r);
        let mut writer = FrameWriter::new(w);
        let setup = WriteSetup {
            token: grant.token,
            offset,
            downstream: grant.pipeline[1..].to_vec(),
        };
        let frame = request_frame(1, setup, Bytes::new()).map_err(|e| head_err(e.into()))?;
        writer
            .write_frame(&frame)
            .await
            .map_err(|e| head_err(e.into()))?;
        let reply = tokio::time::timeout(timeout, reader.read_frame())
            .await
            .map_err(|_| {
                head_err(Error::Remote(RemoteError::Unavailable {
                    reason: format!("{} did not answer the pipeline setup", head.addr),
                }))
            })?
            .map_err(|e| head_err(e.into()))?
            .ok_or_else(|| head_err(Error::Proto(stampfs_proto::Error::Truncated)))?;
        let reply: WriteSetupReply = match parse_reply(1, &reply) {
            Ok(r) => r,
            Err(stampfs_proto::Error::Remote(r)) => return Err(SetupError::Rejected(r)),
            Err(e) => return Err(head_err(e.into())),
        };
        let (tx, acks) = mpsc::channel(ACK_QUEUE);
        let reader = tokio::spawn(read_acks(reader, tx));
        Ok((
            Self {
                writer,
                acks,
                reader,
                head: head.id,
            },
            reply,
        ))
    }

    /// Queues one packet (not flushed).
    pub(crate) async fn send(
        &mut self,
        token: ChunkToken,
        seq: u64,
        offset: u64,
        crc: u32,
        sync: bool,
        data: Bytes,
    ) -> Result<()> {
        let frame = Frame::new(
            &Packet {
                token,
                seq,
                offset,
                crc,
                sync,
            },
            data,
        )?;
        self.writer.feed(&frame).await?;
        Ok(())
    }

    /// Pushes queued packets onto the socket.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        self.writer.flush().await?;
        Ok(())
    }

    /// The next ack; `None` once the stream has ended and every ack was taken.
    pub(crate) async fn next_ack(&mut self) -> Option<Result<Ack>> {
        self.acks.recv().await
    }

    /// Ends the stream cleanly (half-close; the chain drains and closes).
    pub(crate) async fn finish(mut self) {
        let _ = self.writer.shutdown().await;
    }
}

async fn read_acks(
    mut reader: FrameReader<tokio::net::tcp::OwnedReadHalf>,
    tx: mpsc::Sender<Result<Ack>>,
) {
    loop {
        let item = match reader.read_frame().await {
            Ok(Some(frame)) => frame.decode::<Ack>().map_err(Error::from),
            Ok(None) => Err(Error::Remote(RemoteError::Unavailable {
                reason: "the pipeline closed the stream".into(),
            })),
            Err(e) => Err(e.into()),
        };
        let end = item.is_err();
        if tx.send(item).await.is_err() || end {
            return;
        }
    }
}
