//! kube-openapi's `numberValidator`: `multipleOf`, `maximum`, `minimum` and the range of
//! `int32`/`int64`/`float` formats, with Go's integer-versus-float behaviour (bounds are
//! truncated to integers for integer values, floats print as Go's `%v`).

use super::{Code, Num, OpenApiError, Res, is_float64_json_integer};
use crate::gofmt::{go_float_f, go_float_v};
use crate::structural::Structural;

/// swag's range check of a number against the schema's numeric type and format; `None` when
/// it fits.
fn range_problem(
    value: Num,
    type_name: &str,
    format: &str,
    prefix: &str,
    path: &str,
) -> Option<String> {
    let rep = match value {
        Num::Int(i) => i.to_string(),
        Num::Float(f) => go_float_f(f),
    };
    let fits = match (type_name, format) {
        ("integer", "int32") => rep.parse::<i32>().is_ok(),
        ("integer", _) => rep.parse::<i64>().is_ok(),
        (_, "float") => rep
            .parse::<f64>()
            .is_ok_and(|v| !((v as f32).is_infinite() && v.is_finite())),
        _ => true,
    };
    if fits {
        return None;
    }
    Some(if format.is_empty() {
        format!("{prefix} value must be of type {type_name} (default format) in {path}")
    } else {
        format!("{prefix} value must be of type {type_name} with format {format} in {path}")
    })
}

fn bound_error(path: &str, relation: &str, bound: String, data: Num) -> OpenApiError {
    let message = format!("{path} in body should be {relation} {bound}");
    OpenApiError::new(Code::Other, path, message, Some(data.value()))
}

fn multiple_of_error(path: &str, factor: Num, data: Num) -> OpenApiError {
    let positive = match factor {
        Num::Int(f) => f > 0,
        Num::Float(f) => f > 0.0,
    };
    if !positive {
        let message = format!(
            "factor MultipleOf declared for {path} must be positive: {}",
            factor.go_v()
        );
        return OpenApiError::new(Code::Other, path, message, Some(factor.value()));
    }
    let message = format!("{path} in body should be a multiple of {}", factor.go_v());
    OpenApiError::new(Code::Other, path, message, Some(data.value()))
}

fn check_multiple_of(path: &str, data: Num, factor: f64, native: bool) -> Option<OpenApiError> {
    match data {
        Num::Int(d) if native => {
            // Go converts the factor to the value's integer type, truncating.
            let f = factor as i64;
            (f <= 0 || d % f != 0).then(|| multiple_of_error(path, Num::Int(f), data))
        }
        _ => {
            let d = data.as_f64();
            if factor <= 0.0 {
                return Some(multiple_of_error(path, Num::Float(factor), data));
            }
            let mult = if factor < 1.0 {
                1.0 / factor * d
            } else {
                d / factor
            };
            (!is_float64_json_integer(mult))
                .then(|| multiple_of_error(path, Num::Float(factor), Num::Float(d)))
        }
    }
}

fn check_bound(
    path: &str,
    data: Num,
    bound: f64,
    exclusive: bool,
    native: bool,
    max: bool,
) -> Option<OpenApiError> {
    let relation = match (max, exclusive) {
        (true, false) => "less than or equal to",
        (true, true) => "less than",
        (false, false) => "greater than or equal to",
        (false, true) => "greater than",
    };
    let (exceeds, shown) = match data {
        Num::Int(d) if native => {
            let b = bound as i64;
            let exceeds = if max {
                d > b || (exclusive && d == b)
            } else {
                d < b || (exclusive && d == b)
            };
            (exceeds, b.to_string())
        }
        _ => {
            let d = data.as_f64();
            let exceeds = if max {
                d > bound || (exclusive && d == bound)
            } else {
                d < bound || (exclusive && d == bound)
            };
            (exceeds, go_float_v(bound))
        }
    };
    exceeds.then(|| bound_error(path, relation, shown, data))
}

/// kube-openapi `numberValidator`.
pub(super) fn validate_number(
    s: &Structural,
    types: &[&str],
    format: &str,
    path: &str,
    data: Num,
) -> Res {
    let vv = &s.value_validation;
    let mut res = Res::default();
    let (type_name, format) = match types {
        ["integer"] => ("integer", format),
        ["number"] => ("number", format),
        _ => ("", ""),
    };
    if let Some(problem) = range_problem(data, type_name, format, "Checked", path) {
        res.add(OpenApiError::plain(problem));
    }
    let constraint = |bound: f64, prefix: &str, check: &dyn Fn(bool) -> Option<OpenApiError>| {
        let mut result = Res::default();
        let problem = range_problem(Num::Float(bound), type_name, format, prefix, path);
        let native = problem.is_none();
        if let Some(problem) = problem {
            result.add(OpenApiError::plain(problem));
        }
        if let Some(error) = check(native) {
            result.add(error);
        }
        result
    };
    let multiple = vv.multiple_of.map(|factor| {
        constraint(factor, "MultipleOf", &|native| {
            check_multiple_of(path, data, factor, native)
        })
    });
    let maximum = vv.maximum.map(|max| {
        constraint(max, "Maximum boundary", &|native| {
            check_bound(path, data, max, vv.exclusive_maximum, native, true)
        })
    });
    let minimum = vv.minimum.map(|min| {
        constraint(min, "Minimum boundary", &|native| {
            check_bound(path, data, min, vv.exclusive_minimum, native, false)
        })
    });
    for result in [multiple, minimum, maximum].into_iter().flatten() {
        res.merge(result);
    }
    res.inc();
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_problems_follow_swag() {
        let cases = [
            (Num::Int(1), "integer", "int32", None),
            (
                Num::Int(i64::from(i32::MAX) + 1),
                "integer",
                "int32",
                Some("Checked value must be of type integer with format int32 in x"),
            ),
            (
                Num::Float(1.5),
                "integer",
                "",
                Some("Checked value must be of type integer (default format) in x"),
            ),
            (Num::Float(2.0), "integer", "", None),
            (
                Num::Float(1e39),
                "number",
                "float",
                Some("Checked value must be of type number with format float in x"),
            ),
            (Num::Float(1e39), "number", "double", None),
            (Num::Float(1.5), "", "", None),
        ];
        for (value, type_name, format, want) in cases {
            let got = range_problem(value, type_name, format, "Checked", "x");
            assert_eq!(got.as_deref(), want, "{value:?} {type_name} {format}");
        }
    }

    #[test]
    fn bounds_and_factors_truncate_for_integers() {
        let message = |e: Option<OpenApiError>| e.map(|e| e.message);
        // Go converts the bound to int64 for an integer value: 2.5 becomes 2.
        assert_eq!(
            message(check_bound("x", Num::Int(3), 2.5, false, true, true)),
            Some("x in body should be less than or equal to 2".to_string())
        );
        assert_eq!(
            message(check_bound("x", Num::Float(2.5), 2.5, true, true, false)).as_deref(),
            Some("x in body should be greater than 2.5")
        );
        assert_eq!(
            message(check_multiple_of("x", Num::Int(7), 2.5, true)).as_deref(),
            Some("x in body should be a multiple of 2")
        );
        assert_eq!(
            message(check_multiple_of("x", Num::Float(0.3), 0.1, true)),
            None
        );
        assert_eq!(
            message(check_multiple_of("x", Num::Int(4), 0.0, false)).as_deref(),
            Some("factor MultipleOf declared for x must be positive: 0")
        );
    }
}
