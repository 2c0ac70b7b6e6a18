//! Renders JSON values the way upstream's Go code prints them inside messages: `fmt`'s `%v` of
//! decoded JSON (`[A B]`, `map[a:1]`, `1e+06`), `encoding/json`'s number forms, and
//! `strconv.FormatFloat(f, 'f', -1, 64)`. Upstream's error texts embed these renderings, so
//! matching them byte for byte is what keeps our messages identical to kube-apiserver's.

use serde_json::{Number, Value};

/// The decimal digits and exponent of the shortest representation that round-trips `f`
/// (`f` is finite and non-zero): `1.5e3` gives `("15", 3)`.
fn shortest_digits(f: f64) -> (String, i32) {
    // Rust's `{:e}` prints the shortest round-tripping mantissa, which is what Go's
    // `strconv` uses for precision -1.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    (digits, exponent.parse().unwrap_or(0))
}

/// Go's `%e` tail: `e+06`, `e-07`, `e+100`.
fn go_exponent(exp: i32) -> String {
    let sign = if exp < 0 { '-' } else { '+' };
    format!("e{sign}{:02}", exp.abs())
}

fn fixed_from_digits(digits: &str, exp: i32) -> String {
    // `exp` is the power of ten of the first digit.
    let point = exp + 1;
    if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    }
}

fn scientific_from_digits(digits: &str, exp: i32) -> String {
    let (first, rest) = digits.split_at(1);
    if rest.is_empty() {
        format!("{first}{}", go_exponent(exp))
    } else {
        format!("{first}.{rest}{}", go_exponent(exp))
    }
}

/// Go's `fmt` `%v` of a `float64`: shortest `%g`, switching to an exponent below `1e-4` or
/// from `1e+06` on (`strconv.FormatFloat(f, 'g', -1, 64)`).
pub(crate) fn go_float_v(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let (digits, exp) = shortest_digits(f);
    let body = if !(-4..6).contains(&exp) {
        scientific_from_digits(&digits, exp)
    } else {
        fixed_from_digits(&digits, exp)
    };
    if f < 0.0 { format!("-{body}") } else { body }
}

/// Go's `strconv.FormatFloat(f, 'f', -1, 64)`, which swag uses to print numbers before
/// re-parsing them as a narrower type.
pub(crate) fn go_float_f(f: f64) -> String {
    // Rust's `Display` for f64 is the shortest round-tripping digits without an exponent,
    // exactly Go's 'f' with precision -1.
    format!("{f}")
}

/// How `encoding/json` prints a float64: plain below `1e21`, exponent form for tiny or huge
/// magnitudes (`1e-07`, `1e+21`).
fn go_json_float(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return go_float_f(f);
    }
    let abs = f.abs();
    if !(1e-6..1e21).contains(&abs) {
        let (digits, exp) = shortest_digits(f);
        let body = scientific_from_digits(&digits, exp);
        // encoding/json trims "e-07" to "e-7".
        let body = body.replace("e-0", "e-").replace("e+0", "e+");
        return if f < 0.0 { format!("-{body}") } else { body };
    }
    go_float_f(f)
}

fn number_as_go_json(n: &Number) -> String {
    if n.is_i64() || n.is_u64() {
        n.to_string()
    } else {
        go_json_float(n.as_f64().unwrap_or_default())
    }
}

/// `encoding/json.Marshal` of a decoded JSON value: object keys sorted, numbers in Go's form.
/// Upstream compares compound list items and prints non-string enum values this way.
pub(crate) fn go_json(value: &Value) -> String {
    let mut out = String::new();
    write_go_json(value, &mut out);
    out
}

fn write_go_json(value: &Value, out: &mut String) {
    match value {
        Value::Number(n) => out.push_str(&number_as_go_json(n)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(key) {
                    write_go_json(v, out);
                }
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Go's `%v` of a decoded JSON value: strings bare, `<nil>`, `[a b]`, `map[k:v]` with sorted
/// keys. kube-openapi prints enum lists with it.
pub(crate) fn go_v(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => match n.as_u64() {
                Some(u) => u.to_string(),
                None => go_float_v(n.as_f64().unwrap_or_default()),
            },
        },
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(go_v).collect();
            format!("[{}]", parts.join(" "))
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let parts: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{k}:{}", go_v(v)))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// A JSON text with every object's keys sorted, numbers as serde writes them; two schemas
/// with the same canonical text are the same schema whatever their key order.
pub(crate) fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_like_go_v() {
        let cases = [
            (5.0, "5"),
            (1.5, "1.5"),
            (100000.0, "100000"),
            (1000000.0, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (1e21, "1e+21"),
            (0.0, "0"),
        ];
        for (f, want) in cases {
            assert_eq!(go_float_v(f), want, "{f}");
        }
    }

    #[test]
    fn floats_print_like_go_f() {
        assert_eq!(go_float_f(1.5), "1.5");
        assert_eq!(go_float_f(1.0), "1");
        assert_eq!(go_float_f(1e20), "100000000000000000000");
    }

    #[test]
    fn values_print_like_go() {
        let cases = [
            (json!(["A", "B"]), "[A B]"),
            (json!([1, 2.5, true, null]), "[1 2.5 true <nil>]"),
            (json!({"b": 1, "a": "x"}), "map[a:x b:1]"),
        ];
        for (value, want) in cases {
            assert_eq!(go_v(&value), want);
        }
        assert_eq!(
            go_json(&json!({"b": 1.0, "a": [1e-7, 1e21]})),
            r#"{"a":[1e-7,1e+21],"b":1}"#
        );
        assert_eq!(
            canonical_json(&json!({"b": 1, "a": {"d": 1, "c": 2}})),
            r#"{"a":{"c":2,"d":1},"b":1}"#
        );
    }
}
