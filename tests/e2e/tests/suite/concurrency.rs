//! Many ADDs at once, and a crash of the agent in the middle of a run of ADDs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use allot_e2e::*;

#[test]
fn fifty_concurrent_adds_in_fifty_namespaces_get_fifty_distinct_addresses() {
    const PODS: usize = 50;
    let pools = ippool(
        "wide",
        "10.81.0.0/24",
        Some("10.81.0.1"),
        &["10.81.0.10-10.81.0.200"],
    );
    let Some(lab) = Lab::new("fifty_concurrent_adds", &pools) else {
        return;
    };
    let conf = lab.bridge_conf(&["wide"], &[]);
    let pods: Vec<Attachment> = (0..PODS)
        .map(|i| Attachment::new(&format!("pod-{i}")))
        .collect();

    let barrier = Barrier::new(PODS);
    let adds: Vec<CniOutput> = thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|pod| {
                let (lab, conf, barrier) = (&lab, &conf, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    lab.cni("bridge", "ADD", pod, conf)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut seen = BTreeMap::new();
    for (pod, add) in pods.iter().zip(&adds) {
        add.expect_ok();
        let ip = add.ip();
        assert!(
            in_range(addr_of(&ip), "10.81.0.10", "10.81.0.200"),
            "{ip}:\n{add}"
        );
        assert_eq!(
            pod.addrs(),
            vec![ip.clone()],
            "{} holds another address",
            pod.name
        );
        if let Some(other) = seen.insert(ip.clone(), pod.name.clone()) {
            panic!("{ip} handed to both {other} and {}", pod.name);
        }
    }
    assert_eq!(seen.len(), PODS);
    assert_eq!(lab.agent.pool_counts("wide"), (191, 191 - PODS as u64));

    thread::scope(|s| {
        for pod in &pods {
            let (lab, conf) = (&lab, &conf);
            s.spawn(move || lab.cni("bridge", "DEL", pod, conf).expect_ok().clone());
        }
    });
    // A DEL the agent did not answer in time (a loaded machine) succeeds anyway and is journaled;
    // the agent replays it at its next tick. Every address is free again within seconds.
    let t = Instant::now();
    while lab.agent.pool_counts("wide") != (191, 191) && t.elapsed() < Duration::from_secs(10) {
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(lab.agent.pool_counts("wide"), (191, 191));
}

/// SIGKILL the agent (three times) while two workers keep adding pods, restart it, and check
/// that nothing an ADD reported was lost and nothing was handed out twice.
#[test]
fn agent_killed_mid_run_loses_no_claim_and_never_hands_out_twice() {
    const PER_WORKER: usize = 60;
    const WORKERS: usize = 2;
    let pools = ippool(
        "crash",
        "10.82.0.0/23",
        Some("10.82.0.1"),
        &["10.82.0.2-10.82.1.254"],
    );
    let Some(mut lab) = Lab::new("agent_killed_mid_run", &pools) else {
        return;
    };
    let total = lab.agent.pool_counts("crash").0;
    let conf = lab.bridge_conf(&["crash"], &[]);
    // allot's ADD configures nothing, so the attachments can share one namespace.
    let netns = Arc::new(Netns::new());

    let ok: Mutex<Vec<(Attachment, String)>> = Mutex::new(Vec::new());
    let failed: Mutex<Vec<(Attachment, CniOutput)>> = Mutex::new(Vec::new());
    let successes = AtomicUsize::new(0);
    // ADDs that waited for the restarting agent (the plugin retries a socket nobody listens
    // on, within the ADD's timeout) rather than failing.
    let waited = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (plugins, host) = (&lab.plugins, &lab.host);

    thread::scope(|s| {
        for w in 0..WORKERS {
            let (ok, failed, successes, waited, stop, conf, netns, plugins, host) = (
                &ok, &failed, &successes, &waited, &stop, &conf, &netns, plugins, host,
            );
            s.spawn(move || {
                let mut mine = 0;
                let deadline = Instant::now() + Duration::from_secs(120);
                let mut n = 0;
                while mine < PER_WORKER
                    && !stop.load(Ordering::Relaxed)
                    && Instant::now() < deadline
                {
                    n += 1;
                    let att = Attachment::in_netns(netns, &format!("w{w}-{n}"));
                    let started = Instant::now();
                    let out = Cni::new(plugins, "allot", "ADD", &conf.to_string())
                        .attachment(&att)
                        .run(Some(host));
                    if out.success() {
                        if started.elapsed() >= Duration::from_millis(250) {
                            waited.fetch_add(1, Ordering::Relaxed);
                        }
                        mine += 1;
                        successes.fetch_add(1, Ordering::Relaxed);
                        ok.lock().unwrap().push((att, out.ip()));
                    } else {
                        failed.lock().unwrap().push((att, out));
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            });
        }

        // Let the run get going, crash the agent, keep it down a moment, bring it back.
        let wait_for = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(120);
            while successes.load(Ordering::Relaxed) < n && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
        };
        // Three crashes, each after more ADDs went through, down for a while or restarted at once.
        for down in [400, 0, 150] {
            let before = successes.load(Ordering::Relaxed);
            wait_for(before + 12);
            lab.agent.kill9();
            thread::sleep(Duration::from_millis(down));
            lab.agent.restart();
        }
        let after = successes.load(Ordering::Relaxed);
        wait_for(after + 12);
        stop.store(true, Ordering::Relaxed);
    });

    let ok = ok.into_inner().unwrap();
    let failed = failed.into_inner().unwrap();
    let waited = waited.into_inner();
    println!(
        "{} ADDs succeeded ({waited} after waiting for the agent), {} failed while the agent \
         was down or restarting",
        ok.len(),
        failed.len()
    );
    assert!(
        !failed.is_empty() || waited > 0,
        "no ADD hit the downtime; the test proved nothing"
    );
    assert!(ok.len() >= 48, "only {} ADDs succeeded", ok.len());

    // Failures while the agent was down (an ADD in flight when it was killed) are CNI errors
    // that say "try again later".
    for (_, out) in &failed {
        out.expect_err(&[11]);
    }

    // No address twice.
    let mut held = BTreeMap::new();
    for (att, ip) in &ok {
        if let Some(other) = held.insert(ip.clone(), att.name.clone()) {
            panic!("{ip} handed to both {other} and {}", att.name);
        }
    }

    // Every reported claim is still held: the same ADD again returns the same address.
    for (att, ip) in &ok {
        let again = lab.cni("allot", "ADD", att, &conf);
        again.expect_ok();
        assert_eq!(
            &again.ip(),
            ip,
            "{} lost its address across the crash:\n{again}",
            att.name
        );
    }

    // The runtime cleans up failed ADDs with DEL (a claim made just before the crash, whose
    // answer never arrived, goes here).
    for (att, _) in &failed {
        lab.cni("allot", "DEL", att, &conf).expect_ok();
    }
    assert_eq!(
        lab.agent.pool_counts("crash"),
        (total, total - ok.len() as u64),
        "after DEL of the failed ADDs, exactly the reported claims are held"
    );

    // New pods never get a held address.
    let fresh: BTreeSet<String> = (0..20)
        .map(|i| {
            let att = Attachment::in_netns(&netns, &format!("fresh-{i}"));
            let out = lab.cni("allot", "ADD", &att, &conf);
            out.expect_ok();
            out.ip()
        })
        .collect();
    assert_eq!(fresh.len(), 20);
    for ip in &fresh {
        assert!(
            !held.contains_key(ip),
            "{ip} handed out again after the restart"
        );
    }
}

/// The runtime retrying while the first ADD is still running: concurrent ADDs of one container
/// and interface get one address and hold one claim. Even rounds line the ADDs up behind a
/// briefly frozen agent (SIGSTOP), so that it takes them all at once.
#[test]
fn concurrent_adds_of_one_attachment_get_one_address() {
    const RACERS: usize = 16;
    let pools = ippool(
        "race",
        "10.97.0.0/24",
        Some("10.97.0.1"),
        &["10.97.0.10-10.97.0.209"],
    );
    let Some(lab) = Lab::new("concurrent_adds_of_one_attachment", &pools) else {
        return;
    };
    let conf = lab.bridge_conf(&["race"], &[]);
    for round in 0..16 {
        let pod = Attachment::new(&format!("racer-{round}"));
        let barrier = Barrier::new(RACERS + 1);
        let frozen = round % 2 == 0;
        let outs: Vec<CniOutput> = thread::scope(|s| {
            let handles: Vec<_> = (0..RACERS)
                .map(|_| {
                    let (lab, conf, pod, barrier) = (&lab, &conf, &pod, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        lab.cni("allot", "ADD", pod, conf)
                    })
                })
                .collect();
            if frozen {
                lab.agent.freeze();
            }
            barrier.wait();
            if frozen {
                thread::sleep(Duration::from_millis(500));
                lab.agent.thaw();
            }
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut answers = BTreeSet::new();
        for out in &outs {
            out.expect_ok();
            answers.insert(out.ips());
        }
        assert_eq!(
            answers.len(),
            1,
            "{RACERS} concurrent ADDs of one attachment ({} eth0) got different answers: {answers:?}",
            pod.container_id
        );
        let ips = answers.into_iter().next().unwrap();
        assert_eq!(
            ips.len(),
            1,
            "a single-stack attachment got several addresses: {ips:?}"
        );
        assert_eq!(lab.agent.pool_counts("race"), (200, 199 - round));
    }
}
