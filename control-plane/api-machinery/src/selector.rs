//! Label selectors (`k8s.io/apimachinery/pkg/labels`) and field selectors
//! (`k8s.io/apimachinery/pkg/fields`): parsing of the query-string forms with upstream's error
//! messages, conversion from a metav1 `LabelSelector` object, and matching.
//!
//! Matching takes plain maps supplied by the caller: the object's labels, or the field values
//! (`metadata.name`, `spec.nodeName`, ...) that the resource's strategy exposes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde_json::Value;

use crate::field::{FieldError, Path, aggregate};
use crate::names::{is_qualified_name, is_valid_label_value};

/// Why a selector could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector string is malformed; the message is upstream's parser message
    /// (`found ',', expected: identifier after ','`, `unable to parse requirement: ...`).
    #[error("{0}")]
    Syntax(String),
    /// A requirement failed validation (bad key, bad value, wrong number of values).
    #[error("{}", aggregate(.0))]
    InvalidRequirement(Vec<FieldError>),
    /// A `matchExpressions` operator is not one of In, NotIn, Exists, DoesNotExist.
    #[error("{0:?} is not a valid label selector operator")]
    InvalidOperator(String),
    /// A metav1 `LabelSelector` object is not shaped like one.
    #[error("invalid label selector: {0}")]
    Malformed(String),
    /// A field selector term has no recognised operator.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm {
        /// The whole selector.
        selector: String,
        /// The offending term.
        term: String,
    },
    /// A field selector value has a backslash that escapes nothing escapable.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    InvalidEscapeSequence(String),
    /// A field selector value has a bare `,` or `=`; upstream prints the code point.
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.0))]
    UnescapedCharacter(char),
    /// A field selector names a field the resource does not index.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// A set of labels a selector can be matched against.
pub trait Labels {
    /// The value of `key`, if present.
    fn get_label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<S: std::hash::BuildHasher> Labels for HashMap<String, String, S> {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// A JSON labels object; non-string values are treated as absent.
impl Labels for serde_json::Map<String, Value> {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// A label selector operator (upstream `selection.Operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value`.
    Equals,
    /// `key==value`.
    DoubleEquals,
    /// `key!=value`: matches when the key is absent too.
    NotEquals,
    /// `key in (a,b)`.
    In,
    /// `key notin (a,b)`: matches when the key is absent too.
    NotIn,
    /// `key`.
    Exists,
    /// `!key`.
    DoesNotExist,
    /// `key>1` (integers only).
    GreaterThan,
    /// `key<1` (integers only).
    LessThan,
}

impl Operator {
    /// The operator's upstream string value (`=`, `in`, `exists`, `gt`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => "in",
            Operator::NotIn => "notin",
            Operator::Exists => "exists",
            Operator::DoesNotExist => "!",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

/// One `key op values` term of a label selector (upstream `labels.Requirement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a validated requirement (upstream `NewRequirement`); errors carry upstream's
    /// field paths (`key`, `values`, `values[0][key]`).
    pub fn new(key: &str, operator: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        Self::new_at(key, operator, values, &Path::none())
    }

    fn new_at(
        key: &str,
        operator: Operator,
        values: Vec<String>,
        path: &Path,
    ) -> Result<Self, SelectorError> {
        let mut errors = Vec::new();
        if let Some(e) = validate_label_key(key, &path.child("key")) {
            errors.push(e);
        }
        let values_path = path.child("values");
        let values_json = || Value::from(values.clone());
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                errors.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "for 'in', 'notin' operators, values set can't be empty",
                ))
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals
                if values.len() != 1 =>
            {
                errors.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "exact-match compatibility requires one single value",
                ))
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                errors.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "values set must be empty for exists and does not exist",
                ))
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errors.push(FieldError::invalid(
                        &values_path,
                        values_json(),
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, value) in values.iter().enumerate() {
                    if value.parse::<i64>().is_err() {
                        errors.push(FieldError::invalid(
                            &values_path.index(i),
                            value.as_str(),
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
            _ => {}
        }
        for (i, value) in values.iter().enumerate() {
            let problems = is_valid_label_value(value);
            if !problems.is_empty() {
                errors.push(FieldError::invalid(
                    &values_path.index(i).key(key),
                    value.as_str(),
                    problems.join("; "),
                ));
            }
        }
        if errors.is_empty() {
            Ok(Requirement {
                key: key.to_string(),
                operator,
                values,
            })
        } else {
            Err(SelectorError::InvalidRequirement(errors))
        }
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, in the order given.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether `labels` satisfy this requirement (upstream `Requirement.Matches`).
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                labels.get_label(&self.key).is_some_and(has)
            }
            Operator::NotIn | Operator::NotEquals => {
                labels.get_label(&self.key).is_none_or(|v| !has(v))
            }
            Operator::Exists => labels.get_label(&self.key).is_some(),
            Operator::DoesNotExist => labels.get_label(&self.key).is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(actual) = labels
                    .get_label(&self.key)
                    .and_then(|v| v.parse::<i64>().ok())
                else {
                    return false;
                };
                let [wanted] = self.values.as_slice() else {
                    return false;
                };
                let Ok(wanted) = wanted.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > wanted
                } else {
                    actual < wanted
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        f.write_str(op)?;
        let set = matches!(self.operator, Operator::In | Operator::NotIn);
        if set {
            f.write_str("(")?;
        }
        // Upstream prints multiple values sorted, without changing the stored order.
        let mut values: Vec<&str> = self.values.iter().map(String::as_str).collect();
        values.sort_unstable();
        f.write_str(&values.join(","))?;
        if set {
            f.write_str(")")?;
        }
        Ok(())
    }
}

fn validate_label_key(key: &str, path: &Path) -> Option<FieldError> {
    let problems = is_qualified_name(key);
    if problems.is_empty() {
        None
    } else {
        Some(FieldError::invalid(path, key, problems.join("; ")))
    }
}

/// A parsed label selector: the AND of its requirements, sorted by key (upstream
/// `labels.Selector`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    /// Set for the selector of a nil metav1 `LabelSelector`, which matches nothing.
    nothing: bool,
}

