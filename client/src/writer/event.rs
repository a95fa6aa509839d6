//! What goes into the writer's [`Engine`](super::engine::Engine) and what comes out.
//!
//! [`Event`]s are everything the engine learns: the front's commands, what the stream
//! delivered (acks, its end, the idle timer), and the answer to each [`Action`] that
//! asks a question (every action documents the event that answers it). The engine
//! emits at most one such question at a time and takes no other step until its answer
//! comes; actions that ask nothing (release a packet, drop a stream, complete a
//! waiter) are performed in order and need no answer.

use crate::error::{Error, Result};
use crate::pipeline::{SetupError, StreamEnd};
use bytes::Bytes;
use stampfs_proto::{
    Ack, AddChunk, ChunkToken, ChunkserverAddr, Close, CutLastChunk, DropChunks, FileStatus,
    OpenChunk, UpdatePipeline, WriteGrant, WriteSetupReply,
};

/// A packet of the current chunk, sent or about to be, kept until every replica of the
/// pipeline acknowledged it (and sent again on every new stream meanwhile).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Packet {
    pub(crate) seq: u64,
    /// Chunk offset of the first byte.
    pub(crate) offset: u64,
    pub(crate) crc: u32,
    /// Every replica syncs before acknowledging it (hsync).
    pub(crate) sync: bool,
    pub(crate) data: Bytes,
}

