//! Hostile input: whatever a peer sends, both decoders (`Frame::parse` over a buffer
//! and `FrameReader::read_frame` over a stream) return an error or an honest "not yet",
//! never panic, and never trust a length before checking it against its limit.
//! (`alloc_cap.rs` measures the allocations themselves.)

mod common;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use stampfs_proto::codec::{decode_value, encode_value, PREFIX_LEN};
use stampfs_proto::rpc::{parse_reply, parse_request, reply_frame, request_frame};
use stampfs_proto::*;
use std::mem::discriminant;

/// A valid frame to cut and corrupt: a packet header and some data.
fn sample_frame() -> Bytes {
    let token = ChunkToken::sign(
        &ClusterKey::from_bytes([9; 32]),
        ChunkHandle(0xABCDEF),
        ChunkVersion(7),
        ClientId(0x1234),
    );
    let data = Bytes::from((0..150u8).collect::<Vec<_>>());
    let packet = Packet {
        token,
        seq: 1,
        offset: 0,
        crc: crc32fast::hash(&data),
        sync: false,
    };
    Frame::new(&packet, data)
        .expect("frame")
        .to_bytes()
        .expect("encode")
}

/// A frame prefix and body built by hand: `len | crc | body` with the right CRC.
fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREFIX_LEN + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A body: `hlen | header | data`.
fn body(hlen: u32, rest: &[u8]) -> Vec<u8> {
    let mut b = hlen.to_be_bytes().to_vec();
    b.extend_from_slice(rest);
    b
}

/// Both decoders must agree on `bytes`: the same frame, the same kind of error, or
/// "incomplete" (`Ok(None)` from `parse`) exactly where the stream reader reports a
/// truncated stream (or a clean end when nothing was sent).
fn decoders_agree(bytes: &[u8], pipe: usize) -> std::result::Result<(), TestCaseError> {
    let parsed = Frame::parse(bytes);
    let read = read_raw(bytes, pipe);
    match (parsed, read) {
        (Ok(Some((frame, used))), Ok(Some(streamed))) => {
            prop_assert_eq!(&frame, &streamed);
            let again = frame.to_bytes().map_err(fail)?;
            prop_assert_eq!(&again[..], &bytes[..used]);
        }
        (Ok(None), Ok(None)) => prop_assert!(bytes.is_empty()),
        (Ok(None), Err(Error::Truncated)) => prop_assert!(!bytes.is_empty()),
        (Err(a), Err(b)) => prop_assert_eq!(discriminant(&a), discriminant(&b), "{} vs {}", a, b),
        (a, b) => {
            return Err(TestCaseError::fail(format!(
                "decoders disagree: parse {a:?}, read_frame {b:?}"
            )))
        }
    }
    Ok(())
}

/// Decodes `header` as every top-level wire type; the results do not matter, only
/// that nothing panics. Returns how many decoded.
fn decode_as_everything(header: &[u8]) -> usize {
    let frame = Frame {
        header: Bytes::copy_from_slice(header),
        data: Bytes::new(),
    };
    [
        parse_request::<MasterRequest>(&frame).is_ok(),
        parse_request::<ChunkRequest>(&frame).is_ok(),
        frame.decode::<Packet>().is_ok(),
        frame.decode::<Ack>().is_ok(),
        frame.decode::<Signed<ChunkCommand>>().is_ok(),
        frame.decode::<ChunkToken>().is_ok(),
        parse_reply::<FileLocations>(1, &frame).is_ok(),
        parse_reply::<AppendReply>(1, &frame).is_ok(),
        parse_reply::<HeartbeatReply>(1, &frame).is_ok(),
        parse_reply::<WriteSetupReply>(1, &frame).is_ok(),
        parse_reply::<Vec<FileStatus>>(1, &frame).is_ok(),
        parse_reply::<Option<ReplicaReport>>(1, &frame).is_ok(),
        parse_reply::<RecoveryOutcome>(1, &frame).is_ok(),
    ]
    .into_iter()
    .filter(|ok| *ok)
    .count()
}

