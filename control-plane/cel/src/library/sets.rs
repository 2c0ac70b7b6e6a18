//! cel-go's `ext.Sets()` library, part of Kubernetes' base environment since 1.29:
//! `sets.contains`, `sets.equivalent` and `sets.intersects` over lists.

use cel::common::types::LIST_TYPE;
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{bool_val, global, no_such_overload};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    global(env, "sets.contains", &[&LIST_TYPE, &LIST_TYPE], |args| {
        let (a, b) = lists(&args, "sets.contains")?;
        Ok(bool_val(contains_all(&a, &b)))
    })?;
    global(env, "sets.equivalent", &[&LIST_TYPE, &LIST_TYPE], |args| {
        let (a, b) = lists(&args, "sets.equivalent")?;
        Ok(bool_val(contains_all(&a, &b) && contains_all(&b, &a)))
    })?;
    global(env, "sets.intersects", &[&LIST_TYPE, &LIST_TYPE], |args| {
        let (a, b) = lists(&args, "sets.intersects")?;
        Ok(bool_val(b.iter().any(|x| a.iter().any(|y| y.equals(*x)))))
    })?;
    Ok(())
}

type Pair<'a, 'v> = (Vec<&'a (dyn Val + 'v)>, Vec<&'a (dyn Val + 'v)>);

fn lists<'a, 'v>(
    args: &'a [CowVal<'_, 'v>],
    function: &str,
) -> Result<Pair<'a, 'v>, ExecutionError> {
    let items = |index: usize| -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
        let list = args
            .get(index)
            .and_then(|l| l.as_iterable())
            .ok_or_else(|| no_such_overload(function, args))?;
        let mut out = Vec::new();
        let mut iter = list.iter();
        while let Some(item) = iter.next() {
            out.push(item);
        }
        Ok(out)
    };
    Ok((items(0)?, items(1)?))
}

/// Every element of `b` is in `a`.
fn contains_all(a: &[&dyn Val], b: &[&dyn Val]) -> bool {
    b.iter().all(|x| a.iter().any(|y| y.equals(*x)))
}
