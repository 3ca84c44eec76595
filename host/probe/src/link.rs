//! The pod's interface, seen from the probe thread inside its namespace: index, MAC, link
//! state (raised for the probes if it was down, and set down again afterwards), and the probes
//! themselves, one at a time.

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use libc::{c_int, c_short};

use crate::frame::{self, MacAddr, Neighbor};
use crate::socket::{self, PacketSocket};
use crate::{GatewayOutcome, ProbeConfig, ProbeError, ProbeOutcome, bpf};

/// How long to let a link that was just raised settle before the first probe. Raising a veth
/// gives both ends a carrier at once, but the far end (the node's end, on the bridge) starts
/// to transmit only once the kernel's link watcher has run, asynchronously: without a pause,
/// 8 to 33 raises in 100 lost the first answer here (found by the next try, 100 ms later);
/// after 200 µs, none did.
const RAISE_SETTLE: Duration = Duration::from_millis(2);

/// One interface inside the probe thread's namespace. Obtained from [`crate::with_link`];
/// its `&mut self` methods make the probes on it sequential.
pub struct Link {
    name: String,
    index: c_int,
    mac: MacAddr,
    /// An `AF_INET` datagram socket: the handle for the interface ioctls.
    ctl: OwnedFd,
    /// Whether this `Link` set the interface up, and so must set it down again.
    raised: bool,
    cfg: ProbeConfig,
    /// One packet socket per family, opened on first use and kept for the `Link`'s life: each
    /// probe only swaps its filter, since closing one waits for an RCU grace period.
    arp: Option<PacketSocket>,
    ndp: Option<PacketSocket>,
}

/// What answered a solicitation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// A host that uses the address: an ARP packet with it as sender, a Neighbor
    /// Advertisement for it, or a Neighbor Solicitation from it.
    Holder(MacAddr),
    /// Another host probing for the address right now (RFC 5227 §2.1.1, RFC 4862 §5.4.3).
    Prober(MacAddr),
}

