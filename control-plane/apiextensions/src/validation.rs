//! Validation of custom resources against their structural schema: kube-openapi's
//! `pkg/validation/validate` schema validator as apiextensions configures it (formats stripped
//! to the supported set, `x-kubernetes-int-or-string` as `integer,string`), its errors turned
//! into field errors by apiextensions' `kubeOpenAPIResultToFieldErrors`, followed by the
//! embedded-resource and list-type checks the custom resource strategy adds.
//!
//! Paths in kube-openapi's errors are dotted strings (`spec.labels.foo`, `spec.items[0]`),
//! which upstream appends to the field path as one element; the embedded-resource and list-type
//! checks use proper field paths (`spec.labels[foo]`). Both are reproduced as upstream prints
//! them.

mod formats;
mod number;

use flotilla_api_machinery::field::{ErrorType, FieldError, Path, go_quote};
use serde_json::{Map, Number, Value};

use crate::gofmt::{go_float_v, go_json, go_v};
use crate::structural::Structural;
use crate::{listtype, objectmeta};

/// What kind of kube-openapi error this is; decides how it becomes a field error.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Code {
    InvalidType,
    Required,
    TooLong,
    Enum,
    MaxItems,
    TooManyProperties,
    /// Any other `*errors.Validation`: reported as `Invalid` at its own path.
    Other,
    /// Not a `*errors.Validation` (composite and range messages): reported at the base path.
    Plain,
}

#[derive(Debug, Clone)]
struct OpenApiError {
    code: Code,
    name: String,
    message: String,
    value: Option<Value>,
    /// The enum values, or the limit for `TooLong`/`MaxItems`/`TooManyProperties`.
    valid: Vec<Value>,
}

impl OpenApiError {
    fn new(code: Code, name: &str, message: String, value: Option<Value>) -> Self {
        OpenApiError {
            code,
            name: name.to_string(),
            message,
            value,
            valid: Vec::new(),
        }
    }

    fn plain(message: String) -> Self {
        OpenApiError::new(Code::Plain, "", message, None)
    }

    fn with_valid(mut self, valid: Vec<Value>) -> Self {
        self.valid = valid;
        self
    }
}

/// kube-openapi's `validate.Result`: errors deduplicated by message, and how many checks
/// passed, which picks the most plausible branch of `anyOf`/`oneOf` to report.
#[derive(Debug, Default)]
struct Res {
    errors: Vec<OpenApiError>,
    match_count: usize,
}

impl Res {
    fn err(error: OpenApiError) -> Res {
        Res {
            errors: vec![error],
            match_count: 0,
        }
    }

    fn add(&mut self, error: OpenApiError) {
        if !self.errors.iter().any(|e| e.message == error.message) {
            self.errors.push(error);
        }
    }

    fn merge(&mut self, other: Res) {
        for error in other.errors {
            self.add(error);
        }
        self.match_count += other.match_count;
    }

    fn inc(&mut self) {
        self.match_count += 1;
    }

    fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// A JSON number as Go decodes it: `int64` when it fits, `float64` otherwise.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn of(n: &Number) -> Num {
        match n.as_i64() {
            Some(i) => Num::Int(i),
            None => Num::Float(n.as_f64().unwrap_or_default()),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn value(self) -> Value {
        match self {
            Num::Int(i) => Value::from(i),
            Num::Float(f) => Value::from(f),
        }
    }

    /// Go's `%v`.
    fn go_v(self) -> String {
        match self {
            Num::Int(i) => i.to_string(),
            Num::Float(f) => go_float_v(f),
        }
    }
}

/// swag's `IsFloat64AJSONInteger`: an integer within ±(2^53-1), up to a relative 1e-9.
fn is_float64_json_integer(f: f64) -> bool {
    const MAX: f64 = 9_007_199_254_740_991.0;
    if !f.is_finite() || !(-MAX..=MAX).contains(&f) {
        return false;
    }
    let rounded = f.round();
    if f == rounded {
        return true;
    }
    if rounded == 0.0 {
        return false;
    }
    (f - rounded).abs() < 1e-9 * rounded.abs()
}

/// The schema's type list as kube-openapi sees it.
fn types_of(s: &Structural) -> Vec<&str> {
    if s.extensions.int_or_string {
        vec!["integer", "string"]
    } else if s.type_.is_empty() {
        Vec::new()
    } else {
        vec![s.type_.as_str()]
    }
}

/// apiextensions' `StripUnsupportedFormatsPostProcessor`: the format that is actually checked.
fn effective_format<'a>(s: &'a Structural, types: &[&str]) -> &'a str {
    let format = s.value_validation.format.as_str();
    let single = if types.len() == 1 { types[0] } else { "" };
    let kept = match single {
        "" | "string" => formats::is_supported(format),
        "integer" => matches!(format, "int32" | "int64"),
        "number" => matches!(format, "float" | "double"),
        _ => false,
    };
    if kept { format } else { "" }
}

