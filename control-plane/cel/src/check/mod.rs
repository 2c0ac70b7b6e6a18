//! The compile-time half of cel-go that cel-rust does not have: a type check of a rule against
//! the schema's declaration (undeclared names, undefined fields, mismatched operands, the
//! result type, invalid literals) and cel-go's worst-case cost estimate (`checker/cost.go` with
//! the Kubernetes `CostEstimator`), both in one walk of the expression.
//!
//! The check only reports what it is sure of: anything typed `dyn` (int-or-string, values of
//! unknown type) is left to runtime, as cel-go does.

use std::sync::Arc;

use cel::IdedExpr;
use cel::common::ast::SourceInfo;
use cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, LiteralValue};

use crate::comprehensions::ENTRIES;
use crate::cost::{self, Seg, Size, Sizes};
use crate::schema::{DeclKind, DeclType};
use crate::types::{self, Ty};

mod calls;

/// What a walk of one expression found.
pub(crate) struct Analysis {
    pub ty: Ty,
    /// The worst-case cost, in cel-go's units.
    pub cost: u64,
    pub uses_old_self: bool,
    /// cel-go-style issues (`ERROR: <input>:1:5: ...` with the source line), empty if none.
    pub issues: Vec<String>,
}

/// How `oldSelf` is declared for the rule.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OldSelf {
    Plain,
    /// `optionalOldSelf: true`: `oldSelf` is `optional(T)`.
    Optional,
}

/// The variables an expression is checked against.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// An `x-kubernetes-validations` rule: `self` of the schema's type, and `oldSelf`.
    Rule {
        self_type: &'a Arc<DeclType>,
        old_self: OldSelf,
    },
    /// An admission expression: the declared variables by name.
    Named(&'a [Declared]),
}

/// One variable of a [`Scope::Named`]; its name may be qualified
/// (`authorizer.requestResource`).
#[derive(Clone)]
pub(crate) struct Declared {
    pub name: &'static str,
    pub ty: Ty,
}

#[derive(Clone)]
struct Info {
    ty: Ty,
    cost: u64,
    size: Option<Size>,
    path: Option<Vec<Seg>>,
}

impl Info {
    fn new(ty: Ty, cost: u64) -> Info {
        Info {
            ty,
            cost,
            size: None,
            path: None,
        }
    }
}

struct Local {
    name: String,
    ty: Ty,
    path: Option<Vec<Seg>>,
    size: Option<Size>,
    /// For the pair variable of a two-variable comprehension: what its key and value are.
    pair: Option<Box<(Info, Info)>>,
}

struct Checker<'a> {
    scope: Scope<'a>,
    sizes: &'a dyn Sizes,
    source: &'a str,
    source_info: &'a SourceInfo,
    locals: Vec<Local>,
    issues: Vec<String>,
    uses_old_self: bool,
    /// Set while walking a list literal that may mix element types.
    heterogeneous_ok: bool,
}

/// Checks `expr` against the variables of `scope`, estimating sizes with `sizes`.
pub(crate) fn analyze(
    expr: &IdedExpr,
    source: &str,
    source_info: &SourceInfo,
    scope: Scope<'_>,
    sizes: &dyn Sizes,
) -> Analysis {
    let mut checker = Checker {
        scope,
        sizes,
        source,
        source_info,
        locals: Vec::new(),
        issues: Vec::new(),
        uses_old_self: false,
        heterogeneous_ok: false,
    };
    let info = checker.walk(expr);
    Analysis {
        ty: info.ty,
        cost: info.cost,
        uses_old_self: checker.uses_old_self,
        issues: checker.issues,
    }
}

/// Formats a cel-go issue: `ERROR: <input>:line:col: message` with the line and a caret.
pub(crate) fn issue(source: &str, offset: usize, message: &str) -> String {
    let offset = offset.min(source.len());
    let line_start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_no = source[..line_start].matches('\n').count() + 1;
    let line_end = source[line_start..]
        .find('\n')
        .map_or(source.len(), |i| line_start + i);
    let column = source
        .get(line_start..offset)
        .map_or(0, |s| s.chars().count());
    let line = &source[line_start..line_end];
    format!(
        "ERROR: <input>:{line_no}:{}: {message}\n | {line}\n | {}^",
        column + 1,
        ".".repeat(column)
    )
}

fn qualified_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(select) if !select.test => Some(format!(
            "{}.{}",
            qualified_name(&select.operand.expr)?,
            select.field
        )),
        _ => None,
    }
}

