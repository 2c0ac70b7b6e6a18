//! Applies nft scripts (the only place the proxy touches nftables): by running `nft -f -`, or,
//! for partial syncs when a [`Netlink`] socket is attached, as a netlink batch that needs no
//! nft cache. Either way one script is one atomic transaction.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::netlink::{Netlink, NetlinkError};
use crate::render::{TABLE, all_tables, is_proxy_table};

/// Errors of running nft.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// nft refused the transaction (nothing of it was applied).
    #[error("nft failed ({status}): {stderr}")]
    Failed {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The netlink path failed (nothing of the transaction was applied).
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// Which way a partial sync went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// As a netlink batch.
    Netlink,
    /// Through `nft -f -` (no socket, or a line the batch encoder does not know).
    Nft,
}

/// How to run nft: `nft` itself, or a prefix such as `ip netns exec NS nft`; and the netlink
/// socket partial syncs use, if any (it must be in the namespace that command reaches).
#[derive(Debug, Clone)]
pub struct Nft {
    command: Vec<String>,
    netlink: Option<Arc<Mutex<Netlink>>>,
}

impl Default for Nft {
    fn default() -> Self {
        Self {
            command: vec!["nft".to_string()],
            netlink: None,
        }
    }
}

impl Nft {
    /// Runs `command` (program and leading arguments) instead of plain `nft`.
    pub fn with_command(command: Vec<String>) -> Self {
        if command.is_empty() {
            return Self::default();
        }
        Self {
            command,
            netlink: None,
        }
    }

    /// Sends partial syncs through `netlink` (see [`Nft::apply_partial`]).
    pub fn with_netlink(mut self, netlink: Netlink) -> Self {
        self.netlink = Some(Arc::new(Mutex::new(netlink)));
        self
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
        let program = self.command[0].clone();
        let mut child = Command::new(&program)
            .args(&self.command[1..])
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| NftError::Spawn {
                program: program.clone(),
                source,
            })?;
        if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A write error means nft exited early; its status and stderr say why.
            let _ = pipe.write_all(script.as_bytes());
        }
        let output = child
            .wait_with_output()
            .map_err(|source| NftError::Spawn { program, source })?;
        if !output.status.success() {
            return Err(NftError::Failed {
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Applies one script as one transaction (`nft -f -`).
    pub fn apply(&self, script: &str) -> Result<(), NftError> {
        self.run(&["-f", "-"], Some(script)).map(|_| ())
    }

    /// Applies a partial sync's script as one transaction: as a netlink batch when a socket is
    /// attached and every line is a form the batch encoder knows (nft 1.0.6 would first fetch
    /// every chain and set of the namespace), otherwise through `nft -f -`.
    pub fn apply_partial(&self, script: &str) -> Result<Applied, NftError> {
        if let Some(netlink) = &self.netlink {
            let mut socket = netlink
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match socket.apply(script) {
                Ok(()) => return Ok(Applied::Netlink),
                Err(NetlinkError::Encode(err)) => {
                    tracing::debug!(%err, "partial sync goes through nft");
                }
                Err(err) => return Err(err.into()),
            }
        }
        self.apply(script).map(|()| Applied::Nft)
    }

    /// `nft --version`: whether nft can run at all.
    pub fn version(&self) -> Result<String, NftError> {
        self.run(&["--version"], None)
            .map(|out| out.trim().to_string())
    }

    /// Lists the proxy's tables that exist: `kube-proxy`, then its Service tables (fails when
    /// there is none).
    pub fn list_tables(&self) -> Result<String, NftError> {
        let ruleset = self.run(&["list", "ruleset", "ip"], None)?;
        // Each table is `table ip NAME {` … `}` with the closing brace alone on its line.
        let mut out = String::new();
        let mut keep = false;
        for line in ruleset.lines() {
            if let Some(header) = line.strip_prefix("table ip ") {
                keep = header.strip_suffix(" {").is_some_and(is_proxy_table);
            }
            if keep {
                out.push_str(line);
                out.push('\n');
            }
        }
        if out.is_empty() {
            // Not there: nft's own error says so.
            return self.run(&["list", "table", "ip", TABLE], None);
        }
        Ok(out)
    }

    /// Deletes the proxy's tables (`--cleanup`); missing ones are fine.
    pub fn delete_table(&self) -> Result<(), NftError> {
        // "add" first makes each delete succeed whether or not the table exists.
        let script: String = all_tables()
            .iter()
            .map(|name| format!("add table ip {name}\ndelete table ip {name}\n"))
            .collect();
        self.apply(&script)
    }
}
