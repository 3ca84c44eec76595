//! The controller's audit reads its index as the watches fill it: pods' addresses (podIPs and
//! Multus's network status), Endpoints, pools with their status, and decides leaks by GC's
//! table; its counts are the metrics'.

use crate::common::*;
use allot_controller::audit::check;
use allot_controller::metrics::Metrics;
use allot_core::audit::Finding;
use allot_core::gc::GcConfig;
use allot_index::{ClusterIndex, EndpointObject, IndexResource, PoolObject};
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::core::v1::Pod;
use serde_json::json;

fn index(pods: Vec<Pod>, status: (u64, u64)) -> ClusterIndex {
    let mut i = ClusterIndex::new();
    i.reset(pods);
    i.reset(vec![node("node-a", true)]);
    IndexResource::<StatefulSet>::reset(&mut i, Vec::new());
    let mut pool = pool_json("p", "192.0.2.0/24", &["192.0.2.10-192.0.2.19"]);
    pool["status"] = json!({"allocatedIPCount": status.0, "totalIPCount": status.1});
    IndexResource::<PoolObject>::reset(&mut i, vec![PoolObject(dynamic(pool))]);
    let endpoint = |name: &str, uid: &str, ipv4: &str| {
        EndpointObject(typed(json!({
            "apiVersion": "allot.dev/v1alpha1", "kind": "Endpoint",
            "metadata": {"namespace": "web", "name": name},
            "spec": {"uid": uid, "node": "node-a",
                     "interfaces": [{"ifname": "net1", "ipv4": ipv4, "pools": ["p"]}]}
        })))
    };
    IndexResource::<EndpointObject>::reset(
        &mut i,
        vec![
            endpoint("a", "uid-web-a", "192.0.2.10/24"),
            endpoint("stale", "uid-web-stale", "192.0.2.15/24"),
        ],
    );
    i
}

/// A pod on the cluster network with an allot address on net1, as Multus reports it.
fn multus_pod(name: &str, underlay: &str) -> Pod {
    let mut p = pod_json("web", name, "node-a");
    p["metadata"]["annotations"] = json!({
        "k8s.v1.cni.cncf.io/network-status": json!([
            {"name": "cluster", "interface": "eth0", "ips": ["10.244.0.5"], "default": true},
            {"name": "web/underlay", "interface": "net1", "ips": [underlay]}
        ]).to_string()
    });
    typed(p)
}

fn on_net1(mut c: allot_core::store::Claim) -> allot_core::store::Claim {
    c.attachment.as_mut().unwrap().interface = "net1".into();
    c
}

#[test]
fn the_index_is_audited_as_the_command_audits_a_fresh_list() {
    let pods = vec![multus_pod("a", "192.0.2.10"), multus_pod("b", "192.0.2.11")];
    let claims = vec![
        on_net1(claim("192.0.2.10", "web", "a", "uid-web-a", T0)),
        on_net1(claim("192.0.2.12", "web", "gone", "uid-web-gone", T0)),
    ];
    let i = index(pods, (2, 10));
    let report = check(&i, &claims, &GcConfig::default());
    let text: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
    assert_eq!(report.counts(), [1, 1, 0, 1, 0, 0], "{text:#?}");
    assert!(
        matches!(&report.findings[0], Finding::LeakedClaim { claim, .. } if claim.pod.name == "gone")
    );
    assert!(
        text[1].starts_with("192.0.2.11 (IPPool p) is used by pod web/b (uid uid-web-b) on net1"),
        "{text:#?}"
    );
    assert!(text[2].contains("Endpoint web/stale"), "{text:#?}");

    let metrics = Metrics::new();
    metrics.audited(&report);
    let exposed = metrics.encode();
    for line in [
        r#"allot_ipam_drift{kind="leaked-claim"} 1"#,
        r#"allot_ipam_drift{kind="unclaimed-address"} 1"#,
        r#"allot_ipam_drift{kind="claimed-twice"} 0"#,
        r#"allot_ipam_drift{kind="endpoint-without-claim"} 1"#,
        r#"allot_ipam_drift{kind="status-disagrees"} 0"#,
        r#"allot_ipam_drift{kind="pool-count"} 0"#,
        "allot_ipam_audits_total 1",
    ] {
        assert!(exposed.contains(line), "{line} missing from:\n{exposed}");
    }
}

#[test]
fn finished_and_host_network_pods_use_nothing_and_counts_are_compared() {
    let mut done = pod_json("web", "done", "node-a");
    done["status"]["phase"] = json!("Succeeded");
    done["status"]["podIPs"] = json!([{"ip": "192.0.2.13"}]);
    let mut host = pod_json("web", "host", "node-a");
    host["spec"]["hostNetwork"] = json!(true);
    host["status"]["podIPs"] = json!([{"ip": "192.0.2.14"}]);
    let claims = vec![on_net1(claim("192.0.2.10", "web", "a", "uid-web-a", T0))];
    let i = index(
        vec![multus_pod("a", "192.0.2.10"), typed(done), typed(host)],
        (3, 10),
    );
    let report = check(&i, &claims, &GcConfig::default());
    let text: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
    assert_eq!(report.counts(), [0, 0, 0, 1, 0, 1], "{text:#?}");
    assert!(
        text[1].contains("IPPool p says 3 allocated of 10, the claims and its spec say 1 of 10"),
        "{text:#?}"
    );
}

/// Multus's network-status annotation is writable by whoever may patch the pod: a running pod
/// whose annotation names another address for net1 than its claim, which its Endpoint records,
/// is a disagreement for a person to judge, not a leak a repair would release.
#[test]
fn a_patched_network_status_against_the_endpoint_is_not_a_leak() {
    let pods = vec![multus_pod("a", "192.0.2.13")];
    let claims = vec![on_net1(claim("192.0.2.10", "web", "a", "uid-web-a", T0))];
    let i = index(pods, (1, 10));
    let report = check(&i, &claims, &GcConfig::default());
    let text: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
    assert_eq!(report.leaked().count(), 0, "{text:#?}");
    assert!(
        report.findings.iter().any(|f| matches!(f,
            Finding::StatusDisagrees { claim, .. } if claim.pod.name == "a")),
        "{text:#?}"
    );
}
