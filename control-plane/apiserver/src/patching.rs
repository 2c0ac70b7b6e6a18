//! PATCH bodies: JSON patch, JSON merge patch, strategic merge patch and server-side apply,
//! mapped onto the api-machinery engines, with their errors mapped to API errors.

use serde_json::{Value, json};

use flotilla_api_machinery::patch;

use crate::error::ApiError;
use crate::handler::Call;
use crate::meta;
use crate::negotiate::{self, BodyFormat};
use crate::resources::ResourceInfo;

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
                return Err(ApiError::unsupported_media_type_for_patch(other));
            }
        };
        let format = if patch_type == PatchType::Apply {
            BodyFormat::Yaml
        } else {
            BodyFormat::Json
        };
        let body = negotiate::parse_body(&call.body, format)?;
        let force = matches!(
            call.query.get("force").map(String::as_str),
            Some("true") | Some("1")
        );
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
                    "fieldManager",
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

    /// Applies a non-apply patch to `current`; for apply returns the applied configuration.
    /// The boolean says whether the result is an apply configuration.
    pub fn apply_to(
        &self,
        current: &Value,
        kind: &str,
        _typed: bool,
    ) -> Result<(Value, bool), ApiError> {
        let bad = |e: &dyn std::fmt::Display| ApiError::bad_request(e.to_string());
        match self.patch_type {
            PatchType::Json => patch::apply_json_patch(current, &self.body)
                .map(|v| (v, false))
                .map_err(|e| bad(&e)),
            PatchType::Merge => Ok((patch::apply_merge_patch(current, &self.body), false)),
            PatchType::Strategic => {
                // Upstream answers 415 for kinds without strategic-merge metadata (custom resources).
                let schema =
                    flotilla_api_machinery::schema::PatchMeta::for_kind(kind).ok_or_else(|| {
                        ApiError::unsupported_media_type_for_patch(
                            "application/strategic-merge-patch+json",
                        )
                    })?;
                patch::apply_strategic_merge_patch(current, &self.body, &schema)
                    .map(|v| (v, false))
                    .map_err(|e| bad(&e))
            }
            PatchType::Apply => Ok((self.body.clone(), true)),
        }
    }
}

pub fn server_side_apply(
    _c: &Value,
    _config: Value,
    _m: &str,
    _a: &str,
    _f: bool,
    _r: &ResourceInfo,
) -> Result<Value, ApiError> {
    Err(ApiError::internal("TEMP"))
}
pub fn apply_create(
    _r: &PatchRequest,
    _n: &str,
    _ns: &str,
    _m: &str,
    _res: &ResourceInfo,
) -> Result<Value, ApiError> {
    Err(ApiError::internal("TEMP"))
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
