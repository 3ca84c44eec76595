//! allot's core: the vocabulary every other crate speaks, the seams between them, and the pure
//! decision tables of each duty.
//!
//! - Vocabulary: addresses and address sets ([`addr`]), the objects users write ([`spec`]) and
//!   their checked forms ([`pool`]), blocks ([`block`]), configuration in force ([`config`]),
//!   objects read from documents ([`documents`]).
//! - Seams: the [`store::Store`] trait (claims) and the [`policy::Policy`] trait (which pools, in
//!   which order), with the data that crosses them.
//! - Tables: garbage collection ([`gc`]), auto-pools ([`autopool`]), fleet ranges ([`fleet`]),
//!   the audit ([`audit`]), migration from other IPAMs ([`migrate`]), declared addresses
//!   ([`declared`]), admission checks ([`edit`]).
//!
//! No I/O, no kube, no wasmtime, no tokio: everything here is a pure function or plain data (the
//! one clock read is [`store::system_clock`], the default behind the `Clock` seam; the one lock
//! is [`store::MemoryStore`]'s, the in-memory reference store that tests and the contract suite
//! use), so it is unit-tested in microseconds and shared by every adapter and binary. What holds
//! state lives in crates above it, as linkerd's policy-controller keeps its indexes and runtime
//! above its `core`: the allocation engine in `allot-engine`, the stores in `allot-store`.
//! A test (`tests/suite/layers.rs`) fails if core comes to depend on an allot crate or on one
//! that does I/O, or if its source reaches a file, socket, process or thread.

pub mod addr;
pub mod audit;
pub mod autopool;
pub mod block;
pub mod config;
pub mod declared;
pub mod documents;
pub mod dra;
pub mod edit;
pub mod fleet;
pub mod gc;
pub mod migrate;
pub mod policy;
pub mod pool;
pub mod spec;
pub mod store;

pub use addr::{AddrError, AddrSet, IpFamily};
pub use policy::{Inventory, Policy, PolicyError, PolicyErrorKind};
pub use pool::{Pool, PoolFacts, Reserved, SpecError, Subnet};
