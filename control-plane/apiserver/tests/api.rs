//! The API server driven through its real HTTPS surface by the kube-rs client: typed CRUD,
//! pagination, resourceVersion rules, watches (including a forced 410 and relist), and bad
//! input answered with the right `Status` and nothing stored. Runs on the embedded store.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_apiserver::local::LocalServer;
use flotilla_storage::{EmbeddedStorage, Storage};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::{Value, json};

/// A running server with an admin client.
struct Harness {
    client: kube::Client,
    storage: Arc<dyn Storage>,
    _dir: tempfile::TempDir,
    server: LocalServer,
}

impl Harness {
    /// A client authenticated by a certificate of the tenant's CA for `user` in `groups`.
    async fn client_as(&self, user: &str, groups: &[&str]) -> anyhow::Result<kube::Client> {
        use base64::Engine;
        let tenant = self
            .server
            .server
            .tenants
            .get("demo")
            .await
            .map_err(|err| anyhow::anyhow!("tenant demo: {}", err.message))?
            .context("tenant demo")?;
        let issued = tenant.record.client_ca.issue_client(user, groups)?;
        let mut kubeconfig = kube::config::Kubeconfig::from_yaml(&self.server.kubeconfig)?;
        let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
        for auth in &mut kubeconfig.auth_infos {
            if let Some(info) = auth.auth_info.as_mut() {
                info.client_certificate_data = Some(b64(&issued.cert_pem));
                info.client_key_data = Some(b64(&issued.key_pem).into());
            }
        }
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(kube::Client::try_from(config)?)
    }
}

async fn start() -> anyhow::Result<Harness> {
    let dir = tempfile::tempdir()?;
    let storage: Arc<dyn Storage> = Arc::new(EmbeddedStorage::open(dir.path().join("store.redb"))?);
    let server = LocalServer::start(storage.clone(), "demo").await?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    Ok(Harness {
        client,
        storage,
        _dir: dir,
        server,
    })
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"suite": "api"}},
        "data": {"value": value},
    }))
    .unwrap_or_default()
}

fn api_status(err: kube::Error) -> anyhow::Result<(u16, String, String)> {
    match err {
        kube::Error::Api(status) => {
            Ok((status.code, status.reason.clone(), status.message.clone()))
        }
        other => Err(anyhow::anyhow!("expected an API error, got {other}")),
    }
}

/// A raw request through the authenticated client: (code, body as JSON, warnings).
async fn raw(
    h: &Harness,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> anyhow::Result<(u16, Value, Vec<String>)> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("accept", "application/json")
        .body(kube::client::Body::from(body))?;
    let response = h.client.send(request).await?;
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let bytes = response.into_body().collect().await?.to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((code, value, warnings))
}

#[tokio::test]
async fn typed_crud_and_conflicts() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    let created = api
        .create(&PostParams::default(), &config_map("crud", "one"))
        .await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    ensure!(
        created.metadata.creation_timestamp.is_some(),
        "creationTimestamp set"
    );
    let fetched = api.get("crud").await?;
    ensure!(fetched.metadata.uid.as_deref() == Some(uid.as_str()));

    let (code, reason, message) = api_status(
        api.create(&PostParams::default(), &config_map("crud", "x"))
            .await
            .expect_err("duplicate"),
    )?;
    ensure!(
        code == 409 && reason == "AlreadyExists" && message == "configmaps \"crud\" already exists",
        "{code} {reason} {message}"
    );

    let mut replacing = fetched.clone();
    replacing.data = Some([("value".to_string(), "two".to_string())].into());
    let replaced = api
        .replace("crud", &PostParams::default(), &replacing)
        .await?;
    ensure!(
        replaced.metadata.resource_version != fetched.metadata.resource_version,
        "replace bumps the resourceVersion"
    );

    // A replace carrying the old resourceVersion is stale.
    let (code, reason, message) = api_status(
        api.replace("crud", &PostParams::default(), &replacing)
            .await
            .expect_err("stale"),
    )?;
    ensure!(code == 409 && reason == "Conflict", "{code} {reason}");
    ensure!(message.contains("the object has been modified; please apply your changes to the latest version and try again"), "{message}");
    ensure!(
        api.get("crud").await?.data == replaced.data,
        "a stale replace stores nothing"
    );

    let merged = api
        .patch(
            "crud",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"extra": "m"}})),
        )
        .await?;
    ensure!(
        merged
            .data
            .as_ref()
            .and_then(|d| d.get("extra"))
            .map(String::as_str)
            == Some("m")
    );
    let json_patched = api
        .patch(
            "crud",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(
                json!([{"op": "remove", "path": "/data/extra"}]),
            )?),
        )
        .await?;
    ensure!(
        json_patched
            .data
            .as_ref()
            .is_some_and(|d| !d.contains_key("extra"))
    );
    let applied = api
        .patch(
            "crud",
            &PatchParams::apply("suite").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"applied": "yes"}}),
            ),
        )
        .await?;
    ensure!(
        applied
            .metadata
            .managed_fields
            .as_ref()
            .is_some_and(|m| m.iter().any(|e| e.manager.as_deref() == Some("suite")))
    );

    api.delete("crud", &DeleteParams::default()).await?;
    let (code, reason, _) = api_status(api.get("crud").await.expect_err("deleted"))?;
    ensure!(code == 404 && reason == "NotFound");
    Ok(())
}

