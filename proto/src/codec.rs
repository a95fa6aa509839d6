//! The frame codec: how every stampfs message crosses a socket.
//!
//! ```text
//! frame  := len:u32be | crc:u32be | body[len]
//! body   := hlen:u32be | header[hlen] | data[len - 4 - hlen]
//! crc    := crc32(body)                          (crc32fast, IEEE)
//! header := bincode 2, `standard()` config (varint integers), at most MAX_HEADER_LEN
//! data   := raw bytes (a packet's payload, a read's result), never inside bincode
//! ```
//!
//! Limits are checked before anything is allocated: `len <= MAX_FRAME_LEN`,
//! `hlen <= MAX_HEADER_LEN` and `hlen <= len - 4`. The body buffer grows as bytes
//! actually arrive, so a peer that announces a large frame and sends nothing costs
//! nothing. A frame whose CRC does not match is an error; the caller closes that
//! connection.
//!
//! A header is decoded under a bincode byte limit chosen from its own length
//! ([`decode_limit`]), so a length field inside a small header cannot make bincode
//! allocate more than a small multiple of the bytes that actually arrived: a 20-byte
//! header that claims a 16 MiB string fails after at most a few KiB, not 16 MiB.
//! bincode's limit counts *memory*, not input: a container of `len` elements claims
//! `len * size_of::<T>()` before it allocates, and every integer claims its in-memory
//! width (a one-byte varint `u64` claims 8). A legitimate header therefore needs a
//! limit of up to [`DECODE_EXPANSION`] times its length; the limit is the smallest of
//! [`DECODE_LIMITS`] that covers that (bincode's limit is a const generic, hence
//! tiers), and never more than [`MAX_HEADER_LEN`]. The wire format does not depend on
//! the limit.

use crate::error::{Error, Result};
use bincode::error::DecodeError;
use bincode::{Decode, Encode};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};

/// Largest body a frame may announce.
pub const MAX_FRAME_LEN: usize = 32 << 20;
/// Largest bincode header inside a frame.
pub const MAX_HEADER_LEN: usize = 16 << 20;
/// Largest raw data section inside a frame.
pub const MAX_DATA_LEN: usize = 16 << 20;
/// Bytes before the body: length and CRC.
pub const PREFIX_LEN: usize = 8;
/// How much the body buffer grows by at most per read, so memory follows real bytes.
const READ_STEP: usize = 1 << 20;

/// How many bytes of decoded memory one header byte may stand for (see the module
/// docs). The densest wire messages need about 20: a [`crate::ReplicaAck`] is 56 bytes
/// in memory and may encode in 3, and its integers claim their full width as they
/// decode; a list of `None::<ReplicaReport>` needs 33 (32 bytes in memory, 1 on the
/// wire). 64 leaves room for types added later; the `decode_limits` tests decode the
/// densest message of every wire type at each tier's edge and fail if one outgrows it.
pub const DECODE_EXPANSION: usize = 64;

const LIMIT_4K: usize = 4 << 10;
const LIMIT_32K: usize = 32 << 10;
const LIMIT_256K: usize = 256 << 10;
const LIMIT_2M: usize = 2 << 20;

/// The byte limits a header is decoded under, smallest first; each is eight times the
/// one before and the last is [`MAX_HEADER_LEN`].
pub const DECODE_LIMITS: [usize; 5] = [LIMIT_4K, LIMIT_32K, LIMIT_256K, LIMIT_2M, MAX_HEADER_LEN];

/// The bincode byte limit for decoding a header of `len` bytes: the smallest of
/// [`DECODE_LIMITS`] that is at least `len * DECODE_EXPANSION`, or [`MAX_HEADER_LEN`]
/// for headers over `MAX_HEADER_LEN / DECODE_EXPANSION` bytes. bincode claims memory
/// against it before allocating, so no allocation made while decoding exceeds it: at
/// most `max(4 KiB, 8 * DECODE_EXPANSION * len)` bytes, never more than
/// `MAX_HEADER_LEN`.
pub fn decode_limit(len: usize) -> usize {
    let need = len.saturating_mul(DECODE_EXPANSION);
    DECODE_LIMITS
        .into_iter()
        .find(|&limit| limit >= need)
        .unwrap_or(MAX_HEADER_LEN)
}

/// The wire configuration (bincode 2 `standard()`: little endian, varint integers)
/// with a decode limit of `LIMIT` bytes. The limit does not change the encoding.
fn wire_config<const LIMIT: usize>() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<LIMIT>()
}