/// Bytes that look more and more like a frame.
fn arb_wire_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Pure noise.
        prop::collection::vec(any::<u8>(), 0..96),
        // A plausible length, a random CRC, random bytes.
        (
            0u32..80,
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..96)
        )
            .prop_map(|(len, crc, rest)| {
                let mut v = len.to_be_bytes().to_vec();
                v.extend_from_slice(&crc.to_be_bytes());
                v.extend_from_slice(&rest);
                v
            }),
        // A correct CRC over a random body with a random or plausible hlen, maybe
        // cut short or followed by noise.
        (
            prop_oneof![any::<u32>(), 0u32..40],
            prop::collection::vec(any::<u8>(), 0..64),
            prop_oneof![Just(None), (0usize..80).prop_map(Some)],
            prop::collection::vec(any::<u8>(), 0..8),
        )
            .prop_map(|(hlen, rest, cut, tail)| {
                let mut v = raw_frame(&body(hlen, &rest));
                if let Some(cut) = cut {
                    v.truncate(cut);
                }
                v.extend_from_slice(&tail);
                v
            }),
    ]
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn random_bytes_never_panic_and_both_decoders_agree(
        bytes in arb_wire_bytes(),
        pipe in arb_pipe(),
    ) {
        decoders_agree(&bytes, pipe)?;
        if let Ok(Some((frame, _))) = Frame::parse(&bytes) {
            decode_as_everything(&frame.header);
        }
    }

    #[test]
    fn random_headers_never_panic(header in prop::collection::vec(any::<u8>(), 0..128)) {
        decode_as_everything(&header);
    }

    /// bincode is prefix-free: a strict prefix of a valid encoding never decodes. A
    /// valid encoding with one byte changed never panics (it may decode: bincode has no
    /// integrity check of its own, which is why frames carry a CRC).
    #[test]
    fn cut_or_corrupted_requests_never_decode_wrongly(
        req in arb_master_request(),
        cut in any::<prop::sample::Index>(),
        flip in any::<(prop::sample::Index, u8)>(),
    ) {
        let bytes = encode_value(&(42u64, req)).map_err(fail)?;
        let cut = cut.index(bytes.len());
        let frame = Frame { header: Bytes::copy_from_slice(&bytes[..cut]), data: Bytes::new() };
        let res = parse_request::<MasterRequest>(&frame);
        prop_assert!(matches!(res, Err(Error::Malformed { .. })), "prefix decoded: {:?}", res);

        let mut bad = bytes.clone();
        let at = flip.0.index(bad.len());
        bad[at] ^= flip.1;
        decode_as_everything(&bad);
    }
}

#[test]
fn every_truncation_is_incomplete_or_truncated() {
    let bytes = sample_frame();
    for cut in 0..bytes.len() {
        let part = &bytes[..cut];
        assert!(
            matches!(Frame::parse(part), Ok(None)),
            "parse of {cut} bytes"
        );
        for pipe in [1, 7, 64 << 10] {
            let got = read_raw(part, pipe);
            if cut == 0 {
                assert!(matches!(got, Ok(None)), "clean end: {got:?}");
            } else {
                assert!(
                    matches!(got, Err(Error::Truncated)),
                    "{cut} bytes, pipe {pipe}: {got:?}"
                );
            }
        }
    }
    assert!(matches!(read_raw(&bytes, 7), Ok(Some(_))));
}

#[test]
fn a_second_frame_cut_short_is_truncated_after_the_first() {
    let one = sample_frame();
    let mut two = one.to_vec();
    two.extend_from_slice(&one[..one.len() / 2]);
    let got = block_on(async {
        use tokio::io::AsyncWriteExt;
        let (mut a, b) = tokio::io::duplex(64);
        let mut reader = FrameReader::new(b);
        let write = async move {
            a.write_all(&two).await.expect("write");
            a.shutdown().await.expect("shutdown");
        };
        let read = async {
            let first = reader.read_frame().await;
            let second = reader.read_frame().await;
            (first, second)
        };
        tokio::join!(write, read).1
    });
    assert!(matches!(got.0, Ok(Some(_))), "{:?}", got.0);
    assert!(matches!(got.1, Err(Error::Truncated)), "{:?}", got.1);
}

