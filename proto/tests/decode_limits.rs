//! Decoding a header never allocates more than a small multiple of the bytes that
//! actually arrived (`codec::decode_limit`), and the tiered limit never refuses a
//! legitimate message.
//!
//! Like `alloc_cap.rs` (a test binary has one global allocator, hence a file of its
//! own), this binary installs an allocator that records, for the current thread while
//! a measurement is armed, the largest single allocation (or reallocation) and the
//! total bytes requested. Hostile headers are built before the measurement starts, so
//! only the decoder's own allocations count.

mod counting;

use bytes::Bytes;
use counting::measure;
use stampfs_proto::codec::{
    decode_limit, decode_value, encode_value, DECODE_EXPANSION, DECODE_LIMITS, PREFIX_LEN,
};
use stampfs_proto::rpc::{parse_reply, parse_request};
use stampfs_proto::*;
use std::fmt::Debug;

/// Huge claims: just under 16 MiB (a byte string the old single `MAX_HEADER_LEN`
/// limit let bincode allocate in full before it found the bytes missing), exactly
/// 16 MiB, and 4 GiB.
const HUGE_CLAIMS: [u64; 3] = [(16 << 20) - 16, 16 << 20, 4 << 30];

/// What a small header may cost at most: its decode limit (the smallest tier).
const SMALL: usize = 4 << 10;

/// A bincode varint, as the encoder writes it.
fn varint(v: u64) -> Vec<u8> {
    encode_value(&v).expect("encode")
}

