//! A master group of three members in one process, talking over loopback TCP
//! (`--peers`): one of them leads and serves; the others replicate its records, refuse
//! clients with `NotLeader` naming the leader, and take over when it is gone with
//! everything it acknowledged; a member started again catches up.

mod admin;

use stampfs_master::{start, MasterConfig, MasterHandle};
use stampfs_proto::credentials::{Credentials, ADMIN_CREDENTIALS_FILE, ADMIN_USER};
use stampfs_proto::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a group may take to elect a leader in a test (its election timeout is
/// 600-900 ms; a loaded CI machine is slower).
const ELECTION: Duration = Duration::from_secs(20);

/// Three free loopback addresses.
fn free_addrs(n: usize) -> Vec<String> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect()
}

struct Cluster {
    _tmp: tempfile::TempDir,
    dirs: Vec<PathBuf>,
    addrs: Vec<String>,
    key: PathBuf,
    members: Vec<Option<MasterHandle>>,
    tweak: fn(&mut MasterConfig),
}

fn config(dir: &Path, id: u64, addrs: &[String], key: &Path) -> MasterConfig {
    let mut c = MasterConfig::new(dir.to_path_buf());
    c.id = id;
    c.listen = addrs[id as usize - 1].clone();
    c.cluster_key_file = Some(key.to_path_buf());
    c.peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| stampfs_master::config::PeerArg {
            id: i as u64 + 1,
            addr: a.clone(),
        })
        .collect();
    c
}

impl Cluster {
    async fn start() -> Cluster {
        Self::start_with(|_| {}).await
    }

