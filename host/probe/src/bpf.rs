//! Classic BPF programs for the probe sockets: the kernel drops every frame that cannot concern
//! the probed address before it reaches the socket, so a flood of unrelated ARP or NDP traffic
//! neither fills the receive buffer nor wakes the probe. The filter only narrows: every frame
//! that passes is still parsed and classified in userspace (`link::classify`).

use std::net::{Ipv4Addr, Ipv6Addr};

use libc::sock_filter;

/// Offsets in an Ethernet frame (no VLAN tag: the kernel strips it before packet sockets see
/// the frame).
const ETHERTYPE: u32 = 12;
const ARP_SPA: u32 = 14 + 14;
const ARP_TPA: u32 = 14 + 24;
const IPV6_NEXT_HEADER: u32 = 14 + 6;
const IPV6_HOP_LIMIT: u32 = 14 + 7;
const IPV6_SRC: u32 = 14 + 8;
const ICMPV6_TYPE: u32 = 14 + 40;
const ND_TARGET: u32 = 14 + 40 + 8;

/// Keep the whole frame.
const ACCEPT: u32 = 0x0004_0000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum To {
    Next,
    Accept,
    Drop,
    Label(u8),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Load 1, 2 or 4 bytes at an absolute offset, big-endian.
    Load(u8, u32),
    /// Jump on accumulator == k.
    Eq(u32, To, To),
    Label(u8),
}

/// Resolves the symbolic jumps: `Accept` and `Drop` are two return instructions after the code.
fn assemble(ops: &[Op]) -> Vec<sock_filter> {
    let mut index = Vec::with_capacity(ops.len());
    let mut labels = Vec::new();
    let mut n = 0usize;
    for op in ops {
        index.push(n);
        match op {
            Op::Label(l) => labels.push((*l, n)),
            _ => n += 1,
        }
    }
    let (accept, drop) = (n, n + 1);
    let target = |here: usize, to: To| -> u8 {
        let at = match to {
            To::Next => here + 1,
            To::Accept => accept,
            To::Drop => drop,
            To::Label(l) => labels
                .iter()
                .find(|(k, _)| *k == l)
                .map(|(_, at)| *at)
                .expect("every jump label is defined"),
        };
        u8::try_from(at - here - 1).expect("BPF jumps are forward and short")
    };
    let mut code = Vec::with_capacity(n + 2);
    for (op, &here) in ops.iter().zip(&index) {
        match *op {
            Op::Load(size, offset) => {
                let width = match size {
                    1 => libc::BPF_B,
                    2 => libc::BPF_H,
                    _ => libc::BPF_W,
                };
                code.push(insn(libc::BPF_LD | width | libc::BPF_ABS, 0, 0, offset));
            }
            Op::Eq(k, yes, no) => code.push(insn(
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                target(here, yes),
                target(here, no),
                k,
            )),
            Op::Label(_) => {}
        }
    }
    code.push(insn(libc::BPF_RET | libc::BPF_K, 0, 0, ACCEPT));
    code.push(insn(libc::BPF_RET | libc::BPF_K, 0, 0, 0));
    code
}

fn insn(code: u32, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// ARP whose sender is `addr` (a holder answering or announcing), or a request for `addr` from
/// sender 0.0.0.0 (another host probing for it, RFC 5227 §2.1.1).
pub fn arp(addr: Ipv4Addr) -> Vec<sock_filter> {
    let a = u32::from(addr);
    assemble(&[
        Op::Load(2, ETHERTYPE),
        Op::Eq(0x0806, To::Next, To::Drop),
        Op::Load(4, ARP_SPA),
        Op::Eq(a, To::Accept, To::Next),
        Op::Load(4, ARP_TPA),
        Op::Eq(a, To::Next, To::Drop),
        Op::Load(4, ARP_SPA),
        Op::Eq(0, To::Accept, To::Drop),
    ])
}

/// Four loads and compares: the 16 bytes at `offset` are `addr`.
fn is_addr(offset: u32, addr: Ipv6Addr, yes: To, no: To) -> Vec<Op> {
    let o = addr.octets();
    let mut ops = Vec::with_capacity(8);
    for i in 0..4 {
        let word = u32::from_be_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]);
        ops.push(Op::Load(4, offset + 4 * i as u32));
        ops.push(Op::Eq(word, if i == 3 { yes } else { To::Next }, no));
    }
    ops
}

