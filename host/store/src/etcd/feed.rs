//! The change feed of an etcd store: one watch on `PREFIX/claims/`, its events kept in memory.
//!
//! The watch starts at the revision the store opened at and resumes after the last revision it
//! saw when the connection drops (with jittered, capped backoff, so a restarted etcd is not hit
//! by every agent at once). When etcd has compacted that history, the feed starts over at the
//! current revision and every reader behind it is told to resync ([`Changes::Compacted`]).
//!
//! # Positions
//!
//! One etcd transaction changes several claims at one etcd revision, but the feed's contract
//! gives each change a revision of its own. The feed's revisions are therefore *positions*:
//! etcd's revision × 65,536 plus the change's place among that revision's changes, numbered so
//! that the last change of a revision ends it (`revision << 16 | 0xffff`, the position a snapshot
//! at that revision reports). A transaction holds at most 128 operations, far below 65,536.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use allot_core::store::{Change, ChangeKind, Changes, StoreError};
use etcd_client::{EventType, WatchOptions, WatchResponse};

use super::Backend;
use super::keys::{Keys, range_end};

/// Changes kept in memory; a reader further behind resyncs from a snapshot.
const LOG_LIMIT: usize = 100_000;

/// The position that ends etcd revision `revision`: a snapshot there, or its last change.
pub(super) fn end_of(revision: u64) -> u64 {
    (revision << 16) | 0xffff
}

