//! The `flotilla` binary: parses the command line, sets up logging and hands the command to
//! [`flotilla::run`]. Exit codes: 0 success, 1 error (one line on standard error), 2 bad usage
//! (clap's).

use clap::Parser;
use flotilla::Command;

/// jemalloc rather than glibc's malloc: the API server allocates and frees many short-lived
/// JSON trees, and glibc spent over a third of its CPU in malloc, free and chunk consolidation
/// (measured by `bench workloads` under perf).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = flotilla::Cli::parse();
    let default_filter = match &cli.command {
        Command::Kubelet(_) => flotilla_kubelet::DEFAULT_LOG_FILTER,
        Command::Proxy(_) => flotilla_proxy::command::DEFAULT_LOG_FILTER,
        _ => "info",
    };
    flotilla_logging::init(&cli.log, default_filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(flotilla::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
