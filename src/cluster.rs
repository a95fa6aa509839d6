//! [`LocalCluster`]: a master and chunkservers in this process on loopback, sharing
//! one cluster key, with their data under one directory. Used by `stampfs dev`, the
//! demo and the benchmarks.

use anyhow::{Context, Result};
use stampfs_chunkserver::{ChunkserverConfig, ChunkserverHandle};
use stampfs_master::{MasterConfig, MasterHandle};
use std::path::{Path, PathBuf};

/// Adjusts a chunkserver's configuration before it starts.
type ChunkserverTweak = Box<dyn Fn(&mut ChunkserverConfig) + Send>;

/// Builds a [`LocalCluster`].
pub struct LocalClusterBuilder {
    dir: PathBuf,
    chunkservers: usize,
    master: MasterConfig,
    chunkserver_tweak: Option<ChunkserverTweak>,
}

impl LocalClusterBuilder {
    /// Number of chunkservers (default 3).
    pub fn chunkservers(mut self, n: usize) -> Self {
        self.chunkservers = n;
        self
    }

    /// Where the master listens (default: any free loopback port).
    pub fn master_listen(mut self, addr: &str) -> Self {
        self.master.listen = addr.to_string();
        self
    }

    /// Adjusts the master's configuration.
    pub fn master_config(mut self, f: impl FnOnce(&mut MasterConfig)) -> Self {
        f(&mut self.master);
        self
    }

    /// Adjusts every chunkserver's configuration.
    pub fn chunkserver_config(
        mut self,
        f: impl Fn(&mut ChunkserverConfig) + Send + 'static,
    ) -> Self {
        self.chunkserver_tweak = Some(Box::new(f));
        self
    }

    /// Starts the master, then the chunkservers, and waits until all are registered.
    pub async fn start(self) -> Result<LocalCluster> {
        let master = stampfs_master::start(self.master.clone())
            .await
            .context("starting the master")?;
        let master_addr = master.addr().to_string();
        let key_file = self.master.key_file();
        let mut chunkservers = Vec::new();
        for i in 0..self.chunkservers {
            let mut cfg = ChunkserverConfig::new(
                self.dir.join(format!("cs{i}")),
                master_addr.clone(),
                key_file.clone(),
            );
            if let Some(tweak) = &self.chunkserver_tweak {
                tweak(&mut cfg);
            }
            let cs = stampfs_chunkserver::start(cfg)
                .await
                .with_context(|| format!("starting chunkserver {i}"))?;
            chunkservers.push(cs);
        }
        let cluster = LocalCluster {
            dir: self.dir,
            master,
            chunkservers,
        };
        cluster.wait_registered().await?;
        Ok(cluster)
    }
}

/// A running in-process cluster.
pub struct LocalCluster {
    dir: PathBuf,
    master: MasterHandle,
    chunkservers: Vec<ChunkserverHandle>,
}

impl LocalCluster {
    /// A builder for a cluster with its data under `dir`.
    pub fn builder(dir: &Path) -> LocalClusterBuilder {
        let mut master = MasterConfig::new(dir.join("master"));
        master.listen = "127.0.0.1:0".into();
        LocalClusterBuilder {
            dir: dir.to_path_buf(),
            chunkservers: 3,
            master,
            chunkserver_tweak: None,
        }
    }

    /// The master's address.
    pub fn master_addr(&self) -> String {
        self.master.addr().to_string()
    }

    /// The chunkservers' addresses.
    pub fn chunkserver_addrs(&self) -> Vec<String> {
        self.chunkservers
            .iter()
            .map(|c| c.addr().to_string())
            .collect()
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn wait_registered(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if self.chunkservers.iter().all(|c| c.id().is_some()) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("chunkservers did not register with the master within 20 s");
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Stops the chunkservers, then the master.
    pub async fn shutdown(self) -> Result<()> {
        for cs in self.chunkservers {
            cs.shutdown().await.context("stopping a chunkserver")?;
        }
        self.master
            .shutdown()
            .await
            .context("stopping the master")?;
        Ok(())
    }
}
