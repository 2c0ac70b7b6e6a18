//! What the resources share: attribute helpers, the management API's documents as Terraform
//! values, and reads that tell "not found" apart from failures.

use std::borrow::Cow;
use std::time::Duration;

use std::future::Future;

use http::Method;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{Attribute, AttributeConstraint, AttributeType, Block, Description};
use tf_provider::value::{Value, ValueString};
use tf_provider::{AttributePath, Diagnostics};

/// How long a create or update waits for ACTIVE and a delete for the object to go, unless the
/// resource's `timeouts` block says otherwise.
pub const WAIT: Duration = Duration::from_secs(600);
/// How often it looks.
pub const POLL: Duration = Duration::from_millis(500);

/// An attribute of `kind`.
pub fn attribute(kind: AttributeType, constraint: AttributeConstraint, text: &str) -> Attribute {
    Attribute {
        attr_type: kind,
        description: Description::plain(text),
        constraint,
        ..Default::default()
    }
}

/// An owned string value.
pub fn owned<'a>(text: &str) -> ValueString<'a> {
    ValueString::Value(Cow::Owned(text.to_string()))
}

/// The string at `pointer` in a management API document (null when absent).
pub fn json_text<'a>(document: &serde_json::Value, pointer: &str) -> ValueString<'a> {
    document
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .map_or(ValueString::Null, owned)
}

/// `GET path`, `None` on 404.
pub async fn get_if_found(
    client: &flotilla_management_client::ManagementClient,
    path: &str,
) -> anyhow::Result<Option<serde_json::Value>> {
    match client.call_json(Method::GET, path, None).await {
        Ok(answer) => Ok(Some(answer)),
        Err(err)
            if err
                .downcast_ref::<flotilla_management_client::ServiceError>()
                .is_some_and(|e| e.status == http::StatusCode::NOT_FOUND) =>
        {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// The value, or — on an error — the error as one diagnostic on the whole resource and `None`.
pub fn reported<T>(diags: &mut Diagnostics, result: anyhow::Result<T>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(err) => {
            diags.root_error_short(format!("{err:#}"));
            None
        }
    }
}

/// Deletes the object at `path` (unless `describe` finds it gone already) and waits until
/// `describe` finds nothing, at most `within`.
pub async fn delete_and_wait<F, Fut>(
    client: &flotilla_management_client::ManagementClient,
    path: &str,
    within: Duration,
    describe: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<serde_json::Value>>>,
{
    if describe().await?.is_none() {
        return Ok(());
    }
    client.call_json(Method::DELETE, path, None).await?;
    let deadline = tokio::time::Instant::now() + within;
    while describe().await?.is_some() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{path} is still there after {within:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Creates an object (`POST path` with `body`) and waits until `wait_active` finds it ready.
/// An error goes to the `name` attribute; when the POST succeeded but the wait failed, the
/// object as `describe` finds it is still returned, so Terraform keeps it as tainted (the next
/// apply replaces it, destroy deletes it) instead of forgetting an object that exists.
pub async fn create_and_wait<W, WF, D, DF>(
    diags: &mut Diagnostics,
    client: &flotilla_management_client::ManagementClient,
    path: &str,
    body: &serde_json::Value,
    wait_active: W,
    describe: D,
) -> Option<serde_json::Value>
where
    W: FnOnce() -> WF,
    WF: Future<Output = anyhow::Result<serde_json::Value>>,
    D: FnOnce() -> DF,
    DF: Future<Output = anyhow::Result<Option<serde_json::Value>>>,
{
    if let Err(err) = client.call_json(Method::POST, path, Some(body)).await {
        diags.error_short(format!("{err:#}"), AttributePath::new("name"));
        return None;
    }
    match wait_active().await {
        Ok(found) => Some(found),
        Err(err) => {
            diags.error_short(format!("{err:#}"), AttributePath::new("name"));
            describe().await.ok().flatten()
        }
    }
}

/// A resource's `timeouts` block (durations as Terraform writes them: `30s`, `10m`, `1h30m`).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeouts<'a> {
    #[serde(borrow = "'a")]
    create: ValueString<'a>,
    update: ValueString<'a>,
    delete: ValueString<'a>,
}

/// Which wait a timeout bounds.
#[derive(Debug, Clone, Copy)]
pub enum Operation {
    /// Create.
    Create,
    /// Update.
    Update,
    /// Delete.
    Delete,
}

impl<'a> Timeouts<'a> {
    fn value(&self, operation: Operation) -> &ValueString<'a> {
        match operation {
            Operation::Create => &self.create,
            Operation::Update => &self.update,
            Operation::Delete => &self.delete,
        }
    }
}

/// A resource's or data source's schema (version 1): `description`, its attributes and its
/// nested blocks by name.
pub fn schema(
    description: &str,
    attributes: std::collections::HashMap<String, Attribute>,
    blocks: Vec<(&str, tf_provider::schema::NestedBlock)>,
) -> tf_provider::schema::Schema {
    tf_provider::schema::Schema {
        version: 1,
        block: Block {
            version: 1,
            description: Description::plain(description),
            attributes,
            blocks: blocks
                .into_iter()
                .map(|(name, block)| (name.to_string(), block))
                .collect(),
            ..Default::default()
        },
    }
}

/// The `timeouts` block of a resource (at most once).
pub fn timeouts_block() -> tf_provider::schema::NestedBlock {
    let attributes = ["create", "update", "delete"]
        .into_iter()
        .map(|name| {
            (
                name.to_string(),
                attribute(
                    AttributeType::String,
                    AttributeConstraint::Optional,
                    &format!("How long {name} may take (e.g. 30m; default 10m)."),
                ),
            )
        })
        .collect();
    tf_provider::schema::NestedBlock::Optional(Block {
        version: 1,
        description: Description::plain("How long each operation may wait."),
        attributes,
        ..Default::default()
    })
}

/// A Go-style duration (`1h30m`, `45s`, `500ms`): what Terraform's `timeouts` take.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    flotilla_api_machinery::goduration::parse(text)
        .ok_or_else(|| format!("{text:?} is not a duration such as 30s, 10m or 1h30m"))
}

/// How long `operation` may wait under `timeouts` ([`WAIT`] unless set).
pub fn timeout(timeouts: &Value<Timeouts<'_>>, operation: Operation) -> Duration {
    timeouts
        .as_ref_option()
        .and_then(|t| t.value(operation).as_deref_option())
        .and_then(|text| parse_duration(text).ok())
        .unwrap_or(WAIT)
}

/// Checks at plan that every timeout given is a duration, on its attribute.
pub fn validate_timeouts(diags: &mut Diagnostics, timeouts: &Value<Timeouts<'_>>) {
    let Some(given) = timeouts.as_ref_option() else {
        return;
    };
    for (name, operation) in [
        ("create", Operation::Create),
        ("update", Operation::Update),
        ("delete", Operation::Delete),
    ] {
        if let Some(text) = given.value(operation).as_deref_option()
            && let Err(problem) = parse_duration(text)
        {
            diags.error_short(problem, AttributePath::new("timeouts").attribute(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_read_as_terraform_writes_them() {
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "10", "ten minutes", "5 m", "3d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
