//! The node verbs as the agent serves them (`host/agent/src/node/add.rs` and `release.rs`),
//! over the engine: ADD settles its attachment's journaled DEL first, under the attachment's
//! lock; a DEL the store cannot take is journaled and answered; the journal is replayed at
//! start and at every tick. Each verb is recorded in the history with what its client saw.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use allot_core::policy::{CniDefaults, NamespaceInfo, NodeInfo, PodInfo};
use allot_core::store::{Attachment, Claim, StoreError};
use allot_engine::{AddRequest, AllocError, DelRequest, Serialized};

use super::{Life, NETWORK, Node, Sabotage, Sandbox, SimEngine, World, lock};
use crate::history::{Op, Outcome, StoredClaim, Verb};

/// How an operation on a node ended.
enum Served<T, E> {
    Done(Result<T, E>),
    /// The agent died under it: the client got no reply.
    Died,
}

/// Settles the DEL remembered in `journal` for the attachment `held` locks, as the agent's
/// `Node::settle`: served as it would have been, then forgotten; an error leaves it remembered.
fn settle(
    engine: &SimEngine,
    journal: &Journal,
    held: &Serialized<'_>,
) -> Result<Vec<Claim>, AllocError> {
    let Some(del) = lock(journal).get(held.attachment()).cloned() else {
        return Ok(Vec::new());
    };
    let touched = engine.del_serialized(held, &del)?;
    lock(journal).remove(held.attachment());
    Ok(touched)
}

/// A node's DEL journal: one entry per attachment, as the agent keeps one file per attachment.
type Journal = Mutex<std::collections::BTreeMap<Attachment, DelRequest>>;

/// What a failed engine call released or detached before it failed (a release across blocks
/// of the Kubernetes store, one of them refused: [`StoreError::Partial`]).
fn done_before(e: &AllocError) -> &[Claim] {
    match e {
        AllocError::Store(e) => e.done(),
        _ => &[],
    }
}

fn released(claims: &[Claim]) -> Vec<IpAddr> {
    claims
        .iter()
        .filter(|c| c.attachment.is_some())
        .map(|c| c.address)
        .collect()
}

impl World {
    /// Runs `f` on `node`'s engine; [`Served::Died`] when the agent died under it.
    fn serve<T, E>(
        &self,
        node: usize,
        f: impl FnOnce(&SimEngine, &Node) -> Result<T, E>,
    ) -> Served<T, E> {
        let Some(engine) = self.engine(node) else {
            return Served::Died;
        };
        let result = f(&engine, &self.nodes[node]);
        if self.is_dead(node) {
            Served::Died
        } else {
            Served::Done(result)
        }
    }

    /// The faults injected into `node`'s operation so far, and forgets them.
    pub(super) fn notes_of(&self, node: usize) -> Vec<String> {
        std::mem::take(&mut self.faults.lock().notes[node])
    }

    /// Whether the reply of a finished operation is lost on its way to the client.
    fn reply_dropped(&self) -> bool {
        let mut s = self.faults.lock();
        let dropped = s.enabled && s.rng.chance(3);
        if dropped {
            s.counts.dropped_replies += 1;
        }
        dropped
    }

    /// Ends `op`: its outcome, the notes of the faults it met, its completion time.
    fn finish<T, E: std::fmt::Display>(
        &self,
        mut op: Op,
        served: &Served<T, E>,
        mut notes: Vec<String>,
    ) -> Op {
        op.outcome = match served {
            Served::Died => {
                notes.push("agent killed under it".into());
                Outcome::Unknown
            }
            Served::Done(Err(e)) => Outcome::Err(e.to_string()),
            Served::Done(Ok(_)) if self.reply_dropped() => {
                notes.push("reply dropped".into());
                Outcome::Unknown
            }
            Served::Done(Ok(_)) => Outcome::Ok,
        };
        op.note = notes.join("; ");
        op.ret = self.tick();
        op
    }

    fn sandbox_op(&self, s: &Sandbox, verb: Verb) -> Op {
        let call = self.tick();
        let mut op = self.op(s.node, verb, call);
        op.sandbox = Some(s.id.clone());
        op.attachment = Some(s.attachment.to_string());
        op.pod = Some(s.pod.clone());
        op
    }

