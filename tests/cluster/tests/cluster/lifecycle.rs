//! An installation's life on the real control plane, each on a lab of its own: an upgrade whose
//! CRDs changed (the hook upgrades them), then the README's uninstall sequence; the same
//! sequence with `helm uninstall --no-hooks`, and after the release's namespace was deleted
//! first. Whatever the path, nothing is left stuck: no CRD Terminating behind a finalizer, no
//! webhook configuration calling a Service that is gone.

use std::time::Duration;

use allot_cluster_tests::objects::{claims, pod_ips};
use allot_cluster_tests::{NAMESPACE, RELEASE, Suite, install_args};
use allot_lab::testing::wait_for;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};

fn allotctl(s: &Suite, args: &[&str]) -> std::process::Output {
    let bin = allot_lab::paths::allot_bin_dir().join("allotctl");
    std::process::Command::new(&bin)
        .args(["--kubeconfig", s.lab.kubeconfig().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()))
}

/// allot's CRDs present on the cluster, with `Terminating` for those being deleted.
async fn allot_crds(s: &Suite) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    crds.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.group == "allot.dev")
        .map(|c| {
            let name = c.metadata.name.unwrap_or_default();
            match c.metadata.deletion_timestamp {
                Some(_) => format!("{name} (Terminating)"),
                None => name,
            }
        })
        .collect()
}

async fn webhook_configurations(s: &Suite) -> Vec<String> {
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let mut out = Vec::new();
    if validating.get_opt("allot").await.unwrap().is_some() {
        out.push("validating allot".to_string());
    }
    if mutating.get_opt("allot").await.unwrap().is_some() {
        out.push("mutating allot".to_string());
    }
    out
}

/// `allotctl crds --delete`, the sequence's last step; then nothing of allot is left.
async fn delete_crds_and_nothing_is_stuck(s: &Suite) {
    let out = allotctl(s, &["crds", "--delete", "--wait-seconds", "120"]);
    assert!(
        out.status.success(),
        "allotctl crds --delete: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(allot_crds(s).await, Vec::<String>::new(), "a CRD is left");
    assert_eq!(webhook_configurations(s).await, Vec::<String>::new());
}

/// The README's uninstall, first steps: the pods using allot, then the pools (the controller
/// takes their finalizer off), then the release.
/// allot's requests were all authorized while it was installed ([`Suite::no_refusals`]); once
/// `helm uninstall` begins, Helm deletes the RBAC objects while the pods are still stopping (a
/// controller giving its Lease up), so refusals from then on are expected and not checked.
async fn uninstall_as_the_readme_says(s: &Suite, ns: &str, uninstall: &[&str]) {
    s.must("kubectl", &["delete", "namespace", ns, "--wait=true"]);
    s.must("kubectl", &["delete", "ippools", "--all", "--wait=true"]);
    s.no_refusals();
    s.must("helm", uninstall);
}

/// Whether the IPBlock CRD is this allot's: its claims record their node (the older one's
/// blocks named a node and a pool themselves).
fn claims_record_their_node(crd: &CustomResourceDefinition) -> bool {
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["claims"]["additionalProperties"]
        ["properties"]
        .get("node")
        .is_some()
}

/// `kubectl create --dry-run=server` of an IPPool (the validating and mutating webhooks run,
/// nothing is stored) every 250 ms, from a thread, until stopped.
struct WebhookProber {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(std::time::Instant, Result<(), String>)>>,
}

impl WebhookProber {
    fn start(s: &Suite) -> WebhookProber {
        let pool = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            pool.path(),
            allot_cluster_tests::objects::pool_yaml(
                "webhook-probe",
                "2001:db8:1ab::/64",
                "2001:db8:1ab::1",
                "2001:db8:1ab::b:0-2001:db8:1ab::b:f",
            ),
        )
        .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kubectl, kubeconfig) = (
            allot_cluster_tests::tools().join("kubectl"),
            s.lab.kubeconfig(),
        );
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                let out = std::process::Command::new(&kubectl)
                    .args(["create", "--dry-run=server", "-f"])
                    .arg(pool.path())
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .unwrap();
                let result = match out.status.success() {
                    true => Ok(()),
                    false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
                };
                seen.push((std::time::Instant::now(), result));
                std::thread::sleep(Duration::from_millis(250));
            }
            seen
        });
        WebhookProber { stop, thread }
    }

    /// Stops probing; the longest time from a failed write to the next that succeeded.
    fn stop(self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = self.thread.join().unwrap();
        let mut longest = Duration::ZERO;
        let mut failing_since = None;
        for (at, result) in &seen {
            match (result, failing_since) {
                (Err(e), None) => {
                    println!("webhook probe failed: {}", e.trim());
                    failing_since = Some(*at);
                }
                (Ok(()), Some(since)) => {
                    longest = longest.max(at.duration_since(since));
                    failing_since = None;
                }
                _ => {}
            }
        }
        if failing_since.is_some() {
            // Still failing when the probing stopped: it never came back.
            longest = Duration::from_secs(3600);
        }
        longest
    }
}

