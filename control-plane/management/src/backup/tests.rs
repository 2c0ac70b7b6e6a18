//! Backup and restore against a real embedded store and the API server's tenants, in
//! process: what a restore writes, where, with which credentials, and that a refused one
//! writes nothing.

use std::sync::Arc;

use flotilla_apiserver::ApiServer;
use flotilla_storage::{EmbeddedStorage, Storage};
use serde_json::json;

use super::*;
use crate::PublicEndpoint;

const ACCOUNT: &str = "acme";
const SERVING_CA: &str = "-----BEGIN CERTIFICATE-----\nthis service\n-----END CERTIFICATE-----\n";
const SECRET_VALUE: &str = "hunter2-never-in-clear";

struct Fixture {
    management: Arc<Management>,
    storage: Arc<dyn Storage>,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let storage: Arc<dyn Storage> =
        Arc::new(EmbeddedStorage::open(dir.path().join("store.redb")).expect("embedded store"));
    let api = ApiServer::new(storage.clone(), "127.0.0.1:6443").expect("server");
    let management = Management::new(
        api,
        PublicEndpoint {
            base_url: "https://127.0.0.1:6443".into(),
            ca_pem: SERVING_CA.into(),
        },
    );
    Fixture {
        management,
        storage,
        _dir: dir,
    }
}

async fn active_cluster(service: &Fixture, name: &str) -> Cluster {
    let m = &service.management;
    m.ensure_account(ACCOUNT).await.expect("account");
    let request: CreateClusterRequest =
        serde_json::from_value(json!({"name": name, "tags": {"team": "infra"}})).expect("request");
    m.create_cluster(ACCOUNT, request).await.expect("create");
    settle(service, name).await
}

/// Runs the reconciler until `name` is `ACTIVE`.
async fn settle(service: &Fixture, name: &str) -> Cluster {
    for _ in 0..10 {
        service.management.reconcile_all().await.expect("reconcile");
        let (cluster, _) = service
            .management
            .cluster_record(ACCOUNT, name)
            .await
            .expect("cluster");
        if cluster.status == ClusterStatus::Active {
            return cluster;
        }
    }
    panic!("cluster {name} did not become ACTIVE");
}

/// Every key under `prefix` with its value.
async fn keys(storage: &Arc<dyn Storage>, prefix: &str) -> Vec<(String, Vec<u8>)> {
    storage
        .range(RangeRequest {
            prefix: prefix.into(),
            ..Default::default()
        })
        .await
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value.to_vec()))
        .collect()
}

async fn put(storage: &Arc<dyn Storage>, key: &str, value: serde_json::Value) {
    storage
        .create(key, Bytes::from(value.to_string()))
        .await
        .expect("create");
}

/// A cluster with a ConfigMap, a Secret and a node pool.
async fn populated(service: &Fixture) -> Cluster {
    let cluster = active_cluster(service, "prod").await;
    let prefix = Tenant::new(&cluster.id).key_prefix;
    put(
        &service.storage,
        &format!("{prefix}core/configmaps/default/settings"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "default", "uid": "u-1"}, "data": {"mode": "fast"}}),
    )
    .await;
    use base64::Engine;
    put(
        &service.storage,
        &format!("{prefix}core/secrets/default/db"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "default"}, "data": {"password": BASE64.encode(SECRET_VALUE)}}),
    )
    .await;
    let pool: CreateNodePoolRequest =
        serde_json::from_value(json!({"name": "workers"})).expect("pool request");
    service
        .management
        .create_node_pool(ACCOUNT, "prod", pool)
        .await
        .expect("pool");
    cluster
}

