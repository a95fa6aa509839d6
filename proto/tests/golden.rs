//! Golden bytes: the exact wire encoding of representative messages, pinned.
//!
//! A change to any of these bytes is a wire-format change: old and new processes would
//! no longer understand each other. Every expected frame is written out field by field
//! against the layout in `codec.rs`:
//!
//! ```text
//! len:u32be | crc32(body):u32be | hlen:u32be | header (bincode 2 standard, varint) | data
//! ```
//!
//! bincode varints: a value below 251 is one byte; `fb` + u16 LE, `fc` + u32 LE,
//! `fd` + u64 LE otherwise. Strings and Vecs are a varint length then the elements;
//! `Option` and `Result` and enums are a varint tag (None=0/Some=1, Ok=0/Err=1, variant
//! index) then the payload; `bool` is one byte; `[u8; 32]` is 32 raw bytes. Each test
//! also re-checks `len` and `crc` independently with `crc32fast`.

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use stampfs_proto::codec::encode_value;
use stampfs_proto::rpc::{parse_reply, parse_request, reply_frame, request_frame};
use stampfs_proto::*;

/// The fixed cluster key of these tests: bytes 0, 1, ..., 31.
fn key() -> ClusterKey {
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = i as u8;
    }
    ClusterKey::from_bytes(k)
}

/// The fixed token of these tests.
fn token() -> ChunkToken {
    ChunkToken::sign(
        &key(),
        ChunkHandle(0xABCDEF),
        ChunkVersion(7),
        ClientId(0x1234),
    )
}

/// Its MAC: HMAC-SHA256 under `key()`, see `token_mac_is_pinned`.
const TOKEN_MAC: &str = "4b2ebba51303517812cf09b269f16166c783108a0b8f698e3d0f8f00db19957f";

/// Checks a frame's bytes against the layout independently of the codec, then against
/// the pinned hex, then parses it back.
fn check(frame: &Frame, expected: &str) {
    let bytes = frame.to_bytes().expect("encode");
    let len = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let hlen = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    assert_eq!(len, bytes.len() - 8, "len covers the body");
    assert_eq!(crc, crc32fast::hash(&bytes[8..]), "crc covers the body");
    assert_eq!(
        &bytes[12..12 + hlen],
        &frame.header[..],
        "header follows hlen"
    );
    assert_eq!(
        &bytes[12 + hlen..],
        &frame.data[..],
        "data follows the header"
    );
    assert_eq!(hex::encode(&bytes), expected, "wire bytes changed");
    let (parsed, used) = Frame::parse(&bytes).expect("parse").expect("whole");
    assert_eq!(used, bytes.len());
    assert_eq!(&parsed, frame);
}

#[test]
fn token_mac_is_pinned() {
    let t = token();
    // The MAC construction, written out independently: HMAC-SHA256(key, domain, then
    // each part as u64be length + bytes; parts are handle, version, client as u64be).
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&{
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = i as u8;
        }
        k
    })
    .expect("any key length");
    mac.update(b"stampfs/chunk-token/v1");
    for part in [0xABCDEFu64, 7, 0x1234] {
        mac.update(&8u64.to_be_bytes());
        mac.update(&part.to_be_bytes());
    }
    let independent: [u8; 32] = mac.finalize().into_bytes().into();
    assert_eq!(t.mac, independent);
    assert_eq!(hex::encode(t.mac), TOKEN_MAC);
    t.verify(&key()).expect("verifies");

    // Encoded: handle, version, client as varints, then the 32 MAC bytes.
    let expected = [
        "fcefcdab00", // handle 0xABCDEF: fc + u32 LE
        "07",         // version 7
        "fb3412",     // client 0x1234: fb + u16 LE
        TOKEN_MAC,
    ]
    .concat();
    assert_eq!(hex::encode(encode_value(&t).expect("encode")), expected);
}

/// The token's wire encoding (also pinned by `token_mac_is_pinned`).
const TOKEN: &str = concat!(
    "fcefcdab00",                                                       // handle 0xABCDEF
    "07",                                                               // version 7
    "fb3412",                                                           // client 0x1234
    "4b2ebba51303517812cf09b269f16166c783108a0b8f698e3d0f8f00db19957f", // mac
);

