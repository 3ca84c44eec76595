//! The light control plane: etcd and kube-apiserver on 127.0.0.1, several at once, torn down
//! on drop.

use std::time::Instant;

use allot_lab::{LoopbackControlPlane, LoopbackOptions};
use serde_json::json;

fn running(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Three start at once, each with its own ports and directory; each serves pods, bound to a
/// node, whose status is written through the status subresource; a user of its own shows in
/// the audit log; dropping one kills its processes and removes its directory.
#[test]
fn several_start_at_once_serve_and_go_without_a_trace() {
    let started = Instant::now();
    let planes: Vec<LoopbackControlPlane> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..3)
            .map(|_| s.spawn(|| LoopbackControlPlane::for_test("loopback", Default::default())))
            .collect();
        starting
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Option<Vec<_>>>()
    })
    .unwrap_or_default();
    if planes.is_empty() {
        return;
    }
    println!("three control planes up in {:.1?}", started.elapsed());
    let servers: Vec<String> = planes.iter().map(|p| p.server()).collect();
    assert_eq!(
        servers.len(),
        servers
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        "{servers:?}"
    );

    let plane = &planes[0];
    // The `kubernetes` Service has an endpoint: the advertised address is not loopback. The
    // API server's endpoint reconciler writes it shortly after start (later on a busy machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let slices = plane.list("discovery.k8s.io/v1", "endpointslices").unwrap();
        if slices
            .iter()
            .any(|s| s["endpoints"][0]["addresses"][0] == "192.0.2.1")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{slices:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    plane.create_namespace("team", json!({"a": "b"})).unwrap();
    let pod = plane
        .create(
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"namespace": "team", "name": "p"},
                   "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "pause"}]}}),
        )
        .unwrap();
    let mut running_pod = pod.clone();
    running_pod["status"] = json!({"phase": "Running", "podIP": "10.0.0.5"});
    plane.replace_status("pods", running_pod).unwrap();
    let stored = plane.get("v1", "pods", Some("team"), "p").unwrap().unwrap();
    assert_eq!(stored["status"]["phase"], "Running");
    assert_eq!(stored["metadata"]["uid"], pod["metadata"]["uid"]);

    let kubeconfig = plane
        .user_kubeconfig("reader", &["system:masters"])
        .unwrap();
    let out = std::process::Command::new(allot_lab::paths::tools_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "pod", "-n", "team", "p", "-o", "name"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pod/p");
    let reads = plane.requests_of("reader").unwrap();
    assert!(
        reads
            .iter()
            .any(|r| r.verb == "get" && r.resource == "/pods" && r.name == "p"),
        "{reads:?}"
    );

    // A bound pod goes at once with a grace period of 0.
    assert!(plane.delete("v1", "pods", Some("team"), "p").unwrap());
    assert!(
        plane
            .get("v1", "pods", Some("team"), "p")
            .unwrap()
            .is_none()
    );

    // Webhooks are called, as on any cluster (once the API server's informer has the new
    // configuration: a write a moment after it may still pass).
    let started = std::time::Instant::now();
    let refused = loop {
        match write_past_a_webhook_that_leads_nowhere(&planes[1]) {
            Err(refused) => break refused,
            Ok(()) if started.elapsed() < std::time::Duration::from_secs(10) => {
                std::thread::sleep(std::time::Duration::from_millis(200))
            }
            Ok(()) => panic!("a webhook configuration was not called within 10 s"),
        }
    };
    assert!(
        format!("{refused:#}").contains("failed calling webhook"),
        "{refused:#}"
    );

    let dirs: Vec<_> = planes.iter().map(|p| p.dir().to_path_buf()).collect();
    let pids: Vec<u32> = dirs
        .iter()
        .flat_map(|d| {
            std::fs::read_dir("/proc").unwrap().filter_map(move |e| {
                let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                String::from_utf8_lossy(&cmdline)
                    .contains(d.to_str().unwrap())
                    .then_some(pid)
            })
        })
        .collect();
    assert_eq!(pids.len(), 6, "etcd and kube-apiserver each: {pids:?}");
    let stopping = Instant::now();
    drop(planes);
    println!("three torn down in {:.1?}", stopping.elapsed());
    for pid in pids {
        assert!(!running(pid), "{pid} still runs");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} is left", dir.display());
    }
}

/// A validating webhook, failing closed, whose Service leads nowhere; then a ConfigMap it
/// judges.
fn write_past_a_webhook_that_leads_nowhere(plane: &LoopbackControlPlane) -> anyhow::Result<()> {
    let configured = plane.get(
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        None,
        "nowhere",
    )?;
    if configured.is_none() {
        plane
            .create(
                "validatingwebhookconfigurations",
                json!({"apiVersion": "admissionregistration.k8s.io/v1",
                   "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "nowhere"},
                   "webhooks": [{"name": "nowhere.example.com", "sideEffects": "None",
                     "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
                     "clientConfig": {"service": {"namespace": "default", "name": "nowhere"}},
                     "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                "operations": ["CREATE"], "resources": ["configmaps"]}]}]}),
            )
            .unwrap();
    }
    plane
        .create(
            "configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"namespace": "default", "generateName": "written-"}}),
        )
        .map(drop)
}

/// Without the webhook admission plugins, a webhook configuration whose Service leads nowhere
/// does not stop writes.
#[test]
fn webhooks_can_be_left_uncalled() {
    let Some(plane) = LoopbackControlPlane::for_test(
        "webhooks_can_be_left_uncalled",
        LoopbackOptions {
            admission_webhooks: false,
            ..Default::default()
        },
    ) else {
        return;
    };
    write_past_a_webhook_that_leads_nowhere(&plane).expect("no webhook is called");
}