/// The sandboxes of pods of `ns` the nodes' runtimes set up: how long each took (ms: on a real
/// node containerd's RunPodSandbox, the CNI ADD with the pause container's start; on a stand-in
/// its ADD), and whether it succeeded.
fn add_times(s: &Suite, ns: &str) -> Vec<(f64, bool)> {
    let mut out = Vec::new();
    for node in s.lab.nodes() {
        if let Some(log) = &node.runtime_log {
            for run in allot_lab::realnode::runs::sandbox_runs(log) {
                if run.namespace == ns {
                    if let Some(e) = &run.error {
                        println!("the sandbox of {} failed: {e}", run.name);
                    }
                    out.push((run.seconds * 1000.0, run.error.is_none()));
                }
            }
            continue;
        }
        let log = std::fs::read_to_string(node.root.join(allot_lab::node::cni::ADD_LOG))
            .unwrap_or_default();
        for line in log.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["namespace"] == ns {
                if v["ok"] != true {
                    println!("ADD of {} failed: {}", v["pod"], v["error"]);
                }
                out.push((v["add_ms"].as_f64().unwrap_or(f64::MAX), v["ok"] == true));
            }
        }
    }
    out
}

/// A pod with an address, in namespace `ns`.
async fn a_pod(s: &Suite, ns: &str) {
    s.namespace(ns).await;
    s.must(
        "kubectl",
        &[
            "-n",
            ns,
            "run",
            "demo",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sleep",
            "3600",
        ],
    );
    let pod = s.ready_pods(ns, "run=demo", 1).await.remove(0);
    assert_eq!(pod_ips(&pod).len(), 2);
}

