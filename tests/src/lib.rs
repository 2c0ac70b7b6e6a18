//! The end-to-end harness: starts real components (etcd, the `flotilla` binary) on loopback,
//! finds stock kubectl, and cleans up. A missing component fails the test with a clear message.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub mod aggregated_server;
pub mod browser;
pub mod https_server;
pub mod hypervisor;
pub mod imds;
pub mod nodes;
pub mod terraform;
pub mod vm;
pub mod webhook_server;

/// How long a component gets to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A free loopback port (the listener is dropped; the small race is acceptable in tests).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The target directory the test binary was built in (`…/target/debug`).
fn target_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // …/target/debug/deps/e2e-<hash> → …/target/debug
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("cannot locate the cargo target directory from the test binary")
}

/// The `flotilla` binary built from this workspace (`FLOTILLA_BIN` overrides).
pub fn flotilla_bin() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("FLOTILLA_BIN") {
        return Ok(PathBuf::from(path));
    }
    let path = target_dir()?.join("flotilla");
    if !path.exists() {
        bail!(
            "flotilla binary not found at {}: build it first (`cargo build -p flotilla`; tests/run does this)",
            path.display()
        );
    }
    Ok(path)
}

/// Stock kubectl 1.32 (`KUBECTL` overrides). The machine's `/usr/bin/kubectl` is a version
/// dispatcher, so the pinned 1.32 binary is used to test what a 1.32 user runs.
pub fn kubectl_bin() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("KUBECTL") {
        return Ok(PathBuf::from(path));
    }
    for candidate in [
        "/usr/lib/google-cloud-sdk/bin/kubectl.1.32",
        "/usr/local/bin/kubectl-1.32",
    ] {
        if Path::new(candidate).exists() {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!(
        "kubectl 1.32 not found (looked in /usr/lib/google-cloud-sdk/bin/kubectl.1.32; set KUBECTL)"
    )
}

/// A child process killed when dropped.
pub struct Process {
    child: Child,
}

impl Process {
    /// Kills the process with SIGKILL and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `done` every 200 ms until it holds, failing with "timed out waiting until {what}"
/// after `within`.
pub fn until(
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !done()? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// `kubectl ARGS -o jsonpath=PATH`, trimmed.
pub fn jsonpath(kubectl: &Kubectl, args: &[&str], path: &str) -> anyhow::Result<String> {
    let expression = format!("jsonpath={path}");
    let mut all = args.to_vec();
    all.extend(["-o", expression.as_str()]);
    Ok(kubectl.ok(&all)?.trim().to_string())
}

/// Runs `flotilla ARGS` in the background (e.g. `simulate-nodes`, `controller-manager`,
/// `scheduler`), its output discarded; killed when dropped.
pub fn flotilla_process(args: &[&str]) -> anyhow::Result<Process> {
    let child = Command::new(flotilla_bin()?)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting flotilla {}", args.join(" ")))?;
    Ok(Process { child })
}

/// `flotilla cloud-controller ARGS` against LocalStack: the AWS environment set (LocalStack
/// takes any credentials), output left to the caller.
pub fn cloud_controller_command(args: &[&str]) -> anyhow::Result<Command> {
    let mut command = Command::new(flotilla_bin()?);
    command
        .arg("cloud-controller")
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    Ok(command)
}

/// A real etcd on loopback (one member or several), each member with its own data directory.
pub struct Etcd {
    _members: Vec<Process>,
    _dir: tempfile::TempDir,
    /// The first member's client URL.
    pub endpoint: String,
    /// Every member's client URL.
    pub endpoints: Vec<String>,
}

impl Etcd {
    /// Starts a one-member etcd (the Debian `etcd-server` package) and waits until it answers.
    pub fn start() -> anyhow::Result<Self> {
        Self::cluster(1)
    }

    /// Starts an etcd cluster of `size` members on loopback ports and waits until each
    /// member answers.
    pub fn cluster(size: usize) -> anyhow::Result<Self> {
        let binary = which("etcd")
            .context("etcd not found on PATH: install etcd-server (tests/run does this)")?;
        let dir = tempfile::tempdir()?;
        let ports = (0..size)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<anyhow::Result<Vec<(u16, u16)>>>()?;
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        let mut endpoints = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let endpoint = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = Command::new(&binary)
                .arg("--name")
                .arg(format!("m{i}"))
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &endpoint])
                .args(["--advertise-client-urls", &endpoint])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-state", "new"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting etcd")?;
            members.push(Process { child });
            endpoints.push(endpoint);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for (client, _) in &ports {
            while std::net::TcpStream::connect(("127.0.0.1", *client)).is_err() {
                if Instant::now() > deadline {
                    bail!("etcd member on port {client} did not listen within {READY_TIMEOUT:?}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(Etcd {
            _members: members,
            _dir: dir,
            endpoint: endpoints[0].clone(),
            endpoints,
        })
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

/// A command's stdout when it exited zero, else an error carrying its stderr.
fn succeeded(program: &str, args: &[&str], out: Output) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A Python virtualenv with `requirement` installed: `$env_var`, or `default` (under
/// `/var/cache`), made once with `python3 -m venv` and pip. `ready(venv)` says whether what
/// the test needs is there; it is asked before and after installing.
pub fn python_venv(
    env_var: &str,
    default: &str,
    requirement: &str,
    ready: impl Fn(&Path) -> bool,
) -> anyhow::Result<PathBuf> {
    let venv = std::env::var(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(default));
    if ready(&venv) {
        return Ok(venv);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .context("python3 with venv is needed (tests/run installs it)")?;
    if !made.status.success() {
        bail!(
            "python3 -m venv {} failed: {}",
            venv.display(),
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", requirement])
        .output()
        .context("running pip")?;
    if !installed.status.success() || !ready(&venv) {
        bail!(
            "pip install {requirement} failed: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
    }
    Ok(venv)
}

/// Which store a `flotilla up` runs on.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded store in the data directory.
    Embedded,
    /// A real etcd.
    Etcd(String),
}

/// A running `flotilla up` with its data directory and admin kubeconfig.
pub struct Flotilla {
    process: Option<Process>,
    dir: tempfile::TempDir,
    backend: Backend,
    host: String,
    port: u16,
    extra_args: Vec<String>,
    /// Every line `flotilla up` printed on standard output, in order.
    stdout: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Where standard error goes (inherited when `None`).
    stderr_file: Option<PathBuf>,
    /// Environment variables set for the process.
    env: Vec<(String, String)>,
    /// The admin kubeconfig `flotilla up` wrote.
    pub kubeconfig: PathBuf,
}

impl Flotilla {
    /// Starts `flotilla up` on `backend` and waits for its kubeconfig.
    pub fn up(backend: Backend) -> anyhow::Result<Self> {
        Self::up_with(backend, &[])
    }

    /// Starts `flotilla up` with extra flags (e.g. `--external-control-loops`).
    pub fn up_with(backend: Backend, extra_args: &[&str]) -> anyhow::Result<Self> {
        Self::up_at(backend, "127.0.0.1", extra_args)
    }

    /// Starts `flotilla up` listening on `host` (e.g. a fabric's host address, so that nodes in
    /// network namespaces reach it); its kubeconfig names that address.
    pub fn up_at(backend: Backend, host: &str, extra_args: &[&str]) -> anyhow::Result<Self> {
        let mut args: Vec<&str> = extra_args.to_vec();
        // `up` starts a local node when the machine can host one; the suites that want nodes
        // ask for them, the others get the control plane alone.
        if !args.contains(&"--nodes") {
            args.extend(["--nodes", "0"]);
        }
        let mut flotilla = Self::prepare(backend, host, &args, None)?;
        flotilla.start()?;
        Ok(flotilla)
    }

    /// [`Flotilla::up`] with its data directory in `dir` (e.g. a small tmpfs mounted there,
    /// so that a test can fill its disk).
    pub fn up_in(backend: Backend, dir: tempfile::TempDir) -> anyhow::Result<Self> {
        let mut flotilla = Self::prepare(backend, "127.0.0.1", &["--nodes", "0"], None)?;
        flotilla.dir = dir;
        flotilla.kubeconfig = flotilla.dir.path().join("kubeconfig");
        flotilla.start()?;
        Ok(flotilla)
    }

    /// Whether the process is still running (a fault may have stopped it).
    pub fn running(&mut self) -> bool {
        self.process
            .as_mut()
            .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)))
    }

    /// The process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.child.id())
    }

    /// Starts `flotilla up` exactly as a user types it, with `extra_args` only (no `--nodes`
    /// added) and `env` set, its standard error written to `stderr_file` when given.
    pub fn up_as_typed(
        backend: Backend,
        extra_args: &[&str],
        env: &[(&str, &str)],
        stderr_file: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let mut flotilla = Self::prepare(backend, "127.0.0.1", extra_args, stderr_file)?;
        flotilla.env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        flotilla.start()?;
        Ok(flotilla)
    }

    fn prepare(
        backend: Backend,
        host: &str,
        extra_args: &[&str],
        stderr_file: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let flotilla = Flotilla {
            process: None,
            kubeconfig: dir.path().join("kubeconfig"),
            dir,
            backend,
            host: host.to_string(),
            port,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            stdout: Default::default(),
            stderr_file,
            env: Vec::new(),
        };
        Ok(flotilla)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let mut command = Command::new(flotilla_bin()?);
        command
            .arg("up")
            .arg("--data-dir")
            .arg(self.dir.path())
            .arg("--listen")
            .arg(format!("{}:{}", self.host, self.port))
            .args(&self.extra_args)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::piped());
        match &self.stderr_file {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                command.stderr(file);
            }
            None => {
                command.stderr(Stdio::inherit());
            }
        }
        if let Backend::Etcd(endpoint) = &self.backend {
            command.arg("--etcd").arg(endpoint);
        }
        let mut child = command.spawn().context("starting flotilla up")?;
        let stdout = child.stdout.take().context("flotilla stdout")?;
        let process = Process { child };
        // `flotilla up` prints the kubeconfig path once it is listening, then the rest.
        let (tx, rx) = std::sync::mpsc::channel();
        let printed = self.stdout.clone();
        std::thread::spawn(move || {
            for (index, line) in BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .enumerate()
            {
                if index == 0 {
                    let _ = tx.send(line.clone());
                }
                if let Ok(mut printed) = printed.lock() {
                    printed.push(line);
                }
            }
        });
        let line = rx
            .recv_timeout(READY_TIMEOUT)
            .context("flotilla up did not print its kubeconfig path in time")?;
        self.kubeconfig = PathBuf::from(line.trim());
        self.process = Some(process);
        Ok(())
    }

    /// Every line `flotilla up` has printed on standard output so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout
            .lock()
            .map(|lines| lines.clone())
            .unwrap_or_default()
    }

    /// Stops the service (SIGKILL when `hard`, else SIGTERM) and starts it again on the same
    /// data directory and port.
    pub fn restart(&mut self, hard: bool) -> anyhow::Result<()> {
        self.stop(hard, Duration::from_secs(15));
        self.start()
    }

    /// Stops the service: SIGTERM first (unless `hard`), SIGKILL after `grace`.
    pub fn stop(&mut self, hard: bool, grace: Duration) {
        if let Some(mut process) = self.process.take() {
            if !hard {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(process.child.id().to_string())
                    .status();
                let deadline = Instant::now() + grace;
                while matches!(process.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            process.kill();
        }
    }

    /// kubectl 1.32 with this service's admin kubeconfig.
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(&self.kubeconfig)
    }

    /// Runs kubectl and returns stdout, failing with stderr when it exits non-zero.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl().ok(args)
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl().fails(args)
    }

    /// Runs kubectl with a manifest on standard input (`-f -`).
    pub fn ok_stdin(&self, args: &[&str], manifest: &str) -> anyhow::Result<String> {
        self.kubectl().ok_stdin(args, manifest)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Stock kubectl 1.32 with one kubeconfig.
pub struct Kubectl {
    /// The kubeconfig it uses.
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    /// Creates bootstrap token `id.secret` in kube-system (authentication usage), as a cluster
    /// admin hands one to joining nodes.
    pub fn create_bootstrap_token(&self, id: &str, secret: &str) -> anyhow::Result<()> {
        self.ok(&[
            "-n",
            "kube-system",
            "create",
            "secret",
            "generic",
            &format!("bootstrap-token-{id}"),
            "--type",
            "bootstrap.kubernetes.io/token",
            "--from-literal",
            &format!("token-id={id}"),
            "--from-literal",
            &format!("token-secret={secret}"),
            "--from-literal",
            "usage-bootstrap-authentication=true",
        ])?;
        Ok(())
    }

    /// kubectl with `kubeconfig`.
    pub fn new(kubeconfig: &Path) -> Self {
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// Runs kubectl with optional standard input and extra environment.
    pub fn run(
        &self,
        args: &[&str],
        stdin: Option<&str>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Output> {
        let mut command = Command::new(kubectl_bin()?);
        command.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        for (k, v) in env {
            command.env(k, v);
        }
        run_with_stdin(command, stdin)
    }

    /// Runs kubectl and returns stdout, failing with stderr when it exits non-zero.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        succeeded("kubectl", args, self.run(args, None, &[])?)
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> anyhow::Result<String> {
        failed("kubectl", args, self.run(args, None, &[])?)
    }

    /// Runs kubectl with a manifest on standard input (`-f -`).
    pub fn ok_stdin(&self, args: &[&str], manifest: &str) -> anyhow::Result<String> {
        succeeded("kubectl", args, self.run(args, Some(manifest), &[])?)
    }

    /// This kubeconfig's cluster with `token` as the only credential (no client certificate).
    pub fn with_token(&self, token: &str) -> anyhow::Result<Kubectl> {
        let mut config: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&self.kubeconfig)?)?;
        config["users"][0]["user"] = serde_json::json!({ "token": token });
        let file = self.kubeconfig.with_extension(format!(
            "token-{}.kubeconfig",
            token.len() + token.bytes().map(usize::from).sum::<usize>()
        ));
        std::fs::write(&file, serde_yaml::to_string(&config)?)?;
        Ok(Kubectl::new(&file))
    }

    /// The same credentials against another `https://host:port` (another replica).
    pub fn via(&self, url: &str) -> anyhow::Result<Kubectl> {
        let mut config: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&self.kubeconfig)?)?;
        let server = config["clusters"][0]["cluster"]["server"]
            .as_str()
            .context("kubeconfig lacks a server")?;
        let path = server
            .find("/clusters/")
            .map(|at| &server[at..])
            .unwrap_or_default()
            .to_string();
        config["clusters"][0]["cluster"]["server"] = serde_json::json!(format!("{url}{path}"));
        let port = url.rsplit(':').next().unwrap_or("other");
        let file = self
            .kubeconfig
            .with_extension(format!("via-{port}.kubeconfig"));
        std::fs::write(&file, serde_yaml::to_string(&config)?)?;
        Ok(Kubectl::new(&file))
    }

    /// `GET server-URL + path` with this kubeconfig's credentials, through curl: (HTTP status,
    /// body). kubectl's own `get --raw` sends `path` without the server URL's `/clusters/{id}`
    /// (the service then routes by the credential), so it cannot aim one cluster's credential
    /// at another cluster's path; curl can.
    pub fn raw_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.curl(path, None)
    }

    /// `GET server-URL + path` with `Authorization: Bearer TOKEN` instead of the kubeconfig's
    /// client certificate.
    pub fn raw_get_bearer(&self, path: &str, token: &str) -> anyhow::Result<(u16, String)> {
        self.curl(path, Some(token))
    }

    fn curl(&self, path: &str, bearer: Option<&str>) -> anyhow::Result<(u16, String)> {
        let config: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&self.kubeconfig)?)?;
        let cluster = &config["clusters"][0]["cluster"];
        let user = &config["users"][0]["user"];
        let dir = tempfile::tempdir()?;
        let mut files = Vec::new();
        for (field, value) in [
            ("ca", &cluster["certificate-authority-data"]),
            ("cert", &user["client-certificate-data"]),
            ("key", &user["client-key-data"]),
        ] {
            use base64::Engine;
            let data = value
                .as_str()
                .with_context(|| format!("kubeconfig lacks {field}"))?;
            let path = dir.path().join(field);
            std::fs::write(
                &path,
                base64::engine::general_purpose::STANDARD.decode(data)?,
            )?;
            files.push(path);
        }
        let server = cluster["server"]
            .as_str()
            .context("kubeconfig lacks a server")?;
        let mut command = Command::new("curl");
        command
            .args(["-sS", "-w", "\n%{http_code}", "--cacert"])
            .arg(&files[0]);
        match bearer {
            Some(token) => {
                command.args(["-H", &format!("Authorization: Bearer {token}")]);
            }
            None => {
                command
                    .arg("--cert")
                    .arg(&files[1])
                    .arg("--key")
                    .arg(&files[2]);
            }
        }
        let out = command
            .arg(format!("{server}{path}"))
            .output()
            .context("running curl")?;
        if !out.status.success() {
            bail!("curl failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8(out.stdout)?;
        let (body, status) = text.rsplit_once('\n').context("curl printed no status")?;
        Ok((status.trim().parse()?, body.to_string()))
    }
}

