//! The engine's transitions, without sockets: contracts 5 (acknowledged means
//! everywhere) and 6 (a fenced writer fails loudly and never retries with the old
//! token), the resume rule, the idle close and the chunk boundary.

mod overwrite;
mod recovery;

use super::engine::Engine;
use super::event::{Action, Event, StreamFailure, Wait, Watch};
use super::policy::MAX_RECOVERIES;
use crate::error::Error;
use crate::pipeline::{SetupError, StreamEnd};
use bytes::Bytes;
use stampfs_proto::{
    Ack, ChunkHandle, ChunkToken, ChunkVersion, ChunkserverAddr, ChunkserverId, ClientId,
    ClusterKey, FileKind, FileState, FileStatus, InodeId, RemoteError, ReplicaAck, WriteGrant,
    WriteSetupReply,
};

const HANDLE: ChunkHandle = ChunkHandle(3);
const WINDOW: u64 = 1 << 20;

fn grant(version: u64, members: &[u64], chunk_offset: u64) -> WriteGrant {
    let key = ClusterKey::from_bytes([7; 32]);
    WriteGrant {
        token: ChunkToken::sign(&key, HANDLE, ChunkVersion(version), ClientId(5)),
        chunk_index: 0,
        file_offset: 0,
        chunk_offset,
        chunk_size: 1000,
        pipeline: members
            .iter()
            .map(|&id| ChunkserverAddr {
                id: ChunkserverId(id),
                addr: format!("10.0.0.{id}:7000"),
            })
            .collect(),
    }
}

/// In a `Write` or `Flush` given to [`step`]: the end of what the engine sent (an
/// append).
const END: u64 = u64::MAX;

/// Handles `event` (with [`END`] replaced by the file offset of the end) and returns
/// every action that followed.
fn step(e: &mut Engine, mut event: Event) -> Vec<Action> {
    if let Event::Write { offset, .. } | Event::Flush { offset, .. } = &mut event {
        if *offset == END {
            *offset = e.file_end();
        }
    }
    e.handle(event);
    std::iter::from_fn(|| e.next_action()).collect()
}

fn bytes(n: usize) -> Bytes {
    Bytes::from(vec![7u8; n])
}

fn ack(seq: u64, members: &[u64]) -> Ack {
    Ack {
        seq,
        replicas: members
            .iter()
            .map(|&id| ReplicaAck {
                chunkserver: ChunkserverId(id),
                result: Ok(0),
            })
            .collect(),
    }
}

fn accepted(members: &[u64]) -> WriteSetupReply {
    WriteSetupReply {
        accepted: members.iter().map(|&id| ChunkserverId(id)).collect(),
        failed: Vec::new(),
    }
}

fn stale() -> RemoteError {
    RemoteError::StaleToken {
        handle: HANDLE,
        presented: ChunkVersion(4),
        current: ChunkVersion(9),
    }
}

fn closed() -> StreamFailure {
    StreamFailure {
        end: StreamEnd::Closed,
        error: Error::Remote(RemoteError::Unavailable {
            reason: "the pipeline closed the stream".into(),
        }),
    }
}

fn broken() -> StreamFailure {
    StreamFailure {
        end: StreamEnd::Broken,
        error: Error::Remote(RemoteError::Unavailable {
            reason: "did not acknowledge".into(),
        }),
    }
}

fn status() -> FileStatus {
    FileStatus {
        path: "/f".into(),
        inode: InodeId(1),
        kind: FileKind::File,
        length: 110,
        replication: 3,
        chunk_size: 1000,
        state: FileState::Closed,
        attr: stampfs_proto::Attr::default(),
    }
}

fn is_fenced(e: &Error) -> bool {
    matches!(
        e,
        Error::Fenced {
            current: Some(ChunkVersion(9)),
            ..
        }
    )
}

/// Whether `actions` hold a question for the network (anything but bookkeeping).
fn asks_anything(actions: &[Action]) -> bool {
    actions.iter().any(|a| {
        matches!(
            a,
            Action::OpenStream { .. }
                | Action::CheckEnd
                | Action::Send { .. }
                | Action::Resend { .. }
                | Action::FlushStream
                | Action::AskReplicaLength { .. }
                | Action::AddChunk(_)
                | Action::UpdatePipeline(_)
                | Action::CloseFile(_)
                | Action::CloseRefused(_)
        )
    })
}

