//! Shared helpers for the proto integration tests: proptest strategies for every wire
//! type, a per-thread tokio runtime, and a "through the real codec" round trip over a
//! `tokio::io::duplex` stream.
//!
//! Each test binary uses only part of this module.
#![allow(dead_code)]

use bincode::{Decode, Encode};
use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::Config;
use stampfs_proto::codec::encode_value;
use stampfs_proto::*;
use std::fmt::Debug;

// ---------------------------------------------------------------- runtime and wire

thread_local! {
    /// One current-thread runtime per test thread, reused by every proptest case.
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
}

/// Runs a future to completion on this thread's runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    RT.with(|rt| rt.block_on(f))
}

/// The proptest configuration of this suite: few cases, so the suite stays fast.
pub fn cfg() -> Config {
    Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Writes `frames` with a [`FrameWriter`] into a duplex pipe of `pipe` bytes (small
/// pipes force the reader to see every frame in pieces) and reads them back with a
/// [`FrameReader`] until the clean end of stream.
pub fn through_pipe(frames: &[Frame], pipe: usize) -> Result<Vec<Frame>> {
    block_on(async {
        let (a, b) = tokio::io::duplex(pipe.max(1));
        let mut writer = FrameWriter::new(a);
        let mut reader = FrameReader::new(b);
        // Each side owns its half, so an early error drops it and ends the other side.
        let write = async move {
            for f in frames {
                writer.write_frame(f).await?;
            }
            writer.shutdown().await
        };
        let read = async move {
            let mut got = Vec::new();
            while let Some(f) = reader.read_frame().await? {
                got.push(f);
            }
            Ok::<_, Error>(got)
        };
        let (w, r) = tokio::join!(write, read);
        w?;
        r
    })
}

/// Feeds raw `bytes` to a [`FrameReader`] (the writer closes after the last byte) and
/// returns the reader's first answer.
pub fn read_raw(bytes: &[u8], pipe: usize) -> Result<Option<Frame>> {
    let bytes = bytes.to_vec();
    block_on(async move {
        use tokio::io::AsyncWriteExt;
        let (mut a, b) = tokio::io::duplex(pipe.max(1));
        let mut reader = FrameReader::new(b);
        let write = async move {
            // The reader may stop early (an error); a broken pipe is then expected.
            let _ = a.write_all(&bytes).await;
            let _ = a.shutdown().await;
        };
        let read = async move {
            let r = reader.read_frame().await;
            // Closing the read side unblocks a writer stuck on a full pipe.
            drop(reader);
            r
        };
        tokio::join!(write, read).1
    })
}

/// Encodes `msg` with `data` in a frame, checks the three encodings agree
/// (`to_bytes`, `encode_prefix` + parts, what `FrameWriter` puts on the stream),
/// sends it through a pipe, parses it back with both decoders and decodes the header.
pub fn frame_round_trip<M>(
    msg: &M,
    data: Bytes,
    pipe: usize,
) -> std::result::Result<(), TestCaseError>
where
    M: Encode + Decode<()> + PartialEq + Debug,
{
    let frame = Frame::new(msg, data.clone()).map_err(fail)?;
    prop_assert_eq!(&frame.header[..], &encode_value(msg).map_err(fail)?[..]);
    let bytes = frame.to_bytes().map_err(fail)?;
    let prefix = frame.encode_prefix().map_err(fail)?;
    prop_assert_eq!(&bytes[..12], &prefix[..]);
    prop_assert_eq!(bytes.len(), 8 + frame.body_len());

    // Whole-buffer decoder.
    let (parsed, used) = Frame::parse(&bytes)
        .map_err(fail)?
        .ok_or_else(|| TestCaseError::fail("a whole frame parsed as incomplete"))?;
    prop_assert_eq!(used, bytes.len());
    prop_assert_eq!(&parsed, &frame);

    // Stream decoder, two frames back to back, then a clean end of stream.
    let second = Frame::message(msg).map_err(fail)?;
    let got = through_pipe(&[frame.clone(), second.clone()], pipe).map_err(fail)?;
    prop_assert_eq!(got.len(), 2);
    prop_assert_eq!(&got[0], &frame);
    prop_assert_eq!(&got[1], &second);
    prop_assert_eq!(&got[0].data, &data);
    let decoded: M = got[0].decode().map_err(fail)?;
    prop_assert_eq!(&decoded, msg);
    let decoded: M = got[1].decode().map_err(fail)?;
    prop_assert_eq!(&decoded, msg);
    Ok(())
}

/// Turns a proto error into a proptest failure.
pub fn fail(e: Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

// ---------------------------------------------------------------- primitives

/// A u64 that exercises every bincode varint width (1, 3, 5 and 9 bytes).
pub fn arb_u64() -> BoxedStrategy<u64> {
    prop_oneof![
        0u64..251,
        251u64..=0xFFFF,
        0x1_0000u64..=0xFFFF_FFFF,
        any::<u64>(),
        Just(u64::MAX),
    ]
    .boxed()
}

/// A u32 that exercises every varint width it can have.
pub fn arb_u32() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..251, 251u32..=0xFFFF, any::<u32>(), Just(u32::MAX)]
}

/// Any string, including non-ASCII and empty.
pub fn arb_string() -> BoxedStrategy<String> {
    // Compiled once per strategy: a `&str` strategy recompiles its regex per value.
    let regex = |r: &str| prop::string::string_regex(r).expect("valid regex");
    prop_oneof![regex("[a-z/._-]{0,16}"), regex("(?s).{0,12}")].boxed()
}

/// Raw data for a frame's data section.
pub fn arb_data() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<u8>(), 0..64),
        prop::collection::vec(any::<u8>(), 0..3000),
    ]
    .prop_map(Bytes::from)
}

/// A duplex pipe size: tiny pipes split frames at every possible point.
pub fn arb_pipe() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..16, 16usize..512, Just(64 << 10)]
}

fn small_vec<S: Strategy>(s: S) -> impl Strategy<Value = Vec<S::Value>> {
    prop::collection::vec(s, 0..4)
}

// ---------------------------------------------------------------- ids and tokens

pub fn arb_handle() -> impl Strategy<Value = ChunkHandle> {
    arb_u64().prop_map(ChunkHandle)
}

pub fn arb_version() -> impl Strategy<Value = ChunkVersion> {
    arb_u64().prop_map(ChunkVersion)
}

