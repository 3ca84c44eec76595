//! The agent's indexes, fed typed objects: no cluster. One test binary for the crate (one link,
//! not one per file).

mod cluster;
mod fleet;
mod index;
mod workloads;
