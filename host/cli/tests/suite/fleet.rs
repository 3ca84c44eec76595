//! `allotctl fleet plan` as a platform engineer runs it: the example of examples/fleet, the
//! YAML output, refusals with their reasons, and Cluster API clusters' datacenter label.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn allotctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allotctl"))
        .args(args)
        .output()
        .expect("running allotctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fleet")
        .join(name)
        .display()
        .to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn the_example_plan_serves_every_cluster_it_can_and_says_why_not_the_rest() {
    let pools = example("pools.yaml");
    let clusters = example("clusters.yaml");
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    let expected = "\
IPAMPool metallb
  datacenter berlin
    cluster-analytics (analytics)  refused: IPAMPool metallb datacenter berlin is deprecated and serves no new cluster: give the datacenter another IPAMPool, or set deprecated back to false
  datacenter hamburg
    cluster-edge                   192.168.1.21-192.168.1.30  new
    cluster-legacy (legacy)        192.168.1.200-192.168.1.209  kept
    cluster-shop (shop)            192.168.1.31-192.168.1.40  new
IPAMPool nodes-v6
  datacenter hamburg
    cluster-legacy (legacy)        fd00:10:0:1::/64  new
    cluster-shop (shop)            fd00:10:0:2::/64  new
4 new, 1 kept, 0 grown, 1 refused, 0 released
";
    assert_eq!(text, expected);
    // The same again: deterministic.
    let again = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    assert_eq!(stdout(&again), text);
}

#[test]
fn yaml_output_is_the_ipamallocation_objects() {
    let out = allotctl(&[
        "fleet",
        "plan",
        "-f",
        &example("pools.yaml"),
        "--clusters",
        &example("clusters.yaml"),
        "-o",
        "yaml",
    ]);
    let text = stdout(&out);
    let objects: Vec<allot_k8s::IPAMAllocation> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let shown: Vec<(String, String, String)> = objects
        .iter()
        .map(|o| {
            (
                o.metadata.namespace.clone().unwrap(),
                o.metadata.name.clone().unwrap(),
                o.spec.allocation().unwrap().unwrap().to_string(),
            )
        })
        .collect();
    let expect = |ns: &str, pool: &str, a: &str| (ns.to_string(), pool.to_string(), a.to_string());
    assert_eq!(
        shown,
        [
            expect("cluster-edge", "metallb", "192.168.1.21-192.168.1.30"),
            expect("cluster-legacy", "metallb", "192.168.1.200-192.168.1.209"),
            expect("cluster-shop", "metallb", "192.168.1.31-192.168.1.40"),
            expect("cluster-legacy", "nodes-v6", "fd00:10:0:1::/64"),
            expect("cluster-shop", "nodes-v6", "fd00:10:0:2::/64"),
        ]
    );
    assert!(text.contains("apiVersion: allot.dev/v1alpha1"), "{text}");
    assert!(text.contains("type: prefix"), "{text}");
    assert!(
        stderr(&out).contains("refused: IPAMPool metallb datacenter berlin is deprecated"),
        "{}",
        stderr(&out)
    );
}

const POOL: &str = "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 6}
";

#[test]
fn an_exhausted_pool_refuses_the_last_cluster_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let pools = write(dir.path(), "pools.yaml", POOL);
    let clusters = write(
        dir.path(),
        "clusters.yaml",
        "- {name: a, datacenter: dc1}\n- {name: b, datacenter: dc1}\n- {name: c, datacenter: dc1}\n",
    );
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("cluster-a (a)  10.0.0.1-10.0.0.6  new"),
        "{text}"
    );
    assert!(
        text.contains("cluster-b (b)  10.0.0.7-10.0.0.12  new"),
        "{text}"
    );
    assert!(
        text.contains(
            "cluster-c (c)  refused: IPAMPool lb datacenter dc1: cluster cluster-c: poolCidr 10.0.0.0/28 has 2 free addresses, the cluster needs 6 more"
        ),
        "{text}"
    );
}

