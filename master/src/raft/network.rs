//! The network between members. A group of one has no peers and openraft never asks
//! for a connection; peers and their RPCs come with the group of several (increment 2
//! of docs/openraft-plan.md). Until then a connection asked for answers every RPC with
//! `Unreachable`, naming why.

use super::wire::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use super::{MasterNode, NodeId, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};

/// Makes [`Peer`]s.
#[derive(Clone, Debug, Default)]
pub struct Network;

/// A connection to another member.
#[derive(Clone, Debug)]
pub struct Peer {
    target: NodeId,
    addr: String,
}

impl Peer {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, MasterNode, E> {
        let why = std::io::Error::other(format!(
            "member {} at {}: this master serves a group of one and talks to no other member",
            self.target, self.addr
        ));
        RPCError::Unreachable(Unreachable::new(&why))
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &MasterNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError<NodeId, MasterNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse,
        RPCError<NodeId, MasterNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest,
        _option: RPCOption,
    ) -> Result<VoteResponse, RPCError<NodeId, MasterNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
