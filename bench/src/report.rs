//! proxy-load's results: per-repeat samples, their medians and ranges, the ratios and targets
//! the issue states, the printed table and the JSON document.

use serde_json::{Map, Value, json};

use crate::peers::Target;
use crate::stats::Spread;

/// What both scenarios measure alike for one target in one repeat: the closed loop (wrk), the
/// CPU the target spent in it, its memory, and the noise meanwhile.
#[derive(Clone, Debug)]
pub struct Closed {
    /// Requests per second, completed requests, failed requests.
    pub rps: f64,
    pub requests: u64,
    pub closed_loop_errors: u64,
    /// CPU of the measured process trees during the closed loop, per completed request.
    pub cpu_us_per_req: f64,
    /// That CPU time over the wall time: ≈1.0 when the target's core was the bottleneck.
    pub cpu_busy: f64,
    /// CPU (in cores) taken meanwhile by anything outside the bench: other work on a shared
    /// machine, interrupts, steal (a noise indicator; the larger of the phases).
    pub foreign_cpu: Option<f64>,
    /// The upstream's CPU per request in the same window (the same for every target ideally).
    pub upstream_cpu_us_per_req: f64,
    pub rss_idle_mib: f64,
    pub rss_peak_mib: f64,
}

impl Closed {
    /// A sample's JSON object: these fields and those of `extra` (an object).
    pub fn json_with(&self, extra: Value) -> Value {
        let mut v = json!({
            "rps": round(self.rps, 1),
            "requests": self.requests,
            "closed_loop_errors": self.closed_loop_errors,
            "cpu_us_per_req": round(self.cpu_us_per_req, 2),
            "cpu_busy": round(self.cpu_busy, 3),
            "foreign_cpu": self.foreign_cpu.map(|v| round(v, 3)),
            "upstream_cpu_us_per_req": round(self.upstream_cpu_us_per_req, 2),
            "rss_idle_mib": round(self.rss_idle_mib, 2),
            "rss_peak_mib": round(self.rss_peak_mib, 2),
        });
        if let (Value::Object(mine), Value::Object(extra)) = (&mut v, extra) {
            mine.extend(extra);
        }
        v
    }
}

/// One target measured in one repeat of the plaintext scenario.
#[derive(Clone, Debug)]
pub struct Sample {
    pub target: Target,
    pub repeat: usize,
    pub closed: Closed,
    /// Open loop (h2load): achieved rate, latency percentiles, failed requests.
    pub open_loop_rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub open_loop_errors: u64,
    /// Latency over `direct` in the same repeat; filled by [`fill_added_latency`].
    pub p50_added_ms: Option<f64>,
    pub p99_added_ms: Option<f64>,
    /// Share of requests the proxy routed to variant `a` (weft and Envoy), from its metrics.
    pub variant_a_share: Option<f64>,
}

/// A reported quantity of a sample type `S`: JSON key, table header, how to read it from a
/// sample, decimals.
pub struct Metric<S> {
    pub key: &'static str,
    pub header: &'static str,
    pub get: fn(&S) -> Option<f64>,
    pub decimals: usize,
}

/// A sample of one target in one repeat, whatever the scenario measured.
pub trait Measured {
    fn target(&self) -> Target;
}

impl Measured for Sample {
    fn target(&self) -> Target {
        self.target
    }
}

const METRICS: &[Metric<Sample>] = &[
    metric("rps", "req/s (wrk)", |s| Some(s.closed.rps), 0),
    metric("p50_ms", "p50 ms", |s| Some(s.p50_ms), 3),
    metric("p99_ms", "p99 ms", |s| Some(s.p99_ms), 3),
    metric("p50_added_ms", "+p50 ms", |s| s.p50_added_ms, 3),
    metric("p99_added_ms", "+p99 ms", |s| s.p99_added_ms, 3),
    metric(
        "cpu_us_per_req",
        "CPU µs/req",
        |s| Some(s.closed.cpu_us_per_req),
        1,
    ),
    metric("rss_idle_mib", "idle MiB", |s| Some(s.closed.rss_idle_mib), 1),
    metric("rss_peak_mib", "peak MiB", |s| Some(s.closed.rss_peak_mib), 1),
];

