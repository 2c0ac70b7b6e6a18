//! `flotilla version`: the client's version and, when a service is configured and answers,
//! the server's, as `kubectl version` prints them (text, or `-o json|yaml`).

use http::Method;
use serde_json::{Value, json};

use crate::{Output, VersionArgs};

/// This binary's version and the Kubernetes version it was built against, in the shape the
/// server answers `GET /v1/version` with.
pub fn client_version() -> Value {
    flotilla_management::service_version_document()
}

/// One side's line: `LABEL Version: X (Kubernetes Y)`.
fn line(label: &str, side: &Value) -> String {
    format!(
        "{label} Version: {} (Kubernetes {})\n",
        side["version"].as_str().unwrap_or("unknown"),
        side["kubernetes"]["gitVersion"]
            .as_str()
            .unwrap_or("unknown"),
    )
}

/// The lines `flotilla version` prints as text.
fn text(client: &Value, server: Option<&Value>) -> String {
    let mut lines = line("Client", client);
    if let Some(server) = server {
        lines.push_str(&line("Server", server));
    }
    lines
}

/// The document `-o json|yaml` prints.
fn document(client: &Value, server: Option<&Value>) -> Value {
    let mut document = json!({ "clientVersion": client });
    if let Some(server) = server {
        document["serverVersion"] = server.clone();
    }
    document
}

/// `flotilla version`: prints the client's version, then asks the server. As kubectl does, the
/// client's version is printed even when the server cannot be reached, and that is an error.
pub async fn print(args: &VersionArgs) -> anyhow::Result<()> {
    let client = client_version();
    let server = if args.client_only {
        Ok(None)
    } else {
        server_version(args).await.map(Some)
    };
    let shown = server.as_ref().ok().and_then(Option::as_ref);
    match args.client.output {
        Output::Table => print!("{}", text(&client, shown)),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&document(&client, shown))?
        ),
        Output::Yaml => print!("{}", serde_yaml::to_string(&document(&client, shown))?),
    }
    server.map(|_| ())
}

async fn server_version(args: &VersionArgs) -> anyhow::Result<Value> {
    use anyhow::Context;
    let client = args
        .client
        .client()
        .context("the server's version (--client prints the client's alone)")?;
    client.call_json(Method::GET, "/v1/version", None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_documents_name_both_sides() {
        let client = client_version();
        let server = json!({"version": "9.9.9", "kubernetes": {"gitVersion": "v1.33.0-flotilla"}});
        let printed = text(&client, Some(&server));
        let lines: Vec<&str> = printed.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with(&format!(
            "Client Version: {} (Kubernetes v1.",
            env!("CARGO_PKG_VERSION")
        )));
        assert_eq!(
            lines[1],
            "Server Version: 9.9.9 (Kubernetes v1.33.0-flotilla)"
        );
        assert_eq!(text(&client, None).lines().count(), 1);
        let both = document(&client, Some(&server));
        assert_eq!(both["serverVersion"]["version"], "9.9.9");
        assert_eq!(both["clientVersion"], client);
        assert!(document(&client, None).get("serverVersion").is_none());
    }
}
