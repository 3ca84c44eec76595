//! A real Kubernetes API server for the cluster-mode tests: upstream etcd and kube-apiserver on
//! 127.0.0.1 ([`allot_lab::LoopbackControlPlane`]), allot's CRDs applied by `allotctl crds
//! --apply` (what the chart's hook runs), and what a test sets up written as real API objects:
//! namespaces, nodes, pods bound to a node with their status written through the status
//! subresource, workloads, pools. Each binary under test gets a user of its own, so that the
//! API server's audit log says which requests it made ([`KubeApi::requests`]).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;

use allot_lab::audit::Request;
use allot_lab::{LoopbackControlPlane, LoopbackOptions};
use serde_json::{Value, json};

use crate::bin;

/// allot's API group and version.
pub const ALLOT: &str = "allot.dev/v1alpha1";

/// The control plane; its methods panic with the API server's answer when a request fails.
pub struct KubeApi {
    plane: LoopbackControlPlane,
}

impl Deref for KubeApi {
    type Target = LoopbackControlPlane;

    fn deref(&self) -> &LoopbackControlPlane {
        &self.plane
    }
}

impl KubeApi {
    /// Starts one for `test` with allot's CRDs Established; None (after saying why) when the
    /// lab's tests are skipped here (`ALLOT_LAB_SKIP`).
    pub fn start(test: &str) -> Option<KubeApi> {
        Self::start_with(test, LoopbackOptions::default())
    }

    /// [`KubeApi::start`] with `options`.
    pub fn start_with(test: &str, options: LoopbackOptions) -> Option<KubeApi> {
        let plane = LoopbackControlPlane::for_test(test, options)?;
        let out = Command::new(bin("allotctl"))
            .arg("--kubeconfig")
            .arg(plane.kubeconfig())
            .args(["crds", "--apply"])
            .output()
            .expect("allotctl runs");
        assert!(
            out.status.success(),
            "allotctl crds --apply: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(KubeApi { plane })
    }

    /// A kubeconfig of user `user`, in `system:masters`.
    pub fn kubeconfig_of(&self, user: &str) -> PathBuf {
        self.plane
            .user_kubeconfig(user, &["system:masters"])
            .unwrap_or_else(|e| panic!("a kubeconfig for {user}: {e:#}"))
    }

    /// Creates `object` of `plural`; returns it as stored (its UID, resourceVersion).
    #[track_caller]
    pub fn create(&self, plural: &str, object: Value) -> Value {
        self.plane
            .create(plural, object.clone())
            .unwrap_or_else(|e| panic!("creating {plural} {object}: {e:#}"))
    }

    /// Replaces `object` of `plural` on the resourceVersion it carries (built-in kinds also
    /// without one: unconditionally).
    #[track_caller]
    pub fn replace(&self, plural: &str, object: Value) -> Value {
        self.plane
            .replace(plural, object.clone())
            .unwrap_or_else(|e| panic!("replacing {plural} {object}: {e:#}"))
    }

    /// Edits object `name` of `plural` as `kubectl edit` does (read, `change`, replace on the
    /// version read, again on a conflict).
    #[track_caller]
    pub fn edit(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
        change: impl Fn(&mut Value),
    ) -> Value {
        self.plane
            .edit(api_version, plural, namespace, name, change)
            .unwrap_or_else(|e| panic!("editing {plural} {name}: {e:#}"))
    }

    /// Writes `object`'s status through the status subresource.
    #[track_caller]
    pub fn replace_status(&self, plural: &str, object: Value) -> Value {
        self.plane
            .replace_status(plural, object.clone())
            .unwrap_or_else(|e| panic!("writing the status of {plural} {object}: {e:#}"))
    }

    /// Every object of `plural` of `api_version`, in every namespace.
    #[track_caller]
    pub fn objects(&self, api_version: &str, plural: &str) -> Vec<Value> {
        self.plane
            .list(api_version, plural)
            .unwrap_or_else(|e| panic!("listing {plural}: {e:#}"))
    }

    /// Object `name` of `plural`, if any.
    #[track_caller]
    pub fn object(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.plane
            .get(api_version, plural, namespace, name)
            .unwrap_or_else(|e| panic!("reading {plural} {name}: {e:#}"))
    }

    /// Deletes object `name` at once (grace period 0); false when there was none.
    #[track_caller]
    pub fn remove(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        self.plane
            .delete(api_version, plural, namespace, name)
            .unwrap_or_else(|e| panic!("deleting {plural} {name}: {e:#}"))
    }

    /// Creates namespace `name` with `labels` and its `default` ServiceAccount; `default`
    /// exists already and gets the labels.
    pub fn namespace(&self, name: &str, labels: Value) {
        if name == "default" {
            let mut ns = self
                .object("v1", "namespaces", None, "default")
                .expect("namespace default");
            ns["metadata"]["labels"] = labels;
            self.replace("namespaces", ns);
        } else {
            self.plane
                .create_namespace(name, labels)
                .unwrap_or_else(|e| panic!("creating namespace {name}: {e:#}"));
        }
    }

    /// Creates Node `name` with `labels`; `ready` writes a Ready condition through its status
    /// (as its kubelet would).
    pub fn node(&self, name: &str, labels: Value, ready: bool) {
        let node = self.create(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": name, "labels": labels}}),
        );
        if ready {
            let mut node = node;
            node["status"] = json!({"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": now(), "lastTransitionTime": now()}]});
            self.replace_status("nodes", node);
        }
    }

    /// The requests user `user` made of `verb` on `resource` (`group/plural`, the core group
    /// empty: `/pods`, `apps/replicasets`), once every request answered before this call is in
    /// the audit log.
    pub fn requests(&self, user: &str, verb: &str, resource: &str) -> Vec<Request> {
        self.plane
            .requests_of(user)
            .expect("the audit log")
            .into_iter()
            .filter(|r| r.verb == verb && r.resource == resource)
            .collect()
    }

    /// The admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> &Path {
        self.plane.kubeconfig()
    }
}

/// The current time as the API writes timestamps (RFC 3339).
pub fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// An IPPool object as the cluster-mode tests create it.
pub fn pool(name: &str, subnet: &str, gateway: &str, ips: &str, default: bool) -> Value {
    json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"subnet": subnet, "gateway": gateway, "ips": [ips], "default": default},
    })
}

/// The cluster-mode tests' pools: `plain` (the default) and `annotated`.
pub fn two_pools() -> Vec<Value> {
    vec![
        pool(
            "plain",
            "10.97.0.0/24",
            "10.97.0.1",
            "10.97.0.10-10.97.0.19",
            true,
        ),
        pool(
            "annotated",
            "10.97.1.0/24",
            "10.97.1.1",
            "10.97.1.10-10.97.1.19",
            false,
        ),
    ]
}
