//! allotctl's integration tests: the binary as users run it. One test binary for the crate
//! (one link, not one per file); each module is one command or duty.

mod allotctl;
mod fleet;
mod install;
mod policy_new;