fn path_with(path: &Option<Vec<Seg>>, seg: Seg) -> Option<Vec<Seg>> {
    path.as_ref().map(|p| {
        let mut p = p.clone();
        p.push(seg);
        p
    })
}

impl Checker<'_> {
    fn error_at(&mut self, id: u64, message: String) {
        let offset = self
            .source_info
            .offset_for(id)
            .map_or(0, |(start, _)| start as usize);
        self.issues.push(issue(self.source, offset, &message));
    }

    /// cel-go's `sizeOrUnknown`: the computed size, else 1 for fixed-size types.
    fn size_of(&self, info: &Info) -> Size {
        info.size.unwrap_or_else(|| {
            if info.ty.is_scalar() {
                Size::exactly(1)
            } else {
                self.sizes.unknown()
            }
        })
    }

    fn sized(&self, mut info: Info) -> Info {
        if info.size.is_none()
            && let Some(path) = &info.path
        {
            info.size = self.sizes.size(path);
        }
        info
    }

    fn walk(&mut self, e: &IdedExpr) -> Info {
        match &e.expr {
            Expr::Literal(literal) => literal_info(literal),
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(select) => {
                if !select.test
                    && let Some(name) = qualified_name(&e.expr)
                    && types::is_type_name(&name)
                    && !self.is_local(name.split('.').next().unwrap_or_default())
                {
                    return Info::new(Ty::Type, 1);
                }
                // a qualified variable is one name to cel-go, looked up before the selection
                if !select.test
                    && let Some(name) = qualified_name(&e.expr)
                    && let Some(info) = self.qualified_variable(&name)
                {
                    return info;
                }
                let operand = self.walk(&select.operand);
                let field_ty = self.field_type(e.id, &operand.ty, &select.field);
                if select.test {
                    // Kubernetes keeps cel-go's old free presence test
                    return Info::new(Ty::Bool, operand.cost);
                }
                let select_cost = match operand.ty {
                    Ty::Object(_) | Ty::Map(_, _) => 1,
                    _ => 0,
                };
                self.sized(Info {
                    ty: field_ty,
                    cost: operand.cost.saturating_add(select_cost),
                    size: None,
                    path: path_with(&operand.path, Seg::Field(select.field.clone())),
                })
            }
            Expr::Call(call) => self.call(e.id, call),
            Expr::List(list) => {
                let heterogeneous_ok = std::mem::take(&mut self.heterogeneous_ok);
                let mut cost = cost::LIST_CREATE;
                let mut elem: Option<Ty> = None;
                for (i, item) in list.elements.iter().enumerate() {
                    let info = self.walk(item);
                    cost = cost.saturating_add(info.cost);
                    let ty = if list.optional_indices.contains(&i) {
                        info.ty.optional_inner()
                    } else {
                        info.ty
                    };
                    elem = Some(if heterogeneous_ok {
                        Ty::Dyn
                    } else {
                        self.homogeneous(item.id, elem, ty)
                    });
                }
                Info {
                    ty: Ty::List(Box::new(elem.unwrap_or(Ty::Dyn))),
                    cost,
                    size: Some(Size::exactly(list.elements.len() as u64)),
                    path: None,
                }
            }
            Expr::Map(map) => {
                let mut cost = cost::MAP_CREATE;
                let (mut key_ty, mut value_ty): (Option<Ty>, Option<Ty>) = (None, None);
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(entry) = &entry.expr {
                        let key = self.walk(&entry.key);
                        let value = self.walk(&entry.value);
                        cost = cost.saturating_add(key.cost).saturating_add(value.cost);
                        key_ty = Some(self.homogeneous(entry.key.id, key_ty, key.ty));
                        let value = if entry.optional {
                            value.ty.optional_inner()
                        } else {
                            value.ty
                        };
                        value_ty = Some(self.homogeneous(entry.value.id, value_ty, value));
                    }
                }
                Info {
                    ty: Ty::Map(
                        Box::new(key_ty.unwrap_or(Ty::Dyn)),
                        Box::new(value_ty.unwrap_or(Ty::Dyn)),
                    ),
                    cost,
                    size: Some(Size::exactly(map.entries.len() as u64)),
                    path: None,
                }
            }
            Expr::Struct(s) => {
                self.error_at(
                    e.id,
                    format!(
                        "undeclared reference to '{}' (in container '')",
                        s.type_name
                    ),
                );
                Info::new(Ty::Dyn, cost::STRUCT_CREATE)
            }
            Expr::Comprehension(comprehension) => self.comprehension(e.id, comprehension),
            Expr::Unspecified => Info::new(Ty::Dyn, 0),
        }
    }

    fn is_local(&self, name: &str) -> bool {
        self.locals.iter().any(|l| l.name == name)
    }

    /// The declared variable whose qualified name is `name`, unless a local shadows its first
    /// segment.
    fn qualified_variable(&self, name: &str) -> Option<Info> {
        let Scope::Named(declared) = self.scope else {
            return None;
        };
        let var = declared.iter().find(|d| d.name == name)?;
        if self.is_local(name.split('.').next().unwrap_or_default()) {
            return None;
        }
        Some(self.sized(Info {
            ty: var.ty.clone(),
            cost: 1,
            size: None,
            path: Some(vec![Seg::Var(var.name)]),
        }))
    }

    /// Whether `name` is one of the scope's variables, which shadow function namespaces.
    fn is_variable(&self, name: &str) -> bool {
        match self.scope {
            Scope::Rule { .. } => name == "self" || name == "oldSelf",
            Scope::Named(declared) => declared.iter().any(|d| d.name == name),
        }
    }

    fn ident(&mut self, id: u64, name: &str) -> Info {
        if let Some(local) = self.locals.iter().rev().find(|l| l.name == name) {
            let info = Info {
                ty: local.ty.clone(),
                cost: 1,
                size: local.size,
                path: local.path.clone(),
            };
            return self.sized(info);
        }
        match self.scope {
            Scope::Rule {
                self_type,
                old_self,
            } => match name {
                "self" => {
                    return self.sized(Info {
                        ty: Ty::from_decl(self_type),
                        cost: 1,
                        size: None,
                        path: Some(vec![Seg::Root(false)]),
                    });
                }
                "oldSelf" => {
                    self.uses_old_self = true;
                    let ty = Ty::from_decl(self_type);
                    let (ty, path) = match old_self {
                        OldSelf::Plain => (ty, Some(vec![Seg::Root(true)])),
                        OldSelf::Optional => (Ty::Optional(Box::new(ty)), None),
                    };
                    return self.sized(Info {
                        ty,
                        cost: 1,
                        size: None,
                        path,
                    });
                }
                _ => {}
            },
            Scope::Named(declared) => {
                if let Some(var) = declared.iter().find(|d| d.name == name) {
                    return self.sized(Info {
                        ty: var.ty.clone(),
                        cost: 1,
                        size: None,
                        path: Some(vec![Seg::Var(var.name)]),
                    });
                }
            }
        }
        match name {
            // upstream's size estimator reads any one-segment path as `self`, so a type name
            // takes `self`'s size in the estimate
            name if types::is_type_name(name) => Info {
                size: self.sizes.size(&[Seg::Root(false)]),
                ..Info::new(Ty::Type, 1)
            },
            _ => {
                self.error_at(
                    id,
                    format!("undeclared reference to '{name}' (in container '')"),
                );
                Info::new(Ty::Dyn, 1)
            }
        }
    }

    /// The type of `operand.field`, reporting fields an object does not declare.
    fn field_type(&mut self, id: u64, operand: &Ty, field: &str) -> Ty {
        match operand {
            Ty::Object(decl) => match &decl.kind {
                DeclKind::Object(fields) => match fields.get(field) {
                    Some(f) => Ty::from_decl(&f.ty),
                    None => {
                        self.error_at(id, format!("undefined field '{field}'"));
                        Ty::Dyn
                    }
                },
                _ => Ty::Dyn,
            },
            Ty::Map(_, value) => (**value).clone(),
            Ty::Dyn => Ty::Dyn,
            other => {
                self.error_at(
                    id,
                    format!("type '{}' does not support field selection", other.name()),
                );
                Ty::Dyn
            }
        }
    }

    /// `HomogeneousAggregateLiterals`: every element of a literal has the first one's type.
    fn homogeneous(&mut self, id: u64, so_far: Option<Ty>, next: Ty) -> Ty {
        match so_far {
            None => next,
            Some(expected) => {
                if expected.is_dyn() || next.is_dyn() {
                    return if expected.is_dyn() { next } else { expected };
                }
                if !expected.same_as(&next) && !matches!(next, Ty::Null) {
                    self.error_at(
                        id,
                        format!(
                            "expected type '{}' but found '{}'",
                            expected.name(),
                            next.name()
                        ),
                    );
                }
                expected
            }
        }
    }

    fn comprehension(&mut self, _id: u64, c: &ComprehensionExpr) -> Info {
        let (range, pair) = match &c.iter_range.expr {
            Expr::Call(call) if call.func_name == ENTRIES && call.args.len() == 1 => {
                self.entries(&call.args[0])
            }
            _ => (self.walk(&c.iter_range), None),
        };
        let init = self.walk(&c.accu_init);
        let (var_ty, var_seg) = match &range.ty {
            _ if pair.is_some() => (Ty::List(Box::new(Ty::Dyn)), Seg::Items),
            Ty::List(elem) => ((**elem).clone(), Seg::Items),
            Ty::Map(key, _) => ((**key).clone(), Seg::Keys),
            Ty::Dyn => (Ty::Dyn, Seg::Items),
            other => {
                self.error_at(
                    c.iter_range.id,
                    format!(
                        "expression of type '{}' cannot be the range of a comprehension (must be list, map, or dynamic)",
                        other.name()
                    ),
                );
                (Ty::Dyn, Seg::Items)
            }
        };
        let var_path = path_with(&range.path, var_seg);
        let var_size = var_path.as_deref().and_then(|p| self.sizes.size(p));
        self.locals.push(Local {
            name: c.accu_var.clone(),
            ty: init.ty.clone(),
            path: None,
            size: init.size,
            pair: None,
        });
        self.locals.push(Local {
            name: c.iter_var.clone(),
            ty: var_ty,
            path: var_path,
            size: var_size,
            pair,
        });
        let condition = self.walk(&c.loop_cond);
        let step = self.walk(&c.loop_step);
        self.locals.pop();
        // `map`, `filter` and the `transform` macros build their result from the step's type
        let refined = match (&init.ty, &step.ty) {
            (Ty::List(elem), Ty::List(_)) => elem.is_dyn(),
            (Ty::Map(key, value), Ty::Map(_, _)) => key.is_dyn() && value.is_dyn(),
            _ => false,
        };
        if refined && let Some(accu) = self.locals.last_mut() {
            accu.ty = step.ty.clone();
        }
        let result = self.walk(&c.result);
        self.locals.pop();
        let range_size = self.size_of(&range);
        let per_item = condition.cost.saturating_add(step.cost);
        let cost = range
            .cost
            .saturating_add(init.cost)
            .saturating_add(result.cost)
            .saturating_add(range_size.max.saturating_mul(per_item));
        let size = match &c.accu_init.expr {
            Expr::Literal(_) => init.size,
            Expr::List(_) | Expr::Map(_) => Some(range_size),
            _ => None,
        };
        Info {
            ty: result.ty,
            cost,
            size,
            path: None,
        }
    }

    /// The range of a two-variable comprehension, `@entries(target)`: it iterates as often as
    /// `target` has entries, and its pairs are (index, element) or (key, value).
    fn entries(&mut self, target: &IdedExpr) -> (Info, Option<Box<(Info, Info)>>) {
        let t = self.walk(target);
        let half = |ty: Ty, path: Option<Vec<Seg>>| Info {
            ty,
            cost: 1,
            size: None,
            path,
        };
        let (key, value) = match &t.ty {
            Ty::List(elem) => (
                half(Ty::Int, None),
                half((**elem).clone(), path_with(&t.path, Seg::Items)),
            ),
            Ty::Map(key, value) => (
                half((**key).clone(), path_with(&t.path, Seg::Keys)),
                half((**value).clone(), path_with(&t.path, Seg::Values)),
            ),
            Ty::Dyn => (half(Ty::Dyn, None), half(Ty::Dyn, None)),
            other => {
                self.error_at(
                    target.id,
                    format!(
                        "expression of type '{}' cannot be the range of a comprehension (must be list, map, or dynamic)",
                        other.name()
                    ),
                );
                (half(Ty::Dyn, None), half(Ty::Dyn, None))
            }
        };
        let range = Info {
            ty: Ty::List(Box::new(Ty::Dyn)),
            cost: t.cost,
            size: Some(self.size_of(&t)),
            path: None,
        };
        (range, Some(Box::new((key, value))))
    }
}

fn literal_info(literal: &LiteralValue) -> Info {
    let (ty, size) = match literal {
        LiteralValue::Boolean(_) => (Ty::Bool, 1),
        LiteralValue::Int(_) => (Ty::Int, 1),
        LiteralValue::UInt(_) => (Ty::Uint, 1),
        LiteralValue::Double(_) => (Ty::Double, 1),
        LiteralValue::Null => (Ty::Null, 1),
        LiteralValue::String(s) => (Ty::String, s.inner().chars().count() as u64),
        LiteralValue::Bytes(b) => (Ty::Bytes, b.inner().len() as u64),
    };
    Info {
        ty,
        cost: 0,
        size: Some(Size::exactly(size)),
        path: None,
    }
}
