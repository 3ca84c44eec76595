//! allot-agent: the node agent. Standalone mode reads pools from YAML files and serves the
//! allot CNI plugin over a unix socket.

mod ahead;
mod args;
mod cluster;
mod inventory;
mod journal;
mod memory;
mod metrics;
mod quarantine;
mod recorded;
mod server;
mod standalone;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = args::Args::parse();
    match args::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("allot-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
