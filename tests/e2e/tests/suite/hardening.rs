//! The node path under a hostile operator: invalid and half-written files never free addresses,
//! an overlapping pool never takes a serving one out, two agents on one state file stay honest,
//! STATUS tells the truth, a DEL while the agent is down is not lost, released addresses cool
//! down, and a deleted pool keeps serving its claims.

use std::time::Duration;

use allot_e2e::fleet::two_agents_share_six;
use allot_e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

/// Polls `what` until it holds; panics with the agent's log after [`WAIT`].
#[track_caller]
fn eventually(lab: &Lab, what: &str, holds: impl FnMut() -> bool) {
    lab.eventually(what, WAIT, holds);
}

fn reserved(name: &str, ips: &[&str]) -> String {
    document("ReservedIP", name, json!({ "ips": ips }))
}

fn problem_states(lab: &Lab) -> Vec<(String, String, String)> {
    lab.agent
        .status()
        .problems
        .into_iter()
        .map(|p| (p.kind, p.name, p.state))
        .collect()
}

fn metric(lab: &Lab, line_start: &str) -> Option<String> {
    let (_, text) = lab.agent.get("/metrics").expect("metrics");
    text.lines()
        .find(|l| l.starts_with(line_start))
        .map(str::to_string)
}

#[test]
fn an_invalid_or_half_written_reserved_ip_keeps_its_addresses_reserved() {
    let pool = ippool(
        "p",
        "10.60.0.0/24",
        Some("10.60.0.1"),
        &["10.60.0.10-10.60.0.13"],
    );
    let Some(lab) = Lab::new(
        "an_invalid_or_half_written_reserved_ip_keeps_its_addresses_reserved",
        &pool,
    ) else {
        return;
    };
    lab.agent.write_pools(
        "routers.yaml",
        &reserved("routers", &["10.60.0.10", "10.60.0.11"]),
    );
    eventually(&lab, "the reservation is in force", || {
        lab.agent.pool_counts("p") == (2, 2)
    });
    assert!(!lab.agent.status().degraded);

    // One malformed entry added to the same object: it stays in force as it was.
    lab.agent.write_pools(
        "routers.yaml",
        &reserved("routers", &["10.60.0.10", "10.60.0.11", "10.60.0.300"]),
    );
    eventually(&lab, "the agent reports the object held back", || {
        problem_states(&lab).contains(&("ReservedIP".into(), "routers".into(), "held-back".into()))
    });
    let status = lab.agent.status();
    assert!(status.degraded, "{status:?}");
    assert!(status.message.contains("10.60.0.300"), "{}", status.message);
    assert_eq!(
        metric(&lab, "allot_degraded ").as_deref(),
        Some("allot_degraded 1")
    );
    assert_eq!(
        metric(&lab, "allot_config_problems{state=\"held-back\"}").as_deref(),
        Some("allot_config_problems{state=\"held-back\"} 1")
    );

    // A half-written file (an editor mid-save) keeps it too.
    lab.agent.write_pools(
        "routers.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: ReservedIP\nmetadata: {name: rou",
    );
    eventually(&lab, "the file is reported incomplete", || {
        problem_states(&lab)
            .iter()
            .any(|(k, _, s)| k == "File" && s == "incomplete")
    });

    let conf = lab.bridge_conf(&["p"], &[]);
    let mut got = Vec::new();
    for name in ["a", "b"] {
        got.push(lab.bridge_add(&Attachment::new(name), &conf).ip());
    }
    got.sort();
    assert_eq!(got, ["10.60.0.12/24", "10.60.0.13/24"], "never .10 or .11");
    lab.cni("allot", "ADD", &Attachment::new("c"), &conf)
        .expect_err(&[100]);

    // Fixed: the problems clear without another edit being needed.
    lab.agent
        .write_pools("routers.yaml", &reserved("routers", &["10.60.0.10"]));
    eventually(&lab, "the configuration is whole again", || {
        !lab.agent.status().degraded
    });
    assert_eq!(lab.agent.pool_counts("p"), (3, 1));
}

#[test]
fn a_new_overlapping_pool_never_takes_a_serving_pool_out() {
    let Some(lab) = Lab::new(
        "a_new_overlapping_pool_never_takes_a_serving_pool_out",
        &ippool(
            "web",
            "10.61.0.0/24",
            Some("10.61.0.1"),
            &["10.61.0.10-10.61.0.19"],
        ),
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["web"], &[]);
    let pod = Attachment::new("pod");
    let first = lab.bridge_add(&pod, &conf);

    // "aaa" sorts before "web", and overlaps it.
    lab.agent.write_pools(
        "aaa.yaml",
        &ippool(
            "aaa",
            "10.61.0.0/24",
            Some("10.61.0.1"),
            &["10.61.0.15-10.61.0.30"],
        ),
    );
    eventually(&lab, "aaa is left out", || {
        problem_states(&lab).contains(&("IPPool".into(), "aaa".into(), "left-out".into()))
    });
    let retried = lab.cni("allot", "ADD", &pod, &conf);
    retried.expect_ok();
    assert_eq!(retried.ip(), first.ip());
    lab.cni(
        "allot",
        "CHECK",
        &pod,
        &with_prev_result(&conf, first.json.as_ref().unwrap()),
    )
    .expect_ok();
    lab.bridge_add(&Attachment::new("other"), &conf);
    assert!(lab.agent.status().pools.iter().all(|p| p.name != "aaa"));
}

