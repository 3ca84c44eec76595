//! One container's runtime state and its process: started through the helper
//! ([`super::helper`]) in its own process group, so that stopping it signals everything it
//! started; output appended to `/var/log/pods/<ns>_<pod>_<uid>/<container>.log` on the node.

use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::task::JoinHandle;

use super::helper::{ContainerSpec, ERROR_FD, MountSpec};
use crate::image::Image;

/// A finished run of a container.
#[derive(Debug, Clone, PartialEq)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<jiff::Timestamp>,
    pub finished_at: jiff::Timestamp,
    pub container_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: jiff::Timestamp,
        /// The process group leader; None for a container the stand-in does not run.
        pid: Option<u32>,
    },
    Terminated(Terminated),
}

/// A container of the pod (init or regular) and what the stand-in knows about it.
pub struct Runtime {
    pub spec: Container,
    pub init: bool,
    pub state: State,
    pub last: Option<Terminated>,
    pub restarts: i32,
    pub ready: bool,
    /// The startup probe passed (or there is none) since the last start.
    pub started: bool,
    /// Counts starts; exits and probe results of earlier runs are recognized and ignored.
    pub generation: u64,
    pub container_id: Option<String>,
    /// Restart back-off: the current delay and when the next start may happen.
    pub backoff: Option<Duration>,
    pub next_start: Option<Instant>,
    pub probes: Vec<JoinHandle<()>>,
    /// When a stop's grace period ends (SIGKILL then).
    pub kill_at: Option<Instant>,
    /// Process details for exec probes.
    pub uid: u32,
    pub gid: u32,
    pub env: Vec<(String, String)>,
}

impl Runtime {
    pub fn new(spec: Container, init: bool) -> Runtime {
        Runtime {
            state: State::Waiting {
                reason: if init {
                    "PodInitializing"
                } else {
                    "ContainerCreating"
                }
                .into(),
                message: None,
            },
            spec,
            init,
            last: None,
            restarts: 0,
            ready: false,
            started: false,
            generation: 0,
            container_id: None,
            backoff: None,
            next_start: None,
            probes: Vec::new(),
            kill_at: None,
            uid: 0,
            gid: 0,
            env: Vec::new(),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        match self.state {
            State::Running { pid, .. } => pid,
            _ => None,
        }
    }

    pub fn running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    pub fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(t) if t.exit_code == 0)
    }

    /// Sends `signal` to the container's process group.
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) of a process group; no memory-safety preconditions.
            unsafe {
                libc::kill(-(pid as libc::pid_t), signal);
            }
        }
    }

    pub fn stop_probes(&mut self) {
        for p in self.probes.drain(..) {
            p.abort();
        }
    }
}

/// A new container or sandbox id: 64 hex digits, as containerd makes them.
pub fn new_id() -> String {
    let mut bytes = [0u8; 32];
    if fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_err()
    {
        let t = jiff::Timestamp::now().as_nanosecond().to_le_bytes();
        bytes[..16].copy_from_slice(&t);
        bytes[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    }
    hex::encode(bytes)
}

/// Everything one start of a container needs.
pub struct Launch<'a> {
    pub helper: &'a Path,
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub image: &'a Image,
    /// Volume name → the machine's path.
    pub volumes: &'a std::collections::HashMap<String, PathBuf>,
    /// None: the node's network namespace (hostNetwork).
    pub netns: Option<&'a Path>,
    pub hostname: &'a str,
    /// This run's directory (overlay layers, spec).
    pub run_dir: PathBuf,
    pub log: &'a Path,
    pub argv: Vec<String>,
    pub env: &'a [(String, String)],
    pub uid: u32,
    pub gid: u32,
}

/// The user and group a container runs as: its securityContext, else the pod's, else the
/// image's `User`, else root.
pub fn identity(
    pod: &Pod,
    container: &Container,
    image: Option<&Image>,
) -> Result<(u32, u32, Vec<u32>)> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = container.security_context.as_ref();
    let (image_uid, image_gid) = match image {
        Some(i) => i.config.uid_gid()?,
        None => (None, None),
    };
    let uid = csc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user))
        .map(|u| u as u32)
        .or(image_uid)
        .unwrap_or(0);
    let gid = csc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|s| s.run_as_group))
        .map(|g| g as u32)
        .or(image_gid)
        .unwrap_or(0);
    let mut groups: Vec<u32> = psc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| g as u32)
        .collect();
    if let Some(fs_group) = psc.and_then(|s| s.fs_group) {
        groups.push(fs_group as u32);
    }
    Ok((uid, gid, groups))
}

