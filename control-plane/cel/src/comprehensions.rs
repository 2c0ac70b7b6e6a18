//! cel-go's two-variable comprehensions (`ext.TwoVarComprehensions`, in Kubernetes' base
//! environment since 1.32): `all`, `exists`, `existsOne` with `(k, v, predicate)` and
//! `transformList`, `transformMap`, `transformMapEntry`.
//!
//! cel-rust's interpreter binds one iteration variable, so each macro iterates over
//! `@entries(target)`, the `[key, value]` pairs of a map or `[index, element]` pairs of a list,
//! and the two names are rewritten to `@itN[0]` and `@itN[1]` in the expressions that can see
//! them. The compile-time check recognizes that shape and types the pair's halves.

use std::collections::HashMap;

use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr,
};
use cel::common::types::{CelInt, CelList, CelMap, CelMapKey, LIST_TYPE, MAP_TYPE};
use cel::common::value::{CowVal, Val};
use cel::parser::{Macro, MacroExprHelper};
use cel::{DeclarationError, Env, ExecutionError, ParseError};

use crate::library::{error, global, no_such_overload};

/// The function a rewritten comprehension iterates over.
pub(crate) const ENTRIES: &str = "@entries";
const MAP_INSERT: &str = "@mapInsert";
const MAP_MERGE: &str = "@mapMerge";
const RESULT: &str = "@result";

/// Registers the macros and the functions their expansions call.
pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_macro(Macro::receiver("all", 3, |h, t, a| {
        expand(h, t, a, Kind::All)
    }))?;
    env.add_macro(Macro::receiver("exists", 3, |h, t, a| {
        expand(h, t, a, Kind::Exists)
    }))?;
    env.add_macro(Macro::receiver("existsOne", 3, |h, t, a| {
        expand(h, t, a, Kind::ExistsOne)
    }))?;
    env.add_macro(Macro::receiver("exists_one", 3, |h, t, a| {
        expand(h, t, a, Kind::ExistsOne)
    }))?;
    for arity in [3, 4] {
        env.add_macro(Macro::receiver("transformList", arity, |h, t, a| {
            expand(h, t, a, Kind::List)
        }))?;
        env.add_macro(Macro::receiver("transformMap", arity, |h, t, a| {
            expand(h, t, a, Kind::Map)
        }))?;
        env.add_macro(Macro::receiver("transformMapEntry", arity, |h, t, a| {
            expand(h, t, a, Kind::MapEntry)
        }))?;
    }
    global(env, ENTRIES, &[&LIST_TYPE], list_entries)?;
    global(env, ENTRIES, &[&MAP_TYPE], map_entries)?;
    global(
        env,
        MAP_INSERT,
        &[
            &MAP_TYPE,
            &cel::common::types::DYN_TYPE,
            &cel::common::types::DYN_TYPE,
        ],
        map_insert,
    )?;
    global(env, MAP_MERGE, &[&MAP_TYPE, &MAP_TYPE], map_merge)?;
    Ok(())
}

#[derive(Clone, Copy)]
enum Kind {
    All,
    Exists,
    ExistsOne,
    List,
    Map,
    MapEntry,
}

fn ident(h: &mut MacroExprHelper<'_>, name: &str) -> IdedExpr {
    h.next_expr(Expr::Ident(name.to_string()))
}

fn call(h: &mut MacroExprHelper<'_>, name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    h.next_expr(Expr::Call(CallExpr {
        func_name: name.to_string(),
        target: None,
        args,
    }))
}

fn literal(h: &mut MacroExprHelper<'_>, value: LiteralValue) -> IdedExpr {
    h.next_expr(Expr::Literal(value))
}

