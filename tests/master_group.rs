//! A master group of three `stampfs master` processes on loopback (`--peers`): SIGKILL
//! the leader in the middle of a stream of mkdirs; another member takes over with
//! every acknowledged one, and the killed member, restarted, rejoins as a follower. A
//! leader SIGSTOPped past an election commits nothing when it resumes; a leader
//! without a quorum acknowledges nothing; chunkservers and clients follow the leader;
//! the whole group SIGKILLed at once restarts with everything acknowledged.

mod common;

use common::group::{
    get, leader, put, quick, spawn_chunkservers, spawn_group, wait_live, ELECTION,
};
use stampfs_client::{ClientConfig, Error as ClientError};
use stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE;
use stampfs_proto::RemoteError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_sigkilled_mid_stream_is_replaced_with_every_acknowledged_mkdir() {
    let (_tmp, addrs, mut members) = spawn_group();
    // Each member's DIR/addr: its own address, then the other members'.
    for (i, m) in members.iter().enumerate() {
        let listed: Vec<&str> = m.addr.split(',').collect();
        assert_eq!(listed[0], addrs[i], "{}", m.addr);
        let mut all: Vec<&str> = listed.clone();
        all.sort();
        let mut want: Vec<&str> = addrs.iter().map(String::as_str).collect();
        want.sort();
        assert_eq!(all, want, "{}", m.addr);
    }
    let first = leader(&addrs, &[0, 1, 2]).await;
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let writer = {
        let (addr, acked) = (addrs[first].clone(), acked.clone());
        tokio::spawn(async move {
            let Ok(c) = common::connect_with(&addr, quick()).await else {
                return;
            };
            for i in 0.. {
                let d = format!("/s/d{i}");
                if c.mkdir(&d, true).await.is_err() {
                    return;
                }
                acked.lock().expect("lock").push(d);
            }
        })
    };
    while acked.lock().expect("lock").len() < 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    members[first].kill();
    let killed = Instant::now();
    let _ = writer.await;
    let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    let second = leader(&addrs, &others).await;
    eprintln!(
        "failover: SIGKILL of member {} to the first mkdir served by member {}: {:?}",
        first + 1,
        second + 1,
        killed.elapsed()
    );

    let c = common::connect_with(&addrs[second], quick())
        .await
        .expect("connect to the new leader");
    let listed: std::collections::BTreeSet<String> = c
        .list("/s")
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.path)
        .collect();
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() >= 50);
    for d in &acked {
        assert!(
            listed.contains(d),
            "{d} was acknowledged and is gone after the failover"
        );
    }

    // The killed member comes back as a follower: it sends clients to the leader.
    members[first].restart();
    let started = Instant::now();
    loop {
        let back = common::connect_with(&addrs[first], quick()).await;
        if let Ok(b) = back {
            match b.mkdir("/after", true).await {
                Err(ClientError::Remote(RemoteError::NotLeader { leader: Some(at) })) => {
                    assert_eq!(at, addrs[second]);
                    break;
                }
                Ok(_) => panic!("the restarted member deposed a healthy leader and serves"),
                Err(_) => {}
            }
        }
        assert!(
            started.elapsed() < ELECTION,
            "the restarted member never named the leader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for m in members.iter_mut() {
        m.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_sigstopped_past_an_election_commits_nothing_when_it_resumes() {
    let (_tmp, addrs, mut members) = spawn_group();
    let first = leader(&addrs, &[0, 1, 2]).await;
    let patient = ClientConfig {
        request_timeout: Duration::from_secs(120),
        ..quick()
    };
    let old = common::connect_with(&addrs[first], patient)
        .await
        .expect("connect to the leader");
    members[first].stop();
    // Sent while the leader is frozen: it reads the request only when it resumes.
    let late = tokio::spawn(async move { old.mkdir("/late", true).await });
    let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    let second = leader(&addrs, &others).await;
    members[first].cont();
    let refused = tokio::time::timeout(Duration::from_secs(60), late)
        .await
        .expect("the resumed master answers")
        .expect("task");
    eprintln!("the resumed leader's mkdir: {refused:?}");
    match refused {
        Err(ClientError::Remote(RemoteError::NotLeader { .. }))
        | Err(ClientError::Remote(RemoteError::Unavailable { .. })) => {}
        other => panic!("the deposed leader's mkdir must fail, got {other:?}"),
    }
    let c = common::connect_with(&addrs[second], quick())
        .await
        .expect("connect to the new leader");
    let names: Vec<String> = c
        .list("/")
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert!(
        !names.contains(&"/late".to_string()),
        "a record the deposed leader never committed exists: {names:?}"
    );
    // The resumed member follows: it names the leader.
    let back = common::connect_with(&addrs[first], quick())
        .await
        .expect("connect to the resumed member");
    match back.mkdir("/again", true).await {
        Err(ClientError::Remote(RemoteError::NotLeader { leader: Some(at) })) => {
            assert_eq!(at, addrs[second])
        }
        other => panic!(
            "expected NotLeader naming member {}, got {other:?}",
            second + 1
        ),
    }
    for m in members.iter_mut() {
        m.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_quorum_acknowledges_no_write() {
    let (_tmp, addrs, mut members) = spawn_group();
    let first = leader(&addrs, &[0, 1, 2]).await;
    let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    for &i in &others {
        members[i].stop();
    }
    let c = common::connect_with(
        &addrs[first],
        ClientConfig {
            request_timeout: Duration::from_secs(5),
            ..quick()
        },
    )
    .await
    .expect("connect");
    let r = c.mkdir("/alone", true).await;
    assert!(r.is_err(), "a write acknowledged without a quorum: {r:?}");
    let read = c.list("/").await;
    assert!(read.is_err(), "a read served without a quorum: {read:?}");
    for &i in &others {
        members[i].cont();
    }
    // With its followers back, the group serves again (whoever leads).
    leader(&addrs, &[0, 1, 2]).await;
    for m in members.iter_mut() {
        m.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_and_chunkservers_given_every_member_follow_the_leader_through_a_failover() {
    let (tmp, addrs, mut members) = spawn_group();
    let all = addrs.join(",");
    let mut chunkservers = spawn_chunkservers(tmp.path(), &all);
    let first = leader(&addrs, &[0, 1, 2]).await;
    // The client is given every member, in an order that does not start at the leader.
    let mut order: Vec<String> = addrs.clone();
    order.rotate_left((first + 1) % 3);
    let client = common::connect_with(&order.join(","), ClientConfig::default())
        .await
        .expect("connect to the group");
    wait_live(&client, 3).await;
    let before = common::pattern(3 << 20, 7);
    put(&client, "/before", &before).await;
    assert_eq!(get(&client, "/before").await, before);

    members[first].kill();
    let killed = Instant::now();
    // The same client, after the failover: it finds the new leader, which the
    // chunkservers registered with (and reported their replicas to).
    wait_live(&client, 3).await;
    eprintln!(
        "SIGKILL of the leader to every chunkserver live on the new one: {:?}",
        killed.elapsed()
    );
    assert_eq!(
        get(&client, "/before").await,
        before,
        "read after the failover"
    );
    let after = common::pattern(2 << 20, 8);
    put(&client, "/after", &after).await;
    assert_eq!(get(&client, "/after").await, after);
    // The new leader's commands (the version bumps of the new file) raised every
    // chunkserver's epoch fence to its own epoch: the old leader's are refused now.
    let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    let second = leader(&addrs, &others).await;
    for i in 0..3 {
        let text = std::fs::read_to_string(tmp.path().join(format!("cs{i}/master-epoch")))
            .unwrap_or_else(|e| panic!("cs{i} has no master-epoch: {e}"));
        let words: Vec<u64> = text
            .split_whitespace()
            .map(|w| w.parse().expect("a number"))
            .collect();
        assert_eq!(words.len(), 2, "{text}");
        assert_eq!(
            words[1],
            second as u64 + 1,
            "cs{i}'s epoch names the new leader: {text}"
        );
        assert!(words[0] >= 2, "an elected term: {text}");
    }
    // The operator's view, given every member: the group as the new leader sees it.
    let out = std::process::Command::new(common::BIN)
        .args(["admin", "report", "--master", &all, "--credentials"])
        .arg(tmp.path().join("m1").join(ADMIN_CREDENTIALS_FILE))
        .output()
        .expect("run admin report");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("leader {}", second + 1)) && text.contains("master group: term"),
        "{text}"
    );
    // The killed member is still a member; the leader knows nothing of its log.
    let killed_line = text
        .lines()
        .find(|l| l.starts_with(&format!("{} ", first + 1)) && l.contains(&addrs[first]))
        .unwrap_or_else(|| panic!("no line for the killed member: {text}"));
    assert!(
        killed_line.contains("follower") && killed_line.split_whitespace().nth(3) == Some("-"),
        "{killed_line}"
    );
    for p in chunkservers.iter_mut().chain(members.iter_mut()) {
        p.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_group_sigkilled_at_once_restarts_with_everything_acknowledged() {
    let (tmp, addrs, mut members) = spawn_group();
    let all = addrs.join(",");
    let mut chunkservers = spawn_chunkservers(tmp.path(), &all);
    leader(&addrs, &[0, 1, 2]).await;
    let client = common::connect_with(&all, ClientConfig::default())
        .await
        .expect("connect to the group");
    wait_live(&client, 3).await;
    let data = common::pattern(1 << 20, 11);
    put(&client, "/kept", &data).await;
    for i in 0..50 {
        client
            .mkdir(&format!("/d/{i}"), true)
            .await
            .expect("mkdir acknowledged");
    }
    let before = client.locations("/kept").await.expect("locations");
    let last_version = before.chunks.last().expect("a chunk").version;

    // Every member at once: nothing survives but what each made durable.
    for m in members.iter_mut() {
        m.kill();
    }
    for m in members.iter_mut() {
        m.restart();
    }
    let restarted = Instant::now();
    let now = leader(&addrs, &[0, 1, 2]).await;
    eprintln!(
        "the whole group restarted: member {} leads {:?} after the restart",
        now + 1,
        restarted.elapsed()
    );
    wait_live(&client, 3).await;
    assert_eq!(
        get(&client, "/kept").await,
        data,
        "the file after the restart"
    );
    let listed = client.list("/d").await.expect("list");
    assert_eq!(listed.len(), 50, "every acknowledged mkdir is there");
    // The next lease on the file mints a version above every one minted before.
    let mut w = client.append("/kept").await.expect("append");
    tokio::io::AsyncWriteExt::write_all(&mut w, b"more")
        .await
        .expect("write");
    w.close().await.expect("close");
    let after = client.locations("/kept").await.expect("locations");
    let last = after.chunks.last().expect("a chunk");
    assert!(
        last.version > last_version,
        "{} after the restart, {last_version} before",
        last.version
    );
    for p in chunkservers.iter_mut().chain(members.iter_mut()) {
        p.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_changes_stream_through_a_leader_sigkill_without_an_error() {
    let (tmp, addrs, mut members) = spawn_group();
    let first = leader(&addrs, &[0, 1, 2]).await;
    let all = addrs.join(",");
    let client = common::connect_with(&all, quick())
        .await
        .expect("connect to the group");
    client.mkdir("/n", false).await.expect("mkdir /n");
    // mkdir, an empty file in it, a rename of the file, a delete of the directory's
    // previous file: changes that fail if made twice. None may fail.
    let writer = {
        let c = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut i = 0u64;
            while started.elapsed() < Duration::from_secs(6) {
                let d = format!("/n/d{i}");
                c.mkdir(&d, false)
                    .await
                    .unwrap_or_else(|e| panic!("mkdir {d}: {e}"));
                c.make_file(&format!("{d}/f"), stampfs_client::CreateOptions::default())
                    .await
                    .unwrap_or_else(|e| panic!("make_file in {d}: {e}"));
                c.rename(&format!("{d}/f"), &format!("{d}/g"))
                    .await
                    .unwrap_or_else(|e| panic!("rename in {d}: {e}"));
                if i > 0 {
                    let p = format!("/n/d{}/g", i - 1);
                    c.delete(&p, false)
                        .await
                        .unwrap_or_else(|e| panic!("delete {p}: {e}"));
                }
                i += 1;
            }
            i
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    members[first].kill();
    let n = writer
        .await
        .expect("every change acknowledged, none failed");
    assert!(n > 10, "{n} rounds");
    // Each round's directory holds nothing but the last round's renamed file.
    let listed = client.list("/n").await.expect("list");
    assert_eq!(listed.len() as u64, n, "one directory per round");
    for i in 0..n {
        let inside = client.list(&format!("/n/d{i}")).await.expect("list");
        let names: Vec<&str> = inside.iter().map(|s| s.path.as_str()).collect();
        if i + 1 == n {
            assert_eq!(names, [format!("/n/d{i}/g")], "round {i}");
        } else {
            assert!(names.is_empty(), "round {i}: {names:?}");
        }
    }
    let answered_again: usize = (1..=3)
        .map(|i| {
            std::fs::read_to_string(tmp.path().join(format!("logs/master{i}.log")))
                .map(|t| t.matches("a call asked again").count())
                .unwrap_or(0)
        })
        .sum();
    eprintln!(
        "{n} rounds of namespace changes through the SIGKILL of the leader; \
         {answered_again} answered from the kept answers"
    );
    for m in members.iter_mut() {
        m.kill();
    }
}