fn run_with_stdin(mut command: Command, stdin: Option<&str>) -> anyhow::Result<Output> {
    command.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .with_context(|| format!("running {:?}", command.get_program()))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(input.as_bytes())?;
    }
    Ok(child.wait_with_output()?)
}

/// stderr of a command that was expected to fail, or an error if it succeeded.
fn failed(program: &str, args: &[&str], out: Output) -> anyhow::Result<String> {
    if out.status.success() {
        bail!(
            "{program} {} unexpectedly succeeded: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The `flotilla` client commands with one client configuration (`FLOTILLA_CONFIG`).
pub struct FlotillaCli {
    /// The client configuration file.
    pub config: PathBuf,
}

impl FlotillaCli {
    /// Runs `flotilla ARGS`; returns stdout, failing with stderr when it exits non-zero.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        succeeded("flotilla", args, self.run(args)?)
    }

    /// Runs `flotilla ARGS` expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> anyhow::Result<String> {
        failed("flotilla", args, self.run(args)?)
    }

    /// Runs `flotilla ARGS` with extra environment variables (secrets kept off the command
    /// line); returns stdout, failing with stderr when it exits non-zero.
    pub fn ok_env(&self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut command = self.command(args)?;
        command.envs(env.iter().copied());
        succeeded("flotilla", args, run_with_stdin(command, None)?)
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        run_with_stdin(self.command(args)?, None)
    }

    fn command(&self, args: &[&str]) -> anyhow::Result<Command> {
        let mut command = Command::new(flotilla_bin()?);
        command
            .args(args)
            .env("FLOTILLA_CONFIG", &self.config)
            .env_remove("FLOTILLA_ENDPOINT")
            .env_remove("FLOTILLA_API_KEY")
            .env_remove("FLOTILLA_CA_FILE");
        Ok(command)
    }

    /// The same caller through another replica of the service.
    pub fn via(&self, replica: &Serve) -> anyhow::Result<FlotillaCli> {
        let mut settings = self.settings()?;
        settings["endpoint"] = serde_json::json!(replica.url());
        let stem = self
            .config
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("client");
        let config = replica
            .dir()
            .join(format!("{stem}-via-{}.json", replica.port));
        std::fs::write(&config, serde_json::to_vec_pretty(&settings)?)?;
        Ok(FlotillaCli { config })
    }

    /// The configuration's fields (endpoint, apiKey, caPem).
    pub fn settings(&self) -> anyhow::Result<serde_json::Value> {
        let text = std::fs::read_to_string(&self.config)?;
        Ok(serde_json::from_str(&text)?)
    }
}

/// The key-encryption key file of every replica serving from the etcd at `etcd_url`: replicas
/// sharing one store must seal with one key. Kept in the temporary directory by the etcd's
/// address; a file left by an earlier run on the same port opens an empty store just as well.
fn shared_key_encryption_key(etcd_url: &str) -> std::path::PathBuf {
    let name: String = etcd_url
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    std::env::temp_dir().join(format!("flotilla-e2e-kek-{name}"))
}

/// A running `flotilla serve` on etcd, and its operator's client configuration.
pub struct Serve {
    process: Option<Process>,
    dir: tempfile::TempDir,
    etcd: String,
    args: Vec<String>,
    /// `RUST_LOG` and the file standard error goes to, when its log is kept.
    log: Option<(String, PathBuf)>,
    /// The port it listens on (loopback).
    pub port: u16,
}

impl Serve {
    /// [`Serve::start_with`], its standard error kept in `log_file` (JSON lines) under the
    /// `RUST_LOG` filter `filter`, for tests that read what it did and when.
    pub fn start_logging(
        etcd: &str,
        args: &[&str],
        filter: &str,
        log_file: PathBuf,
    ) -> anyhow::Result<Self> {
        let mut serve = Serve {
            process: None,
            dir: tempfile::tempdir()?,
            etcd: etcd.to_string(),
            port: free_port()?,
            args: args
                .iter()
                .map(|a| a.to_string())
                .chain(["--log-format".to_string(), "json".to_string()])
                .collect(),
            log: Some((filter.to_string(), log_file)),
        };
        serve.launch()?;
        Ok(serve)
    }

    /// Starts `flotilla serve --etcd ETCD` on a free loopback port and waits until it serves.
    pub fn start(etcd: &str) -> anyhow::Result<Self> {
        Self::start_with(etcd, &[])
    }

    /// [`Serve::start`] with extra command-line arguments.
    pub fn start_with(etcd: &str, args: &[&str]) -> anyhow::Result<Self> {
        let mut serve = Serve {
            process: None,
            dir: tempfile::tempdir()?,
            etcd: etcd.to_string(),
            port: free_port()?,
            args: args.iter().map(|a| a.to_string()).collect(),
            log: None,
        };
        serve.launch()?;
        Ok(serve)
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        let operator = self.operator_config();
        let _ = std::fs::remove_file(&operator);
        let (filter, stderr) = match &self.log {
            Some((filter, file)) => (
                filter.as_str(),
                Stdio::from(
                    std::fs::File::create(file)
                        .with_context(|| format!("creating {}", file.display()))?,
                ),
            ),
            None => ("warn", Stdio::inherit()),
        };
        let child = Command::new(flotilla_bin()?)
            .arg("serve")
            .arg("--etcd")
            .arg(&self.etcd)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--operator-config")
            .arg(&operator)
            .arg("--key-encryption-key-file")
            .arg(shared_key_encryption_key(&self.etcd))
            .args(&self.args)
            .env("RUST_LOG", filter)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting flotilla serve")?;
        self.process = Some(Process { child });
        let deadline = Instant::now() + READY_TIMEOUT;
        // The operator configuration is written once the service is set up.
        while !operator.exists() || std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
        {
            if Instant::now() > deadline {
                bail!("flotilla serve did not come up within {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The operator's client configuration file.
    pub fn operator_config(&self) -> PathBuf {
        self.dir.path().join("operator.json")
    }

    /// The client commands as the operator.
    pub fn operator(&self) -> FlotillaCli {
        FlotillaCli {
            config: self.operator_config(),
        }
    }

    /// Creates account `id` and returns the client commands with its first API key.
    pub fn account(&self, id: &str) -> anyhow::Result<FlotillaCli> {
        let operator = self.operator();
        let key: serde_json::Value =
            serde_json::from_str(&operator.ok(&["account", "create", id, "-o", "json"])?)?;
        let mut settings = operator.settings()?;
        settings["apiKey"] = key["apiKey"].clone();
        let config = self.dir.path().join(format!("{id}.json"));
        std::fs::write(&config, serde_json::to_vec_pretty(&settings)?)?;
        Ok(FlotillaCli { config })
    }

    /// A scratch directory that lives as long as the service.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the service with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Kills the service and starts it again with the same flags and store.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.launch()
    }
}

/// LocalStack (EC2, EBS, ELBv2 from moto) on a free loopback port, installed and started by
/// `tests/localstack/` (which needs only PyPI); stopped when dropped.
pub struct LocalStack {
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// `http://127.0.0.1:PORT`, the endpoint override of a cluster's `cloud` section.
    pub endpoint: String,
}

/// A VPC with one subnet in each of two zones, tagged for load balancers.
#[derive(Debug, Clone)]
pub struct AwsNetwork {
    /// The VPC.
    pub vpc_id: String,
    /// Subnets in `us-east-1a` and `us-east-1b`.
    pub subnet_ids: Vec<String>,
}

fn localstack_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("localstack")
        .join(name)
}

impl LocalStack {
    /// Installs LocalStack when missing (a no-op when up to date) and starts it.
    pub fn start() -> anyhow::Result<Self> {
        let install = Command::new(localstack_script("install"))
            .output()
            .context("running tests/localstack/install")?;
        if !install.status.success() {
            bail!(
                "LocalStack is not installed and tests/localstack/install failed: {}{}",
                String::from_utf8_lossy(&install.stdout),
                String::from_utf8_lossy(&install.stderr)
            );
        }
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let localstack = LocalStack {
            dir,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        localstack.resume()?;
        Ok(localstack)
    }

    /// Starts it again after [`LocalStack::pause`], on the same port (its state is kept only
    /// in memory, so use this only for faults between calls, not to keep resources).
    pub fn resume(&self) -> anyhow::Result<()> {
        let started = Command::new(localstack_script("start"))
            .arg(self.dir.path())
            .arg(self.port.to_string())
            .output()
            .context("running tests/localstack/start")?;
        if !started.status.success() {
            bail!(
                "LocalStack did not start: {}{}",
                String::from_utf8_lossy(&started.stdout),
                String::from_utf8_lossy(&started.stderr)
            );
        }
        Ok(())
    }

    /// Stops it.
    pub fn pause(&self) {
        let _ = Command::new(localstack_script("stop"))
            .arg(self.dir.path())
            .output();
    }

    /// One AWS call (`ec2`, `describe_instances`, keyword arguments) through boto3; an AWS
    /// error is `Ok(Err((code, message)))`.
    pub fn try_call(
        &self,
        service: &str,
        operation: &str,
        arguments: serde_json::Value,
    ) -> anyhow::Result<Result<serde_json::Value, (String, String)>> {
        aws_call(self.port, service, operation, arguments)
    }

    /// As [`LocalStack::try_call`], an AWS error being a test failure.
    pub fn call(
        &self,
        service: &str,
        operation: &str,
        arguments: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        match self.try_call(service, operation, arguments)? {
            Ok(answer) => Ok(answer),
            Err((code, message)) => bail!("{service} {operation}: {code}: {message}"),
        }
    }

    /// Replaces LocalStack's fault rules (`tests/localstack`'s subset of the Chaos API):
    /// e.g. `[{"service": "ec2", "operation": "RunInstances", "error": {"statusCode": 400,
    /// "code": "InsufficientInstanceCapacity"}}]`; `[]` clears them.
    pub fn set_faults(&self, rules: serde_json::Value) -> anyhow::Result<()> {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-f",
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
            ])
            .arg(rules.to_string())
            .arg(format!("{}/_localstack/chaos/faults", self.endpoint))
            .output()
            .context("running curl")?;
        if !out.status.success() {
            bail!(
                "setting LocalStack faults failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A VPC `10.77.0.0/16` with subnets in `us-east-1a` and `us-east-1b`, both tagged
    /// `kubernetes.io/role/elb=1` (upstream's subnet discovery tag for public load balancers).
    pub fn network(&self) -> anyhow::Result<AwsNetwork> {
        let vpc = self.call(
            "ec2",
            "create_vpc",
            serde_json::json!({"CidrBlock": "10.77.0.0/16"}),
        )?;
        let vpc_id = vpc["Vpc"]["VpcId"]
            .as_str()
            .context("create_vpc answered no VpcId")?
            .to_string();
        let mut subnet_ids = Vec::new();
        for (index, zone) in ["us-east-1a", "us-east-1b"].iter().enumerate() {
            let subnet = self.call(
                "ec2",
                "create_subnet",
                serde_json::json!({
                    "VpcId": vpc_id,
                    "CidrBlock": format!("10.77.{}.0/24", index + 1),
                    "AvailabilityZone": zone,
                    "TagSpecifications": [{"ResourceType": "subnet", "Tags": [
                        {"Key": "kubernetes.io/role/elb", "Value": "1"}]}],
                }),
            )?;
            subnet_ids.push(
                subnet["Subnet"]["SubnetId"]
                    .as_str()
                    .context("create_subnet answered no SubnetId")?
                    .to_string(),
            );
        }
        Ok(AwsNetwork { vpc_id, subnet_ids })
    }
}

/// One AWS call against LocalStack on `port` (see [`LocalStack::try_call`]).
pub fn aws_call(
    port: u16,
    service: &str,
    operation: &str,
    arguments: serde_json::Value,
) -> anyhow::Result<Result<serde_json::Value, (String, String)>> {
    let output = Command::new(localstack_script("aws"))
        .arg(port.to_string())
        .arg(service)
        .arg(operation)
        .arg(arguments.to_string())
        .output()
        .context("running tests/localstack/aws")?;
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "{service} {operation} printed no JSON: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    if let Some(error) = answer.get("Error") {
        let text = |field: &str| error[field].as_str().unwrap_or_default().to_string();
        return Ok(Err((text("Code"), text("Message"))));
    }
    Ok(Ok(answer))
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        self.pause();
    }
}
