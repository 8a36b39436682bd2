//! The sidecar's report stream to the control node it is connected to, beside the ADS stream
//! on the same gRPC connection: the first report registers the inbound endpoint this sidecar
//! fronts (if configured), and every `interval` a report carries a heartbeat (for the control
//! plane's phi-accrual fault detector) and the per-variant load since the previous report;
//! a training sidecar's reports also carry its trainer's state (`training`).
//!
//! The stream lives and dies with the ADS session: when the control node goes, both end and
//! the next session (possibly on another node) registers again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use weft_xds::resources::v1;
use weft_xds::resources::v1::sidecar_reports_client::SidecarReportsClient;

use crate::Shared;
use crate::telemetry::{VariantKey, VariantTotals};

/// A variant's gauges now: requests in flight and requests queued for a slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub in_flight: u32,
    pub queued: u32,
}

/// The load since `before`, one entry per (experiment, variant) that saw requests or has some
/// in flight or queued now (a variant busy with long streams is not idle).
pub fn load_delta(
    before: &BTreeMap<VariantKey, VariantTotals>,
    now: &BTreeMap<VariantKey, VariantTotals>,
    gauges: &BTreeMap<VariantKey, Gauges>,
) -> Vec<v1::VariantLoad> {
    let keys: std::collections::BTreeSet<&VariantKey> = now.keys().chain(gauges.keys()).collect();
    let zero = VariantTotals::default();
    keys.into_iter()
        .filter_map(|key| {
            let t = now.get(key).unwrap_or(&zero);
            let b = before.get(key).unwrap_or(&zero);
            let g = gauges.get(key).copied().unwrap_or_default();
            let requests = t.requests.saturating_sub(b.requests);
            (requests > 0 || g != Gauges::default()).then(|| v1::VariantLoad {
                experiment: key.0.clone(),
                variant: key.1.clone(),
                requests,
                errors: t.errors.saturating_sub(b.errors),
                latency_ms_sum: t.latency_us.saturating_sub(b.latency_us) as f64 / 1000.0,
                in_flight: g.in_flight,
                queued: g.queued,
                latency: (requests > 0).then(|| t.latency.since(&b.latency).to_proto()),
                input_tokens: t.input_tokens.saturating_sub(b.input_tokens),
                output_tokens: t.output_tokens.saturating_sub(b.output_tokens),
                ttfb: (requests > 0).then(|| t.ttfb.since(&b.ttfb).to_proto()).filter(|s| s.counts.iter().any(|c| *c > 0) || s.zero_count > 0),
            })
        })
        .collect()
}

/// Per-variant gauges of the experiments in the running config.
fn gauges(sh: &Shared) -> BTreeMap<VariantKey, Gauges> {
    let snap = sh.snapshot.load();
    let mut out: BTreeMap<VariantKey, Gauges> = BTreeMap::new();
    for e in snap.experiments.iter() {
        for v in &e.variants {
            let g = out.entry((e.name.to_string(), v.name.to_string())).or_default();
            g.in_flight += v.limiter.in_flight();
            g.queued += v.limiter.pending();
        }
    }
    out
}

/// Runs the report stream on `channel` for as long as the session lasts, reopening it when it
/// ends (the first report of each stream registers again). Without this, a report stream that
/// failed on its own left the ADS stream up but sent no more heartbeats: the control plane's
/// failure detector then took this sidecar's endpoints out of every other sidecar's rotation.
pub async fn keep_running(
    channel: Channel,
    sh: Arc<Shared>,
    node_id: String,
    registration: Option<v1::Registration>,
    interval: Duration,
) {
    let mut failures = 0u32;
    loop {
        let started = tokio::time::Instant::now();
        let why = run(channel.clone(), sh.clone(), node_id.clone(), registration.clone(), interval).await;
        // A stream that lasted a few intervals worked: retry soon. Otherwise back off, up to
        // 8 intervals, so a control node that refuses reports is not hammered.
        failures = if started.elapsed() > interval * 4 { 1 } else { (failures + 1).min(4) };
        let wait = interval.mul_f64(f64::from(1u32 << (failures - 1)) * rand::random_range(0.5..1.0));
        tracing::warn!(error = %why, wait_ms = wait.as_millis() as u64, "report stream ended; reopening it");
        tokio::time::sleep(wait).await;
    }
}

