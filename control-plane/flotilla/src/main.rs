//! The `flotilla` binary: parses the command line and hands it to [`flotilla::main_with`].
//! Exit codes: 0 success, 1 error (one line on standard error), 2 bad usage (clap's).

use clap::Parser;

/// jemalloc rather than glibc's malloc: the API server allocates and frees many short-lived
/// JSON trees, and glibc spent over a third of its CPU in malloc, free and chunk consolidation
/// (measured by `bench workloads` under perf).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    flotilla::main_with(flotilla::Cli::parse())
}
