//! Listening sockets for what a cluster reaches on a pod or node address (webhooks, metrics,
//! probes): bound on `::` they answer on IPv6 and, where the node allows both (the Linux default,
//! `net.ipv6.bindv6only=0`), on IPv4 too, so one default serves IPv4-only, dual-stack and
//! IPv6-only clusters. A server on `0.0.0.0` is unreachable on a pod's IPv6 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

/// The address meaning "every address of every family", on `port`.
pub fn any(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
}

/// Binds `address`, non-blocking (for tokio's `TcpListener::from_std`). When it is `::` and
/// the node has no IPv6 (a kernel booted with `ipv6.disable=1`), binds `0.0.0.0` on the same
/// port instead and says so.
pub fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = match TcpListener::bind(address) {
        Err(e) if address.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) && no_ipv6(&e) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), address.port());
            eprintln!("{address}: {e}; this node has no IPv6, listening on {v4}");
            TcpListener::bind(v4)?
        }
        other => other?,
    };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Linux's EAFNOSUPPORT: the kernel has no IPv6 at all.
const ADDRESS_FAMILY_NOT_SUPPORTED: i32 = 97;

fn no_ipv6(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(ADDRESS_FAMILY_NOT_SUPPORTED)
        || e.kind() == std::io::ErrorKind::AddrNotAvailable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unspecified_v6_address_answers_both_families_where_the_node_has_both() {
        let listener = bind(any(0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        for target in [
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
        ] {
            std::net::TcpStream::connect(target)
                .unwrap_or_else(|e| panic!("{target} is not answered: {e}"));
        }
    }
}
