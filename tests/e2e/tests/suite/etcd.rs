//! Agents on several "nodes" sharing claims through a real etcd (Debian's etcd-server, started
//! by the test on loopback ports of its own): each address handed out once, other agents' claims
//! followed by the watch rather than the tick, and an etcd outage that fails ADDs with
//! try-again-later, remembers DELs, and heals by itself.

use std::process::Command;
use std::thread;
use std::time::Duration;

use allot_core::store::Store as _;
use allot_e2e::fleet::two_agents_share_six;
use allot_e2e::*;
use allot_store::etcd::testing::EtcdServer;
use allot_store::{EtcdConfig, EtcdStore};

const WAIT: Duration = Duration::from_secs(20);

#[track_caller]
fn eventually(lab: &Lab, what: &str, holds: impl FnMut() -> bool) {
    lab.eventually(what, WAIT, holds);
}

/// The claimed addresses in etcd, read with etcdctl: what is stored, not what allot says.
fn claim_keys(etcd: &EtcdServer) -> Vec<String> {
    etcd.keys("/allot/claims/")
        .iter()
        .map(|k| k.trim_start_matches("/allot/claims/").to_string())
        .collect()
}

fn ip_only(cidr: &str) -> String {
    cidr.split('/').next().unwrap().to_string()
}

#[test]
fn agents_on_one_etcd_hand_out_each_address_once_and_follow_each_other_by_watch() {
    let etcd = EtcdServer::start();
    let url = etcd.url();
    // A tick far longer than the test: only the watch can tell one agent of the other's claims.
    let flags = [
        ("--store", url.as_str()),
        ("--reload-interval-ms", "60000"),
        ("--resync-seconds", "3600"),
    ];
    let pool = ippool(
        "six",
        "10.64.0.0/24",
        Some("10.64.0.1"),
        &["10.64.0.10-10.64.0.15"],
    );
    let Some(lab) = Lab::with_flags(
        "agents_on_one_etcd_hand_out_each_address_once_and_follow_each_other_by_watch",
        &pool,
        &flags,
    ) else {
        return;
    };
    // The follow time is printed: with a 60 s tick, only the watch can make it short.
    let seen = two_agents_share_six(&lab, "six", WAIT);
    let mut stored = claim_keys(&etcd);
    stored.sort();
    let mut handed: Vec<String> = seen.iter().map(|c| ip_only(c)).collect();
    handed.sort();
    assert_eq!(
        stored, handed,
        "etcd holds exactly the addresses handed out"
    );
}

#[test]
fn while_etcd_is_down_add_fails_with_try_again_and_del_is_remembered() {
    let mut etcd = EtcdServer::start();
    let url = etcd.url();
    let pool = ippool(
        "p",
        "10.65.0.0/24",
        Some("10.65.0.1"),
        &["10.65.0.10-10.65.0.19"],
    );
    let Some(lab) = Lab::with_flags(
        "while_etcd_is_down_add_fails_with_try_again_and_del_is_remembered",
        &pool,
        &[("--store", url.as_str())],
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["p"], &[]);
    let first = Attachment::new("first");
    let first_ip = ip_only(&lab.cni("allot", "ADD", &first, &conf).expect_ok().ip());
    assert_eq!(claim_keys(&etcd), [first_ip]);

    etcd.stop();
    let down = lab.cni("allot", "ADD", &Attachment::new("second"), &conf);
    down.expect_err(&[11]);
    assert!(
        down.msg().contains("etcd"),
        "the error names the store: {down}"
    );
    // The pod must be able to go away while etcd is down.
    lab.cni("allot", "DEL", &first, &conf).expect_ok();
    assert!(
        std::fs::read_dir(lab.agent.journal())
            .map(|d| d.count())
            .unwrap_or(0)
            >= 1,
        "the DEL is remembered in the journal"
    );

    etcd.start_again();
    eventually(&lab, "the remembered DEL is replayed", || {
        claim_keys(&etcd).is_empty()
    });
    // Service resumes by itself: no restart, no operator.
    let again = Attachment::new("again");
    eventually(&lab, "ADD succeeds again", || {
        lab.cni("allot", "ADD", &again, &conf).success()
    });
    assert_eq!(claim_keys(&etcd).len(), 1);
}

