//! Metrics over OTLP (`telemetry.otlp.metrics_interval`): every interval the exporter thread
//! reads the same registry `/metrics` serves and sends it as OTLP metrics — counters as
//! cumulative monotonic sums, gauges as gauges, histograms as explicit-bucket histograms —
//! so both views show the same instruments with the same names and labels.
//!
//! The registry is read through its Prometheus text (the exposition format is the one stable
//! interface the `metrics` exporter offers); [`convert`] is the pure translation. A failed
//! export is counted (`weft_otlp_metric_exports_total{result="failed"}`) and the next interval
//! sends the cumulative values again, so nothing is lost but resolution.
//!
//! Each cumulative series carries its own start time ([`Starts`]): series come and go (the
//! registry drops a series idle for `telemetry.retain_idle`, and one that sees traffic again
//! starts from zero), and an OTLP consumer only knows a cumulative series was reset when its
//! start time moves. With one start for all, a recreated series would read as a counter going
//! backwards, and a delta conversion (the collector's `cumulativetodelta`) would be wrong.

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

/// A cumulative series: metric name and labels (a histogram's without `le`).
type SeriesKey = (String, Vec<(String, String)>);

/// The start time of every cumulative series, kept across exports.
///
/// A series present at the first export counts from the exporter's start. One that appears
/// later, or whose value goes down (it was dropped and recreated, or the process behind it
/// restarted), counts from the previous export: it began somewhere in between, and a start
/// time earlier than its first point is all OTLP asks of it. A series absent from an export is
/// forgotten, so when it comes back it is new.
#[derive(Debug)]
pub struct Starts {
    origin: u64,
    /// The previous export's time; `None` before the first.
    last: Option<u64>,
    /// Series → (start, the value it had: a counter's value, a histogram's count).
    series: BTreeMap<SeriesKey, (u64, f64)>,
    /// Filled during an export; becomes `series` at its end.
    next: BTreeMap<SeriesKey, (u64, f64)>,
}

impl Starts {
    /// Start times for an exporter that began at `origin` (unix ns).
    pub fn new(origin: u64) -> Self {
        Starts { origin, last: None, series: BTreeMap::new(), next: BTreeMap::new() }
    }

    /// The start of series `key` now holding `value`.
    fn start(&mut self, key: SeriesKey, value: f64) -> u64 {
        let start = match (self.series.get(&key), self.last) {
            (Some(&(start, before)), _) if value >= before => start,
            (_, Some(last)) => last,
            (_, None) => self.origin,
        };
        self.next.insert(key, (start, value));
        start
    }

    /// Ends the export made at `now`: series it did not see are forgotten.
    fn finish(&mut self, now: u64) {
        self.series = std::mem::take(&mut self.next);
        self.last = Some(now);
    }
}

/// The Prometheus text `text` as OTLP metrics read at `now` (unix ns), each cumulative series
/// since its start in `starts`.
pub fn convert(text: &str, starts: &mut Starts, now: u64) -> Vec<Metric> {
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
                let counter = kind == "counter";
                let points: Vec<NumberDataPoint> = samples
                    .iter()
                    .filter(|(n, _, _)| n == name)
                    // A gauge's start time is optional in OTLP; it gets the exporter's start.
                    .map(|(_, l, v)| point(l, *v, if counter { starts.start((name.clone(), l.clone()), *v) } else { starts.origin }, now))
                    .collect();
                if points.is_empty() {
                    continue;
                }
                if counter {
                    metric::Data::Sum(Sum { data_points: points, aggregation_temporality: AggregationTemporality::Cumulative as i32, is_monotonic: true })
                } else {
                    metric::Data::Gauge(Gauge { data_points: points })
                }
            }
            "histogram" => {
                let points = histogram(name, &samples, starts, now);
                if points.is_empty() {
                    continue;
                }
                metric::Data::Histogram(Histogram { data_points: points, aggregation_temporality: AggregationTemporality::Cumulative as i32 })
            }
            _ => continue, // summaries: weft registers none
        };
        out.push(Metric { name: name.clone(), description, data: Some(data), ..Default::default() });
    }
    starts.finish(now);
    out
}

