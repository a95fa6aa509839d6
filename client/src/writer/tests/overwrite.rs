//! Writes at any offset: an overwrite engine's streams, its window, its pipeline
//! recovery (no length probe; every unacknowledged packet resent in order) and the
//! writes it refuses.

use super::*;

/// An overwriter with a stream open (members 1, 2, 3) and nothing in flight.
fn open_overwriter() -> Engine {
    let mut e = overwriter();
    let a = step(
        &mut e,
        Event::Write {
            offset: 100,
            data: bytes(10),
        },
    );
    // No member is asked its length: an overwrite set-up cuts nothing.
    let [Action::Queued { seq: 0 }, Action::OpenStream {
        start, overwrite, ..
    }] = &a[..]
    else {
        panic!("{a:?}")
    };
    assert_eq!((*start, *overwrite), (100, true));
    step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2, 3]))));
    step(&mut e, Event::Resent(Ok(())));
    step(&mut e, Event::Ack(ack(0, &[1, 2, 3])));
    assert_eq!(e.offsets(), Some((110, 110)));
    e
}

/// Writes `n` bytes at `offset`, answering the at-rest check (the stream is still
/// there) when the engine makes one.
fn write(e: &mut Engine, offset: u64, n: usize) -> Vec<Action> {
    let mut a = step(
        e,
        Event::Write {
            offset,
            data: bytes(n),
        },
    );
    if a.iter().any(|a| matches!(a, Action::CheckEnd)) {
        a.extend(step(e, Event::EndChecked(None)));
    }
    a
}

fn sent(a: &[Action]) -> Vec<(u64, u64, usize)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Send { packet, .. } => Some((packet.seq, packet.offset, packet.data.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_write_below_the_end_goes_in_place_and_leaves_the_length_alone() {
    let mut e = open_overwriter();
    let a = write(&mut e, 3, 20);
    assert_eq!(sent(&a), vec![(1, 3, 20)]);
    step(&mut e, Event::Sent(Ok(())));
    step(&mut e, Event::Ack(ack(1, &[1, 2, 3])));
    // The furthest byte sent and acknowledged is still 110: that is what is committed.
    assert_eq!(e.offsets(), Some((110, 110)));
    let a = step(&mut e, Event::Close { keep_mtime: false });
    let close = a.iter().find_map(|a| match a {
        Action::CloseFile(c) => Some(c),
        _ => None,
    });
    assert_eq!(close.and_then(|c| c.last).map(|c| c.length), Some(110));
}

#[test]
fn a_write_across_the_end_overwrites_then_extends() {
    let mut e = open_overwriter();
    let a = write(&mut e, 105, 30);
    assert_eq!(sent(&a), vec![(1, 105, 30)]);
    step(&mut e, Event::Sent(Ok(())));
    step(&mut e, Event::Ack(ack(1, &[1, 2, 3])));
    assert_eq!(e.offsets(), Some((135, 135)));
}

#[test]
fn the_window_counts_the_bytes_of_unacknowledged_overwrites() {
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        25,
        Some(grant(4, &[1], 100)),
        true,
    );
    step(
        &mut e,
        Event::Write {
            offset: 0,
            data: bytes(10),
        },
    );
    step(&mut e, Event::SetupReplied(Ok(accepted(&[1]))));
    step(&mut e, Event::Resent(Ok(())));
    assert!(e.wait().commands, "10 of 25 bytes in flight");
    step(
        &mut e,
        Event::Write {
            offset: 0,
            data: bytes(20),
        },
    );
    step(&mut e, Event::Sent(Ok(())));
    // Both packets rewrite bytes below the end: `sent - acked` is 0, but 30 bytes
    // are in flight.
    assert!(!e.wait().commands, "the window is full");
    step(&mut e, Event::Ack(ack(0, &[1])));
    assert!(e.wait().commands);
}

#[test]
fn pipeline_recovery_resends_every_unacknowledged_packet_in_order_without_a_probe() {
    let mut e = open_overwriter();
    for (seq, offset) in [(1u64, 50u64), (2, 0), (3, 110)] {
        let a = write(&mut e, offset, 10);
        assert_eq!(sent(&a), vec![(seq, offset, 10)]);
        step(&mut e, Event::Sent(Ok(())));
    }
    step(&mut e, Event::Ack(ack(1, &[1, 2, 3])));
    // Member 3 fails packet 2.
    let mut bad = ack(2, &[1, 2, 3]);
    bad.replicas[2].result = Err(RemoteError::Io {
        reason: "EIO".into(),
    });
    let a = step(&mut e, Event::Ack(bad));
    let u = updates(&a);
    assert_eq!(
        (u[0].survivors.clone(), u[0].acked_length),
        (ids(&[1, 2]), 110)
    );
    let a = step(&mut e, Event::Granted(Ok(grant(5, &[1, 2], 100))));
    assert!(
        !a.iter()
            .any(|a| matches!(a, Action::AskReplicaLength { .. })),
        "{a:?}"
    );
    let [Action::OpenStream {
        start,
        overwrite: true,
        grant,
    }] = &a[..]
    else {
        panic!("{a:?}")
    };
    // The first unacknowledged packet starts at 0: every survivor holds at least
    // the acknowledged 110 bytes.
    assert_eq!((*start, grant.token.version), (0, ChunkVersion(5)));
    let a = step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2]))));
    let [Action::Resend {
        packets, recovery, ..
    }] = &a[..]
    else {
        panic!("{a:?}")
    };
    let resent: Vec<(u64, u64)> = packets.iter().map(|p| (p.seq, p.offset)).collect();
    assert_eq!((resent, *recovery), (vec![(2, 0), (3, 110)], true));
}