fn updates(actions: &[Action]) -> Vec<&stampfs_proto::UpdatePipeline> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::UpdatePipeline(u) => Some(u),
            _ => None,
        })
        .collect()
}

fn ids(v: &[u64]) -> Vec<ChunkserverId> {
    v.iter().map(|&i| ChunkserverId(i)).collect()
}

/// A writer appending to a chunk (members 1, 2, 3) at chunk offset 100.
fn appender() -> Engine {
    Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant(4, &[1, 2, 3], 100)),
        false,
    )
}

/// A writer for writes anywhere in the same chunk (members 1, 2, 3), 100 bytes in it.
fn overwriter() -> Engine {
    Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant(4, &[1, 2, 3], 100)),
        true,
    )
}

/// Answers the probe of every member with `lengths`, the set-up with every member
/// accepted and the resend with success; returns every action on the way.
fn answer_open(e: &mut Engine, lengths: &[u64]) -> Vec<Action> {
    let mut seen = Vec::new();
    for &l in lengths {
        seen.extend(step(e, Event::ReplicaLength(Ok(l))));
    }
    let members: Vec<u64> = e
        .grant()
        .map(|g| g.pipeline.iter().map(|m| m.id.0).collect())
        .unwrap_or_default();
    seen.extend(step(e, Event::SetupReplied(Ok(accepted(&members)))));
    seen.extend(step(e, Event::Resent(Ok(()))));
    seen
}

/// An appender with one 10-byte packet (seq 0) in flight on an open stream.
fn one_in_flight() -> Engine {
    let mut e = appender();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    answer_open(&mut e, &[100, 100, 100]);
    e
}

/// An appender on an open stream with nothing in flight (acked 110).
fn at_rest() -> Engine {
    let mut e = one_in_flight();
    step(&mut e, Event::Ack(ack(0, &[1, 2, 3])));
    e
}

// ------------------------------------------------------------------ opening

#[test]
fn the_first_packet_asks_every_member_its_length_then_opens_where_all_of_them_end() {
    let mut e = appender();
    let a = step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    assert!(matches!(a[0], Action::Queued { seq: 0 }));
    let Action::AskReplicaLength { member, .. } = &a[1] else {
        panic!("{a:?}")
    };
    assert_eq!(member.id, ChunkserverId(1));
    let a = step(&mut e, Event::ReplicaLength(Ok(100)));
    assert!(
        matches!(&a[..], [Action::AskReplicaLength { member, .. }] if member.id == ChunkserverId(2))
    );
    step(&mut e, Event::ReplicaLength(Ok(105)));
    let a = step(&mut e, Event::ReplicaLength(Ok(110)));
    let [Action::OpenStream { grant, start, .. }] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!((*start, grant.token.version), (100, ChunkVersion(4)));
    let a = step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2, 3]))));
    let [Action::Resend {
        packets, recovery, ..
    }] = &a[..]
    else {
        panic!("{a:?}")
    };
    assert_eq!(
        (packets.len(), packets[0].offset, *recovery),
        (1, 100, false)
    );
    assert!(step(&mut e, Event::Resent(Ok(()))).is_empty());
    assert_eq!(
        e.wait(),
        Wait {
            commands: true,
            stream: Some(Watch::Acks)
        }
    );
}

