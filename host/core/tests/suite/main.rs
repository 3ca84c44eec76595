//! Core's integration tests: its pure tables fed plain data, and its layering (no allot crate, no
//! I/O). One test binary for the crate (one link, not one per file).

mod autopool_carve;
mod autopool_plan;
mod config;
mod edit;
mod gc_table;
mod layers;
