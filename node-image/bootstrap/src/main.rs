//! `flotilla-bootstrap`, a node image's first-boot unit: reads this instance's metadata
//! (IMDSv2: the `NodeConfig` user data, address, id, zone, host name), writes the kubelet's and
//! the proxy's configuration under the state directory, and exits; systemd then starts the
//! kubelet and proxy units, ordered after it. When the node cannot join it writes nothing,
//! prints one line saying why to standard error (the journal) and to the console (the
//! instance's console output), and exits 1.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use flotilla_node_bootstrap::firstboot::{self, Layout};
use flotilla_node_bootstrap::imds::{self, Imds};

/// The first-boot flags.
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-bootstrap",
    version,
    about = "A Flotilla node's first boot: instance metadata → kubelet and proxy configuration"
)]
struct Cli {
    /// The instance metadata service (EC2's by default).
    #[arg(long, env = imds::ENDPOINT_VARIABLE, default_value = imds::DEFAULT_ENDPOINT)]
    imds_endpoint: String,
    /// Where the node keeps its state (nothing is written elsewhere).
    #[arg(long, default_value = "/var/lib/flotilla")]
    state_dir: PathBuf,
    /// containerd's CRI socket, as the kubelet is to reach it.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    container_runtime_endpoint: String,
    /// Where the one-line failure is also written (the instance's console output).
    #[arg(long, default_value = "/dev/console")]
    console: PathBuf,
    #[command(flatten)]
    log: flotilla_logging::LogArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    flotilla_logging::init(&cli.log, "info");
    let layout = Layout {
        state_dir: cli.state_dir.clone(),
        runtime_endpoint: cli.container_runtime_endpoint.clone(),
    };
    let outcome = async {
        let imds = Imds::new(&cli.imds_endpoint)?;
        let (config, identity) = firstboot::read_instance(&imds).await?;
        firstboot::write_all(&firstboot::render(&config, &identity, &layout)?)?;
        Ok::<_, firstboot::FirstBootError>(identity)
    };
    match outcome.await {
        Ok(identity) => {
            tracing::info!(
                node = %identity.local_hostname,
                ip = %identity.local_ipv4,
                instance = %identity.instance_id,
                state = %layout.state_dir.display(),
                "node configured; the kubelet and proxy start from it"
            );
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            let line = format!("flotilla-bootstrap: this node cannot join: {err}");
            eprintln!("{line}");
            if let Ok(mut console) = std::fs::OpenOptions::new().append(true).open(&cli.console) {
                let _ = writeln!(console, "{line}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
