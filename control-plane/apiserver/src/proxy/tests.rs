//! Tests of the proxy subresources: name and path parsing, where requests go, the headers
//! and redirects passed back, and the router's refusals.
use super::*;

#[test]
fn ids_split_as_upstreams_do() {
    let split = |id| split_scheme_name_port(id).map(|s| (s.scheme, s.name, s.port));
    assert_eq!(split("web"), Some(("", "web", "")));
    assert_eq!(split("web:8080"), Some(("", "web", "8080")));
    assert_eq!(split("web:http"), Some(("", "web", "http")));
    assert_eq!(split("https:web:443"), Some(("https", "web", "443")));
    assert_eq!(split("http:web:"), Some(("http", "web", "")));
    assert_eq!(split("web:"), Some(("", "web", "")));
    for invalid in ["", ":80", "ftp:web:21", "a:b:c:d", "https::443"] {
        assert_eq!(split(invalid), None, "{invalid:?}");
    }
}

#[test]
fn proxy_paths_give_the_subpath_and_the_prefix() {
    let target = |path: &'static str| {
        let segments: Vec<&'static str> = path.split('/').filter(|s| !s.is_empty()).collect();
        // The tenant's part, as the router hands it over.
        let rest: Vec<&'static str> = match segments.as_slice() {
            ["clusters", _, rest @ ..] => rest.to_vec(),
            rest => rest.to_vec(),
        };
        proxy_target(path, &rest).map(|t| (t.kind, t.namespace, t.id, t.subpath, t.prefix))
    };
    assert_eq!(
        target("/clusters/c1/api/v1/namespaces/ns/services/https:web:443/proxy/a/b/"),
        Some((
            ProxyKind::Service,
            "ns",
            "https:web:443",
            "/a/b/".to_string(),
            "/clusters/c1/api/v1/namespaces/ns/services/https:web:443/proxy".to_string()
        ))
    );
    assert_eq!(
        target("/api/v1/namespaces/ns/pods/p/proxy"),
        Some((
            ProxyKind::Pod,
            "ns",
            "p",
            String::new(),
            "/api/v1/namespaces/ns/pods/p/proxy".to_string()
        ))
    );
    assert_eq!(
        target("/api/v1/nodes/n1:9100/proxy/"),
        Some((
            ProxyKind::Node,
            "",
            "n1:9100",
            "/".to_string(),
            "/api/v1/nodes/n1:9100/proxy".to_string()
        ))
    );
    // The prefix is written escaped, as Go's URL writes it.
    assert_eq!(
        target("/api/v1/nodes/n 1/proxy/x").map(|t| t.4),
        Some("/api/v1/nodes/n%201/proxy".to_string())
    );
    for other in [
        "/api/v1/namespaces/ns/pods/p/exec",
        "/api/v1/namespaces/ns/configmaps/c/proxy",
        "/api/v1/pods/p/proxy",
        "/apis/apps/v1/namespaces/ns/deployments/d/proxy",
    ] {
        assert_eq!(target(other), None, "{other}");
    }
}

#[test]
fn backend_paths_are_cleaned_and_keep_the_trailing_slash() {
    assert_eq!(backend_path(""), "");
    assert_eq!(backend_path("/"), "/");
    assert_eq!(backend_path("/a/b"), "/a/b");
    assert_eq!(backend_path("/a/b/"), "/a/b/");
    assert_eq!(backend_path("/a/./c/../b"), "/a/b");
    // Nothing climbs above the backend's root.
    assert_eq!(backend_path("/../../etc/passwd"), "/etc/passwd");
    assert_eq!(
        escape_path("/a b/ü/x:y@z;w=1&$+,"),
        "/a%20b/%C3%BC/x:y@z;w=1&$+,"
    );
    assert_eq!(escape_path("/q?#%"), "/q%3F%23%25");
}

