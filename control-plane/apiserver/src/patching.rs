//! PATCH bodies: JSON patch, JSON merge patch, strategic merge patch and server-side apply,
//! mapped onto the api-machinery engines, with their errors mapped to API errors.

use serde_json::{Value, json};

use flotilla_api_machinery::managed_fields;
use flotilla_api_machinery::patch;
use flotilla_api_machinery::schema::PatchMeta;

use crate::error::{ApiError, Path};
use crate::handler::Call;
use crate::meta;
use crate::negotiate::BodyFormat;
use crate::resources::ResourceInfo;
use crate::store::UpdateTarget;

/// The patch type named by the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml`: server-side apply.
    Apply,
}

/// A decoded PATCH request.
pub struct PatchRequest {
    /// Which engine applies it.
    pub patch_type: PatchType,
    /// The patch document.
    pub body: Value,
    /// `force=true` (apply only).
    pub force: bool,
}

impl PatchRequest {
    /// Reads the patch type, body and apply options of a request.
    pub fn parse(call: &Call) -> Result<Self, ApiError> {
        let content_type = call
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mime = content_type.split(';').next().unwrap_or("").trim();
        let patch_type = match mime {
            "application/json-patch+json" => PatchType::Json,
            "application/merge-patch+json" => PatchType::Merge,
            "application/strategic-merge-patch+json" => PatchType::Strategic,
            "application/apply-patch+yaml" => PatchType::Apply,
            other => {
                return Err(ApiError::unsupported_media_type_for_patch(other, true));
            }
        };
        let format = if patch_type == PatchType::Apply {
            BodyFormat::Yaml
        } else {
            BodyFormat::Json
        };
        let body = call.body_in(format)?;
        let force =
            flotilla_api_machinery::query::query_bool(call.query.get("force").map(String::as_str));
        if force && patch_type != PatchType::Apply {
            return Err(ApiError::bad_request(
                "force: Forbidden: may not be specified for non-apply patch",
            ));
        }
        if patch_type == PatchType::Apply
            && call.query.get("fieldManager").is_none_or(|m| m.is_empty())
        {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                vec![crate::error::FieldError::required(
                    &Path::new("fieldManager"),
                    "is required for apply patch",
                )],
            ));
        }
        Ok(PatchRequest {
            patch_type,
            body,
            force,
        })
    }

    /// Whether this is a server-side apply.
    pub fn is_apply(&self) -> bool {
        self.patch_type == PatchType::Apply
    }

    /// Applies a JSON, merge or strategic patch to `current`, whose kind has `meta` (a
    /// strategic patch of a kind without any is upstream's 415). An apply configuration is
    /// merged by [`server_side_apply`] instead; here it is returned as it is.
    pub fn apply_to(&self, current: &Value, meta: Option<PatchMeta>) -> Result<Value, ApiError> {
        let bad = |e: &dyn std::fmt::Display| ApiError::bad_request(e.to_string());
        match self.patch_type {
            PatchType::Json => patch::apply_json_patch(current, &self.body).map_err(|e| match e {
                patch::PatchError::InvalidJsonPatch(_) => bad(&e),
                patch::PatchError::TooManyOperations { .. } => ApiError::entity_too_large(e),
                _ => ApiError::patch_rejected(e),
            }),
            PatchType::Merge => Ok(patch::apply_merge_patch(current, &self.body)),
            PatchType::Strategic => {
                let schema = meta.ok_or_else(|| {
                    ApiError::unsupported_media_type_for_patch(
                        "application/strategic-merge-patch+json",
                        false,
                    )
                })?;
                patch::apply_strategic_merge_patch(current, &self.body, &schema)
                    .map_err(|e| bad(&e))
            }
            PatchType::Apply => Ok(self.body.clone()),
        }
    }
}

