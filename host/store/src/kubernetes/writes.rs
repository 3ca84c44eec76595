//! Writes: each a compare-and-swap on one block (through its writer, [`super::combine`]),
//! recomputed from a fresh read when it loses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use allot_core::block::{BlockScope, REGION_LABEL, block_name, block_of, region_of};
use allot_core::store::{Attachment, Claim, PodRef, Reattach, StoreError, unchanged};

use super::compact::Block;
use super::{Backend, LIST_PAGE, attempt, request};

/// After losing write `lost` (0-based) of a block to other writers, waits a random moment of up
/// to 2 ms per write lost so far (at most 32 ms), so that writers racing for one block spread
/// out instead of reading and losing again in lockstep: without it, one of 16 threads claiming
/// distinct addresses of one block lost 16 writes in a row on a busy real API server. The same
/// idea as client-go's `retry.RetryOnConflict` (a jittered backoff between attempts).
pub(super) async fn pause_after_lost_write(lost: usize) {
    use std::hash::{BuildHasher, Hasher};
    // A random number without a dependency: every RandomState is seeded afresh.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let most_micros = 2_000 * (lost.min(15) as u64 + 1);
    tokio::time::sleep(std::time::Duration::from_micros(random % most_micros)).await;
}

/// Blocks one call of [`Backend::label_regions`] labels at most, well inside a call's budget.
pub(super) const LABEL_BATCH: u32 = 100;

/// Blocks one call writes at once (a release of many claims in many blocks).
const BLOCK_WRITERS: usize = 16;

/// What an edit of a block decided.
pub(super) enum Edit<T> {
    /// Write the edited block, then return this.
    Write(T),
    /// Nothing to write: return this.
    Keep(T),
}

/// The addresses of a call, by the block that holds them, in block-name order.
fn by_block<T>(items: Vec<T>, address: impl Fn(&T) -> IpAddr) -> BTreeMap<String, Vec<T>> {
    let mut out: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for item in items {
        out.entry(block_name(&block_of(address(&item))))
            .or_default()
            .push(item);
    }
    out
}

impl Backend {
    pub(super) fn now(&self) -> u64 {
        (self.clock)()
    }