/// Starts the container's process. Ok(pid and child) once its command runs; Err with the
/// runtime's message when it could not be started (mounts, user, executable).
pub async fn launch(l: Launch<'_>, groups: Vec<u32>) -> Result<tokio::process::Child, String> {
    let result = prepare(&l, groups).map_err(|e| format!("{e:#}"))?;
    let (spec_path, read_end, write_end) = result;
    let log = crate::process::append(l.log).map_err(|e| format!("{e:#}"))?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(l.helper);
    cmd.arg("__container")
        .arg(&spec_path)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    let write_fd = write_end.as_raw_fd();
    // SAFETY: between fork and exec; dup2 is async-signal-safe and the descriptor is open
    // (owned by `write_end`, alive until after the spawn).
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec: clear it instead.
            let ok = if write_fd == ERROR_FD {
                libc::fcntl(ERROR_FD, libc::F_SETFD, 0) >= 0
            } else {
                libc::dup2(write_fd, ERROR_FD) >= 0
            };
            if !ok {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(|e| format!("starting the container helper: {e}"))?;
    drop(write_end);
    let message = tokio::task::spawn_blocking(move || {
        let mut reader = fs::File::from(read_end);
        let mut text = String::new();
        let _ = reader.read_to_string(&mut text);
        text
    })
    .await
    .unwrap_or_default();
    if !message.is_empty() {
        let _ = child.wait().await;
        return Err(message);
    }
    Ok(child)
}

/// Writes the spec, makes the run's directories and the error pipe.
fn prepare(l: &Launch<'_>, groups: Vec<u32>) -> Result<(PathBuf, OwnedFd, OwnedFd)> {
    let _ = fs::remove_dir_all(&l.run_dir);
    for d in ["upper", "work", "rootfs"] {
        fs::create_dir_all(l.run_dir.join(d))?;
    }
    let mut mounts: Vec<MountSpec> = l
        .image
        .files
        .iter()
        .map(|rel| MountSpec {
            source: l.image.rootfs.join(rel),
            target: Path::new("/").join(rel),
            read_only: true,
        })
        .collect();
    let mut volume_mounts = l.container.volume_mounts.clone().unwrap_or_default();
    // Parents before children, as a runtime orders nested mount points.
    volume_mounts.sort_by_key(|m| Path::new(&m.mount_path).components().count());
    for m in &volume_mounts {
        let source = l
            .volumes
            .get(&m.name)
            .with_context(|| format!("volumeMount {:?}: the pod has no such volume", m.name))?;
        let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                let p = source.join(sub);
                if !p.exists() {
                    fs::create_dir_all(&p)?;
                }
                p
            }
            None => source.clone(),
        };
        mounts.push(MountSpec {
            source,
            target: PathBuf::from(&m.mount_path),
            read_only: m.read_only.unwrap_or(false),
        });
    }
    let privileged = l
        .container
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    let spec = ContainerSpec {
        netns: l.netns.map(Path::to_path_buf),
        hostname: l.hostname.to_string(),
        rootfs: l.run_dir.join("rootfs"),
        upper: l.run_dir.join("upper"),
        work: l.run_dir.join("work"),
        mounts,
        read_only_sys: !privileged,
        argv: l.argv.clone(),
        env: l.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        cwd: l
            .container
            .working_dir
            .clone()
            .filter(|w| !w.is_empty())
            .or(l.image.config.working_dir.clone())
            .unwrap_or_else(|| "/".into()),
        uid: l.uid,
        gid: l.gid,
        groups,
    };
    let spec_path = l.run_dir.join("spec.json");
    fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?)?;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, owned right below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: fresh descriptors nobody else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((spec_path, read, write))
}

/// The start time of process `pid` (field 22 of /proc/PID/stat, clock ticks since boot):
/// with the pid it identifies a process across pid reuse.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' are plain.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}
