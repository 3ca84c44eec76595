//! The allocation engine: policy → ordered pools → free address → atomic claim.
//!
//! The one stateful service over `allot-core`'s seams (a lock over the free index, striped
//! attachment locks, retries and cool-downs), kept out of core so that core stays vocabulary and
//! pure tables (as linkerd's policy-controller keeps its indexes and runtime in crates above its
//! `core`): only what allocates depends on it, the agent today.
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
//!   once seen leaked twice past a grace period ([`allot_core::gc`]); a runtime lists its own
//!   node's attachments only, so other nodes' claims are never its to judge. Kept StatefulSet
//!   addresses expire after a keep time.

mod add;
mod ahead;
pub mod free;
mod given;
mod inventory;
mod pick;
mod release;
mod returning;
mod state;
#[cfg(feature = "testing")]
pub mod testing;

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use ipnet::IpNet;

use allot_core::addr::IpFamily;
use allot_core::gc::Suspects;
use allot_core::policy::{CniDefaults, NamespaceInfo, NodeInfo, PodInfo, Policy, PolicyError};
use allot_core::pool::{Pool, Reserved, Route, Subnet};
use allot_core::store::{Attachment, Claim, Clock, Store, StoreError, system_clock};

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
        LoadError::Duplicate { .. } => {
            AllocError::Store(StoreError::backend_caused(e.to_string(), e))
        }
    }
}