#[tokio::test]
async fn paginated_lists_and_resource_versions() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    for i in 0..25 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("page-{i:02}"), "v"),
        )
        .await?;
    }
    let first = api
        .list(&ListParams::default().labels("suite=api").limit(10))
        .await?;
    ensure!(
        first.items.len() == 10,
        "first page has {}",
        first.items.len()
    );
    let snapshot_rv = first.metadata.resource_version.clone().context("list rv")?;
    // Writes between pages are not seen by the continued list.
    api.create(&PostParams::default(), &config_map("page-zz-late", "v"))
        .await?;
    let mut names: Vec<String> = first
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = api
            .list(
                &ListParams::default()
                    .labels("suite=api")
                    .limit(10)
                    .continue_token(&t),
            )
            .await?;
        ensure!(
            page.metadata.resource_version.as_deref() == Some(snapshot_rv.as_str()),
            "pages share one revision"
        );
        names.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        token = page.metadata.continue_.clone();
    }
    ensure!(
        names.len() == 25 && !names.iter().any(|n| n == "page-zz-late"),
        "paged names: {names:?}"
    );
    let unfiltered = api.list(&ListParams::default().limit(5)).await?;
    ensure!(
        unfiltered.metadata.remaining_item_count == Some(21),
        "remainingItemCount {:?}",
        unfiltered.metadata.remaining_item_count
    );

    // Exact reads of the past, and the 410 once that past is compacted away.
    let exact = api
        .list(
            &ListParams::default()
                .labels("suite=api")
                .at(&snapshot_rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await?;
    ensure!(
        exact.items.len() == 25,
        "exact list at the snapshot sees 25, saw {}",
        exact.items.len()
    );
    let page = api
        .list(&ListParams::default().labels("suite=api").limit(10))
        .await?;
    let token = page.metadata.continue_.clone().context("continue token")?;
    // Move past the token's revision, then compact everything before now.
    api.create(&PostParams::default(), &config_map("page-zz-later", "v"))
        .await?;
    let current = h.storage.current_revision().await?;
    h.storage.compact(current).await?;
    let (code, reason, message) = api_status(
        api.list(&ListParams::default().limit(10).continue_token(&token))
            .await
            .expect_err("expired"),
    )?;
    ensure!(
        code == 410 && reason == "Expired",
        "{code} {reason} {message}"
    );
    // The 410 hands back a token that resumes at the latest state.
    let path = format!("/api/v1/namespaces/default/configmaps?limit=10&continue={token}");
    let (code, status, _) = raw(&h, "GET", &path, "application/json", Vec::new()).await?;
    ensure!(code == 410, "expired continue answered {code}");
    let resume = status["metadata"]["continue"]
        .as_str()
        .context("an expired list carries a continue token")?
        .to_string();
    let resumed = api
        .list(&ListParams::default().limit(10).continue_token(&resume))
        .await?;
    ensure!(
        !resumed.items.is_empty(),
        "resuming at the latest state lists the rest"
    );
    let (code, reason, _) = api_status(
        api.list(
            &ListParams::default()
                .at(&snapshot_rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await
        .expect_err("too old"),
    )?;
    ensure!(code == 410 && reason == "Expired", "{code} {reason}");
    // A forged token that tries to leave the list's prefix is refused, not followed.
    use base64::Engine;
    let forged = base64::engine::general_purpose::URL_SAFE
        .encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"../../other/x"}"#);
    let (code, _, _) = api_status(
        api.list(&ListParams::default().continue_token(&forged))
            .await
            .expect_err("forged"),
    )?;
    ensure!(code == 400, "forged continue answered {code}");
    Ok(())
}

#[tokio::test]
async fn watches_translate_selectors_and_expire() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    let created = api
        .create(&PostParams::default(), &config_map("watched", "v"))
        .await?;
    let rv = created.metadata.resource_version.clone().context("rv")?;
    let mut stream = api
        .watch(&WatchParams::default().labels("suite=api").timeout(10), &rv)
        .await?
        .boxed();
    // Relabelling the object out of the selector is a DELETED for this watch.
    api.patch(
        "watched",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"suite": "elsewhere"}}})),
    )
    .await?;
    let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await?
        .context("watch ended")?;
    match event {
        // The DELETED event shows the last state that matched the selector.
        Some(WatchEvent::Deleted(last)) => ensure!(
            last.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("suite"))
                .map(String::as_str)
                == Some("api"),
            "DELETED should carry the last matching state: {last:?}"
        ),
        other => anyhow::bail!("expected DELETED, got {other:?}"),
    }

    // resourceVersionMatch on a watch needs sendInitialEvents (422, as ValidateListOptions).
    let path = "/api/v1/namespaces/default/configmaps?watch=true&resourceVersionMatch=NotOlderThan";
    let (code, status, _) = raw(&h, "GET", path, "application/json", Vec::new()).await?;
    ensure!(
        code == 422 && status["reason"] == "Invalid",
        "watch with a match: {code} {status}"
    );

    // A watch from before the watch cache's window gets the 410 ERROR event. The window is
    // the cache's, not the store's (as upstream): the cache is released, the store compacted,
    // and the rebuilt cache starts after the revision asked for.
    drop(stream);
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("later-{i}"), "v"),
        )
        .await?;
    }
    let current = h.storage.current_revision().await?;
    h.storage.compact(current).await?;
    h.server.server.store().caches().sweep(Duration::ZERO);
    let mut expired = api.watch(&WatchParams::default(), &rv).await?.boxed();
    let event = tokio::time::timeout(Duration::from_secs(5), expired.try_next())
        .await?
        .context("no event")?;
    match event {
        Some(WatchEvent::Error(status)) => {
            ensure!(status.code == 410, "error event code {}", status.code)
        }
        other => anyhow::bail!("expected a 410 ERROR event, got {other:?}"),
    }
    Ok(())
}

