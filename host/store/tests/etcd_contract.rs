//! `EtcdStore` against the shared store contract, each check on an etcd of its own (etcd's
//! revision is global, and the feed checks count revisions), plus what only etcd promises.

use allot_store::etcd::testing::EtcdServer;
use allot_store::{EtcdConfig, EtcdStore};

fn open(server: &EtcdServer) -> EtcdStore {
    EtcdStore::connect(&EtcdConfig::from_url(&server.url()).expect("url")).expect("connect")
}

mod contract {
    allot_store::store_contract_tests! {
        location: allot_store::etcd::testing::EtcdServer::start,
        open: super::open,
    }
}
