//! The ADS stream IO: connect to a control node, subscribe, hand each batch of responses to
//! [`State`], send the ACKs/NACKs the subscription state machine returns, persist what was
//! accepted; on any error move to the next control node. A push that fails validation is held
//! unanswered for a moment (`HOLD`) in case the push of another type completes it. Every decision (what to apply, what
//! to answer, which versions to resume from) is made by pure code; this file only moves bytes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use weft_xds::subscription::{SotwClient, Verdict};
use weft_xds::transport::{AggregatedDiscoveryServiceClient, DiscoveryRequest, DiscoveryResponse, Node};
use weft_xds::typeurl;

use super::convert::SUBSCRIBED;
use super::state::State;
use super::{XdsOptions, disk};
use crate::Shared;

/// After a response, how long to wait for more before deciding: the server pushes every type
/// of a revision back to back, and applying them together avoids NACKing a cluster whose
/// endpoints are one message behind.
const BATCH_WINDOW: Duration = Duration::from_millis(20);
/// How long a push that fails validation waits, unanswered, for the pushes of other types
/// that may complete it (a cluster whose endpoints come in the next message or revision)
/// before it is NACKed. A NACKed version is never pushed again, so NACKing too early would
/// leave the sidecar without that change until the type changes again.
const HOLD: Duration = Duration::from_secs(1);
/// Most responses decided together (one per subscribed type is the useful maximum).
const BATCH_MAX: usize = 8;
/// A control node that does not accept a connection within this is treated as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 pings detect a control node that vanished without closing the connection.
const KEEPALIVE: Duration = Duration::from_secs(10);
/// A stream that ends sooner than this after it opened counts as a failed attempt, even if
/// pushes arrived: a control node that crash-loops (or drops every stream after its first push)
/// is then retried with backoff rather than at once, forever.
const STABLE: Duration = Duration::from_secs(5);
/// A full config can be large (thousands of endpoints); tonic's 4 MiB default is too small.
const MAX_MESSAGE: usize = 64 << 20;

/// Exponential backoff between connection rounds, with jitter so thousands of sidecars that
/// lost the same control node do not come back in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max, next: base }
    }

    /// The delay before the next attempt (without jitter); doubles up to `max`.
    pub fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.base;
    }
}

/// Jitter: somewhere in the upper half of `d`.
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}

pub struct Client {
    sh: Arc<Shared>,
    opts: XdsOptions,
    node: Node,
    state: State,
    sotw: SotwClient,
    /// Whether the subscriptions were sent once (later streams resume with `reconnect`).
    subscribed: bool,
}

impl Client {
    pub fn new(sh: Arc<Shared>, opts: XdsOptions, node: Node) -> Client {
        // The config being served when the client starts is the bootstrap (bound addresses).
        let bootstrap = sh.snapshot.load().config.clone();
        Client {
            sh,
            node: node.clone(),
            opts,
            state: State::new(bootstrap),
            sotw: SotwClient::new(node),
            subscribed: false,
        }
    }

