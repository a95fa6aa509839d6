//! No length on the wire can make the decoder allocate beyond its cap.
//!
//! This test binary installs a global allocator that records the largest single
//! allocation (or reallocation) made by the current thread while a measurement is
//! armed. Each test decodes hostile input inside a measurement on a current-thread
//! runtime (so every allocation of the decoder happens on the measured thread) and
//! checks the largest allocation against the limit: `MAX_FRAME_LEN` for frames,
//! bincode's limit (`MAX_HEADER_LEN`) for headers, and much less where the decoder
//! promises that memory follows the bytes that actually arrived.

mod counting;

use bytes::Bytes;
use counting::measure;
use stampfs_proto::codec::{decode_value, PREFIX_LEN};
use stampfs_proto::rpc::parse_reply;
use stampfs_proto::*;

/// Runs `f` and returns its result and the largest single allocation it made on this
/// thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let (out, seen) = measure(f);
    (out, seen.largest)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Feeds `bytes` (prepared before the measurement) to a `FrameReader` over a duplex
/// pipe and returns the reader's first answer, measuring everything the pipe, the
/// writer and the reader allocate.
fn read_measured(rt: &tokio::runtime::Runtime, bytes: Bytes) -> (Result<Option<Frame>>, usize) {
    largest_allocation(|| {
        rt.block_on(async move {
            use tokio::io::AsyncWriteExt;
            let (mut a, b) = tokio::io::duplex(64 << 10);
            let mut reader = FrameReader::new(b);
            let write = async move {
                // The reader may refuse early; a broken pipe is then expected.
                let _ = a.write_all(&bytes).await;
                let _ = a.shutdown().await;
            };
            let read = async move {
                let r = reader.read_frame().await;
                drop(reader);
                r
            };
            tokio::join!(write, read).1
        })
    })
}

/// What the stream reader may hold before a single body byte arrives: its 128 KiB
/// read buffer and small change.
const READER_OVERHEAD: usize = 256 << 10;

#[test]
fn huge_length_prefixes_allocate_nothing_large() {
    let rt = runtime();
    for len in [u32::MAX, MAX_FRAME_LEN as u32 + 1] {
        let mut wire = len.to_be_bytes().to_vec();
        wire.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        wire.extend_from_slice(&[0u8; 64]);
        let wire = Bytes::from(wire);

        let (parsed, largest) = largest_allocation(|| Frame::parse(&wire).map(|_| ()));
        assert!(
            matches!(parsed, Err(Error::FrameTooLarge { .. })),
            "{parsed:?}"
        );
        assert!(largest <= MAX_FRAME_LEN, "parse allocated {largest} bytes");
        assert!(
            largest < 4096,
            "parse allocated {largest} bytes for a refused frame"
        );

        let (read, largest) = read_measured(&rt, wire.clone());
        assert!(matches!(read, Err(Error::FrameTooLarge { .. })), "{read:?}");
        assert!(
            largest <= MAX_FRAME_LEN,
            "read_frame allocated {largest} bytes"
        );
        assert!(
            largest <= READER_OVERHEAD,
            "read_frame allocated {largest} bytes for a refused frame"
        );
    }
}

/// The body buffer grows in steps of at most 1 MiB (`READ_STEP`) as bytes arrive.
/// `BytesMut` grows like a `Vec` (to at least double), so right after the first read
/// the buffer may already be 2 MiB: the bound is about twice what arrived plus 2 MiB.
fn growth_bound(received: usize) -> usize {
    READER_OVERHEAD + 2 * (received + (1 << 20))
}

/// A frame of `len` body bytes of which only `sent` arrive before the peer closes.
fn announced(len: usize, sent: usize) -> Bytes {
    let mut wire = (len as u32).to_be_bytes().to_vec();
    wire.extend_from_slice(&[0u8; 4]);
    wire.extend_from_slice(&[0, 0, 0, 1, 0]);
    wire.resize(PREFIX_LEN + sent, 7);
    Bytes::from(wire)
}

#[test]
fn a_large_frame_announced_but_not_sent_costs_little() {
    let rt = runtime();
    let wire = announced(MAX_FRAME_LEN, 8);
    let (parsed, largest) = largest_allocation(|| Frame::parse(&wire).map(|f| f.is_some()));
    assert!(matches!(parsed, Ok(false)), "{parsed:?}");
    assert!(largest < 4096, "parse allocated {largest} bytes");

    for sent in [0, 8, 3 << 20] {
        let (read, largest) = read_measured(&rt, announced(MAX_FRAME_LEN, sent));
        // Even the prefix alone, then the end, is truncated (not a clean end).
        assert!(matches!(read, Err(Error::Truncated)), "{read:?}");
        assert!(
            largest <= growth_bound(sent),
            "read_frame allocated {largest} bytes for {sent} body bytes of a \
             {MAX_FRAME_LEN}-byte frame"
        );
    }
}

