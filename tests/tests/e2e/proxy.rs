//! The `proxy` subresources through the API server (the apiserver's `proxy` module) with
//! stock kubectl 1.32. On a fabric: a Service without a selector whose EndpointSlice names a
//! plain HTTP server on the host's fabric address (by port number, port name and scheme), a
//! Pod and a Node whose status name that address; methods, paths, queries and bodies passed
//! on, the caller's credentials not; a redirect and a page's links moved under the proxy's
//! path; an upgraded connection spliced; upstream's refusals (forbidden, not found, address
//! not allowed, unreachable). On a real node: its kubelet through `nodes/{name}/proxy` (HTTPS
//! with the cluster's kubelet client certificate) and busybox httpd through
//! `pods/{name}/proxy`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::{Fabric, SingleNode};
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath, until};

fn contains(text: &str, wanted: &str) -> anyhow::Result<()> {
    ensure!(text.contains(wanted), "expected {wanted:?} in:\n{text}");
    Ok(())
}

/// A plain HTTP/1.1 server on one address, a thread per connection: it answers what it was
/// asked (method, target, the headers the test looks at, the body); `/redirect` is a 302 to
/// `/landed`; an upgrade request is switched to protocol `echo`, which echoes bytes.
struct EchoServer {
    address: String,
    port: u16,
    stop: Arc<AtomicBool>,
}

impl EchoServer {
    fn start(ip: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((ip, 0)).context("binding the echo server")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    std::thread::spawn(move || {
                        let _ = answer(stream);
                    });
                }
            }
        });
        Ok(EchoServer {
            address: ip.to_string(),
            port,
            stop,
        })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect((self.address.as_str(), self.port));
    }
}

fn answer(stream: TcpStream) -> anyhow::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut body = Vec::new();
    if header("transfer-encoding").eq_ignore_ascii_case("chunked") {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim(), 16)?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let length: usize = header("content-length").parse().unwrap_or(0);
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    let mut stream = stream;
    if !header("upgrade").is_empty() {
        stream.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
        )?;
        let mut buffer = [0u8; 1024];
        loop {
            let read = reader.read(&mut buffer)?;
            if read == 0 {
                return Ok(());
            }
            stream.write_all(&buffer[..read])?;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if target.starts_with("/page") {
        // `/page/big`: past what the API server rewrites on its async workers.
        let filler = if target == "/page/big" {
            "<p>filler</p>".repeat(8 * 1024)
        } else {
            String::new()
        };
        let page = format!(
            r#"<html><body>{filler}<a href="/next">next</a> <img src="logo.png"></body></html>"#
        );
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
            page.len()
        )?;
        return Ok(());
    }
    if target.starts_with("/redirect") {
        stream.write_all(
            b"HTTP/1.1 302 Found\r\nLocation: /landed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return Ok(());
    }
    let text = format!(
        "{method} {target}\nforwarded-uri={}\nauthorization={}\nimpersonate={}\nlength={}{}\nbody={}\n",
        header("x-forwarded-uri"),
        header("authorization"),
        header("impersonate-user"),
        header("content-length"),
        header("transfer-encoding"),
        String::from_utf8_lossy(&body),
    );
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nAccess-Control-Allow-Origin: *\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    Ok(())
}

/// `kubectl get --raw PATH`.
fn raw(kubectl: &Kubectl, path: &str) -> anyhow::Result<String> {
    kubectl.ok(&["get", "--raw", path])
}

/// kubectl's error for `get --raw PATH` (with `extra` flags), which must fail.
fn raw_fails(kubectl: &Kubectl, path: &str, extra: &[&str]) -> anyhow::Result<String> {
    let mut args = vec!["get", "--raw", path];
    args.extend(extra);
    kubectl.fails(&args)
}

