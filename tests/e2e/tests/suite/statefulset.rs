//! StatefulSet pods (`ALLOT_OWNER=StatefulSet/<name>` in standalone mode) keep their address
//! across sandboxes, as Spiderpool users expect; other pods never inherit one.

use allot_e2e::*;

fn pools() -> String {
    ippool(
        "sts",
        "10.98.0.0/24",
        Some("10.98.0.1"),
        &["10.98.0.10-10.98.0.29"],
    )
}

fn web(name: &str) -> Attachment {
    let mut att = Attachment::new(name);
    att.owner = Some("StatefulSet/web".into());
    att
}

#[test]
fn a_statefulset_pod_gets_its_address_back_after_del() {
    let Some(lab) = Lab::new(
        "a_statefulset_pod_gets_its_address_back_after_del",
        &pools(),
    ) else {
        return;
    };
    let conf = lab.bridge_conf(&["sts"], &[]);
    let first = web("web-0");
    let ip = lab.bridge_add(&first, &conf).ip();
    lab.cni("bridge", "DEL", &first, &conf).expect_ok();

    // Meanwhile another pod comes and must not get web-0's address.
    let other = Attachment::new("other");
    assert_ne!(lab.bridge_add(&other, &conf).ip(), ip);

    // web-0 again, in a new sandbox (new container id, new uid).
    let second = web("web-0");
    let add = lab.bridge_add(&second, &conf);
    assert_eq!(add.ip(), ip, "web-0 lost its address:\n{add}");
    assert_eq!(second.addrs(), vec![ip.clone()]);

    // A pod of another name, or of the same name but not of the StatefulSet, gets another.
    let web1 = web("web-1");
    assert_ne!(lab.bridge_add(&web1, &conf).ip(), ip);
}

/// The new sandbox's ADD can come before the old sandbox's DEL (node restart, kubelet cleaning
/// up late): the pod still gets its address, and the late DEL does not take it away.
#[test]
fn a_statefulset_pod_recreated_before_the_old_del_keeps_its_address() {
    let Some(lab) = Lab::new("a_statefulset_pod_recreated_before_the_old_del", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["sts"], &[]);
    let old = web("web-0");
    let ip = lab.bridge_add(&old, &conf).ip();

    let new = web("web-0");
    let add = lab.bridge_add(&new, &conf);
    assert_eq!(
        add.ip(),
        ip,
        "web-0's new sandbox got another address:\n{add}"
    );
    assert_eq!(
        lab.agent.pool_counts("sts"),
        (20, 19),
        "web-0 holds two addresses"
    );

    // The old sandbox's DEL arrives late.
    lab.cni("bridge", "DEL", &old, &conf).expect_ok();
    lab.cni(
        "allot",
        "CHECK",
        &new,
        &with_prev_result(&conf, add.json.as_ref().unwrap()),
    )
    .expect_ok();
    for i in 0..19 {
        let other = Attachment::new(&format!("filler-{i}"));
        let out = lab.cni("allot", "ADD", &other, &conf);
        out.expect_ok();
        assert_ne!(out.ip(), ip, "web-0's address was handed to {}", other.name);
    }
}

#[test]
fn a_pod_recreated_with_the_same_name_does_not_share_the_old_address() {
    let Some(lab) = Lab::new("a_pod_recreated_with_the_same_name", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["sts"], &[]);
    let old = Attachment::new("api-7d9f");
    let ip = lab.bridge_add(&old, &conf).ip();
    // A plain pod of the same name, new sandbox, the old one not yet deleted.
    let new = Attachment::new("api-7d9f");
    let add = lab.bridge_add(&new, &conf);
    assert_ne!(add.ip(), ip, "two live sandboxes share an address:\n{add}");
    lab.cni("bridge", "DEL", &old, &conf).expect_ok();
    let again = lab.cni("allot", "ADD", &new, &conf);
    again.expect_ok();
    assert_eq!(again.ip(), add.ip());
}