fn invalid_type(name: &str, type_name: &str, found: &str) -> OpenApiError {
    OpenApiError::new(
        Code::InvalidType,
        name,
        format!(
            "{name} in body must be of type {type_name}: {}",
            go_quote(found)
        ),
        Some(Value::String(found.to_string())),
    )
}

/// kube-openapi `SchemaValidator.Validate`.
fn validate_schema(s: &Structural, path: &str, data: &Value) -> Res {
    let mut res = Res::default();
    let types = types_of(s);
    let format = effective_format(s, &types);
    if data.is_null() {
        res.merge(validate_type(&types, s.nullable, format, path, data));
        res.merge(validate_enum(s, path, data));
        return res;
    }
    if !types.is_empty() || !format.is_empty() {
        res.merge(validate_type(&types, s.nullable, format, path, data));
        res.inc();
    }
    res.merge(validate_schema_props(s, path, data));
    res.inc();
    if let Value::String(text) = data {
        res.merge(validate_string(s, path, text));
        res.inc();
        if formats::is_supported(format) {
            if !formats::validates(format, text) {
                res.merge(Res::err(invalid_type(path, format, text)));
            }
            res.inc();
        }
    }
    if let Value::Number(n) = data {
        res.merge(number::validate_number(s, &types, format, path, Num::of(n)));
        res.inc();
    }
    if let Value::Array(items) = data {
        res.merge(validate_slice(s, path, items));
        res.inc();
    }
    res.merge(validate_enum(s, path, data));
    res.inc();
    if let Value::Object(object) = data {
        res.merge(validate_object(s, path, object));
        res.inc();
    }
    res.inc();
    res
}

/// kube-openapi `typeValidator`.
fn validate_type(types: &[&str], nullable: bool, format: &str, path: &str, data: &Value) -> Res {
    let mut res = Res::default();
    res.inc();
    let contains = |t: &str| types.contains(&t);
    let (found, found_format) = match data {
        Value::Null => {
            if !types.is_empty() && !contains("null") && !nullable {
                return Res::err(invalid_type(path, &types.join(","), "null"));
            }
            return res;
        }
        Value::Bool(_) => ("boolean", ""),
        Value::String(_) => ("string", ""),
        Value::Number(n) => match Num::of(n) {
            Num::Int(_) => ("integer", "int64"),
            Num::Float(_) => ("number", "float64"),
        },
        Value::Array(_) => ("array", ""),
        Value::Object(_) => ("object", ""),
    };
    let float_int = found == "number"
        && data.as_f64().is_some_and(is_float64_json_integer)
        && contains("integer");
    let int_float = found == "integer" && contains("number");
    let text_or_list = data.is_string() || data.is_array();
    let format_fits =
        format.is_empty() || contains(found) || found_format == format || float_int || int_float;
    if !text_or_list && !format_fits {
        return Res::err(invalid_type(path, format, found_format));
    }
    let numeric = contains("number") || contains("integer");
    if text_or_list && !(numeric || format.is_empty()) {
        return res;
    }
    if !(contains(found) || float_int || int_float) {
        return Res::err(invalid_type(path, &types.join(","), found));
    }
    res
}

