//! DEL, CHECK and GC; the DEL journal settled (by the next ADD of an attachment, at start and at
//! every tick); quarantines and kept StatefulSet addresses released when their time is up.
//!
//! **The journal's ordering.** An entry is settled under its attachment's lock: by an ADD of
//! the same attachment before it is served, and by the replay at start (before the socket
//! accepts anything) and at every tick. A runtime sends the ADD that reuses a container ID only
//! after the DEL was answered, and the DEL was answered only once its entry was written, so an
//! entry present when an ADD arrives is a DEL issued before that ADD: settling it first orders
//! the two exactly, whatever the clocks say (`podman restart` reuses container IDs; a repeated
//! ADD writes nothing; a re-ADD may fall in the DEL's second).
//!
//! **A DEL the plugin gave up on.** The plugin journals a DEL it waited for too long and answers
//! success, so the runtime may re-add the container; the DEL it sent may still be waiting here
//! (behind the attachment's lock, for a blocking thread). It is checked under the lock, before
//! the store is touched: past the plugin's deadline it is dropped, not served and not
//! journaled, since the plugin's entry serves it in order (served now, it would release what a
//! re-ADD that took the lock first holds; journaled again, it would do so at the next replay).
//! Before the deadline it is served, and a re-ADD, issued only once the plugin gave up, waits
//! for it behind the lock. Only the agent that owns the socket and the journal replays
//! (`server::start`): another process on the node has no part in these locks.

use std::collections::BTreeSet;
use std::sync::Arc;

use allot_api as api;
use allot_core::store::{Attachment, Claim, StoreError};
use allot_engine::{AllocError, DelRequest, Serialized};

use super::{Node, NodeError};
use crate::wire;

impl Node {
    /// DEL: releases what the attachment holds, unless a StatefulSet keeps it for its pod. When
    /// the store cannot take it now, the DEL is remembered in the journal and answered: the pod
    /// must be able to go away.
    pub async fn del(self: &Arc<Self>, r: api::DelRequest) -> Result<(), NodeError> {
        self.blocking("del", move |node| {
            let request = DelRequest {
                attachment: wire::attachment(&r.attachment),
                owner_replicas: r.owner_replicas,
                issued_at: r.issued_at,
            };
            let container = request.attachment.clone();
            let lock = node.engine.serialize(&container);
            if let Some(late) = r.monotonic_deadline_ms.and_then(api::deadline::overdue) {
                return Err(NodeError::PastDeadline {
                    attachment: container,
                    late,
                });
            }
            let touched = match node.release_serialized(&lock, request) {
                Err(AllocError::Store(StoreError::Unavailable { message: why, .. })) => {
                    return node.remember_del(r, &why);
                }
                // Released in part (an IPv4 and an IPv6 block, one refused, whatever refused
                // it): what was released may be handed out already, so the DEL cannot be
                // answered as failed (the runtime would count the sandbox as still holding
                // it); the journal's replay releases the rest.
                Err(AllocError::Store(e @ StoreError::Partial { .. })) => {
                    return node.remember_del(r, &e.to_string());
                }
                other => other?,
            };
            // Served now: a DEL remembered before (the runtime retried) is done too.
            if let Err(e) = node.journal.forget(&container) {
                tracing::warn!(%container, "served, but cannot remove its DEL journal entry: {e}; replaying it later releases nothing this attachment holds then");
            }
            if r.issued_at.is_some() {
                let released = touched.iter().filter(|c| c.attachment.is_some()).count();
                tracing::info!(%container, released, "replayed a DEL from the plugin's journal");
            }
            Ok(())
        })
        .await
    }

    /// CHECK: what the attachment holds.
    pub async fn check(
        self: &Arc<Self>,
        r: api::AttachmentId,
    ) -> Result<api::IpamResult, NodeError> {
        self.blocking("check", move |node| {
            Ok(wire::result(&node.engine.check(&wire::attachment(&r))?))
        })
        .await
    }

    /// The CNI GC verb: this node's claims of the network that no valid attachment holds are
    /// released once seen leaked twice past the grace period.
    pub async fn gc(self: &Arc<Self>, r: api::GcRequest) -> Result<api::GcResponse, NodeError> {
        self.blocking("gc", move |node| {
            let valid: BTreeSet<Attachment> =
                r.valid_attachments.iter().map(wire::attachment).collect();
            let report = node.engine.gc(&r.network, &valid)?;
            node.metrics.releases.inc_by(report.released.len() as u64);
            for c in &report.released {
                tracing::info!(address = %c.address, pool = %c.pool, "released by GC");
            }
            for c in &report.kept {
                tracing::info!(address = %c.address, pool = %c.pool, pod = %format!("{}/{}", c.pod.namespace, c.pod.name), "kept by GC for the pod's next sandbox (its DEL was lost)");
            }
            if report.suspects > 0 {
                tracing::info!(network = %r.network, suspects = report.suspects, "claims seen leaked; released at a later GC past the grace period if still leaked");
            }
            Ok(api::GcResponse {
                released: report
                    .released
                    .iter()
                    .map(|c| c.address.to_string())
                    .collect(),
                suspects: report.suspects,
            })
        })
        .await
    }