/// Issue 28: lists are served by the watch cache. A consistent list (no resourceVersion) sees
/// every write acknowledged before it, even when the writes since the cache last moved were to
/// other resources (the cache learns it is fresh from its store watch's progress report);
/// `resourceVersion=0` is served as the cache stands, and a page of it continues from the store
/// at the same revision.
#[tokio::test]
async fn lists_from_the_watch_cache_see_every_acknowledged_write() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    for i in 0..20 {
        let name = format!("fresh-{i}");
        api.create(&PostParams::default(), &config_map(&name, "v"))
            .await?;
        // Another resource moves the store past the cache's last event.
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("elsewhere-{i}")}}))?,
            )
            .await?;
        let listed = api.list(&ListParams::default().labels("suite=api")).await?;
        ensure!(
            listed.items.len() == i + 1,
            "a consistent list after {} creates saw {}",
            i + 1,
            listed.items.len()
        );
    }
    let caches = h.server.server.store().caches();
    ensure!(
        caches.live() > 0 && caches.fallbacks() == 0,
        "{} caches, {} reads answered by the store",
        caches.live(),
        caches.fallbacks()
    );
    let total = api.list(&ListParams::default()).await?.items.len();
    let first = api
        .list(&ListParams::default().match_any().limit(8))
        .await?;
    ensure!(first.items.len() == 8, "page of {}", first.items.len());
    let token = first.metadata.continue_.clone().context("continue token")?;
    ensure!(
        first.metadata.remaining_item_count == Some(total as i64 - 8),
        "remaining {:?} of {total}",
        first.metadata.remaining_item_count
    );
    let rest = api
        .list(&ListParams::default().limit(100).continue_token(&token))
        .await?;
    ensure!(
        rest.items.len() == total - 8
            && rest.metadata.resource_version == first.metadata.resource_version,
        "the rest: {} items at {:?} (first page at {:?})",
        rest.items.len(),
        rest.metadata.resource_version,
        first.metadata.resource_version
    );
    Ok(())
}

#[tokio::test]
async fn watcher_relists_after_a_forced_410() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    api.create(&PostParams::default(), &config_map("before", "v"))
        .await?;
    // Short server-side timeouts make the watcher re-watch from its last revision often.
    let mut events = watcher(api.clone(), watcher::Config::default().timeout(1)).boxed();
    let mut init_done = 0;
    let mut seen_after = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut compacted = false;
    while tokio::time::Instant::now() < deadline && !(init_done >= 2 && seen_after) {
        let next = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
        match next {
            Ok(Some(Ok(watcher::Event::InitDone))) => {
                init_done += 1;
                if !compacted {
                    // Writes elsewhere move the store on; compacting past the watcher's revision
                    // makes its next watch fail with 410, which it must survive by relisting.
                    let other: Api<Namespace> = Api::all(h.client.clone());
                    other
                        .create(
                            &PostParams::default(),
                            &serde_json::from_value(json!({"metadata": {"name": "elsewhere"}}))?,
                        )
                        .await?;
                    let current = h.storage.current_revision().await?;
                    h.storage.compact(current).await?;
                    compacted = true;
                    api.create(&PostParams::default(), &config_map("after", "v"))
                        .await?;
                }
            }
            Ok(Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))))
                if cm.metadata.name.as_deref() == Some("after") =>
            {
                seen_after = true;
            }
            Ok(Some(_)) | Err(_) => {}
            Ok(None) => break,
        }
    }
    ensure!(
        seen_after,
        "the watcher never delivered the object created after compaction"
    );
    Ok(())
}

/// (what, content type, body, expected code, reason, message fragment)
type BadInput = (
    &'static str,
    &'static str,
    Vec<u8>,
    u16,
    &'static str,
    &'static str,
);

