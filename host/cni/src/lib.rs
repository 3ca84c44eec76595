//! `allot`, the CNI IPAM plugin (CNI spec 1.1.0, results down-converted for 0.3.x, 0.4.0 and
//! 1.0.0 callers). It parses the CNI environment and network config, asks `allot-agent` over
//! its unix socket, and prints a CNI result or a CNI error object. Std only plus httparse: no
//! async runtime, so it starts in about a millisecond.
//!
//! The binary (`src/main.rs`) only calls [`cmd::main_guarded`]; the parsers are a library so
//! that fuzz targets and tests reach them directly.

pub mod client;
pub mod cmd;
pub mod config;
pub mod env;
pub mod error;
pub mod journal;
pub mod result;
