//! What the benchmarks that drive the real binary share (`#[path]`-included): the binary,
//! `flotilla` child processes killed on drop, `flotilla up` started with its kubeconfig read
//! from its first line of output, and a kube-rs client of that kubeconfig.

#![allow(dead_code)] // each bench uses part of it

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// A child process killed on drop.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Its resident memory, in bytes.
    pub fn rss(&self) -> anyhow::Result<u64> {
        super::proc::rss(self.0.id())
    }

    /// The CPU time it has used so far.
    pub fn cpu(&self) -> Duration {
        super::proc::cpu(&self.0.id().to_string())
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

/// The `flotilla` binary (`FLOTILLA_BIN` overrides the one cargo built).
pub fn flotilla_bin() -> PathBuf {
    std::env::var_os("FLOTILLA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_flotilla")))
}

/// `flotilla ARGS`, its output discarded.
pub fn spawn(args: &[&str]) -> anyhow::Result<Process> {
    let child = Command::new(flotilla_bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting flotilla {args:?}"))?;
    Ok(Process(child))
}

/// `flotilla up --listen 127.0.0.1:0 ARGS --data-dir DIR`, its log to `stderr`; returns it
/// and the kubeconfig path it printed first. Its later output is read and dropped, so that
/// it never writes into a closed pipe.
pub fn start_up(dir: &Path, args: &[&str], stderr: Stdio) -> anyhow::Result<(Process, String)> {
    let mut child = Command::new(flotilla_bin())
        .args(["up", "--listen", "127.0.0.1:0"])
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting flotilla up {args:?}"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let process = Process(child);
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    std::thread::spawn(move || for _ in reader.lines() {});
    let kubeconfig = line.trim().to_string();
    if kubeconfig.is_empty() {
        bail!("flotilla up {args:?} printed no kubeconfig path");
    }
    Ok((process, kubeconfig))
}

/// A kube-rs client of `kubeconfig`.
pub async fn client(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}
