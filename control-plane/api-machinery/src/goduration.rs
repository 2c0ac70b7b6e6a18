//! Go's duration syntax (`time.ParseDuration`: `500ms`, `20s`, `1m30s`, `1.5h`), as Kubernetes
//! flags and Terraform's `timeouts` write durations.

use std::time::Duration;

/// Parses a Go duration of `h`, `m`, `s` and `ms` parts; `None` when `text` is not one.
pub fn parse(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ms" => number / 1000.0,
            "s" => number,
            "m" => number * 60.0,
            "h" => number * 3600.0,
            _ => return None,
        };
        total = total.checked_add(Duration::try_from_secs_f64(seconds).ok()?)?;
        rest = &rest[unit_len..];
    }
    // Go's durations are int64 nanoseconds: about 292 years at most.
    (total.as_nanos() <= i64::MAX as u128).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_are_read() {
        assert_eq!(parse("45s"), Some(Duration::from_secs(45)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        // Found by the `scalars` fuzz target: a sum past what Duration holds panicked.
        assert_eq!(parse("9777747838521301s9767778872345105101s1s"), None);
        assert_eq!(
            parse("2562047h47m16.854775807s"),
            Some(Duration::from_nanos(i64::MAX as u64))
        );
        assert_eq!(parse("2562048h"), None);
        for bad in ["", "10", "ten minutes", "5 m", "3d"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
