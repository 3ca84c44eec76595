//! examples/standalone, as the README's quick start uses it: the agent on that directory, the
//! bridge plugin with `bridge.json` (its socket pointed at the test's agent).

use std::path::Path;

use allot_e2e::*;
use serde_json::{Value, json};

#[test]
fn the_standalone_example_serves_dual_stack_pods_through_the_bridge() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/standalone");
    let Some(lab) = Lab::on_pools_dir("the_standalone_example", &dir) else {
        return;
    };
    let mut conf: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bridge.json")).unwrap())
            .expect("bridge.json is JSON");
    assert_eq!(conf["ipam"]["type"], "allot");
    conf["ipam"]["socket"] = json!(lab.agent.socket());
    conf["ipam"]["journal"] = json!(lab.agent.journal());

    let pods: Vec<Attachment> = ["demo-a", "demo-b"]
        .iter()
        .map(|n| Attachment::new(n))
        .collect();
    let mut v4 = Vec::new();
    for pod in &pods {
        let add = lab.bridge_add(pod, &conf);
        let ips = add.ips();
        assert_eq!(ips.len(), 2, "one address per family:\n{add}");
        let mut in_ns = pod.addrs();
        in_ns.sort();
        let mut want = ips.clone();
        want.sort();
        assert_eq!(in_ns, want);
        for ip in &ips {
            let a = addr_of(ip);
            if a.is_ipv4() {
                assert!(in_range(a, "192.0.2.12", "192.0.2.99"), "{add}");
                assert_ne!(
                    a.to_string(),
                    "192.0.2.13",
                    "an excluded address was handed out"
                );
                v4.push(a.to_string());
            } else {
                assert!(in_subnet(a, "2001:db8:a110::/64"), "{add}");
            }
        }
        assert!(pod.netns.ping("192.0.2.1"), "no path to the gateway");
    }
    assert!(
        pods[1].netns.ping(&v4[0]),
        "the pods cannot reach each other"
    );
    for pod in &pods {
        lab.cni("bridge", "DEL", pod, &conf).expect_ok();
        assert!(pod.addrs().is_empty());
    }
}
