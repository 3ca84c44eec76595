//! Giving addresses back: DEL (keep or release), GC past a grace period, expiry of kept
//! StatefulSet addresses, all in batches that re-check each claim in the store.

use std::collections::{BTreeMap, BTreeSet};

use crate::{AddOutcome, AllocError, DelRequest, Engine, GcReport, Serialized, lock};
use allot_core::gc;
use allot_core::policy::Policy;
use allot_core::store::{Attachment, Claim, Store, unchanged};

/// Claims released per store transaction by GC and expiry: one fsync per batch, not per claim.
const RELEASE_BATCH: usize = 1000;

impl<S: Store, P: Policy> Engine<S, P> {
    /// Releases what `attachment` holds; a StatefulSet pod's addresses are kept (detached) for
    /// its next ADD, a virtual machine's for its next launcher pod. Idempotent. Returns the
    /// addresses released or kept.
    pub fn del(&self, attachment: &Attachment) -> Result<Vec<Claim>, AllocError> {
        self.del_request(&DelRequest::new(attachment.clone()))
    }

    /// [`Engine::del`] with what else the caller knows (replica count, when it was issued).
    pub fn del_request(&self, req: &DelRequest) -> Result<Vec<Claim>, AllocError> {
        let held = self.serialize(&req.attachment);
        self.del_serialized(&held, req)
    }

    /// [`Engine::del_request`] under a lock the caller holds already.
    ///
    /// A DEL replayed late (from a journal, `issued_at` set) releases what the attachment holds
    /// now: its caller settles the journal entry under the attachment's lock before any later
    /// ADD of the attachment is served, so nothing the attachment holds can be a later ADD's.
    /// (Comparing claim times with `issued_at` cannot tell: a repeated ADD writes nothing, a
    /// re-ADD can fall in the same second, and clocks step.)
    ///
    /// # Panics
    /// When `lock` is another attachment's lock (a bug of the caller's).
    pub fn del_serialized(
        &self,
        lock: &Serialized<'_>,
        req: &DelRequest,
    ) -> Result<Vec<Claim>, AllocError> {
        lock.check(&req.attachment);
        let held = self.store.claims_of(&req.attachment)?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let kept = held.iter().any(|c| c.pod.keeps_addresses());
        let scaled_away = req.owner_replicas.is_some_and(|replicas| {
            held.iter().all(|c| {
                c.pod.is_stateful()
                    && gc::scaled_away(
                        &c.pod.name,
                        c.pod.owner_name.as_deref().unwrap_or(""),
                        replicas,
                    )
            })
        });
        if kept && !scaled_away {
            return Ok(self.store.detach(&req.attachment, self.now())?);
        }
        let released = match req.issued_at {
            Some(_) => self.store.release_unchanged(&held),
            None => self.store.release_attachment(&req.attachment),
        };
        // A release done in part is still an error for the caller (the DEL is journaled and
        // served again), but what it released is free from now on, and known so.
        let done = match &released {
            Ok(released) => released.as_slice(),
            Err(e) => e.done(),
        };
        self.mark_released(done);
        // For the pod's next sandbox (a runtime retrying it); GC and expiry release for pods
        // that are gone, which never come back for it.
        crate::lock(&self.returning).remember(done, self.now());
        Ok(released?)
    }

    fn mark_released(&self, released: &[Claim]) {
        let now = self.now();
        let mut state = self.state();
        for c in released {
            state.mark_released(c.address, now, now);
        }
    }

    /// What `attachment` holds, or [`AllocError::UnknownAttachment`].
    pub fn check(&self, attachment: &Attachment) -> Result<AddOutcome, AllocError> {
        let _serial = self.lock_attachment(attachment);
        let held = self.store.claims_of(attachment)?;
        if held.is_empty() {
            return Err(AllocError::UnknownAttachment(attachment.clone()));
        }
        Ok(self.outcome(&held, None, true, Vec::new()))
    }

