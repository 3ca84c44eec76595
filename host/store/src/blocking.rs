//! A synchronous call on an asynchronous client: the [`Store`](allot_core::store::Store) seam
//! is synchronous (the engine calls it from blocking threads, as it calls SQLite), while the
//! etcd and Kubernetes clients are asynchronous. Each such store owns a small tokio runtime; a
//! call runs as a task there and the caller waits for its answer, so the store can be used from
//! any thread, including one that belongs to another runtime.

use std::future::Future;
use std::time::Duration;

use allot_core::store::StoreError;

pub(crate) struct Blocking {
    runtime: Option<tokio::runtime::Runtime>,
    /// What the client talks to, for error messages ("etcd 127.0.0.1:2379").
    peer: String,
    /// Budget of one call.
    timeout: Duration,
}

impl Blocking {
    pub fn new(thread: &str, peer: &str, timeout: Duration) -> Result<Blocking, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread)
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot start the {peer} client: {e}")))?;
        Ok(Blocking {
            runtime: Some(runtime),
            peer: peer.to_string(),
            timeout,
        })
    }

    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives until drop")
    }

    /// Runs `work` on the runtime within the call budget and waits for its outcome.
    pub fn run<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (budget, peer) = (self.timeout, self.peer.clone());
        self.runtime().spawn(async move {
            let outcome = tokio::time::timeout(budget, work)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Unavailable(format!(
                        "{peer} did not answer within {budget:?}; is it running and reachable?"
                    )))
                });
            let _ = tx.send(outcome);
        });
        // The budget above ends any call that yields; this one ends a call even if its task
        // never yields again (a bug), so that no agent thread waits forever.
        rx.recv_timeout(self.timeout + Duration::from_secs(1))
            .unwrap_or_else(|e| {
                Err(StoreError::Backend(format!(
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
