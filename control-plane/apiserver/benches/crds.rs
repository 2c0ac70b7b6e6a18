//! Custom resource benchmark: `cargo bench -p flotilla-apiserver --bench crds`.
//!
//! Measured side by side in one run, printed, never asserted:
//!
//! - CR create throughput (cert-manager Certificates, validated, pruned and defaulted by their
//!   schema) against ConfigMap creates on the same embedded store, through the kube-rs
//!   client over TLS, 8 writers: creates/s and the ratio (target ≥ 0.8);
//! - a definition's create until its kind is served (the reconcile runs before the answer):
//!   p50 / p99 over fresh copies of cert-manager's Certificate definition (target p99 ≤ 500 ms);
//! - validation cost of one Certificate against its schema (OpenAPI validation, pruning,
//!   defaulting, CEL rules) in µs, beside a Pod's round trip through its k8s-openapi type;
//! - memory of the six cert-manager definitions' kinds in 1000 tenants' tables, with schemas
//!   shared by content (as served) and with a copy per tenant (upstream's way), in KiB per
//!   tenant (target ≤ 200 KiB);
//! - a validating webhook's cost per request (p50 / p99) on a loopback-free private address of
//!   this host, against the same ConfigMap creates without it.

mod support;
use support::percentile;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use flotilla_apiserver::apiextensions::custom_resource::kinds_of;
use flotilla_apiserver::apiextensions::schemas::Interner;
use flotilla_apiserver::local::LocalServer;
use flotilla_storage::EmbeddedStorage;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const WRITERS: usize = 8;
const THROUGHPUT_RUN: Duration = Duration::from_secs(3);
const DEFINITIONS: usize = 40;
const TENANTS: usize = 1000;
const VALIDATIONS: usize = 2000;
const WEBHOOK_CREATES: usize = 300;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/crds/cert-manager")
}

/// The six cert-manager definitions, as JSON.
fn cert_manager() -> anyhow::Result<Vec<Value>> {
    let mut definitions = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(fixtures())
        .context("the cert-manager fixtures (../shared/fixtures beside the clone)")?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let text = std::fs::read_to_string(entry.path())?;
        definitions.push(serde_yaml::from_str(&text)?);
    }
    Ok(definitions)
}

fn certificate(name: &str) -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": name},
        "spec": {"secretName": format!("{name}-tls"), "dnsNames": [format!("{name}.example.com")],
                 "issuerRef": {"name": "selfsigned", "kind": "Issuer"},
                 "privateKey": {"algorithm": "ECDSA", "size": 256}, "duration": "2160h"},
    })
}

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
           "data": {"secretName": format!("{name}-tls"), "dnsNames": format!("{name}.example.com"),
                    "issuer": "selfsigned", "algorithm": "ECDSA", "duration": "2160h"}})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Creates/s of `make` objects through `api` by [`WRITERS`] writers for [`THROUGHPUT_RUN`].
