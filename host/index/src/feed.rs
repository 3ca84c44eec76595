//! From a watch stream to index updates.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

use crate::index::Shared;

/// How an index takes one kind of object (kubert's `IndexNamespacedResource`, in small).
pub trait IndexResource<T> {
    /// The kind's name, for logs.
    const KIND: &'static str;
    fn apply(&mut self, object: T);
    fn delete(&mut self, object: T);
    /// Replaces every object of the kind: the complete list after a watch (re)started.
    fn reset(&mut self, objects: Vec<T>);
}

/// Applies a watch's events to `index` until the stream ends. Objects listed after a (re)start
/// are buffered and replace the kind's contents when the list is complete; errors are logged
/// (the watcher retries them with its backoff; wrap it in `default_backoff`).
pub async fn feed<I, K, T, S>(index: Arc<Shared<I>>, stream: S, wrap: fn(K) -> T)
where
    I: IndexResource<T>,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let kind = <I as IndexResource<T>>::KIND;
    let mut listing: Option<Vec<T>> = None;
    let mut failing = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if failing {
                    tracing::info!(kind, "watching again");
                    failing = false;
                }
                match event {
                    watcher::Event::Apply(o) => index.update(|i| i.apply(wrap(o))),
                    watcher::Event::Delete(o) => index.update(|i| i.delete(wrap(o))),
                    watcher::Event::Init => listing = Some(Vec::new()),
                    watcher::Event::InitApply(o) => {
                        listing.get_or_insert_with(Vec::new).push(wrap(o))
                    }
                    watcher::Event::InitDone => {
                        let objects = listing.take().unwrap_or_default();
                        let n = objects.len();
                        index.update(|i| i.reset(objects));
                        tracing::debug!(kind, objects = n, "listed");
                    }
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(kind, "watch failed, retrying with backoff: {e}");
                }
                failing = true;
            }
        }
    }
}
