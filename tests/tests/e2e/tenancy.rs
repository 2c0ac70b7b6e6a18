//! The hosted service end to end: `flotilla serve` on real etcd, clusters made through the
//! management API with the `flotilla` CLI, stock kubectl per cluster, and every way one
//! tenant or account could reach another's data refused.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine;
use flotilla_e2e::{Backend, Etcd, Flotilla, FlotillaCli, Kubectl, Serve};
use serde_json::{Value, json};

use crate::contains;

/// A cluster made through the CLI: its id and an admin kubeconfig.
pub(crate) struct Cluster {
    pub(crate) id: String,
    pub(crate) kubectl: Kubectl,
}

pub(crate) fn create_cluster(
    service: &Serve,
    account: &FlotillaCli,
    name: &str,
) -> anyhow::Result<Cluster> {
    let table = account.ok(&["cluster", "create", name, "--tag", "team=e2e", "--wait"])?;
    contains(&table, "ACTIVE")?;
    let described: Value =
        serde_json::from_str(&account.ok(&["cluster", "get", name, "-o", "json"])?)?;
    let id = described["id"].as_str().context("cluster id")?.to_string();
    ensure!(described["status"] == "ACTIVE", "{described}");
    // As EKS: the endpoint's CA and an OIDC issuer whose documents anyone can fetch.
    let issuer = described["identity"]["oidc"]["issuer"]
        .as_str()
        .context("identity.oidc.issuer")?;
    let ca = service.dir().join(format!("{id}-ca.pem"));
    std::fs::write(
        &ca,
        base64::engine::general_purpose::STANDARD.decode(
            described["certificateAuthority"]["data"]
                .as_str()
                .context("certificateAuthority.data")?,
        )?,
    )?;
    let fetch = |path: &str| -> anyhow::Result<Value> {
        let out = Command::new("curl")
            .args(["-sS", "--fail", "--cacert"])
            .arg(&ca)
            .arg(format!("{issuer}{path}"))
            .output()?;
        ensure!(
            out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let discovery = fetch("/.well-known/openid-configuration")?;
    ensure!(discovery["issuer"] == issuer, "{discovery}");
    ensure!(fetch("/openid/v1/jwks")?["keys"][0]["alg"] == "ES256");
    let kubeconfig = service.dir().join(format!("{id}.kubeconfig"));
    account.ok(&[
        "cluster",
        "kubeconfig",
        name,
        "--file",
        kubeconfig.to_str().context("path")?,
    ])?;
    Ok(Cluster {
        id,
        kubectl: Kubectl::new(&kubeconfig),
    })
}

/// `curl` against the management API: (HTTP status, body).
fn management_call(
    cli: &FlotillaCli,
    method: &str,
    path: &str,
    body: Option<&Value>,
    authenticated: bool,
) -> anyhow::Result<(u16, Value)> {
    let settings = cli.settings()?;
    let ca = cli.config.with_extension("ca.pem");
    std::fs::write(&ca, settings["caPem"].as_str().context("caPem")?)?;
    let url = format!(
        "{}{path}",
        settings["endpoint"].as_str().context("endpoint")?
    );
    let mut command = Command::new("curl");
    command
        .args(["-sS", "--cacert"])
        .arg(&ca)
        .args(["-X", method, "-w", "\n%{http_code}"]);
    if authenticated {
        let key = settings["apiKey"].as_str().context("apiKey")?;
        command.args(["-H", &format!("Authorization: Bearer {key}")]);
    }
    if let Some(body) = body {
        command.args([
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
        ]);
    }
    let out = command.arg(&url).output().context("running curl")?;
    ensure!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let (body, status) = text.rsplit_once('\n').context("curl output")?;
    let body = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).with_context(|| format!("not JSON: {body}"))?
    };
    Ok((status.parse()?, body))
}

/// Replaces the `start` key of a continue token.
fn forge_continue(token: &str, start: &str) -> anyhow::Result<String> {
    let engine = base64::engine::general_purpose::URL_SAFE;
    let mut decoded: Value = serde_json::from_slice(&engine.decode(token)?)?;
    decoded["start"] = json!(start);
    Ok(engine.encode(serde_json::to_vec(&decoded)?))
}