#[test]
fn proxy_reaches_services_pods_and_nodes_in_the_node_networks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Backends are dialled only inside the node networks: serve on the host's fabric address.
    let fabric = Fabric::start(dir.path())?;
    let ip = fabric.host_ip.clone();
    let echo = EchoServer::start(&ip)?;
    let port = echo.port.to_string();
    // A port nobody listens on.
    let closed = TcpListener::bind((ip.as_str(), 0))?.local_addr()?.port();
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: echo}}
spec:
  ports: [{{name: web, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-manual
  labels: {{kubernetes.io/service-name: echo, endpointslice.kubernetes.io/managed-by: e2e}}
addressType: IPv4
ports: [{{name: web, port: {port}, protocol: TCP}}]
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: true}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: gone}}
spec:
  ports: [{{port: 80, targetPort: {closed}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: gone-manual
  labels: {{kubernetes.io/service-name: gone, endpointslice.kubernetes.io/managed-by: e2e}}
addressType: IPv4
ports: [{{name: "", port: {closed}, protocol: TCP}}]
endpoints: [{{addresses: ["{ip}"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: target}}
spec:
  containers: [{{name: web, image: flotilla.local/busybox:1, ports: [{{containerPort: {port}}}]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: loopback}}
spec:
  containers: [{{name: web, image: flotilla.local/busybox:1}}]
---
apiVersion: v1
kind: Node
metadata: {{name: proxied}}
status:
  addresses: [{{type: InternalIP, address: "{ip}"}}]
"#
        ),
    )?;
    for (pod, address) in [("target", ip.as_str()), ("loopback", "127.0.0.1")] {
        kubectl.ok(&[
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"podIP":"{address}","podIPs":[{{"ip":"{address}"}}]}}}}"#),
        ])?;
    }

    // Services: by port number, port name and scheme, with the path and query passed on.
    let services = "/api/v1/namespaces/default/services";
    let seen = raw(
        &kubectl,
        &format!("{services}/echo:80/proxy/some/path?x=1&y=two"),
    )?;
    contains(&seen, "GET /some/path?x=1&y=two\n")?;
    contains(
        &seen,
        &format!("forwarded-uri={services}/echo:80/proxy/some/path\n"),
    )?;
    // The caller's credentials and identity headers stay with the API server.
    let impersonated = kubectl.ok(&[
        "get",
        "--raw",
        &format!("{services}/echo:web/proxy/who"),
        "--as=proxy-admin",
        "--as-group=system:masters",
    ])?;
    contains(&impersonated, "GET /who\n")?;
    contains(&impersonated, "authorization=\nimpersonate=\n")?;
    contains(
        &raw(&kubectl, &format!("{services}/http:echo:web/proxy/"))?,
        "GET /\n",
    )?;
    // A body and its method go through.
    let posted = kubectl.ok_stdin(
        &[
            "create",
            "--raw",
            &format!("{services}/echo:web/proxy/submit"),
            "-f",
            "-",
        ],
        "hello=world",
    )?;
    contains(&posted, "POST /submit\n")?;
    contains(&posted, "body=hello=world\n")?;
    // A redirect to the backend comes back under the proxy's path (kubectl follows it).
    contains(
        &raw(&kubectl, &format!("{services}/echo:80/proxy/redirect"))?,
        "GET /landed\n",
    )?;
    // So do the links of an HTML page (relative ones need nothing), a large one's too.
    for page in ["page", "page/big"] {
        contains(
            &raw(&kubectl, &format!("{services}/echo:80/proxy/{page}"))?,
            &format!(r#"<a href="{services}/echo:80/proxy/next">next</a> <img src="logo.png">"#),
        )?;
    }
    // Without a path: upstream's 301 to the path with a slash; a redirect as it came back.
    let (status, _) = kubectl.raw_get(&format!("{services}/echo:80/proxy"))?;
    ensure!(status == 301, "status {status} for the proxy's root");
    let (status, _) = kubectl.raw_get(&format!("{services}/echo:80/proxy/redirect"))?;
    ensure!(status == 302, "status {status} for a redirect");

    // Pods: the first declared container port, or the one named.
    let pods = "/api/v1/namespaces/default/pods";
    contains(
        &raw(&kubectl, &format!("{pods}/target/proxy/pod/path"))?,
        "GET /pod/path\n",
    )?;
    contains(
        &raw(&kubectl, &format!("{pods}/target:{port}/proxy/other"))?,
        "GET /other\n",
    )?;
    // Nodes: another port on the node over plain HTTP; the kubelet's port over HTTPS (nothing
    // listens there: upstream's 503).
    contains(
        &raw(
            &kubectl,
            &format!("/api/v1/nodes/proxied:{port}/proxy/metrics"),
        )?,
        "GET /metrics\n",
    )?;
    let kubelet = raw_fails(&kubectl, "/api/v1/nodes/proxied/proxy/healthz", &[])?;
    contains(&kubelet, "ServiceUnavailable")?;
    contains(&kubelet, "error trying to reach service: dial tcp")?;

    // An upgrade request is switched and spliced.
    upgrade_through_the_proxy(&f, &format!("{services}/echo:80/proxy/ws"))?;

    // Refusals, in upstream's words.
    let forbidden = raw_fails(
        &kubectl,
        &format!("{services}/echo:80/proxy/"),
        &["--as=nobody"],
    )?;
    contains(&forbidden, "Forbidden")?;
    contains(
        &forbidden,
        r#"services "echo:80" is forbidden: User "nobody" cannot get resource "services/proxy" in API group "" in the namespace "default""#,
    )?;
    contains(
        &raw_fails(&kubectl, &format!("{services}/missing/proxy/"), &[])?,
        r#"services "missing" not found"#,
    )?;
    contains(
        &raw_fails(&kubectl, &format!("{pods}/missing:80/proxy/"), &[])?,
        r#"pods "missing" not found"#,
    )?;
    contains(
        &raw_fails(&kubectl, &format!("{pods}/loopback:80/proxy/"), &[])?,
        "address not allowed",
    )?;
    let unreachable = raw_fails(&kubectl, &format!("{services}/gone:80/proxy/"), &[])?;
    contains(&unreachable, "ServiceUnavailable")?;
    contains(
        &unreachable,
        &format!("error trying to reach service: dial tcp {ip}:{closed}"),
    )?;
    contains(
        &raw_fails(&kubectl, &format!("{services}/echo:81/proxy/"), &[])?,
        r#"no service port 81 found for service "echo""#,
    )?;
    // Without a port, only an unnamed Service port is meant (upstream's reading).
    contains(
        &raw_fails(&kubectl, &format!("{services}/echo/proxy/"), &[])?,
        r#"no endpoints available for service "echo""#,
    )?;
    drop(echo);
    Ok(())
}

