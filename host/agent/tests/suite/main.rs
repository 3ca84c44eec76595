//! The agent's verbs called in process (no socket, no root) and its module layering. One test
//! binary for the crate (one link, not one per file).

mod cluster;
mod layers;
mod node;