#[test]
fn clusters_are_isolated_from_each_other_and_from_other_accounts() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start(&etcd.endpoint)?;
    let x = service.account("x")?;
    let y = service.account("y")?;

    // Two clusters of account X, each with its own API.
    let a = create_cluster(&service, &x, "a")?;
    let b = create_cluster(&service, &x, "b")?;
    let listed = x.ok(&["cluster", "list"])?;
    contains(&listed, &format!("/clusters/{}", a.id))?;
    contains(&listed, &format!("/clusters/{}", b.id))?;
    contains(&x.ok(&["cluster", "list", "-o", "yaml"])?, "team: e2e")?;

    // Each sees only its own objects.
    for i in 0..3 {
        a.kubectl
            .ok(&["create", "configmap", &format!("only-in-a-{i}")])?;
    }
    b.kubectl
        .ok(&["create", "configmap", "only-in-b", "--from-literal=k=v"])?;
    contains(
        &b.kubectl.fails(&["get", "configmap", "only-in-a-0"])?,
        "NotFound",
    )?;
    let b_all = b.kubectl.ok(&["get", "configmaps", "-A"])?;
    ensure!(
        !b_all.contains("only-in-a"),
        "B lists A's objects:\n{b_all}"
    );
    let a_all = a.kubectl.ok(&["get", "configmaps", "-A"])?;
    ensure!(
        !a_all.contains("only-in-b"),
        "A lists B's objects:\n{a_all}"
    );
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        contains(&a.kubectl.ok(&["get", "ns"])?, ns)?;
    }

    // kubectl get --raw drops the URL's /clusters/{id}: the certificate picks the cluster.
    contains(
        &a.kubectl.ok(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps/only-in-a-0",
        ])?,
        "\"name\":\"only-in-a-0\"",
    )?;
    contains(
        &b.kubectl.fails(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps/only-in-a-0",
        ])?,
        "NotFound",
    )?;

    // A's admin certificate on B's path: 401, as kubectl reports it.
    let a_config = std::fs::read_to_string(&a.kubectl.kubeconfig)?;
    let crossed_path = service.dir().join("a-creds-on-b.kubeconfig");
    std::fs::write(
        &crossed_path,
        a_config.replace(
            &format!("/clusters/{}", a.id),
            &format!("/clusters/{}", b.id),
        ),
    )?;
    let crossed = Kubectl::new(&crossed_path);
    contains(
        &crossed.fails(&["get", "configmaps"])?,
        "You must be logged in to the server (Unauthorized)",
    )?;
    let (status, body) = crossed.raw_get("/api/v1/namespaces/default/configmaps/only-in-b")?;
    ensure!(
        status == 401 && body.contains("\"reason\":\"Unauthorized\"") && !body.contains("\"data\""),
        "A's certificate on B's object: {status} {body}"
    );

    // A's service-account token and bootstrap token: accepted on A's path, 401 on B's.
    contains(&a.kubectl.ok(&["auth", "whoami"])?, "kubernetes-admin")?;
    a.kubectl.ok(&["create", "serviceaccount", "robot"])?;
    let jwt = a
        .kubectl
        .ok(&["create", "token", "robot"])?
        .trim()
        .to_string();
    a.kubectl.ok_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: Secret\nmetadata: {name: bootstrap-token-abcdef, namespace: kube-system}\n\
         type: bootstrap.kubernetes.io/token\nstringData: {token-id: abcdef, token-secret: 0123456789abcdef, usage-bootstrap-authentication: \"true\"}\n",
    )?;
    // The admin token of `flotilla cluster token` (kubectl's exec plugin, as EKS's): A only.
    let exec_config = service.dir().join("a-exec.kubeconfig");
    x.ok(&[
        "cluster",
        "kubeconfig",
        "a",
        "--exec",
        "--file",
        exec_config.to_str().context("path")?,
    ])?;
    let via_exec = Kubectl::new(&exec_config);
    contains(&via_exec.ok(&["auth", "whoami"])?, "kubernetes-admin")?;
    contains(
        &via_exec.ok(&["get", "configmap", "only-in-a-0"])?,
        "only-in-a-0",
    )?;
    let credential: Value = serde_json::from_str(&x.ok(&["cluster", "token", "a"])?)?;
    let admin_token = credential["status"]["token"]
        .as_str()
        .context("ExecCredential token")?
        .to_string();
    for token in [
        admin_token.as_str(),
        jwt.as_str(),
        "abcdef.0123456789abcdef",
    ] {
        // Discovery is open to every authenticated user (system:discovery).
        let (status, body) = a.kubectl.raw_get_bearer("/apis", token)?;
        ensure!(
            status == 200 && body.contains("APIGroupList"),
            "A's token on A: {status} {body}"
        );
        let (status, body) = b.kubectl.raw_get_bearer("/apis", token)?;
        ensure!(
            status == 401 && body.contains("\"reason\":\"Unauthorized\""),
            "A's token on B's path: {status} {body}"
        );
    }
    // A's token stops working in A once its service account is deleted.
    a.kubectl.ok(&["delete", "serviceaccount", "robot"])?;
    let (status, _) = a.kubectl.raw_get_bearer("/apis", &jwt)?;
    ensure!(
        status == 401,
        "a deleted service account's token still works: {status}"
    );

    // A continue token forged to climb out of A's prefix into B's: 400, never B's data.
    let (status, page) = a
        .kubectl
        .raw_get("/api/v1/namespaces/default/configmaps?limit=1")?;
    ensure!(status == 200, "{status} {page}");
    let page: Value = serde_json::from_str(&page)?;
    let token = page["metadata"]["continue"]
        .as_str()
        .context("a continue token")?;
    for start in [
        format!("../../../{}/configmaps/default/only-in-b", b.id),
        format!("/{}/configmaps/default/", b.id),
        "../".to_string(),
    ] {
        let forged = forge_continue(token, &start)?;
        let (status, body) = a.kubectl.raw_get(&format!(
            "/api/v1/namespaces/default/configmaps?limit=1&continue={forged}"
        ))?;
        ensure!(
            status == 400 && body.contains("BadRequest") && !body.contains("only-in-b"),
            "forged continue {start:?}: {status} {body}"
        );
    }

    // B's resourceVersion used on A's path reads A's keys at that revision, never B's.
    let b_rv = b.kubectl.ok(&[
        "get",
        "configmap",
        "only-in-b",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ])?;
    let (status, body) = a.kubectl.raw_get(&format!(
        "/api/v1/namespaces/default/configmaps/only-in-b?resourceVersion={b_rv}"
    ))?;
    ensure!(
        status == 404,
        "B's object by B's RV on A's path: {status} {body}"
    );
    let (status, at_b_revision) = a.kubectl.raw_get(&format!(
        "/api/v1/configmaps?resourceVersion={b_rv}&resourceVersionMatch=Exact"
    ))?;
    ensure!(
        status == 200
            && !at_b_revision.contains("only-in-b")
            && at_b_revision.contains("only-in-a-0"),
        "A's list at B's revision: {status} {at_b_revision}"
    );
    // A watch on A's path streams only A's objects. (It starts from resourceVersion 0: one
    // from before the watch cache's window gets 410, as upstream's.)
    let (status, watched) = a
        .kubectl
        .raw_get("/api/v1/configmaps?watch=true&resourceVersion=0&timeoutSeconds=1")?;
    ensure!(
        status == 200 && watched.contains("only-in-a-0") && !watched.contains("only-in-b"),
        "A's watch from resourceVersion 0: {status} {watched}"
    );

    // Account Y cannot see, read, change or delete X's clusters: 404 as if absent.
    let y_list = y.ok(&["cluster", "list", "-o", "json"])?;
    ensure!(
        !y_list.contains(&a.id) && !y_list.contains(&b.id),
        "Y lists X's clusters: {y_list}"
    );
    for args in [
        vec!["cluster", "get", "a"],
        vec!["cluster", "kubeconfig", "a"],
        vec!["cluster", "delete", "a"],
        vec!["nodepool", "list", "a"],
        vec!["nodepool", "create", "a", "pool"],
    ] {
        contains(&y.fails(&args)?, "ResourceNotFoundException (404)")?;
    }
    contains(&x.ok(&["cluster", "get", "a"])?, "ACTIVE")?;
    a.kubectl.ok(&["get", "configmap", "only-in-a-0"])?;

    // Bad input on the management API: precise 4xx, nothing created.
    let cases: [(&str, Option<Value>, bool, u16, &str); 6] = [
        (
            "POST",
            Some(json!({"name": "c", "colour": "red"})),
            true,
            400,
            "InvalidParameterException",
        ),
        (
            "POST",
            Some(
                json!({"name": "c", "kubernetesNetworkConfig": {"serviceIpv4Cidr": "10.96.0.1/12"}}),
            ),
            true,
            400,
            "InvalidParameterException",
        ),
        (
            "POST",
            Some(json!({"name": "c", "kubernetesNetworkConfig": {"podIpv4Cidr": "not-a-cidr"}})),
            true,
            400,
            "InvalidParameterException",
        ),
        (
            "POST",
            Some(json!({"name": "a"})),
            true,
            409,
            "ResourceInUseException",
        ),
        (
            "POST",
            Some(json!({"name": "c"})),
            false,
            401,
            "UnauthorizedException",
        ),
        ("DELETE", None, true, 404, "ResourceNotFoundException"),
    ];
    for (method, body, authenticated, status, code) in cases {
        let path = if method == "DELETE" {
            "/v1/clusters/c"
        } else {
            "/v1/clusters"
        };
        let (got, answer) = management_call(&x, method, path, body.as_ref(), authenticated)?;
        ensure!(
            got == status && answer["code"] == code,
            "{method} {path} {body:?}: expected {status} {code}, got {got} {answer}"
        );
    }
    let (status, answer) = management_call(&y, "GET", "/v1/accounts", None, true)?;
    ensure!(
        status == 403,
        "an account listed accounts: {status} {answer}"
    );
    let after = x.ok(&["cluster", "list"])?;
    ensure!(
        after.lines().count() == 3,
        "bad requests changed X's clusters:\n{after}"
    );

    // Deleting B removes its API and everything in it; A is untouched.
    x.ok(&["cluster", "delete", "b", "--wait"])?;
    contains(
        &x.fails(&["cluster", "get", "b"])?,
        "ResourceNotFoundException (404)",
    )?;
    let gone = b.kubectl.fails(&["get", "configmaps"])?;
    ensure!(
        gone.contains("NotFound") || gone.contains("Unauthorized") || gone.contains("not find"),
        "B still answers after deletion: {gone}"
    );
    a.kubectl.ok(&["get", "configmap", "only-in-a-0"])?;
    Ok(())
}

