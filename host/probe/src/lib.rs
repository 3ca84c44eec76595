//! ARP and NDP probes from a pod's interface, for the IPAM plugin: is a new address already
//! used on the link (duplicate address detection), does the gateway answer, and an
//! announcement of the address once it is taken.
//!
//! # Where it runs
//!
//! Every call enters the pod's network namespace (`CNI_NETNS`) on a thread of its own,
//! [`PROBE_THREAD_NAME`], that ends with the call: `setns(2)` changes only the calling thread,
//! so the caller (the plugin's main thread, or an async runtime's worker) never changes
//! namespace. Frames go out of `CNI_IFNAME` itself through raw `AF_PACKET` sockets, so the
//! probes see the same segment the pod will, and need no address on the interface.
//!
//! # Sender addresses
//!
//! Probes are sent from 0.0.0.0 (ARP, RFC 5227's probe) and from `::` (a Neighbor
//! Solicitation to the target's solicited-node group, RFC 4862's duplicate address detection),
//! gateway probes included. A neighbour learns nothing from such a frame, so a probe never
//! points another host's cache at the pod before the address is known to be free: Spiderpool
//! sent its gateway probe from the new address, in parallel with the conflict probe, and so
//! poisoned caches when the address was taken (its issue 4475). Here the probes on one
//! interface are sequential: each call runs one probe, and [`with_link`] hands out the
//! interface as `&mut Link`. Once the caller has settled on an address, [`announce`] sends one
//! gratuitous ARP or one unsolicited Neighbor Advertisement (with Override) from the pod's MAC,
//! which Spiderpool never did (its issue 4650).
//!
//! # What counts as an answer
//!
//! A packet socket per family, bound to the interface and the ethertype (ARP or IPv6), with a
//! BPF filter for the probed address (attached before the socket is bound, replaced for each
//! probe): only frames about that address reach it, so a flood of other ARP/NDP traffic
//! neither fills its buffer nor wakes it. Each frame that passes
//! is then parsed and checked again: for IPv4, an ARP request or reply whose sender is the
//! address (a holder), or an ARP probe for the address from another MAC (another host probing
//! for it now, which RFC 5227 §2.1.1 also treats as a conflict); for IPv6, a valid Neighbor
//! Advertisement for the address or a Solicitation from it (a holder), or a duplicate address
//! detection Solicitation for it from another MAC. Frames the socket itself sent are skipped.
//! The answer's MAC is the ARP sender hardware address, or the target link-layer option of an
//! advertisement (the Ethernet source when it has none).
//!
//! # Timing
//!
//! [`ProbeConfig`]: `tries` requests, `timeout` apart (3 × 100 ms by default). The wait after
//! each request is a deadline: unrelated frames do not extend it, a signal (EINTR) neither
//! ends nor extends it (Spiderpool's probe broke on EINTR, its issue 5028), and an answer to an
//! earlier request still counts during a later wait. A free address therefore takes
//! `tries × timeout`; a conflict or a reachable gateway returns as soon as the first answer
//! arrives (a fraction of a millisecond on a veth). A send that fails is not retried at once:
//! the next try sends again, and the probe is an error only when every send failed. A `Link`
//! keeps one socket per family for all its probes and has them closed on a thread of their
//! own: closing an `AF_PACKET` socket waits for an RCU grace period (8 to 16 ms here), which
//! would otherwise be added to every probe.
//!
//! # Link state
//!
//! The IPAM plugin runs before the main plugin has configured the interface. With Debian's
//! containernetworking-plugins 1.1.1, both `bridge` and `macvlan` call IPAM while
//! `CNI_IFNAME` exists in the pod namespace, with its MAC but DOWN and without any address;
//! once IPAM has returned they add the address, set the link up and send one gratuitous ARP
//! (IPv4 only). `ipvlan` could not be tried: this kernel has no ipvlan. So when the interface
//! is down, the probe sets it up, waits until it has a carrier (up to
//! [`ProbeConfig::carrier_timeout`]), probes, and sets it down again, leaving the main plugin
//! the interface as it found it. An interface without a carrier is an error, never "free": a probe
//! that cannot leave the host proves nothing. If the probe thread fails in between, the
//! `Link`'s drop still sets the interface down. Right after a raise, the far end of a veth
//! (the node's end, on the bridge) starts to transmit only once the kernel's link watcher has
//! run, asynchronously, so the probe waits 2 ms before its first request (without that pause
//! one first answer in six or so was lost, and found by the next try 100 ms later). Raising
//! and restoring costs 8 to 24 ms here (setting a link down waits for an RCU grace period);
//! leaving it up instead made the bridge plugin wait about a second for IPv6 duplicate
//! address detection of the address it adds next.
//!
//! Links of the node's own namespace (a bridge, a macvlan probe port: [`with_host_link`], for
//! probing ahead) are never raised or set down: down or without a carrier is an error.
//!
//! # Packets
//!
//! Frames are built and read with pnet's packet crates (`pnet_packet`, `pnet_base`), which
//! build cleanly and cheaply here (their proc macros use syn, quote and regex, which the
//! workspace already builds). `pnet_datalink` is not used: its channel always binds
//! `ETH_P_ALL`, takes no BPF filter, turns the interface promiscuous by default, restarts its
//! poll timeout on every frame instead of keeping a deadline, does not expose the packet type
//! (so a socket would read its own probes back), and returns EINTR to the caller. The socket
//! is a few dozen lines of libc instead (`socket`).