#[test]
fn pods_are_reached_at_their_ip_and_port() {
    let pod = json!({"spec": {"containers": [
        {"name": "sidecar"},
        {"name": "web", "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9090}]},
    ]}, "status": {"podIP": "10.1.2.3", "podIPs": [{"ip": "10.1.2.4"}]}});
    assert_eq!(pod_ip(&pod), Some("10.1.2.4".parse().expect("ip")));
    assert_eq!(
        pod_ip(&json!({"status": {"podIP": "10.1.2.3"}})),
        Some("10.1.2.3".parse().expect("ip"))
    );
    assert_eq!(pod_ip(&json!({"status": {}})), None);
    assert_eq!(pod_port(&pod, "").expect("first"), Some(8080));
    assert_eq!(pod_port(&pod, "9090").expect("number"), Some(9090));
    assert_eq!(pod_port(&pod, "http").expect("name"), Some(8080));
    let err = pod_port(&pod, "metrics").expect_err("unknown name");
    assert_eq!(
        (err.code, err.message.as_str()),
        (
            503,
            "error trying to reach service: dial tcp: lookup tcp/metrics: unknown port"
        )
    );
    let bare = json!({"spec": {"containers": [{"name": "c"}]}});
    assert_eq!(pod_port(&bare, "").expect("none"), None);
}

#[test]
fn services_are_reached_at_a_ready_endpoint_of_the_named_port() {
    let service = json!({"metadata": {"name": "web"}, "spec": {"ports": [
        {"name": "http", "port": 80}, {"name": "metrics", "port": 9100}]}});
    assert_eq!(service_port_name(&service, "80").expect("80"), "http");
    assert_eq!(
        service_port_name(&service, "metrics").expect("name"),
        "metrics"
    );
    assert_eq!(service_port_name(&service, "").expect("unnamed"), "");
    let err = service_port_name(&service, "81").expect_err("no port 81");
    assert_eq!(
        (err.code, err.reason, err.message.as_str()),
        (
            503,
            "ServiceUnavailable",
            "no service port 81 found for service \"web\""
        )
    );
    let slices = vec![
        json!({"metadata": {"labels": {"kubernetes.io/service-name": "web"}},
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
            {"addresses": ["10.0.0.3"]},
        ]}),
        json!({"metadata": {"labels": {"kubernetes.io/service-name": "other"}},
            "ports": [{"name": "http", "port": 1}],
            "endpoints": [{"addresses": ["10.0.0.9"]}]}),
    ];
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    assert_eq!(
        ready_endpoints(&slices, "web", "http"),
        vec![(ip("10.0.0.2"), 8080), (ip("10.0.0.3"), 8080)]
    );
    assert!(ready_endpoints(&slices, "web", "metrics").is_empty());
    assert!(ready_endpoints(&slices, "missing", "http").is_empty());
}

#[test]
fn redirects_to_the_backend_move_under_the_proxy() {
    let prefix = "/clusters/c1/api/v1/namespaces/ns/services/web:80/proxy";
    let rewrite = |location: &str| rewrite_location(location, prefix, "10.0.0.2:8080", "api:6443");
    assert_eq!(
        rewrite("/login?next=%2F#top"),
        format!("{prefix}/login?next=%2F#top")
    );
    assert_eq!(rewrite("/dir/"), format!("{prefix}/dir/"));
    assert_eq!(rewrite("http://10.0.0.2:8080/x"), format!("{prefix}/x"));
    // The caller's own host stays; paths already under the proxy are left alone.
    assert_eq!(
        rewrite("https://api:6443/y"),
        format!("https://api:6443{prefix}/y")
    );
    assert_eq!(rewrite(&format!("{prefix}/z")), format!("{prefix}/z"));
    // Other hosts and relative references are not the proxy's business.
    for untouched in ["https://example.com/a", "next/page", "?q=1", "mailto:a@b.c"] {
        assert_eq!(rewrite(untouched), untouched, "{untouched}");
    }
}

#[test]
fn html_answers_have_their_links_moved_gzipped_or_not() {
    use std::io::{Read, Write};
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    };
    assert_eq!(
        html_answer(&headers(&[("content-type", "text/html; charset=utf-8")])),
        Some(false)
    );
    assert_eq!(
        html_answer(&headers(&[
            ("content-type", "TEXT/HTML"),
            ("content-encoding", "gzip")
        ])),
        Some(true)
    );
    for other in [
        headers(&[("content-type", "application/json")]),
        headers(&[("content-type", "text/html"), ("content-encoding", "br")]),
        headers(&[("content-type", "text/html"), ("location", "/x")]),
        headers(&[]),
    ] {
        assert_eq!(html_answer(&other), None, "{other:?}");
    }
    let moved = |url: &str| rewrite_location(url, "/api/v1/nodes/n1/proxy", "10.0.0.5:80", "api");
    let page = b"<a href=\"/metrics\">m</a>";
    assert_eq!(
        rewrite_document(page, false, moved).as_deref(),
        Some(&b"<a href=\"/api/v1/nodes/n1/proxy/metrics\">m</a>"[..])
    );
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(page).expect("gzip");
    let gzipped = encoder.finish().expect("gzip");
    let rewritten = rewrite_document(&gzipped, true, moved).expect("rewritten");
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&rewritten[..])
        .read_to_string(&mut plain)
        .expect("gunzip");
    assert_eq!(plain, "<a href=\"/api/v1/nodes/n1/proxy/metrics\">m</a>");
    // Not UTF-8, or not gzip as it claims: left as it came.
    assert_eq!(rewrite_document(b"\xff<a href=/x>", false, moved), None);
    assert_eq!(rewrite_document(page, true, moved), None);
}

