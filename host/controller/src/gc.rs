//! Garbage collection of leaked addresses.
//!
//! Every claim is judged by core's decision table ([`allot_core::gc::decide`]) against the
//! controller's watch-fed index of pods, nodes and StatefulSets. A leak is released only when
//! all of these hold:
//! 1. it was seen leaked at two looks, the first at least the grace period (`--gc-grace`)
//!    before, and the claim is unchanged since ([`Suspects`]);
//! 2. its own release time has come (deletionTimestamp + grace + additional delay, …);
//! 3. a fresh read of the pod (and of its StatefulSet) from the API, just before the release,
//!    still makes it a leak: the index may lag behind the cluster;
//! 4. this replica still leads, checked right before each write;
//! 5. the store still holds the claim exactly as it was read (`Store::release_unchanged`: a
//!    claim re-attached or changed meanwhile is kept).
//!
//! Looks come from two sides: a full scan every `--gc-interval-seconds` (600 s, Spiderpool's
//! default), and pod events (a pod deleted, terminating, finished or replaced), which make the
//! collector look at that pod's claims at once and again when they may be due.
//!
//! After each full scan the leader also deletes the store's emptied storage (IPBlocks with no
//! claim whose last release is older than [`EMPTIED_AGE`]), each delete conditional on the block
//! being unchanged since it was seen empty.

mod recheck;
pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::gc::{GcConfig, LeakReason, NotBefore, Suspects, Verdict, decide};
use allot_core::store::{Claim, Clock, Store, StoreError};
use allot_index::{ClusterIndex, Shared};

use crate::lease::Leadership;
use crate::metrics::Metrics;

pub use recheck::{ApiReader, FreshReader};

/// Claims released per store call: each may be a write to a block of its own, and on a real
/// API server (etcd, the IPBlock schema's validation) 1,000 of them did not fit in the store's
/// 10 s call budget even 16 at a time; 100 do in about a second.
pub const RELEASE_BATCH: usize = 100;

/// An emptied block is deleted once its last release is this old (seconds): far past any
/// cool-down an agent uses (30 s by default), so that a restarting agent still reads every
/// address that is cooling down.
pub const EMPTIED_AGE: u64 = 3600;
/// Emptied blocks deleted per store call (the leader checks it still leads between calls).
const EMPTIED_BATCH: usize = 100;

/// How the collector runs.
#[derive(Clone, Debug)]
pub struct GcSettings {
    pub table: GcConfig,
    /// A leak is released at its second sighting at least this many seconds after the first.
    pub grace: u64,
    /// Time between full scans.
    pub interval: Duration,
    /// Delete allot Endpoints that hold nothing and whose pod is gone.
    pub clean_outdated_endpoints: bool,
}

impl Default for GcSettings {
    fn default() -> Self {
        GcSettings {
            table: GcConfig::default(),
            grace: 60,
            interval: Duration::from_secs(600),
            clean_outdated_endpoints: false,
        }
    }
}

/// One leak, as a look found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak {
    pub claim: Claim,
    pub reason: LeakReason,
    pub not_before: NotBefore,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    /// Claims looked at.
    pub claims: usize,
    /// Claims the table calls leaked (due or not yet).
    pub leaked: usize,
    pub released: Vec<(Claim, LeakReason)>,
    /// Due leaks the fresh read showed in use.
    pub kept_on_recheck: usize,
    /// Emptied IPBlocks deleted after the scan.
    pub emptied_deleted: usize,
    /// The pass stopped because this replica no longer leads.
    pub lost_leadership: bool,
}

/// The garbage collector of one controller replica.
pub struct Collector {
    store: Arc<dyn Store>,
    index: Arc<Shared<ClusterIndex>>,
    reader: Arc<dyn FreshReader>,
    settings: GcSettings,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    clock: Clock,
    suspects: Suspects,
    /// Pods to look at again, by the unix time they may be due.
    relooks: BTreeMap<u64, BTreeSet<(String, String)>>,
    /// Outdated Endpoints seen at the last scan, deleted when seen again.
    outdated_endpoints: BTreeSet<(String, String, String)>,
}

