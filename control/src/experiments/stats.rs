//! Statistics the A/B report and the experiment engine share, pure: percentiles with
//! distribution-free confidence intervals, Wilson intervals for proportions, the
//! sample-ratio-mismatch (SRM) chi-square test, Mann-Whitney U on latency and the
//! two-proportion z-test. (These are fixed-horizon tests: read once, at the end. The engine's
//! continuous monitoring uses `sequential` instead.)

/// z for a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// Quantile `q` of sorted data, linear interpolation between order statistics (R's type 7).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
            let (lo, frac) = (h.floor() as usize, h - h.floor());
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + frac * (sorted[hi] - sorted[lo])
        }
    }
}

/// Distribution-free confidence interval for quantile `q` of `n` sorted values: the 0-based
/// indices of the order statistics bounding it, from the normal approximation of the
/// binomial count of values below the quantile (Conover).
pub fn quantile_ci(n: usize, q: f64, z: f64) -> (usize, usize) {
    if n == 0 {
        return (0, 0);
    }
    let nf = n as f64;
    let half = z * (nf * q * (1.0 - q)).sqrt();
    let lo_rank = (nf * q - half).floor().max(1.0) as usize;
    let hi_rank = ((nf * q + half).ceil() as usize).clamp(1, n);
    (lo_rank - 1, hi_rank - 1)
}

/// Wilson score interval for a proportion `k / n`.
pub fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let d = 1.0 + z * z / n;
    let c = (p + z * z / (2.0 * n)) / d;
    let h = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / d;
    ((c - h).max(0.0), (c + h).min(1.0))
}

/// Complementary error function (Numerical Recipes' erfcc, relative error < 1.2e-7).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// Standard normal CDF.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// Sample-ratio check of two arm sizes against an even split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Srm {
    pub chi2: f64,
    pub p: f64,
    /// `false` when p < [`SRM_ALPHA`]: the split itself is broken and no comparison is trusted.
    pub ok: bool,
}

/// The usual SRM threshold (a strict one: the check runs on every experiment).
pub const SRM_ALPHA: f64 = 0.001;

/// Pearson chi-square goodness of fit of `(na, nb)` to 50/50 (1 degree of freedom).
pub fn srm(na: u64, nb: u64) -> Srm {
    srm_weighted(&[na, nb], &[1.0, 1.0])
}

/// Pearson chi-square goodness of fit of the arm sizes `counts` to the configured `weights`
/// (any scale; arms of weight 0 are left out), `k - 1` degrees of freedom.
pub fn srm_weighted(counts: &[u64], weights: &[f64]) -> Srm {
    let arms: Vec<(f64, f64)> =
        counts.iter().zip(weights).filter(|(_, w)| **w > 0.0).map(|(c, w)| (*c as f64, *w)).collect();
    let n: f64 = arms.iter().map(|a| a.0).sum();
    let w: f64 = arms.iter().map(|a| a.1).sum();
    if n == 0.0 || arms.len() < 2 {
        return Srm { chi2: 0.0, p: 1.0, ok: true };
    }
    let chi2: f64 = arms.iter().map(|(c, wi)| (c - n * wi / w).powi(2) / (n * wi / w)).sum();
    let p = chi2_sf(chi2, (arms.len() - 1) as f64).min(1.0);
    Srm { chi2, p, ok: p >= SRM_ALPHA }
}

/// P(X > x) for X ~ chi-square with `df` degrees of freedom: the regularized upper incomplete
/// gamma Q(df/2, x/2) (series below a + 1, Lentz's continued fraction above; Numerical
/// Recipes' gammq).
pub fn chi2_sf(x: f64, df: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let (a, x) = (df / 2.0, x / 2.0);
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut sum, mut term, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..1000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        (1.0 - sum * front).clamp(0.0, 1.0)
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-15 {
                break;
            }
        }
        (front * h).clamp(0.0, 1.0)
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; ~1e-15 relative).
pub fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Mann-Whitney U test of latency: is one variant stochastically faster?
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of sample `a`: pairs where a's latency is higher, ties counted half.
    pub u_a: f64,
    /// P(a random request of `a` is faster than one of `b`), ties counted half.
    pub prob_a_faster: f64,
    /// Normal approximation (tie-corrected), positive when `a` is slower.
    pub z: f64,
    pub p_two_sided: f64,
}

