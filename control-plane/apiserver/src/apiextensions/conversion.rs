//! A definition's conversion webhook (`spec.conversion.strategy: Webhook`): objects sent in
//! an `apiextensions.k8s.io` ConversionReview of the first review version both sides speak,
//! over TLS verified against the webhook's `caBundle`, to its URL or Service (upstream
//! `apiextensions-apiserver/pkg/apiserver/conversion/webhook_converter.go`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::conversion::{Conversion, Converter};
use crate::kubelet::KubeletNetworks;
use crate::outbound::{self, Dialer};
use crate::resources::Resources;
use crate::store::{Store, Tenant};

/// How long one conversion call may take (upstream's webhook client default).
const TIMEOUT: Duration = Duration::from_secs(30);

/// The conversion webhook of one definition, in one tenant.
pub struct ConversionWebhook {
    client_config: Value,
    /// `v1` or `v1beta1`: the first of the definition's `conversionReviewVersions` served.
    review_version: &'static str,
    store: Store,
    tenant: Tenant,
    resources: Arc<Resources>,
    networks: KubeletNetworks,
}

/// The conversion of `definition`'s versions in `tenant`.
pub fn of_definition(definition: &Value, server: &crate::ApiServer, tenant: &Tenant) -> Conversion {
    let conversion = &definition["spec"]["conversion"];
    if conversion["strategy"] != json!("Webhook") {
        return Conversion::None;
    }
    let webhook = &conversion["webhook"];
    // Validation admitted only definitions naming v1 or v1beta1 among their review versions.
    let review_version = webhook["conversionReviewVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|v| match v.as_str() {
            Some("v1") => Some("v1"),
            Some("v1beta1") => Some("v1beta1"),
            _ => None,
        })
        .unwrap_or("v1");
    Conversion::Webhook(Arc::new(ConversionWebhook {
        client_config: webhook["clientConfig"].clone(),
        review_version,
        store: server.store.clone(),
        tenant: tenant.clone(),
        resources: server.resources.clone(),
        networks: server.kubelet_networks.clone(),
    }))
}

#[async_trait::async_trait]
impl Converter for ConversionWebhook {
    async fn convert(&self, objects: Vec<Value>, api_version: &str) -> Result<Vec<Value>, String> {
        let dialer = Dialer {
            store: &self.store,
            tenant: &self.tenant,
            resources: &self.resources,
            networks: &self.networks,
        };
        let endpoint = outbound::resolve(&dialer, &self.client_config).await?;
        let uid = uuid::Uuid::new_v4().to_string();
        let review = json!({
            "apiVersion": format!("apiextensions.k8s.io/{}", self.review_version),
            "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": api_version, "objects": objects},
        });
        let url = format!(
            "https://{}{}?timeout={}s",
            endpoint.authority,
            endpoint.path,
            TIMEOUT.as_secs()
        );
        let body = serde_json::to_vec(&review).map_err(|err| err.to_string())?;
        let answer = tokio::time::timeout(TIMEOUT, outbound::post(&endpoint, &url, body))
            .await
            .map_err(|_| format!("Post {url:?}: context deadline exceeded"))?
            .map_err(|err| format!("Post {url:?}: {err}"))?;
        let answer: Value = serde_json::from_slice(&answer).map_err(|err| err.to_string())?;
        converted_objects(&answer, &uid, self.review_version)
    }
}

/// Upstream's `getConvertedObjectsFromResponse`: a v1 answer must be a v1 ConversionReview
/// for this request's uid; either version must report `Success`.
fn converted_objects(
    answer: &Value,
    uid: &str,
    review_version: &str,
) -> Result<Vec<Value>, String> {
    if review_version == "v1" {
        let (api_version, kind) = (
            answer["apiVersion"].as_str().unwrap_or(""),
            answer["kind"].as_str().unwrap_or(""),
        );
        if (api_version, kind) != ("apiextensions.k8s.io/v1", "ConversionReview") {
            return Err(format!(
                "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {api_version}, Kind={kind}"
            ));
        }
    }
    let response = &answer["response"];
    if !response.is_object() {
        return Err("no response provided".to_string());
    }
    if review_version == "v1" {
        let answered = response["uid"].as_str().unwrap_or("");
        if answered != uid {
            return Err(format!("expected response.uid={uid:?}, got {answered:?}"));
        }
    }
    let result = &response["result"];
    let status = result["status"].as_str().unwrap_or("");
    if status != "Success" {
        return Err(match result["message"].as_str() {
            Some(message) if !message.is_empty() => message.to_string(),
            _ => format!("response.result.status was '{status}', not 'Success'"),
        });
    }
    Ok(response["convertedObjects"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_as_upstream_checks_them() {
        let ok = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Success"},
                "convertedObjects": [{"apiVersion": "example.com/v2"}]}});
        assert_eq!(converted_objects(&ok, "u", "v1").map(|o| o.len()), Ok(1));
        assert_eq!(
            converted_objects(&ok, "other", "v1"),
            Err("expected response.uid=\"other\", got \"u\"".to_string())
        );
        let mut failed = ok.clone();
        failed["response"]["result"] = json!({"status": "Failure", "message": "cannot convert"});
        assert_eq!(
            converted_objects(&failed, "u", "v1"),
            Err("cannot convert".to_string())
        );
        // v1beta1 answers were never checked for their kind or uid.
        let beta = json!({"response": {"result": {"status": "Success"}, "convertedObjects": []}});
        assert_eq!(converted_objects(&beta, "u", "v1beta1"), Ok(vec![]));
        assert!(converted_objects(&beta, "u", "v1").is_err());
    }
}
