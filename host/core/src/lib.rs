//! allot's core: the domain model, address-set arithmetic and decision logic.
//!
//! No I/O, no kube, no wasmtime, no tokio: everything here is a pure function or plain data, so
//! it is unit-tested in microseconds and shared by every adapter and binary.

pub mod addr;
pub mod audit;
pub mod autopool;
pub mod block;
pub mod config;
pub mod declared;
pub mod documents;
pub mod edit;
pub mod engine;
pub mod fleet;
pub mod free;
pub mod gc;
pub mod migrate;
pub mod policy;
pub mod pool;
pub mod spec;
pub mod store;

pub use addr::{AddrError, AddrSet, IpFamily};
pub use policy::{Inventory, Policy, PolicyError, PolicyErrorKind};
pub use pool::{Pool, PoolFacts, Reserved, SpecError, Subnet};