pub const fn metric<S>(
    key: &'static str,
    header: &'static str,
    get: fn(&S) -> Option<f64>,
    decimals: usize,
) -> Metric<S> {
    Metric {
        key,
        header,
        get,
        decimals,
    }
}

/// Sets each sample's added latency against `direct` of the same repeat (shared noise).
pub fn fill_added_latency(samples: &mut [Sample]) {
    let direct: Vec<(usize, f64, f64)> = samples
        .iter()
        .filter(|s| s.target == Target::Direct)
        .map(|s| (s.repeat, s.p50_ms, s.p99_ms))
        .collect();
    for s in samples.iter_mut() {
        if let Some(&(_, p50, p99)) = direct.iter().find(|d| d.0 == s.repeat) {
            s.p50_added_ms = Some(s.p50_ms - p50);
            s.p99_added_ms = Some(s.p99_ms - p99);
        }
    }
}

/// Per target: each metric's spread over the repeats (`None` = target not measured).
pub struct Summary<S: 'static = Sample> {
    metrics: &'static [Metric<S>],
    rows: Vec<(Target, Vec<Option<Spread>>)>,
}

impl Summary<Sample> {
    /// The plaintext scenario's summary: every target, [`METRICS`].
    pub fn new(samples: &[Sample]) -> Self {
        Self::over(samples, METRICS, &Target::ALL)
    }
}

impl<S: Measured> Summary<S> {
    /// `metrics` of `samples`, one row per target of `targets` (in that order).
    pub fn over(samples: &[S], metrics: &'static [Metric<S>], targets: &[Target]) -> Self {
        let rows = targets.iter().map(|&t| {
            let mine: Vec<&S> = samples.iter().filter(|s| s.target() == t).collect();
            (
                t,
                metrics
                    .iter()
                    .map(|m| Spread::of(mine.iter().map(|s| (m.get)(s))))
                    .collect(),
            )
        });
        Self {
            metrics,
            rows: rows.collect(),
        }
    }

    /// Median of `key` for `target`.
    pub fn median(&self, target: Target, key: &str) -> Option<f64> {
        let i = self.metrics.iter().position(|m| m.key == key)?;
        let (_, spreads) = self.rows.iter().find(|(t, _)| *t == target)?;
        spreads[i].map(|s| s.median)
    }