#[test]
fn credentials_and_hop_by_hop_headers_stay_here() {
    let mut incoming = HeaderMap::new();
    for (name, value) in [
        ("authorization", "Bearer secret"),
        ("impersonate-user", "alice"),
        ("impersonate-group", "admins"),
        ("connection", "keep-alive, x-private"),
        ("x-private", "1"),
        ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"),
        ("expect", "100-continue"),
        ("accept", "text/html"),
        ("x-forwarded-for", "192.0.2.1"),
    ] {
        incoming.append(name, HeaderValue::from_static(value));
    }
    let client = Some("198.51.100.7".parse().expect("ip"));
    let out = backend_request_headers(&incoming, false, client);
    let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["accept", "x-forwarded-for"], "{out:?}");
    assert_eq!(out["x-forwarded-for"], "192.0.2.1, 198.51.100.7");
    // An upgrade keeps what asks for it.
    let mut upgrading = HeaderMap::new();
    upgrading.insert("connection", HeaderValue::from_static("Upgrade"));
    upgrading.insert("upgrade", HeaderValue::from_static("websocket"));
    upgrading.insert("authorization", HeaderValue::from_static("Bearer secret"));
    assert!(is_upgrade(&upgrading));
    let out = backend_request_headers(&upgrading, true, None);
    assert!(out.contains_key("upgrade") && out.contains_key("connection"));
    assert!(!out.contains_key("authorization"));

    let mut answer = HeaderMap::new();
    for (name, value) in [
        ("access-control-allow-origin", "*"),
        ("transfer-encoding", "chunked"),
        ("location", "/next"),
        ("content-type", "text/plain"),
    ] {
        answer.insert(name, HeaderValue::from_static(value));
    }
    answer_headers(
        &mut answer,
        &Rewrite {
            prefix: "/api/v1/nodes/n1/proxy",
            backend_authority: "10.0.0.5:10250",
            request_host: "api",
        },
    );
    assert_eq!(answer.len(), 2, "{answer:?}");
    assert_eq!(answer["location"], "/api/v1/nodes/n1/proxy/next");
}

/// A server with tenant `t` and `seed` created by an admin, asked `requests` as `user`.
async fn ask(
    seed: Vec<(Method, &str, Value)>,
    requests: Vec<(Method, &str)>,
    user: &str,
) -> Vec<(u16, HeaderMap, Value)> {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let dir = tempfile::tempdir().expect("dir");
    let storage: Arc<dyn flotilla_storage::Storage> = Arc::new(
        flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("store"),
    );
    let server = ApiServer::new(storage, "127.0.0.1:6443").expect("server");
    server.tenants.ensure(&server, "t").await.expect("tenant");
    let identity = |name: &str, groups: &[&str]| {
        crate::authn::InProcessIdentity(crate::authn::UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        })
    };
    for (method, path, body) in seed {
        let content_type = if method == Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body.to_string()))
            .expect("request");
        request
            .extensions_mut()
            .insert(identity("admin", &["system:masters"]));
        let response = server.router().oneshot(request).await.expect("answer");
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
    }
    let groups: &[&str] = if user == "admin" {
        &["system:masters"]
    } else {
        &["system:authenticated"]
    };
    let mut answers = Vec::new();
    for (method, path) in requests {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .expect("request");
        request.extensions_mut().insert(identity(user, groups));
        let response = server.router().oneshot(request).await.expect("answer");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        answers.push((
            parts.status.as_u16(),
            parts.headers,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        ));
    }
    answers
}

