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

use std::time::{Duration, Instant};

use allot_core::block::BlockScope;
use allot_core::store::system_clock;
use allot_store::{KubeConfig, KubeStore};
use allot_test_apiserver::ApiServer;

/// Waits up to 10 s for `f` to give a value (another store's write to reach a watch).
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A Kubernetes store of `node` on the in-memory API server, following `scope`.
fn on_test_apiserver(server: &ApiServer, node: &str, scope: BlockScope) -> KubeStore {
    let server = server.clone();
    let config = KubeConfig {
        node: Some(node.into()),
        scope,
        ..KubeConfig::default()
    };
    KubeStore::open_with(&config, system_clock(), move || async move {
        Ok(server.client())
    })
    .expect("open a store on the test API server")
}
