//! The part of a container start that runs in the container's own process, before it executes
//! the container's command, as runc's `init` does: `allot-lab-node __container SPEC` enters the
//! pod's network namespace, makes its own mount, UTS and IPC namespaces, mounts the container's
//! root (an overlay of the machine's `/`, the image's files, the volumes), drops to the
//! container's user and executes. `allot-lab-node __exec PID ...` joins a running container's
//! namespaces and root, for exec probes.
//!
//! Errors before the command runs are written to descriptor 3 (close-on-exec) and end the
//! process with 128: the stand-in reads a start error there, and nothing (end of file) when
//! the command started.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::sys;

/// The descriptor a container start reports its error on.
pub const ERROR_FD: i32 = 3;

/// A mount of a container: a volume or an image file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MountSpec {
    /// A path of the machine.
    pub source: PathBuf,
    /// A path of the container.
    pub target: PathBuf,
    pub read_only: bool,
}

/// Everything the helper needs to start one container.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContainerSpec {
    /// The pod's network namespace; None: the node's (hostNetwork), which the helper has.
    pub netns: Option<PathBuf>,
    pub hostname: String,
    /// Overlay directories of this container's root: mount point, upper and work.
    pub rootfs: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Image files and volumes, mounted in order.
    pub mounts: Vec<MountSpec>,
    /// Mount a read-only `/sys` (unprivileged containers), else read-write.
    pub read_only_sys: bool,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Runs the helper if this process was started as one (`__container` or `__exec`); returns
/// otherwise. Call it first in `main`, before any thread starts.
pub fn run_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("__container") => container(&args[2..]),
        Some("__exec") => exec_in(&args[2..]),
        _ => return,
    };
    let Err(e) = result;
    let message = format!("{e:#}");
    // SAFETY: descriptor 3 is the error pipe the stand-in passed; wrapping it in a File that
    // is leaked (never closed twice) only writes to it.
    let mut report = unsafe { File::from_raw_fd(ERROR_FD) };
    if report.write_all(message.as_bytes()).is_err() {
        eprintln!("{message}");
    }
    std::mem::forget(report);
    std::process::exit(128);
}

