//! Following the blocks: one watch on IPBlocks (those of the store's scope) from the version the
//! mirror is at, resumed after the last version seen when the stream ends (API servers end
//! watches every few minutes), and a fresh list when the API server has forgotten that version
//! (`410 Gone`) or the scope changed.

use std::sync::Arc;
use std::time::Duration;

use allot_core::block::BlockScope;
use futures::{StreamExt, TryStreamExt};
use kube::api::{WatchEvent, WatchParams};

use super::Backend;
use super::compact::Block;

/// Backoff between failed attempts to watch: doubled from the first to the last, with jitter.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Follows the blocks from `rv`, listing again whenever `scope` (subscribed before the list
/// `rv` came from) changes.
pub(super) async fn follow(
    inner: Arc<Backend>,
    mut rv: String,
    mut scope: tokio::sync::watch::Receiver<BlockScope>,
) {
    let mut backoff = BACKOFF.0;
    // A list is owed: the scope changed (or the version was forgotten) and no list has
    // succeeded since; until one does, nothing is watched with the old selector.
    let mut owed = false;
    loop {
        let ended = if owed {
            Ended::Gone
        } else {
            tokio::select! {
                ended = watch_once(&inner, &mut rv) => ended,
                // Another scope: list its blocks (the mirror drops the others) and watch them.
                Ok(()) = scope.changed() => {
                    tracing::info!("the IPBlocks to follow changed; listing them");
                    Ended::Rescoped
                }
            }
        };
        match ended {
            // Following every block only because some carried no region: once a watch ends
            // (every few minutes), see whether the controller has labelled them since.
            Ended::Quietly { progressed: true } if inner.falling_back() => {
                backoff = BACKOFF.0;
                owed = true;
            }
            Ended::Quietly { progressed: true } => backoff = BACKOFF.0,
            // A stream that ends before delivering anything (a proxy closing it at once) is
            // not let to spin: wait as after a failure.
            Ended::Quietly { progressed: false } => pause(&mut backoff, &rv).await,
            Ended::Gone | Ended::Rescoped => {
                if matches!(ended, Ended::Gone) && !owed {
                    tracing::info!(
                        "the API server forgot the IPBlock version watched from; listing again"
                    );
                }
                match inner.relist().await {
                    Ok(listed) => {
                        rv = listed;
                        backoff = BACKOFF.0;
                        owed = false;
                        continue;
                    }
                    Err(e) => tracing::warn!(error = %e, "listing IPBlocks failed; retrying"),
                }
                owed = true;
                pause(&mut backoff, &rv).await;
            }
            Ended::Failed(e) => {
                tracing::warn!(error = %e, "watching IPBlocks failed; retrying");
                pause(&mut backoff, &rv).await;
            }
        }
    }
}

async fn pause(backoff: &mut Duration, rv: &str) {
    // Jitter from the version (no random source needed): agents restarted together spread out.
    let spread = rv
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
        % 100;
    let wait = backoff.mul_f64(0.5 + spread as f64 / 200.0);
    tokio::time::sleep(wait).await;
    *backoff = (*backoff * 2).min(BACKOFF.1);
}

enum Ended {
    /// The stream ended as streams do (a timeout, a closed connection): resume. `progressed`:
    /// it delivered at least one event first.
    Quietly {
        progressed: bool,
    },
    /// The version is too old: list again.
    Gone,
    /// The scope changed: list its blocks.
    Rescoped,
    Failed(String),
}

async fn watch_once(inner: &Backend, rv: &mut String) -> Ended {
    let mut params = WatchParams::default().timeout(290);
    if let Some(selector) = inner.selector() {
        params = params.labels(&selector);
    }
    let stream = match inner.api.watch(&params, rv).await {
        Ok(s) => s,
        Err(kube::Error::Api(s)) if s.code == 410 => return Ended::Gone,
        Err(e) => return Ended::Failed(e.to_string()),
    };
    let mut stream = stream.boxed();
    let mut progressed = false;
    loop {
        let event = match stream.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return Ended::Quietly { progressed },
            Err(e) => return Ended::Failed(e.to_string()),
        };
        progressed = true;
        if !matches!(event, WatchEvent::Bookmark(_) | WatchEvent::Error(_)) {
            inner
                .watch_events
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let at = (inner.clock)();
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                let block = Block::from_object(&o);
                if let Some(v) = &block.version {
                    rv.clone_from(v);
                }
                let name = block.name.clone();
                inner.mirror.apply(&name, Some(block), None, at);
            }
            WatchEvent::Deleted(o) => {
                let version = o.metadata.resource_version.clone();
                if let Some(v) = &version {
                    rv.clone_from(v);
                }
                let name = o.metadata.name.clone().unwrap_or_default();
                inner.mirror.apply(&name, None, version.as_deref(), at);
            }
            WatchEvent::Bookmark(b) => rv.clone_from(&b.metadata.resource_version),
            WatchEvent::Error(s) if s.code == 410 => return Ended::Gone,
            WatchEvent::Error(s) => {
                return Ended::Failed(format!("{} {}: {}", s.code, s.reason, s.message));
            }
        }
    }
}
