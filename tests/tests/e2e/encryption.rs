//! Encryption at rest on `flotilla serve` with real etcd, checked by reading etcd directly
//! with `etcdctl`: Secrets stored as upstream's `k8s:enc:aescbc:v1:key1:…` and ConfigMaps
//! (not configured) as they are; each tenant's keys its own (a Secret's stored bytes copied
//! into another tenant do not open there); key rotation by a new first provider, a restart
//! and `kubectl get secrets -o json | kubectl replace -f -`; a bad configuration refused
//! with one line naming the field. The `kms` v2 provider against LocalStack's KMS through
//! `flotilla-kms-plugin`: upstream's envelope in etcd, a seed of each tenant's own, reads
//! after a restart through the plugin, the plugin away (and `/readyz`'s `kms-providers`
//! check failing), and the KMS key rotated.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, ensure};
use base64::Engine;
use flotilla_e2e::{Etcd, Serve, flotilla_bin};

use crate::tenancy::{Cluster, create_cluster};

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

/// `serve` on `etcd` with the encryption configuration at `config`, and two clusters of one
/// account on it.
fn two_tenants(etcd: &str, config: &str) -> anyhow::Result<(Serve, Cluster, Cluster)> {
    let service = Serve::start_with(etcd, &["--encryption-provider-config", config])?;
    let account = service.account("x")?;
    let a = create_cluster(&service, &account, "a")?;
    let b = create_cluster(&service, &account, "b")?;
    Ok((service, a, b))
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

    let (mut service, a, b) = two_tenants(&etcd.endpoint, &config_arg)?;
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

/// `flotilla-kms-plugin` serving `socket`, encrypting with LocalStack's KMS key `key_id`;
/// killed when dropped.
struct KmsPlugin(std::process::Child);

impl KmsPlugin {
    fn start(
        localstack: &flotilla_e2e::LocalStack,
        socket: &std::path::Path,
        key_id: &str,
    ) -> anyhow::Result<KmsPlugin> {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(flotilla_e2e::nodes::node_bin("flotilla-kms-plugin")?)
            .arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .args(["--key-id", key_id, "--endpoint-url", &localstack.endpoint])
            .args(["--region", "us-east-1"])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .stdout(Stdio::null())
            .spawn()
            .context("starting flotilla-kms-plugin")?;
        let plugin = KmsPlugin(child);
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while !socket.exists() {
            ensure!(
                Instant::now() < deadline,
                "flotilla-kms-plugin did not listen on {} within 20 s",
                socket.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(plugin)
    }
}

impl Drop for KmsPlugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The length-delimited field `number` of a protobuf message (the first occurrence).
fn protobuf_field(mut message: &[u8], number: u64) -> Option<&[u8]> {
    fn varint(bytes: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = bytes.split_first()?;
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    while !message.is_empty() {
        let tag = varint(&mut message)?;
        match tag & 7 {
            0 => {
                varint(&mut message)?;
            }
            2 => {
                let len = usize::try_from(varint(&mut message)?).ok()?;
                let (field, rest) = message.split_at_checked(len)?;
                if tag >> 3 == number {
                    return Some(field);
                }
                message = rest;
            }
            _ => return None,
        }
    }
    None
}

#[test]
fn kms_v2_wraps_each_tenants_seed_with_localstacks_kms() -> anyhow::Result<()> {
    const PREFIX: &[u8] = b"k8s:enc:kms:v2:aws:";
    let started = Instant::now();
    let localstack = flotilla_e2e::LocalStack::start()?;
    let create_key = |what: &str| -> anyhow::Result<(String, String)> {
        let key = localstack.call(
            "kms",
            "create_key",
            serde_json::json!({"Description": format!("flotilla e2e {what}")}),
        )?;
        let field = |name: &str| {
            key["KeyMetadata"][name]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("create_key answered no {name}: {key}"))
        };
        Ok((field("KeyId")?, field("Arn")?))
    };
    let (key1, key1_arn) = create_key("key 1")?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("kms.sock");
    let plugin = KmsPlugin::start(&localstack, &socket, &key1)?;

    let etcd = Etcd::start()?;
    let config = dir.path().join("encryption.yaml");
    std::fs::write(
        &config,
        configuration(&format!(
            "  - kms: {{apiVersion: v2, name: aws, endpoint: 'unix://{}', timeout: 5s}}\n  - identity: {{}}\n",
            socket.display()
        )),
    )?;
    let config_arg = config.to_str().context("path")?.to_string();
    let (mut service, a, b) = two_tenants(&etcd.endpoint, &config_arg)?;
    let secret = |cluster: &Cluster, name: &str| {
        cluster.kubectl.ok(&[
            "create",
            "secret",
            "generic",
            name,
            &format!("--from-literal=password={PASSWORD}"),
        ])
    };
    secret(&a, "db")?;
    secret(&a, "db2")?;
    secret(&b, "db")?;

    // In etcd: upstream's envelope, the password nowhere, KMS's key named; each tenant's seed
    // its own (two Secrets of one tenant share it).
    let secret_key = |id: &str, name: &str| format!("/registry/{id}/core/secrets/default/{name}");
    let encoded = key(PASSWORD.as_bytes());
    let envelope = |id: &str, name: &str| -> anyhow::Result<Vec<u8>> {
        let raw = stored(&etcd.endpoint, &secret_key(id, name))?;
        ensure!(
            raw.starts_with(PREFIX) && !contains(&raw, PASSWORD) && !contains(&raw, &encoded),
            "the Secret in etcd: {}",
            String::from_utf8_lossy(&raw)
        );
        Ok(raw[PREFIX.len()..].to_vec())
    };
    let (a_db, a_db2, b_db) = (
        envelope(&a.id, "db")?,
        envelope(&a.id, "db2")?,
        envelope(&b.id, "db")?,
    );
    let key_id = |object: &[u8]| protobuf_field(object, 2).map(<[u8]>::to_vec);
    ensure!(
        key_id(&a_db).as_deref() == Some(key1_arn.as_bytes()),
        "the envelope names key {:?}, not {key1_arn}",
        key_id(&a_db).map(|k| String::from_utf8_lossy(&k).to_string())
    );
    let seed = |object: &[u8]| protobuf_field(object, 3).map(<[u8]>::to_vec);
    ensure!(
        seed(&a_db).is_some() && seed(&a_db) == seed(&a_db2),
        "one tenant's Secrets are under different seeds"
    );
    ensure!(
        seed(&a_db) != seed(&b_db),
        "tenants a and b share a data-encryption seed"
    );

    // Upstream's `kms-providers` check is among each cluster's health checks.
    let ready = a.kubectl.ok(&["get", "--raw", "/readyz?verbose"])?;
    ensure!(ready.contains("[+]kms-providers ok"), "/readyz: {ready}");

    // A new process knows no seed: it asks the plugin to decrypt them.
    service.restart()?;
    for cluster in [&a, &b] {
        let read = password(&cluster.kubectl, "db")?;
        ensure!(
            read == encoded,
            "after a restart, the Secret reads as {read:?}"
        );
    }

    // The plugin away: a process that never opened the seed cannot read, and a Secret cannot
    // be written, each with a reason; what is not encrypted is unaffected.
    drop(plugin);
    service.restart()?;
    let unread = a.kubectl.fails(&["get", "secret", "db"])?;
    ensure!(
        unread.contains("failed to decrypt DEK"),
        "a read without the plugin: {unread}"
    );
    let unwritten = a
        .kubectl
        .fails(&["create", "secret", "generic", "x", "--from-literal=a=b"])?;
    ensure!(
        unwritten.contains("storage backend unavailable") && unwritten.contains("KMS plugin"),
        "a write without the plugin: {unwritten}"
    );
    a.kubectl
        .ok(&["create", "configmap", "unencrypted", "--from-literal=a=b"])?;
    let unready = a.kubectl.fails(&["get", "--raw", "/readyz?verbose"])?;
    ensure!(
        unready.contains("[-]kms-providers failed"),
        "/readyz without the plugin: {unready}"
    );

    // Rotation: the plugin now encrypts with a new KMS key; old values still read (KMS knows
    // their key), and rewriting every Secret puts them under the new one.
    let (key2, key2_arn) = create_key("key 2")?;
    let _plugin = KmsPlugin::start(&localstack, &socket, &key2)?;
    service.restart()?;
    ensure!(password(&a.kubectl, "db")? == encoded, "after rotation");
    let all = a.kubectl.ok(&["get", "secrets", "-o", "json"])?;
    a.kubectl.ok_stdin(&["replace", "-f", "-"], &all)?;
    let rewritten = envelope(&a.id, "db")?;
    ensure!(
        key_id(&rewritten).as_deref() == Some(key2_arn.as_bytes()),
        "after the rewrite the envelope names {:?}, not {key2_arn}",
        key_id(&rewritten).map(|k| String::from_utf8_lossy(&k).to_string())
    );
    ensure!(password(&a.kubectl, "db")? == encoded, "after the rewrite");
    println!("kms e2e: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
