//! IPAMPool and IPAMAllocation as users meet them: Kubermatic's field names, what the schema
//! refuses before the controller sees it, and one conversion into core's checked pool.

use allot_core::fleet::{Allocation, FleetKind, FleetPool};
use allot_k8s::{IPAMAllocation, IPAMPool, crds};
use serde_json::{Value, json};

fn schema(plural: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .unwrap();
    let version = &crd.spec.versions[0];
    serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap()
}

fn columns(plural: &str) -> Vec<(String, String)> {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .unwrap();
    crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.json_path))
        .collect()
}

const POOL: &str = "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    vsphere-hamburg:
      type: range
      poolCidr: 192.168.1.0/24
      allocationRange: 10
      excludeRanges: [192.168.1.1-192.168.1.9]
    vsphere-berlin:
      type: prefix
      poolCidr: fd00:10::/48
      allocationPrefix: 64
      excludePrefixes: [fd00:10::/56]
      deprecated: true
";

#[test]
fn a_pool_reads_with_kubermatics_names_and_converts_once() {
    let pool: IPAMPool = serde_yaml::from_str(POOL).unwrap();
    let hamburg = FleetPool::try_from(&pool.spec.datacenters["vsphere-hamburg"]).unwrap();
    assert_eq!(hamburg.kind(), FleetKind::Range { per_cluster: 10 });
    assert_eq!(hamburg.cidr().to_string(), "192.168.1.0/24");
    let berlin = &pool.spec.datacenters["vsphere-berlin"];
    assert!(berlin.deprecated);
    assert_eq!(
        FleetPool::try_from(berlin).unwrap().kind(),
        FleetKind::Prefix { len: 64 }
    );
    // Core's words for a bad entry.
    let mut bad = pool.spec.datacenters["vsphere-hamburg"].clone();
    bad.allocation_range = Some(0);
    let e = FleetPool::try_from(&bad).unwrap_err().to_string();
    assert!(e.contains("allocationRange must be at least 1"), "{e}");
    // A typo is named.
    let e = serde_yaml::from_str::<IPAMPool>(&POOL.replace("allocationRange", "allocationRnage"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("allocationRnage"), "{e}");
}

#[test]
fn an_allocation_is_a_request_until_it_holds_addresses() {
    let request: IPAMAllocation = serde_yaml::from_str(
        "apiVersion: allot.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: metallb, namespace: cluster-xyz}\nspec: {dc: vsphere-hamburg}\n",
    )
    .unwrap();
    assert_eq!(request.spec.allocation(), Ok(None));
    let held: IPAMAllocation = serde_yaml::from_str(
        "apiVersion: allot.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: metallb, namespace: cluster-xyz}\nspec:\n  type: range\n  dc: vsphere-hamburg\n  addresses: [192.168.1.200-192.168.1.210, 192.168.1.240-192.168.1.250]\n",
    )
    .unwrap();
    let a = held.spec.allocation().unwrap().unwrap();
    assert_eq!(a.len(), 22);
    assert_eq!(
        a.to_string(),
        "192.168.1.200-192.168.1.210,192.168.1.240-192.168.1.250"
    );
    // Written back, it is the same spec.
    assert_eq!(
        allot_k8s::IPAMAllocationSpec::recording(&a, "vsphere-hamburg"),
        held.spec
    );
    // A prefix without its type reads as a prefix; both fields at once are refused.
    let mut prefix = request.spec.clone();
    prefix.cidr = Some("10.0.0.0/28".into());
    assert_eq!(
        prefix.allocation().unwrap(),
        Some(Allocation::parse_cidr("10.0.0.0/28").unwrap())
    );
    prefix.addresses = vec!["10.0.0.1".into()];
    assert!(prefix.allocation().is_err());
}

#[test]
fn the_schemas_refuse_what_a_schema_can() {
    let pool = schema("ipampools");
    let dc = &pool["properties"]["spec"]["properties"]["datacenters"]["additionalProperties"];
    assert_eq!(
        pool["properties"]["spec"]["required"],
        json!(["datacenters"])
    );
    let props = &dc["properties"];
    assert_eq!(props["type"]["enum"], json!(["range", "prefix"]), "{dc}");
    assert!(props["poolCidr"]["pattern"].is_string(), "{dc}");
    assert_eq!(props["allocationRange"]["minimum"], json!(1.0), "{dc}");
    assert_eq!(props["allocationPrefix"]["maximum"], json!(128.0), "{dc}");
    assert!(props["excludeRanges"]["items"]["pattern"].is_string());
    assert!(props["excludePrefixes"]["items"]["pattern"].is_string());
    assert_eq!(props["deprecated"]["type"], "boolean");
    let mut required: Vec<&str> = dc["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort();
    assert_eq!(required, ["poolCidr", "type"]);
    // Immutability and "one of the two sizes" are CEL rules on each datacenter's entry.
    let rules: Vec<&str> = dc["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.iter().any(|r| r.contains("oldSelf.poolCidr")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.contains("oldSelf.type")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.contains("oldSelf.allocationPrefix")),
        "{rules:?}"
    );

    let allocation = schema("ipamallocations");
    let spec = &allocation["properties"]["spec"];
    assert_eq!(spec["required"], json!(["dc"]));
    assert!(spec["properties"]["cidr"]["pattern"].is_string());
    assert!(spec["properties"]["addresses"]["items"]["pattern"].is_string());
    assert!(spec["x-kubernetes-validations"][0]["rule"].is_string());
}

#[test]
fn kubectl_get_shows_what_a_platform_engineer_looks_for() {
    let expect = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        columns("ipampools"),
        expect(&[
            ("CLUSTERS", ".status.clusters"),
            ("AGE", ".metadata.creationTimestamp")
        ])
    );
    assert_eq!(
        columns("ipamallocations"),
        expect(&[
            ("TYPE", ".spec.type"),
            ("DC", ".spec.dc"),
            ("CIDR", ".spec.cidr"),
            ("ADDRESSES", ".spec.addresses"),
            ("STATE", ".status.state"),
        ])
    );
}
