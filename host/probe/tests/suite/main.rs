//! The conflict and gateway probes on veth pairs in network namespaces (root). One test binary
//! for the crate (one link, not one per file); [`common`] holds the namespaces they share.

mod common;
mod conflict;
mod crosscheck;
mod eintr;
mod flood;
mod gateway;
mod link_state;
mod port;