#[test]
fn a_new_file_asks_the_master_for_its_first_chunk() {
    let mut e = Engine::new("/f".into(), ClientId(5), WINDOW, None, false);
    let a = step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    let [Action::AddChunk(req)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(req.previous, None);
    let a = step(&mut e, Event::Granted(Ok(grant(1, &[1, 2], 0))));
    assert!(matches!(a[0], Action::Queued { seq: 0 }));
    assert!(matches!(a[1], Action::AskReplicaLength { .. }));
    assert_eq!(e.offsets(), Some((0, 10)));
}

#[test]
fn packets_go_out_on_an_open_stream_and_acks_release_them() {
    let mut e = at_rest();
    // At rest, the stream is checked for an unseen close before the next packet.
    let a = step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(20),
        },
    );
    assert!(matches!(
        &a[..],
        [Action::Queued { seq: 1 }, Action::CheckEnd]
    ));
    let a = step(&mut e, Event::EndChecked(None));
    let [Action::Send { packet, .. }] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!((packet.seq, packet.offset, packet.sync), (1, 110, false));
    assert!(e.quiet_burst(), "sent after the stream was at rest");
    assert!(step(&mut e, Event::Sent(Ok(()))).is_empty());
    // In flight: the next packet goes out without a check.
    let a = step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(5),
        },
    );
    assert!(matches!(
        &a[..],
        [Action::Queued { seq: 2 }, Action::Send { .. }]
    ));
    step(&mut e, Event::Sent(Ok(())));
    let a = step(&mut e, Event::Ack(ack(1, &[1, 2, 3])));
    assert!(matches!(&a[..], [Action::Acked(p)] if p.seq == 1));
    assert!(!e.quiet_burst(), "an ack came back");
    assert_eq!(e.offsets(), Some((130, 135)));
}

#[test]
fn queued_packets_are_pushed_out_when_nothing_more_waits() {
    let mut e = one_in_flight();
    assert!(step(&mut e, Event::Poll { backlog: true }).is_empty());
    let a = step(&mut e, Event::Poll { backlog: false });
    assert!(matches!(&a[..], [Action::FlushStream]));
    assert!(step(&mut e, Event::Flushed(Ok(()))).is_empty());
}

#[test]
fn a_full_window_stops_taking_commands_and_pushes_the_socket() {
    let mut e = Engine::new("/f".into(), ClientId(5), 10, Some(grant(4, &[1], 0)), false);
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    answer_open(&mut e, &[0]);
    assert_eq!(
        e.wait(),
        Wait {
            commands: false,
            stream: Some(Watch::Acks)
        }
    );
    let a = step(&mut e, Event::Poll { backlog: true });
    assert!(matches!(&a[..], [Action::FlushStream]));
}

// ------------------------------------------------------------------ contract 5

#[test]
fn hsync_completes_only_once_every_packet_up_to_it_is_acknowledged_by_every_member() {
    let mut e = one_in_flight();
    let a = step(
        &mut e,
        Event::Flush {
            offset: END,
            sync: true,
            data: bytes(4),
        },
    );
    let [Action::Queued { seq: 1 }, Action::Send { packet, .. }] = &a[..] else {
        panic!("{a:?}")
    };
    assert!(packet.sync, "the tail carries the sync flag itself");
    let a = step(&mut e, Event::Sent(Ok(())));
    assert!(matches!(&a[..], [Action::FlushStream]));
    assert!(step(&mut e, Event::Flushed(Ok(()))).is_empty());
    assert_eq!(
        e.wait(),
        Wait {
            commands: false,
            stream: Some(Watch::Acks)
        }
    );
    let a = step(&mut e, Event::Ack(ack(0, &[1, 2, 3])));
    assert!(matches!(&a[..], [Action::Acked(_), Action::FlushStream]));
    step(&mut e, Event::Flushed(Ok(())));
    let a = step(&mut e, Event::Ack(ack(1, &[1, 2, 3])));
    assert!(matches!(
        &a[..],
        [Action::Acked(_), Action::FlushDone(Ok(()))]
    ));
    assert_eq!(e.offsets(), Some((114, 114)));
}

#[test]
fn a_bare_hsync_sends_an_empty_sync_packet() {
    let mut e = at_rest();
    let a = step(
        &mut e,
        Event::Flush {
            offset: END,
            sync: true,
            data: Bytes::new(),
        },
    );
    assert!(matches!(
        &a[..],
        [Action::Queued { seq: 1 }, Action::CheckEnd]
    ));
    let a = step(&mut e, Event::EndChecked(None));
    assert!(
        matches!(&a[..], [Action::Send { packet, .. }] if packet.sync && packet.data.is_empty())
    );
}

