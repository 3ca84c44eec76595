//! The life of one attachment through the bridge plugin: ADD, CHECK, DEL, repeated DEL,
//! idempotent ADD, CNI versions, and what happens while the agent is down.

use allot_e2e::*;
use serde_json::{Value, json};

const FIRST: &str = "10.77.0.10";
const LAST: &str = "10.77.0.19";

fn pools() -> String {
    ippool(
        "v4",
        "10.77.0.0/24",
        Some("10.77.0.1"),
        &["10.77.0.10-10.77.0.19"],
    ) + &ippool("one", "10.78.0.0/24", Some("10.78.0.1"), &["10.78.0.7"])
}

#[test]
fn bridge_add_puts_a_pool_address_in_the_namespace_and_del_removes_it() {
    let Some(lab) = Lab::new("bridge_add_puts_a_pool_address_in_the_namespace", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["v4"], &[]);
    let pod = Attachment::new("web-0");

    let add = lab.bridge_add(&pod, &conf);
    let ip = add.ip();
    assert!(
        in_range(addr_of(&ip), FIRST, LAST),
        "{ip} outside pool v4:\n{add}"
    );
    assert!(ip.ends_with("/24"), "{ip}: the pool's subnet prefix is /24");
    let result = add.json.clone().unwrap();
    assert_eq!(result["ips"][0]["gateway"], "10.77.0.1", "{add}");
    assert_eq!(
        pod.addrs(),
        vec![ip.clone()],
        "the namespace holds the address ADD reported"
    );
    assert!(
        pod.netns.ping("10.77.0.1"),
        "the pod cannot reach its gateway (the bridge)"
    );
    assert_eq!(lab.agent.pool_counts("v4"), (10, 9));

    lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
    assert!(pod.addrs().is_empty(), "DEL left {:?}", pod.addrs());
    assert!(!pod.netns.link_exists("eth0"));
    assert_eq!(
        lab.agent.pool_counts("v4"),
        (10, 10),
        "DEL released the claim"
    );

    // DEL again, through the bridge and straight to allot: both succeed.
    lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
    lab.cni("allot", "DEL", &pod, &conf).expect_ok();
    // DEL of an attachment that never existed succeeds too.
    lab.cni("allot", "DEL", &Attachment::new("never-added"), &conf)
        .expect_ok();
}

#[test]
fn del_releases_the_address_for_the_next_pod() {
    let Some(lab) = Lab::new("del_releases_the_address_for_the_next_pod", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["one"], &[]);
    let a = Attachment::new("a");
    let b = Attachment::new("b");
    assert_eq!(lab.bridge_add(&a, &conf).ip(), "10.78.0.7/24");
    let no_room = lab.cni("allot", "ADD", &b, &conf);
    no_room.expect_err(&[100]);
    lab.cni("bridge", "DEL", &a, &conf).expect_ok();
    assert_eq!(lab.bridge_add(&b, &conf).ip(), "10.78.0.7/24");
    assert_eq!(b.addrs(), vec!["10.78.0.7/24".to_string()]);
}

#[test]
fn check_succeeds_after_add_and_fails_after_del() {
    let Some(lab) = Lab::new("check_succeeds_after_add_and_fails_after_del", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["v4"], &[]);
    let pod = Attachment::new("checked");
    let add = lab.bridge_add(&pod, &conf);
    let check_conf = with_prev_result(&conf, add.json.as_ref().unwrap());

    lab.cni("bridge", "CHECK", &pod, &check_conf).expect_ok();
    lab.cni("allot", "CHECK", &pod, &check_conf).expect_ok();

    // allot's claim goes while the interface stays: CHECK through the bridge must notice.
    lab.cni("allot", "DEL", &pod, &conf).expect_ok();
    lab.cni("allot", "CHECK", &pod, &check_conf)
        .expect_failure();
    lab.cni("bridge", "CHECK", &pod, &check_conf)
        .expect_failure();

    // A prevResult whose address is not the one held fails CHECK as well.
    let other = Attachment::new("other");
    let add = lab.bridge_add(&other, &conf);
    let mut wrong = add.json.clone().unwrap();
    wrong["ips"][0]["address"] = json!("10.77.0.250/24");
    lab.cni("allot", "CHECK", &other, &with_prev_result(&conf, &wrong))
        .expect_failure();
    lab.cni(
        "allot",
        "CHECK",
        &other,
        &with_prev_result(&conf, add.json.as_ref().unwrap()),
    )
    .expect_ok();

    // After a full DEL, CHECK fails.
    lab.cni("bridge", "DEL", &other, &conf).expect_ok();
    lab.cni(
        "allot",
        "CHECK",
        &other,
        &with_prev_result(&conf, add.json.as_ref().unwrap()),
    )
    .expect_failure();
}