/// The one bincode configuration used everywhere on the wire, with the largest decode
/// limit ([`MAX_HEADER_LEN`]). Encoding uses it as is; decoding uses the same
/// configuration with the limit [`decode_limit`] picks for the input's length.
pub fn bincode_config() -> impl bincode::config::Config {
    wire_config::<MAX_HEADER_LEN>()
}

/// Encodes a value with the wire configuration.
pub fn encode_value<T: Encode>(value: &T) -> Result<Vec<u8>> {
    bincode::encode_to_vec(value, bincode_config()).map_err(|e| Error::Encode {
        reason: e.to_string(),
    })
}

/// Decodes a value that must occupy `bytes` exactly.
pub fn decode_value<T: Decode<()>>(bytes: &[u8]) -> Result<T> {
    let (value, used) = decode_prefix(bytes)?;
    if used != bytes.len() {
        return Err(Error::Malformed {
            reason: format!("{} trailing bytes after message", bytes.len() - used),
        });
    }
    Ok(value)
}

/// Decodes a value from the start of `bytes`, returning it and the bytes it used.
/// bincode may claim at most [`decode_limit`]`(bytes.len())` bytes of memory; a length
/// field claiming more fails before anything is allocated for it.
pub fn decode_prefix<T: Decode<()>>(bytes: &[u8]) -> Result<(T, usize)> {
    let limit = decode_limit(bytes.len());
    let decoded = match limit {
        LIMIT_4K => decode_limited::<T, LIMIT_4K>(bytes),
        LIMIT_32K => decode_limited::<T, LIMIT_32K>(bytes),
        LIMIT_256K => decode_limited::<T, LIMIT_256K>(bytes),
        LIMIT_2M => decode_limited::<T, LIMIT_2M>(bytes),
        _ => decode_limited::<T, MAX_HEADER_LEN>(bytes),
    };
    decoded.map_err(|e| Error::Malformed {
        reason: match e {
            DecodeError::LimitExceeded => format!(
                "a length inside this {}-byte message claims more than its decode limit \
                 of {limit} bytes",
                bytes.len()
            ),
            e => e.to_string(),
        },
    })
}

fn decode_limited<T: Decode<()>, const LIMIT: usize>(
    bytes: &[u8],
) -> std::result::Result<(T, usize), DecodeError> {
    bincode::decode_from_slice(bytes, wire_config::<LIMIT>())
}

/// One frame: a bincode header and optional raw data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The bincode-encoded message.
    pub header: Bytes,
    /// Raw bytes that follow the message (may be empty).
    pub data: Bytes,
}

impl Frame {
    /// A frame carrying `msg` and `data`. Fails if either is over its limit.
    pub fn new<M: Encode>(msg: &M, data: Bytes) -> Result<Self> {
        let header = Bytes::from(encode_value(msg)?);
        let frame = Self { header, data };
        frame.check_limits()?;
        Ok(frame)
    }

    /// A frame carrying only `msg`.
    pub fn message<M: Encode>(msg: &M) -> Result<Self> {
        Self::new(msg, Bytes::new())
    }

    /// Decodes the header as `M`; trailing bytes in the header are an error.
    pub fn decode<M: Decode<()>>(&self) -> Result<M> {
        decode_value(&self.header)
    }

    /// Length of the body on the wire.
    pub fn body_len(&self) -> usize {
        4 + self.header.len() + self.data.len()
    }

    pub(crate) fn check_limits(&self) -> Result<()> {
        if self.header.len() > MAX_HEADER_LEN {
            return Err(Error::FrameTooLarge {
                len: self.header.len() as u64,
                max: MAX_HEADER_LEN as u64,
            });
        }
        if self.data.len() > MAX_DATA_LEN {
            return Err(Error::FrameTooLarge {
                len: self.data.len() as u64,
                max: MAX_DATA_LEN as u64,
            });
        }
        if self.body_len() > MAX_FRAME_LEN {
            return Err(Error::FrameTooLarge {
                len: self.body_len() as u64,
                max: MAX_FRAME_LEN as u64,
            });
        }
        Ok(())
    }

