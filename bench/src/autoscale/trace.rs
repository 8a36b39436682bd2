//! The Azure LLM inference traces, as arrivals per fixed-width time bin.
//!
//! Two formats: the 2024 week in 10 s bins (`time,requests`) and the 2023 per-request hours
//! (`TIMESTAMP,ContextTokens,GeneratedTokens`), which are binned here.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::csv::{all_rows, read};

/// Arrivals per bin, from `start_s` (seconds since the Unix epoch).
#[derive(Clone, Debug)]
pub struct Trace {
    pub name: String,
    pub start_s: f64,
    pub bin_s: f64,
    pub counts: Vec<f64>,
}

impl Trace {
    /// The first `n` bins.
    pub fn head(&self, n: usize) -> Self {
        Self {
            counts: self.counts[..n.min(self.counts.len())].to_vec(),
            ..self.clone()
        }
    }

    pub fn duration_s(&self) -> f64 {
        self.counts.len() as f64 * self.bin_s
    }

    /// Mean arrival rate (req/s) per bucket of `bucket_s` (a whole number of bins; the last
    /// bucket may be shorter).
    pub fn bucket_means(&self, bucket_s: f64) -> Vec<f64> {
        let per = (bucket_s / self.bin_s).round().max(1.0) as usize;
        self.counts
            .chunks(per)
            .map(|c| c.iter().sum::<f64>() / (c.len() as f64 * self.bin_s))
            .collect()
    }
}

/// Reads a `time,requests` trace (bins of equal width, inferred from the first two rows;
/// missing bins count as 0).
pub fn read_binned(path: &Path) -> Result<Trace> {
    let text = read(path)?;
    let rows = all_rows(&text, path, &["time", "requests"])?;
    let (times, counts): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .map(|f| Ok((parse_time(f[0])?, f[1].parse::<f64>().context("requests")?)))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    if times.len() < 2 {
        bail!("{}: fewer than two bins", path.display());
    }
    let bin_s = times[1] - times[0];
    if bin_s <= 0.0 {
        bail!("{}: times not increasing", path.display());
    }
    let start_s = times[0];
    let n = ((times[times.len() - 1] - start_s) / bin_s).round() as usize + 1;
    let mut out = vec![0.0; n];
    for (t, c) in times.iter().zip(counts) {
        let i = ((t - start_s) / bin_s).round();
        if i >= 0.0 && (i as usize) < n {
            out[i as usize] += c;
        }
    }
    Ok(Trace {
        name: stem(path),
        start_s,
        bin_s,
        counts: out,
    })
}

/// Reads a per-request trace (`TIMESTAMP,...`) and counts arrivals per `bin_s`.
pub fn read_requests(path: &Path, bin_s: f64) -> Result<Trace> {
    let text = read(path)?;
    let rows = all_rows(&text, path, &["TIMESTAMP"])?;
    let times = rows
        .iter()
        .map(|f| parse_time(f[0]))
        .collect::<Result<Vec<_>>>()?;
    let start = times.iter().copied().fold(f64::INFINITY, f64::min);
    if !start.is_finite() {
        bail!("{}: no requests", path.display());
    }
    let start_s = (start / bin_s).floor() * bin_s;
    let mut counts = Vec::new();
    for t in times {
        let i = ((t - start_s) / bin_s) as usize;
        if counts.len() <= i {
            counts.resize(i + 1, 0.0);
        }
        counts[i] += 1.0;
    }
    Ok(Trace {
        name: stem(path),
        start_s,
        bin_s,
        counts,
    })
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("trace")
        .to_string()
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC) as seconds since the Unix epoch.
pub fn parse_time(s: &str) -> Result<f64> {
    let bad = || anyhow::anyhow!("not a timestamp: {s:?}");
    let (date, time) = s.trim().split_once([' ', 'T']).ok_or_else(bad)?;
    let d: Vec<i64> = date
        .split('-')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let t: Vec<f64> = time
        .split(':')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if d.len() != 3 || t.len() != 3 {
        return Err(bad());
    }
    Ok(days_from_civil(d[0], d[1], d[2]) as f64 * 86_400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2])
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(parse_time("1970-01-01 00:00:00").unwrap(), 0.0);
        // 2024-05-10 is 19853 days after the epoch.
        assert_eq!(
            parse_time("2024-05-10 00:00:10").unwrap(),
            19_853.0 * 86_400.0 + 10.0
        );
        let t = parse_time("2023-11-16 18:17:03.9799600").unwrap();
        assert!((t - (19_677.0 * 86_400.0 + 18.0 * 3600.0 + 17.0 * 60.0 + 3.97996)).abs() < 1e-6);
        assert!(parse_time("yesterday").is_err());
    }
}
