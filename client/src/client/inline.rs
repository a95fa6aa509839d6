//! Serving a request on the calling thread: the mount's FUSE threads run their
//! namespace requests to completion on a runtime of their own (current-thread,
//! built once per thread), as mfsmount's workers do with their blocking master
//! connections. The master's reply then wakes the thread that will answer the
//! kernel, instead of a runtime worker that hands the reply over: one thread
//! hand-off less each way (DESIGN.md "The mount's request path").
//!
//! Connections are bound to the runtime that dialed them: one dialed here works only
//! while this thread is inside [`block_on`]. So a thread serving inline keeps its own
//! master connections ([`take_master`], [`put_master`]) and never puts a connection
//! into the client's shared pools, whose users run on the main runtime.

use super::RpcClient;
use std::cell::{Cell, RefCell};
use std::future::Future;

/// Master connections kept per inline thread: one request runs at a time there.
const KEPT: usize = 2;

thread_local! {
    /// This thread's runtime; taken out while [`block_on`] runs it.
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
    /// Idle master connections dialed on this thread's runtime.
    static MASTER: RefCell<Vec<RpcClient>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread is inside [`block_on`] now.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `fut` to completion on this thread's own runtime. Must not be called from
/// inside a runtime (a FUSE thread is not one).
pub(crate) fn block_on<F: Future>(fut: F) -> std::io::Result<F::Output> {
    let rt = match RUNTIME.with(|r| r.borrow_mut().take()) {
        Some(rt) => rt,
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    };
    /// Clears [`INSIDE`] however `block_on` ends, and gives the runtime back.
    struct Leave(Option<tokio::runtime::Runtime>);
    impl Drop for Leave {
        fn drop(&mut self) {
            INSIDE.with(|i| i.set(false));
            let rt = self.0.take();
            RUNTIME.with(|r| *r.borrow_mut() = rt);
        }
    }
    INSIDE.with(|i| i.set(true));
    let leave = Leave(Some(rt));
    // Only the runtime itself (not a handle) drives a current-thread runtime's I/O:
    // with `Handle::block_on` a reply would never be seen.
    let out = leave.0.as_ref().map(|rt| rt.block_on(fut));
    drop(leave);
    out.ok_or_else(|| std::io::Error::other("the thread's runtime went away"))
}

/// Whether the caller runs inside [`block_on`]: its connections must stay on this
/// thread.
pub(crate) fn inside() -> bool {
    INSIDE.with(|i| i.get())
}

/// An idle master connection of this inline thread.
pub(crate) fn take_master() -> Option<RpcClient> {
    MASTER.with(|m| m.borrow_mut().pop())
}

/// Keeps a master connection for this inline thread's next request.
pub(crate) fn put_master(conn: RpcClient) {
    MASTER.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() < KEPT {
            m.push(conn);
        }
    })
}

/// Drops this thread's master connections (the master closed them).
pub(crate) fn clear_master() {
    MASTER.with(|m| m.borrow_mut().clear())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn requests_run_on_the_calling_thread_and_its_connections_outlive_each_call() {
        let me = std::thread::current().id();
        let (was_inside, ran_on) =
            block_on(async { (inside(), std::thread::current().id()) }).expect("runtime");
        assert!(was_inside);
        assert_eq!(ran_on, me);
        assert!(!inside());
        // A connection made in one call (as a pooled master connection is) still works
        // in the next: the same runtime drives its I/O.
        let (mut a, mut b) = block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = l.local_addr().expect("addr");
            let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
            (a.expect("connect"), b.expect("accept").0)
        })
        .expect("runtime");
        let got = block_on(async {
            a.write_all(b"ping").await.expect("write");
            let mut buf = [0u8; 4];
            tokio::time::timeout(std::time::Duration::from_secs(5), b.read_exact(&mut buf))
                .await
                .expect("the reply is seen")
                .expect("read");
            buf
        })
        .expect("runtime");
        assert_eq!(&got, b"ping");
    }
}
