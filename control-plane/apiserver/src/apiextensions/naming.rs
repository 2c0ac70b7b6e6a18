//! Upstream's naming controller (`apiextensions-apiserver/pkg/controller/status`): which of a
//! definition's requested names it may have, given the names the other definitions of its
//! group hold, and the `NamesAccepted` and `Established` conditions that follow.

use serde_json::{Value, json};

/// A condition to set on a definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// `NamesAccepted`, `Established`.
    pub kind: String,
    /// `True` or `False`.
    pub status: String,
    /// The one-word reason.
    pub reason: String,
    /// The human message.
    pub message: String,
}

impl Condition {
    fn new(kind: &str, status: &str, reason: &str, message: &str) -> Self {
        Condition {
            kind: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The accepted names and the `NamesAccepted` and `Established` conditions of `definition`
/// among `all` (the tenant's definitions, itself included); `None` when it has them already.
/// A definition whose names were accepted is established at once: one replica's table is
/// rebuilt before the answer, so the endpoint is served as soon as the condition says so.
pub fn calculate(definition: &Value, all: &[Value]) -> Option<(Value, Condition, Condition)> {
    let requested = &definition["spec"]["names"];
    let accepted = &definition["status"]["acceptedNames"];
    let established = super::definition::condition_status(definition, "Established");
    if requested == accepted && established == Some("True") {
        return None;
    }
    let group = &definition["spec"]["group"];
    let mut resources: Vec<&str> = Vec::new();
    let mut kinds: Vec<&str> = Vec::new();
    for other in all.iter().filter(|d| d["spec"]["group"] == *group) {
        let names = &other["status"]["acceptedNames"];
        resources.extend(
            ["plural", "singular"]
                .iter()
                .filter_map(|f| names[*f].as_str()),
        );
        resources.extend(
            names["shortNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str),
        );
        kinds.extend(
            ["kind", "listKind"]
                .iter()
                .filter_map(|f| names[*f].as_str()),
        );
    }
    let text = |names: &Value, field: &str| names[field].as_str().unwrap_or("").to_string();
    let fresh_or_ours = |field: &str, used: &[&str]| -> Result<(), String> {
        let wanted = text(requested, field);
        if wanted == text(accepted, field) || !used.contains(&wanted.as_str()) {
            Ok(())
        } else {
            Err(format!("{wanted:?} is already in use"))
        }
    };
    let mut names_condition = None;
    let mut new_names = if accepted.is_object() {
        accepted.clone()
    } else {
        json!({})
    };
    for (field, reason, used) in [
        ("plural", "PluralConflict", &resources),
        ("singular", "SingularConflict", &resources),
    ] {
        match fresh_or_ours(field, used) {
            Ok(()) => new_names[field] = requested[field].clone(),
            Err(message) => {
                names_condition = Some(Condition::new("NamesAccepted", "False", reason, &message))
            }
        }
    }
    if requested["shortNames"] != accepted["shortNames"] {
        let ours: Vec<&str> = accepted["shortNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let conflicts: Vec<String> = requested["shortNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|short| !ours.contains(short) && resources.contains(short))
            .map(|short| format!("{short:?} is already in use"))
            .collect();
        if conflicts.is_empty() {
            new_names["shortNames"] = requested["shortNames"].clone();
        } else {
            let message = flotilla_api_machinery::field::aggregate_messages(&conflicts);
            names_condition = Some(Condition::new(
                "NamesAccepted",
                "False",
                "ShortNamesConflict",
                &message,
            ));
        }
    }
    for (field, reason) in [("kind", "KindConflict"), ("listKind", "ListKindConflict")] {
        match fresh_or_ours(field, &kinds) {
            Ok(()) => new_names[field] = requested[field].clone(),
            Err(message) => {
                names_condition = Some(Condition::new("NamesAccepted", "False", reason, &message))
            }
        }
    }
    if !requested["categories"].is_null() {
        new_names["categories"] = requested["categories"].clone();
    }
    let names_condition = names_condition.unwrap_or_else(|| {
        Condition::new("NamesAccepted", "True", "NoConflicts", "no conflicts found")
    });
    let established = if names_condition.status == "True" {
        Condition::new(
            "Established",
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        )
    } else if established == Some("True") {
        // Names once served stay served (upstream never un-establishes a definition).
        Condition::new(
            "Established",
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        )
    } else {
        Condition::new(
            "Established",
            "False",
            "NotAccepted",
            "not all names are accepted",
        )
    };
    Some((new_names, names_condition, established))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(name: &str, plural: &str, kind: &str) -> Value {
        json!({
            "metadata": {"name": format!("{plural}.example.com")},
            "spec": {"group": "example.com", "names": {
                "plural": plural, "singular": name, "kind": kind, "listKind": format!("{kind}List"),
            }},
        })
    }

    #[test]
    fn fresh_names_are_accepted_and_established() {
        let widget = definition("widget", "widgets", "Widget");
        let (names, accepted, established) =
            calculate(&widget, std::slice::from_ref(&widget)).expect("something to do");
        assert_eq!(names["plural"], "widgets");
        assert_eq!(names["listKind"], "WidgetList");
        assert_eq!(
            (accepted.status.as_str(), accepted.reason.as_str()),
            ("True", "NoConflicts")
        );
        assert_eq!(established.status, "True");
        assert_eq!(established.reason, "InitialNamesAccepted");
    }

    #[test]
    fn a_second_definition_claiming_a_kind_is_refused_it() {
        let mut first = definition("widget", "widgets", "Widget");
        first["status"]["acceptedNames"] = first["spec"]["names"].clone();
        let second = definition("gizmo", "gizmos", "Widget");
        let (names, accepted, established) =
            calculate(&second, &[first, second.clone()]).expect("something to do");
        assert_eq!(accepted.status, "False");
        // Upstream checks kind, then listKind; the last conflict found is the one reported.
        assert_eq!(accepted.reason, "ListKindConflict");
        assert_eq!(accepted.message, "\"WidgetList\" is already in use");
        assert_eq!(names["plural"], "gizmos");
        assert!(names.get("kind").is_none());
        assert_eq!(
            (established.status.as_str(), established.reason.as_str()),
            ("False", "NotAccepted")
        );
    }
}