async fn throughput(
    api: &Api<DynamicObject>,
    tag: &str,
    make: fn(&str) -> Value,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let api = api.clone();
        let tag = tag.to_string();
        writers.push(tokio::spawn(async move {
            let mut done = 0usize;
            while started.elapsed() < THROUGHPUT_RUN {
                let object: DynamicObject =
                    serde_json::from_value(make(&format!("{tag}-{writer}-{done}")))?;
                api.create(&PostParams::default(), &object).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for writer in writers {
        total += writer.await.context("writer panicked")??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn run() -> anyhow::Result<()> {
    let definitions = cert_manager()?;
    let dir = tempfile::tempdir()?;
    let storage = Arc::new(EmbeddedStorage::open(dir.path().join("store.redb"))?);
    let local = LocalServer::start(storage, "demo").await?;
    let client = support::client(&local).await?;
    let crds = resource(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    );
    let crd_api: Api<DynamicObject> = Api::all_with(client.clone(), &crds);
    for definition in &definitions {
        crd_api
            .create(
                &PostParams::default(),
                &serde_json::from_value(definition.clone())?,
            )
            .await?;
    }

    // Throughput: CR creates against ConfigMap creates, alternated.
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &resource("cert-manager.io", "v1", "Certificate", "certificates"),
    );
    let configmaps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &resource("", "v1", "ConfigMap", "configmaps"),
    );
    throughput(&configmaps, "warm-cm", configmap).await?;
    throughput(&certificates, "warm-cert", certificate).await?;
    // Rounds alternate which kind goes first, so the store's growth falls on both alike.
    let (mut cm_rate, mut cr_rate) = (0.0, 0.0);
    for round in 0..4 {
        let (cm_tag, cr_tag) = (format!("cm{round}"), format!("cert{round}"));
        if round % 2 == 0 {
            cm_rate += throughput(&configmaps, &cm_tag, configmap).await? / 4.0;
            cr_rate += throughput(&certificates, &cr_tag, certificate).await? / 4.0;
        } else {
            cr_rate += throughput(&certificates, &cr_tag, certificate).await? / 4.0;
            cm_rate += throughput(&configmaps, &cm_tag, configmap).await? / 4.0;
        }
    }
    println!("create throughput, {WRITERS} writers, embedded store");
    println!("  ConfigMap (reference)            {cm_rate:>8.0}/s");
    println!(
        "  cert-manager Certificate         {cr_rate:>8.0}/s   {:.2}× of the reference (target ≥ 0.8)",
        cr_rate / cm_rate
    );

    // A definition's create until its kind is served.
    let template = definitions
        .iter()
        .find(|d| d["metadata"]["name"] == "certificates.cert-manager.io")
        .context("the Certificate definition")?
        .to_string();
    let mut latencies = Vec::new();
    for i in 0..DEFINITIONS {
        let copy: Value = serde_json::from_str(
            &template.replace("cert-manager.io", &format!("c{i}.example.com")),
        )?;
        let started = Instant::now();
        crd_api
            .create(&PostParams::default(), &serde_json::from_value(copy)?)
            .await?;
        let served: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            "default",
            &resource(
                &format!("c{i}.example.com"),
                "v1",
                "Certificate",
                "certificates",
            ),
        );
        while served.list(&Default::default()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(started.elapsed());
    }
    latencies.sort();
    println!(
        "\ndefinition created → its kind served ({DEFINITIONS} copies of cert-manager's Certificate definition)"
    );
    println!(
        "  p50 {:.1} ms   p99 {:.1} ms (target p99 ≤ 500 ms)",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99))
    );

    validation_cost(&definitions)?;
    memory(&definitions)?;
    webhook_overhead(&client).await?;
    local.stop().abort();
    Ok(())
}

/// µs per Certificate through its schema and rules, beside a Pod's typed round trip.
fn validation_cost(definitions: &[Value]) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    let definition = definitions
        .iter()
        .find(|d| d["metadata"]["name"] == "certificates.cert-manager.io")
        .context("the Certificate definition")?;
    let props: JSONSchemaProps = serde_json::from_value(
        definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone(),
    )?;
    let schema =
        flotilla_apiextensions::CompiledSchema::new(&props).map_err(|e| anyhow::anyhow!("{e}"))?;
    let rules = flotilla_cel::Validator::new(&props);
    let object = certificate("bench");
    let started = Instant::now();
    for _ in 0..VALIDATIONS {
        let mut candidate = object.clone();
        schema.prune(&mut candidate, true);
        schema.apply_defaults(&mut candidate);
        let errors = schema.validate(&candidate);
        let rule_errors = rules.validate(&candidate, None);
        anyhow::ensure!(
            errors.is_empty() && rule_errors.is_empty(),
            "{errors:?} {rule_errors:?}"
        );
    }
    let custom = started.elapsed() / VALIDATIONS as u32;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}});
    let started = Instant::now();
    for _ in 0..VALIDATIONS {
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone())?;
        std::hint::black_box(serde_json::to_value(typed)?);
    }
    let reference = started.elapsed() / VALIDATIONS as u32;
    println!("\nvalidation cost per object");
    println!(
        "  Pod through its k8s-openapi type (reference)            {:>7.1} µs",
        reference.as_secs_f64() * 1e6
    );
    println!(
        "  Certificate: prune, default, validate, CEL ({} rules)    {:>7.1} µs   {:.1}× the reference",
        if rules.has_rules() { "with" } else { "no" },
        custom.as_secs_f64() * 1e6,
        custom.as_secs_f64() / reference.as_secs_f64()
    );
    Ok(())
}

fn allocated() -> anyhow::Result<usize> {
    tikv_jemalloc_ctl::epoch::advance().map_err(|e| anyhow::anyhow!("{e}"))?;
    tikv_jemalloc_ctl::stats::allocated::read().map_err(|e| anyhow::anyhow!("{e}"))
}

