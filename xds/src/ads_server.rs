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
    AggregatedDiscoveryService, DeltaDiscoveryRequest, DeltaDiscoveryResponse,
    DiscoveryRequest, DiscoveryResponse,
};

/// Responses queued per stream before the stream task waits for the client to read.
const STREAM_BUFFER: usize = 16;

/// gRPC codec buffers per stream. tonic's default is 8 KiB each way, held for the life of the
/// stream; an ADS request (an ACK) is a few hundred bytes and a push grows the buffer to its
/// own size when larger, so 1 KiB saves ~14 KiB per connected sidecar (the control plane's
/// memory is mostly per-connection buffers).
const CODEC_BUFFER: usize = 1024;

/// Serves State-of-the-World and Delta ADS streams from one [`Cache`].
#[derive(Clone)]
pub struct AdsServer {
    cache: Cache,
}

impl AdsServer {
    pub fn new(cache: Cache) -> Self {
        AdsServer { cache }
    }

    /// The tonic service to add to a `tonic::transport::Server`: Envoy's ADS service (same
    /// paths and messages as `AggregatedDiscoveryServiceServer`) with small codec buffers.
    pub fn into_service(self) -> AdsService {
        AdsService { inner: Arc::new(self) }
    }
}

/// The ADS gRPC service (see [`AdsServer::into_service`]). Written out rather than generated
/// only to choose the codec's buffer sizes, which the generated server does not expose.
#[derive(Clone)]
pub struct AdsService {
    inner: Arc<AdsServer>,
}

impl tonic::server::NamedService for AdsService {
    const NAME: &'static str = envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::SERVICE_NAME;
}

/// Prost encoding with [`CODEC_BUFFER`]-sized buffers.
struct SmallCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> tonic::codec::Codec for SmallCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <tonic_prost::ProstCodec<T, U> as tonic::codec::Codec>::Encoder;
    type Decoder = <tonic_prost::ProstCodec<T, U> as tonic::codec::Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<T, U>::raw_encoder(Self::settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<T, U>::raw_decoder(Self::settings())
    }
}

impl<T, U> SmallCodec<T, U> {
    fn new() -> Self {
        SmallCodec(std::marker::PhantomData)
    }

    fn settings() -> tonic::codec::BufferSettings {
        tonic::codec::BufferSettings::new(CODEC_BUFFER, 32 * 1024)
    }
}

const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The two ADS methods, adapted to tonic's streaming-service trait.
macro_rules! ads_method {
    ($name:ident, $req:ty, $resp:ty, $call:ident) => {
        struct $name(Arc<AdsServer>);

        impl tonic::server::StreamingService<$req> for $name {
            type Response = $resp;
            type ResponseStream = Outbound<$resp>;
            type Future = tonic::codegen::BoxFuture<Response<Self::ResponseStream>, Status>;

            fn call(&mut self, request: Request<Streaming<$req>>) -> Self::Future {
                let inner = self.0.clone();
                Box::pin(async move { inner.$call(request).await })
            }
        }
    };
}

ads_method!(SotwMethod, DiscoveryRequest, DiscoveryResponse, stream_aggregated_resources);
ads_method!(DeltaMethod, DeltaDiscoveryRequest, DeltaDiscoveryResponse, delta_aggregated_resources);

impl<B> tonic::codegen::Service<http::Request<B>> for AdsService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                Ok(tonic::server::Grpc::new(SmallCodec::new()).streaming(SotwMethod(inner), req).await)
            }),
            DELTA_PATH => Box::pin(async move {
                Ok(tonic::server::Grpc::new(SmallCodec::new()).streaming(DeltaMethod(inner), req).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such ADS method").into_http()) }),
        }
    }
}

/// A stream's responses. Queued boxed: tokio's channel allocates its slots in blocks of 32,
/// and an unboxed `Result<DiscoveryResponse, Status>` slot is a few hundred bytes.
type Outbound<R> = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<R, Status>> + Send>>;
type Queued<R> = Result<Box<R>, Box<Status>>;

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

fn spawn<M: Mode>(cache: Cache, inbound: Streaming<M::Request>) -> Outbound<M::Response>
where
    M::Response: Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Queued<M::Response>>(STREAM_BUFFER);
    tokio::spawn(async move {
        if let Err(status) = serve::<M>(&cache, inbound, &tx).await {
            // The client may be gone already; nothing more to do either way.
            let _ = tx.send(Err(Box::new(status))).await;
        }
    });
    Box::pin(tokio_stream::StreamExt::map(ReceiverStream::new(rx), |r| r.map(|b| *b).map_err(|s| *s)))
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
    tx: &mpsc::Sender<Queued<M::Response>>,
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
                if let Err(status) = crate::stream::check_type(M::type_url(&request)) {
                    cache.unknown_type();
                    tracing::warn!(node = %connection.node_id, type_url = M::type_url(&request), "refused a subscription to a type this control plane does not serve");
                    return Err(status);
                }
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
        if let Some(c) = &connection {
            for r in &responses {
                let (type_url, version) = M::describe(r);
                cache.pushed(&c.node_id, type_url, version);
            }
        }
        if send_all(tx, responses).await.is_err() {
            return Ok(());
        }
    }
}

async fn send_all<R>(tx: &mpsc::Sender<Queued<R>>, responses: Vec<R>) -> Result<(), Closed> {
    for response in responses {
        tx.send(Ok(Box::new(response))).await.map_err(|_| Closed)?;
    }
    Ok(())
}
