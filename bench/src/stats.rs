//! Order statistics for latency samples and per-repeat summaries.

/// Nearest-rank percentile of an ascending slice (`q` in 0..=1); NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Median, minimum and maximum of the values present (missing repeats are skipped).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` when no repeat produced a value.
    pub fn of(values: impl IntoIterator<Item = Option<f64>>) -> Option<Self> {
        let mut v: Vec<f64> = values
            .into_iter()
            .flatten()
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn spread_skips_missing() {
        let s = Spread::of([Some(3.0), None, Some(1.0), Some(2.0)]).unwrap();
        assert_eq!(
            s,
            Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of([None, None]), None);
        assert_eq!(Spread::of([Some(1.0), Some(2.0)]).unwrap().median, 1.5);
    }
}
