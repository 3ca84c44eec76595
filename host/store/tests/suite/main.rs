//! Every claim store against the backend-independent contract suite (`allot_store::contract`,
//! the `testing` feature), and the Kubernetes store against the in-memory API server and its
//! faults. One test binary for the crate (one link, not one per file).

mod etcd_contract;
mod kubernetes_api;
mod kubernetes_contract;
mod kubernetes_faults;
mod kubernetes_scope;
mod layers;
mod memory_contract;
mod sqlite_contract;
