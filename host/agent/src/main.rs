//! allot-agent: the node agent (see the library's documentation).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: not in a file, a pipe or a container's log.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    let args = allot_agent::args::Args::parse();
    match allot_agent::run::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = allot_core::store::report(e.as_ref());
            tracing::error!("{e}");
            eprintln!("allot-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