#[test]
fn create_request_frame() {
    let frame = request_frame(
        1,
        Create {
            path: "/logs/a".into(),
            client: ClientId(0x1234),
            replication: Some(3),
            chunk_size: Some(64 << 20),
            overwrite: false,
            attr: Some(NewAttr {
                mode: 0o644,
                uid: 1000,
                gid: 100,
            }),
            caller: Some(Caller {
                uid: 1000,
                gid: 100,
                groups: vec![100],
            }),
        },
        Bytes::new(),
    )
    .expect("frame");
    let expected = concat!(
        "00000029",       // len 41 = 4 + hlen
        "5f0c2d9b",       // crc32 of the body
        "00000025",       // hlen 37
        "01",             // request id 1
        "01",             // MasterRequest::Create (index 1)
        "07",             // path: 7 bytes
        "2f6c6f67732f61", //   "/logs/a"
        "fb3412",         // client 0x1234
        "0103",           // replication: Some, 3
        "01fc00000004",   // chunk_size: Some, 64 MiB = 0x0400_0000
        "00",             // overwrite false
        "01",             // attr: Some
        "fba401",         //   mode 0o644 = 420
        "fbe803",         //   uid 1000
        "64",             //   gid 100
        "01",             // caller: Some
        "fbe803",         //   uid 1000
        "64",             //   gid 100
        "0164",           //   groups: [100]
    );
    check(&frame, expected);
    let (id, req): (u64, MasterRequest) = parse_request(&frame).expect("parse");
    assert_eq!(id, 1);
    assert!(matches!(
        req,
        MasterRequest::Create(Create {
            replication: Some(3),
            ..
        })
    ));
}

#[test]
fn add_chunk_request_frame() {
    let frame = request_frame(
        2,
        AddChunk {
            path: "/logs/a".into(),
            client: ClientId(0x1234),
            previous: Some(ChunkCommit {
                handle: ChunkHandle(0xABCDEF),
                length: 300,
            }),
        },
        Bytes::new(),
    )
    .expect("frame");
    let expected = concat!(
        "0000001a",         // len 26
        "de9a1c70",         // crc
        "00000016",         // hlen 22
        "02",               // request id 2
        "03",               // MasterRequest::AddChunk (index 3)
        "072f6c6f67732f61", // path: 7 bytes, "/logs/a"
        "fb3412",           // client 0x1234
        "01",               // previous: Some
        "fcefcdab00",       //   handle 0xABCDEF
        "fb2c01",           //   length 300 = 0x012c
    );
    check(&frame, expected);
}

#[test]
fn report_part_request_frame() {
    let frame = request_frame(
        3,
        ReportPart {
            replicas: vec![ReplicaReport {
                handle: ChunkHandle(0x2a),
                version: ChunkVersion(7),
                length: 300,
                state: ReplicaState::Finalized,
            }],
        },
        Bytes::new(),
    )
    .expect("frame");
    let expected = concat!(
        "0000000d", // len 13
        "8494b944", // crc
        "00000009", // hlen 9
        "03",       // request id 3
        "13",       // MasterRequest::ReportPart (index 19, after every older variant)
        "01",       // replicas: 1
        "2a",       //   handle 0x2a
        "07",       //   version 7
        "fb2c01",   //   length 300
        "01",       //   state Finalized
    );
    check(&frame, expected);
}

#[test]
fn write_setup_request_frame() {
    let frame = request_frame(
        3,
        WriteSetup {
            token: token(),
            offset: 65536,
            downstream: vec![
                ChunkserverAddr {
                    id: ChunkserverId(2),
                    addr: "10.0.0.2:7001".into(),
                },
                ChunkserverAddr {
                    id: ChunkserverId(3),
                    addr: "10.0.0.3:7001".into(),
                },
            ],
        },
        Bytes::new(),
    )
    .expect("frame");
    let expected = [
        "00000053",                     // len 83
        "9c537529",                     // crc
        "0000004f",                     // hlen 79
        "03",                           // request id 3
        "00",                           // ChunkRequest::WriteSetup (index 0)
        TOKEN,                          // token
        "fc00000100",                   // offset 65536 = 0x0001_0000
        "02",                           // downstream: 2 entries
        "02",                           //   id cs2
        "0d31302e302e302e323a37303031", // addr: 13 bytes, "10.0.0.2:7001"
        "03",                           //   id cs3
        "0d31302e302e302e333a37303031", // addr: 13 bytes, "10.0.0.3:7001"
    ]
    .concat();
    check(&frame, &expected);
}