#[test]
fn add_is_idempotent_for_the_same_container_and_interface() {
    let Some(lab) = Lab::new("add_is_idempotent", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["v4"], &[]);
    let pod = Attachment::new("retried");
    let first = lab.bridge_add(&pod, &conf).ip();
    // The runtime retries: allot is asked again for the same container and interface.
    for _ in 0..3 {
        let again = lab.cni("allot", "ADD", &pod, &conf);
        again.expect_ok();
        assert_eq!(
            again.ip(),
            first,
            "a retried ADD got another address:\n{again}"
        );
    }
    assert_eq!(
        lab.agent.pool_counts("v4"),
        (10, 9),
        "retries claimed more addresses"
    );

    // The same container with another interface is another attachment.
    let net1 = pod.with_ifname("net1");
    let second = lab.cni("allot", "ADD", &net1, &conf);
    second.expect_ok();
    assert_ne!(second.ip(), first);
    assert_eq!(lab.agent.pool_counts("v4"), (10, 8));
}

#[test]
fn results_follow_the_callers_cni_version() {
    let Some(lab) = Lab::new("results_follow_the_callers_cni_version", &pools()) else {
        return;
    };
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let conf = bridge_conf(
            version,
            &lab.network,
            &lab.bridge,
            allot_ipam(&lab.agent.socket(), &["v4"], &[]),
        );
        let pod = Attachment::new(&format!("v{}", version.replace('.', "")));
        let direct = lab.cni("allot", "ADD", &pod.with_ifname("x0"), &conf);
        direct.expect_ok();
        let result = direct.json.as_ref().unwrap();
        assert_eq!(
            result["cniVersion"], version,
            "allot answered another version:\n{direct}"
        );
        if version.starts_with("0.") {
            assert_eq!(
                result["ips"][0]["version"], "4",
                "0.x results carry ips[].version:\n{direct}"
            );
        }
        lab.cni("allot", "DEL", &pod.with_ifname("x0"), &conf)
            .expect_ok();

        let add = lab.bridge_add(&pod, &conf);
        assert_eq!(add.json.as_ref().unwrap()["cniVersion"], version, "{add}");
        assert_eq!(pod.addrs(), vec![add.ip()], "version {version}");
        lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
        assert!(pod.addrs().is_empty());
    }
    // 1.1.0 (the bridge here predates it): allot directly.
    let conf = bridge_conf(
        "1.1.0",
        &lab.network,
        &lab.bridge,
        allot_ipam(&lab.agent.socket(), &["v4"], &[]),
    );
    let pod = Attachment::new("v110");
    let add = lab.cni("allot", "ADD", &pod, &conf);
    add.expect_ok();
    assert_eq!(add.json.as_ref().unwrap()["cniVersion"], "1.1.0", "{add}");
    lab.cni("allot", "DEL", &pod, &conf).expect_ok();

    let too_new = bridge_conf(
        "9.9.9",
        &lab.network,
        &lab.bridge,
        allot_ipam(&lab.agent.socket(), &["v4"], &[]),
    );
    lab.cni("allot", "ADD", &Attachment::new("v999"), &too_new)
        .expect_err(&[1]);
    assert_eq!(lab.agent.pool_counts("v4"), (10, 10));
}