/// Two replicas of `flotilla serve` on a three-member etcd: one is killed with SIGKILL while a
/// client writes through it; every write it acknowledged is served by the other replica, which
/// goes on serving every cluster and the management API.
#[test]
fn a_replica_killed_mid_write_loses_nothing_and_the_other_serves_every_cluster()
-> anyhow::Result<()> {
    let etcd = Etcd::cluster(3)?;
    let endpoints = etcd.endpoints.join(",");
    let mut first = Serve::start(&endpoints)?;
    let second = Serve::start(&endpoints)?;
    let x = first.account("x")?;
    let a = create_cluster(&first, &x, "a")?;
    let b = create_cluster(&first, &x, "b")?;
    let (a2, b2) = (a.kubectl.via(&second.url())?, b.kubectl.via(&second.url())?);
    // Both replicas serve a cluster from the moment it exists.
    a.kubectl.ok(&["create", "configmap", "before"])?;
    contains(&a2.ok(&["get", "configmap", "before"])?, "before")?;

    // A writer through the first replica; the replica dies under it.
    let writer_config = a.kubectl.kubeconfig.clone();
    let writer = std::thread::spawn(move || {
        let kubectl = Kubectl::new(&writer_config);
        let mut acknowledged = Vec::new();
        for i in 0..200 {
            let name = format!("acked-{i}");
            match kubectl.ok(&["create", "configmap", &name]) {
                Ok(_) => acknowledged.push(name),
                Err(_) => break,
            }
        }
        acknowledged
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    first.kill();
    let acknowledged = writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))?;
    ensure!(
        acknowledged.len() >= 3 && acknowledged.len() < 200,
        "the kill should land mid-stream: {} writes acknowledged",
        acknowledged.len()
    );
    let listed = a2.ok(&["get", "configmaps", "-o", "name"])?;
    for name in &acknowledged {
        contains(&listed, &format!("configmap/{name}\n"))?;
    }

    // The survivor serves every cluster, reads and writes, and the management API.
    b2.ok(&["create", "configmap", "after-failover"])?;
    contains(&b2.ok(&["get", "configmaps"])?, "after-failover")?;
    let x2 = x.via(&second)?;
    contains(&x2.ok(&["cluster", "create", "c", "--wait"])?, "ACTIVE")?;
    let clusters = x2.ok(&["cluster", "list"])?;
    for name in ["a ", "b ", "c "] {
        contains(&clusters, name)?;
    }
    Ok(())
}

