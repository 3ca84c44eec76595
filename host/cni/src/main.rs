//! `allot`, the CNI IPAM plugin (CNI spec 1.1.0, results down-converted for 0.3.x, 0.4.0 and
//! 1.0.0 callers). It parses the CNI environment and network config, asks `allot-agent` over
//! its unix socket, and prints a CNI result or a CNI error object. Std only plus httparse: no
//! async runtime, so it starts in about a millisecond.

mod client;
mod cmd;
mod config;
mod env;
mod error;
mod result;

fn main() {
    std::process::exit(cmd::main_guarded());
}
