//! The probes against reference implementations on the same namespaces: iputils' `arping -D`
//! (RFC 5227 duplicate address detection) and `ndisc6` (Neighbor Discovery) must reach the same
//! verdict and the same MAC; a probe by `arping -D` and the Linux kernel's own duplicate
//! address detection must be seen as contests. A test whose tool is missing says so and
//! passes (`scripts/setup.sh` installs both: Debian's iputils-arping and ndisc6).

use std::net::IpAddr;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::Duration;

use crate::common::*;
use allot_probe::{
    GatewayOutcome, MacAddr, ProbeConfig, ProbeOutcome, probe_conflict, probe_gateway,
};

/// Whether `program` runs and its `-V` output mentions `expect`; says why not otherwise.
fn have(program: &str, expect: &str, package: &str) -> bool {
    let out = Command::new(program)
        .arg("-V")
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains(expect) => true,
        Ok(_) => {
            eprintln!("skipping: {program} is not {expect}'s (install Debian's {package})");
            false
        }
        Err(e) => {
            eprintln!("skipping: cannot run {program} ({e}); install Debian's {package}");
            false
        }
    }
}

/// The first `[..]`-bracketed or `address:`-prefixed MAC in a tool's output, lower-cased.
fn mac_in(out: &Output) -> Option<String> {
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    text.split(|c: char| c.is_whitespace() || c == '[' || c == ']')
        .find(|w| w.len() == 17 && w.matches(':').count() == 5)
        .map(str::to_owned)
}

/// A pod whose link is up with a usable link-local address (the tools send through the
/// kernel, which needs one), next to a peer holding `held`.
fn lab_with(held: &[IpAddr]) -> Lab {
    let lab = Lab::new();
    lab.pod
        .sysctl(&format!("net.ipv6.conf.{IF}.accept_dad"), "0");
    let lab = lab.pod_up();
    // The link-local address (and the routes the tools need) come once the link is
    // operationally up, which can lag the carrier by a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !lab
        .pod
        .ip(&["-6", "addr", "show", "dev", IF, "scope", "link"])
        .contains("fe80::")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no link-local address"
        );
        thread::sleep(Duration::from_millis(20));
    }
    for &a in held {
        lab.peer.hold(IF, a);
    }
    lab
}

/// `tool`, run in the pod's namespace with `args` (`ADDR` standing for the address), and the
/// probe agree: `held` is taken, at the MAC the tool prints, and `free` is free. `codes` are
/// the tool's exit statuses for the two. Returns the MAC.
fn agree(
    lab: &Lab,
    tool: &str,
    args: &[&str],
    codes: (i32, i32),
    (held, free): (IpAddr, IpAddr),
) -> MacAddr {
    let cfg = ProbeConfig::default();
    let run = |addr: IpAddr| {
        let addr = addr.to_string();
        let mut argv = vec![tool];
        argv.extend(
            args.iter()
                .map(|&a| if a == "ADDR" { addr.as_str() } else { a }),
        );
        lab.pod.exec(&argv)
    };
    let reference = run(held);
    assert_eq!(
        reference.status.code(),
        Some(codes.0),
        "{tool}: {reference:?}"
    );
    let ours = probe_conflict(lab.pod.path(), IF, held, cfg).unwrap();
    let ProbeOutcome::Conflict { mac } = ours else {
        panic!("{tool} found {held} taken, the probe says {ours:?}");
    };
    assert_eq!(mac_in(&reference), Some(mac.to_string()), "{reference:?}");
    let reference = run(free);
    assert_eq!(
        reference.status.code(),
        Some(codes.1),
        "{tool}: {reference:?}"
    );
    let ours = probe_conflict(lab.pod.path(), IF, free, cfg).unwrap();
    assert_eq!(ours, ProbeOutcome::Free, "{tool} found {free} free");
    mac
}

#[test]
fn arping_and_the_probe_agree_on_ipv4() {
    if !have("arping", "iputils", "iputils-arping") {
        return;
    }
    let (held, free) = (v4(60), v4(61));
    let lab = lab_with(&[held]);
    // -D: duplicate address detection, exit status 1 when someone answered.
    let args = ["-D", "-I", IF, "-c", "1", "-w", "1", "ADDR"];
    agree(&lab, "arping", &args, (1, 0), (held, free));
}

#[test]
fn ndisc6_and_the_probe_agree_on_ipv6() {
    if !have("ndisc6", "ndisc6", "ndisc6") {
        return;
    }
    let (held, free) = (v6(0x60), v6(0x61));
    let lab = lab_with(&[held]);
    // Exit status 2 when nobody answered 3 solicitations 100 ms apart.
    let args = ["-1", "-r", "3", "-w", "100", "ADDR", IF];
    let mac = agree(&lab, "ndisc6", &args, (0, 2), (held, free));
    // The same addresses as gateways.
    let cfg = ProbeConfig::default();
    assert_eq!(
        probe_gateway(lab.pod.path(), IF, held, cfg).unwrap(),
        GatewayOutcome::Reachable { mac }
    );
    assert_eq!(
        probe_gateway(lab.pod.path(), IF, free, cfg).unwrap(),
        GatewayOutcome::Unreachable
    );
}

/// One long listen, so that a reference prober that starts a little later is heard.
fn listen_long() -> ProbeConfig {
    ProbeConfig {
        tries: 1,
        timeout: Duration::from_secs(3),
        ..ProbeConfig::default()
    }
}

#[test]
fn a_probe_by_arping_contests_the_address() {
    if !have("arping", "iputils", "iputils-arping") {
        return;
    }
    let lab = Lab::new();
    let addr = v4(62);
    let (out, reference) = thread::scope(|s| {
        let reference = s.spawn(|| {
            thread::sleep(Duration::from_millis(200));
            lab.peer.exec(&[
                "arping",
                "-D",
                "-I",
                IF,
                "-c",
                "1",
                "-w",
                "1",
                &addr.to_string(),
            ])
        });
        let out = probe_conflict(lab.pod.path(), IF, addr, listen_long());
        (out, reference.join().unwrap())
    });
    assert!(reference.status.code().is_some(), "arping: {reference:?}");
    assert_eq!(out.unwrap(), ProbeOutcome::Contested { mac: PEER_MAC });
}

#[test]
fn the_kernels_duplicate_address_detection_contests_the_address() {
    // The link up from the start: the kernel defers its detection until the peer's end is
    // operationally up, which can lag a carrier change by a second.
    let lab = Lab::new().pod_up();
    let addr = v6(0x62);
    let (out, ()) = thread::scope(|s| {
        let dad = s.spawn(|| {
            thread::sleep(Duration::from_millis(200));
            // Without nodad: the kernel solicits for the address from :: within a second.
            lab.peer
                .ip(&["addr", "add", &format!("{addr}/64"), "dev", IF]);
        });
        let out = probe_conflict(lab.pod.path(), IF, addr, listen_long());
        (out, dad.join().unwrap())
    });
    assert_eq!(out.unwrap(), ProbeOutcome::Contested { mac: PEER_MAC });
}
