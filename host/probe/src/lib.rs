//! ARP and NDP probes from a pod's interface, for the IPAM plugin (in progress: the frames and
//! the socket filters first).

#[allow(dead_code)] // the probes of the next commit use the filters
mod bpf;
pub mod frame;

pub use frame::MacAddr;