/// A cluster whose CRDs an older allot applied (allot's first API) gets a release that does not
/// upgrade them (`crds.upgrade=false`, as a chart before the hook); `helm upgrade` to the chart
/// of this checkout runs the hook, which brings every CRD to this allot's: a claim then records
/// its node, a field the old schema pruned. Then the README's uninstall leaves nothing.
#[tokio::test]
async fn an_upgrade_over_older_crds_then_the_readme_uninstall_leaves_nothing_stuck() {
    let Some(s) = Suite::own(
        "an_upgrade_over_older_crds_then_the_readme_uninstall_leaves_nothing_stuck",
        2,
        |_| {},
    )
    .await
    else {
        return;
    };
    s.must("kubectl", &["apply", "-f", "tests/fixtures/crds-699f2d6/"]);
    // Helm 4 applies a chart's crds/ with server-side apply, which conflicts with CRDs another
    // manager wrote differently (here kubectl): the README's install over CRDs already there
    // says --skip-crds, and leaves them to the hook.
    let mut refused = install_args("install");
    refused.extend(["--set", "crds.upgrade=false"]);
    let out = s.helm(&refused);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("conflict"),
        "helm install over older CRDs without --skip-crds: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = s.helm(&["uninstall", RELEASE, "-n", NAMESPACE]);
    let mut old = install_args("install");
    old.extend(["--skip-crds", "--set", "crds.upgrade=false"]);
    s.must("helm", &old);
    s.wait_ready().await;

    // The upgrade rolls the controller's pods (a new version's image would; here an annotation)
    // while pods start and pools are written through the webhook.
    let during = s.namespace("during").await;
    let prober = WebhookProber::start(&s);
    let mut upgrade: Vec<String> = install_args("upgrade")
        .iter()
        .map(|a| a.to_string())
        .collect();
    upgrade.extend([
        "--set".into(),
        "controller.podAnnotations.upgraded=yes".into(),
    ]);
    let (helm, kubeconfig) = (
        allot_cluster_tests::tools().join("helm"),
        s.lab.kubeconfig(),
    );
    let upgrading = std::thread::spawn(move || {
        std::process::Command::new(helm)
            .args(&upgrade)
            .env("KUBECONFIG", kubeconfig)
            .current_dir(allot_cluster_tests::root())
            .output()
            .unwrap()
    });
    // Pods start once the pre-upgrade hook has brought the CRDs up to date (until then the
    // agents of this checkout, installed over older CRDs, cannot write IPBlocks: this test's
    // own skew, not an upgrade's), while Helm rolls the controller's pods.
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    wait_for(
        "the hook upgraded the IPBlock CRD",
        Duration::from_secs(180),
        || async {
            let crd = crds
                .get("ipblocks.allot.dev")
                .await
                .map_err(|e| e.to_string())?;
            claims_record_their_node(&crd)
                .then_some(())
                .ok_or("not yet".to_string())
        },
    )
    .await;
    s.must(
        "kubectl",
        &[
            "-n",
            &during,
            "create",
            "deployment",
            "during",
            "--image=busybox",
            "--replicas=6",
            "--",
            "sleep",
            "3600",
        ],
    );
    let out = upgrading.join().unwrap();
    assert!(
        out.status.success(),
        "helm upgrade: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.wait_ready().await;
    s.ready_pods(&during, "app=during", 6).await;
    // Spiderpool #4243, #3917: after an upgrade the webhook served a certificate its
    // configuration did not trust, and pool writes (and pods waiting on them) failed until
    // someone restarted things. Here a pool write through the webhook works again within 10 s
    // of any failure, and no pod's ADD waits on the webhook at all.
    let longest = prober.stop();
    println!("webhook unavailable at most {longest:.1?} during the upgrade");
    assert!(
        longest <= Duration::from_secs(10),
        "the webhook failed pool writes for {longest:?}"
    );
    let adds = add_times(&s, &during);
    assert!(
        adds.len() >= 6,
        "the ADDs of the pods started during the upgrade: {adds:?}"
    );
    assert!(
        adds.iter().all(|(_, ok)| *ok),
        "an ADD failed during the upgrade: {adds:?}"
    );
    let slowest = adds.iter().map(|(ms, _)| *ms).fold(0.0, f64::max);
    println!("slowest ADD during the upgrade: {slowest:.0} ms");
    assert!(
        slowest < 5000.0,
        "an ADD waited {slowest:.0} ms during the upgrade"
    );
    s.must("kubectl", &["delete", "namespace", &during, "--wait=true"]);

    let ipblocks = crds.get("ipblocks.allot.dev").await.unwrap();
    assert!(
        claims_record_their_node(&ipblocks),
        "the hook did not upgrade the IPBlock CRD"
    );
    assert_eq!(allot_crds(&s).await.len(), 8);

    a_pod(&s, "upgraded").await;
    let held = claims(&s.client).await;
    assert!(
        held.values().all(|h| !h.node.is_empty()),
        "claims made after the upgrade name their node: {held:?}"
    );

    uninstall_as_the_readme_says(
        &s,
        "upgraded",
        &["uninstall", RELEASE, "-n", NAMESPACE, "--wait"],
    )
    .await;
    assert_eq!(webhook_configurations(&s).await, Vec::<String>::new());
    delete_crds_and_nothing_is_stuck(&s).await;
}

/// `helm uninstall --no-hooks` runs no uninstall hook: the webhook configurations, owned by the
/// release's ClusterRole, go with it anyway (the garbage collector), so no pool write is left
/// refused by a webhook whose Service is gone.
#[tokio::test]
async fn helm_uninstall_without_hooks_leaves_no_webhook_configuration_behind() {
    let Some(s) = Suite::own(
        "helm_uninstall_without_hooks_leaves_no_webhook_configuration_behind",
        2,
        |_| {},
    )
    .await
    else {
        return;
    };
    s.install().await;
    a_pod(&s, "nohooks").await;
    uninstall_as_the_readme_says(
        &s,
        "nohooks",
        &[
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--no-hooks",
        ],
    )
    .await;
    wait_for(
        "the webhook configurations gone",
        Duration::from_secs(60),
        || async {
            let left = webhook_configurations(&s).await;
            left.is_empty().then_some(()).ok_or(left)
        },
    )
    .await;
    // A pool can be written again, webhook or not.
    s.must_apply(&allot_cluster_tests::objects::pool_yaml(
        "after",
        "192.0.2.0/24",
        "192.0.2.1",
        "192.0.2.10-192.0.2.20",
    ));
    delete_crds_and_nothing_is_stuck(&s).await;
}

/// The release's namespace deleted first, pods still holding addresses: the controller and the
/// agents are gone, and the Helm release with them (its records lived in that namespace). A pool
/// holding addresses keeps its finalizer, and the webhook configurations still call the deleted
/// Service. `allotctl crds --delete` takes both away: nothing is left stuck.
#[tokio::test]
async fn after_the_namespace_was_deleted_first_nothing_is_left_stuck() {
    let Some(s) = Suite::own(
        "after_the_namespace_was_deleted_first_nothing_is_left_stuck",
        2,
        |_| {},
    )
    .await
    else {
        return;
    };
    s.install().await;
    a_pod(&s, "stranded").await;
    // Deleting the namespace deletes allot's RBAC while its pods stop: checked before.
    s.no_refusals();
    s.must(
        "kubectl",
        &["delete", "namespace", NAMESPACE, "--wait=true"],
    );
    let gone = s.helm(&["status", RELEASE, "-n", NAMESPACE]);
    assert!(
        !gone.status.success(),
        "the release's records went with its namespace"
    );
    // Its pod goes: no agent takes the DEL (the plugin remembers it on the node).
    s.must(
        "kubectl",
        &["delete", "namespace", "stranded", "--wait=true"],
    );
    assert!(
        !claims(&s.client).await.is_empty(),
        "the address stays claimed: nobody could release it"
    );
    delete_crds_and_nothing_is_stuck(&s).await;
}