#[test]
fn version_lists_the_supported_versions() {
    let Some(lab) = Lab::new("version_lists_the_supported_versions", &pools()) else {
        return;
    };
    let out = lab
        .call("allot", "VERSION", r#"{"cniVersion":"1.1.0"}"#)
        .run(None);
    out.expect_ok();
    let versions: Vec<&str> = out.json.as_ref().unwrap()["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no supportedVersions:\n{out}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        assert!(versions.contains(&v), "{v} missing:\n{out}");
    }
}

#[test]
fn while_the_agent_is_down_add_says_try_again_and_del_succeeds() {
    let Some(mut lab) = Lab::new("while_the_agent_is_down", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["v4"], &[]);
    let status_conf = bridge_conf(
        "1.1.0",
        &lab.network,
        &lab.bridge,
        allot_ipam(&lab.agent.socket(), &["v4"], &[]),
    )
    .to_string();
    lab.call("allot", "STATUS", &status_conf)
        .run(Some(&lab.host))
        .expect_ok();

    let held = Attachment::new("held");
    let ip = lab.bridge_add(&held, &conf).ip();

    lab.agent.kill9();
    let pod = Attachment::new("while-down");
    // An ADD waits for the agent within its timeout (a restarting agent is waited for), then
    // gives up with 11: a short one here.
    let mut short = conf.clone();
    short["ipam"]["timeout_ms"] = json!(1000);
    let add = lab.cni("allot", "ADD", &pod, &short);
    add.expect_err(&[11]);
    let add = lab.cni("bridge", "ADD", &pod, &short);
    add.expect_err(&[11]);
    lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
    lab.cni("allot", "DEL", &Attachment::new("other"), &conf)
        .expect_ok();
    lab.call("allot", "STATUS", &status_conf)
        .run(Some(&lab.host))
        .expect_err(&[50]);

    lab.agent.restart();
    lab.call("allot", "STATUS", &status_conf)
        .run(Some(&lab.host))
        .expect_ok();
    // The claim made before the crash is intact, and ADD works again.
    let again = lab.cni("allot", "ADD", &held, &conf);
    again.expect_ok();
    assert_eq!(again.ip(), ip);
    let add = lab.bridge_add(&pod, &conf);
    assert_ne!(add.ip(), ip);
}

#[test]
fn the_agent_exits_cleanly_on_sigterm_and_keeps_its_claims() {
    let Some(mut lab) = Lab::new("the_agent_exits_cleanly_on_sigterm", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["v4"], &[]);
    let pod = Attachment::new("survivor");
    let ip = lab.bridge_add(&pod, &conf).ip();
    let status = lab.agent.stop().expect("allot-agent ignored SIGTERM");
    assert!(
        status.success(),
        "allot-agent exited with {status} on SIGTERM; log:\n{}",
        lab.agent.log()
    );
    lab.agent.restart();
    let again = lab.cni("allot", "ADD", &pod, &conf);
    again.expect_ok();
    assert_eq!(again.ip(), ip, "the claim did not survive a clean restart");
    assert_eq!(lab.agent.pool_counts("v4"), (10, 9));
}

#[test]
fn a_hung_agent_times_out_add_and_never_blocks_del() {
    let Some(lab) = Lab::new("a_hung_agent_times_out_add", &pools()) else {
        return;
    };
    let mut conf = lab.bridge_conf(&["v4"], &[]);
    conf["ipam"]["timeout_ms"] = json!(500);
    let pod = Attachment::new("stuck");
    lab.agent.freeze();
    let add = lab.cni("allot", "ADD", &pod, &conf);
    lab.agent.thaw();
    add.expect_err(&[11]);
    assert!(
        add.elapsed.as_secs() < 5,
        "ADD took {:?} with timeout_ms 500",
        add.elapsed
    );

    lab.agent.freeze();
    let del = lab.cni("allot", "DEL", &pod, &conf);
    lab.agent.thaw();
    del.expect_ok();
    assert!(
        del.elapsed.as_secs() < 5,
        "DEL took {:?} with timeout_ms 500",
        del.elapsed
    );

    // The ADD that timed out may have been served after the thaw; the runtime's DEL (above)
    // may not have reached the agent. A retried ADD and a DEL settle it.
    let again = lab.cni("allot", "ADD", &pod, &conf);
    again.expect_ok();
    lab.cni("allot", "DEL", &pod, &conf).expect_ok();
    assert_eq!(lab.agent.pool_counts("v4"), (10, 10));
}