    /// One GC look at `network` on this engine's node (the CNI GC verb: `valid` is every
    /// attachment of the network the node's runtime still uses): every attached claim of the
    /// network made on this node whose attachment is not in `valid` is a suspect; suspects seen
    /// at an earlier look at least the grace period ago, and unchanged since, are released
    /// (re-checked in the store, in batches). Other nodes' claims (a runtime lists its own
    /// node's attachments only), claims of other networks and kept StatefulSet addresses (see
    /// [`Engine::expire_kept`]) are left alone. A leaked claim a DEL would have kept (a
    /// StatefulSet's pod's, a virtual machine's) is detached instead, as that DEL would have.
    pub fn gc(&self, network: &str, valid: &BTreeSet<Attachment>) -> Result<GcReport, AllocError> {
        let now = self.now();
        let ours =
            |c: &Claim| c.node == self.node || (c.node.is_empty() && self.config.single_node);
        let in_scope = |c: &Claim| c.network == network && ours(c);
        let leaked =
            self.store.all()?.into_iter().filter(|c| {
                in_scope(c) && c.attachment.as_ref().is_some_and(|a| !valid.contains(a))
            });
        let due = lock(&self.suspects).look(
            in_scope,
            leaked.map(|c| (c, gc::NotBefore::AfterFirstSighting(0))),
            now,
            self.config.gc_grace,
        );
        // What a DEL would keep (a StatefulSet's pod's, a virtual machine's addresses) is
        // kept: the DEL was lost, not the holder.
        let (keep, release): (Vec<Claim>, Vec<Claim>) =
            due.into_iter().partition(|c| c.pod.keeps_addresses());
        let released = self.release_batches(&release)?;
        let kept = self.detach_unchanged(&keep)?;
        Ok(GcReport {
            released,
            kept,
            suspects: lock(&self.suspects).len(),
        })
    }

    /// Detaches the attachments of `claims`, each only while it holds exactly what was read
    /// (under its lock, so no ADD of it runs meanwhile).
    fn detach_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, AllocError> {
        let mut by_attachment: BTreeMap<&Attachment, Vec<&Claim>> = BTreeMap::new();
        for c in claims {
            if let Some(a) = &c.attachment {
                by_attachment.entry(a).or_default().push(c);
            }
        }
        let mut kept = Vec::new();
        for (attachment, read) in by_attachment {
            let _serial = self.lock_attachment(attachment);
            let now = self.store.claims_of(attachment)?;
            let same = now.len() == read.len()
                && now.iter().all(|n| {
                    read.iter()
                        .any(|r| r.address == n.address && unchanged(n, r))
                });
            if same {
                kept.extend(self.store.detach(attachment, self.now())?);
            }
            let mut suspects = lock(&self.suspects);
            for c in read {
                suspects.forget(c);
            }
        }
        Ok(kept)
    }

    /// Releases kept StatefulSet addresses whose pod has not come back within the keep time.
    /// Quarantined addresses are left to [`Engine::expire_quarantined`], virtual machines'
    /// to the cluster's GC.
    pub fn expire_kept(&self) -> Result<Vec<Claim>, AllocError> {
        let now = self.now();
        let due: Vec<Claim> = self
            .store
            .detached()?
            .into_iter()
            .filter(|c| {
                // A virtual machine's address is kept while the VM exists, however long it is
                // stopped: the cluster's GC decides that, not a timer.
                !c.is_quarantined()
                    && c.pod.virtual_machine().is_none()
                    && gc::kept_too_long(c, now, self.config.stateful_keep)
            })
            .collect();
        self.release_batches(&due)
    }

    /// Releases quarantined addresses (see [`Engine::quarantine`]) older than `max_age`
    /// seconds, each only if unchanged since it was read. Returns the released claims and the
    /// quarantined ones that remain.
    pub fn expire_quarantined(&self, max_age: u64) -> Result<(Vec<Claim>, Vec<Claim>), AllocError> {
        let now = self.now();
        let (due, kept): (Vec<Claim>, Vec<Claim>) = self
            .store
            .detached()?
            .into_iter()
            .filter(Claim::is_quarantined)
            .partition(|c| c.updated_at.saturating_add(max_age) <= now);
        Ok((self.release_batches(&due)?, kept))
    }

    /// Releases `due` (each only if unchanged since it was read), a batch per transaction.
    /// A store error stops the run: what was committed is marked free, the rest stays claimed
    /// and suspect, for the next run.
    fn release_batches(&self, due: &[Claim]) -> Result<Vec<Claim>, AllocError> {
        let mut released = Vec::new();
        for batch in due.chunks(RELEASE_BATCH) {
            let done = match self.store.release_unchanged(batch) {
                Ok(done) => done,
                Err(e) => {
                    released.extend_from_slice(e.done());
                    self.mark_released(&released);
                    return Err(e.into());
                }
            };
            let mut suspects = lock(&self.suspects);
            for c in batch {
                suspects.forget(c);
            }
            drop(suspects);
            released.extend(done);
        }
        self.mark_released(&released);
        Ok(released)
    }
}
