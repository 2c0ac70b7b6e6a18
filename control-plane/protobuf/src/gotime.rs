//! Go's time text forms as Kubernetes JSON uses them: RFC 3339 the way `metav1.Time` (whole
//! seconds) and `metav1.MicroTime` (6 fraction digits) write it, and `time.Duration`'s
//! `String` / `ParseDuration`, which `metav1.Duration` uses.

use chrono::{DateTime, SecondsFormat, Utc};

/// Formats Unix seconds (+ nanoseconds) as UTC RFC 3339: `2006-01-02T15:04:05Z`, or with
/// `micros` `2006-01-02T15:04:05.000000Z` (nanoseconds truncated, as Go's formatter does).
pub(crate) fn format_rfc3339(seconds: i64, nanos: u32, micros: bool) -> Result<String, String> {
    let time = DateTime::<Utc>::from_timestamp(seconds, if micros { nanos } else { 0 })
        .ok_or_else(|| format!("time {seconds}s is out of range"))?;
    // Go prints years past 9999 without the sign chrono adds, and such times never occur in a
    // real object: refusing them beats producing something neither side parses.
    if !(0..=9999).contains(&chrono::Datelike::year(&time)) {
        return Err(format!("time {seconds}s is outside years 0-9999"));
    }
    let format = if micros {
        SecondsFormat::Micros
    } else {
        SecondsFormat::Secs
    };
    Ok(time.to_rfc3339_opts(format, true))
}

/// Parses RFC 3339 (any offset, optional fraction) into Unix seconds and nanoseconds.
pub(crate) fn parse_rfc3339(text: &str) -> Result<(i64, u32), String> {
    let time = DateTime::parse_from_rfc3339(text)
        .map_err(|err| format!("{text:?} is not an RFC 3339 time: {err}"))?;
    Ok((time.timestamp(), time.timestamp_subsec_nanos()))
}

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// Go's `time.Duration.String`: `"1h0m0s"`, `"1.5s"`, `"300ms"`, `"1.5µs"`, `"0s"`.
pub(crate) fn format_duration(nanos: i64) -> String {
    let negative = nanos < 0;
    let u = nanos.unsigned_abs();
    let mut text = String::new();
    if u < SECOND {
        // Below a second Go switches to the largest unit that keeps an integer part.
        let (prec, unit) = match u {
            0 => return "0s".to_owned(),
            _ if u < MICROSECOND => (0, "ns"),
            _ if u < MILLISECOND => (3, "µs"),
            _ => (6, "ms"),
        };
        text.push_str(&with_fraction(u, prec));
        text.push_str(unit);
    } else {
        let seconds = u / SECOND;
        let mut tail = with_fraction(u % MINUTE, 9);
        tail.push('s');
        let minutes = seconds / 60;
        // Hours are the largest unit: days vary in length, so Go stops there.
        if minutes >= 60 {
            text = format!("{}h{}m{tail}", minutes / 60, minutes % 60);
        } else if minutes > 0 {
            text = format!("{minutes}m{tail}");
        } else {
            text = tail;
        }
    }
    if negative {
        text.insert(0, '-');
    }
    text
}