/// A whole frame on the wire around `header` (no data), with a correct CRC.
fn wire(header: &[u8]) -> Vec<u8> {
    let mut body = (header.len() as u32).to_be_bytes().to_vec();
    body.extend_from_slice(header);
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The frame parsed from `wire(header)`: it passes the length and CRC checks, so only
/// the header's contents are hostile.
fn frame(header: &[u8]) -> Frame {
    let bytes = wire(header);
    let (f, used) = Frame::parse(&bytes)
        .expect("frame is well formed")
        .expect("frame is complete");
    assert_eq!(used, bytes.len());
    assert_eq!(used, PREFIX_LEN + 4 + header.len());
    f
}

/// The error must say what happened: the decode limit refused a length.
fn assert_limit_error<T: Debug>(what: &str, r: Result<T>) {
    match r {
        Err(Error::Malformed { reason }) => {
            assert!(
                reason.contains("decode limit"),
                "{what}: unclear error: {reason}"
            );
            assert_eq!(
                Error::Malformed {
                    reason: reason.clone()
                }
                .code(),
                ErrorCode::MalformedFrame
            );
        }
        other => panic!("{what}: expected a decode-limit error, got {other:?}"),
    }
}

#[test]
fn small_frames_claiming_huge_collections_fail_cheaply() {
    for claim in HUGE_CLAIMS {
        let len = varint(claim);
        // A bare collection: the length and three bytes.
        let mut bare = len.clone();
        bare.extend_from_slice(b"abc");
        let bare = frame(&bare);
        // A Stat request whose path claims `claim` bytes: request id 1, variant 9.
        let mut stat = vec![1u8, 9];
        stat.extend_from_slice(&len);
        stat.push(b'/');
        let stat = frame(&stat);
        // A Register (variant 14) whose replica list claims `claim` entries:
        // id None, addr "", capacity 0, used 0, replicas.
        let mut register = vec![1u8, 14, 0, 0, 0, 0];
        register.extend_from_slice(&len);
        register.extend_from_slice(&[1, 2, 3, 0]);
        let register = frame(&register);
        // A reply to request 1, Ok, with a list of `claim` file statuses.
        let mut list = vec![1u8, 0];
        list.extend_from_slice(&len);
        list.push(0);
        let list = frame(&list);
        // A heartbeat reply with `claim` signed commands.
        let mut heartbeat = vec![1u8, 0];
        heartbeat.extend_from_slice(&len);
        heartbeat.push(0);
        let heartbeat = frame(&heartbeat);
        for f in [&bare, &stat, &register, &list, &heartbeat] {
            assert!(f.header.len() <= 20, "a small frame");
            assert_eq!(decode_limit(f.header.len()), SMALL);
        }

        let (results, seen) = measure(|| {
            vec![
                ("Vec<u8>", bare.decode::<Vec<u8>>().map(|_| ())),
                ("String", bare.decode::<String>().map(|_| ())),
                ("Vec<u64>", bare.decode::<Vec<u64>>().map(|_| ())),
                (
                    "Vec<FileStatus>",
                    bare.decode::<Vec<FileStatus>>().map(|_| ()),
                ),
                ("Stat", parse_request::<MasterRequest>(&stat).map(|_| ())),
                (
                    "Register",
                    parse_request::<MasterRequest>(&register).map(|_| ()),
                ),
                (
                    "List reply",
                    parse_reply::<Vec<FileStatus>>(1, &list).map(|_| ()),
                ),
                (
                    "Heartbeat reply",
                    parse_reply::<HeartbeatReply>(1, &heartbeat).map(|_| ()),
                ),
            ]
        });
        for (what, r) in results {
            assert_limit_error(&format!("{what} claiming {claim}"), r);
        }
        assert!(
            seen.largest <= SMALL,
            "claim {claim}: a {}-byte allocation",
            seen.largest
        );
        // Eight decodes, eight error messages and the vector holding them.
        assert!(
            seen.total <= 16 << 10,
            "claim {claim}: {} bytes allocated in all",
            seen.total
        );
    }
}

#[test]
fn what_a_header_can_cost_follows_its_length() {
    for hlen in [8usize, 64, 65, 100, 1_000, 4_096, 10_000, 100_000, 300_000] {
        let limit = decode_limit(hlen);
        assert!(limit <= MAX_HEADER_LEN);
        assert!(
            limit <= SMALL.max(8 * DECODE_EXPANSION * hlen),
            "{hlen} bytes: limit {limit}"
        );
        assert!(
            limit >= (DECODE_EXPANSION * hlen).min(MAX_HEADER_LEN),
            "{hlen} bytes: limit {limit} leaves no room"
        );
        // The largest claim the limit lets through (the length itself claims 8),
        // then the huge ones.
        for claim in [(limit - 8) as u64, MAX_HEADER_LEN as u64, 4 << 30] {
            let mut header = varint(claim);
            header.resize(hlen.max(header.len() + 1), 0x61);
            let (failed, seen) = measure(|| {
                [
                    decode_value::<Vec<u8>>(&header).is_err(),
                    decode_value::<String>(&header).is_err(),
                    decode_value::<Vec<u64>>(&header).is_err(),
                ]
            });
            assert_eq!(failed, [true; 3], "{hlen} bytes claiming {claim}");
            assert!(
                seen.largest <= limit,
                "{hlen} bytes claiming {claim}: {} bytes allocated, limit {limit}",
                seen.largest
            );
        }
    }
    // Past `MAX_HEADER_LEN / DECODE_EXPANSION` the limit is the old one.
    assert_eq!(
        decode_limit(MAX_HEADER_LEN / DECODE_EXPANSION + 1),
        MAX_HEADER_LEN
    );
    assert_eq!(decode_limit(MAX_HEADER_LEN), MAX_HEADER_LEN);
    assert_eq!(decode_limit(usize::MAX), MAX_HEADER_LEN);
}

// ---------------------------------------------------------------- legitimate messages

fn token() -> ChunkToken {
    ChunkToken {
        handle: ChunkHandle(0),
        version: ChunkVersion(0),
        client: ClientId(0),
        mac: [0; 32],
    }
}

fn status() -> FileStatus {
    FileStatus {
        path: String::new(),
        inode: InodeId(0),
        kind: FileKind::File,
        length: 0,
        replication: 0,
        chunk_size: 0,
        state: FileState::Open,
        attr: Attr::default(),
    }
}

fn located(replicas: usize) -> LocatedChunk {
    LocatedChunk {
        handle: ChunkHandle(0),
        version: ChunkVersion(0),
        file_offset: 0,
        length: 0,
        complete: false,
        unconfirmed: false,
        token: token(),
        replicas: vec![
            ReplicaLocation {
                chunkserver: ChunkserverId(0),
                addr: String::new(),
                version: ChunkVersion(0),
                state: ReplicaState::Writing,
                decommissioning: false,
            };
            replicas
        ],
    }
}

fn file_health(problems: usize) -> FileHealth {
    FileHealth {
        path: String::new(),
        state: FileState::Open,
        length: 0,
        replication: 0,
        healthy: false,
        counts: HealthCounts::default(),
        problems: vec![
            ChunkProblem {
                handle: ChunkHandle(0),
                index: 0,
                version: ChunkVersion(0),
                replication: 0,
                live: 0,
                stale: 0,
                corrupt: 0,
                ahead: 0,
                missing: false,
            };
            problems
        ],
    }
}

fn fsck(files: usize, problems: usize) -> FsckReport {
    FsckReport {
        path: String::new(),
        healthy: false,
        total: HealthCounts::default(),
        files: vec![file_health(problems); files],
        truncated: false,
        orphan_replicas: 0,
        replications_in_flight: 0,
    }
}

/// Decodes `make(n)` for the largest `n` whose header just fits under each tier's
/// edge (`tier / DECODE_EXPANSION` bytes): the densest message a tier must hold.
fn decodes_at_every_edge<M>(name: &str, make: impl Fn(usize) -> M)
where
    M: bincode::Encode + bincode::Decode<()> + PartialEq + Debug,
{
    let encoded_len = |n: usize| encode_value(&make(n)).expect("encode").len();
    for tier in &DECODE_LIMITS[..DECODE_LIMITS.len() - 1] {
        let edge = tier / DECODE_EXPANSION;
        if encoded_len(0) > edge {
            continue;
        }
        // Every element encodes to at least one byte, so `edge` elements are too many.
        let (mut lo, mut hi) = (0usize, edge);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if encoded_len(mid) <= edge {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let msg = make(lo);
        let bytes = encode_value(&msg).expect("encode");
        assert_eq!(decode_limit(bytes.len()), *tier);
        let back = decode_value::<M>(&bytes).unwrap_or_else(|e| {
            panic!(
                "{name}: {lo} elements in {} bytes do not decode under the {tier}-byte limit: {e}",
                bytes.len()
            )
        });
        assert!(back == msg, "{name}: round trip differs");
    }
}

#[test]
fn the_densest_legitimate_messages_decode_at_every_tier_edge() {
    decodes_at_every_edge("Vec<ChunkserverId>", |n| vec![ChunkserverId(0); n]);
    decodes_at_every_edge("Ack (errors)", |n| Ack {
        seq: 0,
        replicas: vec![
            ReplicaAck {
                chunkserver: ChunkserverId(0),
                result: Err(RemoteError::BadToken {
                    handle: ChunkHandle(0),
                }),
            };
            n
        ],
    });
    decodes_at_every_edge("Ack (lengths)", |n| Ack {
        seq: 0,
        replicas: vec![
            ReplicaAck {
                chunkserver: ChunkserverId(0),
                result: Ok(0),
            };
            n
        ],
    });
    decodes_at_every_edge("WriteSetupReply.failed", |n| {
        let failed = (
            ChunkserverId(0),
            RemoteError::NoSpace {
                chunkserver: ChunkserverId(0),
            },
        );
        (
            1u64,
            Ok::<_, RemoteError>(WriteSetupReply {
                accepted: vec![ChunkserverId(0); n],
                failed: vec![failed; n],
            }),
        )
    });
    decodes_at_every_edge("Register", |n| {
        (
            1u64,
            MasterRequest::Register(Register {
                id: None,
                addr: String::new(),
                capacity: 0,
                used: 0,
                replicas: vec![
                    ReplicaReport {
                        handle: ChunkHandle(0),
                        version: ChunkVersion(0),
                        length: 0,
                        state: ReplicaState::Writing,
                    };
                    n
                ],
                session: u64::MAX,
            }),
        )
    });
    decodes_at_every_edge("ReportPart", |n| {
        (
            1u64,
            MasterRequest::ReportPart(ReportPart {
                replicas: vec![
                    ReplicaReport {
                        handle: ChunkHandle(0),
                        version: ChunkVersion(0),
                        length: 0,
                        state: ReplicaState::Writing,
                    };
                    n
                ],
            }),
        )
    });
    decodes_at_every_edge("UpdatePipeline", |n| {
        MasterRequest::UpdatePipeline(UpdatePipeline {
            path: String::new(),
            client: ClientId(0),
            handle: ChunkHandle(0),
            survivors: vec![ChunkserverId(0); n],
            acked_length: 0,
        })
    });
    decodes_at_every_edge("WriteSetup", |n| {
        ChunkRequest::WriteSetup(WriteSetup {
            token: token(),
            offset: 0,
            downstream: vec![
                ChunkserverAddr {
                    id: ChunkserverId(0),
                    addr: String::new(),
                };
                n
            ],
        })
    });
    decodes_at_every_edge("Vec<FileStatus>", |n| {
        (1u64, Ok::<_, RemoteError>(vec![status(); n]))
    });
    decodes_at_every_edge("FileLocations.chunks", |n| FileLocations {
        status: status(),
        chunks: vec![located(0); n],
    });
    decodes_at_every_edge("LocatedChunk.replicas", |n| FileLocations {
        status: status(),
        chunks: vec![located(n)],
    });
    decodes_at_every_edge("FsckReport.files", |n| fsck(n, 0));
    decodes_at_every_edge("FileHealth.problems", |n| fsck(1, n));
    decodes_at_every_edge("ClusterReport", |n| ClusterReport {
        chunkservers: vec![
            ChunkserverStatus {
                id: ChunkserverId(0),
                addr: String::new(),
                state: ChunkserverState::Live,
                last_heartbeat_ms_ago: None,
                capacity: 0,
                used: 0,
                replicas: 0,
                active_streams: 0,
                queued_commands: 0,
                decommission: DecommissionState::InService,
            };
            n
        ],
        chunks: HealthCounts::default(),
        orphan_replicas: 0,
        replications_in_flight: 0,
        masters: None,
        safe_mode: Default::default(),
        balancer: Default::default(),
    });
    decodes_at_every_edge("HeartbeatReply", |n| HeartbeatReply {
        commands: vec![
            Signed {
                issue: Issue {
                    chunkserver: ChunkserverId(0),
                    session: 0,
                    seq: 0,
                    epoch: MasterEpoch::default(),
                },
                body: ChunkCommand::Info {
                    handle: ChunkHandle(0),
                },
                mac: [0; 32],
            };
            n
        ],
        reregister: false,
    });
    decodes_at_every_edge("Vec<Option<ReplicaReport>>", |n| {
        vec![None::<ReplicaReport>; n]
    });
}

/// The frames of a real conversation still cross the codec: a packet with its data,
/// decoded through `Frame::decode` after a stream read.
#[test]
fn ordinary_frames_still_decode() {
    let packet = Packet {
        token: token(),
        seq: 3,
        offset: 65_536,
        crc: 7,
        sync: true,
    };
    let f = Frame::new(&packet, Bytes::from(vec![5u8; 70_000])).expect("frame");
    let bytes = f.to_bytes().expect("bytes");
    let (parsed, _) = Frame::parse(&bytes).expect("parse").expect("whole");
    assert_eq!(parsed.decode::<Packet>().expect("decode"), packet);
    assert_eq!(parsed.data.len(), 70_000);
}
