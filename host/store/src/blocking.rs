//! The synchronous [`Store`] seam over an asynchronous backend, in one place.
//!
//! The engine calls the store from blocking threads (as it calls SQLite), while the etcd and
//! Kubernetes clients are asynchronous. Each of those backends implements [`AsyncStore`] once;
//! [`BlockingStore`] implements [`Store`] for any of them: it owns a small tokio runtime for the
//! backend's client and watch, runs each call there within the call budget, and waits for the
//! answer, so the store can be used from any thread, including one that belongs to another
//! runtime. A call whose answer is ready at once (a read from a watch-fed mirror) is answered
//! on the caller's thread, without a hop to the runtime.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use allot_core::store::{
    Attachment, Changes, Claim, PodRef, Reattach, Snapshot, Store, StoreError,
};

/// A claim store's operations, asynchronously: what a backend on an async client implements
/// (each with the meaning [`Store`]'s method of the same name documents), and
/// [`BlockingStore`] makes a [`Store`] of.
pub trait AsyncStore: Send + Sync + 'static {
    fn claim_batch(
        &self,
        fresh: Vec<Claim>,
        reattach: Vec<Reattach>,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn release_attachment(
        &self,
        attachment: Attachment,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn release(
        &self,
        address: IpAddr,
        attachment: Option<Attachment>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    fn release_unchanged(
        &self,
        claims: Vec<Claim>,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn detach(
        &self,
        attachment: Attachment,
        now: u64,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn quarantine(
        &self,
        address: IpAddr,
        attachment: Attachment,
        holder: PodRef,
        now: u64,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;
    fn claims_of(
        &self,
        attachment: Attachment,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn claims_of_pod(
        &self,
        namespace: String,
        name: String,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    /// See [`Store::claims_of_virtual_machine`]; without an index by owner, every claim is
    /// read.
    fn claims_of_virtual_machine(
        &self,
        namespace: String,
        name: String,
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send {
        async move {
            let mut claims = self.all().await?;
            claims.retain(|c| c.pod.of_virtual_machine(&namespace, &name));
            Ok(claims)
        }
    }
    fn detached(&self) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn all(&self) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send;
    fn snapshot(
        &self,
        released_since: u64,
    ) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;
    fn changes_since(
        &self,
        revision: u64,
    ) -> impl Future<Output = Result<Changes, StoreError>> + Send;
    /// As [`Store::remove_emptied`]; a backend whose emptied storage costs nothing keeps this.
    fn remove_emptied(
        &self,
        cooled_before: u64,
        limit: usize,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        let _ = (cooled_before, limit);
        async { Ok(0) }
    }
}

/// A [`Store`] made of an [`AsyncStore`]: see the [module documentation](self).
pub struct BlockingStore<B> {
    backend: Arc<B>,
    blocking: Blocking,
}

impl<B: std::fmt::Debug> std::fmt::Debug for BlockingStore<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.backend.fmt(f)
    }
}

impl<B: AsyncStore> BlockingStore<B> {
    /// A store whose backend `make` builds on the store's runtime (clients spawn their workers
    /// where they are built, and a backend may start its watch there). `thread` names the
    /// runtime's thread, `peer` what the backend talks to ("etcd 127.0.0.1:2379", for error
    /// messages), `timeout` is the budget of one call.
    pub(crate) fn start<M, F>(
        thread: &str,
        peer: &str,
        timeout: Duration,
        make: M,
    ) -> Result<BlockingStore<B>, StoreError>
    where
        M: FnOnce() -> F,
        F: Future<Output = Result<Arc<B>, StoreError>> + Send + 'static,
    {
        let blocking = Blocking::new(thread, peer, timeout)?;
        let backend = blocking.run(make())?;
        Ok(BlockingStore { backend, blocking })
    }

    /// The backend, for what it offers besides the [`Store`] seam.
    pub(crate) fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Runs `call` on the backend within the call budget and waits for its outcome.
    pub(crate) fn run<T, F>(&self, call: impl FnOnce(Arc<B>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.blocking.run(call(self.backend.clone()))
    }
}

impl<B: AsyncStore> Store for BlockingStore<B> {
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        let (fresh, reattach) = (fresh.to_vec(), reattach.to_vec());
        self.run(move |b| async move { b.claim_batch(fresh, reattach).await })
    }

    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let attachment = attachment.clone();
        self.run(move |b| async move { b.release_attachment(attachment).await })
    }

    fn release(
        &self,
        address: IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        let attachment = attachment.cloned();
        self.run(move |b| async move { b.release(address, attachment).await })
    }

    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        let claims = claims.to_vec();
        self.run(move |b| async move { b.release_unchanged(claims).await })
    }

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        let attachment = attachment.clone();
        self.run(move |b| async move { b.detach(attachment, now).await })
    }

    fn quarantine(
        &self,
        address: IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let (attachment, holder) = (attachment.clone(), holder.clone());
        self.run(move |b| async move { b.quarantine(address, attachment, holder, now).await })
    }

    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let attachment = attachment.clone();
        self.run(move |b| async move { b.claims_of(attachment).await })
    }

    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.run(move |b| async move { b.claims_of_pod(namespace, name).await })
    }

    fn claims_of_virtual_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Claim>, StoreError> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.run(move |b| async move { b.claims_of_virtual_machine(namespace, name).await })
    }

    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        self.run(|b| async move { b.detached().await })
    }

    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        self.run(|b| async move { b.all().await })
    }

    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        self.run(move |b| async move { b.snapshot(released_since).await })
    }

    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        self.run(move |b| async move { b.changes_since(revision).await })
    }

    fn remove_emptied(&self, cooled_before: u64, limit: usize) -> Result<usize, StoreError> {
        self.run(move |b| async move { b.remove_emptied(cooled_before, limit).await })
    }
}

