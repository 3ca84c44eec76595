//! A raw `AF_PACKET` socket on one interface, through libc: open with a BPF filter attached
//! before it is bound (so no unfiltered frame is ever queued), multicast memberships, sends,
//! and receives against a deadline that survive EINTR and never see the socket's own frames.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::thread;
use std::time::Instant;

use libc::{c_int, c_void, sock_filter, sockaddr_ll, socklen_t};

use crate::frame::MacAddr;

pub(crate) struct PacketSocket {
    fd: OwnedFd,
    ifindex: c_int,
}

fn check(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn link_addr(ifindex: c_int, protocol: u16) -> sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all zeroes is a valid value.
    let mut sa: sockaddr_ll = unsafe { mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = protocol.to_be();
    sa.sll_ifindex = ifindex;
    sa
}

fn setsockopt<T>(fd: &OwnedFd, level: c_int, name: c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T of the size passed.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast::<c_void>(),
            mem::size_of::<T>() as socklen_t,
        )
    })
    .map(drop)
}

impl PacketSocket {
    /// A socket on `ifindex` that receives frames of `ethertype` that pass `filter`.
    pub fn open(ifindex: c_int, ethertype: u16, filter: &[sock_filter]) -> io::Result<Self> {
        // Protocol 0: the socket receives nothing until it is bound to an ethertype below,
        // after the filter is in place.
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = check(unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let sock = PacketSocket {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            ifindex,
        };
        sock.set_filter(filter)?;
        let sa = link_addr(ifindex, ethertype);
        // SAFETY: `sa` is a valid sockaddr_ll of the size passed.
        check(unsafe {
            libc::bind(
                sock.fd.as_raw_fd(),
                (&sa as *const sockaddr_ll).cast(),
                mem::size_of::<sockaddr_ll>() as socklen_t,
            )
        })?;
        Ok(sock)
    }

    /// Attaches `filter`, replacing the one before: frames that arrive from now on pass the
    /// new one (frames already queued passed the old one).
    pub fn set_filter(&self, filter: &[sock_filter]) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr().cast_mut(),
        };
        setsockopt(&self.fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
    }

    /// Receive frames sent to the multicast `group` too, for as long as the socket is open
    /// (the interface's own IPv6 stack may not have joined it: IPv6 off, or link just raised).
    pub fn join(&self, group: MacAddr) -> io::Result<()> {
        // SAFETY: packet_mreq is plain old data.
        let mut mreq: libc::packet_mreq = unsafe { mem::zeroed() };
        mreq.mr_ifindex = self.ifindex;
        mreq.mr_type = libc::PACKET_MR_MULTICAST as u16;
        mreq.mr_alen = 6;
        mreq.mr_address[..6].copy_from_slice(&group.0);
        setsockopt(
            &self.fd,
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
        )
    }

    /// Sends one whole Ethernet frame (its destination is the frame's first six bytes).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        let mut sa = link_addr(self.ifindex, 0);
        sa.sll_halen = 6;
        sa.sll_addr[..6].copy_from_slice(&frame[..6]);
        loop {
            // SAFETY: `frame` and `sa` are valid for the lengths passed.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&sa as *const sockaddr_ll).cast(),
                    mem::size_of::<sockaddr_ll>() as socklen_t,
                )
            };
            if n >= 0 {
                return if n as usize == frame.len() {
                    Ok(())
                } else {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "short send"))
                };
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// The next frame that arrived from the network before `deadline`, into `buf`: its length,
    /// or `None` once the deadline has passed. A signal (EINTR) neither ends the wait early nor
    /// extends it; frames this host sent are skipped.
    pub fn recv(&self, buf: &mut [u8], deadline: Instant) -> io::Result<Option<usize>> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // Round up, so that the last fraction of a millisecond is waited for, not spun.
            let ms = (deadline - now)
                .as_micros()
                .div_ceil(1000)
                .min(i32::MAX as u128) as c_int;
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, ms) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if pfd.revents == 0 {
                continue;
            }
            // POLLIN, or POLLERR (e.g. ENETDOWN when the link goes down): recvfrom returns the
            // frame or the pending error.
            // SAFETY: sockaddr_ll is plain old data.
            let mut from: sockaddr_ll = unsafe { mem::zeroed() };
            let mut len = mem::size_of::<sockaddr_ll>() as socklen_t;
            // SAFETY: `buf` and `from` are valid for the lengths passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => continue,
                    _ => return Err(e),
                }
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(n as usize));
        }
    }
}

/// Closes sockets on a thread of their own. Closing an `AF_PACKET` socket waits for an RCU
/// grace period (`synchronize_net`: 8 to 16 ms here) and nothing needs to wait for it; if no
/// thread can be started, they close here.
pub(crate) fn close_in_background(sockets: impl IntoIterator<Item = Option<PacketSocket>>) {
    let sockets: Vec<PacketSocket> = sockets.into_iter().flatten().collect();
    if sockets.is_empty() {
        return;
    }
    let _ = thread::Builder::new()
        .name("allot-probe-close".to_owned())
        .spawn(move || drop(sockets));
}