#[tokio::test]
async fn proxy_requests_are_refused_as_upstream_refuses_them() {
    let pods = "/clusters/t/api/v1/namespaces/default/pods";
    let services = "/clusters/t/api/v1/namespaces/default/services";
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "i"}]}})
    };
    let (loop_status, far_status) = (format!("{pods}/loop/status"), format!("{pods}/far/status"));
    let answers = ask(
        vec![
            (Method::POST, pods, pod("loop")),
            (Method::POST, pods, pod("far")),
            (Method::POST, pods, pod("unplaced")),
            (
                Method::PATCH,
                &loop_status,
                json!({"status": {"podIP": "127.0.0.1"}}),
            ),
            (
                Method::PATCH,
                &far_status,
                json!({"status": {"podIP": "10.255.0.9"}}),
            ),
            (
                Method::POST,
                services,
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "empty"},
                    "spec": {"ports": [{"port": 80}]}}),
            ),
            (
                Method::POST,
                "/clusters/t/api/v1/nodes",
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "meta"},
                    "status": {"addresses": [{"type": "InternalIP", "address": "169.254.169.254"}]}}),
            ),
        ],
        vec![
            (Method::GET, &format!("{pods}/missing/proxy/")),
            (Method::GET, &format!("{pods}/loop/proxy/x")),
            (Method::GET, &format!("{pods}/unplaced:80/proxy/x")),
            (Method::GET, &format!("{pods}/far:8080/proxy?a=b")),
            (Method::GET, &format!("{pods}/ftp:far:21/proxy/")),
            (Method::GET, &format!("{services}/empty:80/proxy/")),
            (Method::GET, &format!("{services}/empty:81/proxy/")),
            (Method::GET, "/clusters/t/api/v1/nodes/meta/proxy/healthz"),
            (Method::TRACE, &format!("{pods}/far/proxy/")),
        ],
        "admin",
    )
    .await;
    let said = |i: usize| {
        let (code, _, status) = &answers[i];
        (
            *code,
            status["reason"].as_str().unwrap_or("").to_string(),
            status["message"].as_str().unwrap_or("").to_string(),
        )
    };
    assert_eq!(
        said(0),
        (404, "NotFound".into(), "pods \"missing\" not found".into())
    );
    for i in [1, 2, 7] {
        assert_eq!(
            said(i),
            (400, "BadRequest".into(), "address not allowed".into()),
            "{i}"
        );
    }
    // No path at all: to the root with a slash, before anything is dialled.
    assert_eq!(answers[3].0, 301);
    assert_eq!(
        answers[3].1["location"],
        "/clusters/t/api/v1/namespaces/default/pods/far:8080/proxy/?a=b"
    );
    assert_eq!(
        said(4),
        (
            400,
            "BadRequest".into(),
            "invalid pod request \"ftp:far:21\"".into()
        )
    );
    assert_eq!(
        said(5),
        (
            503,
            "ServiceUnavailable".into(),
            "no endpoints available for service \"empty\"".into()
        )
    );
    assert_eq!(
        said(6),
        (
            503,
            "ServiceUnavailable".into(),
            "no service port 81 found for service \"empty\"".into()
        )
    );
    assert_eq!(said(8).0, 405);
}

#[tokio::test]
async fn proxying_needs_the_verb_of_the_method() {
    let pods = "/clusters/t/api/v1/namespaces/default/pods";
    let answers = ask(
        vec![],
        vec![
            (Method::GET, &format!("{pods}/web:80/proxy/")),
            (Method::POST, &format!("{pods}/web/proxy/submit")),
            (Method::GET, "/clusters/t/api/v1/nodes/n1/proxy/?watch=true"),
        ],
        "mallory",
    )
    .await;
    let messages: Vec<(u16, &str)> = answers
        .iter()
        .map(|(code, _, status)| (*code, status["message"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        messages,
        [
            (
                403,
                "pods \"web:80\" is forbidden: User \"mallory\" cannot get resource \"pods/proxy\" in API group \"\" in the namespace \"default\""
            ),
            (
                403,
                "pods \"web\" is forbidden: User \"mallory\" cannot create resource \"pods/proxy\" in API group \"\" in the namespace \"default\""
            ),
            (
                403,
                "nodes \"n1\" is forbidden: User \"mallory\" cannot get resource \"nodes/proxy\" in API group \"\" at the cluster scope"
            ),
        ]
    );
}