pub fn mann_whitney(a: &[f64], b: &[f64]) -> MannWhitney {
    let (na, nb) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return MannWhitney { u_a: 0.0, prob_a_faster: 0.5, z: 0.0, p_two_sided: 1.0 };
    }
    let mut all: Vec<(f64, bool)> = a.iter().map(|&x| (x, true)).chain(b.iter().map(|&x| (x, false))).collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut rank_sum_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let mid_rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_sum_a += mid_rank * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let u_a = rank_sum_a - na * (na + 1.0) / 2.0;
    let nf = n as f64;
    let var = na * nb / 12.0 * ((nf + 1.0) - ties / (nf * (nf - 1.0)));
    let z = if var > 0.0 { (u_a - na * nb / 2.0) / var.sqrt() } else { 0.0 };
    MannWhitney { u_a, prob_a_faster: 1.0 - u_a / (na * nb), z, p_two_sided: (2.0 * (1.0 - normal_cdf(z.abs()))).min(1.0) }
}

/// Two-proportion z-test (pooled), e.g. of error rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proportions {
    pub rate_a: f64,
    pub rate_b: f64,
    /// Positive when `b`'s rate is higher.
    pub z: f64,
    pub p_two_sided: f64,
}

pub fn two_proportions(ka: u64, na: u64, kb: u64, nb: u64) -> Proportions {
    let rate = |k: u64, n: u64| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    let (ra, rb) = (rate(ka, na), rate(kb, nb));
    let pool = rate(ka + kb, na + nb);
    let se = if na == 0 || nb == 0 { 0.0 } else { (pool * (1.0 - pool) * (1.0 / na as f64 + 1.0 / nb as f64)).sqrt() };
    let z = if se > 0.0 { (rb - ra) / se } else { 0.0 };
    Proportions { rate_a: ra, rate_b: rb, z, p_two_sided: (2.0 * (1.0 - normal_cdf(z.abs()))).min(1.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5), 3.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 1.0), 4.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn quantile_ci_uses_the_binomial_ranks() {
        // n = 100, median: 50 ± 1.96·5 → ranks 40 and 60 (1-based), indices 39 and 59.
        assert_eq!(quantile_ci(100, 0.5, Z95), (39, 59));
        // n = 1000, p99: 990 ± 1.96·√9.9 = 990 ± 6.17 → ranks 983 and 997.
        assert_eq!(quantile_ci(1000, 0.99, Z95), (982, 996));
        // Tiny samples clamp to the data.
        assert_eq!(quantile_ci(3, 0.99, Z95), (1, 2));
        assert_eq!(quantile_ci(1, 0.5, Z95), (0, 0));
    }

    #[test]
    fn wilson_intervals_match_published_values() {
        let (lo, hi) = wilson(0, 10, Z95);
        assert_eq!(lo, 0.0);
        assert!(close(hi, 0.2775, 1e-4), "{hi}");
        let (lo, hi) = wilson(5, 10, Z95);
        assert!(close(lo, 0.2366, 1e-4) && close(hi, 0.7634, 1e-4), "{lo} {hi}");
    }

    #[test]
    fn normal_cdf_known_points() {
        assert!(close(normal_cdf(0.0), 0.5, 1e-7));
        assert!(close(normal_cdf(1.959_964), 0.975, 1e-6));
        assert!(close(normal_cdf(-1.0), 0.158_655_25, 1e-6));
        assert!(close(normal_cdf(3.0), 0.998_650_1, 1e-6));
    }

    #[test]
    fn srm_chi_square_against_an_even_split() {
        let s = srm(5000, 5000);
        assert!(s.chi2 == 0.0 && close(s.p, 1.0, 1e-6) && s.ok, "{s:?}");
        // (50² + 50²) / 1050 = 4.762, p = 0.0291: suspicious but above the SRM threshold.
        let s = srm(1000, 1100);
        assert!(close(s.chi2, 4.7619, 1e-4) && close(s.p, 0.0291, 1e-4) && s.ok, "{s:?}");
        // 45/55 of 10,000 is a broken split.
        let s = srm(4500, 5500);
        assert!(close(s.chi2, 100.0, 1e-9) && s.p < 1e-20 && !s.ok, "{s:?}");
    }

    #[test]
    fn mann_whitney_known_answers() {
        // Complete separation, 3 vs 3: U_a = 0, z = -4.5 / √5.25 = -1.964, p = 0.0495 (scipy,
        // normal approximation without continuity correction).
        let m = mann_whitney(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        assert_eq!((m.u_a, m.prob_a_faster), (0.0, 1.0));
        assert!(close(m.z, -1.9640, 1e-4) && close(m.p_two_sided, 0.0495, 1e-4), "{m:?}");
        // Ties are mid-ranked: identical samples are a coin flip.
        let m = mann_whitney(&[1.0, 1.0, 2.0], &[1.0, 1.0, 2.0]);
        assert_eq!((m.u_a, m.prob_a_faster, m.z), (4.5, 0.5, 0.0));
        assert!(close(m.p_two_sided, 1.0, 1e-6), "{m:?}");
        // Interleaved: a = {1, 3, 5}, b = {2, 4, 6}: a beats b in 6 of 9 pairs.
        let m = mann_whitney(&[1.0, 3.0, 5.0], &[2.0, 4.0, 6.0]);
        assert!(close(m.prob_a_faster, 6.0 / 9.0, 1e-12) && m.z < 0.0, "{m:?}");
    }

    #[test]
    fn two_proportion_z_test_known_answer() {
        // 1% vs 3% of 1000: pooled 2%, se = √(0.02·0.98·0.002) = 0.006261, z = 3.194, p = 0.0014.
        let t = two_proportions(10, 1000, 30, 1000);
        assert!(close(t.z, 3.1944, 1e-3) && close(t.p_two_sided, 0.0014, 1e-4), "{t:?}");
        assert_eq!(two_proportions(0, 100, 0, 100).z, 0.0);
    }

    #[test]
    fn chi_square_tail_matches_tables() {
        // Critical values at 5%: df 1 → 3.841, df 2 → 5.991, df 4 → 9.488; at 0.1%: df 1 → 10.828.
        for (x, df, p) in [(3.841, 1.0, 0.05), (5.991, 2.0, 0.05), (9.488, 4.0, 0.05), (10.828, 1.0, 0.001)] {
            assert!(close(chi2_sf(x, df), p, p * 1e-3), "chi2_sf({x}, {df}) = {}", chi2_sf(x, df));
        }
        assert_eq!(chi2_sf(0.0, 3.0), 1.0);
        assert!(close(ln_gamma(5.0), 24f64.ln(), 1e-12));
    }

    #[test]
    fn srm_against_configured_weights() {
        // 51/49 of 100,000 on a 50/50 split: chi2 = 2 × 1000² / 50000 = 40, p ≈ 2.5e-10.
        let s = srm(51_000, 49_000);
        assert!(close(s.chi2, 40.0, 1e-9) && s.p < 1e-9 && !s.ok, "{s:?}");
        // A 1/99 step delivered as asked is fine; the same counts against 5/95 are not.
        assert!(srm_weighted(&[1_010, 98_990], &[1.0, 99.0]).ok);
        assert!(!srm_weighted(&[1_010, 98_990], &[5.0, 95.0]).ok);
        // Three arms, exact split.
        let s = srm_weighted(&[500, 300, 200], &[5.0, 3.0, 2.0]);
        assert!(close(s.chi2, 0.0, 1e-12) && close(s.p, 1.0, 1e-12), "{s:?}");
    }
}
