//! How every Flotilla binary logs: the `--log-format` flag, `RUST_LOG` filtering, and a
//! subscriber writing to standard error with colour only on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The environment variable holding the filter directives (upstream's `tracing` syntax).
pub const FILTER_VARIABLE: &str = "RUST_LOG";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event; coloured only when standard error is a terminal.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields, spans), for log shippers.
    Json,
}

/// The logging flags every binary takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// How log lines on standard error are written; `RUST_LOG` filters them (e.g.
    /// `RUST_LOG=debug` or `RUST_LOG=info,kube=warn`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// The filter: `directives` (from `RUST_LOG`) when set and valid, else `default_directives` (a
/// bad `RUST_LOG` is reported once on standard error rather than silently dropping every line).
fn filter(directives: Option<&str>, default_directives: &str) -> EnvFilter {
    match directives {
        Some(directives) if !directives.trim().is_empty() => EnvFilter::try_new(directives)
            .unwrap_or_else(|err| {
                eprintln!("warning: ignoring {FILTER_VARIABLE}={directives:?}: {err}");
                EnvFilter::new(default_directives)
            }),
        _ => EnvFilter::new(default_directives),
    }
}

/// Installs the process's subscriber: standard error, `format`, filtered by `RUST_LOG` or
/// `default_directives`. A second call (tests) leaves the first subscriber in place.
pub fn init(args: &LogArgs, default_directives: &str) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(
            std::env::var(FILTER_VARIABLE).ok().as_deref(),
            default_directives,
        ))
        .with_writer(std::io::stderr);
    let installed = match args.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    drop(installed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn the_format_flag_parses_and_defaults_to_text() {
        let parsed = Cli::try_parse_from(["x"]).map(|cli| cli.log.log_format);
        assert_eq!(parsed.ok(), Some(LogFormat::Text));
        let parsed = Cli::try_parse_from(["x", "--log-format", "json"]).map(|c| c.log.log_format);
        assert_eq!(parsed.ok(), Some(LogFormat::Json));
        assert!(Cli::try_parse_from(["x", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn a_bad_filter_falls_back_to_the_default() {
        use tracing::metadata::LevelFilter;
        let hint = |directives, default| filter(directives, default).max_level_hint();
        assert_eq!(hint(None, "warn"), Some(LevelFilter::WARN));
        assert_eq!(hint(Some(" "), "warn"), Some(LevelFilter::WARN));
        assert_eq!(hint(Some("debug"), "warn"), Some(LevelFilter::DEBUG));
        // EnvFilter accepts most text; an invalid level is what it refuses.
        assert_eq!(
            hint(Some("info,foo=notalevel"), "warn"),
            Some(LevelFilter::WARN)
        );
    }
}