pub fn arb_cs() -> impl Strategy<Value = ChunkserverId> {
    arb_u64().prop_map(ChunkserverId)
}

pub fn arb_client() -> impl Strategy<Value = ClientId> {
    arb_u64().prop_map(ClientId)
}

pub fn arb_inode() -> impl Strategy<Value = InodeId> {
    arb_u64().prop_map(InodeId)
}

prop_compose! {
    /// A token with arbitrary fields and MAC (the codec does not check MACs).
    pub fn arb_token()(handle in arb_handle(), version in arb_version(),
                       client in arb_client(), mac in any::<[u8; 32]>()) -> ChunkToken {
        ChunkToken { handle, version, client, mac }
    }
}

prop_compose! {
    pub fn arb_issue()(chunkserver in arb_cs(), session in arb_u64(), seq in arb_u64(),
                       term in arb_u64(), leader in arb_u64()) -> Issue {
        Issue { chunkserver, session, seq, epoch: MasterEpoch { term, leader } }
    }
}

prop_compose! {
    pub fn arb_signed_command()(issue in arb_issue(), body in arb_chunk_command(), mac in any::<[u8; 32]>())
        -> Signed<ChunkCommand> {
        Signed { issue, body, mac }
    }
}

// ---------------------------------------------------------------- errors

pub fn arb_remote_error() -> BoxedStrategy<RemoteError> {
    let s = arb_string;
    prop_oneof![
        (arb_handle(), arb_version(), arb_version())
            .prop_map(|(handle, presented, current)| {
                RemoteError::StaleToken {
                    handle,
                    presented,
                    current,
                }
            })
            .boxed(),
        (arb_handle(), arb_version(), arb_version())
            .prop_map(|(handle, presented, current)| {
                RemoteError::ReplicaStale {
                    handle,
                    presented,
                    current,
                }
            })
            .boxed(),
        arb_handle()
            .prop_map(|handle| RemoteError::BadToken { handle })
            .boxed(),
        (arb_handle(), arb_u64())
            .prop_map(|(handle, offset)| RemoteError::ChecksumMismatch { handle, offset })
            .boxed(),
        s().prop_map(|what| RemoteError::NotFound { what }).boxed(),
        s().prop_map(|path| RemoteError::AlreadyExists { path })
            .boxed(),
        s().prop_map(|path| RemoteError::NotADirectory { path })
            .boxed(),
        s().prop_map(|path| RemoteError::IsADirectory { path })
            .boxed(),
        s().prop_map(|path| RemoteError::DirectoryNotEmpty { path })
            .boxed(),
        (s(), arb_client(), arb_u64())
            .prop_map(|(path, holder, expires_in_ms)| {
                RemoteError::LeaseConflict {
                    path,
                    holder,
                    expires_in_ms,
                }
            })
            .boxed(),
        s().prop_map(|path| RemoteError::LeaseExpired { path })
            .boxed(),
        s().prop_map(|path| RemoteError::RecoveryInProgress { path })
            .boxed(),
        arb_cs()
            .prop_map(|chunkserver| RemoteError::NoSpace { chunkserver })
            .boxed(),
        (arb_u32(), arb_u32())
            .prop_map(|(live, needed)| RemoteError::NotEnoughReplicas { live, needed })
            .boxed(),
        s().prop_map(|reason| RemoteError::BadRequest { reason })
            .boxed(),
        s().prop_map(|reason| RemoteError::Internal { reason })
            .boxed(),
        (arb_u64(), arb_u64())
            .prop_map(|(len, max)| RemoteError::FrameTooLarge { len, max })
            .boxed(),
        s().prop_map(|reason| RemoteError::MalformedFrame { reason })
            .boxed(),
        s().prop_map(|reason| RemoteError::Io { reason }).boxed(),
        s().prop_map(|reason| RemoteError::Unavailable { reason })
            .boxed(),
        (s(), s())
            .prop_map(|(path, reason)| RemoteError::InvalidPath { path, reason })
            .boxed(),
        s().prop_map(|reason| RemoteError::NotSupported { reason })
            .boxed(),
        (arb_u64(), arb_u64(), arb_u64())
            .prop_map(|(h, offset, length)| RemoteError::ReplicaShort {
                handle: ChunkHandle(h),
                offset,
                length,
            })
            .boxed(),
        (arb_u64(), arb_u64())
            .prop_map(|(h, length)| RemoteError::ReplicaFinalized {
                handle: ChunkHandle(h),
                length,
            })
            .boxed(),
        (s(), s())
            .prop_map(|(path, reason)| RemoteError::PermissionDenied { path, reason })
            .boxed(),
        (s(), s())
            .prop_map(|(path, reason)| RemoteError::NotPermitted { path, reason })
            .boxed(),
        (s(), arb_u64(), arb_u64())
            .prop_map(|(path, bytes, max)| RemoteError::XattrTooBig { path, bytes, max })
            .boxed(),
        s().prop_map(|reason| RemoteError::Unauthenticated { reason })
            .boxed(),
        proptest::option::of(s())
            .prop_map(|leader| RemoteError::NotLeader { leader })
            .boxed(),
        (s(), arb_quota_resource(), arb_u64(), arb_u64(), arb_u64())
            .prop_map(
                |(path, resource, limit, used, requested)| RemoteError::QuotaExceeded {
                    path,
                    resource,
                    limit,
                    used,
                    requested,
                }
            )
            .boxed(),
    ]
    .boxed()
}

/// Either a value from `ok` or a remote error: what a reply frame carries.
pub fn arb_result<T: Debug + Clone>(
    ok: impl Strategy<Value = T>,
) -> impl Strategy<Value = std::result::Result<T, RemoteError>> {
    prop_oneof![ok.prop_map(Ok), arb_remote_error().prop_map(Err)]
}

// ---------------------------------------------------------------- shared shapes

pub fn arb_replica_state() -> impl Strategy<Value = ReplicaState> {
    prop_oneof![Just(ReplicaState::Writing), Just(ReplicaState::Finalized)]
}

pub fn arb_file_kind() -> impl Strategy<Value = FileKind> {
    prop_oneof![
        Just(FileKind::File),
        Just(FileKind::Directory),
        Just(FileKind::Symlink)
    ]
}

pub fn arb_file_state() -> impl Strategy<Value = FileState> {
    prop_oneof![
        Just(FileState::Open),
        Just(FileState::Closed),
        Just(FileState::Recovering)
    ]
}