/// What `frame` says about `target`, to a prober whose MAC is `own`; `None` when nothing.
pub(crate) fn classify(own: MacAddr, target: IpAddr, frame: &[u8]) -> Option<Evidence> {
    match (frame::parse(frame)?, target) {
        (
            Neighbor::Arp {
                op, sha, spa, tpa, ..
            },
            IpAddr::V4(t),
        ) => {
            if spa == t {
                Some(Evidence::Holder(sha))
            } else if op == frame::ARP_REQUEST && spa.is_unspecified() && tpa == t && sha != own {
                Some(Evidence::Prober(sha))
            } else {
                None
            }
        }
        (
            Neighbor::Advertisement {
                eth_src,
                target,
                target_ll,
                ..
            },
            IpAddr::V6(t),
        ) if target == t => Some(Evidence::Holder(target_ll.unwrap_or(eth_src))),
        (
            Neighbor::Solicitation {
                eth_src,
                src,
                target,
                source_ll,
            },
            IpAddr::V6(t),
        ) => {
            if src == t {
                Some(Evidence::Holder(source_ll.unwrap_or(eth_src)))
            } else if src.is_unspecified() && target == t && eth_src != own {
                Some(Evidence::Prober(eth_src))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Only a unicast address can be held by one host, or be a gateway.
pub(crate) fn check_unicast(addr: IpAddr) -> Result<(), ProbeError> {
    let why = if addr.is_unspecified() {
        "it is the unspecified address"
    } else if addr.is_loopback() {
        "it is a loopback address"
    } else if addr.is_multicast() {
        "it is a multicast address"
    } else if addr == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
        "it is the broadcast address"
    } else {
        return Ok(());
    };
    Err(ProbeError::Address { addr, why })
}

/// An `ifreq` naming `name`; `None` when the name cannot be an interface name.
fn ifreq(name: &str) -> Option<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return None;
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    Some(req)
}

/// An interface ioctl on the control socket.
fn ioctl(ctl: &OwnedFd, op: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `req` is a valid ifreq for the interface ioctls this module makes, and any
    // memory it points to (ethtool's) outlives the call.
    if unsafe { libc::ioctl(ctl.as_raw_fd(), op, req as *mut libc::ifreq) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Link {
    /// Finds `name` in the current thread's namespace, checks it is Ethernet, and makes sure
    /// it is up with a carrier: a pod's interface (`netns` given) is raised if it was down; a
    /// link of the node's own namespace (`netns` `None`) is never changed, and being down is
    /// an error.
    pub(crate) fn open(
        netns: Option<&Path>,
        name: &str,
        cfg: ProbeConfig,
    ) -> Result<Link, ProbeError> {
        let no_such = || match netns {
            Some(netns) => ProbeError::NoSuchInterface {
                ifname: name.to_owned(),
                netns: netns.to_owned(),
            },
            None => ProbeError::NoSuchLink {
                ifname: name.to_owned(),
            },
        };
        let mut req = ifreq(name).ok_or_else(no_such)?;
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(ProbeError::io("opening a control socket", name, e));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let ctl = unsafe { OwnedFd::from_raw_fd(raw) };
        if let Err(e) = ioctl(&ctl, libc::SIOCGIFINDEX, &mut req) {
            return Err(match e.raw_os_error() {
                Some(libc::ENODEV) => no_such(),
                _ => ProbeError::io("looking up the interface", name, e),
            });
        }
        // SAFETY: SIOCGIFINDEX filled the index member.
        let index = unsafe { req.ifr_ifru.ifru_ifindex };
        ioctl(&ctl, libc::SIOCGIFHWADDR, &mut req)
            .map_err(|e| ProbeError::io("reading the MAC address", name, e))?;
        // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
        let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
        if hw.sa_family != libc::ARPHRD_ETHER {
            return Err(ProbeError::NotEthernet {
                ifname: name.to_owned(),
                hw_type: hw.sa_family,
            });
        }
        let d = hw.sa_data.map(|c| c as u8);
        let mut link = Link {
            name: name.to_owned(),
            index,
            mac: MacAddr([d[0], d[1], d[2], d[3], d[4], d[5]]),
            ctl,
            raised: false,
            cfg,
            arp: None,
            ndp: None,
        };
        let flags = link.flags()?;
        if flags & libc::IFF_UP as c_short == 0 && netns.is_none() {
            return Err(ProbeError::LinkDown {
                ifname: name.to_owned(),
            });
        }
        if flags & libc::IFF_UP as c_short == 0 {
            let mut req = link.ifreq();
            req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as c_short;
            ioctl(&link.ctl, libc::SIOCSIFFLAGS, &mut req)
                .map_err(link.io("setting the link up"))?;
            link.raised = true;
        }
        link.await_carrier()?;
        if link.raised {
            thread::sleep(RAISE_SETTLE);
        }
        Ok(link)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Whether the interface was down and this `Link` raised it for the probes.
    pub fn was_down(&self) -> bool {
        self.raised
    }

    fn ifreq(&self) -> libc::ifreq {
        ifreq(&self.name).expect("the name was checked when the link was opened")
    }

    fn flags(&self) -> Result<c_short, ProbeError> {
        let mut req = self.ifreq();
        ioctl(&self.ctl, libc::SIOCGIFFLAGS, &mut req)
            .map_err(self.io("reading the link flags"))?;
        // SAFETY: SIOCGIFFLAGS filled the flags member.
        Ok(unsafe { req.ifr_ifru.ifru_flags })
    }

    /// Whether the link has a carrier. ethtool's link state is the carrier itself (and asking
    /// for it makes the kernel apply this link's pending state change); every virtual link a
    /// pod gets (veth, macvlan, ipvlan) and most NIC drivers report it. `IFF_RUNNING`, the
    /// fallback, is the operational state, which the kernel's link watcher derives from the
    /// carrier asynchronously, for some links a second later.
    fn has_carrier(&self) -> Result<bool, ProbeError> {
        #[repr(C)]
        struct EthtoolValue {
            cmd: u32,
            data: u32,
        }
        const ETHTOOL_GLINK: u32 = 0x0a;
        let mut value = EthtoolValue {
            cmd: ETHTOOL_GLINK,
            data: 0,
        };
        let mut req = self.ifreq();
        req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        if ioctl(&self.ctl, libc::SIOCETHTOOL, &mut req).is_ok() {
            return Ok(value.data != 0);
        }
        Ok(self.flags()? & libc::IFF_RUNNING as c_short != 0)
    }

    /// Waits (up to `carrier_timeout`) until the link has a carrier: a probe sent without one
    /// goes nowhere and would report a taken address as free.
    fn await_carrier(&self) -> Result<(), ProbeError> {
        let start = Instant::now();
        loop {
            if self.has_carrier()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= self.cfg.carrier_timeout {
                return Err(ProbeError::NoCarrier {
                    ifname: self.name.clone(),
                    waited,
                });
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Sets the interface down again if this `Link` raised it; reports a failure.
    pub(crate) fn close(mut self) -> Result<(), ProbeError> {
        self.restore()
    }

    fn restore(&mut self) -> Result<(), ProbeError> {
        if !mem::take(&mut self.raised) {
            return Ok(());
        }
        let mut req = self.ifreq();
        ioctl(&self.ctl, libc::SIOCGIFFLAGS, &mut req)
            .and_then(|()| {
                // SAFETY: SIOCGIFFLAGS filled the flags member.
                unsafe { req.ifr_ifru.ifru_flags &= !(libc::IFF_UP as c_short) };
                ioctl(&self.ctl, libc::SIOCSIFFLAGS, &mut req)
            })
            .map_err(|source| ProbeError::LinkRestore {
                ifname: self.name.clone(),
                source,
            })
    }

    fn io(&self, op: &'static str) -> impl FnOnce(io::Error) -> ProbeError + '_ {
        move |e| ProbeError::io(op, &self.name, e)
    }

    /// Points the socket of `target`'s family at `target` (opening it on first use): it hears
    /// only what concerns `target` from now on.
    fn listen(&mut self, target: IpAddr) -> Result<(), ProbeError> {
        let (slot, ethertype, filter) = match target {
            IpAddr::V4(a) => (&mut self.arp, frame::ETHERTYPE_ARP, bpf::arp(a)),
            IpAddr::V6(a) => (&mut self.ndp, frame::ETHERTYPE_IPV6, bpf::ndp(a)),
        };
        let name = &self.name;
        let err = |op| move |e| ProbeError::io(op, name, e);
        let sock = match slot {
            Some(s) => {
                s.set_filter(&filter)
                    .map_err(err("setting the socket filter"))?;
                s
            }
            None => slot.insert(
                PacketSocket::open(self.index, ethertype, &filter)
                    .map_err(err("opening a packet socket"))?,
            ),
        };
        if let IpAddr::V6(a) = target {
            // Answers to a solicitation from :: go to every node; other probers' go to the
            // address's solicited-node group. Memberships last as long as the socket.
            for group in [frame::ALL_NODES, frame::solicited_node(a)] {
                sock.join(MacAddr::ipv6_multicast(group))
                    .map_err(err("joining a multicast group"))?;
            }
        }
        Ok(())
    }

    fn socket(&self, target: IpAddr) -> &PacketSocket {
        match target {
            IpAddr::V4(_) => self.arp.as_ref(),
            IpAddr::V6(_) => self.ndp.as_ref(),
        }
        .expect("listen() opened the family's socket")
    }

    /// Sends `tries` solicitations for `target` from the unspecified address, listening
    /// `timeout` after each (answers to an earlier try still count during a later one), and
    /// returns the first evidence `accept` takes.
    fn solicit(
        &mut self,
        target: IpAddr,
        accept: impl Fn(Evidence) -> bool,
    ) -> Result<Option<Evidence>, ProbeError> {
        check_unicast(target)?;
        self.listen(target)?;
        let sock = self.socket(target);
        let request = match target {
            IpAddr::V4(a) => frame::arp_probe(self.mac, a),
            IpAddr::V6(a) => frame::neighbor_solicitation(self.mac, Ipv6Addr::UNSPECIFIED, a),
        };
        let mut buf = [0u8; 2048];
        let (mut sent, mut send_error) = (0, None);
        for _ in 0..self.cfg.tries {
            match sock.send(&request) {
                Ok(()) => sent += 1,
                Err(e) => send_error = Some(e),
            }
            let deadline = Instant::now() + self.cfg.timeout;
            while let Some(n) = sock
                .recv(&mut buf, deadline)
                .map_err(self.io("receiving"))?
            {
                match classify(self.mac, target, &buf[..n]) {
                    Some(evidence) if accept(evidence) => return Ok(Some(evidence)),
                    _ => {}
                }
            }
        }
        match send_error {
            Some(source) if sent == 0 => Err(ProbeError::SendFailed {
                ifname: self.name.clone(),
                tries: self.cfg.tries,
                source,
            }),
            _ => Ok(None),
        }
    }

    /// Is `addr` used by another host on this link? ARP probe (IPv4) or duplicate address
    /// detection solicitation (IPv6), both from the unspecified address.
    pub fn probe_conflict(&mut self, addr: IpAddr) -> Result<ProbeOutcome, ProbeError> {
        Ok(match self.solicit(addr, |_| true)? {
            None => ProbeOutcome::Free,
            Some(Evidence::Holder(mac)) => ProbeOutcome::Conflict { mac },
            Some(Evidence::Prober(mac)) => ProbeOutcome::Contested { mac },
        })
    }

    /// Does `gateway` answer on this link? The same solicitation as a conflict probe: only the
    /// gateway's own answer counts.
    pub fn probe_gateway(&mut self, gateway: IpAddr) -> Result<GatewayOutcome, ProbeError> {
        let holder = |e: Evidence| matches!(e, Evidence::Holder(_));
        Ok(match self.solicit(gateway, holder)? {
            Some(Evidence::Holder(mac)) => GatewayOutcome::Reachable { mac },
            _ => GatewayOutcome::Unreachable,
        })
    }

    /// Tells the link that `addr` is at this interface's MAC: one gratuitous ARP (IPv4) or one
    /// unsolicited Neighbor Advertisement with Override set (IPv6).
    pub fn announce(&mut self, addr: IpAddr) -> Result<(), ProbeError> {
        check_unicast(addr)?;
        let frame = match addr {
            IpAddr::V4(a) => frame::arp_announcement(self.mac, a),
            IpAddr::V6(a) => frame::unsolicited_advertisement(self.mac, a),
        };
        self.listen(addr)?;
        self.socket(addr)
            .send(&frame)
            .map_err(self.io("sending the announcement"))
    }
}

impl Drop for Link {
    /// A `Link` dropped without `close` (its user returned early or panicked) still leaves the
    /// interface as it found it, as far as it can.
    fn drop(&mut self) {
        let _ = self.restore();
        socket::close_in_background([self.arp.take(), self.ndp.take()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::net::Ipv4Addr;

    const OWN: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const PEER: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const T4: Ipv4Addr = Ipv4Addr::new(10, 3, 0, 9);

    fn t6() -> Ipv6Addr {
        "fd00:3::9".parse().unwrap()
    }

    #[test]
    fn arp_evidence() {
        let t = IpAddr::V4(T4);
        let other = Ipv4Addr::new(10, 3, 0, 10);
        let reply = frame::arp(frame::ARP_REPLY, OWN, PEER, T4, OWN, Ipv4Addr::UNSPECIFIED);
        assert_eq!(classify(OWN, t, &reply), Some(Evidence::Holder(PEER)));
        let garp = frame::arp_announcement(PEER, T4);
        assert_eq!(classify(OWN, t, &garp), Some(Evidence::Holder(PEER)));
        let probe = frame::arp_probe(PEER, T4);
        assert_eq!(classify(OWN, t, &probe), Some(Evidence::Prober(PEER)));
        // Our own probe, heard back (a hairpinning bridge), is not another prober.
        assert_eq!(classify(OWN, t, &frame::arp_probe(OWN, T4)), None);
        // Someone resolving the address, and traffic about other addresses, say nothing.
        let resolve = frame::arp(
            frame::ARP_REQUEST,
            MacAddr::BROADCAST,
            PEER,
            other,
            MacAddr::ZERO,
            T4,
        );
        assert_eq!(classify(OWN, t, &resolve), None);
        assert_eq!(
            classify(OWN, t, &frame::arp_announcement(PEER, other)),
            None
        );
        assert_eq!(classify(OWN, t, &frame::arp_probe(PEER, other)), None);
        // ARP never answers for an IPv6 target.
        assert_eq!(classify(OWN, IpAddr::V6(t6()), &reply), None);
    }

    #[test]
    fn ndp_evidence() {
        let t = IpAddr::V6(t6());
        let other: Ipv6Addr = "fd00:3::10".parse().unwrap();
        let ll: Ipv6Addr = "fe80::2".parse().unwrap();
        let na = frame::unsolicited_advertisement(PEER, t6());
        assert_eq!(classify(OWN, t, &na), Some(Evidence::Holder(PEER)));
        // The target link-layer option names the holder, even when another MAC sent it
        // (a proxy).
        let mut proxied = frame::neighbor_advertisement(OWN, PEER, ll, ll, t6(), 0);
        proxied[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 7]);
        assert_eq!(classify(OWN, t, &proxied), Some(Evidence::Holder(PEER)));
        let dad = frame::neighbor_solicitation(PEER, Ipv6Addr::UNSPECIFIED, t6());
        assert_eq!(classify(OWN, t, &dad), Some(Evidence::Prober(PEER)));
        let own_dad = frame::neighbor_solicitation(OWN, Ipv6Addr::UNSPECIFIED, t6());
        assert_eq!(classify(OWN, t, &own_dad), None);
        let from_t = frame::neighbor_solicitation(PEER, t6(), other);
        assert_eq!(classify(OWN, t, &from_t), Some(Evidence::Holder(PEER)));
        let resolve = frame::neighbor_solicitation(PEER, ll, t6());
        assert_eq!(classify(OWN, t, &resolve), None);
        let na_other = frame::unsolicited_advertisement(PEER, other);
        assert_eq!(classify(OWN, t, &na_other), None);
        assert_eq!(classify(OWN, IpAddr::V4(T4), &na), None);
    }

    #[test]
    fn only_unicast_addresses_are_probed() {
        for bad in [
            "0.0.0.0",
            "127.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "ff02::1",
        ] {
            let e = check_unicast(bad.parse().unwrap()).unwrap_err();
            assert!(e.to_string().starts_with(bad), "{e}");
        }
        for good in ["10.0.0.1", "192.0.2.255", "fd00::1", "fe80::1"] {
            check_unicast(good.parse().unwrap()).unwrap();
        }
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(ifreq("eth0").is_some());
        assert!(ifreq("123456789012345").is_some());
        assert!(ifreq("1234567890123456").is_none());
        assert!(ifreq("").is_none());
        assert!(ifreq("a\0b").is_none());
        let req = ifreq("net1").unwrap();
        // SAFETY: the name is NUL-terminated (the array was zeroed and the name is shorter).
        let name = unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) };
        assert_eq!(name.to_str().unwrap(), "net1");
    }
}
