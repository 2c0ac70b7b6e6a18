//! Applies nft scripts by running `nft -f -` (the only place the proxy touches nftables): one
//! script is one atomic transaction.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::render::TABLE;

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
}

/// How to run nft: `nft` itself, or a prefix such as `ip netns exec NS nft`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nft {
    command: Vec<String>,
}

impl Default for Nft {
    fn default() -> Self {
        Self {
            command: vec!["nft".to_string()],
        }
    }
}

impl Nft {
    /// Runs `command` (program and leading arguments) instead of plain `nft`.
    pub fn with_command(command: Vec<String>) -> Self {
        if command.is_empty() {
            return Self::default();
        }
        Self { command }
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

    /// `nft --version`: whether nft can run at all.
    pub fn version(&self) -> Result<String, NftError> {
        self.run(&["--version"], None)
            .map(|out| out.trim().to_string())
    }

    /// Lists the proxy's table (`nft list table ip kube-proxy`).
    pub fn list_table(&self) -> Result<String, NftError> {
        self.run(&["list", "table", "ip", TABLE], None)
    }

    /// Deletes the proxy's table (`--cleanup`); a missing table is fine.
    pub fn delete_table(&self) -> Result<(), NftError> {
        // "add" first makes the delete succeed whether or not the table exists.
        self.apply(&format!("add table ip {TABLE}\ndelete table ip {TABLE}\n"))
    }
}
