//! The storage seam: atomic per-address claims. Every backend (embedded, etcd, kubernetes)
//! implements [`Store`] and passes the same contract suite (`allot-store`'s `contract` module).
//!
//! The unit of truth is a [`Claim`]: one record per allocated address, keyed by the address.
//! Creating claims is an atomic create-if-absent, so two writers can never hold one address, and
//! no pool-wide object is rewritten per allocation. Pool usage is derived from claims.

use std::fmt;
use std::net::IpAddr;

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
}

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
    /// Unix seconds of creation (or of the last attach/detach).
    pub updated_at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Create-if-absent lost: the address is already claimed. Nothing was written.
    #[error("address {0} is already claimed")]
    Conflict(IpAddr),
    /// The claim changed under us (released or re-attached by someone else). Nothing was written.
    #[error("claim for {0} changed concurrently")]
    Stale(IpAddr),
    /// The backend is busy or unreachable for now (a held lock, a lost connection): retrying
    /// later may succeed. Nothing was written.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend failed; the message says what and, where it can, what to do.
    #[error("store: {0}")]
    Backend(String),
}

/// Atomic per-address claims.
///
/// Implementations must make every method atomic: a batch is written entirely or not at all, and
/// concurrent callers (threads, processes, agents) never both succeed in claiming one address.
pub trait Store: Send + Sync {
    /// Creates every claim, or none: fails with [`StoreError::Conflict`] naming an address that
    /// is already claimed.
    fn claim(&self, claims: &[Claim]) -> Result<(), StoreError>;

    /// Releases the claims `attachment` holds, and returns them. Idempotent: nothing held is
    /// `Ok(vec![])`. Claims of other attachments are never touched.
    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError>;

    /// Releases one claim, but only while `attachment` holds it (`None`: while it is detached).
    /// Returns whether a claim was released.
    fn release(&self, address: IpAddr, attachment: Option<&Attachment>)
    -> Result<bool, StoreError>;

    /// Detaches the claims of `attachment`, keeping the addresses for the same pod (StatefulSet
    /// stickiness). Returns the detached claims.
    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError>;

    /// Attaches a detached claim to `attachment`, only if it is still detached and still belongs
    /// to the same pod (namespace and name); fails with [`StoreError::Stale`] otherwise. The
    /// claim takes the new pod's UID and owner (a restarted StatefulSet pod has a new UID, and GC
    /// compares UIDs).
    fn reattach(
        &self,
        address: IpAddr,
        pod: &PodRef,
        attachment: &Attachment,
        now: u64,
    ) -> Result<Claim, StoreError>;

    /// The claims `attachment` holds.
    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError>;

    /// Detached claims kept for the pod `namespace/name`.
    fn detached_of(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError>;

    /// Every claim (to build free-address indexes at start-up, for GC and for inspection).
    fn all(&self) -> Result<Vec<Claim>, StoreError>;
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn claim(&self, claims: &[Claim]) -> Result<(), StoreError> {
        (**self).claim(claims)
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
    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        (**self).detach(attachment, now)
    }
    fn reattach(
        &self,
        address: IpAddr,
        pod: &PodRef,
        attachment: &Attachment,
        now: u64,
    ) -> Result<Claim, StoreError> {
        (**self).reattach(address, pod, attachment, now)
    }
    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        (**self).claims_of(attachment)
    }
    fn detached_of(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        (**self).detached_of(namespace, name)
    }
    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        (**self).all()
    }
}

/// A [`Store`] in memory: for tests, and as the reference the contract suite is written
/// against. Not durable.
#[derive(Debug, Default)]
pub struct MemoryStore {
    claims: std::sync::Mutex<std::collections::BTreeMap<IpAddr, Claim>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<IpAddr, Claim>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn claim(&self, claims: &[Claim]) -> Result<(), StoreError> {
        let mut map = self.lock();
        let mut batch = std::collections::BTreeSet::new();
        if let Some(c) = claims
            .iter()
            .find(|c| map.contains_key(&c.address) || !batch.insert(c.address))
        {
            return Err(StoreError::Conflict(c.address));
        }
        for c in claims {
            map.insert(c.address, c.clone());
        }
        Ok(())
    }

    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let mut map = self.lock();
        let held: Vec<IpAddr> = map
            .values()
            .filter(|c| c.attachment.as_ref() == Some(attachment))
            .map(|c| c.address)
            .collect();
        Ok(held.iter().filter_map(|a| map.remove(a)).collect())
    }

    fn release(
        &self,
        address: IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        let mut map = self.lock();
        if map
            .get(&address)
            .is_some_and(|c| c.attachment.as_ref() == attachment)
        {
            map.remove(&address);
            return Ok(true);
        }
        Ok(false)
    }

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        let mut map = self.lock();
        let mut out = Vec::new();
        for c in map
            .values_mut()
            .filter(|c| c.attachment.as_ref() == Some(attachment))
        {
            c.attachment = None;
            c.updated_at = now;
            out.push(c.clone());
        }
        Ok(out)
    }

    fn reattach(
        &self,
        address: IpAddr,
        pod: &PodRef,
        attachment: &Attachment,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let mut map = self.lock();
        match map.get_mut(&address) {
            Some(c)
                if c.attachment.is_none()
                    && c.pod.namespace == pod.namespace
                    && c.pod.name == pod.name =>
            {
                c.attachment = Some(attachment.clone());
                c.pod = pod.clone();
                c.updated_at = now;
                Ok(c.clone())
            }
            _ => Err(StoreError::Stale(address)),
        }
    }

    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        Ok(self
            .lock()
            .values()
            .filter(|c| c.attachment.as_ref() == Some(attachment))
            .cloned()
            .collect())
    }

    fn detached_of(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        Ok(self
            .lock()
            .values()
            .filter(|c| {
                c.attachment.is_none() && c.pod.namespace == namespace && c.pod.name == name
            })
            .cloned()
            .collect())
    }

    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        Ok(self.lock().values().cloned().collect())
    }
}
