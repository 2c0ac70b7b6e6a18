//! `flotilla-kubelet`, the node image's kubelet binary: parses flags, sets up logging and runs
//! [`flotilla_kubelet::run_until_signalled`].

use clap::Parser;

/// The kubelet's flags and the logging flags every Flotilla binary takes.
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-kubelet",
    version,
    about = "The Flotilla kubelet on containerd's CRI"
)]
struct Cli {
    #[command(flatten)]
    kubelet: flotilla_kubelet::KubeletArgs,
    #[command(flatten)]
    log: flotilla_logging::LogArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    flotilla_logging::init(&cli.log, flotilla_kubelet::DEFAULT_LOG_FILTER);
    flotilla_kubelet::run_until_signalled(cli.kubelet).await
}