/// How long a reader waits for the watch to catch up with the store's revision.
const CATCH_UP: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(super) struct Feed {
    state: Mutex<FeedState>,
    /// Wakes synchronous waiters ([`Feed::wait_past`]).
    advanced: Condvar,
    /// The watch's progress, for asynchronous waiters.
    progress: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct FeedState {
    /// The watch has started: `log` holds every change with a revision in `(from, progress]`.
    live: bool,
    from: u64,
    progress: u64,
    log: VecDeque<Change>,
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts (or starts over) at `revision`: what came before is only in snapshots.
    fn restart(&self, revision: u64) {
        let mut st = self.lock();
        st.live = true;
        st.from = revision;
        st.progress = revision;
        st.log.clear();
        drop(st);
        self.progress.send_replace(revision);
        self.advanced.notify_all();
    }

    fn record(&self, changes: Vec<Change>, progress: u64) {
        let mut st = self.lock();
        if progress <= st.progress && changes.is_empty() {
            return;
        }
        for c in changes {
            if c.revision > st.progress {
                st.log.push_back(c);
            }
        }
        st.progress = st.progress.max(progress);
        while st.log.len() > LOG_LIMIT {
            let dropped = st.log.pop_front().expect("non-empty").revision;
            // Every change of one revision goes, so that `from` stays exact.
            while st.log.front().is_some_and(|c| c.revision == dropped) {
                st.log.pop_front();
            }
            st.from = dropped;
        }
        let progress = st.progress;
        drop(st);
        self.progress.send_replace(progress);
        self.advanced.notify_all();
    }

    fn resume_from(&self) -> Option<u64> {
        let st = self.lock();
        st.live.then_some(st.progress)
    }

    /// Waits until the watch has started (its start revision is known), or `timeout` passes.
    pub(super) fn wait_live(&self, timeout: Duration) -> bool {
        let st = self.lock();
        let (st, _) = self
            .advanced
            .wait_timeout_while(st, timeout, |st| !st.live)
            .unwrap_or_else(|p| p.into_inner());
        st.live
    }

    /// Waits until the watch has seen past `revision` (a change, or confirmed progress).
    pub(super) fn wait_past(&self, revision: u64, timeout: Duration) -> bool {
        let st = self.lock();
        let (st, _) = self
            .advanced
            .wait_timeout_while(st, timeout, |st| st.progress <= revision)
            .unwrap_or_else(|p| p.into_inner());
        st.progress > revision
    }
}

impl Backend {
    /// etcd's current revision, and the revision of the latest write of claims at that time
    /// (0: none yet), in one read of one key ([`Keys::last_claim_change`]).
    async fn claim_revisions(&self) -> Result<(u64, u64), StoreError> {
        let resp = self
            .kv()
            .get(self.keys.last_claim_change(), None)
            .await
            .map_err(|e| self.err(e))?;
        let now = resp.header().map(|h| h.revision()).unwrap_or_default() as u64;
        let last = resp.kvs().first().map(|kv| kv.mod_revision()).unwrap_or(0) as u64;
        Ok((now, last))
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        Ok(self.claim_revisions().await?.0)
    }

    pub(super) async fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        let (now, last_change) = self.claim_revisions().await?;
        let now = end_of(now);
        if revision > now {
            // A revision from another history (another etcd, a restored backup): start over.
            return Ok(Changes::Compacted);
        }
        // Once the watch has delivered the latest write of claims, it knows every claim change
        // up to `now`: later revisions moved other keys (pools, other applications' keys).
        // Without that key (no claim written yet, or the key deleted by hand) nothing proves the
        // watch complete: answer with what it saw, and let the next claim write the key again.
        let needed = end_of(last_change);
        let mut progress = self.feed.progress.subscribe();
        // (The guard `wait_for` returns is dropped at once: `record` writes the same value.)
        let caught_up = last_change > 0
            && tokio::time::timeout(CATCH_UP, progress.wait_for(|p| *p >= needed))
                .await
                .is_ok_and(|seen| seen.is_ok());
        if caught_up {
            self.feed.record(Vec::new(), now);
        } else {
            tracing::debug!(
                needed,
                "the claims watch has not caught up; answering with what it saw"
            );
        }
        let st = self.feed.lock();
        if !st.live || revision < st.from {
            return Ok(Changes::Compacted);
        }
        if revision >= st.progress {
            // The reader's snapshot is newer than what the watch confirmed: nothing to add.
            return Ok(Changes::Since {
                changes: Vec::new(),
                revision,
            });
        }
        Ok(Changes::Since {
            changes: st
                .log
                .iter()
                .filter(|c| c.revision > revision && c.revision <= st.progress)
                .cloned()
                .collect(),
            revision: st.progress,
        })
    }

    /// What one watch response says about claims, at their positions (all events of one
    /// revision come in one response).
    fn changes_of(&self, resp: &WatchResponse) -> Vec<Change> {
        let at = (self.clock)();
        let mut changes: Vec<Change> = resp
            .events()
            .iter()
            .filter_map(|e| {
                let kv = e.kv()?;
                let address = Keys::address_of(kv.key())?;
                let kind = match e.event_type() {
                    EventType::Delete => ChangeKind::Released,
                    EventType::Put if kv.create_revision() == kv.mod_revision() => {
                        ChangeKind::Claimed
                    }
                    EventType::Put => ChangeKind::Updated,
                };
                Some(Change {
                    revision: kv.mod_revision() as u64,
                    address,
                    kind,
                    at,
                })
            })
            .collect();
        // Number each revision's changes so that its last one sits at `end_of(revision)`.
        let mut i = changes.len();
        while i > 0 {
            let revision = changes[i - 1].revision;
            let mut place = 0xffff;
            while i > 0 && changes[i - 1].revision == revision {
                changes[i - 1].revision = (revision << 16) | place;
                place -= 1;
                i -= 1;
            }
        }
        changes
    }
}

/// Capped exponential backoff with jitter, so that agents reconnecting after an etcd restart
/// spread out instead of arriving together.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    fn wait(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(Self::CAP);
        // Full jitter over the upper half: a random point in [base/2, base].
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0) as u64;
        let half = base.as_nanos() as u64 / 2;
        Duration::from_nanos(half + (nanos ^ (nanos >> 7)) % half.max(1))
    }
}

