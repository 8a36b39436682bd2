//! CPU accounting of one load phase: the measured processes' CPU, the upstream's, and the
//! machine's busy time not used by the bench (a noise indicator).

use std::time::Instant;

use anyhow::{Context, Result};

use crate::procfs::{self, Usage};
use crate::upstream::Upstream;

/// Runs one load phase and reads the CPU that the process trees of `pids` (and the upstream)
/// spent during it.
pub fn during<T>(
    pids: &[u32],
    upstream: &Upstream,
    phase: impl FnOnce() -> Result<T>,
) -> Result<(T, PhaseCpu)> {
    let begun = Phase::begin(pids, upstream)?;
    let out = phase()?;
    Ok((out, begun.end(pids, upstream)?))
}

/// CPU readings taken when a load phase begins.
struct Phase {
    started: Instant,
    machine_busy_s: Option<f64>,
    own_cpu_s: f64,
    target_cpu_s: f64,
    upstream_cpu_s: f64,
}

/// CPU spent during a load phase.
pub struct PhaseCpu {
    pub wall_s: f64,
    /// CPU seconds of the measured process trees.
    pub cpu_s: f64,
    pub upstream_cpu_s: f64,
    /// CPU taken by anything outside the bench, in cores (a noise indicator).
    pub foreign: Option<f64>,
}

impl Phase {
    fn begin(pids: &[u32], upstream: &Upstream) -> Result<Self> {
        Ok(Self {
            started: Instant::now(),
            machine_busy_s: procfs::machine_busy_s(),
            own_cpu_s: procfs::own_cpu_s(),
            target_cpu_s: usage_of(pids)?.cpu_s,
            upstream_cpu_s: usage_of(&[upstream.process.pid()])?.cpu_s,
        })
    }

    fn end(self, pids: &[u32], upstream: &Upstream) -> Result<PhaseCpu> {
        let wall_s = self.started.elapsed().as_secs_f64();
        let machine_busy_s = procfs::machine_busy_s();
        let own_cpu_s = procfs::own_cpu_s() - self.own_cpu_s;
        let cpu_s = usage_of(pids)?.cpu_s - self.target_cpu_s;
        Ok(PhaseCpu {
            wall_s,
            cpu_s,
            upstream_cpu_s: usage_of(&[upstream.process.pid()])?.cpu_s - self.upstream_cpu_s,
            foreign: self
                .machine_busy_s
                .zip(machine_busy_s)
                .map(|(b, a)| (a - b - own_cpu_s) / wall_s),
        })
    }
}

/// The summed usage of the process trees of `pids`; `Err` if one is gone.
pub fn usage_of(pids: &[u32]) -> Result<Usage> {
    pids.iter().try_fold(Usage::default(), |sum, &pid| {
        let u = procfs::usage(pid).with_context(|| format!("process {pid} is gone"))?;
        Ok(Usage {
            cpu_s: sum.cpu_s + u.cpu_s,
            rss_mib: sum.rss_mib + u.rss_mib,
            hwm_mib: sum.hwm_mib + u.hwm_mib,
        })
    })
}
