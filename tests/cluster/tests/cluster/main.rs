//! The real-cluster suite, one test binary (`cluster`): each module is one part of it. Most
//! attach to the shared lab `scripts/cluster-test.sh` starts (`Suite::shared`); `lifecycle`,
//! `audit`, `migration` and `multus` start labs of their own (`Suite::own`) and run in its
//! second phase (selected by module: `test(/^(lifecycle|audit|migration|multus)::/)`).
//! One binary rather than one per file: each links the whole of kube, tokio and the lab.

mod audit;
mod chart;
mod declared;
mod disruption;
mod lifecycle;
mod migration;
mod multus;
mod peer_failures;
mod policy;
mod real_nodes;
mod robustness;
mod scale;
mod virtual_machines;
mod workloads;
