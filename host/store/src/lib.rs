//! allot's claim stores.
//!
//! The [`Store`](allot_core::store::Store) trait lives in `allot-core`; this crate holds its
//! backends and the contract they all pass:
//!
//! - [`sqlite`]: the embedded default, one SQLite file per node ([`SqliteStore`]).
//! - [`etcd`]: claims in an etcd v3 cluster, for several nodes ([`EtcdStore`]).
//! - [`kubernetes`]: claims in IPBlock objects of a cluster's API ([`KubeStore`]).
//! - `contract`: the backend-independent contract suite, expanded into one test per behaviour
//!   by `store_contract_tests!`. Every backend (embedded, etcd, kubernetes, test doubles) runs
//!   it. Test support: only with the `testing` feature, which tests turn on through a
//!   dev-dependency, so no binary ships it (nor `etcd::testing`, the etcd launcher).

pub mod blocking;
#[cfg(feature = "testing")]
pub mod contract;
pub mod etcd;
pub mod kubernetes;
mod open;
pub mod sqlite;

pub use blocking::{AsyncStore, BlockingStore};
pub use etcd::{EtcdConfig, EtcdStore};
pub use kubernetes::{KubeConfig, KubeStats, KubeStore, client as kube_client};
pub use open::{EtcdOptionsError, KUBERNETES, OpenedStore, StoreOptions};
pub use sqlite::SqliteStore;