/// RBAC as upstream: a ServiceAccount bound to `view` in one namespace reads there, is
/// forbidden elsewhere and for writes (upstream's 403 text), `kubectl auth can-i [--list]`,
/// `auth whoami`, `create token` and `--as` behave as upstream, and a user who may create
/// bindings still cannot grant what they do not hold.
#[test]
fn rbac_and_service_account_tokens_behave_as_upstream() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let admin = f.kubectl();
    for ns in ["team", "other"] {
        admin.ok(&["create", "namespace", ns])?;
    }
    admin.ok(&["-n", "team", "create", "serviceaccount", "reader"])?;
    admin.ok(&[
        "-n",
        "team",
        "create",
        "rolebinding",
        "reader-view",
        "--clusterrole=view",
        "--serviceaccount=team:reader",
    ])?;
    let token = admin.ok(&["-n", "team", "create", "token", "reader"])?;
    let reader = admin.with_token(token.trim())?;
    let user = "system:serviceaccount:team:reader";

    contains(&reader.ok(&["auth", "whoami"])?, user)?;
    let listed = reader.run(&["-n", "team", "get", "pods"], None, &[])?;
    ensure!(
        listed.status.success()
            && String::from_utf8_lossy(&listed.stderr)
                .contains("No resources found in team namespace."),
        "the reader cannot list pods in its namespace: {listed:?}"
    );
    contains(
        &reader.fails(&["-n", "other", "get", "pods"])?,
        &format!(
            "Error from server (Forbidden): pods is forbidden: User \"{user}\" cannot list resource \"pods\" in API group \"\" in the namespace \"other\""
        ),
    )?;
    contains(
        &reader.fails(&["-n", "team", "create", "configmap", "x"])?,
        &format!(
            "configmaps is forbidden: User \"{user}\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"team\""
        ),
    )?;
    contains(
        &reader.fails(&["-n", "team", "get", "secrets"])?,
        "cannot list resource \"secrets\"",
    )?;

    // kubectl auth can-i, as the admin about the reader, and the reader's own list.
    let can_i = |args: &[&str]| -> anyhow::Result<String> {
        let out = admin.run(args, None, &[])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let as_reader = format!("--as={user}");
    ensure!(can_i(&["auth", "can-i", "list", "pods", "-n", "team", &as_reader])? == "yes");
    ensure!(can_i(&["auth", "can-i", "list", "pods", "-n", "other", &as_reader])? == "no");
    ensure!(can_i(&["auth", "can-i", "delete", "pods", "-n", "team", &as_reader])? == "no");
    ensure!(can_i(&["auth", "can-i", "*", "*"])? == "yes");
    let listed = reader.ok(&["auth", "can-i", "--list", "-n", "team"])?;
    contains(&listed, "pods ")?;
    contains(&listed, "[get list watch]")?;
    contains(&listed, "selfsubjectaccessreviews.authorization.k8s.io")?;

    // --as: the admin may impersonate; the reader may not.
    contains(&admin.ok(&["auth", "whoami", &as_reader])?, user)?;
    contains(
        &admin.fails(&["get", "pods", "--as=bob"])?,
        "pods is forbidden: User \"bob\" cannot list resource \"pods\"",
    )?;
    contains(
        &reader.fails(&["get", "pods", "--as=bob"])?,
        &format!(
            "users \"bob\" is forbidden: User \"{user}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        ),
    )?;

    // Escalation: allowed to create bindings, the reader may bind `view` (which it holds)
    // but not `admin`.
    admin.ok(&[
        "-n",
        "team",
        "create",
        "role",
        "binder",
        "--verb=create",
        "--resource=rolebindings.rbac.authorization.k8s.io",
    ])?;
    admin.ok(&[
        "-n",
        "team",
        "create",
        "rolebinding",
        "reader-binder",
        "--role=binder",
        "--serviceaccount=team:reader",
    ])?;
    reader.ok(&[
        "-n",
        "team",
        "create",
        "rolebinding",
        "more-view",
        "--clusterrole=view",
        "--serviceaccount=team:reader",
    ])?;
    contains(
        &reader.fails(&[
            "-n",
            "team",
            "create",
            "rolebinding",
            "grab-admin",
            "--clusterrole=admin",
            "--serviceaccount=team:reader",
        ])?,
        "is attempting to grant RBAC permissions not currently held",
    )?;
    contains(
        &admin.fails(&["-n", "team", "get", "rolebinding", "grab-admin"])?,
        "NotFound",
    )?;
    Ok(())
}

/// A cluster's control loops run on exactly one replica, the holder of its
/// `kube-system/kube-controller-manager` Lease, and move to the other replica when the holder
/// is killed: namespaces created afterwards still get their default ServiceAccount.
#[test]
fn control_loops_run_on_one_replica_and_move_when_it_dies() -> anyhow::Result<()> {
    let etcd = Etcd::cluster(3)?;
    let endpoints = etcd.endpoints.join(",");
    let lease = ["--lease-duration-seconds", "2"];
    let mut replicas = [
        Serve::start_with(&endpoints, &lease)?,
        Serve::start_with(&endpoints, &lease)?,
    ];
    let x = replicas[0].account("x")?;
    let cluster = create_cluster(&replicas[0], &x, "loops")?;
    let holder = |kubectl: &Kubectl| -> anyhow::Result<String> {
        Ok(kubectl
            .ok(&[
                "-n",
                "kube-system",
                "get",
                "lease",
                "kube-controller-manager",
                "-o",
                "jsonpath={.spec.holderIdentity} {.spec.leaseTransitions}",
            ])?
            .trim()
            .to_string())
    };
    let wait_for = |what: &str,
                    mut done: Box<dyn FnMut() -> anyhow::Result<bool> + '_>|
     -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !done()? {
            ensure!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        Ok(())
    };
    wait_for(
        "a lease holder",
        Box::new(|| {
            Ok(cluster
                .kubectl
                .run(
                    &[
                        "-n",
                        "kube-system",
                        "get",
                        "lease",
                        "kube-controller-manager",
                    ],
                    None,
                    &[],
                )?
                .status
                .success())
        }),
    )?;
    // A replica that took the cluster before it saw the other may hand it over once both see
    // each other (the rendezvous owner of a grown membership): wait for the holder to settle.
    let mut first = holder(&cluster.kubectl)?;
    let mut steady = 0;
    let settle_by = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while steady < 3 {
        ensure!(
            std::time::Instant::now() < settle_by,
            "the lease did not settle on one live replica"
        );
        std::thread::sleep(std::time::Duration::from_millis(400));
        let now = holder(&cluster.kubectl)?;
        // A lease released in a handover names no one for a moment: not settled yet.
        let held = replicas
            .iter()
            .any(|r| now.contains(&format!("_{}_", r.port)));
        if now == first && held {
            steady += 1;
        } else {
            (first, steady) = (now, 0);
        }
    }
    // Exactly one holder while both replicas live: once settled, it does not change hands.
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(400));
        ensure!(
            holder(&cluster.kubectl)? == first,
            "the lease moved between live replicas"
        );
    }
    cluster.kubectl.ok(&["create", "namespace", "before"])?;
    wait_for(
        "the default ServiceAccount",
        Box::new(|| {
            Ok(cluster
                .kubectl
                .run(
                    &["-n", "before", "get", "serviceaccount", "default"],
                    None,
                    &[],
                )?
                .status
                .success())
        }),
    )?;

    // Kill the holder; the survivor takes the lease over and runs the loops.
    let holder_index = replicas
        .iter()
        .position(|r| first.contains(&format!("_{}_", r.port)))
        .with_context(|| format!("holder {first} is neither replica"))?;
    let survivor = &replicas[1 - holder_index];
    let through_survivor = cluster.kubectl.via(&survivor.url())?;
    replicas[holder_index].kill();
    let survivor_port = format!("_{}_", replicas[1 - holder_index].port);
    wait_for(
        "the survivor to take the lease",
        Box::new(|| Ok(holder(&through_survivor)?.contains(&survivor_port))),
    )?;
    let transitions_before: u64 = first
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let after = holder(&through_survivor)?;
    ensure!(
        after.ends_with(&format!(" {}", transitions_before + 1)),
        "leaseTransitions went from {transitions_before} to {after:?}, not one more"
    );
    through_survivor.ok(&["create", "namespace", "after"])?;
    wait_for(
        "the default ServiceAccount after fail-over",
        Box::new(|| {
            Ok(through_survivor
                .run(
                    &["-n", "after", "get", "configmap", "kube-root-ca.crt"],
                    None,
                    &[],
                )?
                .status
                .success())
        }),
    )?;
    Ok(())
}

