//! The `flotilla-kms-plugin` binary: parses the command line, sets up logging and hands the
//! configuration to [`flotilla_kms_plugin::run`]. Exit codes: 0 stopped by a signal, 1 error
//! (one line on standard error), 2 bad usage (clap's).

use clap::Parser;
use flotilla_api_machinery::errors::error_chain;
use flotilla_kms_plugin::{Cli, Config};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    flotilla_logging::init(&cli.log, "info");
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(flotilla_kms_plugin::run(Config::from(cli))) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", error_chain(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
