//! Durations as people write them in YAML: "250ms", "2s", "5m", "1h", "0".
//! A bare number other than 0 is rejected: "timeout: 30" is ambiguous (seconds? ms?).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn from_millis(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }
    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }
    /// `None` for zero, which means "off" wherever a timeout is configured.
    pub fn non_zero(&self) -> Option<Duration> {
        (!self.0.is_zero()).then_some(self.0)
    }
}

pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(|| {
        format!("duration {s:?} has no unit: write e.g. \"250ms\", \"2s\", \"5m\"")
    })?;
    let (num, unit) = s.split_at(split);
    let unit_ns: u64 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(format!("duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    let out_of_range = || format!("duration {s:?} is out of range");
    const MAX_NS: u64 = 10 * 365 * 86400 * 1_000_000_000;
    // Whole numbers exactly (what `Dur` writes back reads back the same); fractions via f64.
    let ns = match num.parse::<u64>() {
        Ok(n) => n.checked_mul(unit_ns).ok_or_else(out_of_range)?,
        Err(_) => {
            let n: f64 = num.parse().map_err(|_| format!("duration {s:?}: {num:?} is not a number"))?;
            let ns = (n * unit_ns as f64).round();
            if !ns.is_finite() || ns > MAX_NS as f64 {
                return Err(out_of_range());
            }
            ns as u64
        }
    };
    if ns > MAX_NS {
        return Err(out_of_range());
    }
    Ok(Duration::from_nanos(ns))
}

impl fmt::Debug for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // In the largest unit that holds it exactly: what is written (config dumps, the saved
        // xDS config) reads back as the same duration.
        let ns = self.0.as_nanos();
        match ns {
            0 => write!(f, "0"),
            _ if ns.is_multiple_of(1_000_000_000) => write!(f, "{}s", ns / 1_000_000_000),
            _ if ns.is_multiple_of(1_000_000) => write!(f, "{}ms", ns / 1_000_000),
            _ if ns.is_multiple_of(1_000) => write!(f, "{}us", ns / 1_000),
            _ => write!(f, "{ns}ns"),
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// In a CRD schema (weft-k8s): a string such as "250ms" or "2s", or the number 0 (= off), as
/// [`Deserialize`] accepts.
impl schemars::JsonSchema for Dur {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "a duration with a unit (\"250ms\", \"2s\", \"5m\"), or 0 = off",
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            // Checked by the API server already, so a bad value never reaches a watcher
            // (which would fail to decode the whole list): strings as `parse` takes them,
            // numbers only 0.
            "pattern": "^\\s*(0|[0-9]*\\.?[0-9]+(ns|us|µs|ms|s|m|h))\\s*$",
            "minimum": 0,
            "maximum": 0
        })
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(0) => Ok(Dur(Duration::ZERO)),
            Raw::Num(n) => Err(serde::de::Error::custom(format!(
                "duration {n} has no unit: write e.g. \"{n}s\" or \"{n}ms\""
            ))),
            Raw::Text(t) => parse(&t).map(Dur).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn rejects_ambiguous_or_bad() {
        assert!(parse("30").unwrap_err().contains("no unit"));
        assert!(parse("3 parsecs").is_err());
        assert!(parse("ms").is_err());
        assert!(parse("1e400s").is_err());
    }

    #[test]
    fn display_round_trips() {
        for s in ["250ms", "2s", "0", "300s"] {
            let d = Dur(parse(s).unwrap());
            assert_eq!(Dur(parse(&d.to_string()).unwrap()), d);
        }
        // Sub-millisecond and odd values too (they were written rounded: 1.5 ms as "1ms",
        // 500 ns as "0us", which a saved xDS config then read back as 0 and rejected).
        for d in [Duration::from_nanos(500), Duration::from_micros(1500), Duration::from_nanos(1_000_000_001), Duration::from_secs(36_000)] {
            let written = Dur(d).to_string();
            assert_eq!(parse(&written).unwrap(), d, "{written}");
        }
        assert_eq!(Dur(Duration::from_micros(1500)).to_string(), "1500us");
        assert_eq!(parse("1.5ms").unwrap(), Duration::from_micros(1500));
    }
}
