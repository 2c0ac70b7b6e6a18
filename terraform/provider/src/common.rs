//! What the resources share: attribute helpers, the management API's documents as Terraform
//! values, and reads that tell "not found" apart from failures.

use std::borrow::Cow;
use std::time::Duration;

use std::future::Future;

use http::Method;
use tf_provider::Diagnostics;
use tf_provider::schema::{Attribute, AttributeConstraint, AttributeType, Description};
use tf_provider::value::ValueString;

/// How long a create waits for ACTIVE and a delete for the object to go.
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
/// `describe` finds nothing, at most [`WAIT`].
pub async fn delete_and_wait<F, Fut>(
    client: &flotilla_management_client::ManagementClient,
    path: &str,
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
    let deadline = tokio::time::Instant::now() + WAIT;
    while describe().await?.is_some() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{path} is still there after {WAIT:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}