#[test]
fn a_cluster_api_cluster_reads_its_datacenter_from_the_label_given() {
    let dir = tempfile::tempdir().unwrap();
    let pools = write(dir.path(), "pools.yaml", POOL);
    let cluster = "apiVersion: cluster.x-k8s.io/v1beta1
kind: Cluster
metadata:
  name: shop
  namespace: team-a
  labels: {topology.example.com/site: dc1}
";
    let clusters = write(dir.path(), "clusters.yaml", cluster);
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains(
            "Cluster team-a/shop: no label allot.dev/datacenter: label it with its datacenter, or name the label that holds it with --datacenter-label"
        ),
        "{}",
        stdout(&out)
    );
    let out = allotctl(&[
        "fleet",
        "plan",
        "-f",
        &pools,
        "--clusters",
        &clusters,
        "--datacenter-label",
        "topology.example.com/site",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("team-a (shop)  10.0.0.1-10.0.0.6  new"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_grown_range_appends_and_a_gone_cluster_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let pools = write(
        dir.path(),
        "pools.yaml",
        &format!(
            "{}---
apiVersion: allot.dev/v1alpha1
kind: IPAMAllocation
metadata: {{name: lb, namespace: cluster-a}}
spec: {{type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.4]}}
---
apiVersion: allot.dev/v1alpha1
kind: IPAMAllocation
metadata: {{name: lb, namespace: cluster-gone}}
spec: {{type: range, dc: dc1, addresses: [10.0.0.5-10.0.0.8]}}
",
            POOL
        ),
    );
    let clusters = write(
        dir.path(),
        "clusters.yaml",
        "- {name: a, datacenter: dc1}\n",
    );
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("cluster-a (a)  10.0.0.1-10.0.0.4,10.0.0.5-10.0.0.6  grown"),
        "{text}"
    );
    assert!(
        text.contains("IPAMPool lb cluster-gone: 10.0.0.5-10.0.0.8 (no cluster in namespace cluster-gone of datacenter dc1 asks for it)"),
        "{text}"
    );
}

#[test]
fn bad_input_is_an_error_naming_the_file_and_object() {
    let dir = tempfile::tempdir().unwrap();
    let pools = write(
        dir.path(),
        "pools.yaml",
        &POOL.replace("allocationRange", "allocationRnage"),
    );
    let clusters = write(
        dir.path(),
        "clusters.yaml",
        "- {name: a, datacenter: dc1}\n",
    );
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("pools.yaml: lb: not an IPAMPool"), "{err}");
    assert!(err.contains("allocationRnage"), "{err}");
}

/// Kubermatic made both allocations and the pool's allocationRange is raised from 4 to 6: each
/// cluster grows into addresses nobody holds, never into its neighbour's.
#[test]
fn a_raised_allocation_range_grows_every_cluster_into_free_addresses_only() {
    let dir = tempfile::tempdir().unwrap();
    let pools = write(
        dir.path(),
        "pools.yaml",
        "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 6}
---
apiVersion: allot.dev/v1alpha1
kind: IPAMAllocation
metadata: {name: lb, namespace: cluster-a}
spec: {type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.4]}
---
apiVersion: allot.dev/v1alpha1
kind: IPAMAllocation
metadata: {name: lb, namespace: cluster-b}
spec: {type: range, dc: dc1, addresses: [10.0.0.5-10.0.0.8]}
",
    );
    let clusters = write(
        dir.path(),
        "clusters.yaml",
        "- {name: a, datacenter: dc1}\n- {name: b, datacenter: dc1}\n",
    );
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(
        text,
        "\
IPAMPool lb
  datacenter dc1
    cluster-a (a)  10.0.0.1-10.0.0.4,10.0.0.9-10.0.0.10  grown
    cluster-b (b)  10.0.0.5-10.0.0.8,10.0.0.11-10.0.0.12  grown
0 new, 0 kept, 2 grown, 0 refused, 0 released
"
    );
}

/// A /23 split into /24s serves two clusters, and a cluster migrating in with the pool's
/// first /24 keeps it.
#[test]
fn a_prefix_pool_hands_out_its_first_and_last_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let pool = "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: nodes}
spec:
  datacenters:
    dc1: {type: prefix, poolCidr: 10.0.0.0/23, allocationPrefix: 24}
";
    let pools = write(dir.path(), "pools.yaml", pool);
    let clusters = write(
        dir.path(),
        "clusters.yaml",
        "- {name: a, datacenter: dc1}\n- {name: b, datacenter: dc1}\n",
    );
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(
        text,
        "\
IPAMPool nodes
  datacenter dc1
    cluster-a (a)  10.0.0.0/24  new
    cluster-b (b)  10.0.1.0/24  new
2 new, 0 kept, 0 grown, 0 refused, 0 released
"
    );

    let pools = write(
        dir.path(),
        "pools.yaml",
        &format!(
            "{pool}---
apiVersion: allot.dev/v1alpha1
kind: IPAMAllocation
metadata: {{name: nodes, namespace: cluster-m}}
spec: {{type: prefix, dc: dc1, cidr: 10.0.0.0/24}}
"
        ),
    );
    let clusters = write(
        dir.path(),
        "clusters.yaml",
        "- {name: a, datacenter: dc1}\n- {name: m, datacenter: dc1}\n",
    );
    let out = allotctl(&["fleet", "plan", "-f", &pools, "--clusters", &clusters]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(
        text,
        "\
IPAMPool nodes
  datacenter dc1
    cluster-a (a)  10.0.1.0/24  new
    cluster-m (m)  10.0.0.0/24  kept
1 new, 1 kept, 0 grown, 0 refused, 0 released
"
    );
}
