//! Resource quantities (upstream `resource.Quantity`) as exact integers: parsing `100m`,
//! `1.5Gi`, `2e3`, comparing and adding them, and printing sums in upstream's canonical
//! form, for the volume binder's capacity match and the quota controller's usage.

use std::fmt;

/// Nano-units per unit: the finest suffix (`n`) is exact.
const NANOS: i128 = 1_000_000_000;

/// How a quantity was written, which decides how a sum of it is printed (upstream's
/// `Format`: a sum keeps the format of its first non-zero operand).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Powers of 1000 (`k`, `M`, `m`) or no suffix.
    #[default]
    DecimalSi,
    /// Powers of 1024 (`Ki`, `Mi`, …).
    BinarySi,
}

/// An exact quantity in nano-units; equal and ordered by value alone (`1Gi` == `1073741824`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// A string that is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {:?}",
            self.0
        )
    }
}

impl std::error::Error for ParseError {}

impl Quantity {
    /// Zero, printed `0`.
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: Format::DecimalSi,
    };

    /// A whole number of units (an object count).
    pub fn from_count(count: i64) -> Self {
        Quantity {
            nanos: i128::from(count) * NANOS,
            format: Format::DecimalSi,
        }
    }

    /// Parses upstream's quantity syntax; fractions finer than a nano-unit round up.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let fail = || ParseError(text.to_string());
        let trimmed = text.trim();
        let (negative, unsigned) = match trimmed.as_bytes().first() {
            Some(b'-') => (true, &trimmed[1..]),
            Some(b'+') => (false, &trimmed[1..]),
            _ => (false, trimmed),
        };
        let number_end = unsigned
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(unsigned.len());
        let (number, suffix) = unsigned.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(fail());
        }
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        // Every value this type holds prints in at most 39 significant digits, so that many
        // parse (a mantissa beyond i128 fails its parse; a scale beyond it, the checked
        // arithmetic below). Leading zeros are not significant.
        let digits = format!("{whole}{fraction}");
        let significant = digits.trim_start_matches('0');
        if significant.len() > 39 {
            return Err(fail());
        }
        let mantissa: i128 = if significant.is_empty() {
            0
        } else {
            significant.parse().map_err(|_| fail())?
        };
        let (mut decimal_exponent, binary_shift, format) = match suffix {
            "" => (0, 0, Format::DecimalSi),
            "n" => (-9, 0, Format::DecimalSi),
            "u" => (-6, 0, Format::DecimalSi),
            "m" => (-3, 0, Format::DecimalSi),
            "k" => (3, 0, Format::DecimalSi),
            "M" => (6, 0, Format::DecimalSi),
            "G" => (9, 0, Format::DecimalSi),
            "T" => (12, 0, Format::DecimalSi),
            "P" => (15, 0, Format::DecimalSi),
            "E" => (18, 0, Format::DecimalSi),
            "Ki" => (0, 10, Format::BinarySi),
            "Mi" => (0, 20, Format::BinarySi),
            "Gi" => (0, 30, Format::BinarySi),
            "Ti" => (0, 40, Format::BinarySi),
            "Pi" => (0, 50, Format::BinarySi),
            "Ei" => (0, 60, Format::BinarySi),
            exponent if exponent.starts_with(['e', 'E']) => {
                let value: i32 = exponent[1..].parse().map_err(|_| fail())?;
                if !(-30..=30).contains(&value) {
                    return Err(fail());
                }
                (value, 0, Format::DecimalSi)
            }
            _ => return Err(fail()),
        };
        decimal_exponent += 9 - fraction.len() as i32;
        let scaled = mantissa
            .checked_mul(1i128 << binary_shift)
            .ok_or_else(fail)?;
        let nanos = if decimal_exponent >= 0 {
            10i128
                .checked_pow(decimal_exponent as u32)
                .and_then(|power| scaled.checked_mul(power))
                .ok_or_else(fail)?
        } else {
            let divisor = 10i128
                .checked_pow(decimal_exponent.unsigned_abs())
                .ok_or_else(fail)?;
            // Upstream rounds a value finer than its precision up, never to zero (without
            // adding to `scaled` first, which may be near the type's limit).
            scaled / divisor + i128::from(scaled % divisor != 0)
        };
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }

    /// Whether the quantity is zero.
    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// The exact value in nano-units (`1m` is 1 000 000).
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// Upstream's `MilliValue`: thousandths, rounded up.
    pub fn milli_value(self) -> i128 {
        -((-self.nanos).div_euclid(1_000_000))
    }
}

