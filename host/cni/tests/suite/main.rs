//! The plugin's integration tests: the binary against a fake agent. One test binary for the
//! crate (one link, not one per file); [`harness`] is what the tests share.

mod harness;
mod plugin;
