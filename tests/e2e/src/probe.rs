//! Helpers of the probing tests and benchmark: foreign hosts on a segment, bridges with the
//! pools' gateways, the agent's metrics and quarantines, and frame captures.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use serde_json::Value;

use crate::{Agent, Netns, bin, unique_name};

/// The MAC of `ifname` in `ns`.
pub fn mac_of(ns: &Netns, ifname: &str) -> String {
    let out = ns.ip(&["-j", "link", "show", "dev", ifname]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().to_string()
}

/// A foreign host on the segment: its own namespace, one end of a veth pair (`ifname` inside
/// it, up), the other end returned (in `host`, up) for the caller to plug into a bridge, or
/// to use as a macvlan master.
pub fn foreign_host(host: &Netns, addresses: &[&str]) -> (Netns, String, String) {
    let ns = Netns::new();
    let outside = unique_name("fh");
    let inside = unique_name("fn");
    host.ip(&[
        "link",
        "add",
        &outside,
        "type",
        "veth",
        "peer",
        "name",
        &inside,
        "netns",
        ns.name(),
    ]);
    host.ip(&["link", "set", &outside, "up"]);
    ns.ip(&["link", "set", &inside, "up"]);
    for a in addresses {
        // nodad: the address is the foreign host's at once (not tentative), as on a host that
        // has held it for a while.
        ns.ip(&["addr", "add", a, "dev", &inside, "nodad"]);
    }
    let mac = mac_of(&ns, &inside);
    (ns, outside, mac)
}

/// A bridge in `host` named `name`, up, with `addresses` (the pools' gateways), created before
/// the bridge plugin sees it: the plugin puts its gateway addresses on the bridge only after
/// IPAM has returned, too late for a gateway probe of the first pod.
pub fn bridge_with(host: &Netns, name: &str, addresses: &[&str]) {
    host.ip(&["link", "add", name, "type", "bridge"]);
    host.ip(&["link", "set", name, "up"]);
    for a in addresses {
        host.ip(&["addr", "add", a, "dev", name, "nodad"]);
    }
}

pub fn with_probe(mut conf: Value, probe: Value) -> Value {
    conf["ipam"]["probe"] = probe;
    conf
}

pub fn metric(agent: &Agent, name: &str) -> f64 {
    let (status, body) = agent.get("/metrics").expect("metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

/// `allotctl claims list -o json` on the agent's store.
pub fn claims(agent: &Agent) -> Vec<Value> {
    let out = Command::new(bin("allotctl"))
        .arg("--store")
        .arg(agent.state())
        .args(["claims", "list", "-o", "json"])
        .output()
        .expect("allotctl");
    assert!(out.status.success(), "allotctl: {out:?}");
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

pub fn quarantined(agent: &Agent) -> Vec<(String, String)> {
    let mut q: Vec<(String, String)> = claims(agent)
        .iter()
        .filter_map(|c| {
            Some((
                c["address"].as_str()?.to_string(),
                c["conflictMac"].as_str()?.to_string(),
            ))
        })
        .collect();
    q.sort();
    q
}

/// Frames seen on one interface while a capture runs: a raw `AF_PACKET` socket in the
/// interface's namespace, on a thread of its own (setns changes only the calling thread).
pub struct Capture {
    stop: Arc<AtomicBool>,
    frames: thread::JoinHandle<Vec<Vec<u8>>>,
}

impl Capture {
    pub fn start(ns: &Netns, ifname: &str) -> Capture {
        let netns = File::open(ns.path()).unwrap();
        let ifname = CString::new(ifname).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, started) = std::sync::mpsc::channel();
        let stopped = stop.clone();
        let frames = thread::spawn(move || {
            // SAFETY: plain syscalls on descriptors this thread owns; the socket address and
            // the timeout are fully initialised structs of the sizes passed.
            unsafe {
                assert_eq!(libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET), 0);
                let all = (libc::ETH_P_ALL as u16).to_be();
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all));
                assert!(fd >= 0, "{}", std::io::Error::last_os_error());
                let index = libc::if_nametoindex(ifname.as_ptr());
                assert!(index > 0, "no interface {ifname:?}");
                let mut sll: libc::sockaddr_ll = std::mem::zeroed();
                sll.sll_family = libc::AF_PACKET as u16;
                sll.sll_protocol = all;
                sll.sll_ifindex = index as i32;
                let bound = libc::bind(
                    fd,
                    (&raw const sll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                assert_eq!(bound, 0, "{}", std::io::Error::last_os_error());
                let tv = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 20_000,
                };
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as u32,
                );
                ready.send(()).unwrap();
                let mut frames = Vec::new();
                let mut buf = [0u8; 2048];
                loop {
                    let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
                    if n > 0 {
                        frames.push(buf[..n as usize].to_vec());
                    } else if stopped.load(Ordering::SeqCst) {
                        // Stopped, and nothing left queued.
                        break;
                    }
                }
                libc::close(fd);
                frames
            }
        });
        started.recv().unwrap();
        Capture { stop, frames }
    }

    pub fn finish(self) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::SeqCst);
        self.frames.join().unwrap()
    }
}

/// ARP frames and IPv6 neighbour discovery messages (solicitations, advertisements) among
/// `frames` sent from `mac`.
pub fn neighbour_frames(frames: &[Vec<u8>], mac: &str) -> (usize, usize) {
    let mac: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let from = frames
        .iter()
        .filter(|f| f.len() >= 14 && f[6..12] == mac[..]);
    let (mut arp, mut ndp) = (0, 0);
    for f in from {
        match (f[12], f[13]) {
            (0x08, 0x06) => arp += 1,
            // IPv6, next header ICMPv6, type 135 or 136.
            (0x86, 0xdd) if f.len() > 54 && f[20] == 58 && matches!(f[54], 135 | 136) => ndp += 1,
            _ => {}
        }
    }
    (arp, ndp)
}

/// The probes among `frames`: ARP requests from 0.0.0.0 and Neighbor Solicitations from `::`
/// (duplicate address detection), as (sender MAC, probed address).
pub fn probe_frames(frames: &[Vec<u8>]) -> Vec<(String, std::net::IpAddr)> {
    let mac = |f: &[u8]| {
        f[6..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| f.len() >= 14) {
        match (f[12], f[13]) {
            (0x08, 0x06) if f.len() >= 42 && f[20..22] == [0, 1] && f[28..32] == [0; 4] => {
                let t: [u8; 4] = f[38..42].try_into().unwrap();
                out.push((mac(f), std::net::Ipv4Addr::from(t).into()));
            }
            (0x86, 0xdd)
                if f.len() >= 78 && f[20] == 58 && f[54] == 135 && f[22..38] == [0; 16] =>
            {
                let t: [u8; 16] = f[62..78].try_into().unwrap();
                out.push((mac(f), std::net::Ipv6Addr::from(t).into()));
            }
            _ => {}
        }
    }
    out
}
