//! Traffic shadowing: a copy of a sampled request goes to the shadow cluster in its own task.
//! The copy waits for the primary to finish reading the request body (bounded by
//! `max_body_bytes` and the shadow timeout), so the primary never waits for the shadow. Its
//! response is read to the end, measured (labelled `shadow="true"`) and discarded. Copies count
//! against the shadow cluster like any request: its `max_requests` and error-rate breaker can
//! skip them, and their outcomes (answers, connect failures, resets; not the shadow's own
//! timeout) feed its breaker, outlier detection and load balancer.

use bytes::Bytes;
use http_body_util::BodyExt;
use metrics::Label;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use crate::body::ReqBody;
use crate::outlier::Outcome;
use crate::proxy::{Held, Prepared, ReqParts};
use crate::snapshot::{ShadowRt, Snapshot};
use crate::telemetry::{self, Labels};
use crate::Shared;

/// Shadow copies in flight per proxy; beyond this, copies are skipped rather than queued.
pub const MAX_IN_FLIGHT: usize = 1024;

#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn(
    sh: &Arc<Shared>,
    snap: &Arc<Snapshot>,
    s: &ShadowRt,
    parts: &http::request::Parts,
    headers: &crate::headers::ReqHeaders,
    authority: &bytes::Bytes,
    traceparent: [u8; 55],
    body: &Prepared,
    primary: &Labels,
    span: Option<crate::otlp::ChildSpan>,
) {
    let skip = |reason: &'static str| {
        sh.telemetry.counter("weft_shadow_skipped_total", vec![Label::new("reason", reason)]).increment(1);
    };
    let recorder = body.recorder().cloned();
    if !body.is_empty() && recorder.is_none() {
        return skip("body_too_large");
    }
    if sh.shadows_in_flight.fetch_add(1, Relaxed) >= MAX_IN_FLIGHT {
        sh.shadows_in_flight.fetch_sub(1, Relaxed);
        return skip("too_many_in_flight");
    }
    let cluster = snap.clusters[s.cluster].clone();
    let mut headers = headers.clone();
    let (k, v) = crate::proxy::shadow_header();
    headers.insert(k, v);
    headers.remove(&http::HeaderName::from_static("x-weft-variant"));
    let mut traceparent = traceparent;
    if let Some(s) = &span {
        s.set_traceparent(&mut traceparent);
    }
    let mut req = ReqParts {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        headers,
        authority: authority.clone(),
        traceparent,
        variant: None,
        span: None,
        upgrade: None,
    };
    let mut labels = primary.clone();
    labels.variant = s.variant.clone().into();
    labels.cluster = cluster.name.clone().into();
    labels.shadow = true;
    let timeout = s.timeout;
    let max_body = s.max_body_bytes;
    let sh = sh.clone();
    tokio::spawn(async move {
        let start = Instant::now();
        let run = async {
            let data = match &recorder {
                None => Bytes::new(),
                // The recorder's limit may be the retry buffer's, if larger: hold the shadow's.
                Some(r) => r.wait_complete(timeout).await.filter(|d| d.len() <= max_body).ok_or("body_too_large")?,
            };
            // The shadow cluster's own thresholds and breaker hold for copies too: a shadow
            // must not overload the candidate it is evaluating.
            let now = crate::clock::now_ms();
            let mut probe = crate::proxy::admit(&cluster, now).map_err(|o| {
                cluster.count_overflow(o);
                o.as_str()
            })?;
            let ep_i = cluster.pick(&[], now).ok_or("no_healthy_endpoint")?;
            let ep = &cluster.endpoints[ep_i];
            let _held = Held::take(&cluster, ep_i);
            let sent = Instant::now();
            let exchange = async {
                let conn = ep.pool().checkout(ep.addr, &cluster.dial(ep)).await.map_err(|_| "connect_failure")?;
                let max_idle = cluster.cfg.max_idle_per_endpoint;
                let resp = crate::proxy::send(conn, ep, max_idle, &mut req, ReqBody::full(data), true).await.map_err(|_| "reset")?;
                ep.load.finished(sent, false);
                let status = resp.status().as_u16();
                // Read to the end (the connection can then be reused), one frame at a time: the
                // answer is only measured, so none of it is kept.
                let mut body = resp.into_body();
                while let Some(Ok(_)) = body.frame().await {}
                Ok::<_, &'static str>(status)
            };
            let outcome = tokio::time::timeout_at((start + timeout).into(), exchange).await.unwrap_or(Err("timeout"));
            let verdict = match outcome {
                Ok(status) => Some(Outcome::from_status(status)),
                Err("connect_failure" | "reset") => {
                    ep.load.finished(sent, true);
                    Some(Outcome::GatewayError)
                }
                // The shadow's own time limit (often shorter than a route's) is not evidence
                // against the endpoint: a cluster that also serves primary traffic must not
                // eject endpoints, or open its breaker, because copies gave up early.
                Err(_) => None,
            };
            if let Some(v) = verdict {
                cluster.record(ep_i, v, probe.verdict(), crate::clock::now_ms());
            }
            Ok::<_, &'static str>((outcome?, ep.label.clone()))
        };
        let result = tokio::time::timeout(timeout, run).await.unwrap_or(Err("timeout"));
        match result {
            Ok((status, endpoint)) => {
                labels.status_class = telemetry::status_class(status);
                labels.endpoint = endpoint.into();
                if let Some(s) = span {
                    s.finish(&labels, Ok(status));
                }
            }
            Err(reason @ ("body_too_large" | "max_requests" | "breaker_open")) => {
                // Never sent: not a shadow request, just a skipped one.
                sh.telemetry.counter("weft_shadow_skipped_total", vec![Label::new("reason", reason)]).increment(1);
                sh.shadows_in_flight.fetch_sub(1, Relaxed);
                return;
            }
            Err(reason) => {
                labels.status_class = "5xx";
                tracing::debug!(reason, "shadow copy failed");
                if let Some(s) = span {
                    s.finish(&labels, Err(reason));
                }
            }
        }
        sh.telemetry.finish(&labels, start.elapsed(), 0);
        sh.shadows_in_flight.fetch_sub(1, Relaxed);
    });
}