#[tokio::test]
async fn bad_input_gets_precise_status_and_stores_nothing() -> anyhow::Result<()> {
    let h = start().await?;
    let base = "/api/v1/namespaces/default/configmaps";
    let cases: Vec<BadInput> = vec![
        (
            "malformed json",
            "application/json",
            b"{\"apiVersion\": \"v1\", ".to_vec(),
            400,
            "BadRequest",
            "json parse error",
        ),
        (
            "malformed yaml",
            "application/yaml",
            b"metadata: [unclosed".to_vec(),
            400,
            "BadRequest",
            "yaml",
        ),
        (
            "wrong kind",
            "application/json",
            serde_json::to_vec(
                &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wrong"}}),
            )?,
            400,
            "BadRequest",
            "the kind in the data (Pod) does not match the expected kind (ConfigMap)",
        ),
        (
            "bad name",
            "application/json",
            serde_json::to_vec(
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}}),
            )?,
            422,
            "Invalid",
            "metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain",
        ),
        (
            "oversize",
            "application/json",
            serde_json::to_vec(
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "huge"}, "data": {"x": "y".repeat(4 * 1024 * 1024)}}),
            )?,
            413,
            "RequestEntityTooLarge",
            "Request entity too large",
        ),
    ];
    for (what, content_type, body, want_code, want_reason, want_message) in cases {
        let (code, status, _) = raw(&h, "POST", base, content_type, body).await?;
        ensure!(code == want_code, "{what}: code {code}, body {status}");
        ensure!(
            status["kind"] == "Status" && status["reason"] == want_reason,
            "{what}: {status}"
        );
        let message = status["message"].as_str().unwrap_or("");
        ensure!(
            message.contains(want_message),
            "{what}: message {message:?}"
        );
    }
    let strict = serde_json::to_vec(
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "strict"}, "bogus": 1}),
    )?;
    let (code, status, _) = raw(
        &h,
        "POST",
        &format!("{base}?fieldValidation=Strict"),
        "application/json",
        strict.clone(),
    )
    .await?;
    ensure!(
        code == 400 && status["message"] == "strict decoding error: unknown field \"bogus\"",
        "strict: {status}"
    );
    let (code, _, warnings) = raw(
        &h,
        "POST",
        &format!("{base}?fieldValidation=Warn"),
        "application/json",
        strict,
    )
    .await?;
    ensure!(
        code == 201
            && warnings
                .iter()
                .any(|w| w.contains("unknown field \\\"bogus\\\"")),
        "warn: {code} {warnings:?}"
    );

    // Nothing that failed was stored: the namespace holds only what succeeded.
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    let names: Vec<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    ensure!(names == ["strict"], "stored after bad input: {names:?}");

    // Objects in a missing namespace are refused with the namespace's NotFound.
    let (code, status, _) = raw(
        &h,
        "POST",
        "/api/v1/namespaces/nowhere/configmaps",
        "application/json",
        serde_json::to_vec(
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "lost"}}),
        )?,
    )
    .await?;
    ensure!(
        code == 404 && status["message"] == "namespaces \"nowhere\" not found",
        "{status}"
    );
    Ok(())
}

#[tokio::test]
async fn subresources_generate_name_and_namespace_lifecycle() -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    let h = start().await?;
    let deployments: Api<Deployment> = Api::namespaced(h.client.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"generateName": "web-"},
        "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": {
            "metadata": {"labels": {"app": "w"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
        "status": {"replicas": 9},
    }))?;
    let created = deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let name = created.metadata.name.clone().context("generated name")?;
    ensure!(
        name.starts_with("web-") && name.len() == "web-".len() + 5,
        "generated {name}"
    );
    // Reset, and written as upstream writes it: an empty value struct.
    ensure!(
        created
            .status
            .clone()
            .unwrap_or_default()
            .replicas
            .is_none(),
        "status is reset on create"
    );
    ensure!(created.metadata.generation == Some(1));

    // Status written through the main resource is ignored; through /status it sticks, and the
    // spec sent with it is ignored.
    let mut via_main = created.clone();
    via_main.status = Some(serde_json::from_value(json!({"replicas": 3}))?);
    let after_main = deployments
        .replace(&name, &PostParams::default(), &via_main)
        .await?;
    ensure!(
        after_main
            .status
            .clone()
            .unwrap_or_default()
            .replicas
            .is_none(),
        "main resource must ignore status"
    );
    let status_patch = json!({"status": {"replicas": 3}, "spec": {"replicas": 7}});
    let after_status = deployments
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status_patch))
        .await?;
    ensure!(
        after_status.status.as_ref().and_then(|s| s.replicas) == Some(3),
        "status subresource writes status"
    );
    ensure!(
        after_status.spec.as_ref().and_then(|s| s.replicas) == Some(1),
        "status subresource ignores spec"
    );
    ensure!(
        after_status.metadata.generation == Some(1),
        "a status write does not bump generation"
    );
    let scaled = deployments
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await?;
    ensure!(
        scaled.metadata.generation == Some(2),
        "a spec change bumps generation"
    );

    // pods/binding sets the node once; a second binding conflicts.
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": {"name": "bound"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))?)
    .await?;
    let binding = serde_json::to_vec(
        &json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"}, "target": {"kind": "Node", "name": "node-a"}}),
    )?;
    let (code, _, _) = raw(
        &h,
        "POST",
        "/api/v1/namespaces/default/pods/bound/binding",
        "application/json",
        binding.clone(),
    )
    .await?;
    ensure!(code == 201, "binding answered {code}");
    ensure!(
        pods.get("bound")
            .await?
            .spec
            .and_then(|s| s.node_name)
            .as_deref()
            == Some("node-a")
    );
    let (code, status, _) = raw(
        &h,
        "POST",
        "/api/v1/namespaces/default/pods/bound/binding",
        "application/json",
        binding,
    )
    .await?;
    ensure!(
        code == 409 && status["reason"] == "Conflict",
        "second binding: {status}"
    );

    // Deleting a bound pod is graceful: it stays, Terminating, until deleted with grace 0.
    pods.delete("bound", &DeleteParams::default()).await?;
    let terminating = pods.get("bound").await?;
    ensure!(
        terminating.metadata.deletion_timestamp.is_some(),
        "bound pod must be Terminating"
    );
    ensure!(terminating.metadata.deletion_grace_period_seconds == Some(30));
    pods.patch(
        "bound",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"still": "here"}}})),
    )
    .await?;
    ensure!(
        pods.get("bound").await.is_ok(),
        "an update must not finish a graceful delete"
    );
    pods.delete("bound", &DeleteParams::default().grace_period(0))
        .await?;
    ensure!(pods.get("bound").await.is_err(), "grace 0 deletes at once");

    // Server-side apply through /status owns status only and leaves labels alone.
    deployments
        .patch(&name, &PatchParams::apply("ctl"), &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"labels": {"owned": "yes"}}})))
        .await?;
    let status_apply =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "status": {"replicas": 2}});
    let after = deployments
        .patch_status(
            &name,
            &PatchParams::apply("ctl").force(),
            &Patch::Apply(status_apply),
        )
        .await?;
    ensure!(
        after
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("owned"))
            .map(String::as_str)
            == Some("yes"),
        "labels lost: {:?}",
        after.metadata.labels
    );
    ensure!(after.status.and_then(|s| s.replicas) == Some(2));

    // The built-in namespaces cannot be deleted.
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    let (code, _, message) = api_status(
        namespaces
            .delete("default", &DeleteParams::default())
            .await
            .err()
            .context("default deleted")?,
    )?;
    ensure!(
        code == 403
            && message == "namespaces \"default\" is forbidden: this namespace may not be deleted",
        "{message}"
    );

    // A terminating namespace takes no new objects, and updating it does not finish it.
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "closing"}}))?,
        )
        .await?;
    namespaces
        .delete("closing", &DeleteParams::default())
        .await?;
    ensure!(
        namespaces
            .get("closing")
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Terminating")
    );
    namespaces
        .patch(
            "closing",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await?;
    ensure!(
        namespaces.get("closing").await.is_ok(),
        "a terminating namespace must wait for its finalizers"
    );
    let in_closing: Api<ConfigMap> = Api::namespaced(h.client.clone(), "closing");
    let (code, reason, message) = api_status(
        in_closing
            .create(&PostParams::default(), &config_map("late", "v"))
            .await
            .expect_err("terminating"),
    )?;
    ensure!(code == 403 && reason == "Forbidden", "{code} {reason}");
    ensure!(
        message.contains(
            "unable to create new content in namespace closing because it is being terminated"
        ),
        "{message}"
    );
    // Clearing spec.finalizers through namespaces/finalize (the namespace controller's last
    // step) removes the namespace.
    let finalize = serde_json::to_vec(&json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "closing"}, "spec": {"finalizers": []},
    }))?;
    let (code, _, _) = raw(
        &h,
        "PUT",
        "/api/v1/namespaces/closing/finalize",
        "application/json",
        finalize,
    )
    .await?;
    ensure!(code == 200, "finalize answered {code}");
    ensure!(
        namespaces.get("closing").await.is_err(),
        "a finalized namespace is gone"
    );
    Ok(())
}

