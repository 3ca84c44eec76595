//! Addresses a policy names (contract 0.3.0's address hints): a pod annotation that gives the
//! address, a StatefulSet ordinal's entry of a declared list, or any rule of a custom policy.
//!
//! The host honours a hint only inside a pool the policy ordered for the family (or one it
//! dropped only for being full: the hint may be what fills it), and only if that pool may hand
//! the address out to this pod now. Anything else fails the NIC with the address and the reason;
//! the host never hands out another address instead (Calico's `ipAddrs` behaves the same:
//! a pod whose requested address is unavailable does not start).

use std::net::IpAddr;

use allot_core::addr::IpFamily;
use allot_core::policy::{
    AddressHint, DropReason, FamilyDecision, Inventory, PolicyError, PolicyErrorKind, PoolRef,
    Request, describe_drop,
};
use allot_core::store::Claim;

use crate::AllocError;
use crate::state::State;

/// Why a given address cannot be handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// It can never be this pod's here as things stand (outside the allowed pools, excluded,
    /// reserved, the gateway): the user must change the pod or the pools.
    Never(String),
    /// Someone holds it, or is being given it right now: it may be free later.
    Held,
}

impl State {
    /// Takes the given `address` for `fam` out of its pool's free addresses (cooling ones
    /// included: a cooldown prefers, it never refuses) and marks it in flight. Returns the
    /// pool's name.
    pub(super) fn take_given(
        &mut self,
        inventory: &Inventory,
        request: &Request,
        interface: &str,
        fam: &FamilyDecision,
        address: IpAddr,
    ) -> Result<String, Refusal> {
        // Pools the policy allowed, by name (the inventory may have changed since the decision),
        // skipping any since disabled or marked for deletion. A pool dropped only for being
        // full is allowed too: the given address may be what fills it, and held or not, the
        // reason below says so.
        let full = fam.dropped.iter().filter_map(|d| match d.pool {
            PoolRef::Index(i) if d.reason == DropReason::Exhausted => Some(i),
            _ => None,
        });
        let allowed: Vec<usize> = fam
            .order
            .iter()
            .copied()
            .chain(full)
            .filter_map(|i| {
                let &entry = self.by_name.get(&inventory.pools[i as usize].name)?;
                let pool = &self.pools[entry].pool;
                let takes = !pool.spec.disable && !pool.terminating();
                (takes && pool.family == fam.family).then_some(entry)
            })
            .collect();
        let in_ips = allowed
            .iter()
            .copied()
            .find(|&e| self.pools[e].pool.ips.contains(address));
        let Some(entry) = in_ips else {
            if let Some(&e) = allowed
                .iter()
                .find(|&&e| self.pools[e].pool.gateway == Some(address))
            {
                let name = &self.pools[e].pool.meta.name;
                return Err(Refusal::Never(format!(
                    "it is the gateway of IPPool {name}"
                )));
            }
            return Err(Refusal::Never(
                self.outside(inventory, request, interface, fam, &allowed, address),
            ));
        };
        let pool = &self.pools[entry].pool;
        let name = pool.meta.name.clone();
        if pool.gateway == Some(address) {
            return Err(Refusal::Never(format!(
                "it is the gateway of IPPool {name}"
            )));
        }
        if pool.excluded.contains(address) {
            return Err(Refusal::Never(format!(
                "IPPool {name} excludes it (excludeIPs)"
            )));
        }
        if !pool.allocatable().contains(address) {
            return Err(Refusal::Never(format!(
                "it is the network or broadcast address of IPPool {name}'s subnet {}",
                pool.subnet
            )));
        }
        if !self.pools[entry].assignable.contains(address) {
            // Reserved for this pod's own StatefulSet (its declared list): its to take; whether
            // someone holds it now, the store's create-if-absent says.
            let owner = request
                .pod
                .owner
                .as_ref()
                .map(|o| (o.kind.as_str(), o.name.as_str()));
            if allot_core::declared::reserved_for_pod(
                &self.reserved,
                address,
                &request.pod.namespace,
                owner,
            ) {
                if !self.in_flight.insert(address) {
                    return Err(Refusal::Held);
                }
                return Ok(name);
            }
            let by: Vec<&str> = self
                .reserved
                .iter()
                .filter(|r| r.reserves_address(address))
                .map(|r| r.meta.name.as_str())
                .collect();
            return Err(Refusal::Never(format!(
                "it is reserved by ReservedIP {}",
                if by.is_empty() {
                    "(unknown)".to_string()
                } else {
                    by.join(", ")
                }
            )));
        }
        if self.in_flight.contains(&address) {
            return Err(Refusal::Held);
        }
        if self.pools[entry].index.remove(address) {
            self.in_flight.insert(address);
            return Ok(name);
        }
        if self.take_cooling_exact(entry, address) {
            return Ok(name);
        }
        Err(Refusal::Held)
    }

