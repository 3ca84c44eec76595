//! The storage seam: atomic per-address claims. Every backend (embedded, etcd, kubernetes)
//! implements [`Store`] and passes the same contract suite (`allot-store`'s `contract` module).
//!
//! The unit of truth is a [`Claim`]: one record per allocated address, keyed by the address.
//! Creating claims is an atomic create-if-absent, so two writers can never hold one address, and
//! no pool-wide object is rewritten per allocation. Pool usage is derived from claims.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

mod error;
pub use error::{Cause, StoreError, report};

/// One CNI attachment: a container's interface. ADD, DEL and CHECK are idempotent per attachment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attachment {
    pub container_id: String,
    pub interface: String,
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container_id, self.interface)
    }
}

/// Who an address was allocated to, as far as the host knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Kind of the pod's top-level controller ("StatefulSet", "Deployment", ...), if known.
    pub owner_kind: Option<String>,
    pub owner_name: Option<String>,
}

impl PodRef {
    /// A StatefulSet pod keeps its address across restarts while its pools are unchanged.
    pub fn is_stateful(&self) -> bool {
        self.owner_kind.as_deref() == Some("StatefulSet")
    }

    /// The KubeVirt virtual machine whose launcher pod this is (a claim made for it is held
    /// for the VM, not the pod: every launcher pod of the VM, a restarted one or a live
    /// migration's target, takes it over).
    pub fn virtual_machine(&self) -> Option<&str> {
        match (self.owner_kind.as_deref(), self.owner_name.as_deref()) {
            (Some(VIRTUAL_MACHINE_KIND), Some(name)) if !name.is_empty() => Some(name),
            _ => None,
        }
    }

    /// Whether this is a launcher pod of the virtual machine `namespace/name`.
    pub fn of_virtual_machine(&self, namespace: &str, name: &str) -> bool {
        self.namespace == namespace && self.virtual_machine() == Some(name)
    }

    /// Whether a DEL keeps this pod's addresses (detached) for the next pod that is the same
    /// holder: a StatefulSet's pod of the same name, a virtual machine's next launcher pod.
    pub fn keeps_addresses(&self) -> bool {
        self.is_stateful() || self.virtual_machine().is_some()
    }

    /// Whether `self` and `other` hold addresses as one: the same pod (namespace and name), or
    /// launcher pods of the same virtual machine.
    pub fn same_holder(&self, other: &PodRef) -> bool {
        self.namespace == other.namespace
            && (self.name == other.name
                || self
                    .virtual_machine()
                    .is_some_and(|vm| other.virtual_machine() == Some(vm)))
    }

    /// The holder of an address quarantined because the host at `mac` answered for it on the
    /// link (see [`Store::quarantine`]). Its namespace cannot be a Kubernetes namespace (a dot)
    /// and its name cannot be a pod's (colons), so no pod ever takes the address back or is
    /// mistaken for it; `claims_of_pod(QUARANTINE_NAMESPACE, mac)` lists what one foreign host
    /// was found holding.
    pub fn conflict(mac: &str) -> PodRef {
        PodRef {
            namespace: QUARANTINE_NAMESPACE.to_string(),
            name: mac.to_string(),
            uid: String::new(),
            owner_kind: Some(CONFLICT_KIND.to_string()),
            owner_name: Some(mac.to_string()),
        }
    }

    /// Whether this is the holder of a quarantined address ([`PodRef::conflict`]).
    pub fn is_conflict(&self) -> bool {
        self.namespace == QUARANTINE_NAMESPACE && self.owner_kind.as_deref() == Some(CONFLICT_KIND)
    }

    /// The MAC address that answered for a quarantined address.
    pub fn conflict_mac(&self) -> Option<&str> {
        self.is_conflict().then_some(self.name.as_str())
    }
}

/// `PodRef::owner_kind` of a KubeVirt launcher pod's claims: the pod's controller is a
/// VirtualMachineInstance, named (as KubeVirt names it) after its VirtualMachine; a bare
/// VirtualMachineInstance counts as a VM of its name.
pub const VIRTUAL_MACHINE_KIND: &str = "VirtualMachine";

/// The owner kind a claim records for a pod whose controller (reference) is `kind` of
/// `api_version`: a KubeVirt VirtualMachineInstance stands for its virtual machine
/// ([`VIRTUAL_MACHINE_KIND`]), whose address every launcher pod of it shares; any other kind is
/// itself.
pub fn holder_kind<'a>(api_version: &str, kind: &'a str) -> &'a str {
    let kubevirt = api_version.split('/').next() == Some("kubevirt.io");
    if kubevirt && kind == "VirtualMachineInstance" {
        VIRTUAL_MACHINE_KIND
    } else {
        kind
    }
}
/// `PodRef::namespace` of a quarantined address.
pub const QUARANTINE_NAMESPACE: &str = "allot.quarantine";
/// `PodRef::owner_kind` of a quarantined address.
pub const CONFLICT_KIND: &str = "Conflict";

