//! `flotilla-proxy`, the node image's proxy binary: parses flags, sets up logging and runs
//! [`flotilla_proxy::command::run_until_signalled`].

use clap::Parser;
use flotilla_proxy::command;

/// The proxy's flags and the logging flags every Flotilla binary takes.
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-proxy",
    version,
    about = "The Flotilla node proxy (nftables)"
)]
struct Cli {
    #[command(flatten)]
    proxy: command::ProxyArgs,
    #[command(flatten)]
    log: flotilla_logging::LogArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    flotilla_logging::init(&cli.log, command::DEFAULT_LOG_FILTER);
    command::run_until_signalled(cli.proxy).await
}