#[test]
fn packet_frame_with_data() {
    let data = Bytes::from_static(b"hello stampfs");
    let packet = Packet {
        token: token(),
        seq: 5,
        offset: 65536,
        crc: crc32fast::hash(&data),
        sync: true,
    };
    assert_eq!(packet.crc, 0x8ebb_e83e);
    let frame = Frame::new(&packet, data).expect("frame");
    let expected = [
        "00000046",                   // len 70 = 4 + 53 + 13
        "eab75972",                   // crc of hlen | header | data
        "00000035",                   // hlen 53
        TOKEN,                        // token
        "05",                         // seq 5
        "fc00000100",                 // offset 65536
        "fc3ee8bb8e",                 // payload crc 0x8ebbe83e
        "01",                         // sync true
        "68656c6c6f207374616d706673", // data "hello stampfs", raw
    ]
    .concat();
    check(&frame, &expected);
    assert_eq!(frame.decode::<Packet>().expect("decode"), packet);
}

#[test]
fn ack_with_mixed_replica_results() {
    let ack = Ack {
        seq: 5,
        replicas: vec![
            ReplicaAck {
                chunkserver: ChunkserverId(1),
                result: Ok(65549),
            },
            ReplicaAck {
                chunkserver: ChunkserverId(2),
                result: Err(RemoteError::ChecksumMismatch {
                    handle: ChunkHandle(0xABCDEF),
                    offset: 65536,
                }),
            },
            ReplicaAck {
                chunkserver: ChunkserverId(3),
                result: Ok(65549),
            },
        ],
    };
    let frame = Frame::message(&ack).expect("frame");
    let expected = concat!(
        "00000021",   // len 33
        "8c908424",   // crc
        "0000001d",   // hlen 29
        "05",         // seq 5
        "03",         // 3 replicas
        "01",         // cs1
        "00",         //   Ok
        "fc0d000100", //   length 65549 = 0x0001_000d
        "02",         // cs2
        "01",         //   Err
        "03",         //   RemoteError::ChecksumMismatch (index 3)
        "fcefcdab00", //     handle 0xABCDEF
        "fc00000100", //     offset 65536
        "03",         // cs3
        "00",         //   Ok
        "fc0d000100", //   length 65549
    );
    check(&frame, expected);
    assert_eq!(frame.decode::<Ack>().expect("decode"), ack);
}

#[test]
fn stale_token_reply_frame() {
    let err = RemoteError::StaleToken {
        handle: ChunkHandle(0xABCDEF),
        presented: ChunkVersion(6),
        current: ChunkVersion(7),
    };
    let frame =
        reply_frame(3, &Err::<WriteSetupReply, _>(err.clone()), Bytes::new()).expect("frame");
    let expected = concat!(
        "0000000e",   // len 14
        "c845f7b2",   // crc
        "0000000a",   // hlen 10
        "03",         // request id 3
        "01",         // Err
        "00",         // RemoteError::StaleToken (index 0)
        "fcefcdab00", // handle
        "06",         // presented 6
        "07",         // current 7
    );
    check(&frame, expected);
    match parse_reply::<WriteSetupReply>(3, &frame) {
        Err(Error::Remote(got)) => {
            assert_eq!(got, err);
            assert_eq!(got.code(), ErrorCode::StaleToken);
        }
        other => panic!("expected the stale token error, got {other:?}"),
    }
}