#[tokio::test]
async fn streaming_list_watch_ends_initial_events_with_a_bookmark() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("stream-{i}"), "v"),
        )
        .await?;
    }
    // kube-runtime's streaming lists use sendInitialEvents and wait for the marked bookmark.
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next()).await?? {
            Some(watcher::Event::InitApply(cm)) => initial.extend(cm.metadata.name),
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => anyhow::bail!("watcher ended before the initial events were complete"),
        }
    }
    initial.sort();
    ensure!(
        initial == ["stream-0", "stream-1", "stream-2"],
        "initial events: {initial:?}"
    );
    api.create(&PostParams::default(), &config_map("stream-live", "v"))
        .await?;
    match tokio::time::timeout(Duration::from_secs(10), events.try_next()).await?? {
        Some(watcher::Event::Apply(cm)) => {
            ensure!(cm.metadata.name.as_deref() == Some("stream-live"))
        }
        other => anyhow::bail!("expected the live object, got {other:?}"),
    }
    Ok(())
}

/// The Node authorizer and NodeRestriction: a kubelet reads only what pods bound to it use,
/// and changes only its own Node, its own Lease and its own pods' status.
#[tokio::test]
async fn a_node_reads_only_its_pods_objects_and_changes_only_itself() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Node, Pod, Secret};
    let h = start().await?;
    let admin_secrets: Api<Secret> = Api::namespaced(h.client.clone(), "default");
    for name in ["mounted", "unrelated"] {
        admin_secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": name}, "stringData": {"k": "v"}}),
                )?,
            )
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let pod = |name: &str, node: &str| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "s", "secret": {"secretName": if node == "n1" { "mounted" } else { "unrelated" }}}],
            }}),
        )?)
    };
    pods.create(&PostParams::default(), &pod("on-n1", "n1")?)
        .await?;
    pods.create(&PostParams::default(), &pod("on-n2", "n2")?)
        .await?;
    let nodes: Api<Node> = Api::all(h.client.clone());
    for name in ["n1", "n2"] {
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}}))?,
            )
            .await?;
    }

    let kubelet = h.client_as("system:node:n1", &["system:nodes"]).await?;
    let secrets: Api<Secret> = Api::namespaced(kubelet.clone(), "default");
    secrets
        .get("mounted")
        .await
        .context("n1 reads its pod's secret")?;
    let (code, reason, message) = api_status(
        secrets
            .get("unrelated")
            .await
            .err()
            .context("n1 read another node's secret")?,
    )?;
    ensure!(
        (code, reason.as_str()) == (403, "Forbidden")
            && message
                == "secrets \"unrelated\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\"",
        "{message}"
    );
    ensure!(
        secrets.list(&ListParams::default()).await.is_err(),
        "a node listed all secrets"
    );
    // Upstream's node rules: pods and nodes are readable.
    Api::<Pod>::namespaced(kubelet.clone(), "default")
        .get("on-n2")
        .await?;

    // NodeRestriction: its own Node only, its own pods' status only.
    let kubelet_nodes: Api<Node> = Api::all(kubelet.clone());
    let label = json!({"metadata": {"labels": {"seen": "yes"}}});
    kubelet_nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .context("n1 labels itself")?;
    let (code, _, message) = api_status(
        kubelet_nodes
            .patch("n2", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .err()
            .context("n1 patched n2")?,
    )?;
    ensure!(
        code == 403
            && message
                == "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\"",
        "{message}"
    );
    // NodeRestriction on tokens: only bound to a pod scheduled on this node.
    {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::ServiceAccount;
        let _ = Api::<ServiceAccount>::namespaced(h.client.clone(), "default")
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
            )
            .await;
        let accounts: Api<ServiceAccount> = Api::namespaced(kubelet.clone(), "default");
        let bound_to = |pod: Option<&Pod>| -> anyhow::Result<TokenRequest> {
            let reference = pod.map(|p| {
                json!({"apiVersion": "v1", "kind": "Pod",
                       "name": p.metadata.name, "uid": p.metadata.uid})
            });
            Ok(serde_json::from_value(
                json!({"spec": {"audiences": [], "boundObjectRef": reference}}),
            )?)
        };
        let on_n1 = pods.get("on-n1").await?;
        let on_n2 = pods.get("on-n2").await?;
        let answer = accounts
            .create_token_request("default", &PostParams::default(), &bound_to(Some(&on_n1))?)
            .await
            .context("n1 requests a token bound to its pod")?;
        ensure!(answer.status.is_some_and(|s| !s.token.is_empty()));
        for (request, want) in [
            (bound_to(None)?, "node requested token not bound to a pod"),
            (
                bound_to(Some(&on_n2))?,
                "node requested token bound to a pod scheduled on a different node",
            ),
        ] {
            let (code, _, message) = api_status(
                accounts
                    .create_token_request("default", &PostParams::default(), &request)
                    .await
                    .err()
                    .context("n1 got a token it must not")?,
            )?;
            ensure!(code == 403 && message.contains(want), "{message}");
        }
    }

    let kubelet_pods: Api<Pod> = Api::namespaced(kubelet, "default");
    let status = json!({"status": {"phase": "Running"}});
    kubelet_pods
        .patch_status("on-n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("n1 updates its pod's status")?;
    let (code, _, message) = api_status(
        kubelet_pods
            .patch_status("on-n2", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .err()
            .context("n1 updated n2's pod")?,
    )?;
    ensure!(
        code == 403
            && message
                .contains("can only update pod status for pods with spec.nodeName set to itself"),
        "{message}"
    );
    Ok(())
}

/// Security review, finding 1: no private key is readable in the store's bytes; the tenant
/// record (client CA and service-account keys) is sealed under the key-encryption key.
#[tokio::test]
async fn private_keys_are_sealed_in_the_store() -> anyhow::Result<()> {
    let h = start().await?;
    let record = h
        .storage
        .get("/flotilla/tenants/demo")
        .await?
        .context("tenant record")?;
    ensure!(
        record.value.starts_with(b"k8s:enc:aesgcm:v1:kek-"),
        "the tenant record is not sealed"
    );
    let bytes = std::fs::read(h._dir.path().join("store.redb"))?;
    for secret in [&b"PRIVATE KEY"[..], b"key_pem", b"service_account_key"] {
        ensure!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "{:?} is in the store's bytes",
            String::from_utf8_lossy(secret)
        );
    }
    // The sealed record still serves: a new client certificate of the tenant's CA works.
    let client = h.client_as("someone", &["system:masters"]).await?;
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await?;
    Ok(())
}