prop_compose! {
    pub fn arb_cs_addr()(id in arb_cs(), addr in arb_string()) -> ChunkserverAddr {
        ChunkserverAddr { id, addr }
    }
}

prop_compose! {
    pub fn arb_replica_report()(handle in arb_handle(), version in arb_version(),
                                length in arb_u64(), state in arb_replica_state())
        -> ReplicaReport {
        ReplicaReport { handle, version, length, state }
    }
}

prop_compose! {
    pub fn arb_file_status()(path in arb_string(), inode in arb_inode(), kind in arb_file_kind(),
                             length in arb_u64(), replication in any::<u8>(),
                             chunk_size in arb_u64(), state in arb_file_state(),
                             attr in arb_attr()) -> FileStatus {
        FileStatus { path, inode, kind, length, replication, chunk_size, state, attr }
    }
}

prop_compose! {
    pub fn arb_replica_location()(chunkserver in arb_cs(), addr in arb_string(),
                                  version in arb_version(), state in arb_replica_state(),
                                  decommissioning in any::<bool>())
        -> ReplicaLocation {
        ReplicaLocation { chunkserver, addr, version, state, decommissioning }
    }
}

prop_compose! {
    pub fn arb_located_chunk()(handle in arb_handle(), version in arb_version(),
                               file_offset in arb_u64(), length in arb_u64(),
                               complete in any::<bool>(), token in arb_token(),
                               replicas in small_vec(arb_replica_location())) -> LocatedChunk {
        LocatedChunk { handle, version, file_offset, length, complete, unconfirmed: !complete && length % 2 == 1, token, replicas }
    }
}

prop_compose! {
    pub fn arb_file_locations()(status in arb_file_status(),
                                chunks in small_vec(arb_located_chunk())) -> FileLocations {
        FileLocations { status, chunks }
    }
}

prop_compose! {
    pub fn arb_write_grant()(token in arb_token(), chunk_index in arb_u64(),
                             file_offset in arb_u64(), chunk_offset in arb_u64(),
                             chunk_size in arb_u64(), pipeline in small_vec(arb_cs_addr()))
        -> WriteGrant {
        WriteGrant { token, chunk_index, file_offset, chunk_offset, chunk_size, pipeline }
    }
}

prop_compose! {
    pub fn arb_chunk_commit()(handle in arb_handle(), length in arb_u64()) -> ChunkCommit {
        ChunkCommit { handle, length }
    }
}

// ---------------------------------------------------------------- client → master

prop_compose! {
    pub fn arb_new_attr()(mode in any::<u32>(), uid in any::<u32>(), gid in any::<u32>())
        -> NewAttr {
        NewAttr { mode, uid, gid }
    }
}

prop_compose! {
    pub fn arb_attr()(mode in any::<u32>(), uid in any::<u32>(), gid in any::<u32>(),
                      atime_ns in any::<i64>(), mtime_ns in any::<i64>(),
                      ctime_ns in any::<i64>()) -> Attr {
        Attr { mode, uid, gid, atime_ns, mtime_ns, ctime_ns }
    }
}

prop_compose! {
    pub fn arb_caller()(uid in any::<u32>(), gid in any::<u32>(),
                        groups in prop::collection::vec(any::<u32>(), 0..8)) -> Caller {
        Caller { uid, gid, groups }
    }
}

pub fn arb_set_time() -> impl Strategy<Value = SetTime> {
    prop_oneof![Just(SetTime::Now), any::<i64>().prop_map(SetTime::At)]
}

prop_compose! {
    pub fn arb_set_attr()(path in arb_string(), mode in any::<Option<u32>>(),
                          uid in any::<Option<u32>>(), gid in any::<Option<u32>>(),
                          atime in prop::option::of(arb_set_time()),
                          mtime in prop::option::of(arb_set_time()),
        caller in prop::option::of(arb_caller())) -> SetAttr {
        SetAttr { path, mode, uid, gid, atime, mtime, caller }
    }
}

prop_compose! {
    pub fn arb_mkdir()(path in arb_string(), parents in any::<bool>(),
                       attr in prop::option::of(arb_new_attr()),
        caller in prop::option::of(arb_caller())) -> Mkdir {
        Mkdir { path, parents, attr, caller }
    }
}

prop_compose! {
    pub fn arb_create()(path in arb_string(), client in arb_client(),
                        replication in any::<Option<u8>>(),
                        chunk_size in prop::option::of(arb_u64()),
                        overwrite in any::<bool>(),
                        attr in prop::option::of(arb_new_attr()),
        caller in prop::option::of(arb_caller())) -> Create {
        Create { path, client, replication, chunk_size, overwrite, attr, caller }
    }
}

prop_compose! {
    pub fn arb_make_file()(path in arb_string(), client in arb_client(),
                           replication in any::<Option<u8>>(),
                           chunk_size in prop::option::of(arb_u64()),
                           attr in prop::option::of(arb_new_attr()),
        caller in prop::option::of(arb_caller())) -> MakeFile {
        MakeFile { path, client, replication, chunk_size, attr, caller }
    }
}

prop_compose! {
    pub fn arb_cut_last_chunk()(path in arb_string(), client in arb_client(),
                                handle in arb_handle(), length in arb_u64()) -> CutLastChunk {
        CutLastChunk { path, client, handle, length }
    }
}

prop_compose! {
    pub fn arb_drop_chunks()(path in arb_string(), client in arb_client(),
                             previous in prop::option::of(arb_chunk_commit()),
                             keep in arb_u64()) -> DropChunks {
        DropChunks { path, client, previous, keep }
    }
}

prop_compose! {
    pub fn arb_symlink()(path in arb_string(), target in arb_string(),
                         attr in prop::option::of(arb_new_attr()),
        caller in prop::option::of(arb_caller())) -> Symlink {
        Symlink { path, target, attr, caller }
    }
}

prop_compose! {
    pub fn arb_open_chunk()(path in arb_string(), client in arb_client(),
                            previous in prop::option::of(arb_chunk_commit()),
                            index in arb_u64()) -> OpenChunk {
        OpenChunk { path, client, previous, index }
    }
}

prop_compose! {
    pub fn arb_append()(path in arb_string(), client in arb_client(),
        caller in prop::option::of(arb_caller())) -> Append {
        Append { path, client, caller }
    }
}

prop_compose! {
    pub fn arb_append_reply()(status in arb_file_status(),
                              last_chunk in prop::option::of(arb_write_grant())) -> AppendReply {
        AppendReply { status, last_chunk }
    }
}