    /// The `summary` object: medians under the metric keys, `[min, max]` under `range`.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        for (target, spreads) in &self.rows {
            let mut row = Map::new();
            let mut range = Map::new();
            for (m, s) in self.metrics.iter().zip(spreads) {
                row.insert(
                    m.key.into(),
                    s.map_or(Value::Null, |s| round(s.median, m.decimals + 1)),
                );
                let digits = m.decimals + 1;
                range.insert(
                    m.key.into(),
                    s.map_or(Value::Null, |s| {
                        json!([round(s.min, digits), round(s.max, digits)])
                    }),
                );
            }
            row.insert("range".into(), Value::Object(range));
            out.insert(target.name().into(), Value::Object(row));
        }
        Value::Object(out)
    }

    /// The table: `median (min–max)` per cell, `-` where a target was not measured.
    pub fn table(&self) -> String {
        let mut lines = vec![
            std::iter::once("target")
                .chain(self.metrics.iter().map(|m| m.header))
                .collect::<Vec<_>>()
                .join(" | "),
        ];
        lines.push(vec!["---"; self.metrics.len() + 1].join("|"));
        for (target, spreads) in &self.rows {
            let cells = self.metrics.iter().zip(spreads).map(|(m, s)| match s {
                None => "-".to_string(),
                Some(s) if s.min == s.max => format!("{:.*}", m.decimals, s.median),
                Some(s) => format!(
                    "{:.*} ({:.*}–{:.*})",
                    m.decimals, s.median, m.decimals, s.min, m.decimals, s.max
                ),
            });
            lines.push(
                std::iter::once(target.name().to_string())
                    .chain(cells)
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
        lines.iter().map(|l| format!("| {l} |\n")).collect()
    }
}

/// The key in [`ratios`] of the ceiling: direct's throughput over Envoy's.
pub const CEILING: &str = "direct_rps_over_envoy_rps";

/// A ratio of two medians, `(name, numerator target, denominator target, metric key)`.
pub type Ratio = (&'static str, Target, Target, &'static str);

const RATIOS: &[Ratio] = &[
    // The ceiling of every proxy-over-Envoy throughput ratio this rig can show: a proxy that
    // cost nothing would still leave the load core (load generator + upstream) to do the work
    // of `direct`, so no proxy can measure above direct's rps.
    (
        CEILING,
        Target::Direct,
        Target::Envoy,
        "rps",
    ),
    (
        "weft_rps_over_envoy_rps",
        Target::Weft,
        Target::Envoy,
        "rps",
    ),
    (
        "weft_cpu_over_envoy_cpu",
        Target::Weft,
        Target::Envoy,
        "cpu_us_per_req",
    ),
    // What the shipped (profile-guided) build gains over the plain release build, and where
    // the plain build stands against the peers.
    (
        "weft_rps_over_weft_release_rps",
        Target::Weft,
        Target::WeftRelease,
        "rps",
    ),
    (
        "weft_cpu_over_weft_release_cpu",
        Target::Weft,
        Target::WeftRelease,
        "cpu_us_per_req",
    ),
    (
        "weft_release_rps_over_nginx_rps",
        Target::WeftRelease,
        Target::Nginx,
        "rps",
    ),
    (
        "weft_release_cpu_over_haproxy_cpu",
        Target::WeftRelease,
        Target::Haproxy,
        "cpu_us_per_req",
    ),
];

/// weft against nginx and HAProxy, in both scenarios.
pub const WEFT_OVER_NGINX_HAPROXY: &[Ratio] = &[
    ("weft_rps_over_nginx_rps", Target::Weft, Target::Nginx, "rps"),
    (
        "weft_rps_over_haproxy_rps",
        Target::Weft,
        Target::Haproxy,
        "rps",
    ),
    (
        "weft_cpu_over_nginx_cpu",
        Target::Weft,
        Target::Nginx,
        "cpu_us_per_req",
    ),
    (
        "weft_cpu_over_haproxy_cpu",
        Target::Weft,
        Target::Haproxy,
        "cpu_us_per_req",
    ),
];

/// The plaintext scenario's ratios.
pub fn ratios(summary: &Summary) -> Value {
    ratios_of(summary, &[RATIOS, WEFT_OVER_NGINX_HAPROXY])
}

/// Each ratio of `ratios` from `summary`'s medians (`null` where a side is missing).
pub fn ratios_of<S: Measured>(summary: &Summary<S>, ratios: &[&[Ratio]]) -> Value {
    let ratio = |&(name, num, den, key): &Ratio| {
        let v = summary
            .median(num, key)
            .zip(summary.median(den, key))
            .map(|(n, d)| round(n / d, 3));
        (name.to_string(), v.unwrap_or(Value::Null))
    };
    Value::Object(ratios.iter().copied().flatten().map(ratio).collect())
}

/// One target from the issue: `value` must be `>=` (or `<=`) `limit`.
pub struct Check {
    pub name: &'static str,
    pub value: Option<f64>,
    pub limit: Option<f64>,
    pub at_least: bool,
}

impl Check {
    /// `None` when a side is missing: unknown, neither pass nor fail.
    pub fn pass(&self) -> Option<bool> {
        let (v, l) = self.value.zip(self.limit)?;
        Some(if self.at_least { v >= l } else { v <= l })
    }
}

/// The targets, from the medians.
pub fn checks(s: &Summary) -> Vec<Check> {
    let weft = |k| s.median(Target::Weft, k);
    let times = |t, k, f: f64| s.median(t, k).map(|v| v * f);
    vec![
        Check {
            name: "weft rps >= 3x envoy rps",
            value: weft("rps"),
            limit: times(Target::Envoy, "rps", 3.0),
            at_least: true,
        },
        Check {
            name: "weft rps >= nginx rps",
            value: weft("rps"),
            limit: s.median(Target::Nginx, "rps"),
            at_least: true,
        },
        Check {
            name: "weft CPU/req <= haproxy CPU/req",
            value: weft("cpu_us_per_req"),
            limit: s.median(Target::Haproxy, "cpu_us_per_req"),
            at_least: false,
        },
        Check {
            name: "weft p99 added latency <= haproxy's",
            value: weft("p99_added_ms"),
            limit: s.median(Target::Haproxy, "p99_added_ms"),
            at_least: false,
        },
        Check {
            name: "weft idle RSS <= 15 MiB",
            value: weft("rss_idle_mib"),
            limit: Some(15.0),
            at_least: false,
        },
    ]
}

pub fn checks_json(checks: &[Check]) -> Value {
    let rows = checks.iter().map(|c| {
        json!({
            "target": c.name,
            "value": c.value.map(|v| round(v, 4)),
            "limit": c.limit.map(|v| round(v, 4)),
            "pass": c.pass(),
        })
    });
    Value::Array(rows.collect())
}

pub fn checks_table(checks: &[Check]) -> String {
    let verdict = |p: Option<bool>| match p {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "n/a (missing data)",
    };
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    checks
        .iter()
        .map(|c| {
            format!(
                "{:<38} {:>4}  (weft {} vs limit {})\n",
                c.name,
                verdict(c.pass()),
                fmt(c.value),
                fmt(c.limit)
            )
        })
        .collect()
}

/// One sample as a JSON object (the raw per-repeat numbers).
pub fn sample_json(s: &Sample) -> Value {
    s.closed.json_with(json!({
        "target": s.target.name(),
        "repeat": s.repeat,
        "open_loop_achieved_rps": round(s.open_loop_rps, 1),
        "p50_ms": round(s.p50_ms, 4),
        "p99_ms": round(s.p99_ms, 4),
        "p50_added_ms": s.p50_added_ms.map(|v| round(v, 4)),
        "p99_added_ms": s.p99_added_ms.map(|v| round(v, 4)),
        "open_loop_errors": s.open_loop_errors,
        "variant_a_share": s.variant_a_share.map(|v| round(v, 3)),
    }))
}

pub fn round(v: f64, decimals: usize) -> Value {
    let f = 10f64.powi(decimals as i32);
    json!((v * f).round() / f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(target: Target, repeat: usize, rps: f64, p99_ms: f64) -> Sample {
        Sample {
            target,
            repeat,
            closed: Closed {
                rps,
                requests: 1,
                closed_loop_errors: 0,
                cpu_us_per_req: 30.0,
                cpu_busy: 1.0,
                foreign_cpu: None,
                upstream_cpu_us_per_req: 10.0,
                rss_idle_mib: 10.0,
                rss_peak_mib: 12.0,
            },
            open_loop_rps: 2000.0,
            p50_ms: p99_ms / 2.0,
            p99_ms,
            open_loop_errors: 0,
            p50_added_ms: None,
            p99_added_ms: None,
            variant_a_share: None,
        }
    }

    #[test]
    fn added_latency_is_against_the_same_repeat() {
        let mut s = vec![
            sample(Target::Direct, 0, 1.0, 0.1),
            sample(Target::Direct, 1, 1.0, 0.2),
            sample(Target::Weft, 1, 1.0, 0.5),
        ];
        fill_added_latency(&mut s);
        assert!((s[2].p99_added_ms.unwrap() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn checks_are_unknown_when_a_peer_is_missing() {
        let s = Summary::new(&[
            sample(Target::Weft, 0, 30000.0, 0.3),
            sample(Target::Nginx, 0, 20000.0, 0.3),
        ]);
        let c = checks(&s);
        assert_eq!(c[0].pass(), None, "no envoy");
        assert_eq!(c[1].pass(), Some(true));
        assert_eq!(c[4].pass(), Some(true));
        assert_eq!(ratios(&s)["weft_rps_over_nginx_rps"], json!(1.5));
        assert_eq!(s.to_json()["envoy"]["rps"], Value::Null);
    }

    /// The ceiling is direct's rate over Envoy's: what a proxy costing nothing would show.
    #[test]
    fn the_ceiling_is_direct_over_envoy() {
        let s = Summary::new(&[
            sample(Target::Direct, 0, 60000.0, 0.1),
            sample(Target::Envoy, 0, 24000.0, 0.6),
            sample(Target::Weft, 0, 54000.0, 0.3),
        ]);
        let r = ratios(&s);
        assert_eq!(r[CEILING], json!(2.5));
        assert_eq!(r["weft_rps_over_envoy_rps"], json!(2.25));
        assert_eq!(checks(&s)[0].pass(), Some(false), "2.25x < 3x");
    }
}
