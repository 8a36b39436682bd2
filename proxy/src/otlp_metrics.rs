//! Metrics over OTLP (`telemetry.otlp.metrics_interval`): every interval the exporter thread
//! reads the same registry `/metrics` serves and sends it as OTLP metrics — counters as
//! cumulative monotonic sums, gauges as gauges, histograms as explicit-bucket histograms —
//! so both views show the same instruments with the same names and labels.
//!
//! The registry is read through its Prometheus text (the exposition format is the one stable
//! interface the `metrics` exporter offers); [`convert`] is the pure translation. A failed
//! export is counted (`weft_otlp_metric_exports_total{result="failed"}`) and the next interval
//! sends the cumulative values again, so nothing is lost but resolution.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::Counter;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::watch;
use tonic::metadata::MetadataMap;

/// One sample line: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses `name{k="v",...} value` (labels optional); `None` for anything else.
fn sample(line: &str) -> Option<Sample> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let Some(open) = head.find('{') else { return Some((head.to_owned(), Vec::new(), value)) };
    let name = head[..open].to_owned();
    let body = head[open + 1..].strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut val = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_owned(), val));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name, labels, value))
}

fn attrs(labels: &[(String, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue { key: k.clone(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.clone())) }), ..Default::default() })
        .collect()
}

fn point(labels: &[(String, String)], v: f64, start: u64, now: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attrs(labels),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(v)),
        ..Default::default()
    }
}

/// The Prometheus text `text` as OTLP metrics, cumulative since `start` (unix ns), read at `now`.
pub fn convert(text: &str, start: u64, now: u64) -> Vec<Metric> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut help: BTreeMap<String, String> = BTreeMap::new();
    let mut samples: Vec<Sample> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((n, t)) = rest.split_once(' ') {
                types.insert(n.to_owned(), t.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((n, h)) = rest.split_once(' ') {
                help.insert(n.to_owned(), h.to_owned());
            }
        } else if !line.starts_with('#')
            && let Some(s) = sample(line)
        {
            samples.push(s);
        }
    }
    let mut out = Vec::new();
    for (name, kind) in &types {
        let description = help.get(name).cloned().unwrap_or_default();
        let data = match kind.as_str() {
            "counter" | "gauge" => {
                let points: Vec<NumberDataPoint> =
                    samples.iter().filter(|(n, _, _)| n == name).map(|(_, l, v)| point(l, *v, start, now)).collect();
                if points.is_empty() {
                    continue;
                }
                if kind == "counter" {
                    metric::Data::Sum(Sum { data_points: points, aggregation_temporality: AggregationTemporality::Cumulative as i32, is_monotonic: true })
                } else {
                    metric::Data::Gauge(Gauge { data_points: points })
                }
            }
            "histogram" => {
                let points = histogram(name, &samples, start, now);
                if points.is_empty() {
                    continue;
                }
                metric::Data::Histogram(Histogram { data_points: points, aggregation_temporality: AggregationTemporality::Cumulative as i32 })
            }
            _ => continue, // summaries: weft registers none
        };
        out.push(Metric { name: name.clone(), description, data: Some(data), ..Default::default() });
    }
    out
}

