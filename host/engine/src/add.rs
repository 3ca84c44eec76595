//! The ADD verb: the policy's decision (asked with the free counts the engine sees), checked
//! by the host; the address of each family taken from the free index and claimed in the store,
//! with retries elsewhere in the pool when another node wins the race; a retried or taken-over
//! sandbox, a StatefulSet's kept address and a quarantine's replacement; and the outcome the
//! plugin reports (addresses, gateways, routes). Kept apart from the engine's state and its
//! other verbs (`release`, `ahead`) as the biggest of them.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use allot_core::addr::IpFamily;
use allot_core::policy::{
    Decision, DropReason, FamilyDecision, Inventory, Nic, Policy, PolicyError, PolicyErrorKind,
    PoolRef, Request,
};
use allot_core::pool::Route;
use allot_core::store::{Attachment, Claim, PodRef, Reattach, Store, StoreError};

use crate::{
    AddOutcome, AddRequest, AllocError, Allocation, CONFLICT_RETRIES, Engine, Serialized,
    load_to_alloc, seed_of,
};

impl<S: Store, P: Policy> Engine<S, P> {
    fn policy_request(&self, req: &AddRequest, free_counts: Vec<u64>) -> Request {
        Request {
            pod: req.pod.clone(),
            namespace: req.namespace.clone(),
            node: req.node.clone(),
            nics: vec![Nic {
                interface: req.attachment.interface.clone(),
                multus_name: req.multus_name.clone(),
            }],
            cni_defaults: req.cni_defaults.clone(),
            free_counts,
        }
    }

    fn decide(&self, req: &AddRequest) -> Result<(Arc<Inventory>, Request, Decision), AllocError> {
        let (inventory, free_counts) = {
            let state = self.state();
            if !state.loaded {
                return Err(AllocError::NotLoaded);
            }
            (state.inventory.clone(), state.free_counts())
        };
        let request = self.policy_request(req, free_counts);
        let blame = |e: PolicyError| {
            AllocError::Policy(match e.kind {
                PolicyErrorKind::BadOutput => PolicyError::new(
                    e.kind,
                    format!("policy {}: {}", self.policy.name(), e.message),
                ),
                _ => e,
            })
        };
        let decision = self.policy.decide(&inventory, &request).map_err(blame)?;
        // Whatever policy decided, the decision is checked, once: here, unless the policy's
        // host checked it already (the wasmtime runtime does, to fall back on a bogus answer).
        if !self.policy.validates() {
            decision.validate(&inventory, &request).map_err(blame)?;
        }
        Ok((inventory, request, decision))
    }

    pub fn add(&self, req: &AddRequest) -> Result<AddOutcome, AllocError> {
        let _serial = self.lock_attachment(&req.attachment);
        self.add_locked(req)
    }

    /// [`Engine::add`] under a lock the caller holds already.
    ///
    /// # Panics
    /// When `held` is another attachment's lock (a bug of the caller's).
    pub fn add_serialized(
        &self,
        held: &Serialized<'_>,
        req: &AddRequest,
    ) -> Result<AddOutcome, AllocError> {
        held.check(&req.attachment);
        self.add_locked(req)
    }

    /// Quarantines addresses of `req`'s attachment that another host was found using on the
    /// link (each `(address, MAC)`), then, when `replace`, serves the ADD again: the
    /// attachment now lacks those families, so it gets fresh addresses for them (never a
    /// quarantined one: it stays claimed). Each quarantine is one store write that moves the
    /// claim from the attachment to [`PodRef::conflict`], so the address is never free in
    /// between; an address the attachment no longer holds (a DEL came first) fails with
    /// [`StoreError::Stale`]. Returns the quarantined claims and, when `replace`, the outcome.
    pub fn quarantine(
        &self,
        req: &AddRequest,
        conflicts: &[(IpAddr, String)],
        replace: bool,
    ) -> Result<(Vec<Claim>, Option<AddOutcome>), AllocError> {
        let _serial = self.lock_attachment(&req.attachment);
        let mut quarantined = Vec::with_capacity(conflicts.len());
        for (address, mac) in conflicts {
            let holder = PodRef::conflict(mac);
            quarantined.push(self.store.quarantine(
                *address,
                &req.attachment,
                &holder,
                self.now(),
            )?);
        }
        let outcome = if replace {
            Some(self.add_locked(req)?)
        } else {
            None
        };
        Ok((quarantined, outcome))
    }

