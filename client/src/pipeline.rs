//! One write stream through a chain of chunkservers: setup, packets out, acks back.
//!
//! Packets go out through a [`FrameSink`]: each frame's 12-byte prefix and bincode
//! header are built in a small buffer, the payload is the packet's own buffer (never
//! copied), and queued frames leave in one vectored write. The frame CRC is derived
//! from the packet CRC the writer already computed (CRC combination), so the payload
//! is checksummed once on the client, not twice.
//!
//! The ack reader tells how a stream ended ([`StreamEnd`]): the head *closed* the
//! connection (EOF, reset, broken pipe; a chunkserver does that to a stream that was
//! silent for its `--idle-timeout`), or the stream *broke* (a malformed frame, no ack
//! within the ack timeout). The writer decides from that, and from what it had in
//! flight, whether to blame the head (`writer::policy::after_stream_end`).

use crate::client::connection_closed;
use crate::error::{Error, Result};
use bytes::Bytes;
use stampfs_proto::codec::{Frame, FrameReader, FrameSink};
use stampfs_proto::net::{ConnRead, ConnWrite, Dialer};
use stampfs_proto::rpc::{parse_reply, request_frame};
use stampfs_proto::{
    Ack, ChunkToken, ChunkserverId, OverwriteSetup, Packet, RemoteError, WriteGrant, WriteSetup,
    WriteSetupReply,
};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Acks buffered between the socket reader and the writer task; the window bounds
/// how many packets can be outstanding, so this never fills in practice.
const ACK_QUEUE: usize = 4096;

/// How a pipeline stream ended, as far as the client can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// The head closed the connection: a clean EOF, a reset or a broken pipe. A head
    /// that is alive does this to a stream it found idle; a dead one looks the same.
    Closed,
    /// Anything else: a malformed or undecodable frame, an ack or a send that did not
    /// complete within the ack timeout.
    Broken,
}

impl StreamEnd {
    /// Classifies the error a read or a send on the stream failed with.
    pub(crate) fn of(e: &Error) -> Self {
        let closed = match e {
            Error::Proto(stampfs_proto::Error::Io(io)) | Error::Io(io) => {
                connection_closed(io.kind())
            }
            _ => false,
        };
        if closed {
            StreamEnd::Closed
        } else {
            StreamEnd::Broken
        }
    }
}

/// What the ack reader hands the writer.
pub(crate) enum Incoming {
    Ack(Ack),
    /// The stream is over: how, and the error to report. Always the last item.
    End(StreamEnd, Error),
}

/// What happened on a stream the writer watches.
pub(crate) enum StreamEvent {
    /// An ack or the end of the stream; `None` if the reader went away silently.
    Incoming(Option<Incoming>),
    /// Nothing was sent or received for the writer's idle close, with nothing in flight.
    Idle,
}

/// An open pipeline stream to the head chunkserver.
pub(crate) struct PipelineStream {
    writer: FrameSink<ConnWrite>,
    /// Acks (then how the stream ended) from the reader task; closed when the reader
    /// task exits.
    acks: mpsc::Receiver<Incoming>,
    /// The task reading acks off the socket; aborted when the stream is dropped.
    reader: tokio::task::JoinHandle<()>,
    pub(crate) head: ChunkserverId,
    /// How long an outstanding packet may wait for its ack, and a send for the
    /// socket, before the head counts as failed (a frozen head never answers).
    ack_timeout: Duration,
    /// The last time a packet was queued or an ack taken (or the stream set up): the
    /// head's idle clock runs from about then.
    last_activity: Instant,
}

impl Drop for PipelineStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Why a setup failed: the head could not be reached, or it answered with an error.
#[derive(Debug)]
pub(crate) enum SetupError {
    Head(ChunkserverId, Error),
    Rejected(RemoteError),
}