#[test]
fn wrong_crc_is_a_checksum_error() {
    let mut bytes = sample_frame().to_vec();
    bytes[7] ^= 0x40;
    let expected_err = |r: &Result<_>| matches!(r, Err(Error::FrameChecksum { .. }));
    assert!(expected_err(&Frame::parse(&bytes).map(|_| ())));
    for pipe in [3, 64 << 10] {
        assert!(expected_err(&read_raw(&bytes, pipe).map(|_| ())));
    }
}

#[test]
fn a_length_below_four_is_malformed() {
    for len in 0u32..4 {
        let mut bytes = len.to_be_bytes().to_vec();
        let body = vec![0u8; len as usize];
        bytes.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        bytes.extend_from_slice(&body);
        let parsed = Frame::parse(&bytes);
        assert!(
            matches!(parsed, Err(Error::Malformed { .. })),
            "len {len}: {parsed:?}"
        );
        let read = read_raw(&bytes, 64);
        assert!(
            matches!(read, Err(Error::Malformed { .. })),
            "len {len}: {read:?}"
        );
    }
}

#[test]
fn a_header_length_beyond_the_body_or_the_limit_is_malformed() {
    let rest = [1u8, 2, 3, 4, 5];
    for hlen in [
        rest.len() as u32 + 1,
        64,
        MAX_HEADER_LEN as u32,
        MAX_HEADER_LEN as u32 + 1,
        u32::MAX,
    ] {
        let bytes = raw_frame(&body(hlen, &rest));
        let parsed = Frame::parse(&bytes);
        assert!(
            matches!(parsed, Err(Error::Malformed { .. })),
            "hlen {hlen}: {parsed:?}"
        );
        let read = read_raw(&bytes, 5);
        assert!(
            matches!(read, Err(Error::Malformed { .. })),
            "hlen {hlen}: {read:?}"
        );
    }
    // hlen equal to the rest of the body is fine: all header, no data.
    let bytes = raw_frame(&body(rest.len() as u32, &rest));
    let (frame, _) = Frame::parse(&bytes).expect("ok").expect("whole");
    assert_eq!(&frame.header[..], &rest);
    assert!(frame.data.is_empty());
}

#[test]
fn oversized_length_prefixes_are_refused_before_reading_the_body() {
    for len in [u32::MAX, MAX_FRAME_LEN as u32 + 1] {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 1, 2, 3]);
        let check = |r: Result<()>| match r {
            Err(Error::FrameTooLarge { len: got, max }) => {
                assert_eq!(got, u64::from(len));
                assert_eq!(max, MAX_FRAME_LEN as u64);
            }
            other => panic!("len {len:#x}: expected FrameTooLarge, got {other:?}"),
        };
        check(Frame::parse(&bytes).map(|_| ()));
        // Only the prefix is needed to refuse: the rest never has to arrive.
        check(Frame::parse(&bytes[..PREFIX_LEN]).map(|_| ()));
        check(read_raw(&bytes, 64 << 10).map(|_| ()));
        check(read_raw(&bytes[..PREFIX_LEN], 3).map(|_| ()));
    }
}

#[test]
fn the_largest_allowed_length_announced_then_abandoned_is_truncated() {
    let mut bytes = (MAX_FRAME_LEN as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 4]);
    bytes.extend_from_slice(&[0, 0, 0, 2, 0x05, 0x00, 9, 9, 9]);
    assert!(matches!(Frame::parse(&bytes), Ok(None)));
    let got = read_raw(&bytes, 64 << 10);
    assert!(matches!(got, Err(Error::Truncated)), "{got:?}");
}