/// Follows the claims for as long as the store lives (the task ends with its runtime).
pub(super) async fn follow(inner: Arc<Backend>) {
    let mut backoff = Backoff::new();
    loop {
        if let Err(e) = watch_once(&inner, &mut backoff).await {
            tracing::warn!("watching etcd claims: {e}; reconnecting");
        }
        tokio::time::sleep(backoff.wait()).await;
    }
}

/// One watch, from where the feed stands, until it breaks.
async fn watch_once(inner: &Backend, backoff: &mut Backoff) -> Result<(), StoreError> {
    let start = match inner.feed.resume_from() {
        Some(progress) => progress,
        None => {
            let now = inner.current_revision().await?;
            inner.feed.restart(end_of(now));
            end_of(now)
        }
    };
    let prefix = inner.keys.claims();
    let options = WatchOptions::new()
        .with_range(range_end(&prefix))
        .with_start_revision((start >> 16) as i64 + 1);
    let stream = inner
        .client
        .watch_client()
        .watch(prefix, Some(options))
        .await
        .map_err(|e| inner.err(e))?;
    // The request half stays alive: dropping it would end the watch.
    let (_requests, mut responses) = stream.split();
    loop {
        let resp = responses.message().await.map_err(|e| inner.err(e))?;
        let Some(resp) = resp else {
            return Err(StoreError::unavailable("the watch stream ended"));
        };
        if resp.compact_revision() > 0 {
            // The history after our progress is gone: start over at the current revision;
            // readers behind it resync from a snapshot.
            let now = inner.current_revision().await?;
            tracing::info!(
                compacted = resp.compact_revision(),
                now,
                "etcd compacted the claims' history past the watch; readers will resync"
            );
            inner.feed.restart(end_of(now));
            return Ok(());
        }
        if resp.canceled() {
            return Err(StoreError::unavailable(format!(
                "etcd cancelled the watch: {}",
                resp.cancel_reason()
            )));
        }
        if resp.created() {
            backoff.reset();
            continue;
        }
        // Progress comes from events, and from `changes_since` reading the revision of the
        // latest claim write: not from etcd's progress notifications, which etcd before 3.4.26
        // may send ahead of events it has not delivered yet.
        let changes = inner.changes_of(&resp);
        if let Some(last) = changes.iter().map(|c| c.revision).max() {
            inner.feed.record(changes, last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(revision: u64) -> Change {
        Change {
            revision,
            address: "10.0.0.1".parse().unwrap(),
            kind: ChangeKind::Claimed,
            at: 0,
        }
    }

    #[test]
    fn the_log_keeps_whole_revisions_when_it_drops_old_ones() {
        let feed = Feed::default();
        feed.restart(10);
        let many: Vec<Change> = (0..LOG_LIMIT as u64 + 2)
            .map(|i| change(11 + i / 2))
            .collect();
        let last = many.last().unwrap().revision;
        feed.record(many, last);
        let st = feed.lock();
        assert!(st.log.len() <= LOG_LIMIT);
        assert!(st.log.front().unwrap().revision > st.from);
        assert_eq!(
            st.log.iter().filter(|c| c.revision == st.from + 1).count(),
            2,
            "the oldest revision kept is whole"
        );
    }

    #[test]
    fn waiters_wake_on_progress() {
        let feed = Arc::new(Feed::default());
        feed.restart(5);
        assert!(!feed.wait_past(5, Duration::from_millis(10)));
        let f = feed.clone();
        let t = std::thread::spawn(move || f.wait_past(5, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        feed.record(vec![change(6)], 6);
        assert!(t.join().unwrap());
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let mut b = Backoff::new();
        let waits: Vec<Duration> = (0..10).map(|_| b.wait()).collect();
        assert!(waits[0] >= Backoff::FIRST / 2 && waits[0] <= Backoff::FIRST);
        assert!(waits.iter().all(|w| *w <= Backoff::CAP));
        assert!(waits[9] >= Backoff::CAP / 2);
    }
}