    /// Why `address` is in none of the pools the policy allowed for `fam` (`allowed`, by entry):
    /// the pool it is in and why that one may not serve the pod, else which allowed pool's
    /// subnet it is in.
    fn outside(
        &self,
        inventory: &Inventory,
        request: &Request,
        interface: &str,
        fam: &FamilyDecision,
        allowed_entries: &[usize],
        address: IpAddr,
    ) -> String {
        let contains = |name: &str| {
            self.by_name
                .get(name)
                .is_some_and(|&e| self.pools[e].pool.ips.contains(address))
        };
        for d in &fam.dropped {
            if let PoolRef::Index(i) = d.pool
                && let Some(pool) = inventory.pools.get(i as usize)
                && contains(&pool.name)
            {
                return format!(
                    "it is in IPPool {}, which cannot serve this pod here: {} ({})",
                    pool.name,
                    d.reason,
                    describe_drop(inventory, request, interface, d)
                );
            }
        }
        for &i in &fam.order {
            let pool = &inventory.pools[i as usize];
            if contains(&pool.name) {
                return format!(
                    "it is in IPPool {}, which is disabled or being deleted",
                    pool.name
                );
            }
        }
        let allowed: Vec<&str> = fam
            .order
            .iter()
            .map(|&i| inventory.pools[i as usize].name.as_str())
            .collect();
        let allowed = if allowed.is_empty() {
            "none".to_string()
        } else {
            allowed.join(", ")
        };
        let family = IpFamily::of(address);
        match self
            .pools
            .iter()
            .find(|e| e.pool.family == family && e.pool.ips.contains(address))
        {
            Some(e) => format!(
                "it is in IPPool {}, which is not among the pools allowed for this pod ({} by \
                 rule {}: {allowed})",
                e.pool.meta.name, fam.source, fam.rule
            ),
            None => match allowed_entries
                .iter()
                .find(|&&e| self.pools[e].pool.subnet.contains(&address))
            {
                Some(&e) => format!(
                    "it is in the subnet {} of IPPool {} but not among its ips",
                    self.pools[e].pool.subnet, self.pools[e].pool.meta.name
                ),
                None => format!(
                    "it is in no IPPool; the pools allowed for this pod are {allowed} ({} by \
                     rule {})",
                    fam.source, fam.rule
                ),
            },
        }
    }
}

/// Who holds `address`, in words, from the store's claims.
pub(super) fn holder(claims: &[Claim], address: IpAddr) -> String {
    match claims.iter().find(|c| c.address == address) {
        None => "it is being given to another pod right now".to_string(),
        Some(c) if c.is_quarantined() => format!(
            "it is quarantined: host {} answered for it on the link",
            c.pod.conflict_mac().unwrap_or("?")
        ),
        Some(c) if c.attachment.is_none() && c.pod.virtual_machine().is_some() => format!(
            "it is kept for virtual machine {}/{} (between its launcher pods)",
            c.pod.namespace,
            c.pod.virtual_machine().unwrap_or_default()
        ),
        Some(c) if c.attachment.is_none() => format!(
            "it is kept for pod {}/{} (a StatefulSet pod between restarts)",
            c.pod.namespace, c.pod.name
        ),
        Some(c) => format!(
            "it is held by pod {}/{}{}",
            c.pod.namespace,
            c.pod.name,
            if c.node.is_empty() {
                String::new()
            } else {
                format!(" on node {}", c.node)
            }
        ),
    }
}

/// The error for a given address the host cannot hand out: an error the policy could have
/// returned (invalid pod, or not ready while someone else holds it), so the plugin reports it as
/// one, without a change of its own.
pub(super) fn refused(
    kind: PolicyErrorKind,
    interface: &str,
    hint: &AddressHint,
    address: IpAddr,
    why: &str,
) -> AllocError {
    AllocError::Policy(PolicyError::new(
        kind,
        format!(
            "interface {interface} cannot get {address}, which {} asks for: {why}; the pod gets \
             no other address instead",
            hint.source
        ),
    ))
}