/// kube-openapi `schemaPropsValidator`: `allOf`, `anyOf`, `oneOf` and `not`.
fn validate_schema_props(s: &Structural, path: &str, data: &Value) -> Res {
    let vv = &s.value_validation;
    let mut main = Res::default();
    let quoted = go_quote(path);
    if !vv.any_of.is_empty() {
        let mut best: Option<Res> = None;
        let mut first_success: Option<Res> = None;
        for schema in &vv.any_of {
            let result = validate_schema(schema, path, data);
            if result.is_valid() {
                best = None;
                first_success = Some(result);
                break;
            }
            if best
                .as_ref()
                .is_none_or(|b| result.match_count > b.match_count)
            {
                best = Some(result);
            }
        }
        if first_success.is_none() {
            main.add(OpenApiError::plain(format!(
                "{quoted} must validate at least one schema (anyOf)"
            )));
        }
        if let Some(result) = best.or(first_success) {
            main.merge(result);
        }
    }
    if !vv.one_of.is_empty() {
        let mut best: Option<Res> = None;
        let mut first_success: Option<Res> = None;
        let mut validated = 0;
        for schema in &vv.one_of {
            let result = validate_schema(schema, path, data);
            if result.is_valid() {
                validated += 1;
                best = None;
                first_success.get_or_insert(result);
                continue;
            }
            if validated == 0
                && best
                    .as_ref()
                    .is_none_or(|b| result.match_count > b.match_count)
            {
                best = Some(result);
            }
        }
        if validated != 1 {
            let detail = if validated == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {validated} valid alternatives")
            };
            main.add(OpenApiError::plain(format!(
                "{quoted} must validate one and only one schema (oneOf). {detail}"
            )));
            if let Some(result) = best {
                main.merge(result);
            }
        } else if let Some(result) = first_success {
            main.merge(result);
        }
    }
    if !vv.all_of.is_empty() {
        let mut validated = 0;
        for schema in &vv.all_of {
            let result = validate_schema(schema, path, data);
            if result.is_valid() {
                validated += 1;
            }
            main.merge(result);
        }
        if validated != vv.all_of.len() {
            let detail = if validated == 0 {
                ". None validated"
            } else {
                ""
            };
            main.add(OpenApiError::plain(format!(
                "{quoted} must validate all the schemas (allOf){detail}"
            )));
        }
    }
    if let Some(not) = &vv.not
        && validate_schema(not, path, data).is_valid()
    {
        main.add(OpenApiError::plain(format!(
            "{quoted} must not validate the schema (not)"
        )));
    }
    main.inc();
    main
}

/// kube-openapi `stringValidator`: stops at the first failure.
fn validate_string(s: &Structural, path: &str, text: &str) -> Res {
    let vv = &s.value_validation;
    let length = text.chars().count() as i64;
    let value = || Some(Value::String(text.to_string()));
    if let Some(max) = vv.max_length
        && length > max
    {
        let message = format!("{path} in body should be at most {max} chars long");
        return Res::err(
            OpenApiError::new(Code::TooLong, path, message, value()).with_valid(vec![max.into()]),
        );
    }
    if let Some(min) = vv.min_length
        && length < min
    {
        let message = format!("{path} in body should be at least {min} chars long");
        return Res::err(OpenApiError::new(Code::Other, path, message, value()));
    }
    if let Some(pattern) = &vv.pattern {
        let shown = match pattern.regex() {
            Ok(re) if re.is_match(text) => return Res::default(),
            Ok(_) => pattern.source().to_string(),
            Err(e) => format!("{}, but pattern is invalid: {e}", pattern.source()),
        };
        let message = format!("{path} in body should match '{shown}'");
        return Res::err(OpenApiError::new(Code::Other, path, message, value()));
    }
    Res::default()
}

