//! What probing ahead needs from the engine: the addresses a pool will hand out next, whether an
//! address is still free, and the quarantine of a free address found in use on the link before
//! anyone was given it.

use std::net::IpAddr;

use crate::{AllocError, Engine};
use allot_core::policy::Policy;
use allot_core::store::{Claim, PodRef, Store, StoreError};

impl<S: Store, P: Policy> Engine<S, P> {
    /// The next `n` addresses pool `pool` would hand out, in the order it would hand them out,
    /// if nothing changed meanwhile (round-robin from the pool's cursor; addresses claimed, in
    /// flight or cooling down are not free, so not among them). Empty for an unknown pool, or
    /// one that takes no new allocations.
    pub fn upcoming(&self, pool: &str, n: usize) -> Vec<IpAddr> {
        let state = self.state();
        let Some(&i) = state.by_name.get(pool) else {
            return Vec::new();
        };
        let p = &state.pools[i].pool;
        if p.spec.disable || p.terminating() {
            return Vec::new();
        }
        state.pools[i].index.upcoming(n)
    }

    /// Whether `address` is free in its pool now (not claimed, in flight or cooling down).
    pub fn is_free(&self, address: IpAddr) -> bool {
        let state = self.state();
        state
            .locate(address)
            .is_some_and(|i| state.pools[i].index.is_free(address))
    }

    /// Quarantines a free address that the host at `mac` was found using on the link: a
    /// detached claim held by [`PodRef::conflict`], as [`Engine::quarantine`] leaves one, created
    /// only if the address is still free. `Ok(None)` when it is not (an ADD took it meanwhile,
    /// or another writer of the store did): nothing is written.
    pub fn quarantine_free(
        &self,
        address: IpAddr,
        pool: &str,
        network: &str,
        mac: &str,
    ) -> Result<Option<Claim>, AllocError> {
        if !self.state().take_exact(address) {
            return Ok(None);
        }
        let claim = Claim {
            address,
            pool: pool.to_string(),
            network: network.to_string(),
            attachment: None,
            pod: PodRef::conflict(mac),
            node: self.node.clone(),
            updated_at: self.now(),
        };
        let result = self.store.claim(std::slice::from_ref(&claim));
        let mut state = self.state();
        match result {
            Ok(()) => {
                state.committed(address);
                Ok(Some(claim))
            }
            Err(StoreError::Conflict(_)) => {
                state.untake(address, true);
                Ok(None)
            }
            Err(e) => {
                state.untake(address, false);
                Err(e.into())
            }
        }
    }
}