#[test]
fn ok_unit_reply_frame() {
    let frame = reply_frame(9, &Ok::<(), RemoteError>(()), Bytes::new()).expect("frame");
    let expected = concat!(
        "00000006", // len 6
        "6384ce84", // crc
        "00000002", // hlen 2
        "09",       // request id 9
        "00",       // Ok, and () is nothing
    );
    check(&frame, expected);
    parse_reply::<()>(9, &frame).expect("ok");
}

#[test]
fn signed_command_request_frame() {
    let cmd = ChunkCommand::BumpVersion {
        handle: ChunkHandle(0xABCDEF),
        version: ChunkVersion(8),
        create: true,
    };
    let issue = Issue {
        chunkserver: ChunkserverId(3),
        session: 0x0102_0304_0506_0708,
        seq: 300,
        epoch: MasterEpoch { term: 5, leader: 2 },
    };
    let signed = Signed::new(&key(), issue, cmd.clone()).expect("sign");

    // The MAC, written out independently: HMAC-SHA256(key, command domain, then for
    // the issue and for the body: u64be length of its bincode encoding, that encoding).
    let issue_bytes = encode_value(&issue).expect("encode");
    assert_eq!(hex::encode(&issue_bytes), "03fd0807060504030201fb2c010502");
    let body = encode_value(&cmd).expect("encode");
    assert_eq!(hex::encode(&body), "00fcefcdab000801");
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&(0u8..32).collect::<Vec<_>>())
        .expect("any key length");
    mac.update(b"stampfs/master-command/v3");
    for part in [&issue_bytes, &body] {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    let independent: [u8; 32] = mac.finalize().into_bytes().into();
    assert_eq!(signed.mac, independent);

    let frame = request_frame(4, signed.clone(), Bytes::new()).expect("frame");
    let expected = concat!(
        "0000003d",                                                         // len 61
        "43fe27bc",                                                         // crc
        "00000039",                                                         // hlen 57
        "04",                                                               // request id 4
        "04",                 // ChunkRequest::Command (index 4)
        "03",                 // issue: chunkserver 3
        "fd0807060504030201", // session 0x0102030405060708 (u64 LE)
        "fb2c01",             // seq 300 (u16 LE)
        "0502",               // epoch: term 5, member 2
        "00",                 // ChunkCommand::BumpVersion (index 0)
        "fcefcdab00",         // handle
        "08",                 // version 8
        "01",                 // create true
        "1c0ed3fe5d53cb1412dc3fa68aab07eb99d632268ff40eaee6e037b2dc90d737", // mac
    );
    check(&frame, expected);
    let (_, req): (u64, ChunkRequest) = parse_request(&frame).expect("parse");
    let ChunkRequest::Command(got) = req else {
        panic!("expected a command, got {req:?}");
    };
    assert_eq!(got.verify(&key()).expect("genuine"), (issue, cmd));
}

/// A CRC-32 catches every single-byte error, so flipping any bit pattern of any one
/// byte of the body must make the frame fail its checksum.
#[test]
fn any_single_byte_flip_in_the_body_fails_the_checksum() {
    let data = Bytes::from_static(b"hello stampfs");
    let packet = Packet {
        token: token(),
        seq: 5,
        offset: 65536,
        crc: crc32fast::hash(&data),
        sync: true,
    };
    let bytes = Frame::new(&packet, data)
        .expect("frame")
        .to_bytes()
        .expect("encode");
    for i in 8..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff, 0x5a] {
            let mut bad = bytes.to_vec();
            bad[i] ^= mask;
            match Frame::parse(&bad) {
                Err(Error::FrameChecksum { expected, actual }) => {
                    assert_eq!(
                        expected,
                        u32::from_be_bytes([bad[4], bad[5], bad[6], bad[7]])
                    );
                    assert_ne!(expected, actual);
                }
                other => panic!("byte {i} ^ {mask:#04x}: expected a checksum error, got {other:?}"),
            }
        }
    }
    // And a flipped CRC field fails the same way.
    for i in 4..8 {
        let mut bad = bytes.to_vec();
        bad[i] ^= 0x01;
        assert!(matches!(
            Frame::parse(&bad),
            Err(Error::FrameChecksum { .. })
        ));
    }
}