/// An allocated address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub address: IpAddr,
    pub pool: String,
    /// The CNI network (config `name`) the attachment belongs to: a runtime garbage-collects
    /// one network at a time.
    pub network: String,
    /// The attachment holding the address; `None` while a StatefulSet pod's address is kept
    /// between its DEL and its next ADD.
    pub attachment: Option<Attachment>,
    pub pod: PodRef,
    /// The node whose agent made the claim, or last took it back for its pod: CNI attachments
    /// are a node's own (a runtime lists only its node's), so the CNI GC verb on a node looks
    /// at that node's claims alone. Empty in claims written before claims recorded their node.
    pub node: String,
    /// Unix seconds of creation (or of the last attach/detach/quarantine).
    pub updated_at: u64,
}

impl Claim {
    /// Held by a conflict seen on the link ([`Store::quarantine`]): detached, owned by
    /// [`PodRef::conflict`]. Released by expiry only, never by GC or a pod.
    pub fn is_quarantined(&self) -> bool {
        self.attachment.is_none() && self.pod.is_conflict()
    }
}

/// A detached claim to give back to its pod, in the same batch as fresh claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reattach {
    pub address: IpAddr,
    /// The pod taking it back: the same holder as the claim's ([`PodRef::same_holder`]: same
    /// namespace and name, or the same virtual machine), with its UID and owner.
    pub pod: PodRef,
    pub attachment: Attachment,
    /// The CNI network the attachment is on: the claim's from now on. It is the claim's own but
    /// for a claim a migration made without knowing its network (empty), which the first ADD
    /// taking it back tells.
    pub network: String,
    /// The node taking it back (a StatefulSet pod may come back on another node).
    pub node: String,
    /// Unix seconds, the claim's new `updated_at`.
    pub now: u64,
}

/// What happened to one address, as the change feed reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// The address was claimed: it is no longer free.
    Claimed,
    /// The claim was released: the address is free again.
    Released,
    /// The claim changed (detached, reattached) but the address stays claimed.
    Updated,
}

/// One entry of the change feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The store's revision after this change. Revisions only grow.
    pub revision: u64,
    pub address: IpAddr,
    pub kind: ChangeKind,
    /// Unix seconds when the change was made (the writer's clock).
    pub at: u64,
}

/// An answer of [`Store::changes_since`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changes {
    /// Every change after the revision asked for, in order, and the revision they lead to
    /// (the store's revision when it answered, even if `changes` is empty).
    Since { changes: Vec<Change>, revision: u64 },
    /// The store has forgotten some changes after the revision asked for (compaction): read a
    /// [`Snapshot`] instead.
    Compacted,
}

/// An address a claim holds, and the claim's pool: all an index needs of a claim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Taken {
    pub address: IpAddr,
    pub pool: Arc<str>,
}

impl Taken {
    /// The addresses `claims` hold, in address order, their pools' names shared: a snapshot of
    /// 100,000 claims is a few megabytes, not the claims copied in full.
    pub fn of_all<'a>(claims: impl IntoIterator<Item = &'a Claim>) -> Vec<Taken> {
        let mut pools: HashMap<&str, Arc<str>> = HashMap::new();
        let mut taken: Vec<Taken> = claims
            .into_iter()
            .map(|c| Taken {
                address: c.address,
                pool: pools
                    .entry(&c.pool)
                    .or_insert_with(|| Arc::from(c.pool.as_str()))
                    .clone(),
            })
            .collect();
        taken.sort();
        taken
    }
}

/// Every claim at one revision, as an index needs it: what it is built from, and resynchronised
/// against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The revision the claims are as of; follow the feed from here.
    pub revision: u64,
    /// The claimed addresses, in address order.
    pub claims: Vec<Taken>,
    /// Addresses released at or after the time asked for, with when (unix seconds): a released
    /// address cools down before it is handed out again, across restarts and agents.
    pub released: Vec<(IpAddr, u64)>,
    /// The address each pool handed out last: round-robin cursors survive restarts.
    pub cursors: Vec<(String, IpAddr)>,
}

