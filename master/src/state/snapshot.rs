//! The checkpoint payload: encoding the persisted state, and decoding it from this
//! format or any older one still read (see [`SNAPSHOT_FORMAT`]).

use super::*;

impl MasterState {
    /// The checkpoint payload: everything persisted, up to `last_lsn`.
    pub fn encode_snapshot(&self) -> Result<Vec<u8>> {
        let snap = (
            SNAPSHOT_FORMAT,
            self.last_lsn,
            &self.ns,
            &self.chunks,
            &self.servers,
            self.next_server,
            &self.pipelines,
            &self.open_chunks,
            &self.users,
            &self.owners(),
            &self.decommissioning,
            &self.quota_limits(),
        );
        bincode::encode_to_vec(snap, codec_config()).map_err(|e| Error::Codec {
            reason: e.to_string(),
        })
    }

    /// Rebuilds the state from a checkpoint payload. Open files get lease timers that
    /// start at `now_ms`.
    pub fn decode_snapshot(settings: Settings, bytes: &[u8], now_ms: u64) -> Result<Self> {
        type Snap = (
            u32,
            u64,
            Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
            BTreeMap<InodeId, ChunkHandle>,
            BTreeMap<String, User>,
            BTreeMap<ClientId, String>,
            BTreeSet<ChunkserverId>,
            BTreeMap<InodeId, QuotaLimits>,
        );
        type SnapV9 = (
            u32,
            u64,
            Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
            BTreeMap<InodeId, ChunkHandle>,
            BTreeMap<String, User>,
            BTreeMap<ClientId, String>,
            BTreeSet<ChunkserverId>,
        );
        type SnapV8 = (
            u32,
            u64,
            Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
            BTreeMap<InodeId, ChunkHandle>,
            BTreeMap<String, User>,
            BTreeMap<ClientId, String>,
        );
        type SnapV7 = (
            u32,
            u64,
            Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
            BTreeMap<InodeId, ChunkHandle>,
            BTreeMap<String, User>,
        );
        type SnapV6 = (
            u32,
            u64,
            Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
            BTreeMap<InodeId, ChunkHandle>,
        );
        type SnapV5 = (
            u32,
            u64,
            namespace::v5::Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
            BTreeMap<InodeId, ChunkHandle>,
        );
        type SnapV3 = (
            u32,
            u64,
            namespace::v5::Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
            BTreeMap<InodeId, Pipeline>,
        );
        type SnapV2 = (
            u32,
            u64,
            namespace::v5::Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
        );
        type SnapV1 = (
            u32,
            u64,
            namespace::v1::Namespace,
            ChunkTable,
            BTreeMap<ChunkserverId, String>,
            u64,
        );
        let codec = |e: bincode::error::DecodeError| Error::Codec {
            reason: format!("checkpoint: {e}"),
        };
        let (format, _): (u32, usize) =
            bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
        // Checkpoints older than format 3 know no granted pipelines: lease recovery of
        // a file open at the time lets every replica at a recoverable version vote.
        // Checkpoints older than format 4 know no chunk opened before the last: every
        // open file was written in its last chunk.
        let mut users = BTreeMap::new();
        let mut owners = BTreeMap::new();
        let mut decommissioning = BTreeSet::new();
        let mut quotas = BTreeMap::new();
        let (last_lsn, ns, chunks, servers, next_server, pipelines, open_chunks) = match format {
            SNAPSHOT_FORMAT => {
                let (
                    (_, last_lsn, ns, chunks, servers, next_server, pipelines, open, u, o, d, q),
                    _,
                ): (Snap, usize) =
                    bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                users = u;
                owners = o;
                decommissioning = d;
                quotas = q;
                (last_lsn, ns, chunks, servers, next_server, pipelines, open)
            }
            9 => {
                let ((_, last_lsn, ns, chunks, servers, next_server, pipelines, open, u, o, d), _): (
                    SnapV9,
                    usize,
                ) = bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                users = u;
                owners = o;
                decommissioning = d;
                (last_lsn, ns, chunks, servers, next_server, pipelines, open)
            }
            8 => {
                let ((_, last_lsn, ns, chunks, servers, next_server, pipelines, open, u, o), _): (
                    SnapV8,
                    usize,
                ) = bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                users = u;
                owners = o;
                (last_lsn, ns, chunks, servers, next_server, pipelines, open)
            }
            7 => {
                let ((_, last_lsn, ns, chunks, servers, next_server, pipelines, open, u), _): (
                    SnapV7,
                    usize,
                ) = bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                users = u;
                (last_lsn, ns, chunks, servers, next_server, pipelines, open)
            }
            6 => {
                let ((_, last_lsn, ns, chunks, servers, next_server, pipelines, open), _): (
                    SnapV6,
                    usize,
                ) = bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                (last_lsn, ns, chunks, servers, next_server, pipelines, open)
            }
            4 | 5 => {
                let ((_, last_lsn, ns, chunks, servers, next_server, pipelines, open), _): (
                    SnapV5,
                    usize,
                ) = bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                let ns = ns.upgrade().map_err(upgrade_failed)?;
                (last_lsn, ns, chunks, servers, next_server, pipelines, open)
            }
            3 => {
                let ((_, last_lsn, ns, chunks, servers, next_server, pipelines), _): (
                    SnapV3,
                    usize,
                ) = bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                let open = BTreeMap::new();
                (
                    last_lsn,
                    ns.upgrade().map_err(upgrade_failed)?,
                    chunks,
                    servers,
                    next_server,
                    pipelines,
                    open,
                )
            }
            2 => {
                let ((_, last_lsn, ns, chunks, servers, next_server), _): (SnapV2, usize) =
                    bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                let none = BTreeMap::new();
                (
                    last_lsn,
                    ns.upgrade().map_err(upgrade_failed)?,
                    chunks,
                    servers,
                    next_server,
                    none,
                    BTreeMap::new(),
                )
            }
            1 => {
                let ((_, last_lsn, ns, chunks, servers, next_server), _): (SnapV1, usize) =
                    bincode::decode_from_slice(bytes, codec_config()).map_err(codec)?;
                let ns = ns
                    .upgrade(|h| chunks.get(h).map_or(ChunkVersion(0), |c| c.version))
                    .map_err(upgrade_failed)?;
                let none = BTreeMap::new();
                (
                    last_lsn,
                    ns,
                    chunks,
                    servers,
                    next_server,
                    none,
                    BTreeMap::new(),
                )
            }
            other => {
                return Err(Error::Codec {
                    reason: format!("checkpoint format {other} is not {SNAPSHOT_FORMAT}"),
                })
            }
        };
        let mut st = Self::new(settings);
        st.last_lsn = last_lsn;
        st.ns = ns;
        st.chunks = chunks;
        st.servers = servers;
        st.next_server = next_server;
        st.pipelines = pipelines;
        st.open_chunks = open_chunks;
        st.users = users;
        st.owners = owners;
        st.decommissioning = decommissioning;
        st.quotas = quotas
            .into_iter()
            .map(|(ino, limits)| {
                let used = Usage::ZERO;
                (ino, Quota { limits, used })
            })
            .collect();
        st.rebuild_quota_usage();
        let open: Vec<(InodeId, ClientId)> = st
            .ns
            .iter()
            .filter_map(|(ino, i)| i.as_file().and_then(|f| f.writer()).map(|c| (*ino, c)))
            .collect();
        for (ino, client) in open {
            st.leases.acquire(ino, client, now_ms);
        }
        st.recovering = st
            .ns
            .iter()
            .filter(|(_, i)| i.as_file().is_some_and(FileMeta::is_recovering))
            .map(|(ino, _)| *ino)
            .collect();
        Ok(st)
    }
}

impl MasterState {
    /// The persisted part of the quotas: each quota'd directory's limits.
    fn quota_limits(&self) -> BTreeMap<InodeId, QuotaLimits> {
        self.quotas.iter().map(|(i, q)| (*i, q.limits)).collect()
    }
}

/// An older checkpoint's namespace the current form refuses.
fn upgrade_failed(reason: String) -> Error {
    Error::Codec {
        reason: format!("checkpoint namespace: {reason}"),
    }
}