#[test]
fn a_stale_token_in_an_ack_of_an_overwrite_fences_the_writer() {
    let mut e = open_overwriter();
    write(&mut e, 0, 10);
    step(&mut e, Event::Sent(Ok(())));
    let mut late = ack(1, &[1, 2, 3]);
    late.replicas[0].result = Err(stale());
    let a = step(&mut e, Event::Ack(late));
    assert!(!asks_anything(&a), "{a:?}");
    assert!(e.failure().is_some_and(is_fenced));
}

/// The grant of chunk `index` (chunk size 1000) with `chunk_offset` bytes in it.
fn grant_of(index: u64, version: u64, chunk_offset: u64) -> WriteGrant {
    let mut g = grant(version, &[1, 2], chunk_offset);
    g.chunk_index = index;
    g.file_offset = index * 1000;
    g
}

/// The `OpenChunk` among `a`.
fn open_chunk(a: &[Action]) -> Option<&stampfs_proto::OpenChunk> {
    a.iter().find_map(|a| match a {
        Action::OpenChunk(r) => Some(r),
        _ => None,
    })
}

#[test]
fn an_overwriter_moves_to_the_chunk_that_holds_a_write_and_back() {
    // Writing chunk 1 (of 1100 bytes in all), 100 bytes in it so far.
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(1, 4, 100)),
        true,
    )
    .with_file(1100, 1000);
    // A write into chunk 0: nothing is in flight, so it moves at once, committing
    // chunk 1 at what was acknowledged.
    let a = write(&mut e, 999, 1);
    let req = open_chunk(&a).unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!(req.index, 0);
    assert_eq!(
        req.previous.map(|c| (c.handle, c.length)),
        Some((HANDLE, 100))
    );
    assert!(!a.iter().any(|a| matches!(a, Action::Send { .. })), "{a:?}");
    // The grant of chunk 0 (full): the byte goes in place, on an overwrite stream.
    let a = step(&mut e, Event::Granted(Ok(grant_of(0, 7, 1000))));
    let opened = a.iter().find_map(|a| match a {
        Action::OpenStream {
            grant,
            start,
            overwrite,
        } => Some((grant.chunk_index, *start, *overwrite)),
        _ => None,
    });
    assert_eq!(opened, Some((0, 999, true)), "{a:?}");
    step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2]))));
    step(&mut e, Event::Resent(Ok(())));
    step(&mut e, Event::Ack(ack(0, &[1, 2])));
    assert_eq!(e.offsets(), Some((1000, 1000)), "chunk 0 stays full");
    assert_eq!(e.known_end(), 1100, "the file's end is remembered");
    // Back to the end of the file: chunk 1 again, after chunk 0 is drained, synced
    // and committed full.
    let a = write(&mut e, 1100, 5);
    assert!(open_chunk(&a).is_none(), "synced first: {a:?}");
    let a = super::sync_sent(&mut e, &a, 1, &[1, 2]);
    let req = open_chunk(&a).unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!(req.index, 1);
    assert_eq!(req.previous.map(|c| c.length), Some(1000));
    let a = step(&mut e, Event::Granted(Ok(grant_of(1, 5, 100))));
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::OpenStream { start: 100, .. })),
        "{a:?}"
    );
    step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2]))));
    step(&mut e, Event::Resent(Ok(())));
    // Packet 1 was the sync of chunk 0.
    step(&mut e, Event::Ack(ack(2, &[1, 2])));
    assert_eq!(e.offsets(), Some((105, 105)));
    let a = step(&mut e, Event::Close { keep_mtime: false });
    let close = a.iter().find_map(|a| match a {
        Action::CloseFile(c) => Some(c),
        _ => None,
    });
    assert_eq!(close.and_then(|c| c.last).map(|c| c.length), Some(105));
}

