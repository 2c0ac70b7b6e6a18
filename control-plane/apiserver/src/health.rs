//! `/livez`, `/readyz` and `/healthz` as upstream answers them: `ok` (or the failures); with
//! `?verbose` each check on its own line (`[+]ping ok`, … `livez check passed`); a single
//! check at `/readyz/{name}`; checks left out with `?exclude=NAME`.

use std::collections::HashMap;

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::ApiServer;

/// The checks every server runs, in upstream's order.
const CHECKS: [&str; 3] = ["ping", "log", "etcd"];
/// Upstream's check of the KMS v2 plugins, when encryption at rest has any.
const KMS_PROVIDERS: &str = "kms-providers";

/// The checks `server` runs, in upstream's order.
fn checks(server: &ApiServer) -> Vec<&'static str> {
    let mut checks = CHECKS.to_vec();
    if !server.kms_providers.is_empty() {
        checks.push(KMS_PROVIDERS);
    }
    checks
}

/// Whether check `name` passes now; the reason when it does not.
async fn run(server: &ApiServer, name: &str) -> Result<(), String> {
    match name {
        // The process answers and can write its log.
        "ping" | "log" => Ok(()),
        // The store answers a read (the embedded store or etcd alike).
        "etcd" => server
            .store()
            .storage()
            .current_revision()
            .await
            .map(|_| ())
            .map_err(|err| err.to_string()),
        // Each plugin's `Status` answers healthy, in its API version, with a key id.
        KMS_PROVIDERS => {
            for provider in &server.kms_providers {
                provider.check().await?;
            }
            Ok(())
        }
        _ => Err(format!("no check named {name:?}")),
    }
}

/// The answer of endpoint `endpoint` (`livez`, `readyz` or `healthz`), for one `check` or all.
pub async fn answer(
    server: &ApiServer,
    endpoint: &str,
    check: Option<&str>,
    query: &HashMap<String, String>,
) -> Response {
    if let Some(name) = check {
        if !checks(server).contains(&name) {
            return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
        }
        return match run(server, name).await {
            Ok(()) => (StatusCode::OK, "ok").into_response(),
            Err(reason) => {
                tracing::warn!(check = name, %reason, "a health check failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("internal server error: {name} check failed\n"),
                )
                    .into_response()
            }
        };
    }
    let excluded: Vec<&str> = query
        .iter()
        .filter(|(key, _)| *key == "exclude")
        .flat_map(|(_, value)| value.split(','))
        .collect();
    let mut lines = Vec::new();
    let mut failed = false;
    for name in checks(server) {
        if excluded.contains(&name) {
            lines.push(format!("[+]{name} excluded: ok"));
            continue;
        }
        match run(server, name).await {
            Ok(()) => lines.push(format!("[+]{name} ok")),
            Err(reason) => {
                failed = true;
                tracing::warn!(check = name, %reason, "a health check failed");
                // Upstream withholds the reason from the caller; it is in the server's log.
                lines.push(format!("[-]{name} failed: reason withheld"));
            }
        }
    }
    let verbose = query.contains_key("verbose");
    if failed {
        tracing::warn!(endpoint, "a health check failed");
        lines.push(format!("{endpoint} check failed"));
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", lines.join("\n")),
        )
            .into_response();
    }
    if verbose {
        lines.push(format!("{endpoint} check passed"));
        return (StatusCode::OK, format!("{}\n", lines.join("\n"))).into_response();
    }
    (StatusCode::OK, "ok").into_response()
}
