//! Converting objects between the versions of one kind (upstream's CR converter,
//! `apiextensions-apiserver/pkg/apiserver/conversion`): a custom resource's versions share
//! one storage, each object kept at the version it was written in (the storage version
//! then). Reads convert to the version asked for, writes to the storage version. With
//! conversion `None` only `apiVersion` differs; with `Webhook` the objects in another version
//! are sent to the definition's converter, which may change anything but their identity.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceInfo;

/// How a kind's objects change version.
#[derive(Clone, Default)]
pub enum Conversion {
    /// Only `apiVersion` differs (every built-in kind here has one version).
    #[default]
    None,
    /// The definition's conversion webhook converts.
    Webhook(Arc<dyn Converter>),
}

/// A conversion webhook, as the conversion points see it.
#[async_trait::async_trait]
pub trait Converter: Send + Sync {
    /// `objects` (each needing it) converted to `api_version`, in order; `Err` is the text
    /// after upstream's `conversion webhook for <gvk> failed: `.
    async fn convert(&self, objects: Vec<Value>, api_version: &str) -> Result<Vec<Value>, String>;
}

impl ResourceInfo {
    /// A stored object as this version serves it.
    pub async fn served(&self, obj: Value) -> Result<Value, ApiError> {
        let mut objects = [obj];
        self.convert_all(&mut objects, &self.api_version()).await?;
        let [obj] = objects;
        Ok(obj)
    }

    /// `obj` (in this version) as it is stored: at the definition's storage version.
    pub async fn to_stored<'a>(&self, obj: &'a Value) -> Result<Cow<'a, Value>, ApiError> {
        match &self.storage_version {
            Some(storage) => {
                let mut objects = [obj.clone()];
                self.convert_all(&mut objects, &format!("{}/{storage}", self.group))
                    .await?;
                let [stored] = objects;
                Ok(Cow::Owned(stored))
            }
            None => Ok(Cow::Borrowed(obj)),
        }
    }

    /// Whether converting needs no call out (reads may then convert as they decode).
    pub fn converts_in_place(&self) -> bool {
        matches!(self.conversion, Conversion::None)
    }

    /// Converts each of `objects` not already in `api_version` to it, the webhook's with one
    /// call for all of them (a list's page is one ConversionReview, as upstream's).
    pub async fn convert_all(
        &self,
        objects: &mut [Value],
        api_version: &str,
    ) -> Result<(), ApiError> {
        if !self.is_custom() {
            return Ok(());
        }
        let needing: Vec<usize> = (0..objects.len())
            .filter(|&i| objects[i]["apiVersion"].as_str() != Some(api_version))
            .collect();
        if needing.is_empty() {
            return Ok(());
        }
        match &self.conversion {
            Conversion::None => {
                for &i in &needing {
                    if let Some(map) = objects[i].as_object_mut() {
                        map.insert("apiVersion".into(), Value::String(api_version.to_string()));
                    }
                }
                Ok(())
            }
            Conversion::Webhook(converter) => {
                let first = &objects[needing[0]];
                let gvk = format!(
                    "{}, Kind={}",
                    first["apiVersion"].as_str().unwrap_or(""),
                    first["kind"].as_str().unwrap_or(&self.kind)
                );
                let sent: Vec<Value> = needing.iter().map(|&i| objects[i].clone()).collect();
                let converted = converter.convert(sent, api_version).await.map_err(|err| {
                    ApiError::internal(format!("conversion webhook for {gvk} failed: {err}"))
                })?;
                if converted.len() != needing.len() {
                    return Err(ApiError::internal(format!(
                        "conversion webhook for {gvk} returned {} objects, expected {}",
                        converted.len(),
                        needing.len()
                    )));
                }
                for (index, (&i, mut out)) in needing.iter().zip(converted).enumerate() {
                    let original = &objects[i];
                    checked_conversion(original, &mut out, api_version).map_err(|err| {
                        ApiError::internal(format!(
                            "conversion webhook for {gvk} returned invalid converted object at index {index}: {err}"
                        ))
                    })?;
                    objects[i] = out;
                }
                Ok(())
            }
        }
    }
}

/// Upstream's checks of one converted object (`validateConvertedObject`, then
/// `restoreObjectMeta`): the version asked for, the same kind and identity, and only labels
/// and annotations taken from the converter; all other metadata stays the original's.
fn checked_conversion(original: &Value, out: &mut Value, api_version: &str) -> Result<(), String> {
    let text = |obj: &Value, pointer: &str| {
        obj.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let received = text(out, "/apiVersion");
    if received != api_version {
        return Err(format!(
            "invalid groupVersion (expected {api_version}, received {received})"
        ));
    }
    for (pointer, what) in [
        ("/kind", "kind"),
        ("/metadata/name", "name"),
        ("/metadata/namespace", "namespace"),
        ("/metadata/uid", "UID"),
    ] {
        let (expected, got) = (text(original, pointer), text(out, pointer));
        if expected != got {
            return Err(format!("must have the same {what}: {expected} != {got}"));
        }
    }
    let Some(answered) = out.get("metadata").and_then(Value::as_object).cloned() else {
        return Err("missing metadata in converted object".to_string());
    };
    let mut metadata = original
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for field in ["labels", "annotations"] {
        match answered.get(field) {
            None | Some(Value::Null) => {
                metadata.remove(field);
            }
            Some(Value::Object(map)) => {
                if let Some((key, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "metadata.{field}[{key}] must be a string in converted object"
                    ));
                }
                metadata.insert(field.to_string(), Value::Object(map.clone()));
            }
            Some(_) => return Err(format!("invalid metadata.{field} in converted object")),
        }
    }
    if let Some(map) = out.as_object_mut() {
        map.insert("metadata".into(), Value::Object(metadata));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_converted_object_keeps_its_identity_and_takes_only_labels_and_annotations() {
        let original = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"old": "x"}}, "spec": {"size": 1}});
        let mut out = json!({"apiVersion": "example.com/v2", "kind": "Widget",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "99",
                "labels": {"new": "y"}, "annotations": {"converted": "yes"}},
            "spec": {"dimensions": {"size": 1}}});
        checked_conversion(&original, &mut out, "example.com/v2").expect("valid");
        assert_eq!(out["metadata"]["resourceVersion"], "7");
        assert_eq!(out["metadata"]["labels"], json!({"new": "y"}));
        assert_eq!(out["metadata"]["annotations"], json!({"converted": "yes"}));
        assert_eq!(out["spec"]["dimensions"]["size"], 1);

        let mut renamed = out.clone();
        renamed["metadata"]["name"] = json!("b");
        assert_eq!(
            checked_conversion(&original, &mut renamed, "example.com/v2"),
            Err("must have the same name: a != b".to_string())
        );
        let mut wrong_version = out.clone();
        wrong_version["apiVersion"] = json!("example.com/v1");
        assert_eq!(
            checked_conversion(&original, &mut wrong_version, "example.com/v2"),
            Err(
                "invalid groupVersion (expected example.com/v2, received example.com/v1)"
                    .to_string()
            )
        );
    }
}
