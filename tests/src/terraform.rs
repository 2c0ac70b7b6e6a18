//! The real `terraform` binary driving `terraform-provider-flotilla` built beside `flotilla`:
//! a working directory with its own CLI configuration (`dev_overrides` pointing Terraform at
//! the provider, so no registry or `terraform init` is needed), run offline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, ensure};

/// Where the machine's Terraform is (`TERRAFORM` overrides).
fn terraform_bin() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("TERRAFORM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/terraform"));
    ensure!(
        path.exists(),
        "terraform not found at {} (install Terraform 1.11; set TERRAFORM)",
        path.display()
    );
    Ok(path)
}

/// A Terraform working directory using the provider built beside `flotilla`.
pub struct Terraform {
    bin: PathBuf,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Terraform {
    /// A new working directory with `main.tf`.
    pub fn new(main_tf: &str) -> anyhow::Result<Self> {
        let bin = terraform_bin()?;
        let provider = crate::flotilla_bin()?.with_file_name("terraform-provider-flotilla");
        ensure!(
            provider.exists(),
            "terraform-provider-flotilla not found at {}: build it first (`cargo build --workspace --bins`; tests/run does)",
            provider.display()
        );
        let dir = tempfile::tempdir()?;
        let provider_dir = provider.parent().context("the provider's directory")?;
        let cli_config = dir.path().join("cli.tfrc");
        std::fs::write(
            &cli_config,
            format!(
                "provider_installation {{\n  dev_overrides {{\n    \"flotilla/flotilla\" = \"{}\"\n  }}\n  direct {{}}\n}}\n",
                provider_dir.display()
            ),
        )?;
        std::fs::write(dir.path().join("main.tf"), main_tf)?;
        Ok(Terraform {
            bin,
            env: vec![
                (
                    "TF_CLI_CONFIG_FILE".into(),
                    cli_config.display().to_string(),
                ),
                // No call home to HashiCorp's update check.
                ("CHECKPOINT_DISABLE".into(), "1".into()),
                ("TF_IN_AUTOMATION".into(), "1".into()),
            ],
            dir,
        })
    }

    /// The working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces `main.tf`.
    pub fn write(&self, main_tf: &str) -> anyhow::Result<()> {
        Ok(std::fs::write(self.dir.path().join("main.tf"), main_tf)?)
    }

    /// Runs `terraform ARGS` with `env` added; its output, whatever its exit status.
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Output> {
        let mut command = Command::new(&self.bin);
        command
            .current_dir(self.dir.path())
            .args(args)
            .env_remove("FLOTILLA_CONFIG")
            .env_remove("FLOTILLA_ENDPOINT")
            .env_remove("FLOTILLA_API_KEY")
            .env_remove("FLOTILLA_CA_FILE")
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().context("running terraform")
    }

    /// `terraform ARGS -no-color`; stdout, failing with both streams when it exits non-zero.
    pub fn ok(&self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut all = args.to_vec();
        all.push("-no-color");
        let out = self.run(&all, env)?;
        ensure!(
            out.status.success(),
            "terraform {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `terraform ARGS -no-color`, which must fail; stdout and stderr together.
    pub fn fails(&self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut all = args.to_vec();
        all.push("-no-color");
        let out = self.run(&all, env)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(
            !out.status.success(),
            "terraform {} should have failed:\n{text}",
            args.join(" ")
        );
        Ok(text)
    }
}