    /// The frame's prefix and header-length field, ready to be followed by the header
    /// and data. The CRC covers `hlen | header | data` without copying them together.
    pub fn encode_prefix(&self) -> Result<[u8; PREFIX_LEN + 4]> {
        self.check_limits()?;
        let hlen = (self.header.len() as u32).to_be_bytes();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&hlen);
        crc.update(&self.header);
        crc.update(&self.data);
        let mut out = [0u8; PREFIX_LEN + 4];
        out[0..4].copy_from_slice(&(self.body_len() as u32).to_be_bytes());
        out[4..8].copy_from_slice(&crc.finalize().to_be_bytes());
        out[8..12].copy_from_slice(&hlen);
        Ok(out)
    }

    /// The whole frame as one buffer (tests and small messages).
    pub fn to_bytes(&self) -> Result<Bytes> {
        let prefix = self.encode_prefix()?;
        let mut out = BytesMut::with_capacity(prefix.len() + self.header.len() + self.data.len());
        out.put_slice(&prefix);
        out.put_slice(&self.header);
        out.put_slice(&self.data);
        Ok(out.freeze())
    }

    /// Parses a complete body whose prefix has already been checked.
    fn from_body(body: Bytes, expected_crc: u32) -> Result<Self> {
        Self::from_body_crc(body, expected_crc).map(|(frame, _)| frame)
    }

    /// [`Frame::from_body`], also returning `crc32(data)`. The frame CRC is verified in
    /// the same single pass over the bytes: the header part and the data part are
    /// hashed separately and combined, so a receiver that checks a packet's own CRC
    /// against the data does not read the data a second time.
    fn from_body_crc(mut body: Bytes, expected_crc: u32) -> Result<(Self, u32)> {
        let split = (body.len() >= 4)
            .then(|| u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize)
            .filter(|hlen| *hlen <= MAX_HEADER_LEN && 4 + *hlen <= body.len())
            .map(|hlen| 4 + hlen);
        let (actual, data_crc) = match split {
            Some(at) => {
                let data_crc = crc32fast::hash(&body[at..]);
                let mut whole = crc32fast::Hasher::new_with_initial_len(
                    crc32fast::hash(&body[..at]),
                    at as u64,
                );
                whole.combine(&crc32fast::Hasher::new_with_initial_len(
                    data_crc,
                    (body.len() - at) as u64,
                ));
                (whole.finalize(), data_crc)
            }
            // A header length that does not fit: the CRC decides which error it is.
            None => (crc32fast::hash(&body), 0),
        };
        if actual != expected_crc {
            return Err(Error::FrameChecksum {
                expected: expected_crc,
                actual,
            });
        }
        if body.len() < 4 {
            return Err(Error::Malformed {
                reason: "body shorter than its header length field".into(),
            });
        }
        let hlen = body.get_u32() as usize;
        if hlen > MAX_HEADER_LEN || hlen > body.len() {
            return Err(Error::Malformed {
                reason: format!("header length {hlen} exceeds the body or the limit"),
            });
        }
        let header = body.split_to(hlen);
        if body.len() > MAX_DATA_LEN {
            return Err(Error::FrameTooLarge {
                len: body.len() as u64,
                max: MAX_DATA_LEN as u64,
            });
        }
        Ok((Self { header, data: body }, data_crc))
    }

    /// Decodes one frame from a complete buffer; returns it and the bytes used, or
    /// `None` when the buffer does not yet hold a whole frame.
    pub fn parse(buf: &[u8]) -> Result<Option<(Self, usize)>> {
        if buf.len() < PREFIX_LEN {
            return Ok(None);
        }
        let (len, crc) =
            parse_prefix(buf[..PREFIX_LEN].try_into().map_err(|_| Error::Malformed {
                reason: "short prefix".into(),
            })?)?;
        let total = PREFIX_LEN + len;
        if buf.len() < total {
            return Ok(None);
        }
        let body = Bytes::copy_from_slice(&buf[PREFIX_LEN..total]);
        Ok(Some((Self::from_body(body, crc)?, total)))
    }
}

fn parse_prefix(prefix: [u8; PREFIX_LEN]) -> Result<(usize, u32)> {
    // A frame's length is at most 2^25, so its first byte is never a TLS record's type.
    if prefix[0] == crate::net::TLS_HANDSHAKE_RECORD && prefix[1] == 3 {
        return Err(Error::Malformed {
            reason: "a TLS handshake where a stampfs frame was expected: the peer dials with \
                     TLS (--tls-ca), this server serves plain TCP (no --tls-cert)"
                .into(),
        });
    }
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    let crc = u32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
    if len > MAX_FRAME_LEN {
        return Err(Error::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME_LEN as u64,
        });
    }
    if len < 4 {
        return Err(Error::Malformed {
            reason: format!("body of {len} bytes cannot hold its header length"),
        });
    }
    Ok((len, crc))
}