/// A histogram's series (`_bucket{le}`, `_sum`, `_count`) grouped by their other labels.
fn histogram(name: &str, samples: &[Sample], starts: &mut Starts, now: u64) -> Vec<HistogramDataPoint> {
    let (bucket, sum, count) = (format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count"));
    // labels (without le) → ((le, cumulative count), sum, count)
    type Parts = (Vec<(f64, f64)>, f64, f64);
    let mut series: BTreeMap<Vec<(String, String)>, Parts> = BTreeMap::new();
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
            let attributes = attrs(&labels);
            HistogramDataPoint {
                attributes,
                start_time_unix_nano: starts.start((name.to_owned(), labels), c),
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
    let mut starts = Starts::new(unix_ns(SystemTime::now()));
    let mut client = MetricsServiceClient::new(channel);
    let mut tick = tokio::time::interval(job.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let metrics = convert(&job.exposition.render(), &mut starts, unix_ns(SystemTime::now()));
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
        let m = convert(TEXT, &mut Starts::new(1), 2);
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
        assert!(convert("# TYPE weft_z counter\nweft_z{a=\"1\"} not-a-number\n", &mut Starts::new(0), 0).is_empty());
    }

    /// (start, value) of each point of counter `name`, by its `k` label.
    fn counter_points(m: &[Metric], name: &str) -> BTreeMap<String, (u64, f64)> {
        let Some(metric::Data::Sum(sum)) = m.iter().find(|x| x.name == name).and_then(|x| x.data.clone()) else { return BTreeMap::new() };
        sum.data_points
            .iter()
            .map(|p| {
                let Some(number_data_point::Value::AsDouble(v)) = p.value else { panic!("double") };
                (label(&p.attributes, "k"), (p.start_time_unix_nano, v))
            })
            .collect()
    }

    fn hist_start(m: &[Metric]) -> u64 {
        let Some(metric::Data::Histogram(h)) = m.iter().find(|x| x.name == "weft_h").and_then(|x| x.data.clone()) else { panic!("weft_h") };
        h.data_points[0].start_time_unix_nano
    }

    /// A series that appears late, or drops to a lower value (dropped while idle and recreated),
    /// gets a new start time, so an OTLP consumer sees a reset, not a counter going backwards;
    /// a series that only grows keeps its start.
    #[test]
    fn a_series_that_appears_or_resets_gets_its_own_start_time() {
        let text = |a: u32, b: Option<u32>, h: u32| {
            let mut t = format!("# TYPE weft_c counter\nweft_c{{k=\"a\"}} {a}\n");
            if let Some(b) = b {
                t += &format!("weft_c{{k=\"b\"}} {b}\n");
            }
            t + &format!("# TYPE weft_h histogram\nweft_h_bucket{{le=\"+Inf\"}} {h}\nweft_h_sum 1\nweft_h_count {h}\n")
        };
        let mut starts = Starts::new(100);
        let m = convert(&text(5, None, 3), &mut starts, 110);
        assert_eq!(counter_points(&m, "weft_c")["a"], (100, 5.0), "present at the first export: since the exporter began");
        assert_eq!(hist_start(&m), 100);
        let m = convert(&text(9, Some(2), 4), &mut starts, 120);
        assert_eq!(counter_points(&m, "weft_c")["a"], (100, 9.0), "it grew: same start");
        assert_eq!(counter_points(&m, "weft_c")["b"], (110, 2.0), "new since the export at 110");
        assert_eq!(hist_start(&m), 100);
        // b is dropped (idle), a is recreated from zero, the histogram too.
        let m = convert(&text(1, None, 1), &mut starts, 130);
        assert_eq!(counter_points(&m, "weft_c")["a"], (120, 1.0), "went down: a reset, counted from the last export");
        assert_eq!(hist_start(&m), 120, "a histogram's count going down is a reset too");
        let m = convert(&text(2, Some(7), 2), &mut starts, 140);
        assert_eq!(counter_points(&m, "weft_c")["a"], (120, 2.0));
        assert_eq!(counter_points(&m, "weft_c")["b"], (130, 7.0), "b came back after an export without it: new, even though 7 > 2");
        assert_eq!(hist_start(&m), 120);
    }
}
