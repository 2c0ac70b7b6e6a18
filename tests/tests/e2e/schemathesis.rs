//! Schema-driven API fuzzing with schemathesis (PyPI), bounded: the management API from its
//! `/v1/openapi.json` (an account's operations with every phase, stateful included, then the
//! operator's), checked for no 5xx and for answers, status codes and content types that match
//! the document; and a cluster's `apps/v1`, core `v1` and then every other group and version
//! it serves (their OpenAPI v3 documents merged into one) from the documents the API server
//! serves, checked for no 5xx, each run printing how many of its operations it reached. Then
//! the service still answers. Installs schemathesis
//! into a virtualenv under `/var/cache` once (needs python3 with venv, which tests/run installs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, ensure};
use base64::Engine;
use flotilla_e2e::{Backend, Flotilla, python_venv};
use serde_json::Value;

/// The version the checks were written against.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";
/// Examples per operation and seconds per run: enough to reach every operation, bounded.
const LIMITS: Limits = Limits {
    examples: 5,
    seconds: 45,
};

/// How far one run goes.
struct Limits {
    examples: u32,
    seconds: u32,
}

/// schemathesis from `FLOTILLA_SCHEMATHESIS_VENV`, or a virtualenv made once under /var/cache.
fn schemathesis() -> anyhow::Result<PathBuf> {
    let version = SCHEMATHESIS.trim_start_matches("schemathesis==");
    let venv = python_venv(
        "FLOTILLA_SCHEMATHESIS_VENV",
        "/var/cache/flotilla-schemathesis",
        SCHEMATHESIS,
        |venv| {
            Command::new(venv.join("bin/schemathesis"))
                .arg("--version")
                .output()
                .is_ok_and(|out| {
                    out.status.success() && String::from_utf8_lossy(&out.stdout).contains(version)
                })
        },
    )?;
    Ok(venv.join("bin/schemathesis"))
}

