//! The load generators, run pinned to one core: `wrk` for closed-loop throughput and `h2load`
//! (`--h1 --rps`) for latency at a fixed open-loop rate.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::guard::Spawned;

/// Result of a closed-loop `wrk` run.
#[derive(Clone, Debug)]
pub struct ClosedLoop {
    /// Completed requests (any status).
    pub requests: u64,
    /// Requests per second as wrk reports it.
    pub rps: f64,
    /// Non-2xx/3xx responses plus socket errors: a proxy that fails fast must not look fast.
    pub errors: u64,
}

/// Runs `wrk` with one thread and `connections` connections for `duration` (whole seconds:
/// wrk takes no finer unit) against `url` (`http://ADDR/`, or `https://ADDR/` for a TLS
/// terminator: wrk does not check the server's certificate).
pub fn wrk(core: usize, url: &str, connections: u32, duration: Duration) -> Result<ClosedLoop> {
    let seconds = duration.as_secs().max(1);
    let mut cmd = pinned(core, "wrk");
    cmd.args([
        "-t1",
        &format!("-c{connections}"),
        &format!("-d{seconds}s"),
        url,
    ]);
    let text = Spawned::run_to_end("wrk", &mut cmd, time_limit(duration))?;
    parse_wrk(&text).with_context(|| format!("unexpected wrk output:\n{text}"))
}

fn parse_wrk(text: &str) -> Option<ClosedLoop> {
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let rps = number_after(text, "Requests/sec:")?;
    let non_2xx = number_after(text, "Non-2xx or 3xx responses:").unwrap_or(0.0) as u64;
    let socket_errors: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .map(|s| {
            s.split(',')
                .filter_map(|kv| kv.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Some(ClosedLoop {
        requests,
        rps,
        errors: non_2xx + socket_errors,
    })
}

/// Result of an open-loop `h2load` run.
#[derive(Clone, Debug)]
pub struct OpenLoop {
    /// Rate actually achieved, req/s (should equal the target rate).
    pub achieved_rps: f64,
    /// Median request latency, ms.
    pub p50_ms: f64,
    /// 99th percentile request latency, ms.
    pub p99_ms: f64,
    /// Requests that did not answer 2xx.
    pub errors: u64,
}

/// Sends `rate` req/s spread over `connections` HTTP/1.1 connections for `duration`.
///
/// h2load paces each connection at `rate / connections` from the moment it connects, and
/// `-r1 --rate-period=1ms` opens the connections 1 ms apart, so their schedules interleave instead
/// of firing in one burst (libev's timers tick in milliseconds: at 2,000 req/s that is two
/// requests per millisecond). With many more connections than requests in flight a request almost
/// never waits for its connection, so the schedule stays open-loop. Percentiles come from the
/// per-request log (`--log-file`); h2load's summary has only mean/sd.
pub fn h2load(
    core: usize,
    addr: SocketAddr,
    rate: u32,
    connections: u32,
    duration: Duration,
    log: &Path,
) -> Result<OpenLoop> {
    let per_connection = f64::from(rate) / f64::from(connections);
    let requests = (f64::from(rate) * duration.as_secs_f64()).round().max(1.0);
    // h2load appends to an existing log.
    let _ = std::fs::remove_file(log);
    let mut cmd = pinned(core, "h2load");
    cmd.args([
        "--h1",
        "-t1",
        &format!("-c{connections}"),
        &format!("-n{requests}"),
        &format!("--rps={per_connection}"),
    ])
    .args(["-r1", "--rate-period=1ms"])
    .arg(format!("--log-file={}", log.display()))
    .arg(format!("http://{addr}/"));
    let text = Spawned::run_to_end("h2load", &mut cmd, time_limit(duration))?;
    let log_text = std::fs::read_to_string(log).context("reading the h2load log")?;
    parse_h2load_log(&log_text).with_context(|| format!("no requests in h2load run:\n{text}"))
}

/// Each log line is `start_us \t status \t duration_us`; the achieved rate is measured between
/// the first and the last request start.
fn parse_h2load_log(log: &str) -> Option<OpenLoop> {
    let mut latencies_us = Vec::new();
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut errors = 0;
    for line in log.lines() {
        let mut cols = line.split('\t');
        let (start, status, took) = (cols.next()?, cols.next()?, cols.next()?);
        let start: f64 = start.parse().ok()?;
        (first, last) = (first.min(start), last.max(start));
        if !status.starts_with('2') {
            errors += 1;
        }
        latencies_us.push(took.trim().parse::<f64>().ok()?);
    }
    if latencies_us.len() < 2 {
        return None;
    }
    latencies_us.sort_by(f64::total_cmp);
    Some(OpenLoop {
        achieved_rps: (latencies_us.len() - 1) as f64 / ((last - first) / 1e6).max(1e-6),
        p50_ms: crate::stats::percentile(&latencies_us, 0.50) / 1000.0,
        p99_ms: crate::stats::percentile(&latencies_us, 0.99) / 1000.0,
        errors,
    })
}

/// How long a phase of `duration` may take before the load generator is deemed stuck.
fn time_limit(duration: Duration) -> Duration {
    duration * 3 + Duration::from_secs(10)
}

/// `taskset -c CORE program`.
fn pinned(core: usize, program: &str) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &core.to_string(), program]);
    cmd
}

/// The number following `label` on its line.
fn number_after(text: &str, label: &str) -> Option<f64> {
    let rest = &text[text.find(label)? + label.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_with_errors() {
        let text = "Running 3s test @ http://127.0.0.1:1/\n  1 threads and 50 connections\n  \
                    61234 requests in 3.00s, 10.00MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\n  \
                    Non-2xx or 3xx responses: 4\nRequests/sec:  20411.33\nTransfer/sec:      3.33MB\n";
        let r = parse_wrk(text).unwrap();
        assert_eq!((r.requests, r.errors), (61234, 7));
        assert!((r.rps - 20411.33).abs() < 1e-9);
    }

    #[test]
    fn parses_h2load_log() {
        // 101 requests started 10 ms apart: 100 req/s.
        let log: String = (1..=100)
            .map(|i| {
                format!(
                    "{}\t200\t{}\n",
                    1_700_000_000_000_000u64 + i * 10_000,
                    i * 10
                )
            })
            .collect();
        let r = parse_h2load_log(&format!("{log}1700000000000000\t503\t5\n")).unwrap();
        assert_eq!(r.errors, 1);
        assert!((r.achieved_rps - 100.0).abs() < 1e-6, "{}", r.achieved_rps);
        assert!((r.p50_ms - 0.5).abs() < 0.011, "{}", r.p50_ms);
        assert!((r.p99_ms - 0.99).abs() < 0.011, "{}", r.p99_ms);
    }
}
