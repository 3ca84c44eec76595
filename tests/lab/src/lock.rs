//! One lab per machine: the bridge, its addresses and the namespace names are fixed. A lock
//! file (flock) held for the cluster's lifetime says who runs it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The lock file.
pub const LOCK_PATH: &str = "/run/allot-lab.lock";

/// The held lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct Lock {
    file: File,
}

impl Lock {
    /// Takes the lock, waiting up to `wait` for another lab to finish; records this process
    /// and `dir` in it. Returns the lock and what the previous holder had recorded (its
    /// directory, when it ended without cleaning up).
    pub fn acquire(dir: &Path, wait: Duration) -> Result<(Lock, Option<PathBuf>)> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(LOCK_PATH)
            .with_context(|| format!("opening {LOCK_PATH} (the lab needs root)"))?;
        let deadline = Instant::now() + wait;
        loop {
            // SAFETY: flock(2) on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            if Instant::now() >= deadline {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                bail!(
                    "another lab cluster is running ({}): stop it first (Ctrl-C in its \
                     terminal, or kill the pid named there); only one lab runs per machine",
                    holder.trim()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let mut previous = String::new();
        file.rewind()?;
        file.read_to_string(&mut previous)?;
        let previous_dir = previous
            .split_whitespace()
            .find_map(|w| w.strip_prefix("dir="))
            .map(PathBuf::from);
        file.set_len(0)?;
        file.rewind()?;
        write!(file, "pid={} dir={}", std::process::id(), dir.display())?;
        file.flush()?;
        Ok((Lock { file }, previous_dir))
    }

    /// Marks the lab as cleaned up: the next holder has nothing of this one to remove.
    pub fn release_clean(self) {
        let _ = self.file.set_len(0);
    }
}
