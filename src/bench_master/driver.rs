//! How the benchmark reaches the master: [`Driver::Service`] calls its request layer
//! ([`Core`], the methods its connection handlers call) in this process;
//! [`Driver::Rpc`] sends the same requests over loopback TCP with [`RpcClient`] (the
//! client library's transport), one request at a time per connection.
//!
//! The service path is the default because on a 2-core machine the wire costs more
//! CPU than most master operations: framing, two sockets, and a wake-up on each side
//! per request, all on the same cores as the master. Measuring through it would
//! measure mostly that. The rpc path is there to show what it costs.

use anyhow::{anyhow, Result};
use stampfs_master::service::Core;
use stampfs_proto::net::Dialer;
use stampfs_proto::{MasterRequest, Rpc, RpcClient};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request the master's request layer serves: the [`Core`] method its connection
/// handler calls for it.
pub trait Serve: Rpc<Request = MasterRequest> + Send + 'static {
    fn serve(
        self,
        core: &Arc<Core>,
    ) -> impl Future<Output = stampfs_master::Result<Self::Response>> + Send + '_;
}

macro_rules! serve {
    ($($req:ident => $method:ident;)*) => {$(
        impl Serve for stampfs_proto::$req {
            fn serve(
                self,
                core: &Arc<Core>,
            ) -> impl Future<Output = stampfs_master::Result<Self::Response>> + Send + '_ {
                core.$method(self)
            }
        }
    )*};
}

serve! {
    Mkdir => mkdir;
    Create => create;
    Append => append;
    AddChunk => add_chunk;
    Close => close;
    GetLocations => get_locations;
    List => list;
    Stat => stat;
    Rename => rename;
    Delete => delete;
    Register => register;
    Heartbeat => heartbeat;
}

impl Serve for stampfs_proto::ChunkReport {
    /// In process there is no connection to keep a heartbeat's mark: the clock now,
    /// as the simulated chunkservers build their reports when no command is running.
    fn serve(
        self,
        core: &Arc<Core>,
    ) -> impl Future<Output = stampfs_master::Result<Self::Response>> + Send + '_ {
        core.chunk_report(self, core.ack_mark())
    }
}

/// Idle connections to the master, taken for one request and put back after it.
pub struct Pool {
    addr: String,
    /// The cluster key: every connection proves it at its start, since the pool's
    /// connections carry the simulated chunkservers' registrations and reports too.
    key: stampfs_proto::ClusterKey,
    /// And the superuser's credentials: they carry the clients' requests as well.
    creds: stampfs_proto::Credentials,
    /// Connections not in use; a request that finds none connects a new one, and a
    /// connection that failed is dropped instead of put back.
    idle: Mutex<Vec<RpcClient>>,
}

/// The way to the master; cheap to clone.
#[derive(Clone)]
pub enum Driver {
    Service(Arc<Core>),
    Rpc(Arc<Pool>),
}

impl Driver {
    pub fn rpc(
        addr: String,
        key: stampfs_proto::ClusterKey,
        creds: stampfs_proto::Credentials,
    ) -> Self {
        Driver::Rpc(Arc::new(Pool {
            addr,
            key,
            creds,
            idle: Mutex::new(Vec::new()),
        }))
    }

    /// Sends one request and returns its reply.
    pub async fn call<R: Serve>(&self, req: R) -> Result<R::Response> {
        match self {
            Driver::Service(core) => {
                // What the connection handler does first.
                core.check_running().map_err(|e| anyhow!(e.to_remote()))?;
                req.serve(core).await.map_err(|e| anyhow!(e.to_remote()))
            }
            Driver::Rpc(pool) => {
                let conn = pool.idle.lock().ok().and_then(|mut v| v.pop());
                let mut conn = match conn {
                    Some(c) => c,
                    None => {
                        let mut c = RpcClient::connect(
                            &Dialer::plain(),
                            &pool.addr,
                            Duration::from_secs(10),
                        )
                        .await?;
                        stampfs_proto::auth::authenticate_chunkserver(&mut c, &pool.key).await?;
                        stampfs_proto::auth::authenticate_client(&mut c, &pool.creds).await?;
                        c
                    }
                };
                match conn.call(req).await {
                    Ok(r) => {
                        pool.put(conn);
                        Ok(r)
                    }
                    Err(stampfs_proto::Error::Remote(e)) => {
                        pool.put(conn);
                        Err(anyhow!(e))
                    }
                    Err(e) => Err(anyhow!(e)),
                }
            }
        }
    }
}

impl Pool {
    fn put(&self, conn: RpcClient) {
        if let Ok(mut v) = self.idle.lock() {
            v.push(conn);
        }
    }
}
