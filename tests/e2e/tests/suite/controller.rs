//! allot-controller as shipped: two real replicas against a real kube-apiserver (upstream
//! etcd and kube-apiserver on 127.0.0.1, with allot's CRDs). Only the leader acts; when it is
//! killed the other takes over; leaked addresses are released exactly once, pool status and
//! finalizers are kept; `allotctl gc --dry-run` reports without writing.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use allot_e2e::bin;
use allot_e2e::kube::{ALLOT, KubeApi};
use allot_lab::LoopbackOptions;
use serde_json::{Value, json};

struct Cluster {
    api: KubeApi,
}

impl Cluster {
    fn new(test: &str) -> Option<Cluster> {
        // The controller creates its webhook configurations (failing closed) for a Service
        // that would have to lead to a non-loopback address of this machine; the admission
        // webhooks are tested on the lab (tests/cluster) and against their own server
        // (host/controller/tests/suite/webhook_tls.rs). Here the API server does not call them.
        let api = KubeApi::start_with(
            test,
            LoopbackOptions {
                admission_webhooks: false,
                ..Default::default()
            },
        )?;
        api.node("node-1", json!({}), true);
        api.namespace("web", json!({}));
        api.namespace("allot-system", json!({}));
        api.create(
            "ippools",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
                   "metadata": {"name": "p"},
                   "spec": {"subnet": "10.9.0.0/24", "ips": ["10.9.0.10-10.9.0.29"]}}),
        );
        Some(Cluster { api })
    }

    /// A Running pod on node-1 holding 10.9.0.10; returns its UID.
    fn pod(&self, name: &str) -> String {
        let mut stored = self.api.create(
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"namespace": "web", "name": name},
                   "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]}}),
        );
        stored["status"] = json!({"phase": "Running", "podIP": "10.9.0.10",
                                  "podIPs": [{"ip": "10.9.0.10"}]});
        self.api.replace_status("pods", stored)["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Claims in the IPBlock 10.9.0.0/26: (address, pod, uid).
    fn claims(&self, claims: &[(&str, &str, &str)]) {
        let claims: serde_json::Map<String, Value> = claims
            .iter()
            .map(|(address, pod, uid)| {
                (
                    address.to_string(),
                    json!({"pool": "p", "network": "underlay",
                           "containerId": format!("c-{pod}"), "interface": "eth0",
                           "namespace": "web", "pod": pod, "uid": uid,
                           "ownerKind": "Deployment", "ownerName": "web",
                           "updatedAt": 1_700_000_000u64}),
                )
            })
            .collect();
        self.api.create(
            "ipblocks",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
                   "metadata": {"name": "v4-10-9-0-0-26"},
                   "spec": {"cidr": "10.9.0.0/26", "claims": claims}}),
        );
    }

    fn blocks(&self) -> Vec<Value> {
        self.api.objects(ALLOT, "ipblocks")
    }

    fn pools(&self) -> Vec<Value> {
        self.api.objects(ALLOT, "ippools")
    }

    fn held(&self) -> Vec<String> {
        let mut held: Vec<String> = self
            .blocks()
            .iter()
            .flat_map(|b| {
                b["spec"]["claims"]
                    .as_object()
                    .map(|c| c.keys().cloned().collect::<Vec<_>>())
                    .unwrap_or_default()
            })
            .collect();
        held.sort();
        held
    }

    fn log_path(&self, identity: &str) -> PathBuf {
        self.api.dir().join(format!("{identity}.log"))
    }

    fn controller(&self, identity: &str) -> Child {
        self.controller_with(identity, &[])
    }

    fn controller_with(&self, identity: &str, extra: &[&str]) -> Child {
        let log = std::fs::File::create(self.log_path(identity)).unwrap();
        let kubeconfig = self.api.kubeconfig_of(identity);
        Command::new(bin("allot-controller"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--identity", identity, "--namespace", "allot-system"])
            .args(["--metrics-address", "127.0.0.1:0", "--webhook-port", "0"])
            .args([
                "--lease-duration-seconds",
                "2",
                "--lease-renew-deadline-seconds",
                "1",
            ])
            .args([
                "--lease-retry-period-ms",
                "100",
                "--status-interval-seconds",
                "1",
            ])
            .args(["--gc-grace", "1", "--gc-interval", "1"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("allot-controller starts")
    }

    fn log(&self, identity: &str) -> String {
        std::fs::read_to_string(self.log_path(identity)).unwrap_or_default()
    }

    fn allotctl(&self, args: &[&str]) -> Output {
        let kubeconfig = self.api.kubeconfig_of("allotctl");
        Command::new(bin("allotctl"))
            .args([
                "--store",
                "kubernetes",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
            ])
            .args(args)
            .output()
            .expect("allotctl runs")
    }

    fn lease_holder(&self) -> Option<String> {
        self.api
            .object(
                "coordination.k8s.io/v1",
                "leases",
                Some("allot-system"),
                "allot-controller",
            )
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    }
}

fn until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn gc_dry_run_reports_what_would_be_released_and_changes_nothing() {
    let Some(c) = Cluster::new("gc_dry_run_reports_what_would_be_released_and_changes_nothing")
    else {
        return;
    };
    let uid = c.pod("web-1");
    c.claims(&[
        ("10.9.0.10", "web-1", &uid),
        ("10.9.0.11", "web-gone", "uid-gone"),
    ]);
    let before = c.blocks();
    let out = c.allotctl(&["gc", "--dry-run"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("10.9.0.11"), "{stdout}");
    assert!(stdout.contains("web/web-gone"), "{stdout}");
    assert!(stdout.contains("pod-deleted"), "{stdout}");
    assert!(
        !stdout.contains("10.9.0.10 "),
        "the running pod's address is not listed: {stdout}"
    );
    assert!(
        stdout.contains("1 address(es) would be released"),
        "{stdout}"
    );
    assert_eq!(c.blocks(), before, "nothing written");
    for verb in ["create", "update", "patch", "delete"] {
        let writes = c.api.requests("allotctl", verb, "allot.dev/ipblocks");
        assert_eq!(writes.len(), 0, "{verb}: {writes:?}");
    }

    // With the table's rule off for deleted pods there is no such rule: GC disabled lists none.
    let out = c.allotctl(&["gc", "--dry-run", "--gc-enabled", "false"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to release"));

    // Without --dry-run it says what to do instead, and writes nothing.
    let out = c.allotctl(&["gc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dry-run"));
    assert_eq!(c.blocks(), before);
}

#[test]
fn two_controllers_only_the_leader_acts_and_the_other_takes_over_when_it_dies() {
    let Some(c) =
        Cluster::new("two_controllers_only_the_leader_acts_and_the_other_takes_over_when_it_dies")
    else {
        return;
    };
    let uid = c.pod("web-1");
    c.claims(&[
        ("10.9.0.10", "web-1", &uid),
        ("10.9.0.11", "web-gone", "uid-gone"),
    ]);
    let a = c.controller("controller-a");
    until("a leads", Duration::from_secs(20), || {
        c.lease_holder().as_deref() == Some("controller-a")
    });
    let b = c.controller_with("controller-b", &["--shutdown-delay-seconds", "4"]);

    // The leaked address is released (seen twice, one grace second apart, the pod read again),
    // the running pod's stays; the pool gets its finalizer and its counts.
    until("the leak is released", Duration::from_secs(30), || {
        c.held() == ["10.9.0.10"]
    });
    until("the pool's status", Duration::from_secs(20), || {
        let p = &c.pools()[0];
        p["status"]["allocatedIPCount"] == 1 && p["status"]["totalIPCount"] == 20
    });
    assert_eq!(
        c.pools()[0]["metadata"]["finalizers"],
        json!(["allot.dev/claims"])
    );
    // Logged once the release is written: the API may show it first.
    let released = |who: &str| c.log(who).matches("released a leaked address").count();
    until("a logs the release", Duration::from_secs(10), || {
        released("controller-a") > 0
    });
    assert_eq!(released("controller-a"), 1, "{}", c.log("controller-a"));
    assert_eq!(released("controller-b"), 0, "the follower released nothing");
    assert_eq!(c.lease_holder().as_deref(), Some("controller-a"));

    // a dies without giving the lease up; b takes over after the lease's duration and acts.
    let mut a = a;
    a.kill().unwrap();
    a.wait().unwrap();
    c.claims_more(&[("10.9.0.12", "web-gone-2", "uid-gone-2")]);
    until("b leads", Duration::from_secs(20), || {
        c.lease_holder().as_deref() == Some("controller-b")
    });
    until("b releases the new leak", Duration::from_secs(30), || {
        c.held() == ["10.9.0.10"]
    });
    until("b logs the release", Duration::from_secs(10), || {
        released("controller-b") > 0
    });
    assert_eq!(released("controller-b"), 1, "{}", c.log("controller-b"));
    stop_draining(&c, b, "controller-b");
}

/// The address a line of `log` containing `message` gives in `field=`.
fn logged_address(log: &str, message: &str, field: &str) -> Option<std::net::SocketAddr> {
    log.lines()
        .filter(|l| l.contains(message))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(&format!("{field}=")))
        .and_then(|a| a.parse().ok())
}

/// SIGTERM to a leader started with `--shutdown-delay-seconds 4`: it gives the lease up at once
/// and reports not ready, but its webhook keeps accepting connections through the delay (the
/// API server may still send admissions there until it learns the replica is going: a webhook
/// that failed closed refused them, and `helm upgrade` with them); then it exits.
fn stop_draining(c: &Cluster, mut child: Child, identity: &str) {
    let log = c.log(identity);
    let metrics = logged_address(&log, "serving /metrics", "bound").expect(&log);
    let webhook = logged_address(&log, "webhook: serving HTTPS", "address").expect(&log);
    let readyz = || {
        let mut s = std::net::TcpStream::connect(metrics).ok()?;
        use std::io::{Read, Write};
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        answer.split_whitespace().nth(1).map(str::to_string)
    };
    assert_eq!(readyz().as_deref(), Some("200"));
    let signalled = Instant::now();
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    until("the lease is given up", Duration::from_secs(3), || {
        c.lease_holder().unwrap_or_default().is_empty()
    });
    until("not ready", Duration::from_secs(3), || {
        readyz().as_deref() == Some("503")
    });
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "took too long to tell before the delay's end"
    );
    assert!(
        std::net::TcpStream::connect(webhook).is_ok(),
        "the webhook stopped answering before the shutdown delay"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited before the delay"
    );
    until("it exits after the delay", Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    });
    assert!(
        signalled.elapsed() >= Duration::from_secs(4),
        "exited {:?} after SIGTERM, within its shutdown delay",
        signalled.elapsed()
    );
    assert!(std::net::TcpStream::connect(webhook).is_err());
}

impl Cluster {
    /// Adds claims to the block written by [`Cluster::claims`], as a user's edit.
    fn claims_more(&self, claims: &[(&str, &str, &str)]) {
        self.api
            .edit(ALLOT, "ipblocks", None, "v4-10-9-0-0-26", |block| {
                for (address, pod, uid) in claims {
                    block["spec"]["claims"][*address] = json!({"pool": "p",
                        "network": "underlay", "containerId": format!("c-{pod}"),
                        "interface": "eth0", "namespace": "web", "pod": pod, "uid": uid,
                        "updatedAt": 1_700_000_000u64});
                }
            });
    }
}

/// ResourceSlice `name`, when there is one.
fn slice_named(c: &Cluster, name: &str) -> Option<serde_json::Value> {
    c.api
        .object("resource.k8s.io/v1", "resourceslices", None, name)
}

/// The capacity `addresses` of the device of ResourceSlice `name`, when there is one.
fn slice_capacity(c: &Cluster, name: &str) -> Option<String> {
    let slice = slice_named(c, name)?;
    slice["spec"]["devices"][0]["capacity"]["addresses"]["value"]
        .as_str()
        .map(str::to_string)
}

/// Waits until the slice of `name` announces `capacity`; returns how long that took.
fn slice_reaches(c: &Cluster, name: &str, capacity: &str) -> Duration {
    let t = Instant::now();
    until(
        &format!("{name} announces {capacity}"),
        Duration::from_secs(20),
        || slice_capacity(c, name).as_deref() == Some(capacity),
    );
    t.elapsed()
}

#[test]
fn resource_slices_follow_the_pools_claims_and_reservations() {
    let Some(c) = Cluster::new("resource_slices_follow_the_pools_claims_and_reservations") else {
        return;
    };
    let slices = || c.api.objects("resource.k8s.io/v1", "resourceslices");
    let mut controller = c.controller_with("controller-a", &["--resource-slices", "true"]);
    // Pool p: 10.9.0.10-10.9.0.29, no gateway, nothing claimed: 20.
    let first = slice_reaches(&c, "p.ipam.allot.dev", "20");
    let slice = slice_named(&c, "p.ipam.allot.dev").unwrap();
    // As written: an API server that dropped allowMultipleAllocations or the capacity (the
    // DRAConsumableCapacity gate off) would fail here.
    let spec = &slice["spec"];
    assert_eq!(spec["driver"], "ipam.allot.dev", "{slice}");
    assert_eq!(spec["pool"]["name"], "p", "{slice}");
    assert_eq!(spec["allNodes"], true, "{slice}");
    assert!(spec.get("nodeName").is_none(), "{slice}");
    let device = &spec["devices"][0];
    assert_eq!(device["name"], "ipv4", "{slice}");
    assert_eq!(device["allowMultipleAllocations"], true, "{slice}");
    assert_eq!(device["attributes"]["subnet"]["string"], "10.9.0.0/24");
    assert_eq!(device["attributes"]["ipVersion"]["int"], 4);
    assert_eq!(
        device["capacity"]["addresses"]["requestPolicy"]["default"], "1",
        "{slice}"
    );

    // A claim (a running pod's address) takes one.
    let uid = c.pod("web-1");
    c.claims(&[("10.9.0.10", "web-1", &uid)]);
    let claimed = slice_reaches(&c, "p.ipam.allot.dev", "19");
    // A ReservedIP of two of the pool's addresses takes two more; removed, gives them back.
    c.api.create(
        "reservedips",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "ReservedIP",
               "metadata": {"name": "r"}, "spec": {"ips": ["10.9.0.20-10.9.0.21"]}}),
    );
    let reserved = slice_reaches(&c, "p.ipam.allot.dev", "17");
    assert!(c.api.remove("allot.dev/v1alpha1", "reservedips", None, "r"));
    let unreserved = slice_reaches(&c, "p.ipam.allot.dev", "19");

    // A second pool, scoped to node-1 by name: a nodeSelector, never spec.nodeName (the
    // kubelet deletes slices naming its node that its plugin did not publish).
    c.api.create(
        "ippools",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
               "metadata": {"name": "q"},
               "spec": {"subnet": "10.8.0.0/24", "ips": ["10.8.0.10-10.8.0.13"],
                        "nodeName": ["node-1"]}}),
    );
    let created = slice_reaches(&c, "q.ipam.allot.dev", "4");
    let q = slice_named(&c, "q.ipam.allot.dev").unwrap();
    assert!(q["spec"].get("nodeName").is_none(), "{q}");
    assert_eq!(
        q["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["node-1"]),
        "{q}"
    );
    // Deleted (no claim holds its addresses: its finalizer goes), its slice goes.
    assert!(c.api.remove("allot.dev/v1alpha1", "ippools", None, "q"));
    let t = Instant::now();
    until("q's slice is deleted", Duration::from_secs(20), || {
        slice_named(&c, "q.ipam.allot.dev").is_none()
    });
    let deleted = t.elapsed();
    assert_eq!(slices().len(), 1, "{:?}", slices());
    eprintln!(
        "resource slice lag: first {first:?}, claim {claimed:?}, reserved {reserved:?}, \
         unreserved {unreserved:?}, created {created:?}, deleted {deleted:?}"
    );

    // p was replaced once per change (19, 17, 19); with nothing changing, nothing is written
    // (the digest matches). q, terminating for a moment, may have been replaced to 0.
    let writes_of_p = || {
        c.api
            .requests("controller-a", "update", "resource.k8s.io/resourceslices")
            .into_iter()
            .filter(|r| r.name == "p.ipam.allot.dev")
            .count()
    };
    let writes = writes_of_p();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(writes_of_p(), writes, "replaced with nothing changed");
    assert_eq!(writes, 3, "one replace per change of p");
    controller.kill().unwrap();
    controller.wait().unwrap();
}