/// `value / 10^prec` with the remainder as a fraction, trailing zeros (and a bare point)
/// dropped, as Go's `fmtFrac` + `fmtInt` print it.
fn with_fraction(value: u64, prec: u32) -> String {
    let scale = 10u64.pow(prec);
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:0width$}", width = prec as usize);
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers with units (`ns`, `us`/`µs`/`μs`,
/// `ms`, `s`, `m`, `h`), optionally signed, e.g. `"1h30m"`, `"-1.5s"`, `"0"`.
pub(crate) fn parse_duration(text: &str) -> Result<i64, String> {
    let invalid = || format!("invalid duration {text:?}");
    let overflow = || format!("duration {text:?} is out of range");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    // Accumulate in u128 so that one overflow check per component is enough.
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (whole, after) = rest.split_at(digits_end);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => {
                let end = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(end)
            }
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_end = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let unit = match unit {
            "ns" => NANOSECOND,
            "us" | "µs" | "μs" => MICROSECOND,
            "ms" => MILLISECOND,
            "s" => SECOND,
            "m" => MINUTE,
            "h" => HOUR,
            "" => return Err(format!("missing unit in duration {text:?}")),
            other => return Err(format!("unknown unit {other:?} in duration {text:?}")),
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| overflow())?
        };
        let mut value = whole.checked_mul(u128::from(unit)).ok_or_else(overflow)?;
        // Go scales the fraction through a float64; the digits beyond nanosecond precision
        // cannot matter, so 18 digits in integer arithmetic give the same result without
        // float rounding surprises.
        let fraction = &fraction[..fraction.len().min(18)];
        if !fraction.is_empty() {
            let numerator: u128 = fraction.parse().map_err(|_| invalid())?;
            let scale = 10u128.pow(fraction.len() as u32);
            value += numerator * u128::from(unit) / scale;
        }
        total = total.checked_add(value).ok_or_else(overflow)?;
        if total > 1u128 << 63 {
            return Err(overflow());
        }
        rest = after;
    }
    if negative {
        // -2^63 is representable, +2^63 is not.
        i64::try_from(-(total as i128)).map_err(|_| overflow())
    } else {
        i64::try_from(total).map_err(|_| overflow())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_format_like_go() {
        // Expected strings are what Go's time.Duration.String prints for these values.
        let cases: &[(i64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (3_300_000_000, "3.3s"),
            (4 * 60 * 1_000_000_000 + 5_000_000_000, "4m5s"),
            (4 * 60 * 1_000_000_000 + 5_001_000_000, "4m5.001s"),
            (
                5 * 3_600_000_000_000 + 6 * 60_000_000_000 + 7_001_000_000,
                "5h6m7.001s",
            ),
            (8 * 60_000_000_000 + 1, "8m0.000000001s"),
            (3_600_000_000_000, "1h0m0s"),
            (-1_500_000_000, "-1.5s"),
            (i64::MAX, "2562047h47m16.854775807s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ];
        for (nanos, want) in cases {
            assert_eq!(format_duration(*nanos), *want, "{nanos}");
            assert_eq!(parse_duration(want), Ok(*nanos), "{want}");
        }
    }

    #[test]
    fn durations_parse_like_go() {
        let cases: &[(&str, Result<i64, ()>)] = &[
            ("0", Ok(0)),
            ("5s", Ok(5_000_000_000)),
            ("+5s", Ok(5_000_000_000)),
            ("1h30m", Ok(5_400_000_000_000)),
            (".5s", Ok(500_000_000)),
            ("1.s", Ok(1_000_000_000)),
            ("100us", Ok(100_000)),
            ("100μs", Ok(100_000)),
            ("1.0000000001s", Ok(1_000_000_000)),
            ("", Err(())),
            ("-", Err(())),
            ("s", Err(())),
            (".s", Err(())),
            ("5", Err(())),
            ("5d", Err(())),
            ("1h-5m", Err(())),
            ("9223372036854775808ns", Err(())),
            ("-9223372036854775808ns", Ok(i64::MIN)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).map_err(|_| ()), *want, "{text:?}");
        }
    }

    #[test]
    fn times_format_like_metav1() {
        let cases: &[(i64, u32, bool, &str)] = &[
            (0, 0, false, "1970-01-01T00:00:00Z"),
            (1_700_000_000, 999_999_999, false, "2023-11-14T22:13:20Z"),
            (
                1_700_000_000,
                123_456_789,
                true,
                "2023-11-14T22:13:20.123456Z",
            ),
            (1_700_000_000, 0, true, "2023-11-14T22:13:20.000000Z"),
            (-62_135_596_800, 0, false, "0001-01-01T00:00:00Z"),
        ];
        for (seconds, nanos, micros, want) in cases {
            assert_eq!(
                format_rfc3339(*seconds, *nanos, *micros).as_deref(),
                Ok(*want)
            );
        }
        assert!(format_rfc3339(300_000_000_000, 0, false).is_err());
    }

    #[test]
    fn times_parse_with_offsets_and_fractions() {
        let cases: &[(&str, Option<(i64, u32)>)] = &[
            ("2023-11-14T22:13:20Z", Some((1_700_000_000, 0))),
            ("2023-11-15T00:13:20+02:00", Some((1_700_000_000, 0))),
            ("2023-11-14T22:13:20.5Z", Some((1_700_000_000, 500_000_000))),
            ("2023-11-14", None),
            ("yesterday", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_rfc3339(text).ok(), *want, "{text}");
        }
    }
}
