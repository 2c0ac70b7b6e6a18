//! Kubeconfigs whose user gets its credential from a command (client.authentication.k8s.io/v1
//! exec plugins), as EKS's run `aws eks get-token`: what the CLI and the console hand out.

/// A kubeconfig for cluster `name` at `server` (trusting base64 PEM `ca_data`) whose user runs
/// `command args…` with `env` (name, value) for a token.
pub fn exec_kubeconfig(
    name: &str,
    server: &serde_json::Value,
    ca_data: &serde_json::Value,
    command: &serde_json::Value,
    args: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let user = format!("{name}-admin");
    let mut exec = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": command,
        "args": args,
        "interactiveMode": "Never",
    });
    if !env.is_empty() {
        exec["env"] = env
            .iter()
            .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
            .collect();
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": ca_data,
        }}],
        "users": [{"name": user, "user": {"exec": exec}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_runs_the_command_for_its_token() {
        let config = exec_kubeconfig(
            "prod",
            &"https://h/clusters/p".into(),
            &"Q0E=".into(),
            &"flotilla".into(),
            &["cluster", "token", "prod"],
            &[("FLOTILLA_CONFIG", "/c.json")],
        );
        assert_eq!(config["current-context"], "prod");
        let exec = &config["users"][0]["user"]["exec"];
        assert_eq!(
            exec["args"],
            serde_json::json!(["cluster", "token", "prod"])
        );
        assert_eq!(exec["env"][0]["value"], "/c.json");
        assert_eq!(
            config["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        let bare = exec_kubeconfig("p", &"s".into(), &"c".into(), &"f".into(), &[], &[]);
        assert!(bare["users"][0]["user"]["exec"].get("env").is_none());
    }
}
