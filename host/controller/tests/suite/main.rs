//! The controller's integration tests: each duty against the in-memory API server (or its
//! pure index). One test binary for the crate (one link, not one per file); [`common`] holds
//! the builders they share.

mod audit;
mod autopool;
mod common;
mod declared;
mod fleet;
mod fleet_api;
mod fleet_args;
mod fleet_decide;
mod fleet_growth;
mod gc;
mod gc_api;
mod lease;
mod pools;
mod uninstall;
mod webhook_admission;
mod webhook_api;
mod webhook_args;
mod webhook_certs;
mod webhook_declared;
mod webhook_tls;