/// KiB per tenant of the six definitions' kinds (and the tenant's table), shared schemas
/// against a copy per tenant.
fn memory(definitions: &[Value]) -> anyhow::Result<()> {
    let established: Vec<Value> = definitions
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d["status"]["acceptedNames"] = d["spec"]["names"].clone();
            d
        })
        .collect();
    let builtin = Arc::new(flotilla_apiserver::resources::Resources::builtin());
    let measure = |shared: bool| -> anyhow::Result<f64> {
        let interner = Interner::default();
        let before = allocated()?;
        let mut tables = Vec::with_capacity(TENANTS);
        for _ in 0..TENANTS {
            let own;
            let interner = if shared {
                &interner
            } else {
                own = Interner::default();
                &own
            };
            let kinds: Vec<_> = established
                .iter()
                .flat_map(|d| kinds_of(d, interner, &Default::default()))
                .collect();
            tables.push(builtin.with_custom(kinds));
        }
        let after = allocated()?;
        drop(tables);
        Ok((after.saturating_sub(before)) as f64 / TENANTS as f64 / 1024.0)
    };
    let copied = measure(false)?;
    let shared = measure(true)?;
    println!("\nmemory of cert-manager's six definitions' kinds, {TENANTS} tenants");
    println!(
        "  a schema copy per tenant (upstream's way, reference)  {copied:>8.1} KiB per tenant"
    );
    println!(
        "  schemas shared by content (as served)                  {shared:>8.1} KiB per tenant   {:.3}× the reference (target ≤ 200 KiB)",
        shared / copied
    );
    Ok(())
}

/// A private, non-loopback address of this host (webhooks are dialled only there).
fn private_address() -> Option<String> {
    let output = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::Ipv4Addr>().ok())
        .find(|ip| ip.is_private())
        .map(|ip| ip.to_string())
}

/// A validating webhook that allows everything, served with `rustls` on `ip`.
async fn allow_all_webhook(ip: &str) -> anyhow::Result<(String, String)> {
    use http_body_util::{BodyExt, Full};
    let ca = flotilla_apiserver::pki::CertificateAuthority::generate("bench webhook CA")?;
    let serving = ca.issue_serving("webhook", &[ip.to_string()])?;
    let tls = flotilla_apiserver::serve::server_config(
        &format!("{}{}", serving.cert_pem, ca.cert_pem),
        &serving.key_pem,
    )?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            // As Go's servers do: answers are not held back waiting for acknowledgements.
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |request: hyper::Request<hyper::body::Incoming>| async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "response": {"uid": review["request"]["uid"], "allowed": true}});
                        Ok::<_, hyper::Error>(hyper::Response::new(Full::new(bytes::Bytes::from(
                            answer.to_string(),
                        ))))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok((format!("https://{address}/validate"), ca.cert_pem))
}

async fn webhook_overhead(client: &kube::Client) -> anyhow::Result<()> {
    println!(
        "\nvalidating webhook on this host, ConfigMap creates one at a time ({WEBHOOK_CREATES} each)"
    );
    let Some(ip) = private_address() else {
        println!("  not measured: this host has no private IPv4 address to serve the webhook on");
        return Ok(());
    };
    let (url, ca_pem) = allow_all_webhook(&ip).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let timed = |tag: String| {
        let configmaps = configmaps.clone();
        async move {
            let mut latencies = Vec::new();
            for i in 0..WEBHOOK_CREATES {
                let object: ConfigMap = serde_json::from_value(configmap(&format!("{tag}-{i}")))?;
                let started = Instant::now();
                configmaps.create(&PostParams::default(), &object).await?;
                latencies.push(started.elapsed());
            }
            latencies.sort();
            anyhow::Ok(latencies)
        }
    };
    timed("wh-warm".into()).await?;
    let without = timed("wh-off".into()).await?;
    use base64::Engine as _;
    let configuration: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "allow-all"},
        "webhooks": [{"name": "allow.bench.flotilla.dev", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem)},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]}],
    }))?;
    let hooks: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
        ),
    );
    hooks.create(&PostParams::default(), &configuration).await?;
    // The configuration is read through the admission lookups (at most 1 s old).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let with = timed("wh-on".into()).await?;
    let row = |name: &str, latencies: &[Duration]| {
        println!(
            "  {name:<34} p50 {:>6.2} ms   p99 {:>6.2} ms",
            ms(percentile(latencies, 0.5)),
            ms(percentile(latencies, 0.99))
        );
    };
    row("without a webhook (reference)", &without);
    row("one validating webhook", &with);
    println!(
        "  webhook cost per request: p50 +{:.2} ms, p99 +{:.2} ms",
        ms(percentile(&with, 0.5)) - ms(percentile(&without, 0.5)),
        ms(percentile(&with, 0.99)) - ms(percentile(&without, 0.99))
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}
