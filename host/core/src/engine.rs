//! The allocation engine: policy → ordered pools → free address → atomic claim.
//!
//! Generic over [`Store`] (where claims live) and [`Policy`] (which pools, in which order).
//! In-memory state is only an index of free addresses per pool, rebuilt from the store on start
//! and on every inventory change; the store is the truth. Lifecycle (DESIGN.md):
//!
//! * ADD is idempotent per attachment (container ID, interface): an attachment that holds
//!   claims gets the same addresses again. A StatefulSet pod gets its kept address back while the
//!   pool is still among its candidates. Otherwise the policy orders the pools and the engine
//!   takes the next free address of the first pool with room, per family, and claims all
//!   families of the NIC in one atomic batch (all or nothing).
//! * DEL releases what the attachment holds (a StatefulSet pod's addresses are kept, detached,
//!   for its next ADD); idempotent.
//! * GC releases every claim whose attachment is not listed as valid.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ipnet::IpNet;

use crate::addr::{AddrSet, IpFamily, addr_to_u128};
use crate::free::FreeIndex;
use crate::policy::{
    CniDefaults, Decision, FamilyDecision, Inventory, NamespaceInfo, Nic, NodeInfo, PodInfo,
    Policy, PolicyError, Request, describe_drop,
};
use crate::pool::{Pool, Reserved, Route, Subnet, reserved_set};
use crate::store::{Attachment, Claim, PodRef, Store, StoreError};

/// How often a lost create-if-absent race is retried with another address before giving up.
const CONFLICT_RETRIES: usize = 16;

/// Locks serialising ADD, DEL and CHECK of one attachment (runtimes do retry and race
/// themselves); striped so that memory does not grow with the number of attachments.
const ATTACHMENT_STRIPES: usize = 64;

/// One ADD: an attachment of a pod on a node.
#[derive(Clone, Debug)]
pub struct AddRequest {
    pub attachment: Attachment,
    /// The CNI network (config `name`).
    pub network: String,
    pub pod: PodInfo,
    pub namespace: NamespaceInfo,
    pub node: NodeInfo,
    pub multus_name: String,
    pub cni_defaults: CniDefaults,
}

/// An address handed to an attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub address: IpAddr,
    /// The pool's subnet (the address's prefix length comes from it).
    pub subnet: IpNet,
    pub gateway: Option<IpAddr>,
    pub pool: String,
}

impl Allocation {
    /// The address in CIDR notation with its subnet's prefix, e.g. `10.6.0.12/24`.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.subnet.prefix_len())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddOutcome {
    pub allocations: Vec<Allocation>,
    pub routes: Vec<Route>,
    /// The attachment already held these addresses (a retried ADD).
    pub repeated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The policy's verdict (malformed annotation, not ready) or its fault.
    #[error("{0}")]
    Policy(PolicyError),
    /// No candidate pool can serve the NIC; `trace` says what was considered and why not.
    #[error("no pool can serve {family} for interface {interface}: {summary}")]
    NoPoolFits {
        family: IpFamily,
        interface: String,
        summary: String,
        trace: String,
    },
    /// The policy decided no IP family at all for the NIC.
    #[error("the policy gave interface {0} no address family to allocate")]
    NothingDecided(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Address races kept being lost (other agents allocating from the same pools): retry.
    #[error("lost {0} races for addresses in a row; try again")]
    Contended(usize),
    #[error("attachment {0} holds no addresses")]
    UnknownAttachment(Attachment),
    #[error("no pools are loaded yet")]
    NotLoaded,
}

/// Usage of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    pub name: String,
    pub family: IpFamily,
    pub total: u64,
    pub free: u64,
}

struct PoolEntry {
    pool: Pool,
    assignable: AddrSet,
    index: FreeIndex,
}

struct State {
    inventory: Arc<Inventory>,
    /// By inventory order (name order).
    pools: Vec<PoolEntry>,
    by_name: HashMap<String, usize>,
    /// (first, last, pool index) over every pool's assignable ranges, sorted: finds the pool of
    /// an address in O(log ranges).
    ranges: Vec<(u128, u128, IpFamily, usize)>,
    loaded: bool,
}

impl State {
    fn empty() -> Self {
        State {
            inventory: Arc::new(Inventory::default()),
            pools: Vec::new(),
            by_name: HashMap::new(),
            ranges: Vec::new(),
            loaded: false,
        }
    }

    fn locate(&self, addr: IpAddr) -> Option<usize> {
        let family = IpFamily::of(addr);
        let n = addr_to_u128(addr);
        let i = self
            .ranges
            .partition_point(|&(lo, _, f, _)| (f, lo) <= (family, n));
        let &(lo, hi, f, pool) = self.ranges.get(i.checked_sub(1)?)?;
        (f == family && lo <= n && n <= hi).then_some(pool)
    }