#[test]
fn a_data_section_over_its_limit_is_refused() {
    // A body within MAX_FRAME_LEN whose data section is one byte over MAX_DATA_LEN.
    let frame_bytes = raw_frame(&body(0, &vec![0xa5u8; MAX_DATA_LEN + 1]));
    let check = |r: Result<()>| match r {
        Err(Error::FrameTooLarge { len, max }) => {
            assert_eq!(len, MAX_DATA_LEN as u64 + 1);
            assert_eq!(max, MAX_DATA_LEN as u64);
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    };
    check(Frame::parse(&frame_bytes).map(|_| ()));
    check(read_raw(&frame_bytes, 64 << 10).map(|_| ()));
}

#[test]
fn a_header_over_its_limit_is_refused_even_when_all_of_it_arrived() {
    // The body holds all MAX_HEADER_LEN + 1 header bytes, within MAX_FRAME_LEN.
    let hlen = MAX_HEADER_LEN + 1;
    let frame_bytes = raw_frame(&body(hlen as u32, &vec![0u8; hlen + 10]));
    let parsed = Frame::parse(&frame_bytes);
    assert!(matches!(parsed, Err(Error::Malformed { .. })), "{parsed:?}");
    let read = read_raw(&frame_bytes, 64 << 10);
    assert!(matches!(read, Err(Error::Malformed { .. })), "{read:?}");
}

#[test]
fn frames_over_a_limit_cannot_be_built() {
    let header_over = vec![0u8; MAX_HEADER_LEN];
    // A Vec<u8> of MAX_HEADER_LEN bytes encodes to more than MAX_HEADER_LEN bytes.
    assert!(matches!(
        Frame::message(&header_over),
        Err(Error::FrameTooLarge { .. })
    ));
    let data_over = Bytes::from(vec![0u8; MAX_DATA_LEN + 1]);
    assert!(matches!(
        Frame::new(&1u8, data_over),
        Err(Error::FrameTooLarge { .. })
    ));
    // A hand-made Frame over a limit is refused when encoding, too.
    let frame = Frame {
        header: Bytes::from(vec![0u8; MAX_HEADER_LEN + 1]),
        data: Bytes::new(),
    };
    assert!(matches!(frame.to_bytes(), Err(Error::FrameTooLarge { .. })));
    assert!(matches!(
        frame.encode_prefix(),
        Err(Error::FrameTooLarge { .. })
    ));
}

fn assert_malformed<T: std::fmt::Debug>(what: &str, r: Result<T>) {
    assert!(matches!(r, Err(Error::Malformed { .. })), "{what}: {r:?}");
}

#[test]
fn valid_bincode_of_the_wrong_type_is_refused() {
    // An unknown enum variant index.
    assert_malformed(
        "u32::MAX as a MasterRequest",
        decode_value::<MasterRequest>(&encode_value(&u32::MAX).expect("encode")),
    );
    // A bool that is neither 0 nor 1.
    assert_malformed(
        "Delete with recursive = 2",
        decode_value::<Delete>(&encode_value(&(String::from("x"), 2u8)).expect("encode")),
    );
    // An Option tag that is neither 0 nor 1.
    assert_malformed(
        "Create with replication tag 2",
        decode_value::<Create>(&[0, 1, 2, 0, 0, 0]),
    );
    // A path that is not UTF-8.
    assert_malformed(
        "Stat of invalid UTF-8",
        decode_value::<Stat>(&[2, 0xff, 0xfe]),
    );
    // A replica state with index 2.
    assert_malformed(
        "ReplicaState 2",
        decode_value::<ReplicaState>(&encode_value(&2u32).expect("encode")),
    );

    // A reply frame read as a request.
    let reply = reply_frame(
        3,
        &Err::<WriteSetupReply, _>(RemoteError::StaleToken {
            handle: ChunkHandle(0xABCDEF),
            presented: ChunkVersion(6),
            current: ChunkVersion(7),
        }),
        Bytes::new(),
    )
    .expect("frame");
    assert_malformed("reply as request", parse_request::<MasterRequest>(&reply));

    // A master request read as a chunkserver request.
    let req = request_frame(
        1,
        Stat {
            path: "/x".into(),
            caller: None,
        },
        Bytes::new(),
    )
    .expect("frame");
    assert_malformed(
        "master request as chunk request",
        parse_request::<ChunkRequest>(&req),
    );

    // A reply whose Result tag is 2.
    let frame = Frame {
        header: Bytes::from_static(&[3, 2, 0]),
        data: Bytes::new(),
    };
    assert_malformed("Result tag 2", parse_reply::<()>(3, &frame));

    // A request frame read as a reply: id 1, then MasterRequest::Stat's index (9) is
    // not a Result tag.
    assert_malformed("request as reply", parse_reply::<FileStatus>(1, &req));
}

#[test]
fn trailing_bytes_after_the_value_are_refused() {
    let hb = Heartbeat {
        id: ChunkserverId(1),
        capacity: 10,
        used: 5,
        replica_count: 2,
        active_streams: 0,
    };
    // A complete Heartbeat read as a RegisterReply uses only its first field.
    let bytes = encode_value(&hb).expect("encode");
    assert_malformed(
        "heartbeat as register reply",
        decode_value::<RegisterReply>(&bytes),
    );

    let mut frame = request_frame(
        5,
        Stat {
            path: "/a".into(),
            caller: None,
        },
        Bytes::new(),
    )
    .expect("frame");
    let mut header = frame.header.to_vec();
    header.push(0);
    frame.header = Bytes::from(header);
    assert_malformed("request + 1 byte", parse_request::<MasterRequest>(&frame));
    assert_malformed(
        "frame.decode + 1 byte",
        frame.decode::<(u64, MasterRequest)>(),
    );

    let mut reply = reply_frame(5, &Ok::<(), RemoteError>(()), Bytes::new()).expect("frame");
    reply.header = Bytes::from_static(&[5, 0, 0]);
    assert_malformed("reply + 1 byte", parse_reply::<()>(5, &reply));

    // Trailing bytes survive the codec as header bytes, so the whole path refuses them.
    let bytes = reply.to_bytes().expect("encode");
    let streamed = read_raw(&bytes, 2).expect("read").expect("frame");
    assert_malformed("streamed reply + 1 byte", parse_reply::<()>(5, &streamed));
}

#[test]
fn huge_length_fields_inside_a_header_are_refused() {
    // Varint u64::MAX: fd + 8 bytes little-endian.
    let mut u64_max = vec![0xfd];
    u64_max.extend_from_slice(&u64::MAX.to_le_bytes());
    // Varint 2^60.
    let mut two_60 = vec![0xfd];
    two_60.extend_from_slice(&(1u64 << 60).to_le_bytes());
    for claim in [&u64_max, &two_60] {
        let mut bytes = claim.clone();
        bytes.extend_from_slice(&[1, 2, 3]);
        assert_malformed("Vec<u64>", decode_value::<Vec<u64>>(&bytes));
        assert_malformed("Vec<u8>", decode_value::<Vec<u8>>(&bytes));
        assert_malformed("String", decode_value::<String>(&bytes));
        assert_malformed("Vec<FileStatus>", decode_value::<Vec<FileStatus>>(&bytes));
        // Inside a real message: Register { id: None, addr: "", capacity: 0, used: 0,
        // replicas: <claim> }.
        let mut reg = vec![0u8, 0, 0, 0];
        reg.extend_from_slice(&bytes);
        assert_malformed("Register.replicas", decode_value::<Register>(&reg));
        // And as a request id followed by a list reply.
        let frame = Frame {
            header: Bytes::from([&[1u8, 0][..], &bytes].concat()),
            data: Bytes::new(),
        };
        assert_malformed("List reply", parse_reply::<Vec<FileStatus>>(1, &frame));
    }
}
