//! `allot`, the CNI IPAM plugin (CNI spec 1.1.0, results down-converted for 0.3.x, 0.4.0 and
//! 1.0.0 callers). It parses the CNI environment and network config, asks `allot-agent` over
//! its unix socket, optionally probes the addresses on the pod's link ([`probe`], through
//! `allot-probe`), and prints a CNI result or a CNI error object. Std plus httparse and the
//! probe crate: no async runtime, so it starts in about a millisecond.
//!
//! The binary (`src/main.rs`) only calls [`cmd::main_guarded`]; the parsers are a library so
//! that fuzz targets and tests reach them directly.

pub mod client;
pub mod cmd;
pub mod config;
pub mod env;
pub mod error;
pub mod probe;
pub use allot_api::journal;
pub mod result;