/// Security review, finding 2: a deeply nested YAML body is refused at once, and the server
/// keeps answering (it once held a core for minutes on `[` × 1,000,000).
#[tokio::test]
async fn nested_yaml_bodies_are_refused_quickly() -> anyhow::Result<()> {
    let h = start().await?;
    let base = "/api/v1/namespaces/default/configmaps";
    for body in ["[".repeat(1_000_000), "{a: ".repeat(250_000)] {
        let started = std::time::Instant::now();
        let (code, status, _) =
            raw(&h, "POST", base, "application/yaml", body.into_bytes()).await?;
        ensure!(code == 400, "nested yaml: {code} {status}");
        // Minutes before the fix; a loose bound, not a benchmark.
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "refused after {:?}",
            started.elapsed()
        );
    }
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    api.create(&PostParams::default(), &config_map("after", "ok"))
        .await?;
    Ok(())
}

/// Security review, finding 3: JSON patches are bounded as upstream's — at most 10,000
/// operations (413), and `copy` may add at most 3 MiB in all (422), even in a dry run.
#[tokio::test]
async fn json_patch_copies_and_operations_are_bounded() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    let mut seed = config_map("copied", "x");
    seed.metadata.annotations = Some([("a".to_string(), "b".repeat(4096))].into());
    api.create(&PostParams::default(), &seed).await?;
    let path = "/api/v1/namespaces/default/configmaps/copied";
    let copies: Vec<Value> = (0..24)
        .map(|i| json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/c{i}")}))
        .collect();
    let (code, status, _) = raw(
        &h,
        "PATCH",
        &format!("{path}?dryRun=All"),
        "application/json-patch+json",
        serde_json::to_vec(&copies)?,
    )
    .await?;
    ensure!(
        code == 422 && status["reason"] == "Invalid",
        "copies: {status}"
    );
    ensure!(
        status
            .to_string()
            .contains("accumulated size increase of copy"),
        "copies: {status}"
    );
    let many = vec![json!({"op": "test", "path": "/data/value", "value": "x"}); 10_001];
    let (code, status, _) = raw(
        &h,
        "PATCH",
        path,
        "application/json-patch+json",
        serde_json::to_vec(&many)?,
    )
    .await?;
    ensure!(
        code == 413
            && status["message"]
                == "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001",
        "operations: {status}"
    );
    ensure!(
        api.get("copied").await?.data == seed.data,
        "nothing changed"
    );
    Ok(())
}