    fn add_locked(&self, req: &AddRequest) -> Result<AddOutcome, AllocError> {
        self.sync().map_err(load_to_alloc)?;
        let held = self.store.claims_of(&req.attachment)?;
        let decided = self.decide(req);
        if !held.is_empty() {
            // A retried ADD: the same addresses, plus any family the attachment lacks. Without a
            // decision it cannot tell what is missing: what is held is returned as it is.
            let Ok((inventory, request, decision)) = decided else {
                return Ok(self.outcome(&held, None, true, Vec::new()));
            };
            if decision.nics.first().is_none_or(|n| n.error.is_some()) {
                // The policy cannot serve the NIC now (e.g. its pool was deleted): what it holds
                // keeps serving; nothing new is claimed.
                return Ok(self.outcome(&held, None, true, Vec::new()));
            }
            let mut all = held;
            let claimed = self.allocate(req, &inventory, &request, &decision, &mut all)?;
            let repeated = claimed.is_empty();
            return Ok(self.outcome(&all, Some(&decision), repeated, claimed));
        }
        let (inventory, request, decision) = decided?;
        let mut all = Vec::new();
        let claimed = self.allocate(req, &inventory, &request, &decision, &mut all)?;
        Ok(self.outcome(&all, Some(&decision), false, claimed))
    }

