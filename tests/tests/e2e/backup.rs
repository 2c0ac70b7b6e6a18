//! Per-cluster backup and restore end to end: `flotilla cluster backup` taken while
//! ConfigMaps are being written holds exactly the writes at or below its revision; `flotilla
//! cluster restore` makes a copy under a new name (its own id and credentials, the original's
//! refused) and brings the cluster back under its own name on another backend (embedded →
//! etcd, etcd → embedded, differing encryption-at-rest configurations) where the original
//! client certificate works again; a truncated, flipped-byte, other-version, foreign-key or
//! taken-name restore is refused with one line and changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Etcd, Flotilla, FlotillaCli, Kubectl, until};
use serde_json::{Value, json};

use crate::contains;

/// ConfigMaps in the cluster before the backup.
const SEEDED: usize = 1000;
/// ConfigMaps written by one `kubectl create -f -` while the backup is taken.
const STREAMED: usize = 600;
const PASSWORD: &str = "correct-horse-battery-staple";

/// The account's client commands of a `flotilla up`.
fn cli(f: &Flotilla) -> FlotillaCli {
    FlotillaCli {
        config: f.data_dir().join("flotilla.json"),
    }
}

/// A fresh admin kubeconfig of cluster `name`, written in `dir`.
fn kubeconfig(cli: &FlotillaCli, dir: &Path, name: &str) -> anyhow::Result<Kubectl> {
    let path = dir.join(format!("{name}-{}.kubeconfig", rand_suffix()));
    cli.ok(&[
        "cluster",
        "kubeconfig",
        name,
        "--file",
        path.to_str().context("path")?,
    ])?;
    Ok(Kubectl::new(&path))
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// `server`'s kubeconfig with the user (client certificate and key) of `user`'s.
fn with_user_of(server: &Kubectl, user: &Kubectl, path: PathBuf) -> anyhow::Result<Kubectl> {
    let read = |k: &Kubectl| -> anyhow::Result<Value> {
        Ok(serde_yaml::from_str(&std::fs::read_to_string(
            &k.kubeconfig,
        )?)?)
    };
    let mut config = read(server)?;
    config["users"][0]["user"] = read(user)?["users"][0]["user"].clone();
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(Kubectl::new(&path))
}

/// A `v1` List of ConfigMaps `{prefix}-0…` with a label `set={prefix}`.
fn config_maps(prefix: &str, count: usize) -> String {
    let items: Vec<Value> = (0..count)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("{prefix}-{i}"), "labels": {"set": prefix}},
                "data": {"index": i.to_string(), "payload": "x".repeat(200)}})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// Every ConfigMap of the default namespace: name → resourceVersion.
fn config_map_versions(kubectl: &Kubectl) -> anyhow::Result<BTreeMap<String, i64>> {
    let listing = kubectl.ok(&[
        "get",
        "cm",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.resourceVersion}{\"\\n\"}{end}",
    ])?;
    listing
        .lines()
        .map(|line| {
            let (name, version) = line.split_once(' ').context("name and version")?;
            Ok((name.to_string(), version.trim().parse()?))
        })
        .collect()
}

/// The header line of a backup file.
fn header(file: &Path) -> anyhow::Result<Value> {
    let bytes = std::fs::read(file)?;
    let end = bytes
        .iter()
        .position(|b| *b == b'\n')
        .context("a header line")?;
    Ok(serde_json::from_slice(&bytes[..end])?)
}

/// `flotilla ARGS` fails with one line on standard error naming `expected`.
fn refused(cli: &FlotillaCli, args: &[&str], expected: &str) -> anyhow::Result<()> {
    let stderr = cli.fails(args)?;
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    ensure!(
        lines.len() == 1 && lines[0].starts_with("error: ") && lines[0].contains(expected),
        "flotilla {args:?}: expected one line with {expected:?}, got:\n{stderr}"
    );
    Ok(())
}

fn clusters(cli: &FlotillaCli) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(
        &cli.ok(&["cluster", "list", "-o", "json"])?,
    )?)
}