    /// A DEL, from the plugin or from the journal, under the attachment's lock: in cluster mode
    /// the StatefulSet's replica count is read from the API when the caller did not say it, and
    /// the pod's Endpoint loses the interface whose addresses were released. Returns the claims
    /// touched (released ones still name their attachment; kept ones do not).
    fn release_serialized(
        &self,
        lock: &Serialized<'_>,
        mut request: DelRequest,
    ) -> Result<Vec<Claim>, AllocError> {
        if let Some(cluster) = &self.cluster
            && request.owner_replicas.is_none()
        {
            request.owner_replicas =
                cluster.owner_replicas(self.engine.store().as_ref(), &request.attachment);
        }
        let touched = self.engine.del_serialized(lock, &request)?;
        let released: Vec<&Claim> = touched.iter().filter(|c| c.attachment.is_some()).collect();
        self.metrics.releases.inc_by(released.len() as u64);
        if let (Some(cluster), Some(c)) = (&self.cluster, released.first()) {
            cluster.endpoints.released(
                &c.pod.namespace,
                &c.pod.name,
                &c.pod.uid,
                &request.attachment.interface,
            );
        }
        Ok(touched)
    }

    /// Writes a DEL the store could not take (or took in part) into the journal, and answers
    /// success; when even that fails, the DEL fails with try-again-later and the runtime
    /// retries it.
    fn remember_del(&self, r: api::DelRequest, why: &str) -> Result<(), NodeError> {
        let entry = api::DelRequest {
            issued_at: Some(r.issued_at.unwrap_or_else(unix_now)),
            // Served late on purpose.
            monotonic_deadline_ms: None,
            ..r
        };
        let unavailable =
            |why: String| NodeError::Alloc(AllocError::Store(StoreError::unavailable(why)));
        match self.journal.remember(&entry) {
            // The entry's file name is made of these: never a path out of the journal.
            None => Err(unavailable(why.to_string())),
            Some(Ok(path)) => {
                self.metrics.error("del-journaled");
                tracing::warn!(container = %format!("{}/{}", entry.attachment.container_id, entry.attachment.if_name), journal = %path.display(), "the store did not take the whole DEL ({why}); it is remembered and will be replayed");
                Ok(())
            }
            Some(Err(e)) => Err(unavailable(format!(
                "{why}; and the DEL cannot be remembered in {}: {e}",
                self.journal.dir().display()
            ))),
        }
    }

    /// Settles the DEL remembered for the attachment whose lock `lock` is, if there is one:
    /// the DEL is served as it would have been, then its entry removed. `Ok(None)` when nothing
    /// was remembered. An error leaves the entry for later, and the caller's ADD must not be
    /// served: the DEL comes first.
    pub fn settle(&self, lock: &Serialized<'_>) -> Result<Option<Vec<Claim>>, AllocError> {
        let held = lock.attachment();
        let unavailable = |e: crate::journal::EntryError| {
            AllocError::Store(StoreError::unavailable_caused(e.to_string(), e))
        };
        let Some(del) = self.journal.entry(held).map_err(unavailable)? else {
            return Ok(None);
        };
        let touched = self.release_serialized(lock, del)?;
        // Until the entry is gone the DEL would be served again, and a later ADD's claims with it.
        self.journal.forget(held).map_err(unavailable)?;
        let released = touched.iter().filter(|c| c.attachment.is_some()).count();
        tracing::info!(container = %held, released, kept = touched.len() - released, "replayed a DEL the plugin or the agent remembered while it could not be served");
        Ok(Some(touched))
    }

    /// Settles every entry of the journal; returns how many were. An entry the engine cannot
    /// take now (the store unavailable) stays for the next tick, or for the ADD of its
    /// attachment. Blocking.
    pub fn replay_journal(&self) -> usize {
        let mut replayed = 0;
        for attachment in self.journal.pending() {
            // The entry is read again under the lock: an ADD of the attachment may have settled
            // it meanwhile.
            let lock = self.engine.serialize(&attachment);
            match self.settle(&lock) {
                Ok(Some(_)) => replayed += 1,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(container = %attachment, "cannot replay the DEL yet, retrying: {e}")
                }
            }
        }
        replayed
    }

    /// Releases quarantined addresses whose quarantine has passed, and keeps the
    /// `allot_quarantined_addresses` gauge true (also for other agents' quarantines on a
    /// shared store). Blocking.
    pub fn expire_quarantined(&self) {
        match self
            .engine
            .expire_quarantined(self.underlay.quarantine_seconds)
        {
            Ok((released, kept)) => {
                self.metrics.releases.inc_by(released.len() as u64);
                self.metrics.quarantined.set(kept.len() as i64);
                for c in &released {
                    tracing::info!(
                        address = %c.address,
                        pool = %c.pool,
                        mac = c.pod.conflict_mac().unwrap_or(""),
                        "released a quarantined address: its quarantine has expired"
                    );
                }
            }
            Err(e) => tracing::warn!("releasing expired quarantines: {e}"),
        }
    }

    /// Releases the addresses kept for StatefulSet pods that did not come back within the keep
    /// time. Blocking.
    pub fn expire_kept(&self) {
        match self.engine.expire_kept() {
            Ok(released) => {
                self.metrics.releases.inc_by(released.len() as u64);
                for c in &released {
                    tracing::info!(address = %c.address, pod = %format!("{}/{}", c.pod.namespace, c.pod.name), "released a kept StatefulSet address: the pod did not come back");
                }
            }
            Err(e) => tracing::warn!("releasing expired StatefulSet addresses: {e}"),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