fn expand(
    h: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
    kind: Kind,
) -> Result<Option<IdedExpr>, ParseError> {
    let name = |e: &IdedExpr| match &e.expr {
        Expr::Ident(name) => Ok(name.clone()),
        _ => Err(h.new_error(e.id, "argument must be a simple name")),
    };
    let (key, value) = (name(&args[0])?, name(&args[1])?);
    let Some(target) = target.take() else {
        return Ok(None);
    };
    let range = call(h, ENTRIES, vec![target]);
    let pair = format!("@it{}", range.id);
    let names = Names {
        key: &key,
        value: &value,
        pair: &pair,
    };
    let mut rest: Vec<IdedExpr> = args.drain(2..).collect();
    let body = names.rewrite(h, rest.pop().unwrap_or_default());
    let filter = rest.pop().map(|f| names.rewrite(h, f));
    let accu = |h: &mut MacroExprHelper<'_>| ident(h, RESULT);

    let (init, condition, step, result) = match kind {
        Kind::All | Kind::Exists => {
            let all = matches!(kind, Kind::All);
            let init = literal(h, LiteralValue::Boolean(all.into()));
            let a = accu(h);
            let tested = if all { a } else { call(h, "!_", vec![a]) };
            let condition = call(h, "@not_strictly_false", vec![tested]);
            let a = accu(h);
            let step = call(h, if all { "_&&_" } else { "_||_" }, vec![a, body]);
            (init, condition, step, accu(h))
        }
        Kind::ExistsOne => {
            let init = literal(h, LiteralValue::Int(0.into()));
            let condition = literal(h, LiteralValue::Boolean(true.into()));
            let (a, one) = (accu(h), literal(h, LiteralValue::Int(1.into())));
            let plus = call(h, "_+_", vec![a, one]);
            let a = accu(h);
            let step = call(h, "_?_:_", vec![body, plus, a]);
            let (a, one) = (accu(h), literal(h, LiteralValue::Int(1.into())));
            (init, condition, step, call(h, "_==_", vec![a, one]))
        }
        Kind::List | Kind::Map | Kind::MapEntry => {
            let init = match kind {
                Kind::List => h.next_expr(Expr::List(ListExpr::new(Vec::new()))),
                _ => h.next_expr(Expr::Map(MapExpr::default())),
            };
            let condition = literal(h, LiteralValue::Boolean(true.into()));
            let a = accu(h);
            let grown = match kind {
                Kind::List => {
                    let item = h.next_expr(Expr::List(ListExpr::new(vec![body])));
                    call(h, "_+_", vec![a, item])
                }
                Kind::Map => {
                    let key = names.half(h, 0);
                    call(h, MAP_INSERT, vec![a, key, body])
                }
                _ => call(h, MAP_MERGE, vec![a, body]),
            };
            let step = match filter {
                Some(filter) => {
                    let a = accu(h);
                    call(h, "_?_:_", vec![filter, grown, a])
                }
                None => grown,
            };
            (init, condition, step, accu(h))
        }
    };
    Ok(Some(h.next_expr(Expr::Comprehension(Box::new(
        ComprehensionExpr {
            iter_range: range,
            iter_var: pair,
            iter_var2: None,
            accu_var: RESULT.to_string(),
            accu_init: init,
            loop_cond: condition,
            loop_step: step,
            result,
        },
    )))))
}

/// The two user names and the pair variable standing for them.
struct Names<'a> {
    key: &'a str,
    value: &'a str,
    pair: &'a str,
}

