//! Simulated sidecars for `xds-fanout`: N in-process ADS clients, each on its own TCP
//! connection to one control node, driven by weft's real subscription state machine
//! ([`SotwClient`]), reporting the instant each one ACKs each version of the cluster type.
//!
//! They do what weft-proxy's xDS client does on the wire (same subscriptions, node id in the
//! first request, decode every resource, ACK with the version and nonce) and nothing else: no
//! config conversion, no 20 ms batching window, no disk cache. What the bench times is
//! therefore the control node's fan-out plus gRPC, not a sidecar's apply path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use weft_xds::resources::{Resource, from_any, v1};
use weft_xds::subscription::{SotwClient, Verdict};
use weft_xds::transport::{AggregatedDiscoveryServiceClient, Any, DiscoveryResponse, node};
use weft_xds::typeurl::{CLUSTER, ENDPOINTS, EXPERIMENT, SERVICE};

use crate::stats::percentile;

/// The types a weft sidecar subscribes to (weft-proxy's `xds::convert::SUBSCRIBED`).
pub const SUBSCRIBED: &[&str] = &[CLUSTER, ENDPOINTS, EXPERIMENT, SERVICE];

/// Requests a sidecar may queue before the transport takes them: the four subscriptions fit.
const OUTBOUND: usize = 8;

/// How the fleet connects.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    pub sidecars: usize,
    /// Sidecars connecting (TCP + HTTP/2 handshake + first push of every type) at once, so
    /// bringing up 10,000 is a steady stream rather than a SYN storm.
    pub connect_concurrency: usize,
    /// Longest wait for the whole fleet to connect and ACK its first config.
    pub connect_patience: Duration,
}

/// What a sidecar task tells the fleet: progress, or why it stopped (the sidecar is gone).
type Report = Result<Event, Failure>;

enum Event {
    /// Every subscribed type is ACKed once: the sidecar runs the initial config.
    Synced,
    /// An ACK of the cluster type was handed to the transport at `at`.
    Acked {
        sidecar: usize,
        version: u64,
        at: Instant,
    },
}

struct Failure {
    sidecar: usize,
    error: String,
}

/// How long a change took to reach the fleet, from the instant before it was triggered.
#[derive(Clone, Copy, Debug)]
pub struct Convergence {
    /// Until the last sidecar ACKed: the fan-out time the bench reports.
    pub all: Duration,
    /// Until half of the sidecars ACKed (the median sidecar).
    pub half: Duration,
}

/// N connected sidecars. Dropping the fleet aborts every task, which closes every connection.
pub struct Fleet {
    size: usize,
    events: mpsc::UnboundedReceiver<Report>,
    /// Per sidecar: the last cluster version it ACKed (0 = none yet).
    acked: Vec<u64>,
    _tasks: JoinSet<()>,
}

