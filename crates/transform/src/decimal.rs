//! Exact decimals from text, refused (never rounded) when they do not fit.
//!
//! rust_decimal holds a 96-bit integer and a scale of 0 to 28, so a value
//! fits when its magnitude is at most 79228162514264337593543950335, its
//! significant digits make an integer no larger than that (28 digits, or
//! 29 up to that maximum) and its last digit is at most 28 places after the
//! point. The crate's own parsers cannot say which limit a value passes
//! (`1.5E+30` and `1e-40` are both "scale exceeds maximum precision"; an
//! over-long mantissa is "underflow"), and `from_scientific` rounds. So the
//! number is split into its significant digits and a power of ten here,
//! checked against each limit, and built exactly from them.

use std::fmt;

use rust_decimal::Decimal;

/// The largest magnitude a decimal holds, 2^96 - 1.
const MAX: &str = "79228162514264337593543950335";
/// Its number of digits.
const MAX_DIGITS: usize = MAX.len();
/// The most places after the point.
const MAX_PLACES: u32 = 28;

/// Why a plain number does not fit a decimal exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unfit {
    /// The magnitude exceeds [`MAX`].
    Magnitude,
    /// More significant digits than the 96-bit integer holds.
    Digits(usize),
    /// A digit further than 28 places after the point.
    Places(u64),
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::Magnitude => write!(
                f,
                "decimal out of range: its magnitude exceeds {MAX}, the largest a decimal holds"
            ),
            Unfit::Digits(n) => write!(
                f,
                "decimal out of range: it has {n} significant digits, and a decimal holds at most 28 (29 up to {MAX}); tidemark never rounds"
            ),
            Unfit::Places(n) => write!(
                f,
                "decimal out of range: it has a digit {n} places after the point, and a decimal holds at most {MAX_PLACES} (down to 1e-{MAX_PLACES}); tidemark never rounds"
            ),
        }
    }
}

/// Reads a plain number (`-12.50`, `1.5E+30`, `.5e-3`: already checked by
/// the caller's syntax check) as an exact, normalised decimal.
pub(crate) fn exact(s: &str) -> Result<Decimal, Unfit> {
    let negative = s.starts_with('-');
    let unsigned = s.trim_start_matches(['+', '-']);
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], parse_exponent(&unsigned[at + 1..])),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let leading = digits.trim_start_matches('0');
    let significant = leading.trim_end_matches('0');
    if significant.is_empty() {
        return Ok(Decimal::ZERO);
    }
    // The value is `significant` × 10^power.
    let power = exponent
        .saturating_sub(length(fraction))
        .saturating_add(length(leading) - length(significant));
    let magnitude = unsigned_exact(significant, power)?;
    Ok(if negative { -magnitude } else { magnitude }.normalize())
}

/// `significant` (no leading or trailing zeros) × 10^`power`.
fn unsigned_exact(significant: &str, power: i64) -> Result<Decimal, Unfit> {
    let count = significant.len();
    let whole_digits = length(significant).saturating_add(power);
    if whole_digits > length(MAX) {
        return Err(Unfit::Magnitude);
    }
    if whole_digits == length(MAX) {
        // Same number of whole digits as MAX: compare them as text.
        let whole: String = significant
            .chars()
            .chain(std::iter::repeat('0'))
            .take(MAX_DIGITS)
            .collect();
        if whole.as_str() > MAX || (whole == MAX && power < 0) {
            return Err(Unfit::Magnitude);
        }
    }
    if count > MAX_DIGITS || (count == MAX_DIGITS && significant > MAX) {
        return Err(Unfit::Digits(count));
    }
    let integer: i128 = significant.parse().map_err(|_| Unfit::Digits(count))?;
    if power >= 0 {
        let scaled = u32::try_from(power)
            .ok()
            .and_then(|p| 10_i128.checked_pow(p))
            .and_then(|factor| integer.checked_mul(factor))
            .ok_or(Unfit::Magnitude)?;
        return Decimal::try_from_i128_with_scale(scaled, 0).map_err(|_| Unfit::Magnitude);
    }
    let places = power.unsigned_abs();
    match u32::try_from(places) {
        Ok(scale) if scale <= MAX_PLACES => {
            Decimal::try_from_i128_with_scale(integer, scale).map_err(|_| Unfit::Digits(count))
        }
        _ => Err(Unfit::Places(places)),
    }
}

