//! The `kubernetes.lists` library: `isSorted`, `sum`, `min`, `max`, `indexOf` and
//! `lastIndexOf` on lists (upstream `library/lists.go`).

use std::cmp::Ordering;

use cel::common::types::{CelInt, DYN_TYPE, LIST_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{bool_val, error, int_val, member, no_such_overload};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    member(env, "isSorted", &LIST_TYPE, &[], is_sorted)?;
    member(env, "sum", &LIST_TYPE, &[], sum)?;
    member(env, "min", &LIST_TYPE, &[], min)?;
    member(env, "max", &LIST_TYPE, &[], max)?;
    member(env, "indexOf", &LIST_TYPE, &[&DYN_TYPE], index_of)?;
    member(env, "lastIndexOf", &LIST_TYPE, &[&DYN_TYPE], last_index_of)?;
    Ok(())
}

/// The elements of the receiver, owned so they outlive the argument vector.
fn elements<'v>(
    args: &[CowVal<'_, 'v>],
    function: &str,
) -> Result<Vec<Box<dyn Val + 'v>>, ExecutionError> {
    let list = args
        .first()
        .and_then(|l| l.as_iterable())
        .ok_or_else(|| no_such_overload(function, args))?;
    let mut items = Vec::new();
    let mut iter = list.iter();
    while let Some(item) = iter.next() {
        items.push(item.clone_as_boxed());
    }
    Ok(items)
}

fn compare(a: &dyn Val, b: &dyn Val, function: &str) -> Result<Ordering, ExecutionError> {
    let comparer = a.as_comparer().ok_or_else(|| {
        ExecutionError::no_such_overload(function, vec![a.get_type().name().to_string()])
    })?;
    comparer.compare(b)
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let items = elements(&args, "isSorted")?;
    for pair in items.windows(2) {
        if compare(pair[0].as_ref(), pair[1].as_ref(), "isSorted")? == Ordering::Greater {
            return Ok(bool_val(false));
        }
    }
    Ok(bool_val(true))
}

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let items = elements(&args, "sum")?;
    let mut items = items.into_iter();
    // upstream starts from the zero of the element type it knows statically; with no static
    // types, an empty list sums to the int zero, which is what `[].sum()` gives upstream
    let Some(first) = items.next() else {
        return Ok(CowVal::owned(CelInt::from(0)));
    };
    let mut total: Box<dyn Val + 'v> = first;
    for item in items {
        let adder = total.as_adder().ok_or_else(|| {
            ExecutionError::no_such_overload("sum", vec![total.get_type().name().to_string()])
        })?;
        let next = adder.add(item.as_ref())?.into_owned();
        total = next;
    }
    Ok(CowVal::Owned(total))
}

fn extreme<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    prefer: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let items = elements(&args, function)?;
    let mut best: Option<Box<dyn Val + 'v>> = None;
    for item in items {
        best = match best {
            None => Some(item),
            Some(current) => {
                if compare(item.as_ref(), current.as_ref(), function)? == prefer {
                    Some(item)
                } else {
                    Some(current)
                }
            }
        };
    }
    best.map(CowVal::Owned)
        .ok_or_else(|| error(function, format!("{function} called on empty list")))
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "min", Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "max", Ordering::Greater)
}

fn position<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let needle = args
        .get(1)
        .ok_or_else(|| no_such_overload(function, &args))?;
    let items = elements(&args, function)?;
    let found = if last {
        items.iter().rposition(|item| item.equals(needle.as_ref()))
    } else {
        items.iter().position(|item| item.equals(needle.as_ref()))
    };
    Ok(int_val(found.map_or(-1, |i| i as i64)))
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, "indexOf", false)
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, "lastIndexOf", true)
}
