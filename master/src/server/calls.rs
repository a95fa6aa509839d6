//! Requests the master serves around its dispatch: a Raft call from another member of
//! the group, and a `Once` call (the answer kept for it, or its request made with
//! its answer kept).

use super::{dispatch, reply};
use crate::error::Error;
use crate::service::Core;
use stampfs_proto::codec::Frame;
use stampfs_proto::rpc::reply_frame;
use stampfs_proto::{MasterRequest, RemoteError};
use std::sync::Arc;

/// Serves a Raft call from another member of the group (its message is the frame's
/// data, and so is the answer).
pub(super) async fn serve_raft(core: &Core, id: u64, req: MasterRequest, data: &[u8]) -> Frame {
    let MasterRequest::Raft(call) = req else {
        return reply::<()>(id, Err(Error::bad_request("not a Raft call")));
    };
    let Some(g) = core.log.group() else {
        return reply::<()>(
            id,
            Err(Error::bad_request(
                "this master keeps an operation log and is no member of a group",
            )),
        );
    };
    match crate::raft::network::serve(&g.raft, call, data).await {
        Ok((r, body)) => reply_frame(id, &Ok::<_, RemoteError>(r), body).unwrap_or_else(|e| {
            reply::<()>(
                id,
                Err(Error::Codec {
                    reason: e.to_string(),
                }),
            )
        }),
        Err(e) => reply::<()>(id, Err(e)),
    }
}

/// A `Once` call (`service/once.rs`): the answer kept for it when it was made, else
/// its request, made with its answer kept.
pub(super) fn serve_once<'a>(
    core: &'a Arc<Core>,
    id: u64,
    o: stampfs_proto::OnceCall,
    mark: &'a mut Option<(stampfs_proto::ChunkserverId, u64)>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Frame> + Send + 'a>> {
    // Boxed: `dispatch` serves the call's request (never a `Once` call itself: that
    // is refused when decoding).
    Box::pin(async move {
        use crate::retry_cache::{CachedReply, CallKind};
        let stampfs_proto::OnceCall {
            client,
            call,
            request,
        } = o;
        let Some(kind) = CallKind::of(&request) else {
            return reply::<()>(
                id,
                Err(Error::bad_request(
                    "only a namespace change made in one step (mkdir, create, make-file, \
                     rename, delete, symlink, set-xattr) is sent as a Once call",
                )),
            );
        };
        if request.client_id().is_some_and(|c| c != client) {
            return reply::<()>(
                id,
                Err(Error::bad_request(
                    "a Once call speaks for another client than its request",
                )),
            );
        }
        let _making = match core.begin_call(client, call, kind).await {
            Ok(Ok(CachedReply::Status(s))) => return reply(id, Ok(s)),
            Ok(Ok(CachedReply::Unit)) => return reply(id, Ok(())),
            Ok(Ok(CachedReply::Bool(b))) => return reply(id, Ok(b)),
            Ok(Err(guard)) => guard,
            Err(e) => return reply::<()>(id, Err(e)),
        };
        crate::service::ONCE
            .scope((client, call, kind), dispatch(core, id, *request, mark))
            .await
    })
}
