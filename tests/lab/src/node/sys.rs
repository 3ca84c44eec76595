//! Thin wrappers of the namespace and mount system calls, with the path in every error.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{Context, Result};

pub fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{}: a path with a NUL byte", path.display()))
}

fn check(ret: libc::c_int, what: impl FnOnce() -> String) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error()).with_context(what)
    }
}

/// mount(2). `source`, `fstype` and `data` may be absent.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<()> {
    let src = source.map(cstring).transpose()?;
    let tgt = cstring(target)?;
    let fs = fstype.map(CString::new).transpose()?;
    let dat = data.map(CString::new).transpose()?;
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            fs.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            dat.as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast::<libc::c_void>()),
        )
    };
    check(ret, || {
        format!(
            "mount {} on {} ({})",
            source.map_or("-".into(), |s| s.display().to_string()),
            target.display(),
            fstype.unwrap_or("bind")
        )
    })
}

/// A bind mount of `source` on `target` (recursive), read-only when asked.
pub fn bind(source: &Path, target: &Path, read_only: bool) -> Result<()> {
    mount(
        Some(source),
        target,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )?;
    if read_only {
        // A bind mount takes the read-only flag only on a remount (mount(2), "MS_REMOUNT").
        mount(
            None,
            target,
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_REC,
            None,
        )?;
    }
    Ok(())
}

/// Makes every mount below `/` a slave of the parent namespace's: nothing mounted here
/// propagates back to the machine.
pub fn make_rslave() -> Result<()> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
    )
}

pub fn unshare(flags: libc::c_int) -> Result<()> {
    // SAFETY: unshare(2) takes flags only.
    check(unsafe { libc::unshare(flags) }, || {
        format!("unshare({flags:#x})")
    })
}

/// Opens a namespace file (or any path) read-only, close-on-exec.
pub fn open(path: &Path, flags: libc::c_int) -> Result<OwnedFd> {
    let c = cstring(path)?;
    // SAFETY: a NUL-terminated path; the returned descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("open {}", path.display()));
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Enters the namespace of `fd` (`nstype` one of CLONE_NEW*).
pub fn setns(fd: &OwnedFd, nstype: libc::c_int, what: &Path) -> Result<()> {
    // SAFETY: setns(2) on a descriptor we own.
    check(unsafe { libc::setns(fd.as_raw_fd(), nstype) }, || {
        format!("entering the namespace {}", what.display())
    })
}

pub fn chroot(path: &Path) -> Result<()> {
    let c = cstring(path)?;
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::chroot(c.as_ptr()) }, || {
        format!("chroot {}", path.display())
    })?;
    std::env::set_current_dir("/").context("chdir / after chroot")
}