mod bpf;
mod error;
pub mod frame;
mod host;
mod link;
mod netns;
mod port;
mod socket;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

pub use error::ProbeError;
pub use frame::MacAddr;
pub use host::{LocalAddress, local_addresses};
pub use link::Link;
pub use netns::{PROBE_THREAD_NAME, in_netns};
pub use port::{MacvlanPort, link_kind, macvlan_port_name};

/// How long a probe listens, and how often it asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Requests sent, each followed by a wait of `timeout`.
    pub tries: u32,
    /// How long to listen after each request.
    pub timeout: Duration,
    /// How long an interface may take to get a carrier (after the probe set it up, or when it
    /// was up without one) before the probe gives up with [`ProbeError::NoCarrier`]. A veth
    /// or a macvlan has one at once; a physical function may take a while.
    pub carrier_timeout: Duration,
}

impl Default for ProbeConfig {
    /// Spiderpool's 3 × 100 ms; a carrier within a second.
    fn default() -> Self {
        ProbeConfig {
            tries: 3,
            timeout: Duration::from_millis(100),
            carrier_timeout: Duration::from_secs(1),
        }
    }
}

impl ProbeConfig {
    /// Bounds that keep a probe meaningful and an ADD short: 1-100 tries, 1 ms-10 s each,
    /// at most a minute for the carrier.
    pub fn validate(&self) -> Result<(), ProbeError> {
        let bad = |what: String| Err(ProbeError::Config(what));
        if !(1..=100).contains(&self.tries) {
            return bad(format!("tries is {}: use 1 to 100", self.tries));
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_secs(10) {
            return bad(format!("timeout is {:?}: use 1 ms to 10 s", self.timeout));
        }
        if self.carrier_timeout > Duration::from_secs(60) {
            return bad(format!(
                "carrier_timeout is {:?}: use at most 60 s",
                self.carrier_timeout
            ));
        }
        Ok(())
    }
}

/// The answer to "is this address used on the link?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Nobody answered within `tries × timeout`.
    Free,
    /// A host at `mac` uses the address: it answered, announced it, or sent from it.
    Conflict { mac: MacAddr },
    /// A host at `mac` is probing for the same address right now; it is about to take it, so
    /// the address is not free either.
    Contested { mac: MacAddr },
}

impl ProbeOutcome {
    pub fn is_free(&self) -> bool {
        matches!(self, ProbeOutcome::Free)
    }
}

