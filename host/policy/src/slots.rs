//! Who may hold the engine's instance slots.
//!
//! Every policy of a [`crate::PolicyEngine`] instantiates from one wasmtime pooling allocator of
//! `Limits::max_instances` slots, and a live instance (busy or warm) holds its slot. Left alone,
//! a custom policy under load (many concurrent calls that each loop to the deadline) takes every
//! slot and keeps them as warm instances, and when it then faults on a cluster configured to fall
//! back, the embedded default cannot instantiate either.
//!
//! So slots are counted here before wasmtime is asked. Custom policies together may hold at most
//! `max_instances - reserved`; the default may take any free slot, so `reserved` slots are always
//! its to take whatever custom policies do. One pool with a reserved share, rather than a
//! second pool for the default, keeps the memory bound where it was (`max_instances` memories,
//! not more), lets the default use the whole pool when no custom policy is busy (the common
//! case: most clusters run only the default), and needs one compiled copy of each policy.
//!
//! A caller that finds its share full waits for an instance to come back (a warm one is reused,
//! a discarded one frees its slot), up to the policy's deadline, instead of failing at once: a
//! burst of calls is served by the instances it has. Custom policies still share their part
//! among themselves; isolating clusters' custom policies from one another is not done here.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Which share of the slots a policy draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Share {
    /// The embedded default: any free slot, and the reserved ones are always free for it.
    Default,
    /// Every other policy: the shared custom part only.
    Custom,
}

/// The reserved part: a quarter of the pool, at least one slot. The default is trusted code that
/// finishes in microseconds, so a few instances serve many callers; a quarter is enough for it
/// and leaves custom policies most of the pool.
pub(crate) fn reserved_for_default(max_instances: u32) -> u32 {
    (max_instances / 4).max(1)
}

pub(crate) struct InstanceSlots {
    total: u32,
    custom_max: u32,
    counts: Mutex<Counts>,
    /// Signalled whenever a slot is freed or an instance returns to a warm list.
    released: Condvar,
}

#[derive(Default)]
pub(crate) struct Counts {
    live: u32,
    custom_live: u32,
}

impl InstanceSlots {
    pub(crate) fn new(max_instances: u32) -> Arc<Self> {
        let reserved = reserved_for_default(max_instances);
        Arc::new(InstanceSlots {
            total: max_instances,
            // With a pool of one slot there is nothing to split: both share it.
            custom_max: max_instances.saturating_sub(reserved).max(1),
            counts: Mutex::new(Counts::default()),
            released: Condvar::new(),
        })
    }

    /// How many instances a policy of this share may have alive at once.
    pub(crate) fn share_size(&self, share: Share) -> u32 {
        match share {
            Share::Default => self.total,
            Share::Custom => self.custom_max,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot if the share has one free. Called with the lock held, so that a caller that
    /// finds none can wait on [`Self::wait_until`] without missing a release.
    pub(crate) fn try_take(
        self: &Arc<Self>,
        counts: &mut MutexGuard<'_, Counts>,
        share: Share,
    ) -> Option<Slot> {
        if counts.live >= self.total {
            return None;
        }
        if share == Share::Custom {
            if counts.custom_live >= self.custom_max {
                return None;
            }
            counts.custom_live += 1;
        }
        counts.live += 1;
        Some(Slot {
            slots: self.clone(),
            share,
        })
    }

    /// Waits for a release or until `until`; None once `until` has passed.
    pub(crate) fn wait_until<'a>(
        &self,
        counts: MutexGuard<'a, Counts>,
        until: Instant,
    ) -> Option<MutexGuard<'a, Counts>> {
        let left = until.checked_duration_since(Instant::now())?;
        let (counts, _) = self
            .released
            .wait_timeout(counts, left)
            .unwrap_or_else(|p| p.into_inner());
        Some(counts)
    }

    /// Wakes the callers waiting for an instance (one went back to a warm list).
    pub(crate) fn notify_returned(&self) {
        let _counts = self.lock();
        self.released.notify_all();
    }
}

/// One slot of the pool, held by a live instance; freed when the instance is dropped (declare it
/// after the store, so that wasmtime's slot is free before this one is).
pub(crate) struct Slot {
    slots: Arc<InstanceSlots>,
    share: Share,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.slots.lock();
        counts.live -= 1;
        if self.share == Share::Custom {
            counts.custom_live -= 1;
        }
        self.slots.released.notify_all();
    }
}