impl Fleet {
    /// Connects `options.sidecars` sidecars to `xds` and returns once every one of them has
    /// ACKed every subscribed type; an error if one fails or the patience runs out.
    pub async fn connect(xds: SocketAddr, options: &FleetOptions) -> Result<Fleet> {
        let endpoint = Endpoint::from_shared(format!("http://{xds}"))?
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true);
        let gate = Arc::new(Semaphore::new(options.connect_concurrency.max(1)));
        let (tx, events) = mpsc::unbounded_channel();
        let mut tasks = JoinSet::new();
        for sidecar in 0..options.sidecars {
            let (endpoint, gate, tx) = (endpoint.clone(), gate.clone(), tx.clone());
            tasks.spawn(async move {
                let error = run_sidecar(sidecar, endpoint, gate, &tx).await;
                let _ = tx.send(Err(Failure { sidecar, error }));
            });
        }
        let mut fleet = Fleet {
            size: options.sidecars,
            events,
            acked: vec![0; options.sidecars],
            _tasks: tasks,
        };
        let deadline = Instant::now() + options.connect_patience;
        let mut synced = 0;
        while synced < fleet.size {
            match fleet.next_event(deadline).await? {
                None => bail!(
                    "{synced} of {} sidecars connected and ACKed their first config within {:?}",
                    fleet.size,
                    options.connect_patience
                ),
                Some(Event::Synced) => synced += 1,
                Some(Event::Acked {
                    sidecar, version, ..
                }) => {
                    fleet.record_ack(sidecar, version);
                }
            }
        }
        Ok(fleet)
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits until every sidecar has ACKed a cluster version ≥ `revision` (the type version a
    /// commit at `revision` produces) and times that from `since`, the instant before the
    /// change was triggered.
    pub async fn converge(
        &mut self,
        revision: u64,
        since: Instant,
        patience: Duration,
    ) -> Result<Convergence> {
        let deadline = Instant::now() + patience;
        // Sidecars not there yet: all of them, unless a report raced ahead of an earlier wait.
        let behind = self.acked.iter().filter(|&&v| v < revision).count();
        let mut latencies: Vec<f64> = Vec::with_capacity(behind);
        while latencies.len() < behind {
            match self.next_event(deadline).await? {
                None => bail!(
                    "{} of {} sidecars ACKed revision {revision} within {patience:?}",
                    self.size - behind + latencies.len(),
                    self.size
                ),
                Some(Event::Acked {
                    sidecar,
                    version,
                    at,
                }) => {
                    if self.record_ack(sidecar, version) < revision && version >= revision {
                        latencies.push(at.saturating_duration_since(since).as_secs_f64());
                    }
                }
                Some(Event::Synced) => {}
            }
        }
        latencies.sort_by(f64::total_cmp);
        // (`max` maps the NaN of an empty list, all sidecars already there, to zero.)
        let at = |q| Duration::from_secs_f64(percentile(&latencies, q).max(0.0));
        Ok(Convergence {
            all: at(1.0),
            half: at(0.5),
        })
    }

    /// Notes a sidecar's ACK of cluster `version`; returns the version it had ACKed before.
    fn record_ack(&mut self, sidecar: usize, version: u64) -> u64 {
        let last = &mut self.acked[sidecar];
        std::mem::replace(last, (*last).max(version))
    }

    /// The next event; `None` at the deadline; an error when a sidecar failed (a lost sidecar
    /// would make every later wait run out its patience).
    async fn next_event(&mut self, deadline: Instant) -> Result<Option<Event>> {
        match tokio::time::timeout_at(deadline, self.events.recv()).await {
            Err(_) => Ok(None),
            Ok(None) => bail!("every sidecar task ended"),
            Ok(Some(Ok(event))) => Ok(Some(event)),
            Ok(Some(Err(Failure { sidecar, error }))) => bail!("sidecar {sidecar}: {error}"),
        }
    }
}

/// One sidecar: connect (holding a slot of the connect gate until synced), subscribe to every
/// type, then answer each push. Returns why it stopped.
async fn run_sidecar(
    sidecar: usize,
    endpoint: Endpoint,
    gate: Arc<Semaphore>,
    events: &mpsc::UnboundedSender<Report>,
) -> String {
    let Ok(mut slot) = gate.acquire_owned().await.map(Some) else {
        return "the connect gate closed".into();
    };
    // Its own connection: `connect` dials a new HTTP/2 connection for every channel.
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(e) => return format!("cannot connect: {e}"),
    };
    let mut sotw = SotwClient::new(node(format!("sidecar-{sidecar:05}")));
    let (tx, rx) = mpsc::channel(OUTBOUND);
    for type_url in SUBSCRIBED {
        // The channel is empty and holds more than the subscriptions.
        let _ = tx.try_send(sotw.subscribe(type_url, vec![]));
    }
    let mut inbound = match AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return format!("cannot open the ADS stream: {status}"),
    };
    loop {
        let response = match inbound.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return "the control node closed the stream".into(),
            Err(status) => return format!("stream error: {status}"),
        };
        let verdict = validate(&response);
        let rejected = verdict.clone().err();
        let Ok(answer) = sotw.on_response(&response, verdict) else {
            // Unsolicited type: answering would claim a verdict on something never asked for.
            continue;
        };
        if tx.send(answer).await.is_err() {
            return "the request stream closed".into();
        }
        if let Some(error) = rejected {
            // The bench's mesh is valid: a NACK is a bug worth stopping for, not a data point.
            return format!(
                "NACKed {} version {}: {error}",
                response.type_url, response.version_info
            );
        }
        if response.type_url == CLUSTER {
            let Ok(version) = response.version_info.parse() else {
                return format!(
                    "cluster version {:?} is not a revision",
                    response.version_info
                );
            };
            let _ = events.send(Ok(Event::Acked {
                sidecar,
                version,
                at: Instant::now(),
            }));
        }
        if slot.is_some()
            && SUBSCRIBED
                .iter()
                .all(|t| sotw.acked_version(t).is_some_and(|v| !v.is_empty()))
        {
            slot = None;
            let _ = events.send(Ok(Event::Synced));
        }
    }
}

