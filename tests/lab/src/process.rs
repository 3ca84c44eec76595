//! Processes the launcher starts (control plane, node stand-ins, real nodes' containerd and
//! kubelet): one command line each, started again with the same arguments on restart, output
//! appended to one log file.

use std::ffi::{CString, OsString};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// What a process needs to run on a lab node: the node's network namespace, its mount
/// namespace and the view (the node's `/`) it chroots into ([`crate::node::hostfs`]).
#[derive(Debug, Clone)]
pub struct NodeEntry {
    pub mnt_ns: Arc<OwnedFd>,
    pub view: CString,
}

/// A command the launcher runs and may stop and start again.
#[derive(Debug)]
pub struct Supervised {
    pub name: String,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    pub log: PathBuf,
    child: Option<Child>,
    spawner: Option<Spawner>,
    /// The node it runs on, if any: (its network namespace, its mount namespace and view).
    node: Option<(Arc<OwnedFd>, NodeEntry)>,
}

impl Supervised {
    pub fn new(name: &str, program: &Path, args: Vec<OsString>, log: PathBuf) -> Supervised {
        Supervised {
            name: name.to_string(),
            program: program.to_path_buf(),
            args,
            env: Vec::new(),
            log,
            child: None,
            spawner: None,
            node: None,
        }
    }

    /// Runs the process on a lab node: in its network namespace `netns` and its mount
    /// namespace, chrooted into its view, where the program's path is resolved. A node whose
    /// mount namespace is made anew (a reboot) gives its processes the new one here.
    pub fn on_node(&mut self, netns: Arc<OwnedFd>, entry: NodeEntry) {
        self.node = Some((netns, entry));
    }

    /// Starts the process from `spawner`'s thread instead of the calling one (see
    /// [`Spawner`]).
    pub fn spawned_by(mut self, spawner: &Spawner) -> Supervised {
        self.spawner = Some(spawner.clone());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Supervised {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// The command line, for messages.
    pub fn command_line(&self) -> String {
        std::iter::once(self.program.to_string_lossy().into_owned())
            .chain(self.args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Starts the process (again), appending to its log.
    ///
    /// The child gets its own process group, so a terminal's Ctrl-C reaches the launcher only
    /// and it can stop things in order; and SIGKILL when the launcher dies (prctl
    /// PR_SET_PDEATHSIG), so nothing outlives a killed launcher. The death signal follows the
    /// spawning *thread*: processes are started from the launcher's long-lived threads.
    pub fn start(&mut self) -> Result<u32> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (setpgid, prctl, getppid, _exit) on values computed before the fork.
        unsafe {
            cmd.pre_exec(move || {
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The launcher may have died before prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        if let Some((netns, entry)) = &self.node {
            let (net, mnt, view) = (
                netns.as_raw_fd(),
                entry.mnt_ns.as_raw_fd(),
                entry.view.clone(),
            );
            // SAFETY: runs between fork and exec; setns, chroot and chdir are async-signal-safe
            // and use descriptors and a string made before the fork, which `self` keeps alive.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(net, libc::CLONE_NEWNET) != 0
                        || libc::setns(mnt, libc::CLONE_NEWNS) != 0
                        || libc::chroot(view.as_ptr()) != 0
                        || libc::chdir(c"/".as_ptr()) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = match &self.spawner {
            Some(spawner) => spawner.spawn(cmd),
            None => cmd.spawn(),
        }
        .with_context(|| format!("starting {}: {}", self.name, self.program.display()))?;
        let pid = child.id();
        self.child = Some(child);
        Ok(pid)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the process runs (it was started and has not exited).
    pub fn running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `signal` to the process; false when it does not run.
    pub fn signal(&mut self, signal: libc::c_int) -> bool {
        if !self.running() {
            return false;
        }
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
        true
    }

    /// The exit status once the process has exited (reaped), else None.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status)
            }
            Ok(None) => None,
            Err(_) => {
                self.child = None;
                None
            }
        }
    }

    /// SIGKILL and reap, now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process: `signal`, then SIGKILL after `grace`; blocks until it is reaped.
    pub fn stop_blocking(&mut self, signal: libc::c_int, grace: Duration) {
        if !self.signal(signal) {
            self.child = None;
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.is_none() || self.try_exit().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

/// A thread that lives as long as its owner and forks the processes it is handed.
///
/// A child's PR_SET_PDEATHSIG fires when the *thread* that forked it exits, not the process.
/// A test that starts processes from a runtime's worker thread, or from the thread of one
/// test among several in a process, would see them killed when that thread ends; forking from
/// this thread ties them to the owner's lifetime, and still kills them with the process.
#[derive(Clone, Debug)]
pub struct Spawner {
    jobs: Arc<Mutex<mpsc::Sender<SpawnJob>>>,
}

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

impl Spawner {
    /// A new thread named `name`; it ends when the last clone is dropped.
    pub fn new(name: &str) -> Result<Spawner> {
        let (jobs, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .context("starting the spawner thread")?;
        Ok(Spawner {
            jobs: Arc::new(Mutex::new(jobs)),
        })
    }

    /// Forks `cmd` from the spawner's thread.
    pub fn spawn(&self, cmd: Command) -> std::io::Result<Child> {
        let (reply, answer) = mpsc::channel();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((cmd, reply));
        if sent.is_err() {
            return Err(std::io::Error::other("the spawner thread has ended"));
        }
        answer
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the spawner thread has ended")))
    }
}

/// The last `lines` lines of a file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Opens (creating) a file for appending.
pub fn append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}