    /// Claims every family the decision wants and `held` lacks, atomically (kept StatefulSet
    /// addresses taken back in the same batch), appending to `held`. Returns the fresh addresses.
    fn allocate(
        &self,
        req: &AddRequest,
        inventory: &Inventory,
        request: &Request,
        decision: &Decision,
        held: &mut Vec<Claim>,
    ) -> Result<Vec<IpAddr>, AllocError> {
        let nic = decision
            .nics
            .first()
            .ok_or_else(|| AllocError::NothingDecided(req.attachment.interface.clone()))?;
        if let Some(error) = &nic.error {
            return Err(AllocError::Policy(error.clone()));
        }
        if nic.families.is_empty() {
            return Err(AllocError::NothingDecided(req.attachment.interface.clone()));
        }
        let wanted: Vec<&FamilyDecision> = nic
            .families
            .iter()
            .filter(|f| !held.iter().any(|c| IpFamily::of(c.address) == f.family))
            .collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let pod = PodRef {
            namespace: req.pod.namespace.clone(),
            name: req.pod.name.clone(),
            uid: req.pod.uid.clone(),
            owner_kind: req.pod.owner.as_ref().map(|o| o.kind.clone()),
            owner_name: req.pod.owner.as_ref().map(|o| o.name.clone()),
        };
        // The holder's claims as the take-over left them serve the first try; a retry reads
        // them again.
        let mut holders_claims = if pod.keeps_addresses() {
            Some(self.take_over_older_sandboxes(&pod, &req.attachment)?)
        } else {
            None
        };
        let mut lost = 0;
        loop {
            let now = self.now();
            let reattach = if pod.keeps_addresses() {
                let claims = match holders_claims.take() {
                    Some(claims) => claims,
                    None => self.claims_of_holder(&pod)?,
                };
                self.kept_for(&pod, req, inventory, &wanted, now, claims)?
            } else {
                Vec::new()
            };
            let fresh_families: Vec<&FamilyDecision> = wanted
                .iter()
                .copied()
                .filter(|f| !reattach.iter().any(|r| IpFamily::of(r.address) == f.family))
                .collect();
            let picks = self.pick(
                inventory,
                request,
                &req.network,
                &nic.interface,
                &fresh_families,
            )?;
            let claims: Vec<Claim> = picks
                .iter()
                .map(|(address, pool)| Claim {
                    address: *address,
                    pool: pool.clone(),
                    network: req.network.clone(),
                    attachment: Some(req.attachment.clone()),
                    pod: pod.clone(),
                    node: self.node.clone(),
                    updated_at: now,
                })
                .collect();
            let result = self.store.claim_batch(&claims, &reattach);
            let mut state = self.state();
            match result {
                Ok(reattached) => {
                    for c in &claims {
                        state.committed(c.address);
                    }
                    drop(state);
                    held.extend(reattached);
                    held.extend(claims.iter().cloned());
                    held.sort_by_key(|c| IpFamily::of(c.address));
                    return Ok(claims.iter().map(|c| c.address).collect());
                }
                Err(e @ (StoreError::Conflict(_) | StoreError::Stale(_))) => {
                    // Someone else (another agent sharing the store) holds an address we took,
                    // or took back a kept one: keep it out, learn what else changed, try again.
                    for c in &claims {
                        state.untake(c.address, e == StoreError::Conflict(c.address));
                        state.scatter(c.address, scatter_seed(&req.attachment, c.address, lost));
                    }
                    drop(state);
                    lost += 1;
                    self.lost_races
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // A given address someone else claimed first: trying it again is pointless.
                    if let StoreError::Conflict(address) = e
                        && let Some(hint) = fresh_families
                            .iter()
                            .filter_map(|f| f.address.as_ref())
                            .find(|h| h.ip() == Some(address))
                    {
                        return Err(self.given_held(&nic.interface, hint, address));
                    }
                    if lost >= CONFLICT_RETRIES {
                        return Err(AllocError::Contended(lost));
                    }
                    self.sync().map_err(load_to_alloc)?;
                }
                Err(e) => {
                    for c in &claims {
                        state.untake(c.address, false);
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// A StatefulSet has at most one pod of a name: an older sandbox of this pod still holding
    /// this interface is dead or dying (its DEL may come late). A virtual machine runs in one
    /// launcher pod, but for a live migration's target, which takes the address over from the
    /// source while the guest still runs there: the address is the VM's, one claim, never free,
    /// and the source's DEL at completion finds nothing of it to release. Either way the
    /// addresses are kept for the holder; the older sandbox's late DEL finds nothing.
    /// Returns the holder's claims as it left them.
    fn take_over_older_sandboxes(
        &self,
        pod: &PodRef,
        attachment: &Attachment,
    ) -> Result<Vec<Claim>, AllocError> {
        let mut held = self.claims_of_holder(pod)?;
        let older: BTreeSet<Attachment> = held
            .iter()
            .filter(|c| c.pod.same_holder(pod))
            .filter_map(|c| c.attachment.clone())
            .filter(|a| a.interface == attachment.interface && a != attachment)
            .collect();
        held.retain(|c| c.attachment.as_ref().is_none_or(|a| !older.contains(a)));
        for old in &older {
            held.extend(self.store.detach(old, self.now())?);
        }
        Ok(held)
    }

    /// Every claim of the holder `pod` is one of (a store lookup): its virtual machine's, or
    /// the pod's by namespace and name.
    fn claims_of_holder(&self, pod: &PodRef) -> Result<Vec<Claim>, StoreError> {
        match pod.virtual_machine() {
            Some(vm) => self.store.claims_of_virtual_machine(&pod.namespace, vm),
            None => self.store.claims_of_pod(&pod.namespace, &pod.name),
        }
    }

    /// The kept addresses a StatefulSet pod (or a virtual machine's launcher pod) takes back,
    /// of the holder's claims `kept`, per family, when their pool is still among the candidates the policy ordered (or dropped
    /// only for being full: the kept address is part of why it is full).
    fn kept_for(
        &self,
        pod: &PodRef,
        req: &AddRequest,
        inventory: &Inventory,
        wanted: &[&FamilyDecision],
        now: u64,
        mut kept: Vec<Claim>,
    ) -> Result<Vec<Reattach>, AllocError> {
        // Of the holder's claims (`kept`), the detached ones; a VM's addresses on its other
        // networks are for its other NICs. A claim of no network is one `allotctl migrate` made
        // where the peer did not record the network (Spiderpool): it is this NIC's if its pool
        // is (below), and taking it back records the network.
        kept.retain(|c| {
            c.attachment.is_none()
                && c.pod.same_holder(pod)
                && (pod.virtual_machine().is_none()
                    || c.network == req.network
                    || c.network.is_empty())
        });
        let mut out = Vec::new();
        for fam in wanted {
            let exhausted = fam.dropped.iter().filter_map(|d| match d.pool {
                PoolRef::Index(i) if d.reason == DropReason::Exhausted => Some(i),
                _ => None,
            });
            let orderable: BTreeSet<&str> = fam
                .order
                .iter()
                .copied()
                .chain(exhausted)
                .map(|i| inventory.pools[i as usize].name.as_str())
                .collect();
            // An address the policy names is the one to take back, or none.
            let given = fam.address.as_ref().and_then(|h| h.ip());
            let of_family = || {
                kept.iter()
                    .filter(|c| IpFamily::of(c.address) == fam.family)
            };
            let found = of_family().find(|c| {
                orderable.contains(c.pool.as_str()) && given.is_none_or(|g| g == c.address)
            });
            // A virtual machine's guest keeps the address it has, wherever it runs: another
            // one would cut it off (a live migration's target above all), so the NIC fails.
            if found.is_none()
                && let (Some(vm), Some(k)) = (pod.virtual_machine(), of_family().next())
            {
                return Err(AllocError::Policy(PolicyError::new(
                    PolicyErrorKind::NotReady,
                    format!(
                        "interface {} of virtual machine {}/{vm} cannot keep its address {} \
                         of pool {}: {}; the VM gets no other address instead (allow the \
                         pool for this pod on node {}, or release the address with `allotctl \
                         ipam release --virtual-machine {}/{vm}` to give the VM a new one)",
                        req.attachment.interface,
                        pod.namespace,
                        k.address,
                        k.pool,
                        match given {
                            Some(g) if g != k.address => format!("the policy asks for {g}"),
                            _ => "the policy does not allow that pool here".to_string(),
                        },
                        self.node,
                        pod.namespace,
                    ),
                )));
            }
            if let Some(k) = found {
                out.push(Reattach {
                    address: k.address,
                    pod: pod.clone(),
                    attachment: req.attachment.clone(),
                    network: req.network.clone(),
                    node: self.node.clone(),
                    now,
                });
            }
        }
        Ok(out)
    }

    pub(crate) fn outcome(
        &self,
        claims: &[Claim],
        decision: Option<&Decision>,
        repeated: bool,
        claimed: Vec<IpAddr>,
    ) -> AddOutcome {
        let nic = decision.and_then(|d| d.nics.first());
        let clean_gateway = nic.is_some_and(|n| n.clean_gateway);
        let state = self.state();
        let mut allocations = Vec::with_capacity(claims.len());
        let mut routes: Vec<Route> = Vec::new();
        for claim in claims {
            let pool = state.pool_of_claim(&claim.pool, claim.address);
            let (subnet, gateway) = match pool {
                Some(p) => (p.subnet, p.gateway),
                // No version of the pool is known (deleted while the agent was down): report
                // the bare address.
                None => (IpNet::from(claim.address), None),
            };
            let gateway = gateway.filter(|_| !clean_gateway);
            if let Some(gw) = gateway {
                let default = match gw {
                    IpAddr::V4(_) => "0.0.0.0/0",
                    IpAddr::V6(_) => "::/0",
                };
                routes.push(Route {
                    dst: default.parse().expect("a valid CIDR"),
                    gw,
                });
            }
            if let Some(p) = pool {
                routes.extend(p.routes.iter().cloned());
            }
            allocations.push(Allocation {
                address: claim.address,
                subnet,
                gateway,
                pool: claim.pool.clone(),
            });
        }
        // Routes from the pod's annotation go to the NIC whose subnet reaches their gateway.
        if let Some(nic) = nic {
            for r in &nic.routes {
                let (Ok(dst), Ok(gw)) = (r.dst.parse::<IpNet>(), r.gw.parse::<IpAddr>()) else {
                    continue;
                };
                if allocations.iter().any(|a| a.subnet.contains(&gw)) {
                    routes.push(Route { dst, gw });
                }
            }
        }
        routes.dedup();
        AddOutcome {
            allocations,
            routes,
            repeated,
            claimed,
        }
    }
}

/// Where a pool's cursor jumps after a lost race: different for each attachment and attempt, so
/// that agents racing in the same order spread out (a pure function: no random source).
fn scatter_seed(attachment: &Attachment, address: IpAddr, attempt: usize) -> u64 {
    seed_of(&(attachment, address, attempt))
}
