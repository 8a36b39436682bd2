//! The ADS gRPC service: each client stream becomes a task that feeds requests and new
//! snapshots to the stream's pure [`AdsStream`] state and sends what it returns. This file is
//! only IO; every protocol decision lives in [`crate::stream`].
//!
//! Debouncing: a stream woken by a new revision waits the cache's debounce window before it
//! reads the latest snapshot, so a burst of commits costs each sidecar one push, not many.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::cache::{Cache, NodeStatus, Snapshot};
use crate::stream::{AdsStream, Delta, Mode, Sotw};
use crate::transport::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer, DeltaDiscoveryRequest, DeltaDiscoveryResponse,
    DiscoveryRequest, DiscoveryResponse,
};

/// Responses queued per stream before the stream task waits for the client to read.
const STREAM_BUFFER: usize = 16;

/// Serves State-of-the-World and Delta ADS streams from one [`Cache`].
#[derive(Clone)]
pub struct AdsServer {
    cache: Cache,
}

impl AdsServer {
    pub fn new(cache: Cache) -> Self {
        AdsServer { cache }
    }

    /// The tonic service to add to a `tonic::transport::Server`.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<AdsServer> {
        AggregatedDiscoveryServiceServer::new(self)
    }
}

type Outbound<R> = ReceiverStream<Result<R, Status>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = Outbound<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Outbound<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Ok(Response::new(spawn::<Sotw>(self.cache.clone(), request.into_inner())))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Ok(Response::new(spawn::<Delta>(self.cache.clone(), request.into_inner())))
    }
}

fn spawn<M: Mode>(cache: Cache, inbound: Streaming<M::Request>) -> Outbound<M::Response> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        if let Err(status) = serve::<M>(&cache, inbound, &tx).await {
            // The client may be gone already; nothing more to do either way.
            let _ = tx.send(Err(status)).await;
        }
    });
    ReceiverStream::new(rx)
}

/// A node's stream as counted in the cache's node status; uncounted when the stream ends.
struct Connection {
    cache: Cache,
    node_id: String,
    prior: NodeStatus,
}

impl Connection {
    fn open(cache: &Cache, node_id: &str) -> Self {
        let prior = cache.connect(node_id);
        Connection { cache: cache.clone(), node_id: node_id.to_owned(), prior }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.cache.disconnect(&self.node_id);
    }
}

/// Why a stream loop stopped without an error for the client.
struct Closed;

async fn serve<M: Mode>(
    cache: &Cache,
    mut inbound: Streaming<M::Request>,
    tx: &mpsc::Sender<Result<M::Response, Status>>,
) -> Result<(), Status> {
    let mut snapshots: watch::Receiver<Arc<Snapshot>> = cache.watch();
    snapshots.borrow_and_update();
    let mut state = AdsStream::<M>::default();
    let mut connection: Option<Connection> = None;
    let mut flush_at: Option<Instant> = None;
    loop {
        let responses = tokio::select! {
            message = inbound.message() => {
                let Some(request) = message.ok().flatten() else { return Ok(()) };
                let connection = match &connection {
                    Some(c) => c,
                    None => {
                        let id = M::node_id(&request).filter(|id| !id.is_empty()).ok_or_else(|| {
                            Status::invalid_argument("the first request of a stream must carry node.id")
                        })?;
                        connection.insert(Connection::open(cache, id))
                    }
                };
                let snapshot = snapshots.borrow().clone();
                let reply = state.on_request(request, &snapshot, &connection.prior)?;
                if let Some(feedback) = reply.feedback {
                    cache.record(&connection.node_id, feedback);
                }
                reply.responses
            }
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                snapshots.borrow_and_update();
                flush_at.get_or_insert_with(|| Instant::now() + cache.debounce());
                continue;
            }
            () = sleep_until(flush_at.unwrap_or_else(Instant::now)), if flush_at.is_some() => {
                flush_at = None;
                let snapshot = snapshots.borrow_and_update().clone();
                state.on_snapshot(&snapshot)
            }
        };
        if send_all(tx, responses).await.is_err() {
            return Ok(());
        }
    }
}

async fn send_all<R>(tx: &mpsc::Sender<Result<R, Status>>, responses: Vec<R>) -> Result<(), Closed> {
    for response in responses {
        tx.send(Ok(response)).await.map_err(|_| Closed)?;
    }
    Ok(())
}