/// kube-openapi `schemaSliceValidator`.
fn validate_slice(s: &Structural, path: &str, items: &[Value]) -> Res {
    let vv = &s.value_validation;
    let mut res = Res::default();
    if let Some(item_schema) = &s.items {
        for (i, item) in items.iter().enumerate() {
            res.merge(validate_schema(item_schema, &format!("{path}[{i}]"), item));
        }
    }
    let size = items.len() as i64;
    if let Some(min) = vv.min_items
        && size < min
    {
        let message = format!("{path} in body should have at least {min} items");
        res.add(OpenApiError::new(
            Code::Other,
            path,
            message,
            Some(size.into()),
        ));
    }
    if let Some(max) = vv.max_items
        && size > max
    {
        let message = format!("{path} in body should have at most {max} items");
        res.add(
            OpenApiError::new(Code::MaxItems, path, message, Some(size.into()))
                .with_valid(vec![max.into()]),
        );
    }
    if vv.unique_items
        && items
            .iter()
            .enumerate()
            .any(|(i, item)| items[..i].contains(item))
    {
        let message = format!("{path} in body shouldn't contain duplicates");
        res.add(OpenApiError::new(Code::Other, path, message, None));
    }
    res.inc();
    res
}

/// Go's `reflect` conversion-then-`DeepEqual` that kube-openapi uses to match enum values.
fn enum_matches(data: &Value, allowed: &Value) -> bool {
    match (data, allowed) {
        (Value::Number(d), Value::Number(a)) => match (Num::of(d), Num::of(a)) {
            (Num::Int(d), Num::Int(a)) => d == a,
            (Num::Int(d), Num::Float(a)) => d as f64 == a,
            (Num::Float(d), Num::Int(a)) => d as i64 == a,
            (Num::Float(d), Num::Float(a)) => d == a,
        },
        // Go converts an integer to the string of that code point.
        (Value::Number(d), Value::String(a)) => match Num::of(d) {
            Num::Int(i) => {
                let c = u32::try_from(i)
                    .ok()
                    .and_then(char::from_u32)
                    .unwrap_or('\u{FFFD}');
                a.chars().eq(std::iter::once(c))
            }
            Num::Float(_) => false,
        },
        (Value::Null, _) | (_, Value::Null) => false,
        (d, a) => d == a,
    }
}

/// kube-openapi `basicCommonValidator`: `enum`.
fn validate_enum(s: &Structural, path: &str, data: &Value) -> Res {
    let allowed = &s.value_validation.enum_;
    if allowed.is_empty() || allowed.iter().any(|a| enum_matches(data, a)) {
        return Res::default();
    }
    let message = format!(
        "{path} in body should be one of {}",
        go_v(&Value::Array(allowed.clone()))
    );
    Res::err(
        OpenApiError::new(Code::Enum, path, message, Some(data.clone()))
            .with_valid(allowed.clone()),
    )
}

/// kube-openapi `objectValidator`.
fn validate_object(s: &Structural, path: &str, object: &Map<String, Value>) -> Res {
    let vv = &s.value_validation;
    let mut res = Res::default();
    let size = object.len() as i64;
    if let Some(min) = vv.min_properties
        && size < min
    {
        let message = format!("{path} in body should have at least {min} properties");
        res.add(OpenApiError::new(
            Code::Other,
            path,
            message,
            Some(size.into()),
        ));
    }
    if let Some(max) = vv.max_properties
        && size > max
    {
        let message = format!("{path} in body should have at most {max} properties");
        res.add(
            OpenApiError::new(Code::TooManyProperties, path, message, Some(size.into()))
                .with_valid(vec![max.into()]),
        );
    }
    let extra = object
        .iter()
        .filter(|(k, _)| !s.properties.contains_key(*k));
    match &s.additional_properties {
        Some(crate::AdditionalProperties::Bool(false)) => {
            for (key, _) in extra {
                let message = format!("{path}.{key} in body is a forbidden property");
                res.add(OpenApiError::new(
                    Code::Other,
                    path,
                    message,
                    Some(key.as_str().into()),
                ));
            }
        }
        Some(crate::AdditionalProperties::Schema(schema)) => {
            for (key, value) in extra {
                res.merge(validate_schema(schema, &format!("{path}.{key}"), value));
            }
        }
        _ => {}
    }
    for (name, schema) in &s.properties {
        if let Some(value) = object.get(name) {
            let child = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            res.merge(validate_schema(schema, &child, value));
        }
    }
    for key in &vv.required {
        if !object.contains_key(key) {
            let name = format!("{path}.{key}");
            let message = format!("{name} in body is required");
            res.add(OpenApiError::new(Code::Required, &name, message, None));
        }
    }
    res
}