/// The answer to "does the gateway answer on the link?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatewayOutcome {
    Reachable {
        mac: MacAddr,
    },
    /// No answer within `tries × timeout`.
    Unreachable,
}

/// Runs `f` with the interface `ifname` of the network namespace `netns`, on the probe thread:
/// the way to run several probes and the announcement with one namespace entry and, for an
/// interface that was down, one raise and one restore. See the crate documentation for what
/// happens to the link.
pub fn with_link<R: Send>(
    netns: &Path,
    ifname: &str,
    cfg: ProbeConfig,
    f: impl FnOnce(&mut Link) -> Result<R, ProbeError> + Send,
) -> Result<R, ProbeError> {
    cfg.validate()?;
    in_netns(netns, || {
        let mut link = Link::open(Some(netns), ifname, cfg)?;
        let out = f(&mut link);
        let restored = link.close();
        let out = out?;
        restored.map(|()| out)
    })
}

/// Runs `f` with the link `ifname` of the calling thread's own network namespace (the node's,
/// for the agent): no namespace is entered and the link's state is never changed, so a link
/// that is down, or without a carrier within `cfg.carrier_timeout`, is an error.
pub fn with_host_link<R>(
    ifname: &str,
    cfg: ProbeConfig,
    f: impl FnOnce(&mut Link) -> Result<R, ProbeError>,
) -> Result<R, ProbeError> {
    cfg.validate()?;
    let mut link = Link::open(None, ifname, cfg)?;
    let out = f(&mut link);
    link.close()?;
    out
}

/// Duplicate address detection for `addr` from `ifname` in `netns`: an ARP probe (IPv4) or a
/// Neighbor Solicitation from `::` (IPv6), `cfg.tries` times.
pub fn probe_conflict(
    netns: &Path,
    ifname: &str,
    addr: IpAddr,
    cfg: ProbeConfig,
) -> Result<ProbeOutcome, ProbeError> {
    with_link(netns, ifname, cfg, |link| link.probe_conflict(addr))
}

/// Whether `gateway` answers an ARP probe (IPv4) or a Neighbor Solicitation (IPv6) sent from
/// `ifname` in `netns`.
pub fn probe_gateway(
    netns: &Path,
    ifname: &str,
    gateway: IpAddr,
    cfg: ProbeConfig,
) -> Result<GatewayOutcome, ProbeError> {
    with_link(netns, ifname, cfg, |link| link.probe_gateway(gateway))
}

/// Announces that `addr` is at `ifname`'s MAC: a gratuitous ARP (IPv4) or an unsolicited
/// Neighbor Advertisement (IPv6).
pub fn announce(netns: &Path, ifname: &str, addr: IpAddr) -> Result<(), ProbeError> {
    with_link(netns, ifname, ProbeConfig::default(), |link| {
        link.announce(addr)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_three_times_100_ms() {
        let c = ProbeConfig::default();
        assert_eq!((c.tries, c.timeout), (3, Duration::from_millis(100)));
        c.validate().unwrap();
    }

    #[test]
    fn config_bounds() {
        let ok = ProbeConfig::default();
        for bad in [
            ProbeConfig { tries: 0, ..ok },
            ProbeConfig { tries: 101, ..ok },
            ProbeConfig {
                timeout: Duration::ZERO,
                ..ok
            },
            ProbeConfig {
                timeout: Duration::from_secs(11),
                ..ok
            },
            ProbeConfig {
                carrier_timeout: Duration::from_secs(61),
                ..ok
            },
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.to_string().contains("use"), "{e}");
        }
        // A bad configuration is refused before any namespace is entered.
        let e = probe_conflict(
            Path::new("/nonexistent"),
            "eth0",
            "10.0.0.1".parse().unwrap(),
            ProbeConfig { tries: 0, ..ok },
        )
        .unwrap_err();
        assert!(matches!(e, ProbeError::Config(_)), "{e}");
    }
}