prop_compose! {
    pub fn arb_add_chunk()(path in arb_string(), client in arb_client(),
                           previous in prop::option::of(arb_chunk_commit())) -> AddChunk {
        AddChunk { path, client, previous }
    }
}

prop_compose! {
    pub fn arb_update_pipeline()(path in arb_string(), client in arb_client(),
                                 handle in arb_handle(), survivors in small_vec(arb_cs()),
                                 acked_length in arb_u64()) -> UpdatePipeline {
        UpdatePipeline { path, client, handle, survivors, acked_length }
    }
}

prop_compose! {
    pub fn arb_close()(path in arb_string(), client in arb_client(),
                       last in prop::option::of(arb_chunk_commit()),
                       keep_mtime in any::<bool>()) -> Close {
        Close { path, client, last, keep_mtime }
    }
}

prop_compose! {
    pub fn arb_renew_lease()(client in arb_client()) -> RenewLease {
        RenewLease { client }
    }
}

prop_compose! {
    pub fn arb_get_locations()(path in arb_string(), client in arb_client(),
                               access in any::<bool>(),
        caller in prop::option::of(arb_caller())) -> GetLocations {
        GetLocations { path, client, access, caller }
    }
}

prop_compose! {
    pub fn arb_list()(path in arb_string(),
        caller in prop::option::of(arb_caller())) -> List {
        List { path, caller }
    }
}

prop_compose! {
    pub fn arb_stat()(path in arb_string(),
        caller in prop::option::of(arb_caller())) -> Stat {
        Stat { path, caller }
    }
}

prop_compose! {
    pub fn arb_rename()(src in arb_string(), dst in arb_string(), replace in any::<bool>(),
        caller in prop::option::of(arb_caller())) -> Rename {
        Rename { src, dst, replace, caller }
    }
}

prop_compose! {
    pub fn arb_delete()(path in arb_string(), recursive in any::<bool>(),
        caller in prop::option::of(arb_caller())) -> Delete {
        Delete { path, recursive, caller }
    }
}

prop_compose! {
    pub fn arb_recover_lease()(path in arb_string(), client in arb_client(), accept_loss in any::<bool>(),
        caller in prop::option::of(arb_caller())) -> RecoverLease {
        RecoverLease { path, client, accept_loss, caller }
    }
}

prop_compose! {
    pub fn arb_recovery_outcome()(path in arb_string(), closed in any::<bool>(),
                                  old_version in prop::option::of(arb_version()),
                                  new_version in prop::option::of(arb_version()),
                                  length in arb_u64()) -> RecoveryOutcome {
        RecoveryOutcome { path, closed, old_version, new_version, length }
    }
}

prop_compose! {
    pub fn arb_report_corrupt()(handle in arb_handle(), chunkserver in arb_cs()) -> ReportCorrupt {
        ReportCorrupt { handle, chunkserver }
    }
}

// ---------------------------------------------------------------- replica health

prop_compose! {
    pub fn arb_fsck()(path in prop::option::of(arb_string())) -> Fsck {
        Fsck { path }
    }
}

prop_compose! {
    pub fn arb_health_counts()(files in arb_u64(), chunks in arb_u64(), healthy in arb_u64(),
                               under_replicated in arb_u64(), missing in arb_u64(),
                               stale_replicas in arb_u64(), corrupt_replicas in arb_u64(),
                               ahead_replicas in arb_u64(),
                               (open_files, recovering_files) in (arb_u64(), arb_u64()))
        -> HealthCounts {
        HealthCounts {
            files, chunks, healthy, under_replicated, missing, stale_replicas,
            corrupt_replicas, ahead_replicas, open_files, recovering_files,
        }
    }
}

prop_compose! {
    pub fn arb_chunk_problem()(handle in arb_handle(), index in arb_u64(),
                               version in arb_version(), replication in any::<u8>(),
                               live in arb_u64(), stale in arb_u64(), corrupt in arb_u64(),
                               ahead in arb_u64(), missing in any::<bool>()) -> ChunkProblem {
        ChunkProblem { handle, index, version, replication, live, stale, corrupt, ahead, missing }
    }
}

prop_compose! {
    pub fn arb_file_health()(path in arb_string(), state in arb_file_state(),
                             length in arb_u64(), replication in any::<u8>(),
                             healthy in any::<bool>(), counts in arb_health_counts(),
                             problems in small_vec(arb_chunk_problem())) -> FileHealth {
        FileHealth { path, state, length, replication, healthy, counts, problems }
    }
}

prop_compose! {
    pub fn arb_fsck_report()(path in arb_string(), healthy in any::<bool>(),
                             total in arb_health_counts(),
                             files in small_vec(arb_file_health()),
                             truncated in any::<bool>(), orphan_replicas in arb_u64(),
                             replications_in_flight in arb_u64()) -> FsckReport {
        FsckReport {
            path, healthy, total, files, truncated, orphan_replicas, replications_in_flight,
        }
    }
}

pub fn arb_cluster_report_request() -> impl Strategy<Value = ClusterReportRequest> {
    Just(ClusterReportRequest {})
}

pub fn arb_chunkserver_state() -> impl Strategy<Value = ChunkserverState> {
    prop_oneof![Just(ChunkserverState::Live), Just(ChunkserverState::Dead)]
}

prop_compose! {
    pub fn arb_chunkserver_status()(id in arb_cs(), addr in arb_string(),
                                    state in arb_chunkserver_state(),
                                    last_heartbeat_ms_ago in prop::option::of(arb_u64()),
                                    capacity in arb_u64(), used in arb_u64(),
                                    replicas in arb_u64(), active_streams in arb_u32(),
                                    queued_commands in arb_u64(),
                                    decommission in arb_decommission_state()) -> ChunkserverStatus {
        ChunkserverStatus {
            id, addr, state, last_heartbeat_ms_ago, capacity, used, replicas,
            active_streams, queued_commands, decommission,
        }
    }
}

pub fn arb_decommission_state() -> impl Strategy<Value = DecommissionState> {
    prop_oneof![
        Just(DecommissionState::InService),
        arb_u64().prop_map(|waiting| DecommissionState::Decommissioning { waiting }),
        Just(DecommissionState::Decommissioned),
        Just(DecommissionState::Unreported),
    ]
}