/// Security review, finding 5: ConfigMap and Secret data over 1 MiB are invalid, and no
/// stored object may pass etcd's 1.5 MiB, on either backend.
#[tokio::test]
async fn object_sizes_are_limited_as_upstream() -> anyhow::Result<()> {
    use base64::Engine;
    let h = start().await?;
    let mib = 1024 * 1024;
    let configmap = |name: &str, value: String| {
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"v": value}}))
    };
    let (code, status, _) = raw(
        &h,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        configmap("big", "x".repeat(mib + 1))?,
    )
    .await?;
    ensure!(
        code == 422
            && status["message"]
                .as_str()
                .is_some_and(|m| m.contains("Too long: must have at most 1048576 bytes")),
        "configmap: {status}"
    );
    let secret = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "big"},
        "data": {"v": base64::engine::general_purpose::STANDARD.encode(vec![7u8; mib + 1])}}))?;
    let (code, status, _) = raw(
        &h,
        "POST",
        "/api/v1/namespaces/default/secrets",
        "application/json",
        secret,
    )
    .await?;
    ensure!(
        code == 422
            && status["message"]
                .as_str()
                .is_some_and(|m| m.contains("data: Too long: must have at most 1048576 bytes")),
        "secret: {status}"
    );
    // 1 MiB of quotes is valid data, but stored as JSON it takes 2 MiB: over etcd's limit.
    let (code, status, _) = raw(
        &h,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        configmap("quoted", "\"".repeat(mib - 16))?,
    )
    .await?;
    ensure!(
        code == 500 && status["message"] == "etcdserver: request is too large",
        "stored size: {code} {status}"
    );
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    ensure!(
        api.list(&ListParams::default()).await?.items.is_empty(),
        "nothing stored"
    );
    Ok(())
}

/// Security review, finding 6: a connection that never finishes its TLS handshake, or
/// trickles its request headers, is closed; one address may hold only so many connections
/// that have sent no request. (Short limits here; the defaults are upstream's 10 s and 32 s.)
#[tokio::test]
async fn unauthenticated_connections_are_bounded() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir()?;
    let storage: Arc<dyn Storage> = Arc::new(EmbeddedStorage::open(dir.path().join("s.redb"))?);
    let limits = flotilla_apiserver::serve::ConnectionLimits {
        handshake_timeout: Duration::from_secs(1),
        header_read_timeout: Duration::from_secs(1),
        max_unauthenticated_per_address: 3,
        ..Default::default()
    };
    let server = LocalServer::start_with_limits(storage, "demo", limits).await?;
    let address = server.address;
    // Reads until the server closes the connection; how long that took.
    async fn closed_after<S: tokio::io::AsyncRead + Unpin>(mut stream: S) -> Option<Duration> {
        let started = std::time::Instant::now();
        let mut buf = [0u8; 256];
        let read = async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .ok()
            .map(|()| started.elapsed())
    }

    // Silent after connecting: closed at the handshake timeout.
    let silent = tokio::net::TcpStream::connect(address).await?;
    ensure!(
        closed_after(silent).await.is_some(),
        "a silent connection stayed open"
    );

    // Three silent connections fill this address's allowance; a fourth is closed at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(address).await?);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fourth = tokio::net::TcpStream::connect(address).await?;
    let after = closed_after(fourth)
        .await
        .context("the fourth stayed open")?;
    ensure!(
        after < Duration::from_millis(900),
        "closed only after {after:?}"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Headers trickled after a good handshake: closed at the header timeout.
    let kubeconfig: Value = serde_yaml::from_str(&server.kubeconfig)?;
    let ca = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .context("ca")?,
    )?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&ca) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let mut tls = connector
        .connect(
            rustls_pki_types::ServerName::try_from("127.0.0.1")?.to_owned(),
            tcp,
        )
        .await?;
    tls.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n")
        .await?;
    let trickle = async {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if tls.write_all(b"X-Slow: 1\r\n").await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(8), trickle).await;
    ensure!(
        closed_after(tls).await.is_some(),
        "a connection trickling headers stayed open"
    );
    let _ = server.stop().await;
    Ok(())
}

/// Security review, finding 9: percent-escaped path segments name what they decode to.
#[tokio::test]
async fn escaped_paths_answer_as_upstream() -> anyhow::Result<()> {
    let h = start().await?;
    let api: Api<ConfigMap> = Api::namespaced(h.client.clone(), "default");
    api.create(&PostParams::default(), &config_map("secret-a-1", "v"))
        .await?;
    let (code, object, _) = raw(
        &h,
        "GET",
        "/api/v1/namespaces/default/configmaps/secret%2Da%2D1",
        "application/json",
        Vec::new(),
    )
    .await?;
    ensure!(
        code == 200 && object["metadata"]["name"] == "secret-a-1",
        "escaped path: {code} {object}"
    );
    Ok(())
}