    fn add_request(&self, s: &Sandbox) -> AddRequest {
        let (namespace, name) = s.pod.split_once('/').unwrap_or(("sim", &s.pod));
        AddRequest {
            attachment: s.attachment.clone(),
            network: NETWORK.into(),
            pod: PodInfo {
                namespace: namespace.into(),
                name: name.into(),
                uid: s.id.clone(),
                ..Default::default()
            },
            namespace: NamespaceInfo {
                name: namespace.into(),
                ..Default::default()
            },
            node: NodeInfo {
                name: self.nodes[s.node].name.clone(),
                ..Default::default()
            },
            multus_name: String::new(),
            cni_defaults: CniDefaults {
                ipv4: vec!["v4".into()],
                ipv6: vec!["v6".into()],
            },
        }
    }

    /// CNI ADD of `s` (a new sandbox's, or a runtime's retry). When it does not succeed, the
    /// runtime tears the sandbox down: a DEL follows at once.
    pub(super) fn add(&self, s: Sandbox) -> anyhow::Result<()> {
        let mut op = self.sandbox_op(&s, Verb::Add);
        let request = self.add_request(&s);
        let mut settled = Vec::new();
        let served = self.serve(s.node, |engine, node| {
            let held = engine.serialize(&s.attachment);
            if self.faults.lock().sabotage != Some(Sabotage::AddBeforeJournal) {
                settled = settle(engine, &node.journal, &held).inspect_err(|e| {
                    settled = done_before(e).to_vec();
                })?;
            } else if lock(&node.journal).contains_key(&s.attachment) {
                self.faults.lock().counts.sabotaged += 1;
            }
            engine.add_serialized(&held, &request)
        });
        op.released = released(&settled);
        if let Served::Done(Ok(out)) = &served {
            op.addresses = out.allocations.iter().map(|a| a.address).collect();
        }
        let op = self.finish(op, &served, self.notes_of(s.node));
        let ok = op.outcome == Outcome::Ok;
        self.record(op);
        self.restart_if_dead(s.node)?;
        if ok {
            self.set_life(&s.id, Life::Live);
            Ok(())
        } else {
            self.set_life(&s.id, Life::Deleting);
            self.del(s)
        }
    }

    /// CNI DEL of `s`. A DEL the store cannot take now is journaled and answered; one whose
    /// agent died under it is journaled by the plugin (it remembers DELs while the agent is
    /// away) and answered; one that failed otherwise, or whose reply was lost, the runtime
    /// sends again later.
    pub(super) fn del(&self, s: Sandbox) -> anyhow::Result<()> {
        self.set_life(&s.id, Life::Deleting);
        let mut op = self.sandbox_op(&s, Verb::Del);
        let issued_at = self.seconds.load(Ordering::SeqCst);
        let remember = |journal: &Journal| {
            lock(journal).insert(
                s.attachment.clone(),
                DelRequest {
                    attachment: s.attachment.clone(),
                    owner_replicas: None,
                    issued_at: Some(issued_at),
                },
            );
        };
        let mut journaled = None;
        let served = self.serve(s.node, |engine, node| {
            let held = engine.serialize(&s.attachment);
            match engine.del_serialized(&held, &DelRequest::new(s.attachment.clone())) {
                // As the agent does: unavailable, or released in part (whatever refused the
                // rest), the DEL is journaled and answered.
                Err(AllocError::Store(e))
                    if (matches!(e, StoreError::Partial { .. })
                        || matches!(e, StoreError::Unavailable { .. }))
                        && !self.is_dead(s.node) =>
                {
                    remember(&node.journal);
                    journaled = Some(e.to_string());
                    Ok(e.done().to_vec())
                }
                Ok(touched) => {
                    lock(&node.journal).remove(&s.attachment);
                    Ok(touched)
                }
                Err(e) => Err(e),
            }
        });
        if let Served::Done(Ok(touched)) = &served {
            op.released = released(touched);
        }
        let mut notes = self.notes_of(s.node);
        if let Some(why) = journaled {
            notes.push(format!("journaled by the agent: {why}"));
        }
        let died = matches!(served, Served::Died);
        if died {
            remember(&self.nodes[s.node].journal);
            notes.push("journaled by the plugin".into());
        }
        let op = self.finish(op, &served, notes);
        // The runtime is done with the sandbox when it got a success, or when the plugin
        // answered for the agent that died.
        let done = op.outcome == Outcome::Ok || died;
        self.record(op);
        self.restart_if_dead(s.node)?;
        if done {
            self.set_life(&s.id, Life::Gone);
        }
        Ok(())
    }

