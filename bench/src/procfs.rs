//! CPU time and memory of a process tree, read from `/proc`.
//!
//! A proxy may be more than one process (nginx: master + worker), so every reading sums the
//! process and all its descendants at the moment of reading.

use std::fs;
use std::process::Command;

/// One reading of a process tree.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// utime + stime of all processes in the tree, in seconds.
    pub cpu_s: f64,
    /// Sum of VmRSS, MiB.
    pub rss_mib: f64,
    /// Sum of VmHWM (peak resident set), MiB.
    pub hwm_mib: f64,
}

/// Reads the tree rooted at `pid`; `None` if the root process is gone.
pub fn usage(pid: u32) -> Option<Usage> {
    let ticks_per_s = clock_ticks_per_second();
    let tree = tree(pid);
    if tree.is_empty() {
        return None;
    }
    let mut total = Usage::default();
    for p in tree {
        if let Some(ticks) = cpu_ticks(p) {
            total.cpu_s += ticks as f64 / ticks_per_s;
        }
        total.rss_mib += status_kib(p, "VmRSS:").unwrap_or(0) as f64 / 1024.0;
        total.hwm_mib += status_kib(p, "VmHWM:").unwrap_or(0) as f64 / 1024.0;
    }
    Some(total)
}

/// PSS of `pid` in KiB (`Pss:` of `/proc/PID/smaps_rollup`): pages it shares count split
/// between the processes mapping them, so a sum over processes counts each page once.
pub fn pss_kib(pid: u32) -> anyhow::Result<u64> {
    use anyhow::Context;
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("smaps_rollup of {pid}"))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("Pss:")
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .with_context(|| format!("no Pss line in smaps_rollup of {pid}"))
}

/// Busy time of all CPUs since boot, in seconds: user, nice, system, irq, softirq and steal
/// from `/proc/stat`'s `cpu` line.
pub fn machine_busy_s() -> Option<f64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    Some(busy as f64 / clock_ticks_per_second())
}

/// CPU seconds of this process and everything it started: its live descendants (proxy,
/// upstream) plus its reaped children (`cutime`/`cstime`: finished load generators).
/// `machine_busy_s` minus this is what other work on a shared machine took.
pub fn own_cpu_s() -> f64 {
    let me = std::process::id();
    let reaped = stat_fields(me)
        .and_then(|f| Some(f.get(13)?.parse::<u64>().ok()? + f.get(14)?.parse::<u64>().ok()?))
        .unwrap_or(0);
    usage(me).map_or(0.0, |u| u.cpu_s) + reaped as f64 / clock_ticks_per_second()
}

/// `pid` followed by all its live descendants.
fn tree(pid: u32) -> Vec<u32> {
    if cpu_ticks(pid).is_none() {
        return Vec::new();
    }
    let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| Some((p, stat_fields(p)?.get(1)?.parse().ok()?)))
        .collect();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    out
}

/// Fields of `/proc/PID/stat` after the `(comm)` field: index 0 is state, 1 ppid, 11 utime,
/// 12 stime, 13 cutime, 14 cstime (the man page's fields 3, 4, 14 to 17).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    Some(after_comm.split_whitespace().map(str::to_string).collect())
}

/// utime + stime in clock ticks; `None` for a missing or zombie process.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let f = stat_fields(pid)?;
    if f.first().map(String::as_str) == Some("Z") {
        return None;
    }
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `kB` line of `/proc/PID/status`, such as `VmRSS:`.
fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// `CLK_TCK` from getconf(1) (sysconf would need `unsafe`); 100 on every Linux we run on.
fn clock_ticks_per_second() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