/// An exponent; one beyond `i64` is beyond every limit, so it saturates.
fn parse_exponent(text: &str) -> i64 {
    text.parse().unwrap_or(if text.starts_with('-') {
        i64::MIN
    } else {
        i64::MAX
    })
}

fn length(digits: &str) -> i64 {
    i64::try_from(digits.len()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn ok(s: &str) -> String {
        exact(s).unwrap_or_else(|e| panic!("{s}: {e}")).to_string()
    }

    #[test]
    fn values_that_fit_are_exact_and_normalised() {
        for (input, stored) in [
            ("10.50", "10.5"),
            ("150e-2", "1.5"),
            ("-0", "0"),
            ("-0.0e99999999999999999999", "0"),
            ("0e-400", "0"),
            ("1200", "1200"),
            ("1.2e3", "1200"),
            ("+7", "7"),
            (".5", "0.5"),
            ("5.", "5"),
            ("-1.25E-2", "-0.0125"),
            ("000000000000000000000000000000012.50", "12.5"),
            ("1.00000000000000000000000000000000000", "1"),
            (MAX, MAX),
            (
                "-79228162514264337593543950335",
                "-79228162514264337593543950335",
            ),
            (
                "7.9228162514264337593543950335",
                "7.9228162514264337593543950335",
            ),
            ("7.9228162514264337593543950335e28", MAX),
            ("1e-28", "0.0000000000000000000000000001"),
            ("100e-30", "0.0000000000000000000000000001"),
            ("1.5E+28", "15000000000000000000000000000"),
            (
                "0.1234567890123456789012345678",
                "0.1234567890123456789012345678",
            ),
        ] {
            assert_eq!(ok(input), stored, "{input}");
            assert_eq!(
                exact(input).ok(),
                Decimal::from_str(stored).ok().map(|d| d.normalize()),
                "{input}"
            );
        }
    }

    #[test]
    fn each_limit_is_named() {
        for (input, unfit) in [
            // Two significant digits: the magnitude is what does not fit.
            ("1.5E+30", Unfit::Magnitude),
            ("1e40", Unfit::Magnitude),
            ("1e99999999999999999999", Unfit::Magnitude),
            ("79228162514264337593543950336", Unfit::Magnitude),
            ("79228162514264337593543950335.5", Unfit::Magnitude),
            ("99999999999999999999999999999", Unfit::Magnitude),
            ("-123456789012345678901234567890", Unfit::Magnitude),
            ("1.0000000000000000000000000000001", Unfit::Digits(32)),
            ("0.1000000000000000055511151231257827", Unfit::Digits(34)),
            ("7.9228162514264337593543950336", Unfit::Digits(29)),
            ("12345678901234567890.123456789012", Unfit::Digits(32)),
            ("1e-29", Unfit::Places(29)),
            ("-1.5e-40", Unfit::Places(41)),
            ("0.00000000000000000000000000001", Unfit::Places(29)),
            (
                "1e-99999999999999999999",
                Unfit::Places(i64::MIN.unsigned_abs()),
            ),
        ] {
            assert_eq!(exact(input), Err(unfit), "{input}");
        }
        let magnitude = Unfit::Magnitude.to_string();
        assert!(magnitude.contains(MAX), "{magnitude}");
        assert!(!magnitude.contains("significant"), "{magnitude}");
        assert!(Unfit::Digits(32)
            .to_string()
            .contains("32 significant digits"));
        assert!(Unfit::Places(29)
            .to_string()
            .contains("29 places after the point"));
    }
}
