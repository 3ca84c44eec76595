//! The loop that drives a reconcile from a watch-fed index, while this replica leads: a pass
//! when the index's generation moved (changes arriving together are one pass), again after a
//! backoff when a pass asked to be retried, and at least every resync period; after winning the
//! leadership back, at once (another replica may have acted meanwhile). Auto-pools and fleet
//! ranges both run in it.

use std::sync::Arc;
use std::time::Duration;

use allot_index::Shared;
use futures::future::BoxFuture;

use crate::lease::Leadership;

/// The first retry after a pass that could not finish; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Changes that arrive together are one pass.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// What one pass says of itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Passed {
    /// Something could not be done now: pass again after a backoff.
    pub retry: bool,
    /// The pass was the full resync it was asked for (the next is one period later).
    pub resynced: bool,
}

/// What the loop reads of an index: whether its first lists are in, and its generation.
pub trait Watched {
    fn ready(&self) -> bool;
    fn generation(&self) -> u64;
}

/// One pass over the index (told whether a full resync is due). The future is boxed so that
/// it is `Send` for every borrow, which an `async fn` in a trait cannot promise yet.
pub trait Pass<I>: Send {
    fn pass<'a>(&'a mut self, index: &'a Shared<I>, resync_due: bool) -> BoxFuture<'a, Passed>;
}

/// Runs `pass` as described above, forever.
pub async fn run<I: Watched + Send + Sync>(
    what: &str,
    index: Arc<Shared<I>>,
    leadership: Leadership,
    resync: Duration,
    mut pass: impl Pass<I>,
) {
    let mut changes = index.changes();
    let mut leading = leadership.subscribe();
    let mut done: Option<u64> = None;
    let mut backoff: Option<Duration> = None;
    let mut next_resync = tokio::time::Instant::now() + resync;
    loop {
        leadership.until_leading().await;
        // Before reading the generation: a change made while the pass runs must wake the wait
        // below (marking after the pass would swallow it until the next resync).
        changes.mark_unchanged();
        leading.mark_unchanged();
        let (ready, generation) = {
            let i = index.read();
            (i.ready(), i.generation())
        };
        let resync_due = tokio::time::Instant::now() >= next_resync;
        if ready && (done != Some(generation) || backoff.is_some() || resync_due) {
            let passed = pass.pass(&index, resync_due).await;
            tracing::debug!(?passed, "{what} pass");
            if passed.resynced {
                next_resync = tokio::time::Instant::now() + resync;
            }
            done = Some(generation);
            backoff = passed
                .retry
                .then(|| backoff.map_or(FIRST_BACKOFF, |b| (b * 2).min(MAX_BACKOFF)));
        } else if !ready {
            tracing::debug!("{what}: waiting for the watches' first lists");
        }
        let wake = match backoff {
            Some(b) => tokio::time::Instant::now() + b,
            None => next_resync,
        };
        tokio::select! {
            _ = changes.changed() => tokio::time::sleep(DEBOUNCE).await,
            _ = leading.changed() => done = None,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Toy {
        generation: u64,
    }

    impl Watched for Toy {
        fn ready(&self) -> bool {
            true
        }
        fn generation(&self) -> u64 {
            self.generation
        }
    }

    /// Reports when each pass ran; the first one changes the index while it runs, as a watch
    /// event arriving mid-pass does.
    struct ChangesDuringFirstPass {
        passes: tokio::sync::mpsc::UnboundedSender<tokio::time::Instant>,
        count: usize,
    }

    impl Pass<Toy> for ChangesDuringFirstPass {
        fn pass<'a>(&'a mut self, index: &'a Shared<Toy>, _: bool) -> BoxFuture<'a, Passed> {
            Box::pin(async move {
                self.count += 1;
                if self.count == 1 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    index.update(|t| t.generation += 1);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let _ = self.passes.send(tokio::time::Instant::now());
                Passed::default()
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_made_during_a_pass_gets_a_pass_of_its_own_without_waiting_for_the_resync() {
        let index = Shared::of(Toy { generation: 0 });
        let (tx, mut passes) = tokio::sync::mpsc::unbounded_channel();
        let pass = ChangesDuringFirstPass {
            passes: tx,
            count: 0,
        };
        let resync = Duration::from_secs(3600);
        let looping = tokio::spawn(run("test", index, Leadership::always(), resync, pass));
        let first = passes.recv().await.unwrap();
        let second = passes.recv().await.unwrap();
        looping.abort();
        assert!(
            second - first < Duration::from_secs(1),
            "the second pass came {:?} after the first (the resync is {resync:?})",
            second - first
        );
    }
}
