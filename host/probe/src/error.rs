//! What can go wrong before a probe has an answer. Each message says what to do next: the CNI
//! plugin passes it on to the runtime (and so to `kubectl describe pod`) as it is.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid probe configuration: {0}")]
    Config(String),

    #[error("{addr} cannot be probed: {why}")]
    Address { addr: IpAddr, why: &'static str },

    #[error(
        "cannot open network namespace {}: {source}; check that CNI_NETNS names the pod's \
         namespace and that the pod still exists",
        path.display()
    )]
    NetnsOpen { path: PathBuf, source: io::Error },

    #[error("cannot enter network namespace {}: {source}; {}", path.display(), netns_hint(source))]
    NetnsEnter { path: PathBuf, source: io::Error },

    #[error(
        "no interface {ifname:?} in network namespace {}: the main plugin creates CNI_IFNAME \
         before it calls IPAM, so check the plugin chain and CNI_IFNAME",
        netns.display()
    )]
    NoSuchInterface { ifname: String, netns: PathBuf },

    #[error(
        "no link {ifname:?} in this network namespace: probing ahead needs the parent link \
         (bridge, macvlan master) in the agent's namespace"
    )]
    NoSuchLink { ifname: String },

    #[error("{ifname} is down: probing ahead never changes a link of the node; bring it up")]
    LinkDown { ifname: String },

    #[error(
        "{ifname} is not an Ethernet interface (hardware type {hw_type}): ARP and NDP probes need \
         Ethernet framing; turn probing off for this network"
    )]
    NotEthernet { ifname: String, hw_type: u16 },

    #[error(
        "{ifname} has no carrier {waited:?} after it was brought up: its peer or parent link is \
         down, so a probe could not tell a free address from a taken one; bring the parent \
         interface up, or turn probing off for this network"
    )]
    NoCarrier { ifname: String, waited: Duration },

    #[error("{op} on {ifname} failed: {source}{}", permission_hint(source))]
    Io {
        op: &'static str,
        ifname: String,
        source: io::Error,
    },

    #[error(
        "every probe send on {ifname} failed ({tries} tries), the last with: {source}{}; the \
         address was not checked, so retry the ADD",
        permission_hint(source)
    )]
    SendFailed {
        ifname: String,
        tries: u32,
        source: io::Error,
    },

    #[error(
        "probed {ifname}, but could not set it down again: {source}; it is left up (the main \
         plugin sets it up anyway)"
    )]
    LinkRestore { ifname: String, source: io::Error },

    #[error("the probe thread failed: {0}; this is a bug in allot-probe, please report it")]
    Thread(String),
}

impl ProbeError {
    /// Whether the process lacked a privilege the probe needs (a raw socket without
    /// CAP_NET_RAW, a link change without CAP_NET_ADMIN, a namespace without CAP_SYS_ADMIN):
    /// no retry helps, only the process's capabilities.
    pub fn lacks_privilege(&self) -> bool {
        let source = match self {
            ProbeError::Io { source, .. }
            | ProbeError::SendFailed { source, .. }
            | ProbeError::NetnsEnter { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.raw_os_error(),
            Some(libc::EPERM) | Some(libc::EACCES)
        )
    }

    pub(crate) fn io(op: &'static str, ifname: &str, source: io::Error) -> Self {
        ProbeError::Io {
            op,
            ifname: ifname.to_owned(),
            source,
        }
    }
}

fn netns_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EINVAL) => {
            "the path is not a network namespace (expected /proc/PID/ns/net or a bind mount of one, as in /run/netns/NAME)"
        }
        Some(libc::EPERM) => {
            "entering a namespace needs CAP_SYS_ADMIN: run the plugin as root, as container runtimes do"
        }
        _ => "check that CNI_NETNS names the pod's namespace",
    }
}

fn permission_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (raw packet sockets need CAP_NET_RAW and changing a link needs CAP_NET_ADMIN: run \
             the plugin as root, as container runtimes do)"
        }
        Some(libc::ENETDOWN) | Some(libc::ENXIO) | Some(libc::ENODEV) => {
            " (the interface went down or away during the probe)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_socket_or_link_change_is_a_missing_privilege_and_nothing_else_is() {
        let io = |errno| ProbeError::io("socket", "eth0", io::Error::from_raw_os_error(errno));
        assert!(io(libc::EPERM).lacks_privilege());
        assert!(io(libc::EACCES).lacks_privilege());
        assert!(!io(libc::ENETDOWN).lacks_privilege());
        let send = ProbeError::SendFailed {
            ifname: "eth0".into(),
            tries: 3,
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert!(send.lacks_privilege());
        assert!(!ProbeError::Config("tries".into()).lacks_privilege());
        assert!(
            !ProbeError::NoSuchLink {
                ifname: "eth1".into()
            }
            .lacks_privilege()
        );
    }
}
