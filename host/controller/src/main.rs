//! allot-controller: garbage collection, pool lifecycle, subnet auto-pools, admission webhooks
//! and fleet ranges for a cluster, one leader at a time.

use std::process::ExitCode;

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
    let args = match allot_controller::args::ControllerArgs::parse_with_env() {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    match allot_controller::run::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = allot_core::store::report(e.as_ref());
            tracing::error!("{e}");
            eprintln!("allot-controller: {e}");
            ExitCode::FAILURE
        }
    }
}
