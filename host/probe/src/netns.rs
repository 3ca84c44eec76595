//! Running code inside a network namespace without moving the caller: `setns(2)` changes only
//! the calling thread, so the work runs on a fresh thread that enters the namespace and ends
//! with the work. The caller's thread (a CNI plugin's main thread, or an async runtime's
//! worker) never changes namespace.

use std::any::Any;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::thread;

use crate::error::ProbeError;

/// The name of the thread that enters the namespace (as `/proc/PID/task/TID/comm` shows it).
pub const PROBE_THREAD_NAME: &str = "allot-probe";

/// Runs `f` on a new thread inside the network namespace at `netns` (a `/proc/PID/ns/net`
/// path, or a bind mount of one such as `/run/netns/NAME`: what `CNI_NETNS` names) and returns
/// its result. A panic in `f` comes back as [`ProbeError::Thread`].
pub fn in_netns<R: Send>(
    netns: &Path,
    f: impl FnOnce() -> Result<R, ProbeError> + Send,
) -> Result<R, ProbeError> {
    // Opened here so that a wrong path fails before any thread exists.
    let file = File::open(netns).map_err(|source| ProbeError::NetnsOpen {
        path: netns.to_owned(),
        source,
    })?;
    thread::scope(|scope| {
        let worker = thread::Builder::new()
            .name(PROBE_THREAD_NAME.to_owned())
            .spawn_scoped(scope, move || {
                // SAFETY: setns(2) on a descriptor this thread owns; it affects only this
                // thread, which ends when `f` returns.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(ProbeError::NetnsEnter {
                        path: netns.to_owned(),
                        source: std::io::Error::last_os_error(),
                    });
                }
                drop(file);
                f()
            })
            .map_err(|e| ProbeError::Thread(format!("cannot start it: {e}")))?;
        worker
            .join()
            .unwrap_or_else(|panic| Err(ProbeError::Thread(panic_message(panic.as_ref()))))
    })
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("it panicked: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn netns_inode(path: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn the_caller_stays_where_it_was() {
        // Entering our own namespace needs no privilege beyond what setns checks, and shows
        // that the work runs on another thread.
        let before = netns_inode("/proc/thread-self/ns/net");
        let caller = thread::current().id();
        let (id, name) = in_netns(Path::new("/proc/self/ns/net"), || {
            let t = thread::current();
            Ok((t.id(), t.name().map(str::to_owned)))
        })
        .unwrap();
        assert_ne!(id, caller);
        assert_eq!(name.as_deref(), Some(PROBE_THREAD_NAME));
        assert_eq!(netns_inode("/proc/thread-self/ns/net"), before);
    }

    #[test]
    fn wrong_paths_and_panics_are_errors() {
        let e = in_netns(Path::new("/nonexistent/netns"), || Ok(())).unwrap_err();
        assert!(matches!(e, ProbeError::NetnsOpen { .. }), "{e}");
        assert!(e.to_string().contains("CNI_NETNS"), "{e}");
        let e = in_netns(Path::new("/proc/self/ns/uts"), || Ok(())).unwrap_err();
        assert!(matches!(e, ProbeError::NetnsEnter { .. }), "{e}");
        assert!(e.to_string().contains("not a network namespace"), "{e}");
        let e = in_netns(Path::new("/proc/self/ns/net"), || -> Result<(), _> {
            panic!("boom")
        })
        .unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
    }
}