#[test]
fn two_agents_sharing_one_state_file_see_each_others_claims() {
    let Some(lab) = Lab::new(
        "two_agents_sharing_one_state_file_see_each_others_claims",
        &ippool(
            "six",
            "10.62.0.0/24",
            Some("10.62.0.1"),
            &["10.62.0.10-10.62.0.15"],
        ),
    ) else {
        return;
    };
    two_agents_share_six(&lab, "six", WAIT);
}

#[test]
fn status_succeeds_while_pools_are_exhausted() {
    let Some(lab) = Lab::new(
        "status_succeeds_while_pools_are_exhausted",
        &ippool("one", "10.63.0.0/24", Some("10.63.0.1"), &["10.63.0.10"]),
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["one"], &[]);
    lab.bridge_add(&Attachment::new("a"), &conf);
    lab.cni("allot", "ADD", &Attachment::new("b"), &conf)
        .expect_err(&[100]);
    let mut status_conf = conf.clone();
    status_conf["cniVersion"] = json!("1.1.0");
    let out = lab
        .call("allot", "STATUS", &status_conf.to_string())
        .run(Some(&lab.host));
    out.expect_ok();
}

#[test]
fn a_del_while_the_agent_is_down_is_replayed_when_it_is_back() {
    let Some(mut lab) = Lab::new(
        "a_del_while_the_agent_is_down_is_replayed_when_it_is_back",
        &ippool(
            "p",
            "10.64.0.0/24",
            Some("10.64.0.1"),
            &["10.64.0.10-10.64.0.14"],
        ),
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["p"], &[]);
    let pod = Attachment::new("pod");
    lab.bridge_add(&pod, &conf);
    assert_eq!(lab.agent.pool_counts("p"), (5, 4));

    lab.agent.stop();
    let del = lab.cni("bridge", "DEL", &pod, &conf);
    del.expect_ok();
    let journal = lab.agent.journal();
    assert_eq!(
        std::fs::read_dir(&journal).expect("journal").count(),
        1,
        "the DEL is remembered"
    );

    lab.agent.restart();
    eventually(&lab, "the DEL is replayed", || {
        lab.agent.pool_counts("p") == (5, 5)
    });
    eventually(&lab, "the entry is removed", || {
        std::fs::read_dir(&journal).unwrap().count() == 0
    });
    assert!(lab.agent.log().contains("replayed a DEL"));
}

#[test]
fn a_full_pool_hands_out_its_cooling_address_rather_than_refuse_the_pod() {
    let Some(lab) = Lab::with_flags(
        "a_full_pool_hands_out_its_cooling_address_rather_than_refuse_the_pod",
        &ippool(
            "two",
            "10.65.0.0/24",
            Some("10.65.0.1"),
            &["10.65.0.10-10.65.0.11"],
        ),
        &[("--cooldown-seconds", "600")],
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["two"], &[]);
    let a = Attachment::new("a");
    let first = lab.bridge_add(&a, &conf).ip();
    lab.bridge_add(&Attachment::new("b"), &conf);
    lab.cni("bridge", "DEL", &a, &conf).expect_ok();
    let status = lab.agent.status();
    let two = status.pools.iter().find(|p| p.name == "two").unwrap();
    assert_eq!(
        (two.free, two.cooling),
        (1, 1),
        "cooling, and free for capacity: {status:?}"
    );
    // Nothing else is free: the cooling address is handed out rather than the pod refused
    // (a rolling update of a full pool), and counted.
    let c = lab.bridge_add(&Attachment::new("c"), &conf);
    assert_eq!(c.ip(), first);
    let (code, metrics) = lab.agent.get("/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("allot_cooldown_cut_short_total{pool=\"two\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_deleted_pool_keeps_serving_its_claims_until_released() {
    let pools = ippool(
        "old",
        "10.66.0.0/24",
        Some("10.66.0.1"),
        &["10.66.0.10-10.66.0.14"],
    );
    let Some(lab) = Lab::new(
        "a_deleted_pool_keeps_serving_its_claims_until_released",
        &pools,
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["old"], &[]);
    let pod = Attachment::new("pod");
    let first = lab.bridge_add(&pod, &conf);
    let prev: Value = first.json.clone().unwrap();
    // What allot itself answers a retried ADD while the pool is in force.
    let baseline = lab.cni("allot", "ADD", &pod, &conf);
    baseline.expect_ok();

    lab.agent.write_pools(
        "pools.yaml",
        &ippool("new", "10.67.0.0/24", Some("10.67.0.1"), &["10.67.0.10"]),
    );
    eventually(&lab, "old is terminating", || {
        lab.agent
            .status()
            .pools
            .iter()
            .any(|p| p.name == "old" && p.state == "terminating" && p.claims == 1)
    });
    let retried = lab.cni("allot", "ADD", &pod, &conf);
    retried.expect_ok();
    assert_eq!(
        retried.json, baseline.json,
        "same address, gateway and routes"
    );
    lab.cni("allot", "CHECK", &pod, &with_prev_result(&conf, &prev))
        .expect_ok();
    // No new allocations: to the policy the deleted pool no longer exists.
    let refused = lab.cni("allot", "ADD", &Attachment::new("new-pod"), &conf);
    refused.expect_err(&[11]);
    assert!(
        refused.stdout.contains("IPPool old does not exist"),
        "{refused}"
    );

    lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
    assert!(lab.agent.status().pools.iter().all(|p| p.name != "old"));
}
