//! End-to-end: the real binaries (plugin, agent, controller) against real stores, namespaces
//! and the in-memory API server. One test binary for the crate (one link, not one per file, a
//! few minutes of cold CI saved); each module is one area.

mod agent;
mod concurrency;
mod controller;
mod docs;
mod errors;
mod etcd;
mod etcd_stress;
mod examples;
mod gc;
mod hardening;
mod kubernetes;
mod kubernetes_faults;
mod lifecycle;
mod macvlan;
mod metrics_address;
mod policy_rollout;
mod pools;
mod probe;
mod probe_ahead;
mod statefulset;
