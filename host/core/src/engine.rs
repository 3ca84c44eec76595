//! The allocation engine: policy → ordered pools → free address → atomic claim.
//!
//! Generic over [`Store`] (where claims live) and [`Policy`] (which pools, in which order).
//! In-memory state is an index of free addresses per pool, built from a store snapshot and kept
//! true by the store's change feed (so that agents and tools sharing one store see each other's
//! claims and releases), with a periodic full resync as a safety net; the store is the truth.
//! Lifecycle:
//!
//! * ADD is idempotent per attachment (container ID, interface): an attachment that holds
//!   claims gets the same addresses again, and a retry completes any family it lacks. A
//!   StatefulSet pod gets its kept address back while the pool is still among its candidates.
//!   Otherwise the policy orders the pools and the engine takes the next free address of the
//!   first pool with room, per family, and claims all families of the NIC (kept ones included)
//!   in one atomic batch.
//! * DEL releases what the attachment holds (a StatefulSet pod's addresses are kept, detached,
//!   for its next ADD, unless the set was scaled below its ordinal); idempotent. A released
//!   address cools down before it is handed out again.
//! * GC releases claims of a network that this node made and that no valid attachment holds,
//!   once seen leaked twice past a grace period ([`crate::gc`]); a runtime lists its own node's
//!   attachments only, so other nodes' claims are never its to judge. Kept StatefulSet
//!   addresses expire after a keep time.

mod ahead;
mod given;
mod inventory;
mod pick;
mod release;
mod returning;
mod state;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::IpNet;

use crate::addr::IpFamily;
use crate::gc::Suspects;
use crate::policy::{
    CniDefaults, Decision, DropReason, FamilyDecision, Inventory, NamespaceInfo, Nic, NodeInfo,
    PodInfo, Policy, PolicyError, PolicyErrorKind, PoolRef, Request,
};
use crate::pool::{Pool, Reserved, Route, Subnet};
use crate::store::{Attachment, Claim, Clock, PodRef, Reattach, Store, StoreError, system_clock};

use state::State;

/// How often a lost create-if-absent race is retried with another address before giving up.
const CONFLICT_RETRIES: usize = 16;

/// Locks serialising ADD, DEL and CHECK of one attachment (runtimes do retry and race
/// themselves); striped so that memory does not grow with the number of attachments.
const ATTACHMENT_STRIPES: usize = 64;

/// Time-related behaviour, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// A released address stays out of the free index this long (Calico's
    /// `IPCooldownSeconds`): neighbours' ARP caches may still point at the old pod.
    pub cooldown: u64,
    /// GC releases a claim only after seeing it leaked twice at least this far apart, and never
    /// a claim younger than this.
    pub gc_grace: u64,
    /// A StatefulSet pod's address kept after DEL is released when the pod has not come back
    /// within this time.
    pub stateful_keep: u64,
    /// The index is rebuilt from a store snapshot this often, whatever the change feed said.
    pub resync: u64,
    /// Set when several engines (one per node) write to one store: each pool's cursor then
    /// starts at a place of its own, chosen from this value and the pool's name, instead of
    /// where the last writer left the shared cursor. Nodes walking the same order from the
    /// same place would race for every address; from their own places they rarely meet.
    pub spread: Option<u64>,
    /// Set when the store serves this node alone (the embedded store): claims that record no
    /// node (written before claims recorded one) are then this node's, for the CNI GC verb.
    /// With a shared store they may be any node's, and that verb leaves them alone.
    pub single_node: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cooldown: 30,
            gc_grace: 60,
            stateful_keep: 24 * 3600,
            resync: 300,
            spread: None,
            single_node: true,
        }
    }
}

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

/// One DEL.
#[derive(Clone, Debug)]
pub struct DelRequest {
    pub attachment: Attachment,
    /// The StatefulSet's replica count, when the caller knows it: a pod whose ordinal is at or
    /// past it is gone for good, and its address is released instead of kept.
    pub owner_replicas: Option<u32>,
    /// When the DEL was issued (unix seconds), for a DEL replayed late (from the DEL journal).
    /// Its caller orders it before any later ADD of the attachment ([`Engine::del_serialized`]);
    /// it releases only claims still as it read them.
    pub issued_at: Option<u64>,
}

impl DelRequest {
    pub fn new(attachment: Attachment) -> Self {
        DelRequest {
            attachment,
            owner_replicas: None,
            issued_at: None,
        }
    }
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
    /// Addresses this call claimed (the others it held already, or took back).
    pub claimed: Vec<IpAddr>,
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

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{kind} {name} is defined twice: rename one")]
    Duplicate { kind: &'static str, name: String },
    #[error("reading claims: {0}")]
    Store(#[from] StoreError),
}

/// Whether a pool takes new allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolState {
    Serving,
    /// `disable: true`: serves its claims, takes no new ones.
    Disabled,
    /// Deleted (or edited away) while it still holds claims, or marked for deletion: serves its
    /// claims until they are released, takes no new ones.
    Terminating,
}

impl PoolState {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolState::Serving => "serving",
            PoolState::Disabled => "disabled",
            PoolState::Terminating => "terminating",
        }
    }
}