fn count(value: &Value) -> i64 {
    value.as_i64().unwrap_or(-1)
}

/// apiextensions `kubeOpenAPIResultToFieldErrors`.
fn to_field_errors(base: &Path, errors: Vec<OpenApiError>) -> Vec<FieldError> {
    errors
        .into_iter()
        .map(|err| {
            let path = if err.name.is_empty() || err.name == "." {
                base.clone()
            } else {
                base.child(err.name.strip_prefix('.').unwrap_or(&err.name))
            };
            let value = err
                .value
                .clone()
                .unwrap_or_else(|| Value::String(String::new()));
            let limit = err.valid.first().map_or(-1, count);
            let plural = |unit: &str| {
                if limit == 1 {
                    unit.to_string()
                } else {
                    format!("{unit}s")
                }
            };
            match err.code {
                Code::Plain => FieldError::invalid(base, "", err.message),
                Code::Required => FieldError::required(&path, ""),
                Code::Enum => {
                    let allowed: Vec<String> = err
                        .valid
                        .iter()
                        .map(|v| match v {
                            Value::String(s) => s.clone(),
                            other => go_json(other),
                        })
                        .collect();
                    let refs: Vec<&str> = allowed.iter().map(String::as_str).collect();
                    FieldError::not_supported(&path, value, &refs)
                }
                Code::TooLong => FieldError {
                    error_type: ErrorType::TooLong,
                    field: path.to_string(),
                    bad_value: None,
                    detail: if limit >= 0 {
                        format!("may not be more than {limit} {}", plural("byte"))
                    } else {
                        "value is too long".to_string()
                    },
                },
                Code::MaxItems | Code::TooManyProperties => FieldError {
                    error_type: ErrorType::TooMany,
                    field: path.to_string(),
                    bad_value: err
                        .value
                        .as_ref()
                        .map(count)
                        .filter(|n| *n >= 0)
                        .map(Value::from),
                    detail: if limit >= 0 {
                        format!("must have at most {limit} {}", plural("item"))
                    } else {
                        "has too many items".to_string()
                    },
                },
                Code::InvalidType => FieldError {
                    error_type: ErrorType::TypeInvalid,
                    field: path.to_string(),
                    bad_value: Some(value),
                    detail: err.message,
                },
                Code::Other => FieldError::invalid(&path, value, err.message),
            }
        })
        .collect()
}

/// Upstream `ValidateCustomResource`: the OpenAPI value validation of `value` against
/// `schema`, with errors placed under `path` (`Path::none()` for a whole object,
/// `Path::new("status")` for the status subresource validated against the status schema).
pub fn validate_custom_resource(
    path: &Path,
    value: &Value,
    schema: &Structural,
) -> Vec<FieldError> {
    let result = validate_schema(schema, "", value);
    to_field_errors(path, result.errors)
}

/// Validates a custom resource the way its registry strategy does, short of CEL rules and of
/// the root TypeMeta/ObjectMeta checks every kind shares: OpenAPI value validation, then
/// TypeMeta/ObjectMeta of embedded resources, then list-type set/map uniqueness.
pub fn validate(schema: &Structural, value: &Value) -> Vec<FieldError> {
    let root = Path::none();
    let mut errors = validate_custom_resource(&root, value, schema);
    errors.extend(objectmeta::validate(&root, value, schema, false));
    if let Value::Object(object) = value {
        errors.extend(listtype::validate_list_sets_and_maps(&root, schema, object));
    }
    errors
}

#[cfg(test)]
mod tests;
