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
    _mirror: Option<tempfile::TempDir>,
}

/// The provider's version in mirrors (its crate's).
const PROVIDER_VERSION: &str = "0.1.0";

/// `terraform-provider-flotilla`, built beside `flotilla`.
fn provider_bin() -> anyhow::Result<PathBuf> {
    let provider = crate::flotilla_bin()?.with_file_name("terraform-provider-flotilla");
    ensure!(
        provider.exists(),
        "terraform-provider-flotilla not found at {}: build it first (`cargo build --workspace --bins`; tests/run does)",
        provider.display()
    );
    Ok(provider)
}

impl Terraform {
    /// A new working directory with `main.tf`, Terraform finding the provider through
    /// `dev_overrides` (no `terraform init`; only our provider can be used).
    pub fn new(main_tf: &str) -> anyhow::Result<Self> {
        let provider = provider_bin()?;
        let provider_dir = provider.parent().context("the provider's directory")?;
        Self::with_cli_config(
            main_tf,
            &format!(
                "provider_installation {{\n  dev_overrides {{\n    \"flotilla/flotilla\" = \"{}\"\n  }}\n  direct {{}}\n}}\n",
                provider_dir.display()
            ),
        )
    }

    /// A new working directory with `main.tf` for `terraform init`, offline: our provider
    /// from a filesystem mirror made here (as `terraform/install` makes one), hashicorp/aws
    /// from the machine's mirror (`/opt/tf-plugins`, `TF_PLUGIN_MIRROR` overrides).
    pub fn with_mirrors(main_tf: &str) -> anyhow::Result<Self> {
        let provider = provider_bin()?;
        let aws_mirror =
            std::env::var("TF_PLUGIN_MIRROR").unwrap_or_else(|_| "/opt/tf-plugins".into());
        ensure!(
            Path::new(&aws_mirror)
                .join("registry.terraform.io/hashicorp/aws")
                .exists(),
            "no hashicorp/aws in the provider mirror {aws_mirror} (set TF_PLUGIN_MIRROR)"
        );
        let mirror = tempfile::tempdir()?;
        let platform = mirror
            .path()
            .join("registry.terraform.io/flotilla/flotilla")
            .join(PROVIDER_VERSION)
            .join("linux_amd64");
        std::fs::create_dir_all(&platform)?;
        std::fs::copy(
            &provider,
            platform.join(format!("terraform-provider-flotilla_v{PROVIDER_VERSION}")),
        )?;
        let mut terraform = Self::with_cli_config(
            main_tf,
            &format!(
                "provider_installation {{\n  filesystem_mirror {{\n    path    = \"{}\"\n    include = [\"registry.terraform.io/flotilla/*\"]\n  }}\n  filesystem_mirror {{\n    path    = \"{aws_mirror}\"\n    include = [\"registry.terraform.io/hashicorp/*\"]\n  }}\n}}\n",
                mirror.path().display()
            ),
        )?;
        terraform._mirror = Some(mirror);
        Ok(terraform)
    }

    fn with_cli_config(main_tf: &str, cli_config_text: &str) -> anyhow::Result<Self> {
        let bin = terraform_bin()?;
        let dir = tempfile::tempdir()?;
        let cli_config = dir.path().join("cli.tfrc");
        std::fs::write(&cli_config, cli_config_text)?;
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
            _mirror: None,
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
