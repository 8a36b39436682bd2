//! The agent's ADS stream: a State-of-the-World subscription to every `weft.v1.Placement`
//! (weft's own subscription state machine), the latest accepted set handed to the loop through
//! a watch channel. A push that does not decode is NACKed and the previous set kept. The
//! stream fails over between the control nodes given and reconnects with backoff forever; while
//! it is down the loop keeps what it has (nothing stops because the control plane is away).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use weft_proxy::xds::client::Backoff;
use weft_proxy::xds::dial::{self, ControlTls};
use weft_xds::resources::{from_any, v1};
use weft_xds::subscription::SotwClient;
use weft_xds::transport::{AggregatedDiscoveryServiceClient, DiscoveryResponse, node};
use weft_xds::typeurl::PLACEMENT;

/// Placement sets as they arrive (`None` until the first one).
pub type Placements = watch::Receiver<Option<Arc<Vec<v1::Placement>>>>;

/// Decodes every resource of a placement push, or says which one does not decode.
fn decode(response: &DiscoveryResponse) -> Result<Vec<v1::Placement>, String> {
    response
        .resources
        .iter()
        .enumerate()
        .map(|(i, any)| from_any::<v1::Placement>(any).map_err(|e| format!("resource {i}: {e}")))
        .collect()
}

/// Spawns the stream; `connected` says whether it is up now.
pub fn spawn(servers: Vec<String>, tls: ControlTls, node_id: String, connected: Arc<AtomicBool>) -> Placements {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut sotw = SotwClient::new(node(node_id));
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
        let mut first = true;
        for addr in servers.iter().cycle() {
            let initial = if first { vec![sotw.subscribe(PLACEMENT, vec![])] } else { sotw.reconnect() };
            first = false;
            match stream(addr, &tls, &mut sotw, initial, &tx, &connected, &mut backoff).await {
                Err(e) => eprintln!("weft-agent: xDS {addr}: {e}"),
                Ok(()) => return,
            }
            connected.store(false, Ordering::SeqCst);
            tokio::time::sleep(backoff.step()).await;
        }
    });
    rx
}

/// One ADS stream to `addr`, until it breaks (`Err`) or the loop is gone (`Ok`).
async fn stream(
    addr: &str,
    tls: &ControlTls,
    sotw: &mut SotwClient,
    initial: Vec<weft_xds::transport::DiscoveryRequest>,
    placements: &watch::Sender<Option<Arc<Vec<v1::Placement>>>>,
    connected: &AtomicBool,
    backoff: &mut Backoff,
) -> Result<(), String> {
    let channel = dial::channel(addr, tls, |e| e.connect_timeout(Duration::from_secs(3)).tcp_nodelay(true)).await?;
    let (tx, rx) = mpsc::channel(8);
    for r in initial {
        let _ = tx.try_send(r);
    }
    let mut inbound = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("cannot open the ADS stream: {s}"))?
        .into_inner();
    loop {
        let response = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err("the control node closed the stream".into()),
            Err(s) => return Err(format!("stream error: {s}")),
        };
        connected.store(true, Ordering::SeqCst);
        backoff.reset();
        let decoded = decode(&response);
        let verdict = decoded.as_ref().map(drop).map_err(Clone::clone);
        let Ok(answer) = sotw.on_response(&response, verdict) else { continue };
        match decoded {
            Ok(list) => {
                if placements.send(Some(Arc::new(list))).is_err() {
                    return Ok(());
                }
            }
            Err(e) => eprintln!("weft-agent: NACKed placements version {}: {e}", response.version_info),
        }
        if tx.send(answer).await.is_err() {
            return Err("the request stream closed".into());
        }
    }
}