async fn tenant_record(service: &Fixture, id: &str) -> TenantRecord {
    let key = Tenants::record_key(id);
    let kv = service
        .storage
        .get(&key)
        .await
        .expect("get")
        .expect("record");
    service
        .management
        .api
        .tenants
        .open_record(&key, &kv.value)
        .expect("open")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[test]
fn service_objects_are_put_right_for_this_service() {
    assert_eq!(
        for_this_service("core/endpoints/default/kubernetes", b"{}", SERVING_CA),
        Fixup::Drop
    );
    let root = json!({"kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "old"}});
    let Fixup::Replace(value) = for_this_service(
        "core/configmaps/team-a/kube-root-ca.crt",
        root.to_string().as_bytes(),
        SERVING_CA,
    ) else {
        panic!("the root CA is replaced");
    };
    let value: serde_json::Value = serde_json::from_slice(&value).expect("JSON");
    assert_eq!(value["data"]["ca.crt"], SERVING_CA);
    // Field order is kept (the store answers in the order it holds).
    assert!(
        serde_json::to_string(&value)
            .expect("text")
            .starts_with("{\"kind\"")
    );
    let same = json!({"data": {"ca.crt": SERVING_CA}}).to_string();
    assert_eq!(
        for_this_service(
            "core/configmaps/a/kube-root-ca.crt",
            same.as_bytes(),
            SERVING_CA
        ),
        Fixup::Keep
    );
    assert_eq!(
        for_this_service(
            "core/configmaps/a/settings",
            root.to_string().as_bytes(),
            SERVING_CA
        ),
        Fixup::Keep
    );
}

#[tokio::test]
async fn a_copy_gets_a_new_id_every_object_under_it_and_credentials_of_its_own() {
    let service = fixture();
    let m = &service.management;
    let original = populated(&service).await;
    let backup = m.backup_cluster(ACCOUNT, "prod").await.expect("backup");
    let header = &backup.header;
    assert_eq!(header.cluster.id, original.id);
    assert!(header.objects > 2, "{header:?}");
    assert_eq!(header.resources.get("secrets"), Some(&1));
    // Sealed: no private key, no secret and no value in clear (keys are, as etcd's are).
    for needle in ["PRIVATE KEY", SECRET_VALUE, "\"mode\"", "fast"] {
        assert!(
            !contains(&backup.bytes, needle),
            "{needle:?} is in the file"
        );
    }
    use base64::Engine;
    assert!(!contains(&backup.bytes, &BASE64.encode(SECRET_VALUE)));

    let copy = m
        .restore_cluster(ACCOUNT, "copy", &backup.bytes)
        .await
        .expect("restore");
    assert!(copy.id.starts_with("copy-") && copy.id != original.id);
    assert_eq!(
        copy.endpoint,
        format!("https://127.0.0.1:6443/clusters/{}", copy.id)
    );
    assert_eq!(copy.tags, original.tags);
    assert_eq!(
        copy.restored_from.as_ref().map(|r| r.revision),
        Some(header.revision)
    );
    let copy = settle(&service, "copy").await;

    let old_prefix = Tenant::new(&original.id).key_prefix;
    let new_prefix = Tenant::new(&copy.id).key_prefix;
    let old = keys(&service.storage, &old_prefix).await;
    let new = keys(&service.storage, &new_prefix).await;
    let relative = |all: &[(String, Vec<u8>)], prefix: &str| -> Vec<String> {
        all.iter()
            .filter_map(|(key, _)| key.strip_prefix(prefix).map(String::from))
            .collect()
    };
    assert_eq!(relative(&old, &old_prefix), relative(&new, &new_prefix));
    let secret = new
        .iter()
        .find(|(key, _)| key.ends_with("core/secrets/default/db"))
        .expect("the secret is restored");
    assert_eq!(
        Some(secret),
        old.iter()
            .find(|(key, _)| key.ends_with("core/secrets/default/db"))
            .map(|(key, value)| (key.replace(&old_prefix, &new_prefix), value.clone()))
            .as_ref(),
        "restored byte for byte"
    );
    // Its own CA and signing key, published where kubelets read them.
    let (a, b) = (
        tenant_record(&service, &original.id).await,
        tenant_record(&service, &copy.id).await,
    );
    assert_ne!(a.client_ca, b.client_ca);
    assert_ne!(a.service_account_key, b.service_account_key);
    let published = new
        .iter()
        .find(|(key, _)| {
            key.ends_with("core/configmaps/kube-system/extension-apiserver-authentication")
        })
        .expect("published");
    assert!(contains(
        &published.1,
        &b.client_ca.cert_pem.replace('\n', "\\n")
    ));
    // The pool came along, for the copy.
    let pools = keys(&service.storage, &pools_prefix(ACCOUNT, "copy")).await;
    assert_eq!(pools.len(), 1);
    assert!(
        keys(&service.storage, &format!("{ROOT}restores/"))
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn the_same_name_brings_back_the_same_id_and_credentials() {
    let service = fixture();
    let m = &service.management;
    let original = populated(&service).await;
    let before = tenant_record(&service, &original.id).await;
    let backup = m.backup_cluster(ACCOUNT, "prod").await.expect("backup");

    // While it exists, under its own name: refused, and nothing is written.
    let revision = service.storage.current_revision().await.expect("revision");
    let err = m
        .restore_cluster(ACCOUNT, "prod", &backup.bytes)
        .await
        .expect_err("the name exists");
    assert_eq!(err.status, StatusCode::CONFLICT, "{err}");
    assert_eq!(
        service.storage.current_revision().await.expect("revision"),
        revision,
        "nothing was written"
    );
    // Another account's restore, even under the same name, is a copy: credentials stay with
    // their account.
    m.ensure_account("other").await.expect("account");
    let theirs = m
        .restore_cluster("other", "prod", &backup.bytes)
        .await
        .expect("a copy in another account");
    assert_ne!(theirs.id, original.id);
    assert_ne!(
        tenant_record(&service, &theirs.id).await.client_ca,
        before.client_ca
    );

    m.delete_cluster(ACCOUNT, "prod").await.expect("delete");
    m.reconcile_all().await.expect("reconcile");
    assert!(
        keys(&service.storage, &Tenant::new(&original.id).key_prefix)
            .await
            .is_empty()
    );
    let restored = m
        .restore_cluster(ACCOUNT, "prod", &backup.bytes)
        .await
        .expect("restore");
    assert_eq!(restored.id, original.id);
    settle(&service, "prod").await;
    let after = tenant_record(&service, &original.id).await;
    assert_eq!(before.client_ca, after.client_ca);
    assert_eq!(before.service_account_key, after.service_account_key);
    assert_eq!(before.front_proxy_ca, after.front_proxy_ca);
    let secret = service
        .storage
        .get(&format!(
            "{}core/secrets/default/db",
            Tenant::new(&original.id).key_prefix
        ))
        .await
        .expect("get");
    assert!(secret.is_some());

    // A tenant left without its record (a deletion half done) keeps its id taken.
    service
        .storage
        .delete(&cluster_key(ACCOUNT, "prod"), None)
        .await
        .expect("delete the record");
    let revision = service.storage.current_revision().await.expect("revision");
    let err = m
        .restore_cluster(ACCOUNT, "prod", &backup.bytes)
        .await
        .expect_err("the id is in use");
    assert_eq!(err.status, StatusCode::CONFLICT, "{err}");
    assert!(err.message.contains("another name"), "{err}");
    assert_eq!(
        service.storage.current_revision().await.expect("revision"),
        revision,
        "nothing was written"
    );
}

#[tokio::test]
async fn a_bad_file_is_refused_with_one_line_and_writes_nothing() {
    let service = fixture();
    let m = &service.management;
    populated(&service).await;
    let backup = m.backup_cluster(ACCOUNT, "prod").await.expect("backup");
    let revision = service.storage.current_revision().await.expect("revision");
    let mut flipped = backup.bytes.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 1;
    let half = &backup.bytes[..backup.bytes.len() / 2];
    let other = fixture();
    let foreign = other
        .management
        .restore_cluster(ACCOUNT, "x", &backup.bytes)
        .await
        .expect_err("another key-encryption key");
    assert!(
        foreign.message.contains("--key-encryption-key-file"),
        "{foreign}"
    );
    for (file, expected) in [
        (&flipped[..], "the backup is corrupted"),
        (half, "the backup is truncated"),
        (b"hello\n".as_slice(), "not a Flotilla cluster backup"),
    ] {
        let err = m
            .restore_cluster(ACCOUNT, "copy", file)
            .await
            .expect_err("refused");
        assert_eq!(err.status, StatusCode::BAD_REQUEST, "{err}");
        assert!(err.message.starts_with(expected), "{err}");
        assert!(!err.message.contains('\n'), "{err}");
    }
    // Authentic bytes under a recomputed checksum: the seal says it was altered.
    let (header, payload) = format::read_header(&backup.bytes).expect("header");
    let mut tampered = payload.to_vec();
    let dropped = tampered
        .iter()
        .rposition(|b| *b == b'\n')
        .and_then(|end| tampered[..end].iter().rposition(|b| *b == b'\n'))
        .expect("two lines");
    tampered.truncate(dropped + 1);
    let header = format::Header {
        entries: header.entries - 1,
        objects: header.objects - 1,
        payload_bytes: tampered.len() as u64,
        payload_sha256: format::sha256_hex(&tampered),
        ..header
    };
    let err = m
        .restore_cluster(ACCOUNT, "copy", &format::assemble(&header, &tampered))
        .await
        .expect_err("altered");
    assert!(err.message.contains("altered"), "{err}");
    assert_eq!(
        service.storage.current_revision().await.expect("revision"),
        revision,
        "nothing was written"
    );
}

#[test]
fn the_openapi_document_describes_both_operations() {
    let document = &*crate::openapi::DOCUMENT;
    let backup = &document["paths"]["/v1/clusters/{name}/backup"]["get"];
    assert_eq!(
        backup["responses"]["200"]["content"]["application/octet-stream"]["schema"]["format"],
        "binary"
    );
    let restore = &document["paths"]["/v1/clusters/{name}/restore"]["post"];
    assert_eq!(
        restore["requestBody"]["content"]["application/octet-stream"]["schema"]["type"],
        "string"
    );
    assert_eq!(
        restore["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["cluster"]
            ["$ref"],
        "#/components/schemas/Cluster"
    );
    let cluster = &document["components"]["schemas"]["Cluster"]["properties"];
    assert!(cluster["restoredFrom"].is_object(), "{cluster}");
}

#[tokio::test]
async fn the_routes_answer_the_file_and_take_it_back() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let service = fixture();
    let m = &service.management;
    populated(&service).await;
    let key = m.issue_api_key(ACCOUNT).await.expect("key").api_key;
    let call = |method: &str, path: &str, body: Vec<u8>| {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::AUTHORIZATION, format!("Bearer {key}"))
            .body(Body::from(body))
            .expect("request");
        let router = m.router();
        async move {
            let response = router.oneshot(request).await.expect("answer");
            let status = response.status();
            let content_type = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (status, content_type, body)
        }
    };
    let (status, content_type, file) = call("GET", "/v1/clusters/prod/backup", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, format::MEDIA_TYPE);
    format::read(&file).expect("a whole backup");

    let (status, _, body) = call("POST", "/v1/clusters/copy/restore", b"{}\n".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(error["code"], "InvalidParameterException");

    let (status, _, body) = call("POST", "/v1/clusters/copy/restore", file.to_vec()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(answer["cluster"]["status"], "CREATING");
    assert_eq!(answer["cluster"]["restoredFrom"]["clusterName"], "prod");
    let (status, _, _) = call("POST", "/v1/clusters/copy/restore", file.to_vec()).await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn a_restore_that_fails_midway_leaves_nothing() {
    let service = fixture();
    let m = &service.management;
    populated(&service).await;
    let backup = m.backup_cluster(ACCOUNT, "prod").await.expect("backup");
    let before = keys(&service.storage, "/").await.len();
    let contents = m.open_backup(&backup.bytes).expect("contents");
    let plan = m.plan_restore(ACCOUNT, "copy", contents).expect("plan");
    m.check_free(&plan).await.expect("free");
    // Another writer puts one of the keys there first: the restore stops and undoes itself.
    let (key, value) = plan.objects[plan.objects.len() / 2].clone();
    service.storage.create(&key, value).await.expect("create");
    let mut written = Written::default();
    let err = m
        .write_restore(&plan, &mut written)
        .await
        .expect_err("a key was taken");
    assert_eq!(err.status, StatusCode::CONFLICT, "{err}");
    m.undo_restore(&plan, &written).await;
    assert_eq!(keys(&service.storage, "/").await.len(), before);
    assert!(
        keys(&service.storage, &Tenant::new(&plan.id).key_prefix)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_restore_whose_replica_stopped_fails_and_its_deletion_removes_it() {
    let service = fixture();
    let m = &service.management;
    populated(&service).await;
    let backup = m.backup_cluster(ACCOUNT, "prod").await.expect("backup");
    let contents = m.open_backup(&backup.bytes).expect("contents");
    let mut plan = m.plan_restore(ACCOUNT, "copy", contents).expect("plan");
    plan.cluster.created_at = "2020-01-01T00:00:00Z".into();
    // What a replica killed midway leaves: the record, the claim and some objects.
    let record_key = cluster_key(ACCOUNT, "copy");
    service
        .storage
        .create(
            &record_key,
            m.seal(&record_key, &plan.cluster).expect("seal"),
        )
        .await
        .expect("record");
    let claim_key = restore_claim_key(&plan.id);
    let claim = RestoreClaim {
        account_id: ACCOUNT.into(),
        cluster: "copy".into(),
    };
    service
        .storage
        .create(&claim_key, m.seal(&claim_key, &claim).expect("seal"))
        .await
        .expect("claim");
    for (key, value) in plan.objects.iter().take(10) {
        service
            .storage
            .create(key, value.clone())
            .await
            .expect("object");
    }
    m.reconcile_all().await.expect("reconcile");
    let (cluster, _) = m.cluster_record(ACCOUNT, "copy").await.expect("record");
    assert_eq!(cluster.status, ClusterStatus::Failed);
    assert!(
        cluster
            .status_reason
            .is_some_and(|r| r.contains("restore did not finish"))
    );
    m.delete_cluster(ACCOUNT, "copy").await.expect("delete");
    m.reconcile_all().await.expect("reconcile");
    assert!(m.cluster_record(ACCOUNT, "copy").await.is_err());
    assert!(
        keys(&service.storage, &Tenant::new(&plan.id).key_prefix)
            .await
            .is_empty()
    );
    assert!(
        service
            .storage
            .get(&claim_key)
            .await
            .expect("get")
            .is_none()
    );
}
