//! The in-memory store (allot-core's reference implementation) passes the same contract as the
//! real backends. Its "location" is the shared store itself, so reopening is trivially true.

use std::sync::Arc;

use allot_core::store::MemoryStore;
use allot_store::store_contract_tests;

store_contract_tests! {
    location: || Arc::new(MemoryStore::new()),
    open: |store: &Arc<MemoryStore>| store.clone(),
}