impl Names<'_> {
    /// `pair[index]`.
    fn half(&self, h: &mut MacroExprHelper<'_>, index: i64) -> IdedExpr {
        let pair = ident(h, self.pair);
        let index = literal(h, LiteralValue::Int(index.into()));
        call(h, "_[_]", vec![pair, index])
    }

    /// `e` with the key and value names replaced by the pair's halves, except where a
    /// nested comprehension binds the same name.
    fn rewrite(&self, h: &mut MacroExprHelper<'_>, e: IdedExpr) -> IdedExpr {
        let id = e.id;
        let expr = match e.expr {
            Expr::Ident(name) if name == self.key => return self.half(h, 0),
            Expr::Ident(name) if name == self.value => return self.half(h, 1),
            Expr::Call(c) => Expr::Call(CallExpr {
                func_name: c.func_name,
                target: c.target.map(|t| Box::new(self.rewrite(h, *t))),
                args: c.args.into_iter().map(|a| self.rewrite(h, a)).collect(),
            }),
            Expr::Select(mut s) => {
                s.operand = Box::new(self.rewrite(h, *s.operand));
                Expr::Select(s)
            }
            Expr::List(l) => Expr::List(ListExpr::new_with_optionals(
                l.elements.into_iter().map(|i| self.rewrite(h, i)).collect(),
                l.optional_indices,
            )),
            Expr::Map(m) => Expr::Map(MapExpr {
                entries: m
                    .entries
                    .into_iter()
                    .map(|mut entry| {
                        if let EntryExpr::MapEntry(mut me) = entry.expr {
                            me.key = self.rewrite(h, me.key);
                            me.value = self.rewrite(h, me.value);
                            entry.expr = EntryExpr::MapEntry(me);
                        }
                        entry
                    })
                    .collect(),
            }),
            Expr::Comprehension(c) => {
                let mut c = *c;
                c.iter_range = self.rewrite(h, c.iter_range);
                c.accu_init = self.rewrite(h, c.accu_init);
                let bound = [Some(&c.iter_var), c.iter_var2.as_ref(), Some(&c.accu_var)];
                let shadows = |n: &str| bound.iter().flatten().any(|b| b.as_str() == n);
                let inner = Names {
                    key: if shadows(self.key) { "" } else { self.key },
                    value: if shadows(self.value) { "" } else { self.value },
                    pair: self.pair,
                };
                c.loop_cond = inner.rewrite(h, c.loop_cond);
                c.loop_step = inner.rewrite(h, c.loop_step);
                c.result = inner.rewrite(h, c.result);
                Expr::Comprehension(Box::new(c))
            }
            other => other,
        };
        IdedExpr { id, expr }
    }
}

fn pair<'v>(key: Box<dyn Val + 'v>, value: Box<dyn Val + 'v>) -> Box<dyn Val + 'v> {
    Box::new(CelList::from(vec![key, value]))
}

fn list_entries<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let list = args
        .first()
        .and_then(|l| l.as_iterable())
        .ok_or_else(|| no_such_overload(ENTRIES, &args))?;
    let mut pairs: Vec<Box<dyn Val + 'v>> = Vec::new();
    let mut iter = list.iter();
    let mut index = 0i64;
    while let Some(item) = iter.next() {
        pairs.push(pair(Box::new(CelInt::from(index)), item.clone_as_boxed()));
        index += 1;
    }
    Ok(CowVal::owned(CelList::from(pairs)))
}

fn map_entries<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let map = args
        .first()
        .and_then(|m| m.downcast_ref::<CelMap>())
        .ok_or_else(|| no_such_overload(ENTRIES, &args))?;
    let pairs: Vec<Box<dyn Val + 'v>> = map
        .inner()
        .iter()
        .map(|(k, v)| pair(k.inner().clone_as_boxed(), v.clone()))
        .collect();
    Ok(CowVal::owned(CelList::from(pairs)))
}

fn owned_map<'v>(
    args: &[CowVal<'_, 'v>],
    function: &str,
) -> Result<HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>, ExecutionError> {
    args.first()
        .and_then(|m| m.downcast_ref::<CelMap>())
        .map(|m| m.inner().clone())
        .ok_or_else(|| no_such_overload(function, args))
}

fn insert<'v>(
    map: &mut HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>,
    key: Box<dyn Val + 'v>,
    value: Box<dyn Val + 'v>,
) -> Result<(), ExecutionError> {
    let shown = format!("{key:?}");
    let key = CelMapKey::try_from(key)?;
    if map.contains_key(&key) {
        return Err(error(
            MAP_INSERT,
            format!("insert failed: key {shown} already exists"),
        ));
    }
    map.insert(key, value);
    Ok(())
}

fn map_insert<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut map = owned_map(&args, MAP_INSERT)?;
    let (Some(key), Some(value)) = (args.get(1), args.get(2)) else {
        return Err(no_such_overload(MAP_INSERT, &args));
    };
    insert(
        &mut map,
        key.clone().into_owned(),
        value.clone().into_owned(),
    )?;
    Ok(CowVal::owned(CelMap::from(map)))
}

fn map_merge<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut map = owned_map(&args, MAP_MERGE)?;
    let entries = args
        .get(1)
        .and_then(|m| m.downcast_ref::<CelMap>())
        .ok_or_else(|| no_such_overload(MAP_MERGE, &args))?;
    for (k, v) in entries.inner() {
        insert(&mut map, k.inner().clone_as_boxed(), v.clone())?;
    }
    Ok(CowVal::owned(CelMap::from(map)))
}