prop_compose! {
    pub fn arb_cluster_report()(chunkservers in small_vec(arb_chunkserver_status()),
                                chunks in arb_health_counts(), orphan_replicas in arb_u64(),
                                replications_in_flight in arb_u64(),
                                masters in proptest::option::of(arb_group_status()),
                                safe_mode in arb_safe_mode_status(),
                                balancer in arb_balance_status()) -> ClusterReport {
        ClusterReport {
            chunkservers, chunks, orphan_replicas, replications_in_flight, masters, safe_mode,
            balancer,
        }
    }
}

/// Either quota resource.
pub fn arb_quota_resource() -> impl Strategy<Value = QuotaResource> {
    prop_oneof![Just(QuotaResource::Names), Just(QuotaResource::Bytes)]
}

/// Any change of one quota limit.
pub fn arb_quota_change() -> impl Strategy<Value = QuotaChange> {
    prop_oneof![
        Just(QuotaChange::Keep),
        Just(QuotaChange::Clear),
        arb_u64().prop_map(QuotaChange::Set),
    ]
}

prop_compose! {
    pub fn arb_quota_report()(path in arb_string(),
                              names in proptest::option::of((arb_u64(), arb_u64())),
                              bytes in proptest::option::of((arb_u64(), arb_u64())))
        -> QuotaReport {
        let quota = |(limit, used)| QuotaUse { limit, used };
        QuotaReport { path, names: names.map(quota), bytes: bytes.map(quota) }
    }
}

prop_compose! {
    pub fn arb_balance_status()(running in any::<bool>(), threshold_pct in any::<u8>(),
                                moves_ordered in arb_u64(), average_ppm in arb_u32(),
                                over in arb_u32(), under in arb_u32(), balanced in any::<bool>(),
                                stuck in any::<bool>())
        -> BalanceStatus {
        BalanceStatus {
            running, threshold_pct, moves_ordered, average_ppm, over, under, balanced, stuck,
        }
    }
}

prop_compose! {
    pub fn arb_safe_mode_status()(on in any::<bool>(), manual in any::<bool>(),
                                  chunks in arb_u64(), reported in arb_u64(),
                                  threshold_ppm in arb_u32(),
                                  extension_left_ms in proptest::option::of(arb_u64()),
                                  first_pass_pending in any::<bool>())
        -> SafeModeStatus {
        SafeModeStatus {
            on, manual, chunks, reported, threshold_ppm, extension_left_ms, first_pass_pending,
        }
    }
}

prop_compose! {
    pub fn arb_member_status()(id in arb_u64(), addr in arb_string(), role in arb_string(),
                               matched_index in proptest::option::of(arb_u64()),
                               lag in proptest::option::of(arb_u64())) -> MemberStatus {
        MemberStatus { id, addr, role, matched_index, lag }
    }
}

prop_compose! {
    pub fn arb_group_status()(this in arb_u64(), term in arb_u64(), epoch in arb_string(),
                              leader in proptest::option::of(arb_u64()),
                              applied_index in proptest::option::of(arb_u64()),
                              last_log_index in proptest::option::of(arb_u64()),
                              snapshot_index in proptest::option::of(arb_u64()),
                              purged_index in proptest::option::of(arb_u64()),
                              quorum_ack_ms_ago in proptest::option::of(arb_u64()),
                              members in small_vec(arb_member_status())) -> GroupStatus {
        GroupStatus { this, term, epoch, leader, applied_index, last_log_index, snapshot_index,
                      purged_index, quorum_ack_ms_ago, members }
    }
}

// ---------------------------------------------------------------- chunkserver → master

prop_compose! {
    pub fn arb_register()(id in prop::option::of(arb_cs()), addr in arb_string(),
                          capacity in arb_u64(), used in arb_u64(),
                          replicas in small_vec(arb_replica_report()),
                          session in arb_u64()) -> Register {
        Register { id, addr, capacity, used, replicas, session }
    }
}

prop_compose! {
    pub fn arb_lease_terms()(
        renewed in any::<u32>(),
        soft_limit_ms in any::<u64>(),
        hard_limit_ms in any::<u64>(),
    ) -> LeaseTerms {
        LeaseTerms { renewed, soft_limit_ms, hard_limit_ms }
    }
}

prop_compose! {
    pub fn arb_register_reply()(id in arb_cs()) -> RegisterReply {
        RegisterReply { id }
    }
}

prop_compose! {
    pub fn arb_heartbeat()(id in arb_cs(), capacity in arb_u64(), used in arb_u64(),
                           replica_count in arb_u64(), active_streams in arb_u32()) -> Heartbeat {
        Heartbeat { id, capacity, used, replica_count, active_streams }
    }
}

prop_compose! {
    pub fn arb_heartbeat_reply()(commands in small_vec(arb_signed_command()),
                                 reregister in any::<bool>()) -> HeartbeatReply {
        HeartbeatReply { commands, reregister }
    }
}

prop_compose! {
    pub fn arb_chunk_report()(id in arb_cs(), replicas in small_vec(arb_replica_report()))
        -> ChunkReport {
        ChunkReport { id, replicas }
    }
}

prop_compose! {
    pub fn arb_report_part()(replicas in small_vec(arb_replica_report())) -> ReportPart {
        ReportPart { replicas }
    }
}

