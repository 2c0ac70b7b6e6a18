//! What the resources share: attribute helpers, the management API's documents as Terraform
//! values, and reads that tell "not found" apart from failures.

use std::borrow::Cow;
use std::time::Duration;

use http::Method;
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