impl LabelSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    /// The selector that matches no object (a nil metav1 `LabelSelector`).
    pub fn nothing() -> Self {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// Builds a selector from requirements, sorting them by key as upstream does.
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector {
            requirements,
            nothing: false,
        }
    }

    /// The selector matching exactly `set` (upstream `SelectorFromSet`, unvalidated).
    pub fn from_set(set: &BTreeMap<String, String>) -> Self {
        let requirements = set
            .iter()
            .map(|(k, v)| Requirement {
                key: k.clone(),
                operator: Operator::Equals,
                values: vec![v.clone()],
            })
            .collect();
        LabelSelector::from_requirements(requirements)
    }

    /// Parses the query-string form (upstream `labels.Parse`): `a=b,c!=d,e in (x,y),!f,g>1`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let tokens = lex(selector.as_bytes());
        let requirements = Parser {
            tokens,
            position: 0,
        }
        .parse()?;
        Ok(LabelSelector::from_requirements(requirements))
    }

    /// Converts a metav1 `LabelSelector` object (upstream `LabelSelectorAsSelector`): `null`
    /// matches nothing, `{}` matches everything.
    pub fn from_json(selector: &Value) -> Result<Self, SelectorError> {
        Self::from_optional_json(Some(selector))
    }

    /// [`LabelSelector::from_json`] for a field that may be absent (absent matches nothing).
    pub fn from_optional_json(selector: Option<&Value>) -> Result<Self, SelectorError> {
        let object = match selector {
            None | Some(Value::Null) => return Ok(LabelSelector::nothing()),
            Some(Value::Object(object)) => object,
            Some(_) => return Err(SelectorError::Malformed("must be an object".into())),
        };
        let mut requirements = Vec::new();
        match object.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (key, value) in labels {
                    let Some(value) = value.as_str() else {
                        return Err(SelectorError::Malformed(format!(
                            "matchLabels[{key}] must be a string"
                        )));
                    };
                    requirements.push(Requirement::new(
                        key,
                        Operator::Equals,
                        vec![value.to_string()],
                    )?);
                }
            }
            Some(_) => {
                return Err(SelectorError::Malformed(
                    "matchLabels must be an object".into(),
                ));
            }
        }
        match object.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for expression in expressions {
                    requirements.push(requirement_from_expression(expression)?);
                }
            }
            Some(_) => {
                return Err(SelectorError::Malformed(
                    "matchExpressions must be a list".into(),
                ));
            }
        }
        Ok(LabelSelector::from_requirements(requirements))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Matches a JSON `metadata.labels` value; absent or `null` labels are the empty set.
    pub fn matches_json(&self, labels: Option<&Value>) -> bool {
        match labels.and_then(Value::as_object) {
            Some(labels) => self.matches(labels),
            None => self.matches(&BTreeMap::<String, String>::new()),
        }
    }

    /// True when the selector does not restrict anything (upstream `Empty`); the nothing
    /// selector is not empty.
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// True for the selector that matches nothing.
    pub fn matches_nothing(&self) -> bool {
        self.nothing
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// The single value `label` must have, if the selector pins one (upstream
    /// `RequiresExactMatch`).
    pub fn requires_exact_match(&self, label: &str) -> Option<&str> {
        let requirement = self.requirements.iter().find(|r| r.key == label)?;
        match (requirement.operator, requirement.values.as_slice()) {
            (Operator::Equals | Operator::DoubleEquals | Operator::In, [value]) => Some(value),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

fn requirement_from_expression(expression: &Value) -> Result<Requirement, SelectorError> {
    let Some(expression) = expression.as_object() else {
        return Err(SelectorError::Malformed(
            "matchExpressions entries must be objects".into(),
        ));
    };
    let key = expression
        .get("key")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let operator = expression
        .get("operator")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let operator = match operator {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => return Err(SelectorError::InvalidOperator(other.to_string())),
    };
    let values = match expression.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                SelectorError::Malformed("matchExpressions values must be strings".into())
            })?,
        Some(_) => {
            return Err(SelectorError::Malformed(
                "matchExpressions values must be a list".into(),
            ));
        }
    };
    Requirement::new(key, operator, values)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(literal: &[u8]) -> Option<Token> {
    Some(match literal {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Upstream's lexer, byte for byte: identifiers run until whitespace or a special symbol, and
/// special symbols are scanned greedily as long as they still form a known operator.
fn lex(input: &[u8]) -> Vec<(Token, String)> {
    // Splits only ever happen at ASCII bytes, so every slice is valid UTF-8 again.
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut tokens = Vec::new();
    let mut pos = 0;
    loop {
        while pos < input.len() && is_whitespace(input[pos]) {
            pos += 1;
        }
        if pos >= input.len() {
            tokens.push((Token::EndOfString, String::new()));
            return tokens;
        }
        if is_special_symbol(input[pos]) {
            let start = pos;
            let mut last: Option<(Token, usize)> = None;
            while pos < input.len() && is_special_symbol(input[pos]) {
                let candidate = &input[start..=pos];
                if let Some(token) = keyword(candidate) {
                    last = Some((token, pos + 1));
                } else if last.is_some() {
                    break;
                }
                pos += 1;
            }
            match last {
                Some((token, end)) => {
                    pos = end;
                    tokens.push((token, text(&input[start..end])));
                }
                None => tokens.push((
                    Token::Error,
                    format!(
                        "error expected: keyword found '{}'",
                        text(&input[start..pos])
                    ),
                )),
            }
        } else {
            let start = pos;
            while pos < input.len() && !is_special_symbol(input[pos]) && !is_whitespace(input[pos])
            {
                pos += 1;
            }
            let literal = &input[start..pos];
            tokens.push((keyword(literal).unwrap_or(Token::Identifier), text(literal)));
        }
    }
}

/// Whether `in`/`notin` are operators (after a key) or plain identifiers (as values).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    tokens: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn token_at(&self, index: usize, context: Context) -> (Token, String) {
        // The token list always ends with EndOfString; reading past it keeps returning it.
        let (token, literal) = self
            .tokens
            .get(index)
            .or(self.tokens.last())
            .cloned()
            .unwrap_or((Token::EndOfString, String::new()));
        match (context, token) {
            (Context::Values, Token::In | Token::NotIn) => (Token::Identifier, literal),
            _ => (token, literal),
        }
    }

    fn lookahead(&self, context: Context) -> (Token, String) {
        self.token_at(self.position, context)
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        let item = self.token_at(self.position, context);
        self.position += 1;
        item
    }

    fn parse(mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let requirement = self.parse_requirement().map_err(|e| {
                        SelectorError::Syntax(format!("unable to parse requirement: {e}"))
                    })?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (next, literal) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{literal}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{literal}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (key, operator) = self.parse_key_and_infer_operator()?;
        if let Some(operator @ (Operator::Exists | Operator::DoesNotExist)) = operator {
            return Requirement::new_at(&key, operator, Vec::new(), &Path::none());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        Requirement::new_at(&key, operator, values.into_iter().collect(), &Path::none())
    }

    fn parse_key_and_infer_operator(
        &mut self,
    ) -> Result<(String, Option<Operator>), SelectorError> {
        let mut operator = None;
        let (mut token, mut literal) = self.consume(Context::Values);
        if token == Token::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(SelectorError::Syntax(format!(
                "found '{literal}', expected: identifier"
            )));
        }
        if let Some(error) = validate_label_key(&literal, &Path::none()) {
            return Err(SelectorError::InvalidRequirement(vec![error]));
        }
        let (next, _) = self.lookahead(Context::Values);
        if matches!(next, Token::EndOfString | Token::Comma) && operator.is_none() {
            operator = Some(Operator::Exists);
        }
        Ok((literal, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, SelectorError> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(SelectorError::Syntax(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        })
    }

    /// `(a,b,c)`; values come back sorted and de-duplicated, as upstream's `sets.String` does.
    fn parse_values(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(SelectorError::Syntax(format!(
                "found '{literal}' expected: '('"
            )));
        }
        let (token, literal) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                let (token, _) = self.consume(Context::Values);
                if token != Token::ClosedPar {
                    return Err(SelectorError::Syntax(format!(
                        "found '{literal}', expected: ')'"
                    )));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(SelectorError::Syntax(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            ))),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let mut values = BTreeSet::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.insert(literal);
                    let (next, literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{literal}', expected: ',' or ')'"
                            )));
                        }
                    }
                }
                // `(,a)`, `(a,,b)` and `(a,)` all contain the empty value.
                Token::Comma => {
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    let (next, _) = self.lookahead(Context::Values);
                    if next == Token::ClosedPar {
                        values.insert(String::new());
                        return Ok(values);
                    }
                    if next == Token::Comma {
                        values.insert(String::new());
                    }
                }
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{literal}', expected: ',', or identifier"
                    )));
                }
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let (token, _) = self.lookahead(Context::Values);
        if matches!(token, Token::EndOfString | Token::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (token, literal) = self.consume(Context::Values);
        if token == Token::Identifier {
            Ok(BTreeSet::from([literal]))
        } else {
            Err(SelectorError::Syntax(format!(
                "found '{literal}', expected: identifier"
            )))
        }
    }
}