impl Quantity {
    /// The difference, in this quantity's format (upstream's `Sub`).
    pub fn minus(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_sub(other.nanos),
            format: self.format,
        }
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;

    /// The sum, in the format of the first non-zero operand.
    fn add(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl fmt::Display for Quantity {
    /// Upstream's canonical form: the largest suffix that keeps the number whole (`1500m`,
    /// `2k`, `1536Mi`); binary quantities below 1024 or with fractions print as decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();
        if self.format == Format::BinarySi
            && magnitude.is_multiple_of(NANOS as u128)
            && magnitude / (NANOS as u128) >= 1024
        {
            let units = magnitude / NANOS as u128;
            for (shift, suffix) in [
                (60, "Ei"),
                (50, "Pi"),
                (40, "Ti"),
                (30, "Gi"),
                (20, "Mi"),
                (10, "Ki"),
            ] {
                if units.is_multiple_of(1u128 << shift) {
                    return write!(f, "{sign}{}{suffix}", units >> shift);
                }
            }
            return write!(f, "{sign}{units}");
        }
        if magnitude == 0 {
            return write!(f, "0");
        }
        for (exponent, suffix) in [
            (27u32, "E"),
            (24, "P"),
            (21, "T"),
            (18, "G"),
            (15, "M"),
            (12, "k"),
            (9, ""),
            (6, "m"),
            (3, "u"),
            (0, "n"),
        ] {
            let unit = 10u128.pow(exponent);
            if magnitude.is_multiple_of(unit) {
                return write!(f, "{sign}{}{suffix}", magnitude / unit);
            }
        }
        write!(f, "{sign}{magnitude}n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_and_prints_canonically() {
        for (input, canonical) in [
            ("0", "0"),
            ("100m", "100m"),
            ("1", "1"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("0.1", "100m"),
            ("2000", "2k"),
            ("1500", "1500"),
            ("1e3", "1k"),
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("0.5Gi", "512Mi"),
            ("512", "512"),
            ("1M", "1M"),
            ("-100m", "-100m"),
            ("1n", "1n"),
            // Whole but not a multiple of 1024: upstream keeps the binary format and prints
            // the plain number, which then reads back as decimal (found by the fuzz target).
            ("62.5Ki", "64000"),
            ("64000", "64k"),
        ] {
            assert_eq!(q(input).to_string(), canonical, "{input}");
        }
    }

    /// Found by the `scalars` fuzz target: a 30-digit value printed in 31 digits that the
    /// parser then refused (it capped the digits at 30, not at what the type holds).
    #[test]
    fn what_prints_parses_back() {
        let long = q("6999999999999699999999969.99998");
        assert_eq!(long.to_string(), "6999999999999699999999969999980u");
        assert_eq!(q(&long.to_string()), long);
        assert_eq!(q("000000000000000000000000000000000000000001"), q("1"));
        // Beyond what 128 bits of nano-units hold: refused, not wrapped.
        assert!(Quantity::parse("999999999999999999999999999999999999999").is_err());
        assert!(Quantity::parse("1E30").is_err());
        // A 39-digit fraction of a nano-unit rounds up without overflowing on the way.
        assert_eq!(q(".99999911999999999919999999991199999999n"), q("1n"));
    }

    #[test]
    fn rejects_what_upstream_rejects() {
        for bad in ["", "abc", "1.2.3", "1Xi", "Gi", ".", "1e"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn compares_by_value_across_formats() {
        assert_eq!(q("1Gi"), q("1073741824"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("500Mi") < q("1Gi"));
        assert!(q("100m") < q("1"));
    }

    #[test]
    fn sums_keep_the_first_non_zero_format() {
        let sum = Quantity::ZERO + q("64Mi") + q("64Mi");
        assert_eq!(sum.to_string(), "128Mi");
        let cpu = Quantity::ZERO + q("100m") + q("900m");
        assert_eq!(cpu.to_string(), "1");
        assert_eq!(Quantity::from_count(3).to_string(), "3");
    }
}
