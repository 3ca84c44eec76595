//! The allocation engine over the in-memory store and a small policy ([`common`]): lifecycle,
//! given addresses, probe-ahead candidates, virtual machines. One test binary for the crate (one
//! link, not one per file).

mod ahead;
mod common;
mod cooldown;
mod engine;
mod given;
mod lifecycle;
mod virtual_machines;
