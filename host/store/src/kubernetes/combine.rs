//! One writer per block in this process: the edits of concurrent calls to the same block are
//! queued and written together, in one compare-and-swap.
//!
//! A node's concurrent ADDs mostly claim addresses of the same block (its pool's cursor walks
//! the block), and each write replaces the whole object. Written one call at a time, they lose
//! to each other: on a real API server, creating 1,000 pods on 10 nodes lost 960 writes for
//! 1,225 that landed, each loss a read and a write more, and every write is sent to every
//! watcher. Here the first call to find a block idle becomes its writer (a task of the store's
//! runtime, so a caller that gives up does not stop it); calls arriving meanwhile queue, and
//! the writer's next write carries all of them: the flat combining of Hendler et al., "Flat
//! Combining and the Synchronization-Parallelism Tradeoff" (SPAA 2010). Only writers on other
//! nodes still race, and those writes are compare-and-swaps as before.
//!
//! Each queued edit keeps its own answer: it runs on a copy of the block as the edits before it
//! in the same write left it, and an edit that refuses (an address claimed meanwhile) changes
//! nothing and gets its refusal while the others are written. As before, a refusal or a no-op
//! computed on the mirror's copy is checked against a fresh read before it is believed.

use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use allot_core::block::{block_name, block_of};
use allot_core::store::{Attachment, StoreError};
use ipnet::IpNet;
use kube::api::PostParams;
use tokio::sync::{Notify, oneshot};

use super::compact::Block;
use super::writes::{Edit, pause_after_lost_write};
use super::{Backend, MAX_ATTEMPTS, attempt};

type Answer = Result<Box<dyn Any + Send>, StoreError>;
type ErasedEdit =
    Box<dyn FnMut(&mut Block) -> Result<Edit<Box<dyn Any + Send>>, StoreError> + Send>;

/// One call's edit of a block, waiting for the block's writer.
struct Queued {
    edit: ErasedEdit,
    reply: oneshot::Sender<Answer>,
}

/// The edits waiting per block name. A name is present while its writer runs (with the edits
/// that arrived since it last took them), absent while the block is idle.
#[derive(Default)]
pub(super) struct Queues(Mutex<HashMap<String, Vec<Queued>>>);

impl Queues {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Queued>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Leaves block `name` idle when its writer ends: normally it has left it so itself (and
/// another writer may have started since, whose queue is not ours to touch); a writer that stops
/// early (its runtime shutting down, a panic in an edit) drops what still waits, whose
/// callers are told to try again, so that the next call to the block starts a writer of its own
/// instead of queueing behind one that is gone.
struct Writing<'a> {
    queues: &'a Queues,
    name: &'a str,
    idle: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if !self.idle {
            self.queues.lock().remove(self.name);
        }
    }
}

/// Claims of each attachment that a block's writer still holds: an ADD whose call gave up
/// (its budget ran out) may have left its write on its way, and the DEL that follows must see
/// what that write lands, or it would release nothing and the claim would outlive the
/// attachment. Reads by attachment wait until these are settled ([`Pending::settled`]).
#[derive(Default)]
pub(super) struct Pending {
    held: Mutex<HashMap<Attachment, usize>>,
    changed: Notify,
}

/// One call's claims on their way, counted in [`Pending`] until dropped (with its edit, once
/// the writer is done with it).
pub(super) struct PendingClaims {
    pending: Arc<Pending>,
    attachments: Vec<Attachment>,
}

impl Pending {
    pub(super) fn hold(self: &Arc<Self>, attachments: Vec<Attachment>) -> PendingClaims {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for a in &attachments {
            *held.entry(a.clone()).or_default() += 1;
        }
        PendingClaims {
            pending: self.clone(),
            attachments,
        }
    }

