//! The `kubernetes.quantity` library: `quantity()`, `isQuantity()` and the `Quantity` methods
//! (upstream `library/quantity.go`), over `flotilla_api_machinery::quantity`.
//!
//! That type keeps quantities exactly to the nano-unit (upstream keeps arbitrary precision), so
//! quantities with more than 30 significant digits are not quantities here.

use cel::common::types::{CelDouble, INT_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};
use flotilla_api_machinery::quantity::Quantity as Amount;

use super::{arg, bool_val, error, global, int_arg, int_val, member, opaque_value, str_arg};

/// A resource quantity value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Quantity(Amount);

opaque_value!(Quantity, QUANTITY_TYPE, "kubernetes.Quantity");

/// Upstream's `resource.ErrFormatWrong`, which `quantity()` reports as is.
const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(QUANTITY_TYPE.to_owned())?;
    global(env, "quantity", &[&STRING_TYPE], |args| {
        let text = str_arg(&args, 0, "quantity")?;
        Amount::parse(text)
            .map(|q| CowVal::owned(Quantity(q)))
            .map_err(|_| error("quantity", FORMAT_WRONG))
    })?;
    global(env, "isQuantity", &[&STRING_TYPE], |args| {
        Ok(bool_val(
            Amount::parse(str_arg(&args, 0, "isQuantity")?).is_ok(),
        ))
    })?;
    member(env, "sign", &QUANTITY_TYPE, &[], |args| {
        let q = quantity(&args, 0, "sign")?;
        Ok(int_val(match q.cmp(&Amount::ZERO) {
            std::cmp::Ordering::Less => -1,
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Greater => 1,
        }))
    })?;
    member(
        env,
        "isGreaterThan",
        &QUANTITY_TYPE,
        &[&QUANTITY_TYPE],
        |args| {
            Ok(bool_val(
                quantity(&args, 0, "isGreaterThan")? > quantity(&args, 1, "isGreaterThan")?,
            ))
        },
    )?;
    member(
        env,
        "isLessThan",
        &QUANTITY_TYPE,
        &[&QUANTITY_TYPE],
        |args| {
            Ok(bool_val(
                quantity(&args, 0, "isLessThan")? < quantity(&args, 1, "isLessThan")?,
            ))
        },
    )?;
    member(
        env,
        "compareTo",
        &QUANTITY_TYPE,
        &[&QUANTITY_TYPE],
        |args| {
            let ordering = quantity(&args, 0, "compareTo")?.cmp(&quantity(&args, 1, "compareTo")?);
            Ok(int_val(ordering as i64))
        },
    )?;
    member(env, "asApproximateFloat", &QUANTITY_TYPE, &[], |args| {
        let nanos = nanos(&quantity(&args, 0, "asApproximateFloat")?);
        Ok(CowVal::owned(CelDouble::from(nanos as f64 / 1e9)))
    })?;
    member(env, "isInteger", &QUANTITY_TYPE, &[], |args| {
        Ok(bool_val(
            as_integer(&quantity(&args, 0, "isInteger")?).is_some(),
        ))
    })?;
    member(env, "asInteger", &QUANTITY_TYPE, &[], |args| {
        as_integer(&quantity(&args, 0, "asInteger")?)
            .map(int_val)
            .ok_or_else(|| error("asInteger", "cannot convert value to integer"))
    })?;
    member(env, "add", &QUANTITY_TYPE, &[&QUANTITY_TYPE], |args| {
        let sum = quantity(&args, 0, "add")? + quantity(&args, 1, "add")?;
        Ok(CowVal::owned(Quantity(sum)))
    })?;
    member(env, "add", &QUANTITY_TYPE, &[&INT_TYPE], |args| {
        let sum = quantity(&args, 0, "add")? + Amount::from_count(int_arg(&args, 1, "add")?);
        Ok(CowVal::owned(Quantity(sum)))
    })?;
    member(env, "sub", &QUANTITY_TYPE, &[&QUANTITY_TYPE], |args| {
        let difference = quantity(&args, 0, "sub")?.minus(quantity(&args, 1, "sub")?);
        Ok(CowVal::owned(Quantity(difference)))
    })?;
    member(env, "sub", &QUANTITY_TYPE, &[&INT_TYPE], |args| {
        let count = Amount::from_count(int_arg(&args, 1, "sub")?);
        Ok(CowVal::owned(Quantity(
            quantity(&args, 0, "sub")?.minus(count),
        )))
    })?;
    Ok(())
}

fn quantity(
    args: &[CowVal<'_, '_>],
    index: usize,
    function: &str,
) -> Result<Amount, ExecutionError> {
    arg::<Quantity>(args, index, function).map(|q| q.0)
}

/// The value as a whole `int64`, if it is one (`AsInt64`).
fn as_integer(q: &Amount) -> Option<i64> {
    let nanos = nanos(q);
    if nanos % 1_000_000_000 != 0 {
        return None;
    }
    i64::try_from(nanos / 1_000_000_000).ok()
}

/// The exact value in nano-units, read back from the canonical form the quantity prints
/// (`1500m`, `2Gi`, `-3k`): the type keeps that number private.
fn nanos(q: &Amount) -> i128 {
    let text = q.to_string();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let split = unsigned
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(unsigned.len());
    let (digits, suffix) = unsigned.split_at(split);
    let units: i128 = digits.parse().unwrap_or(0);
    let scale: i128 = match suffix {
        "n" => 1,
        "u" => 1_000,
        "m" => 1_000_000,
        "" => 1_000_000_000,
        "k" => 1_000_000_000_000,
        "M" => 1_000_000_000_000_000,
        "G" => 1_000_000_000_000_000_000,
        "T" => 1_000_000_000_000_000_000_000,
        "P" => 1_000_000_000_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000_000_000_000,
        binary => {
            let shift = match binary {
                "Ki" => 10,
                "Mi" => 20,
                "Gi" => 30,
                "Ti" => 40,
                "Pi" => 50,
                "Ei" => 60,
                _ => 0,
            };
            (1i128 << shift) * 1_000_000_000
        }
    };
    let value = units.saturating_mul(scale);
    if negative { -value } else { value }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Amount {
        Amount::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn reads_exact_values_back() {
        for (text, want) in [
            ("1", 1_000_000_000i128),
            ("100m", 100_000_000),
            ("1.5", 1_500_000_000),
            ("2k", 2_000_000_000_000),
            ("1Gi", (1i128 << 30) * 1_000_000_000),
            ("-3", -3_000_000_000),
            ("5n", 5),
        ] {
            assert_eq!(nanos(&q(text)), want, "{text}");
        }
    }

    #[test]
    fn converts_to_integers_like_upstream() {
        assert_eq!(as_integer(&q("50k")), Some(50_000));
        assert_eq!(as_integer(&q("1.5")), None);
        assert_eq!(as_integer(&q("50000000G")), Some(50_000_000_000_000_000));
        assert_eq!(as_integer(&q("9223372036854775808")), None);
    }
}
