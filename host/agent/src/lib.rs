//! allot-agent, the node agent: the allocation engine, the claim store and the policy runtime
//! behind the plugin's unix socket.
//!
//! The crate draws as layers, each module using only those below it:
//!
//! ```text
//! run                         wiring from the flags: store, policies, engine, node, tasks (the
//!                             periodic reload, feed and journal work), servers
//! server   args               HTTP over the node; flags
//! node (add, release, reload) one type owning the node's state and verbs (add, del, check, gc,
//!                             quarantine, reload, status, journal replay, expiries)
//! ahead   metrics   cluster   probing ahead; Prometheus metrics; cluster mode's indexes, Endpoints
//!                             and Policy follower
//! engine  config  journal  wire  inventory  standalone  recorded  memory  identity
//! ```
//!
//! [`node::Node`] is the seam: everything the plugin can ask is a method of it taking the wire
//! contract's request, so the request path is tested in process (`tests/suite/node.rs`) as well as
//! end to end through network namespaces (`tests/e2e`).

pub mod ahead;
pub mod args;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod identity;
pub mod inventory;
pub mod journal;
pub mod memory;
pub mod metrics;
pub mod node;
pub mod recorded;
pub mod run;
pub mod server;
pub mod standalone;
pub mod wire;
