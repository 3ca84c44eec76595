//! What the Helm chart runs from allot's image, run as the chart runs it: `allotctl crds --apply`
//! (the CRD hook, against the in-memory API server over loopback HTTP) and `allotctl cni install`
//! (the agent's init container, into temporary directories).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use allot_k8s::openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use allot_test_apiserver::ApiServer;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn allotctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allotctl"))
        .args(args)
        .output()
        .expect("running allotctl")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The repository's `crds/`, by name.
fn repo_crds() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(root().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (crd["metadata"]["name"].as_str().unwrap().to_string(), crd)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// An API server on a loopback port, with a kubeconfig for it, marking every CRD Established as
/// a real API server does once it serves the kind.
struct Cluster {
    server: ApiServer,
    kubeconfig: tempfile::NamedTempFile,
    _runtime: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = ApiServer::new();
        let addr = runtime
            .block_on(server.serve("127.0.0.1:0".parse().unwrap()))
            .unwrap();
        let s = server.clone();
        runtime.spawn(async move {
            let crds: Api<CustomResourceDefinition> = Api::all(s.client());
            let established =
                json!({"status": {"conditions": [{"type": "Established", "status": "True"}]}});
            loop {
                for crd in s.objects("customresourcedefinitions") {
                    if crd["status"]["conditions"].is_null() {
                        let name = crd["metadata"]["name"].as_str().unwrap();
                        let patch = Patch::Merge(&established);
                        let _ = crds
                            .patch_status(name, &PatchParams::default(), &patch)
                            .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let kubeconfig = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            kubeconfig.path(),
            ApiServer::kubeconfig(&format!("http://{addr}")),
        )
        .unwrap();
        Cluster {
            server,
            kubeconfig,
            _runtime: runtime,
        }
    }

    fn apply(&self) -> Output {
        let kubeconfig = self.kubeconfig.path().to_str().unwrap();
        allotctl(&["--kubeconfig", kubeconfig, "crds", "--apply"])
    }

    fn crds(&self) -> Vec<(String, Value)> {
        let mut out: Vec<(String, Value)> = self
            .server
            .objects("customresourcedefinitions")
            .into_iter()
            .map(|c| (c["metadata"]["name"].as_str().unwrap().to_string(), c))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn insert(&self, crd: Value) {
        self.server.insert("customresourcedefinitions", crd);
    }
}

/// Every stored CRD has the spec of the repository's `crds/`, and the version annotation.
fn assert_current(cluster: &Cluster) {
    let stored = cluster.crds();
    let repo = repo_crds();
    assert_eq!(
        stored.iter().map(|c| &c.0).collect::<Vec<_>>(),
        repo.iter().map(|c| &c.0).collect::<Vec<_>>()
    );
    for ((name, stored), (_, ours)) in stored.iter().zip(&repo) {
        assert_eq!(stored["spec"], ours["spec"], "{name}: spec");
        assert_eq!(
            stored["metadata"]["annotations"]["allot.dev/version"], VERSION,
            "{name}"
        );
    }
}

#[test]
fn crds_are_created_in_an_empty_cluster() {
    let cluster = Cluster::start();
    let out = cluster.apply();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("ippools.allot.dev: created"),
        "{}",
        text(&out)
    );
    assert_current(&cluster);
}

#[test]
fn older_crds_are_upgraded_whatever_they_lack_or_have_in_excess() {
    let cluster = Cluster::start();
    // The cluster holds the CRDs of an older allot, as `helm install` left them (Helm never
    // upgrades a chart's crds/): a property the old schema lacked (Policy's OCI source), one it
    // had and this one dropped, an older version annotation, and others' labels.
    for (name, mut crd) in repo_crds() {
        let schema = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        if name == "policies.allot.dev" {
            let source = &mut schema["properties"]["spec"]["properties"]["source"];
            source["properties"].as_object_mut().unwrap().remove("oci");
        }
        schema["properties"]["spec"]["properties"]["droppedSince"] = json!({"type": "string"});
        crd["metadata"]["annotations"] = json!({"allot.dev/version": "0.0.9", "team": "net"});
        crd["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "Helm"});
        crd["status"] = json!({"conditions": [{"type": "Established", "status": "True"}]});
        cluster.insert(crd);
    }
    let out = cluster.apply();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("policies.allot.dev: replaced"),
        "{}",
        text(&out)
    );
    assert_current(&cluster);
    for (name, stored) in cluster.crds() {
        assert_eq!(stored["metadata"]["annotations"]["team"], "net", "{name}");
        assert_eq!(
            stored["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm",
            "{name}"
        );
    }
    // Running it again (every upgrade does) changes nothing.
    let before = cluster.crds();
    assert!(cluster.apply().status.success());
    let after = cluster.crds();
    for ((name, a), (_, b)) in before.iter().zip(&after) {
        assert_eq!(a["spec"], b["spec"], "{name}");
    }
}

#[test]
fn a_crd_a_newer_allot_applied_is_never_downgraded() {
    let cluster = Cluster::start();
    let (name, mut newer) = repo_crds().remove(0);
    newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["addedLater"] = json!({"type": "string"});
    newer["metadata"]["annotations"] = json!({"allot.dev/version": "999.0.0"});
    newer["status"] = json!({"conditions": [{"type": "Established", "status": "True"}]});
    cluster.insert(newer.clone());
    let out = cluster.apply();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{name}: kept: allot 999.0.0 applied it")),
        "{}",
        text(&out)
    );
    let stored = cluster.crds().into_iter().find(|c| c.0 == name).unwrap().1;
    assert_eq!(stored["spec"], newer["spec"]);
}

#[test]
fn a_refusal_names_the_permission_missing() {
    let cluster = Cluster::start();
    cluster.server.forbid("patch", "customresourcedefinitions");
    let out = cluster.apply();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("needs get, patch and update on customresourcedefinitions"),
        "{}",
        text(&out)
    );
}

// ---------------------------------------------------------------------------------------------
// cni install

struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn file(&self, name: &str, content: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    }
    fn install(&self, extra: &[&str]) -> Output {
        let plugin = Path::new(env!("CARGO_BIN_EXE_allotctl")).with_file_name("allot");
        let bin = self.path("opt/cni/bin");
        let mut args = vec![
            "cni",
            "install",
            "--plugin",
            plugin.to_str().unwrap(),
            "--bin-dir",
            bin.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        allotctl(&args)
    }
    fn listing(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(dir))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

const IPAM: &str =
    r#"{"type": "allot", "socket": "/run/allot/agent.sock", "probe": {"conflict": true}}"#;
const CONFLIST: &str = r#"{"cniVersion": "1.0.0", "name": "underlay", "plugins": [
  {"type": "macvlan", "master": "eth1", "mode": "bridge",
   "ipam": {"type": "allot", "socket": "/run/allot/agent.sock"}}]}"#;

#[test]
fn the_plugin_and_configuration_are_installed_and_installed_again() {
    let node = Node::new();
    let ipam = node.file("ipam.json", IPAM);
    let conflist = node.file("net.conflist", CONFLIST);
    let ipam_dest = node.path("etc/cni/net.d/allot.d/ipam.json");
    let net_dest = node.path("etc/cni/net.d/10-allot.conflist");
    let args = [
        "--ipam",
        &ipam,
        "--ipam-dest",
        ipam_dest.to_str().unwrap(),
        "--network",
        &conflist,
        "--network-dest",
        net_dest.to_str().unwrap(),
    ];
    for _ in 0..2 {
        let out = node.install(&args);
        assert!(out.status.success(), "{}", text(&out));
        let installed = node.path("opt/cni/bin/allot");
        let plugin = Path::new(env!("CARGO_BIN_EXE_allotctl")).with_file_name("allot");
        assert_eq!(
            std::fs::read(&installed).unwrap(),
            std::fs::read(plugin).unwrap()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&installed).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(std::fs::read_to_string(&ipam_dest).unwrap(), IPAM);
        assert_eq!(std::fs::read_to_string(&net_dest).unwrap(), CONFLIST);
        // No temporary file is left beside what was installed.
        assert_eq!(node.listing("opt/cni/bin"), ["allot"]);
        assert_eq!(
            node.listing("etc/cni/net.d"),
            ["10-allot.conflist", "allot.d"]
        );
    }
    // The installed plugin runs (VERSION needs no agent).
    let out = Command::new(node.path("opt/cni/bin/allot"))
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    assert!(text(&out).contains("1.1.0"), "{}", text(&out));
}

#[test]
fn bad_configuration_is_refused_with_the_reason_and_nothing_is_written() {
    let cases = [
        (
            r#"{"type": "allot", "sokcet": "/run/allot/agent.sock"}"#,
            "unknown field in ipam: \"sokcet\"",
        ),
        (
            r#"{"type": "allot", "socket": "run/allot.sock"}"#,
            "must be an absolute path",
        ),
        (r#"{"type": "allot", "probe": {"tries": 0}}"#, "ipam.probe"),
        (r#"{"socket": "/run/allot/agent.sock"}"#, "has no \"type\""),
        (r#"["allot"]"#, "not a JSON object"),
        ("{\"type\": \"allot\"", "not JSON"),
    ];
    for (ipam, reason) in cases {
        let node = Node::new();
        let src = node.file("ipam.json", ipam);
        let dest = node.path("net.d/allot.d/ipam.json");
        let out = node.install(&["--ipam", &src, "--ipam-dest", dest.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{ipam}: {}", text(&out));
        assert!(text(&out).contains(reason), "{ipam}: {}", text(&out));
        assert!(
            node.listing("opt/cni/bin").is_empty(),
            "{ipam}: the plugin was installed"
        );
        assert!(!dest.exists(), "{ipam}");
    }
    let lists = [
        (
            CONFLIST.replace("\"allot\", \"socket\"", "\"host-local\", \"socket\""),
            "no plugin has \"ipam\": {\"type\": \"allot\"",
        ),
        (
            CONFLIST.replace("1.0.0", "0.2.0"),
            "incompatible CNI versions",
        ),
        (CONFLIST.replace("\"underlay\"", "\"\""), "name is empty"),
        (
            CONFLIST.replace(
                "/run/allot/agent.sock\"}",
                "/run/allot/agent.sock\", \"x\": 1}",
            ),
            "plugins[0].ipam",
        ),
        (
            r#"{"cniVersion": "1.0.0", "name": "n", "plugins": []}"#.into(),
            "non-empty \"plugins\"",
        ),
    ];
    for (conflist, reason) in lists {
        let node = Node::new();
        let src = node.file("net.conflist", &conflist);
        let dest = node.path("net.d/10-allot.conflist");
        let out = node.install(&["--network", &src, "--network-dest", dest.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{conflist}: {}", text(&out));
        assert!(text(&out).contains(reason), "{conflist}: {}", text(&out));
        assert!(!dest.exists());
    }
}

#[test]
fn a_destination_that_is_not_a_file_is_left_alone() {
    let node = Node::new();
    let src = node.file("ipam.json", IPAM);
    let dest = node.path("net.d/ipam.json");
    std::fs::create_dir_all(&dest).unwrap();
    let out = node.install(&["--ipam", &src, "--ipam-dest", dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("is not a regular file"),
        "{}",
        text(&out)
    );
    assert!(dest.is_dir());
    assert!(
        node.listing("opt/cni/bin").is_empty(),
        "the plugin was installed"
    );
}