pub fn arb_master_request() -> BoxedStrategy<MasterRequest> {
    prop_oneof![
        arb_mkdir().prop_map(MasterRequest::Mkdir).boxed(),
        arb_create().prop_map(MasterRequest::Create).boxed(),
        arb_append().prop_map(MasterRequest::Append).boxed(),
        arb_add_chunk().prop_map(MasterRequest::AddChunk).boxed(),
        arb_update_pipeline()
            .prop_map(MasterRequest::UpdatePipeline)
            .boxed(),
        arb_close().prop_map(MasterRequest::Close).boxed(),
        arb_renew_lease()
            .prop_map(MasterRequest::RenewLease)
            .boxed(),
        arb_get_locations()
            .prop_map(MasterRequest::GetLocations)
            .boxed(),
        arb_list().prop_map(MasterRequest::List).boxed(),
        arb_stat().prop_map(MasterRequest::Stat).boxed(),
        arb_rename().prop_map(MasterRequest::Rename).boxed(),
        arb_delete().prop_map(MasterRequest::Delete).boxed(),
        arb_recover_lease()
            .prop_map(MasterRequest::RecoverLease)
            .boxed(),
        arb_report_corrupt()
            .prop_map(MasterRequest::ReportCorrupt)
            .boxed(),
        arb_register().prop_map(MasterRequest::Register).boxed(),
        arb_heartbeat().prop_map(MasterRequest::Heartbeat).boxed(),
        arb_chunk_report()
            .prop_map(MasterRequest::ChunkReport)
            .boxed(),
        arb_fsck().prop_map(MasterRequest::Fsck).boxed(),
        arb_cluster_report_request()
            .prop_map(MasterRequest::ClusterReport)
            .boxed(),
        arb_report_part()
            .prop_map(MasterRequest::ReportPart)
            .boxed(),
        arb_make_file().prop_map(MasterRequest::MakeFile).boxed(),
        arb_cut_last_chunk()
            .prop_map(MasterRequest::CutLastChunk)
            .boxed(),
        arb_open_chunk().prop_map(MasterRequest::OpenChunk).boxed(),
        arb_drop_chunks()
            .prop_map(MasterRequest::DropChunks)
            .boxed(),
        arb_symlink().prop_map(MasterRequest::Symlink).boxed(),
        arb_string()
            .prop_map(|path| MasterRequest::ReadLink(ReadLink { path, caller: None }))
            .boxed(),
        arb_set_attr().prop_map(MasterRequest::SetAttr).boxed(),
        (arb_string(), arb_string(), prop::option::of(arb_caller()))
            .prop_map(|(path, name, caller)| {
                MasterRequest::GetXattr(GetXattr { path, name, caller })
            })
            .boxed(),
        (arb_string(), prop::option::of(arb_caller()))
            .prop_map(|(path, caller)| MasterRequest::ListXattr(ListXattr { path, caller }))
            .boxed(),
        (
            arb_string(),
            arb_string(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..64)),
            prop_oneof![
                Just(XattrSet::Any),
                Just(XattrSet::Create),
                Just(XattrSet::Replace)
            ],
            prop::option::of(arb_caller()),
        )
            .prop_map(|(path, name, value, how, caller)| {
                MasterRequest::SetXattr(SetXattr {
                    path,
                    name,
                    value,
                    how,
                    caller,
                })
            })
            .boxed(),
        any::<[u8; 32]>()
            .prop_map(|nonce| MasterRequest::ServerHello(ServerHello { nonce }))
            .boxed(),
        any::<[u8; 32]>()
            .prop_map(|proof| MasterRequest::ServerProve(ServerProve { proof }))
            .boxed(),
        (arb_string(), any::<[u8; 32]>())
            .prop_map(|(user, nonce)| MasterRequest::ClientHello(ClientHello { user, nonce }))
            .boxed(),
        any::<[u8; 32]>()
            .prop_map(|proof| MasterRequest::ClientProve(ClientProve { proof }))
            .boxed(),
        arb_user_info()
            .prop_map(|u| MasterRequest::AddUser(AddUser {
                name: u.name,
                uid: u.uid,
                gid: u.gid,
                groups: u.groups,
                superuser: u.superuser,
            }))
            .boxed(),
        Just(MasterRequest::ListUsers(ListUsers {})).boxed(),
        arb_string()
            .prop_map(|name| MasterRequest::RemoveUser(RemoveUser { name }))
            .boxed(),
        (
            any::<u64>(),
            prop_oneof![
                Just(RaftKind::AppendEntries),
                Just(RaftKind::Vote),
                Just(RaftKind::InstallSnapshot),
                Just(RaftKind::ElectNow)
            ]
        )
            .prop_map(|(from, kind)| MasterRequest::Raft(RaftCall { from, kind }))
            .boxed(),
        (any::<u64>(), arb_string())
            .prop_map(|(id, addr)| MasterRequest::AddMaster(AddMaster { id, addr }))
            .boxed(),
        any::<u64>()
            .prop_map(|id| MasterRequest::RemoveMaster(RemoveMaster { id }))
            .boxed(),
        any::<u64>()
            .prop_map(|to| MasterRequest::TransferLeader(TransferLeader { to }))
            .boxed(),
        (arb_string(), any::<u8>(), prop::option::of(arb_caller()))
            .prop_map(|(path, replication, caller)| {
                MasterRequest::SetReplication(SetReplication {
                    path,
                    replication,
                    caller,
                })
            })
            .boxed(),
        (arb_cs(), any::<bool>())
            .prop_map(|(server, on)| MasterRequest::Decommission(Decommission { server, on }))
            .boxed(),
        prop_oneof![
            Just(SafeModeAction::Get),
            Just(SafeModeAction::Enter),
            Just(SafeModeAction::Leave)
        ]
        .prop_map(|action| MasterRequest::SafeMode(SafeModeRequest { action }))
        .boxed(),
        (arb_string(), any::<bool>(), prop::option::of(arb_caller()))
            .prop_map(
                |(path, recursive, caller)| MasterRequest::DeleteNow(DeleteNow {
                    path,
                    recursive,
                    caller,
                })
            )
            .boxed(),
        (arb_string(), arb_string(), prop::option::of(arb_caller()))
            .prop_map(
                |(path, to, caller)| MasterRequest::RestoreTrash(RestoreTrash { path, to, caller })
            )
            .boxed(),
        prop_oneof![
            Just(BalanceAction::Status),
            Just(BalanceAction::Stop),
            any::<u8>().prop_map(|threshold_pct| BalanceAction::Start { threshold_pct }),
        ]
        .prop_map(|action| MasterRequest::Balance(BalanceRequest { action }))
        .boxed(),
        (arb_string(), arb_quota_change(), arb_quota_change())
            .prop_map(|(path, names, bytes)| MasterRequest::SetQuota(SetQuota {
                path,
                names,
                bytes
            }))
            .boxed(),
        (arb_string(), prop::option::of(arb_caller()))
            .prop_map(|(path, caller)| MasterRequest::GetQuota(GetQuota { path, caller }))
            .boxed(),
        Just(MasterRequest::ListQuotas(ListQuotas {})).boxed(),
        (any::<u64>(), any::<u64>(), arb_mkdir())
            .prop_map(|(client, call, m)| MasterRequest::Once(OnceCall {
                client: ClientId(client),
                call,
                request: Box::new(MasterRequest::Mkdir(m)),
            }))
            .boxed(),
    ]
    .boxed()
}

prop_compose! {
    pub fn arb_user_info()(name in arb_string(), uid in any::<u32>(), gid in any::<u32>(),
                           groups in small_vec(any::<u32>()), superuser in any::<bool>())
        -> UserInfo {
        UserInfo { name, uid, gid, groups, superuser }
    }
}

