//! The calls of an expression in the compile-time check: declared functions, operand types,
//! literal arguments, and cel-go's per-function cost (`functionCost` and the Kubernetes
//! `CostEstimator`).

use cel::common::ast::{CallExpr, Expr, LiteralValue};

use super::{Checker, Info, path_with, qualified_name};
use crate::cost::{AUTHZ_CHECK, REGEX_STRING_LENGTH, STRING_TRAVERSAL, Seg, Size, factor};
use crate::types::{self, Ty};

impl Checker<'_> {
    pub(super) fn call(&mut self, id: u64, call: &CallExpr) -> Info {
        // `@itN[0]` and `@itN[1]`: a two-variable comprehension's key and value
        if call.func_name == "_[_]"
            && let (Some(Expr::Ident(name)), Some(Expr::Literal(LiteralValue::Int(index)))) = (
                call.args.first().map(|a| &a.expr),
                call.args.get(1).map(|a| &a.expr),
            )
            && let Some(pair) = self
                .locals
                .iter()
                .rev()
                .find(|l| &l.name == name)
                .and_then(|l| l.pair.as_deref())
        {
            let half = if *index.inner() == 0 {
                &pair.0
            } else {
                &pair.1
            };
            return self.sized(half.clone());
        }
        // `format.named(x)`, `sets.contains(a, b)`: a namespaced global function
        if let Some(target) = &call.target
            && let Some(namespace) = qualified_name(&target.expr)
            && !self.is_local(namespace.split('.').next().unwrap_or_default())
            && !self.is_variable(namespace.split('.').next().unwrap_or_default())
        {
            let name = format!("{namespace}.{}", call.func_name);
            if types::is_global_function(&name) {
                let args: Vec<Info> = call.args.iter().map(|a| self.walk(a)).collect();
                return self.function(id, &name, None, &args, call);
            }
        }
        let target = call.target.as_ref().map(|t| self.walk(t));
        // `format`'s argument list may mix types (cel-go exempts it from homogeneity)
        let exempt = call.func_name == "format" && call.target.is_some();
        let args: Vec<Info> = call
            .args
            .iter()
            .map(|a| {
                self.heterogeneous_ok = exempt && matches!(a.expr, Expr::List(_));
                let info = self.walk(a);
                self.heterogeneous_ok = false;
                info
            })
            .collect();
        self.function(id, &call.func_name, target, &args, call)
    }

    fn function(
        &mut self,
        id: u64,
        name: &str,
        target: Option<Info>,
        args: &[Info],
        call: &CallExpr,
    ) -> Info {
        let arg_cost = args.iter().fold(0u64, |sum, a| sum.saturating_add(a.cost));
        let base = target
            .as_ref()
            .map_or(0, |t| t.cost)
            .saturating_add(arg_cost);
        let arg_ty = |i: usize| args.get(i).map_or(Ty::Dyn, |a| a.ty.clone());

        if !types::is_declared(name, target.is_some()) {
            self.error_at(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            );
            return Info::new(Ty::Dyn, base.saturating_add(1));
        }
        self.check_literals(name, call, target.is_some());
        if let Some(message) = types::overload_mismatch(
            name,
            target.as_ref().map(|t| &t.ty),
            &args.iter().map(|a| a.ty.clone()).collect::<Vec<_>>(),
        ) {
            self.error_at(id, message);
        }

        let target_size = target.as_ref().map(|t| self.size_of(t));
        let size = |i: usize| args.get(i).map_or(Size::UNKNOWN, |a| self.size_of(a));
        let result_ty = types::result_type(
            name,
            target.as_ref().map(|t| &t.ty),
            args.iter().map(|a| &a.ty).collect(),
        );

        let mut result_size: Option<Size> = None;
        let mut path: Option<Vec<Seg>> = None;
        let fn_cost: u64 = match name {
            "_&&_" | "_||_" => 0,
            "_?_:_" => {
                let (t, f) = (args.get(1), args.get(2));
                result_size = Some(size(1).union(size(2)));
                let cond = args.first().map_or(0, |a| a.cost);
                let branch = t.map_or(0, |a| a.cost).max(f.map_or(0, |a| a.cost));
                return Info {
                    ty: result_ty,
                    cost: cond.saturating_add(branch),
                    size: result_size,
                    path: None,
                };
            }
            "dyn" => {
                let inner = args
                    .first()
                    .cloned()
                    .unwrap_or_else(|| Info::new(Ty::Dyn, 0));
                return Info {
                    ty: Ty::Dyn,
                    cost: inner.cost.saturating_add(1),
                    ..inner
                };
            }
            "_==_" | "_!=_" => match (&arg_ty(0), &arg_ty(1)) {
                (Ty::Opaque(n), Ty::Opaque(m)) if n == m => match *n {
                    types::URL => factor(size(0).max.max(size(1).max), STRING_TRAVERSAL),
                    types::FORMAT => factor(64, STRING_TRAVERSAL),
                    _ => 1,
                },
                _ => factor(size(0).max.min(size(1).max), STRING_TRAVERSAL),
            },
            "_<_" | "_<=_" | "_>_" | "_>=_" => match arg_ty(0) {
                Ty::String | Ty::Bytes => factor(size(0).max.min(size(1).max), STRING_TRAVERSAL),
                _ => 1,
            },
            "_+_" => match arg_ty(0) {
                Ty::String | Ty::Bytes => {
                    let total = size(0).add(size(1));
                    result_size = Some(total);
                    factor(total.max, STRING_TRAVERSAL)
                }
                Ty::List(_) => {
                    result_size = Some(size(0).add(size(1)));
                    1
                }
                _ => 1,
            },
            "@in" => match arg_ty(1) {
                Ty::List(_) | Ty::Dyn => size(1).max,
                _ => 1,
            },
            "_[_]" | "_[?_]" => {
                let seg = match arg_ty(0) {
                    Ty::Map(_, _) => Some(Seg::Values),
                    Ty::List(_) => Some(Seg::Items),
                    _ => None,
                };
                if let (Some(seg), Some(container)) = (seg, args.first()) {
                    path = path_with(&container.path, seg);
                }
                1
            }
            "_?._" => {
                if let (Some(operand), Some(Expr::Literal(LiteralValue::String(field)))) =
                    (args.first(), call.args.get(1).map(|a| &a.expr))
                {
                    let ty = self.field_type(id, &operand.ty, field.inner());
                    return self.sized(Info {
                        ty: Ty::Optional(Box::new(ty)),
                        cost: base.saturating_add(1),
                        size: None,
                        path: path_with(&operand.path, Seg::Field(field.inner().to_string())),
                    });
                }
                1
            }
            // upstream's fixed price of an authorization check, which lets two run per call
            "check" if target.is_some() => AUTHZ_CHECK,
            "startsWith" | "endsWith" => factor(size(0).max, STRING_TRAVERSAL),
            "matches" => {
                // global `matches(s, re)` or member `s.matches(re)`
                let (text, pattern) = match target_size {
                    Some(t) => (t, size(0)),
                    None => (size(0), size(1)),
                };
                let text_cost = factor(text.max.saturating_add(1), STRING_TRAVERSAL);
                text_cost.saturating_mul(factor(pattern.max, REGEX_STRING_LENGTH))
            }
            "find" | "findAll" => {
                let text = target_size.unwrap_or(Size::UNKNOWN);
                result_size = Some(Size {
                    min: 0,
                    max: text.max,
                });
                let text_cost = factor(text.max.saturating_add(1), STRING_TRAVERSAL);
                text_cost.saturating_mul(factor(size(0).max, REGEX_STRING_LENGTH))
            }
            "contains" if matches!(target.as_ref().map(|t| &t.ty), Some(Ty::String)) => {
                let text = target_size.unwrap_or(Size::UNKNOWN);
                factor(text.max, STRING_TRAVERSAL)
                    .saturating_mul(factor(size(0).max, STRING_TRAVERSAL))
            }
            "strings.quote" => {
                let s = size(0);
                result_size = Some(Size {
                    min: s.min.saturating_add(2),
                    max: s.max.saturating_mul(2).saturating_add(2),
                });
                factor(s.max, STRING_TRAVERSAL)
            }
            "format" if target.is_some() => {
                factor(target_size.unwrap_or(Size::UNKNOWN).max, STRING_TRAVERSAL)
            }
            "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" if target.is_some() => {
                let target = target.as_ref().map(|t| (t.ty.clone(), t.path.clone()));
                let n = target_size.unwrap_or(Size::UNKNOWN);
                match target {
                    Some((Ty::List(elem), list_path)) => {
                        let mut per = 1u64;
                        if matches!(*elem, Ty::String | Ty::Bytes) {
                            let elem_size = path_with(&list_path, Seg::Items)
                                .and_then(|p| self.sizes.size(&p))
                                .unwrap_or_else(|| self.sizes.unknown());
                            per = per.saturating_add(factor(elem_size.max, STRING_TRAVERSAL));
                        }
                        n.max.saturating_mul(per)
                    }
                    _ => factor(n.max, STRING_TRAVERSAL),
                }
            }
            "url" => {
                result_size = Some(size(0));
                factor(size(0).max, STRING_TRAVERSAL)
            }
            "lowerAscii" | "upperAscii" | "substring" | "trim" if target.is_some() => {
                let t = target_size.unwrap_or(Size::UNKNOWN);
                result_size = Some(t);
                factor(t.max, STRING_TRAVERSAL)
            }
            "replace" if target.is_some() => {
                let t = target_size.unwrap_or(Size::UNKNOWN);
                let (from, to) = (size(0), size(1));
                let max = if from.min == 0 {
                    t.max
                        .saturating_add(1)
                        .saturating_mul(to.max)
                        .saturating_add(t.max)
                } else if to.max <= from.min {
                    t.max
                } else {
                    t.max.div_ceil(from.min).saturating_mul(to.max)
                };
                result_size = Some(Size { min: 0, max });
                factor(t.max, 2.0 * STRING_TRAVERSAL)
            }
            "split" if target.is_some() => {
                let t = target_size.unwrap_or(Size::UNKNOWN);
                let mut max = t.max;
                if let Some(Expr::Literal(LiteralValue::Int(limit))) =
                    call.args.get(1).map(|a| &a.expr)
                {
                    max = (*limit.inner()).max(0) as u64;
                }
                result_size = Some(Size { min: 0, max });
                factor(t.max, 2.0 * STRING_TRAVERSAL)
            }
            "join" if target.is_some() => {
                let list = target.as_ref().map(|t| t.path.clone()).unwrap_or_default();
                let n = target_size.unwrap_or(Size::UNKNOWN);
                let elem = path_with(&list, Seg::Items)
                    .and_then(|p| self.sizes.size(&p))
                    .unwrap_or_else(|| self.sizes.unknown());
                let mut total = n.max.saturating_mul(elem.max);
                if let Some(sep) = args.first() {
                    let sep = self.size_of(sep);
                    total = total.saturating_add(sep.max.saturating_mul(n.max.saturating_sub(1)));
                }
                result_size = Some(Size { min: 0, max: total });
                factor(total, STRING_TRAVERSAL)
            }
            "containsIP" | "containsCIDR" if target.is_some() => {
                let ip = factor(32, STRING_TRAVERSAL);
                let mut c = if name == "containsCIDR" {
                    ip.saturating_add(factor(16, STRING_TRAVERSAL))
                        .saturating_add(1)
                } else {
                    ip
                };
                if matches!(arg_ty(0), Ty::String) {
                    c = c.saturating_add(factor(size(0).max, STRING_TRAVERSAL));
                }
                c
            }
            "validate" if target.is_some() => factor(
                factor(size(0).max, STRING_TRAVERSAL),
                128.0 * REGEX_STRING_LENGTH,
            ),
            _ => 1,
        };
        self.sized(Info {
            ty: result_ty,
            cost: base.saturating_add(fn_cost),
            size: result_size,
            path,
        })
    }

    /// Upstream's literal validators: duration and timestamp literals must parse, and a
    /// literal `matches` pattern must compile.
    fn check_literals(&mut self, name: &str, call: &CallExpr, member: bool) {
        let literal = |i: usize| match call.args.get(i).map(|a| (&a.expr, a.id)) {
            Some((Expr::Literal(LiteralValue::String(s)), id)) => Some((s.inner().to_string(), id)),
            _ => None,
        };
        match name {
            "duration" if !member => {
                if let Some((text, id)) = literal(0)
                    && crate::values::parse_duration(&text).is_none()
                {
                    self.error_at(id, "invalid duration argument".to_string());
                }
            }
            "timestamp" if !member => {
                if let Some((text, id)) = literal(0)
                    && crate::values::parse_timestamp(&text).is_none()
                {
                    self.error_at(id, "invalid timestamp".to_string());
                }
            }
            "matches" => {
                let index = if member { 0 } else { 1 };
                if let Some((pattern, id)) = literal(index)
                    && !types::regex_compiles(&pattern)
                {
                    self.error_at(id, "invalid matches argument".to_string());
                }
            }
            _ => {}
        }
    }
}