/// Usage of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    pub name: String,
    pub family: IpFamily,
    /// Assignable addresses (0 for a retired version).
    pub total: u64,
    /// Addresses that can be handed out, cooling ones included.
    pub free: u64,
    /// Of the free addresses, those released less than the cooldown ago: handed out only when
    /// no other free address is left.
    pub cooling: u64,
    /// Cooling addresses handed out because nothing else was free, since start.
    pub cooldown_cut_short: u64,
    /// Claims a retired version still serves.
    pub claims: u64,
    pub state: PoolState,
}

/// What one GC look did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub released: Vec<Claim>,
    /// Leaked claims kept (detached) for their holder: a StatefulSet's pod, a virtual machine.
    pub kept: Vec<Claim>,
    /// Claims seen leaked, waiting for their second sighting past the grace period.
    pub suspects: usize,
}

/// The lock of one attachment, held ([`Engine::serialize`]).
pub struct Serialized<'a> {
    attachment: Attachment,
    _guard: MutexGuard<'a, ()>,
}

impl Serialized<'_> {
    pub fn attachment(&self) -> &Attachment {
        &self.attachment
    }

    fn check(&self, attachment: &Attachment) {
        assert_eq!(
            &self.attachment, attachment,
            "the lock held is another attachment's"
        );
    }
}

/// What was last installed, to tell a real change from a reload of the same objects.
#[derive(Default)]
struct Installed {
    pools: Vec<Pool>,
    subnets: Vec<Subnet>,
    reserved: Vec<Reserved>,
    generation: u64,
    last_resync: u64,
}

pub struct Engine<S, P> {
    store: S,
    policy: P,
    config: EngineConfig,
    /// The node this engine allocates on, recorded in every claim it makes ([`Engine::on_node`]).
    node: String,
    clock: Clock,
    state: Mutex<State>,
    /// Serialises installs and resyncs (which build without holding `state`).
    installed: Mutex<Installed>,
    suspects: Mutex<Suspects>,
    attachment_locks: Vec<Mutex<()>>,
    /// Create-if-absent races lost to another writer of the store, since start.
    lost_races: std::sync::atomic::AtomicU64,
    /// Per pool name: cooling addresses handed out because nothing else was free, since start.
    cut_short: Mutex<std::collections::BTreeMap<String, u64>>,
    /// What pods' NICs released lately, for their next sandboxes.
    returning: Mutex<returning::Returning>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Store, P: Policy> Engine<S, P> {
    pub fn new(store: S, policy: P) -> Self {
        Self::with_config(store, policy, EngineConfig::default(), system_clock())
    }

    pub fn with_config(store: S, policy: P, config: EngineConfig, clock: Clock) -> Self {
        Engine {
            store,
            policy,
            config,
            node: String::new(),
            clock,
            state: Mutex::new(State::empty(config.cooldown, config.spread)),
            installed: Mutex::new(Installed::default()),
            suspects: Mutex::new(Suspects::new()),
            attachment_locks: (0..ATTACHMENT_STRIPES).map(|_| Mutex::new(())).collect(),
            lost_races: Default::default(),
            cut_short: Default::default(),
            returning: Default::default(),
        }
    }

    /// The engine of node `node`: its claims record the node, and the CNI GC verb
    /// ([`Engine::gc`]) judges that node's claims alone.
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = node.to_string();
        self
    }

    /// The node this engine allocates on.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn lock_attachment(&self, attachment: &Attachment) -> MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        attachment.hash(&mut h);
        lock(&self.attachment_locks[h.finish() as usize % ATTACHMENT_STRIPES])
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn config(&self) -> EngineConfig {
        self.config
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub fn is_loaded(&self) -> bool {
        self.state().loaded
    }

    /// Create-if-absent races lost to another writer since start (each retried with another
    /// address).
    pub fn lost_races(&self) -> u64 {
        self.lost_races.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The store revision the indexes reflect (0 before the first install).
    pub fn revision(&self) -> u64 {
        self.state().revision
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
        // Whatever policy decided, the host checks the decision itself.
        decision.validate(&inventory, &request).map_err(blame)?;
        Ok((inventory, request, decision))
    }

    pub fn add(&self, req: &AddRequest) -> Result<AddOutcome, AllocError> {
        let _serial = self.lock_attachment(&req.attachment);
        self.add_locked(req)
    }

    /// Holds `attachment`'s lock until the returned guard is dropped: its ADD, DEL and CHECK wait
    /// meanwhile. For work that must be ordered with them exactly, such as a DEL remembered in a
    /// journal that an ADD of the same attachment must settle first
    /// ([`Engine::add_serialized`], [`Engine::del_serialized`]).
    pub fn serialize(&self, attachment: &Attachment) -> Serialized<'_> {
        Serialized {
            attachment: attachment.clone(),
            _guard: self.lock_attachment(attachment),
        }
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

    fn outcome(
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

/// A number for `value`, the same in every process of one build (std's SipHash with fixed
/// keys): where cursors jump or start, never anything stored.
pub fn seed_of(value: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

fn load_to_alloc(e: LoadError) -> AllocError {
    match e {
        LoadError::Store(e) => AllocError::Store(e),
        LoadError::Duplicate { .. } => AllocError::Store(StoreError::Backend(e.to_string())),
    }
}