impl Collector {
    pub fn new(
        store: Arc<dyn Store>,
        index: Arc<Shared<ClusterIndex>>,
        reader: Arc<dyn FreshReader>,
        settings: GcSettings,
        leadership: Leadership,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Collector {
        Collector {
            store,
            index,
            reader,
            settings,
            leadership,
            metrics,
            clock,
            suspects: Suspects::new(),
            relooks: BTreeMap::new(),
            outdated_endpoints: BTreeSet::new(),
        }
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    /// What the table says of each of `claims` against the index: the leaks, due or not.
    pub fn leaks(&self, claims: &[Claim]) -> Vec<Leak> {
        let index = self.index.read();
        claims
            .iter()
            .filter_map(|c| {
                let pod = index.pod_state(&c.pod.namespace, &c.pod.name);
                match decide(c, pod.as_ref(), index.owner_state(c), &self.settings.table) {
                    Verdict::Leak { reason, not_before } => Some(Leak {
                        claim: c.clone(),
                        reason,
                        not_before,
                    }),
                    Verdict::Keep(_) => None,
                }
            })
            .collect()
    }

    /// One full scan: every claim, then the due leaks re-checked and released.
    pub async fn scan(&mut self) -> Result<Pass, StoreError> {
        let started = Instant::now();
        let store = self.store.clone();
        let claims = blocking(move || store.all()).await?;
        let leaks = self.leaks(&claims);
        let now = self.now();
        let reasons: BTreeMap<_, _> = leaks.iter().map(|l| (l.claim.address, l.reason)).collect();
        let due = self.suspects.look(
            |_| true,
            leaks.into_iter().map(|l| (l.claim, l.not_before)),
            now,
            self.settings.grace,
        );
        let mut pass = Pass {
            claims: claims.len(),
            leaked: reasons.len(),
            ..Pass::default()
        };
        self.release(due, &mut pass).await?;
        if self.settings.clean_outdated_endpoints {
            self.clean_endpoints(&claims).await;
        }
        pass.emptied_deleted = self.delete_emptied(now).await;
        self.metrics.gc_scans.inc();
        self.metrics
            .gc_scan_seconds
            .observe(started.elapsed().as_secs_f64());
        self.metrics.gc_suspects.set(self.suspects.len() as i64);
        tracing::info!(
            claims = pass.claims,
            leaked = pass.leaked,
            released = pass.released.len(),
            kept_on_recheck = pass.kept_on_recheck,
            emptied_deleted = pass.emptied_deleted,
            suspects = self.suspects.len(),
            seconds = started.elapsed().as_secs_f64(),
            "GC scan"
        );
        Ok(pass)
    }

    /// Looks at the claims of the given pods only (after their events), and schedules another
    /// look for when their leaks may be due.
    pub async fn look_at(&mut self, pods: BTreeSet<(String, String)>) -> Result<Pass, StoreError> {
        let mut pass = Pass::default();
        for (namespace, name) in pods {
            let store = self.store.clone();
            let (ns, n) = (namespace.clone(), name.clone());
            let claims = blocking(move || store.claims_of_pod(&ns, &n)).await?;
            pass.claims += claims.len();
            let leaks = self.leaks(&claims);
            pass.leaked += leaks.len();
            let now = self.now();
            let grace = self.settings.grace;
            if let Some(when) = leaks
                .iter()
                .map(|l| match l.not_before {
                    NotBefore::At(t) => t.max(now + grace),
                    NotBefore::AfterFirstSighting(d) => now + d.max(grace),
                })
                .max()
            {
                self.relooks
                    .entry(when)
                    .or_default()
                    .insert((namespace.clone(), name.clone()));
            }
            let due = self.suspects.look(
                |c| c.pod.namespace == namespace && c.pod.name == name,
                leaks.into_iter().map(|l| (l.claim, l.not_before)),
                now,
                grace,
            );
            self.release(due, &mut pass).await?;
            if pass.lost_leadership {
                break;
            }
        }
        self.metrics.gc_suspects.set(self.suspects.len() as i64);
        Ok(pass)
    }

    /// The pods whose second look is due by `now`.
    fn due_relooks(&mut self, now: u64) -> BTreeSet<(String, String)> {
        let later = self.relooks.split_off(&(now + 1));
        std::mem::replace(&mut self.relooks, later)
            .into_values()
            .flatten()
            .collect()
    }

    /// Re-checks `due` against fresh reads and releases what is still leaked, batch by batch;
    /// each batch only while this replica leads, checked before its reads and again right
    /// before its write.
    async fn release(&mut self, due: Vec<Claim>, pass: &mut Pass) -> Result<(), StoreError> {
        let mut released_now = Vec::new();
        let mut result = Ok(());
        for batch in due.chunks(RELEASE_BATCH) {
            if !self.still_leading(pass) {
                break;
            }
            let confirmed = recheck::confirm(
                self.reader.as_ref(),
                &self.index,
                &self.settings.table,
                batch.to_vec(),
                self.now(),
            )
            .await;
            pass.kept_on_recheck += confirmed.kept.len();
            self.metrics
                .gc_kept_on_recheck
                .inc_by(confirmed.kept.len() as u64);
            for kept in &confirmed.kept {
                self.suspects.forget(kept);
            }
            if confirmed.leaks.is_empty() {
                continue;
            }
            if !self.still_leading(pass) {
                break;
            }
            let claims: Vec<Claim> = confirmed.leaks.iter().map(|l| l.claim.clone()).collect();
            let store = self.store.clone();
            // A release done in part (claims in several IPBlocks) is recorded for what it did.
            let (released, failed) = match blocking(move || store.release_unchanged(&claims)).await
            {
                Ok(r) => (r, None),
                Err(e) => (e.done().to_vec(), Some(e)),
            };
            for claim in released {
                self.suspects.forget(&claim);
                let reason = confirmed
                    .leaks
                    .iter()
                    .find(|l| l.claim.address == claim.address)
                    .map(|l| l.reason)
                    .unwrap_or(LeakReason::PodDeleted);
                self.metrics.released(reason);
                tracing::info!(
                    address = %claim.address,
                    pool = %claim.pool,
                    pod = %format!("{}/{}", claim.pod.namespace, claim.pod.name),
                    reason = reason.as_str(),
                    "released a leaked address: {}",
                    reason.describe()
                );
                released_now.push((claim, reason));
            }
            if let Some(e) = failed {
                result = Err(e);
                break;
            }
        }
        self.reader.record_releases(&released_now).await;
        pass.released.extend(released_now);
        result
    }

    fn still_leading(&self, pass: &mut Pass) -> bool {
        if self.leadership.is_leading() {
            return true;
        }
        if !pass.lost_leadership {
            tracing::warn!("no longer the leader: GC stops releasing");
        }
        pass.lost_leadership = true;
        false
    }

    /// Deletes allot Endpoints that hold nothing and whose pod is gone, when seen so at two
    /// scans in a row.
    async fn clean_endpoints(&mut self, claims: &[Claim]) {
        let held: BTreeSet<(&str, &str)> = claims
            .iter()
            .map(|c| (c.pod.namespace.as_str(), c.pod.name.as_str()))
            .collect();
        let outdated: BTreeSet<(String, String, String)> = {
            let index = self.index.read();
            index
                .endpoints()
                .filter(|(ns, name, uid)| {
                    let live = index.pod(ns, name).map(|p| p.uid.as_str());
                    allot_core::gc::endpoint_outdated(uid, live, held.contains(&(*ns, *name)))
                })
                .map(|(ns, name, uid)| (ns.to_string(), name.to_string(), uid.to_string()))
                .collect()
        };
        let seen_twice: Vec<_> = outdated
            .intersection(&self.outdated_endpoints)
            .cloned()
            .collect();
        self.outdated_endpoints = outdated;
        for (ns, name, uid) in seen_twice {
            if !self.leadership.is_leading() {
                return;
            }
            if self.reader.delete_outdated_endpoint(&ns, &name, &uid).await {
                self.metrics.endpoints_deleted.inc();
                self.outdated_endpoints.remove(&(ns, name, uid));
            }
        }
    }

    /// Deletes the store's emptied storage in batches while this replica leads; a failure is
    /// logged and left for the next scan (an empty block costs an object, never an address).
    async fn delete_emptied(&self, now: u64) -> usize {
        let cooled_before = now.saturating_sub(EMPTIED_AGE);
        let mut deleted = 0;
        while self.leadership.is_leading() {
            let store = self.store.clone();
            match blocking(move || store.remove_emptied(cooled_before, EMPTIED_BATCH)).await {
                Ok(n) => {
                    deleted += n;
                    self.metrics.emptied_deleted.inc_by(n as u64);
                    if n < EMPTIED_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!("deleting emptied IPBlocks stopped, the next scan goes on: {e}");
                    break;
                }
            }
        }
        deleted
    }

    /// Runs until `shutdown`: a full scan at once and every interval, the pods of each event
    /// batch, and the second looks they scheduled, all only while this replica leads and the
    /// index is listed.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut changes = self.index.changes();
        let mut leading = self.leadership.subscribe();
        let mut next_scan = tokio::time::Instant::now();
        loop {
            let next_relook = self.relooks.keys().next().map(|t| {
                let wait = t.saturating_sub(self.now());
                tokio::time::Instant::now() + Duration::from_secs(wait)
            });
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep_until(next_scan) => {
                    if self.ready() {
                        if let Err(e) = self.scan().await {
                            self.failed(&e);
                        }
                        next_scan = tokio::time::Instant::now() + self.settings.interval;
                    } else {
                        // Not leading, or the index is not listed yet: try again shortly.
                        next_scan = tokio::time::Instant::now() + Duration::from_secs(1);
                    }
                }
                _ = changes.changed() => {
                    if !self.index.read().has_pending() {
                        continue;
                    }
                    let pods = self.index.update(ClusterIndex::take_pending);
                    if self.ready()
                        && let Err(e) = self.look_at(pods).await
                    {
                        self.failed(&e);
                    }
                }
                _ = sleep_until_some(next_relook) => {
                    let pods = self.due_relooks(self.now());
                    if self.ready()
                        && let Err(e) = self.look_at(pods).await
                    {
                        self.failed(&e);
                    }
                }
                _ = leading.changed() => {
                    let now_leading = *leading.borrow_and_update();
                    self.metrics.leader.set(i64::from(now_leading));
                    if now_leading {
                        // A new leader starts from a full scan; sightings of an earlier term
                        // are not trusted (the cluster moved on meanwhile).
                        self.suspects = Suspects::new();
                        self.relooks.clear();
                        next_scan = tokio::time::Instant::now();
                    }
                }
            }
        }
    }

    fn ready(&self) -> bool {
        self.leadership.is_leading() && self.index.read().ready_for_gc()
    }

    fn failed(&self, e: &StoreError) {
        self.metrics.gc_errors.inc();
        tracing::warn!("GC pass stopped, what was not released stays suspect: {e}");
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs a synchronous store call off the async workers (the stores block their caller).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::backend_caused(format!("store call panicked: {e}"), e))?
}