    async fn start_with(tweak: fn(&mut MasterConfig)) -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let addrs = free_addrs(3);
        let key = tmp.path().join("cluster.key");
        ClusterKey::load_or_create(&key).expect("cluster key");
        // One superuser for the group: whichever member leads first creates it with
        // the credentials every member's directory holds.
        let creds = Credentials::generate(ADMIN_USER).expect("credentials");
        let mut dirs = Vec::new();
        for i in 1..=3 {
            let d = tmp.path().join(format!("m{i}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            creds
                .write(&d.join(ADMIN_CREDENTIALS_FILE), true)
                .expect("write credentials");
            dirs.push(d);
        }
        let mut c = Cluster {
            _tmp: tmp,
            dirs,
            addrs,
            key,
            members: vec![None, None, None],
            tweak,
        };
        for id in 1..=3 {
            c.start_member(id).await;
        }
        c
    }

    async fn start_member(&mut self, id: u64) {
        let i = id as usize - 1;
        let mut cfg = config(&self.dirs[i], id, &self.addrs, &self.key);
        (self.tweak)(&mut cfg);
        let m = start(cfg)
            .await
            .unwrap_or_else(|e| panic!("start member {id}: {e}"));
        self.members[i] = Some(m);
    }

    /// The member that serves, once one does (and only one does).
    async fn leader(&self) -> usize {
        let started = Instant::now();
        loop {
            let serving: Vec<usize> = self
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.as_ref().is_some_and(|m| m.core().log.serving().is_ok()))
                .map(|(i, _)| i)
                .collect();
            if let [only] = serving[..] {
                // Serving, and its superuser created (the first leader does that).
                let m = self.members[only].as_ref().expect("running");
                if !m.core().state().user_list().is_empty() {
                    return only;
                }
            }
            assert!(
                started.elapsed() < ELECTION,
                "no single leader after {ELECTION:?}: {serving:?} serve"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn client(&self, i: usize) -> RpcClient {
        admin::connect(&self.addrs[i], &self.dirs[i]).await
    }
}

async fn mkdir(c: &mut RpcClient, path: &str) -> Result<FileStatus, Error> {
    c.call(Mkdir {
        path: path.into(),
        parents: false,
        attr: None,
        caller: None,
    })
    .await
}

async fn names(c: &mut RpcClient) -> Vec<String> {
    let mut v: Vec<String> = c
        .call(List {
            path: "/".into(),
            caller: None,
        })
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.path)
        .filter(|p| p != "/.trash")
        .collect();
    v.sort();
    v
}

/// Waits until member `i`'s state holds `path` (a follower applies what commits).
async fn replicated(c: &Cluster, i: usize, path: &str) {
    let started = Instant::now();
    let m = c.members[i].as_ref().expect("running");
    while m.core().state().stat(path).is_err() {
        assert!(
            started.elapsed() < ELECTION,
            "member {} never applied {path}",
            i + 1
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_masters_elect_one_leader_that_replicates_and_survives_its_loss() {
    let mut c = Cluster::start().await;
    let first = c.leader().await;
    let mut leader = c.client(first).await;
    for d in ["/a", "/b", "/c"] {
        mkdir(&mut leader, d).await.expect("mkdir on the leader");
    }

    // The followers hold what the leader acknowledged, and send clients to it.
    for i in (0..3).filter(|&i| i != first) {
        replicated(&c, i, "/c").await;
        let mut f = c.client(i).await;
        let refused = mkdir(&mut f, "/nope")
            .await
            .expect_err("a follower serves no write");
        match refused {
            Error::Remote(RemoteError::NotLeader { leader: Some(at) }) => {
                assert_eq!(at, c.addrs[first], "the follower names the leader")
            }
            e => panic!("expected NotLeader naming the leader, got {e}"),
        }
        let read = f
            .call(Stat {
                path: "/a".into(),
                caller: None,
            })
            .await
            .expect_err("a follower serves no read either");
        assert!(
            matches!(read, Error::Remote(RemoteError::NotLeader { .. })),
            "{read}"
        );
    }

    // The leader goes (dropped: its log halts where it is, as in a crash).
    drop(leader);
    c.members[first] = None;
    let second = c.leader().await;
    assert_ne!(second, first);
    let mut leader = c.client(second).await;
    assert_eq!(names(&mut leader).await, ["/a", "/b", "/c"]);
    mkdir(&mut leader, "/d")
        .await
        .expect("mkdir on the new leader");

    // The old leader comes back as a follower and catches up.
    c.start_member(first as u64 + 1).await;
    replicated(&c, first, "/d").await;
    assert_eq!(
        c.leader().await,
        second,
        "the returning member does not depose the leader"
    );
    let mut back = c.client(first).await;
    assert!(matches!(
        mkdir(&mut back, "/e").await,
        Err(Error::Remote(RemoteError::NotLeader { .. }))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_restarted_whole_keeps_its_state_and_leads_again() {
    let mut c = Cluster::start().await;
    let first = c.leader().await;
    let mut leader = c.client(first).await;
    for d in ["/x", "/y"] {
        mkdir(&mut leader, d).await.expect("mkdir");
    }
    drop(leader);
    for m in c.members.iter_mut() {
        *m = None;
    }
    for id in 1..=3 {
        c.start_member(id).await;
    }
    let next = c.leader().await;
    let mut leader = c.client(next).await;
    assert_eq!(names(&mut leader).await, ["/x", "/y"]);
    mkdir(&mut leader, "/z")
        .await
        .expect("mkdir after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_across_a_snapshot_catches_up_from_the_leaders_snapshot() {
    let mut c = Cluster::start_with(|cfg| cfg.group_log_keep = 5).await;
    let first = c.leader().await;
    let behind = (first + 1) % 3;
    c.members[behind] = None;
    let mut leader = c.client(first).await;
    mkdir(&mut leader, "/s").await.expect("mkdir");
    for i in 0..100 {
        mkdir(&mut leader, &format!("/s/d{i}"))
            .await
            .expect("mkdir with two members of three");
    }
    // A snapshot on the leader; its log before it is purged but for 5 entries.
    let m = c.members[first].as_ref().expect("running");
    assert!(
        m.checkpoint().await.expect("snapshot"),
        "a snapshot was due"
    );
    c.start_member(behind as u64 + 1).await;
    replicated(&c, behind, "/s/d99").await;
    let got = stampfs_master::raft::snapshot::read(&c.dirs[behind].join("raft"))
        .expect("read the snapshot")
        .expect("a snapshot");
    assert!(
        got.meta.last_log_id > Some(stampfs_master::raft::snapshot::FORMED_AT),
        "the member caught up from the leader's snapshot: {:?}",
        got.meta
    );
    // And it goes on from there.
    mkdir(&mut leader, "/t").await.expect("mkdir");
    replicated(&c, behind, "/t").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_do_not_name_this_master_are_refused_at_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let addrs = free_addrs(3);
    let key = tmp.path().join("cluster.key");
    let mut cfg = config(tmp.path(), 1, &addrs, &key);
    cfg.listen = "127.0.0.1:1".into();
    let e = start(cfg)
        .await
        .expect_err("listen address not among the peers");
    assert!(e.to_string().contains("--listen"), "{e}");
    let mut cfg = config(tmp.path(), 1, &addrs, &key);
    cfg.cluster_key_file = None;
    let e = start(cfg).await.expect_err("a group needs one shared key");
    assert!(e.to_string().contains("cluster-key-file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_the_group_and_another_is_removed() {
    let c = Cluster::start_with(|cfg| cfg.group_log_keep = 5).await;
    let first = c.leader().await;
    let mut leader = c.client(first).await;
    mkdir(&mut leader, "/a").await.expect("mkdir");

    // A fourth master, on a new directory, waits to be added.
    let dir4 = c._tmp.path().join("m4");
    std::fs::create_dir_all(&dir4).expect("mkdir");
    std::fs::copy(
        c.dirs[0].join(ADMIN_CREDENTIALS_FILE),
        dir4.join(ADMIN_CREDENTIALS_FILE),
    )
    .expect("credentials");
    let addr4 = free_addrs(1).remove(0);
    let mut cfg = MasterConfig::new(dir4.clone());
    cfg.id = 4;
    cfg.listen = addr4.clone();
    cfg.cluster_key_file = Some(c.key.clone());
    cfg.join = true;
    let fourth = start(cfg).await.expect("start the joining member");
    assert!(
        fourth.core().log.serving().is_err(),
        "a joining member serves nothing"
    );

    leader
        .call(AddMaster {
            id: 4,
            addr: addr4.clone(),
        })
        .await
        .expect("add member 4");
    let started = Instant::now();
    while fourth.core().state().stat("/a").is_err() {
        assert!(started.elapsed() < ELECTION, "member 4 never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A follower goes.
    let gone = (first + 1) % 3;
    leader
        .call(RemoveMaster {
            id: gone as u64 + 1,
        })
        .await
        .expect("remove a follower");
    let report = leader.call(ClusterReportRequest {}).await.expect("report");
    let group = report.masters.expect("a group's report shows it");
    let mut ids: Vec<u64> = group.members.iter().map(|m| m.id).collect();
    ids.sort();
    let mut want: Vec<u64> = vec![1, 2, 3, 4]
        .into_iter()
        .filter(|&i| i != gone as u64 + 1)
        .collect();
    want.sort();
    assert_eq!(ids, want, "{group:?}");
    assert_eq!(group.leader, Some(first as u64 + 1));
    assert!(group
        .members
        .iter()
        .any(|m| m.id == 4 && m.role == "follower"));

    // The group goes on with its new member.
    mkdir(&mut leader, "/b")
        .await
        .expect("mkdir after the changes");
    let started = Instant::now();
    while fourth.core().state().stat("/b").is_err() {
        assert!(started.elapsed() < ELECTION, "member 4 does not follow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = leader.call(RemoveMaster { id: 9 }).await;
    assert!(again.is_err(), "no member 9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lead_is_handed_to_another_member() {
    let c = Cluster::start().await;
    let first = c.leader().await;
    let mut leader = c.client(first).await;
    mkdir(&mut leader, "/x").await.expect("mkdir");
    let to = (first + 2) % 3;
    leader
        .call(TransferLeader { to: to as u64 + 1 })
        .await
        .expect("transfer the lead");
    assert_eq!(c.leader().await, to, "the target leads");
    let mut new = c.client(to).await;
    assert_eq!(names(&mut new).await, ["/x"]);
    mkdir(&mut new, "/y")
        .await
        .expect("mkdir on the new leader");
    replicated(&c, first, "/y").await;
    let refused = mkdir(&mut leader, "/z")
        .await
        .expect_err("the old leader follows");
    assert!(
        matches!(refused, Error::Remote(RemoteError::NotLeader { .. })),
        "{refused}"
    );
}

/// A mkdir sent as a `Once` call under call id `call` of client `client`.
async fn mkdir_once(
    c: &mut RpcClient,
    client: u64,
    call: u64,
    path: &str,
) -> Result<FileStatus, Error> {
    c.call(stampfs_proto::rpc::Once {
        client: ClientId(client),
        call,
        inner: Mkdir {
            path: path.into(),
            parents: false,
            attr: None,
            caller: None,
        },
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_once_call_asked_again_on_the_next_leader_gets_the_answer_of_the_first() {
    let mut c = Cluster::start().await;
    let first = c.leader().await;
    let mut leader = c.client(first).await;
    let made = mkdir_once(&mut leader, 0xc1, 1, "/once")
        .await
        .expect("made");
    // Asked again on the same leader: the same answer, not AlreadyExists.
    let again = mkdir_once(&mut leader, 0xc1, 1, "/once")
        .await
        .expect("asked again");
    assert_eq!(again, made);
    // A change that changes nothing (mkdir -p of a directory that exists) keeps no
    // answer: asked again, it answers the same anyway.
    let kept = c.members[first]
        .as_ref()
        .expect("running")
        .core()
        .state()
        .retry
        .len();
    leader
        .call(stampfs_proto::rpc::Once {
            client: ClientId(0xc1),
            call: 9,
            inner: Mkdir {
                path: "/once".into(),
                parents: true,
                attr: None,
                caller: None,
            },
        })
        .await
        .expect("mkdir -p of a directory that exists");
    let m = c.members[first].as_ref().expect("running");
    assert_eq!(m.core().state().retry.len(), kept);
    // Another call of the same client is another request: made (and refused) anew.
    let other = mkdir_once(&mut leader, 0xc1, 2, "/once").await;
    assert!(
        matches!(other, Err(Error::Remote(RemoteError::AlreadyExists { .. }))),
        "{other:?}"
    );
    // A call id reused for another kind of request is refused.
    let reused = leader
        .call(stampfs_proto::rpc::Once {
            client: ClientId(0xc1),
            call: 1,
            inner: Delete {
                path: "/once".into(),
                recursive: false,
                caller: None,
            },
        })
        .await;
    assert!(
        matches!(reused, Err(Error::Remote(RemoteError::BadRequest { .. }))),
        "{reused:?}"
    );
    // Only a namespace change made in one step is taken as a call.
    let wrapped_read = leader
        .call(stampfs_proto::rpc::Once {
            client: ClientId(0xc1),
            call: 3,
            inner: Stat {
                path: "/".into(),
                caller: None,
            },
        })
        .await;
    assert!(
        matches!(
            wrapped_read,
            Err(Error::Remote(RemoteError::BadRequest { .. }))
        ),
        "{wrapped_read:?}"
    );

    // The leader goes; the next one (which applied the answer with the change) answers
    // the repeat the same.
    drop(leader);
    c.members[first] = None;
    let second = c.leader().await;
    let mut leader = c.client(second).await;
    let after = mkdir_once(&mut leader, 0xc1, 1, "/once")
        .await
        .expect("asked again on the next leader");
    assert_eq!(after.path, made.path);
    assert_eq!(after.inode, made.inode);
    // Its own calls are kept too, and the restarted member rebuilds them from the log.
    mkdir_once(&mut leader, 0xc2, 7, "/twice")
        .await
        .expect("made");
    c.start_member(first as u64 + 1).await;
    replicated(&c, first, "/twice").await;
    let m = c.members[first].as_ref().expect("running");
    assert!(
        matches!(
            m.core().state().retry.lookup(
                ClientId(0xc2),
                7,
                stampfs_master::retry_cache::CallKind::Mkdir
            ),
            stampfs_master::retry_cache::Lookup::Made(_)
        ),
        "a follower applies the answers with the changes"
    );
}