/// Atomic per-address claims, and a feed of their changes.
///
/// Implementations must make every method atomic: a batch is written entirely or not at all, and
/// concurrent callers (threads, processes, agents) never both succeed in claiming one address.
/// The one exception is a release or detach on a backend without transactions across its
/// objects, which says what it did: [`StoreError::Partial`].
/// Every write is reported by the change feed ([`Store::changes_since`]) in the order it was
/// made, so that every engine sharing the store keeps its free-address index true.
pub trait Store: Send + Sync {
    /// Creates every claim, or none: fails with [`StoreError::Conflict`] naming an address that
    /// is already claimed.
    fn claim(&self, claims: &[Claim]) -> Result<(), StoreError> {
        self.claim_batch(claims, &[]).map(drop)
    }

    /// Creates `fresh` claims and reattaches detached ones, all or nothing: fails with
    /// [`StoreError::Conflict`] naming a fresh address that is already claimed, or
    /// [`StoreError::Stale`] naming a reattach whose claim is no longer detached for the same
    /// holder ([`PodRef::same_holder`]). Returns the reattached claims as stored.
    fn claim_batch(&self, fresh: &[Claim], reattach: &[Reattach])
    -> Result<Vec<Claim>, StoreError>;

    /// Releases the claims `attachment` holds, and returns them. Idempotent: nothing held is
    /// `Ok(vec![])`. Claims of other attachments are never touched.
    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError>;

    /// Releases one claim, but only while `attachment` holds it (`None`: while it is detached).
    /// Returns whether a claim was released.
    fn release(&self, address: IpAddr, attachment: Option<&Attachment>)
    -> Result<bool, StoreError>;

    /// Releases each of `claims` that is still stored exactly as given (same attachment, pod UID
    /// and `updated_at`: a claim that changed since it was read is kept), all in one
    /// transaction. Returns the claims released.
    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError>;

    /// Detaches the claims of `attachment`, keeping the addresses for the same holder (a
    /// StatefulSet's pod, a virtual machine). Returns the detached claims.
    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError>;

    /// Attaches a detached claim to `reattach.attachment`, only if it is still detached and still
    /// belongs to the same holder ([`PodRef::same_holder`]); fails with [`StoreError::Stale`]
    /// otherwise.
    /// The claim takes the new pod's UID and owner (a restarted StatefulSet pod has a new UID, and
    /// GC compares UIDs), the network of the new attachment and the node taking it back.
    fn reattach(&self, reattach: Reattach) -> Result<Claim, StoreError> {
        let address = reattach.address;
        let mut claims = self.claim_batch(&[], &[reattach])?;
        claims.pop().ok_or(StoreError::Stale(address))
    }

    /// Takes `address` away from `attachment` and gives it to `holder` (a
    /// [`PodRef::conflict`]), detached, with `updated_at = now`, in one write: the address stays
    /// claimed throughout, so it is never free between the attachment and the quarantine.
    /// Fails with [`StoreError::Stale`] unless `attachment` holds `address` now. Returns the
    /// claim as stored. The change feed reports it as [`ChangeKind::Updated`].
    fn quarantine(
        &self,
        address: IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError>;

    /// The claims `attachment` holds.
    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError>;

    /// Every claim of the pod `namespace/name`, attached or not (an index lookup, not a scan).
    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError>;

    /// Every claim held for the virtual machine `namespace/name` (see
    /// [`PodRef::virtual_machine`]), attached or not. Backends without an index by owner read
    /// every claim.
    fn claims_of_virtual_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut claims = self.all()?;
        claims.retain(|c| c.pod.of_virtual_machine(namespace, name));
        Ok(claims)
    }

    /// Detached claims kept for the pod `namespace/name`.
    fn detached_of(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        let mut claims = self.claims_of_pod(namespace, name)?;
        claims.retain(|c| c.attachment.is_none());
        Ok(claims)
    }

    /// Every detached claim (kept StatefulSet addresses), for their expiry.
    fn detached(&self) -> Result<Vec<Claim>, StoreError>;

    /// Every claim (for GC and for inspection).
    fn all(&self) -> Result<Vec<Claim>, StoreError>;

    /// Every claim as of one revision, the addresses released at or after `released_since`
    /// (unix seconds), and the pools' cursors.
    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError>;

    /// The changes after `revision`, in order.
    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError>;