fn container(args: &[String]) -> Result<std::convert::Infallible> {
    let path = args.first().context("__container needs the spec file")?;
    let spec: ContainerSpec = serde_json::from_slice(&fs::read(path)?)?;
    mark_error_fd_cloexec();
    // Its own session and process group: the stand-in signals the whole group.
    // SAFETY: setsid(2) has no preconditions.
    unsafe { libc::setsid() };
    if let Some(netns) = &spec.netns {
        let fd = sys::open(netns, libc::O_RDONLY)?;
        sys::setns(&fd, libc::CLONE_NEWNET, netns)?;
    }
    sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC)?;
    sys::make_rslave()?;
    let options = format!(
        "lowerdir=/,upperdir={},workdir={}",
        spec.upper.display(),
        spec.work.display()
    );
    sys::mount(
        Some(Path::new("overlay")),
        &spec.rootfs,
        Some("overlay"),
        0,
        Some(&options),
    )?;
    let root = &spec.rootfs;
    for dir in ["proc", "dev"] {
        let target = super::hostfs::mkdir_in(root, Path::new(dir))?;
        sys::bind(&Path::new("/").join(dir), &target, false)?;
    }
    let sysfs = super::hostfs::mkdir_in(root, Path::new("sys"))?;
    let ro = if spec.read_only_sys {
        libc::MS_RDONLY
    } else {
        0
    };
    sys::mount(Some(Path::new("sysfs")), &sysfs, Some("sysfs"), ro, None)?;
    for dir in ["tmp", "run"] {
        let target = super::hostfs::mkdir_in(root, Path::new(dir))?;
        sys::mount(
            Some(Path::new("tmpfs")),
            &target,
            Some("tmpfs"),
            0,
            Some("mode=1777"),
        )?;
    }
    // Sources are opened before the chroot (they are outside the new root) and mounted from
    // /proc/self/fd after it, so that the targets, created in the new root, resolve there
    // (an absolute link such as /var/run -> /run points into the container, not the machine).
    let sources = spec
        .mounts
        .iter()
        .map(|m| {
            sys::open(&m.source, libc::O_PATH)
                .with_context(|| format!("volume source {}", m.source.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    sys::chroot(root)?;
    for (m, fd) in spec.mounts.iter().zip(&sources) {
        let is_dir = fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))?.is_dir();
        if is_dir {
            fs::create_dir_all(&m.target)
                .with_context(|| format!("creating mount point {}", m.target.display()))?;
        } else {
            if let Some(parent) = m.target.parent() {
                fs::create_dir_all(parent)?;
            }
            if !m.target.exists() {
                File::create(&m.target)
                    .with_context(|| format!("creating mount point {}", m.target.display()))?;
            }
        }
        let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        sys::bind(&source, &m.target, m.read_only).with_context(|| {
            format!("mounting {} at {}", m.source.display(), m.target.display())
        })?;
    }
    drop(sources);
    let host = CString::new(spec.hostname.as_bytes())?;
    // SAFETY: a buffer and its length.
    if unsafe { libc::sethostname(host.as_ptr(), spec.hostname.len()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("sethostname");
    }
    if !Path::new(&spec.cwd).exists() {
        fs::create_dir_all(&spec.cwd)?;
    }
    become_user(spec.uid, spec.gid, &spec.groups)?;
    std::env::set_current_dir(&spec.cwd).with_context(|| format!("workingDir {}", spec.cwd))?;
    execute(&spec.argv, &spec.env)
}

/// `__exec PID UID GID CWD -- ARGV...`, environment as given: joins the container of PID.
fn exec_in(args: &[String]) -> Result<std::convert::Infallible> {
    let [pid, uid, gid, cwd, dashes, argv @ ..] = args else {
        bail!("__exec PID UID GID CWD -- ARGV...");
    };
    if dashes != "--" || argv.is_empty() {
        bail!("__exec PID UID GID CWD -- ARGV...");
    }
    mark_error_fd_cloexec();
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let root = sys::open(&proc.join("root"), libc::O_PATH | libc::O_DIRECTORY)?;
    for (ns, flag) in [
        ("ipc", libc::CLONE_NEWIPC),
        ("uts", libc::CLONE_NEWUTS),
        ("net", libc::CLONE_NEWNET),
        ("mnt", libc::CLONE_NEWNS),
    ] {
        let path = proc.join("ns").join(ns);
        let fd = sys::open(&path, libc::O_RDONLY)?;
        sys::setns(&fd, flag, &path)?;
    }
    // SAFETY: fchdir on a descriptor we own.
    if unsafe { libc::fchdir(root.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("entering the container's root");
    }
    sys::chroot(Path::new("."))?;
    become_user(uid.parse()?, gid.parse()?, &[])?;
    let _ = std::env::set_current_dir(cwd);
    let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    execute(argv, &env)
}

fn mark_error_fd_cloexec() {
    // SAFETY: fcntl on descriptor 3; harmless when it is not open.
    unsafe {
        libc::fcntl(ERROR_FD, libc::F_SETFD, libc::FD_CLOEXEC);
    }
}

fn become_user(uid: u32, gid: u32, groups: &[u32]) -> Result<()> {
    // SAFETY: setgroups takes a length and a pointer to that many gids; setgid and setuid
    // take ids.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error()).context("setgroups");
        }
        if libc::setgid(gid) != 0 {
            return Err(std::io::Error::last_os_error()).context("setgid");
        }
        if libc::setuid(uid) != 0 {
            return Err(std::io::Error::last_os_error()).context("setuid");
        }
    }
    Ok(())
}

/// execve(2) of `argv` with `env`, looking a bare name up in the environment's PATH.
fn execute(argv: &[String], env: &[String]) -> Result<std::convert::Infallible> {
    let program = argv.first().context("no command to run")?;
    // The stand-in (a Rust program) ignores SIGPIPE; the container starts with every signal
    // at its default and none blocked, as a runtime starts it.
    // SAFETY: signal(2) with SIG_DFL and sigprocmask with an empty set.
    unsafe {
        for sig in 1..32 {
            libc::signal(sig, libc::SIG_DFL);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let cenv: Vec<CString> = env
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut argp: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = cenv.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        let path = env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        path.split(':')
            .map(|d| Path::new(d).join(program))
            .collect()
    };
    let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
    for candidate in &candidates {
        let c = CString::new(candidate.as_os_str().as_bytes())?;
        // SAFETY: NUL-terminated strings in null-terminated arrays, alive across the call.
        unsafe { libc::execve(c.as_ptr(), argp.as_ptr(), envp.as_ptr()) };
        last = std::io::Error::last_os_error();
    }
    Err(last).with_context(|| {
        format!("exec: {program:?}: executable file not found or not runnable in the container")
    })
}