#[test]
fn a_move_waits_for_every_packet_of_the_chunk_it_leaves() {
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(1, 4, 100)),
        true,
    )
    .with_file(1100, 1000);
    write(&mut e, 1100, 10);
    step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2]))));
    step(&mut e, Event::Resent(Ok(())));
    // Unacknowledged: a write into chunk 0 drains first.
    let a = write(&mut e, 10, 1);
    assert!(open_chunk(&a).is_none(), "{a:?}");
    step(&mut e, Event::Flushed(Ok(())));
    let a = step(&mut e, Event::Ack(ack(0, &[1, 2])));
    assert!(open_chunk(&a).is_none(), "synced first: {a:?}");
    let a = super::sync_before_move(&mut e, 1, &[1, 2]);
    let req = open_chunk(&a).unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!(req.previous.map(|c| c.length), Some(110));
}

#[test]
fn the_end_of_a_file_whose_last_chunk_is_full_is_a_new_chunk() {
    // Writing chunk 0 of a file of two full chunks.
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(0, 4, 1000)),
        true,
    )
    .with_file(2000, 1000);
    let a = write(&mut e, 2000, 1);
    let add = a.iter().find_map(|a| match a {
        Action::AddChunk(r) => Some(r),
        _ => None,
    });
    assert_eq!(
        add.and_then(|r| r.previous).map(|c| c.length),
        Some(1000),
        "chunk 0 is committed full: {a:?}"
    );
}

#[test]
fn a_writer_without_a_chunk_moves_to_the_one_a_write_goes_into() {
    // A file of two full chunks, opened without a grant.
    let mut e = Engine::new("/f".into(), ClientId(5), WINDOW, None, true).with_file(2000, 1000);
    let a = write(&mut e, 1500, 1);
    let req = open_chunk(&a).unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!((req.index, req.previous), (1, None));
}

#[test]
fn an_overwriter_refuses_a_write_past_the_end() {
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant(4, &[1], 100)),
        true,
    );
    // A gap: the front writes zeros into it first, so the engine never sees one.
    let a = write(&mut e, 101, 1);
    assert!(!asks_anything(&a), "{a:?}");
    assert!(matches!(e.failure(), Some(Error::NotSupported { .. })));
}

#[test]
fn an_appender_refuses_a_write_anywhere_but_the_end() {
    let mut e = appender();
    let a = write(&mut e, 50, 1);
    assert!(!asks_anything(&a), "{a:?}");
    assert!(matches!(e.failure(), Some(Error::NotSupported { .. })));
}