#[test]
fn an_hflush_with_nothing_in_flight_completes_at_once() {
    let mut e = at_rest();
    let a = step(
        &mut e,
        Event::Flush {
            offset: END,
            sync: false,
            data: Bytes::new(),
        },
    );
    assert!(matches!(&a[..], [Action::FlushDone(Ok(()))]));
}

#[test]
fn an_ack_missing_a_member_excludes_that_member() {
    let mut e = one_in_flight();
    let a = step(&mut e, Event::Ack(ack(0, &[1, 3])));
    assert!(matches!(a[0], Action::DropStream));
    let u = updates(&a);
    assert_eq!(u.len(), 1);
    assert_eq!(
        (u[0].survivors.clone(), u[0].acked_length),
        (ids(&[1, 3]), 100)
    );
    assert_eq!(
        e.offsets(),
        Some((100, 110)),
        "the packet is not acknowledged"
    );
}

#[test]
fn an_ack_with_a_failed_replica_excludes_it() {
    let mut e = one_in_flight();
    let mut bad = ack(0, &[1, 2, 3]);
    bad.replicas[2].result = Err(RemoteError::Io {
        reason: "EIO".into(),
    });
    let a = step(&mut e, Event::Ack(bad));
    assert_eq!(updates(&a)[0].survivors, ids(&[1, 2]));
}

#[test]
fn an_ack_out_of_order_excludes_the_head() {
    let mut e = one_in_flight();
    let a = step(&mut e, Event::Ack(ack(7, &[1, 2, 3])));
    assert_eq!(updates(&a)[0].survivors, ids(&[2, 3]));
}

// ------------------------------------------------------------------ chunks, close

/// A writer with 890 of its chunk's 1000 bytes written that is given 120 more: the
/// first 110 fill the chunk, are acknowledged, and it asks for the next chunk (the
/// `AddChunk` it sends is returned).
fn crossing_the_chunk_end() -> (Engine, stampfs_proto::AddChunk) {
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant(4, &[1], 890)),
        false,
    );
    let a = step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(120),
        },
    );
    assert!(matches!(
        &a[..],
        [Action::Queued { seq: 0 }, Action::AskReplicaLength { .. }]
    ));
    let a = answer_open(&mut e, &[890]);
    let [.., Action::Resend { packets, .. }, Action::FlushStream] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!((packets[0].offset, packets[0].data.len()), (890, 110));
    assert!(
        step(&mut e, Event::Flushed(Ok(()))).is_empty(),
        "waits for the ack"
    );
    // An append writer moves at once (no sync of the full chunk: its fast path).
    let a = step(&mut e, Event::Ack(ack(0, &[1])));
    let [Action::Acked(_), Action::FinishStream, Action::AddChunk(req)] = &a[..] else {
        panic!("{a:?}")
    };
    let req = req.clone();
    (e, req)
}

#[test]
fn a_chunk_boundary_drains_commits_and_adds_the_next_chunk() {
    let (mut e, req) = crossing_the_chunk_end();
    assert_eq!(
        req.previous.map(|c| (c.handle, c.length)),
        Some((HANDLE, 1000))
    );
    let mut next = grant(1, &[2], 0);
    next.chunk_index = 1;
    next.file_offset = 1000;
    next.token = ChunkToken::sign(
        &ClusterKey::from_bytes([7; 32]),
        ChunkHandle(4),
        ChunkVersion(1),
        ClientId(5),
    );
    let a = step(&mut e, Event::Granted(Ok(next)));
    assert!(matches!(
        &a[..],
        [Action::Queued { seq: 1 }, Action::AskReplicaLength { .. }]
    ));
    assert_eq!(e.offsets(), Some((0, 10)));
}