/// The ownership options of an apply. Through the main resource, status is not tracked when
/// the kind has a status subresource; through `/status`, only status is, and the entry is
/// recorded for the subresource (upstream's per-endpoint field resets).
fn apply_options(
    manager: &str,
    force: bool,
    resource: &ResourceInfo,
    target: UpdateTarget,
    top_level_fields: &[&Value],
) -> managed_fields::ApplyOptions {
    let mut ignored = managed_fields::FieldSet::new();
    let field = |name: &str| [managed_fields::PathElement::Field(name.to_string())];
    match target {
        // A resize keeps only what it may change (see the store); it owns like the object.
        UpdateTarget::Main | UpdateTarget::Resize if resource.status_subresource => {
            ignored.insert(&field("status"))
        }
        UpdateTarget::Main | UpdateTarget::Resize => {}
        UpdateTarget::Status | UpdateTarget::Approval | UpdateTarget::EphemeralContainers => {
            let names = top_level_fields
                .iter()
                .filter_map(|v| v.as_object())
                .flat_map(|m| m.keys());
            for name in names.filter(|n| !matches!(n.as_str(), "status" | "apiVersion" | "kind")) {
                ignored.insert(&field(name));
            }
        }
    }
    managed_fields::ApplyOptions {
        manager: manager.to_string(),
        api_version: resource.api_version(),
        force,
        now: meta::now_rfc3339(),
        schema: resource.patch_meta().unwrap_or_default(),
        ignored,
        subresource: target.subresource().unwrap_or("").into(),
    }
}

fn apply_error(err: managed_fields::ManagedFieldsError) -> ApiError {
    ApiError::bad_request(err.to_string())
}

/// Server-side apply onto an existing object: merge, take ownership, or report conflicts (409).
pub fn server_side_apply(
    current: &Value,
    request: &PatchRequest,
    manager: &str,
    resource: &ResourceInfo,
    target: UpdateTarget,
) -> Result<Value, ApiError> {
    let config = &request.body;
    check_apply_identity(config, current, resource)?;
    let managed = managed_fields::decode_managed_fields(current).map_err(apply_error)?;
    let options = apply_options(manager, request.force, resource, target, &[current, config]);
    match managed_fields::apply(current, config, &managed, &options).map_err(apply_error)? {
        managed_fields::ApplyOutcome::Applied { object, .. } => Ok(object),
        managed_fields::ApplyOutcome::Conflicts(conflicts) => {
            let causes = conflicts
                .iter()
                .map(
                    |c| k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                        reason: Some("FieldManagerConflict".into()),
                        message: Some(c.cause_message()),
                        field: Some(c.path.to_string()),
                    },
                )
                .collect();
            Err(ApiError::apply_conflict(
                causes,
                managed_fields::conflict_message(&conflicts),
            ))
        }
    }
}

/// Server-side apply of an object that does not exist yet: a create owned by the manager.
pub fn apply_create(
    request: &PatchRequest,
    name: &str,
    namespace: &str,
    manager: &str,
    resource: &ResourceInfo,
) -> Result<Value, ApiError> {
    let identity = json!({"metadata": {"name": name, "namespace": namespace}});
    check_apply_identity(&request.body, &identity, resource)?;
    let options = apply_options(
        manager,
        true,
        resource,
        UpdateTarget::Main,
        &[&request.body],
    );
    let outcome =
        managed_fields::apply(&json!({}), &request.body, &[], &options).map_err(apply_error)?;
    let mut obj = match outcome {
        managed_fields::ApplyOutcome::Applied { object, .. } => object,
        managed_fields::ApplyOutcome::Conflicts(_) => request.body.clone(),
    };
    meta::set_at(&mut obj, &["metadata", "name"], json!(name));
    Ok(obj)
}

fn check_apply_identity(
    config: &Value,
    current: &Value,
    resource: &ResourceInfo,
) -> Result<(), ApiError> {
    if config
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
        || config
            .get("kind")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return Err(ApiError::bad_request(format!(
            "invalid object type: /, Kind= (apply configurations must set apiVersion and kind; expected {} {})",
            resource.api_version(),
            resource.kind
        )));
    }
    let name = meta::name(config);
    if !name.is_empty() && name != meta::name(current) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            meta::name(current)
        )));
    }
    Ok(())
}
