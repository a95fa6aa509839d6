//! Contract 6 (fencing), pipeline recovery and idle streams.

use super::*;

// ------------------------------------------------------------------ contract 6

#[test]
fn stale_token_in_a_set_up_reply_fences_the_writer_and_nothing_follows() {
    let mut e = appender();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    for l in [100, 100] {
        step(&mut e, Event::ReplicaLength(Ok(l)));
    }
    step(&mut e, Event::ReplicaLength(Ok(100)));
    let reply = WriteSetupReply {
        accepted: ids(&[1, 2]),
        failed: vec![(ChunkserverId(3), stale())],
    };
    let a = step(&mut e, Event::SetupReplied(Ok(reply)));
    assert!(
        matches!(&a[..], [Action::DropStream, Action::Fail(f)] if is_fenced(f)),
        "{a:?}"
    );
    // Every later call fails the same way and asks nothing of anyone.
    let a = step(
        &mut e,
        Event::Flush {
            offset: END,
            sync: true,
            data: bytes(3),
        },
    );
    assert!(matches!(&a[..], [Action::FlushDone(Err(f))] if is_fenced(f)));
    assert!(step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(3)
        }
    )
    .is_empty());
    let a = step(&mut e, Event::Close { keep_mtime: false });
    assert!(matches!(&a[..], [Action::CloseDone(Err(f))] if is_fenced(f)));
    assert!(e.is_finished());
}

#[test]
fn stale_token_refusing_the_set_up_fences_the_writer() {
    let mut e = appender();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    answer_lengths(&mut e, &[100, 100, 100]);
    let a = step(
        &mut e,
        Event::SetupReplied(Err(SetupError::Rejected(stale()))),
    );
    assert!(matches!(&a[..], [Action::Fail(f)] if is_fenced(f)), "{a:?}");
}

fn answer_lengths(e: &mut Engine, lengths: &[u64]) {
    for &l in lengths {
        step(e, Event::ReplicaLength(Ok(l)));
    }
}

#[test]
fn stale_token_in_an_ack_fences_the_writer() {
    let mut e = one_in_flight();
    let mut a0 = ack(0, &[1, 2, 3]);
    a0.replicas[1].result = Err(stale());
    let a = step(&mut e, Event::Ack(a0));
    assert!(matches!(&a[..], [Action::Fail(f)] if is_fenced(f)), "{a:?}");
    assert!(!asks_anything(&a));
    assert_eq!(
        e.wait().stream,
        None,
        "a fenced writer stops watching its stream"
    );
}

#[test]
fn stale_token_in_replica_info_fences_the_writer() {
    let mut e = appender();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    let a = step(&mut e, Event::ReplicaLength(Err(Error::Remote(stale()))));
    assert!(matches!(&a[..], [Action::Fail(f)] if is_fenced(f)), "{a:?}");
}

#[test]
fn a_lost_lease_at_the_master_fences_the_writer() {
    let mut e = Engine::new("/f".into(), ClientId(5), WINDOW, None, false);
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    let lost = Error::Remote(RemoteError::LeaseExpired { path: "/f".into() });
    let a = step(&mut e, Event::Granted(Err(lost)));
    assert!(
        matches!(&a[..], [Action::Fail(Error::Fenced { current: None, .. })]),
        "{a:?}"
    );
    // A pipeline update the master refuses with a newer version fences it too.
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    let a = step(&mut e, Event::Granted(Err(Error::Remote(stale()))));
    assert!(matches!(&a[..], [Action::Fail(f)] if is_fenced(f)), "{a:?}");
}

// ------------------------------------------------------------------ recovery

#[test]
fn a_broken_stream_with_packets_in_flight_excludes_the_head_at_the_acknowledged_length() {
    let mut e = one_in_flight();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    step(&mut e, Event::Sent(Ok(())));
    step(&mut e, Event::Ack(ack(0, &[1, 2, 3])));
    let a = step(&mut e, Event::StreamEnded(broken()));
    assert!(matches!(a[0], Action::DropStream));
    let u = updates(&a);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].survivors, ids(&[2, 3]));
    assert_eq!(u[0].acked_length, 110);
    assert_eq!(u[0].handle, HANDLE);
}

