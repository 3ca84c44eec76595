//! The addresses of the calling thread's own network namespace, with the MAC of the interface
//! holding each: a probe sent from a link never hears the node itself answer (its own frames
//! do not come back to it), yet Linux answers ARP for any of its addresses on any interface,
//! so probing ahead checks a candidate against these first.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::frame::MacAddr;

/// One address of a local interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAddress {
    pub address: IpAddr,
    pub ifname: String,
    /// The interface's MAC; `None` for an interface without one (loopback, a tunnel).
    pub mac: Option<MacAddr>,
}

/// Every address of every interface in this thread's network namespace (`getifaddrs(3)`).
pub fn local_addresses() -> io::Result<Vec<LocalAddress>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that freeifaddrs releases below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut addresses = Vec::new();
    let mut macs: Vec<(String, MacAddr)> = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let entry = unsafe { &*at };
        at = entry.ifa_next;
        if entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string of the list.
        let name = unsafe { CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
        let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
        match family {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in>() };
                let address = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                addresses.push((IpAddr::V4(address), name));
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in6>() };
                let address = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                addresses.push((IpAddr::V6(address), name));
            }
            libc::AF_PACKET => {
                // SAFETY: an AF_PACKET entry is a sockaddr_ll with the hardware address.
                let sll = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_ll>() };
                if sll.sll_halen == 6 && sll.sll_hatype == libc::ARPHRD_ETHER {
                    let a = sll.sll_addr;
                    macs.push((name, MacAddr([a[0], a[1], a[2], a[3], a[4], a[5]])));
                }
            }
            _ => {}
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(addresses
        .into_iter()
        .map(|(address, ifname)| LocalAddress {
            address,
            mac: macs.iter().find(|(n, _)| *n == ifname).map(|&(_, m)| m),
            ifname,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_without_a_mac() {
        let all = local_addresses().unwrap();
        let lo = all
            .iter()
            .find(|a| a.address == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 on lo");
        assert_eq!(lo.ifname, "lo");
        assert_eq!(lo.mac, None);
    }
}
