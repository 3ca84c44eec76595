//! Day 2, on the real control plane: `allotctl ipam check` finds nothing on a clean cluster and
//! each kind of drift a test plants (a leaked claim, a pod using an address nobody claims, an
//! address with two holders, a pool count that disagrees); `ipam release --from-report`
//! releases what the report lists and is still leaked, once GC's own clocks allow, never a
//! claim changed meanwhile, and never the claims of a pod force-deleted a moment ago on a node
//! cut off before GC's own deadline; the controller counts the same drift in its metrics and
//! tells it in Events; once repaired, the check is clean again.
//!
//! A lab of its own (the controller is stopped for a while): run in the own-lab phase.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_cluster_tests::objects::{Workload, pod_ips};
use allot_cluster_tests::{NAMESPACE, Suite, install_args};
use allot_core::store::{Attachment, Claim, PodRef, Store};
use allot_k8s::Endpoint;
use allot_lab::testing::wait_for;
use allot_store::{KubeConfig, KubeStore};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;

const NS: &str = "audit";

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The store's call, off the test's runtime (the store blocks its caller).
async fn with_store<T: Send + 'static>(
    store: &Arc<KubeStore>,
    f: impl FnOnce(&KubeStore) -> T + Send + 'static,
) -> T {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .unwrap()
}

/// The controller's `/metrics`, from the replica that leads (on its node's address: the
/// controller runs on the host network where allot's conflist is the pod network).
async fn leader_metrics(s: &Suite) -> Result<String, String> {
    let leader = s.leader().await.ok_or("no leader")?;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), NAMESPACE);
    let pod = pods.get(&leader).await.map_err(|e| e.to_string())?;
    let host = pod
        .status
        .and_then(|s| s.host_ip)
        .ok_or("the leader has no host IP")?;
    allot_cluster_tests::metrics(&host, 9402).await
}

