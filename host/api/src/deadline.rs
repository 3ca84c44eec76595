//! When the plugin gives up on a request, on a clock the agent reads too.
//!
//! The plugin gives up on a DEL after its timeout, remembers it in the journal and reports
//! success; a runtime that reuses container IDs may then ADD the same container again. If the
//! agent acted on that DEL afterwards (it had been waiting behind the attachment's lock, or for
//! a blocking thread), it would release what the re-ADD holds. So the plugin sends the moment
//! it gives up ([`crate::DelRequest::monotonic_deadline_ms`]), and the agent drops a DEL it has
//! not acted on by then: the journal entry serves it, ordered with the re-ADD under the same
//! lock.
//!
//! The clock is `CLOCK_MONOTONIC`, in milliseconds: plugin and agent share it, being on one
//! host (they talk over a unix socket) and in one time namespace (runtimes give containers
//! none of their own unless asked), and unlike the wall clock it never steps (NTP), which
//! could make the agent act after the plugin gave up.

use std::time::Duration;

/// Milliseconds of `CLOCK_MONOTONIC` now.
pub fn now_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a pointer to a live one; with
    // CLOCK_MONOTONIC, which Linux always has, it cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    (now.tv_sec as u64) * 1000 + (now.tv_nsec as u64) / 1_000_000
}

/// The deadline `timeout` from now. Taken before the call's own timer starts, so it is never
/// later than the moment the caller gives up.
pub fn after(timeout: Duration) -> u64 {
    now_ms().saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
}

/// How long ago `deadline` passed; `None` while it has not.
pub fn overdue(deadline: u64) -> Option<Duration> {
    let now = now_ms();
    (now >= deadline).then(|| Duration::from_millis(now - deadline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_passes_after_its_timeout() {
        let deadline = after(Duration::from_millis(50));
        assert_eq!(overdue(deadline), None);
        std::thread::sleep(Duration::from_millis(60));
        assert!(overdue(deadline).is_some_and(|late| late < Duration::from_secs(5)));
        assert!(overdue(after(Duration::ZERO)).is_some(), "at once");
    }
}