/// Bytes the frame reader buffers. Small on purpose: prefixes, headers and small
/// frames (acks, replies) are read through the buffer, several per system call, while
/// the rest of a large body is read straight into the frame's own buffer (tokio's
/// `BufReader` bypasses its buffer for reads at least this large when it is empty), so
/// packet data is not copied a second time in user space.
const READ_BUFFER: usize = 8 << 10;

/// Reads frames from any byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: BufReader<R>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self::with_capacity(READ_BUFFER, inner)
    }

    /// A reader whose buffer holds `capacity` bytes (allocated now, for the reader's
    /// life); a body larger than it is read straight into its own buffer.
    pub fn with_capacity(capacity: usize, inner: R) -> Self {
        Self {
            inner: BufReader::with_capacity(capacity, inner),
        }
    }

    /// The next frame; `Ok(None)` on a clean end of stream between frames.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>> {
        match self.read_body().await? {
            Some((body, crc)) => Frame::from_body(body, crc).map(Some),
            None => Ok(None),
        }
    }

    /// [`FrameReader::read_frame`], with `crc32(frame.data)` from the same pass that
    /// verified the frame CRC (for receivers that check a CRC of the data itself).
    pub async fn read_frame_with_data_crc(&mut self) -> Result<Option<(Frame, u32)>> {
        match self.read_body().await? {
            Some((body, crc)) => Frame::from_body_crc(body, crc).map(Some),
            None => Ok(None),
        }
    }

    /// The next frame's body and its expected CRC, read in full.
    async fn read_body(&mut self) -> Result<Option<(Bytes, u32)>> {
        let mut prefix = [0u8; PREFIX_LEN];
        let mut got = 0;
        while got < PREFIX_LEN {
            let n = match self.inner.read(&mut prefix[got..]).await {
                Ok(n) => n,
                // TLS reports a peer that closed without `close_notify` this way; between
                // frames that is an end like any other (frames delimit themselves, so
                // nothing can have been cut off unseen).
                Err(e) if got == 0 && e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return if got == 0 {
                    Ok(None)
                } else {
                    Err(Error::Truncated)
                };
            }
            got += n;
        }
        let (len, crc) = parse_prefix(prefix)?;
        // Grow by exact steps only when full, so memory follows the bytes that arrived
        // and never exceeds `len`.
        let mut body: Vec<u8> = Vec::new();
        while body.len() < len {
            if body.capacity() == body.len() {
                body.reserve_exact((len - body.len()).min(READ_STEP));
            }
            let room = (body.capacity() - body.len()).min(len - body.len());
            let n = (&mut self.inner)
                .take(room as u64)
                .read_buf(&mut body)
                .await?;
            if n == 0 {
                return Err(Error::Truncated);
            }
        }
        Ok(Some((Bytes::from(body), crc)))
    }

    /// The transport, and whether bytes it delivered are buffered here unread.
    pub fn get_mut(&mut self) -> (&mut R, bool) {
        let buffered = !self.inner.buffer().is_empty();
        (self.inner.get_mut(), buffered)
    }

    pub fn into_inner(self) -> R {
        self.inner.into_inner()
    }
}

/// Writes frames to any byte stream.
#[derive(Debug)]
pub struct FrameWriter<W: AsyncWrite> {
    inner: BufWriter<W>,
}

/// The write buffer of [`FrameWriter::new`]: room to batch a data stream's packets.
pub const WRITE_BUFFER: usize = 64 << 10;

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W) -> Self {
        Self::with_capacity(WRITE_BUFFER, inner)
    }

    /// A writer whose buffer holds `capacity` bytes (allocated now, for the writer's
    /// life); a frame larger than it is written through, so any size works.
    pub fn with_capacity(capacity: usize, inner: W) -> Self {
        Self {
            inner: BufWriter::with_capacity(capacity, inner),
        }
    }

    /// Queues a frame without flushing (for batching several frames).
    pub async fn feed(&mut self, frame: &Frame) -> Result<()> {
        let prefix = frame.encode_prefix()?;
        self.inner.write_all(&prefix).await?;
        self.inner.write_all(&frame.header).await?;
        self.inner.write_all(&frame.data).await?;
        Ok(())
    }

    /// Writes a frame and flushes it.
    pub async fn write_frame(&mut self, frame: &Frame) -> Result<()> {
        self.feed(frame).await?;
        self.flush().await
    }

    /// Flushes queued frames.
    pub async fn flush(&mut self) -> Result<()> {
        self.inner.flush().await?;
        Ok(())
    }

    /// Flushes and shuts the write side down.
    pub async fn shutdown(&mut self) -> Result<()> {
        self.inner.shutdown().await?;
        Ok(())
    }
}

