//! Encryption at rest on `flotilla serve` with real etcd, checked by reading etcd directly
//! with `etcdctl`: Secrets stored as upstream's `k8s:enc:aescbc:v1:key1:…` and ConfigMaps
//! (not configured) as they are; each tenant's keys its own (a Secret's stored bytes copied
//! into another tenant do not open there); key rotation by a new first provider, a restart
//! and `kubectl get secrets -o json | kubectl replace -f -`; a bad configuration refused
//! with one line naming the field.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, ensure};
use base64::Engine;
use flotilla_e2e::{Etcd, Serve, flotilla_bin};

use crate::tenancy::create_cluster;

const PASSWORD: &str = "hunter2-at-rest";

fn key(secret: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(secret)
}

fn configuration(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{providers}"
    )
}

/// `etcdctl` against `endpoint`: its stdout, failing with its stderr.
fn etcdctl(endpoint: &str, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("etcdctl")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .context("running etcdctl (tests/run installs etcd-client)")?;
    ensure!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// The bytes etcd holds for `key` (etcdctl prints the value and a newline).
fn stored(endpoint: &str, key: &str) -> anyhow::Result<Vec<u8>> {
    let mut value = etcdctl(endpoint, &["get", key, "--print-value-only"])?;
    ensure!(!value.is_empty(), "{key} is not in etcd");
    value.pop();
    Ok(value)
}

/// Secret `name`'s `password`, base64-encoded, as the API reads it back.
fn password(kubectl: &flotilla_e2e::Kubectl, name: &str) -> anyhow::Result<String> {
    kubectl.ok(&["get", "secret", name, "-o", "jsonpath={.data.password}"])
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[test]
fn secrets_are_encrypted_at_rest_with_keys_of_each_tenant() -> anyhow::Result<()> {
    let started = Instant::now();
    let etcd = Etcd::start()?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("encryption.yaml");
    let key1 = key(&[0x11; 32]);
    let key2 = key(&[0x22; 32]);
    std::fs::write(
        &config,
        configuration(&format!(
            "  - aescbc: {{keys: [{{name: key1, secret: {key1}}}]}}\n  - identity: {{}}\n"
        )),
    )?;
    let config_arg = config.to_str().context("path")?.to_string();

    // A bad file: the service does not start, and says which field in one line.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        configuration("  - secretbox: {keys: [{name: k, secret: c2hvcnQ=}]}\n"),
    )?;
    let refused = Command::new(flotilla_bin()?)
        .current_dir(dir.path())
        .args(["serve", "--etcd", &etcd.endpoint, "--listen", "127.0.0.1:0"])
        .arg("--encryption-provider-config")
        .arg(&bad)
        .stdout(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !dir.path().join("flotilla-key-encryption-key").exists(),
        "a refused start wrote a key-encryption key"
    );
    let last = stderr.lines().last().unwrap_or_default();
    ensure!(
        refused.status.code() == Some(1)
            && last.contains("resources[0].providers[0].secretbox.keys[0].secret")
            && last.contains("expected one of [32]"),
        "a bad configuration: exit {:?}, {stderr}",
        refused.status.code()
    );

    let mut service = Serve::start_with(
        &etcd.endpoint,
        &["--encryption-provider-config", &config_arg],
    )?;
    let account = service.account("x")?;
    let a = create_cluster(&service, &account, "a")?;
    let b = create_cluster(&service, &account, "b")?;
    for cluster in [&a, &b] {
        cluster.kubectl.ok(&[
            "create",
            "secret",
            "generic",
            "db",
            &format!("--from-literal=password={PASSWORD}"),
        ])?;
        cluster.kubectl.ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=mode=visible-at-rest",
        ])?;
    }

    // In etcd: the Secret under upstream's prefix, its password nowhere in clear or base64;
    // the ConfigMap as it is.
    let secret_key = |id: &str, name: &str| format!("/registry/{id}/core/secrets/default/{name}");
    let raw_a = stored(&etcd.endpoint, &secret_key(&a.id, "db"))?;
    let encoded = key(PASSWORD.as_bytes());
    ensure!(
        raw_a.starts_with(b"k8s:enc:aescbc:v1:key1:")
            && !contains(&raw_a, PASSWORD)
            && !contains(&raw_a, &encoded),
        "the Secret in etcd: {}",
        String::from_utf8_lossy(&raw_a)
    );
    let raw_map = stored(
        &etcd.endpoint,
        &format!("/registry/{}/core/configmaps/default/settings", a.id),
    )?;
    ensure!(
        contains(&raw_map, "visible-at-rest"),
        "the ConfigMap is not stored as it is"
    );
    // Through the API, the Secret reads back.
    for cluster in [&a, &b] {
        let read =
            cluster
                .kubectl
                .ok(&["get", "secret", "db", "-o", "jsonpath={.data.password}"])?;
        ensure!(read == encoded, "the Secret read back as {read:?}");
    }

    // Tenant A's stored bytes, copied into tenant B, do not open there (B's key is not A's),
    // while a copy within A does.
    // Raw bytes go through etcdctl's stdin (an argument could not carry them).
    let put = |key: &str, value: &[u8]| -> anyhow::Result<()> {
        use std::io::Write;
        let mut child = Command::new("etcdctl")
            .args(["--endpoints", &etcd.endpoint, "put", key])
            .env("ETCDCTL_API", "3")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(value)?;
        ensure!(child.wait()?.success(), "etcdctl put {key}");
        Ok(())
    };
    put(&secret_key(&b.id, "stolen"), &raw_a)?;
    put(&secret_key(&a.id, "copied"), &raw_a)?;
    ensure!(
        stored(&etcd.endpoint, &secret_key(&b.id, "stolen"))? == raw_a,
        "the copy is not byte for byte"
    );
    let refused = b.kubectl.fails(&["get", "secret", "stolen"])?;
    ensure!(
        refused.contains("InternalError") || refused.contains("cannot decrypt"),
        "tenant B opened tenant A's Secret: {refused}"
    );
    let copied = a
        .kubectl
        .ok(&["get", "secret", "copied", "-o", "jsonpath={.data.password}"]);
    ensure!(
        copied.as_deref().ok() == Some(encoded.as_str()),
        "a copy within tenant A does not open: {copied:?}"
    );
    // The copies hold `db`'s own metadata: they go before the Secrets are rewritten.
    etcdctl(&etcd.endpoint, &["del", &secret_key(&b.id, "stolen")])?;
    etcdctl(&etcd.endpoint, &["del", &secret_key(&a.id, "copied")])?;

    // Rotation: a new first provider, a restart, and every Secret rewritten.
    let mut reconfigure = |providers: String, what: &str| -> anyhow::Result<()> {
        std::fs::write(&config, configuration(&providers))?;
        service.restart()?;
        let read = password(&a.kubectl, "db")?;
        ensure!(read == encoded, "{what}: the Secret reads as {read:?}");
        Ok(())
    };
    reconfigure(
        format!(
            "  - aesgcm: {{keys: [{{name: key2, secret: {key2}}}]}}\n  - aescbc: {{keys: [{{name: key1, secret: {key1}}}]}}\n  - identity: {{}}\n"
        ),
        "with a new first key",
    )?;
    let all = a.kubectl.ok(&["get", "secrets", "-A", "-o", "json"])?;
    a.kubectl.ok_stdin(&["replace", "-f", "-"], &all)?;
    let rewritten = stored(&etcd.endpoint, &secret_key(&a.id, "db"))?;
    ensure!(
        rewritten.starts_with(b"k8s:enc:aesgcm:v1:key2:"),
        "after the rewrite: {}",
        String::from_utf8_lossy(&rewritten[..40.min(rewritten.len())])
    );
    // The old key can now go: A's Secrets still read.
    reconfigure(
        format!("  - aesgcm: {{keys: [{{name: key2, secret: {key2}}}]}}\n  - identity: {{}}\n"),
        "after removing the old key",
    )?;
    println!("encryption e2e: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The embedded store too: `flotilla up` with the same file, and the store file itself
/// (read once the service has stopped) holds the Secret only encrypted.
#[test]
fn the_embedded_store_holds_secrets_encrypted() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("encryption.yaml");
    std::fs::write(
        &config,
        configuration(&format!(
            "  - secretbox: {{keys: [{{name: box1, secret: {}}}]}}\n  - identity: {{}}\n",
            key(&[0x33; 32])
        )),
    )?;
    let mut f = flotilla_e2e::Flotilla::up_with(
        flotilla_e2e::Backend::Embedded,
        &[
            "--encryption-provider-config",
            config.to_str().context("path")?,
        ],
    )?;
    f.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        &format!("--from-literal=password={PASSWORD}"),
    ])?;
    let read = f.ok(&["get", "secret", "db", "-o", "jsonpath={.data.password}"])?;
    ensure!(read == key(PASSWORD.as_bytes()), "read back as {read:?}");
    f.stop(false, std::time::Duration::from_secs(15));
    let store = std::fs::read(f.data_dir().join("store.redb"))?;
    ensure!(
        contains(&store, "k8s:enc:secretbox:v1:box1:")
            && !contains(&store, PASSWORD)
            && !contains(&store, &key(PASSWORD.as_bytes())),
        "the store file holds the Secret in clear"
    );
    Ok(())
}