/// A runtime and the budget of one call on it.
struct Blocking {
    runtime: Option<tokio::runtime::Runtime>,
    /// What the client talks to, for error messages ("etcd 127.0.0.1:2379").
    peer: String,
    /// Budget of one call.
    timeout: Duration,
}

impl Blocking {
    fn new(thread: &str, peer: &str, timeout: Duration) -> Result<Blocking, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread)
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::backend_caused(format!("cannot start the {peer} client: {e}"), e)
            })?;
        Ok(Blocking {
            runtime: Some(runtime),
            peer: peer.to_string(),
            timeout,
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives until drop")
    }

    /// Runs `work` within the call budget and waits for its outcome: on the caller's thread when
    /// it is ready at once, else on the runtime.
    fn run<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let mut work = Box::pin(work);
        {
            // In the runtime's context, so that a call that does start I/O registers it with
            // this runtime; polled once, it moves there below and goes on.
            let _context = self.runtime().enter();
            let mut cx = Context::from_waker(std::task::Waker::noop());
            if let Poll::Ready(outcome) = work.as_mut().poll(&mut cx) {
                return outcome;
            }
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (budget, peer) = (self.timeout, self.peer.clone());
        self.runtime().spawn(async move {
            let outcome = tokio::time::timeout(budget, work)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::unavailable(format!(
                        "{peer} did not answer within {budget:?}; is it running and reachable?"
                    )))
                });
            let _ = tx.send(outcome);
        });
        // The budget above ends any call that yields; this one ends a call even if its task
        // never yields again (a bug), so that no agent thread waits forever.
        rx.recv_timeout(self.timeout + Duration::from_secs(1))
            .unwrap_or_else(|e| {
                Err(StoreError::backend(format!(
                    "the {} client {}; restart the agent if this repeats",
                    self.peer,
                    match e {
                        std::sync::mpsc::RecvTimeoutError::Timeout => "did not finish a call",
                        std::sync::mpsc::RecvTimeoutError::Disconnected => "stopped",
                    }
                )))
            })
    }
}

impl Drop for Blocking {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside another runtime's async context.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