    /// Removes up to `limit` pieces of storage that hold no claim any more and whose releases
    /// all happened before `cooled_before` (unix seconds): the Kubernetes store's emptied
    /// IPBlocks. Each removal is conditional on the piece being unchanged since it was seen
    /// empty, so a claim made meanwhile always stays. Returns how many were removed. Stores
    /// whose emptied storage costs nothing (one row or key per claim) have nothing to remove.
    fn remove_emptied(&self, cooled_before: u64, limit: usize) -> Result<usize, StoreError> {
        let _ = (cooled_before, limit);
        Ok(0)
    }
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn claim(&self, claims: &[Claim]) -> Result<(), StoreError> {
        (**self).claim(claims)
    }
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        (**self).claim_batch(fresh, reattach)
    }
    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        (**self).release_attachment(attachment)
    }
    fn release(
        &self,
        address: IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        (**self).release(address, attachment)
    }
    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        (**self).release_unchanged(claims)
    }
    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        (**self).detach(attachment, now)
    }
    fn reattach(&self, reattach: Reattach) -> Result<Claim, StoreError> {
        (**self).reattach(reattach)
    }
    fn quarantine(
        &self,
        address: IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        (**self).quarantine(address, attachment, holder, now)
    }
    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        (**self).claims_of(attachment)
    }
    fn claims_of_virtual_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Claim>, StoreError> {
        (**self).claims_of_virtual_machine(namespace, name)
    }
    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        (**self).claims_of_pod(namespace, name)
    }
    fn detached_of(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        (**self).detached_of(namespace, name)
    }
    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        (**self).detached()
    }
    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        (**self).all()
    }
    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        (**self).snapshot(released_since)
    }
    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        (**self).changes_since(revision)
    }
    fn remove_emptied(&self, cooled_before: u64, limit: usize) -> Result<usize, StoreError> {
        (**self).remove_emptied(cooled_before, limit)
    }
}

/// A clock in unix seconds (injectable so that tests can move time).
pub type Clock = std::sync::Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock in unix seconds.
pub fn system_clock() -> Clock {
    std::sync::Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    })
}

/// A [`Store`] in memory: for tests, and as the reference the contract suite is written
/// against. Not durable.
pub struct MemoryStore {
    state: std::sync::Mutex<MemoryState>,
    clock: Clock,
}

#[derive(Default)]
struct MemoryState {
    claims: std::collections::BTreeMap<IpAddr, Claim>,
    /// The change feed; `log[0]` has revision `first_revision`.
    log: std::collections::VecDeque<Change>,
    first_revision: u64,
    revision: u64,
    cursors: std::collections::BTreeMap<String, IpAddr>,
}

impl MemoryState {
    fn record(&mut self, address: IpAddr, kind: ChangeKind, at: u64) {
        self.revision += 1;
        if self.log.is_empty() {
            self.first_revision = self.revision;
        }
        self.log.push_back(Change {
            revision: self.revision,
            address,
            kind,
            at,
        });
        // Bounded: a reader this far behind resynchronises from a snapshot.
        if self.log.len() > MEMORY_LOG_LIMIT {
            self.log.pop_front();
            self.first_revision += 1;
        }
    }
}

