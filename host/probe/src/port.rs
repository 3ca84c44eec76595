//! A macvlan child of a master link, made for probing ahead: a probe sent from a macvlan
//! master itself never reaches the master's own macvlan children on this node (the kernel
//! hands frames the master transmits to the wire only), so a pod's view of the segment (the
//! wire, and in bridge mode its sibling macvlans) is had only from a sibling. The port is
//! created down, without IPv6 address generation and with ARP off, then set up: it holds no address and sends
//! nothing but the probes written to it (no router solicitations, no duplicate address
//! detection of a link-local address, no ARP replies). A link of its name left by a killed
//! agent is replaced, if it is a macvlan of the same master. Made with one rtnetlink request, through
//! libc like the packet sockets.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::ProbeError;

/// rtnetlink, as `linux/rtnetlink.h` and `linux/if_link.h` number it.
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_MACVLAN_MODE: u16 = 1;
const MACVLAN_MODE_BRIDGE: u32 = 4;
const IFLA_AF_SPEC: u16 = 26;
const IFLA_INET6_ADDR_GEN_MODE: u16 = 8;
const IN6_ADDR_GEN_MODE_NONE: u8 = 1;

/// The name of the probe port on the master with interface index `master_index`
/// (`allotp` and the index: at most 15 bytes, unique per master).
pub fn macvlan_port_name(master_index: u32) -> String {
    format!("allotp{master_index}")
}

/// A probe port, removed when dropped.
#[derive(Debug)]
pub struct MacvlanPort {
    name: String,
}

impl MacvlanPort {
    /// Creates the probe port of `master` (a port of that name left by an earlier agent is
    /// replaced), in bridge mode, up, without IPv6 or ARP.
    pub fn create(master: &str) -> Result<MacvlanPort, ProbeError> {
        let err = |op: &'static str| move |e: io::Error| ProbeError::io(op, master, e);
        let master_index = if_index(master).ok_or_else(|| ProbeError::NoSuchLink {
            ifname: master.to_owned(),
        })?;
        let name = macvlan_port_name(master_index);
        if let Some(stale) = if_index(&name) {
            // Left by an agent that was killed: replaced, but only if it is a macvlan of this
            // master, never anything else.
            let (kind, lower) = link_info(stale).map_err(err("inspecting a stale probe port"))?;
            if kind.as_deref() != Some("macvlan") || lower != Some(master_index) {
                return Err(ProbeError::io(
                    "creating a macvlan probe port",
                    master,
                    io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!(
                            "a link named {name} exists and is not a macvlan of {master}: \
                             rename it"
                        ),
                    ),
                ));
            }
            request(RTM_DELLINK, 0, stale, 0, &[]).map_err(err("removing a stale probe port"))?;
        }
        let mut attrs = Vec::new();
        push_attr(&mut attrs, IFLA_IFNAME, &nul_terminated(&name));
        push_attr(&mut attrs, IFLA_LINK, &master_index.to_ne_bytes());
        let mut data = Vec::new();
        push_attr(
            &mut data,
            IFLA_MACVLAN_MODE,
            &MACVLAN_MODE_BRIDGE.to_ne_bytes(),
        );
        let mut info = Vec::new();
        push_attr(&mut info, IFLA_INFO_KIND, b"macvlan\0");
        push_attr(&mut info, IFLA_INFO_DATA, &data);
        push_attr(&mut attrs, IFLA_LINKINFO, &info);
        // Down, ARP off: set up only once IPv6 is off below.
        let noarp = libc::IFF_NOARP as u32;
        request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0, noarp, &attrs)
            .map_err(err("creating a macvlan probe port"))?;
        let port = MacvlanPort { name };
        // No IPv6 address generation on the port: without a link-local address it sends no
        // duplicate address detection and no router solicitation (asked through rtnetlink,
        // which works where /proc/sys is read-only). Without IPv6 in the kernel there is
        // nothing to turn off.
        let index = if_index(&port.name).ok_or_else(|| ProbeError::NoSuchLink {
            ifname: port.name.clone(),
        })?;
        let mut inet6 = Vec::new();
        push_attr(
            &mut inet6,
            IFLA_INET6_ADDR_GEN_MODE,
            &[IN6_ADDR_GEN_MODE_NONE],
        );
        let mut af = Vec::new();
        push_attr(&mut af, libc::AF_INET6 as u16, &inet6);
        let mut attrs = Vec::new();
        push_attr(&mut attrs, IFLA_AF_SPEC, &af);
        match request(RTM_NEWLINK, 0, index, noarp, &attrs) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAFNOSUPPORT | libc::EOPNOTSUPP)
                ) => {}
            other => other.map_err(|e| {
                ProbeError::io(
                    "turning IPv6 addresses off on the probe port",
                    &port.name,
                    e,
                )
            })?,
        }
        set_up(&port.name)
            .map_err(|e| ProbeError::io("setting the probe port up", &port.name, e))?;
        Ok(port)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for MacvlanPort {
    fn drop(&mut self) {
        if let Some(index) = if_index(&self.name) {
            let _ = request(RTM_DELLINK, 0, index, 0, &[]);
        }
    }
}