/// Queued bytes after which [`FrameSink::feed`] writes them out without waiting for a
/// flush.
const SINK_HIGH_WATER: usize = 1 << 20;
/// Most buffers handed to one vectored write.
const SINK_IOVECS: usize = 64;

/// The prefix (`len | crc | hlen`) of a frame with `header` and `data_len` bytes of
/// data whose CRC is `data_crc`: the body CRC is combined from the CRC of
/// `hlen | header` and `data_crc`, without reading the data again. A packet's data CRC
/// is computed once by the writer and verified once on arrival, so sending and
/// forwarding cost no further checksum pass. The caller keeps within the limits.
pub fn frame_prefix(header: &[u8], data_len: usize, data_crc: u32) -> [u8; PREFIX_LEN + 4] {
    let hlen = (header.len() as u32).to_be_bytes();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&hlen);
    crc.update(header);
    crc.combine(&crc32fast::Hasher::new_with_initial_len(
        data_crc,
        data_len as u64,
    ));
    let body = (4 + header.len() + data_len) as u32;
    let mut out = [0u8; PREFIX_LEN + 4];
    out[0..4].copy_from_slice(&body.to_be_bytes());
    out[4..8].copy_from_slice(&crc.finalize().to_be_bytes());
    out[8..12].copy_from_slice(&hlen);
    out
}

/// Writes frames with vectored writes, for the data path: each frame's prefix is built
/// from its data CRC (see [`frame_prefix`]), the header and data go out as the very
/// buffers they are (never copied), and everything queued leaves in as few syscalls as
/// possible.
#[derive(Debug)]
pub struct FrameSink<W> {
    inner: W,
    /// Buffers not yet written, in order; the front may be partly written already.
    queue: std::collections::VecDeque<Bytes>,
    queued: usize,
}

