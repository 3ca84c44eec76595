//! The policy runtime against real components (the default policy, older contract versions,
//! hostile fixtures). One test binary for the crate (one link, not one per file); [`common`]
//! holds what they share.

mod common;
mod contract_versions;
mod default_policy;
mod given_addresses;
mod host;
mod hostile;
mod idle;
mod layers;
