//! Blocks: the aligned runs of addresses that the Kubernetes store groups claims into.
//!
//! Every address belongs to exactly one block, whatever pool it is handed out from: a block is
//! named after its address run alone, so create-if-absent per address holds even where pools
//! overlap or share a block. 64 addresses per block (a /26 of IPv4, a /122 of IPv6, Calico's
//! IPv4 size) keeps an object at a few kilobytes, and 150,000 dense claims in about 2,350 objects.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{IpFamily, addr_to_u128, u128_to_addr};

/// Addresses per block, as host bits: 2^6 = 64.
pub const BLOCK_HOST_BITS: u8 = 6;

/// The block holding `address`.
pub fn block_of(address: IpAddr) -> IpNet {
    let family = IpFamily::of(address);
    let bits = match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    };
    let start = addr_to_u128(address) & !((1u128 << BLOCK_HOST_BITS) - 1);
    IpNet::new(u128_to_addr(family, start), bits - BLOCK_HOST_BITS).expect("a valid prefix")
}

/// The object name of a block: `v4-10-0-0-64-26`, `v6-fd00-0000-…-0040-122` (every IPv6 group
/// written out, so that one block has one name).
pub fn block_name(block: &IpNet) -> String {
    match block {
        IpNet::V4(n) => {
            let o = n.network().octets();
            format!("v4-{}-{}-{}-{}-{}", o[0], o[1], o[2], o[3], n.prefix_len())
        }
        IpNet::V6(n) => {
            let groups: Vec<String> = n
                .network()
                .segments()
                .iter()
                .map(|g| format!("{g:04x}"))
                .collect();
            format!("v6-{}-{}", groups.join("-"), n.prefix_len())
        }
    }
}

/// The block an object name stands for, if it is a block's name ([`block_name`] read back).
pub fn block_named(name: &str) -> Option<IpNet> {
    let (family, rest) = name.split_once('-')?;
    let (address, len) = rest.rsplit_once('-')?;
    let len: u8 = len.parse().ok()?;
    let address: IpAddr = match family {
        "v4" => address.replace('-', ".").parse().ok()?,
        "v6" => address.replace('-', ":").parse().ok()?,
        _ => return None,
    };
    let block = IpNet::new(address, len).ok()?;
    (block_of(address) == block && block_name(&block) == name).then_some(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipv4_address_is_in_its_aligned_slash_26() {
        assert_eq!(block_of(ip("10.0.0.0")).to_string(), "10.0.0.0/26");
        assert_eq!(block_of(ip("10.0.0.63")).to_string(), "10.0.0.0/26");
        assert_eq!(block_of(ip("10.0.0.64")).to_string(), "10.0.0.64/26");
        assert_eq!(block_of(ip("10.1.255.255")).to_string(), "10.1.255.192/26");
    }

    #[test]
    fn an_ipv6_address_is_in_its_aligned_slash_122() {
        assert_eq!(block_of(ip("fd00::1")).to_string(), "fd00::/122");
        assert_eq!(block_of(ip("fd00::40")).to_string(), "fd00::40/122");
        assert_eq!(block_of(ip("fd00::7f")).to_string(), "fd00::40/122");
    }

    #[test]
    fn block_names_are_distinct_per_block_and_valid_object_names() {
        let a = block_name(&block_of(ip("10.0.0.64")));
        assert_eq!(a, "v4-10-0-0-64-26");
        let b = block_name(&block_of(ip("fd00::41")));
        assert_eq!(b, "v6-fd00-0000-0000-0000-0000-0000-0000-0040-122");
        assert_ne!(
            block_name(&block_of(ip("fd00::1:0"))),
            block_name(&block_of(ip("fd00:0:0:1::")))
        );
        assert_eq!(block_named(&a), Some(block_of(ip("10.0.0.64"))));
        assert_eq!(block_named(&b), Some(block_of(ip("fd00::41"))));
        for bad in [
            "v4-10-0-0-65-26",
            "v4-10-0-0-64-24",
            "v6-fd00--40-122",
            "v4-10-0-0-64",
            "ipblock",
            "v5-10-0-0-64-26",
        ] {
            assert_eq!(block_named(bad), None, "{bad}");
        }
        for name in [a, b] {
            assert!(name.len() <= 253);
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            );
        }
    }
}