impl<W: AsyncWrite + Unpin> FrameSink<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            queue: std::collections::VecDeque::new(),
            queued: 0,
        }
    }

    fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.queued += b.len();
            self.queue.push_back(b);
        }
    }

    /// Queues `frame`, whose data has CRC `data_crc`; writes out once enough is queued.
    pub async fn feed(&mut self, frame: &Frame, data_crc: u32) -> Result<()> {
        frame.check_limits()?;
        let prefix = frame_prefix(&frame.header, frame.data.len(), data_crc);
        self.push(Bytes::copy_from_slice(&prefix));
        self.push(frame.header.clone());
        self.push(frame.data.clone());
        if self.queued >= SINK_HIGH_WATER {
            self.flush().await?;
        }
        Ok(())
    }

    /// Queues a whole small frame (a set-up request, an ack), computing its CRC.
    pub fn feed_frame(&mut self, frame: &Frame) -> Result<()> {
        self.push(frame.to_bytes()?);
        Ok(())
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> Result<()> {
        while !self.queue.is_empty() {
            let slices: Vec<std::io::IoSlice<'_>> = self
                .queue
                .iter()
                .take(SINK_IOVECS)
                .map(|b| std::io::IoSlice::new(b))
                .collect();
            let mut n = self.inner.write_vectored(&slices).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
            }
            self.queued -= n;
            while n > 0 {
                let Some(front) = self.queue.front_mut() else {
                    break;
                };
                if n >= front.len() {
                    n -= front.len();
                    self.queue.pop_front();
                } else {
                    front.advance(n);
                    n = 0;
                }
            }
        }
        self.inner.flush().await?;
        Ok(())
    }

    /// Writes everything queued, then shuts the write side down.
    pub async fn shutdown(&mut self) -> Result<()> {
        self.flush().await?;
        self.inner.shutdown().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_reader_returns_the_data_crc_from_its_verifying_pass() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let frame = Frame::new(&("packet", 42u64), Bytes::from(data.clone())).expect("frame");
        let mut wire = frame.to_bytes().expect("encode").to_vec();
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let sent = wire.clone();
        tokio::spawn(async move {
            let _ = b.write_all(&sent).await;
        });
        let mut reader = FrameReader::new(a);
        let (got, crc) = reader
            .read_frame_with_data_crc()
            .await
            .expect("reads")
            .expect("a frame");
        assert_eq!(got, frame);
        assert_eq!(crc, crc32fast::hash(&data));
        // Any flipped byte, in the header or the data, still fails the frame CRC.
        for at in [PREFIX_LEN + 5, wire.len() - 1] {
            wire[at] ^= 1;
            let (c, mut d) = tokio::io::duplex(1 << 16);
            let bad = wire.clone();
            tokio::spawn(async move {
                let _ = d.write_all(&bad).await;
            });
            let err = FrameReader::new(c)
                .read_frame_with_data_crc()
                .await
                .unwrap_err();
            assert!(matches!(err, Error::FrameChecksum { .. }), "{err}");
            wire[at] ^= 1;
        }
    }

    #[tokio::test]
    async fn frames_round_trip_over_a_duplex_stream() {
        let (a, b) = tokio::io::duplex(1024);
        let mut w = FrameWriter::new(a);
        let mut r = FrameReader::new(b);
        let sent =
            Frame::new(&(1u32, String::from("hi")), Bytes::from(vec![9u8; 5000])).expect("frame");
        let writer = tokio::spawn(async move {
            w.write_frame(&sent).await.expect("write");
            w.write_frame(&Frame::message(&7u64).expect("frame"))
                .await
                .expect("write");
            w.shutdown().await.expect("shutdown");
            sent
        });
        let got = r.read_frame().await.expect("read").expect("frame");
        let sent = writer.await.expect("join");
        assert_eq!(got, sent);
        assert_eq!(
            got.decode::<(u32, String)>().expect("decode"),
            (1, "hi".into())
        );
        let second = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(second.decode::<u64>().expect("decode"), 7);
        assert!(r.read_frame().await.expect("clean eof").is_none());
    }

    #[test]
    fn parse_needs_the_whole_frame() {
        let bytes = Frame::message(&5u8)
            .expect("frame")
            .to_bytes()
            .expect("bytes");
        for cut in 0..bytes.len() {
            assert!(Frame::parse(&bytes[..cut]).expect("prefix ok").is_none());
        }
        let (f, used) = Frame::parse(&bytes).expect("ok").expect("whole");
        assert_eq!(used, bytes.len());
        assert_eq!(f.decode::<u8>().expect("decode"), 5);
    }

    #[test]
    fn oversized_data_is_refused_when_building() {
        let big = Bytes::from(vec![0u8; MAX_DATA_LEN + 1]);
        assert!(matches!(
            Frame::new(&1u8, big),
            Err(Error::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn trailing_header_bytes_are_rejected() {
        let mut f = Frame::message(&(1u8, 2u8)).expect("frame");
        f.header = Bytes::from(encode_value(&(1u8, 2u8, 3u8)).expect("encode"));
        assert!(f.decode::<(u8, u8)>().is_err());
    }

    #[test]
    fn frame_prefix_matches_the_codec() {
        for len in [0usize, 1, 4095, 65_536, 70_001] {
            let data = Bytes::from((0..len).map(|i| (i * 31) as u8).collect::<Vec<_>>());
            let f = Frame::new(&(len as u64, "packet"), data.clone()).expect("frame");
            assert_eq!(
                frame_prefix(&f.header, len, crc32fast::hash(&data)),
                f.encode_prefix().expect("prefix"),
                "{len} bytes"
            );
        }
    }

    #[tokio::test]
    async fn the_sink_writes_what_the_codec_reads() {
        let (a, b) = tokio::io::duplex(1 << 12);
        let mut sink = FrameSink::new(a);
        let frames: Vec<Frame> = (0..5u32)
            .map(|i| {
                Frame::new(&i, Bytes::from(vec![i as u8; 30_000 * i as usize])).expect("frame")
            })
            .collect();
        let sent = frames.clone();
        let writer = tokio::spawn(async move {
            for f in &sent {
                sink.feed(f, crc32fast::hash(&f.data)).await.expect("feed");
            }
            sink.feed_frame(&Frame::message(&99u32).expect("frame"))
                .expect("feed frame");
            sink.shutdown().await.expect("shutdown");
        });
        let mut reader = FrameReader::new(b);
        for f in &frames {
            assert_eq!(&reader.read_frame().await.expect("read").expect("frame"), f);
        }
        let last = reader.read_frame().await.expect("read").expect("frame");
        assert_eq!(last.decode::<u32>().expect("decode"), 99);
        assert!(reader.read_frame().await.expect("eof").is_none());
        writer.await.expect("join");
    }
}