impl PipelineStream {
    /// Connects to the first replica of `grant` and opens a stream at chunk `offset`:
    /// an append stream (`WriteSetup`, which cuts a longer replica there) or, with
    /// `overwrite`, an overwrite stream (`OverwriteSetup`: packets at any offset up to
    /// the replica's length, nothing cut).
    pub(crate) async fn open(
        dialer: &Dialer,
        grant: &WriteGrant,
        offset: u64,
        overwrite: bool,
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
        let conn = dialer
            .connect(&head.addr, timeout)
            .await
            .map_err(|e| head_err(e.into()))?;
        let mut reader = FrameReader::new(conn.read);
        let mut writer = FrameSink::new(conn.write);
        let setup = WriteSetup {
            token: grant.token,
            offset,
            downstream: grant.pipeline[1..].to_vec(),
        };
        let frame = if overwrite {
            request_frame(1, OverwriteSetup { setup }, Bytes::new())
        } else {
            request_frame(1, setup, Bytes::new())
        }
        .map_err(|e| head_err(e.into()))?;
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
                last_activity: Instant::now(),
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
        self.last_activity = Instant::now();
        match stampfs_proto::pause::timeout(
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
        match stampfs_proto::pause::timeout(self.ack_timeout, self.writer.flush()).await {
            Ok(res) => res.map_err(Error::from),
            Err(_) => Err(self.stalled("accept data")),
        }
    }

    /// The next ack (while packets are in flight); `None` once the stream has ended
    /// and every item was taken. A [`StreamEnd::Broken`] end when none arrives within
    /// the ack timeout.
    pub(crate) async fn next_ack(&mut self) -> Option<Incoming> {
        let item = match stampfs_proto::pause::timeout(self.ack_timeout, self.acks.recv()).await {
            Ok(item) => item,
            Err(_) => Some(Incoming::End(
                StreamEnd::Broken,
                self.stalled("acknowledge"),
            )),
        };
        self.last_activity = Instant::now();
        item
    }

    /// Watches a stream with nothing in flight: returns what the reader delivers (at
    /// rest that can only be the end of the stream), or [`StreamEvent::Idle`] once
    /// nothing was sent or received for `idle_close` (never when `None`).
    pub(crate) async fn watch_at_rest(&mut self, idle_close: Option<Duration>) -> StreamEvent {
        let deadline = idle_close.and_then(|d| self.last_activity.checked_add(d));
        let idle = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            item = self.acks.recv() => StreamEvent::Incoming(item),
            () = idle => StreamEvent::Idle,
        }
    }

