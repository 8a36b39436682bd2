//! A replica's capacity, estimated from what its sidecar observes (latency at each concurrency)
//! when the operator did not configure one.
//!
//! Queueing inside a model server makes latency grow roughly linearly with concurrency once the
//! batch is full: `latency ≈ a + b × concurrency`. The largest concurrency that keeps latency
//! within the limit is `(limit - a) / b`, and by Little's law a replica then serves
//! `concurrency / latency` requests per second.

/// Requests per second one replica serves within `latency_limit_s`, from
/// `(concurrency, latency_s)` samples. `None` without two distinct concurrencies or when the
/// limit is below the fitted zero-load latency. When latency does not grow with concurrency
/// (the replica was never loaded enough to tell), the best throughput seen is returned: a lower
/// bound.
pub fn estimate_rps(samples: &[(f64, f64)], latency_limit_s: f64) -> Option<f64> {
    let n = samples.len() as f64;
    if samples.len() < 2 || latency_limit_s <= 0.0 {
        return None;
    }
    let mc = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let ml = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let sxx: f64 = samples.iter().map(|s| (s.0 - mc).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = samples.iter().map(|s| (s.0 - mc) * (s.1 - ml)).sum();
    let b = sxy / sxx;
    let a = ml - b * mc;
    if b <= 1e-12 {
        return samples
            .iter()
            .filter(|s| s.1 > 0.0)
            .map(|s| s.0 / s.1)
            .reduce(f64::max);
    }
    let c = (latency_limit_s - a) / b;
    (c > 0.0).then(|| c / latency_limit_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_latency_gives_the_littles_law_capacity() {
        // latency = 0.5 + 0.1 c: at a 1.5 s limit, c = 10 in flight -> 10 / 1.5 req/s.
        let s: Vec<(f64, f64)> = (1..=8)
            .map(|c| (f64::from(c), 0.5 + 0.1 * f64::from(c)))
            .collect();
        let r = estimate_rps(&s, 1.5).unwrap();
        assert!((r - 10.0 / 1.5).abs() < 1e-9, "{r}");
    }

    #[test]
    fn flat_latency_is_a_lower_bound_and_bad_input_is_none() {
        let s = [(1.0, 0.5), (4.0, 0.5)];
        assert_eq!(estimate_rps(&s, 2.0), Some(8.0));
        assert_eq!(estimate_rps(&[(1.0, 0.5)], 2.0), None);
        assert_eq!(estimate_rps(&[(2.0, 0.5), (2.0, 0.7)], 2.0), None);
        // Zero-load latency 1 s already passes a 0.5 s limit.
        assert_eq!(estimate_rps(&[(1.0, 1.1), (2.0, 1.2)], 0.5), None);
    }
}
