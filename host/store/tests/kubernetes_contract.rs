//! `KubeStore` against the shared store contract, each check on an in-memory API server of its
//! own (no API server can be installed where CI runs: see `tests/apiserver`).

use allot_core::store::system_clock;
use allot_store::{KubeConfig, KubeStore};
use allot_test_apiserver::ApiServer;

fn open(server: &ApiServer) -> KubeStore {
    let server = server.clone();
    let config = KubeConfig {
        node: Some("node-a".into()),
        ..KubeConfig::default()
    };
    KubeStore::open_with(&config, system_clock(), move || async move {
        Ok(server.client())
    })
    .expect("open a store on the test API server")
}

mod contract {
    allot_store::store_contract_tests! {
        location: allot_test_apiserver::ApiServer::new,
        open: super::open,
    }
}
