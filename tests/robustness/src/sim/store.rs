//! The claim store as one node's agent sees it: the real SQLite store, with faults injected
//! between store steps (every call is a step): the store unavailable for a moment, the agent
//! process killed before a step or right after a write committed, and another operation run in
//! between: another node's (agents sharing a store interleave at exactly these points), or a
//! GC of the same node's right before an ADD's claim (the agent serves verbs concurrently). All of it is
//! drawn from the run's one seeded generator, so a seed replays exactly.
//!
//! A [`Sabotage`] of the store makes it wrong on purpose, for the tests that prove the checker
//! catches a broken store.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use allot_core::store::{
    Attachment, Changes, Claim, PodRef, Reattach, Snapshot, Store, StoreError,
};

use super::Sabotage;
use super::rng::Rng;

/// How often each fault is injected, per thousand store steps.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub unavailable: u64,
    pub crash_before: u64,
    /// Of write steps only.
    pub crash_after_write: u64,
    /// Another operation run before the step: another node's, or a GC of the same node's
    /// before an ADD's claim.
    pub interleave: u64,
}

/// Faults injected so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub unavailable: u64,
    pub crash_before: u64,
    pub crash_after_write: u64,
    pub interleaved: u64,
    pub dropped_replies: u64,
    pub idle_kills: u64,
    /// Requests the API server was told to refuse (the Kubernetes scenario).
    pub api_errors: u64,
    pub sabotaged: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.unavailable
            + self.crash_before
            + self.crash_after_write
            + self.interleaved
            + self.dropped_replies
            + self.idle_kills
            + self.api_errors
    }

    pub fn add(&mut self, other: &FaultCounts) {
        self.unavailable += other.unavailable;
        self.crash_before += other.crash_before;
        self.crash_after_write += other.crash_after_write;
        self.interleaved += other.interleaved;
        self.dropped_replies += other.dropped_replies;
        self.idle_kills += other.idle_kills;
        self.api_errors += other.api_errors;
        self.sabotaged += other.sabotaged;
    }
}

/// The run's fault state, shared by every node's store.
pub struct Faults {
    state: Mutex<FaultState>,
}

pub struct FaultState {
    pub rng: Rng,
    /// Off once the run heals, to reach quiescence.
    pub enabled: bool,
    pub rates: Rates,
    /// Per node: its agent process is dead (killed mid-operation); every step fails until the
    /// simulator restarts it.
    pub dead: Vec<bool>,
    /// Per node: where its last crash happened, for the history.
    pub crash_note: Vec<Option<String>>,
    /// Per node: the faults injected into its current operation, for the history.
    pub notes: Vec<Vec<String>>,
    pub counts: FaultCounts,
    pub sabotage: Option<Sabotage>,
    /// One interleaved operation at a time: no nesting.
    pub interleaving: bool,
}