/// The namespace controller: deleting a namespace deletes everything in it, waits for objects
/// that still have finalizers, and only then removes the namespace (`kubectl delete ns` and
/// `kubectl wait --for=delete` return).
#[test]
fn deleting_a_namespace_deletes_its_contents_then_the_namespace() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok(&["create", "namespace", "gone"])?;
    kubectl.ok(&["-n", "gone", "create", "configmap", "plain"])?;
    kubectl.ok(&["-n", "gone", "create", "deployment", "web", "--image=nginx"])?;
    kubectl.ok_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, namespace: gone, finalizers: [example.com/hold]}\n",
    )?;
    kubectl.ok(&["delete", "namespace", "gone", "--wait=false"])?;
    // Everything without a finalizer goes; the held object and the namespace stay.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let left = kubectl.ok(&["-n", "gone", "get", "configmaps,deployments", "-o", "name"])?;
        if left.trim() == "configmap/held" {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "contents not deleted: {left}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    contains(
        &kubectl.ok(&["get", "namespace", "gone", "-o", "jsonpath={.status.phase}"])?,
        "Terminating",
    )?;
    kubectl.ok(&[
        "-n",
        "gone",
        "patch",
        "configmap",
        "held",
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
    ])?;
    kubectl.ok(&["wait", "--for=delete", "namespace/gone", "--timeout=20s"])?;
    // A namespace of the same name starts empty.
    kubectl.ok(&["create", "namespace", "gone"])?;
    let fresh = kubectl.ok(&["-n", "gone", "get", "configmaps,deployments", "-o", "name"])?;
    ensure!(
        !fresh.contains("plain") && !fresh.contains("held") && !fresh.contains("web"),
        "old contents came back: {fresh}"
    );
    Ok(())
}