    /// Returns once no write carrying a claim of `attachment` is on its way.
    pub(super) async fn settled(&self, attachment: &Attachment) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let busy = self
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(attachment);
            if !busy {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for PendingClaims {
    fn drop(&mut self) {
        let mut held = self
            .pending
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for a in &self.attachments {
            if let Some(n) = held.get_mut(a) {
                *n -= 1;
                if *n == 0 {
                    held.remove(a);
                }
            }
        }
        drop(held);
        self.pending.changed.notify_waiters();
    }
}

/// What one edit decided in a combined write.
enum Decided {
    Write(Box<dyn Any + Send>),
    Keep(Box<dyn Any + Send>),
    Refused(StoreError),
}

impl Backend {
    /// Applies `edit` to the block holding `address`, together with the other edits of that
    /// block waiting at the time, by compare-and-swap (see the module's documentation).
    pub(super) async fn change_block<T: Send + 'static>(
        &self,
        address: IpAddr,
        mut edit: impl FnMut(&mut Block) -> Result<Edit<T>, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let cidr = block_of(address);
        let name = block_name(&cidr);
        let (reply, answer) = oneshot::channel();
        let erased: ErasedEdit = Box::new(move |block| {
            Ok(match edit(block)? {
                Edit::Write(t) => Edit::Write(Box::new(t) as Box<dyn Any + Send>),
                Edit::Keep(t) => Edit::Keep(Box::new(t) as Box<dyn Any + Send>),
            })
        });
        let lead = {
            let mut queues = self.queues.lock();
            match queues.get_mut(&name) {
                Some(waiting) => {
                    waiting.push(Queued {
                        edit: erased,
                        reply,
                    });
                    false
                }
                None => {
                    queues.insert(
                        name.clone(),
                        vec![Queued {
                            edit: erased,
                            reply,
                        }],
                    );
                    true
                }
            }
        };
        if lead {
            let me = self
                .this
                .upgrade()
                .expect("a store's backend outlives its calls");
            tokio::spawn(async move { me.write_queue(name, cidr).await });
        }
        let answer = answer.await.map_err(|_| {
            StoreError::unavailable(
                "the block's writer stopped before writing this change; try again",
            )
        })??;
        Ok(*answer
            .downcast::<T>()
            .expect("an edit's answer has the type its call gave"))
    }

    /// The writer of block `name`: writes what is queued, again and again, until nothing is.
    async fn write_queue(&self, name: String, cidr: IpNet) {
        let mut writing = Writing {
            queues: &self.queues,
            name: &name,
            idle: false,
        };
        loop {
            let batch: Vec<Queued> = {
                let mut queues = self.queues.lock();
                let waiting = queues.entry(name.clone()).or_default();
                if waiting.is_empty() {
                    queues.remove(&name);
                    writing.idle = true;
                    return;
                }
                std::mem::take(waiting)
            };
            let mut batch = batch;
            let answers: Vec<Answer> = match self.write_combined(&name, cidr, &mut batch).await {
                Ok(decided) => decided
                    .into_iter()
                    .map(|d| match d {
                        Decided::Write(t) | Decided::Keep(t) => Ok(t),
                        Decided::Refused(e) => Err(e),
                    })
                    .collect(),
                Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
            };
            let replies = batch.into_iter().map(|q| q.reply);
            for (reply, answer) in replies.zip(answers) {
                // A caller that gave up meanwhile: its answer has nobody to go to.
                let _ = reply.send(answer);
            }
        }
    }

    /// One compare-and-swap carrying every edit of `edits` that changes the block: computed on
    /// the mirror's copy first, and on a fresh read whenever the API says that copy is stale (a
    /// lost write) or before an edit's refusal or no-op is believed.
    async fn write_combined(
        &self,
        name: &str,
        cidr: IpNet,
        edits: &mut Vec<Queued>,
    ) -> Result<Vec<Decided>, StoreError> {
        let mut fresh: Option<Option<Block>> = None;
        for attempt_number in 0..MAX_ATTEMPTS {
            // A caller that gave up (its call budget ran out) no longer wants its edit written:
            // it has told its runtime the call failed, and the DEL that follows may already
            // have looked for what it would claim. Only a write already on its way can land.
            edits.retain(|q| !q.reply.is_closed());
            if edits.is_empty() {
                return Ok(Vec::new());
            }
            let base = match &fresh {
                Some(b) => b.clone(),
                None => self.mirror.block(name),
            };
            let mut next = base
                .clone()
                .unwrap_or_else(|| Block::empty(name.to_string(), cidr, self.node.clone()));
            let mut decided = Vec::with_capacity(edits.len());
            let mut doubtful = false;
            for queued in edits.iter_mut() {
                // On a copy: an edit that refuses leaves nothing of itself behind.
                let mut trial = next.clone();
                let d = match (queued.edit)(&mut trial) {
                    Ok(Edit::Write(t)) => {
                        next = trial;
                        Decided::Write(t)
                    }
                    Ok(Edit::Keep(t)) => {
                        doubtful = true;
                        Decided::Keep(t)
                    }
                    Err(e @ (StoreError::Conflict(_) | StoreError::Stale(_))) => {
                        doubtful = true;
                        Decided::Refused(e)
                    }
                    Err(e) => Decided::Refused(e),
                };
                decided.push(d);
            }
            // A refusal or a no-op computed on the mirror's copy may be stale: check it against
            // the API before answering with it.
            if doubtful && fresh.is_none() && base.is_some() {
                fresh = Some(self.fetch(name).await?);
                continue;
            }
            if !decided.iter().any(|d| matches!(d, Decided::Write(_))) {
                return Ok(decided);
            }
            let object = next.to_object();
            self.count();
            let pp = PostParams::default();
            let (what, written) = match &base {
                Some(_) => {
                    let what = format!("updating IPBlock {name}");
                    let written = attempt(&what, self.api.replace(name, &pp, &object)).await?;
                    (what, written)
                }
                None => {
                    let what = format!("creating IPBlock {name}");
                    let written = attempt(&what, self.api.create(&pp, &object)).await?;
                    (what, written)
                }
            };
            match written {
                Ok(stored) => {
                    let block = Block::from_object(&stored);
                    self.mirror.apply(name, Some(block), None, self.now());
                    return Ok(decided);
                }
                // 409: another writer changed (or created) the block first; 404: it was
                // deleted since it was read. Either way, read it again and recompute.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    self.conflicts.fetch_add(1, Ordering::Relaxed);
                    pause_after_lost_write(attempt_number).await;
                    fresh = Some(self.fetch(name).await?);
                }
                Err(e) => return Err(super::api_error(&what, e)),
            }
        }
        Err(StoreError::unavailable(format!(
            "IPBlock {name}: {MAX_ATTEMPTS} writes in a row lost to other writers; try again"
        )))
    }
}