/// One schemathesis run in `report_dir` (its cache stays there, out of the clone); its JSON
/// report decides: every failure fails the test, or only server errors.
fn run(
    binary: &Path,
    report_dir: &Path,
    name: &str,
    args: &[&str],
    only_server_errors: bool,
    limits: Limits,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = report_dir.join(name);
    let out = Command::new(binary)
        .current_dir(report_dir)
        .arg("run")
        .args(args)
        .args(["-n", &limits.examples.to_string()])
        .args(["--max-time", &limits.seconds.to_string(), "--workers", "1"])
        .args(["--request-timeout", "10", "--seed", "1"])
        .args(["--report", "json", "--report-dir"])
        .arg(&dir)
        .output()
        .context("running schemathesis")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = std::fs::read_dir(&dir)
        .ok()
        .and_then(|mut entries| entries.next())
        .and_then(|entry| entry.ok())
        .with_context(|| format!("schemathesis wrote no report: {stdout}"))?;
    let report: Value = serde_json::from_slice(&std::fs::read(report.path())?)?;
    let failures: Vec<&Value> = report["failures"]
        .as_array()
        .into_iter()
        .flatten()
        // ST101 and ST102: a 5xx answer (to any request, or to one of an undeclared type).
        .filter(|f| !only_server_errors || f["code"] == "ST101" || f["code"] == "ST102")
        .collect();
    let cases = &report["test_cases"];
    let operations = &report["operations"];
    println!(
        "schemathesis {name}: {} of {} operations tested, {} cases generated, {} failures counted, {:.1} s",
        operations["tested"].as_u64().unwrap_or_default(),
        operations["selected"].as_u64().unwrap_or_default(),
        cases["generated"]
            .as_u64()
            .or(cases["total"].as_u64())
            .unwrap_or_default(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    ensure!(
        failures.is_empty(),
        "schemathesis {name} found: {}\n{}",
        serde_json::to_string_pretty(&failures)?,
        stdout
            .lines()
            .rev()
            .take(80)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

fn config(path: &Path) -> anyhow::Result<(String, String, PathBuf)> {
    let settings: Value = serde_json::from_slice(&std::fs::read(path)?)?;
    let ca = path.with_extension("ca.pem");
    std::fs::write(&ca, settings["caPem"].as_str().context("caPem")?)?;
    Ok((
        settings["endpoint"]
            .as_str()
            .context("endpoint")?
            .to_string(),
        settings["apiKey"].as_str().context("apiKey")?.to_string(),
        ca,
    ))
}

/// A field of the kubeconfig's first entry, base64-decoded, written to `dir/name`.
fn kubeconfig_file(
    kubeconfig: &str,
    field: &str,
    dir: &Path,
    name: &str,
) -> anyhow::Result<PathBuf> {
    let value = kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix(&format!("{field}: ")))
        .with_context(|| format!("{field} in the kubeconfig"))?;
    let path = dir.join(name);
    std::fs::write(
        &path,
        base64::engine::general_purpose::STANDARD.decode(value.trim())?,
    )?;
    Ok(path)
}

#[test]
fn schemathesis_finds_no_server_errors_and_no_schema_mismatches() -> anyhow::Result<()> {
    let started = Instant::now();
    let binary = schemathesis()?;
    let f = Flotilla::up(Backend::Embedded)?;
    let reports = tempfile::tempdir()?;
    let path = |p: &Path| p.to_str().map(str::to_string).context("path");

    // The management API: an account's operations, stateful links included, then the
    // operator's. The account is one of its own: its run creates and deletes clusters, and the
    // `demo` cluster is fuzzed below.
    let (endpoint, operator_key, ca) = config(&f.data_dir().join("operator.json"))?;
    let document = format!("{}/v1/openapi.json", endpoint.trim_end_matches('/'));
    let checks = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance";
    let ca = path(&ca)?;
    let created = Command::new("curl")
        .args(["-sS", "--fail", "--cacert", &ca, "-H"])
        .arg(format!("Authorization: Bearer {operator_key}"))
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"id": "fuzz"}"#,
        ])
        .arg(format!("{}/v1/accounts", endpoint.trim_end_matches('/')))
        .output()
        .context("running curl")?;
    ensure!(
        created.status.success(),
        "creating the fuzz account: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let created: Value = serde_json::from_slice(&created.stdout)?;
    let account_key = created["apiKey"].as_str().context("apiKey")?.to_string();
    run(
        &binary,
        reports.path(),
        "management (account)",
        &[
            &document,
            "--tls-verify",
            &ca,
            "-H",
            &format!("Authorization: Bearer {account_key}"),
            "-c",
            checks,
            "--include-path-regex",
            "^/v1/clusters",
        ],
        false,
        LIMITS,
    )?;
    run(
        &binary,
        reports.path(),
        "management (operator)",
        &[
            &document,
            "--tls-verify",
            &ca,
            "-H",
            &format!("Authorization: Bearer {operator_key}"),
            "-c",
            checks,
            "--include-path-regex",
            "^/v1/(accounts|identity|version)",
            "--phases",
            "examples,coverage,fuzzing",
        ],
        false,
        LIMITS,
    )?;

    // A cluster's API from its own OpenAPI v3 documents: no 5xx. Watches (`/watch/` paths and
    // `?watch=`) stream until the client gives up, as upstream's do, and the `proxy`
    // subresources answer what their backend answers (503 for a Service without endpoints, as
    // upstream): they are left out.
    let kubeconfig = std::fs::read_to_string(&f.kubeconfig)?;
    let server = kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: "))
        .context("server in the kubeconfig")?
        .to_string();
    let cluster_ca = kubeconfig_file(
        &kubeconfig,
        "certificate-authority-data",
        reports.path(),
        "cluster-ca.pem",
    )?;
    let cert = kubeconfig_file(
        &kubeconfig,
        "client-certificate-data",
        reports.path(),
        "client.pem",
    )?;
    let key = kubeconfig_file(
        &kubeconfig,
        "client-key-data",
        reports.path(),
        "client-key.pem",
    )?;
    let kubectl = f.kubectl();
    // What every run against the cluster's API passes after its document.
    let cluster_args: Vec<String> = vec![
        "--url".into(),
        server.clone(),
        "--tls-verify".into(),
        path(&cluster_ca)?,
        "--request-cert".into(),
        path(&cert)?,
        "--request-cert-key".into(),
        path(&key)?,
        "-c".into(),
        "not_a_server_error".into(),
        "--exclude-path-regex".into(),
        "/watch/|/proxy".into(),
        "--phases".into(),
        "fuzzing".into(),
    ];
    // Core v1 has 163 operations: fewer examples each, so that all are reached.
    let core_limits = Limits {
        examples: 2,
        seconds: 90,
    };
    for (name, group, limits) in [
        ("apps/v1", "apis/apps/v1", LIMITS),
        ("core v1", "api/v1", core_limits),
    ] {
        let document = reports
            .path()
            .join(format!("{}.json", name.replace(['/', ' '], "-")));
        std::fs::write(
            &document,
            kubectl.ok(&["get", "--raw", &format!("/openapi/v3/{group}")])?,
        )?;
        let mut args = vec![path(&document)?];
        args.extend(cluster_args.iter().cloned());
        run(
            &binary,
            reports.path(),
            name,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            true,
            limits,
        )?;
    }

    // Every other group and version the cluster serves, in one run over their documents
    // merged (schemas of one name are one definition across them): one example each within
    // 4 minutes here; `FLOTILLA_SCHEMATHESIS_EXAMPLES` and `FLOTILLA_SCHEMATHESIS_SECONDS`
    // ask for more (the README's long form: 5 and 1800).
    let index: Value = serde_json::from_str(&kubectl.ok(&["get", "--raw", "/openapi/v3"])?)?;
    let mut merged = serde_json::json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "every group"},
        "paths": {},
        "components": {"schemas": {}, "securitySchemes": {}},
    });
    let mut groups = 0;
    for group in index["paths"]
        .as_object()
        .context("the /openapi/v3 index")?
        .keys()
    {
        if !(group.starts_with("api/") || group.starts_with("apis/"))
            || group == "api/v1"
            || group == "apis/apps/v1"
        {
            continue;
        }
        let document: Value = serde_json::from_str(&kubectl.ok(&[
            "get",
            "--raw",
            &format!("/openapi/v3/{group}"),
        ])?)?;
        for section in ["paths", "components/schemas", "components/securitySchemes"] {
            let pointer = format!("/{section}");
            if let (Some(from), Some(Value::Object(into))) = (
                document.pointer(&pointer).and_then(Value::as_object),
                merged.pointer_mut(&pointer),
            ) {
                for (name, value) in from {
                    into.insert(name.clone(), value.clone());
                }
            }
        }
        groups += 1;
    }
    ensure!(groups > 10, "only {groups} other groups in /openapi/v3");
    let every = reports.path().join("every-group.json");
    std::fs::write(&every, serde_json::to_vec(&merged)?)?;
    let setting = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default)
    };
    run(
        &binary,
        reports.path(),
        &format!("{groups} other groups"),
        &[path(&every)?]
            .iter()
            .chain(&cluster_args)
            .map(String::as_str)
            .collect::<Vec<_>>(),
        true,
        Limits {
            examples: setting("FLOTILLA_SCHEMATHESIS_EXAMPLES", 1),
            seconds: setting("FLOTILLA_SCHEMATHESIS_SECONDS", 240),
        },
    )?;

    // Still healthy afterwards.
    ensure!(
        kubectl.ok(&["get", "--raw", "/readyz"])? == "ok",
        "not ready after fuzzing"
    );
    kubectl.ok(&["get", "namespaces"])?;
    println!("schemathesis e2e: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