fn path_arg(path: &Path) -> anyhow::Result<&str> {
    path.to_str().context("a UTF-8 path")
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[test]
fn a_backup_during_writes_restores_as_a_copy_and_on_etcd_with_its_credentials() -> anyhow::Result<()>
{
    let started = Instant::now();
    let scratch = tempfile::tempdir()?;
    let kek = scratch.path().join("key-encryption-key");
    let kek_arg = path_arg(&kek)?.to_string();
    let source = Flotilla::up_with(Backend::Embedded, &["--key-encryption-key-file", &kek_arg])?;
    let a = cli(&source);
    contains(&a.ok(&["cluster", "create", "prod", "--wait"])?, "ACTIVE")?;
    let prod = kubeconfig(&a, scratch.path(), "prod")?;
    let seeding = Instant::now();
    prod.ok_stdin(&["create", "-f", "-"], &config_maps("seed", SEEDED))?;
    let seeded_in = seeding.elapsed();
    prod.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        &format!("--from-literal=password={PASSWORD}"),
    ])?;

    // Two writers while the backup is taken: one `kubectl create -f -` streaming ConfigMaps,
    // and one creating a ConfigMap at a time, noting when each was acknowledged.
    let streamer = {
        let kubectl = Kubectl::new(&prod.kubeconfig);
        std::thread::spawn(move || -> anyhow::Result<()> {
            kubectl.ok_stdin(&["create", "-f", "-"], &config_maps("live", STREAMED))?;
            Ok(())
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let kubectl = Kubectl::new(&prod.kubeconfig);
        let stop = stop.clone();
        std::thread::spawn(move || -> anyhow::Result<Vec<(String, Instant)>> {
            let mut acknowledged = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("tick-{i}");
                kubectl.ok(&["create", "configmap", &name])?;
                acknowledged.push((name, Instant::now()));
            }
            Ok(acknowledged)
        })
    };
    until(
        "the streamed writes are under way",
        Duration::from_secs(60),
        || {
            Ok(prod
                .run(&["get", "cm", "live-20"], None, &[])?
                .status
                .success())
        },
    )?;
    let file = scratch.path().join("prod.flotilla-backup");
    let backup_started = Instant::now();
    a.ok(&["cluster", "backup", "prod", "--file", path_arg(&file)?])?;
    let backup_took = backup_started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let ticks = ticker
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))??;
    streamer
        .join()
        .map_err(|_| anyhow::anyhow!("the streamer panicked"))??;

    let header = header(&file)?;
    ensure!(
        header["kind"] == "ClusterBackup" && header["formatVersion"] == 1,
        "{header}"
    );
    let revision = header["revision"].as_i64().context("revision")?;
    let size = std::fs::metadata(&file)?.len();
    let bytes = std::fs::read(&file)?;
    for needle in [PASSWORD, "PRIVATE KEY", "xxxxxxxxxx"] {
        ensure!(
            !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{needle:?} is in the backup in clear"
        );
    }
    // What the backup must hold: exactly the ConfigMaps written at or below its revision.
    let versions = config_map_versions(&prod)?;
    let expected: BTreeSet<String> = versions
        .iter()
        .filter(|(_, version)| **version <= revision)
        .map(|(name, _)| name.clone())
        .collect();
    let live_before = expected.iter().filter(|n| n.starts_with("live-")).count();
    ensure!(
        live_before > 0 && live_before < STREAMED,
        "the backup (revision {revision}) was not taken during the writes: {live_before} of {STREAMED} before it"
    );
    let ticks_before: Vec<&String> = ticks
        .iter()
        .filter(|(_, at)| *at < backup_started)
        .map(|(name, _)| name)
        .collect();
    for name in &ticks_before {
        ensure!(
            expected.contains(*name),
            "{name} was acknowledged before the backup started but is above its revision"
        );
    }

    // A copy beside the original: every object at or below the revision, nothing after it.
    let restoring = Instant::now();
    contains(
        &a.ok(&[
            "cluster",
            "restore",
            "--file",
            path_arg(&file)?,
            "--name",
            "prod-copy",
            "--wait",
        ])?,
        "ACTIVE",
    )?;
    let copy_took = restoring.elapsed();
    let copy = kubeconfig(&a, scratch.path(), "prod-copy")?;
    let restored: BTreeSet<String> = config_map_versions(&copy)?.into_keys().collect();
    ensure!(
        restored == expected,
        "the copy holds {} ConfigMaps, the backup's revision {} (missing {:?}, extra {:?})",
        restored.len(),
        expected.len(),
        expected.difference(&restored).take(5).collect::<Vec<_>>(),
        restored.difference(&expected).take(5).collect::<Vec<_>>()
    );
    ensure!(
        copy.ok(&["get", "secret", "db", "-o", "jsonpath={.data.password}"])?
            == base64_of(PASSWORD),
        "the secret's value did not come back"
    );
    copy.ok(&["create", "configmap", "written-to-the-copy"])?;
    ensure!(
        !prod
            .run(&["get", "cm", "written-to-the-copy"], None, &[])?
            .status
            .success(),
        "the copy shares the original's objects"
    );
    let described: Value =
        serde_json::from_str(&a.ok(&["cluster", "get", "prod-copy", "-o", "json"])?)?;
    let original: Value = serde_json::from_str(&a.ok(&["cluster", "get", "prod", "-o", "json"])?)?;
    let copy_id = described["id"].as_str().context("the copy's id")?;
    let endpoint = described["endpoint"]
        .as_str()
        .context("the copy's endpoint")?;
    ensure!(
        copy_id != original["id"]
            && endpoint.ends_with(&format!("/clusters/{copy_id}"))
            && described["restoredFrom"]["revision"] == revision,
        "{described}"
    );
    // The copy has credentials of its own: the original's certificate opens nothing there.
    let original_user_on_copy = with_user_of(
        &copy,
        &prod,
        scratch.path().join("original-on-copy.kubeconfig"),
    )?;
    let denied = original_user_on_copy.fails(&["get", "cm"])?;
    ensure!(
        denied.contains("Unauthorized") || denied.contains("must be logged in"),
        "{denied}"
    );

    // Refused with one line, nothing changed: truncated, a flipped byte, another version, a
    // taken name.
    let before = clusters(&a)?;
    let truncated = scratch.path().join("truncated.flotilla-backup");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3])?;
    let flipped = scratch.path().join("flipped.flotilla-backup");
    let mut corrupted = bytes.clone();
    let at = corrupted.len() - 1000;
    corrupted[at] ^= 0x01;
    std::fs::write(&flipped, &corrupted)?;
    let newer = scratch.path().join("newer.flotilla-backup");
    std::fs::write(
        &newer,
        String::from_utf8(bytes.clone())?.replacen("\"formatVersion\":1", "\"formatVersion\":2", 1),
    )?;
    for (bad, expected) in [
        (&truncated, "the backup is truncated"),
        (&flipped, "the backup is corrupted"),
        (&newer, "format version 2"),
    ] {
        refused(
            &a,
            &[
                "cluster",
                "restore",
                "--file",
                path_arg(bad)?,
                "--name",
                "bad",
            ],
            expected,
        )?;
    }
    refused(
        &a,
        &[
            "cluster",
            "restore",
            "--file",
            path_arg(&file)?,
            "--name",
            "prod-copy",
        ],
        "ResourceInUseException (409)",
    )?;
    ensure!(
        clusters(&a)? == before,
        "a refused restore changed the cluster list"
    );

    // The same backup on etcd, under its own name: the same id, and the original's client
    // certificate works again (its CA came back).
    let etcd = Etcd::start()?;
    let target = Flotilla::up_with(
        Backend::Etcd(etcd.endpoint.clone()),
        &["--key-encryption-key-file", &kek_arg],
    )?;
    let b = cli(&target);
    let restoring = Instant::now();
    contains(
        &b.ok(&["cluster", "restore", "--file", path_arg(&file)?, "--wait"])?,
        "ACTIVE",
    )?;
    let etcd_took = restoring.elapsed();
    let moved: Value = serde_json::from_str(&b.ok(&["cluster", "get", "prod", "-o", "json"])?)?;
    ensure!(moved["id"] == original["id"], "{moved}");
    let on_etcd = kubeconfig(&b, scratch.path(), "prod")?;
    let restored: BTreeSet<String> = config_map_versions(&on_etcd)?.into_keys().collect();
    ensure!(
        restored == expected,
        "etcd holds {} ConfigMaps, expected {}",
        restored.len(),
        expected.len()
    );
    let original_user = with_user_of(
        &on_etcd,
        &prod,
        scratch.path().join("original-on-etcd.kubeconfig"),
    )?;
    contains(&original_user.ok(&["get", "secret", "db"])?, "db")?;
    // What describes the service rather than the cluster is this service's: where its API
    // listens, and the CA pods trust it by.
    ensure!(
        jsonpath_of(&original_user, "kubernetes")?.contains(&target_port(&on_etcd)?),
        "the kubernetes endpoints name the backed-up service, not this one"
    );
    let root_ca = on_etcd.ok(&[
        "get",
        "configmap",
        "kube-root-ca.crt",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ])?;
    ensure!(
        base64_of(&root_ca) == server_ca_data(&on_etcd)?,
        "kube-root-ca.crt holds the backed-up service's CA"
    );

    println!(
        "backup e2e: {} objects ({SEEDED} ConfigMaps seeded in {:.1} s): backup {:.2} s (CLI, revision {revision}), {:.2} MiB; restore as a copy {:.2} s (embedded), under its own name on etcd {:.2} s; {} ticks before, {live_before} of {STREAMED} streamed before; {:.1} s in all",
        header["objects"],
        seeded_in.as_secs_f64(),
        backup_took.as_secs_f64(),
        mib(size),
        copy_took.as_secs_f64(),
        etcd_took.as_secs_f64(),
        ticks_before.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The `kubernetes` endpoints' address and port.
fn jsonpath_of(kubectl: &Kubectl, name: &str) -> anyhow::Result<String> {
    kubectl.ok(&[
        "get",
        "endpoints",
        name,
        "-o",
        "jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}",
    ])
}

/// The port of a kubeconfig's server URL.
fn target_port(kubectl: &Kubectl) -> anyhow::Result<String> {
    let config: Value = serde_yaml::from_str(&std::fs::read_to_string(&kubectl.kubeconfig)?)?;
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .context("server")?;
    let authority = server
        .trim_start_matches("https://")
        .split('/')
        .next()
        .context("authority")?;
    Ok(authority.to_string())
}

/// The `certificate-authority-data` of a kubeconfig.
fn server_ca_data(kubectl: &Kubectl) -> anyhow::Result<String> {
    let config: Value = serde_yaml::from_str(&std::fs::read_to_string(&kubectl.kubeconfig)?)?;
    Ok(
        config["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .context("certificate-authority-data")?
            .to_string(),
    )
}

fn encryption_config(dir: &Path, name: &str, secret_byte: u8) -> anyhow::Result<String> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets, configmaps]\n  providers:\n  - aescbc: {{keys: [{{name: {name}, secret: {}}}]}}\n  - identity: {{}}\n",
            base64_of_bytes(&[secret_byte; 32])
        ),
    )?;
    Ok(path_arg(&path)?.to_string())
}

