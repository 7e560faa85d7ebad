//! Memory budgets as users write them: bytes, units, or a percentage.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A user's memory budget.
///
/// Absolute budgets are *total* memory (static + activations); every strategy gets the activation
/// budget `total - static`. A percentage is relative to the activation peak of the checkpoint-all
/// plan, so `100%` is exactly the memory of training without rematerialization and `50%` halves the
/// activation memory; static memory is added on top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Total bytes.
    Bytes(u64),
    /// Percent of the checkpoint-all activation peak (plus static memory).
    PercentOfCheckpointAll(f64),
}

impl Budget {
    /// The total budget in bytes, given the graph's static bytes and the checkpoint-all activation
    /// peak.
    pub fn total_bytes(self, static_bytes: u64, checkpoint_all_peak: u64) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::PercentOfCheckpointAll(p) => {
                static_bytes + (checkpoint_all_peak as f64 * p / 100.0).round() as u64
            }
        }
    }

    /// The activation budget (total minus static), or `None` when the total does not even hold the
    /// static memory.
    pub fn activation_bytes(self, static_bytes: u64, checkpoint_all_peak: u64) -> Option<u64> {
        self.total_bytes(static_bytes, checkpoint_all_peak)
            .checked_sub(static_bytes)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Bytes(b) => write!(f, "{}", format_bytes(*b)),
            Budget::PercentOfCheckpointAll(p) => write!(f, "{p}%"),
        }
    }
}

const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
];

impl FromStr for Budget {
    type Err = Error;

    fn from_str(s: &str) -> Result<Budget, Error> {
        let err = |reason: &str| Error::Budget {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(err("it is empty"));
        }
        if let Some(num) = t.strip_suffix('%') {
            let p: f64 = num
                .trim()
                .parse()
                .map_err(|_| err("the percentage is not a number"))?;
            if !p.is_finite() || p <= 0.0 {
                return Err(err("the percentage must be positive"));
            }
            return Ok(Budget::PercentOfCheckpointAll(p));
        }
        let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
        let (num, unit) = (t[..split].trim(), t[split..].trim());
        if unit.is_empty() {
            return num
                .parse::<u64>()
                .map(Budget::Bytes)
                .map_err(|_| err("a plain number must be a whole number of bytes"));
        }
        let mult = UNITS
            .iter()
            .find(|(u, _)| u.eq_ignore_ascii_case(unit))
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                err(&format!(
                    "unknown unit {unit:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
                ))
            })?;
        let x: f64 = num.parse().map_err(|_| err("the amount is not a number"))?;
        if !x.is_finite() || x < 0.0 {
            return Err(err("the amount must be non-negative"));
        }
        let bytes = x * mult as f64;
        if bytes >= u64::MAX as f64 {
            return Err(err("the amount is too large"));
        }
        Ok(Budget::Bytes(bytes.round() as u64))
    }
}

/// `1.50 GiB`-style rendering of a byte count.
pub fn format_bytes(b: u64) -> String {
    match byte_unit(b) {
        ("B", _) => format!("{b} B"),
        (unit, size) => format!("{:.2} {unit}", b as f64 / size),
    }
}

/// The binary unit [`format_bytes`] writes `b` in: its name (`B`, `KiB`, `MiB` or `GiB`) and its
/// size in bytes (e.g. for a plot's axis in the unit a table uses).
pub fn byte_unit(b: u64) -> (&'static str, f64) {
    const K: f64 = 1024.0;
    let x = b as f64;
    if x >= K * K * K {
        ("GiB", K * K * K)
    } else if x >= K * K {
        ("MiB", K * K)
    } else if x >= K {
        ("KiB", K)
    } else {
        ("B", 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            "6442450944".parse::<Budget>().unwrap(),
            Budget::Bytes(6_442_450_944)
        );
        assert_eq!("6GiB".parse::<Budget>().unwrap(), Budget::Bytes(6 << 30));
        assert_eq!(
            "500MB".parse::<Budget>().unwrap(),
            Budget::Bytes(500_000_000)
        );
        assert_eq!("1.5 kib".parse::<Budget>().unwrap(), Budget::Bytes(1536));
        assert_eq!(
            "50%".parse::<Budget>().unwrap(),
            Budget::PercentOfCheckpointAll(50.0)
        );
    }

    #[test]
    fn rejects_malformed_budgets_with_a_reason() {
        for bad in ["", "abc", "6XB", "-5%", "12.5", "1e999GB", "%", "-3GB"] {
            let e = bad.parse::<Budget>().unwrap_err().to_string();
            assert!(e.contains("cannot parse budget"), "{bad}: {e}");
            assert!(
                e.contains("GiB"),
                "message should say what is accepted: {e}"
            );
        }
    }

    #[test]
    fn percent_is_of_the_activation_peak_plus_static() {
        let b = Budget::PercentOfCheckpointAll(50.0);
        assert_eq!(b.total_bytes(100, 1000), 600);
        assert_eq!(b.activation_bytes(100, 1000), Some(500));
        assert_eq!(Budget::Bytes(50).activation_bytes(100, 1000), None);
    }
}
