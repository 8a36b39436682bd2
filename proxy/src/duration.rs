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
    let n: f64 = num.parse().map_err(|_| format!("duration {s:?}: {num:?} is not a number"))?;
    let secs = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs > 10.0 * 365.0 * 86400.0 {
        return Err(format!("duration {s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl fmt::Debug for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 && self.0.is_zero() {
            write!(f, "0")
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else if ms > 0 {
            write!(f, "{ms}ms")
        } else {
            write!(f, "{}us", self.0.as_micros())
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
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
    }
}