impl Faults {
    pub fn new(seed: u64, nodes: usize, rates: Rates, sabotage: Option<Sabotage>) -> Faults {
        Faults {
            state: Mutex::new(FaultState {
                rng: Rng::new(seed),
                enabled: true,
                rates,
                dead: vec![false; nodes],
                crash_note: vec![None; nodes],
                notes: vec![Vec::new(); nodes],
                counts: FaultCounts::default(),
                sabotage,
                interleaving: false,
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs another operation between two steps of `node`'s (the world's scheduler): the node
/// and the step about to be taken.
pub type Between = Arc<dyn Fn(usize, &str) + Send + Sync>;

/// Whether a step goes ahead, or the process dies right after it.
enum Step {
    Go,
    CrashAfter,
}

/// One node's view of the shared SQLite store.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    node: usize,
    faults: Arc<Faults>,
    between: Option<Between>,
}

impl FaultyStore {
    pub fn new(
        inner: Arc<dyn Store>,
        node: usize,
        faults: Arc<Faults>,
        between: Option<Between>,
    ) -> FaultyStore {
        FaultyStore {
            inner,
            node,
            faults,
            between,
        }
    }

    fn dead() -> StoreError {
        StoreError::unavailable("simulated: the agent process is dead")
    }

    /// Decides the fate of the next step, `what`.
    fn before(&self, what: &str, write: bool) -> Result<Step, StoreError> {
        let interleave = {
            let mut s = self.faults.lock();
            if s.dead[self.node] {
                return Err(Self::dead());
            }
            let roll = s.rng.below(1000);
            let go =
                self.between.is_some() && s.enabled && !s.interleaving && roll < s.rates.interleave;
            if go {
                s.interleaving = true;
            }
            go
        };
        if interleave {
            if let Some(between) = &self.between {
                between(self.node, what);
            }
            self.faults.lock().interleaving = false;
        }
        let mut s = self.faults.lock();
        if s.dead[self.node] {
            return Err(Self::dead());
        }
        if !s.enabled {
            return Ok(Step::Go);
        }
        let rates = s.rates;
        let roll = s.rng.below(1000);
        if roll < rates.unavailable {
            s.counts.unavailable += 1;
            s.notes[self.node].push(format!("store unavailable at {what}"));
            return Err(StoreError::unavailable(
                "simulated: the store is unavailable",
            ));
        }
        if roll < rates.unavailable + rates.crash_before {
            s.counts.crash_before += 1;
            s.dead[self.node] = true;
            s.crash_note[self.node] = Some(format!("killed before {what}"));
            return Err(Self::dead());
        }
        if write && roll < rates.unavailable + rates.crash_before + rates.crash_after_write {
            s.counts.crash_after_write += 1;
            return Ok(Step::CrashAfter);
        }
        Ok(Step::Go)
    }

    /// The step's result, unless the process died right after it.
    fn after<T>(
        &self,
        what: &str,
        step: Step,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match step {
            Step::Go => result,
            Step::CrashAfter => {
                let mut s = self.faults.lock();
                s.dead[self.node] = true;
                let done = if result.is_ok() {
                    "committed"
                } else {
                    "failed"
                };
                s.crash_note[self.node] = Some(format!("killed after {what} {done}"));
                Err(Self::dead())
            }
        }
    }

    fn read<T>(
        &self,
        what: &str,
        f: impl FnOnce(&dyn Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let step = self.before(what, false)?;
        self.after(what, step, f(self.inner.as_ref()))
    }

    fn write<T>(
        &self,
        what: &str,
        f: impl FnOnce(&dyn Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let step = self.before(what, true)?;
        self.after(what, step, f(self.inner.as_ref()))
    }

    fn sabotage(&self) -> Option<Sabotage> {
        self.faults.lock().sabotage
    }

    /// [`Sabotage::ReleaseAnother`]: one in three DELs that released something also releases
    /// the first claim of another attachment, and says nothing of it.
    fn release_another(&self, attachment: &Attachment) -> Result<(), StoreError> {
        {
            let mut s = self.faults.lock();
            if !s.rng.chance(33) {
                return Ok(());
            }
        }
        let other = self
            .inner
            .all()?
            .into_iter()
            .find(|c| c.attachment.as_ref().is_some_and(|a| a != attachment));
        if let Some(c) = other {
            self.inner.release(c.address, c.attachment.as_ref())?;
            self.faults.lock().counts.sabotaged += 1;
        }
        Ok(())
    }

    /// [`Sabotage::DoubleAllocate`]: a claim that conflicts takes the address from its holder.
    fn claim_over(&self, fresh: &[Claim], reattach: &[Reattach]) -> Result<Vec<Claim>, StoreError> {
        match self.inner.claim_batch(fresh, reattach) {
            Err(StoreError::Conflict(address)) => {
                if let Some(held) = self.inner.all()?.into_iter().find(|c| c.address == address) {
                    self.inner.release(address, held.attachment.as_ref())?;
                    self.faults.lock().counts.sabotaged += 1;
                }
                self.inner.claim_batch(fresh, reattach)
            }
            other => other,
        }
    }
}

impl Store for FaultyStore {
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        self.write("claim", |s| {
            if self.sabotage() == Some(Sabotage::DoubleAllocate) {
                self.claim_over(fresh, reattach)
            } else {
                s.claim_batch(fresh, reattach)
            }
        })
    }

    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.write("release", |s| {
            let released = s.release_attachment(attachment)?;
            if !released.is_empty() && self.sabotage() == Some(Sabotage::ReleaseAnother) {
                self.release_another(attachment)?;
            }
            Ok(released)
        })
    }

    fn release(
        &self,
        address: IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        self.write("release one", |s| s.release(address, attachment))
    }

    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        self.write("release unchanged", |s| s.release_unchanged(claims))
    }

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        self.write("detach", |s| s.detach(attachment, now))
    }

    fn quarantine(
        &self,
        address: IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        self.write("quarantine", |s| {
            s.quarantine(address, attachment, holder, now)
        })
    }

    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.read("claims of", |s| s.claims_of(attachment))
    }

    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        self.read("claims of pod", |s| s.claims_of_pod(namespace, name))
    }

    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        self.read("detached", |s| s.detached())
    }

    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        self.read("all", |s| s.all())
    }

    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        self.read("snapshot", |s| s.snapshot(released_since))
    }

    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        self.read("changes", |s| s.changes_since(revision))
    }

    fn remove_emptied(&self, cooled_before: u64, limit: usize) -> Result<usize, StoreError> {
        self.write("remove emptied", |s| s.remove_emptied(cooled_before, limit))
    }
}