fn base64_of_bytes(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn a_backup_from_etcd_restores_on_the_embedded_store_and_only_with_the_same_key()
-> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let kek = scratch.path().join("key-encryption-key");
    let kek_arg = path_arg(&kek)?.to_string();
    // Encrypted at rest with different keys on either side: the backup carries the values
    // as the API reads them (sealed under the key-encryption key), the restore encrypts them
    // with the target's configuration.
    let etcd = Etcd::start()?;
    let source = Flotilla::up_with(
        Backend::Etcd(etcd.endpoint.clone()),
        &[
            "--key-encryption-key-file",
            &kek_arg,
            "--encryption-provider-config",
            &encryption_config(scratch.path(), "source", 0x11)?,
        ],
    )?;
    source.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        &format!("--from-literal=password={PASSWORD}"),
    ])?;
    source.ok(&[
        "create",
        "configmap",
        "settings",
        "--from-literal=mode=fast",
    ])?;
    source.ok(&["create", "namespace", "team-a"])?;
    source.ok(&["-n", "team-a", "create", "serviceaccount", "builder"])?;
    let file = scratch.path().join("demo.flotilla-backup");
    cli(&source).ok(&["cluster", "backup", "demo", "--file", path_arg(&file)?])?;

    let target = Flotilla::up_with(
        Backend::Embedded,
        &[
            "--key-encryption-key-file",
            &kek_arg,
            "--encryption-provider-config",
            &encryption_config(scratch.path(), "target", 0x22)?,
        ],
    )?;
    let b = cli(&target);
    // `demo` exists there too: refused by name, then restored under another.
    let before = clusters(&b)?;
    refused(
        &b,
        &["cluster", "restore", "--file", path_arg(&file)?],
        "cluster \"demo\" already exists",
    )?;
    ensure!(
        clusters(&b)? == before,
        "a refused restore changed the cluster list"
    );
    contains(
        &b.ok(&[
            "cluster",
            "restore",
            "--file",
            path_arg(&file)?,
            "--name",
            "from-etcd",
            "--wait",
        ])?,
        "ACTIVE",
    )?;
    let copy = kubeconfig(&b, scratch.path(), "from-etcd")?;
    ensure!(
        copy.ok(&["get", "secret", "db", "-o", "jsonpath={.data.password}"])?
            == base64_of(PASSWORD),
        "the secret's value did not come back"
    );
    contains(
        &copy.ok(&["get", "configmap", "settings", "-o", "yaml"])?,
        "mode: fast",
    )?;
    contains(
        &copy.ok(&["-n", "team-a", "get", "serviceaccount", "builder"])?,
        "builder",
    )?;
    // The restored cluster runs its control loops: a namespace made now gets its default
    // ServiceAccount and root CA.
    copy.ok(&["create", "namespace", "team-b"])?;
    until("team-b gets its root CA", Duration::from_secs(30), || {
        Ok(copy
            .run(
                &["-n", "team-b", "get", "configmap", "kube-root-ca.crt"],
                None,
                &[],
            )?
            .status
            .success())
    })?;
    let store = std::fs::read(target.data_dir().join("store.redb"))?;
    ensure!(
        !store
            .windows(PASSWORD.len())
            .any(|w| w == PASSWORD.as_bytes()),
        "the restored secret is in the target's store in clear"
    );

    // A service with another key-encryption key cannot open the backup: one line naming
    // both keys, nothing written.
    let stranger = Flotilla::up(Backend::Embedded)?;
    let c = cli(&stranger);
    let before = clusters(&c)?;
    refused(
        &c,
        &[
            "cluster",
            "restore",
            "--file",
            path_arg(&file)?,
            "--name",
            "elsewhere",
        ],
        "--key-encryption-key-file",
    )?;
    ensure!(
        clusters(&c)? == before,
        "a refused restore changed the cluster list"
    );
    Ok(())
}