    /// Runs forever: restore the disk cache, then connect, stream, fail over, back off.
    pub async fn run(mut self) {
        self.restore();
        let mut backoff = Backoff::new(self.opts.backoff_base, self.opts.backoff_max);
        let servers = self.opts.servers.clone();
        let mut failed_in_a_row = 0;
        for addr in servers.iter().cycle() {
            let mut received = false;
            let opened = Instant::now();
            let err = self.session(addr, &mut received).await;
            if received && opened.elapsed() >= STABLE {
                // It worked for a while: start over with short delays.
                backoff.reset();
                failed_in_a_row = 0;
                tracing::warn!(control = %addr, error = %err, "xDS stream ended; failing over");
            } else {
                failed_in_a_row += 1;
                let what = if received { "xDS stream ended soon after it opened" } else { "xDS control node unavailable" };
                tracing::warn!(control = %addr, error = %err, "{what}");
            }
            // Try every node once before waiting, so failover to a live node is immediate.
            if failed_in_a_row >= servers.len() {
                failed_in_a_row = 0;
                let wait = jitter(backoff.step());
                tracing::info!(
                    wait_ms = wait.as_millis() as u64,
                    version = self.sh.snapshot.load().version,
                    "no xDS control node reachable; serving the last good config"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// Serves the saved config, if any, until a control node answers: better than the bare
    /// bootstrap after a restart, and replaced within one round trip when a node is up.
    fn restore(&mut self) {
        let Some(path) = self.opts.cache_path.clone() else { return };
        let sh = self.sh.clone();
        match disk::load(&path, &self.node.id) {
            Ok(None) => {}
            Ok(Some(saved)) => match self.state.restore(saved, |cfg| sh.apply(cfg)) {
                Ok(v) => tracing::info!(path = %path.display(), version = v, "serving the saved xDS config"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "saved xDS config rejected; serving the bootstrap")
                }
            },
            Err(e) => tracing::warn!(error = %e, "ignoring the xDS cache"),
        }
    }

    /// One ADS stream to `addr`, until it fails. Returns why it ended.
    async fn session(&mut self, addr: &str, received: &mut bool) -> String {
        let tune = |e: Endpoint| e.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).http2_keep_alive_interval(KEEPALIVE).keep_alive_timeout(KEEPALIVE);
        let channel = match super::dial::channel(addr, &self.opts.tls, tune).await {
            Ok(c) => c,
            Err(e) => return e,
        };
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(BATCH_MAX * 2);
        let opening = if self.subscribed {
            self.sotw.reconnect()
        } else {
            self.subscribed = true;
            let mut v: Vec<DiscoveryRequest> = SUBSCRIBED.iter().map(|t| self.sotw.subscribe(t, vec![])).collect();
            // A training sidecar also wants its job's shard map (and only that one).
            if let Some(t) = &self.sh.training {
                v.push(self.sotw.subscribe(typeurl::SHARD_MAP, vec![t.job()]));
            }
            v
        };
        for request in opening {
            // The channel is empty and larger than the number of subscribed types.
            let _ = tx.try_send(request);
        }
        // Heartbeats and load reports ride on the same connection, for as long as the session.
        let reports = tokio::spawn(super::report::keep_running(
            channel.clone(),
            self.sh.clone(),
            self.node.id.clone(),
            self.opts.registration.clone(),
            self.opts.report_interval,
        ));
        let _stop_reports = AbortOnDrop(reports);
        let mut ads = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        let mut inbound = match ads.stream_aggregated_resources(ReceiverStream::new(rx)).await {
            Ok(r) => r.into_inner(),
            Err(status) => return format!("cannot open the ADS stream: {status}"),
        };
        tracing::info!(control = %addr, "xDS stream open");
        // Pushes that failed validation and are not answered yet (see `HOLD`).
        let mut held: Vec<(DiscoveryResponse, String)> = Vec::new();
        let mut hold_until: Option<Instant> = None;
        loop {
            let next = match hold_until {
                None => Some(inbound.message().await),
                Some(t) => tokio::time::timeout_at(t, inbound.message()).await.ok(),
            };
            let first = match next {
                // Nothing arrived that could fix the held pushes: NACK them now.
                None => {
                    hold_until = None;
                    let answers = held.drain(..).map(|(r, e)| (r, Err(e))).collect();
                    if let Err(why) = send_all(&tx, self.answer(answers)).await {
                        return why;
                    }
                    continue;
                }
                Some(Ok(Some(r))) => r,
                Some(Ok(None)) => return "the control node closed the stream".into(),
                Some(Err(status)) => return format!("stream error: {status}"),
            };
            let mut batch = vec![first];
            let mut ended = None;
            while batch.len() < BATCH_MAX {
                match tokio::time::timeout(BATCH_WINDOW, inbound.message()).await {
                    Err(_) => break,
                    Ok(Ok(Some(r))) => batch.push(r),
                    Ok(Ok(None)) => ended = Some("the control node closed the stream".to_string()),
                    Ok(Err(status)) => ended = Some(format!("stream error: {status}")),
                }
                if ended.is_some() {
                    break;
                }
            }
            *received = true;
            // Shard maps are the trainer's, not routing config: decided on their own.
            let (maps, mut batch): (Vec<_>, Vec<_>) = batch.into_iter().partition(|r| r.type_url == typeurl::SHARD_MAP);
            if let Some(t) = &self.sh.training {
                let answers = maps.into_iter().map(|r| {
                    let v = t.absorb(&r.resources);
                    (r, v)
                });
                if let Err(why) = send_all(&tx, self.answer(answers.collect())).await {
                    return why;
                }
            }
            batch.retain(|r| {
                let ours = SUBSCRIBED.contains(&r.type_url.as_str());
                if !ours {
                    // Unsolicited: answering would claim a verdict on something never asked for.
                    tracing::warn!(type_url = %r.type_url, "ignoring a response for a type not subscribed to");
                }
                ours
            });
            // Held pushes are decided again with the new ones: these may be what they lacked.
            let all: Vec<DiscoveryResponse> = held.drain(..).map(|(r, _)| r).chain(batch).collect();
            let verdicts = self.apply(&all);
            let mut answers = Vec::with_capacity(all.len());
            for (response, verdict) in all.into_iter().zip(verdicts) {
                match verdict {
                    Err(e) if hold_until.is_none_or(|t| Instant::now() < t) => held.push((response, e)),
                    verdict => answers.push((response, verdict)),
                }
            }
            hold_until = if held.is_empty() { None } else { hold_until.or(Some(Instant::now() + HOLD)) };
            // Answered even if the stream just ended: the state machine then resumes from them.
            if let Err(why) = send_all(&tx, self.answer(answers)).await {
                return why;
            }
            if let Some(why) = ended {
                return why;
            }
        }
    }

    /// Applies what can be applied of `batch` (see [`State::absorb`]), saves the result to
    /// disk, and returns one verdict per response.
    fn apply(&mut self, batch: &[DiscoveryResponse]) -> Vec<Verdict> {
        if batch.is_empty() {
            return Vec::new();
        }
        let sh = self.sh.clone();
        let outcome = self.state.absorb(batch, |cfg| sh.apply(cfg));
        if let Some(version) = outcome.applied {
            tracing::info!(version, "xDS config applied");
            if let Some(path) = &self.opts.cache_path
                && let Err(e) = disk::save(path, &self.node.id, self.state.accepted())
            {
                tracing::warn!(error = %e, "the last good xDS config was not saved");
            }
        }
        outcome.verdicts
    }

    /// The ACK or NACK of each response, from the subscription state machine.
    fn answer(&mut self, answers: Vec<(DiscoveryResponse, Verdict)>) -> Vec<DiscoveryRequest> {
        let mut requests = Vec::with_capacity(answers.len());
        for (response, verdict) in answers {
            if let Err(e) = &verdict {
                tracing::error!(type_url = %response.type_url, version = %response.version_info, error = %e,
                    "xDS push rejected (NACK); still serving version {}", self.sh.snapshot.load().version);
            }
            match self.sotw.on_response(&response, verdict) {
                Ok(request) => requests.push(request),
                Err(e) => tracing::warn!(error = %e, "not answering"),
            }
        }
        requests
    }
}

/// Ends the report stream when the ADS session it belongs to ends.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn send_all(tx: &mpsc::Sender<DiscoveryRequest>, requests: Vec<DiscoveryRequest>) -> Result<(), String> {
    for request in requests {
        tx.send(request).await.map_err(|_| "the ADS request stream closed".to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        let steps: Vec<u64> = (0..7).map(|_| b.step().as_millis() as u64).collect();
        assert_eq!(steps, vec![250, 500, 1000, 2000, 4000, 5000, 5000]);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(250));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for _ in 0..100 {
            let j = jitter(Duration::from_millis(1000));
            assert!(j >= Duration::from_millis(500) && j <= Duration::from_millis(1000), "{j:?}");
        }
    }
}
