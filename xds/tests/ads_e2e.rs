//! End-to-end: the ADS server over real gRPC on loopback, and clients driven by the
//! subscription state machines. Each test walks a protocol story: subscribe → receive → ACK,
//! a rejected push → NACK → no re-push of that version → the next revision arrives, and a
//! reconnect that resumes from what the client already runs.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use weft_xds::cache::NodeStatus;
use weft_xds::resources::{from_any, v1};
use weft_xds::subscription::{DeltaClient, SotwClient, Verdict};
use weft_xds::transport::{
    AggregatedDiscoveryServiceClient, Any, DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest,
    DiscoveryResponse, node,
};
use weft_xds::typeurl::{CLUSTER, ENDPOINTS, LISTENER};
use weft_xds::{AdsServer, Cache, Resources};

/// Generous bound on any single wait; the tests normally take milliseconds per step.
const PATIENCE: Duration = Duration::from_secs(10);

async fn start(cache: Cache) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::builder().add_service(AdsServer::new(cache).into_service());
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

/// One open ADS stream: requests go in through `tx`, responses come out of `rx`.
struct Ads<Req, Resp> {
    tx: mpsc::Sender<Req>,
    rx: Streaming<Resp>,
}

impl<Req, Resp> Ads<Req, Resp> {
    async fn send(&self, request: Req) {
        self.tx.send(request).await.expect("stream open");
    }

    async fn next(&mut self) -> Resp {
        tokio::time::timeout(PATIENCE, self.rx.message())
            .await
            .expect("no response in time")
            .expect("stream error")
            .expect("stream closed")
    }
}

async fn client(addr: SocketAddr) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await.unwrap()
}

async fn open_sotw(addr: SocketAddr) -> Ads<DiscoveryRequest, DiscoveryResponse> {
    let (tx, rx) = mpsc::channel(16);
    let rx = client(addr).await.stream_aggregated_resources(ReceiverStream::new(rx)).await.unwrap().into_inner();
    Ads { tx, rx }
}

async fn open_delta(addr: SocketAddr) -> Ads<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
    let (tx, rx) = mpsc::channel(16);
    let rx = client(addr).await.delta_aggregated_resources(ReceiverStream::new(rx)).await.unwrap().into_inner();
    Ads { tx, rx }
}

/// The sidecar's validation stand-in: a cluster whose name starts with "bad" is invalid.
fn validate<'a>(resources: impl IntoIterator<Item = &'a Any>) -> Verdict {
    for any in resources {
        if any.type_url == CLUSTER {
            let cluster = from_any::<v1::Cluster>(any).map_err(|e| e.to_string())?;
            if cluster.name.starts_with("bad") {
                return Err(format!("cluster {}: invalid", cluster.name));
            }
        }
    }
    Ok(())
}

/// Clusters `(name, idle)`: changing `idle` changes the resource body.
fn config(clusters: &[(&str, u64)], listeners: &[&str]) -> Resources {
    let mut r = Resources::new();
    for (name, idle) in clusters {
        r.add(&v1::Cluster { name: (*name).into(), max_idle_per_endpoint: Some(*idle), ..Default::default() });
    }
    for name in listeners {
        r.add(&v1::Listener { name: (*name).into(), address: "127.0.0.1:0".into(), ..Default::default() });
    }
    r
}