#[test]
fn after_a_recovery_grant_every_member_is_asked_and_the_stream_starts_at_the_resume_offset() {
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    let a = step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
    assert!(
        matches!(&a[..], [Action::AskReplicaLength { member, token }]
        if member.id == ChunkserverId(2) && token.version == ChunkVersion(5))
    );
    let a = step(&mut e, Event::ReplicaLength(Ok(108)));
    assert!(
        matches!(&a[..], [Action::AskReplicaLength { member, .. }] if member.id == ChunkserverId(3))
    );
    let a = step(&mut e, Event::ReplicaLength(Ok(110)));
    // Both hold 108 of the 110 bytes sent; 100 were acknowledged.
    let [Action::OpenStream { grant, start, .. }] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!((*start, grant.token.version), (108, ChunkVersion(5)));
    let a = step(&mut e, Event::SetupReplied(Ok(accepted(&[2, 3]))));
    // The crash point `writer-reopen-before-resend` fires only in a recovery.
    assert!(
        matches!(&a[..], [Action::Resend { packets, recovery: true, token }]
        if packets.len() == 1 && token.version == ChunkVersion(5))
    );
    assert!(step(&mut e, Event::Resent(Ok(()))).is_empty());
    assert!(!e.quiet_burst());
    // The resent packet's ack from the new pipeline counts.
    let a = step(&mut e, Event::Ack(ack(0, &[2, 3])));
    assert!(matches!(&a[..], [Action::Acked(_)]));
}

#[test]
fn a_member_that_does_not_answer_replica_info_is_excluded_not_opened_at_the_acknowledged_offset() {
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
    step(&mut e, Event::ReplicaLength(Ok(110)));
    let unreachable = Error::Remote(RemoteError::Unavailable {
        reason: "timed out".into(),
    });
    let a = step(&mut e, Event::ReplicaLength(Err(unreachable)));
    assert!(!a.iter().any(|a| matches!(a, Action::OpenStream { .. })));
    let u = updates(&a);
    assert_eq!(
        (u[0].survivors.clone(), u[0].acked_length),
        (ids(&[2]), 100)
    );
}

#[test]
fn an_unreachable_head_at_set_up_is_excluded() {
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
    answer_lengths(&mut e, &[100, 100]);
    let down = Error::Io(std::io::ErrorKind::ConnectionRefused.into());
    let a = step(
        &mut e,
        Event::SetupReplied(Err(SetupError::Head(ChunkserverId(2), down))),
    );
    assert_eq!(updates(&a)[0].survivors, ids(&[3]));
}

#[test]
fn members_the_set_up_reply_names_failed_are_excluded_after_a_clean_finish() {
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
    answer_lengths(&mut e, &[100, 100]);
    let reply = WriteSetupReply {
        accepted: ids(&[2]),
        failed: vec![(
            ChunkserverId(3),
            RemoteError::Unavailable {
                reason: "down".into(),
            },
        )],
    };
    let a = step(&mut e, Event::SetupReplied(Ok(reply)));
    assert!(matches!(a[0], Action::FinishStream));
    assert_eq!(updates(&a)[0].survivors, ids(&[2]));
}

#[test]
fn a_head_refusing_its_own_replica_is_excluded_but_a_refused_token_or_request_is_fatal() {
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
    answer_lengths(&mut e, &[100, 100]);
    let short = RemoteError::ReplicaShort {
        handle: HANDLE,
        offset: 100,
        length: 40,
    };
    let a = step(
        &mut e,
        Event::SetupReplied(Err(SetupError::Rejected(short))),
    );
    assert_eq!(updates(&a)[0].survivors, ids(&[3]));

    // A refused token, or a malformed request: every chunkserver would say the same.
    for refused in [
        RemoteError::BadToken { handle: HANDLE },
        RemoteError::BadRequest {
            reason: "malformed".into(),
        },
    ] {
        let mut e = one_in_flight();
        step(&mut e, Event::StreamEnded(broken()));
        step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
        answer_lengths(&mut e, &[100, 100]);
        let a = step(
            &mut e,
            Event::SetupReplied(Err(SetupError::Rejected(refused))),
        );
        assert!(
            matches!(&a[..], [Action::Fail(Error::Pipeline { .. })]),
            "{a:?}"
        );
    }
}

#[test]
fn a_failed_resend_excludes_the_new_head() {
    let mut e = one_in_flight();
    step(&mut e, Event::StreamEnded(broken()));
    step(&mut e, Event::Granted(Ok(grant(5, &[2, 3], 100))));
    answer_lengths(&mut e, &[100, 100]);
    step(&mut e, Event::SetupReplied(Ok(accepted(&[2, 3]))));
    let a = step(&mut e, Event::Resent(Err(broken())));
    assert!(matches!(a[0], Action::DropStream));
    assert_eq!(updates(&a)[0].survivors, ids(&[3]));
}

