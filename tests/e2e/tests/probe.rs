//! Underlay safety end to end: conflict and gateway probes run by the allot plugin inside the
//! pod's namespace, called by Debian's bridge and macvlan plugins, against foreign hosts the
//! tests put on the segment (namespaces joined by veth pairs, all created here and removed on
//! drop); quarantine in the agent's store; and a capture showing that probing disabled sends
//! nothing.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use allot_e2e::*;
use serde_json::{Value, json};

/// The MAC of `ifname` in `ns`.
fn mac_of(ns: &Netns, ifname: &str) -> String {
    let out = ns.ip(&["-j", "link", "show", "dev", ifname]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().to_string()
}

/// A foreign host on the segment: its own namespace, one end of a veth pair (`ifname` inside
/// it, up), the other end returned (in `host`, up) for the caller to plug into a bridge, or
/// to use as a macvlan master.
fn foreign_host(host: &Netns, addresses: &[&str]) -> (Netns, String, String) {
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
fn bridge_with(host: &Netns, name: &str, addresses: &[&str]) {
    host.ip(&["link", "add", name, "type", "bridge"]);
    host.ip(&["link", "set", name, "up"]);
    for a in addresses {
        host.ip(&["addr", "add", a, "dev", name, "nodad"]);
    }
}

fn with_probe(mut conf: Value, probe: Value) -> Value {
    conf["ipam"]["probe"] = probe;
    conf
}

fn metric(agent: &Agent, name: &str) -> f64 {
    let (status, body) = agent.get("/metrics").expect("metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

/// `allotctl claims list -o json` on the agent's store.
fn claims(agent: &Agent) -> Vec<Value> {
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

fn quarantined(agent: &Agent) -> Vec<(String, String)> {
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

fn dual_stack_pools(n: u8) -> String {
    format!(
        "{}{}",
        ippool(
            "v4",
            &format!("10.9{n}.0.0/24"),
            Some(&format!("10.9{n}.0.1")),
            &[&format!("10.9{n}.0.100-10.9{n}.0.109")]
        ),
        ippool(
            "v6",
            &format!("fd00:9{n}::/64"),
            Some(&format!("fd00:9{n}::1")),
            &[&format!("fd00:9{n}::100-fd00:9{n}::109")]
        ),
    )
}

/// A foreign host on the bridge already uses the first free IPv4 and IPv6 addresses: allot
/// hands out the next ones, quarantines the first (shown by `allotctl claims list` with the
/// foreign MAC, counted in the metrics), and the plugin's log names the MAC. A second pod
/// does not meet the quarantined addresses again.
#[test]
fn a_foreign_host_holding_the_first_addresses_gets_them_quarantined_and_the_pod_the_next() {
    let test = "a_foreign_host_holding_the_first_addresses_gets_them_quarantined";
    let Some(lab) = Lab::new(test, &dual_stack_pools(3)) else {
        return;
    };
    bridge_with(&lab.host, &lab.bridge, &["10.93.0.1/24", "fd00:93::1/64"]);
    let (_foreign, port, foreign_mac) =
        foreign_host(&lab.host, &["10.93.0.100/24", "fd00:93::100/64"]);
    lab.host.ip(&["link", "set", &port, "master", &lab.bridge]);

    let conf = with_probe(
        lab.bridge_conf(&["v4"], &["v6"]),
        json!({"conflict": true, "gateway": true}),
    );
    let pod = Attachment::new("dad-a");
    let add = lab.bridge_add(&pod, &conf);
    let mut ips = add.ips();
    ips.sort();
    assert_eq!(ips, ["10.93.0.101/24", "fd00:93::101/64"], "{add}");
    assert!(
        add.stderr.contains(&foreign_mac) && add.stderr.contains("10.93.0.100"),
        "the plugin's log names the conflicting MAC:\n{add}"
    );
    assert_eq!(
        quarantined(&lab.agent),
        [
            ("10.93.0.100".to_string(), foreign_mac.clone()),
            ("fd00:93::100".to_string(), foreign_mac.clone())
        ]
    );
    assert!(
        lab.agent.log().contains(&foreign_mac),
        "{}",
        lab.agent.log()
    );
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 2.0);
    assert_eq!(metric(&lab.agent, "allot_quarantined_addresses"), 2.0);
    // The pod, its address and the quarantine: 2 of 10 gone per family.
    assert_eq!(lab.agent.pool_counts("v4"), (10, 8));
    assert_eq!(lab.agent.pool_counts("v6"), (10, 8));
    assert!(pod.netns.ping("10.93.0.1"), "the pod reaches its gateway");

    // The next pod goes straight to the next free addresses.
    let second = Attachment::new("dad-b");
    let add = lab.bridge_add(&second, &conf);
    let mut ips = add.ips();
    ips.sort();
    assert_eq!(ips, ["10.93.0.102/24", "fd00:93::102/64"], "{add}");
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 2.0);

    // GC with no valid attachment releases the second pod's addresses (a leak, once the
    // first pod is gone), never the quarantine.
    lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
    let gc = json!({"cniVersion": "1.1.0", "name": lab.network, "ipam": conf["ipam"],
                    "cni.dev/valid-attachments": []});
    for _ in 0..2 {
        lab.call("allot", "GC", &gc.to_string())
            .run(Some(&lab.host))
            .expect_ok();
    }
    assert_eq!(quarantined(&lab.agent).len(), 2);
    assert_eq!(lab.agent.pool_counts("v4"), (10, 9));
}

/// The gateway probe: both gateways answer (the bridge holds them) → the ADD succeeds; the
/// IPv6 gateway gone → the ADD fails naming it and the interface; both gone → the IPv4 one
/// is named. A failed ADD leaks nothing.
#[test]
fn an_unreachable_gateway_fails_the_add_by_name_and_leaks_nothing() {
    let test = "an_unreachable_gateway_fails_the_add_by_name_and_leaks_nothing";
    let Some(lab) = Lab::new(test, &dual_stack_pools(5)) else {
        return;
    };
    bridge_with(&lab.host, &lab.bridge, &["10.95.0.1/24", "fd00:95::1/64"]);
    let probe = json!({"gateway": true, "tries": 2, "timeoutMs": 50});
    let present = with_probe(lab.bridge_conf(&["v4"], &["v6"]), probe.clone());
    let ok = Attachment::new("gw-ok");
    lab.bridge_add(&ok, &present);
    assert_eq!(lab.agent.pool_counts("v4"), (10, 9));

    // Without the gateways on the bridge, and without the bridge plugin adding them back.
    let mut absent = present.clone();
    absent["isGateway"] = json!(false);
    for (remove, named) in [
        ("fd00:95::1/64", "fd00:95::1"),
        ("10.95.0.1/24", "10.95.0.1"),
    ] {
        lab.host.ip(&["addr", "del", remove, "dev", &lab.bridge]);
        let pod = Attachment::new("gw-gone");
        let add = lab.cni("bridge", "ADD", &pod, &absent);
        add.expect_err(&[106]);
        let msg = add.msg();
        assert!(
            msg.contains(&format!("gateway {named} does not answer on eth0")),
            "{add}"
        );
        assert!(msg.contains("released"), "{add}");
        assert_eq!(lab.agent.pool_counts("v4"), (10, 9), "leaked:\n{add}");
        assert_eq!(lab.agent.pool_counts("v6"), (10, 9), "leaked:\n{add}");
        lab.cni("bridge", "DEL", &pod, &absent).expect_ok();
    }
    assert_eq!(
        claims(&lab.agent).len(),
        2,
        "only the first pod's addresses"
    );
}

/// Frames seen on one interface while a capture runs: a raw `AF_PACKET` socket in the
/// interface's namespace, on a thread of its own (setns changes only the calling thread).
struct Capture {
    stop: Arc<AtomicBool>,
    frames: thread::JoinHandle<Vec<Vec<u8>>>,
}

impl Capture {
    fn start(ns: &Netns, ifname: &str) -> Capture {
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

    fn finish(self) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::SeqCst);
        self.frames.join().unwrap()
    }
}

/// ARP frames and IPv6 neighbour discovery messages (solicitations, advertisements) among
/// `frames` sent from `mac`.
fn neighbour_frames(frames: &[Vec<u8>], mac: &str) -> (usize, usize) {
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

/// The plugin called by itself on an interface the test made (down, no address), the other
/// end of its veth captured: with the agent's `--probe-conflict` default and no `probe`
/// section, ARP and NDP probes leave the pod; with an explicit section that turns probing
/// off, or with an agent whose defaults are off, nothing at all does. The interface is left
/// down either way.
#[test]
fn probing_disabled_sends_nothing_and_the_agents_defaults_apply_without_a_section() {
    let test = "probing_disabled_sends_nothing";
    let pools = dual_stack_pools(4);
    let Some(lab) = Lab::with_flags(test, &pools, &[("--probe-conflict", "")]) else {
        return;
    };
    let quiet = Agent::start(&pools);
    let pod = Attachment::new("capture");
    let outside = unique_name("cp");
    lab.host.ip(&[
        "link",
        "add",
        &outside,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod.netns.name(),
    ]);
    lab.host.ip(&["link", "set", &outside, "up"]);
    let pod_mac = mac_of(&pod.netns, "eth0");

    let network = |socket: &std::path::Path, probe: Option<Value>| {
        let mut ipam = allot_ipam(socket, &["v4"], &["v6"]);
        if let Some(p) = probe {
            ipam["probe"] = p;
        }
        json!({"cniVersion": "1.0.0", "name": "allot-e2e-capture", "type": "allot", "ipam": ipam})
    };
    let cases = [
        (
            "agent defaults on, no section",
            network(&lab.agent.socket(), None),
            true,
        ),
        (
            "agent defaults on, section off",
            network(
                &lab.agent.socket(),
                Some(json!({"conflict": false, "gateway": false})),
            ),
            false,
        ),
        (
            "agent defaults off, no section",
            network(&quiet.socket(), None),
            false,
        ),
    ];
    for (i, (case, conf, probes)) in cases.iter().enumerate() {
        let att = Attachment {
            container_id: format!("{}{i}", pod.container_id),
            ..pod.clone()
        };
        let capture = Capture::start(&lab.host, &outside);
        let add = lab.cni("allot", "ADD", &att, conf);
        let frames = capture.finish();
        add.expect_ok();
        let (arp, ndp) = neighbour_frames(&frames, &pod_mac);
        if *probes {
            // 3 tries per address, then one announcement each.
            assert!(arp >= 3 && ndp >= 3, "{case}: arp {arp}, ndp {ndp}\n{add}");
        } else {
            let from_pod = frames.iter().filter(|f| f.len() >= 14).filter(|f| {
                f[6..12]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":")
                    == pod_mac
            });
            assert_eq!(from_pod.count(), 0, "{case}: the pod sent frames\n{add}");
        }
        let state = pod.netns.ip(&["-j", "link", "show", "dev", "eth0"]);
        assert!(
            !state.contains("\"UP\""),
            "{case}: eth0 is left up: {state}"
        );
        lab.cni("allot", "DEL", &att, conf).expect_ok();
    }
}

/// macvlan on a parent link whose other end is a foreign host holding the first address: the
/// agent's defaults (no `probe` section in the network) catch it, the pod gets the next
/// address, and the quarantine is released once `--quarantine-seconds` have passed.
#[test]
fn macvlan_conflict_is_quarantined_replaced_and_expires() {
    let test = "macvlan_conflict_is_quarantined_replaced_and_expires";
    let pools = ippool(
        "underlay",
        "10.96.0.0/24",
        Some("10.96.0.1"),
        &["10.96.0.100-10.96.0.109"],
    );
    let flags = [("--probe-conflict", ""), ("--quarantine-seconds", "2")];
    let Some(lab) = Lab::with_flags(test, &pools, &flags) else {
        return;
    };
    let (_foreign, parent, foreign_mac) = foreign_host(&lab.host, &["10.96.0.100/24"]);
    let conf = macvlan_conf(
        "1.0.0",
        "allot-e2e-macvlan-probe",
        &parent,
        allot_ipam(&lab.agent.socket(), &["underlay"], &[]),
    );
    let pod = Attachment::new("mv-dad");
    let add = lab.cni("macvlan", "ADD", &pod, &conf);
    add.expect_ok();
    assert_eq!(add.ip(), "10.96.0.101/24", "{add}");
    assert!(add.stderr.contains(&foreign_mac), "{add}");
    assert_eq!(pod.addrs(), ["10.96.0.101/24"]);
    assert!(
        pod.netns.ping("10.96.0.100"),
        "the pod reaches the foreign host over the macvlan"
    );
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 1.0);

    lab.eventually(
        "the quarantine expires and 10.96.0.100 is free again",
        Duration::from_secs(30),
        || lab.agent.pool_counts("underlay") == (10, 9) && quarantined(&lab.agent).is_empty(),
    );
    assert_eq!(metric(&lab.agent, "allot_quarantined_addresses"), 0.0);
    lab.cni("macvlan", "DEL", &pod, &conf).expect_ok();
    assert_eq!(lab.agent.pool_counts("underlay"), (10, 10));
}