/// A histogram's series (`_bucket{le}`, `_sum`, `_count`) grouped by their other labels.
fn histogram(name: &str, samples: &[Sample], start: u64, now: u64) -> Vec<HistogramDataPoint> {
    let (bucket, sum, count) = (format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count"));
    // labels (without le) → (le → cumulative count, sum, count)
    let mut series: BTreeMap<Vec<(String, String)>, (Vec<(f64, f64)>, f64, f64)> = BTreeMap::new();
    for (n, labels, v) in samples {
        if n == &bucket {
            let le = labels.iter().find(|(k, _)| k == "le").and_then(|(_, v)| if v == "+Inf" { Some(f64::INFINITY) } else { v.parse().ok() });
            let rest: Vec<(String, String)> = labels.iter().filter(|(k, _)| k != "le").cloned().collect();
            if let Some(le) = le {
                series.entry(rest).or_default().0.push((le, *v));
            }
        } else if n == &sum {
            series.entry(labels.clone()).or_default().1 = *v;
        } else if n == &count {
            series.entry(labels.clone()).or_default().2 = *v;
        }
    }
    series
        .into_iter()
        .map(|(labels, (mut buckets, s, c))| {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let bounds: Vec<f64> = buckets.iter().map(|b| b.0).filter(|b| b.is_finite()).collect();
            // Cumulative counts → per-bucket counts, with the overflow bucket last.
            let mut counts = Vec::with_capacity(bounds.len() + 1);
            let mut below = 0.0;
            for (le, cum) in &buckets {
                if le.is_finite() {
                    counts.push((cum - below).max(0.0) as u64);
                    below = *cum;
                }
            }
            counts.push((c - below).max(0.0) as u64);
            HistogramDataPoint {
                attributes: attrs(&labels),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: c as u64,
                sum: Some(s),
                bucket_counts: counts,
                explicit_bounds: bounds,
                ..Default::default()
            }
        })
        .collect()
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

/// What the metrics loop needs from the exporter.
pub(crate) struct MetricsJob {
    pub exposition: crate::telemetry::Exposition,
    pub interval: Duration,
    pub ok: Counter,
    pub failed: Counter,
}

/// Sends the registry every interval until `stop`; runs on the exporter thread's runtime.
pub(crate) async fn run(
    job: MetricsJob,
    channel: tonic::transport::Channel,
    md: MetadataMap,
    resource: Resource,
    scope: InstrumentationScope,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let start = unix_ns(SystemTime::now());
    let mut client = MetricsServiceClient::new(channel);
    let mut tick = tokio::time::interval(job.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let metrics = convert(&job.exposition.render(), start, unix_ns(SystemTime::now()));
        let body = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(resource.clone()),
                scope_metrics: vec![ScopeMetrics { scope: Some(scope.clone()), metrics, ..Default::default() }],
                ..Default::default()
            }],
        };
        let mut req = tonic::Request::new(body);
        *req.metadata_mut() = md.clone();
        match tokio::time::timeout(timeout, client.export(req)).await {
            Ok(Ok(_)) => job.ok.increment(1),
            _ => job.failed.increment(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP weft_requests_total Requests.
# TYPE weft_requests_total counter
weft_requests_total{node="n1",variant="a",route="r \"1\""} 7
weft_requests_total{node="n1",variant="b",route="r2"} 3
# TYPE weft_requests_in_flight gauge
weft_requests_in_flight{cluster="c"} 2
# TYPE weft_request_duration_seconds histogram
weft_request_duration_seconds_bucket{variant="a",le="0.01"} 4
weft_request_duration_seconds_bucket{variant="a",le="0.1"} 6
weft_request_duration_seconds_bucket{variant="a",le="+Inf"} 7
weft_request_duration_seconds_sum{variant="a"} 0.42
weft_request_duration_seconds_count{variant="a"} 7
"#;

    fn label(kvs: &[KeyValue], k: &str) -> String {
        match kvs.iter().find(|kv| kv.key == k).and_then(|kv| kv.value.as_ref()?.value.clone()) {
            Some(any_value::Value::StringValue(s)) => s,
            other => panic!("{k}: {other:?}"),
        }
    }

    #[test]
    fn counters_gauges_and_histograms_keep_their_names_labels_and_values() {
        let m = convert(TEXT, 1, 2);
        let by = |n: &str| m.iter().find(|x| x.name == n).unwrap_or_else(|| panic!("{n} missing"));
        let Some(metric::Data::Sum(sum)) = &by("weft_requests_total").data else { panic!("counter → sum") };
        assert!(sum.is_monotonic && sum.aggregation_temporality == AggregationTemporality::Cumulative as i32);
        assert_eq!(sum.data_points.len(), 2);
        let a = &sum.data_points[0];
        assert_eq!((label(&a.attributes, "variant"), label(&a.attributes, "route")), ("a".into(), "r \"1\"".into()));
        assert_eq!(a.value, Some(number_data_point::Value::AsDouble(7.0)));
        assert_eq!((a.start_time_unix_nano, a.time_unix_nano), (1, 2));
        assert_eq!(by("weft_requests_total").description, "Requests.");
        assert!(matches!(&by("weft_requests_in_flight").data, Some(metric::Data::Gauge(g)) if g.data_points.len() == 1));
        let Some(metric::Data::Histogram(h)) = &by("weft_request_duration_seconds").data else { panic!("histogram") };
        let p = &h.data_points[0];
        assert_eq!((p.count, p.sum, p.explicit_bounds.clone(), p.bucket_counts.clone()), (7, Some(0.42), vec![0.01, 0.1], vec![4, 2, 1]));
        assert_eq!(label(&p.attributes, "variant"), "a");
        assert!(p.attributes.iter().all(|kv| kv.key != "le"));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        assert!(sample("weft_x{a=\"1\" 3").is_none());
        assert!(sample("weft_x{a=1} 3").is_none());
        assert_eq!(sample("weft_y 4"), Some(("weft_y".into(), vec![], 4.0)));
        assert!(convert("# TYPE weft_z counter\nweft_z{a=\"1\"} not-a-number\n", 0, 0).is_empty());
    }
}
