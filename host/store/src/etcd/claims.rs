//! The claim operations, as guarded etcd transactions.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use allot_core::store::{Claim, Reattach, Snapshot, StoreError, Taken, unchanged};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, KvClient, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use super::keys::{self, Keys, range_end};
use super::{Backend, RELEASE_CHUNK, etcd_error};

/// etcd's default `--max-txn-ops`: operations (and compares) one transaction may hold.
pub const MAX_TXN_OPS: usize = 128;

/// Fresh reads after a claim changed between our read and our guarded write.
const ATTEMPTS: usize = 16;

/// Keys per page when listing every claim.
const PAGE: i64 = 2000;

/// A claim as read, with the revision its write is guarded on.
#[derive(Clone, Debug)]
pub(super) struct Read {
    pub claim: Claim,
    pub mod_revision: i64,
}

fn gets(txn: &TxnResponse) -> Vec<Option<KeyValue>> {
    txn.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

fn sorted(mut claims: Vec<Claim>) -> Vec<Claim> {
    claims.sort_by_key(|c| c.address);
    claims
}

impl Backend {
    pub(super) fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    pub(super) fn err(&self, e: etcd_client::Error) -> StoreError {
        etcd_error(&self.endpoints, e)
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    fn decode(&self, kv: &KeyValue) -> Result<Read, StoreError> {
        let claim = keys::decode(kv.key(), kv.value()).map_err(|e| {
            StoreError::backend_caused(
                format!("{e}; fix or delete the key with etcdctl (see docs/stores.md)"),
                e,
            )
        })?;
        Ok(Read {
            claim,
            mod_revision: kv.mod_revision(),
        })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        self.kv().txn(txn).await.map_err(|e| self.err(e))
    }

    /// The claims of `addresses` (`None`: not claimed), read in transactions of gets.
    pub(super) async fn read_claims(
        &self,
        addresses: &[IpAddr],
    ) -> Result<Vec<Option<Read>>, StoreError> {
        let mut out = Vec::with_capacity(addresses.len());
        for chunk in addresses.chunks(MAX_TXN_OPS) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|a| TxnOp::get(self.keys.claim(*a), None))
                .collect();
            let resp = self.txn(Txn::new().and_then(ops)).await?;
            for kv in gets(&resp) {
                out.push(kv.map(|kv| self.decode(&kv)).transpose()?);
            }
        }
        Ok(out)
    }

    /// The addresses listed under an index prefix.
    async fn index(&self, prefix: &str) -> Result<Vec<IpAddr>, StoreError> {
        let resp = self
            .kv()
            .get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_range(range_end(prefix))
                        .with_keys_only(),
                ),
            )
            .await
            .map_err(|e| self.err(e))?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| Keys::address_of(kv.key()))
            .collect())
    }

    /// The claims an index lists, as read now.
    async fn index_reads(&self, prefix: &str) -> Result<Vec<Read>, StoreError> {
        let addresses = self.index(prefix).await?;
        self.read_existing(&addresses).await
    }

    pub(super) async fn claims_at_index(&self, prefix: &str) -> Result<Vec<Claim>, StoreError> {
        let reads = self.index_reads(prefix).await?;
        Ok(sorted(reads.into_iter().map(|r| r.claim).collect()))
    }

    /// The index keys of a claim as it stands.
    fn index_puts(&self, c: &Claim, ops: &mut Vec<TxnOp>) {
        match &c.attachment {
            Some(a) => ops.push(TxnOp::put(
                format!("{}{}", self.keys.by_attachment(a), c.address),
                "",
                None,
            )),
            None => ops.push(TxnOp::put(
                format!("{}{}", self.keys.detached(), c.address),
                "",
                None,
            )),
        }
    }

    fn index_deletes(&self, c: &Claim, ops: &mut Vec<TxnOp>) {
        match &c.attachment {
            Some(a) => ops.push(TxnOp::delete(
                format!("{}{}", self.keys.by_attachment(a), c.address),
                None,
            )),
            None => ops.push(TxnOp::delete(
                format!("{}{}", self.keys.detached(), c.address),
                None,
            )),
        }
    }

    /// Written by every transaction that writes claims (see [`keys`] for why).
    fn claims_changed(&self) -> TxnOp {
        TxnOp::put(self.keys.last_claim_change(), "", None)
    }

    fn pod_index(&self, c: &Claim) -> String {
        format!(
            "{}{}",
            self.keys.by_pod(&c.pod.namespace, &c.pod.name),
            c.address
        )
    }

    pub(super) async fn claim_batch(
        &self,
        fresh: Vec<Claim>,
        reattach: Vec<Reattach>,
    ) -> Result<Vec<Claim>, StoreError> {
        if fresh.is_empty() && reattach.is_empty() {
            return Ok(Vec::new());
        }
        let mut named = BTreeSet::new();
        if let Some(c) = fresh.iter().find(|c| !named.insert(c.address)) {
            return Err(StoreError::Conflict(c.address));
        }
        let twice = reattach.iter().find(|r| !named.insert(r.address));
        let pools: BTreeMap<&str, IpAddr> =
            fresh.iter().map(|c| (c.pool.as_str(), c.address)).collect();
        let ops = fresh.len() * 4 + reattach.len() * 5 + pools.len() + 1;
        if ops > MAX_TXN_OPS || fresh.len() + reattach.len() > MAX_TXN_OPS {
            return Err(StoreError::backend(format!(
                "a batch of {} addresses needs {ops} etcd operations, more than etcd's \
                 --max-txn-ops ({MAX_TXN_OPS}); allocate fewer addresses per pod",
                fresh.len() + reattach.len()
            )));
        }

        // The detached claims to take back, as they are now.
        let reads = self
            .read_claims(&reattach.iter().map(|r| r.address).collect::<Vec<_>>())
            .await?;
        let refused = twice.map(|r| r.address).or_else(|| {
            reattach.iter().zip(&reads).find_map(|(r, read)| {
                let ok = read.as_ref().is_some_and(|read| {
                    read.claim.attachment.is_none() && read.claim.pod.same_holder(&r.pod)
                });
                (!ok).then_some(r.address)
            })
        });
        if let Some(stale) = refused {
            // A fresh address that is taken is the answer that matters more.
            let taken = self
                .read_claims(&fresh.iter().map(|c| c.address).collect::<Vec<_>>())
                .await?;
            if let Some((c, _)) = fresh.iter().zip(&taken).find(|(_, t)| t.is_some()) {
                return Err(StoreError::Conflict(c.address));
            }
            return Err(StoreError::Stale(stale));
        }

        let mut compares = Vec::new();
        let mut success = Vec::new();
        let mut failure = Vec::new();
        for c in &fresh {
            let key = self.keys.claim(c.address);
            compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            success.push(TxnOp::put(key.clone(), keys::encode(c), None));
            self.index_puts(c, &mut success);
            success.push(TxnOp::put(self.pod_index(c), "", None));
            success.push(TxnOp::delete(
                format!("{}{}", self.keys.released(), c.address),
                None,
            ));
            failure.push(TxnOp::get(key, None));
        }
        for (pool, address) in &pools {
            success.push(TxnOp::put(
                self.keys.cursor(pool),
                address.to_string(),
                None,
            ));
        }
        success.push(self.claims_changed());
        let mut out = Vec::with_capacity(reattach.len());
        let mut guards = Vec::with_capacity(reattach.len());
        for (r, read) in reattach.iter().zip(reads) {
            let read = read.expect("checked above");
            guards.push(read.mod_revision);
            let key = self.keys.claim(r.address);
            compares.push(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                read.mod_revision,
            ));
            let mut c = read.claim;
            self.index_deletes(&c, &mut success);
            // A virtual machine's next launcher pod has another name: the pod index moves.
            let renamed = c.pod.name != r.pod.name;
            if renamed {
                success.push(TxnOp::delete(self.pod_index(&c), None));
            }
            c.attachment = Some(r.attachment.clone());
            c.pod = r.pod.clone();
            c.network = r.network.clone();
            c.node = r.node.clone();
            c.updated_at = r.now;
            success.push(TxnOp::put(key.clone(), keys::encode(&c), None));
            self.index_puts(&c, &mut success);
            if renamed {
                success.push(TxnOp::put(self.pod_index(&c), "", None));
            }
            failure.push(TxnOp::get(key, None));
            out.push(c);
        }
        let resp = self
            .txn(Txn::new().when(compares).and_then(success).or_else(failure))
            .await?;
        if resp.succeeded() {
            return Ok(out);
        }
        // Someone was first: name a fresh address now claimed, else a reattach that changed.
        let now: Vec<Option<KeyValue>> = gets(&resp);
        if let Some((c, _)) = fresh.iter().zip(&now).find(|(_, kv)| kv.is_some()) {
            return Err(StoreError::Conflict(c.address));
        }
        let moved = reattach
            .iter()
            .zip(&guards)
            .zip(now.iter().skip(fresh.len()))
            .find(|((_, guard), kv)| kv.as_ref().map(|kv| kv.mod_revision()) != Some(**guard))
            .map(|((r, _), _)| r.address)
            .or(reattach.first().map(|r| r.address));
        Err(match moved {
            Some(address) => StoreError::Stale(address),
            // A fresh address claimed and released again between the guard and our look.
            None => StoreError::Conflict(fresh[0].address),
        })
    }

    /// The claims of `addresses` that exist, as read now.
    async fn read_existing(&self, addresses: &[IpAddr]) -> Result<Vec<Read>, StoreError> {
        Ok(self
            .read_claims(addresses)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    /// Writes each read claim that `select` picks, as `write` says (pushing its operations and
    /// returning the claim to report), in transactions of [`RELEASE_CHUNK`] claims, each guarded
    /// on the revisions read. A chunk refused because a claim changed meanwhile is read again,
    /// selected again and tried again, a bounded number of times.
    async fn guarded_writes(
        &self,
        mut reads: Vec<Read>,
        select: impl Fn(&Claim) -> bool,
        write: impl Fn(&Claim, &mut Vec<TxnOp>) -> Claim,
        what: &str,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut done = Vec::new();
        for _ in 0..ATTEMPTS {
            reads.retain(|r| select(&r.claim));
            let mut changed = Vec::new();
            for chunk in reads.chunks(RELEASE_CHUNK) {
                let mut compares = Vec::new();
                let mut ops = Vec::new();
                let mut out = Vec::new();
                for r in chunk {
                    compares.push(Compare::mod_revision(
                        self.keys.claim(r.claim.address),
                        CompareOp::Equal,
                        r.mod_revision,
                    ));
                    out.push(write(&r.claim, &mut ops));
                }
                ops.push(self.claims_changed());
                if self
                    .txn(Txn::new().when(compares).and_then(ops))
                    .await?
                    .succeeded()
                {
                    done.extend(out);
                } else {
                    changed.extend(chunk.iter().map(|r| r.claim.address));
                }
            }
            if changed.is_empty() {
                return Ok(sorted(done));
            }
            reads = self.read_existing(&changed).await?;
        }
        Err(StoreError::unavailable(format!(
            "claims kept changing while being {what}; retry"
        )))
    }

    /// Releases what `select` picks among `reads` (claim and index keys deleted, the release
    /// time recorded for the cool-down).
    async fn release_where(
        &self,
        reads: Vec<Read>,
        select: impl Fn(&Claim) -> bool,
    ) -> Result<Vec<Claim>, StoreError> {
        let now = self.now().to_string();
        let release = |c: &Claim, ops: &mut Vec<TxnOp>| {
            ops.push(TxnOp::delete(self.keys.claim(c.address), None));
            self.index_deletes(c, ops);
            ops.push(TxnOp::delete(self.pod_index(c), None));
            ops.push(TxnOp::put(
                format!("{}{}", self.keys.released(), c.address),
                now.clone(),
                None,
            ));
            c.clone()
        };
        self.guarded_writes(reads, select, release, "released")
            .await
    }

    pub(super) async fn release_attachment(
        &self,
        attachment: allot_core::store::Attachment,
    ) -> Result<Vec<Claim>, StoreError> {
        let reads = self
            .index_reads(&self.keys.by_attachment(&attachment))
            .await?;
        self.release_where(reads, |c| c.attachment.as_ref() == Some(&attachment))
            .await
    }

    pub(super) async fn release(
        &self,
        address: IpAddr,
        attachment: Option<allot_core::store::Attachment>,
    ) -> Result<bool, StoreError> {
        let reads = self.read_existing(&[address]).await?;
        let released = self
            .release_where(reads, |c| c.attachment == attachment)
            .await?;
        Ok(!released.is_empty())
    }

    pub(super) async fn release_unchanged(
        &self,
        claims: Vec<Claim>,
    ) -> Result<Vec<Claim>, StoreError> {
        let wanted: BTreeMap<IpAddr, Claim> = claims.into_iter().map(|c| (c.address, c)).collect();
        let addresses: Vec<IpAddr> = wanted.keys().copied().collect();
        let reads = self.read_existing(&addresses).await?;
        self.release_where(reads, |stored| {
            wanted
                .get(&stored.address)
                .is_some_and(|read| unchanged(stored, read))
        })
        .await
    }

    pub(super) async fn detach(
        &self,
        attachment: allot_core::store::Attachment,
        now: u64,
    ) -> Result<Vec<Claim>, StoreError> {
        let reads = self
            .index_reads(&self.keys.by_attachment(&attachment))
            .await?;
        let detach = |c: &Claim, ops: &mut Vec<TxnOp>| {
            self.index_deletes(c, ops);
            let mut c = c.clone();
            c.attachment = None;
            c.updated_at = now;
            ops.push(TxnOp::put(
                self.keys.claim(c.address),
                keys::encode(&c),
                None,
            ));
            self.index_puts(&c, ops);
            c
        };
        self.guarded_writes(
            reads,
            |c| c.attachment.as_ref() == Some(&attachment),
            detach,
            "detached",
        )
        .await
    }

    pub(super) async fn quarantine(
        &self,
        address: IpAddr,
        attachment: allot_core::store::Attachment,
        holder: allot_core::store::PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let reads = self.read_existing(&[address]).await?;
        let quarantine = |c: &Claim, ops: &mut Vec<TxnOp>| {
            self.index_deletes(c, ops);
            ops.push(TxnOp::delete(self.pod_index(c), None));
            let mut c = c.clone();
            c.attachment = None;
            c.pod = holder.clone();
            c.updated_at = now;
            ops.push(TxnOp::put(
                self.keys.claim(c.address),
                keys::encode(&c),
                None,
            ));
            self.index_puts(&c, ops);
            ops.push(TxnOp::put(self.pod_index(&c), "", None));
            c
        };
        let mut moved = self
            .guarded_writes(
                reads,
                |c| c.attachment.as_ref() == Some(&attachment),
                quarantine,
                "quarantined",
            )
            .await?;
        moved.pop().ok_or(StoreError::Stale(address))
    }

    /// Every key under `prefix` at one revision (`None`: the current one), page by page.
    /// Returns the revision read at.
    pub(super) async fn list(
        &self,
        prefix: &str,
        at: Option<i64>,
    ) -> Result<(i64, Vec<KeyValue>), StoreError> {
        let end = range_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        let mut revision = at;
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if let Some(r) = revision {
                options = options.with_revision(r);
            }
            let mut resp = self
                .kv()
                .get(from.clone(), Some(options))
                .await
                .map_err(|e| self.err(e))?;
            let at = resp.header().map(|h| h.revision()).unwrap_or_default();
            let revision = *revision.get_or_insert(at);
            let more = resp.more();
            let kvs = resp.take_kvs();
            if let Some(last) = kvs.last() {
                from = last.key().to_vec();
                from.push(0);
            }
            out.extend(kvs);
            if !more {
                return Ok((revision, out));
            }
        }
    }

    /// Every claim, at one revision.
    pub(super) async fn all_claims(
        &self,
        at: Option<i64>,
    ) -> Result<(i64, Vec<Claim>), StoreError> {
        let (revision, kvs) = self.list(&self.keys.claims(), at).await?;
        let claims = kvs
            .iter()
            .map(|kv| self.decode(kv).map(|r| r.claim))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((revision, sorted(claims)))
    }

    pub(super) async fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        let (revision, claims) = self.all_claims(None).await?;
        let (_, released) = self.list(&self.keys.released(), Some(revision)).await?;
        let (_, cursors) = self.list(&self.keys.cursors(), Some(revision)).await?;
        let released = released
            .iter()
            .filter_map(|kv| {
                let at: u64 = std::str::from_utf8(kv.value()).ok()?.parse().ok()?;
                Some((Keys::address_of(kv.key())?, at))
            })
            .filter(|(_, at)| *at >= released_since)
            .collect();
        let cursors = cursors
            .iter()
            .filter_map(|kv| {
                let address = std::str::from_utf8(kv.value()).ok()?.parse().ok()?;
                Some((Keys::name_of(kv.key())?, address))
            })
            .collect();
        Ok(Snapshot {
            revision: super::feed::end_of(revision as u64),
            claims: Taken::of_all(&claims),
            released,
            cursors,
        })
    }
}