#[test]
fn a_quota_refusing_the_next_chunk_closes_the_file_at_what_fit_before_the_caller_hears() {
    // The chunk is full (1000 of 1000 acknowledged); the next write needs a new one.
    let (mut e, _) = crossing_the_chunk_end();
    let a = step(&mut e, Event::Close { keep_mtime: false });
    assert!(a.is_empty(), "the close waits for the chunk: {a:?}");
    let refusal = RemoteError::QuotaExceeded {
        path: "/".into(),
        resource: stampfs_proto::QuotaResource::Bytes,
        limit: 1000,
        used: 1000,
        requested: 1000,
    };
    let a = step(&mut e, Event::Granted(Err(Error::Remote(refusal))));
    let [Action::CloseRefused(req), Action::Fail(f), Action::CloseDone(Err(g))] = &a[..] else {
        panic!("{a:?}")
    };
    // Closed with the chunk written in complete, everything in it acknowledged.
    assert_eq!(req.client, ClientId(5));
    assert_eq!(req.last.map(|c| (c.handle, c.length)), Some((HANDLE, 1000)));
    assert!(f.is_quota_exceeded() && g.is_quota_exceeded(), "{f} / {g}");
    assert!(!asks_anything(&step(&mut e, Event::IdleTimeout)));
}

/// Answers the sync packet `seq` a move to another chunk sends on the chunk it
/// leaves (the at-rest check, the send, the flush, every member's ack); returns what
/// followed the ack (the move itself).
pub(super) fn sync_before_move(e: &mut Engine, seq: u64, members: &[u64]) -> Vec<Action> {
    let a = step(e, Event::EndChecked(None));
    sync_sent(e, &a, seq, members)
}

/// [`sync_before_move`] from the actions `a` that sent the sync packet.
pub(super) fn sync_sent(e: &mut Engine, a: &[Action], seq: u64, members: &[u64]) -> Vec<Action> {
    let Some(Action::Send { packet, .. }) = a.last() else {
        panic!("{a:?}")
    };
    assert!(
        packet.sync && packet.data.is_empty() && packet.seq == seq,
        "{packet:?}"
    );
    let a = step(e, Event::Sent(Ok(())));
    assert!(matches!(&a[..], [Action::FlushStream]), "{a:?}");
    step(e, Event::Flushed(Ok(())));
    step(e, Event::Ack(ack(seq, members)))
}

#[test]
fn close_drains_commits_the_acknowledged_length_and_finishes() {
    let mut e = one_in_flight();
    let a = step(&mut e, Event::Close { keep_mtime: false });
    assert!(matches!(&a[..], [Action::FlushStream]));
    step(&mut e, Event::Flushed(Ok(())));
    let a = step(&mut e, Event::Ack(ack(0, &[1, 2, 3])));
    let [Action::Acked(_), Action::FinishStream, Action::CloseFile(req)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(req.last.map(|c| c.length), Some(110));
    let a = step(&mut e, Event::FileClosed(Ok(status())));
    assert!(matches!(&a[..], [Action::CloseDone(Ok(_))]));
    assert!(e.is_finished());
}

#[test]
fn a_close_the_master_refuses_fails_the_writer() {
    let mut e = at_rest();
    step(&mut e, Event::Close { keep_mtime: false });
    let a = step(&mut e, Event::FileClosed(Err(Error::Remote(stale()))));
    assert!(
        matches!(&a[..], [Action::Fail(f), Action::CloseDone(Err(g))] if is_fenced(f) && is_fenced(g))
    );
    assert!(e.failure().is_some_and(is_fenced));
}

#[test]
fn a_final_drain_that_gives_up_hands_the_waiter_its_own_error() {
    let mut e = one_in_flight();
    step(
        &mut e,
        Event::Flush {
            offset: END,
            sync: false,
            data: Bytes::new(),
        },
    );
    // The flush fails on a broken stream; no replica can be reached afterwards.
    let mut a = step(&mut e, Event::Flushed(Err(broken())));
    let mut version = 5;
    while !updates(&a).is_empty() {
        step(&mut e, Event::Granted(Ok(grant(version, &[2, 3], 100))));
        version += 1;
        let down = || Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        step(&mut e, Event::ReplicaLength(Err(down())));
        a = step(&mut e, Event::ReplicaLength(Err(down())));
    }
    assert_eq!(version, 5 + MAX_RECOVERIES as u64);
    let done = a.iter().find_map(|a| match a {
        Action::FlushDone(Err(e)) => Some(e.to_string()),
        _ => None,
    });
    assert_eq!(
        done.as_deref(),
        Some("write pipeline for /f failed: gave up after 6 pipeline recoveries")
    );
}
