//! The live autoscaler's spend ledger, for monthly budget pacing (`budget` in an autoscaler):
//! what each autoscaler's replicas have cost this calendar month (UTC), kept in its committed
//! `scalingdecisions/<name>` record without any extra write. Between two records the replica
//! counts do not change, so the spend grows linearly: a record carries the spend up to the
//! moment it was committed, and the spend now is that plus the record's hourly rate times the
//! hours since. A new leader reads the same numbers from the store.

use super::spec::{AutoscalerSpec, DecisionRecord};

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil (year, month) of a day count (`civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    (yoe + era * 400 + i64::from(m <= 2), m)
}

/// The UTC calendar month holding `unix_s`: (start, length), both in seconds.
pub fn month(unix_s: f64) -> (f64, f64) {
    let (y, m) = civil_from_days((unix_s / 86_400.0).floor() as i64);
    let start = days_from_civil(y, m, 1);
    let next = if m == 12 { days_from_civil(y + 1, 1, 1) } else { days_from_civil(y, m + 1, 1) };
    (start as f64 * 86_400.0, (next - start) as f64 * 86_400.0)
}

/// What `on_demand` + `spot` replicas of `spec` cost per hour.
pub fn rate(spec: &AutoscalerSpec, on_demand: u32, spot: u32) -> f64 {
    let spot_price = spec.spot.map_or(spec.price_per_hour, |s| s.price_per_hour);
    f64::from(on_demand) * spec.price_per_hour + f64::from(spot) * spot_price
}

/// This month's spend of the autoscaler whose committed record is `r`, at `unix_s`.
pub fn spent_now(spec: &AutoscalerSpec, r: &DecisionRecord, unix_s: f64) -> f64 {
    let (start, _) = month(unix_s);
    let per_s = rate(spec, r.on_demand, r.spot) / 3600.0;
    if r.spent_at <= 0.0 || month(r.spent_at).0 != start {
        // No ledger yet, or it is from an earlier month: the current replicas since the later
        // of the month's start and the record's commit.
        return per_s * (unix_s - start.max(r.spent_at)).max(0.0);
    }
    r.spent_usd + per_s * (unix_s - r.spent_at).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_months_in_utc() {
        // 2026-11-30T12:00:00Z
        let t = 1_796_040_000.0;
        let (start, len) = month(t);
        assert_eq!(start, 1_793_491_200.0, "2026-11-01T00:00:00Z");
        assert_eq!(len, 30.0 * 86_400.0);
        assert_eq!(month(start + len).1, 31.0 * 86_400.0, "December");
        assert_eq!(month(951_782_400.0).1, 29.0 * 86_400.0, "February 2000 is a leap month");
        assert_eq!(month(0.0), (0.0, 31.0 * 86_400.0));
    }

    fn spec() -> AutoscalerSpec {
        serde_json::from_value(serde_json::json!({"variant": "a", "capacity_rps": 10.0, "price_per_hour": 2.0,
            "spot": {"price_per_hour": 0.5, "preemptions_per_hour": 0.1}})).unwrap()
    }

    fn record(on_demand: u32, spot: u32, spent_usd: f64, spent_at: f64) -> DecisionRecord {
        DecisionRecord {
            variant: "a".into(),
            policy: Default::default(),
            replicas: on_demand + spot,
            on_demand,
            spot,
            reason: "stable".into(),
            demand_rps: 0.0,
            forecast_rps: None,
            spent_usd,
            spent_at,
        }
    }

    #[test]
    fn spend_grows_at_the_records_rate_and_restarts_each_month() {
        let s = spec();
        let (start, len) = month(1_796_040_000.0);
        assert_eq!(rate(&s, 2, 4), 2.0 * 2.0 + 4.0 * 0.5);
        let r = record(2, 4, 100.0, start + 3600.0);
        assert_eq!(spent_now(&s, &r, start + 3.0 * 3600.0), 100.0 + 6.0 * 2.0, "two hours at $6/h");
        // Next month: only what ran since it began.
        assert_eq!(spent_now(&s, &r, start + len + 1800.0), 3.0);
        // No ledger: since the month began.
        assert_eq!(spent_now(&s, &record(1, 0, 0.0, 0.0), start + 7200.0), 4.0);
    }
}