/// ICMPv6 with hop limit 255 that is a Neighbor Advertisement for `addr`, or a Neighbor
/// Solicitation for `addr` (a DAD probe) or from `addr` (a holder resolving a neighbour).
pub fn ndp(addr: Ipv6Addr) -> Vec<sock_filter> {
    const ADVERT: u8 = 1;
    const SOURCE: u8 = 2;
    let mut ops = vec![
        Op::Load(2, ETHERTYPE),
        Op::Eq(0x86dd, To::Next, To::Drop),
        Op::Load(1, IPV6_NEXT_HEADER),
        Op::Eq(58, To::Next, To::Drop),
        Op::Load(1, IPV6_HOP_LIMIT),
        Op::Eq(255, To::Next, To::Drop),
        Op::Load(1, ICMPV6_TYPE),
        Op::Eq(136, To::Label(ADVERT), To::Next),
        Op::Eq(135, To::Next, To::Drop),
    ];
    ops.extend(is_addr(ND_TARGET, addr, To::Accept, To::Label(SOURCE)));
    ops.push(Op::Label(ADVERT));
    ops.extend(is_addr(ND_TARGET, addr, To::Accept, To::Drop));
    ops.push(Op::Label(SOURCE));
    ops.extend(is_addr(IPV6_SRC, addr, To::Accept, To::Drop));
    assemble(&ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{self, MacAddr};

    /// The subset of classic BPF the programs use, with the kernel's rule that a load past
    /// the end of the frame drops it.
    fn run(prog: &[sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = prog[pc];
            let code = u32::from(i.code);
            if code == libc::BPF_RET | libc::BPF_K {
                return i.k;
            }
            if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                pc += 1 + usize::from(if a == i.k { i.jt } else { i.jf });
                continue;
            }
            let width = match code & !(libc::BPF_LD | libc::BPF_ABS) {
                w if w == libc::BPF_B => 1,
                w if w == libc::BPF_H => 2,
                w if w == libc::BPF_W => 4,
                _ => panic!("unexpected instruction {code:#x}"),
            };
            let at = i.k as usize;
            let Some(bytes) = pkt.get(at..at + width) else {
                return 0;
            };
            a = bytes.iter().fold(0, |acc, &b| (acc << 8) | u32::from(b));
            pc += 1;
        }
    }

    const OWN: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const PEER: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    #[test]
    fn arp_filter_keeps_only_frames_about_the_address() {
        let t = Ipv4Addr::new(10, 7, 0, 5);
        let other = Ipv4Addr::new(10, 7, 0, 6);
        let prog = arp(t);
        let keep = [
            frame::arp(frame::ARP_REPLY, OWN, PEER, t, OWN, Ipv4Addr::UNSPECIFIED),
            frame::arp_announcement(PEER, t),
            frame::arp_probe(PEER, t),
            frame::arp(
                frame::ARP_REQUEST,
                MacAddr::BROADCAST,
                PEER,
                t,
                MacAddr::ZERO,
                other,
            ),
        ];
        for f in &keep {
            assert_eq!(run(&prog, f), ACCEPT, "{:?}", frame::parse(f));
        }
        let drop = [
            frame::arp(
                frame::ARP_REPLY,
                OWN,
                PEER,
                other,
                OWN,
                Ipv4Addr::UNSPECIFIED,
            ),
            frame::arp_announcement(PEER, other),
            frame::arp_probe(PEER, other),
            // Someone resolving the address says nothing about who holds it.
            frame::arp(
                frame::ARP_REQUEST,
                MacAddr::BROADCAST,
                PEER,
                other,
                MacAddr::ZERO,
                t,
            ),
            frame::unsolicited_advertisement(PEER, "fd00::5".parse().unwrap()),
        ];
        for f in &drop {
            assert_eq!(run(&prog, f), 0, "{:?}", frame::parse(f));
        }
        assert_eq!(run(&prog, &keep[0][..30]), 0, "truncated");
    }

    #[test]
    fn ndp_filter_keeps_only_frames_about_the_address() {
        let t: Ipv6Addr = "fd00:1::5".parse().unwrap();
        let other: Ipv6Addr = "fd00:1::6".parse().unwrap();
        let ll: Ipv6Addr = "fe80::2".parse().unwrap();
        let prog = ndp(t);
        let keep = [
            frame::unsolicited_advertisement(PEER, t),
            frame::neighbor_advertisement(OWN, PEER, ll, ll, t, frame::NA_SOLICITED),
            frame::neighbor_solicitation(PEER, Ipv6Addr::UNSPECIFIED, t),
            frame::neighbor_solicitation(PEER, t, other),
        ];
        for f in &keep {
            assert_eq!(run(&prog, f), ACCEPT, "{:?}", frame::parse(f));
        }
        let mut routed = frame::unsolicited_advertisement(PEER, t);
        routed[21] = 64;
        let drop = [
            frame::unsolicited_advertisement(PEER, other),
            frame::neighbor_solicitation(PEER, Ipv6Addr::UNSPECIFIED, other),
            frame::neighbor_solicitation(PEER, ll, other),
            frame::arp_announcement(PEER, Ipv4Addr::new(10, 0, 0, 1)),
            routed,
        ];
        for f in &drop {
            assert_eq!(run(&prog, f), 0, "{:?}", frame::parse(f));
        }
    }

    #[test]
    fn labels_resolve_forward() {
        let prog = assemble(&[
            Op::Load(1, 0),
            Op::Eq(1, To::Label(9), To::Next),
            Op::Eq(2, To::Accept, To::Drop),
            Op::Label(9),
            Op::Eq(1, To::Accept, To::Drop),
        ]);
        assert_eq!(prog.len(), 6);
        assert_eq!((prog[1].jt, prog[1].jf), (1, 0));
        assert_eq!((prog[2].jt, prog[2].jf), (1, 2));
        assert_eq!(run(&prog, &[1]), ACCEPT);
        assert_eq!(run(&prog, &[2]), ACCEPT);
        assert_eq!(run(&prog, &[3]), 0);
    }
}