/// The variant name; exhaustive (no `_` arm), so a new variant breaks the build here
/// until it has a strategy above and a name below.
pub fn master_request_variant(r: &MasterRequest) -> &'static str {
    match r {
        MasterRequest::Mkdir(_) => "Mkdir",
        MasterRequest::Create(_) => "Create",
        MasterRequest::Append(_) => "Append",
        MasterRequest::AddChunk(_) => "AddChunk",
        MasterRequest::UpdatePipeline(_) => "UpdatePipeline",
        MasterRequest::Close(_) => "Close",
        MasterRequest::RenewLease(_) => "RenewLease",
        MasterRequest::GetLocations(_) => "GetLocations",
        MasterRequest::List(_) => "List",
        MasterRequest::Stat(_) => "Stat",
        MasterRequest::Rename(_) => "Rename",
        MasterRequest::Delete(_) => "Delete",
        MasterRequest::RecoverLease(_) => "RecoverLease",
        MasterRequest::ReportCorrupt(_) => "ReportCorrupt",
        MasterRequest::Register(_) => "Register",
        MasterRequest::Heartbeat(_) => "Heartbeat",
        MasterRequest::ChunkReport(_) => "ChunkReport",
        MasterRequest::Fsck(_) => "Fsck",
        MasterRequest::ClusterReport(_) => "ClusterReport",
        MasterRequest::ReportPart(_) => "ReportPart",
        MasterRequest::MakeFile(_) => "MakeFile",
        MasterRequest::CutLastChunk(_) => "CutLastChunk",
        MasterRequest::OpenChunk(_) => "OpenChunk",
        MasterRequest::DropChunks(_) => "DropChunks",
        MasterRequest::Symlink(_) => "Symlink",
        MasterRequest::ReadLink(_) => "ReadLink",
        MasterRequest::SetAttr(_) => "SetAttr",
        MasterRequest::GetXattr(_) => "GetXattr",
        MasterRequest::ListXattr(_) => "ListXattr",
        MasterRequest::SetXattr(_) => "SetXattr",
        MasterRequest::ServerHello(_) => "ServerHello",
        MasterRequest::ServerProve(_) => "ServerProve",
        MasterRequest::ClientHello(_) => "ClientHello",
        MasterRequest::ClientProve(_) => "ClientProve",
        MasterRequest::AddUser(_) => "AddUser",
        MasterRequest::ListUsers(_) => "ListUsers",
        MasterRequest::RemoveUser(_) => "RemoveUser",
        MasterRequest::Raft(_) => "Raft",
        MasterRequest::AddMaster(_) => "AddMaster",
        MasterRequest::RemoveMaster(_) => "RemoveMaster",
        MasterRequest::TransferLeader(_) => "TransferLeader",
        MasterRequest::Once(_) => "Once",
        MasterRequest::SetReplication(_) => "SetReplication",
        MasterRequest::Decommission(_) => "Decommission",
        MasterRequest::SafeMode(_) => "SafeMode",
        MasterRequest::DeleteNow(_) => "DeleteNow",
        MasterRequest::RestoreTrash(_) => "RestoreTrash",
        MasterRequest::Balance(_) => "Balance",
        MasterRequest::SetQuota(_) => "SetQuota",
        MasterRequest::GetQuota(_) => "GetQuota",
        MasterRequest::ListQuotas(_) => "ListQuotas",
    }
}

// ---------------------------------------------------------------- → chunkserver

prop_compose! {
    pub fn arb_write_setup()(token in arb_token(), offset in arb_u64(),
                             downstream in small_vec(arb_cs_addr())) -> WriteSetup {
        WriteSetup { token, offset, downstream }
    }
}

prop_compose! {
    pub fn arb_write_setup_reply()(accepted in small_vec(arb_cs()),
                                   failed in small_vec((arb_cs(), arb_remote_error())))
        -> WriteSetupReply {
        WriteSetupReply { accepted, failed }
    }
}

prop_compose! {
    pub fn arb_packet()(token in arb_token(), seq in arb_u64(), offset in arb_u64(),
                        crc in arb_u32(), sync in any::<bool>()) -> Packet {
        Packet { token, seq, offset, crc, sync }
    }
}

prop_compose! {
    pub fn arb_replica_ack()(chunkserver in arb_cs(), result in arb_result(arb_u64()))
        -> ReplicaAck {
        ReplicaAck { chunkserver, result }
    }
}

prop_compose! {
    pub fn arb_ack()(seq in arb_u64(), replicas in small_vec(arb_replica_ack())) -> Ack {
        Ack { seq, replicas }
    }
}

prop_compose! {
    pub fn arb_read()(token in arb_token(), offset in arb_u64(), len in arb_u32()) -> Read {
        Read { token, offset, len }
    }
}

prop_compose! {
    pub fn arb_read_reply()(replica in arb_replica_report()) -> ReadReply {
        ReadReply { replica }
    }
}

prop_compose! {
    pub fn arb_replica_info()(token in arb_token()) -> ReplicaInfo {
        ReplicaInfo { token }
    }
}

prop_compose! {
    pub fn arb_receive_replica()(token in arb_token(), length in arb_u64()) -> ReceiveReplica {
        ReceiveReplica { token, length }
    }
}

prop_compose! {
    pub fn arb_verify_replica()(handle in arb_handle()) -> VerifyReplica {
        VerifyReplica { handle }
    }
}

prop_compose! {
    pub fn arb_signed_verify()(issue in arb_issue(), body in arb_verify_replica(), mac in any::<[u8; 32]>())
        -> Signed<VerifyReplica> {
        Signed { issue, body, mac }
    }
}

prop_compose! {
    pub fn arb_overwrite_setup()(setup in arb_write_setup()) -> OverwriteSetup {
        OverwriteSetup { setup }
    }
}

prop_compose! {
    pub fn arb_digest_replica()(handle in arb_handle(), version in arb_version()) -> DigestReplica {
        DigestReplica { handle, version }
    }
}

prop_compose! {
    pub fn arb_signed_digest()(issue in arb_issue(), body in arb_digest_replica(), mac in any::<[u8; 32]>())
        -> Signed<DigestReplica> {
        Signed { issue, body, mac }
    }
}

prop_compose! {
    pub fn arb_replica_digest()(replica in arb_replica_report(), blocks in small_vec(any::<u64>()))
        -> ReplicaDigest {
        ReplicaDigest { replica, blocks }
    }
}

