//! A network that reaches nobody. A single-node cluster never sends an RPC, but `Raft::new`
//! needs a factory; the multi-node transport replaces this in a later change.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::types::{Member, NodeId, TypeConfig};

/// Factory whose clients fail every call with `Unreachable`.
#[derive(Debug, Clone, Default)]
pub struct NoNetwork;

/// The (never usable) client `NoNetwork` hands out.
#[derive(Debug, Clone)]
pub struct NoConnection {
    target: NodeId,
}

#[derive(Debug)]
struct NoTransport(NodeId);

impl std::fmt::Display for NoTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no network transport configured (target node {})",
            self.0
        )
    }
}

impl std::error::Error for NoTransport {}

impl NoConnection {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, Member, E> {
        RPCError::Unreachable(Unreachable::new(&NoTransport(self.target)))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoNetwork {
    type Network = NoConnection;

    async fn new_client(&mut self, target: NodeId, _node: &Member) -> Self::Network {
        NoConnection { target }
    }
}

impl RaftNetwork<TypeConfig> for NoConnection {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
