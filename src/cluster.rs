//! [`LocalCluster`]: a master and chunkservers in this process on loopback, sharing
//! one cluster key, with their data under one directory. Used by `stampfs dev`, the
//! demo and the benchmarks.

use crate::tls::Pki;
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
    tls: Option<Pki>,
}

impl LocalClusterBuilder {
    /// Every server serves TLS with `pki`'s certificate and dials TLS trusting its
    /// authority, and so do this cluster's clients ([`LocalCluster::client_with`]).
    pub fn tls(mut self, pki: Pki) -> Self {
        self.master.tls = pki.files();
        self.tls = Some(pki);
        self
    }

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
        let mut configs = Vec::new();
        for i in 0..self.chunkservers {
            let mut cfg = ChunkserverConfig::new(
                self.dir.join(format!("cs{i}")),
                master_addr.clone(),
                key_file.clone(),
            );
            if let Some(pki) = &self.tls {
                cfg.tls = pki.files();
            }
            if let Some(tweak) = &self.chunkserver_tweak {
                tweak(&mut cfg);
            }
            let cs = stampfs_chunkserver::start(cfg.clone())
                .await
                .with_context(|| format!("starting chunkserver {i}"))?;
            chunkservers.push(Some(cs));
            configs.push(cfg);
        }
        let cluster = LocalCluster {
            dir: self.dir,
            master,
            chunkservers,
            configs,
            tls: self.tls,
        };
        cluster.wait_registered().await?;
        Ok(cluster)
    }
}

/// A running in-process cluster.
pub struct LocalCluster {
    dir: PathBuf,
    master: MasterHandle,
    /// `None` while a chunkserver is stopped.
    chunkservers: Vec<Option<ChunkserverHandle>>,
    configs: Vec<ChunkserverConfig>,
    /// The certificates every server serves TLS with, when it does.
    tls: Option<Pki>,
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
            tls: None,
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
            .map(|c| {
                c.as_ref()
                    .map_or_else(|| "(stopped)".into(), |c| c.addr().to_string())
            })
            .collect()
    }

    /// The id chunkserver `i` registered under (while it runs).
    pub fn chunkserver_id(&self, i: usize) -> Option<stampfs_proto::ChunkserverId> {
        self.chunkservers.get(i)?.as_ref()?.id()
    }

    /// The data directory of chunkserver `i`.
    pub fn chunkserver_dir(&self, i: usize) -> Option<&Path> {
        self.configs.get(i).map(|c| c.dir.as_path())
    }

    /// Stops chunkserver `i` cleanly; its data stays.
    pub async fn stop_chunkserver(&mut self, i: usize) -> Result<()> {
        if let Some(cs) = self.chunkservers.get_mut(i).and_then(Option::take) {
            cs.shutdown().await.context("stopping a chunkserver")?;
        }
        Ok(())
    }

    /// Starts chunkserver `i` again on its data directory and waits until it has
    /// registered.
    pub async fn restart_chunkserver(&mut self, i: usize) -> Result<()> {
        let cfg = self
            .configs
            .get(i)
            .cloned()
            .context("no such chunkserver")?;
        self.stop_chunkserver(i).await?;
        let cs = stampfs_chunkserver::start(cfg)
            .await
            .with_context(|| format!("restarting chunkserver {i}"))?;
        self.chunkservers[i] = Some(cs);
        self.wait_registered().await
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The superuser's credentials file, written by the master at its first start.
    pub fn credentials_file(&self) -> PathBuf {
        self.dir
            .join("master")
            .join(stampfs_proto::credentials::ADMIN_CREDENTIALS_FILE)
    }

    /// The certificate authority to dial this cluster with, when it serves TLS.
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls.as_ref().map(|p| p.ca.as_path())
    }

    /// A client of this cluster, as its superuser, with `config` otherwise (and TLS
    /// when the cluster serves it).
    pub async fn client_with(
        &self,
        mut config: stampfs_client::ClientConfig,
    ) -> Result<stampfs_client::Client> {
        let path = self.credentials_file();
        config.credentials = Some(
            stampfs_proto::Credentials::load(&path)
                .with_context(|| format!("reading {}", path.display()))?,
        );
        if let Some(ca) = self.tls_ca() {
            config.dialer = stampfs_proto::net::Dialer::tls(ca)?;
        }
        let master = self.master_addr();
        stampfs_client::Client::connect_with(&master, config)
            .await
            .with_context(|| format!("connecting to the master at {master}"))
    }

    /// A client of this cluster, as its superuser.
    pub async fn client(&self) -> Result<stampfs_client::Client> {
        self.client_with(stampfs_client::ClientConfig::default())
            .await
    }

    async fn wait_registered(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if self.chunkservers.iter().flatten().all(|c| c.id().is_some()) {
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
        for cs in self.chunkservers.into_iter().flatten() {
            cs.shutdown().await.context("stopping a chunkserver")?;
        }
        self.master
            .shutdown()
            .await
            .context("stopping the master")?;
        Ok(())
    }
}