/// Runs the report stream on `channel` until it fails; returns why.
pub async fn run(
    channel: Channel,
    sh: Arc<Shared>,
    node_id: String,
    registration: Option<v1::Registration>,
    interval: Duration,
) -> String {
    let (tx, rx) = mpsc::channel::<v1::SidecarReport>(4);
    let mut client = SidecarReportsClient::new(channel);
    let mut last = sh.telemetry.variant_totals();
    let training = |sh: &Shared| sh.training.as_ref().map(|t| t.report());
    let first = v1::SidecarReport { node_id: node_id.clone(), registration, seq: 1, load: vec![], training: training(&sh), identity: identity(&sh) };
    let _ = tx.try_send(first);
    let mut acks = match client.report(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) => return format!("cannot open the report stream: {status}"),
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut seq = 1;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                seq += 1;
                let now = sh.telemetry.variant_totals();
                let load = load_delta(&last, &now, &gauges(&sh));
                let report = v1::SidecarReport { node_id: node_id.clone(), registration: None, seq, load, training: training(&sh), identity: identity(&sh) };
                last = now;
                if tx.send(report).await.is_err() {
                    return "report stream closed".into();
                }
            }
            ack = acks.message() => match ack {
                Ok(Some(_)) => {}
                Ok(None) => return "the control node closed the report stream".into(),
                Err(status) => return format!("report stream error: {status}"),
            },
        }
    }
}

/// The sidecar's identity and current certificate, for `weftctl proxy-status`.
fn identity(sh: &Shared) -> Option<v1::IdentityReport> {
    let mesh = sh.tls.mesh.as_ref()?;
    let secs = |t| crate::tls::unix_secs(t) as i64;
    let cur = mesh.current();
    Some(v1::IdentityReport {
        spiffe_id: mesh.id().map(|i| i.to_string()).unwrap_or_default(),
        not_before: cur.as_ref().map_or(0, |c| secs(c.not_before)),
        not_after: cur.as_ref().map_or(0, |c| secs(c.not_after)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_is_the_difference_between_readings() {
        let t = |requests, errors, latency_us, ms: &[f64]| {
            let mut latency = crate::sketch::LogSketch::new();
            for v in ms {
                latency.add(*v);
            }
            VariantTotals { requests, errors, latency_us, latency, ..Default::default() }
        };
        let k = |v: &str| ("e".to_string(), v.to_string());
        let before = BTreeMap::from([(k("a"), t(10, 1, 5_000, &[1.0])), (k("b"), t(4, 0, 1_000, &[2.0]))]);
        let now = BTreeMap::from([
            (k("a"), t(15, 3, 9_000, &[1.0, 40.0, 40.0])),
            (k("b"), t(4, 0, 1_000, &[2.0])),
            (k("c"), t(2, 0, 500, &[3.0])),
        ]);
        let d = load_delta(&before, &now, &BTreeMap::new());
        let got: Vec<_> = d.iter().map(|l| (l.experiment.as_str(), l.variant.as_str(), l.requests, l.errors, l.latency_ms_sum)).collect();
        assert_eq!(got, vec![("e", "a", 5, 2, 4.0), ("e", "c", 2, 0, 0.5)], "idle variants are left out");
        let sketch = crate::sketch::LogSketch::from_proto(d[0].latency.as_ref().unwrap()).unwrap();
        assert_eq!(sketch.count(), 2, "the interval's latencies only");
        let streaming = BTreeMap::from([(k("b"), Gauges { in_flight: 3, queued: 1 })]);
        let d = load_delta(&before, &now, &streaming);
        let got: Vec<_> = d.iter().map(|l| (l.variant.as_str(), l.requests, l.in_flight, l.queued, l.latency.is_some())).collect();
        assert_eq!(got, vec![("a", 5, 0, 0, true), ("b", 0, 3, 1, false), ("c", 2, 0, 0, true)], "a variant with streams open is reported");
    }
}