impl Packet {
    /// Chunk offset just past its last byte.
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// A stream that failed, with how ([`StreamEnd::of`] the error, or what the ack reader
/// saw).
#[derive(Debug)]
pub(crate) struct StreamFailure {
    pub(crate) end: StreamEnd,
    pub(crate) error: Error,
}

impl From<Error> for StreamFailure {
    fn from(error: Error) -> Self {
        Self {
            end: StreamEnd::of(&error),
            error,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Event {
    // ------------------------------------------------------------ from the front
    /// Bytes to write at file offset `offset` (at most a packet; cut again at a chunk
    /// boundary). An append writer's offsets are always the end; any writer's never
    /// leave a gap past the end (the front writes zeros into it) and never fall before
    /// the chunk being written (the front refuses those).
    Write {
        offset: u64,
        data: Bytes,
    },
    /// `hflush` (`sync` false) or `hsync`, with the front's buffered tail (at file
    /// offset `offset`) as its last packet. Answered by [`Action::FlushDone`].
    Flush {
        sync: bool,
        offset: u64,
        data: Bytes,
    },
    /// Shrink the file to file offset `offset`, within the current chunk (the front
    /// refuses anything else): drain, lower the committed length at the master, cut
    /// every member with an append set-up there. Answered by [`Action::FlushDone`].
    Cut {
        offset: u64,
    },
    /// Flush, commit the last chunk, close the file (`keep_mtime`: leaving its
    /// modification time alone). Answered by [`Action::CloseDone`].
    Close {
        keep_mtime: bool,
    },
    /// The runtime is about to wait; `backlog`: more front commands are queued already
    /// (then packets stay queued on the socket, unless the window is full).
    Poll {
        backlog: bool,
    },

    // ------------------------------------------------------------ from the stream
    Ack(Ack),
    /// The stream ended while the runtime watched it (or an ack did not come within
    /// the ack timeout: a [`StreamEnd::Broken`] end).
    StreamEnded(StreamFailure),
    /// The stream was at rest for the writer's idle close.
    IdleTimeout,

    // ------------------------------------------------------------ answers
    /// To [`Action::CheckEnd`]: how the stream ended, if it did.
    EndChecked(Option<StreamFailure>),
    /// To [`Action::Send`].
    Sent(std::result::Result<(), StreamFailure>),
    /// To [`Action::FlushStream`].
    Flushed(std::result::Result<(), StreamFailure>),
    /// To [`Action::AddChunk`], [`Action::OpenChunk`] and [`Action::UpdatePipeline`].
    Granted(Result<WriteGrant>),
    /// To [`Action::AskReplicaLength`]: the member's replica length.
    ReplicaLength(Result<u64>),
    /// To [`Action::OpenStream`]: the head's set-up reply (with the members that
    /// failed), or why there was none.
    SetupReplied(std::result::Result<WriteSetupReply, SetupError>),
    /// To [`Action::Resend`].
    Resent(std::result::Result<(), StreamFailure>),
    /// To [`Action::CloseFile`].
    FileClosed(Result<FileStatus>),
    /// To [`Action::CutLastChunk`].
    ChunkCut(Result<()>),
    /// To [`Action::DropChunks`].
    ChunksDropped(Result<()>),
}

#[derive(Debug)]
pub(crate) enum Action {
    // ------------------------------------------------------------ stream
    /// Connect to the grant's head and set a stream up at chunk offset `start`: an
    /// append stream (the head cuts its replica there) or, with `overwrite`, an
    /// overwrite stream (nothing cut; packets at any offset up to the replica's
    /// length). Answer: [`Event::SetupReplied`]; an accepted stream becomes the
    /// current one.
    OpenStream {
        grant: WriteGrant,
        start: u64,
        overwrite: bool,
    },
    /// Has the current stream ended while nobody watched it (at rest)? Answer:
    /// [`Event::EndChecked`].
    CheckEnd,
    /// Queue a new packet on the current stream. Answer: [`Event::Sent`].
    Send { token: ChunkToken, packet: Packet },
    /// Send every unacknowledged packet on the stream just set up, then push them out.
    /// `recovery`: the stream replaces a pipeline that lost a member (the crash point
    /// `writer-reopen-before-resend` sits here). Answer: [`Event::Resent`].
    Resend {
        token: ChunkToken,
        packets: Vec<Packet>,
        recovery: bool,
    },
    /// Push queued packets onto the socket. Answer: [`Event::Flushed`].
    FlushStream,
    /// End the current stream cleanly (half-close).
    FinishStream,
    /// Drop the current stream (or the one just set up) without a word.
    DropStream,

    // ------------------------------------------------------------ chunkservers, master
    /// `ReplicaInfo` of one pipeline member. Answer: [`Event::ReplicaLength`].
    AskReplicaLength {
        member: ChunkserverAddr,
        token: ChunkToken,
    },
    /// Answer: [`Event::Granted`].
    AddChunk(AddChunk),
    /// Move to an existing chunk of the file. Answer: [`Event::Granted`].
    OpenChunk(OpenChunk),
    /// A version bump over the survivors. Answer: [`Event::Granted`].
    UpdatePipeline(UpdatePipeline),
    /// Answer: [`Event::FileClosed`].
    CloseFile(Close),
    /// Close the file at what the writer's replicas acknowledged, after a directory
    /// quota refused it a new chunk: the refusal came while it held the lease and
    /// had every byte it sent acknowledged, so what fit is kept (the master checks
    /// the lease is still this writer's). No answer: the writer has failed already.
    CloseRefused(Close),
    /// Lower the last chunk's committed length before cutting its replicas. Answer:
    /// [`Event::ChunkCut`].
    CutLastChunk(CutLastChunk),
    /// Drop the chunks past the new end of a shrink below the last chunk. Answer:
    /// [`Event::ChunksDropped`].
    DropChunks(DropChunks),

    // ------------------------------------------------------------ bookkeeping, the front
    /// A packet was cut (the ack-latency clock starts).
    Queued { seq: u64 },
    /// Every replica acknowledged this packet: its buffer may be reused.
    Acked(Packet),
    /// The writer failed for good (fenced, or out of recoveries); every later call
    /// returns this error.
    Fail(Error),
    /// The flush asked for by [`Event::Flush`] is over.
    FlushDone(Result<()>),
    /// The close asked for by [`Event::Close { keep_mtime: false }`] is over; the writer is finished.
    CloseDone(Result<FileStatus>),
}

/// What the runtime waits for between events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    /// Take the front's next command.
    pub(crate) commands: bool,
    /// Watch the stream.
    pub(crate) stream: Option<Watch>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Watch {
    /// Packets are in flight: the next ack (or the stream's end, or an ack timeout).
    Acks,
    /// Nothing is in flight: the stream's end, or the writer's idle close.
    AtRest,
}