pub fn arb_verification() -> BoxedStrategy<Verification> {
    prop_oneof![
        arb_replica_report()
            .prop_map(|replica| Verification::Clean { replica })
            .boxed(),
        (arb_version(), arb_u64())
            .prop_map(|(version, offset)| Verification::Corrupt { version, offset })
            .boxed(),
        Just(Verification::Absent).boxed(),
    ]
    .boxed()
}

/// Exhaustive variant name of a [`Verification`].
pub fn verification_variant(v: &Verification) -> &'static str {
    match v {
        Verification::Clean { .. } => "Clean",
        Verification::Corrupt { .. } => "Corrupt",
        Verification::Absent => "Absent",
    }
}

pub fn arb_chunk_command() -> BoxedStrategy<ChunkCommand> {
    prop_oneof![
        (arb_handle(), arb_version(), any::<bool>())
            .prop_map(|(handle, version, create)| {
                ChunkCommand::BumpVersion {
                    handle,
                    version,
                    create,
                }
            })
            .boxed(),
        (arb_handle(), arb_version())
            .prop_map(|(handle, max_version)| ChunkCommand::Delete {
                handle,
                max_version
            })
            .boxed(),
        (arb_handle(), arb_version(), arb_cs_addr())
            .prop_map(|(handle, version, target)| {
                ChunkCommand::Replicate {
                    handle,
                    version,
                    target,
                }
            })
            .boxed(),
        (arb_handle(), arb_version(), arb_u64())
            .prop_map(|(handle, version, length)| {
                ChunkCommand::Truncate {
                    handle,
                    version,
                    length,
                }
            })
            .boxed(),
        (arb_handle(), arb_version(), arb_u64())
            .prop_map(|(handle, version, length)| {
                ChunkCommand::Finalize {
                    handle,
                    version,
                    length,
                }
            })
            .boxed(),
        arb_handle()
            .prop_map(|handle| ChunkCommand::Info { handle })
            .boxed(),
    ]
    .boxed()
}

/// Exhaustive variant name of a [`ChunkCommand`].
pub fn chunk_command_variant(c: &ChunkCommand) -> &'static str {
    match c {
        ChunkCommand::BumpVersion { .. } => "BumpVersion",
        ChunkCommand::Delete { .. } => "Delete",
        ChunkCommand::Replicate { .. } => "Replicate",
        ChunkCommand::Truncate { .. } => "Truncate",
        ChunkCommand::Finalize { .. } => "Finalize",
        ChunkCommand::Info { .. } => "Info",
    }
}

pub fn arb_chunk_request() -> BoxedStrategy<ChunkRequest> {
    prop_oneof![
        arb_write_setup().prop_map(ChunkRequest::WriteSetup).boxed(),
        arb_read().prop_map(ChunkRequest::Read).boxed(),
        arb_replica_info()
            .prop_map(ChunkRequest::ReplicaInfo)
            .boxed(),
        arb_receive_replica()
            .prop_map(ChunkRequest::ReceiveReplica)
            .boxed(),
        arb_signed_command().prop_map(ChunkRequest::Command).boxed(),
        arb_signed_verify().prop_map(ChunkRequest::Verify).boxed(),
        arb_overwrite_setup()
            .prop_map(ChunkRequest::OverwriteSetup)
            .boxed(),
        arb_signed_digest().prop_map(ChunkRequest::Digest).boxed(),
    ]
    .boxed()
}

/// Exhaustive variant name of a [`ChunkRequest`].
pub fn chunk_request_variant(r: &ChunkRequest) -> &'static str {
    match r {
        ChunkRequest::WriteSetup(_) => "WriteSetup",
        ChunkRequest::Read(_) => "Read",
        ChunkRequest::ReplicaInfo(_) => "ReplicaInfo",
        ChunkRequest::ReceiveReplica(_) => "ReceiveReplica",
        ChunkRequest::Command(_) => "Command",
        ChunkRequest::Verify(_) => "Verify",
        ChunkRequest::OverwriteSetup(_) => "OverwriteSetup",
        ChunkRequest::Digest(_) => "Digest",
    }
}

/// Exhaustive variant name of a [`RemoteError`].
pub fn remote_error_variant(e: &RemoteError) -> &'static str {
    match e {
        RemoteError::StaleToken { .. } => "StaleToken",
        RemoteError::ReplicaStale { .. } => "ReplicaStale",
        RemoteError::BadToken { .. } => "BadToken",
        RemoteError::ChecksumMismatch { .. } => "ChecksumMismatch",
        RemoteError::NotFound { .. } => "NotFound",
        RemoteError::AlreadyExists { .. } => "AlreadyExists",
        RemoteError::NotADirectory { .. } => "NotADirectory",
        RemoteError::IsADirectory { .. } => "IsADirectory",
        RemoteError::DirectoryNotEmpty { .. } => "DirectoryNotEmpty",
        RemoteError::LeaseConflict { .. } => "LeaseConflict",
        RemoteError::LeaseExpired { .. } => "LeaseExpired",
        RemoteError::RecoveryInProgress { .. } => "RecoveryInProgress",
        RemoteError::NoSpace { .. } => "NoSpace",
        RemoteError::NotEnoughReplicas { .. } => "NotEnoughReplicas",
        RemoteError::BadRequest { .. } => "BadRequest",
        RemoteError::Internal { .. } => "Internal",
        RemoteError::FrameTooLarge { .. } => "FrameTooLarge",
        RemoteError::MalformedFrame { .. } => "MalformedFrame",
        RemoteError::Io { .. } => "Io",
        RemoteError::Unavailable { .. } => "Unavailable",
        RemoteError::InvalidPath { .. } => "InvalidPath",
        RemoteError::NotSupported { .. } => "NotSupported",
        RemoteError::ReplicaShort { .. } => "ReplicaShort",
        RemoteError::ReplicaFinalized { .. } => "ReplicaFinalized",
        RemoteError::PermissionDenied { .. } => "PermissionDenied",
        RemoteError::NotPermitted { .. } => "NotPermitted",
        RemoteError::XattrTooBig { .. } => "XattrTooBig",
        RemoteError::Unauthenticated { .. } => "Unauthenticated",
        RemoteError::NotLeader { .. } => "NotLeader",
        RemoteError::QuotaExceeded { .. } => "QuotaExceeded",
    }
}
