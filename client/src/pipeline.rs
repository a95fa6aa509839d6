//! One write stream through a chain of chunkservers: setup, packets out, acks back.
//!
//! Packets go out through a [`FrameSink`]: each frame's 12-byte prefix and bincode
//! header are built in a small buffer, the payload is the packet's own buffer (never
//! copied), and queued frames leave in one vectored write. The frame CRC is derived
//! from the packet CRC the writer already computed (CRC combination), so the payload
//! is checksummed once on the client, not twice.

use crate::error::{Error, Result};
use bytes::Bytes;
use stampfs_proto::codec::{Frame, FrameReader, FrameSink};
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
    writer: FrameSink<OwnedWriteHalf>,
    /// Acks (or the reason the stream ended) from the reader task; closed when the
    /// reader task exits.
    acks: mpsc::Receiver<Result<Ack>>,
    /// The task reading acks off the socket; aborted when the stream is dropped.
    reader: tokio::task::JoinHandle<()>,
    pub(crate) head: ChunkserverId,
    /// How long an outstanding packet may wait for its ack, and a send for the
    /// socket, before the head counts as failed (a frozen head never answers).
    ack_timeout: Duration,
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
        ack_timeout: Duration,
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
        let mut writer = FrameSink::new(w);
        let setup = WriteSetup {
            token: grant.token,
            offset,
            downstream: grant.pipeline[1..].to_vec(),
        };
        let frame = request_frame(1, setup, Bytes::new()).map_err(|e| head_err(e.into()))?;
        writer.feed_frame(&frame).map_err(|e| head_err(e.into()))?;
        writer.flush().await.map_err(|e| head_err(e.into()))?;
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
                ack_timeout,
            },
            reply,
        ))
    }

    /// Queues one packet (written once enough is queued, or by `flush`). `crc` is the
    /// CRC of `data`.
    pub(crate) async fn send(
        &mut self,
        token: ChunkToken,
        seq: u64,
        offset: u64,
        crc: u32,
        sync: bool,
        data: Bytes,
    ) -> Result<()> {
        let packet = Packet {
            token,
            seq,
            offset,
            crc,
            sync,
        };
        match tokio::time::timeout(
            self.ack_timeout,
            self.writer.feed(&Frame::new(&packet, data)?, crc),
        )
        .await
        {
            Ok(res) => res.map_err(Error::from),
            Err(_) => Err(self.stalled("accept data")),
        }
    }

    /// Pushes queued packets onto the socket.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        match tokio::time::timeout(self.ack_timeout, self.writer.flush()).await {
            Ok(res) => res.map_err(Error::from),
            Err(_) => Err(self.stalled("accept data")),
        }
    }

    /// The next ack; `None` once the stream has ended and every ack was taken. An
    /// error when none arrives within the ack timeout.
    pub(crate) async fn next_ack(&mut self) -> Option<Result<Ack>> {
        match tokio::time::timeout(self.ack_timeout, self.acks.recv()).await {
            Ok(ack) => ack,
            Err(_) => Some(Err(self.stalled("acknowledge"))),
        }
    }

    fn stalled(&self, what: &str) -> Error {
        Error::Remote(RemoteError::Unavailable {
            reason: format!(
                "pipeline head {} did not {what} within {:?}",
                self.head, self.ack_timeout
            ),
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::{ChunkHandle, ChunkVersion, ClientId, ClusterKey};

    fn packet(seq: u64, crc: u32) -> Packet {
        let key = ClusterKey::from_bytes([7; 32]);
        Packet {
            token: ChunkToken::sign(&key, ChunkHandle(3), ChunkVersion(4), ClientId(5)),
            seq,
            offset: seq * 10,
            crc,
            sync: seq % 2 == 0,
        }
    }

    #[tokio::test]
    async fn sink_frames_are_byte_identical_to_the_codec() {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let mut sink = FrameSink::new(a);
        let mut expected = Vec::new();
        for (seq, len) in [(0u64, 0usize), (1, 1), (2, 70_000), (3, 4096)] {
            let data = Bytes::from(
                (0..len)
                    .map(|i| (i * 7 + seq as usize) as u8)
                    .collect::<Vec<_>>(),
            );
            let crc = crc32fast::hash(&data);
            let p = packet(seq, crc);
            expected.extend_from_slice(
                &Frame::new(&p, data.clone())
                    .expect("frame")
                    .to_bytes()
                    .expect("bytes"),
            );
            let frame = Frame::new(&p, data).expect("frame");
            sink.feed(&frame, crc).await.expect("feed");
        }
        let setup = Frame::message(&9u32).expect("frame");
        expected.extend_from_slice(&setup.to_bytes().expect("bytes"));
        sink.feed_frame(&setup).expect("feed frame");
        let writer = tokio::spawn(async move {
            sink.shutdown().await.expect("shutdown");
        });
        let mut got = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut b, &mut got)
            .await
            .expect("read");
        writer.await.expect("join");
        assert_eq!(got.len(), expected.len());
        assert!(
            got == expected,
            "the sink must write exactly what the codec would"
        );
        // And the codec reads them back.
        let mut reader = FrameReader::new(&got[..]);
        for seq in 0..4u64 {
            let f = reader.read_frame().await.expect("read").expect("frame");
            assert_eq!(f.decode::<Packet>().expect("decode").seq, seq);
        }
    }
}
