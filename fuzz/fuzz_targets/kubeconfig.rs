//! Kubeconfigs: those the kubelet and the proxy read at start (`--kubeconfig`, kube-rs's
//! `Kubeconfig::from_yaml`), and those we write for others to read — the exec-plugin
//! kubeconfig of the CLI and the console (`api_machinery::kubeconfig`, written with
//! `serde_yaml`), and the proxy's kubeconfig a booting node writes from its NodeConfig (user
//! data). The first byte picks one: arbitrary bytes as a kubeconfig, where anything that parses
//! must serialize (as YAML, as we write it) to text that parses back to the same value; or
//! arbitrary names, URLs, CA data, commands, arguments and environment, where what we write
//! must read back with exactly those values.
#![no_main]

use std::collections::HashMap;

use flotilla_api_machinery::kubeconfig::exec_kubeconfig;
use flotilla_api_machinery::nodeconfig::NodeConfig;
use flotilla_node_bootstrap::firstboot::{InstanceIdentity, Layout, render};
use kube::config::Kubeconfig;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

/// A parsed kubeconfig as a value to compare (kube-rs's types have no `PartialEq`).
fn value(config: &Kubeconfig) -> serde_json::Value {
    serde_json::to_value(config).expect("a kubeconfig serializes")
}

/// Anything that parses serializes to text that parses back to the same value. As YAML,
/// which is what we write (`serde_yaml`): kube-rs's YAML parser refuses characters JSON
/// leaves unescaped (DEL, the C1 controls), so JSON is not a kubeconfig format for it.
fn round_trip(text: &str) {
    let Ok(config) = Kubeconfig::from_yaml(text) else {
        return;
    };
    let original = value(&config);
    let yaml = serde_yaml::to_string(&config).expect("a kubeconfig serializes as YAML");
    let again = Kubeconfig::from_yaml(&yaml)
        .unwrap_or_else(|err| panic!("our YAML of it does not parse ({err}): {yaml}"));
    assert_eq!(value(&again), original, "through YAML: {yaml}");
}

/// The single entry of a list a kubeconfig we wrote holds.
fn only<T>(list: &[T]) -> &T {
    assert_eq!(list.len(), 1, "one entry");
    &list[0]
}

/// The CLI's and the console's exec-plugin kubeconfig reads back with what it was made of.
fn exec(u: &mut Unstructured<'_>) -> Result<()> {
    let name: String = u.arbitrary()?;
    let server: String = u.arbitrary()?;
    let ca: String = u.arbitrary()?;
    let command: String = u.arbitrary()?;
    let args: Vec<String> = u.arbitrary()?;
    let env: Vec<(String, String)> = u.arbitrary()?;
    let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let written = exec_kubeconfig(
        &name,
        &json!(server),
        &json!(ca),
        &json!(command),
        &args_ref,
        &env_ref,
    );
    let text = serde_yaml::to_string(&written).expect("YAML");
    let config = Kubeconfig::from_yaml(&text)
        .unwrap_or_else(|err| panic!("our kubeconfig does not parse ({err}): {text}"));
    let user = format!("{name}-admin");
    let cluster = only(&config.clusters);
    assert_eq!(cluster.name, name, "{text}");
    let cluster = cluster.cluster.as_ref().expect("a cluster");
    assert_eq!(cluster.server.as_deref(), Some(server.as_str()), "{text}");
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(ca.as_str()),
        "{text}"
    );
    let auth = only(&config.auth_infos);
    assert_eq!(auth.name, user, "{text}");
    let plugin = auth
        .auth_info
        .as_ref()
        .and_then(|a| a.exec.as_ref())
        .expect("an exec plugin");
    assert_eq!(plugin.command.as_deref(), Some(command.as_str()), "{text}");
    assert_eq!(plugin.args.as_deref(), Some(args.as_slice()), "{text}");
    let want_env: Option<Vec<HashMap<String, String>>> = (!env.is_empty()).then(|| {
        env.iter()
            .map(|(k, v)| HashMap::from([("name".into(), k.clone()), ("value".into(), v.clone())]))
            .collect()
    });
    assert_eq!(plugin.env, want_env, "{text}");
    let context = only(&config.contexts);
    assert_eq!(context.name, name, "{text}");
    let context = context.context.as_ref().expect("a context");
    assert_eq!(context.cluster, name, "{text}");
    assert_eq!(context.user.as_deref(), Some(user.as_str()), "{text}");
    assert_eq!(
        config.current_context.as_deref(),
        Some(name.as_str()),
        "{text}"
    );
    Ok(())
}

/// The proxy's kubeconfig a booting node writes names the NodeConfig's cluster, endpoint and
/// CA exactly, whatever a NodeConfig that parses holds.
fn node(u: &mut Unstructured<'_>) -> Result<()> {
    use base64::Engine;
    let name: String = u.arbitrary()?;
    let endpoint: String = u.arbitrary()?;
    let pem = format!("-----BEGIN CERTIFICATE-----\n{}", u.arbitrary::<String>()?);
    let padding: [bool; 2] = u.arbitrary()?;
    let ca = format!(
        "{}{}{}",
        if padding[0] { " " } else { "" },
        base64::engine::general_purpose::STANDARD.encode(pem),
        if padding[1] { "\n" } else { "" },
    );
    let document = json!({
        "apiVersion": "node.flotilla.dev/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {"name": name, "apiServerEndpoint": endpoint, "certificateAuthority": ca},
            "kubelet": {"bootstrapToken": "abcdef.0123456789abcdef"},
        },
    });
    let Ok(config) = NodeConfig::parse(&document.to_string()) else {
        return Ok(());
    };
    let identity = InstanceIdentity {
        instance_id: "i-0123456789abcdef0".into(),
        local_ipv4: [10, 0, 0, 5].into(),
        availability_zone: "eu-west-1a".into(),
        local_hostname: "ip-10-0-0-5".into(),
    };
    let layout = Layout::default();
    let files = render(&config, &identity, &layout).expect("a NodeConfig that parses renders");
    let text = &files
        .iter()
        .find(|file| file.path == layout.proxy_kubeconfig())
        .expect("the proxy's kubeconfig")
        .text;
    let config = Kubeconfig::from_yaml(text)
        .unwrap_or_else(|err| panic!("the proxy's kubeconfig does not parse ({err}): {text}"));
    let cluster = only(&config.clusters);
    assert_eq!(cluster.name, name, "{text}");
    let cluster = cluster.cluster.as_ref().expect("a cluster");
    assert_eq!(cluster.server.as_deref(), Some(endpoint.as_str()), "{text}");
    assert_eq!(
        cluster.certificate_authority_data.as_deref().map(str::trim),
        Some(ca.trim()),
        "{text}"
    );
    let context = only(&config.contexts);
    let current = config
        .current_context
        .as_deref()
        .expect("a current context");
    assert_eq!(context.name, current, "{text}");
    assert_eq!(
        context.context.as_ref().map(|c| c.cluster.as_str()),
        Some(name.as_str()),
        "{text}"
    );
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                round_trip(text);
            }
        }
        1 => {
            let _ = exec(&mut Unstructured::new(rest));
        }
        _ => {
            let _ = node(&mut Unstructured::new(rest));
        }
    }
});