#[test]
fn the_writer_gives_up_after_max_recoveries() {
    let mut e = one_in_flight();
    let mut a = step(&mut e, Event::StreamEnded(broken()));
    let mut attempts = 0;
    while let Some(u) = updates(&a).first() {
        attempts += 1;
        let members: Vec<u64> = [2, 3, 4, 5, 6, 7, 8].to_vec();
        let _ = u;
        step(
            &mut e,
            Event::Granted(Ok(grant(5 + attempts, &members, 100))),
        );
        answer_lengths(&mut e, &[100; 7]);
        let down = Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        a = step(
            &mut e,
            Event::SetupReplied(Err(SetupError::Head(ChunkserverId(2), down))),
        );
        assert!(attempts <= MAX_RECOVERIES as u64, "{a:?}");
    }
    assert_eq!(attempts, MAX_RECOVERIES as u64);
    assert!(
        matches!(&a[..], [Action::Fail(Error::Pipeline { reason, .. })]
        if reason.contains("gave up")),
        "{a:?}"
    );
}

// ------------------------------------------------------------------ idle streams

#[test]
fn an_idle_close_reopens_with_the_same_token_at_the_acknowledged_offset_without_the_master() {
    let mut e = at_rest();
    let a = step(&mut e, Event::IdleTimeout);
    assert!(matches!(&a[..], [Action::FinishStream]));
    assert_eq!(
        e.wait(),
        Wait {
            commands: true,
            stream: None
        }
    );
    let a = step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    assert!(matches!(
        &a[..],
        [Action::Queued { seq: 1 }, Action::AskReplicaLength { .. }]
    ));
    let a = answer_open(&mut e, &[110, 110, 110]);
    assert!(updates(&a).is_empty(), "no version bump for an idle close");
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::OpenStream { grant, start: 110, .. }
        if grant.token.version == ChunkVersion(4))));
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Resend {
            recovery: false,
            ..
        }
    )));
}

#[test]
fn the_idle_timer_leaves_a_stream_with_packets_in_flight_alone() {
    let mut e = one_in_flight();
    assert!(step(&mut e, Event::IdleTimeout).is_empty());
}

#[test]
fn a_stream_the_head_closed_at_rest_is_replaced_not_blamed() {
    let mut e = at_rest();
    let a = step(&mut e, Event::StreamEnded(closed()));
    assert!(matches!(&a[..], [Action::DropStream]), "{a:?}");
    // Found only when the next packet is about to go out: the same.
    let mut e = at_rest();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    let a = step(&mut e, Event::EndChecked(Some(closed())));
    assert!(
        matches!(
            &a[..],
            [Action::DropStream, Action::AskReplicaLength { .. }]
        ),
        "{a:?}"
    );
    let a = answer_open(&mut e, &[110, 110, 110]);
    assert!(updates(&a).is_empty());
}

#[test]
fn garbage_from_a_head_at_rest_excludes_it() {
    let mut e = at_rest();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    let a = step(&mut e, Event::EndChecked(Some(broken())));
    assert_eq!(updates(&a)[0].survivors, ids(&[2, 3]));
}

#[test]
fn a_close_seen_after_a_quiet_burst_reopens_with_the_same_token() {
    let mut e = at_rest();
    step(
        &mut e,
        Event::Write {
            offset: END,
            data: bytes(10),
        },
    );
    step(&mut e, Event::EndChecked(None));
    // The head's close came before the packet left: the send fails on a closed socket.
    let a = step(&mut e, Event::Sent(Err(closed())));
    assert!(
        matches!(
            &a[..],
            [Action::DropStream, Action::AskReplicaLength { .. }]
        ),
        "{a:?}"
    );
}

#[test]
fn a_close_while_the_head_was_acking_excludes_it() {
    let mut e = one_in_flight();
    let a = step(&mut e, Event::StreamEnded(closed()));
    assert_eq!(updates(&a)[0].survivors, ids(&[2, 3]));
}

#[test]
fn a_flush_that_fails_at_rest_drops_the_stream_for_the_next_packet_to_replace() {
    let mut e = at_rest();
    step(&mut e, Event::Poll { backlog: false });
    let a = step(&mut e, Event::Flushed(Err(closed())));
    assert!(matches!(&a[..], [Action::DropStream]), "{a:?}");
}
