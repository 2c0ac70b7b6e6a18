//! A throwaway single-member etcd on free loopback ports, killed when dropped (tests and benches).
//!
//! Needs the `etcd` binary on PATH (Debian: `etcd-server`); without it, starting fails loudly
//! rather than letting an etcd test pass without having run.

use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flotilla_storage::EtcdStorage;
use tempfile::TempDir;

/// A running etcd; dropping it kills the process and deletes its data.
pub struct EtcdServer {
    child: Child,
    client_port: u16,
    dir: TempDir,
}

impl EtcdServer {
    /// Starts etcd and waits until its client port accepts connections.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// [`EtcdServer::start`] with extra command-line flags.
    pub fn start_with(flags: &[&str]) -> anyhow::Result<Self> {
        let Some(binary) = find_on_path("etcd") else {
            bail!("etcd not found on PATH: install etcd-server");
        };
        let mut last_error = None;
        // Free ports are found by binding and releasing them, which another process can race;
        // a retry with fresh ports covers that.
        for _ in 0..3 {
            match Self::try_start(&binary, flags) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("etcd did not start")))
    }

    fn try_start(binary: &PathBuf, flags: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("create etcd data dir")?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let log = File::create(dir.path().join("etcd.log")).context("create etcd log")?;
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(binary)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--initial-cluster-state=new")
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .args(flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("clone etcd log handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        let mut server = Self {
            child,
            client_port,
            dir,
        };
        server.wait_listening(Duration::from_secs(20))?;
        Ok(server)
    }

    fn wait_listening(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "etcd exited with {status} while starting:\n{}",
                    self.log_tail()
                );
            }
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.client_port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd did not listen within {timeout:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Connects a store, retrying while etcd elects itself leader after it starts listening.
    pub async fn connect(&self, prefix: Option<String>) -> anyhow::Result<EtcdStorage> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match EtcdStorage::connect(&[self.endpoint()], prefix.clone()).await {
                Ok(store) => return Ok(store),
                Err(error) if Instant::now() < deadline => {
                    tracing_free_log(&error);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    return Err(anyhow::Error::new(error).context(format!(
                        "connect to test etcd; its log:\n{}",
                        self.log_tail()
                    )));
                }
            }
        }
    }

    fn log_tail(&self) -> String {
        let mut log = String::new();
        if let Ok(mut file) = File::open(self.dir.path().join("etcd.log")) {
            let _ = file.read_to_string(&mut log);
        }
        let start = log.len().saturating_sub(4000);
        log.get(start..).unwrap_or_default().to_owned()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // SIGKILL: nothing of this etcd is worth a graceful shutdown.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tracing_free_log(error: &flotilla_storage::StorageError) {
    if std::env::var_os("STORAGE_TEST_VERBOSE").is_some() {
        eprintln!("etcd not ready yet: {error}");
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind a free port")?;
    Ok(listener.local_addr()?.port())
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
