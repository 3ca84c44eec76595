//! Ethernet frames of the probes, and the parser that reads what comes back: ARP (RFC 826, with
//! RFC 5227's probe and announcement shapes) and IPv6 Neighbor Solicitation / Advertisement
//! (RFC 4861, with RFC 4862's duplicate address detection shape).
//!
//! Fixed headers are read and written with pnet's packet types; NDP options are walked here,
//! because pnet's option length function multiplies the 8-bit length field in `u8`, which
//! overflows (a panic in debug builds) on a hostile option of 32 units or more. Public so that
//! tests and tools can build the same frames and read captures with the same rules.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use pnet_packet::Packet;
use pnet_packet::arp::{ArpHardwareTypes, ArpOperation, ArpPacket, MutableArpPacket};
use pnet_packet::ethernet::{EtherTypes, EthernetPacket, MutableEthernetPacket};
use pnet_packet::icmpv6::ndp::{
    MutableNeighborAdvertPacket, MutableNeighborSolicitPacket, NeighborAdvertPacket,
    NeighborSolicitPacket,
};
use pnet_packet::icmpv6::{self, Icmpv6Code, Icmpv6Packet, Icmpv6Types, MutableIcmpv6Packet};
use pnet_packet::ip::IpNextHeaderProtocols;
use pnet_packet::ipv6::{Ipv6Packet, MutableIpv6Packet};