    pub(super) fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Lists every block into the mirror; returns the list's resourceVersion to watch from.
    pub(super) async fn relist(&self) -> Result<String, StoreError> {
        // In pages, as the API server prefers for large lists: each page is turned into the
        // mirror's blocks and dropped before the next is read, and all pages are one snapshot
        // (the first page's resourceVersion). An expired continue token fails the relist,
        // which the follower retries from the start.
        let selector = self.effective_selector().await?;
        let mut params = kube::api::ListParams::default().limit(LIST_PAGE);
        if let Some(selector) = &selector {
            params = params.labels(selector);
        }
        let mut listing = self.mirror.begin_list();
        let mut rv = None;
        loop {
            self.count();
            let page = request("listing IPBlocks", self.api.list(&params)).await?;
            rv.get_or_insert_with(|| page.metadata.resource_version.clone().unwrap_or_default());
            listing.page(page.items.iter().map(Block::from_object), self.now());
            match page.metadata.continue_.filter(|t| !t.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        let rv = rv.unwrap_or_default();
        listing.finish(&rv, self.now());
        *self.selector.lock().unwrap_or_else(|p| p.into_inner()) = selector;
        Ok(rv)
    }

    /// The label selector of the scope wanted now, or `None` (every block) while blocks written
    /// before blocks carried their region remain: no region selects those until a write, or the
    /// controller at its start ([`super::KubeStore::label_regions`]), labels them.
    async fn effective_selector(&self) -> Result<Option<String>, StoreError> {
        let Some(selector) = self.scope.borrow().selector() else {
            return Ok(None);
        };
        let unlabelled = kube::api::ListParams::default()
            .labels(&format!("!{REGION_LABEL}"))
            .limit(1);
        self.count();
        let found = request("listing IPBlocks", self.api.list_metadata(&unlabelled)).await?;
        if found.items.is_empty() {
            Ok(Some(selector))
        } else {
            tracing::info!(
                "some IPBlocks carry no {REGION_LABEL} label yet (written by an older allot): \
                 following every block until the controller has labelled them"
            );
            Ok(None)
        }
    }

    /// Whether the store follows every block only because some carried no region.
    pub(super) fn falling_back(&self) -> bool {
        self.selector().is_none() && *self.scope.borrow() != BlockScope::All
    }

    /// The selector the watch uses: the last list's.
    pub(super) fn selector(&self) -> Option<String> {
        self.selector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Labels up to [`LABEL_BATCH`] blocks that carry no region yet (written before blocks
    /// did); returns how many. A merge patch of the label alone: the claims are untouched, and a writer computing
    /// from the older version loses its compare-and-swap and reads again, as after any write.
    pub(super) async fn label_regions(&self) -> Result<usize, StoreError> {
        let params = kube::api::ListParams::default()
            .labels(&format!("!{REGION_LABEL}"))
            .limit(LABEL_BATCH);
        self.count();
        let found = request("listing IPBlocks", self.api.list_metadata(&params)).await?;
        let mut labelled = 0;
        for object in found.items {
            let name = object.metadata.name.unwrap_or_default();
            let Some(cidr) = allot_core::block::block_named(&name) else {
                continue;
            };
            let patch = serde_json::json!({
                "metadata": {"labels": {REGION_LABEL: region_of(cidr.network())}}
            });
            self.count();
            let what = format!("labelling IPBlock {name}");
            match attempt(
                &what,
                self.api.patch_metadata(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                ),
            )
            .await?
            {
                Ok(_) => labelled += 1,
                // Deleted meanwhile (emptied and tidied): nothing to label.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(super::api_error(&what, e)),
            }
        }
        Ok(labelled)
    }

    /// Reads one block from the API into the mirror (`None`: it does not exist).
    pub(super) async fn fetch(&self, name: &str) -> Result<Option<Block>, StoreError> {
        self.count();
        let found = request(&format!("reading IPBlock {name}"), self.api.get_opt(name)).await?;
        match found {
            Some(object) => {
                let block = Block::from_object(&object);
                self.mirror
                    .apply(name, Some(block.clone()), None, self.now());
                Ok(Some(block))
            }
            None => Ok(None),
        }
    }

    pub(super) async fn claim_batch(
        &self,
        fresh: Vec<Claim>,
        reattach: Vec<Reattach>,
    ) -> Result<Vec<Claim>, StoreError> {
        // One address twice in a batch: as every backend answers it, nothing written.
        let mut seen = BTreeSet::new();
        if let Some(c) = fresh.iter().find(|c| !seen.insert(c.address)) {
            return Err(StoreError::Conflict(c.address));
        }
        if let Some(r) = reattach.iter().find(|r| !seen.insert(r.address)) {
            return Err(StoreError::Stale(r.address));
        }
        let mut fresh = by_block(fresh, |c| c.address);
        let mut reattach = by_block(reattach, |r| r.address);
        let names: BTreeSet<String> = fresh.keys().chain(reattach.keys()).cloned().collect();
        let mut written: Vec<(Vec<Claim>, Vec<Claim>)> = Vec::new();
        let mut reattached = Vec::new();
        for name in names {
            let fresh = fresh.remove(&name).unwrap_or_default();
            let reattach = reattach.remove(&name).unwrap_or_default();
            let address = fresh
                .first()
                .map(|c| c.address)
                .or_else(|| reattach.first().map(|r| r.address))
                .expect("a block of the batch has an address");
            let (fresh_edit, reattach_edit) = (fresh.clone(), reattach);
            // Counted until the block's writer is done with this edit, even if this call
            // gives up first (see `combine::Pending`).
            let on_its_way = self.pending.hold(
                fresh
                    .iter()
                    .filter_map(|c| c.attachment.clone())
                    .chain(reattach_edit.iter().map(|r| r.attachment.clone()))
                    .collect(),
            );
            let outcome = self
                .change_block(address, move |block| {
                    let _on_its_way = &on_its_way;
                    let (fresh, reattach) = (&fresh_edit, &reattach_edit);
                    if let Some(c) = fresh.iter().find(|c| block.claims.contains_key(&c.address)) {
                        return Err(StoreError::Conflict(c.address));
                    }
                    let mut before = Vec::new();
                    let mut after = Vec::new();
                    for r in reattach {
                        let ok = block
                            .claims
                            .get(&r.address)
                            .is_some_and(|c| c.attachment.is_none() && c.pod.same_holder(&r.pod));
                        if !ok {
                            return Err(StoreError::Stale(r.address));
                        }
                        let c = block.claims.get_mut(&r.address).expect("checked above");
                        before.push(c.clone());
                        c.attachment = Some(r.attachment.clone());
                        c.pod = r.pod.clone();
                        c.network = r.network.clone();
                        c.node = r.node.clone();
                        c.updated_at = r.now;
                        after.push(c.clone());
                    }
                    for c in fresh {
                        block.claims.insert(c.address, c.clone());
                        block.released.remove(&c.address);
                    }
                    Ok(Edit::Write((before, after)))
                })
                .await;
            match outcome {
                Ok((before, after)) => {
                    reattached.extend(after.iter().cloned());
                    let mut undo_fresh = fresh;
                    undo_fresh.extend(after);
                    written.push((undo_fresh, before));
                }
                Err(e) => {
                    if matches!(e, StoreError::Conflict(_)) {
                        self.lost_races.fetch_add(1, Ordering::Relaxed);
                    }
                    self.roll_back(written).await;
                    return Err(e);
                }
            }
        }
        Ok(reattached)
    }

    /// Undoes the blocks a failed batch wrote: removes its fresh claims and detaches its
    /// reattached ones again, each only while it is still as the batch wrote it.
    async fn roll_back(&self, written: Vec<(Vec<Claim>, Vec<Claim>)>) {
        for (ours, before) in written.into_iter().rev() {
            let Some(address) = ours.first().map(|c| c.address) else {
                continue;
            };
            let addresses: Vec<String> = ours.iter().map(|c| c.address.to_string()).collect();
            let undone = self
                .change_block(address, move |block| {
                    let mut changed = false;
                    for c in &ours {
                        let still = block
                            .claims
                            .get(&c.address)
                            .is_some_and(|s| unchanged(s, c));
                        if !still {
                            continue;
                        }
                        match before.iter().find(|b| b.address == c.address) {
                            Some(detached) => {
                                block.claims.insert(c.address, detached.clone());
                            }
                            None => {
                                block.claims.remove(&c.address);
                            }
                        }
                        changed = true;
                    }
                    Ok(if changed {
                        Edit::Write(())
                    } else {
                        Edit::Keep(())
                    })
                })
                .await;
            if let Err(e) = undone {
                tracing::warn!(
                    addresses = %addresses.join(","),
                    error = %e,
                    "could not roll back part of a failed batch; its attachment keeps these \
                     addresses until its DEL, its retried ADD or GC"
                );
            }
        }
    }

    /// Applies `edit` to every block holding one of `addresses`, up to [`BLOCK_WRITERS`] blocks
    /// at a time (each its own compare-and-swap, so the order they land in does not matter);
    /// collects the claims each returned, in block-name order. One after another, a GC batch of
    /// 1,000 leaks in as many blocks took longer than the call budget (10 s) on a real API server.
    ///
    /// Every block's write is waited for, also after another failed: a write given up on could
    /// still land (its block's writer holds it), and the caller must learn what did. When some
    /// blocks were written and others failed, the call fails with [`StoreError::Partial`]
    /// naming what was written (a dual-stack DEL whose IPv6 block took its write while the
    /// API server refused the IPv4 block's): reported as not done at all, the written half is
    /// free to others while the agent still journals it as held.
    async fn each_block(
        &self,
        addresses: Vec<IpAddr>,
        edit: impl Fn(&mut Block) -> Result<Edit<Vec<Claim>>, StoreError> + Send + Sync + 'static,
    ) -> Result<Vec<Claim>, StoreError> {
        use futures::StreamExt;
        let edit = std::sync::Arc::new(edit);
        let per_block: Vec<Result<Vec<Claim>, StoreError>> =
            futures::stream::iter(by_block(addresses, |a| *a))
                .map(|(_, addresses)| {
                    let edit = edit.clone();
                    self.change_block(addresses[0], move |block| edit(block))
                })
                .buffered(BLOCK_WRITERS)
                .collect()
                .await;
        let mut done = Vec::new();
        let mut failed = None;
        for outcome in per_block {
            match outcome {
                Ok(claims) => done.extend(claims),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => Ok(done),
            Some(e) if done.is_empty() => Err(e),
            Some(rest) => Err(StoreError::Partial {
                done,
                rest: Box::new(rest),
            }),
        }
    }

    pub(super) async fn release_attachment(
        &self,
        attachment: Attachment,
    ) -> Result<Vec<Claim>, StoreError> {
        let now = self.now();
        let held = self.mirror.addresses_of(&attachment);
        self.each_block(held, move |block| {
            let mine: Vec<IpAddr> = block
                .claims
                .values()
                .filter(|c| c.attachment.as_ref() == Some(&attachment))
                .map(|c| c.address)
                .collect();
            Ok(release_in(block, &mine, now))
        })
        .await
    }

    pub(super) async fn release(
        &self,
        address: IpAddr,
        attachment: Option<Attachment>,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        self.change_block(address, move |block| {
            let held = block
                .claims
                .get(&address)
                .is_some_and(|c| c.attachment == attachment);
            if !held {
                return Ok(Edit::Keep(false));
            }
            release_in(block, &[address], now);
            Ok(Edit::Write(true))
        })
        .await
    }

    pub(super) async fn release_unchanged(
        &self,
        claims: Vec<Claim>,
    ) -> Result<Vec<Claim>, StoreError> {
        let now = self.now();
        let addresses = claims.iter().map(|c| c.address).collect();
        self.each_block(addresses, move |block| {
            let still: Vec<IpAddr> = claims
                .iter()
                .filter(|read| {
                    block
                        .claims
                        .get(&read.address)
                        .is_some_and(|stored| unchanged(stored, read))
                })
                .map(|c| c.address)
                .collect();
            Ok(release_in(block, &still, now))
        })
        .await
    }

    pub(super) async fn detach(
        &self,
        attachment: Attachment,
        now: u64,
    ) -> Result<Vec<Claim>, StoreError> {
        let held = self.mirror.addresses_of(&attachment);
        self.each_block(held, move |block| {
            let mut out = Vec::new();
            for c in block
                .claims
                .values_mut()
                .filter(|c| c.attachment.as_ref() == Some(&attachment))
            {
                c.attachment = None;
                c.updated_at = now;
                out.push(c.clone());
            }
            Ok(if out.is_empty() {
                Edit::Keep(out)
            } else {
                Edit::Write(out)
            })
        })
        .await
    }
}

impl Backend {
    pub(super) async fn quarantine(
        &self,
        address: IpAddr,
        attachment: Attachment,
        holder: PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        self.change_block(address, move |block| {
            let Some(c) = block
                .claims
                .get_mut(&address)
                .filter(|c| c.attachment.as_ref() == Some(&attachment))
            else {
                return Err(StoreError::Stale(address));
            };
            c.attachment = None;
            c.pod = holder.clone();
            c.updated_at = now;
            Ok(Edit::Write(c.clone()))
        })
        .await
    }
}

/// Removes the claims at `addresses` from `block`, marking them released at `now`.
fn release_in(block: &mut Block, addresses: &[IpAddr], now: u64) -> Edit<Vec<Claim>> {
    let mut out = Vec::new();
    for a in addresses {
        if let Some(c) = block.claims.remove(a) {
            block.released.insert(*a, now);
            out.push(c);
        }
    }
    if out.is_empty() {
        Edit::Keep(out)
    } else {
        Edit::Write(out)
    }
}