/// A runtime that reuses container IDs (`podman restart`) sends DEL then ADD for the same
/// attachment. When the DEL could not be served (the store was away) it waits in the journal;
/// the ADD that follows must settle it first, so that the journaled DEL never releases the
/// address the container got back and uses. Before, the re-ADD returned the held claim
/// untouched and a later replay (here: the agent's restart) released it from under the
/// container.
#[test]
fn a_journaled_del_never_releases_the_address_a_readd_of_its_container_uses() {
    let mut etcd = EtcdServer::start();
    let url = etcd.url();
    let pool = ippool(
        "p",
        "10.66.0.0/24",
        Some("10.66.0.1"),
        &["10.66.0.10-10.66.0.19"],
    );
    let Some(mut lab) = Lab::with_flags(
        "a_journaled_del_never_releases_the_address_a_readd_of_its_container_uses",
        &pool,
        // No tick during the test: only the restart replays.
        &[
            ("--store", url.as_str()),
            ("--reload-interval-ms", "600000"),
        ],
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["p"], &[]);
    let pod = Attachment::new("restarted");
    lab.cni("allot", "ADD", &pod, &conf).expect_ok();

    etcd.stop();
    lab.cni("allot", "DEL", &pod, &conf).expect_ok();
    let entries = || {
        std::fs::read_dir(lab.agent.journal())
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert_eq!(entries(), 1, "the DEL is remembered");
    etcd.start_again();

    // The container comes back under the same ID at once.
    let mut again = None;
    eventually(&lab, "the re-ADD is served", || {
        let out = lab.cni("allot", "ADD", &pod, &conf);
        let ok = out.success();
        again = Some(out);
        ok
    });
    let address = ip_only(&again.unwrap().ip());
    assert_eq!(claim_keys(&etcd), std::slice::from_ref(&address));
    assert_eq!(entries(), 0, "the ADD settled the remembered DEL first");

    // Whatever replays now finds nothing of this attachment to release.
    lab.agent.restart();
    lab.cni("allot", "CHECK", &pod, &conf).expect_ok();
    assert_eq!(
        claim_keys(&etcd),
        [address],
        "the container still holds the address it uses"
    );
}

fn allotctl(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(bin("allotctl"))
        .args(["--store", url])
        .args(args)
        .output()
        .expect("allotctl")
}

#[test]
fn pools_applied_to_etcd_are_served_and_an_edit_that_would_orphan_a_claim_is_refused() {
    if skip("pools_applied_to_etcd_are_served_and_an_edit_that_would_orphan_a_claim_is_refused") {
        return;
    }
    let etcd = EtcdServer::start();
    let url = etcd.url();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pools.yaml");
    let file_arg = file.to_str().unwrap();
    let write = |ips: &str| {
        std::fs::write(
            &file,
            ippool("p", "10.66.0.0/24", Some("10.66.0.1"), &[ips]),
        )
        .unwrap()
    };
    write("10.66.0.10-10.66.0.19");
    let out = allotctl(&url, &["pool", "apply", "-f", file_arg]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("IPPool p applied"));

    let Some(lab) = Lab::on_etcd_pools(
        "pools_applied_to_etcd_are_served_and_an_edit_that_would_orphan_a_claim_is_refused",
        &url,
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["p"], &[]);
    let first = ip_only(
        &lab.cni("allot", "ADD", &Attachment::new("a"), &conf)
            .expect_ok()
            .ip(),
    );
    assert!(in_range(first.parse().unwrap(), "10.66.0.10", "10.66.0.19"));

    // Shrinking the pool past the claimed address is refused, and nothing is written.
    write("10.66.0.200-10.66.0.209");
    let out = allotctl(&url, &["pool", "apply", "-f", file_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("would no longer hold claimed address(es) {first}"))
            && stderr.contains("nothing was written"),
        "{stderr}"
    );
    // So is an invalid pool.
    write("10.66.1.5");
    let out = allotctl(&url, &["pool", "apply", "-f", file_arg]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stored = allotctl(&url, &["pool", "get", "p"]);
    assert!(
        String::from_utf8_lossy(&stored.stdout).contains("10.66.0.10-10.66.0.19"),
        "{stored:?}"
    );

    // Growing it is accepted, and the agent serves the new version.
    write("10.66.0.10-10.66.0.29");
    let out = allotctl(&url, &["pool", "apply", "-f", file_arg]);
    assert!(out.status.success(), "{out:?}");
    eventually(&lab, "the agent serves the grown pool", || {
        lab.agent.pool_counts("p").0 == 20
    });
    let listed = allotctl(&url, &["claims", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&first) && listed.contains(" p "),
        "{listed}"
    );
    let pools = allotctl(&url, &["pool", "list"]);
    let pools = String::from_utf8_lossy(&pools.stdout);
    assert!(
        pools
            .lines()
            .any(|l| l.starts_with("p ") && l.contains(" 1 ") && l.contains(" 20 ")),
        "{pools}"
    );
}

/// An agent killed with SIGKILL in the middle of an ADD (its claim already in etcd, its answer
/// not yet given): the retried ADD, through the restarted agent, returns the same address, and
/// an agent on another node never receives it, even when the pool runs out.
#[test]
fn an_agent_killed_mid_add_gives_the_retry_the_same_address_and_no_one_else() {
    let etcd = EtcdServer::start();
    let url = etcd.url();
    let pool = ippool(
        "small",
        "10.68.0.0/24",
        Some("10.68.0.1"),
        &["10.68.0.10-10.68.0.49"],
    );
    let Some(mut lab) = Lab::with_flags(
        "an_agent_killed_mid_add_gives_the_retry_the_same_address_and_no_one_else",
        &pool,
        &[("--store", url.as_str())],
    ) else {
        return;
    };
    let other = Agent::start_sharing(&lab.agent);
    let conf = lab.bridge_conf(&["small"], &[]);
    let other_conf = lab.bridge_conf_via(&other.socket(), &["small"], &[]);
    let truth = EtcdStore::connect(&EtcdConfig::from_url(&url).unwrap()).unwrap();

    // Stop the agent (SIGSTOP) at moments swept across an ADD's duration until it is caught
    // with its claim in etcd and its answer not given; then SIGKILL it. An attempt that is not
    // caught is deleted again, so the pool never runs out.
    let probe = Attachment::new("probe");
    let add_takes = lab.cni("allot", "ADD", &probe, &conf).expect_ok().elapsed;
    lab.cni("allot", "DEL", &probe, &conf).expect_ok();
    const SWEEP: u32 = 40;
    let mut caught = None;
    for n in 0..SWEEP * 3 {
        let pod = Attachment::new(&format!("victim-{n}"));
        let id = allot_core::store::Attachment {
            container_id: pod.container_id.clone(),
            interface: pod.ifname.clone(),
        };
        // From the start of the ADD to a fifth past its usual end.
        let pause = add_takes * 6 * (n % SWEEP) / (5 * SWEEP);
        let killed = thread::scope(|s| {
            let add = s.spawn(|| lab.cni("allot", "ADD", &pod, &conf));
            thread::sleep(pause);
            lab.agent.signal(libc::SIGSTOP);
            thread::sleep(Duration::from_millis(100));
            let claims = truth.claims_of(&id).unwrap();
            if !add.is_finished() && !claims.is_empty() {
                lab.agent.signal(libc::SIGKILL);
                add.join().unwrap().expect_err(&[11]);
                Some(claims[0].address.to_string())
            } else {
                lab.agent.signal(libc::SIGCONT);
                add.join().unwrap();
                None
            }
        });
        if let Some(address) = killed {
            caught = Some((pod, address));
            break;
        }
        lab.cni("allot", "DEL", &pod, &conf).expect_ok();
    }
    let (pod, first) = caught.expect("the agent was never caught between its claim and its answer");

    // The other node gets every other address, never this one.
    let mut others = Vec::new();
    loop {
        let out = lab.cni(
            "allot",
            "ADD",
            &Attachment::new(&format!("o{}", others.len())),
            &other_conf,
        );
        if !out.success() {
            out.expect_err(&[100]);
            break;
        }
        others.push(ip_only(&out.ip()));
    }
    assert!(
        !others.contains(&first),
        "{first} handed out twice: {others:?}"
    );

    lab.agent.restart();
    let retried = lab.cni("allot", "ADD", &pod, &conf);
    assert_eq!(
        ip_only(&retried.expect_ok().ip()),
        first,
        "the retry gets the same address"
    );
}