/// Discovery and OpenAPI documents carry an ETag and answer 304 to a request naming it, as
/// upstream's do (kubectl's discovery cache revalidates this way); another tag gets the
/// document again.
#[tokio::test]
async fn discovery_and_openapi_documents_revalidate_with_etags() -> anyhow::Result<()> {
    let h = start().await?;
    for (path, accept) in [
        (
            "/apis",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        ),
        ("/api/v1", "application/json"),
        (
            "/openapi/v2",
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        ),
        ("/openapi/v3/apis/apps/v1", "application/json"),
    ] {
        let get = |tag: Option<&str>| {
            let mut request = http::Request::builder().uri(path).header("accept", accept);
            if let Some(tag) = tag {
                request = request.header("if-none-match", tag);
            }
            request.body(kube::client::Body::empty())
        };
        let first = h.client.send(get(None)?).await?;
        anyhow::ensure!(first.status() == 200, "{path}: {}", first.status());
        let etag = first
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("{path} has no ETag"))?;
        let again = h.client.send(get(Some(&etag))?).await?;
        anyhow::ensure!(
            again.status() == 304,
            "{path} with its ETag: {}",
            again.status()
        );
        let body = again.into_body().collect().await?.to_bytes();
        anyhow::ensure!(body.is_empty(), "a 304 has no body");
        let other = h.client.send(get(Some("\"stale\""))?).await?;
        anyhow::ensure!(
            other.status() == 200,
            "{path} with another tag: {}",
            other.status()
        );
    }
    Ok(())
}

/// Boolean query parameters read as upstream reads them: `watch=True` (what the Python client
/// sends) and a bare `watch` stream events; `watch=False` and `watch=0` list.
#[tokio::test]
async fn boolean_query_parameters_read_as_upstream() -> anyhow::Result<()> {
    let h = start().await?;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(h.client.clone(), "default");
    api.create(&kube::api::PostParams::default(), &config_map("seen", "1"))
        .await?;
    for (query, streams) in [
        ("watch=True", true),
        ("watch", true),
        ("watch=1", true),
        ("watch=False", false),
        ("watch=0", false),
    ] {
        let request = http::Request::builder()
            .uri(format!(
                "/api/v1/namespaces/default/configmaps?{query}&timeoutSeconds=1"
            ))
            .header("accept", "application/json")
            .body(kube::client::Body::empty())?;
        let response = h.client.send(request).await?;
        anyhow::ensure!(response.status() == 200, "{query}: {}", response.status());
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body);
        let watched = text.contains(r#""type":"ADDED""#);
        let listed = text.contains(r#""kind":"ConfigMapList""#);
        anyhow::ensure!(
            watched == streams && listed != streams,
            "{query}: streamed {watched}, listed {listed}: {text}"
        );
    }
    Ok(())
}

/// Health endpoints as upstream's: `ok`, each check with `?verbose`, one check by name, a
/// check left out with `?exclude=`, 404 for a check that does not exist.
#[tokio::test]
async fn health_checks_are_listed_named_and_excluded() -> anyhow::Result<()> {
    let h = start().await?;
    let get = |path: &str| -> anyhow::Result<http::Request<kube::client::Body>> {
        Ok(http::Request::builder()
            .uri(path)
            .body(kube::client::Body::empty())?)
    };
    let text = |response: http::Response<kube::client::Body>| async move {
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    let (status, body) = text(h.client.send(get("/readyz")?).await?).await?;
    anyhow::ensure!(status == 200 && body == "ok", "readyz: {status} {body}");
    let (status, body) = text(h.client.send(get("/livez?verbose")?).await?).await?;
    anyhow::ensure!(
        status == 200
            && body.contains("[+]ping ok")
            && body.contains("[+]etcd ok")
            && body.ends_with("livez check passed\n"),
        "livez?verbose: {status} {body}"
    );
    let (status, body) = text(h.client.send(get("/readyz/etcd")?).await?).await?;
    anyhow::ensure!(
        status == 200 && body == "ok",
        "readyz/etcd: {status} {body}"
    );
    let (status, body) = text(h.client.send(get("/readyz?verbose&exclude=etcd")?).await?).await?;
    anyhow::ensure!(
        status == 200 && body.contains("[+]etcd excluded: ok"),
        "exclude: {status} {body}"
    );
    let (status, _) = text(h.client.send(get("/readyz/nosuch")?).await?).await?;
    anyhow::ensure!(status == 404, "an unknown check: {status}");
    Ok(())
}

/// A new Service carries upstream's empty status, `{"loadBalancer":{}}`, as Go's encoder
/// always writes it.
#[tokio::test]
async fn a_new_service_has_an_empty_load_balancer_status() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Service;
    let h = start().await?;
    let api: kube::Api<Service> = kube::Api::namespaced(h.client.clone(), "default");
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}},
    }))?;
    api.create(&kube::api::PostParams::default(), &service)
        .await?;
    let (code, body, _) = raw(
        &h,
        "GET",
        "/api/v1/namespaces/default/services/web",
        "application/json",
        Vec::new(),
    )
    .await?;
    anyhow::ensure!(
        code == 200 && body["status"] == serde_json::json!({"loadBalancer": {}}),
        "{code} {body}"
    );
    Ok(())
}