/// `flotilla simulate-nodes`: simulated nodes register and stay Ready, a pod bound to one runs
/// and becomes Ready, and deleting it completes (the simulated kubelet confirms the delete).
#[test]
fn simulated_nodes_run_their_pods() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let kubeconfig = kubectl.kubeconfig.to_str().context("path")?.to_string();
    let mut simulator = Command::new(flotilla_e2e::flotilla_bin()?)
        .args([
            "simulate-nodes",
            "--kubeconfig",
            &kubeconfig,
            "--count",
            "3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let outcome = (|| -> anyhow::Result<()> {
        // The nodes appear once the simulator has registered them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while kubectl
            .ok(&["get", "nodes", "--no-headers"])?
            .matches(" Ready ")
            .count()
            < 3
        {
            ensure!(
                std::time::Instant::now() < deadline,
                "three Ready nodes did not appear"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        contains(&kubectl.ok(&["get", "nodes"])?, "sim-2   Ready")?;
        kubectl.ok(&[
            "run",
            "web",
            "--image=nginx",
            "--overrides={\"spec\":{\"nodeName\":\"sim-1\"}}",
        ])?;
        kubectl.ok(&["wait", "--for=condition=Ready", "pod/web", "--timeout=20s"])?;
        contains(&kubectl.ok(&["get", "pod", "web", "-o", "wide"])?, "sim-1")?;
        kubectl.ok(&["delete", "pod", "web", "--timeout=20s"])?;
        contains(&kubectl.fails(&["get", "pod", "web"])?, "NotFound")?;
        contains(
            &kubectl.ok(&["-n", "kube-node-lease", "get", "lease", "sim-0"])?,
            "sim-0",
        )?;

        // The scheduler places an unbound pod; one that fits nowhere stays Pending with
        // upstream's condition and FailedScheduling event.
        kubectl.ok(&["run", "placed", "--image=nginx"])?;
        kubectl.ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/placed",
            "--timeout=20s",
        ])?;
        contains(
            &kubectl.ok(&["get", "pod", "placed", "-o", "jsonpath={.spec.nodeName}"])?,
            "sim-",
        )?;
        kubectl.ok(&[
            "run",
            "nowhere",
            "--image=nginx",
            "--overrides={\"spec\":{\"nodeSelector\":{\"zone\":\"mars\"}}}",
        ])?;
        kubectl.ok(&[
            "wait",
            "--for=condition=PodScheduled=False",
            "pod/nowhere",
            "--timeout=20s",
        ])?;
        contains(
            &kubectl.ok(&[
                "get",
                "pod",
                "nowhere",
                "-o",
                "jsonpath={.status.conditions[0].message}",
            ])?,
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
        )?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !kubectl
            .ok(&["describe", "pod", "nowhere"])?
            .contains("FailedScheduling")
        {
            ensure!(
                std::time::Instant::now() < deadline,
                "no FailedScheduling event"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }

        // A ReplicaSet: its controller creates the pods, the scheduler spreads them, scaling
        // and deleting it remove pods.
        kubectl.ok_stdin(
            &["apply", "-f", "-"],
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: web-rs}\nspec:\n  replicas: 3\n  selector: {matchLabels: {app: web-rs}}\n  template:\n    metadata: {labels: {app: web-rs}}\n    spec: {containers: [{name: c, image: nginx}]}\n",
        )?;
        kubectl.ok(&[
            "wait",
            "--for=jsonpath={.status.readyReplicas}=3",
            "rs/web-rs",
            "--timeout=30s",
        ])?;
        let nodes = kubectl.ok(&[
            "get",
            "pods",
            "-l",
            "app=web-rs",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ])?;
        let distinct: std::collections::BTreeSet<&str> = nodes.split_whitespace().collect();
        ensure!(
            distinct.len() >= 2,
            "three best-effort pods were not spread: {nodes}"
        );
        // A Service over them: its Endpoints and EndpointSlice follow the pods.
        kubectl.ok(&["expose", "rs", "web-rs", "--port=80", "--target-port=8080"])?;
        let addresses = |kubectl: &Kubectl| -> anyhow::Result<usize> {
            Ok(kubectl
                .ok(&[
                    "get",
                    "endpoints",
                    "web-rs",
                    "-o",
                    "jsonpath={.subsets[*].addresses[*].ip}",
                ])?
                .split_whitespace()
                .count())
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while kubectl
            .run(&["get", "endpoints", "web-rs"], None, &[])?
            .status
            .code()
            != Some(0)
            || addresses(&kubectl)? != 3
        {
            ensure!(
                std::time::Instant::now() < deadline,
                "the Service's endpoints did not list 3 pods"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        contains(
            &kubectl.ok(&[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web-rs",
            ])?,
            "8080",
        )?;
        kubectl.ok(&["scale", "rs", "web-rs", "--replicas=1"])?;
        kubectl.ok(&[
            "wait",
            "--for=jsonpath={.status.replicas}=1",
            "rs/web-rs",
            "--timeout=30s",
        ])?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while addresses(&kubectl)? != 1 {
            ensure!(
                std::time::Instant::now() < deadline,
                "the endpoints did not follow the scale-down"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        kubectl.ok(&["delete", "rs", "web-rs"])?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !kubectl
            .ok(&["get", "pods", "-l", "app=web-rs", "-o", "name"])?
            .trim()
            .is_empty()
        {
            ensure!(
                std::time::Instant::now() < deadline,
                "the ReplicaSet's pods outlived it"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        Ok(())
    })();
    let _ = simulator.kill();
    let _ = simulator.wait();
    outcome
}

/// Retries `check` for up to `within` (a setting applied by the service takes effect then).
pub(crate) fn eventually(
    within: Duration,
    mut check: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(err) if std::time::Instant::now() >= deadline => return Err(err),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Security review, findings 1, 7 and 9: on etcd no private key is stored in plain; a
/// cluster's `endpointAccess` is enforced on its API
/// (publicAccessCidrs, then a private-only endpoint, then open again), each change applied
/// within seconds with a 403 that names the rule; `/metrics` is the operator's alone.
#[test]
fn endpoint_access_is_enforced_and_metrics_need_the_operator() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start(&etcd.endpoint)?;
    let x = service.account("x")?;
    let cluster = create_cluster(&service, &x, "guarded")?;
    cluster.kubectl.ok(&["get", "ns", "default"])?;

    // Finding 1 on etcd: no private key in any stored value; the records holding keys sealed.
    let dump = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.endpoint, "get", "", "--from-key"])
        .output()
        .context("etcdctl (etcd-client) is needed")?;
    ensure!(
        dump.status.success(),
        "etcdctl get: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    ensure!(
        !dump.contains("PRIVATE KEY"),
        "a private key is stored in plain in etcd"
    );
    ensure!(
        dump.contains(&format!(
            "/flotilla/tenants/{}\nk8s:enc:aesgcm:v1:",
            cluster.id
        )) && dump.contains("/flotilla/pki/serving-ca\nk8s:enc:aesgcm:v1:"),
        "tenant record or serving CA not sealed"
    );

    // The cluster's PodSecurity defaults are a management setting (upstream's shipped
    // `privileged` until set): `baseline` by default, kube-system exempt.
    let (code, body) = management_call(
        &x,
        "PATCH",
        "/v1/clusters/guarded",
        Some(&json!({"podSecurity": {"defaults": {"enforce": "strict"}}})),
        true,
    )?;
    ensure!(
        code == 400 && body.to_string().contains("podSecurity.defaults.enforce"),
        "a level that does not exist: {code} {body}"
    );
    let (code, body) = management_call(
        &x,
        "PATCH",
        "/v1/clusters/guarded",
        Some(&json!({"podSecurity": {"defaults": {"enforce": "baseline"},
            "exemptions": {"namespaces": ["kube-system"]}}})),
        true,
    )?;
    ensure!(code == 200, "PATCH podSecurity: {code} {body}");
    eventually(Duration::from_secs(3), || {
        contains(
            &cluster
                .kubectl
                .fails(&["run", "root", "--image=nginx", "--privileged"])?,
            "violates PodSecurity \"baseline:latest\": privileged",
        )
    })?;
    cluster.kubectl.ok(&[
        "-n",
        "kube-system",
        "run",
        "root",
        "--image=nginx",
        "--privileged",
    ])?;
    // The CLI changes one mode and keeps the others.
    let updated: Value = serde_json::from_str(&x.ok(&[
        "cluster",
        "update",
        "guarded",
        "--pod-security-warn",
        "restricted",
        "--wait",
        "-o",
        "json",
    ])?)?;
    ensure!(
        updated["podSecurity"]["defaults"]["enforce"] == "baseline"
            && updated["podSecurity"]["defaults"]["warn"] == "restricted"
            && updated["podSecurity"]["exemptions"]["namespaces"] == json!(["kube-system"]),
        "flotilla cluster update: {updated}"
    );
    contains(
        &x.fails(&["cluster", "update", "guarded"])?,
        "nothing to change",
    )?;

    let set = |access: Value| -> anyhow::Result<()> {
        let (code, body) = management_call(
            &x,
            "PATCH",
            "/v1/clusters/guarded",
            Some(&json!({ "endpointAccess": access })),
            true,
        )?;
        ensure!(code == 200, "PATCH endpointAccess: {code} {body}");
        Ok(())
    };
    set(json!({"publicAccessCidrs": ["10.1.0.0/16"]}))?;
    eventually(Duration::from_secs(3), || {
        let refused = cluster.kubectl.fails(&["get", "ns", "default"])?;
        contains(&refused, "Forbidden")?;
        contains(&refused, "does not answer 127.0.0.1")?;
        contains(&refused, "publicAccessCidrs [10.1.0.0/16]")
    })?;
    set(json!({"public": false, "private": true}))?;
    eventually(Duration::from_secs(3), || {
        contains(
            &cluster.kubectl.fails(&["get", "ns", "default"])?,
            "the cluster's endpoint is private",
        )
    })?;
    // The management API still answers for the cluster (its access is the account's key).
    let (code, _) = management_call(&x, "GET", "/v1/clusters/guarded", None, true)?;
    ensure!(code == 200, "management GET: {code}");
    set(json!({"publicAccessCidrs": ["127.0.0.0/8"]}))?;
    eventually(Duration::from_secs(3), || {
        cluster.kubectl.ok(&["get", "ns", "default"]).map(drop)
    })?;

    // The cluster's own /metrics, under its RBAC: its admin may read them.
    let (status, body) = cluster.kubectl.raw_get("/metrics")?;
    ensure!(
        status == 200 && body.contains("# TYPE"),
        "cluster /metrics: {status} {body}"
    );
    // The service's /metrics: 401 without a credential, 403 for an account, 200 for the operator.
    let (code, _) = management_call(&x, "GET", "/metrics", None, false)?;
    ensure!(code == 401, "anonymous /metrics: {code}");
    let (code, _) = management_call(&x, "GET", "/metrics", None, true)?;
    ensure!(code == 403, "account /metrics: {code}");
    let operator = service.operator();
    let settings = operator.settings()?;
    let ca = service.dir().join("operator-ca.pem");
    std::fs::write(&ca, settings["caPem"].as_str().context("caPem")?)?;
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--cacert"])
        .arg(&ca)
        .args([
            "-H",
            &format!(
                "Authorization: Bearer {}",
                settings["apiKey"].as_str().context("apiKey")?
            ),
        ])
        .arg(format!(
            "{}/metrics",
            settings["endpoint"].as_str().context("endpoint")?
        ))
        .output()?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("# TYPE"),
        "operator /metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// When replicas join and leave, each cluster's control loops move between them and never run
/// on two at once: every replica's log of starting and stopping a cluster's loops, read
/// afterwards, shows no overlap. A third replica joining takes over some clusters (the others
/// release them first); the first replica killed has its clusters taken once its lease lapses.
#[test]
fn control_loops_move_between_replicas_and_never_run_on_two_at_once() -> anyhow::Result<()> {
    const CLUSTERS: usize = 16;
    let etcd = Etcd::start()?;
    let logs = tempfile::tempdir()?;
    let lease = ["--lease-duration-seconds", "2"];
    let filter = "warn,flotilla::placement=info";
    let log_of = |name: &str| logs.path().join(format!("{name}.log"));
    let mut a = Serve::start_logging(&etcd.endpoint, &lease, filter, log_of("a"))?;
    let _b = Serve::start_logging(&etcd.endpoint, &lease, filter, log_of("b"))?;
    let x = a.account("x")?;
    for i in 0..CLUSTERS {
        x.ok(&["cluster", "create", &format!("c{i}"), "--wait"])?;
    }
    let wait_for = |what: &str, mut done: Box<dyn FnMut() -> anyhow::Result<bool> + '_>| {
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        while !done()? {
            ensure!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    };
    let names = ["a", "b", "c"];
    let running_somewhere = |replicas: &[&str]| -> anyhow::Result<usize> {
        let mut running = std::collections::BTreeSet::new();
        for name in replicas {
            for (cluster, intervals) in loop_intervals(&log_of(name))? {
                if intervals.last().is_some_and(|(_, end)| end.is_none()) {
                    running.insert(cluster);
                }
            }
        }
        Ok(running.len())
    };
    wait_for(
        "every cluster's loops to run",
        Box::new(|| Ok(running_somewhere(&names[..2])? == CLUSTERS)),
    )?;

    // A third replica: some clusters move to it.
    let _c = Serve::start_logging(&etcd.endpoint, &lease, filter, log_of("c"))?;
    wait_for(
        "the new replica to take some clusters",
        Box::new(|| Ok(!loop_intervals(&log_of("c"))?.is_empty())),
    )?;
    // The first dies: its clusters go to the others once its lease lapses.
    a.kill();
    let killed_at = time::OffsetDateTime::now_utc();
    wait_for(
        "the survivors to run every cluster",
        Box::new(|| Ok(running_somewhere(&names[1..])? == CLUSTERS)),
    )?;

    // No cluster's loops ran on two replicas at once.
    let mut by_cluster: std::collections::BTreeMap<String, Vec<(&str, Interval)>> =
        Default::default();
    for name in names {
        for (cluster, intervals) in loop_intervals(&log_of(name))? {
            for (start, end) in intervals {
                // The killed replica's loops ended with it.
                let end = end.or((name == "a").then_some(killed_at));
                by_cluster
                    .entry(cluster.clone())
                    .or_default()
                    .push((name, (start, end)));
            }
        }
    }
    ensure!(by_cluster.len() == CLUSTERS, "{by_cluster:?}");
    let mut moves = 0;
    for (cluster, mut runs) in by_cluster {
        runs.sort_by_key(|(_, (start, _))| *start);
        moves += runs.len() - 1;
        for pair in runs.windows(2) {
            let ((first, (_, first_end)), (second, (second_start, _))) = (&pair[0], &pair[1]);
            ensure!(
                first_end.is_some_and(|end| end <= *second_start),
                "cluster {cluster}: {first}'s loops were still running when {second}'s started: {runs:?}"
            );
        }
    }
    ensure!(moves > 0, "no cluster moved");
    // Failover: how long the killed replica's clusters went without loops (the issue's
    // target is the replica lease's duration + 2 s).
    let taken_over: Vec<f64> = names[1..]
        .iter()
        .map(|name| loop_intervals(&log_of(name)))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flat_map(|by_cluster| by_cluster.into_values().flatten())
        .filter(|(start, _)| *start >= killed_at)
        .map(|(start, _)| (start - killed_at).as_seconds_f64())
        .collect();
    let slowest = taken_over.iter().copied().fold(0.0, f64::max);
    println!(
        "failover: {} clusters taken over, the last {slowest:.2} s after the kill (lease 2 s)",
        taken_over.len()
    );
    Ok(())
}

/// When a replica started and stopped a cluster's loops: (start, end), end `None` while they
/// still run.
type Interval = (time::OffsetDateTime, Option<time::OffsetDateTime>);

/// Each cluster's intervals of running loops in one replica's JSON log.
fn loop_intervals(
    log: &std::path::Path,
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<Interval>>> {
    let mut intervals: std::collections::BTreeMap<String, Vec<Interval>> = Default::default();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        // The JSON log flattens an event's fields into the line.
        let (Some(message), Some(cluster), Some(at)) = (
            entry["message"].as_str(),
            entry["cluster"].as_str(),
            entry["timestamp"].as_str(),
        ) else {
            continue;
        };
        let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
            .with_context(|| format!("timestamp {at}"))?;
        let runs = intervals.entry(cluster.to_string()).or_default();
        if message.starts_with("running the cluster's control loops") {
            runs.push((at, None));
        } else if message.starts_with("control loops stopped")
            && let Some(open) = runs.last_mut().filter(|(_, end)| end.is_none())
        {
            open.1 = Some(at);
        }
    }
    Ok(intervals)
}

/// Issue 28: an idle cluster's control loops are parked (stopped, their Lease kept, shown by
/// `kubectl get componentstatuses`) and start again on its next write: a Deployment created
/// on a parked cluster gets its ReplicaSet and pod, and a cluster with pods stays awake.
#[test]
fn idle_clusters_park_their_loops_and_wake_on_a_write() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start_with(&etcd.endpoint, &["--park-idle-clusters-after", "2s"])?;
    let x = service.account("x")?;
    let cluster = create_cluster(&service, &x, "sleepy")?;
    let components = |kubectl: &Kubectl| -> anyhow::Result<String> {
        kubectl.ok(&[
            "get",
            "componentstatuses",
            "controller-manager",
            "-o",
            "jsonpath={.conditions[0].status} {.conditions[0].message}",
        ])
    };
    let parked = |kubectl: &Kubectl| -> anyhow::Result<()> {
        let status = components(kubectl)?;
        ensure!(status.starts_with("True ok (idle"), "not parked: {status}");
        Ok(())
    };
    eventually(Duration::from_secs(30), || parked(&cluster.kubectl))?;
    // A read does not wake it; a write does, and the loops do what it asks.
    cluster.kubectl.ok(&["get", "configmaps", "-A"])?;
    parked(&cluster.kubectl)?;
    let written = std::time::Instant::now();
    cluster.kubectl.ok(&[
        "create",
        "deployment",
        "web",
        "--image=flotilla.local/busybox:1",
    ])?;
    eventually(Duration::from_secs(20), || {
        contains(
            &cluster.kubectl.ok(&["get", "pods", "-o", "name"])?,
            "pod/web-",
        )
    })?;
    eprintln!(
        "a parked cluster's Deployment had its pod {} ms after the create",
        written.elapsed().as_millis()
    );
    contains(&components(&cluster.kubectl)?, "True ok")?;
    // Its pending pod keeps it awake (the scheduler retries it).
    std::thread::sleep(Duration::from_secs(5));
    let status = components(&cluster.kubectl)?;
    ensure!(status == "True ok", "a cluster with a pod parked: {status}");
    // Without the Deployment it parks again; another cluster parked all along.
    cluster.kubectl.ok(&["delete", "deployment", "web"])?;
    eventually(Duration::from_secs(30), || {
        ensure!(
            cluster
                .kubectl
                .ok(&["get", "pods", "-o", "name"])?
                .is_empty(),
            "pods left"
        );
        parked(&cluster.kubectl)
    })?;
    Ok(())
}