/// A field selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `field=value` or `field==value`.
    Equals,
    /// `field!=value`.
    NotEquals,
}

/// One `field op value` term of a field selector (upstream `fields.Requirement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field label, e.g. `spec.nodeName`.
    pub field: String,
    /// The operator.
    pub operator: FieldOperator,
    /// The unescaped value.
    pub value: String,
}

impl FieldRequirement {
    /// Whether the field values satisfy this term; an absent field has the value `""`.
    pub fn matches(&self, fields: &BTreeMap<String, String>) -> bool {
        let actual = fields.get(&self.field).map(String::as_str).unwrap_or("");
        match self.operator {
            FieldOperator::Equals => actual == self.value,
            FieldOperator::NotEquals => actual != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            FieldOperator::Equals => "=",
            FieldOperator::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_value(&self.value))
    }
}

/// A parsed field selector: the AND of its terms (upstream `fields.Selector`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    /// Parses `a=b,c!=d` with upstream's escaping (`\,`, `\=`, `\\` in values); terms are
    /// sorted, empty terms skipped, and no whitespace is trimmed (as upstream).
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut terms = split_terms(selector);
        terms.sort_unstable();
        let mut requirements = Vec::new();
        for term in terms.into_iter().filter(|t| !t.is_empty()) {
            let Some((field, operator, raw)) = split_term(term) else {
                return Err(SelectorError::FieldTerm {
                    selector: selector.to_string(),
                    term: term.to_string(),
                });
            };
            requirements.push(FieldRequirement {
                field: field.to_string(),
                operator,
                value: unescape_value(raw)?,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// The selector requiring `field` to equal `value` (upstream `OneTermEqualSelector`).
    pub fn one_term_equal(field: &str, value: &str) -> Self {
        FieldSelector {
            requirements: vec![FieldRequirement {
                field: field.to_string(),
                operator: FieldOperator::Equals,
                value: value.to_string(),
            }],
        }
    }

    /// Whether the field values satisfy every term.
    pub fn matches(&self, fields: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(fields))
    }

    /// True when the selector restricts nothing.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms, in sorted order.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The distinct field labels the selector refers to, so the caller can reject the ones its
    /// resource does not support.
    pub fn fields(&self) -> BTreeSet<String> {
        self.requirements.iter().map(|r| r.field.clone()).collect()
    }

    /// Rejects the selector if it names a field outside `supported`, with upstream's
    /// `field label not supported: X` message.
    pub fn check_supported(&self, supported: &[&str]) -> Result<(), SelectorError> {
        match self
            .requirements
            .iter()
            .find(|r| !supported.contains(&r.field.as_str()))
        {
            Some(r) => Err(SelectorError::UnsupportedField(r.field.clone())),
            None => Ok(()),
        }
    }

    /// The single value `field` must equal, if the selector pins one (upstream
    /// `RequiresExactMatch`), e.g. to turn `metadata.name=x` into a point read.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator == FieldOperator::Equals)
            .map(|r| r.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

/// Escapes a literal for use as a field selector value (upstream `EscapeValue`).
pub fn escape_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Reverses [`escape_value`], rejecting unknown escapes and bare `,`/`=` (upstream
/// `UnescapeValue`).
pub fn unescape_value(value: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(value.len());
    let mut in_slash = false;
    for c in value.chars() {
        if in_slash {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError::InvalidEscapeSequence(format!("\\{c}")));
            }
            out.push(c);
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => return Err(SelectorError::UnescapedCharacter(c)),
            c => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::InvalidEscapeSequence("\\".into()));
    }
    Ok(out)
}

/// Splits on commas that are not backslash-escaped; escapes stay in the terms.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Splits a term at the first operator; `!=` and `==` are tried before `=` at each position so
/// `a==b` does not leave `=b` as the value.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, operator) in [
            ("!=", FieldOperator::NotEquals),
            ("==", FieldOperator::Equals),
            ("=", FieldOperator::Equals),
        ] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], operator, value));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_restrings_like_upstream() {
        // From upstream TestSelectorParse: the string form is the input without spaces.
        let good = [
            "x=a,y=b,z=c",
            "",
            "x!=a,y=b",
            "x=",
            "x= ",
            "x=,z= ",
            "x= ,z= ",
            "!x",
            "x>1",
            "x>1,z<5",
        ];
        for input in good {
            let selector = LabelSelector::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(selector.to_string(), input.replace(' ', ""), "{input}");
        }
        let cases = [
            ("a in (z,b, a)", "a in (a,b,z)"),
            ("b=1,a=2", "a=2,b=1"),
            ("  a  ==  b ", "a==b"),
            (
                "x in (foo,,baz),y,z notin ()",
                "x in (,baz,foo),y,z notin ()",
            ),
            ("a in (in,notin)", "a in (in,notin)"),
            ("k8s.io/app=web", "k8s.io/app=web"),
            ("a\tin\t(b)", "a in (b)"),
        ];
        for (input, want) in cases {
            assert_eq!(
                LabelSelector::parse(input).map(|s| s.to_string()),
                Ok(want.to_string()),
                "{input}"
            );
        }
    }

    #[test]
    fn rejects_like_upstream() {
        let cases = [
            (
                "x=a||y=b",
                "unable to parse requirement: values[0][x]: Invalid value: \"a||y\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            ),
            ("x==a==b", "found '==', expected: ',' or 'end of string'"),
            ("!x=a", "found '=', expected: ',' or 'end of string'"),
            (
                "x<a",
                "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer",
            ),
            ("a,", "found '', expected: identifier after ','"),
            (
                ",a",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
            (
                "a in b",
                "unable to parse requirement: found 'b' expected: '('",
            ),
            (
                "a in (b",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a in (=)",
                "unable to parse requirement: found '=', expected: ',', ')' or identifier",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a=(",
                "unable to parse requirement: found '(', expected: identifier",
            ),
            ("a = b c", "found 'c', expected: ',' or 'end of string'"),
            (
                "a notin",
                "unable to parse requirement: found '' expected: '('",
            ),
        ];
        for (input, want) in cases {
            let err = LabelSelector::parse(input).expect_err(input);
            assert_eq!(err.to_string(), want, "{input}");
        }
    }

    #[test]
    fn rejects_invalid_keys_and_values_with_upstream_paths() {
        let err = LabelSelector::parse("a@b=c").expect_err("bad key");
        assert!(err.to_string().starts_with("unable to parse requirement: <nil>: Invalid value: \"a@b\": name part must consist of"), "{err}");
        let err = LabelSelector::parse("a=b@c").expect_err("bad value");
        assert!(err.to_string().starts_with("unable to parse requirement: values[0][a]: Invalid value: \"b@c\": a valid label must be"), "{err}");
        let err = Requirement::new("a", Operator::In, vec![]).expect_err("empty in");
        assert_eq!(
            err.to_string(),
            "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty"
        );
        let err =
            Requirement::new("", Operator::Exists, vec!["x".into()]).expect_err("two problems");
        assert!(
            err.to_string().starts_with(
                "[key: Invalid value: \"\": name part must be non-empty; name part must consist"
            ),
            "{err}"
        );
    }

    #[test]
    fn matches_like_upstream() {
        let set = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (db,web)", true),
            ("app notin (db,web)", false),
            ("missing notin (x)", true),
            ("missing in (x)", false),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("n>4", true),
            ("n>5", false),
            ("n<6", true),
            ("app>1", false),
            ("missing<1", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("missing=", false),
            ("missing in ()", false),
        ];
        for (selector, want) in cases {
            let parsed =
                LabelSelector::parse(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert_eq!(parsed.matches(&set), want, "{selector}");
        }
        let json_labels = json!({"app": "web", "count": 3});
        let parsed = LabelSelector::parse("app=web,!count").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            parsed.matches_json(Some(&json_labels)),
            "non-string label values count as absent"
        );
        assert!(LabelSelector::parse("!a").is_ok_and(|s| s.matches_json(None)));
    }

    #[test]
    fn converts_metav1_label_selectors() {
        let web = labels(&[("app", "web"), ("env", "prod")]);
        let cases = [
            (json!(null), false),
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "dev"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]}),
                true,
            ),
        ];
        for (selector, want) in cases {
            let parsed =
                LabelSelector::from_json(&selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert_eq!(parsed.matches(&web), want, "{selector}");
        }
        assert!(
            LabelSelector::from_json(&json!(null))
                .is_ok_and(|s| s.matches_nothing() && !s.is_empty())
        );
        assert!(LabelSelector::from_json(&json!({})).is_ok_and(|s| s.is_empty()));
        assert!(LabelSelector::from_optional_json(None).is_ok_and(|s| !s.matches(&web)));
        let s = LabelSelector::from_json(
            &json!({"matchLabels": {"b": "1", "a": "2"}, "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]}]}),
        );
        assert_eq!(
            s.map(|s| s.to_string()),
            Ok("a=2,b=1,c in (x,y)".to_string())
        );

        let errors = [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "\"Gt\" is not a valid label selector operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "values: Invalid value: []string{\"x\"}: values set must be empty for exists and does not exist",
            ),
            (
                json!({"matchLabels": {"a": 1}}),
                "invalid label selector: matchLabels[a] must be a string",
            ),
            (json!("a=b"), "invalid label selector: must be an object"),
        ];
        for (selector, want) in errors {
            let err = LabelSelector::from_json(&selector).expect_err("should fail");
            assert_eq!(err.to_string(), want, "{selector}");
        }
    }

    #[test]
    fn exact_matches() {
        let s =
            LabelSelector::parse("a=1,b in (2),c in (3,4),d!=5").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.requires_exact_match("a"), Some("1"));
        assert_eq!(s.requires_exact_match("b"), Some("2"));
        assert_eq!(s.requires_exact_match("c"), None);
        assert_eq!(s.requires_exact_match("d"), None);
        assert_eq!(s.requires_exact_match("e"), None);
        assert_eq!(
            LabelSelector::from_set(&labels(&[("b", "1"), ("a", "2")])).to_string(),
            "a=2,b=1"
        );
    }

    #[test]
    fn field_selectors_parse_and_match() {
        let pod = labels(&[
            ("metadata.name", "web-1"),
            ("spec.nodeName", "node-a"),
            ("status.phase", "Running"),
        ]);
        let cases = [
            ("", true),
            ("metadata.name=web-1", true),
            ("metadata.name==web-1", true),
            ("metadata.name!=web-1", false),
            ("spec.nodeName=node-a,status.phase=Running", true),
            ("spec.nodeName=node-a,status.phase!=Running", false),
            ("spec.nodeName=", false),
            ("spec.schedulerName=", true),
            ("spec.schedulerName!=", false),
            (",metadata.name=web-1,", true),
        ];
        for (selector, want) in cases {
            let parsed =
                FieldSelector::parse(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert_eq!(parsed.matches(&pod), want, "{selector}");
        }
    }

    #[test]
    fn field_selector_escaping() {
        let parsed =
            FieldSelector::parse(r"metadata.name=a\,b\=c\\d").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.requirements()[0].value, r"a,b=c\d");
        assert_eq!(parsed.to_string(), r"metadata.name=a\,b\=c\\d");
        assert!(parsed.matches(&labels(&[("metadata.name", r"a,b=c\d")])));
        assert_eq!(escape_value(r"x\,="), r"x\\\,\=");
        assert_eq!(
            unescape_value(&escape_value("a=b,c\\")).as_deref(),
            Ok("a=b,c\\")
        );

        let errors = [
            ("a", "invalid selector: 'a'; can't understand 'a'"),
            ("a=b,c", "invalid selector: 'a=b,c'; can't understand 'c'"),
            (
                r"a=b\x",
                r"invalid field selector: invalid escape sequence: \x",
            ),
            (
                r"a=b\",
                r"invalid field selector: invalid escape sequence: \",
            ),
            (
                "a=b=c",
                "invalid field selector: unescaped character in value: 61",
            ),
        ];
        for (input, want) in errors {
            assert_eq!(
                FieldSelector::parse(input).expect_err(input).to_string(),
                want,
                "{input}"
            );
        }
    }

    #[test]
    fn field_selector_reports_fields() {
        let parsed = FieldSelector::parse("spec.nodeName=a,metadata.name!=b,spec.nodeName!=c")
            .unwrap_or_else(|e| panic!("{e}"));
        let fields: Vec<String> = parsed.fields().into_iter().collect();
        assert_eq!(fields, vec!["metadata.name", "spec.nodeName"]);
        assert_eq!(parsed.requires_exact_match("spec.nodeName"), Some("a"));
        assert_eq!(parsed.requires_exact_match("metadata.name"), None);
        assert!(
            parsed
                .check_supported(&["metadata.name", "spec.nodeName"])
                .is_ok()
        );
        assert_eq!(
            parsed
                .check_supported(&["metadata.name"])
                .map_err(|e| e.to_string()),
            Err("field label not supported: spec.nodeName".to_string())
        );
        assert_eq!(
            FieldSelector::one_term_equal("metadata.name", "x").to_string(),
            "metadata.name=x"
        );
        // Upstream sorts the raw terms, so the string form is sorted too.
        assert_eq!(
            parsed.to_string(),
            "metadata.name!=b,spec.nodeName!=c,spec.nodeName=a"
        );
    }
}