/// Sends an upgrade request for `path` over TLS with the admin kubeconfig's client
/// certificate, expects `101`, then echoes a line through the spliced connection.
fn upgrade_through_the_proxy(f: &Flotilla, path: &str) -> anyhow::Result<()> {
    use base64::Engine as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let config: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(&f.kubeconfig)?)?;
    let decode = |value: &serde_json::Value| -> anyhow::Result<Vec<u8>> {
        Ok(base64::engine::general_purpose::STANDARD
            .decode(value.as_str().context("kubeconfig field")?)?)
    };
    let cluster = &config["clusters"][0]["cluster"];
    let user = &config["users"][0]["user"];
    let server = cluster["server"].as_str().context("server")?;
    let rest = server.strip_prefix("https://").context("https server")?;
    let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    let mut roots = rustls::RootCertStore::empty();
    for certificate in
        CertificateDer::pem_slice_iter(&decode(&cluster["certificate-authority-data"])?)
    {
        roots.add(certificate?)?;
    }
    let chain = CertificateDer::pem_slice_iter(&decode(&user["client-certificate-data"])?)
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(&decode(&user["client-key-data"])?)?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)?;
    let mut connection =
        rustls::ClientConnection::new(Arc::new(tls), ServerName::try_from(host.to_string())?)?;
    let mut tcp = TcpStream::connect(authority)?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut stream = rustls::Stream::new(&mut connection, &mut tcp);
    write!(
        stream,
        "GET {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
    )?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ensure!(
            stream.read(&mut byte)? == 1,
            "the connection closed: {head:?}"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    ensure!(head.starts_with("HTTP/1.1 101"), "no upgrade: {head}");
    stream.write_all(b"ping through the proxy\n")?;
    let mut echoed = [0u8; 23];
    stream.read_exact(&mut echoed)?;
    ensure!(
        &echoed == b"ping through the proxy\n",
        "echoed {:?}",
        String::from_utf8_lossy(&echoed)
    );
    Ok(())
}

const NODE: &str = "proxy-e2e";
const POD_CIDR: &str = "10.244.81.0/24";

const WEB: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  nodeName: proxy-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    ports: [{containerPort: 8080}]
    command: [sh, -c, "echo started-web; mkdir -p /www && echo hello-through-the-pod-proxy > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#;

/// The host's route to the node's pods, removed when dropped (the fabric's interface goes
/// with the fabric anyway).
struct PodRoute;

impl Drop for PodRoute {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["route", "del", POD_CIDR])
            .status();
    }
}

#[test]
fn proxy_reaches_a_real_kubelet_and_a_pod_on_its_node() -> anyhow::Result<()> {
    let node = SingleNode::start(NODE, POD_CIDR, &[])?;
    let kubectl = node.flotilla.kubectl();
    let outcome = node.wait_ready(NODE).and_then(|()| {
        // The kubelet itself, over HTTPS with the cluster's kubelet client certificate.
        ensure!(
            raw(&kubectl, &format!("/api/v1/nodes/{NODE}/proxy/healthz"))?.trim() == "ok",
            "the kubelet's healthz"
        );
        node.flotilla.ok_stdin(&["apply", "-f", "-"], WEB)?;
        until("web is Running", Duration::from_secs(60), || {
            Ok(jsonpath(&kubectl, &["get", "pod", "web"], "{.status.phase}")? == "Running")
        })?;
        // A path the kubelet authorizes (its SubjectAccessReview of the API server's
        // certificate), proxied as it came.
        contains(
            &raw(
                &kubectl,
                &format!("/api/v1/nodes/{NODE}/proxy/containerLogs/default/web/httpd"),
            )?,
            "started-web",
        )?;
        // The pod network is behind the node: route it there from the host.
        let status = std::process::Command::new("ip")
            .args(["route", "replace", POD_CIDR, "via", &node.containerd.ip])
            .status()?;
        ensure!(status.success(), "ip route replace {POD_CIDR}");
        let _route = PodRoute;
        contains(
            &raw(
                &kubectl,
                "/api/v1/namespaces/default/pods/web/proxy/index.html",
            )?,
            "hello-through-the-pod-proxy",
        )?;
        Ok(())
    });
    outcome.with_context(|| format!("kubelet log:\n{}", node.kubelet.log()))
}