fn drift(metrics: &str, kind: &str) -> Option<u64> {
    let prefix = format!("allot_ipam_drift{{kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

async fn check_json(s: &Suite) -> (bool, Value) {
    let out = s.allotctl(&["ipam", "check", "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ipam check -o json: {e}: {}", text(&out)));
    (out.status.success(), report)
}

fn messages(report: &Value, kind: &str) -> Vec<String> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .map(|f| f["message"].as_str().unwrap().to_string())
        .collect()
}

/// The GC settings `ipam release` is given: the suite's controller's (tests/cluster/values.yaml:
/// `controller.gc.graceSeconds: 5`), and an additional delay for the repair to honour.
const GC_FLAGS: [&str; 4] = ["--gc-grace", "5", "--gc-additional-grace-delay", "10"];

/// `allotctl ipam release --from-report FILE` with [`GC_FLAGS`]: its output.
fn release_from(s: &Suite, report: &std::path::Path) -> String {
    let mut args = vec!["ipam", "release", "--from-report", report.to_str().unwrap()];
    args.extend(GC_FLAGS);
    let out = s.allotctl(&args);
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

fn scale_controller(s: &Suite, replicas: u32) {
    s.must(
        "kubectl",
        &[
            "-n",
            NAMESPACE,
            "scale",
            "deployment/allot-controller",
            &format!("--replicas={replicas}"),
        ],
    );
}

#[tokio::test]
async fn ipam_check_finds_each_planted_drift_and_release_frees_only_the_leaks() {
    let Some(s) = Suite::own("audit", 2, |_| {}).await else {
        return;
    };
    let mut args = install_args("install");
    args.extend(["--set", "controller.audit.intervalSeconds=2"]);
    s.must("helm", &args);
    s.wait_ready().await;
    s.namespace(NS).await;
    s.must_apply(&Workload::deployment(NS, "app", 3).grace(1).yaml());
    let mut pods = s.ready_pods(NS, "app=app", 3).await;
    pods.sort_by_key(|p| p.metadata.name.clone());
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let name = |p: &Pod| p.metadata.name.clone().unwrap();
    let v4 = |p: &Pod| *pod_ips(p).iter().find(|ip| ip.is_ipv4()).unwrap();

    wait_for("ipam check clean", Duration::from_secs(60), || async {
        let (ok, report) = check_json(&s).await;
        ok.then_some(()).ok_or(report)
    })
    .await;
    let clean = s.allotctl(&["ipam", "check"]);
    assert!(text(&clean).contains("no drift"), "{}", text(&clean));

    // The controller stopped: nothing repairs the drift meanwhile.
    scale_controller(&s, 0);
    wait_for("no controller", Duration::from_secs(60), || async {
        let left = s
            .pods(NAMESPACE, "app.kubernetes.io/component=controller")
            .await;
        left.is_empty().then_some(()).ok_or(left.len())
    })
    .await;
    let kubeconfig = s.lab.kubeconfig();
    let store = Arc::new(
        tokio::task::spawn_blocking(move || {
            KubeStore::connect(&KubeConfig {
                kubeconfig: Some(kubeconfig),
                ..KubeConfig::default()
            })
        })
        .await
        .unwrap()
        .unwrap(),
    );
    let claims = with_store(&store, |s| s.all().unwrap()).await;
    let free: Vec<IpAddr> = (170u8..190)
        .map(|n| IpAddr::from([198, 51, 100, n]))
        .filter(|ip| !claims.iter().any(|c| c.address == *ip))
        .take(2)
        .collect();
    let ghost = |address: IpAddr, name: &str| Claim {
        address,
        pool: "default-v4".into(),
        network: "allot".into(),
        attachment: Some(Attachment {
            container_id: format!("{name}-sandbox"),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: NS.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            owner_kind: None,
            owner_name: None,
        },
        node: "node-1".into(),
        updated_at: 1_000,
    };
    // A leak: claims of pods that do not exist.
    let (ghost1, ghost2) = (ghost(free[0], "ghost-1"), ghost(free[1], "ghost-2"));
    let planted = vec![ghost1.clone(), ghost2.clone()];
    with_store(&store, move |s| s.claim(&planted).unwrap()).await;
    // A pod using an address nobody claims.
    let c4 = claims
        .iter()
        .find(|cl| cl.address == v4(c))
        .unwrap()
        .clone();
    with_store(&store, move |s| {
        assert_eq!(s.release_unchanged(&[c4]).unwrap().len(), 1)
    })
    .await;
    // Two holders: b's Endpoint also records a's address.
    let endpoints: Api<Endpoint> = Api::namespaced(s.client.clone(), NS);
    let mut ep = endpoints.get(&name(b)).await.unwrap();
    ep.spec.interfaces.push(allot_k8s::EndpointInterface {
        ifname: "net9".into(),
        ipv4: Some(format!("{}/24", v4(a))),
        ..Default::default()
    });
    endpoints
        .replace(&name(b), &PostParams::default(), &ep)
        .await
        .unwrap();
    // A pool count that disagrees.
    s.must(
        "kubectl",
        &[
            "patch",
            "ippool",
            "default-v4",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"allocatedIPCount":99}}"#,
        ],
    );

    let (ok, report) = check_json(&s).await;
    assert!(!ok, "drift exits 1");
    let counts = &report["counts"];
    assert_eq!(counts["leaked-claim"], 2, "{report:#}");
    assert_eq!(counts["unclaimed-address"], 1, "{report:#}");
    assert_eq!(counts["claimed-twice"], 1, "{report:#}");
    assert_eq!(counts["pool-count"], 1, "{report:#}");
    assert_eq!(counts["endpoint-without-claim"], 0, "{report:#}");
    let leaked = messages(&report, "leaked-claim");
    assert!(
        leaked[0].contains(&format!(
            "{} (IPPool default-v4) is claimed for audit/ghost-1",
            free[0]
        )),
        "{leaked:?}"
    );
    assert!(leaked[0].contains("pod-deleted"), "{leaked:?}");
    let unclaimed = &messages(&report, "unclaimed-address")[0];
    assert!(
        unclaimed.contains(&format!(
            "{} (IPPool default-v4) is used by pod audit/{}",
            v4(c),
            name(c)
        )),
        "{unclaimed}"
    );
    let twice = &messages(&report, "claimed-twice")[0];
    assert!(
        twice.contains(&format!("claimed for audit/{}", name(a))),
        "{twice}"
    );
    assert!(
        twice.contains(&format!("recorded by Endpoint audit/{}", name(b))),
        "{twice}"
    );
    let count = &messages(&report, "pool-count")[0];
    assert!(
        count.contains("IPPool default-v4 says 99 allocated"),
        "{count}"
    );
    let table = text(&s.allotctl(&["ipam", "check"]));
    for kind in [
        "leaked-claim",
        "unclaimed-address",
        "claimed-twice",
        "pool-count",
    ] {
        assert!(table.contains(kind), "{table}");
    }

    // ghost-2's claim changes after the report (released, claimed again): it is kept.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_vec(&report).unwrap()).unwrap();
    let changed = Claim {
        updated_at: 2_000,
        ..ghost2.clone()
    };
    with_store(&store, move |s| {
        assert_eq!(s.release_unchanged(&[ghost2]).unwrap().len(), 1);
        s.claim(&[changed]).unwrap();
    })
    .await;
    // At once, GC would release nothing: its second sighting comes its grace period after the
    // first (the report), and its additional delay after that.
    let at_once = release_from(&s, file.path());
    assert!(
        at_once.contains(&format!(
            "kept {} (IPPool default-v4) of audit/ghost-1: not due yet",
            free[0]
        )),
        "{at_once}"
    );
    assert!(
        at_once.contains("0 of 2 reported leak(s) released"),
        "{at_once}"
    );
    let out = wait_for(
        "the repair releases ghost-1 once GC would",
        Duration::from_secs(60),
        || async {
            let out = release_from(&s, file.path());
            out.contains("1 of 2 reported leak(s) released")
                .then(|| out.clone())
                .ok_or(out)
        },
    )
    .await;
    assert!(
        out.contains(&format!(
            "released {} (IPPool default-v4) of audit/ghost-1",
            free[0]
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "kept {} (IPPool default-v4) of audit/ghost-2",
            free[1]
        )),
        "{out}"
    );
    let now = with_store(&store, |s| s.all().unwrap()).await;
    assert!(!now.iter().any(|cl| cl.address == free[0]));
    assert!(
        now.iter()
            .any(|cl| cl.address == free[1] && cl.updated_at == 2_000)
    );
    assert!(
        now.iter()
            .any(|cl| cl.address == v4(a) && cl.pod.name == name(a)),
        "a's claim stays"
    );
    assert!(
        !now.iter().any(|cl| cl.address == v4(c)),
        "release never claims"
    );

    // A node cut off, its pod force-deleted (its sandbox may still run there): the pod's claims
    // are leaked by GC's table at once, but a repair releases them only at GC's own deadline,
    // the report plus the grace period and the additional delay.
    let cut_node = "node-2";
    s.must_apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: cut, namespace: {NS}}}\n\
         spec: {{nodeName: {cut_node}, terminationGracePeriodSeconds: 1, \
         containers: [{{name: c, image: busybox, command: [sleep, \"3600\"]}}]}}\n"
    ));
    let cut_ips = wait_for("pod cut running", Duration::from_secs(90), || async {
        let p = s.pods(NS, "").await;
        let ips = p
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("cut"))
            .map(pod_ips)
            .unwrap_or_default();
        (!ips.is_empty()).then_some(ips).ok_or(())
    })
    .await;
    // Older than GC's grace period, as a running pod's claim is: a younger one's sighting
    // would not count (the repair would wait for a later report).
    tokio::time::sleep(Duration::from_secs(6)).await;
    s.lab.stop_node(cut_node).await.unwrap();
    s.must(
        "kubectl",
        &[
            "-n",
            NS,
            "delete",
            "pod",
            "cut",
            "--force",
            "--grace-period=0",
        ],
    );
    let reported_at = Instant::now();
    let (_, cut_report) = check_json(&s).await;
    let cut_leaks = messages(&cut_report, "leaked-claim");
    for ip in &cut_ips {
        assert!(
            cut_leaks
                .iter()
                .any(|m| m.contains(&format!("{ip} ")) && m.contains("audit/cut")),
            "{cut_leaks:?}"
        );
    }
    std::fs::write(file.path(), serde_json::to_vec(&cut_report).unwrap()).unwrap();
    let at_once = release_from(&s, file.path());
    assert!(at_once.contains("not due yet"), "{at_once}");
    let held = |all: &[Claim]| {
        cut_ips
            .iter()
            .filter(|ip| all.iter().any(|c| c.address == **ip))
            .count()
    };
    assert_eq!(
        held(&with_store(&store, |s| s.all().unwrap()).await),
        cut_ips.len(),
        "nothing released at once: {at_once}"
    );
    wait_for(
        "the cut-off pod's claims released at GC's deadline",
        Duration::from_secs(90),
        || async {
            let out = release_from(&s, file.path());
            let left = held(&with_store(&store, |s| s.all().unwrap()).await);
            (left == 0)
                .then_some(())
                .ok_or(format!("{left} held: {out}"))
        },
    )
    .await;
    assert!(
        reported_at.elapsed() >= Duration::from_secs(9),
        "released {:?} after the report, before the grace period and the additional delay \
         (5 + 10 s, to within the report's whole seconds)",
        reported_at.elapsed()
    );
    s.lab.start_node(cut_node).await.unwrap();

    // The controller back: it counts the same drift and tells what persists.
    scale_controller(&s, 2);
    s.wait_ready().await;
    wait_for(
        "the drift in the leader's metrics",
        Duration::from_secs(120),
        || async {
            let m = leader_metrics(&s).await?;
            let seen = (drift(&m, "unclaimed-address"), drift(&m, "claimed-twice"));
            (seen == (Some(1), Some(1)))
                .then_some(())
                .ok_or(format!("{seen:?}"))
        },
    )
    .await;
    wait_for(
        "an IPAMDrift Event on pod c",
        Duration::from_secs(120),
        || async {
            let out = s.kubectl(&[
                "-n",
                NS,
                "get",
                "events.events.k8s.io",
                "--field-selector=reason=IPAMDrift",
                "-o",
                "json",
            ]);
            let events: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
            let notes: Vec<String> = events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["regarding"]["name"] == name(c).as_str())
                .filter_map(|e| e["note"].as_str().map(str::to_string))
                .collect();
            notes
                .iter()
                .any(|n| n.starts_with("unclaimed-address:") && n.contains(&v4(c).to_string()))
                .then_some(())
                .ok_or(format!("{notes:?}"))
        },
    )
    .await;

    // Repaired: the bogus record gone, the pod using the unclaimed address replaced (GC
    // releases ghost-2's claim and the controller writes the counts by themselves).
    let mut ep = endpoints.get(&name(b)).await.unwrap();
    ep.spec.interfaces.retain(|i| i.ifname != "net9");
    endpoints
        .replace(&name(b), &PostParams::default(), &ep)
        .await
        .unwrap();
    s.must("kubectl", &["-n", NS, "delete", "pod", &name(c)]);
    s.ready_pods(NS, "app=app", 3).await;
    wait_for(
        "ipam check clean again",
        Duration::from_secs(180),
        || async {
            let (ok, report) = check_json(&s).await;
            ok.then_some(()).ok_or(report)
        },
    )
    .await;
    wait_for(
        "no drift in the leader's metrics",
        Duration::from_secs(60),
        || async {
            let m = leader_metrics(&s).await?;
            let total: u64 = allot_core::audit::KINDS
                .iter()
                .map(|k| drift(&m, k).unwrap_or(99))
                .sum();
            (total == 0)
                .then_some(())
                .ok_or(format!("{total} findings"))
        },
    )
    .await;
    s.no_refusals();
}
