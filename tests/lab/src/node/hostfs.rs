//! The node's host filesystem. The node's own directories live under its root directory
//! (`--root`); what runs "on the node" (CNI plugins) sees them at their real paths, in a mount
//! namespace of the node's that never touches the machine's mounts:
//!
//! * an overlay whose lower layer is the machine's `/` (the node's operating system) and whose
//!   upper layer is under the root directory (writes stay the node's), mounted at
//!   `<root>/.lab/rootfs`;
//! * the node's directories bound over their paths in it (`/etc/cni/net.d`, `/opt/cni/bin`,
//!   `/var/lib/cni`, `/var/lib/allot`, `/var/lib/kubelet`, `/var/log`, `/run`), the machine's
//!   `/run/netns` inside the node's `/run` (pods' network namespaces, as `ip netns` pins
//!   them), `/proc`, `/dev`, a `/sys` of the node's network namespace;
//! * processes enter that namespace and chroot into the overlay before they execute.
//!
//! The namespace is made once, by a thread that unshares its filesystem attributes and mount
//! namespace (unshare(2): CLONE_FS | CLONE_NEWNS), and kept alive by a descriptor; slave
//! propagation (mount_namespaces(7)) keeps it receiving the machine's new `/run/netns` entries
//! while sending nothing back.
//!
//! A real node ([`crate::realnode`], containerd and the kubelet) gets more of its own: its
//! `/var/lib/containerd` (a real filesystem: overlayfs, containerd's snapshotter, cannot stack
//! on the view's overlay) and `/etc/containerd`, the machine's cgroup hierarchies under
//! `/sys/fs/cgroup`, and its own `/run/netns` (containerd pins its pods' network namespaces
//! there). Its view is made shared within the node (still a slave of the machine), so that a
//! pod's `Bidirectional` mount propagation works as on a real node.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::sys;

/// The node's directories (relative to its root), bound at their paths in the node's view.
pub const NODE_DIRS: [&str; 7] = [
    "etc/cni/net.d",
    "opt/cni/bin",
    "var/lib/cni",
    "var/lib/allot",
    "var/lib/kubelet",
    "var/log",
    "run",
];

/// What only a real node's view has (see the module's documentation).
pub const REAL_NODE_DIRS: [&str; 3] = ["var/lib/containerd", "etc/containerd", "etc/kubernetes"];

/// Where Debian's CNI plugins are; a node image would ship them in `/opt/cni/bin`.
const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";

/// Which node a view is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewKind {
    /// The kubelet stand-in's: pods' network namespaces are the machine's `/run/netns`.
    StandIn,
    /// containerd's and the kubelet's (see the module's documentation).
    Real,
}

/// The node's filesystem: its root directory and its mount namespace.
#[derive(Debug)]
pub struct NodeFs {
    pub root: PathBuf,
    /// The overlay the node's processes chroot into (a path of the node's mount namespace).
    view: PathBuf,
    view_c: std::ffi::CString,
    mnt_ns: OwnedFd,
}

impl NodeFs {
    /// Creates the node's directories and its mount namespace. Call it from the node's network
    /// namespace (the namespace's `/sys` shows that one's interfaces).
    pub fn setup(root: &Path) -> Result<NodeFs> {
        NodeFs::setup_in(root, None, ViewKind::StandIn)
    }

