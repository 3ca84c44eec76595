//! Signals aimed at the probe thread (a handler installed without SA_RESTART, so every blocking
//! call it interrupts fails with EINTR) neither end a probe early, nor stretch it, nor lose an
//! answer that arrives late. Its own test binary: the handler is process-wide.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::common::*;
use allot_probe::frame::{self, MacAddr, Neighbor};
use allot_probe::{PROBE_THREAD_NAME, ProbeConfig, ProbeOutcome, probe_conflict};

static DELIVERED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count(_: libc::c_int) {
    DELIVERED.fetch_add(1, Ordering::Relaxed);
}

/// Sends SIGUSR1 to every thread of this process named [`PROBE_THREAD_NAME`], every half
/// millisecond, until dropped.
struct Interrupter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Interrupter {
    fn start() -> Interrupter {
        // SAFETY: installs a handler that only touches an atomic; no SA_RESTART.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = count as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::spawn(move || {
            let pid = std::process::id() as libc::pid_t;
            while !s.load(Ordering::Relaxed) {
                for task in std::fs::read_dir("/proc/self/task").into_iter().flatten() {
                    let Ok(task) = task else { continue };
                    let comm =
                        std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                    if comm.trim_end() != PROBE_THREAD_NAME {
                        continue;
                    }
                    let Ok(tid) = task.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                        continue;
                    };
                    // SAFETY: tgkill(2) to a thread of this process; it may have exited (ESRCH).
                    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) };
                }
                thread::sleep(Duration::from_micros(500));
            }
        });
        Interrupter {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Interrupter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const HOLDER: MacAddr = MacAddr([0x02, 0xa1, 0, 0, 0, 0x77]);

/// A host that answers the probe for `target` only `delay` after it sees it.
fn slow_holder(raw: Raw, target: IpAddr, delay: Duration) -> JoinHandle<bool> {
    thread::spawn(move || {
        let probe = raw.wait_for(Duration::from_secs(3), |f| match frame::parse(f) {
            Some(Neighbor::Arp { sha, tpa, .. }) => sha == POD_MAC && IpAddr::V4(tpa) == target,
            Some(Neighbor::Solicitation {
                eth_src, target: t, ..
            }) => eth_src == POD_MAC && IpAddr::V6(t) == target,
            _ => false,
        });
        if probe.is_none() {
            return false;
        }
        thread::sleep(delay);
        let answer = match target {
            IpAddr::V4(t) => frame::arp(
                frame::ARP_REPLY,
                POD_MAC,
                HOLDER,
                t,
                POD_MAC,
                Ipv4Addr::UNSPECIFIED,
            ),
            IpAddr::V6(t) => {
                let ll: Ipv6Addr = "fe80::77".parse().unwrap();
                frame::neighbor_advertisement(
                    MacAddr::ipv6_multicast(frame::ALL_NODES),
                    HOLDER,
                    ll,
                    frame::ALL_NODES,
                    t,
                    frame::NA_OVERRIDE,
                )
            }
        };
        raw.send(&answer).is_ok()
    })
}

fn late_answer_under_signals(target: IpAddr) {
    let lab = Lab::new();
    // 150 ms: the answer to the first probe arrives during the second try's wait.
    let delay = Duration::from_millis(150);
    let holder = slow_holder(Raw::open(&lab.peer, IF), target, delay);
    let interrupter = Interrupter::start();
    let before = DELIVERED.load(Ordering::Relaxed);
    let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, target, ProbeConfig::default()));
    let signals = DELIVERED.load(Ordering::Relaxed) - before;
    drop(interrupter);
    assert!(holder.join().unwrap(), "the holder never saw the probe");
    eprintln!("{target}: late conflict found in {took:?} through {signals} signals");
    assert_eq!(out.unwrap(), ProbeOutcome::Conflict { mac: HOLDER });
    assert!(took >= delay && took < delay + SLACK, "took {took:?}");
    assert!(signals > 20, "only {signals} signals reached the probe");
}

#[test]
fn a_late_ipv4_answer_is_found_through_signals() {
    late_answer_under_signals(v4(50));
}

#[test]
fn a_late_ipv6_answer_is_found_through_signals() {
    late_answer_under_signals(v6(0x50));
}

#[test]
fn signals_do_not_end_the_wait_for_a_free_address_early() {
    let lab = Lab::new();
    let interrupter = Interrupter::start();
    let cfg = ProbeConfig::default();
    let before = DELIVERED.load(Ordering::Relaxed);
    for addr in [v4(51), v6(0x51)] {
        let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, addr, cfg));
        assert_eq!(out.unwrap(), ProbeOutcome::Free, "{addr}");
        let window = cfg.timeout * cfg.tries;
        assert!(
            took >= window && took < window + SLACK,
            "{addr} took {took:?}"
        );
    }
    drop(interrupter);
    let signals = DELIVERED.load(Ordering::Relaxed) - before;
    assert!(signals > 40, "only {signals} signals reached the probes");
}