// ------------------------------------------------------------------ shrink

#[test]
fn a_shrink_lowers_the_committed_length_first_then_cuts_with_an_append_set_up() {
    let mut e = open_overwriter();
    let a = step(&mut e, Event::Cut { offset: 50 });
    let [Action::CutLastChunk(req)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!((req.handle, req.length), (HANDLE, 50));
    let a = step(&mut e, Event::ChunkCut(Ok(())));
    let [Action::FinishStream, Action::OpenStream {
        start, overwrite, ..
    }] = &a[..]
    else {
        panic!("{a:?}")
    };
    // An append set-up is what cuts every member.
    assert_eq!((*start, *overwrite), (50, false));
    let a = step(&mut e, Event::SetupReplied(Ok(accepted(&[1, 2, 3]))));
    let [Action::Resend { packets, .. }] = &a[..] else {
        panic!("{a:?}")
    };
    assert!(packets.is_empty());
    let a = step(&mut e, Event::Resent(Ok(())));
    assert!(
        matches!(&a[..], [Action::FinishStream, Action::FlushDone(Ok(()))]),
        "{a:?}"
    );
    assert_eq!(e.offsets(), Some((50, 50)));
    // The next write opens an overwrite stream again.
    let a = write(&mut e, 10, 5);
    assert!(
        a.iter().any(|a| matches!(
            a,
            Action::OpenStream {
                overwrite: true,
                ..
            }
        )),
        "{a:?}"
    );
}

#[test]
fn a_shrink_waits_for_every_packet_in_flight() {
    let mut e = open_overwriter();
    write(&mut e, 0, 10);
    step(&mut e, Event::Sent(Ok(())));
    let mut a = step(&mut e, Event::Cut { offset: 20 });
    a.extend(step(&mut e, Event::Flushed(Ok(()))));
    assert!(
        !a.iter().any(|a| matches!(a, Action::CutLastChunk(_))),
        "{a:?}"
    );
    let a = step(&mut e, Event::Ack(ack(1, &[1, 2, 3])));
    assert!(
        a.iter().any(|a| matches!(a, Action::CutLastChunk(_))),
        "{a:?}"
    );
}

#[test]
fn a_shrink_a_member_misses_excludes_it_at_the_new_length() {
    let mut e = open_overwriter();
    step(&mut e, Event::Cut { offset: 50 });
    step(&mut e, Event::ChunkCut(Ok(())));
    let failed = WriteSetupReply {
        accepted: ids(&[1, 2]),
        failed: vec![(
            ChunkserverId(3),
            RemoteError::Io {
                reason: "EIO".into(),
            },
        )],
    };
    let a = step(&mut e, Event::SetupReplied(Ok(failed)));
    let u = updates(&a);
    assert_eq!(
        (u[0].survivors.clone(), u[0].acked_length),
        (ids(&[1, 2]), 50)
    );
    let a = step(&mut e, Event::Granted(Ok(grant(5, &[1, 2], 100))));
    assert!(
        matches!(
            &a[..],
            [Action::OpenStream {
                start: 50,
                overwrite: false,
                ..
            }]
        ),
        "{a:?}"
    );
}

#[test]
fn a_shrink_past_the_end_is_refused_and_the_writer_goes_on() {
    let mut g = grant(4, &[1], 100);
    g.chunk_index = 1;
    g.file_offset = 1000;
    let mut e = Engine::new("/f".into(), ClientId(5), WINDOW, Some(g), true);
    let a = step(&mut e, Event::Cut { offset: 1101 });
    assert!(
        matches!(&a[..], [Action::FlushDone(Err(Error::NotSupported { .. }))]),
        "{a:?}"
    );
    assert!(e.failure().is_none());
    // To the end: nothing to do.
    let a = step(&mut e, Event::Cut { offset: 1100 });
    assert!(matches!(&a[..], [Action::FlushDone(Ok(()))]), "{a:?}");
    // An appender never cuts.
    let mut e = appender();
    let a = step(&mut e, Event::Cut { offset: 50 });
    assert!(
        matches!(&a[..], [Action::FlushDone(Err(Error::NotSupported { .. }))]),
        "{a:?}"
    );
}

#[test]
fn a_shrink_the_master_refuses_as_expired_fences_the_writer() {
    let mut e = open_overwriter();
    step(&mut e, Event::Cut { offset: 50 });
    let a = step(
        &mut e,
        Event::ChunkCut(Err(Error::Remote(RemoteError::LeaseExpired {
            path: "/f".into(),
        }))),
    );
    assert!(
        matches!(
            &a[..],
            [
                Action::Fail(_),
                Action::FlushDone(Err(Error::Fenced { .. }))
            ]
        ),
        "{a:?}"
    );
    assert!(e.failure().is_some_and(Error::is_fenced));
}

#[test]
fn a_shrink_from_an_earlier_chunk_moves_to_the_last_chunk_first() {
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(0, 4, 1000)),
        true,
    )
    .with_file(1500, 1000);
    let a = step(&mut e, Event::Cut { offset: 1200 });
    let req = open_chunk(&a).unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!(req.index, 1);
    let a = step(&mut e, Event::Granted(Ok(grant_of(1, 5, 500))));
    let [Action::CutLastChunk(cut)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(cut.length, 200, "a chunk offset");
    let a = step(&mut e, Event::ChunkCut(Ok(())));
    assert!(
        a.iter().any(|a| matches!(
            a,
            Action::OpenStream {
                start: 200,
                overwrite: false,
                ..
            }
        )),
        "{a:?}"
    );
}