#[test]
fn the_largest_allowed_frame_stays_within_the_frame_cap() {
    let rt = runtime();
    // hlen field + a header of MAX_HEADER_LEN - 4 bytes + MAX_DATA_LEN bytes of data:
    // a body of exactly MAX_FRAME_LEN bytes.
    let hlen = MAX_HEADER_LEN - 4;
    let mut body = Vec::with_capacity(MAX_FRAME_LEN);
    body.extend_from_slice(&(hlen as u32).to_be_bytes());
    body.resize(4 + hlen, 0x11);
    body.resize(MAX_FRAME_LEN, 0x22);
    let mut wire = Vec::with_capacity(PREFIX_LEN + body.len());
    wire.extend_from_slice(&(body.len() as u32).to_be_bytes());
    wire.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    wire.extend_from_slice(&body);
    drop(body);
    let wire = Bytes::from(wire);

    let (frame, largest) = read_measured(&rt, wire.clone());
    let frame = frame.expect("read").expect("frame");
    assert_eq!(frame.header.len(), hlen);
    assert_eq!(frame.data.len(), MAX_DATA_LEN);
    assert!(
        largest <= MAX_FRAME_LEN,
        "read_frame allocated {largest} bytes for a {MAX_FRAME_LEN}-byte body"
    );
    drop(frame);

    let (parsed, largest) = largest_allocation(|| Frame::parse(&wire).map(|f| f.is_some()));
    assert!(matches!(parsed, Ok(true)), "{parsed:?}");
    assert!(largest <= MAX_FRAME_LEN, "parse allocated {largest} bytes");
}

/// A varint `fd` + u64 LE.
fn varint_u64(v: u64) -> Vec<u8> {
    let mut out = vec![0xfd];
    out.extend_from_slice(&v.to_le_bytes());
    out
}

#[test]
fn header_length_fields_cannot_make_bincode_allocate_beyond_its_limit() {
    for claim in [1u64 << 60, u64::MAX, (MAX_HEADER_LEN as u64 / 8) + 1] {
        let mut header = varint_u64(claim);
        header.extend_from_slice(&[1, 2, 3]);
        let frame = Frame {
            header: Bytes::from(header.clone()),
            data: Bytes::new(),
        };
        // As a reply: request id 1, Ok, then the claimed list.
        let mut reply = vec![1u8, 0];
        reply.extend_from_slice(&header);
        let reply = Frame {
            header: Bytes::from(reply),
            data: Bytes::new(),
        };
        // Register { id: None, addr: "", capacity: 0, used: 0, replicas: <claim> }.
        let mut register = vec![0u8, 0, 0, 0];
        register.extend_from_slice(&header);

        let (failures, largest) = largest_allocation(|| {
            [
                frame.decode::<Vec<u64>>().is_err(),
                frame.decode::<Vec<FileStatus>>().is_err(),
                parse_reply::<Vec<FileStatus>>(1, &reply).is_err(),
                decode_value::<Register>(&register).is_err(),
            ]
        });
        assert_eq!(failures, [true; 4], "claim {claim}");
        assert!(
            largest <= MAX_HEADER_LEN,
            "claim {claim}: {largest} bytes allocated"
        );
        assert!(largest < 4096, "claim {claim}: {largest} bytes allocated");
    }
    for claim in [1u64 << 60, u64::MAX, MAX_HEADER_LEN as u64 + 1] {
        let mut header = varint_u64(claim);
        header.extend_from_slice(b"abc");
        let (failures, largest) = largest_allocation(|| {
            [
                decode_value::<Vec<u8>>(&header).is_err(),
                decode_value::<String>(&header).is_err(),
            ]
        });
        assert_eq!(failures, [true; 2], "claim {claim}");
        assert!(largest < 4096, "claim {claim}: {largest} bytes allocated");
    }
}

/// A claim at the largest decode limit never allocates past it. (Since the limit is
/// tiered by the header's own length, a few header bytes claiming that much now fail
/// after a few KiB: see `decode_limits.rs`; this pins the outer cap.)
#[test]
fn a_claim_at_the_limit_allocates_at_most_the_limit() {
    let mut u64s = varint_u64(MAX_HEADER_LEN as u64 / 8);
    u64s.push(1);
    let mut bytes = varint_u64(MAX_HEADER_LEN as u64);
    bytes.push(1);
    // A path of MAX_HEADER_LEN bytes inside a Stat request.
    let mut stat = vec![1u8, 9];
    stat.extend_from_slice(&bytes);
    let stat = Frame {
        header: Bytes::from(stat),
        data: Bytes::new(),
    };
    let (failures, largest) = largest_allocation(|| {
        [
            decode_value::<Vec<u64>>(&u64s).is_err(),
            decode_value::<Vec<u8>>(&bytes).is_err(),
            decode_value::<String>(&bytes).is_err(),
            rpc::parse_request::<MasterRequest>(&stat).is_err(),
        ]
    });
    assert_eq!(failures, [true; 4]);
    assert!(largest <= MAX_HEADER_LEN, "{largest} bytes allocated");
}