fn if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Appends one rtattr (length, type, payload, padding to 4 bytes).
fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (len.next_multiple_of(4) - len), 0);
}

/// The kind of link `name` is (`bridge`, `macvlan`, `veth`, …; `None` for a physical one),
/// or `None` when there is no such link, as rtnetlink reports it.
pub fn link_kind(name: &str) -> Option<Option<String>> {
    let index = if_index(name)?;
    link_info(index).ok().map(|(kind, _)| kind)
}

/// The kind (`IFLA_INFO_KIND`) and lower link (`IFLA_LINK`) of interface `index`.
fn link_info(index: u32) -> io::Result<(Option<String>, Option<u32>)> {
    let reply = exchange(RTM_GETLINK, 0, index, 0, &[])?;
    // nlmsghdr, ifinfomsg, then the attributes.
    let attrs = reply.get(32..).unwrap_or_default();
    let (mut kind, mut lower) = (None, None);
    for (t, payload) in attributes(attrs) {
        match t {
            IFLA_LINK if payload.len() >= 4 => {
                lower = Some(u32::from_ne_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]));
            }
            IFLA_LINKINFO => {
                for (t, payload) in attributes(payload) {
                    if t == IFLA_INFO_KIND {
                        let name = payload.split(|&b| b == 0).next().unwrap_or_default();
                        kind = Some(String::from_utf8_lossy(name).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    Ok((kind, lower))
}

/// The (type, payload) of each rtattr in `buf`.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((kind, payload))
    })
}

/// One rtnetlink link request (an `ifinfomsg` for interface `index` with `flags` set, then
/// `attrs`), and its acknowledgement.
fn request(kind: u16, extra: u16, index: u32, flags: u32, attrs: &[u8]) -> io::Result<()> {
    exchange(kind, NLM_F_ACK | extra, index, flags, attrs).map(drop)
}

/// Sends one rtnetlink link message and returns the kernel's answer: the acknowledgement (or
/// error) of a change, the link of a `RTM_GETLINK`.
fn exchange(kind: u16, extra: u16, index: u32, flags: u32, attrs: &[u8]) -> io::Result<Vec<u8>> {
    let mut msg = Vec::with_capacity(32 + attrs.len());
    let len = 16 + 16 + attrs.len();
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | extra).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
    // ifinfomsg: family, padding, type, index, flags, change mask.
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    msg.extend_from_slice(&(index as i32).to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(attrs);
    // SAFETY: plain socket(2); owned at once.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_nl is plain old data; zero pid and groups address the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: `msg` and `kernel` are valid for the lengths passed.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let reply = &buf[..n as usize];
        if reply.len() < 20 {
            continue;
        }
        match u16::from_ne_bytes([reply[4], reply[5]]) {
            NLMSG_ERROR => {
                let code = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
                return if code == 0 {
                    Ok(reply.to_vec())
                } else {
                    Err(io::Error::from_raw_os_error(-code))
                };
            }
            RTM_NEWLINK if kind == RTM_GETLINK => return Ok(reply.to_vec()),
            _ => {}
        }
    }
}

fn set_up(name: &str) -> io::Result<()> {
    // SAFETY: plain socket(2); owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let ctl = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS on a valid ifreq.
    unsafe {
        if libc::ioctl(ctl.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(ctl.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