#[test]
fn a_shrink_below_the_last_chunk_drops_chunks_then_cuts_the_new_last() {
    let drop_of = |a: &[Action]| {
        a.iter().find_map(|a| match a {
            Action::DropChunks(r) => Some((r.keep, r.previous.map(|c| c.length))),
            _ => None,
        })
    };
    // Writing chunk 0 of a file of 1500 bytes; cut to 999: chunk 1 goes, chunk 0 is cut.
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(0, 4, 1000)),
        true,
    )
    .with_file(1500, 1000);
    let a = step(&mut e, Event::Cut { offset: 999 });
    assert_eq!(drop_of(&a), Some((1, Some(1000))), "{a:?}");
    let a = step(&mut e, Event::ChunksDropped(Ok(())));
    let req = open_chunk(&a).unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!((req.index, req.previous), (0, None));
    let a = step(&mut e, Event::Granted(Ok(grant_of(0, 5, 1000))));
    let [Action::CutLastChunk(cut)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(cut.length, 999);
    // To a chunk boundary: the drop is all.
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(1, 4, 500)),
        true,
    )
    .with_file(1500, 1000);
    let a = step(&mut e, Event::Cut { offset: 1000 });
    assert_eq!(drop_of(&a), Some((1, Some(500))), "{a:?}");
    let a = step(&mut e, Event::ChunksDropped(Ok(())));
    assert!(matches!(&a[..], [Action::FlushDone(Ok(()))]), "{a:?}");
    assert_eq!(e.known_end(), 1000);
    // A refused drop leaves the writer going, in the chunk it was writing.
    let mut e = Engine::new(
        "/f".into(),
        ClientId(5),
        WINDOW,
        Some(grant_of(1, 4, 500)),
        true,
    )
    .with_file(1500, 1000);
    step(&mut e, Event::Cut { offset: 0 });
    let refused = Err(Error::Remote(stampfs_proto::RemoteError::BadRequest {
        reason: "no".into(),
    }));
    let a = step(&mut e, Event::ChunksDropped(refused));
    assert!(matches!(&a[..], [Action::FlushDone(Err(_))]), "{a:?}");
    assert!(e.failure().is_none());
    assert_eq!(e.known_end(), 1500);
}