/// Polls the cache's view of a node until `done` holds (the server records ACKs/NACKs
/// asynchronously to the client sending them).
async fn wait_status(cache: &Cache, node_id: &str, done: impl Fn(&NodeStatus) -> bool) -> NodeStatus {
    let poll = async {
        loop {
            if let Some(status) = cache.node_status(node_id).filter(|s| done(s)) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(PATIENCE, poll).await.expect("node status never reached the expected state")
}

fn acked(type_url: &'static str, version: &'static str) -> impl Fn(&NodeStatus) -> bool {
    move |s| s.acked.get(type_url).map(String::as_str) == Some(version)
}

fn cluster_names(resources: &[Any]) -> BTreeSet<String> {
    resources.iter().map(|a| from_any::<v1::Cluster>(a).unwrap().name).collect()
}

/// Receives one SotW response, validates it and sends the ACK or NACK the state machine says.
async fn sotw_step(ads: &mut Ads<DiscoveryRequest, DiscoveryResponse>, client: &mut SotwClient) -> DiscoveryResponse {
    let response = ads.next().await;
    let request = client.on_response(&response, validate(&response.resources)).expect("subscribed type");
    ads.send(request).await;
    response
}

async fn delta_step(
    ads: &mut Ads<DeltaDiscoveryRequest, DeltaDiscoveryResponse>,
    client: &mut DeltaClient,
) -> DeltaDiscoveryResponse {
    let response = ads.next().await;
    let verdict = validate(response.resources.iter().filter_map(|r| r.resource.as_ref()));
    let request = client.on_response(&response, verdict).expect("subscribed type");
    ads.send(request).await;
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_ack_nack_no_repush_and_resume() {
    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, config(&[("a", 1), ("b", 1)], &[])).unwrap();
    let addr = start(cache.clone()).await;
    let mut sidecar = SotwClient::new(node("sidecar-1"));
    let mut ads = open_sotw(addr).await;
    ads.send(sidecar.subscribe(CLUSTER, vec![])).await;
    ads.send(sidecar.subscribe(LISTENER, vec![])).await;

    // Subscribe → receive → ACK, for both types (listeners exist in no revision yet).
    let first = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!((first.type_url.as_str(), first.version_info.as_str()), (CLUSTER, "1"));
    assert_eq!(cluster_names(&first.resources), BTreeSet::from(["a".into(), "b".into()]));
    let second = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!((second.type_url.as_str(), second.version_info.as_str()), (LISTENER, "0"));
    assert!(second.resources.is_empty());
    wait_status(&cache, "sidecar-1", acked(CLUSTER, "1")).await;

    // A push the sidecar rejects: NACK with error_detail, recorded per node.
    cache.set(2, config(&[("a", 1), ("b", 1), ("bad", 1)], &[])).unwrap();
    let rejected = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!(rejected.version_info, "2");
    let status = wait_status(&cache, "sidecar-1", |s| s.nacked.contains_key(CLUSTER)).await;
    assert_eq!(status.nacked[CLUSTER].version, 2);
    assert!(status.nacked[CLUSTER].error.contains("cluster bad"), "{:?}", status.nacked);
    assert_eq!(status.acked[CLUSTER], "1");
    assert_eq!(sidecar.acked_version(CLUSTER), Some("1"));

    // Revision 3 changes only listeners: clusters stay at the NACKed version and are not
    // pushed again, so the next response is the listener one.
    cache.set(3, config(&[("a", 1), ("b", 1), ("bad", 1)], &["l1"])).unwrap();
    let listeners = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!((listeners.type_url.as_str(), listeners.version_info.as_str()), (LISTENER, "3"));

    // Revision 4 fixes the clusters: pushed and ACKed.
    cache.set(4, config(&[("a", 1), ("c", 1)], &["l1"])).unwrap();
    let fixed = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!((fixed.type_url.as_str(), fixed.version_info.as_str()), (CLUSTER, "4"));
    assert_eq!(cluster_names(&fixed.resources), BTreeSet::from(["a".into(), "c".into()]));
    wait_status(&cache, "sidecar-1", acked(CLUSTER, "4")).await;

    // Reconnect: the sidecar resends its ACKed versions and gets nothing it already runs.
    // A new subscription on the same stream is answered after the resumed ones, so if the
    // server re-pushed clusters or listeners, those responses would arrive first.
    drop(ads);
    let mut ads = open_sotw(addr).await;
    for request in sidecar.reconnect() {
        assert_ne!(request.version_info, "", "resume carries the last ACKed version");
        ads.send(request).await;
    }
    ads.send(sidecar.subscribe(ENDPOINTS, vec![])).await;
    let next = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!((next.type_url.as_str(), next.version_info.as_str()), (ENDPOINTS, "0"));

    // And the resumed stream still receives new revisions.
    cache.set(5, config(&[("a", 2), ("c", 1)], &["l1"])).unwrap();
    let update = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!((update.type_url.as_str(), update.version_info.as_str()), (CLUSTER, "5"));
    wait_status(&cache, "sidecar-1", acked(CLUSTER, "5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_sends_changes_only_nacks_and_resumes_with_initial_versions() {
    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, config(&[("a", 1), ("b", 1)], &[])).unwrap();
    let addr = start(cache.clone()).await;
    let mut sidecar = DeltaClient::new(node("sidecar-2"));
    let mut ads = open_delta(addr).await;
    ads.send(sidecar.subscribe(CLUSTER, vec![])).await;
    ads.send(sidecar.subscribe(LISTENER, vec![])).await;

    let first = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!(first.type_url, CLUSTER);
    assert_eq!(names(&first), (vec![("a".into(), "1".into()), ("b".into(), "1".into())], vec![]));
    let empty = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!((empty.type_url.as_str(), names(&empty)), (LISTENER, (vec![], vec![])));

    // Only what changed: b's body and the new c; a is not resent.
    cache.set(2, config(&[("a", 1), ("b", 2), ("c", 1)], &[])).unwrap();
    let changed = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!(names(&changed), (vec![("b".into(), "2".into()), ("c".into(), "2".into())], vec![]));
    wait_status(&cache, "sidecar-2", acked(CLUSTER, "2")).await;

    // Rejected: a bad cluster added and c removed. The sidecar keeps its versions.
    cache.set(3, config(&[("a", 1), ("b", 2), ("bad", 1)], &[])).unwrap();
    let rejected = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!(names(&rejected), (vec![("bad".into(), "3".into())], vec!["c".into()]));
    let status = wait_status(&cache, "sidecar-2", |s| s.nacked.contains_key(CLUSTER)).await;
    assert_eq!(status.nacked[CLUSTER].version, 3);
    assert!(status.nacked[CLUSTER].error.contains("cluster bad"));

    // Listeners change, clusters do not: no cluster push at the NACKed version.
    cache.set(4, config(&[("a", 1), ("b", 2), ("bad", 1)], &["l1"])).unwrap();
    let listeners = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!((listeners.type_url.as_str(), names(&listeners)), (LISTENER, (vec![("l1".into(), "4".into())], vec![])));

    // The fix: a changes, bad goes; c is removed again because the NACK kept it.
    cache.set(5, config(&[("a", 2), ("b", 2)], &["l1"])).unwrap();
    let fixed = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!(names(&fixed), (vec![("a".into(), "5".into())], vec!["c".into()]));
    wait_status(&cache, "sidecar-2", acked(CLUSTER, "5")).await;
    let held: Vec<(String, String)> = sidecar.versions(CLUSTER).unwrap().clone().into_iter().collect();
    assert_eq!(held, vec![("a".into(), "5".into()), ("b".into(), "2".into())]);

    // Reconnect with initial_resource_versions: both types answered, nothing resent.
    drop(ads);
    let mut ads = open_delta(addr).await;
    for request in sidecar.reconnect() {
        ads.send(request).await;
    }
    for _ in 0..2 {
        let resumed = delta_step(&mut ads, &mut sidecar).await;
        assert_eq!(names(&resumed), (vec![], vec![]), "{} resent on resume", resumed.type_url);
    }
    cache.set(6, config(&[("a", 2), ("b", 3)], &["l1"])).unwrap();
    let update = delta_step(&mut ads, &mut sidecar).await;
    assert_eq!(names(&update), (vec![("b".into(), "6".into())], vec![]));
}

fn names(r: &DeltaDiscoveryResponse) -> (Vec<(String, String)>, Vec<String>) {
    let updated = r.resources.iter().map(|x| (x.name.clone(), x.version.clone())).collect();
    (updated, r.removed_resources.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_revisions_within_the_debounce_window_is_one_push() {
    let cache = Cache::new(Duration::from_secs(1));
    cache.set(1, config(&[("a", 1)], &[])).unwrap();
    let addr = start(cache.clone()).await;
    let mut sidecar = SotwClient::new(node("sidecar-3"));
    let mut ads = open_sotw(addr).await;
    ads.send(sidecar.subscribe(CLUSTER, vec![])).await;
    assert_eq!(sotw_step(&mut ads, &mut sidecar).await.version_info, "1");
    wait_status(&cache, "sidecar-3", acked(CLUSTER, "1")).await;

    for revision in 2..=4 {
        cache.set(revision, config(&[("a", revision)], &[])).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let push = sotw_step(&mut ads, &mut sidecar).await;
    assert_eq!(push.version_info, "4", "revisions 2 and 3 were coalesced into 4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_node_id_is_refused() {
    let cache = Cache::new(Duration::ZERO);
    cache.set(1, config(&[("a", 1)], &[])).unwrap();
    let addr = start(cache.clone()).await;
    let ads = open_sotw(addr).await;
    ads.send(DiscoveryRequest { type_url: CLUSTER.into(), ..Default::default() }).await;
    let mut rx = ads.rx;
    let err = tokio::time::timeout(PATIENCE, rx.message()).await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(cache.node_statuses().is_empty());
}