    /// The same, from any thread: the namespace is made on a thread that enters the node's
    /// network namespace `netns` first (when given), for a view of `kind`.
    pub fn setup_in(root: &Path, netns: Option<&Path>, kind: ViewKind) -> Result<NodeFs> {
        for dir in NODE_DIRS {
            fs::create_dir_all(root.join(dir))?;
        }
        if kind == ViewKind::Real {
            for dir in REAL_NODE_DIRS {
                fs::create_dir_all(root.join(dir))?;
            }
        }
        for dir in [
            "run/allot",
            "run/netns",
            ".lab/upper",
            ".lab/work",
            ".lab/rootfs",
        ] {
            fs::create_dir_all(root.join(dir))?;
        }
        install_cni_plugins(&root.join("opt/cni/bin"))?;
        let view = root.join(".lab/rootfs");
        let (root2, view2) = (root.to_path_buf(), view.clone());
        let netns = netns.map(Path::to_path_buf);
        let mnt_ns = std::thread::spawn(move || {
            if let Some(netns) = &netns {
                let fd = sys::open(netns, libc::O_RDONLY)?;
                sys::setns(&fd, libc::CLONE_NEWNET, netns)?;
            }
            make_namespace(&root2, &view2, kind)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the mount namespace thread panicked"))??;
        Ok(NodeFs {
            root: root.to_path_buf(),
            view_c: sys::cstring(&view)?,
            view,
            mnt_ns,
        })
    }

    /// The node's path `path` (absolute, as a pod's hostPath names it) in the machine's view:
    /// under the root directory, except `/proc`, `/sys` and `/dev`, which the node shares with
    /// the machine (one kernel).
    pub fn host_path(&self, path: &str) -> Result<PathBuf> {
        let rel = Path::new(path);
        if !rel.is_absolute() || rel.components().any(|c| c == Component::ParentDir) {
            bail!("hostPath {path:?}: must be an absolute path without '..'");
        }
        let first = rel.components().nth(1).map(|c| c.as_os_str().to_owned());
        if first.is_some_and(|f| f == "proc" || f == "sys" || f == "dev") {
            return Ok(rel.to_path_buf());
        }
        // Pods' network namespaces are the machine's, bound at /run/netns in the node's view
        // (see the module's documentation): a pod mounting them sees them as the node does.
        if rel.starts_with("/run/netns") || rel.starts_with("/var/run/netns") {
            return Ok(Path::new("/run/netns").join(
                rel.strip_prefix("/var/run/netns")
                    .or_else(|_| rel.strip_prefix("/run/netns"))?,
            ));
        }
        Ok(self.root.join(rel.strip_prefix("/")?))
    }

    /// A command that runs `program` (a path of the node's view) on the node: in its mount
    /// namespace, chrooted into its view, in its network namespace (the stand-in's own).
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        let ns = self.mnt_ns.as_raw_fd();
        let view = self.view_c.clone();
        // SAFETY: runs between fork and exec; setns, chroot and chdir are async-signal-safe and
        // use only values made before the fork (the descriptor outlives the child's start, as
        // the NodeFs owning it lives as long as the stand-in).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns, libc::CLONE_NEWNS) != 0
                    || libc::chroot(view.as_ptr()) != 0
                    || libc::chdir(c"/".as_ptr()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// The node's view directory (where its overlay is mounted, in its namespace).
    pub fn view(&self) -> &Path {
        &self.view
    }

    /// What a process needs to run on the node: its mount namespace and view (see
    /// [`crate::process::Supervised::on_node`]).
    pub fn entry(&self) -> Result<crate::process::NodeEntry> {
        Ok(crate::process::NodeEntry {
            mnt_ns: std::sync::Arc::new(self.mnt_ns.try_clone()?),
            view: self.view_c.clone(),
        })
    }
}

/// Links Debian's plugins into the node's `/opt/cni/bin` (kept if already there: a plugin
/// installed by a pod, such as allot's, replaces its link with a file).
fn install_cni_plugins(bin: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(SYSTEM_CNI_DIR) else {
        bail!(
            "{SYSTEM_CNI_DIR} is missing: install Debian's containernetworking-plugins (the \
             nodes' CNI plugins)"
        );
    };
    for entry in entries {
        let entry = entry?;
        let dest = bin.join(entry.file_name());
        if dest.symlink_metadata().is_err() {
            symlink(entry.path(), &dest).with_context(|| format!("linking {}", dest.display()))?;
        }
    }
    Ok(())
}

/// Runs on its own thread: unshares, mounts the node's view, returns the namespace.
fn make_namespace(root: &Path, view: &Path, kind: ViewKind) -> Result<OwnedFd> {
    sys::unshare(libc::CLONE_FS | libc::CLONE_NEWNS)?;
    sys::make_rslave()?;
    let options = format!(
        "lowerdir=/,upperdir={},workdir={}",
        root.join(".lab/upper").display(),
        root.join(".lab/work").display()
    );
    sys::mount(
        Some(Path::new("overlay")),
        view,
        Some("overlay"),
        0,
        Some(&options),
    )
    .context("the node's root overlay (is overlayfs available?)")?;
    let own: &[&str] = match kind {
        ViewKind::StandIn => &[],
        ViewKind::Real => &REAL_NODE_DIRS,
    };
    for dir in NODE_DIRS.iter().chain(own) {
        let target = mkdir_in(view, Path::new(dir))?;
        sys::bind(&root.join(dir), &target, false)?;
    }
    if kind == ViewKind::StandIn {
        let netns = mkdir_in(view, Path::new("run/netns"))?;
        fs::create_dir_all("/run/netns")?;
        sys::bind(Path::new("/run/netns"), &netns, false)?;
    }
    for dir in ["proc", "dev"] {
        let target = mkdir_in(view, Path::new(dir))?;
        sys::bind(&Path::new("/").join(dir), &target, false)?;
    }
    let sysfs = mkdir_in(view, Path::new("sys"))?;
    sys::mount(Some(Path::new("sysfs")), &sysfs, Some("sysfs"), 0, None)?;
    if kind == ViewKind::Real {
        sys::bind(Path::new("/sys/fs/cgroup"), &sysfs.join("fs/cgroup"), false)?;
    }
    let tmp = mkdir_in(view, Path::new("tmp"))?;
    sys::mount(
        Some(Path::new("tmpfs")),
        &tmp,
        Some("tmpfs"),
        0,
        Some("mode=1777"),
    )?;
    if kind == ViewKind::Real {
        sys::mount(None, view, None, libc::MS_REC | libc::MS_SHARED, None)?;
    }
    sys::open(Path::new("/proc/thread-self/ns/mnt"), libc::O_RDONLY)
}

/// Creates `rel` below `root` without following symbolic links (one in the machine's tree
/// could lead outside the overlay); returns the full path.
pub fn mkdir_in(root: &Path, rel: &Path) -> Result<PathBuf> {
    let mut path = root.to_path_buf();
    for component in rel.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        path.push(name);
        match path.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => bail!(
                "{}: a symbolic link in the machine's tree; the lab does not create mount \
                 points through links",
                path.display()
            ),
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!("{}: exists and is not a directory", path.display()),
            Err(_) => {
                fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?
            }
        }
    }
    Ok(path)
}