    /// Returns an address to its pool's index, if it still belongs to one.
    fn give_back(&mut self, addr: IpAddr) {
        if let Some(i) = self.locate(addr) {
            self.pools[i].index.insert(addr);
        }
    }

    fn free_counts(&self) -> Vec<u64> {
        self.pools.iter().map(|p| p.index.free_count()).collect()
    }
}

pub struct Engine<S, P> {
    store: S,
    policy: P,
    state: Mutex<State>,
    attachment_locks: Vec<Mutex<()>>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl<S: Store, P: Policy> Engine<S, P> {
    pub fn new(store: S, policy: P) -> Self {
        Engine {
            store,
            policy,
            state: Mutex::new(State::empty()),
            attachment_locks: (0..ATTACHMENT_STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn lock_attachment(&self, attachment: &Attachment) -> std::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        attachment.hash(&mut h);
        self.attachment_locks[h.finish() as usize % ATTACHMENT_STRIPES]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Installs a new inventory (checked pools, subnets, reservations) and rebuilds the free
    /// indexes from the store. Claims are never dropped: an address claimed in a pool that no
    /// longer lists it simply stays out of every index.
    pub fn load(
        &self,
        pools: Vec<Pool>,
        subnets: Vec<Subnet>,
        reserved: Vec<Reserved>,
    ) -> Result<(), StoreError> {
        let generation = self.state().inventory.generation + 1;
        let inventory = Arc::new(Inventory::build(generation, &pools, &subnets, &reserved));
        let reserved_v4 = reserved_set(IpFamily::V4, &reserved);
        let reserved_v6 = reserved_set(IpFamily::V6, &reserved);
        let mut by_pool: HashMap<String, Pool> = pools
            .into_iter()
            .map(|p| (p.meta.name.clone(), p))
            .collect();
        let mut entries = Vec::with_capacity(inventory.pools.len());
        let mut ranges = Vec::new();
        for (i, ip) in inventory.pools.iter().enumerate() {
            let pool = by_pool
                .remove(&ip.name)
                .expect("the inventory is built from these pools");
            let reserved = match pool.family {
                IpFamily::V4 => &reserved_v4,
                IpFamily::V6 => &reserved_v6,
            };
            let assignable = pool.assignable(reserved);
            for (lo, hi) in assignable.ranges() {
                ranges.push((addr_to_u128(lo), addr_to_u128(hi), pool.family, i));
            }
            entries.push(PoolEntry {
                index: FreeIndex::new(&assignable),
                assignable,
                pool,
            });
        }
        ranges.sort_unstable_by_key(|&(lo, _, f, _)| (f, lo));
        let mut state = State {
            by_name: entries
                .iter()
                .enumerate()
                .map(|(i, e)| (e.pool.meta.name.clone(), i))
                .collect(),
            inventory,
            pools: entries,
            ranges,
            loaded: true,
        };
        // Hold the lock while reading claims so that no ADD or DEL interleaves with the rebuild.
        let mut current = self.state();
        for claim in self.store.all()? {
            if let Some(i) = state.locate(claim.address) {
                state.pools[i].index.remove(claim.address);
            }
        }
        *current = state;
        Ok(())
    }

    pub fn usage(&self) -> Vec<PoolUsage> {
        self.state()
            .pools
            .iter()
            .map(|p| PoolUsage {
                name: p.pool.meta.name.clone(),
                family: p.pool.family,
                total: p.assignable.len(),
                free: p.index.free_count(),
            })
            .collect()
    }

    pub fn is_loaded(&self) -> bool {
        self.state().loaded
    }

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
        let decision = self
            .policy
            .decide(&inventory, &request)
            .map_err(AllocError::Policy)?;
        Ok((inventory, request, decision))
    }

    pub fn add(&self, req: &AddRequest) -> Result<AddOutcome, AllocError> {
        let _serial = self.lock_attachment(&req.attachment);
        let held = self.store.claims_of(&req.attachment)?;
        if !held.is_empty() {
            // A retried ADD: the same addresses. Routes come from a fresh decision when the
            // policy still gives one (the routes annotation), else from the pools alone.
            let decision = self.decide(req).ok().map(|(_, _, d)| d);
            return Ok(self.outcome(&held, decision.as_ref(), true));
        }
        let (inventory, request, decision) = self.decide(req)?;
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
        let pod = PodRef {
            namespace: req.pod.namespace.clone(),
            name: req.pod.name.clone(),
            uid: req.pod.uid.clone(),
            owner_kind: req.pod.owner.as_ref().map(|o| o.kind.clone()),
            owner_name: req.pod.owner.as_ref().map(|o| o.name.clone()),
        };

        // A StatefulSet pod takes back the address kept for it, per family, when its pool is
        // still among the candidates the policy ordered.
        let mut reattached: Vec<Claim> = Vec::new();
        if pod.is_stateful() {
            // A StatefulSet has at most one pod of a name: an older sandbox of this pod still
            // holding this interface is dead or dying (its DEL may come late). Take its
            // addresses over; its late DEL then finds nothing to release.
            let older: BTreeSet<Attachment> = self
                .store
                .all()?
                .into_iter()
                .filter(|c| c.pod.namespace == pod.namespace && c.pod.name == pod.name)
                .filter_map(|c| c.attachment)
                .filter(|a| a.interface == req.attachment.interface && *a != req.attachment)
                .collect();
            for old in &older {
                self.store.detach(old, now())?;
            }
            let kept = self.store.detached_of(&pod.namespace, &pod.name)?;
            for fam in &nic.families {
                // Still a candidate: ordered, or dropped only for being full (the kept address
                // is part of why it is full).
                let exhausted = fam.dropped.iter().filter_map(|d| match d.pool {
                    crate::policy::PoolRef::Index(i)
                        if d.reason == crate::policy::DropReason::Exhausted =>
                    {
                        Some(i)
                    }
                    _ => None,
                });
                let orderable: BTreeSet<&str> = fam
                    .order
                    .iter()
                    .copied()
                    .chain(exhausted)
                    .map(|i| inventory.pools[i as usize].name.as_str())
                    .collect();
                let Some(k) = kept.iter().find(|c| {
                    IpFamily::of(c.address) == fam.family && orderable.contains(c.pool.as_str())
                }) else {
                    continue;
                };
                match self.store.reattach(k.address, &pod, &req.attachment, now()) {
                    Ok(claim) => reattached.push(claim),
                    Err(StoreError::Stale(_)) => {}
                    Err(e) => {
                        self.undo_reattach(&req.attachment, &reattached);
                        return Err(e.into());
                    }
                }
            }
        }

        let fresh_families: Vec<&FamilyDecision> = nic
            .families
            .iter()
            .filter(|f| {
                !reattached
                    .iter()
                    .any(|c| IpFamily::of(c.address) == f.family)
            })
            .collect();
        let mut conflicts = 0;
        let fresh = loop {
            let picks = match self.pick(&inventory, &request, &nic.interface, &fresh_families) {
                Ok(p) => p,
                Err(e) => {
                    self.undo_reattach(&req.attachment, &reattached);
                    return Err(e);
                }
            };
            let claims: Vec<Claim> = picks
                .iter()
                .map(|(addr, pool)| Claim {
                    address: *addr,
                    pool: pool.clone(),
                    network: req.network.clone(),
                    attachment: Some(req.attachment.clone()),
                    pod: pod.clone(),
                    updated_at: now(),
                })
                .collect();
            match self.store.claim(&claims) {
                Ok(()) => break claims,
                Err(StoreError::Conflict(taken)) => {
                    // Someone else (another agent sharing the store) holds `taken`: keep it out
                    // of the index, return the rest, try again.
                    let mut state = self.state();
                    for (addr, _) in &picks {
                        if *addr != taken {
                            state.give_back(*addr);
                        }
                    }
                    drop(state);
                    conflicts += 1;
                    if conflicts >= CONFLICT_RETRIES {
                        self.undo_reattach(&req.attachment, &reattached);
                        return Err(AllocError::Contended(conflicts));
                    }
                }
                Err(e) => {
                    let mut state = self.state();
                    for (addr, _) in &picks {
                        state.give_back(*addr);
                    }
                    drop(state);
                    self.undo_reattach(&req.attachment, &reattached);
                    return Err(e.into());
                }
            }
        };
        let mut all = reattached;
        all.extend(fresh);
        all.sort_by_key(|c| IpFamily::of(c.address));
        Ok(self.outcome(&all, Some(&decision), false))
    }

    fn undo_reattach(&self, attachment: &Attachment, reattached: &[Claim]) {
        if !reattached.is_empty() {
            // Best effort: put the kept addresses back to "kept" so a retry finds them again.
            let _ = self.store.detach(attachment, now());
        }
    }

    /// Takes one free address per family from the first pool of its order with room.
    fn pick(
        &self,
        inventory: &Inventory,
        request: &Request,
        interface: &str,
        families: &[&FamilyDecision],
    ) -> Result<Vec<(IpAddr, String)>, AllocError> {
        let mut state = self.state();
        let mut picks: Vec<(IpAddr, String)> = Vec::with_capacity(families.len());
        for fam in families {
            let mut got = None;
            for &i in &fam.order {
                let name = &inventory.pools[i as usize].name;
                // The inventory may have been replaced since the decision: go by name.
                let Some(&entry) = state.by_name.get(name) else {
                    continue;
                };
                if let Some(addr) = state.pools[entry].index.take_next() {
                    got = Some((addr, name.clone()));
                    break;
                }
            }
            match got {
                Some(p) => picks.push(p),
                None => {
                    for (addr, _) in &picks {
                        state.give_back(*addr);
                    }
                    return Err(no_pool_fits(inventory, request, interface, fam));
                }
            }
        }
        Ok(picks)
    }

    fn outcome(&self, claims: &[Claim], decision: Option<&Decision>, repeated: bool) -> AddOutcome {
        let nic = decision.and_then(|d| d.nics.first());
        let clean_gateway = nic.is_some_and(|n| n.clean_gateway);
        let state = self.state();
        let mut allocations = Vec::with_capacity(claims.len());
        let mut routes: Vec<Route> = Vec::new();
        for claim in claims {
            let pool = state
                .by_name
                .get(&claim.pool)
                .map(|&i| &state.pools[i].pool);
            let (subnet, gateway) = match pool {
                Some(p) => (p.subnet, p.gateway),
                // The pool is gone from the inventory: report the bare address.
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
        }
    }

    /// Releases what `attachment` holds; a StatefulSet pod's addresses are kept (detached) for
    /// its next ADD. Idempotent. Returns the addresses released or kept.
    pub fn del(&self, attachment: &Attachment) -> Result<Vec<Claim>, AllocError> {
        let _serial = self.lock_attachment(attachment);
        let held = self.store.claims_of(attachment)?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        if held.iter().any(|c| c.pod.is_stateful()) {
            return Ok(self.store.detach(attachment, now())?);
        }
        let released = self.store.release_attachment(attachment)?;
        let mut state = self.state();
        for c in &released {
            state.give_back(c.address);
        }
        Ok(released)
    }

    /// What `attachment` holds, or [`AllocError::UnknownAttachment`].
    pub fn check(&self, attachment: &Attachment) -> Result<AddOutcome, AllocError> {
        let _serial = self.lock_attachment(attachment);
        let held = self.store.claims_of(attachment)?;
        if held.is_empty() {
            return Err(AllocError::UnknownAttachment(attachment.clone()));
        }
        Ok(self.outcome(&held, None, true))
    }

    /// Releases every claim of `network` whose attachment is not in `valid` (detached ones
    /// included). Claims of other networks are left alone: a runtime collects one network at a
    /// time.
    pub fn gc(
        &self,
        network: &str,
        valid: &BTreeSet<Attachment>,
    ) -> Result<Vec<Claim>, AllocError> {
        let mut released = Vec::new();
        for claim in self.store.all()? {
            if claim.network != network {
                continue;
            }
            let keep = claim.attachment.as_ref().is_some_and(|a| valid.contains(a));
            if !keep
                && self
                    .store
                    .release(claim.address, claim.attachment.as_ref())?
            {
                released.push(claim);
            }
        }
        let mut state = self.state();
        for c in &released {
            state.give_back(c.address);
        }
        Ok(released)
    }
}

fn no_pool_fits(
    inventory: &Inventory,
    request: &Request,
    interface: &str,
    fam: &FamilyDecision,
) -> AllocError {
    let name = |i: u32| inventory.pools[i as usize].name.as_str();
    let mut trace = String::new();
    let _ = writeln!(
        trace,
        "{interface} {}: rule {} ({})",
        fam.family, fam.rule, fam.source
    );
    let candidates: Vec<&str> = fam.candidates.iter().map(|&i| name(i)).collect();
    let _ = writeln!(trace, "candidates: {}", candidates.join(", "));
    let mut reasons = Vec::new();
    for d in &fam.dropped {
        let pool = match &d.pool {
            crate::policy::PoolRef::Index(i) => name(*i).to_string(),
            crate::policy::PoolRef::Missing(n) => n.clone(),
        };
        let why = describe_drop(inventory, request, interface, d);
        let _ = writeln!(trace, "dropped {pool}: {} ({why})", d.reason);
        reasons.push(format!("{pool} {}", d.reason));
    }
    for &i in &fam.order {
        let _ = writeln!(trace, "{}: no free address left", name(i));
        reasons.push(format!("{} exhausted", name(i)));
    }
    let summary = if reasons.is_empty() {
        "the policy named no candidate pool".to_string()
    } else {
        format!(
            "{} considered: {}",
            candidates.len().max(reasons.len()),
            reasons.join(", ")
        )
    };
    AllocError::NoPoolFits {
        family: fam.family,
        interface: interface.to_string(),
        summary,
        trace,
    }
}
