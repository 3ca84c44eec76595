//! What a pod's NIC gave back lately, so that the same pod's next sandbox gets it again: a
//! runtime retries a sandbox whose setup failed (a second NIC without an address, a plugin
//! error) with a new container, tearing the old one down each time. Without this, each try
//! would take the next address, the released ones cooling down, and the pod's address would
//! change at every try (Spiderpool #4295, #2901). Handing the address back to the pod it was
//! released by is what the cooldown allows: the neighbours' caches point at that pod.

use std::collections::HashMap;
use std::net::IpAddr;

use allot_core::addr::IpFamily;
use allot_core::store::Claim;

/// How long a released address is remembered for its pod: a runtime's retries back off to
/// minutes apart. Past the cooldown the address is free anyway; this only prefers it.
pub const REMEMBERED_SECONDS: u64 = 600;

/// Entries kept before expired ones are swept.
const SWEEP_AT: usize = 4096;

/// (pod UID, network, interface) → the addresses it released, with when they are forgotten.
#[derive(Debug, Default)]
pub struct Returning {
    released: HashMap<(String, String, String), Vec<(IpAddr, u64)>>,
}

impl Returning {
    /// Remembers `claims` released at `now` for their pods' next sandboxes.
    pub fn remember(&mut self, claims: &[Claim], now: u64) {
        if self.released.len() >= SWEEP_AT {
            self.released.retain(|_, v| {
                v.retain(|&(_, until)| until > now);
                !v.is_empty()
            });
        }
        for c in claims {
            let Some(attachment) = &c.attachment else {
                continue;
            };
            if c.pod.uid.is_empty() {
                continue;
            }
            let key = (
                c.pod.uid.clone(),
                c.network.clone(),
                attachment.interface.clone(),
            );
            let entry = self.released.entry(key).or_default();
            entry.retain(|&(a, until)| until > now && IpFamily::of(a) != IpFamily::of(c.address));
            entry.push((c.address, now + REMEMBERED_SECONDS));
        }
    }

    /// The address of `family` pod `uid`'s `interface` on `network` released last, if it is
    /// still remembered.
    pub fn last(
        &self,
        uid: &str,
        network: &str,
        interface: &str,
        family: IpFamily,
        now: u64,
    ) -> Option<IpAddr> {
        let key = (uid.to_string(), network.to_string(), interface.to_string());
        self.released
            .get(&key)?
            .iter()
            .rev()
            .find(|&&(a, until)| until > now && IpFamily::of(a) == family)
            .map(|&(a, _)| a)
    }
}