/// An Ethernet (EUI-48) address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    pub fn octets(self) -> [u8; 6] {
        self.0
    }

    /// The multicast MAC of an IPv6 multicast group: 33:33 and the group's low 32 bits.
    pub fn ipv6_multicast(group: Ipv6Addr) -> MacAddr {
        let g = group.octets();
        MacAddr([0x33, 0x33, g[12], g[13], g[14], g[15]])
    }

    fn to_pnet(self) -> pnet_base::MacAddr {
        let [a, b, c, d, e, f] = self.0;
        pnet_base::MacAddr::new(a, b, c, d, e, f)
    }

    fn from_pnet(m: pnet_base::MacAddr) -> MacAddr {
        MacAddr(m.octets())
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        MacAddr(octets)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ARP_REQUEST: u16 = 1;
pub const ARP_REPLY: u16 = 2;
/// Neighbor Advertisement flags (RFC 4861 §4.4).
pub const NA_ROUTER: u8 = 0x80;
pub const NA_SOLICITED: u8 = 0x40;
pub const NA_OVERRIDE: u8 = 0x20;
/// ff02::1, every node on the link.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

const ETH_LEN: usize = 14;
/// The shortest Ethernet frame without its FCS; shorter ones are padded, as a NIC would.
const ETH_MIN: usize = 60;
const IPV6_LEN: usize = 40;
/// ICMPv6 type, code, checksum, flags or reserved, target address.
const ND_LEN: usize = 24;
const OPT_SOURCE_LL: u8 = 1;
const OPT_TARGET_LL: u8 = 2;
const HOP_LIMIT: u8 = 255;

/// ff02::1:ffXX:XXXX: the group a node joins for each of its addresses (RFC 4291 §2.7.1).
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

fn ethernet(buf: &mut [u8], dst: MacAddr, src: MacAddr, ethertype: u16) {
    let mut eth = MutableEthernetPacket::new(buf).expect("frame buffers hold an Ethernet header");
    eth.set_destination(dst.to_pnet());
    eth.set_source(src.to_pnet());
    eth.set_ethertype(pnet_packet::ethernet::EtherType::new(ethertype));
}

/// An ARP frame for IPv4 over Ethernet, padded to 60 bytes.
pub fn arp(
    op: u16,
    eth_dst: MacAddr,
    sha: MacAddr,
    spa: Ipv4Addr,
    tha: MacAddr,
    tpa: Ipv4Addr,
) -> Vec<u8> {
    let mut buf = vec![0u8; ETH_MIN];
    ethernet(&mut buf, eth_dst, sha, ETHERTYPE_ARP);
    let mut a = MutableArpPacket::new(&mut buf[ETH_LEN..]).expect("60 bytes hold an ARP packet");
    a.set_hardware_type(ArpHardwareTypes::Ethernet);
    a.set_protocol_type(EtherTypes::Ipv4);
    a.set_hw_addr_len(6);
    a.set_proto_addr_len(4);
    a.set_operation(ArpOperation::new(op));
    a.set_sender_hw_addr(sha.to_pnet());
    a.set_sender_proto_addr(spa);
    a.set_target_hw_addr(tha.to_pnet());
    a.set_target_proto_addr(tpa);
    buf
}

/// RFC 5227's ARP probe: a broadcast request for `target` from sender 0.0.0.0, so that no
/// neighbour's cache learns anything from it.
pub fn arp_probe(own: MacAddr, target: Ipv4Addr) -> Vec<u8> {
    arp(
        ARP_REQUEST,
        MacAddr::BROADCAST,
        own,
        Ipv4Addr::UNSPECIFIED,
        MacAddr::ZERO,
        target,
    )
}

/// RFC 5227's ARP announcement (a gratuitous ARP): a broadcast request with `addr` as both
/// sender and target, so that neighbours holding an entry for `addr` update it to `own`.
pub fn arp_announcement(own: MacAddr, addr: Ipv4Addr) -> Vec<u8> {
    arp(
        ARP_REQUEST,
        MacAddr::BROADCAST,
        own,
        addr,
        MacAddr::ZERO,
        addr,
    )
}

/// Ethernet + IPv6 (hop limit 255, ICMPv6) + an NDP message of `nd_len` bytes written by
/// `fill`, with the ICMPv6 checksum computed last.
fn ndp(
    eth_dst: MacAddr,
    eth_src: MacAddr,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    nd_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Vec<u8> {
    let mut buf = vec![0u8; (ETH_LEN + IPV6_LEN + nd_len).max(ETH_MIN)];
    ethernet(&mut buf, eth_dst, eth_src, ETHERTYPE_IPV6);
    let mut ip = MutableIpv6Packet::new(&mut buf[ETH_LEN..]).expect("sized for IPv6");
    ip.set_version(6);
    ip.set_payload_length(nd_len as u16);
    ip.set_next_header(IpNextHeaderProtocols::Icmpv6);
    ip.set_hop_limit(HOP_LIMIT);
    ip.set_source(src);
    ip.set_destination(dst);
    let body = &mut buf[ETH_LEN + IPV6_LEN..ETH_LEN + IPV6_LEN + nd_len];
    fill(body);
    let mut icmp = MutableIcmpv6Packet::new(body).expect("sized for ICMPv6");
    let sum = icmpv6::checksum(&icmp.to_immutable(), &src, &dst);
    icmp.set_checksum(sum);
    buf
}

/// A link-layer address option (RFC 4861 §4.6.1): type, length 1 (8 bytes), the address.
fn ll_option(kind: u8, mac: MacAddr) -> [u8; 8] {
    let m = mac.0;
    [kind, 1, m[0], m[1], m[2], m[3], m[4], m[5]]
}

/// A Neighbor Solicitation for `target`, to its solicited-node group. From `src` = `::` it is
/// RFC 4862's duplicate address detection probe and carries no source link-layer option (the
/// RFC forbids one); from an address it carries `own` as that option.
pub fn neighbor_solicitation(own: MacAddr, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let dst = solicited_node(target);
    let with_option = !src.is_unspecified();
    let len = ND_LEN + if with_option { 8 } else { 0 };
    ndp(MacAddr::ipv6_multicast(dst), own, src, dst, len, |body| {
        let mut ns = MutableNeighborSolicitPacket::new(body).expect("sized for NS");
        ns.set_icmpv6_type(Icmpv6Types::NeighborSolicit);
        ns.set_icmpv6_code(Icmpv6Code::new(0));
        ns.set_target_addr(target);
        if with_option {
            body[ND_LEN..].copy_from_slice(&ll_option(OPT_SOURCE_LL, own));
        }
    })
}

/// A Neighbor Advertisement for `target` with `own` as its target link-layer option.
pub fn neighbor_advertisement(
    eth_dst: MacAddr,
    own: MacAddr,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    target: Ipv6Addr,
    flags: u8,
) -> Vec<u8> {
    ndp(eth_dst, own, src, dst, ND_LEN + 8, |body| {
        let mut na = MutableNeighborAdvertPacket::new(body).expect("sized for NA");
        na.set_icmpv6_type(Icmpv6Types::NeighborAdvert);
        na.set_icmpv6_code(Icmpv6Code::new(0));
        na.set_flags(flags);
        na.set_target_addr(target);
        body[ND_LEN..].copy_from_slice(&ll_option(OPT_TARGET_LL, own));
    })
}

/// RFC 4861 §7.2.6's unsolicited advertisement: to every node, Override set, Solicited not, so
/// that neighbours holding an entry for `addr` update it to `own`.
pub fn unsolicited_advertisement(own: MacAddr, addr: Ipv6Addr) -> Vec<u8> {
    neighbor_advertisement(
        MacAddr::ipv6_multicast(ALL_NODES),
        own,
        addr,
        ALL_NODES,
        addr,
        NA_OVERRIDE,
    )
}

/// What a received frame says about the neighbourhood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Neighbor {
    Arp {
        op: u16,
        sha: MacAddr,
        spa: Ipv4Addr,
        tha: MacAddr,
        tpa: Ipv4Addr,
    },
    Solicitation {
        eth_src: MacAddr,
        src: Ipv6Addr,
        target: Ipv6Addr,
        source_ll: Option<MacAddr>,
    },
    Advertisement {
        eth_src: MacAddr,
        src: Ipv6Addr,
        target: Ipv6Addr,
        flags: u8,
        target_ll: Option<MacAddr>,
    },
}

/// Reads an ARP request or reply (IPv4 over Ethernet), or a Neighbor Solicitation or
/// Advertisement that passes RFC 4861's validity checks (hop limit 255, code 0, checksum, no
/// zero-length option, a DAD solicitation only to a solicited-node group and without a source
/// link-layer option). Anything else, including every malformed frame, is `None`.
pub fn parse(frame: &[u8]) -> Option<Neighbor> {
    let eth = EthernetPacket::new(frame)?;
    match eth.get_ethertype().0 {
        ETHERTYPE_ARP => parse_arp(eth.payload()),
        ETHERTYPE_IPV6 => parse_ndp(MacAddr::from_pnet(eth.get_source()), eth.payload()),
        _ => None,
    }
}

fn parse_arp(bytes: &[u8]) -> Option<Neighbor> {
    let a = ArpPacket::new(bytes)?;
    let ethernet_ipv4 = a.get_hardware_type() == ArpHardwareTypes::Ethernet
        && a.get_protocol_type() == EtherTypes::Ipv4
        && a.get_hw_addr_len() == 6
        && a.get_proto_addr_len() == 4;
    let op = a.get_operation().0;
    if !ethernet_ipv4 || !(op == ARP_REQUEST || op == ARP_REPLY) {
        return None;
    }
    Some(Neighbor::Arp {
        op,
        sha: MacAddr::from_pnet(a.get_sender_hw_addr()),
        spa: a.get_sender_proto_addr(),
        tha: MacAddr::from_pnet(a.get_target_hw_addr()),
        tpa: a.get_target_proto_addr(),
    })
}

fn parse_ndp(eth_src: MacAddr, bytes: &[u8]) -> Option<Neighbor> {
    let ip = Ipv6Packet::new(bytes)?;
    let len = ip.get_payload_length() as usize;
    if ip.get_version() != 6
        || ip.get_next_header() != IpNextHeaderProtocols::Icmpv6
        || ip.get_hop_limit() != HOP_LIMIT
        || len < ND_LEN
        || bytes.len() < IPV6_LEN + len
    {
        return None;
    }
    let (src, dst) = (ip.get_source(), ip.get_destination());
    // The IPv6 payload length, not the frame length: short frames carry Ethernet padding.
    let body = &bytes[IPV6_LEN..IPV6_LEN + len];
    let icmp = Icmpv6Packet::new(body)?;
    if icmp.get_icmpv6_code().0 != 0 || icmp.get_checksum() != icmpv6::checksum(&icmp, &src, &dst) {
        return None;
    }
    let options = &body[ND_LEN..];
    match icmp.get_icmpv6_type() {
        Icmpv6Types::NeighborSolicit => {
            let ns = NeighborSolicitPacket::new(body)?;
            let source_ll = ll_address(options, OPT_SOURCE_LL)?;
            if src.is_unspecified()
                && (dst != solicited_node(ns.get_target_addr()) || source_ll.is_some())
            {
                return None;
            }
            Some(Neighbor::Solicitation {
                eth_src,
                src,
                target: ns.get_target_addr(),
                source_ll,
            })
        }
        Icmpv6Types::NeighborAdvert => {
            let na = NeighborAdvertPacket::new(body)?;
            Some(Neighbor::Advertisement {
                eth_src,
                src,
                target: na.get_target_addr(),
                flags: na.get_flags(),
                target_ll: ll_address(options, OPT_TARGET_LL)?,
            })
        }
        _ => None,
    }
}

/// Walks NDP options: `None` when they are malformed (a zero length, or one that runs past the
/// end), else the first link-layer address option of `kind`, if any.
fn ll_address(mut options: &[u8], kind: u8) -> Option<Option<MacAddr>> {
    let mut found = None;
    while !options.is_empty() {
        let units = *options.get(1)? as usize;
        let len = units * 8;
        if units == 0 || len > options.len() {
            return None;
        }
        if options[0] == kind && len >= 8 && found.is_none() {
            let m = &options[2..8];
            found = Some(MacAddr([m[0], m[1], m[2], m[3], m[4], m[5]]));
        }
        options = &options[len..];
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
    const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn arp_probe_is_rfc_5227_shaped_byte_for_byte() {
        let f = arp_probe(OWN, Ipv4Addr::new(10, 1, 2, 3));
        let want = hex("ffffffffffff 020000000001 0806 \
             0001 0800 06 04 0001 020000000001 00000000 000000000000 0a010203");
        assert_eq!(&f[..42], &want[..]);
        assert_eq!(f.len(), 60);
        assert!(f[42..].iter().all(|&b| b == 0), "padding is zero");
    }

    #[test]
    fn arp_frames_round_trip() {
        let a = Ipv4Addr::new(192, 0, 2, 7);
        assert_eq!(
            parse(&arp_announcement(OWN, a)),
            Some(Neighbor::Arp {
                op: ARP_REQUEST,
                sha: OWN,
                spa: a,
                tha: MacAddr::ZERO,
                tpa: a
            })
        );
        let reply = arp(ARP_REPLY, OWN, PEER, a, OWN, Ipv4Addr::UNSPECIFIED);
        assert_eq!(
            parse(&reply),
            Some(Neighbor::Arp {
                op: ARP_REPLY,
                sha: PEER,
                spa: a,
                tha: OWN,
                tpa: Ipv4Addr::UNSPECIFIED
            })
        );
    }

    #[test]
    fn odd_arp_is_ignored() {
        let mut f = arp_probe(OWN, Ipv4Addr::new(10, 0, 0, 1));
        assert!(parse(&f[..14 + 27]).is_none(), "truncated");
        f[14 + 7] = 3; // RARP request
        assert!(parse(&f).is_none());
        let mut f = arp_probe(OWN, Ipv4Addr::new(10, 0, 0, 1));
        f[14 + 4] = 8; // hardware address length
        assert!(parse(&f).is_none());
        assert!(parse(&[0u8; 10]).is_none());
    }

    #[test]
    fn dad_solicitation_is_rfc_4862_shaped() {
        let target: Ipv6Addr = "fd00::12:3456".parse().unwrap();
        let f = neighbor_solicitation(OWN, Ipv6Addr::UNSPECIFIED, target);
        assert_eq!(f.len(), 14 + 40 + 24);
        assert_eq!(&f[..6], &[0x33, 0x33, 0xff, 0x12, 0x34, 0x56]);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!(f[14 + 6], 58, "next header ICMPv6");
        assert_eq!(f[14 + 7], 255, "hop limit");
        assert!(f[22..38].iter().all(|&b| b == 0), "from ::");
        assert_eq!(
            &f[38..54],
            &"ff02::1:ff12:3456".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(f[54], 135);
        assert_eq!(&f[62..78], &target.octets());
        assert_eq!(
            parse(&f),
            Some(Neighbor::Solicitation {
                eth_src: OWN,
                src: Ipv6Addr::UNSPECIFIED,
                target,
                source_ll: None
            })
        );
    }

    #[test]
    fn checksum_matches_an_independent_computation() {
        let target: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let f = unsolicited_advertisement(OWN, target);
        // RFC 1071 over the pseudo-header (src, dst, length, next header) and the message.
        let body = &f[54..];
        let mut sum: u32 = 0;
        let mut words = |b: &[u8]| {
            for c in b.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
        };
        words(&f[22..54]);
        words(&(body.len() as u32).to_be_bytes());
        words(&[0, 0, 0, 58]);
        words(body);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "a correct checksum sums to all ones");
    }

    #[test]
    fn advertisements_round_trip_with_their_option() {
        let a: Ipv6Addr = "fd00:a::5".parse().unwrap();
        let f = unsolicited_advertisement(OWN, a);
        assert_eq!(&f[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(
            parse(&f),
            Some(Neighbor::Advertisement {
                eth_src: OWN,
                src: a,
                target: a,
                flags: NA_OVERRIDE,
                target_ll: Some(OWN)
            })
        );
        let ns = neighbor_solicitation(PEER, "fe80::2".parse().unwrap(), a);
        assert!(matches!(
            parse(&ns),
            Some(Neighbor::Solicitation { source_ll: Some(m), .. }) if m == PEER
        ));
    }

    /// Recomputes the ICMPv6 checksum of an edited frame, so that the edit itself is tested.
    fn fix_checksum(f: &mut [u8]) {
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&f[22..38]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
        let len = u16::from_be_bytes([f[18], f[19]]) as usize;
        let mut icmp = MutableIcmpv6Packet::new(&mut f[54..54 + len]).unwrap();
        let sum = icmpv6::checksum(&icmp.to_immutable(), &src, &dst);
        icmp.set_checksum(sum);
    }

    #[test]
    fn invalid_ndp_is_ignored() {
        let a: Ipv6Addr = "fd00::9".parse().unwrap();
        let good = unsolicited_advertisement(OWN, a);
        let mut f = good.clone();
        f[60] ^= 1; // a flipped bit: bad checksum
        assert!(parse(&f).is_none());
        type Edit = fn(&mut Vec<u8>);
        let edits: [(&str, Edit); 5] = [
            ("hop limit 64: came through a router", |f| f[14 + 7] = 64),
            ("code 1", |f| f[55] = 1),
            ("zero-length option", |f| f[79] = 0),
            ("an option of 40 units, far past the end", |f| f[79] = 40),
            ("payload length past the frame", |f| f[19] = 200),
        ];
        for (what, edit) in edits {
            let mut f = good.clone();
            edit(&mut f);
            if f[19] != 200 {
                fix_checksum(&mut f);
            }
            assert!(parse(&f).is_none(), "{what}");
        }
        let mut f = good.clone();
        fix_checksum(&mut f);
        assert!(parse(&f).is_some(), "fix_checksum keeps a good frame good");
        assert!(parse(&good[..good.len() - 1]).is_none(), "truncated");
        // A DAD solicitation must go to the target's solicited-node group, without an option.
        let dad = neighbor_solicitation(PEER, Ipv6Addr::UNSPECIFIED, a);
        let mut f = dad.clone();
        f[14 + 24 + 15] ^= 1;
        fix_checksum(&mut f);
        assert!(parse(&f).is_none(), "wrong group");
        let mut f = neighbor_solicitation(PEER, "fe80::1".parse().unwrap(), a);
        f[22..38].fill(0);
        fix_checksum(&mut f);
        assert!(
            parse(&f).is_none(),
            "from :: with a source link-layer option"
        );
    }

    #[test]
    fn options_are_walked_past_unknown_kinds() {
        let mut opts = vec![14, 1, 0, 0, 0, 0, 0, 0]; // a nonce option
        opts.extend_from_slice(&ll_option(OPT_TARGET_LL, PEER));
        assert_eq!(ll_address(&opts, OPT_TARGET_LL), Some(Some(PEER)));
        assert_eq!(ll_address(&opts, OPT_SOURCE_LL), Some(None));
        assert_eq!(ll_address(&[], OPT_SOURCE_LL), Some(None));
        assert_eq!(ll_address(&[1], OPT_SOURCE_LL), None);
        assert_eq!(ll_address(&[1, 255, 0, 0], OPT_SOURCE_LL), None);
    }

    #[test]
    fn multicast_addresses() {
        let a: Ipv6Addr = "2001:db8::aa:bbcc".parse().unwrap();
        assert_eq!(
            solicited_node(a),
            "ff02::1:ffaa:bbcc".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            MacAddr::ipv6_multicast(solicited_node(a)).to_string(),
            "33:33:ff:aa:bb:cc"
        );
    }
}