/// Changes a [`MemoryStore`] remembers.
const MEMORY_LOG_LIMIT: usize = 100_000;

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_clock(system_clock())
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store whose change feed stamps changes with `clock`.
    pub fn with_clock(clock: Clock) -> Self {
        MemoryStore {
            state: std::sync::Mutex::new(MemoryState::default()),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets every change up to `revision` (as a backend's compaction would): a reader behind
    /// it gets [`Changes::Compacted`].
    pub fn compact(&self, revision: u64) {
        let mut state = self.lock();
        while state.log.front().is_some_and(|c| c.revision <= revision) {
            state.log.pop_front();
        }
        state.first_revision = state.first_revision.max(revision + 1);
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }
}

/// Whether a stored claim is still the one a caller read (for [`Store::release_unchanged`]).
pub fn unchanged(stored: &Claim, read: &Claim) -> bool {
    stored.attachment == read.attachment
        && stored.pod.uid == read.pod.uid
        && stored.updated_at == read.updated_at
}

impl Store for MemoryStore {
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        let at = self.now();
        let mut state = self.lock();
        let mut batch = std::collections::BTreeSet::new();
        if let Some(c) = fresh
            .iter()
            .find(|c| state.claims.contains_key(&c.address) || !batch.insert(c.address))
        {
            return Err(StoreError::Conflict(c.address));
        }
        for r in reattach {
            let ok = batch.insert(r.address)
                && state
                    .claims
                    .get(&r.address)
                    .is_some_and(|c| c.attachment.is_none() && c.pod.same_holder(&r.pod));
            if !ok {
                return Err(StoreError::Stale(r.address));
            }
        }
        for c in fresh {
            state.claims.insert(c.address, c.clone());
            state.cursors.insert(c.pool.clone(), c.address);
            state.record(c.address, ChangeKind::Claimed, at);
        }
        let mut out = Vec::with_capacity(reattach.len());
        for r in reattach {
            let c = state.claims.get_mut(&r.address).expect("checked above");
            c.attachment = Some(r.attachment.clone());
            c.pod = r.pod.clone();
            c.network = r.network.clone();
            c.node = r.node.clone();
            c.updated_at = r.now;
            out.push(c.clone());
            state.record(r.address, ChangeKind::Updated, at);
        }
        Ok(out)
    }

    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let at = self.now();
        let mut state = self.lock();
        let held: Vec<IpAddr> = state
            .claims
            .values()
            .filter(|c| c.attachment.as_ref() == Some(attachment))
            .map(|c| c.address)
            .collect();
        let mut out = Vec::with_capacity(held.len());
        for a in held {
            if let Some(c) = state.claims.remove(&a) {
                state.record(a, ChangeKind::Released, at);
                out.push(c);
            }
        }
        Ok(out)
    }

    fn release(
        &self,
        address: IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        let at = self.now();
        let mut state = self.lock();
        if state
            .claims
            .get(&address)
            .is_some_and(|c| c.attachment.as_ref() == attachment)
        {
            state.claims.remove(&address);
            state.record(address, ChangeKind::Released, at);
            return Ok(true);
        }
        Ok(false)
    }

    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        let at = self.now();
        let mut state = self.lock();
        let mut out = Vec::new();
        for read in claims {
            if state
                .claims
                .get(&read.address)
                .is_some_and(|stored| unchanged(stored, read))
                && let Some(c) = state.claims.remove(&read.address)
            {
                state.record(read.address, ChangeKind::Released, at);
                out.push(c);
            }
        }
        Ok(out)
    }

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        let at = self.now();
        let mut state = self.lock();
        let mut out = Vec::new();
        for c in state
            .claims
            .values_mut()
            .filter(|c| c.attachment.as_ref() == Some(attachment))
        {
            c.attachment = None;
            c.updated_at = now;
            out.push(c.clone());
        }
        for c in &out {
            state.record(c.address, ChangeKind::Updated, at);
        }
        Ok(out)
    }

    fn quarantine(
        &self,
        address: IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let at = self.now();
        let mut state = self.lock();
        let Some(c) = state
            .claims
            .get_mut(&address)
            .filter(|c| c.attachment.as_ref() == Some(attachment))
        else {
            return Err(StoreError::Stale(address));
        };
        c.attachment = None;
        c.pod = holder.clone();
        c.updated_at = now;
        let out = c.clone();
        state.record(address, ChangeKind::Updated, at);
        Ok(out)
    }

    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        Ok(self
            .lock()
            .claims
            .values()
            .filter(|c| c.attachment.as_ref() == Some(attachment))
            .cloned()
            .collect())
    }

    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        Ok(self
            .lock()
            .claims
            .values()
            .filter(|c| c.pod.namespace == namespace && c.pod.name == name)
            .cloned()
            .collect())
    }

    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        Ok(self
            .lock()
            .claims
            .values()
            .filter(|c| c.attachment.is_none())
            .cloned()
            .collect())
    }

    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        Ok(self.lock().claims.values().cloned().collect())
    }

    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        let state = self.lock();
        // The latest change per address says whether it is still released.
        let mut last: std::collections::BTreeMap<IpAddr, &Change> = Default::default();
        for c in &state.log {
            last.insert(c.address, c);
        }
        Ok(Snapshot {
            revision: state.revision,
            claims: Taken::of_all(state.claims.values()),
            released: last
                .values()
                .filter(|c| c.kind == ChangeKind::Released && c.at >= released_since)
                .map(|c| (c.address, c.at))
                .collect(),
            cursors: state.cursors.iter().map(|(p, a)| (p.clone(), *a)).collect(),
        })
    }

    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        let state = self.lock();
        if revision > state.revision {
            // A revision from another history (the store was replaced): start over.
            return Ok(Changes::Compacted);
        }
        if revision == state.revision {
            return Ok(Changes::Since {
                changes: Vec::new(),
                revision: state.revision,
            });
        }
        if state.log.is_empty() || revision + 1 < state.first_revision {
            return Ok(Changes::Compacted);
        }
        let skip = (revision + 1 - state.first_revision) as usize;
        Ok(Changes::Since {
            changes: state.log.iter().skip(skip).cloned().collect(),
            revision: state.revision,
        })
    }
}
