//! raft-write's measurements: closed-loop writers (one keep-alive HTTP/1.1 connection each,
//! writes back to back), the disk's own write + `fdatasync` latency, and the disk's I/O and
//! flush counters from `/proc/diskstats`.

use std::io::{Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::raft_clusters::{HttpConn, System};
use crate::stats::percentile;

/// What the writers saw in the measured window.
#[derive(Clone, Debug, Default)]
pub struct Writes {
    /// Writes acknowledged (committed) within the window.
    pub ok: u64,
    /// Failed writes within the window (non-200, unexpected body, broken connection).
    pub errors: u64,
    /// The first failure's description, if any.
    pub first_error: Option<String>,
    /// Latency of each acknowledged write, ms, ascending.
    pub latencies_ms: Vec<f64>,
    pub window_s: f64,
}

impl Writes {
    pub fn writes_per_s(&self) -> f64 {
        self.ok as f64 / self.window_s
    }

    pub fn p50_ms(&self) -> f64 {
        percentile(&self.latencies_ms, 0.50)
    }

    pub fn p99_ms(&self) -> f64 {
        percentile(&self.latencies_ms, 0.99)
    }
}

/// Runs `clients` closed-loop writers against `target` from now until `until`; only writes
/// that complete inside `from..=until` count (throughput and latency alike), the ones before
/// are the warm-up. A writer whose write fails reconnects if needed and goes on after 10 ms.
pub async fn closed_loop(
    system: System,
    target: SocketAddr,
    clients: usize,
    from: Instant,
    until: Instant,
) -> Result<Writes> {
    let mut tasks = Vec::with_capacity(clients);
    for client in 0..clients {
        tasks.push(tokio::spawn(writer(system, target, client, from, until)));
    }
    let mut total = Writes {
        window_s: until.saturating_duration_since(from).as_secs_f64(),
        ..Writes::default()
    };
    for t in tasks {
        let w = t.await.context("writer task panicked")??;
        total.ok += w.ok;
        total.errors += w.errors;
        total.first_error = total.first_error.or(w.first_error);
        total.latencies_ms.extend(w.latencies_ms);
    }
    total.latencies_ms.sort_by(f64::total_cmp);
    Ok(total)
}

/// One closed-loop writer: `Err` only when it cannot connect at all.
async fn writer(
    system: System,
    target: SocketAddr,
    client: usize,
    from: Instant,
    until: Instant,
) -> Result<Writes> {
    let mut conn = HttpConn::connect(target).await?;
    let mut out = Writes::default();
    loop {
        let begun = Instant::now();
        if begun >= until {
            return Ok(out);
        }
        let (method, path, body) = system.write_request(client);
        let result = conn.send(method, &path, body).await;
        let done = Instant::now();
        let counted = done >= from && done <= until;
        let failure = match result {
            Ok((status, body)) if system.write_ok(status, &body) => {
                if counted {
                    out.ok += 1;
                    out.latencies_ms
                        .push(done.duration_since(begun).as_secs_f64() * 1e3);
                }
                None
            }
            Ok((status, body)) => Some(format!(
                "{} {path}: HTTP {status}: {}",
                system.name(),
                String::from_utf8_lossy(&body).trim()
            )),
            Err(e) => Some(format!("{} {path}: {e:#}", system.name())),
        };
        if let Some(why) = failure {
            if counted {
                out.errors += 1;
                out.first_error.get_or_insert(why);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            if !conn.is_open() {
                conn = HttpConn::connect(target).await?;
            }
        }
    }
}

/// Latency of `write(4 KiB) + fdatasync`, ms.
#[derive(Clone, Debug)]
pub struct Fsync {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub iterations: usize,
}

/// Appends 4 KiB and calls `fdatasync` (`File::sync_data`) `iterations` times on a new file in
/// `dir` (`append`), or rewrites the same 4 KiB at offset 0 (`!append`). Appending also
/// changes the file size, which `fdatasync` must journal: that is what a log that grows does.
///
/// `extra` is added to every sample (slept after the sync): the same emulated delay the nodes
/// get under `--fsync-delay-ms`, so the baseline stays comparable.
pub fn fdatasync_latency(
    dir: &Path,
    iterations: usize,
    append: bool,
    extra: Duration,
) -> Result<Fsync> {
    if iterations == 0 {
        bail!("fdatasync: no iterations");
    }
    let path = dir.join(if append {
        "fdatasync-append"
    } else {
        "fdatasync-overwrite"
    });
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let block = [0x5au8; 4096];
    if !append {
        file.write_all(&block)?;
        file.sync_all()?;
    }
    let mut ms = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        if !append {
            file.seek(SeekFrom::Start(0))?;
        }
        let begun = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        if !extra.is_zero() {
            std::thread::sleep(extra);
        }
        ms.push(begun.elapsed().as_secs_f64() * 1e3);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    ms.sort_by(f64::total_cmp);
    Ok(Fsync {
        p50_ms: percentile(&ms, 0.5),
        p99_ms: percentile(&ms, 0.99),
        iterations,
    })
}

/// Completed writes and flushes (cache flushes: what an fsync turns into) of one block device.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskCounters {
    pub writes: u64,
    pub flushes: u64,
}

/// The block device holding `dir`, as named in `/proc/diskstats` (`vda`), if found.
pub fn device_of(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
    stats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[0] == major.to_string() && f[1] == minor.to_string())
            .then(|| f[2].to_string())
    })
}

/// Current counters of `device` (fields 8 and 20 of its `/proc/diskstats` line; the flush
/// count needs Linux ≥ 5.5 and is 0 for devices without a write cache).
pub fn disk_counters(device: &str) -> Option<DiskCounters> {
    let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
    let line = stats
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(device))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(3)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    Some(DiskCounters {
        writes: *f.get(4)?,
        flushes: f.get(15).copied().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdatasync_measures_each_iteration() {
        let dir = std::env::temp_dir().join(format!("weft-fsync-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for append in [true, false] {
            let f = fdatasync_latency(&dir, 5, append, Duration::ZERO).unwrap();
            assert_eq!(f.iterations, 5);
            assert!(f.p50_ms > 0.0 && f.p99_ms >= f.p50_ms);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_the_device_of_the_temp_dir() {
        // Containers without /proc/diskstats entries for overlay roots get None: fine.
        if let Some(dev) = device_of(&std::env::temp_dir()) {
            assert!(disk_counters(&dev).is_some());
        }
    }
}