    /// The end of a stream whose ack reader has already stopped (the head closed it
    /// while the writer was not looking), skipping acks nobody waits for; `None` while
    /// the stream is still up.
    pub(crate) fn take_end(&mut self) -> Option<Incoming> {
        if !self.reader.is_finished() {
            return None;
        }
        loop {
            match self.acks.try_recv() {
                Ok(Incoming::Ack(_)) => continue,
                Ok(end) => return Some(end),
                Err(_) => {
                    return Some(Incoming::End(
                        StreamEnd::Closed,
                        Error::Remote(RemoteError::Unavailable {
                            reason: "the pipeline closed the stream".into(),
                        }),
                    ))
                }
            }
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

async fn read_acks(mut reader: FrameReader<ConnRead>, tx: mpsc::Sender<Incoming>) {
    loop {
        let item = match reader.read_frame().await {
            Ok(Some(frame)) => match frame.decode::<Ack>() {
                Ok(ack) => Incoming::Ack(ack),
                Err(e) => Incoming::End(StreamEnd::Broken, e.into()),
            },
            Ok(None) => Incoming::End(
                StreamEnd::Closed,
                Error::Remote(RemoteError::Unavailable {
                    reason: "the pipeline closed the stream".into(),
                }),
            ),
            Err(e) => {
                let e = Error::from(e);
                Incoming::End(StreamEnd::of(&e), e)
            }
        };
        let end = matches!(item, Incoming::End(..));
        if tx.send(item).await.is_err() || end {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stampfs_proto::rpc::{parse_request, reply_frame};
    use stampfs_proto::{
        ChunkHandle, ChunkRequest, ChunkVersion, ChunkserverAddr, ClientId, ClusterKey, FrameWriter,
    };
    use tokio::net::TcpListener;

    const WAIT: Duration = Duration::from_secs(10);

    fn grant(addr: String) -> WriteGrant {
        let key = ClusterKey::from_bytes([7; 32]);
        WriteGrant {
            token: ChunkToken::sign(&key, ChunkHandle(3), ChunkVersion(4), ClientId(5)),
            chunk_index: 0,
            file_offset: 0,
            chunk_offset: 0,
            chunk_size: 1 << 20,
            pipeline: vec![ChunkserverAddr {
                id: ChunkserverId(1),
                addr,
            }],
        }
    }

    /// A stand-in head on a real loopback socket: accepts one stream and answers its
    /// set-up; the caller decides what happens next.
    async fn open_against_head() -> (
        PipelineStream,
        FrameReader<tokio::net::tcp::OwnedReadHalf>,
        FrameWriter<tokio::net::tcp::OwnedWriteHalf>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let head = tokio::spawn(async move {
            let (s, _) = listener.accept().await.expect("accept");
            let (r, w) = s.into_split();
            let mut reader = FrameReader::new(r);
            let mut writer = FrameWriter::new(w);
            let f = reader.read_frame().await.expect("read").expect("setup");
            let (id, req): (u64, ChunkRequest) = parse_request(&f).expect("parse");
            assert!(matches!(req, ChunkRequest::WriteSetup(_)));
            let reply = WriteSetupReply {
                accepted: vec![ChunkserverId(1)],
                failed: Vec::new(),
            };
            let frame = reply_frame(id, &Ok(reply), Bytes::new()).expect("frame");
            writer.write_frame(&frame).await.expect("reply");
            (reader, writer)
        });
        let (stream, _) = match PipelineStream::open(
            &Dialer::plain(),
            &grant(addr),
            0,
            false,
            WAIT,
            WAIT,
        )
        .await
        {
            Ok(s) => s,
            Err(_) => panic!("set-up failed"),
        };
        let (reader, writer) = head.await.expect("head");
        (stream, reader, writer)
    }

    #[tokio::test]
    async fn a_head_that_closes_a_stream_at_rest_is_seen_as_a_close() {
        let (mut stream, reader, writer) = open_against_head().await;
        drop((reader, writer));
        match tokio::time::timeout(WAIT, stream.watch_at_rest(None)).await {
            Ok(StreamEvent::Incoming(Some(Incoming::End(StreamEnd::Closed, _)))) => {}
            Ok(_) => panic!("expected a closed stream"),
            Err(_) => panic!("the close was not noticed"),
        }
    }

    #[tokio::test]
    async fn a_close_the_writer_did_not_watch_is_found_before_sending() {
        let (mut stream, reader, writer) = open_against_head().await;
        assert!(stream.take_end().is_none(), "the stream is up");
        drop((reader, writer));
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(end) = stream.take_end() {
                    return end;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the close was not noticed");
        assert!(matches!(found, Incoming::End(StreamEnd::Closed, _)));
    }

    #[tokio::test]
    async fn garbage_from_the_head_is_a_broken_stream() {
        let (mut stream, _reader, mut writer) = open_against_head().await;
        let garbage = Frame::message(&"not an ack".to_string()).expect("frame");
        writer.write_frame(&garbage).await.expect("write");
        match tokio::time::timeout(WAIT, stream.watch_at_rest(None)).await {
            Ok(StreamEvent::Incoming(Some(Incoming::End(StreamEnd::Broken, _)))) => {}
            Ok(_) => panic!("expected a broken stream"),
            Err(_) => panic!("the garbage was not noticed"),
        }
    }

    #[tokio::test]
    async fn a_silent_stream_at_rest_reaches_the_writers_idle_close() {
        let (mut stream, _reader, _writer) = open_against_head().await;
        let idle = Duration::from_millis(50);
        match tokio::time::timeout(WAIT, stream.watch_at_rest(Some(idle))).await {
            Ok(StreamEvent::Idle) => {}
            Ok(_) => panic!("expected the idle close"),
            Err(_) => panic!("the idle close never came"),
        }
    }

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
