//! A bounded ring of the decisions a registry made, newest last, so that an author can replay
//! real traffic against a new policy before shipping it (`allotctl policy record`). What is kept
//! is everything the policy saw: the inventory (shared by reference with the serving one, so a
//! generation costs memory once), the request with the pod's labels and annotations, the
//! namespace's and the node's, and the outcome.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use allot_core::PolicyError;
use allot_core::policy::{Decision, Inventory, Request};

/// One decision as the agent made it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Counts every decision recorded since the agent started (gaps mean the ring overflowed).
    pub seq: u64,
    pub at: SystemTime,
    /// The policy whose decision this is (the embedded default when it stood in for a faulting
    /// one), and its sha256.
    pub policy: String,
    pub sha256: String,
    /// The cluster's policy faulted with this error and the default decided instead.
    pub fallback_from: Option<PolicyError>,
    pub inventory: Arc<Inventory>,
    pub request: Request,
    pub result: Result<Decision, PolicyError>,
}

/// The ring. A capacity of 0 records nothing.
#[derive(Debug)]
pub struct DecisionLog {
    capacity: usize,
    state: Mutex<(u64, VecDeque<Recorded>)>,
}

impl DecisionLog {
    pub fn new(capacity: usize) -> Self {
        DecisionLog {
            capacity,
            state: Mutex::new((0, VecDeque::with_capacity(capacity.min(1024)))),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn push(&self, make: impl FnOnce(u64) -> Recorded) {
        if self.capacity == 0 {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let seq = state.0;
        state.0 += 1;
        if state.1.len() == self.capacity {
            state.1.pop_front();
        }
        let recorded = make(seq);
        state.1.push_back(recorded);
    }

    /// The decisions kept, oldest first.
    pub fn snapshot(&self) -> Vec<Recorded> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.1.iter().cloned().collect()
    }
}