    /// CNI CHECK of `s`.
    pub(super) fn check(&self, s: Sandbox) -> anyhow::Result<()> {
        let mut op = self.sandbox_op(&s, Verb::Check);
        let served = self.serve(s.node, |engine, _| engine.check(&s.attachment));
        if let Served::Done(Ok(out)) = &served {
            op.addresses = out.allocations.iter().map(|a| a.address).collect();
        }
        let op = self.finish(op, &served, self.notes_of(s.node));
        self.record(op);
        self.restart_if_dead(s.node)
    }

    /// CNI GC on `node`, with every attachment its runtime still has.
    pub(super) fn gc(&self, node: usize) -> anyhow::Result<()> {
        self.gc_once(node);
        self.restart_if_dead(node)
    }

    /// [`World::gc`], leaving a node that died under it dead.
    pub(super) fn gc_once(&self, node: usize) {
        let valid: BTreeSet<Attachment> = lock(&self.sandboxes)
            .iter()
            .filter(|s| s.node == node && matches!(s.life, Life::Adding | Life::Live))
            .map(|s| s.attachment.clone())
            .collect();
        let call = self.tick();
        let mut op = self.op(node, Verb::Gc, call);
        let served = self.serve(node, |engine, _| engine.gc(NETWORK, &valid));
        if let Served::Done(Ok(report)) = &served {
            op.released = released(&report.released);
        }
        let op = self.finish(op, &served, self.notes_of(node));
        self.record(op);
    }

    /// The agent's periodic work on `node`: follow the change feed, replay the journal.
    pub(super) fn sync(&self, node: usize) -> anyhow::Result<()> {
        let served = self.serve(node, |engine, _| engine.tick());
        self.notes_of(node);
        if matches!(served, Served::Died) {
            return self.restart_if_dead(node);
        }
        if self.replay(node) {
            Ok(())
        } else {
            self.restart_if_dead(node)
        }
    }

    /// Serves every DEL in `node`'s journal (at start and at every tick); false when the agent
    /// died doing it. Recorded when there was something to replay.
    pub(super) fn replay(&self, node: usize) -> bool {
        let pending: Vec<Attachment> = lock(&self.nodes[node].journal).keys().cloned().collect();
        if pending.is_empty() {
            return true;
        }
        let call = self.tick();
        let mut op = self.op(node, Verb::Replay, call);
        let mut touched = Vec::new();
        let mut failed = Vec::new();
        let served: Served<(), AllocError> = self.serve(node, |engine, n| {
            for attachment in &pending {
                let held = engine.serialize(attachment);
                match settle(engine, &n.journal, &held) {
                    Ok(claims) => touched.extend(claims),
                    Err(e) => {
                        touched.extend_from_slice(done_before(&e));
                        failed.push(format!("{attachment}: {e}"));
                    }
                }
            }
            Ok(())
        });
        op.released = released(&touched);
        let mut notes = self.notes_of(node);
        if !failed.is_empty() {
            notes.push(format!("left for later: {}", failed.join(", ")));
        }
        let op = self.finish(op, &served, notes);
        self.record(op);
        !matches!(served, Served::Died)
    }

    /// Heals every fault, starts every dead agent, serves every pending DEL and runs GC on
    /// every node past its grace period twice (a claim is reclaimed at its second sighting),
    /// then reads the store.
    pub(super) fn quiesce(&self) -> anyhow::Result<Vec<StoredClaim>> {
        self.faults.lock().enabled = false;
        if let super::Backend::Kube(server) = &self.backend {
            server.clear_faults();
        }
        for n in 0..self.nodes.len() {
            if self.is_dead(n) {
                self.crashed(n);
            }
            if self.engine(n).is_none() {
                self.start(n)?;
            }
        }
        for _ in 0..3 {
            for n in 0..self.nodes.len() {
                self.sync(n)?;
            }
            let deleting: Vec<Sandbox> = lock(&self.sandboxes)
                .iter()
                .filter(|s| s.life == Life::Deleting)
                .cloned()
                .collect();
            for s in deleting {
                self.del(s)?;
            }
        }
        for _ in 0..2 {
            self.seconds
                .fetch_add(self.config.gc_grace + 1, Ordering::SeqCst);
            for n in 0..self.nodes.len() {
                self.gc(n)?;
            }
        }
        for n in 0..self.nodes.len() {
            self.sync(n)?;
        }
        super::stored_claims(&self.backend, self.clock())
    }
}