/// A sidecar's check of a push, reduced to what costs the same: every resource must decode as
/// the type it claims. (The mesh the bench serves is valid, so a NACK means a real bug.)
fn validate(response: &DiscoveryResponse) -> Verdict {
    fn decodes<R: Resource>(any: &Any) -> Verdict {
        from_any::<R>(any).map(drop).map_err(|e| e.to_string())
    }
    response
        .resources
        .iter()
        .try_for_each(|any| match any.type_url.as_str() {
            CLUSTER => decodes::<v1::Cluster>(any),
            ENDPOINTS => decodes::<v1::Endpoints>(any),
            EXPERIMENT => decodes::<v1::Experiment>(any),
            SERVICE => decodes::<v1::Service>(any),
            other => Err(format!("unexpected resource type {other}")),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tonic::transport::Server;
    use tonic::transport::server::TcpIncoming;
    use weft_xds::resources::to_any;
    use weft_xds::{AdsServer, Cache, Resources};

    const PATIENCE: Duration = Duration::from_secs(10);

    async fn serve(cache: Cache) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::builder().add_service(AdsServer::new(cache).into_service());
        tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
        addr
    }

    fn cluster(idle: u64) -> Resources {
        let mut r = Resources::new();
        r.add(&v1::Cluster {
            name: "a".into(),
            max_idle_per_endpoint: Some(idle),
            ..Default::default()
        });
        r
    }

    fn options(sidecars: usize) -> FleetOptions {
        FleetOptions {
            sidecars,
            connect_concurrency: 4,
            connect_patience: PATIENCE,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_sidecar_is_its_own_node_and_a_change_is_timed_to_the_last_ack() {
        let cache = Cache::new(Duration::ZERO);
        cache.set(1, cluster(1)).unwrap();
        let mut fleet = Fleet::connect(serve(cache.clone()).await, &options(20))
            .await
            .unwrap();
        assert_eq!(cache.node_statuses().len(), 20, "distinct node ids");

        let since = Instant::now();
        cache.set(2, cluster(2)).unwrap();
        let c = fleet.converge(2, since, PATIENCE).await.unwrap();
        assert!(c.half <= c.all && c.all < PATIENCE);
        assert_eq!(fleet.acked, vec![2; 20]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejected_push_stops_the_measurement_with_the_reason() {
        let cache = Cache::new(Duration::ZERO);
        cache.set(1, cluster(1)).unwrap();
        let mut fleet = Fleet::connect(serve(cache.clone()).await, &options(3))
            .await
            .unwrap();
        let mut bad = Resources::new();
        bad.insert(
            CLUSTER,
            "a",
            Any {
                type_url: CLUSTER.into(),
                value: vec![0xff; 3],
            },
        );
        cache.set(2, bad).unwrap();
        let err = fleet
            .converge(2, Instant::now(), PATIENCE)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("NACKed") && err.contains(CLUSTER), "{err}");
    }

    #[test]
    fn validation_decodes_each_resource_as_the_type_it_claims() {
        let response = |any| DiscoveryResponse {
            resources: vec![any],
            ..Default::default()
        };
        assert!(validate(&response(to_any(&v1::Service::default()))).is_ok());
        assert!(
            validate(&response(Any {
                type_url: SERVICE.into(),
                value: vec![0xff; 3]
            }))
            .is_err()
        );
        assert!(
            validate(&response(Any {
                type_url: "type.googleapis.com/x".into(),
                value: vec![]
            }))
            .is_err()
        );
    }
}
