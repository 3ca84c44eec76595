//! Test labs: network namespaces made for one test (named after the process and a counter,
//! removed by `Drop` even when the test panics), joined by veth pairs created inside them, so
//! that no interface ever appears in the machine's own namespace. A raw socket in the peer's
//! namespace plays foreign hosts: it injects frames and captures what the probe sends.

#![allow(dead_code)]

use std::ffi::CString;
use std::io;
use std::mem;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use allot_probe::{MacAddr, in_netns};

pub const IF: &str = "eth0";
pub const POD_MAC: MacAddr = MacAddr([0x02, 0xa1, 0, 0, 0, 0x01]);
pub const PEER_MAC: MacAddr = MacAddr([0x02, 0xa1, 0, 0, 0, 0x02]);
/// Documentation ranges (RFC 5737, RFC 3849): these only ever exist inside the test labs.
pub const SUBNET4: &str = "192.0.2";
pub const SUBNET6: &str = "2001:db8:a1";

pub fn v4(host: u8) -> IpAddr {
    format!("{SUBNET4}.{host}").parse().unwrap()
}

pub fn v6(host: u16) -> IpAddr {
    format!("{SUBNET6}::{host:x}").parse().unwrap()
}

pub fn prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 24 } else { 64 }
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

#[track_caller]
fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A network namespace of this test process, deleted on drop.
pub struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    pub fn new(role: &str) -> Netns {
        let name = format!(
            "allot-probe-{}-{}-{role}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns {
            path: PathBuf::from("/run/netns").join(&name),
            name,
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/NAME`: what `CNI_NETNS` would name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `ip -n NAME ARGS...`, which must succeed.
    #[track_caller]
    pub fn ip(&self, args: &[&str]) -> String {
        ok(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Runs a program inside the namespace.
    pub fn exec(&self, argv: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv))
    }

    /// `sysctl -w KEY=VALUE` inside the namespace.
    #[track_caller]
    pub fn sysctl(&self, key: &str, value: &str) {
        let out = self.exec(&["sysctl", "-q", "-w", &format!("{key}={value}")]);
        assert!(out.status.success(), "sysctl {key}: {out:?}");
    }

    pub fn flags(&self, ifname: &str) -> String {
        let out = self.ip(&["-o", "link", "show", "dev", ifname]);
        let start = out.find('<').unwrap_or(0);
        let end = out.find('>').unwrap_or(out.len());
        out[start..=end.min(out.len() - 1)].to_string()
    }

    pub fn is_up(&self, ifname: &str) -> bool {
        self.flags(ifname)
            .trim_matches(['<', '>'])
            .split(',')
            .any(|f| f == "UP")
    }

    pub fn hold(&self, ifname: &str, addr: IpAddr) {
        let cidr = format!("{addr}/{}", prefix(addr));
        if addr.is_ipv4() {
            self.ip(&["addr", "add", &cidr, "dev", ifname]);
        } else {
            // No duplicate address detection: the address answers at once.
            self.ip(&["addr", "add", &cidr, "dev", ifname, "nodad"]);
        }
    }

    /// The neighbour table's MAC for `addr` on `ifname`, if any.
    pub fn neighbour(&self, ifname: &str, addr: IpAddr) -> Option<String> {
        let out = self.ip(&["neigh", "show", &addr.to_string(), "dev", ifname]);
        let words: Vec<&str> = out.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == "lladdr")
            .and_then(|i| words.get(i + 1))
            .map(|s| s.to_string())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = run(Command::new("ip").args(["netns", "del", &self.name]));
        if !out.status.success() {
            eprintln!(
                "warning: cannot remove network namespace {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
}

/// A pod and a foreign host on one segment: `eth0` in each, a veth pair between them. The pod
/// side is left DOWN and without addresses, as the bridge and macvlan plugins leave it when
/// they call IPAM; the peer side is up. The two ends get different interface indexes, as a
/// pod's veth and its node end have: the kernel handles the state changes of a veth whose
/// peer has its own index at once, and batches those of one whose peer shares it.
pub struct Lab {
    pub pod: Netns,
    pub peer: Netns,
}

impl Lab {
    pub fn new() -> Lab {
        let pod = Netns::new("pod");
        let peer = Netns::new("peer");
        pod.ip(&[
            "link",
            "add",
            IF,
            "index",
            "10",
            "address",
            &POD_MAC.to_string(),
            "type",
            "veth",
            "peer",
            "name",
            IF,
            "index",
            "20",
            "address",
            &PEER_MAC.to_string(),
            "netns",
            peer.name(),
        ]);
        peer.ip(&["link", "set", IF, "up"]);
        Lab { pod, peer }
    }

    /// The pod's interface up (as a plugin that raises it before IPAM would leave it).
    pub fn pod_up(self) -> Lab {
        self.pod.ip(&["link", "set", IF, "up"]);
        self
    }
}

/// Elapsed time of `f`, with its result.
pub fn timed<R>(f: impl FnOnce() -> R) -> (R, Duration) {
    let start = Instant::now();
    let r = f();
    (r, start.elapsed())
}

/// How much later than planned a probe may end on a loaded 2-core machine (CI runs the whole
/// workspace's tests beside these). A wait that restarted on every frame would overrun it many
/// times over under the flood; the lower bounds (never before `tries × timeout`) are exact.
pub const SLACK: Duration = Duration::from_secs(1);

/// A raw `AF_PACKET` socket on an interface of another namespace, written independently of the
/// crate's own: it sees every frame (`ETH_P_ALL`) and sends whole frames.
pub struct Raw {
    fd: OwnedFd,
    ifindex: i32,
}

fn check(ret: i32) -> io::Result<i32> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Raw {
    pub fn open(netns: &Netns, ifname: &str) -> Raw {
        let name = CString::new(ifname).unwrap();
        let (fd, ifindex) = in_netns(netns.path(), || {
            // SAFETY: plain libc calls; the descriptor is owned right away.
            unsafe {
                let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
                assert!(ifindex > 0, "no {ifname} in {}", netns.name());
                let raw = check(libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    (libc::ETH_P_ALL as u16).to_be() as i32,
                ))
                .unwrap();
                let fd = OwnedFd::from_raw_fd(raw);
                let mut sa: libc::sockaddr_ll = mem::zeroed();
                sa.sll_family = libc::AF_PACKET as u16;
                sa.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
                sa.sll_ifindex = ifindex;
                check(libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_ll).cast(),
                    mem::size_of::<libc::sockaddr_ll>() as u32,
                ))
                .unwrap();
                Ok((fd, ifindex))
            }
        })
        .unwrap();
        Raw { fd, ifindex }
    }

    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data.
        let mut sa: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = self.ifindex;
        sa.sll_halen = 6;
        sa.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: valid buffers of the lengths passed.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sa as *const libc::sockaddr_ll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        check(n as i32).map(drop)
    }

    /// The next incoming frame (not one this namespace sent) within `wait`.
    pub fn recv(&self, wait: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + wait;
        let mut buf = vec![0u8; 2048];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) } <= 0 {
                continue;
            }
            // SAFETY: sockaddr_ll is plain old data; valid buffers of the lengths passed.
            let mut from: libc::sockaddr_ll = unsafe { mem::zeroed() };
            let mut len = mem::size_of::<libc::sockaddr_ll>() as u32;
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n > 0 && from.sll_pkttype != libc::PACKET_OUTGOING {
                buf.truncate(n as usize);
                return Some(buf);
            }
        }
    }

    /// The first frame within `wait` that `keep` accepts.
    pub fn wait_for(&self, wait: Duration, keep: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let deadline = Instant::now() + wait;
        loop {
            let f = self.recv(deadline.checked_duration_since(Instant::now())?)?;
            if keep(&f) {
                return Some(f);
            }
        }
    }

    /// Frames received within `wait` that `keep` accepts (captured until the time is up).
    pub fn capture(&self, wait: Duration, keep: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.recv(left) {
                Some(f) if keep(&f) => out.push(f),
                Some(_) => {}
                None => break,
            }
        }
        out
    }
}

/// A thread that sends `frames` round and round from a raw socket until dropped (or a cap of
/// frames is reached), pausing briefly every 64 frames so that it cannot starve the probe.
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Flood {
    pub fn start(raw: Raw, frames: Vec<Vec<u8>>) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let thread = thread::spawn(move || {
            let mut i = 0usize;
            while !s.load(Ordering::Relaxed) && i < 500_000 {
                if raw.send(&frames[i % frames.len()]).is_ok() {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
                if i.is_multiple_of(64) {
                    thread::sleep(Duration::from_micros(200));
                }
            }
        });
        // Let the flood get going before the probe starts.
        let start = Instant::now();
        while sent.load(Ordering::Relaxed) < 200 && start.elapsed() < Duration::from_secs(2) {
            thread::sleep(Duration::from_millis(1));
        }
        Flood {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    pub fn sent(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
